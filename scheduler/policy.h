// \file When the engine specializes a signature: its compile policy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pejit {

struct Policy {
  enum class Kind : uint8_t {
    kEager,        // specialize every new signature on first sight
    kHot,          // specialize a signature on its `hot_calls`-th call
    kInterpreter,  // never specialize: everything runs in tier 0
    kSync,         // specialize before running (the call waits): tests, benchmarks, debugging
  };
  Kind kind = Kind::kEager;
  int64_t hot_calls = 0;  // kHot only, >= 1

  static Policy Eager() { return {Kind::kEager, 0}; }
  static Policy Hot(int64_t n);  // throws std::invalid_argument for n < 1
  static Policy Interpreter() { return {Kind::kInterpreter, 0}; }
  static Policy Sync() { return {Kind::kSync, 0}; }

  // "eager", "hot:N" (N >= 1), "interpreter" or "sync"; throws
  // std::invalid_argument naming the choices, e.g.
  //   "unknown policy 'egaer' (did you mean 'eager'?); expected eager, hot:N, interpreter or sync".
  static Policy Parse(std::string_view text);
  std::string ToString() const;  // what Parse reads back

  friend bool operator==(const Policy&, const Policy&) = default;
};

}  // namespace pejit
