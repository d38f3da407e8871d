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

#define PEJIT_AVX512 __attribute__((target("avx512f")))

// The same panels, one 16-column panel a register: kRows512 rows per call
// (12 accumulators, the panel, broadcasts folded into the FMAs), so that a
// run of up to 12 rows streams each panel once. Every output element sums
// over k in the same order as Kernel6x16, with the same fused multiply-adds,
// so the two kernels agree bit for bit (tiers and machines stay comparable).
// The rows a call has are a template parameter: fewer rows, fewer FMAs.
constexpr int kRows512 = 12;

template <int kR>
PEJIT_AVX512 void Kernel512(int64_t k, const float* const* a, const float* panel, float* c, int64_t ldc,
                            int64_t cols, bool accumulate) {
  __m512 acc[kR];
#pragma GCC unroll 12
  for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t i = 0; i < k; ++i) {
    const __m512 b = _mm512_loadu_ps(panel + i * kPackedPanel);
#pragma GCC unroll 12
    for (int r = 0; r < kR; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r][i]), b, acc[r]);
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
#pragma GCC unroll 12
  for (int r = 0; r < kR; ++r) {
    float* out = c + r * ldc;
    _mm512_mask_storeu_ps(out, mask, accumulate ? _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(mask, out)) : acc[r]);
  }
}

// Calls Kernel512 for `rows` (1..kRows512) rows: a switch, so that each row
// count has its accumulators in registers.
PEJIT_AVX512 void Kernel512Rows(int rows, int64_t k, const float* const* a, const float* panel, float* c,
                                int64_t ldc, int64_t cols, bool accumulate) {
  switch (rows) {
#define PEJIT_ROWS(n) \
  case n:             \
    return Kernel512<n>(k, a, panel, c, ldc, cols, accumulate);
    PEJIT_ROWS(1) PEJIT_ROWS(2) PEJIT_ROWS(3) PEJIT_ROWS(4) PEJIT_ROWS(5) PEJIT_ROWS(6)
    PEJIT_ROWS(7) PEJIT_ROWS(8) PEJIT_ROWS(9) PEJIT_ROWS(10) PEJIT_ROWS(11) PEJIT_ROWS(12)
#undef PEJIT_ROWS
  }
}

PEJIT_AVX512 void GemmPackedAvx512(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                   const float* packed, float* c, int64_t ldc, bool accumulate) {
  for (int64_t p = 0; p * kPackedPanel < n; ++p) {
    const float* panel = packed + p * k * kPackedPanel;
    const int64_t cols = std::min(kPackedPanel, n - p * kPackedPanel);
    for (int64_t i = 0; i < m; i += kRows512) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows512, m - i));
      const float* row[kRows512];
      for (int r = 0; r < rows; ++r) row[r] = a + (i + r) * lda;
      Kernel512Rows(rows, k, row, panel, c + i * ldc + p * kPackedPanel, ldc, cols, accumulate);
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

GemmIsa BestGemmIsa() {
  static const GemmIsa best = __builtin_cpu_supports("avx512f") ? GemmIsa::kAvx512
                              : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? GemmIsa::kAvx2
                                                                                                 : GemmIsa::kPlain;
  return best;
}

bool GemmIsaSupported(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kPlain: return true;
    case GemmIsa::kAvx2: return BestGemmIsa() != GemmIsa::kPlain;
    case GemmIsa::kAvx512: return BestGemmIsa() == GemmIsa::kAvx512;
  }
  return false;
}

const char* GemmIsaName(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kPlain: return "plain";
    case GemmIsa::kAvx2: return "avx2";
    case GemmIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool PackedGemmFast() { return BestGemmIsa() != GemmIsa::kPlain; }

Shape PackedShape(int64_t k, int64_t n) { return {(n + kPackedPanel - 1) / kPackedPanel, k, kPackedPanel}; }

void PackGemmRhs(bool transpose, int64_t k, int64_t n, const float* b, int64_t ldb, float* packed) {
  const int64_t panels = (n + kPackedPanel - 1) / kPackedPanel;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = packed + p * k * kPackedPanel;
    const int64_t first = p * kPackedPanel, cols = std::min(kPackedPanel, n - first);
    if (transpose) {
      // Column j of op(B) is row j of B: the panel's 16 rows read side by
      // side, so that it is written in order (written down its columns, it
      // took a sixth longer).
      const float* rows[kPackedPanel];
      for (int64_t j = 0; j < cols; ++j) rows[j] = b + (first + j) * ldb;
      for (int64_t l = 0; l < k; ++l) {
        float* dst = panel + l * kPackedPanel;
        for (int64_t j = 0; j < cols; ++j) dst[j] = rows[j][l];
        for (int64_t j = cols; j < kPackedPanel; ++j) dst[j] = 0.0f;
      }
    } else {
      PackGemmRhsRows(k, 0, k, n, b, ldb, packed);
      return;
    }
  }
}

void PackGemmRhsRows(int64_t k, int64_t first, int64_t rows, int64_t n, const float* b, int64_t ldb, float* packed) {
  const int64_t panels = (n + kPackedPanel - 1) / kPackedPanel;
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = packed + (p * k + first) * kPackedPanel;
    const int64_t col = p * kPackedPanel, cols = std::min(kPackedPanel, n - col);
    for (int64_t l = 0; l < rows; ++l) {
      float* dst = panel + l * kPackedPanel;
      std::copy_n(b + l * ldb + col, cols, dst);
      std::fill(dst + cols, dst + kPackedPanel, 0.0f);
    }
  }
}

void GemmPackedWith(GemmIsa isa, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed,
                    float* c, int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (!GemmIsaSupported(isa)) isa = BestGemmIsa();
  switch (isa) {
    case GemmIsa::kAvx512: return GemmPackedAvx512(m, n, k, a, lda, packed, c, ldc, accumulate);
    case GemmIsa::kAvx2: return GemmPackedAvx2(m, n, k, a, lda, packed, c, ldc, accumulate);
    case GemmIsa::kPlain: return GemmPackedPlain(m, n, k, a, lda, packed, c, ldc, accumulate);
  }
}

void GemmPacked(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* packed, float* c,
                int64_t ldc, bool accumulate) {
  GemmPackedWith(BestGemmIsa(), m, n, k, a, lda, packed, c, ldc, accumulate);
}

}  // namespace pejit
