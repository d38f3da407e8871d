#include "examples/treelstm/listops.h"

#include <algorithm>
#include <charconv>
#include <functional>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "support/input_file.h"

namespace pejit::listops {
namespace {

const char* OperatorName(int token) {
  switch (token) {
    case kMax: return "[MAX";
    case kMin: return "[MIN";
    case kMed: return "[MED";
    case kSm: return "[SM";
  }
  return "?";
}

Expr GenerateAt(Rng& rng, int depth, const GeneratorOptions& o) {
  Expr e;
  e.token = kMax + static_cast<int>(rng.NextInt(0, 4));
  int n = static_cast<int>(rng.NextInt(o.min_args, o.max_args + 1));
  for (int i = 0; i < n; ++i) {
    if (depth + 1 < o.max_depth && rng.NextUniform() < o.nested_probability) {
      e.children.push_back(GenerateAt(rng, depth + 1, o));
    } else {
      e.children.push_back(Expr{static_cast<int>(rng.NextInt(0, 10)), {}});
    }
  }
  return e;
}

void Append(const Expr& e, std::string& out) {
  if (e.children.empty()) {
    out += std::to_string(e.token);
    return;
  }
  out += OperatorName(e.token);
  for (const Expr& a : e.children) {
    out += ' ';
    Append(a, out);
  }
  out += " ]";
}

}  // namespace

int Evaluate(const Expr& e) {
  if (e.children.empty()) return e.token;
  std::vector<int> v;
  for (const Expr& a : e.children) v.push_back(Evaluate(a));
  switch (e.token) {
    case kMax: return *std::max_element(v.begin(), v.end());
    case kMin: return *std::min_element(v.begin(), v.end());
    case kMed: {
      std::sort(v.begin(), v.end());
      size_t n = v.size();
      return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    }
    case kSm: {
      int sum = 0;
      for (int x : v) sum += x;
      return sum % 10;
    }
  }
  throw std::invalid_argument("ListOps: unknown operator token " + std::to_string(e.token));
}

std::string ToString(const Expr& e) {
  std::string out;
  Append(e, out);
  return out;
}

Expr Generate(Rng& rng, const GeneratorOptions& options) { return GenerateAt(rng, 0, options); }

Splits GenerateSplits(uint64_t seed, int train, int dev, int test, const GeneratorOptions& options) {
  Rng rng(seed);
  std::unordered_set<std::string> seen;
  Splits s;
  auto fill = [&](std::vector<Example>& split, int count) {
    // Small expressions repeat; give up on uniqueness only after many tries.
    int attempts = 0;
    while (static_cast<int>(split.size()) < count) {
      Expr e = Generate(rng, options);
      if (!seen.insert(ToString(e)).second) {
        if (++attempts > 100 * count + 1000) throw std::runtime_error("ListOps: not enough distinct expressions");
        continue;
      }
      int label = Evaluate(e);
      split.push_back({std::move(e), label});
    }
  };
  fill(s.train, train);
  fill(s.dev, dev);
  fill(s.test, test);
  return s;
}

Expr Parse(const std::string& text) {
  std::vector<std::string> tokens;
  std::istringstream in(text);
  // The binarized release's parentheses group arguments in pairs: they carry
  // no meaning for the Tree-LSTM, but must balance.
  int open_parentheses = 0, position = 0;
  for (std::string t; in >> t;) {
    ++position;
    if (t == "(") {
      ++open_parentheses;
    } else if (t == ")") {
      if (--open_parentheses < 0) throw std::invalid_argument("')' without its '(' at token " + std::to_string(position));
    } else {
      tokens.push_back(t);
    }
  }
  if (open_parentheses > 0) throw std::invalid_argument(std::to_string(open_parentheses) + " '(' never closed");
  int nodes = 0;
  size_t pos = 0;
  std::function<Expr(int)> parse = [&](int depth) -> Expr {
    if (depth > kMaxParseDepth) {
      throw std::invalid_argument("expressions nested deeper than " + std::to_string(kMaxParseDepth) + " levels are refused");
    }
    if (pos >= tokens.size()) throw std::invalid_argument("expression ends early");
    if (++nodes > treelstm::kMaxTreeNodes) {
      throw std::invalid_argument("expressions of more than " + std::to_string(treelstm::kMaxTreeNodes) +
                                  " operators and digits are refused");
    }
    const std::string& t = tokens[pos++];
    if (t.size() == 1 && t[0] >= '0' && t[0] <= '9') return Expr{t[0] - '0', {}};
    Expr e;
    if (t == "[MAX") e.token = kMax;
    else if (t == "[MIN") e.token = kMin;
    else if (t == "[MED") e.token = kMed;
    else if (t == "[SM") e.token = kSm;
    else throw std::invalid_argument("unknown token '" + t + "' at token " + std::to_string(pos));
    while (pos < tokens.size() && tokens[pos] != "]") e.children.push_back(parse(depth + 1));
    if (pos >= tokens.size()) throw std::invalid_argument("missing ']' for " + t);
    ++pos;
    if (e.children.empty()) throw std::invalid_argument(t + " has no arguments");
    return e;
  };
  Expr e = parse(1);
  if (pos != tokens.size()) throw std::invalid_argument("extra tokens after the expression at token " + std::to_string(pos + 1));
  if (e.children.empty()) throw std::invalid_argument("the expression is a single digit, not an operator");
  return e;
}

FileReport ReadFile(const std::string& path, bool strict) {
  std::ifstream in = OpenInputFile(path);
  FileReport report;
  std::string line;
  bool expression_first = false, too_long = false;
  for (int number = 1; ReadLine(in, line, too_long, treelstm::kMaxLineBytes, /*skip_long_lines=*/true); ++number) {
    if (line.empty() && !too_long) continue;
    if (number == 1 && line.rfind("Source\tTarget", 0) == 0) {
      expression_first = true;
      continue;
    }
    try {
      if (too_long) throw std::invalid_argument(LineTooLong(treelstm::kMaxLineBytes));
      size_t tab = line.find('\t');
      if (tab == std::string::npos) throw std::invalid_argument("expected label<TAB>expression");
      std::string label_text = expression_first ? line.substr(tab + 1) : line.substr(0, tab);
      std::string expr_text = expression_first ? line.substr(0, tab) : line.substr(tab + 1);
      int label = -1;
      auto [end, ec] = std::from_chars(label_text.data(), label_text.data() + label_text.size(), label);
      if (ec != std::errc() || end != label_text.data() + label_text.size() || label < 0 || label >= kClasses) {
        throw std::invalid_argument("bad label '" + label_text + "' (expected 0-9)");
      }
      Expr e = Parse(expr_text);
      // The label is the expression's value: a line that says otherwise is
      // damaged, and training on it would teach a wrong answer.
      if (int value = Evaluate(e); value != label) {
        throw std::invalid_argument("label " + std::to_string(label) + " is not the expression's value " +
                                    std::to_string(value));
      }
      report.examples.push_back({std::move(e), label});
    } catch (const std::exception& err) {
      std::string message = path + ":" + std::to_string(number) + ": " + err.what();
      if (strict) throw std::runtime_error(message);
      report.errors.push_back(message);
    }
  }
  return report;
}

}  // namespace pejit::listops
