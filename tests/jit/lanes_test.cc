// Lanes (jit/lanes.h): a program of independent examples is cut between
// them, a small or indivisible one is not; batching merges instances within
// a lane only; each lane's buffers have arena bytes of their own; and a
// program in lanes computes what it does in one, on any number of threads.
#include "jit/lanes.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ir/printer.h"
#include "ir/visitor.h"
#include "jit/batch.h"
#include "jit/native_executable.h"
#include "jit/pipeline.h"
#include "jit/schedule.h"
#include "ops/random.h"
#include "pe/partial_eval.h"
#include "support/team.h"
#include "tests/support/thread_pool.h"

namespace pejit {
namespace {

// Two examples' chains of products, `depth` each, joined by one add at the end.
std::string TwoChains(int rows, int width, int depth) {
  const std::string x = "Tensor[(" + std::to_string(rows) + ", " + std::to_string(width) + "), f32]";
  const std::string w = "Tensor[(" + std::to_string(width) + ", " + std::to_string(width) + "), f32]";
  std::string text = "def @chain(%x: " + x + ", %w: " + w + ") -> " + x + " {\n";
  std::string h = "%x";
  for (int d = 0; d < depth; ++d) {
    text += "  let %h" + std::to_string(d) + " = tanh(matmul(" + h + ", %w));\n";
    h = "%h" + std::to_string(d);
  }
  text += "  " + h + "\n}\n";
  text += "def @f(%a: " + x + ", %b: " + x + ", %w: " + w + ") -> Tensor[(), f32] {\n";
  text += "  sum(add(@chain(%a, %w), @chain(%b, %w)))\n}\n";
  return text;
}

Straight ResidualOf(const std::string& source, const std::vector<Value>& args) {
  Module module;
  module.AddSource(source, "lanes.pj");
  return Decompose(PartialEvaluate(*module.snapshot(), "f", args).main);
}

std::vector<Value> ChainArgs(int rows, int width) {
  Rng rng(5);
  return {Value(RandomNormal(rng, {rows, width}, 0, 1)), Value(RandomNormal(rng, {rows, width}, 0, 1)),
          Value(RandomNormal(rng, {width, width}, 0, 0.1f))};
}

// The lane of the first operation reading `operand`, or -2 when none does.
int LaneOfUse(const Straight& s, const LaneSplit& split, const Var& operand) {
  for (size_t i = 0; i < s.bindings.size(); ++i) {
    auto* call = As<OpCallNode>(s.bindings[i].value);
    if (!call) continue;
    for (const Expr& a : call->args) {
      if (a.get() == operand.get()) return split.lane_of[i];
    }
  }
  return -2;
}

TEST(Lanes, IndependentExamplesAreCutBetweenThem) {
  std::vector<Value> args = ChainArgs(128, 256);
  Straight s = ResidualOf(TwoChains(128, 256, 3), args);
  LaneSplit split = SplitIntoLanes(s, 2);
  ASSERT_EQ(split.lanes, 2) << split.why_one;
  // Each chain's first product is in a lane of its own; the lanes are in
  // the program's order.
  EXPECT_EQ(LaneOfUse(s, split, s.params[0]), 0);
  EXPECT_EQ(LaneOfUse(s, split, s.params[1]), 1);
  for (size_t i = 1; i < s.bindings.size(); ++i) EXPECT_LE(split.lane_of[i - 1], split.lane_of[i]);
  // What crosses: the first chain's result, read by the join (128 x 256 floats).
  EXPECT_EQ(split.cut_bytes, 128 * 256 * 4);
}

TEST(Lanes, OneLaneWhenAskedSmallOrIndivisible) {
  {
    std::vector<Value> args = ChainArgs(128, 256);
    EXPECT_EQ(SplitIntoLanes(ResidualOf(TwoChains(128, 256, 3), args), 1).lanes, 1);
  }
  {
    std::vector<Value> args = ChainArgs(2, 8);
    LaneSplit split = SplitIntoLanes(ResidualOf(TwoChains(2, 8, 3), args), 2);
    EXPECT_EQ(split.lanes, 1);
    EXPECT_EQ(split.why_one, "too little work to divide");
  }
  {
    // One chain: the second half waits for the end of the first.
    Module module;
    module.AddSource(R"(
def @f(%x: Tensor[(128, 256), f32], %w: Tensor[(256, 256), f32]) -> Tensor[(), f32] {
  let %a = tanh(matmul(%x, %w));
  let %b = tanh(matmul(%a, %w));
  let %c = tanh(matmul(%b, %w));
  let %d = tanh(matmul(%c, %w));
  sum(%d)
})", "chain.pj");
    Rng rng(2);
    std::vector<Value> args = {Value(RandomNormal(rng, {128, 256}, 0, 1)), Value(RandomNormal(rng, {256, 256}, 0, 0.1f))};
    LaneSplit split = SplitIntoLanes(Decompose(PartialEvaluate(*module.snapshot(), "f", args).main), 2);
    EXPECT_EQ(split.lanes, 1);
    EXPECT_NE(split.why_one.find("would wait for each other"), std::string::npos) << split.why_one;
  }
}

// A Tree-LSTM minibatch, as the engine compiles it.
struct TreeLstmStep {
  Module module;
  Snapshot snapshot;
  std::vector<Value> args;
  Func residual;
  TreeLstmStep() {
    module.AddSource(treelstm::ModelSource(), "treelstm.pj");
    snapshot = module.snapshot();
    treelstm::Batch b = treelstm::GeneratedListOpsBatch(7, 24, *snapshot);
    Rng rng(3);
    args = {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, 64, 128, listops::kClasses})};
    residual = PartialEvaluate(*snapshot, "loss", args).main;
  }
};

