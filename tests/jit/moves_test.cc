// Operators that only move bytes (jit/moves.h), and the batching rules
// (jit/batch_rules.h): both read from the operator's registration, so a
// call's view, copy blocks and batching follow from OpDef alone.
#include <gtest/gtest.h>

#include "jit/batch_rules.h"
#include "jit/moves.h"
#include "ops/op.h"

namespace pejit {
namespace {

class MovesTest : public testing::Test {
 protected:
  // `op` applied to `args`, as a typed call.
  const OpCallNode& Call(std::string_view op, std::vector<Expr> args, const Attrs& attrs = {}) {
    out_.Op(op, std::move(args), attrs, SourceLoc{});
    return *As<OpCallNode>(out_.bindings().back().value);
  }
  Expr Table() { return MakeVar("table", TensorTy(DType::kF32, {5, 3})); }
  static Expr Indices(std::vector<int64_t> rows) {
    return MakeConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(rows.size())}, rows));
  }
  static TensorType F32(int64_t rows, int64_t cols) { return {DType::kF32, {rows, cols}}; }

  StraightEmitter out_;
};

TEST_F(MovesTest, AReshapeIsAViewOfItsOperandAsItLies) {
  const OpCallNode& call = Call("reshape", {Table()}, {{"shape", std::vector<int64_t>{15}}});
  EXPECT_EQ(ViewOffset(call, {DType::kF32, {15}}), 0);
}

TEST_F(MovesTest, ATakeOfConsecutiveConstantRowsIsAViewAtTheFirstRow) {
  const OpCallNode& call = Call("take", {Table(), Indices({2, 3})});
  EXPECT_EQ(ViewOffset(call, F32(2, 3)), 2 * 3 * 4);
}

TEST_F(MovesTest, ATakeOfOtherConstantRowsIsOneBlockPerRunOfRows) {
  const OpCallNode& call = Call("take", {Table(), Indices({4, 0, 1})});
  EXPECT_EQ(ViewOffset(call, F32(3, 3)), std::nullopt);
  std::optional<std::vector<CopyBlock>> blocks = CopyBlocks(call, F32(3, 3));
  ASSERT_TRUE(blocks);
  // Row 4 to row 0, then rows 0 and 1 (consecutive in both) in one block.
  ASSERT_EQ(blocks->size(), 2u);
  EXPECT_EQ((*blocks)[0].from, 4 * 12);
  EXPECT_EQ((*blocks)[0].bytes, 12);
  EXPECT_EQ((*blocks)[1].from, 0);
  EXPECT_EQ((*blocks)[1].to, 12);
  EXPECT_EQ((*blocks)[1].bytes, 24);
}

TEST_F(MovesTest, ATakeOfARowOutOfRangeIsLeftToTheKernelWhichReportsIt) {
  const OpCallNode& call = Call("take", {Table(), Indices({7})});
  EXPECT_EQ(CopyBlocks(call, F32(1, 3)), std::nullopt);
}

TEST_F(MovesTest, AConcatenationCopiesEachOperandInTurn) {
  Expr a = MakeVar("a", TensorTy(DType::kF32, {2, 3})), b = MakeVar("b", TensorTy(DType::kF32, {1, 3}));
  const OpCallNode& call = Call("concat", {a, b}, {{"axis", int64_t{0}}});
  std::optional<std::vector<CopyBlock>> blocks = CopyBlocks(call, F32(3, 3));
  ASSERT_TRUE(blocks);
  ASSERT_EQ(blocks->size(), 2u);
  EXPECT_EQ((*blocks)[0].input, 0);
  EXPECT_EQ((*blocks)[0].bytes, 24);
  EXPECT_EQ((*blocks)[1].input, 1);
  EXPECT_EQ((*blocks)[1].to, 24);
  EXPECT_EQ((*blocks)[1].bytes, 12);
}

TEST_F(MovesTest, AnOperatorThatComputesIsNeitherAViewNorACopy) {
  Expr t = Table();
  const OpCallNode& call = Call("add", {t, t});
  EXPECT_EQ(ViewOffset(call, F32(5, 3)), std::nullopt);
  EXPECT_EQ(CopyBlocks(call, F32(5, 3)), std::nullopt);
}

TEST_F(MovesTest, BatchingRulesComeFromTheRegistration) {
  Expr t = Table(), w = MakeVar("w", TensorTy(DType::kF32, {3, 4}));
  EXPECT_EQ(BatchRuleOf(Call("add", {t, t})), BatchRule::kElementwise);  // derived: elementwise with a scalar function
  EXPECT_EQ(BatchRuleOf(Call("take", {t, Indices({1})})), BatchRule::kGather);
  EXPECT_EQ(BatchRuleOf(Call("matmul", {t, w})), BatchRule::kGemm);
  // A GEMM whose instances would lie along columns has no rule.
  EXPECT_EQ(BatchRuleOf(Call("matmul", {t, t}, {{"transpose_a", true}})), BatchRule::kNone);
  EXPECT_EQ(BatchRuleOf(Call("sum", {t})), BatchRule::kReduce);
  EXPECT_EQ(BatchRuleOf(Call("softmax", {t})), BatchRule::kAxis);
  EXPECT_EQ(BatchRuleOf(Call("one_hot", {Indices({1, 2})}, {{"depth", int64_t{3}}})), BatchRule::kLeading);
  EXPECT_EQ(BatchRuleOf(Call("cross_entropy", {t, Indices({1, 2, 0, 1, 2})})), BatchRule::kRowLoss);
  EXPECT_EQ(BatchRuleOf(Call("transpose", {t})), BatchRule::kShapeAttrs);
  // Axes resolved against a shape that is not known: no rule.
  const Expr open = MakeVar("open", TensorTy(DType::kF32, {kUnknownDim, 3}));
  EXPECT_EQ(BatchRuleOf(Call("transpose", {open})), BatchRule::kNone);
  EXPECT_EQ(BatchRuleOf(Call("cross_entropy", {open, MakeVar("labels", TensorTy(DType::kI64, {kUnknownDim}))})),
            BatchRule::kNone);
  EXPECT_EQ(BatchRuleOf(Call("scatter_add", {t, Indices({1, 2, 3, 4, 0})}, {{"rows", int64_t{5}}})), BatchRule::kNone);
}

}  // namespace
}  // namespace pejit
