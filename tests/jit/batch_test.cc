// Auto-batching: the batched program computes what the unbatched one does
// (values and gradients, interpreted and compiled), merges exactly the
// independent instances of one computation, and turns a minibatch of trees
// of equal height h into h batched cells plus one for the leaves.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ir/printer.h"
#include "ir/visitor.h"
#include "jit/autodiff.h"
#include "jit/batch.h"
#include "jit/compiler.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

// Operator calls of `f` named `op`, by source line.
std::map<int, int> CountByLine(const Func& f, const std::string& op) {
  std::map<int, int> n;
  PostOrderVisit(f->body, [&](const Expr& e) {
    if (auto* call = As<OpCallNode>(e); call && call->op->name == op) ++n[call->loc.line];
  });
  return n;
}

int Count(const Func& f, const std::string& op) {
  int n = 0;
  for (const auto& [line, count] : CountByLine(f, op)) n += count;
  return n;
}

// The line of treelstm.pj holding `text`.
int LineOf(std::string_view source, std::string_view text) {
  size_t at = source.find(text);
  EXPECT_NE(at, std::string_view::npos) << text;
  return 1 + static_cast<int>(std::count(source.begin(), source.begin() + at, '\n'));
}

class BatchTest : public testing::Test {
 protected:
  static void SetUpTestSuite() { session_ = JitSession::Create().release(); }
  static void TearDownTestSuite() { delete session_; }

  // Runs a straight-line program in the interpreter (it type-checks on the way).
  std::vector<Tensor> Interpret(const Func& f, const std::vector<Tensor>& inputs) {
    Module m;
    m.AddAll({{"main", f}});
    std::vector<Value> args(inputs.begin(), inputs.end());
    return Flatten({interp_.Call(*m.snapshot(), "main", args)});
  }

  static void ExpectClose(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(AllClose(got[i], want[i], 1e-4, 1e-6))
          << what << ", result " << i << ": " << got[i].ToString() << " vs " << want[i].ToString();
    }
  }

  // Batches `program` and checks the result against the original, in the
  // interpreter and compiled.
  Func CheckBatched(const Func& program, const std::vector<Tensor>& inputs, BatchStats* stats = nullptr) {
    Func batched = Batch(program, stats);
    std::vector<Tensor> want = Interpret(program, inputs);
    ExpectClose(Interpret(batched, inputs), want, "batched, interpreted");
    ExpectClose(session_->Compile(batched)->Run(inputs), want, "batched, compiled");
    return batched;
  }

  // `batched` (Batch of `program`) differentiated for `wrt` and compiled
  // gives the gradients of `program` interpreted: batching before autodiff,
  // as the engine does.
  void ExpectBatchedGradients(const Func& program, const Func& batched, const std::vector<int>& wrt,
                              const std::vector<Tensor>& inputs) {
    std::vector<Tensor> want = Interpret(Differentiate(program, wrt), inputs);
    ExpectClose(session_->Compile(Differentiate(batched, wrt))->Run(inputs), want, "batched then differentiated");
  }

  static JitSession* session_;
  Interpreter interp_;
};
JitSession* BatchTest::session_ = nullptr;

Snapshot Load(const std::string& text) {
  Module m;
  m.AddSource(text, "b.pj");
  return m.snapshot();
}

