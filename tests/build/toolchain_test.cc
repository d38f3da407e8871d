// The stack links and works under every config (default, opt, asan, tsan).
#include <gtest/gtest.h>

#include "examples/smoke/smoke.h"

namespace pejit::smoke {
namespace {

TEST(Toolchain, JitKernelOnTbbPoolMatchesPlainLoop) {
  SmokeResult r = RunSmoke(100000, 32);
  EXPECT_FALSE(r.host_cpu.empty());
  EXPECT_EQ(r.max_saxpy_error, 0.0f);  // same IEEE operations, same order
  EXPECT_GE(r.tbb_chunks, 2);
}

TEST(Toolchain, OpenBlasSgemmMatchesNaiveProduct) {
  SmokeResult r = RunSmoke(1, 48);
  EXPECT_LT(r.max_gemm_error, 1e-4f);
}

}  // namespace
}  // namespace pejit::smoke
