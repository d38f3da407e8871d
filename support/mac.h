// \file Keyed authentication of bytes pejit wrote and reads back later, and
// the digest that names what an artifact was made from.
//
// A checksum (hash.h) catches a torn or corrupted file; it does not stop
// anyone who can write the file from writing another one with a matching
// checksum. Bytes that decide what native code runs (the code cache's
// entries, scheduler/disk_cache.h) carry an HMAC-SHA256 under a secret key
// only their writer can read: a file made without the key fails.
#pragma once

#include <string>
#include <string_view>

namespace pejit {

inline constexpr size_t kMacKeyBytes = 32;
inline constexpr size_t kMacBytes = 32;

// HMAC-SHA256 of `data` under `key` (kMacBytes bytes).
std::string Mac(std::string_view key, std::string_view data);

// Whether `a` and `b` are equal, in time that does not depend on where they differ.
bool SameMac(std::string_view a, std::string_view b);

// SHA-256 of `data`, as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view data);

// `n` bytes from the kernel's random source (getrandom(2)); throws
// std::runtime_error when it cannot give them.
std::string RandomBytes(size_t n);

}  // namespace pejit
