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

}  // namespace pejit::treelstm
