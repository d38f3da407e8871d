#include "examples/treelstm/sst.h"

#include <fstream>
#include <stdexcept>

#include "support/input_file.h"

namespace pejit::sst {
namespace {

// Recursive descent over the bracketed form; errors name the column.
class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Tree Run() {
    SkipSpace();
    if (AtEnd()) Fail("no tree on the line");
    Tree t = Node(1);
    SkipSpace();
    if (!AtEnd()) Fail("text after the tree's closing ')'");
    return t;
  }

 private:
  Tree Node(int depth) {
    if (depth > kMaxDepth) Fail("trees nested deeper than " + std::to_string(kMaxDepth) + " levels are refused");
    if (++nodes_ > treelstm::kMaxTreeNodes) {
      Fail("trees of more than " + std::to_string(treelstm::kMaxTreeNodes) + " nodes are refused");
    }
    const size_t open = pos_;
    if (AtEnd() || s_[pos_] != '(') Fail("expected '('");
    ++pos_;
    SkipSpace();
    const size_t label_at = pos_;
    std::string_view label = Atom();
    if (label.empty()) Fail("expected a label (0-4) after '('");
    if (label.size() != 1 || label[0] < '0' || label[0] > '4') {
      Fail("bad label '" + std::string(label) + "' (expected 0-4)", label_at);
    }
    Tree t;
    t.label = label[0] - '0';
    SkipSpace();
    if (!AtEnd() && s_[pos_] != '(' && s_[pos_] != ')') {
      t.word = std::string(Atom());
      SkipSpace();
      if (AtEnd() || s_[pos_] != ')') Fail("expected ')' after the word '" + t.word + "' (a leaf has one word)");
      ++pos_;
      return t;
    }
    while (!AtEnd() && s_[pos_] == '(') {
      t.children.push_back(Node(depth + 1));
      SkipSpace();
    }
    if (AtEnd()) Fail("missing ')' for the node opened at column " + std::to_string(open + 1));
    if (s_[pos_] != ')') Fail("expected '(' or ')', found '" + std::string(Atom()) + "'", pos_);
    if (t.children.empty()) Fail("a node without a word or children", open);
    ++pos_;
    return t;
  }

  std::string_view Atom() {
    size_t start = pos_;
    while (!AtEnd() && !IsSpace(s_[pos_]) && s_[pos_] != '(' && s_[pos_] != ')') ++pos_;
    return s_.substr(start, pos_ - start);
  }
  void SkipSpace() {
    while (!AtEnd() && IsSpace(s_[pos_])) ++pos_;
  }
  static bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
  bool AtEnd() const { return pos_ >= s_.size(); }
  [[noreturn]] void Fail(const std::string& message) const { Fail(message, pos_); }
  [[noreturn]] void Fail(const std::string& message, size_t at) const {
    throw std::invalid_argument("column " + std::to_string(at + 1) + ": " + message);
  }

  std::string_view s_;
  size_t pos_ = 0;
  int nodes_ = 0;
};

void CountWords(const Tree& t, std::unordered_map<std::string, int>& counts, std::vector<std::string>& order) {
  if (t.children.empty()) {
    if (counts[t.word]++ == 0) order.push_back(t.word);
    return;
  }
  for (const Tree& c : t.children) CountWords(c, counts, order);
}

treelstm::TokenTree Tokens(const Tree& t, const Vocabulary& v) {
  if (t.children.empty()) return {v.Id(t.word), {}};
  treelstm::TokenTree out{Vocabulary::kNode, {}};
  out.children.reserve(t.children.size());
  for (const Tree& c : t.children) out.children.push_back(Tokens(c, v));
  return out;
}

}  // namespace

Tree Parse(std::string_view line) { return Parser(line).Run(); }

FileReport ReadFile(const std::string& path, bool strict) {
  std::ifstream in = OpenInputFile(path);
  FileReport report;
  std::string line;
  bool too_long = false;
  for (int number = 1; ReadLine(in, line, too_long, treelstm::kMaxLineBytes, /*skip_long_lines=*/true); ++number) {
    if (!too_long && line.find_first_not_of(" \t\r") == std::string::npos) continue;
    try {
      if (too_long) throw std::invalid_argument(LineTooLong(treelstm::kMaxLineBytes));
      report.trees.push_back(Parse(line));
    } catch (const std::invalid_argument& e) {
      std::string message = path + ":" + std::to_string(number) + ": " + e.what();
      if (strict) throw std::runtime_error(message);
      report.errors.push_back(std::move(message));
    }
  }
  return report;
}

Vocabulary Vocabulary::Build(const std::vector<Tree>& trees, int min_count) {
  std::unordered_map<std::string, int> counts;
  std::vector<std::string> order;
  for (const Tree& t : trees) CountWords(t, counts, order);
  Vocabulary v;
  v.words_ = {"<node>", "<unk>"};
  for (const std::string& w : order) {
    if (counts[w] < min_count) continue;
    v.ids_.emplace(w, v.size());
    v.words_.push_back(w);
  }
  return v;
}

int Vocabulary::Id(const std::string& word) const {
  auto it = ids_.find(word);
  return it == ids_.end() ? kUnknown : it->second;
}

const std::string& Vocabulary::Word(int id) const {
  if (id < 0 || id >= size()) throw std::out_of_range("no word with id " + std::to_string(id));
  return words_[id];
}

treelstm::Example ToExample(const Tree& tree, const Vocabulary& vocabulary) {
  return {Tokens(tree, vocabulary), tree.label};
}

}  // namespace pejit::sst
