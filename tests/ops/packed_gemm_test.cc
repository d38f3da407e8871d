// The packed GEMM's micro-kernels: each CPU this runs on uses the best one it
// has, and a compiled step must give the same bits on a machine with AVX-512
// as on one with AVX2 only (tiers and runs stay comparable). So the kernels
// agree bit for bit with each other, and with a double-precision reference to
// rounding, on shapes crossing their row blocks (6 and 12) and 16-column
// panels, with strided operands and accumulation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/packed_gemm.h"
#include "ops/random.h"

namespace pejit {
namespace {

struct Shape3 {
  int64_t m, n, k;
};

struct Product {
  std::vector<float> c;
  std::vector<double> reference, scale;  // Σ a·b in double, and Σ |a·b| (the rounding scale)
};

// C = A·op(B) (+ C0 when accumulate), with A's and C's rows padded apart.
Product Multiply(GemmIsa isa, const Shape3& s, bool transpose, bool accumulate, uint64_t seed) {
  Rng rng(seed);
  const int64_t lda = s.k + 3, ldc = s.n + 5, ldb = transpose ? s.k : s.n;
  std::vector<float> a(static_cast<size_t>(s.m * lda)), b(static_cast<size_t>(s.k * s.n)),
      c(static_cast<size_t>(s.m * ldc));
  for (float& x : a) x = static_cast<float>(rng.NextUniform() * 2 - 1);
  for (float& x : b) x = static_cast<float>(rng.NextUniform() * 2 - 1);
  for (float& x : c) x = accumulate ? static_cast<float>(rng.NextUniform() * 2 - 1) : 0.0f;
  Product out;
  out.reference.resize(c.size());
  out.scale.resize(c.size());
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = c[i * ldc + j], scale = std::abs(sum);
      for (int64_t l = 0; l < s.k; ++l) {
        const double term = double{a[i * lda + l]} * b[transpose ? j * ldb + l : l * ldb + j];
        sum += term;
        scale += std::abs(term);
      }
      out.reference[i * ldc + j] = sum;
      out.scale[i * ldc + j] = scale;
    }
  }
  std::vector<float> packed(static_cast<size_t>(((s.n + kPackedPanel - 1) / kPackedPanel) * s.k * kPackedPanel));
  PackGemmRhs(transpose, s.k, s.n, b.data(), ldb, packed.data());
  GemmPackedWith(isa, s.m, s.n, s.k, a.data(), lda, packed.data(), c.data(), ldc, accumulate);
  out.c = std::move(c);
  return out;
}

std::vector<Shape3> Shapes() {
  std::vector<Shape3> shapes = {{1, 1, 1},   {6, 16, 8},   {7, 17, 3},  {12, 16, 64},  {13, 40, 33},
                                {25, 48, 64}, {5, 15, 128}, {24, 384, 128}, {11, 1, 7}, {30, 33, 1}};
  Rng rng(7);
  for (int i = 0; i < 12; ++i) shapes.push_back({rng.NextInt(1, 40), rng.NextInt(1, 70), rng.NextInt(1, 90)});
  return shapes;
}

TEST(PackedGemm, EveryMicroKernelMatchesTheReferenceToRounding) {
  for (GemmIsa isa : {GemmIsa::kPlain, GemmIsa::kAvx2, GemmIsa::kAvx512}) {
    if (!GemmIsaSupported(isa)) continue;
    uint64_t seed = 1;
    for (const Shape3& s : Shapes()) {
      for (bool transpose : {false, true}) {
        for (bool accumulate : {false, true}) {
          const Product p = Multiply(isa, s, transpose, accumulate, seed++);
          for (int64_t i = 0; i < s.m; ++i) {
            for (int64_t j = 0; j < s.n; ++j) {
              const size_t at = static_cast<size_t>(i * (s.n + 5) + j);
              ASSERT_NEAR(p.c[at], p.reference[at], 1e-6 * (1 + static_cast<double>(s.k)) * p.scale[at] + 1e-30)
                  << GemmIsaName(isa) << " m " << s.m << " n " << s.n << " k " << s.k << " at (" << i << ", " << j
                  << ")";
            }
          }
        }
      }
    }
  }
}

TEST(PackedGemm, TheAvx512KernelGivesTheAvx2KernelsBitsAndLeavesPaddingAlone) {
  if (!GemmIsaSupported(GemmIsa::kAvx512)) GTEST_SKIP() << "this CPU has no AVX-512";
  uint64_t seed = 100;
  for (const Shape3& s : Shapes()) {
    for (bool transpose : {false, true}) {
      for (bool accumulate : {false, true}) {
        const Product wide = Multiply(GemmIsa::kAvx512, s, transpose, accumulate, seed);
        const Product narrow = Multiply(GemmIsa::kAvx2, s, transpose, accumulate, seed++);
        // Every float of C, the padding between rows included (never written).
        ASSERT_EQ(wide.c, narrow.c) << "m " << s.m << " n " << s.n << " k " << s.k;
      }
    }
  }
}

}  // namespace
}  // namespace pejit
