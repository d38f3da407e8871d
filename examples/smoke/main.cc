// Runs the toolchain smoke check and prints its result as one JSON line.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <exception>

#include "examples/smoke/smoke.h"

int main(int argc, char** argv) {
  CLI::App app{"pejit smoke check: JIT-compile a vector kernel with LLVM ORC, run it on a oneTBB "
               "pool, multiply with OpenBLAS, log with spdlog."};
  int64_t length = 1 << 20;
  int gemm = 128;
  app.add_option("--length", length, "elements for the JIT-compiled saxpy")->check(CLI::PositiveNumber);
  app.add_option("--gemm", gemm, "n of the n*n*n sgemm")->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  try {
    auto r = pejit::smoke::RunSmoke(length, gemm);
    nlohmann::json out = {{"host_cpu", r.host_cpu},         {"vector_length", r.vector_length},
                          {"max_saxpy_error", r.max_saxpy_error}, {"tbb_chunks", r.tbb_chunks},
                          {"gemm_size", r.gemm_size},         {"max_gemm_error", r.max_gemm_error}};
    std::printf("%s\n", out.dump().c_str());
    return (r.max_saxpy_error == 0 && r.max_gemm_error < 1e-3f) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smoke: %s\n", e.what());
    return 1;
  }
}
