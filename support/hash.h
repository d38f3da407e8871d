// \file FNV-1a, 64 bits: a hash that is the same in every run and on every
// machine, for keys that logs print and for file checksums (any change of one
// bit, or of a few in one byte, changes it).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pejit {

inline constexpr uint64_t kFnv1aStart = 0xcbf29ce484222325ull;

// Hashes `n` bytes on from `h` (a previous result, to hash pieces in turn).
inline uint64_t Fnv1a(const void* data, size_t n, uint64_t h = kFnv1aStart) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= bytes[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace pejit
