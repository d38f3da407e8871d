// Bad input to an operator is refused with a message naming the operator,
// the input and the shapes involved, never a crash or a wrong answer.
#include <gtest/gtest.h>

#include "ops/eager.h"

namespace pejit {
namespace {

using Ints = std::vector<int64_t>;

// The message of the OpError thrown by fn, or "" if nothing was thrown.
template <typename Fn>
std::string ErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const OpError& e) {
    return e.what();
  }
  return "";
}

Tensor F(Shape s) { return Tensor::Zeros(DType::kF32, std::move(s)); }
Tensor I(Shape s) { return Tensor::Zeros(DType::kI64, std::move(s)); }

TEST(OpErrors, MatmulNamesBothShapes) {
  EXPECT_EQ(ErrorOf([] { CallOp("matmul", {F({3, 4}), F({5, 2})}); }),
            "matmul: inner dimensions differ: lhs (3, 4) vs rhs (5, 2)");
  EXPECT_EQ(ErrorOf([] { CallOp("matmul", {F({3}), F({3, 2})}); }),
            "matmul: inputs must both be rank 2 or both rank 3: lhs (3,) vs rhs (3, 2)");
  EXPECT_EQ(ErrorOf([] { CallOp("matmul", {F({2, 3, 4}), F({3, 4, 5})}); }),
            "matmul: batch dimensions differ: lhs (2, 3, 4) vs rhs (3, 4, 5)");
}

TEST(OpErrors, BroadcastFailureNamesBothInputs) {
  EXPECT_EQ(ErrorOf([] { CallOp("add", {F({3, 4}), F({5})}); }), "add: cannot broadcast lhs (3, 4) with rhs (5,)");
}

TEST(OpErrors, MixedDTypesAreRefused) {
  EXPECT_EQ(ErrorOf([] { CallOp("mul", {F({2}), I({2})}); }),
            "mul: dtypes differ: lhs Tensor[(2,), f32] vs rhs Tensor[(2,), i64]");
  EXPECT_EQ(ErrorOf([] { CallOp("exp", {I({2})}); }), "exp: does not take Tensor[(2,), i64]");
  EXPECT_EQ(ErrorOf([] { CallOp("div", {I({2}), I({2})}); }), "div: does not take i64 inputs");
}

TEST(OpErrors, UnknownOperatorSuggestsTheClosest) {
  EXPECT_EQ(ErrorOf([] { LookupOp("matmull"); }), "matmull: unknown operator 'matmull'; did you mean 'matmul'?");
  EXPECT_EQ(ErrorOf([] { LookupOp("frobnicate"); }), "frobnicate: unknown operator 'frobnicate'");
}

TEST(OpErrors, AttributesAreCheckedAgainstTheSchema) {
  EXPECT_EQ(ErrorOf([] { CallOp("sum", {F({2})}, {{"axs", Ints{0}}}); }),
            "sum: unknown attribute 'axs'; did you mean 'axes'?");
  EXPECT_EQ(ErrorOf([] { CallOp("sum", {F({2})}, {{"axes", int64_t{0}}}); }),
            "sum: attribute 'axes' must be int list, got int 0");
  EXPECT_EQ(ErrorOf([] { CallOp("reshape", {F({2})}); }), "reshape: missing attribute 'shape'");
}

TEST(OpErrors, WrongNumberOfInputs) {
  EXPECT_EQ(ErrorOf([] { CallOp("add", {F({2})}); }), "add: takes 2 inputs, got 1");
  EXPECT_EQ(ErrorOf([] { CallOp("concat", {}); }), "concat: needs at least one input");
}

TEST(OpErrors, AxesOutOfRange) {
  EXPECT_EQ(ErrorOf([] { CallOp("sum", {F({2, 3})}, {{"axes", Ints{2}}}); }),
            "sum: axis 2 is out of range for rank 2");
  EXPECT_EQ(ErrorOf([] { CallOp("softmax", {F({2, 3})}, {{"axis", int64_t{-3}}}); }),
            "softmax: axis -3 is out of range for rank 2");
  EXPECT_EQ(ErrorOf([] { CallOp("sum", {F({2, 3})}, {{"axes", Ints{1, -1}}}); }), "sum: axis -1 is given twice");
}

