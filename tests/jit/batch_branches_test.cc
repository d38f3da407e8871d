// Branches and loops on tensor values batched across a minibatch's examples
// (jit/batch_branches.h): the per-example instances of a data-ended loop run
// as one computation over stacked rows, and the compiled program agrees with
// the interpreter on the original one in values and gradients, whichever
// examples loop how long; a row no example gives a branch never evaluates
// it (no index out of range, no NaN in a gradient); instances that depend
// on each other stay apart.
#include <gtest/gtest.h>

#include <cmath>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "jit/batch_branches.h"
#include "jit/control_flow.h"
#include "jit/refine_shapes.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
type Row = Tensor[(1, ?), f32];

# Adaptive computation time: a step per example until its halting sum passes
# 0.9 or it has taken %left steps; the output the halting-weighted states.
def @ponder(%x: Row, %h: Row, %halted: Tensor[(), f32], %out: Row, %left: Tensor[(), i64],
            %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Row {
  let %next = tanh(add(matmul(%x, %w), matmul(%h, %u)));
  let %halt = sigmoid(sum(matmul(%next, %v)));
  let %total = add(%halted, %halt);
  if (logical_or(greater(%total, 0.9f32), less_equal(%left, 1))) {
    add(%out, mul(%next, sub(1f32, %halted)))
  } else {
    @ponder(%x, %next, %total, add(%out, mul(%next, %halt)), sub(%left, 1), %w, %u, %v)
  }
}
def @act_loss(%xs: List[Row], %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %zero = mul(%x, 0f32);
      let %y = @ponder(%x, %zero, 0f32, %zero, 8, %w, %u, %v);
      add(sum(mul(%y, %y)), @act_loss(%rest, %w, %u, %v))
    },
  }
}

# The same loop in two sets of instances, of 8 and of 4 steps at most.
def @short_loss(%xs: List[Row], %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %y = @ponder(%x, %x, 0f32, %x, 4, %w, %u, %v);
      add(sum(%y), @short_loss(%rest, %w, %u, %v))
    },
  }
}
def @two_loss(%a: List[Row], %b: List[Row], %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  add(@act_loss(%a, %w, %u, %v), @short_loss(%b, %w, %u, %v))
}

# A loop of as many steps as each example says (thousands).
def @steps(%x: Tensor[(1, 2), f32], %n: Tensor[(), i64]) -> Tensor[(1, 2), f32] {
  if (less_equal(%n, 0)) { %x } else { @steps(add(mul(%x, 0.5f32), 1f32), sub(%n, 1)) }
}
def @steps_loss(%xs: List[(Tensor[(1, 2), f32], Tensor[(), i64])], %w: Tensor[(1, 2), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%e, %rest) => add(sum(mul(@steps(mul(%e.0, %w), %e.1), %w)), @steps_loss(%rest, %w)),
  }
}

# A loop's result read by a log on one side of a branch: the rows that do not
# take that side must not read zeros from the stacked loop (log 0 = -inf,
# times the weight in its gradient: NaN).
def @halve(%x: Tensor[(1, 2), f32], %n: Tensor[(), i64]) -> Tensor[(1, 2), f32] {
  if (less_equal(%n, 0)) { %x } else { @halve(mul(%x, 0.5f32), sub(%n, 1)) }
}
def @log_loss(%xs: List[(Tensor[(1, 2), f32], Tensor[(), i64])], %w: Tensor[(1, 2), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%e, %rest) => {
      let %y = if (greater(sum(mul(%e.0, %w)), 0f32)) {
        let %h = @halve(exp(%e.0), %e.1);
        sum(mul(log(%h), %w))
      } else {
        sum(mul(%e.0, %w))
      };
      add(%y, @log_loss(%rest, %w))
    },
  }
}

