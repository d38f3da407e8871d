// \file Option checks for the command-line tools, beside CLI11's own.
//
// CLI11's PositiveNumber on a double says "not in range 0.000000 to 1797693..."
// (all 309 digits of the largest double); these say what is wanted.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

namespace pejit {

// A finite number greater than zero (a learning rate).
inline CLI::Validator PositiveReal() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(text, &used);
          if (used == text.size() && std::isfinite(v) && v > 0) return "";
        } catch (const std::exception&) {
        }
        return "must be a positive number, not " + text;
      },
      "POSITIVE");
}

// A finite number >= 0 (a clip norm, a weight decay): CLI11's
// NonNegativeNumber lets nan and inf through.
inline CLI::Validator NonNegativeReal() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const double v = std::stod(text, &used);
          if (used == text.size() && std::isfinite(v) && v >= 0) return "";
        } catch (const std::exception&) {
        }
        return "must be a number >= 0, not " + text;
      },
      "NUMBER");
}

// A whole number in [lo, hi] (a size, a count with a bound): CLI11's Range
// says "2.5 not in range" and lets a type's overflow through as a second
// error about how many values were given.
inline CLI::Validator WholeNumber(int64_t lo, int64_t hi) {
  const bool unbounded = hi == std::numeric_limits<int64_t>::max();
  const std::string range =
      unbounded ? ">= " + std::to_string(lo) : "from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(text, &used);
          if (used == text.size() && v >= lo && v <= hi) return "";
        } catch (const std::exception&) {
        }
        return "must be a whole number " + range + ", not " + text;
      },
      unbounded ? "COUNT" : "INT in [" + std::to_string(lo) + " - " + std::to_string(hi) + "]");
}

// A whole number >= 0 (a count, a budget) of int64's range.
inline CLI::Validator NonNegativeInteger() { return WholeNumber(0, std::numeric_limits<int64_t>::max()); }

// An option whose values a library parser judges (a policy, a log level):
// its std::invalid_argument becomes the option's error, so the message names
// the option rather than a struct field.
template <typename Parse>
CLI::Validator ParsedBy(Parse parse, std::string description) {
  return CLI::Validator(
      [parse](std::string& text) -> std::string {
        try {
          (void)parse(text);
          return "";
        } catch (const std::invalid_argument& e) {
          return e.what();
        }
      },
      std::move(description));
}

// A path that names something: `--save "$UNSET"` must not quietly mean "do not save".
inline CLI::Validator NonEmptyPath() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must name a file, not the empty string" : ""; },
      "PATH");
}

}  // namespace pejit
