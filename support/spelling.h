// \file "Did you mean ...?" suggestions for error messages.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pejit {

// Edit distance between a and b, a swap of neighbours counting as one edit.
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate closest to `name`, if it is close enough to be a likely typo
// (at most a third of the name's length away, rounded up, and at least one edit).
std::optional<std::string> ClosestMatch(std::string_view name,
                                        const std::vector<std::string>& candidates);

// "; did you mean 'x'?" or "" when nothing is close.
std::string DidYouMean(std::string_view name, const std::vector<std::string>& candidates);

}  // namespace pejit
