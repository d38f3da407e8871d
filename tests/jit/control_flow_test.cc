// Residual programs with control flow compiled to native regions: a branch
// on a tensor, a chosen function, a loop the data ends (a residual
// function); each agrees with the interpreter on the original program, on
// both sides of every condition, in values and in gradients (the
// interpreter's tape, and finite differences).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "jit/control_flow.h"
#include "jit/pass.h"
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

# Losses through each of them, for gradients.
def @gate_loss(%x: Tensor[(4, 8), f32], %w: Tensor[(8, 8), f32], %t: Tensor[(), f32]) -> Tensor[(), f32] {
  sum(mul(@gate(%x, %w, %t), %x))
}
def @count_loss(%x: Tensor[(2,), f32], %w: Tensor[(2,), f32], %n: Tensor[(), i64]) -> Tensor[(), f32] {
  let %y = @count(mul(%x, %w), %n);
  sum(mul(%y, %y))
}

# A recursion that is not a loop: the call's result is used after it returns.
def @nest(%x: Tensor[(3,), f32], %w: Tensor[(3,), f32], %n: Tensor[(), i64]) -> Tensor[(3,), f32] {
  if (less_equal(%n, 0)) { mul(%x, %w) } else { tanh(add(mul(@nest(%x, %w, sub(%n, 1)), %w), %x)) }
}
def @nest_loss(%x: Tensor[(3,), f32], %w: Tensor[(3,), f32], %n: Tensor[(), i64]) -> Tensor[(), f32] {
  sum(@nest(%x, %w, %n))
}

# Sizes declared open, as models write them: what the program computes
# decides them (the branches of an `if` agree; a loop keeps its state's).
type Row = Tensor[(1, ?), f32];
def @branch(%x: Row, %w: Tensor[(?, ?), f32]) -> Row {
  if (greater(sum(%x), 0f32)) { tanh(matmul(%x, %w)) } else { mul(%x, 2f32) }
}
def @branch_loss(%x: Row, %w: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  let %y = @branch(%x, %w);
  sum(mul(%y, matmul(%y, %w)))
}
# Adaptive computation time's loop: a step until the halting sum passes 0.9.
def @ponder(%h: Row, %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %halt: Tensor[(), f32], %n: Tensor[(), i64]) -> Row {
  let %next = tanh(matmul(%h, %w));
  let %total = add(%halt, sigmoid(sum(matmul(%next, %u))));
  if (logical_or(greater(%total, 0.9f32), less_equal(%n, 0))) { %next } else { @ponder(%next, %w, %u, %total, sub(%n, 1)) }
}
def @ponder_loss(%h: Row, %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  let %out = @ponder(%h, %w, %u, 0f32, 30);
  sum(mul(%out, %out))
}
# Sizes the program leaves open: the two sides of the `if` differ.
def @ragged(%x: Row, %c: Tensor[(), f32]) -> Tensor[(), f32] {
  let %y: Row = if (greater(%c, 0f32)) { %x } else { concat(%x, %x, axis=1) };
  sum(tanh(%y))
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

  // Grad mode: (loss, gradients of the float arguments `wrt`) compiled
  // against the interpreter's tape on the original program and, with
  // `finite_differences`, against central differences of the compiled loss.
  ControlFlowStats CheckGrad(const std::string& entry, const std::vector<Value>& args, const std::vector<int>& wrt,
                             bool finite_differences = false) {
    Snapshot s = module_.snapshot();
    Residual r = PartialEvaluate(*s, entry, args);
    ControlFlowStats stats;
    ExecutablePtr exe = CompileControlFlow(*session_, r.main, r.functions, {{}, wrt}, &stats);
    std::vector<Tensor> leaves = Flatten(args, {});
    std::vector<Tensor> got = exe->Run(leaves);
    Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*s, entry, args, wrt);
    EXPECT_EQ(got.size(), 1 + wrt.size());
    if (got.size() != 1 + wrt.size()) return stats;
    EXPECT_TRUE(AllClose(got[0], want.value.tensor(), 1e-5, 1e-6)) << got[0].ToString() << " vs " << want.value.ToString();
    for (size_t k = 0; k < wrt.size(); ++k) {
      EXPECT_TRUE(AllClose(got[1 + k], want.grads[k].tensor(), 1e-4, 1e-5))
          << "d/d argument " << wrt[k] << ": " << got[1 + k].ToString() << " vs " << want.grads[k].ToString() << "\n"
          << r.ToText();
    }
    for (size_t k = 0; finite_differences && k < wrt.size(); ++k) {
      const Tensor& x = leaves[wrt[k]];
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double h = 1e-2;
        auto loss_at = [&](double delta) {
          std::vector<Tensor> moved = leaves;
          moved[wrt[k]] = x.Clone();
          moved[wrt[k]].data<float>()[i] += static_cast<float>(delta);
          return static_cast<double>(exe->Run(moved)[0].data<float>()[0]);
        };
        const double numeric = (loss_at(h) - loss_at(-h)) / (2 * h);
        const double analytic = got[1 + k].data<float>()[i];
        EXPECT_NEAR(analytic, numeric, 2e-2 * std::max(1.0, std::abs(numeric))) << "d/d argument " << wrt[k] << "[" << i << "]";
      }
    }
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
    // The choice and the two uses' branches; the uses, independent
    // instances of one branch, run as one over two stacked rows.
    EXPECT_EQ(stats.batched_groups, 1);
    EXPECT_EQ(stats.batched_rows, 2);
    EXPECT_EQ(stats.branches, 2);
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

