// \file Stanford Sentiment Treebank trees (Socher et al., 2013) read from
// files, one tree a line in the treebank's bracketed form:
//   (3 (2 It) (4 (2 's) (4 (3 a) (4 treat))))
// Every node is "(label word)" (a leaf) or "(label child child...)" (an inner
// node), with a label from 0 (very negative) to 4 (very positive); the
// Tree-LSTM learns the root's. Words are kept as written (-LRB- stays -LRB-).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "examples/treelstm/data.h"

namespace pejit::sst {

inline constexpr int kClasses = 5;
// Deeper trees are refused as malformed rather than recursed into, and so
// are trees of more than treelstm::kMaxTreeNodes nodes.
inline constexpr int kMaxDepth = 256;

struct Tree {
  int label = 0;
  std::string word;            // a leaf's
  std::vector<Tree> children;  // an inner node's (then `word` is empty)
};

// One tree. Throws std::invalid_argument saying what is wrong and at which
// column (1-based), e.g. "column 9: expected ')' after the word 'It'".
Tree Parse(std::string_view line);

struct FileReport {
  std::vector<Tree> trees;
  std::vector<std::string> errors;  // "file:line: message" for each skipped line
};
// Reads a file of trees, one a line (blank lines are skipped). Malformed
// lines are skipped and reported; with `strict` the first one throws
// std::runtime_error. A file that cannot be read throws std::runtime_error.
FileReport ReadFile(const std::string& path, bool strict = false);

// Token ids for the model: every inner node has kNode (SST's inner nodes
// carry no word), a word absent from the training trees has kUnknown, and the
// words of the training trees seen at least `min_count` times have 2, 3, ...
// in order of first appearance.
class Vocabulary {
 public:
  static constexpr int kNode = 0, kUnknown = 1;
  static Vocabulary Build(const std::vector<Tree>& trees, int min_count = 1);

  int Id(const std::string& word) const;  // kUnknown when absent
  const std::string& Word(int id) const;  // "<node>", "<unk>" or the word
  int size() const { return static_cast<int>(words_.size()); }

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, int> ids_;
};

// The tree in token ids, labelled with its root's class.
treelstm::Example ToExample(const Tree& tree, const Vocabulary& vocabulary);

}  // namespace pejit::sst
