// Structural call instances (PeOptions::record_instances): every node of the
// data a recursion walks is one instance, and instances with one key (the
// function, the clauses they took, the types they receive and get back from
// their own calls) emit the same code. That is what the generic tier's cells
// rest on (docs/architecture.md): checked on random minibatches of three
// models.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "ir/module.h"
#include "ir/printer.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Residual::binding_instance's order: main's let-bindings, outermost first.
std::vector<const LetNode*> Bindings(const Func& main) {
  std::vector<const LetNode*> out;
  const ExprNode* e = main->body.get();
  while (e->kind == ExprKind::kLet) {
    const auto* let = static_cast<const LetNode*>(e);
    out.push_back(let);
    e = let->body.get();
  }
  return out;
}

// The code every instance emitted, as text that names no variable: each
// binding's operator (or projection, tuple), attributes and type, and for
// each operand where it comes from, relative to the instance: its own k-th
// binding, an atom of its arguments or of the result of its p-th call (by
// path), or a constant. Anything else would be a value no cell can take.
struct InstanceCode {
  std::string text;
  std::vector<const ExprNode*> reads;  // the argument atoms it reads, in order of first use
};

std::vector<InstanceCode> CodeOfInstances(const Residual& r) {
  std::vector<const LetNode*> lets = Bindings(r.main);
  EXPECT_EQ(lets.size(), r.binding_instance.size());
  std::map<const ExprNode*, std::pair<int, int>> defined;  // var -> (instance, local index)
  std::vector<int> count(r.instances.size(), 0);
  std::vector<std::vector<int>> calls(r.instances.size());
  for (size_t i = 1; i < r.instances.size(); ++i) calls[r.instances[i].parent].push_back(static_cast<int>(i));
  // Every path an atom is at ("1|2": one value passed twice; "()": the
  // whole result), or nothing.
  auto path_in = [](const std::vector<std::pair<std::string, Expr>>& atoms, const Expr& a) -> std::string {
    std::string out;
    for (const auto& [path, atom] : atoms) {
      if (atom.get() == a.get()) out += (out.empty() ? "" : "|") + (path.empty() ? "()" : path);
    }
    return out;
  };
  std::vector<InstanceCode> code(r.instances.size());
  for (size_t i = 0; i < lets.size() && i < r.binding_instance.size(); ++i) {
    int at = r.binding_instance[i];
    auto where = [&](const Expr& a) -> std::string {
      if (a->kind == ExprKind::kConstant) return "const";
      auto it = defined.find(a.get());
      if (it != defined.end() && it->second.first == -1) return "const";
      if (it != defined.end() && it->second.first == at) return "self:" + std::to_string(it->second.second);
      if (std::string path = path_in(r.instances[at].arg_atoms, a); !path.empty()) {
        std::vector<const ExprNode*>& reads = code[at].reads;
        if (std::find(reads.begin(), reads.end(), a.get()) == reads.end()) reads.push_back(a.get());
        return "arg " + path;
      }
      for (size_t p = 0; p < calls[at].size(); ++p) {
        if (std::string path = path_in(r.instances[calls[at][p]].result_atoms, a); !path.empty()) {
          return "call" + std::to_string(p) + " " + path;
        }
      }
      return "elsewhere";
    };
    std::string line;
    const Expr& value = lets[i]->value;
    if (auto* call = As<OpCallNode>(value)) {
      line = call->op->name + "(" + call->attrs.ToString() + ")";
      for (const Expr& a : call->args) line += " " + where(a);
    } else if (auto* proj = As<ProjNode>(value)) {
      line = "." + std::to_string(proj->index) + " " + where(proj->tuple);
    } else if (auto* tuple = As<TupleNode>(value)) {
      line = "tuple";
      for (const Expr& f : tuple->fields) line += " " + where(f);
    } else {
      line = PrintExpr(value);
    }
    if (at >= 0) code[at].text += line + " : " + (lets[i]->var->annotation ? TypeToString(lets[i]->var->annotation) : std::string("?")) + "\n";
    defined[lets[i]->var.get()] = {at, at >= 0 ? count[at]++ : 0};
  }
  return code;
}

// The key: the function, its clauses, the types (and static values) it
// receives, what its calls return, and which of the argument paths its code
// reads hold one value (a value passed twice may be folded differently).
std::string KeyOf(const Residual& r, size_t i, const InstanceCode& code) {
  const CallInstance& c = r.instances[i];
  std::string key = c.function + " clauses";
  for (int k : c.clauses) key += " " + std::to_string(k);
  key += " args (" + c.arg_types + ") calls";
  for (size_t j = 0; j < r.instances.size(); ++j) {
    if (r.instances[j].parent == static_cast<int>(i)) key += " " + r.instances[j].result_type;
  }
  key += " reads";
  for (const ExprNode* atom : code.reads) {
    for (const auto& [path, a] : c.arg_atoms) {
      if (a.get() == atom) key += " " + path;
    }
    key += ";";
  }
  return key;
}

// Instances with one key emitted one code; returns the number of keys.
size_t ExpectOneCodePerKey(const Residual& r) {
  std::vector<InstanceCode> code = CodeOfInstances(r);
  std::map<std::string, size_t> first;
  for (size_t i = 0; i < r.instances.size(); ++i) {
    auto [it, added] = first.try_emplace(KeyOf(r, i, code[i]), i);
    if (!added) {
      EXPECT_EQ(code[i].text, code[it->second].text) << "instances " << it->second << " and " << i << " of "
                                                      << it->first;
    }
    EXPECT_EQ(code[i].text.find("elsewhere"), std::string::npos) << code[i].text;
  }
  return first.size();
}

