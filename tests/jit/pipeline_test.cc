// The pipeline after PE (jit/pipeline.h): the stages run in their order, each
// seen by the print-after hook and timed, and what comes out computes the
// interpreter's values and gradients.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ir/printer.h"
#include "ir/visitor.h"
#include "jit/pass.h"
#include "jit/pipeline.h"
#include "ops/packed_gemm.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

int CountOps(const Func& f) {
  int n = 0;
  PostOrderVisit(f->body, [&](const Expr& e) { n += As<OpCallNode>(e) != nullptr; });
  return n;
}

struct TreeLstmCall {
  Module module;
  Snapshot snapshot;
  std::vector<Value> args;

  explicit TreeLstmCall(int trees) {
    module.AddSource(treelstm::ModelSource(), "treelstm.pj");
    snapshot = module.snapshot();
    treelstm::Batch b = treelstm::GeneratedListOpsBatch(3, trees, *snapshot);
    Rng rng(5);
    args = {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, 8, 16, listops::kClasses})};
  }
};

TEST(PipelineTest, GradModeRunsBatchThenAutodiffAndMatchesTheInterpreterTape) {
  TreeLstmCall call(4);
  Residual residual = PartialEvaluate(*call.snapshot, "loss", call.args);
  PipelineOptions options;
  options.wrt_leaves = FloatWrtLeaves(call.args, std::vector<int>{2});
  std::vector<std::string> stages;
  std::vector<int> ops;
  std::vector<double> ms;
  options.compile.instrument.after = [&](std::string_view stage, const PassProduct& product, double took) {
    stages.emplace_back(stage);
    ASSERT_NE(product.program, nullptr);
    ops.push_back(CountOps(*product.program));
    EXPECT_EQ(product.text(), PrintFunction("main", *product.program));
    ms.push_back(took);
  };
  auto session = JitSession::Create();
  PipelineReport report;
  ExecutablePtr exe = CompileResidual(*session, residual.main, options, &report);

  // The residual pass list, then lowering's (jit/pass.h), each once, in order.
  std::vector<std::string> passes = {"residual", "batch", "autodiff", "fold-constants", "combine-sums"};
  if (PackedGemmFast()) passes.push_back("pack-gemm");
  passes.insert(passes.end(), {"cse", "dce"});
  EXPECT_EQ(stages, passes);
  for (const std::string& stage : stages) EXPECT_TRUE(IsPassName(stage)) << stage;
  ASSERT_EQ(ops.size(), passes.size());
  EXPECT_DOUBLE_EQ(report.batch_ms, ms[1]);
  EXPECT_DOUBLE_EQ(report.autodiff_ms, ms[2]);
  EXPECT_LT(ops[1], ops[0]) << "batching merges the cells of the four trees";
  EXPECT_GT(ops[2], ops[1]) << "autodiff adds the backward pass";
  EXPECT_TRUE(report.batched);
  EXPECT_TRUE(report.batch_skipped.empty());
  EXPECT_GT(report.batch.groups, 0);
  EXPECT_GT(report.compile.kernels, 0);

  std::vector<Tensor> got = exe->Run(Flatten(call.args));
  Interpreter interp;
  Interpreter::ValueAndGrad want = interp.CallWithGrad(*call.snapshot, "loss", call.args, {2});
  std::vector<Tensor> want_leaves = Flatten({want.value});
  for (const Tensor& g : Flatten({want.grads[0]})) want_leaves.push_back(g);
  ASSERT_EQ(got.size(), want_leaves.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(AllClose(got[i], want_leaves[i], 1e-4, 1e-5)) << "result " << i;
  }
}

// Compiles `entry` in grad mode for the float leaves of arguments 0 and 1
// and expects the interpreter's value and gradients; returns how many
// tensors the compiled code gave.
size_t ExpectCompiledGradientsOfTheFirstTwoArguments(const Snapshot& snapshot, const std::string& entry,
                                                     const std::vector<Value>& args) {
  Residual residual = PartialEvaluate(*snapshot, entry, args);
  PipelineOptions options;
  options.wrt_leaves = FloatWrtLeaves(args, std::vector<int>{0, 1});
  auto session = JitSession::Create();
  ExecutablePtr exe = CompileResidual(*session, residual.main, options);
  std::vector<Tensor> got = exe->Run(Flatten(args));
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*snapshot, entry, args, {0, 1});
  std::vector<Tensor> want_leaves = Flatten({want.value});
  for (const Value& g : want.grads) AppendTensorLeaves(g, want_leaves);
  EXPECT_EQ(got.size(), want_leaves.size());
  for (size_t i = 0; i < got.size() && i < want_leaves.size(); ++i) {
    EXPECT_TRUE(AllClose(got[i], want_leaves[i], 1e-5, 1e-6))
        << "result " << i << ": " << got[i].ToString() << " vs " << want_leaves[i].ToString();
  }
  return got.size();
}

