// \file Whether float buffers hold only finite values: what the optimizer
// checks of gradients and updates, and checkpoints of what they save and load.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace pejit {

// The index of the first NaN or infinite value, or -1.
inline int64_t FirstNonFinite(const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return i;
  }
  return -1;
}

// The same question without the index, on the bits and branch-free so that
// it vectorizes (for hot paths): NaN and the infinities are the floats whose
// exponent bits are all ones.
inline bool AllFinite(const float* v, int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  uint32_t any = 0;
  for (int64_t j = 0; j < n; ++j) {
    uint32_t bits;
    std::memcpy(&bits, v + j, sizeof bits);
    any |= static_cast<uint32_t>((bits & kExponent) == kExponent);
  }
  return any == 0;
}

}  // namespace pejit
