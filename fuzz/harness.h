// \file What every fuzz harness shares: the entry point libFuzzer calls, and
// how a harness reports a broken property (besides a crash or a sanitizer
// report): it prints what broke and aborts, which libFuzzer records as a
// finding with the input that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace pejit::fuzz {

inline std::string_view Text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

[[noreturn]] inline void Finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace pejit::fuzz