# A loop both sides of whose exit test call a function: the loop's own call
# is put last (the tail call), and 20,000 iterations run.
def @finish(%x: Tensor[(1, 2), f32], %k: Tensor[(), i64]) -> Tensor[(1, 2), f32] {
  if (less_equal(%k, 0)) { %x } else { @finish(tanh(%x), sub(%k, 1)) }
}
def @count_then(%x: Tensor[(1, 2), f32], %n: Tensor[(), i64], %k: Tensor[(), i64]) -> Tensor[(1, 2), f32] {
  if (greater(%n, 0)) { @count_then(add(mul(%x, 0.5f32), 0.25f32), sub(%n, 1), %k) } else { @finish(%x, %k) }
}
def @count_then_loss(%xs: List[(Tensor[(1, 2), f32], Tensor[(), i64], Tensor[(), i64])], %w: Tensor[(1, 2), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%e, %rest) => add(sum(mul(@count_then(mul(%e.0, %w), %e.1, %e.2), %w)), @count_then_loss(%rest, %w)),
  }
}

# A loop returning a pair: left per example (a stacked function passes
# tensors only).
def @pair(%h: Tensor[(1, 2), f32], %c: Tensor[(1, 2), f32], %n: Tensor[(), i64]) -> (Tensor[(1, 2), f32], Tensor[(1, 2), f32]) {
  if (less_equal(%n, 0)) { (%h, %c) } else { @pair(tanh(add(%h, %c)), mul(%c, 0.5f32), sub(%n, 1)) }
}
def @pair_loss(%xs: List[(Tensor[(1, 2), f32], Tensor[(), i64])], %w: Tensor[(1, 2), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%e, %rest) => {
      let %p = @pair(mul(%e.0, %w), %w, %e.1);
      add(sum(mul(%p.0, %p.1)), @pair_loss(%rest, %w))
    },
  }
}

# A walk over rows %start.. of a shared table while the row index is below
# %end: the step reads row %i, valid only while the loop runs. An example
# that has finished must not take the step's row %end (past the table).
def @walk(%table: Tensor[(6, 3), f32], %i: Tensor[(), i64], %end: Tensor[(), i64], %acc: Tensor[(1, 3), f32],
          %w: Tensor[(3, 3), f32]) -> Tensor[(1, 3), f32] {
  if (greater_equal(%i, %end)) { %acc } else {
    let %row = take(%table, reshape(%i, shape=[1]));
    @walk(%table, add(%i, 1), %end, tanh(add(matmul(%acc, %w), %row)), %w)
  }
}
def @walk_loss(%spans: List[(Tensor[(), i64], Tensor[(), i64])], %table: Tensor[(6, 3), f32], %w: Tensor[(3, 3), f32]) -> Tensor[(), f32] {
  match (%spans) {
    Nil => 0f32,
    Cons(%s, %rest) => {
      let %h = @walk(%table, %s.0, %s.1, mul(take(%table, reshape(%s.0, shape=[1])), 0.5f32), %w);
      add(sum(%h), @walk_loss(%rest, %table, %w))
    },
  }
}

# A branch each side of which is valid only on its own side: the log of a
# positive sum, or the square of a negative one.
def @safe_loss(%xs: List[Row], %w: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %s = sum(matmul(%x, %w));
      let %y = if (greater(%s, 0f32)) { log(%s) } else { mul(sqrt(neg(%s)), 3f32) };
      add(%y, @safe_loss(%rest, %w))
    },
  }
}

# Each example's loop starts from the previous one's result: a chain, not a
# set of independent instances.
def @chain(%xs: List[Row], %h: Row, %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Row {
  match (%xs) {
    Nil => %h,
    Cons(%x, %rest) => @chain(%rest, @ponder(%x, %h, 0f32, %h, 4, %w, %u, %v), %w, %u, %v),
  }
}
def @chain_loss(%xs: List[Row], %w: Tensor[(?, ?), f32], %u: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => sum(@chain(%rest, %x, %w, %u, %v)),
  }
}
)";

