// The calling convention of compiled code (ir/abi.h): the leaves a call
// passes, the results code returns in each mode, and the answer rebuilt from
// them, which must be the interpreter's for the same call.
#include "ir/abi.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "interp/interpreter.h"
#include "ir/module.h"

namespace pejit {
namespace {

Value F32(std::vector<float> v) { return Value(Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v)); }
Value I64(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

TEST(FlattenTest, ArgumentsLeftToRightEachDepthFirstStaticOnesLeftOut) {
  std::vector<Value> args = {Value::Tuple({I64(3), F32({1, 2})}), F32({9}), Value::Tuple({F32({4}), I64(5)})};
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, {}, &first);
  ASSERT_EQ(leaves.size(), 5u);
  EXPECT_EQ(first, (std::vector<size_t>{0, 2, 3}));
  EXPECT_EQ(leaves[1].data<float>()[1], 2.0f);
  EXPECT_EQ(leaves[4].data<int64_t>()[0], 5);
  leaves = Flatten(args, {false, true}, &first);  // argument 1 static
  EXPECT_EQ(leaves.size(), 4u);
  EXPECT_EQ(first, (std::vector<size_t>{0, 2, 2}));
}

TEST(FloatWrtLeavesTest, TheFloatLeavesOfTheWrtArgumentsInFlattenOrder) {
  // Leaves: 0 word (i64), 1 emb; 2 label (i64); 3 w, 4 b, 5 step (i64).
  std::vector<Value> args = {Value::Tuple({I64(3), F32({1, 2})}), I64(1),
                             Value::Tuple({F32({1}), F32({2}), I64(7)})};
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{2}), (std::vector<int>{3, 4}));
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{2, 0}), (std::vector<int>{1, 3, 4}));  // ascending
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{0, 0}), (std::vector<int>{1}));        // each once
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{1}), (std::vector<int>{}));            // integers have none
}

TEST(FloatWrtLeavesTest, StaticArgumentsHaveNoLeaves) {
  std::vector<Value> args = {F32({1}), F32({2}), F32({3})};
  // Argument 0 is static: Flatten skips it, so argument 2's leaf is index 1.
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{2}, {true}), (std::vector<int>{1}));
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{0}, {true}), (std::vector<int>{}));
}

TEST(FloatWrtLeavesTest, FromLeavesAlreadyFlattened) {
  std::vector<Value> args = {I64(1), Value::Tuple({F32({1}), F32({2})})};
  std::vector<Tensor> leaves = Flatten(args);
  std::vector<size_t> first = {0, 1};
  EXPECT_EQ(FloatWrtLeaves(leaves, first, std::vector<int>{1}), FloatWrtLeaves(args, std::vector<int>{1}));
}

TEST(FloatWrtLeavesTest, AnIndexThatNamesNoArgumentIsRefused) {
  try {
    FloatWrtLeaves({F32({1})}, std::vector<int>{3});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "gradient with respect to argument 3: there is no such argument (the call has 1)");
  }
}

TEST(CompilableWrtTest, DistinctDynamicArgumentsOnly) {
  EXPECT_TRUE(CompilableWrt({0, 2}, 3, {}));
  EXPECT_TRUE(CompilableWrt({}, 3, {}));
  EXPECT_FALSE(CompilableWrt({0, 0}, 3, {}));       // named twice: the interpreter's
  EXPECT_FALSE(CompilableWrt({3}, 3, {}));          // no such argument
  EXPECT_FALSE(CompilableWrt({-1}, 3, {}));
  EXPECT_FALSE(CompilableWrt({1}, 3, {false, true}));  // static: no leaves to differentiate
}

TEST(LayoutOfTest, ValueModeReturnsTheResultsLeavesGradModeTheLossThenOnePerFloatLeaf) {
  Type ret = TupleTy({TensorTy(DType::kF32, {2}), TupleTy({TensorTy(DType::kF32, {}), TensorTy(DType::kI64, {})})});
  std::vector<Value> args = {Value::Tuple({I64(3), F32({1, 2})}), I64(1), Value::Tuple({F32({1}), F32({2})})};
  CallLayout value = LayoutOf(ret, args, {}, nullptr);
  EXPECT_EQ(value.results, 3u);
  EXPECT_TRUE(value.gradient_result.empty());
  const std::vector<int> wrt{2, 0};
  CallLayout grad = LayoutOf(TensorTy(DType::kF32, {}), args, {}, &wrt);
  EXPECT_EQ(grad.wrt_leaves, (std::vector<int>{1, 3, 4}));
  EXPECT_EQ(grad.results, 4u);
  EXPECT_EQ(grad.gradient_result, (std::vector<int>{-1, 1, -1, 2, 3}));
}

