#include "ops/random.h"

#include <cmath>

namespace pejit {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

template <typename Gen>
Tensor Generate(Shape shape, DType dtype, Gen&& gen) {
  Tensor t = Tensor::Empty(dtype, std::move(shape));
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(gen());
  });
  return t;
}

}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = SplitMix64(seed);
}

uint64_t Rng::NextU64() {
  uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::NextUniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

double Rng::NextNormal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_normal_;
  }
  double u = 0;
  while (u <= 0) u = NextUniform();
  double v = NextUniform();
  double r = std::sqrt(-2.0 * std::log(u));
  spare_normal_ = r * std::sin(2 * M_PI * v);
  has_spare_ = true;
  return r * std::cos(2 * M_PI * v);
}

int64_t Rng::NextInt(int64_t lo, int64_t hi) {
  if (hi <= lo) throw std::invalid_argument("Rng::NextInt: empty range");
  return lo + static_cast<int64_t>(NextU64() % static_cast<uint64_t>(hi - lo));
}

Tensor RandomUniform(Rng& rng, Shape shape, double lo, double hi, DType dtype) {
  return Generate(std::move(shape), dtype, [&] { return lo + (hi - lo) * rng.NextUniform(); });
}

Tensor RandomNormal(Rng& rng, Shape shape, double mean, double stddev, DType dtype) {
  return Generate(std::move(shape), dtype, [&] { return mean + stddev * rng.NextNormal(); });
}

Tensor RandomInt(Rng& rng, Shape shape, int64_t lo, int64_t hi) {
  return Generate(std::move(shape), DType::kI64, [&] { return rng.NextInt(lo, hi); });
}

Tensor XavierUniform(Rng& rng, Shape shape, DType dtype) {
  if (shape.size() < 2) throw std::invalid_argument("XavierUniform needs a shape of rank >= 2");
  double fan_out = static_cast<double>(shape[shape.size() - 2]);
  double fan_in = static_cast<double>(shape.back());
  double a = std::sqrt(6.0 / (fan_in + fan_out));
  return RandomUniform(rng, std::move(shape), -a, a, dtype);
}

}  // namespace pejit
