// A value's tensor leaves (ir/value.h): the order every tier agrees on, and
// the rebuild that puts gradients back in an argument's shape.
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>

#include "ir/value.h"

namespace pejit {
namespace {

Value F32(float v) { return Value(Tensor::Scalar(v)); }
Value I64(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

// List = Nil | Cons(Tensor, List), built by hand: this test needs no parser.
TypeDefPtr ListType() {
  auto list = std::make_shared<TypeDef>();
  list->name = "List";
  list->ctors = {CtorDef{"Nil", {}}, CtorDef{"Cons", {TensorTy(TensorType{DType::kF32, {}}), Type()}}};
  return list;
}

Value List(const TypeDefPtr& type, int n) {
  Value v = Value::Adt(type, 0, {});
  for (int i = n; i-- > 0;) v = Value::Adt(type, 1, {F32(static_cast<float>(i)), v});
  return v;
}

std::vector<double> Numbers(const std::vector<Tensor>& leaves) {
  std::vector<double> out;
  for (const Tensor& t : leaves) out.push_back(t.ElementAsDouble(0));
  return out;
}

TEST(TensorLeavesTest, AreTheTensorsDepthFirstFieldsLeftToRight) {
  TypeDefPtr list = ListType();
  Value v = Value::Tuple({Value::Tuple({F32(1), I64(2)}), List(list, 2), F32(5)});
  EXPECT_EQ(Numbers(TensorLeaves(v)), (std::vector<double>{1, 2, 0, 1, 5}));
  EXPECT_EQ(Numbers(TensorLeaves(F32(7))), (std::vector<double>{7}));
  EXPECT_TRUE(TensorLeaves(Value::Adt(list, 0, {})).empty());
}

// Nested tuples of random widths (empty ones included), tensors at every depth.
Value RandomNest(uint64_t& state, int depth) {
  state = state * 6364136223846793005ull + 1442695040888963407ull;
  const int width = static_cast<int>(state >> 61);  // 0 .. 7
  if (depth == 0 || width == 7) return F32(static_cast<float>(state >> 40));
  std::vector<Value> fields;
  for (int k = 0; k < width; ++k) fields.push_back(RandomNest(state, depth - 1));
  return Value::Tuple(std::move(fields));
}

void Preorder(const Value& v, std::vector<const Value*>& out) {
  out.push_back(&v);
  if (v.kind() == Value::Kind::kTuple || v.kind() == Value::Kind::kAdt) {
    for (const Value& f : v.fields()) Preorder(f, out);
  }
}

TEST(ForEachNodeTest, VisitsEveryNodeBeforeItsFieldsFieldsLeftToRight) {
  uint64_t state = 7;
  for (int trial = 0; trial < 20; ++trial) {
    Value v = RandomNest(state, 6);
    std::vector<const Value*> want, got;
    Preorder(v, want);
    ForEachNode(v, [&](const Value& node) { got.push_back(&node); });
    EXPECT_EQ(got, want) << "trial " << trial << ": " << v.Describe();
  }
}

TEST(ReplaceTensorLeavesTest, KeepsTheStructureAndPutsEachLeafInItsPlace) {
  TypeDefPtr list = ListType();
  Value v = Value::Tuple({F32(1), List(list, 2), Value::Tuple({})});
  std::vector<Value> doubled;
  for (const Tensor& t : TensorLeaves(v)) doubled.push_back(F32(static_cast<float>(2 * t.ElementAsDouble(0))));
  Value w = ReplaceTensorLeaves(v, doubled);
  EXPECT_EQ(Numbers(TensorLeaves(w)), (std::vector<double>{2, 0, 2}));
  // The same constructors and arities: only the leaves changed.
  EXPECT_TRUE(ValueEqual(w, Value::Tuple({F32(2), Value::Adt(list, 1, {F32(0), Value::Adt(list, 1, {F32(2), Value::Adt(list, 0, {})})}),
                                         Value::Tuple({})})));
  // Its own leaves give the value back.
  std::vector<Value> same;
  for (const Tensor& t : TensorLeaves(v)) same.emplace_back(t);
  EXPECT_TRUE(ValueEqual(ReplaceTensorLeaves(v, same), v));
}

TEST(ReplaceTensorLeavesTest, RefusesTooFewOrTooManyLeaves) {
  Value v = Value::Tuple({F32(1), F32(2)});
  std::vector<Value> one = {F32(0)}, three = {F32(0), F32(0), F32(0)};
  EXPECT_THROW(ReplaceTensorLeaves(v, one), std::invalid_argument);
  EXPECT_THROW(ReplaceTensorLeaves(v, three), std::invalid_argument);
}

TEST(TensorLeavesTest, WalkAListAsDeepAsItsDataWithoutTheNativeStack) {
  TypeDefPtr list = ListType();
  const int n = 200'000;  // nested 200,000 deep: recursion would overflow 8 MiB
  Value v = List(list, n);
  std::vector<Tensor> leaves = TensorLeaves(v);
  ASSERT_EQ(leaves.size(), static_cast<size_t>(n));
  std::vector<Value> values(leaves.begin(), leaves.end());
  Value w = ReplaceTensorLeaves(v, values);
  std::vector<Tensor> again = TensorLeaves(w);
  ASSERT_EQ(again.size(), static_cast<size_t>(n));
  EXPECT_EQ(again[n - 1].ElementAsDouble(0), n - 1);
}

}  // namespace
}  // namespace pejit