TEST_F(BatchTest, IndependentInstancesMergeAndDependentOnesDoNot) {
  Snapshot s = Load(R"(
def @layer(%x: Tensor[(1, 4), f32], %w: Tensor[(3, 4), f32], %b: Tensor[(3,), f32]) -> Tensor[(1, 3), f32] {
  tanh(dense(%x, %w, %b))
}
def @f(%x1: Tensor[(1, 4), f32], %x2: Tensor[(1, 4), f32], %x3: Tensor[(1, 4), f32],
       %w: Tensor[(3, 4), f32], %b: Tensor[(3,), f32], %v: Tensor[(3, 4), f32]) {
  let %h1 = @layer(%x1, %w, %b);
  let %h2 = @layer(%x2, %w, %b);
  let %h3 = @layer(%x3, %v, %b);    # other weights: not an instance of the same GEMM
  let %deep = @layer(pad(%h1, before=[0, 0], after=[0, 1]), %w, %b);  # depends on %h1
  (add(%h1, %h2), %h3, %deep)
})");
  Rng rng(1);
  std::vector<Value> args;
  for (Shape shape : {Shape{1, 4}, {1, 4}, {1, 4}, {3, 4}, {3}, {3, 4}}) {
    args.emplace_back(RandomUniform(rng, shape, -1, 1));
  }
  Residual r = PartialEvaluate(*s, "f", args);
  BatchStats stats;
  Func batched = CheckBatched(r.main, Flatten(args), &stats);
  // %h1 and %h2 share one GEMM; %h3 (other weights) and %deep (after %h1) run alone.
  EXPECT_EQ(Count(r.main, "dense"), 4);
  EXPECT_EQ(Count(batched, "dense"), 3) << PrintFunction("batched", batched);
  EXPECT_EQ(stats.groups, 2) << stats.ToString();  // the dense pair; the tanh of %h1, %h2 and %h3
  EXPECT_EQ(stats.batched_ops, 5);
  EXPECT_EQ(stats.ops_before, Count(r.main, "dense") + Count(r.main, "tanh") + Count(r.main, "pad") +
                                  Count(r.main, "add"));
}

TEST_F(BatchTest, OperandsOfOtherRanksBroadcastAndAxesMoveAfterStacking) {
  Snapshot s = Load(R"(
def @g(%a: Tensor[(2, 3), f32], %v: Tensor[(3,), f32], %k: Tensor[(), f32]) -> (Tensor[(2, 3), f32], Tensor[(2,), f32]) {
  let %y = mul(sigmoid(add(%a, %v)), %k);
  let %c = chunk(%y, chunks=3, axis=1);
  (softmax(%y, axis=0), sum(%c.1, axes=[1]))
}
def @f(%a1: Tensor[(2, 3), f32], %a2: Tensor[(2, 3), f32], %v1: Tensor[(3,), f32], %v2: Tensor[(3,), f32],
       %k: Tensor[(), f32]) {
  let %g1 = @g(%a1, %v1, %k);
  let %g2 = @g(%a2, %v2, %k);
  (add(%g1.0, %g2.0), %g1.1, mul(%g2.1, 2f32))
})");
  Rng rng(2);
  std::vector<Value> args;
  for (Shape shape : {Shape{2, 3}, {2, 3}, {3}, {3}, {}}) args.emplace_back(RandomUniform(rng, shape, -1, 1));
  Residual r = PartialEvaluate(*s, "f", args);
  Func batched = CheckBatched(r.main, Flatten(args));
  for (const char* op : {"add", "sigmoid", "chunk", "softmax", "sum"}) {
    EXPECT_EQ(Count(r.main, op), op == std::string("add") ? 3 : 2) << op;
    EXPECT_EQ(Count(batched, op), op == std::string("add") ? 2 : 1) << op << "\n" << PrintFunction("batched", batched);
  }
}

// Reductions of scalars (a loss's terms: sum(mul(%y, %dy)) per output) stack
// into a vector and reduce along a unit axis, not along the stack.
TEST_F(BatchTest, ReductionsOfScalarsReduceEachInstanceAlone) {
  Snapshot s = Load(R"(
def @term(%a: Tensor[(), f32], %b: Tensor[(), f32]) -> Tensor[(), f32] {
  add(add(sum(mul(%a, %b)), norm(%a)), max(%b))
}
def @f(%a: Tensor[(), f32], %b: Tensor[(), f32], %c: Tensor[(), f32], %d: Tensor[(), f32]) {
  (@term(%a, %b), @term(%c, %d))
})");
  std::vector<Value> args;
  for (float v : {1.5f, -2.0f, 0.25f, 3.0f}) args.emplace_back(Tensor::Scalar(v));
  Residual r = PartialEvaluate(*s, "f", args);
  Func batched = CheckBatched(r.main, Flatten(args));
  for (const char* op : {"sum", "norm", "max"}) {
    EXPECT_EQ(Count(batched, op), 1) << op << "\n" << PrintFunction("batched", batched);
  }
}

