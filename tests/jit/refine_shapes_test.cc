// RefineShapes gives a residual program's values the shapes its definitions
// compute: an `if` the join of its branches, a loop (a residual function)
// the fixpoint of its body and its calls; what the program leaves open stays
// `?`, and a declaration is never contradicted.
#include "jit/refine_shapes.h"

#include <gtest/gtest.h>

#include "ir/module.h"
#include "ir/printer.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

Type T(Shape shape, DType dtype = DType::kF32) { return TensorTy(dtype, std::move(shape)); }

TEST(JoinTypes, KeepsTheDimsThatAgree) {
  EXPECT_TRUE(TypeEqual(JoinTypes(T({1, 16}), T({1, 16})), T({1, 16})));
  EXPECT_TRUE(TypeEqual(JoinTypes(T({1, 16}), T({1, 32})), T({1, kUnknownDim})));
  EXPECT_TRUE(TypeEqual(JoinTypes(nullptr, T({2})), T({2})));  // nothing known yet: the identity
  EXPECT_TRUE(TypeEqual(JoinTypes(T({2}), nullptr), T({2})));
  EXPECT_EQ(JoinTypes(T({2}), T({2}, DType::kI64)), nullptr);
  EXPECT_EQ(JoinTypes(T({2}), T({2, 1})), nullptr);
  EXPECT_TRUE(TypeEqual(JoinTypes(TupleTy({T({3}), T({1, 4})}), TupleTy({T({3}), T({1, 5})})),
                        TupleTy({T({3}), T({1, kUnknownDim})})));
}

class RefineShapesTest : public testing::Test {
 protected:
  void SetUp() override {
    module_.AddSource(R"(
type Row = Tensor[(1, ?), f32];
def @step(%h: Row, %w: Tensor[(?, ?), f32], %n: Tensor[(), i64]) -> Row {
  let %next = tanh(matmul(%h, %w));
  if (logical_or(less(sum(%next), 0f32), less_equal(%n, 0))) { %next } else { @step(%next, %w, sub(%n, 1)) }
}
def @loop(%h: Row, %w: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  let %y = @step(%h, %w, 50);
  sum(mul(%y, %y))
}
def @ragged(%x: Row, %c: Tensor[(), f32]) -> Tensor[(), f32] {
  let %y: Row = if (greater(%c, 0f32)) { %x } else { concat(%x, %x, axis=1) };
  sum(tanh(%y))
}
)", "refine.pj");
  }
  Value Matrix(int64_t rows, int64_t cols) const {
    return Value(Tensor::FromVector<float>({rows, cols}, std::vector<float>(rows * cols, 0.1f)));
  }
  Module module_;
};

// Every type in `f` (parameters, lets, the result), printed.
std::string Printed(const RefinedProgram& p) {
  std::string out = PrintFunction("main", p.main);
  for (const auto& [name, f] : p.functions) out += "\n" + PrintFunction(name, f);
  return out;
}

TEST_F(RefineShapesTest, ALoopKeepsTheShapeOfItsState) {
  Residual r = PartialEvaluate(*module_.snapshot(), "loop", {Matrix(1, 8), Matrix(8, 8)});
  ASSERT_EQ(r.functions.size(), 1u) << r.ToText();
  ASSERT_NE(r.ToText().find("(1, ?)"), std::string::npos) << "the declarations leave the state open:\n" << r.ToText();
  RefinedProgram refined = RefineShapes(r.main, r.functions);
  EXPECT_GT(refined.refined, 0);
  const std::string text = Printed(refined);
  EXPECT_EQ(text.find("?"), std::string::npos) << text;
  const Func& loop = refined.functions[0].second;
  EXPECT_TRUE(TypeEqual(loop->ret_type, T({1, 8}))) << TypeToString(loop->ret_type);
}

TEST_F(RefineShapesTest, BranchesOfDifferentSizesLeaveTheSizeOpen) {
  Residual r = PartialEvaluate(*module_.snapshot(), "ragged", {Matrix(1, 3), Value(Tensor::Scalar(1.0f))});
  RefinedProgram refined = RefineShapes(r.main, r.functions);
  const std::string text = Printed(refined);
  EXPECT_NE(text.find("Tensor[(1, ?), f32]"), std::string::npos) << text;
}

TEST_F(RefineShapesTest, ADeclarationIsNeverContradicted) {
  // Built, not parsed (the checker would refuse it): tanh of a (1, 3) declared (1, 4).
  Var x = MakeVar("x", T({1, 3}));
  Func wrong = MakeFunc({x}, MakeOpCall("tanh", {x}), T({1, 4}));
  RefinedProgram refined = RefineShapes(wrong, {});
  EXPECT_EQ(refined.main, wrong);  // inferred (1, 3), declared (1, 4): left to the interpreter's check
}

TEST_F(RefineShapesTest, AProgramWithoutOpenSizesIsUnchanged) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(2, 3), f32]) -> Tensor[(), f32] { sum(tanh(%x)) }", "f.pj");
  Residual r = PartialEvaluate(*m.snapshot(), "f", {Matrix(2, 3)});
  RefinedProgram refined = RefineShapes(r.main, r.functions);
  EXPECT_EQ(refined.main, r.main);
  EXPECT_EQ(refined.refined, 0);
}

}  // namespace
}  // namespace pejit
