// An executable image's bytes (jit/image.h: what the persistent code cache
// and `pejit export` store) through the decoder: refused with ImageError,
// or an image whose every index is in range, so that running its plan
// cannot read or write outside its buffers.
#include <stdexcept>
#include <string>

#include "fuzz/harness.h"
#include "jit/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pejit::Image image;
  try {
    image = pejit::DecodeImage(pejit::fuzz::Text(data, size));
  } catch (const pejit::ImageError&) {
    return 0;
  }
  const pejit::Plan& plan = image.plan;
  const size_t buffers = plan.buffers.size();
  for (const pejit::PlanStep& step : plan.steps) {
    for (int b : step.inputs) {
      if (b < 0 || static_cast<size_t>(b) >= buffers) pejit::fuzz::Finding("a step reads a buffer out of range");
    }
    for (int b : step.outputs) {
      if (b < 0 || static_cast<size_t>(b) >= buffers) pejit::fuzz::Finding("a step writes a buffer out of range");
    }
  }
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const int k = image.step_kernel[s];
    if (k >= static_cast<int>(image.kernels.size())) pejit::fuzz::Finding("a step calls a kernel out of range");
  }
  for (const pejit::Image::Kernel& k : image.kernels) {
    if (k.object < 0 || static_cast<size_t>(k.object) >= image.objects.size()) {
      pejit::fuzz::Finding("a kernel in an object out of range");
    }
  }
  return 0;
}