// layer_norm works along the last axis: instances stack along a new first
// one, their gamma and beta shared; one with another gamma runs alone.
TEST_F(BatchTest, LayerNormsOfOneGammaAndBetaMerge) {
  Snapshot s = Load(R"(
def @norm(%x: Tensor[(2, 5), f32], %g: Tensor[(5,), f32], %b: Tensor[(5,), f32]) -> Tensor[(2, 5), f32] {
  layer_norm(%x, %g, %b, eps=0.001)
}
def @f(%x1: Tensor[(2, 5), f32], %x2: Tensor[(2, 5), f32], %x3: Tensor[(2, 5), f32],
       %g: Tensor[(5,), f32], %b: Tensor[(5,), f32], %g2: Tensor[(5,), f32]) {
  let %y1 = @norm(%x1, %g, %b);
  let %y2 = @norm(%x2, %g, %b);
  let %y3 = @norm(%x3, %g2, %b);
  (add(%y1, %y2), %y3)
})");
  Rng rng(3);
  std::vector<Value> args;
  for (Shape shape : {Shape{2, 5}, {2, 5}, {2, 5}, {5}, {5}, {5}}) args.emplace_back(RandomUniform(rng, shape, -1, 1));
  Residual r = PartialEvaluate(*s, "f", args);
  Func batched = CheckBatched(r.main, Flatten(args));
  EXPECT_EQ(Count(r.main, "layer_norm"), 3);
  EXPECT_EQ(Count(batched, "layer_norm"), 2) << PrintFunction("batched", batched);
}

// A loss per instance (a label at every node of a tree) runs as one loss
// over all instances' rows, each instance's mean taken over its own rows;
// its one_hot (the backward's targets) as one call too. Gradients through
// the batched losses are the unbatched ones.
TEST_F(BatchTest, LossesOfInstancesRunAsOneLossPerRow) {
  Snapshot s = Load(R"(
def @term(%x: Tensor[(2, 4), f32], %w: Tensor[(3, 4), f32], %y: Tensor[(2,), i64]) -> Tensor[(), f32] {
  let %s = matmul(%x, %w, transpose_b=true);
  let %rows = nll(log_softmax(%s, axis=1), %y, mean=false);
  add(add(cross_entropy(%s, %y), sum(%rows)), sum(one_hot(%y, depth=3)))
}
def @f(%x1: Tensor[(2, 4), f32], %x2: Tensor[(2, 4), f32], %x3: Tensor[(2, 4), f32], %w: Tensor[(3, 4), f32],
       %y1: Tensor[(2,), i64], %y2: Tensor[(2,), i64]) -> Tensor[(), f32] {
  add(add(@term(%x1, %w, %y1), @term(%x2, %w, %y2)), @term(%x3, %w, %y1))  # %y1 twice
})");
  Rng rng(4);
  std::vector<Value> args;
  for (Shape shape : {Shape{2, 4}, {2, 4}, {2, 4}, {3, 4}}) args.emplace_back(RandomUniform(rng, shape, -2, 2));
  args.emplace_back(Tensor::FromVector<int64_t>({2}, {2, 0}));
  args.emplace_back(Tensor::FromVector<int64_t>({2}, {1, 1}));
  Residual r = PartialEvaluate(*s, "f", args);
  Func batched = CheckBatched(r.main, Flatten(args));
  for (const char* op : {"cross_entropy", "nll", "one_hot"}) {
    EXPECT_EQ(Count(r.main, op), 3) << op;
    EXPECT_EQ(Count(batched, op), 1) << op << "\n" << PrintFunction("batched", batched);
  }
  ExpectBatchedGradients(r.main, batched, {0, 1, 2, 3}, Flatten(args));
}