TEST(Lanes, BatchingMergesInstancesWithinALaneOnly) {
  TreeLstmStep step;
  BatchStats one, two;
  Func batched_one = Batch(step.residual, &one, 1);
  Func batched_two = Batch(step.residual, &two, 2);
  ASSERT_EQ(two.lanes, 2) << two.why_one_lane;
  EXPECT_EQ(one.lanes, 1);
  // Each lane has its own batched cell per level: more groups; the few
  // instances alone in their lane at a level are not merged.
  EXPECT_GT(two.groups, one.groups);
  EXPECT_LE(two.batched_ops, one.batched_ops);
  EXPECT_GT(two.batched_ops, one.batched_ops * 95 / 100);
  // Every operation says its lane; both lanes hold products.
  std::map<int, int> products_by_lane;
  PostOrderVisit(batched_two->body, [&](const Expr& e) {
    auto* call = As<OpCallNode>(e);
    if (!call) return;
    EXPECT_GE(call->loc.lane, 0) << call->op->name;
    if (call->op->name == "dense" || call->op->name == "matmul") ++products_by_lane[call->loc.lane];
  });
  EXPECT_EQ(products_by_lane.size(), 2u);
  // The same loss as the program unbatched.
  Module m;
  m.AddAll({{"one", step.residual}, {"two", batched_two}});
  Interpreter interp;
  std::vector<Value> inputs;
  for (const Tensor& t : Flatten(step.args)) inputs.emplace_back(t);
  const Tensor want = interp.Call(*m.snapshot(), "one", inputs).tensor();
  const Tensor got = interp.Call(*m.snapshot(), "two", inputs).tensor();
  EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-6)) << got.ToString() << " vs " << want.ToString();
}

std::vector<Tensor> RunWith(const Executable& exe, const std::vector<Tensor>& inputs, int threads) {
  testing_support::ThreadPool pool(threads - 1);
  Team team(&pool, threads);
  ScopedTeam scoped(&team);
  return exe.Run(inputs);
}