class BatchBranchesTest : public testing::Test {
 protected:
  void SetUp() override {
    module_.AddSource(kProgram, "batch.pj");
    session_ = JitSession::Create();
    list_ = module_.snapshot()->FindType("List");
  }

  static Value I64(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }
  // n examples' rows (1, cols), uniform in [-1, 1].
  static std::vector<Value> Rows(Rng& rng, int n, int64_t cols) {
    std::vector<Value> rows;
    for (int i = 0; i < n; ++i) rows.emplace_back(RandomUniform(rng, {1, cols}, -1, 1));
    return rows;
  }

  Value List(const std::vector<Value>& items) {
    Value xs = Value::Adt(list_, 0, {});
    for (auto it = items.rbegin(); it != items.rend(); ++it) xs = Value::Adt(list_, 1, {*it, xs});
    return xs;
  }

  // PE of `entry` on `args`, compiled in grad mode for the weights `wrt`
  // (tensor arguments), against the interpreter's tape on the original
  // program.
  ControlFlowStats CheckGrad(const std::string& entry, const std::vector<Value>& args, const std::vector<int>& wrt) {
    Snapshot s = module_.snapshot();
    Residual r = PartialEvaluate(*s, entry, args);
    std::vector<int> leaves;  // each weight's place among the program's tensor parameters
    for (int a : wrt) {
      int before = 0;
      for (int i = 0; i < a; ++i) before += static_cast<int>(Flatten({args[i]}, {}).size());
      leaves.push_back(before);
    }
    ControlFlowStats stats;
    ExecutablePtr exe = CompileControlFlow(*session_, r.main, r.functions, {{}, leaves}, &stats);
    std::vector<Tensor> got = exe->Run(Flatten(args, {}));
    Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*s, entry, args, wrt);
    EXPECT_EQ(got.size(), 1 + wrt.size());
    if (got.size() != 1 + wrt.size()) return stats;
    EXPECT_TRUE(AllClose(got[0], want.value.tensor(), 1e-4, 1e-5)) << got[0].ToString() << " vs " << want.value.ToString();
    for (size_t k = 0; k < wrt.size(); ++k) {
      const float* g = got[1 + k].data<float>();
      for (int64_t i = 0; i < got[1 + k].numel(); ++i) EXPECT_TRUE(std::isfinite(g[i])) << "d/d argument " << wrt[k];
      EXPECT_TRUE(AllClose(got[1 + k], want.grads[k].tensor(), 1e-3, 1e-5))
          << "d/d argument " << wrt[k] << ": " << got[1 + k].ToString() << " vs " << want.grads[k].ToString();
    }
    return stats;
  }

  Module module_;
  std::unique_ptr<JitSession> session_;
  TypeDefPtr list_;
};

TEST_F(BatchBranchesTest, EveryExamplesLoopRunsAsOneBatchedLoop) {
  Rng rng(7);
  for (int trial = 0; trial < 4; ++trial) {  // weights that halt early, late, and in between
    const float scale = 0.2f + 0.4f * trial;
    std::vector<Value> rows = Rows(rng, 9, 6);
    Value w(RandomUniform(rng, {6, 6}, -scale, scale)), u(RandomUniform(rng, {6, 6}, -scale, scale));
    Value v(RandomUniform(rng, {6, 1}, -scale, scale));
    ControlFlowStats stats = CheckGrad("act_loss", {List(rows), w, u, v}, {1, 2, 3});
    EXPECT_EQ(stats.batched_groups, 1) << "trial " << trial;
    EXPECT_EQ(stats.batched_rows, 9);
  }
}