// Shape operators whose attributes name axes batch with those axes moved
// past the stack axis (negative ones resolved first); a stack's operand
// shared by the instances takes part in each; broadcast_to and sum_to keep
// the stack axis apart from the axes they add or sum.
TEST_F(BatchTest, ShapeOperatorsBatchWithTheirAxesMoved) {
  Snapshot s = Load(R"(
def @shapes(%x: Tensor[(2, 3), f32], %v: Tensor[(3,), f32], %c: Tensor[(3,), f32]) -> Tensor[(), f32] {
  let %t = transpose(%x);                                    # (3, 2)
  let %u = transpose(expand_dims(%x, axis=-1), perm=[2, 0, 1]);  # (1, 2, 3)
  let %q = squeeze(slice(%t, axes=[-1], begins=[1], ends=[2]));   # (3,)
  let %p = pad(%x, before=[1, 0], after=[0, 2]);             # (3, 5)
  let %st = stack(%v, %c, %q, axis=-1);                      # (3, 3), %c shared
  let %wide = broadcast_to(%v, shape=[2, 2, 3]);             # across two new leading axes
  let %back = sum_to(mul(%wide, %wide), shape=[1, 3]);        # the leading axis summed, one kept unit
  add(add(add(sum(mul(%u, %u)), sum(%p)), add(sum(mul(%st, %st)), sum(squeeze(%u, axes=[0])))),
      sum(mul(%back, sum_to(%x, shape=[3]))))
}
def @f(%x1: Tensor[(2, 3), f32], %x2: Tensor[(2, 3), f32], %x3: Tensor[(2, 3), f32], %v1: Tensor[(3,), f32],
       %v2: Tensor[(3,), f32], %c: Tensor[(3,), f32]) -> Tensor[(), f32] {
  add(add(@shapes(%x1, %v1, %c), @shapes(%x2, %v2, %c)), @shapes(%x3, %v1, %c))
})");
  Rng rng(5);
  std::vector<Value> args;
  for (Shape shape : {Shape{2, 3}, {2, 3}, {2, 3}, {3}, {3}, {3}}) args.emplace_back(RandomUniform(rng, shape, -1, 1));
  Residual r = PartialEvaluate(*s, "f", args);
  Func batched = CheckBatched(r.main, Flatten(args));
  for (const char* op : {"transpose", "expand_dims", "squeeze", "slice", "pad", "sum_to"}) {
    EXPECT_EQ(Count(batched, op), Count(r.main, op) / 3) << op << "\n" << PrintFunction("batched", batched);
  }
  // The program's stack (the batcher stacks operands along axis 0 too).
  auto stacks_along_inner_axes = [](const Func& f) {
    int n = 0;
    PostOrderVisit(f->body, [&](const Expr& e) {
      if (auto* call = As<OpCallNode>(e); call && call->op->name == "stack" && call->attrs.GetInt("axis") != 0) ++n;
    });
    return n;
  };
  EXPECT_EQ(stacks_along_inner_axes(r.main), 3);
  EXPECT_EQ(stacks_along_inner_axes(batched), 1) << PrintFunction("batched", batched);
  ExpectBatchedGradients(r.main, batched, {0, 1, 2, 3, 4, 5}, Flatten(args));
}

TEST_F(BatchTest, ABatchIsLaidOutInTheOrderItsOperandsRowsLie) {
  // The GEMMs' instances come in the order 3, 1, 2; their operands are the
  // rows of the tanh batch, which lie in the order 1, 2, 3. The GEMM batch
  // takes the order 1, 2, 3 and reads the tanh batch whole: the one copy
  // left is stacking the parameters.
  Snapshot s = Load(R"(
def @act(%x: Tensor[(1, 4), f32]) -> Tensor[(1, 4), f32] { tanh(%x) }
def @gemm(%a: Tensor[(1, 4), f32], %w: Tensor[(3, 4), f32], %b: Tensor[(3,), f32]) -> Tensor[(1, 3), f32] {
  dense(%a, %w, %b)
}
def @f(%x1: Tensor[(1, 4), f32], %x2: Tensor[(1, 4), f32], %x3: Tensor[(1, 4), f32],
       %w: Tensor[(3, 4), f32], %b: Tensor[(3,), f32]) {
  let %a1 = @act(%x1);
  let %a2 = @act(%x2);
  let %a3 = @act(%x3);
  let %h3 = @gemm(%a3, %w, %b);
  let %h1 = @gemm(%a1, %w, %b);
  let %h2 = @gemm(%a2, %w, %b);
  (%h1, %h2, %h3)
})");
  Rng rng(3);
  std::vector<Value> args;
  for (Shape shape : {Shape{1, 4}, {1, 4}, {1, 4}, {3, 4}, {3}}) args.emplace_back(RandomUniform(rng, shape, -1, 1));
  Residual r = PartialEvaluate(*s, "f", args);
  BatchStats stats;
  Func batched = CheckBatched(r.main, Flatten(args), &stats);
  EXPECT_EQ(stats.groups, 2) << stats.ToString();
  EXPECT_EQ(stats.copied_bytes, 3 * 4 * 4) << stats.ToString() << "\n" << PrintFunction("batched", batched);
}

