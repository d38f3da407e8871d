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

#include "ops/random.h"

namespace pejit::listops {

// Tokens: digits 0-9 are themselves; operators follow.
enum Token : int { kMax = 10, kMin = 11, kMed = 12, kSm = 13 };
inline constexpr int kVocabularySize = 14;
inline constexpr int kClasses = 10;

struct Expr {
  int token = 0;            // a digit (leaf) or an operator (inner node)
  std::vector<Expr> args;   // empty for a digit
};

struct Example {
  Expr expr;
  int label = 0;
};

struct GeneratorOptions {
  int max_depth = 10;             // arguments at this depth are digits
  int min_args = 2, max_args = 5;
  double nested_probability = 0.25;
};

int Evaluate(const Expr& e);
std::string ToString(const Expr& e);  // "[MAX 2 9 [MIN 4 7 ] 1 ]"
int CountNodes(const Expr& e);        // tokens other than ']'
int Height(const Expr& e);            // a digit has height 0

// One random expression.
Expr Generate(Rng& rng, const GeneratorOptions& options = {});

struct Splits {
  std::vector<Example> train, dev, test;
};
// Three splits of distinct expressions (no expression in two splits),
// deterministic for a seed.
Splits GenerateSplits(uint64_t seed, int train, int dev, int test, const GeneratorOptions& options = {});

// Parses an expression: tokens separated by spaces; '(' and ')' (as in the
// binarized release) are ignored. Throws std::invalid_argument with the
// position of the problem.
Expr Parse(const std::string& text);

struct FileReport {
  std::vector<Example> examples;
  std::vector<std::string> errors;  // "file:line: message" for each skipped line
};
// Reads a ListOps file: one example a line, "label<TAB>expression", or with a
// header "Source<TAB>Target" (Long Range Arena) "expression<TAB>label".
// Malformed lines are skipped and reported; with `strict` the first one throws.
FileReport ReadFile(const std::string& path, bool strict = false);

}  // namespace pejit::listops
