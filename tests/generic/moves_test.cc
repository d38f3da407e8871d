// A segment that only moves its inputs' bytes or adds whole values
// (generic/moves.h) is described by its moves; one that computes anything
// else is not.
#include <gtest/gtest.h>

#include "generic/moves.h"
#include "jit/batch_rules.h"
#include "jit/straight.h"
#include "tests/generic/segments.h"

namespace pejit::generic {
namespace {

Var Param(const std::string& name, int64_t rows, int64_t cols) {
  return MakeVar(name, TensorTy(DType::kF32, {rows, cols}));
}

using testing_segments::Segment;

TEST(MovesOf, AConcatenationOfRowsIsEachInputWholeInTurn) {
  Var a = Param("a", 1, 4), b = Param("b", 3, 4);
  std::optional<SegmentMoves> moves =
      MovesOf(Segment({a, b}, [&](StraightEmitter& out) -> std::vector<Expr> {
        return {out.Op("concat", {a, b}, {{"axis", int64_t{0}}}, {})};
      }));
  ASSERT_TRUE(moves);
  ASSERT_EQ(moves->outputs.size(), 1u);
  const MoveNode& node = moves->nodes[moves->outputs[0]];
  EXPECT_EQ(node.type, (TensorType{DType::kF32, {4, 4}}));
  ASSERT_EQ(node.blocks.size(), 2u);
  EXPECT_EQ(node.blocks[0].source, 0);
  EXPECT_EQ(node.blocks[0].bytes, 16);
  EXPECT_EQ(node.blocks[1].source, 1);
  EXPECT_EQ(node.blocks[1].to, 16);
  EXPECT_EQ(node.blocks[1].bytes, 48);
}

TEST(MovesOf, AReshapeIsItsOperandAndASliceOfAConcatenationReadsItsBlocks) {
  Var a = Param("a", 2, 2), b = Param("b", 2, 2);
  std::optional<SegmentMoves> moves =
      MovesOf(Segment({a, b}, [&](StraightEmitter& out) -> std::vector<Expr> {
        Var wide = out.Op("concat", {a, b}, {{"axis", int64_t{1}}}, {});  // (2, 4): a row of a, a row of b, ...
        Var low = out.Op("slice", {wide}, {{"axes", std::vector<int64_t>{0}}, {"begins", std::vector<int64_t>{1}},
                                           {"ends", std::vector<int64_t>{2}}}, {});
        return {out.Op("reshape", {a}, {{"shape", std::vector<int64_t>{4}}}, {}), low};
      }));
  ASSERT_TRUE(moves);
  ASSERT_EQ(moves->outputs.size(), 2u);
  EXPECT_EQ(moves->outputs[0], 0);  // the reshape: input a's bytes
  const MoveNode& wide = moves->nodes[2];
  ASSERT_EQ(wide.blocks.size(), 4u);  // row by row, a's then b's
  EXPECT_EQ(wide.blocks[1].source, 1);
  EXPECT_EQ(wide.blocks[1].from, 0);
  EXPECT_EQ(wide.blocks[1].to, 8);
  EXPECT_EQ(wide.blocks[1].bytes, 8);
  const MoveNode& low = moves->nodes[moves->outputs[1]];
  ASSERT_EQ(low.blocks.size(), 1u);  // the second row of the concatenation
  EXPECT_EQ(low.blocks[0].source, 2);
  EXPECT_EQ(low.blocks[0].from, 16);
  EXPECT_EQ(low.blocks[0].bytes, 16);
}

TEST(MovesOf, AnAddOfTwoWholeF32ValuesIsASumAndABroadcastOneRuns) {
  Var a = Param("a", 1, 4), b = Param("b", 1, 4), c = Param("c", 1, 4);
  std::optional<SegmentMoves> moves =
      MovesOf(Segment({a, b, c}, [&](StraightEmitter& out) -> std::vector<Expr> {
        Var bc = out.Op("add", {b, c}, {}, {});
        return {out.Op("add", {a, bc}, {}, {})};  // a + (b + c), as a recursion over a list sums
      }));
  ASSERT_TRUE(moves);
  const MoveNode& top = moves->nodes[moves->outputs[0]];
  ASSERT_EQ(top.sum.size(), 2u);
  EXPECT_EQ(top.sum[0], 0);
  EXPECT_EQ(moves->nodes[top.sum[1]].sum, (std::vector<int>{1, 2}));
  Var bias = MakeVar("bias", TensorTy(DType::kF32, {4}));
  EXPECT_FALSE(MovesOf(Segment({a, bias}, [&](StraightEmitter& out) -> std::vector<Expr> {
    return {out.Op("add", {a, bias}, {}, {})};
  })));
}

TEST(MovesOf, ASegmentThatComputesOrReadsAConstantRuns) {
  Var a = Param("a", 1, 4), b = Param("b", 1, 4);
  EXPECT_FALSE(MovesOf(Segment({a, b}, [&](StraightEmitter& out) -> std::vector<Expr> {
    Var both = out.Op("concat", {a, b}, {{"axis", int64_t{0}}}, {});
    return {out.Op("tanh", {both}, {}, {})};
  })));
  EXPECT_FALSE(MovesOf(Segment({a}, [&](StraightEmitter& out) -> std::vector<Expr> {
    Expr zeros = MakeConstant(Tensor::Zeros(DType::kF32, {1, 4}));
    return {out.Op("concat", {a, zeros}, {{"axis", int64_t{0}}}, {})};
  })));
}

}  // namespace
}  // namespace pejit::generic