TEST(Lanes, ATrainingStepInLanesGivesTheGradientsOfOneLaneAndTheSameBitsOnAnyThreads) {
  TreeLstmStep step;
  auto session = JitSession::Create();
  PipelineOptions options;
  options.wrt_leaves = FloatWrtLeaves(step.args, std::vector<int>{2});
  options.lanes = 1;
  ExecutablePtr one = CompileResidual(*session, step.residual, options);
  options.lanes = 2;
  PipelineReport report;
  ExecutablePtr two = CompileResidual(*session, step.residual, options, &report);
  ASSERT_EQ(report.batch.lanes, 2);
  const Plan& plan = dynamic_cast<const NativeExecutable&>(*two).plan();
  EXPECT_NE(plan.ToString().find("lane 1"), std::string::npos);
  // Each weight's gradient: one product per lane, summed.
  std::vector<Tensor> inputs = Flatten(step.args);
  std::vector<Tensor> want = one->Run(inputs), got = two->Run(inputs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(AllClose(got[i], want[i], 1e-4, 1e-6)) << "result " << i;
  }
  for (int threads : {1, 2, 4}) {
    for (int run = 0; run < 3; ++run) {
      std::vector<Tensor> again = RunWith(*two, inputs, threads);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::memcmp(again[i].raw_data(), got[i].raw_data(), got[i].nbytes()), 0)
            << threads << " threads, result " << i;
      }
    }
  }
}

// The minibatch's training step (gradients of the parameters), compiled
// with the pipeline's lanes.
ExecutablePtr CompileTrainingStep(JitSession& session, const TreeLstmStep& step) {
  PipelineOptions options;
  options.wrt_leaves = FloatWrtLeaves(step.args, std::vector<int>{2});
  return CompileResidual(session, step.residual, options);
}

TEST(Lanes, EachLanesBuffersHaveArenaBytesOfTheirOwn) {
  TreeLstmStep step;
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileTrainingStep(*session, step);
  const Plan& plan = dynamic_cast<const NativeExecutable&>(*exe).plan();
  std::map<int, std::pair<int64_t, int64_t>> region;  // lane → [first byte, end)
  for (const PlanBuffer& b : plan.buffers) {
    if (b.kind != PlanBuffer::Kind::kArena || b.first_step < 0) continue;
    auto [it, fresh] = region.emplace(b.lane, std::make_pair(b.offset, b.offset + b.bytes()));
    if (!fresh) it->second = {std::min(it->second.first, b.offset), std::max(it->second.second, b.offset + b.bytes())};
  }
  ASSERT_GE(region.size(), 3u) << "lane 0, lane 1, and buffers of several lanes";
  for (auto a = region.begin(); a != region.end(); ++a) {
    for (auto b = std::next(a); b != region.end(); ++b) {
      EXPECT_TRUE(a->second.second <= b->second.first || b->second.second <= a->second.first)
          << "lanes " << a->first << " and " << b->first << " share arena bytes";
    }
  }
}

// Two buffers sharing arena bytes make the second's writer wait for the
// first's last reader: across lanes, that would hold a thread back for data
// it never uses. So a step waits for a step of another lane (or of none)
// only when both touch one buffer, one of them writing it.
TEST(Lanes, AStepWaitsForAnotherLanesStepOnlyForABufferBothTouch) {
  TreeLstmStep step;
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileTrainingStep(*session, step);
  const Plan& plan = dynamic_cast<const NativeExecutable&>(*exe).plan();
  auto roots = [&](const std::vector<int>& buffers) {
    std::set<int> out;
    for (int b : buffers) out.insert(plan.ViewOf(b).first);
    return out;
  };
  const std::vector<std::vector<int>> deps = StepDependences(plan);
  int across = 0;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const PlanStep& later = plan.steps[s];
    for (int d : deps[s]) {
      const PlanStep& earlier = plan.steps[static_cast<size_t>(d)];
      if (earlier.lane == later.lane) continue;
      ++across;
      const std::set<int> later_reads = roots(later.inputs), later_writes = roots(later.outputs);
      bool shared = false;
      for (int w : roots(earlier.outputs)) shared |= later_reads.count(w) || later_writes.count(w);
      for (int r : roots(earlier.inputs)) shared |= later_writes.count(r) > 0;
      EXPECT_TRUE(shared) << "step " << s << " (lane " << later.lane << ") waits for step " << d << " (lane "
                          << earlier.lane << ") through arena bytes alone";
    }
  }
  EXPECT_GT(across, 0) << "the lanes share data: a test that finds no such wait checks nothing";
}

}  // namespace
}  // namespace pejit
