#include "support/spelling.h"

#include <algorithm>
#include <numeric>

namespace pejit {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> ClosestMatch(std::string_view name,
                                        const std::vector<std::string>& candidates) {
  size_t limit = std::max<size_t>(1, name.size() / 3);
  std::optional<std::string> best;
  size_t best_distance = limit + 1;
  for (const auto& c : candidates) {
    size_t d = EditDistance(name, c);
    if (d > 0 && d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  return best;
}

std::string DidYouMean(std::string_view name, const std::vector<std::string>& candidates) {
  auto best = ClosestMatch(name, candidates);
  return best ? "; did you mean '" + *best + "'?" : "";
}

}  // namespace pejit