TEST_F(BatchBranchesTest, OneLoopInTwoSetsOfInstancesOfDifferentSizes) {
  Rng rng(13);
  std::vector<Value> a = Rows(rng, 5, 6), b = Rows(rng, 3, 6);
  Value w(RandomUniform(rng, {6, 6}, -0.5f, 0.5f)), u(RandomUniform(rng, {6, 6}, -0.5f, 0.5f));
  Value v(RandomUniform(rng, {6, 1}, -0.5f, 0.5f));
  ControlFlowStats stats = CheckGrad("two_loss", {List(a), List(b), w, u, v}, {2, 3, 4});
  EXPECT_EQ(stats.batched_groups, 2);
  EXPECT_EQ(stats.batched_rows, 8);
}

// The batched loop's next iteration is a tail call (the finished rows
// passed down), which the driver runs in one frame: thousands of iterations,
// more than residual calls may nest (2,000).
TEST_F(BatchBranchesTest, ABatchedLoopRunsThousandsOfIterationsInOneFrame) {
  Rng rng(14);
  std::vector<Value> examples;
  for (int64_t n : {3000, 2500, 10, 0}) {
    examples.push_back(Value::Tuple({Value(RandomUniform(rng, {1, 2}, -1, 1)), I64(n)}));
  }
  Value w(RandomUniform(rng, {1, 2}, -1, 1));
  ControlFlowStats stats = CheckGrad("steps_loss", {List(examples), w}, {1});
  EXPECT_EQ(stats.batched_groups, 1);
}

TEST_F(BatchBranchesTest, RowsOutsideABranchNeverReadZerosFromALoopItCalls) {
  Rng rng(15);
  std::vector<Value> examples;
  for (int64_t n : {3, 0, 5, 1, 2, 4}) examples.push_back(Value::Tuple({Value(RandomUniform(rng, {1, 2}, -1, 1)), I64(n)}));
  Value w(Tensor::FromVector<float>({1, 2}, {0.7f, -0.4f}));
  ControlFlowStats stats = CheckGrad("log_loss", {List(examples), w}, {1});
  EXPECT_EQ(stats.batched_groups, 1);
}

TEST_F(BatchBranchesTest, ALoopWhoseExitCallsAnotherRunsTwentyThousandIterations) {
  Rng rng(16);
  std::vector<Value> examples;
  for (auto [n, k] : std::vector<std::pair<int64_t, int64_t>>{{20000, 2}, {3, 0}, {7, 4}}) {
    examples.push_back(Value::Tuple({Value(RandomUniform(rng, {1, 2}, -1, 1)), I64(n), I64(k)}));
  }
  Value w(RandomUniform(rng, {1, 2}, -1, 1));
  ControlFlowStats stats = CheckGrad("count_then_loss", {List(examples), w}, {1});
  EXPECT_EQ(stats.batched_groups, 1);
}

TEST_F(BatchBranchesTest, ALoopReturningATupleStaysPerExample) {
  Rng rng(17);
  std::vector<Value> examples;
  for (int64_t n : {2, 5, 0}) examples.push_back(Value::Tuple({Value(RandomUniform(rng, {1, 2}, -1, 1)), I64(n)}));
  Value w(RandomUniform(rng, {1, 2}, -1, 1));
  ControlFlowStats stats = CheckGrad("pair_loss", {List(examples), w}, {1});
  EXPECT_EQ(stats.batched_groups, 0);
}

TEST_F(BatchBranchesTest, OneExampleIsLeftAsItIs) {
  Rng rng(8);
  Value w(RandomUniform(rng, {6, 6}, -0.5f, 0.5f)), u(RandomUniform(rng, {6, 6}, -0.5f, 0.5f));
  Value v(RandomUniform(rng, {6, 1}, -0.5f, 0.5f));
  ControlFlowStats stats = CheckGrad("act_loss", {List({Value(RandomUniform(rng, {1, 6}, -1, 1))}), w, u, v}, {1, 2, 3});
  EXPECT_EQ(stats.batched_groups, 0);
}

