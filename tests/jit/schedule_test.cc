// The parallel schedule (jit/schedule.h): stages of steps that touch
// disjoint bytes, steps split into parts, and the same bits from a compiled
// step whatever the number of threads that run it.
#include "jit/schedule.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "ir/parser.h"
#include "jit/native_executable.h"
#include "jit/pipeline.h"
#include "ops/random.h"
#include "pe/partial_eval.h"
#include "support/team.h"
#include "tests/support/thread_pool.h"

namespace pejit {
namespace {

using testing_support::ThreadPool;

// Runs `exe` as an engine call with `threads` threads does.
std::vector<Tensor> RunWith(const Executable& exe, const std::vector<Tensor>& inputs, int threads) {
  ThreadPool pool(threads - 1);
  Team team(&pool, threads);
  ScopedTeam scoped(&team);
  return exe.Run(inputs);
}

void ExpectSameBits(const std::vector<Tensor>& a, const std::vector<Tensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].type(), b[i].type()) << what << ", result " << i;
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << what << ", result " << i;
  }
}

const Plan& PlanOf(const ExecutablePtr& exe) {
  auto* native = dynamic_cast<const NativeExecutable*>(exe.get());
  if (!native) throw std::logic_error("not a native executable");
  return native->plan();
}

// Steps other threads may take: of a lane (jit/lanes.h) or split.
int DividedSteps(const Plan& plan) {
  int n = 0;
  for (const PlanStep& s : plan.steps) n += s.lane >= 0 || s.parts > 1;
  return n;
}

// `trees` generated ListOps trees (seed `seed`) and Tree-LSTM parameters:
// the arguments of treelstm.pj's `loss`.
struct TreeLstmMinibatch {
  Module module;
  Snapshot snapshot;
  std::vector<Value> args;
  TreeLstmMinibatch(uint64_t seed, int trees, int embed, int hidden) {
    module.AddSource(treelstm::ModelSource(), "treelstm.pj");
    snapshot = module.snapshot();
    treelstm::Batch b = treelstm::GeneratedListOpsBatch(seed, trees, *snapshot);
    Rng rng(3);
    args = {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, embed, hidden, listops::kClasses})};
  }
};

// A Tree-LSTM minibatch's training step (loss and gradients) and inference
// step: big enough that some stages are divided and some steps split.
TEST(Schedule, ATreeLstmStepGivesTheSameBitsOnOneTwoAndFourThreads) {
  TreeLstmMinibatch m(7, 16, 64, 128);
  const Snapshot& snapshot = m.snapshot;
  const std::vector<Value>& args = m.args;
  auto session = JitSession::Create();
  for (bool grad : {true, false}) {
    SCOPED_TRACE(grad ? "training" : "inference");
    PipelineOptions options;
    if (grad) options.wrt_leaves = FloatWrtLeaves(args, std::vector<int>{2});
    ExecutablePtr exe = CompileResidual(*session, PartialEvaluate(*snapshot, "loss", args).main, options);
    const Plan& plan = PlanOf(exe);
    EXPECT_NO_THROW(CheckStages(plan));
    EXPECT_GT(DividedSteps(plan), 0) << plan.ToString();
    std::vector<Tensor> inputs = Flatten(args);
    std::vector<Tensor> alone = exe->Run(inputs);
    for (int threads : {1, 2, 4}) {
      for (int run = 0; run < 3; ++run) ExpectSameBits(alone, RunWith(*exe, inputs, threads), std::to_string(threads) + " threads");
    }
  }
}

// Every pair of steps touching the same planned bytes (arena bytes two
// buffers share included), one of them writing, is ordered by the
// dependences the executable waits on: directly or through other steps.
TEST(Schedule, StepDependencesOrderEveryPairOfStepsSharingBytes) {
  TreeLstmMinibatch m(5, 8, 16, 32);
  const Snapshot& snapshot = m.snapshot;
  const std::vector<Value>& args = m.args;
  PipelineOptions options;
  options.wrt_leaves = FloatWrtLeaves(args, std::vector<int>{2});
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileResidual(*session, PartialEvaluate(*snapshot, "loss", args).main, options);
  const Plan& plan = PlanOf(exe);
  const std::vector<std::vector<int>> preds = StepDependences(plan);
  const size_t n = plan.steps.size();
  ASSERT_EQ(preds.size(), n);
  // before[j][i]: step i must be done before step j starts.
  std::vector<std::vector<bool>> before(n, std::vector<bool>(n, false));
  for (size_t j = 0; j < n; ++j) {
    for (int p : preds[j]) {
      ASSERT_LT(static_cast<size_t>(p), j) << "a step waits for a later one";
      before[j][static_cast<size_t>(p)] = true;
      for (size_t i = 0; i < n; ++i) before[j][i] = before[j][i] || before[static_cast<size_t>(p)][i];
    }
  }
  // Planned bytes of each step, by brute force.
  struct Bytes {
    int memory;
    int64_t begin, end;
    bool write;
  };
  auto bytes_of = [&](size_t s) {
    std::vector<Bytes> out;
    auto add = [&](int buffer, bool write) {
      auto [root, offset] = plan.ViewOf(buffer);
      const PlanBuffer& r = plan.buffers[static_cast<size_t>(root)];
      const bool arena = r.kind == PlanBuffer::Kind::kArena;
      const int64_t begin = offset + (arena ? r.offset : 0);
      out.push_back({arena ? -1 : root, begin, begin + plan.buffers[static_cast<size_t>(buffer)].bytes(), write});
    };
    for (int buffer : plan.steps[s].inputs) add(buffer, false);
    for (int buffer : plan.steps[s].outputs) add(buffer, true);
    return out;
  };
  int hazards = 0;
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < j; ++i) {
      bool conflict = false;
      for (const Bytes& a : bytes_of(i)) {
        for (const Bytes& c : bytes_of(j)) {
          conflict |= a.memory == c.memory && a.begin < c.end && c.begin < a.end && a.begin < a.end &&
                      c.begin < c.end && (a.write || c.write);
        }
      }
      if (!conflict) continue;
      ++hazards;
      EXPECT_TRUE(before[j][i]) << "step " << j << " does not wait for step " << i;
    }
  }
  EXPECT_GT(hazards, static_cast<int>(n) / 2);
}