Value List(const ModuleSnapshot& m, std::vector<Value> items) {
  TypeDefPtr list = m.FindType("List");
  Value out = Value::Adt(list, 0, {});
  for (auto it = items.rbegin(); it != items.rend(); ++it) out = Value::Adt(list, 1, {*it, out});
  return out;
}

Value Scalar(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

TEST(InstancesTest, EveryTreeNodeOfATreeLstmMinibatchIsOneInstance) {
  Module module;
  module.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot s = module.snapshot();
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(11, 6, *s);
  // Every node but the six roots is one node's child.
  const int nodes = b.nodes, children = b.nodes - 6;
  Rng rng(2);
  std::vector<Value> args = {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, 4, 6, 10})};
  PeOptions options;
  options.record_instances = true;
  Residual r = PartialEvaluate(*s, "loss", args, {}, options);

  std::map<std::string, int> per_function;
  for (const CallInstance& c : r.instances) ++per_function[c.function];
  EXPECT_EQ(per_function["loss"], 1);
  EXPECT_EQ(per_function["roots"], 6);
  EXPECT_EQ(per_function["tree"], nodes);
  EXPECT_EQ(per_function["children"], children);
  EXPECT_EQ(per_function.size(), 4u) << "helpers without a match (@cell, @gated, @logits) are inlined";
  EXPECT_EQ(r.instances[0].parent, -1);
  size_t keys = ExpectOneCodePerKey(r);
  // @tree: leaf, inner node; @children: last child, more; @roots: one per
  // length of the rest of the list (its concat's rows); @loss.
  EXPECT_LE(keys, 4u + 6u + 1u);
}

TEST(InstancesTest, TheSameKeyEmitsTheSameCodeInARecursionWithALossAtEveryNode) {
  Module module;
  module.AddSource(ReadFile("tests/tools/testdata/tree_rnn.pj"), "tree_rnn.pj");
  Snapshot s = module.snapshot();
  TypeDefPtr tree = s->FindType("Tree");
  Rng rng(4);
  std::function<Value(int)> random_tree = [&](int depth) -> Value {
    if (depth == 0 || rng.NextInt(0, 10) < 3) return Value::Adt(tree, 0, {Scalar(rng.NextInt(0, 20)), Scalar(rng.NextInt(0, 3))});
    return Value::Adt(tree, 1, {random_tree(depth - 1), random_tree(depth - 1), Scalar(rng.NextInt(0, 3))});
  };
  const int64_t h = 5;
  Value params = Value::Tuple({Value(RandomUniform(rng, {20, h}, -1, 1)), Value(RandomUniform(rng, {h, 2 * h}, -1, 1)),
                               Value(RandomUniform(rng, {h}, -1, 1)), Value(RandomUniform(rng, {3, h}, -1, 1)),
                               Value(RandomUniform(rng, {3}, -1, 1))});
  PeOptions options;
  options.record_instances = true;
  for (int minibatch = 0; minibatch < 5; ++minibatch) {
    std::vector<Value> trees;
    for (int i = 0; i < 3; ++i) trees.push_back(random_tree(5));
    Residual r = PartialEvaluate(*s, "loss", {List(*s, trees), params}, {}, options);
    EXPECT_LE(ExpectOneCodePerKey(r), 2u + 4u + 1u);  // leaf, node; @loss per list position; the entry
  }
}

TEST(InstancesTest, TheSameKeyEmitsTheSameCodeInAFoldOverSequences) {
  Module module;
  module.AddSource(ReadFile("tests/tools/testdata/seq_lstm.pj"), "seq_lstm.pj");
  Snapshot s = module.snapshot();
  Rng rng(6);
  const int64_t e = 3, h = 4;
  Value params = Value::Tuple({Value(RandomUniform(rng, {10, e}, -1, 1)), Value(RandomUniform(rng, {4 * h, e}, -1, 1)),
                               Value(RandomUniform(rng, {4 * h, h}, -1, 1)), Value(RandomUniform(rng, {4 * h}, -1, 1)),
                               Value(RandomUniform(rng, {3, h}, -1, 1)), Value(RandomUniform(rng, {3}, -1, 1))});
  PeOptions options;
  options.record_instances = true;
  for (int minibatch = 0; minibatch < 5; ++minibatch) {
    std::vector<Value> seqs;
    for (int i = 0; i < 4; ++i) {
      std::vector<Value> words;
      for (int64_t n = rng.NextInt(0, 6); n > 0; --n) words.push_back(Scalar(rng.NextInt(0, 10)));
      seqs.push_back(List(*s, words));
    }
    std::vector<Value> args = {List(*s, seqs), Value(Tensor::FromVector<int64_t>({4}, {0, 1, 2, 0})),
                               Value(Tensor::FromVector<float>({1, h}, std::vector<float>(h, 0.0f))), params};
    Residual r = PartialEvaluate(*s, "loss", args, {}, options);
    std::map<std::string, int> per_function;
    for (const CallInstance& c : r.instances) ++per_function[c.function];
    EXPECT_EQ(per_function["last_states"], 4);
    // @run: once per word and once at each sequence's end.
    int words = 0;
    for (const Value& q : seqs) {
      for (Value l = q; l.tag() == 1; l = l.fields()[1]) ++words;
    }
    EXPECT_EQ(per_function["run"], words + 4);
    // @run: a sequence's end, its first word (state and cell one zero
    // value), the words after; @last_states per list position; the entry.
    EXPECT_LE(ExpectOneCodePerKey(r), 3u + 4u + 1u);
  }
}

}  // namespace
}  // namespace pejit
