// \file The BLAS behind every matrix product: OpenBLAS, called through cblas.
#pragma once

#include <cstdint>
#include <string>

namespace pejit {

// OpenBLAS's own thread count. pejit runs small GEMMs inside its own parallel
// work, where OpenBLAS's threads would oversubscribe the cores: 1 is right
// there; the default is OpenBLAS's (all cores, or OPENBLAS_NUM_THREADS).
void SetBlasThreads(int threads);
int BlasThreads();
std::string BlasConfig();  // OpenBLAS's build description, for benchmark reports

// Row-major C[m×n] = alpha * op(A) * op(B) + beta * C, with op(A) m×k and
// op(B) k×n; lda/ldb/ldc are the row lengths of A, B and C as stored.
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void Gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc);

}  // namespace pejit