TEST(OpErrors, ShapeOperatorsExplainTheMismatch) {
  EXPECT_EQ(ErrorOf([] { CallOp("reshape", {F({2, 3})}, {{"shape", Ints{4, 2}}}); }),
            "reshape: cannot reshape x (2, 3) (6 elements) to (4, 2)");
  EXPECT_EQ(ErrorOf([] { CallOp("concat", {F({2, 3}), F({3, 3})}, {{"axis", int64_t{1}}}); }),
            "concat: input 1 Tensor[(3, 3), f32] does not match input 0 Tensor[(2, 3), f32] outside axis 1");
  EXPECT_EQ(ErrorOf([] { CallOp("slice", {F({4})}, {{"axes", Ints{0}}, {"begins", Ints{1}}, {"ends", Ints{6}}}); }),
            "slice: bounds [1, 6) are out of range for axis 0 of x (4,)");
  EXPECT_EQ(ErrorOf([] { CallOp("transpose", {F({2, 3})}, {{"perm", Ints{0, 0}}}); }),
            "transpose: perm [0, 0] is not a permutation of the 2 axes of x (2, 3)");
  EXPECT_EQ(ErrorOf([] { RunOp(LookupOp("chunk"), std::vector<Tensor>{F({2, 5})}, NormalizeAttrs(LookupOp("chunk"), {{"chunks", int64_t{3}}, {"axis", int64_t{1}}})); }),
            "chunk: dimension 1 of x (2, 5) does not divide into 3 chunks");
  EXPECT_EQ(ErrorOf([] { CallOp("squeeze", {F({2, 3})}, {{"axes", Ints{1}}}); }),
            "squeeze: axis 1 of x (2, 3) is not 1");
}

TEST(OpErrors, IndicesOutOfRangeAreCaughtAtRunTime) {
  Tensor table = F({4, 2});
  EXPECT_EQ(ErrorOf([&] { CallOp("take", {table, Tensor::FromVector<int64_t>({2}, {1, 4})}); }),
            "take: index 4 is out of range for table rows of size 4");
  EXPECT_EQ(ErrorOf([&] { CallOp("take", {table, Tensor::FromVector<int64_t>({1}, {-1})}); }),
            "take: index -1 is out of range for table rows of size 4");
  EXPECT_EQ(ErrorOf([] { CallOp("cross_entropy", {F({2, 3}), Tensor::FromVector<int64_t>({2}, {0, 3})}); }),
            "cross_entropy: index 3 is out of range for classes of size 3");
  EXPECT_EQ(ErrorOf([] { CallOp("one_hot", {Tensor::FromVector<int64_t>({1}, {5})}, {{"depth", int64_t{5}}}); }),
            "one_hot: index 5 is out of range for depth of size 5");
}

TEST(OpErrors, LossesNeedMatchingBatches) {
  EXPECT_EQ(ErrorOf([] { CallOp("nll", {F({2, 3}), I({3})}); }),
            "nll: batch sizes differ: scores (2, 3) vs labels (3,)");
  EXPECT_EQ(ErrorOf([] { CallOp("cross_entropy", {F({2, 3}), F({2})}); }),
            "cross_entropy: labels must be i64, got Tensor[(2,), f32]");
}

TEST(OpErrors, ReductionsOverEmptyAxesHaveNoMaximum) {
  EXPECT_EQ(ErrorOf([] { CallOp("argmax", {F({2, 0})}); }), "argmax: reduction over an empty axis");
  EXPECT_EQ(ErrorOf([] { CallOp("max", {F({2, 0})}, {{"axes", Ints{1}}}); }), "max: reduction over an empty axis");
}

TEST(ShapeRules, UnknownDimensionsPropagate) {
  const OpDef& add = LookupOp("add");
  std::vector<TensorType> in = {{DType::kF32, {kUnknownDim, 4}}, {DType::kF32, {4}}};
  EXPECT_EQ(InferTypes(add, in, {})[0].shape, (Shape{kUnknownDim, 4}));
  const OpDef& matmul = LookupOp("matmul");
  std::vector<TensorType> mm = {{DType::kF32, {kUnknownDim, 128}}, {DType::kF32, {128, 512}}};
  EXPECT_EQ(InferTypes(matmul, mm, NormalizeAttrs(matmul, {}))[0].shape, (Shape{kUnknownDim, 512}));
  // An unknown dim against a known one other than 1 must be that one.
  std::vector<TensorType> bc = {{DType::kF32, {kUnknownDim}}, {DType::kF32, {5}}};
  EXPECT_EQ(InferTypes(add, bc, {})[0].shape, (Shape{5}));
}

}  // namespace
}  // namespace pejit
