// \file What the Tree-LSTM trains on, whatever the data set: a tree of token
// ids (the C++ side of treelstm.pj's `Tree`) and the class of its root.
#pragma once

#include <istream>
#include <string>
#include <vector>

namespace pejit::treelstm {

// A leaf is a token (a ListOps digit, an SST word); an inner node has a token
// of its own (a ListOps operator; SST's inner nodes share one token) and its
// children, in order.
struct TokenTree {
  int token = 0;
  std::vector<TokenTree> children;  // empty for a leaf
};

struct Example {
  TokenTree tree;
  int label = 0;
};

int CountNodes(const TokenTree& t);  // leaves and inner nodes
int Height(const TokenTree& t);      // a leaf has height 0

// Bounds on what a data file's line may hold, checked while reading so that
// a runaway line (one tree of millions of nodes, a file without newlines)
// fails fast with its line number instead of exhausting memory in the model.
inline constexpr int kMaxTreeNodes = 100'000;
inline constexpr size_t kMaxLineBytes = size_t{16} << 20;

}  // namespace pejit::treelstm