// A step that fails (an index out of range, from the call's own input)
// ends the call with its error, on any number of threads: the steps after
// it do not wait for it forever.
TEST(Schedule, AFailingStepEndsTheCallWithItsErrorOnAnyThreads) {
  Module module;
  module.AddSource(R"(
def @f(%emb: Tensor[(16, 256), f32], %idx: Tensor[(512,), i64], %w: Tensor[(256, 256), f32]) -> Tensor[(), f32] {
  sum(tanh(matmul(take(%emb, %idx), %w)))
}
)", "f.pj");
  Rng rng(1);
  Tensor idx = Tensor::Empty(DType::kI64, {512});
  for (int64_t i = 0; i < 512; ++i) idx.data<int64_t>()[i] = i % 16;
  std::vector<Value> args = {Value(RandomNormal(rng, {16, 256}, 0, 1)), Value(idx), Value(RandomNormal(rng, {256, 256}, 0, 0.1f))};
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileResidual(*session, PartialEvaluate(*module.snapshot(), "f", args).main, {});
  std::vector<Tensor> inputs = Flatten(args);
  const std::vector<Tensor> good = exe->Run(inputs);
  inputs[1] = Tensor::Empty(DType::kI64, {512});
  for (int64_t i = 0; i < 512; ++i) inputs[1].data<int64_t>()[i] = i == 300 ? 99 : i % 16;
  for (int threads : {1, 2, 4}) {
    EXPECT_THROW(RunWith(*exe, inputs, threads), OpError) << threads << " threads";
  }
  // The executable still works.
  ExpectSameBits(good, RunWith(*exe, Flatten(args), 2), "after the error");
}

// A product too big for one thread is split, and prints so; its parts give
// the bits of any number of threads.
TEST(Schedule, ALargeProductIsSplitIntoParts) {
  Module module;
  module.AddSource(R"(
def @f(%x: Tensor[(256, 512), f32], %w: Tensor[(512, 384), f32], %v: Tensor[(384, 64), f32]) -> Tensor[(256, 64), f32] {
  matmul(tanh(matmul(%x, %w)), %v)
}
)", "f.pj");
  Rng rng(1);
  std::vector<Value> args = {Value(RandomNormal(rng, {256, 512}, 0, 1)), Value(RandomNormal(rng, {512, 384}, 0, 1)),
                             Value(RandomNormal(rng, {384, 64}, 0, 1))};
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileResidual(*session, PartialEvaluate(*module.snapshot(), "f", args).main, {});
  const Plan& plan = PlanOf(exe);
  int64_t most = 1;
  for (const PlanStep& s : plan.steps) most = std::max(most, s.parts);
  EXPECT_EQ(most, kMaxParts) << plan.ToString();
  EXPECT_NE(plan.ToString().find("×" + std::to_string(kMaxParts)), std::string::npos);
  std::vector<Tensor> inputs = Flatten(args);
  std::vector<Tensor> alone = exe->Run(inputs);
  for (int threads : {2, 4}) ExpectSameBits(alone, RunWith(*exe, inputs, threads), std::to_string(threads) + " threads");
}

// Small steps stay whole and in no lane: dividing them would cost more
// than it gains.
TEST(Schedule, SmallStepsStayWholeAndSerial) {
  Module module;
  module.AddSource(R"(
def @g(%x: Tensor[(4, 8), f32], %w: Tensor[(8, 8), f32]) -> Tensor[(4, 8), f32] { tanh(matmul(%x, %w)) }
)", "g.pj");
  Rng rng(1);
  std::vector<Value> args = {Value(RandomNormal(rng, {4, 8}, 0, 1)), Value(RandomNormal(rng, {8, 8}, 0, 1))};
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileResidual(*session, PartialEvaluate(*module.snapshot(), "g", args).main, {});
  const Plan& plan = PlanOf(exe);
  EXPECT_EQ(DividedSteps(plan), 0) << plan.ToString();
  for (const PlanStep& s : plan.steps) EXPECT_EQ(s.parts, 1);
}

// Steps that depend on each other in one stage are refused, as an image
// (jit/image.h) holding such a stage would be.
TEST(Schedule, CheckStagesRefusesDependentStepsInOneStage) {
  Module module;
  module.AddSource(R"(
def @h(%x: Tensor[(64, 64), f32]) -> Tensor[(64, 64), f32] { tanh(matmul(exp(%x), %x)) }
)", "h.pj");
  Rng rng(1);
  std::vector<Value> args = {Value(RandomNormal(rng, {64, 64}, 0, 1))};
  auto session = JitSession::Create();
  Plan plan = PlanOf(CompileResidual(*session, PartialEvaluate(*module.snapshot(), "h", args).main, {}));
  ASSERT_GE(plan.stages.size(), 2u) << plan.ToString();
  EXPECT_NO_THROW(CheckStages(plan));
  // exp, then the product reading it: one stage would race.
  plan.stages[0].end = plan.stages[1].end;
  plan.stages.erase(plan.stages.begin() + 1);
  EXPECT_THROW(CheckStages(plan), JitFailure);
  Plan gap = plan;
  gap.stages.pop_back();
  EXPECT_THROW(CheckStages(gap), JitFailure);
}

}  // namespace
}  // namespace pejit
