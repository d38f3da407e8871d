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

Value TreeValue(const listops::Expr& e, const ModuleSnapshot& module) {
  TypeDefPtr tree = module.FindType("Tree"), list = module.FindType("List");
  if (e.args.empty()) return Value::Adt(tree, tree->FindCtor("Leaf"), {Token(e.token)});
  std::vector<Value> children;
  for (const listops::Expr& a : e.args) children.push_back(TreeValue(a, module));
  return Value::Adt(tree, tree->FindCtor("Node"), {Token(e.token), ListOf(children, list)});
}

Batch MakeBatch(const std::vector<const listops::Example*>& examples, const ModuleSnapshot& module) {
  Batch b;
  std::vector<Value> trees;
  std::vector<int64_t> labels;
  for (const listops::Example* ex : examples) {
    trees.push_back(TreeValue(ex->expr, module));
    labels.push_back(ex->label);
    b.nodes += listops::CountNodes(ex->expr);
  }
  b.trees = ListOf(trees, module.FindType("List"));
  b.labels = Value(Tensor::FromVector<int64_t>({static_cast<int64_t>(labels.size())}, labels));
  return b;
}

}  // namespace pejit::treelstm
