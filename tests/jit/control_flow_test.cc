// Residual programs with control flow compiled to native regions: a branch
// on a tensor, a chosen function, a loop the data ends (a residual
// function); each agrees with the interpreter on the original program, on
// both sides of every condition.
#include <gtest/gtest.h>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "jit/control_flow.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
def @gate(%x: Tensor[(4, 8), f32], %w: Tensor[(8, 8), f32], %t: Tensor[(), f32]) -> Tensor[(4, 8), f32] {
  let %h = tanh(matmul(%x, %w));
  if (greater(sum(%h), %t)) { sigmoid(add(%h, %x)) } else { mul(%h, 2f32) }
}

# A chosen function applied twice (PE's choice: a residual `if` per use).
def @act(%x: Tensor[(3,), f32], %y: Tensor[(), f32], %w: Tensor[(3,), f32]) -> Tensor[(), f32] {
  let %h = tanh(%w);
  let %f = if (greater(%y, 0f32)) {
    let %s = mul(%h, %y);
    fn (%v: Tensor[(3,), f32]) -> Tensor[(3,), f32] { add(%v, %s) }
  } else {
    fn (%v: Tensor[(3,), f32]) -> Tensor[(3,), f32] { sigmoid(mul(%v, %w)) }
  };
  sum(mul(%f(%x), %f(neg(%x))))
}

# Iterates a recurrent cell until its state settles, at most %n times: a
# loop the data ends, left by PE as one residual function.
def @settle(%h: Tensor[(1, 16), f32], %w: Tensor[(16, 16), f32], %n: Tensor[(), i64]) -> Tensor[(1, 16), f32] {
  let %next = tanh(matmul(%h, %w));
  if (logical_or(less(norm(sub(%next, %h)), 0.001f32), less_equal(%n, 0))) { %next }
  else { @settle(%next, %w, sub(%n, 1)) }
}
def @run(%h: Tensor[(1, 16), f32], %w: Tensor[(16, 16), f32]) -> Tensor[(), f32] { sum(@settle(%h, %w, 200)) }

# A loop whose count is data: as many iterations as the argument says.
def @count(%x: Tensor[(2,), f32], %n: Tensor[(), i64]) -> Tensor[(2,), f32] {
  if (less_equal(%n, 0)) { %x } else { @count(add(mul(%x, 0.5f32), 1f32), sub(%n, 1)) }
}
)";

class ControlFlowTest : public testing::Test {
 protected:
  void SetUp() override {
    module_.AddSource(kProgram, "cf.pj");
    session_ = JitSession::Create();
  }

  // PE of `entry` on `args` (all dynamic), compiled to regions; its result
  // against the interpreter's on the original program.
  ControlFlowStats Check(const std::string& entry, const std::vector<Value>& args) {
    Snapshot s = module_.snapshot();
    Residual r = PartialEvaluate(*s, entry, args);
    ControlFlowStats stats;
    ExecutablePtr exe = CompileControlFlow(*session_, r.main, r.functions, {}, &stats);
    EXPECT_STREQ(exe->tier(), "native");
    std::vector<Tensor> got = exe->Run(Flatten(args, {}));
    Value want = Interpreter().Call(*s, entry, args);
    EXPECT_EQ(got.size(), 1u);
    EXPECT_TRUE(AllClose(got.at(0), want.tensor(), 1e-5, 1e-6)) << got.at(0).ToString() << " vs " << want.ToString()
                                                                  << "\n" << r.ToText();
    return stats;
  }

  Module module_;
  std::unique_ptr<JitSession> session_;
};

TEST_F(ControlFlowTest, ABranchOnATensorRunsTheRegionOfTheSideItTakes) {
  Rng rng(1);
  Value x(RandomUniform(rng, {4, 8}, -1, 1)), w(RandomUniform(rng, {8, 8}, -1, 1));
  for (float t : {-100.0f, 100.0f}) {  // then, else
    ControlFlowStats stats = Check("gate", {x, w, Value(Tensor::Scalar(t))});
    EXPECT_EQ(stats.branches, 1);
    EXPECT_EQ(stats.regions, 3);  // before the `if`, and one per branch
  }
}

TEST_F(ControlFlowTest, AChosenFunctionRunsNativeOnBothSides) {
  auto vec = [](float a, float b, float c) { return Value(Tensor::FromVector<float>({3}, {a, b, c})); };
  for (float y : {0.5f, -0.25f}) {
    ControlFlowStats stats = Check("act", {vec(0.1f, -0.2f, 0.3f), Value(Tensor::Scalar(y)), vec(0.7f, -0.1f, 0.2f)});
    EXPECT_EQ(stats.branches, 3);
  }
}

TEST_F(ControlFlowTest, ALoopTheDataEndsRunsItsBodyNativeUntilTheStateSettles) {
  Rng rng(2);
  Value h(RandomUniform(rng, {1, 16}, -1, 1));
  for (float scale : {0.1f, 0.6f}) {  // settles at once; takes many steps
    Value w(RandomUniform(rng, {16, 16}, -scale, scale));
    ControlFlowStats stats = Check("run", {h, w});
    EXPECT_EQ(stats.calls, 2);  // main's call, and the loop's own
    EXPECT_GE(stats.regions, 2);
  }
}

// The driver runs a loop in tail position in one frame: 100,000 iterations
// need no more native stack than one.
TEST_F(ControlFlowTest, ALongLoopRunsInConstantStack) {
  Value x(Tensor::FromVector<float>({2}, {3.0f, -1.0f}));
  Value n(Tensor::FromVector<int64_t>({}, {100000}));
  ControlFlowStats stats = Check("count", {x, n});
  EXPECT_EQ(stats.calls, 2);
}

TEST_F(ControlFlowTest, StraightLineCodeIsLeftToTheStraightLineCompiler) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { tanh(%x) }", "f.pj");
  Residual r = PartialEvaluate(*m.snapshot(), "f", {Value(Tensor::FromVector<float>({2}, {1, 2}))});
  EXPECT_FALSE(HasControlFlow(r.main));
  EXPECT_THROW(CompileControlFlow(*session_, r.main, r.functions), JitFailure);
}

}  // namespace
}  // namespace pejit
