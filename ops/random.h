// \file Seeded random numbers and parameter initializers.
//
// The generator is xoshiro256** seeded through splitmix64, and the
// distributions are written out here, so a seed gives the same tensors on
// every platform and standard library.
#pragma once

#include <cstdint>

#include "ops/tensor.h"

namespace pejit {

class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t NextU64();
  double NextUniform();             // [0, 1)
  double NextNormal();              // mean 0, stddev 1 (Box-Muller)
  int64_t NextInt(int64_t lo, int64_t hi);  // [lo, hi)

 private:
  uint64_t s_[4];
  double spare_normal_ = 0;
  bool has_spare_ = false;
};

Tensor RandomUniform(Rng& rng, Shape shape, double lo, double hi, DType dtype = DType::kF32);
Tensor RandomNormal(Rng& rng, Shape shape, double mean, double stddev, DType dtype = DType::kF32);
Tensor RandomInt(Rng& rng, Shape shape, int64_t lo, int64_t hi);  // i64 in [lo, hi)
// Glorot/Xavier uniform for a weight of shape (fan_out, fan_in), or any shape
// whose last two dims are (fan_out, fan_in): U(-a, a), a = sqrt(6/(in+out)).
Tensor XavierUniform(Rng& rng, Shape shape, DType dtype = DType::kF32);

}  // namespace pejit