TEST_F(ControlFlowTest, GradientsFollowTheBranchEachCallTook) {
  Rng rng(3);
  Value x(RandomUniform(rng, {4, 8}, -1, 1)), w(RandomUniform(rng, {8, 8}, -1, 1));
  for (float t : {-100.0f, 100.0f}) {
    ControlFlowStats stats = CheckGrad("gate_loss", {x, w, Value(Tensor::Scalar(t))}, {0, 1, 2});
    EXPECT_EQ(stats.branches, 1);
    EXPECT_GE(stats.vjp_regions, 3);
  }
}

TEST_F(ControlFlowTest, GradientsOfAChosenFunctionOnBothSides) {
  auto vec = [](float a, float b, float c) { return Value(Tensor::FromVector<float>({3}, {a, b, c})); };
  for (float y : {0.5f, -0.25f}) {
    CheckGrad("act", {vec(0.1f, -0.2f, 0.3f), Value(Tensor::Scalar(y)), vec(0.7f, -0.1f, 0.2f)}, {0, 1, 2},
              /*finite_differences=*/true);
  }
}

TEST_F(ControlFlowTest, GradientsThroughALoopTheDataEnds) {
  Rng rng(4);
  Value h(RandomUniform(rng, {1, 16}, -1, 1)), w(RandomUniform(rng, {16, 16}, -0.6f, 0.6f));
  CheckGrad("run", {h, w}, {0, 1});
  Value x(Tensor::FromVector<float>({2}, {0.3f, -1.0f})), v(Tensor::FromVector<float>({2}, {1.5f, 0.5f}));
  for (int64_t n : {0, 1, 7, 10000}) {
    CheckGrad("count_loss", {x, v, Value(Tensor::FromVector<int64_t>({}, {n}))}, {0, 1}, /*finite_differences=*/n == 7);
  }
}

TEST_F(ControlFlowTest, GradientsThroughARecursionThatReturnsIntoItsCaller) {
  Value x(Tensor::FromVector<float>({3}, {0.3f, -0.4f, 0.5f})), w(Tensor::FromVector<float>({3}, {0.9f, 1.1f, -0.7f}));
  for (int64_t n : {0, 3, 50}) {
    ControlFlowStats stats = CheckGrad("nest_loss", {x, w, Value(Tensor::FromVector<int64_t>({}, {n}))}, {0, 1},
                                       /*finite_differences=*/n == 3);
    EXPECT_GE(stats.calls, 2);
  }
}

