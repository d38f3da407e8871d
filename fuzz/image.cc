// An executable image's bytes (jit/image.h: what the persistent code cache
// and `pejit export` store) through the decoder and its verifier: refused
// with ImageError, or an image whose every index is in range, whose kernel
// steps get the types their operators infer, and whose fused kernels, run
// for the rows the image says over the strides their loop nest gives, touch
// only elements inside their buffers: running its plan cannot read or
// write outside them.
#include <stdexcept>
#include <string>

#include "fuzz/harness.h"
#include "jit/image.h"
#include "ops/op.h"

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
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const pejit::PlanStep& step = plan.steps[s];
    if (step.kind == pejit::PlanStep::Kind::kKernel) {
      std::vector<pejit::TensorType> in;
      for (int b : step.inputs) in.push_back(plan.buffers[b].type);
      std::vector<pejit::TensorType> out = pejit::InferTypes(*step.op, in, step.attrs);  // throws: a finding
      for (size_t o = 0; o < out.size(); ++o) {
        if (o >= step.outputs.size() || !(out[o] == plan.buffers[step.outputs[o]].type)) {
          pejit::fuzz::Finding("a kernel step writes a buffer of another type");
        }
      }
    }
    if (step.kind != pejit::PlanStep::Kind::kFused) continue;
    // The elements the kernel touches: rows `outer`, then the nest's inner
    // extents, each load at its strides, the output row-major.
    const pejit::LoopNest nest = pejit::NestOf(plan, step);
    int64_t touched_out = image.outer[s];
    for (size_t d = 1; d < nest.dims.size(); ++d) touched_out *= nest.dims[d];
    if (touched_out > pejit::NumElements(plan.buffers[step.outputs[0]].type.shape)) {
      pejit::fuzz::Finding("a fused kernel writes past its output");
    }
    for (size_t l = 0; l < nest.loads.size(); ++l) {
      int64_t last = 0;
      for (size_t d = 0; d < nest.dims.size(); ++d) {
        const int64_t extent = d == 0 ? image.outer[s] : nest.dims[d];
        if (extent > 0) last += (extent - 1) * nest.load_strides[l][d];
      }
      const pejit::PlanBuffer& b = plan.buffers[step.nodes[nest.loads[l]].buffer];
      if (touched_out > 0 && (last >= pejit::NumElements(b.type.shape) || b.type.dtype != step.nodes[nest.loads[l]].dtype)) {
        pejit::fuzz::Finding("a fused kernel reads past a buffer");
      }
    }
  }
  return 0;
}