// gather along a middle and the last axis (issue 23), twice alike so that
// batching meets two calls it has no rule to merge: compiled values and
// gradients are the interpreter's.
TEST(PipelineTest, GatherAlongAnyAxisCompilesWithItsGradient) {
  Module module;
  module.AddSource(R"(
def @f(%x: Tensor[(2, 5, 3), f32], %y: Tensor[(2, 5, 3), f32], %i: Tensor[(4,), i64], %j: Tensor[(2, 2), i64])
    -> Tensor[(), f32] {
  let %a = gather(%x, %i, axis=1);
  let %b = gather(%y, %i, axis=1);
  let %c = gather(mul(%a, %b), %j, axis=-1);
  sum(tanh(%c))
})",
                   "gather.pj");
  Snapshot snapshot = module.snapshot();
  Rng rng(11);
  std::vector<Value> args = {Value(RandomUniform(rng, {2, 5, 3}, -1, 1)), Value(RandomUniform(rng, {2, 5, 3}, -1, 1)),
                             Value(Tensor::FromVector<int64_t>({4}, {4, 0, 2, 0})),
                             Value(Tensor::FromVector<int64_t>({2, 2}, {2, 0, 2, 1}))};
  EXPECT_EQ(ExpectCompiledGradientsOfTheFirstTwoArguments(snapshot, "f", args), 3u);
}

// Generic definitions (issue 23): the prelude's @map and @fold are written
// once for any element type; partial evaluation unfolds the instances this
// call makes, and the compiled values and gradients are the interpreter's.
TEST(PipelineTest, GenericMapAndFoldSpecializeAndCompile) {
  Module module;
  module.AddSource(R"(
def @loss(%xs: List[Tensor[(4,), f32]], %w: Tensor[(3, 4), f32]) -> Tensor[(), f32] {
  let %hs: List[Tensor[(3,), f32]] = @map(fn (%x: Tensor[(4,), f32]) { tanh(sum(mul(%w, %x), axes=[1])) }, %xs);
  let %n: Tensor[(), i64] = @fold(fn (%k: Tensor[(), i64], %h: Tensor[(3,), f32]) { add(%k, 1) }, 0, %hs);
  div(@fold(fn (%s: Tensor[(), f32], %h: Tensor[(3,), f32]) { add(%s, sum(mul(%h, %h))) }, 0f32, %hs), cast(%n, dtype=f32))
})",
                   "generic.pj");
  Snapshot snapshot = module.snapshot();
  Rng rng(13);
  TypeDefPtr list = snapshot->FindType("List");
  Value xs = Value::Adt(list, 0, {});
  for (int i = 0; i < 5; ++i) xs = Value::Adt(list, 1, {Value(RandomUniform(rng, {4}, -1, 1)), xs});
  std::vector<Value> args = {xs, Value(RandomUniform(rng, {3, 4}, -1, 1))};
  // The loss, a gradient per list element, the weight's.
  EXPECT_EQ(ExpectCompiledGradientsOfTheFirstTwoArguments(snapshot, "loss", args), 1u + 5 + 1);
}

TEST(PipelineTest, ValueModeWithoutBatchingHasOneStage) {
  TreeLstmCall call(2);
  std::vector<Value> args = {call.args[0], call.args[2]};
  Residual residual = PartialEvaluate(*call.snapshot, "infer", args);
  PipelineOptions options;
  options.batch = false;
  std::vector<std::string> stages;
  options.compile.instrument.after = [&](std::string_view stage, const PassProduct&, double) { stages.emplace_back(stage); };
  PipelineReport report;
  Func program = PrepareResidual(residual.main, options, &report);
  EXPECT_EQ(stages, std::vector<std::string>{"residual"});
  EXPECT_FALSE(report.batched);
  EXPECT_EQ(program.get(), residual.main.get()) << "nothing to do: the residual itself";
}

TEST(PipelineTest, AProgramThatIsNotStraightLineStaysUnbatchedAndSaysWhy) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(3,), f32]) -> Tensor[(3,), f32] {\n"
              "  if (greater(sum(%x), 0f32)) { tanh(%x) } else { neg(%x) }\n"
              "}\n",
              "f.pj");
  Rng rng(1);
  std::vector<Value> args = {Value(RandomUniform(rng, {3}, -1, 1))};
  Residual residual = PartialEvaluate(*m.snapshot(), "f", args);
  PipelineReport report;
  Func program = PrepareResidual(residual.main, {}, &report);
  EXPECT_FALSE(report.batched);
  EXPECT_NE(report.batch_skipped.find("if"), std::string::npos) << report.batch_skipped;
  auto session = JitSession::Create();
  EXPECT_THROW(CompileResidual(*session, residual.main, {}), JitFailure);
}

}  // namespace
}  // namespace pejit