// Spans ending at the table's last row: a finished example stepping on with
// the others would read row 6 of 6.
TEST_F(BatchBranchesTest, AFinishedExampleNeverRunsTheStepItsLoopGuards) {
  Rng rng(9);
  std::vector<Value> spans;
  for (auto [start, end] : std::vector<std::pair<int64_t, int64_t>>{{0, 6}, {4, 6}, {2, 3}, {5, 6}, {1, 1}, {3, 6}}) {
    spans.push_back(Value::Tuple({I64(start), I64(end)}));
  }
  Value table(RandomUniform(rng, {6, 3}, -1, 1)), w(RandomUniform(rng, {3, 3}, -0.8f, 0.8f));
  ControlFlowStats stats = CheckGrad("walk_loss", {List(spans), table, w}, {1, 2});
  EXPECT_EQ(stats.batched_groups, 1);
  EXPECT_EQ(stats.batched_rows, 6);
}

// Where both sides ran on every row and a select kept one, the log of a
// negative sum would make NaN, and its zero cotangent times the NaN would
// reach the weight's gradient.
TEST_F(BatchBranchesTest, EachSideOfABranchSeesOnlyRowsThatTakeIt) {
  Rng rng(10);
  std::vector<Value> rows = Rows(rng, 8, 4);
  Value w(RandomUniform(rng, {4, 1}, -1, 1));
  ControlFlowStats stats = CheckGrad("safe_loss", {List(rows), w}, {1});
  EXPECT_EQ(stats.batched_groups, 1);
  // Every example on one side: the other side runs for no row.
  Value positive(Tensor::Full(DType::kF32, {4, 1}, 1.0));
  std::vector<Value> ones;
  for (int i = 0; i < 3; ++i) ones.emplace_back(Tensor::Full(DType::kF32, {1, 4}, 0.5 + i));
  CheckGrad("safe_loss", {List(ones), positive}, {1});
}

TEST_F(BatchBranchesTest, LoopsThatReadEachOthersResultsStayApart) {
  Rng rng(11);
  std::vector<Value> rows = Rows(rng, 5, 6);
  Value w(RandomUniform(rng, {6, 6}, -0.6f, 0.6f)), u(RandomUniform(rng, {6, 6}, -0.6f, 0.6f));
  Value v(RandomUniform(rng, {6, 1}, -0.6f, 0.6f));
  ControlFlowStats stats = CheckGrad("chain_loss", {List(rows), w, u, v}, {1, 2, 3});
  EXPECT_EQ(stats.batched_groups, 0);
}

// The pass alone: the batched functions it adds are named after the
// originals, and a program without instances to batch comes back unchanged.
TEST_F(BatchBranchesTest, ThePassAddsAStackedVersionOfTheLoop) {
  Rng rng(12);
  std::vector<Value> rows = Rows(rng, 3, 6);
  Value w(RandomUniform(rng, {6, 6}, -0.5f, 0.5f));
  Snapshot s = module_.snapshot();
  Residual r = PartialEvaluate(*s, "act_loss", {List(rows), w, w, Value(RandomUniform(rng, {6, 1}, -0.5f, 0.5f))});
  BatchedBranches none = BatchBranches(r.main, r.functions);  // declared sizes still open: nothing to stack
  EXPECT_EQ(none.groups, 0);
  EXPECT_EQ(none.main, r.main);
  RefinedProgram refined = RefineShapes(r.main, r.functions);
  BatchedBranches batched = BatchBranches(refined.main, refined.functions);
  EXPECT_EQ(batched.groups, 1);
  EXPECT_EQ(batched.rows, 3);
  ASSERT_EQ(batched.functions.size(), refined.functions.size() + 1);
  EXPECT_EQ(batched.functions.back().first, refined.functions[0].first + "_rows1");
  // The mask, and what the rows outside it return.
  EXPECT_EQ(batched.functions.back().second->params.size(), refined.functions[0].second->params.size() + 2);
}

}  // namespace
}  // namespace pejit
