#include "train/lookahead.h"

#include <algorithm>
#include <utility>

namespace pejit {

Lookahead::Lookahead(Entry entry, ArgsOf args_of, int ahead)
    : entry_(std::move(entry)), args_of_(std::move(args_of)), ahead_(static_cast<size_t>(std::max(0, ahead))) {
  for (size_t k = 1; k < ahead_; ++k) Prefetch(k);
}

void Lookahead::BeforeStep(size_t step) {
  if (ahead_ > 0) Prefetch(step + ahead_);
}

void Lookahead::Prefetch(size_t step) {
  if (std::optional<std::vector<Value>> args = args_of_(step)) entry_.prefetch(*args, pejit::Prefetch::kNext);
}

}  // namespace pejit
