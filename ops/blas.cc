#include "ops/blas.h"

#include <cblas.h>

#include <limits>
#include <stdexcept>

namespace pejit {
namespace {

blasint Checked(int64_t v) {
  if (v < 0 || v > std::numeric_limits<blasint>::max()) {
    throw std::invalid_argument("GEMM dimension " + std::to_string(v) + " does not fit OpenBLAS's int");
  }
  return static_cast<blasint>(v);
}

CBLAS_TRANSPOSE Trans(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace

void SetBlasThreads(int threads) { openblas_set_num_threads(threads); }
int BlasThreads() { return openblas_get_num_threads(); }
std::string BlasConfig() { return openblas_get_config(); }

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, Trans(ta), Trans(tb), Checked(m), Checked(n), Checked(k), alpha, a,
              Checked(std::max<int64_t>(lda, 1)), b, Checked(std::max<int64_t>(ldb, 1)), beta, c,
              Checked(std::max<int64_t>(ldc, 1)));
}

void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
          int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, Trans(ta), Trans(tb), Checked(m), Checked(n), Checked(k), alpha, a,
              Checked(std::max<int64_t>(lda, 1)), b, Checked(std::max<int64_t>(ldb, 1)), beta, c,
              Checked(std::max<int64_t>(ldc, 1)));
}

}  // namespace pejit
