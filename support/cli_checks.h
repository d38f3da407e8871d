// \file Option checks for the command-line tools, beside CLI11's own.
//
// CLI11's PositiveNumber on a double says "not in range 0.000000 to 1797693..."
// (all 309 digits of the largest double); these say what is wanted.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <string>

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

// A whole number >= 0 (a count, a budget).
inline CLI::Validator NonNegativeInteger() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(text, &used);
          if (used == text.size() && v >= 0) return "";
        } catch (const std::exception&) {
        }
        return "must be a whole number >= 0, not " + text;
      },
      "COUNT");
}

// A path that names something: `--save "$UNSET"` must not quietly mean "do not save".
inline CLI::Validator NonEmptyPath() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must name a file, not the empty string" : ""; },
      "PATH");
}

}  // namespace pejit
