// \file Integers read from JSON without undefined behaviour.
//
// nlohmann converts a float (1e40) or an unsigned past 2^63 - 1 to int64
// without a check (undefined behaviour, or a wrapped value), so every reader
// of outside JSON asks this first (issue 24).
#pragma once

#include <cstdint>
#include <limits>

namespace pejit {

// Whether `j` (any nlohmann::basic_json) is an integer that int64 holds.
template <typename Json>
bool IsInt64(const Json& j) {
  return j.is_number_integer() &&
         !(j.is_number_unsigned() && j.template get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()});
}

}  // namespace pejit
