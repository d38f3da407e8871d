// \file Integers read from JSON without undefined behaviour.
//
// nlohmann converts a float (1e40) or an unsigned past 2^63 - 1 to int64
// without a check (undefined behaviour, or a wrapped value), so every reader
// of outside JSON asks this first (issue 24).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace pejit {

// Whether `j` (any nlohmann::basic_json) is an integer that int64 holds.
template <typename Json>
bool IsInt64(const Json& j) {
  return j.is_number_integer() &&
         !(j.is_number_unsigned() && j.template get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()});
}

// Whether `j` is a whole number that int64 cannot hold: an unsigned past
// 2^63 - 1, or what nlohmann reads as a float because no integer type holds
// it (-9223372036854775809, 1e19). Its error says "out of range", not
// "not an integer".
template <typename Json>
bool IsIntegerPastInt64(const Json& j) {
  if (j.is_number_unsigned()) return !IsInt64(j);
  if (!j.is_number_float()) return false;
  const double v = j.template get<double>();
  return std::isfinite(v) && v == std::floor(v) && std::fabs(v) >= 0x1p63;
}

}  // namespace pejit
