// \file Text from the input, echoed in messages and reports, bounded.
//
// A name or value a user wrote may be megabytes long (a 20 MB constructor
// name): an error or a trace summary that repeats it whole is unreadable and
// slow. What is echoed keeps its head and tail and says how much it left out.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace pejit {

inline std::string Bounded(std::string_view text, size_t max = 200) {
  if (text.size() <= max) return std::string(text);
  const size_t tail = max / 8, head = max - tail;
  return std::string(text.substr(0, head)) + "...(" + std::to_string(text.size() - head - tail) + " bytes)..." +
         std::string(text.substr(text.size() - tail));
}

}  // namespace pejit
