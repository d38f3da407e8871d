// \file The build's smoke check: every system library of the stack, used once.
//
// Until the Tree-LSTM demo exists this is README command 1; its test keeps the
// toolchain (LLVM ORC, oneTBB, OpenBLAS, spdlog) honest under every config.
#pragma once

#include <cstdint>
#include <string>

namespace pejit::smoke {

struct SmokeResult {
  std::string host_cpu;         // what LLVM targets for JIT-compiled code
  int64_t vector_length = 0;    // elements processed by the JIT-compiled kernel
  float max_saxpy_error = 0;    // JIT kernel vs. a plain C++ loop
  int tbb_chunks = 0;           // parallel_for chunks that ran the kernel
  int gemm_size = 0;            // n of the n×n×n OpenBLAS sgemm
  float max_gemm_error = 0;     // sgemm vs. a naive triple loop
};

// JIT-compiles `y[i] = a*x[i] + y[i]` with ORC LLJIT, runs it over `length`
// elements in parallel on a oneTBB pool, checks an OpenBLAS sgemm of size
// `gemm_size` and logs each step with spdlog. Throws std::runtime_error when
// LLVM fails to compile or look up the kernel.
SmokeResult RunSmoke(int64_t length, int gemm_size);

}  // namespace pejit::smoke
