#include "ops/packed_gemm.h"

#include <immintrin.h>

#include <algorithm>

namespace pejit {
namespace {

constexpr int kRows = 6;  // rows per micro-kernel call: 12 accumulators, 2 panel registers, 1 broadcast

#define PEJIT_AVX2 __attribute__((target("avx2,fma")))

// C[rows×cols] (rows ≤ 6, cols ≤ 16) = Σ_k A[r][k]·panel[k][·]. The
// accumulators are named, not an array, so that GCC keeps all twelve in
// registers; missing rows read row 0 again and are not stored.
PEJIT_AVX2 void Kernel6x16(int64_t k, const float* const* a, int rows, const float* panel, float* c, int64_t ldc,
                           int64_t cols, bool accumulate) {
  const float *a0 = a[0], *a1 = a[rows > 1 ? 1 : 0], *a2 = a[rows > 2 ? 2 : 0], *a3 = a[rows > 3 ? 3 : 0],
              *a4 = a[rows > 4 ? 4 : 0], *a5 = a[rows > 5 ? 5 : 0];
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
  for (int64_t i = 0; i < k; ++i) {
    const __m256 b0 = _mm256_loadu_ps(panel + i * kPackedPanel), b1 = _mm256_loadu_ps(panel + i * kPackedPanel + 8);
    __m256 x = _mm256_broadcast_ss(a0 + i);
    c00 = _mm256_fmadd_ps(x, b0, c00);
    c01 = _mm256_fmadd_ps(x, b1, c01);
    x = _mm256_broadcast_ss(a1 + i);
    c10 = _mm256_fmadd_ps(x, b0, c10);
    c11 = _mm256_fmadd_ps(x, b1, c11);
    x = _mm256_broadcast_ss(a2 + i);
    c20 = _mm256_fmadd_ps(x, b0, c20);
    c21 = _mm256_fmadd_ps(x, b1, c21);
    x = _mm256_broadcast_ss(a3 + i);
    c30 = _mm256_fmadd_ps(x, b0, c30);
    c31 = _mm256_fmadd_ps(x, b1, c31);
    x = _mm256_broadcast_ss(a4 + i);
    c40 = _mm256_fmadd_ps(x, b0, c40);
    c41 = _mm256_fmadd_ps(x, b1, c41);
    x = _mm256_broadcast_ss(a5 + i);
    c50 = _mm256_fmadd_ps(x, b0, c50);
    c51 = _mm256_fmadd_ps(x, b1, c51);
  }
  // Out of the loop, an array is fine: accumulator q is row q / 2, columns
  // 8 * (q % 2) on.
  const __m256 acc[2 * kRows] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
  if (rows == kRows && cols == kPackedPanel) {
    for (int q = 0; q < 2 * kRows; ++q) {
      float* out = c + (q / 2) * ldc + 8 * (q % 2);
      _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(acc[q], _mm256_loadu_ps(out)) : acc[q]);
    }
    return;
  }
  alignas(32) float t[kRows][kPackedPanel];
  for (int q = 0; q < 2 * kRows; ++q) _mm256_store_ps(t[q / 2] + 8 * (q % 2), acc[q]);
  for (int r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    for (int64_t j = 0; j < cols; ++j) row[j] = accumulate ? row[j] + t[r][j] : t[r][j];
  }
}

// Panel by panel (k·16 floats, in L1 for k up to a few hundred), every block
// of six rows against it.
PEJIT_AVX2 void GemmPackedAvx2(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed,
                               float* c, int64_t ldc, bool accumulate) {
  for (int64_t p = 0; p * kPackedPanel < n; ++p) {
    const float* panel = packed + p * k * kPackedPanel;
    const int64_t cols = std::min(kPackedPanel, n - p * kPackedPanel);
    for (int64_t i = 0; i < m; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      const float* row[kRows];
      for (int r = 0; r < rows; ++r) row[r] = a + (i + r) * lda;
      Kernel6x16(k, row, rows, panel, c + i * ldc + p * kPackedPanel, ldc, cols, accumulate);
    }
  }
}

void GemmPackedPlain(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                     int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float* column = packed + (j / kPackedPanel) * k * kPackedPanel + j % kPackedPanel;
      float sum = 0;
      for (int64_t l = 0; l < k; ++l) sum += a[i * lda + l] * column[l * kPackedPanel];
      c[i * ldc + j] = accumulate ? c[i * ldc + j] + sum : sum;
    }
  }
}

}  // namespace

bool PackedGemmFast() {
  static const bool fast = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return fast;
}

Shape PackedShape(int64_t k, int64_t n) { return {(n + kPackedPanel - 1) / kPackedPanel, k, kPackedPanel}; }

void PackGemmRhs(bool transpose, int64_t k, int64_t n, const float* b, int64_t ldb, float* packed) {
  const int64_t panels = (n + kPackedPanel - 1) / kPackedPanel;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = packed + p * k * kPackedPanel;
    const int64_t first = p * kPackedPanel, cols = std::min(kPackedPanel, n - first);
    if (transpose) {  // column j of op(B) is row j of B: contiguous reads, strided writes
      for (int64_t j = 0; j < kPackedPanel; ++j) {
        const float* src = j < cols ? b + (first + j) * ldb : nullptr;
        for (int64_t l = 0; l < k; ++l) panel[l * kPackedPanel + j] = src ? src[l] : 0.0f;
      }
    } else {
      for (int64_t l = 0; l < k; ++l) {
        float* dst = panel + l * kPackedPanel;
        std::copy_n(b + l * ldb + first, cols, dst);
        std::fill(dst + cols, dst + kPackedPanel, 0.0f);
      }
    }
  }
}

void GemmPacked(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (PackedGemmFast()) {
    GemmPackedAvx2(m, n, k, a, lda, packed, c, ldc, accumulate);
  } else {
    GemmPackedPlain(m, n, k, a, lda, packed, c, ldc, accumulate);
  }
}

}  // namespace pejit
