// \file ListOps (Nangia & Bowman, 2018): nested list operations over digits,
// generated in-process from a seed, and read from files.
//
// An expression is an operator applied to 2-5 arguments, each a nested
// expression (probability 0.25, below the depth limit) or a digit:
//   MAX, MIN   the largest, smallest argument
//   MED        the median, rounded down
//   SM         the sum modulo 10
// Written in prefix form with closing brackets: "[MAX 2 9 [MIN 4 7 ] 1 ]",
// whose value (the label, 0-9) is 9.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "examples/treelstm/data.h"
#include "ops/random.h"

namespace pejit::listops {

// Tokens: digits 0-9 are themselves; operators follow.
enum Token : int { kMax = 10, kMin = 11, kMed = 12, kSm = 13 };
inline constexpr int kVocabularySize = 14;
inline constexpr int kClasses = 10;

// An expression: a digit (leaf) or an operator (inner node) and its
// arguments (children); its label is its value.
using Expr = treelstm::TokenTree;
using Example = treelstm::Example;

struct GeneratorOptions {
  int max_depth = 10;             // arguments at this depth are digits
  int min_args = 2, max_args = 5;
  double nested_probability = 0.25;
};

int Evaluate(const Expr& e);
std::string ToString(const Expr& e);  // "[MAX 2 9 [MIN 4 7 ] 1 ]"

// One random expression.
Expr Generate(Rng& rng, const GeneratorOptions& options = {});

struct Splits {
  std::vector<Example> train, dev, test;
};
// Three splits of distinct expressions (no expression in two splits),
// deterministic for a seed.
Splits GenerateSplits(uint64_t seed, int train, int dev, int test, const GeneratorOptions& options = {});

// Parses an expression: tokens separated by spaces; '(' and ')' (as in the
// binarized release) must balance and are otherwise ignored. Throws
// std::invalid_argument with the position of the problem, for expressions
// nested deeper than kMaxParseDepth (rather than recursing into them) and
// for those of more than treelstm::kMaxTreeNodes nodes.
inline constexpr int kMaxParseDepth = 256;
Expr Parse(const std::string& text);

struct FileReport {
  std::vector<Example> examples;
  std::vector<std::string> errors;  // "file:line: message" for each skipped line
};
// Reads a ListOps file: one example a line, "label<TAB>expression", or with a
// header "Source<TAB>Target" (Long Range Arena) "expression<TAB>label".
// Malformed lines, and lines whose label is not their expression's value,
// are skipped and reported; with `strict` the first one throws.
FileReport ReadFile(const std::string& path, bool strict = false);

}  // namespace pejit::listops
