#include "examples/treelstm/model.h"

#include <cstring>

namespace pejit {
extern const char kTreeLstmSource[];  // treelstm_source.cc, generated from treelstm.pj
}

namespace pejit::treelstm {

std::string_view ModelSource() { return kTreeLstmSource; }

Value InitParams(Rng& rng, const Sizes& s) {
  const int64_t e = s.embed, h = s.hidden;
  Tensor b_f = Tensor::Ones(DType::kF32, {h});
  return Value::Tuple({
      Value(RandomNormal(rng, {s.vocabulary, e}, 0, 0.1)),
      Value(XavierUniform(rng, {3 * h, e})),
      Value(XavierUniform(rng, {3 * h, h})),
      Value(Tensor::Zeros(DType::kF32, {3 * h})),
      Value(XavierUniform(rng, {h, e})),
      Value(XavierUniform(rng, {h, h})),
      Value(b_f),
      Value(XavierUniform(rng, {s.classes, h})),
      Value(Tensor::Zeros(DType::kF32, {s.classes})),
  });
}

namespace {

Value Token(int t) { return Value(Tensor::FromVector<int64_t>({}, {t})); }

Value ListOf(const std::vector<Value>& items, const TypeDefPtr& list) {
  Value v = Value::Adt(list, list->FindCtor("Nil"), {});
  int cons = list->FindCtor("Cons");
  for (auto it = items.rbegin(); it != items.rend(); ++it) v = Value::Adt(list, cons, {*it, v});
  return v;
}

}  // namespace

Value TreeValue(const TokenTree& t, const ModuleSnapshot& module) {
  TypeDefPtr tree = module.FindType("Tree"), list = module.FindType("List");
  if (t.children.empty()) return Value::Adt(tree, tree->FindCtor("Leaf"), {Token(t.token)});
  std::vector<Value> children;
  for (const TokenTree& c : t.children) children.push_back(TreeValue(c, module));
  return Value::Adt(tree, tree->FindCtor("Node"), {Token(t.token), ListOf(children, list)});
}

Batch MakeBatch(const std::vector<const Example*>& examples, const ModuleSnapshot& module) {
  Batch b;
  std::vector<Value> trees;
  std::vector<int64_t> labels;
  for (const Example* ex : examples) {
    trees.push_back(TreeValue(ex->tree, module));
    labels.push_back(ex->label);
    b.nodes += CountNodes(ex->tree);
  }
  b.trees = ListOf(trees, module.FindType("List"));
  b.labels = Value(Tensor::FromVector<int64_t>({static_cast<int64_t>(labels.size())}, labels));
  return b;
}

Batch GeneratedListOpsBatch(uint64_t seed, int trees, const ModuleSnapshot& module) {
  listops::Splits data = listops::GenerateSplits(seed, trees, 0, 0);
  std::vector<const Example*> batch;
  for (const auto& ex : data.train) batch.push_back(&ex);
  return MakeBatch(batch, module);
}

}  // namespace pejit::treelstm