class TreeLstmBatchTest : public BatchTest {
 protected:
  void SetUp() override {
    module_.AddSource(std::string(treelstm::ModelSource()), "treelstm.pj");
    Rng rng(7);
    params_ = treelstm::InitParams(rng, {listops::kVocabularySize, 8, 6, listops::kClasses});
  }

  std::vector<Value> LossArgs(const std::vector<listops::Example>& examples, int* nodes = nullptr) {
    std::vector<const listops::Example*> batch;
    for (const auto& e : examples) batch.push_back(&e);
    treelstm::Batch b = treelstm::MakeBatch(batch, *module_.snapshot());
    if (nodes) *nodes = b.nodes;
    return {b.trees, b.labels, params_};
  }

  // The float leaves of the parameter tuple (the last argument) among the residual's parameters.
  static std::vector<int> ParamLeaves(const std::vector<Value>& args) {
    int first = static_cast<int>(Flatten({args[0], args[1]}).size());
    int count = static_cast<int>(Flatten({args[2]}).size());
    std::vector<int> wrt(count);
    for (int i = 0; i < count; ++i) wrt[i] = first + i;
    return wrt;
  }

  Module module_;
  Value params_;
};

TEST_F(TreeLstmBatchTest, LossAndGradientsOfRandomMinibatchesAreUnchanged) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::vector<Value> args = LossArgs(listops::GenerateSplits(seed, 6, 0, 0).train);
    Residual r = PartialEvaluate(*module_.snapshot(), "loss", args);
    BatchStats stats;
    Func batched = CheckBatched(r.main, Flatten(args), &stats);
    EXPECT_LT(stats.ops_after, stats.ops_before / 2) << stats.ToString();

    // Batching before autodiff (what the engine does) and after it.
    std::vector<int> wrt = ParamLeaves(args);
    ExpectBatchedGradients(r.main, batched, wrt, Flatten(args));
    CheckBatched(Differentiate(r.main, wrt), Flatten(args));
  }
}

TEST_F(TreeLstmBatchTest, TreesOfEqualHeightGiveOneBatchedCellPerLevel) {
  const std::string_view source = treelstm::ModelSource();
  const int cell_gemm = LineOf(source, "matmul(%h_sum");
  const int leaf_gemm = LineOf(source, "let %iou = chunk(dense(%x, %p.w_iou, %p.b_iou)");
  for (int height : {1, 3, 5}) {
    SCOPED_TRACE("height " + std::to_string(height));
    Rng rng(height);
    listops::GeneratorOptions options;
    options.max_depth = height;
    options.nested_probability = 0.5;
    std::vector<listops::Example> trees;
    while (trees.size() < 8) {
      listops::Expr e = listops::Generate(rng, options);
      if (treelstm::Height(e) == height) trees.push_back({e, listops::Evaluate(e)});
    }
    int nodes = 0;
    std::vector<Value> args = LossArgs(trees, &nodes);
    Residual r = PartialEvaluate(*module_.snapshot(), "loss", args);
    Func batched = CheckBatched(r.main, Flatten(args));
    std::map<int, int> gemms = CountByLine(r.main, "matmul");
    std::map<int, int> dense = CountByLine(r.main, "dense");
    EXPECT_GT(gemms[cell_gemm], height);   // one per inner node before
    EXPECT_GT(dense[leaf_gemm], 1);        // one per leaf before
    EXPECT_EQ(CountByLine(batched, "matmul")[cell_gemm], height) << PrintFunction("batched", batched);
    EXPECT_EQ(CountByLine(batched, "dense")[leaf_gemm], 1);
  }
}

}  // namespace
}  // namespace pejit
