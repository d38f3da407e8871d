#include "scheduler/policy.h"

#include <charconv>
#include <stdexcept>

#include "support/spelling.h"

namespace pejit {
namespace {

constexpr char kChoices[] = "expected eager, hot:N (N >= 1), interpreter or sync";

}  // namespace

Policy Policy::Hot(int64_t n) {
  if (n < 1) throw std::invalid_argument("policy hot:N needs N >= 1, got " + std::to_string(n));
  return {Kind::kHot, n};
}

Policy Policy::Parse(std::string_view text) {
  if (text == "eager") return Eager();
  if (text == "interpreter") return Interpreter();
  if (text == "sync") return Sync();
  if (text.starts_with("hot:")) {
    std::string_view digits = text.substr(4);
    int64_t n = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || n < 1) {
      throw std::invalid_argument("bad policy '" + std::string(text) +
                                  "': N in hot:N must be a whole number >= 1");
    }
    return Hot(n);
  }
  std::string hint = DidYouMean(text, {"eager", "hot:N", "interpreter", "sync"});
  if (!hint.empty() && hint.front() == ';') hint = " (" + hint.substr(2) + ")";
  throw std::invalid_argument("unknown policy '" + std::string(text) + "'" + hint + "; " + kChoices);
}

std::string Policy::ToString() const {
  switch (kind) {
    case Kind::kEager: return "eager";
    case Kind::kHot: return "hot:" + std::to_string(hot_calls);
    case Kind::kInterpreter: return "interpreter";
    case Kind::kSync: return "sync";
  }
  return "?";
}

}  // namespace pejit
