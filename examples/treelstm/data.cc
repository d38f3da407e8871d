#include "examples/treelstm/data.h"

#include <algorithm>

namespace pejit::treelstm {

int CountNodes(const TokenTree& t) {
  int n = 1;
  for (const TokenTree& c : t.children) n += CountNodes(c);
  return n;
}

int Height(const TokenTree& t) {
  int h = 0;
  for (const TokenTree& c : t.children) h = std::max(h, 1 + Height(c));
  return h;
}

bool ReadLine(std::istream& in, std::string& line, bool& too_long) {
  line.clear();
  too_long = false;
  std::streambuf* buf = in.rdbuf();
  int c = buf->sbumpc();
  if (c == std::char_traits<char>::eof()) {
    in.setstate(std::ios::eofbit);
    return false;
  }
  for (; c != std::char_traits<char>::eof() && c != '\n'; c = buf->sbumpc()) {
    if (line.size() < kMaxLineBytes) {
      line.push_back(static_cast<char>(c));
    } else {
      too_long = true;
    }
  }
  if (too_long) line.clear();
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

}  // namespace pejit::treelstm