// `Row = Tensor[(1, ?), f32]`: the residual `if` and the loop's result are
// (1, 16) because every value they may hold is; both compile, values and
// gradients the interpreter's.
TEST_F(ControlFlowTest, SizesDeclaredOpenAreTheOnesTheProgramComputes) {
  Rng rng(5);
  Value x(RandomUniform(rng, {1, 16}, -1, 1)), w(RandomUniform(rng, {16, 16}, -0.5f, 0.5f)),
      u(RandomUniform(rng, {16, 4}, -0.3f, 0.3f));
  for (float sign : {1.0f, -1.0f}) {  // both sides of the branch
    Value signed_x(Tensor::FromVector<float>({1, 16}, [&] {
      std::vector<float> v(x.tensor().data<float>(), x.tensor().data<float>() + 16);
      v[0] = sign * 100;
      return v;
    }()));
    ControlFlowStats stats = CheckGrad("branch_loss", {signed_x, w}, {0, 1});
    EXPECT_GT(stats.refined, 0);
  }
  for (float scale : {0.05f, 1.0f}) {  // halts at once; ponders several steps
    Value uu(Tensor::FromVector<float>({16, 4}, [&] {
      std::vector<float> v(u.tensor().data<float>(), u.tensor().data<float>() + 64);
      for (float& e : v) e *= scale;
      return v;
    }()));
    ControlFlowStats stats = CheckGrad("ponder_loss", {x, w, uu}, {0, 1, 2}, /*finite_differences=*/scale == 1.0f);
    EXPECT_GE(stats.calls, 2);
  }
}

// The control-flow pass list runs once over the whole program, in order,
// and shows what each made: refine-shapes writes the sizes `(1, ?)` left
// open; each region then goes through the residual and lowering lists.
TEST_F(ControlFlowTest, ItsPassesRunInTheirOrderAndShowWhatTheyMade) {
  Rng rng(6);
  Value x(RandomUniform(rng, {1, 16}, -1, 1)), w(RandomUniform(rng, {16, 16}, -0.5f, 0.5f));
  Snapshot s = module_.snapshot();
  Residual r = PartialEvaluate(*s, "branch_loss", {x, w});
  std::vector<std::string> passes;
  std::string refined;
  ControlFlowOptions options;
  options.compile.instrument.after = [&](std::string_view pass, const PassProduct& product, double ms) {
    passes.emplace_back(pass);
    EXPECT_TRUE(IsPassName(pass)) << pass;
    EXPECT_GE(ms, 0);
    if (pass == "refine-shapes") refined = product.text();
  };
  CompileControlFlow(*session_, r.main, r.functions, options);
  ASSERT_GE(passes.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(passes.begin(), passes.begin() + 3),
            (std::vector<std::string>{"residual", "refine-shapes", "batch-branches"}));
  EXPECT_NE(refined.find("Tensor[(1, 16), f32]"), std::string::npos) << refined;
  EXPECT_EQ(std::count(passes.begin(), passes.end(), "dce"),
            std::count(passes.begin() + 3, passes.end(), "residual"))
      << "every region is lowered";
  EXPECT_GE(std::count(passes.begin(), passes.end(), "dce"), 2) << "a region per side of the branch";
}

// A size the program does not determine is refused with where the value is
// computed and what to write.
TEST_F(ControlFlowTest, ASizeTheProgramLeavesOpenIsRefusedWithItsPlace) {
  Snapshot s = module_.snapshot();
  Value x(Tensor::FromVector<float>({1, 3}, {0.1f, 0.2f, 0.3f}));
  Residual r = PartialEvaluate(*s, "ragged", {x, Value(Tensor::Scalar(1.0f))});
  try {
    CompileControlFlow(*session_, r.main, r.functions);
    FAIL() << "compiled a region over a value of unknown size";
  } catch (const JitFailure& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cf.pj:72:"), std::string::npos) << what;
    EXPECT_NE(what.find("Tensor[(1, ?), f32]"), std::string::npos) << what;
    EXPECT_NE(what.find("write the size"), std::string::npos) << what;
  }
}

TEST_F(ControlFlowTest, GradModeTakesAScalarF32LossAndFloatParametersOnly) {
  Snapshot s = module_.snapshot();
  Value x(Tensor::FromVector<float>({2}, {0.3f, -1.0f})), n(Tensor::FromVector<int64_t>({}, {3}));
  Residual count = PartialEvaluate(*s, "count", {x, n});
  EXPECT_THROW(CompileControlFlow(*session_, count.main, count.functions, {{}, std::vector<int>{0}}), JitFailure);
  Residual loss = PartialEvaluate(*s, "count_loss", {x, x, n});
  EXPECT_THROW(CompileControlFlow(*session_, loss.main, loss.functions, {{}, std::vector<int>{2}}), JitFailure);
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