TEST(FromResultsTest, ValueModeRebuildsTheResultTypeAndRefusesExtraTensors) {
  Type ret = TupleTy({TensorTy(DType::kF32, {1}), TensorTy(DType::kF32, {2})});
  std::vector<Tensor> results = {F32({1}).tensor(), F32({2, 3}).tensor()};
  ValueAndGrad out = FromResults(ret, {}, nullptr, {}, {}, {}, results);
  EXPECT_TRUE(ValueEqual(out.value, Value::Tuple({F32({1}), F32({2, 3})})));
  results.push_back(F32({4}).tensor());
  EXPECT_THROW(FromResults(ret, {}, nullptr, {}, {}, {}, results), std::logic_error);
}

TEST(FromResultsTest, AnIntegerLeafStandsForItselfAndAnUndefinedGradientIsZeros) {
  std::vector<Value> args = {Value::Tuple({I64(3), F32({1, 2}), F32({5})})};
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, {}, &first);
  const std::vector<int> wrt{0};
  CallLayout layout = LayoutOf(TensorTy(DType::kF32, {}), args, {}, &wrt);
  Tensor loss = Tensor::FromVector<float>({}, {7});
  ValueAndGrad out = FromResults(nullptr, args, &wrt, leaves, first, layout.gradient_result,
                                 {loss, F32({0.5f, 0.25f}).tensor(), Tensor()});
  EXPECT_TRUE(ValueEqual(out.value, Value(loss)));
  ASSERT_EQ(out.grads.size(), 1u);
  EXPECT_TRUE(ValueEqual(out.grads[0], Value::Tuple({I64(3), F32({0.5f, 0.25f}), F32({0})})));
  EXPECT_THROW(FromResults(nullptr, args, &wrt, leaves, first, {1, 2}, {loss}), std::logic_error);
}

// What compiled code returns for a call, laid out by the convention from the
// interpreter's own gradients, rebuilds to the interpreter's answer.
TEST(FromResultsTest, RebuildsWhatTheInterpreterAnswers) {
  Module m;
  m.AddSource(R"(
type P = {w: Tensor[(2,), f32], k: Tensor[(), i64], b: Tensor[(2,), f32]};
def @loss(%x: Tensor[(2,), f32], %p: P, %n: Tensor[(), i64]) -> Tensor[(), f32] {
  sum(mul(add(mul(%x, %p.w), %p.b), %x))
}
)",
              "abi.pj");
  std::vector<Value> args = {F32({1, 3}), Value::Tuple({F32({2, -1}), I64(4), F32({0.5f, 2})}), I64(2)};
  const std::vector<int> wrt{1, 0};
  ValueAndGrad want = Interpreter().CallWithGrad(*m.snapshot(), "loss", args, wrt);
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, {}, &first);
  CallLayout layout = LayoutOf(TensorTy(DType::kF32, {}), args, {}, &wrt);
  ASSERT_EQ(layout.wrt_leaves, (std::vector<int>{0, 1, 3}));
  // The interpreter's gradients, leaf by leaf, where the layout puts them.
  std::vector<Tensor> results(layout.results);
  results[0] = want.value.tensor();
  results[layout.gradient_result[0]] = want.grads[1].tensor();
  results[layout.gradient_result[1]] = want.grads[0].fields()[0].tensor();
  results[layout.gradient_result[3]] = want.grads[0].fields()[2].tensor();
  ValueAndGrad got = FromResults(nullptr, args, &wrt, leaves, first, layout.gradient_result, results);
  EXPECT_TRUE(ValueEqual(got.value, want.value));
  ASSERT_EQ(got.grads.size(), 2u);
  EXPECT_TRUE(ValueEqual(got.grads[0], want.grads[0]));
  EXPECT_TRUE(ValueEqual(got.grads[1], want.grads[1]));
}

}  // namespace
}  // namespace pejit
