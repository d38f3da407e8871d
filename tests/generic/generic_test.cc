// The structure-generic tier computes what the interpreter computes, values
// and gradients, on minibatches whose structures it has never seen: the
// Child-Sum Tree-LSTM, a sequence LSTM over word lists, a binary-tree
// recursive network with a loss at every node (as a plain recursion over the
// minibatch, as a `@fold` with a closure, as a `@map` then a sum, with
// closures handed down the recursion, with branches on tensor values, and
// with a loop the data ends at every node), a character LM over lists of
// words written with nested folds, a typed AST encoder with a cell per
// constructor, a module network, a DAG encoder, adaptive computation time;
// 24 random minibatches each, segments run on baseline code and compiled by
// LLVM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <nlohmann/json.hpp>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "generic/executor.h"
#include "generic/program.h"
#include "interp/interpreter.h"
#include "ir/json.h"
#include "ir/module.h"
#include "ir/printer.h"
#include "ir/program_files.h"
#include "ir/visitor.h"
#include "jit/compiler.h"
#include "jit/image.h"
#include "jit/native_executable.h"
#include "tests/support/thread_pool.h"

namespace pejit::generic {
namespace {

// The arguments of a call of `entry` written as `json` (an array, one
// element per parameter, as `pejit replay` reads them).
std::vector<Value> ArgsFromJson(const ModuleSnapshot& module, const std::string& entry, const nlohmann::json& json) {
  const Definition& def = module.Get(entry);
  std::vector<Value> args;
  for (size_t i = 0; i < def.func->params.size(); ++i) {
    args.push_back(ValueFromJson(json.at(i), def.func->params[i]->annotation,
                                 [&](const std::string& n) { return module.FindType(n); }));
  }
  return args;
}

std::vector<std::vector<Value>> Calls(const ModuleSnapshot& module, const std::string& entry, const std::string& path) {
  std::vector<std::vector<Value>> calls;
  std::istringstream lines(ReadFile(path));
  for (std::string line; std::getline(lines, line);) calls.push_back(ArgsFromJson(module, entry, nlohmann::json::parse(line)));
  return calls;
}

struct Model {
  std::string name, program, calls;
  std::vector<int> wrt;  // the arguments whose types can hold a float tensor
};

class GenericTest : public ::testing::TestWithParam<Model> {};

TEST_P(GenericTest, ValuesAndGradientsMatchTheInterpreterOnUnseenStructures) {
  const Model& model = GetParam();
  Snapshot module = LoadProgram(model.program);
  auto calls = Calls(*module, "loss", model.calls);
  ASSERT_EQ(calls.size(), 24u);
  GenericProgram program(module, "loss");
  Interpreter interpreter;
  std::unique_ptr<JitSession> jit = JitSession::Create();
  for (size_t c = 0; c < calls.size(); ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    const std::vector<Value>& args = calls[c];
    Interpreter::ValueAndGrad want = interpreter.CallWithGrad(*module, "loss", args, model.wrt);
    // Odd calls compile every segment variant they run; even ones use what is there.
    ExecuteOptions options;
    options.grad = true;
    options.compile_now = c % 2 ? jit.get() : nullptr;
    Inspection inspection;
    Execution got = InspectAndExecute(program, args, options, inspection);
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5)) << got.value.ToString() << " vs " << want.value.ToString();
    ValueAndGrad grads = CallResult(args, &model.wrt, got);
    for (size_t w = 0; w < model.wrt.size(); ++w) {
      EXPECT_TRUE(ValueAllClose(grads.grads[w], want.grads[w], 1e-4, 1e-5)) << "gradient of argument " << model.wrt[w];
    }
    if (c % 2) {
      EXPECT_EQ(got.baseline_runs, 0);
    }
    // Value mode on what grad mode compiled: runs whose row count has no
    // native code run in pieces of counts that have.
    Execution value = Execute(inspection, ExecuteOptions{});
    EXPECT_TRUE(ValueAllClose(value.value, want.value, 1e-4, 1e-5)) << "value mode";
  }
  // Code is per segment program and row bucket, not per minibatch.
  EXPECT_LT(program.segment_codes(), 100);
}

// A call's segment instances cut into two lanes (between its examples)
// give the interpreter's answers, and the same bits whether one thread runs
// both lanes or two threads run them side by side.
TEST_P(GenericTest, TwoLanesGiveTheSameBitsOnOneThreadOrTwoAndTheInterpretersAnswers) {
  const Model& model = GetParam();
  Snapshot module = LoadProgram(model.program);
  auto calls = Calls(*module, "loss", model.calls);
  GenericOptions two_lanes;
  two_lanes.lanes = 2;
  two_lanes.min_lane_instances = 0;
  two_lanes.lanes_always = true;
  GenericProgram program(module, "loss", two_lanes);
  Interpreter interpreter;
  std::unique_ptr<JitSession> jit = JitSession::Create();
  testing_support::ThreadPool pool(1);
  int with_lanes = 0;
  for (size_t c = 0; c < calls.size(); c += 3) {
    SCOPED_TRACE("call " + std::to_string(c));
    const std::vector<Value>& args = calls[c];
    ExecuteOptions options;
    options.grad = true;
    options.compile_now = c % 2 ? jit.get() : nullptr;  // native code, or baseline code made as runs come
    Inspection inspection;
    Execution alone = InspectAndExecute(program, args, options, inspection);
    if (inspection.lanes == 2) {
      ++with_lanes;
      // Each lane a contiguous range of the instances, in evaluation order.
      int last_of_lane0 = -1, first_of_lane1 = std::numeric_limits<int>::max();
      for (const generic::Run& run : inspection.runs) {
        for (int si : run.members) {
          if (run.lane == 0) last_of_lane0 = std::max(last_of_lane0, si);
          if (run.lane == 1) first_of_lane1 = std::min(first_of_lane1, si);
        }
      }
      EXPECT_LT(last_of_lane0, first_of_lane1);
      EXPECT_GE(last_of_lane0, 0);
    }
    Execution two;
    {
      Team team(&pool, 2);
      ScopedTeam scoped(&team);
      two = Execute(inspection, options);
    }
    ASSERT_TRUE(pool.WaitAllReturned());
    ASSERT_TRUE(alone.value.is_tensor() && two.value.is_tensor());
    EXPECT_EQ(std::memcmp(alone.value.tensor().raw_data(), two.value.tensor().raw_data(), alone.value.tensor().nbytes()), 0);
    ASSERT_EQ(alone.root_grads.size(), two.root_grads.size());
    for (size_t i = 0; i < alone.root_grads.size(); ++i) {
      SCOPED_TRACE("entry tensor " + std::to_string(i));
      ASSERT_EQ(alone.root_grads[i].defined(), two.root_grads[i].defined());
      if (!alone.root_grads[i].defined()) continue;
      EXPECT_EQ(std::memcmp(alone.root_grads[i].raw_data(), two.root_grads[i].raw_data(), alone.root_grads[i].nbytes()), 0);
    }
    Interpreter::ValueAndGrad want = interpreter.CallWithGrad(*module, "loss", args, model.wrt);
    EXPECT_TRUE(ValueAllClose(two.value, want.value, 1e-4, 1e-5)) << two.value.ToString() << " vs " << want.value.ToString();
    ValueAndGrad grads = CallResult(args, &model.wrt, two);
    for (size_t w = 0; w < model.wrt.size(); ++w) {
      EXPECT_TRUE(ValueAllClose(grads.grads[w], want.grads[w], 1e-4, 1e-5)) << "gradient of argument " << model.wrt[w];
    }
  }
  EXPECT_GT(with_lanes, 0) << "no call was cut into lanes";
}

// Lanes are taken while other processes leave a core for each helper, and
// where the load is not known.
TEST(LanesPay, WhileOtherProcessesLeaveACoreForEachHelper) {
  EXPECT_TRUE(LanesPay(2, 2, 0.0));
  EXPECT_TRUE(LanesPay(2, 2, 0.2));
  EXPECT_FALSE(LanesPay(2, 2, 0.4));  // a process busy on a core of two, yielding part of it
  EXPECT_FALSE(LanesPay(2, 2, 1.0));
  EXPECT_TRUE(LanesPay(2, 4, 2.0));   // two cores of four left
  EXPECT_FALSE(LanesPay(4, 4, 1.0));
  EXPECT_TRUE(LanesPay(2, 2, std::nullopt));
  EXPECT_TRUE(LanesPay(2, 0, 1.0));
}

// A tree encoder called with two weight matrices, and its arguments.
struct TwoEncoders {
  Snapshot module;
  TypeDefPtr tree;

  TwoEncoders() {
    Module m;
    m.AddSource(R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
def @enc(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32]) -> Tensor[(1, ?), f32] {
  match (%t) {
    Leaf(%x) => take(%emb, reshape(%x, shape=[1])),
    Node(%l, %r) => tanh(matmul(add(@enc(%l, %emb, %w), @enc(%r, %emb, %w)), %w)),
  }
}
def @loss(%a: Tree, %b: Tree, %emb: Tensor[(?, ?), f32], %w1: Tensor[(?, ?), f32], %w2: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  sum(mul(@enc(%a, %emb, %w1), @enc(%b, %emb, %w2)))
}
)", "two.pj");
    module = m.snapshot();
    tree = module->FindType("Tree");
  }
  Value Leaf(int64_t i) const { return Value::Adt(tree, 0, {Value(Tensor::FromVector<int64_t>({}, {i}))}); }
  Value Node(Value l, Value r) const { return Value::Adt(tree, 1, {std::move(l), std::move(r)}); }
  static Value Matrix(int64_t rows, int64_t cols, float scale) {
    std::vector<float> v(rows * cols);
    for (size_t i = 0; i < v.size(); ++i) v[i] = scale * static_cast<float>(static_cast<int>(i * 37 % 11) - 5) / 10.0f;
    return Value(Tensor::FromVector<float>({rows, cols}, v));
  }
  // The loss and its gradients wrt the two weights, by the interpreter and by `program`.
  void ExpectAgrees(GenericProgram& program, const std::vector<Value>& args, Inspection inspection) const {
    Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", args, {3, 4});
    ExecuteOptions options;
    options.grad = true;
    Execution got = Execute(inspection, options);
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5)) << got.value.ToString() << " vs " << want.value.ToString();
    const std::vector<int> wrt{3, 4};
    ValueAndGrad grads = CallResult(args, &wrt, got);
    EXPECT_TRUE(ValueAllClose(grads.grads[0], want.grads[0], 1e-4, 1e-5));
    EXPECT_TRUE(ValueAllClose(grads.grads[1], want.grads[1], 1e-4, 1e-5));
  }
};

// Two cells alike but for their weights (one recursion called with two
// parameter matrices) run the same segment programs at the same levels; each
// instance still computes with its own weight.
TEST(GenericTier, CellsAlikeButForTheirWeightsKeepTheirOwnWeights) {
  TwoEncoders t;
  // The same shape on both sides, so that both recursions meet at every level.
  std::vector<Value> args = {t.Node(t.Node(t.Leaf(0), t.Leaf(1)), t.Leaf(2)), t.Node(t.Node(t.Leaf(3), t.Leaf(1)), t.Leaf(0)),
                             t.Matrix(4, 3, 1.0f), t.Matrix(3, 3, 1.0f), t.Matrix(3, 3, -0.7f)};
  GenericProgram program(t.module, "loss");
  t.ExpectAgrees(program, args, program.Inspect(args));
}

// A prefetch walks a minibatch once: its call takes the inspection, computing
// with the call's own parameters (an optimizer step came in between), and a
// second call of the same minibatch, or another minibatch, walks anew.
TEST(GenericTier, ACallTakesTheScheduleItsPrefetchWalkedWithItsOwnParameters) {
  TwoEncoders t;
  Value a = t.Node(t.Node(t.Leaf(0), t.Leaf(1)), t.Leaf(2)), b = t.Node(t.Leaf(3), t.Node(t.Leaf(1), t.Leaf(0)));
  GenericProgram program(t.module, "loss");
  Ahead ahead = program.InspectAhead({a, b, t.Matrix(4, 3, 1.0f), t.Matrix(3, 3, 1.0f), t.Matrix(3, 3, -0.7f)});
  EXPECT_FALSE(ahead.variants.empty());
  EXPECT_GT(ahead.new_cells, 0);

  std::vector<Value> stepped = {a, b, t.Matrix(4, 3, 0.5f), t.Matrix(3, 3, 2.0f), t.Matrix(3, 3, 0.3f)};
  Inspection taken = program.Inspect(stepped);
  EXPECT_TRUE(taken.kept);
  EXPECT_EQ(taken.new_cells, 0);
  t.ExpectAgrees(program, stepped, std::move(taken));

  Inspection again = program.Inspect(stepped);
  EXPECT_FALSE(again.kept);
  t.ExpectAgrees(program, stepped, std::move(again));

  // Another structure, even one equal to the prefetched one, is not taken for it.
  program.InspectAhead({a, b, t.Matrix(4, 3, 1.0f), t.Matrix(3, 3, 1.0f), t.Matrix(3, 3, -0.7f)});
  std::vector<Value> other = {t.Node(t.Node(t.Leaf(0), t.Leaf(1)), t.Leaf(2)), b, t.Matrix(4, 3, 1.0f),
                              t.Matrix(3, 3, 1.0f), t.Matrix(3, 3, -0.7f)};
  Inspection fresh = program.Inspect(other);
  EXPECT_FALSE(fresh.kept);
  t.ExpectAgrees(program, other, std::move(fresh));
}

// The Child-Sum Tree-LSTM's generic program with native grad-mode code for
// the row counts of its first minibatch only, and the other minibatches.
struct TrainedOnOneMinibatch {
  Snapshot module = LoadProgram("examples/treelstm/treelstm.pj");
  std::vector<std::vector<Value>> calls = Calls(*module, "loss", "tests/generic/treelstm_calls.jsonl");
  GenericProgram program{module, "loss"};
  std::unique_ptr<JitSession> jit = JitSession::Create();

  TrainedOnOneMinibatch() {
    ExecuteOptions train;
    train.grad = true;
    train.compile_now = jit.get();
    Execute(program.Inspect(calls[0]), train);
  }
};

// Inference on row counts training never compiled: each run takes native
// code of other row counts (training's forwards, padded or in pieces) or
// baseline code, with the interpreter's values, and asks for its own variants.
TEST(GenericTier, ValueModeRunsRowCountsWithoutCodeOfTheirOwnOnOtherCounts) {
  TrainedOnOneMinibatch trained;
  const Snapshot& module = trained.module;
  const auto& calls = trained.calls;
  GenericProgram& program = trained.program;
  Interpreter interpreter;
  int native = 0;
  for (size_t c = 1; c < calls.size(); ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    Execution got = Execute(program.Inspect(calls[c]), ExecuteOptions{});
    EXPECT_TRUE(ValueAllClose(got.value, interpreter.Call(*module, "loss", calls[c]), 1e-4, 1e-5));
    native += got.native_runs;
    for (const SegmentCode::Variant* v : got.missing_native) EXPECT_FALSE(v->grad) << "value mode asks for its own variants";
  }
  EXPECT_GT(native, 0);
}

// A grad-mode run whose row bucket has no code yet takes the code of a
// larger bucket, its rows padded, instead of making its own on the caller's
// thread; its own variant is left for a worker (missing_native). Values and
// gradients are the interpreter's either way.
TEST(GenericTier, GradModeRunsARowCountWithoutCodeOfItsOwnOnALargerBucket) {
  TrainedOnOneMinibatch trained;
  const Snapshot& module = trained.module;
  const auto& calls = trained.calls;
  GenericProgram& program = trained.program;
  Interpreter interpreter;
  const std::vector<int> wrt{2};
  int stood_in = 0;
  for (size_t c = 1; c < calls.size(); ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    Interpreter::ValueAndGrad want = interpreter.CallWithGrad(*module, "loss", calls[c], wrt);
    ExecuteOptions options;
    options.grad = true;
    Execution got = Execute(program.Inspect(calls[c]), options);
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5));
    EXPECT_TRUE(ValueAllClose(CallResult(calls[c], &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
    for (size_t m = 0; m < got.missing_native.size(); ++m) {
      std::lock_guard lock(got.missing_codes[m]->mu);
      if (!got.missing_native[m]->made) ++stood_in;  // it ran, on another variant's code
    }
  }
  EXPECT_GT(stood_in, 0);
}

// One minibatch `times` times over: @loss(trees, labels, params) with the
// trees and labels repeated, every level `times` as many rows.
std::vector<Value> Repeated(const ModuleSnapshot& module, const std::vector<Value>& call, int times) {
  TypeDefPtr list = module.FindType("List");
  std::vector<Value> trees;
  for (Value v = call[0]; v.kind() == Value::Kind::kAdt && v.fields().size() == 2; v = v.fields()[1]) {
    trees.push_back(v.fields()[0]);
  }
  const Tensor& labels = call[1].tensor();
  std::vector<int64_t> all;
  for (int k = 0; k < times; ++k) all.insert(all.end(), labels.data<int64_t>(), labels.data<int64_t>() + labels.numel());
  Value out = Value::Adt(list, 0, {});
  for (int k = 0; k < times; ++k) {
    for (size_t i = trees.size(); i-- > 0;) out = Value::Adt(list, 1, {trees[i], out});
  }
  return {out, Value(Tensor::FromVector<int64_t>({static_cast<int64_t>(all.size())}, all)), call[2]};
}

// A grad-mode run with more rows than any compiled bucket serves, padded
// (the minibatch trained on, four times over), runs in pieces of the
// compiled buckets' native code, forward and backward, not on baseline
// code; its own variant is left for a worker. Values and gradients are the
// interpreter's.
TEST(GenericTier, GradModeRunsARowCountPastEveryCompiledBucketInNativePieces) {
  TrainedOnOneMinibatch trained;
  const std::vector<Value> args = Repeated(*trained.module, trained.calls[0], 4);
  const std::vector<int> wrt{2};
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*trained.module, "loss", args, wrt);
  ExecuteOptions options;
  options.grad = true;
  Execution got = Execute(trained.program.Inspect(args), options);
  EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5));
  EXPECT_TRUE(ValueAllClose(CallResult(args, &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
  // Runs on baseline code only where their segment has no native code of
  // any row count at their padding (a segment the trained minibatch never
  // ran, or a length it never had: the minibatch's roots, four times as
  // many); runs past every compiled bucket's padding ran in pieces.
  int in_pieces = 0;
  for (size_t m = 0; m < got.missing_native.size(); ++m) {
    SegmentCode& code = *got.missing_codes[m];
    const SegmentCode::Variant& own = *got.missing_native[m];
    std::lock_guard lock(code.mu);
    int64_t largest_native = 0;
    for (const auto& [key, v] : code.variants) {
      if (v->native.load() && key.first == PadKey(own.pads)) largest_native = std::max(largest_native, v->rows);
    }
    if (own.made) {
      EXPECT_EQ(largest_native, 0) << "segment " << code.id << ": baseline code beside native code";
    } else if (largest_native > 0 && own.rows > 2 * largest_native + 8) {
      ++in_pieces;
    }
  }
  EXPECT_GT(in_pieces, 0);
  EXPECT_GT(got.native_runs, 0);
  EXPECT_FALSE(got.missing_native.empty()) << "the runs' own buckets are asked for";
}

// One minibatch of every tree of `path`'s calls, `times` over: their tree
// lists joined (a list's Nil replaced by the next), their labels
// concatenated, the first call's parameters.
std::vector<Value> JoinedCall(const ModuleSnapshot& module, const std::string& path, int times) {
  std::istringstream lines(ReadFile(path));
  std::vector<nlohmann::json> calls;
  for (std::string line; std::getline(lines, line);) calls.push_back(nlohmann::json::parse(line));
  std::vector<nlohmann::json> lists;  // every call's trees, `times` over, in order
  nlohmann::json labels = calls[0][1];
  labels["data"] = nlohmann::json::array();
  for (int t = 0; t < times; ++t) {
    for (const nlohmann::json& c : calls) {
      lists.push_back(c[0]);
      for (const auto& y : c[1]["data"]) labels["data"].push_back(y);
    }
  }
  labels["shape"] = {labels["data"].size()};
  nlohmann::json trees = {{"ctor", "Nil"}, {"fields", nlohmann::json::array()}};
  for (auto list = lists.rbegin(); list != lists.rend(); ++list) {  // each list's Nil: the lists after it
    nlohmann::json* end = &*list;
    while ((*end)["ctor"] == "Cons") end = &(*end)["fields"][1];
    *end = std::move(trees);
    trees = std::move(*list);
  }
  return ArgsFromJson(module, "loss", nlohmann::json::array({trees, labels, calls[0][2]}));
}

// A weight's gradient is one product over every run's rows, in parts of a
// fixed number of rows that a call's team shares out: two threads give the
// bits one gives, and the interpreter's gradients. A minibatch of 288 trees
// has thousands of rows: several parts.
TEST(GenericTier, WeightGradientProductsGiveTheSameBitsOnOneThreadOrTwo) {
  Snapshot module = LoadProgram("examples/treelstm/treelstm.pj");
  const std::vector<Value> args = JoinedCall(*module, "tests/generic/treelstm_calls.jsonl", 3);
  GenericProgram program(module, "loss");
  std::unique_ptr<JitSession> jit = JitSession::Create();
  ExecuteOptions options;
  options.grad = true;
  options.compile_now = jit.get();
  Inspection inspection = program.Inspect(args);
  Execution alone = Execute(inspection, options);
  testing_support::ThreadPool pool(1);
  Execution two;
  {
    Team team(&pool, 2);
    ScopedTeam scoped(&team);
    two = Execute(inspection, options);
  }
  ASSERT_TRUE(pool.WaitAllReturned());
  ASSERT_EQ(alone.root_grads.size(), two.root_grads.size());
  for (size_t i = 0; i < alone.root_grads.size(); ++i) {
    SCOPED_TRACE("entry tensor " + std::to_string(i));
    ASSERT_EQ(alone.root_grads[i].defined(), two.root_grads[i].defined());
    if (!alone.root_grads[i].defined()) continue;
    ASSERT_EQ(alone.root_grads[i].nbytes(), two.root_grads[i].nbytes());
    EXPECT_EQ(std::memcmp(alone.root_grads[i].raw_data(), two.root_grads[i].raw_data(), alone.root_grads[i].nbytes()), 0);
  }
  const std::vector<int> wrt{2};
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", args, wrt);
  EXPECT_TRUE(ValueAllClose(two.value, want.value, 1e-4, 1e-5));
  EXPECT_TRUE(ValueAllClose(CallResult(args, &wrt, two).grads[0], want.grads[0], 1e-4, 1e-5));
}

// A variant's first native code is the quick code generator's; the
// optimizing one's replaces it (a later compile), and a quick compile of a
// variant with optimized code leaves it. Every step gives the interpreter's
// values and gradients.
TEST(GenericTier, QuickNativeCodeIsReplacedByOptimizedCode) {
  Snapshot module = LoadProgram("examples/treelstm/treelstm.pj");
  std::vector<std::vector<Value>> calls = Calls(*module, "loss", "tests/generic/treelstm_calls.jsonl");
  GenericProgram program(module, "loss");
  std::unique_ptr<JitSession> jit = JitSession::Create();
  const std::vector<int> wrt{2};
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", calls[0], wrt);
  ExecuteOptions options;
  options.grad = true;
  auto expect_the_interpreters = [&](Execution& got) {
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5));
    EXPECT_TRUE(ValueAllClose(CallResult(calls[0], &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
  };
  Inspection inspection = program.Inspect(calls[0]);
  Execution first = Execute(inspection, options);  // baseline code; each run's variant made
  expect_the_interpreters(first);
  ASSERT_FALSE(first.missing_native.empty());
  for (size_t m = 0; m < first.missing_native.size(); ++m) {
    SegmentCode& code = *first.missing_codes[m];
    SegmentCode::Variant& v = *first.missing_native[m];
    CompileVariant(*jit, code, v, {}, CodeGen::kQuick);
    std::lock_guard lock(code.mu);
    EXPECT_TRUE(v.native.load());
    EXPECT_FALSE(v.optimized);
  }
  Execution quick = Execute(inspection, options);
  expect_the_interpreters(quick);
  EXPECT_EQ(quick.baseline_runs, 0);
  std::vector<const ExecutablePtr::element_type*> quick_code;
  for (size_t m = 0; m < first.missing_native.size(); ++m) {
    SegmentCode& code = *first.missing_codes[m];
    SegmentCode::Variant& v = *first.missing_native[m];
    quick_code.push_back(v.forward_code->current().get());
    CompileVariant(*jit, code, v, {}, CodeGen::kOptimized);
    const auto* optimized = v.forward_code->current().get();
    EXPECT_NE(optimized, quick_code.back()) << "replaced";
    CompileVariant(*jit, code, v, {}, CodeGen::kQuick);  // nothing to do
    std::lock_guard lock(code.mu);
    EXPECT_EQ(v.forward_code->current().get(), optimized);
    EXPECT_TRUE(v.optimized);
  }
  Execution optimized = Execute(inspection, options);
  expect_the_interpreters(optimized);
  EXPECT_EQ(optimized.baseline_runs, 0);
}

// A store kept in memory, as the engine's persistent cache keeps images
// on disk: which keys were kept, with which code generator.
class ImageStore final : public CodeStore {
 public:
  explicit ImageStore(JitSession& session) : session_(session) {}
  ExecutablePtr Load(const std::string& key, const CompileOptions&) override {
    auto it = images.find(key);
    return it == images.end() ? nullptr : session_.Load(it->second);
  }
  void Keep(const std::string& key, const Executable& exec, const CompileOptions& options) override {
    images[key] = EncodeImage(dynamic_cast<const NativeExecutable&>(exec));
    kept_quick += !options.optimize_machine_code;
  }
  std::map<std::string, std::string> images;
  int kept_quick = 0;

 private:
  JitSession& session_;
};

// A warm store serves a variant's first compile with the optimized code an
// earlier run kept, whichever code generator the compile asks for (no quick
// code to replace later); quick code is never kept, only optimized code.
TEST(GenericTier, AStoresOptimizedCodeServesAQuickCompileAndQuickCodeIsNotKept) {
  Snapshot module = LoadProgram("examples/treelstm/treelstm.pj");
  std::vector<std::vector<Value>> calls = Calls(*module, "loss", "tests/generic/treelstm_calls.jsonl");
  std::unique_ptr<JitSession> jit = JitSession::Create();
  auto store = std::make_shared<ImageStore>(*jit);
  CompileOptions with_store;
  with_store.store = store;
  const std::vector<int> wrt{2};
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", calls[0], wrt);
  ExecuteOptions options;
  options.grad = true;
  // Each run in a fresh program (fresh variants), the same segments' text.
  auto run = [&](CodeGen codegen, CodeGen expected) {
    GenericProgram program(module, "loss");
    Inspection inspection = program.Inspect(calls[0]);
    Execution first = Execute(inspection, options);
    EXPECT_FALSE(first.missing_native.empty());
    for (size_t m = 0; m < first.missing_native.size(); ++m) {
      EXPECT_EQ(CompileVariant(*jit, *first.missing_codes[m], *first.missing_native[m], with_store, codegen), expected);
    }
    Execution got = Execute(inspection, options);
    EXPECT_EQ(got.baseline_runs, 0);
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5));
    EXPECT_TRUE(ValueAllClose(CallResult(calls[0], &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
  };
  run(CodeGen::kQuick, CodeGen::kQuick);  // a cold store: quick code, not kept
  EXPECT_TRUE(store->images.empty());
  run(CodeGen::kOptimized, CodeGen::kOptimized);  // kept
  const size_t kept = store->images.size();
  EXPECT_GT(kept, 0u);
  run(CodeGen::kQuick, CodeGen::kOptimized);  // warm: the kept optimized code
  EXPECT_EQ(store->images.size(), kept);
  EXPECT_EQ(store->kept_quick, 0);
}

// Per run of two or more instances: the operator calls of its grad-mode
// forward program, by name (each once where the run is batched).
std::vector<std::pair<Func, std::map<std::string, int>>> OpsOfBatchedRuns(const Inspection& inspection) {
  std::vector<std::pair<Func, std::map<std::string, int>>> out;
  for (const generic::Run& run : inspection.runs) {
    if (run.members.size() < 2) continue;
    const SegmentCode::Variant& v = VariantFor(*run.code, run.rows, true);
    std::map<std::string, int> ops;
    PostOrderVisit(v.forward->body, [&](const Expr& e) {
      if (auto* call = As<OpCallNode>(e)) ++ops[call->op->name];
    });
    out.emplace_back(v.forward, std::move(ops));
  }
  return out;
}

// The inspection run in grad mode gives the interpreter's value of "loss"
// and its gradients with respect to arguments `wrt`.
void ExpectTheInterpretersGradients(const Snapshot& module, const std::vector<Value>& args,
                                    const std::vector<int>& wrt, const Inspection& inspection) {
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", args, wrt);
  ExecuteOptions options;
  options.grad = true;
  Execution got = Execute(inspection, options);
  EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5)) << got.value.ToString() << " vs " << want.value.ToString();
  ValueAndGrad grads = CallResult(args, &wrt, got);
  for (size_t a = 0; a < wrt.size(); ++a) {
    EXPECT_TRUE(ValueAllClose(grads.grads[a], want.grads[a], 1e-4, 1e-5)) << "argument " << wrt[a];
  }
}

// A layer norm over a node's features stacks across the nodes of a run
// (one layer_norm in the vectorized program, gamma and beta shared), with
// the interpreter's values and gradients for every parameter.
TEST(GenericTier, LayerNormRunsBatchedWithTheInterpretersGradients) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
def @enc(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32], %g: Tensor[(?,), f32],
         %b: Tensor[(?,), f32]) -> Tensor[(1, ?), f32] {
  match (%t) {
    Leaf(%x) => take(%emb, reshape(%x, shape=[1])),
    Node(%l, %r) => tanh(layer_norm(matmul(add(@enc(%l, %emb, %w, %g, %b), @enc(%r, %emb, %w, %g, %b)), %w),
                                    %g, %b, eps=0.001)),
  }
}
def @loss(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32], %g: Tensor[(?,), f32],
          %b: Tensor[(?,), f32]) -> Tensor[(), f32] {
  sum(mul(@enc(%t, %emb, %w, %g, %b), @enc(%t, %emb, %w, %g, %b)))
}
)", "ln.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr tree = module->FindType("Tree");
  auto leaf = [&](int64_t i) { return Value::Adt(tree, 0, {Value(Tensor::FromVector<int64_t>({}, {i}))}); };
  auto node = [&](Value l, Value r) { return Value::Adt(tree, 1, {std::move(l), std::move(r)}); };
  Value t = node(node(node(leaf(0), leaf(1)), node(leaf(2), leaf(3))), node(node(leaf(1), leaf(0)), node(leaf(3), leaf(2))));
  std::vector<Value> args = {t, TwoEncoders::Matrix(4, 3, 1.0f), TwoEncoders::Matrix(3, 3, 0.8f),
                             Value(Tensor::FromVector<float>({3}, {1.0f, 0.5f, -0.7f})),
                             Value(Tensor::FromVector<float>({3}, {0.1f, -0.2f, 0.3f}))};
  GenericProgram program(module, "loss");
  Inspection inspection = program.Inspect(args);
  int batched = 0;
  for (auto& [forward, ops] : OpsOfBatchedRuns(inspection)) {
    if (ops["layer_norm"] > 0) {
      EXPECT_EQ(ops["layer_norm"], 1) << PrintFunction("forward", forward);
      ++batched;
    }
  }
  EXPECT_GT(batched, 0);
  ExpectTheInterpretersGradients(module, args, {1, 2, 3, 4}, inspection);
}

// A loss at every node and shape operators (transpose, slice, squeeze,
// expand_dims, pad, stack) run once per batched run, not once per row, with
// the interpreter's values and gradients.
TEST(GenericTier, LossesAndShapeOperatorsRunBatchedWithTheInterpretersGradients) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(), i64], Tensor[(), i64]), Node(Tree, Tree, Tensor[(), i64]) }
def @node(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32], %out: Tensor[(?, ?), f32])
    -> (Tensor[(1, ?), f32], Tensor[(), f32]) {
  match (%t) {
    Leaf(%x, %y) => {
      let %h = take(%emb, reshape(%x, shape=[1]));
      (%h, cross_entropy(matmul(%h, %out), reshape(%y, shape=[1])))
    },
    Node(%l, %r, %y) => {
      let %a = @node(%l, %emb, %w, %out);
      let %b = @node(%r, %emb, %w, %out);
      let %pair = transpose(squeeze(stack(%a.0, %b.0, axis=-1), axes=[0]));    # (2, H)
      let %first = slice(%pair, axes=[0], begins=[0], ends=[1]);              # (1, H)
      let %wide = pad(expand_dims(squeeze(%first), axis=0), before=[0, 1], after=[0, 0]);  # (1, H + 1)
      let %h = tanh(matmul(add(slice(%wide, axes=[-1], begins=[1], ends=[4]), %b.0), %w));
      (%h, add(add(%a.1, %b.1), nll(log_softmax(matmul(%h, %out), axis=1), reshape(%y, shape=[1]))))
    },
  }
}
def @loss(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32], %out: Tensor[(?, ?), f32])
    -> Tensor[(), f32] {
  @node(%t, %emb, %w, %out).1
}
)", "shapes.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr tree = module->FindType("Tree");
  auto i64 = [](int64_t i) { return Value(Tensor::FromVector<int64_t>({}, {i})); };
  auto leaf = [&](int64_t i) { return Value::Adt(tree, 0, {i64(i), i64((i + 1) % 2)}); };
  auto node = [&](Value l, Value r, int64_t y) { return Value::Adt(tree, 1, {std::move(l), std::move(r), i64(y)}); };
  Value t = node(node(node(leaf(0), leaf(1), 0), node(leaf(2), leaf(3), 1), 1),
                 node(node(leaf(1), leaf(0), 1), node(leaf(3), leaf(2), 0), 0), 1);
  std::vector<Value> args = {t, TwoEncoders::Matrix(4, 3, 1.0f), TwoEncoders::Matrix(3, 3, 0.8f),
                             TwoEncoders::Matrix(3, 2, 0.6f)};
  GenericProgram program(module, "loss");
  Inspection inspection = program.Inspect(args);
  const auto batched = OpsOfBatchedRuns(inspection);
  EXPECT_FALSE(batched.empty());
  for (auto [forward, ops] : batched) {
    for (const char* op : {"cross_entropy", "nll", "transpose", "squeeze", "expand_dims", "pad"}) {
      EXPECT_LE(ops[op], 2) << op << "\n" << PrintFunction("forward", forward);  // squeeze: twice per instance
    }
    EXPECT_LE(ops["take"], 1) << PrintFunction("forward", forward);  // not per row
  }
  ExpectTheInterpretersGradients(module, args, {1, 2, 3}, inspection);
}

// A recursion that builds a matrix of its leaves' rows (concatenations
// returned from cell to cell) and a segment that only cuts and joins rows
// before a call run no code: they are places (generic/moves.h) whose bytes
// runs read and whose cotangents go back to where the bytes came from,
// whole rows or parts of rows, with the interpreter's values and gradients.
TEST(GenericTier, SegmentsThatOnlyMoveBytesArePlacesWithTheInterpretersAnswers) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
def @rows(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] {
  match (%t) {
    Leaf(%x) => tanh(matmul(take(%emb, reshape(%x, shape=[1])), %w)),
    Node(%l, %r) => concat(@rows(%l, %emb, %w), @rows(%r, %emb, %w), axis=0),
  }
}
def @head(%t: Tree, %m: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  match (%t) {
    _ => sum(tanh(matmul(%m, %v))),
  }
}
def @square(%t: Tree, %w: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] {
  match (%t) {
    _ => tanh(mul(%w, %w)),
  }
}
def @loss(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32], %v: Tensor[(?, ?), f32],
          %u: Tensor[(?, ?), f32]) -> Tensor[(), f32] {
  match (%t) {
    Leaf(%x) => sum(@rows(%t, %emb, %w)),
    Node(%l, %r) => {
      let %all = @rows(%t, %emb, %w);
      # rows 1 and 2 of each side's matrix side by side, and the last two
      # columns of a run's matrix: blocks that are parts of moved places and of rows
      let %cut = slice(concat(@rows(%l, %emb, %w), @rows(%r, %emb, %w), axis=1), axes=[0], begins=[1], ends=[3]);
      let %cols = slice(@square(%t, %w), axes=[1], begins=[1], ends=[3]);
      add(add(@head(%t, %cut, %v), @head(%t, %cols, %u)), sum(mul(%all, %all)))
    },
  }
}
def @matrix(%t: Tree, %emb: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] {
  @rows(%t, %emb, %w)
}
)", "moves.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr tree = module->FindType("Tree");
  auto leaf = [&](int64_t i) { return Value::Adt(tree, 0, {Value(Tensor::FromVector<int64_t>({}, {i}))}); };
  auto node = [&](Value l, Value r) { return Value::Adt(tree, 1, {std::move(l), std::move(r)}); };
  Value t = node(node(node(leaf(0), leaf(1)), node(leaf(2), leaf(3))), node(node(leaf(1), node(leaf(0), leaf(2))), leaf(3)));
  std::vector<Value> args = {t, TwoEncoders::Matrix(4, 3, 1.0f), TwoEncoders::Matrix(3, 3, 0.8f),
                             TwoEncoders::Matrix(6, 2, 0.6f), TwoEncoders::Matrix(2, 2, 0.7f)};
  GenericProgram program(module, "loss");
  Inspection inspection = program.Inspect(args);
  EXPECT_GE(inspection.moved.size(), 7u);  // a concatenation per inner node, and the cuts
  for (const generic::Run& run : inspection.runs) {
    std::set<std::string> ops;
    PostOrderVisit(run.code->program->body, [&](const Expr& e) {
      if (auto* call = As<OpCallNode>(e)) ops.insert(call->op->name);
    });
    EXPECT_FALSE(ops.empty() || std::all_of(ops.begin(), ops.end(), [](const std::string& op) {
      return op == "concat" || op == "slice" || op == "reshape";
    })) << PrintFunction("segment", run.code->program);
  }
  ExpectTheInterpretersGradients(module, args, {1, 2, 3, 4}, inspection);
  // A result that is a moved place: its rows gathered into the value.
  GenericProgram matrix(module, "matrix");
  std::vector<Value> margs(args.begin(), args.begin() + 3);
  Inspection mi;
  Execution got = InspectAndExecute(matrix, margs, ExecuteOptions{}, mi);
  Value want = Interpreter().Call(*module, "matrix", margs);
  EXPECT_TRUE(ValueAllClose(got.value, want, 1e-5, 1e-6)) << got.value.ToString() << " vs " << want.ToString();
  EXPECT_EQ(got.native_runs + got.baseline_runs, 1);  // the leaves; the concatenations ran nothing
}

// Calls f(si) for each segment instance whose row `place` reads, through
// moved places (generic/moves.h) too.
template <typename F>
void ForEachRowRead(const Inspection& s, const Place& place, F&& f) {
  if (place.kind == Place::Kind::kRow) f(place.index);
  if (place.kind != Place::Kind::kMoved) return;
  for (const MovedPlace::Block& b : s.moved[place.index].blocks) ForEachRowRead(s, b.source, f);
  for (const Place& term : s.moved[place.index].sum) ForEachRowRead(s, term, f);
}

// For each segment program, the longest chain of its instances in which
// each depends (through any others) on the one before: no inspection can run
// the program fewer times.
std::map<const SegmentCode*, int> FewestRuns(const Inspection& s) {
  const size_t n = s.si_run.size();
  std::map<const SegmentCode*, int> fewest;
  for (const Run& run : s.runs) fewest[run.code] = 0;
  for (auto& [code, best] : fewest) {
    std::vector<int> chain(n, 0);  // segment instances are numbered in evaluation order
    for (size_t i = 0; i < n; ++i) {
      int longest = 0;
      for (int k = s.si_input_begin[i]; k < s.si_input_begin[i + 1]; ++k) {
        ForEachRowRead(s, s.si_inputs[k], [&](int before) { longest = std::max(longest, chain[before]); });
      }
      chain[i] = longest + (s.runs[s.si_run[i]].code == code ? 1 : 0);
      best = std::max(best, chain[i]);
    }
  }
  return fewest;
}

// The Child-Sum Tree-LSTM sums a node's children with a fold over their
// list, so a node's place in the dependency graph depends on how many
// children it and its ancestors have. Nodes of one height still run each
// program with matrix products together: it runs no more often than its
// longest chain of instances requires (here the tree heights), where the
// sums split when both cannot; values and gradients are the interpreter's.
TEST(GenericTier, RunsBatchNodesOfOneHeightWhateverTheirChildCounts) {
  Snapshot module = LoadProgram("examples/treelstm/treelstm.pj");
  TypeDefPtr tree = module->FindType("Tree"), list = module->FindType("List");
  auto token = [](int64_t t) { return Value(Tensor::FromVector<int64_t>({}, {t})); };
  auto leaf = [&](int64_t t) { return Value::Adt(tree, 0, {token(t)}); };
  auto cons_list = [&](std::vector<Value> items) {
    Value out = Value::Adt(list, 0, {});
    for (size_t i = items.size(); i-- > 0;) out = Value::Adt(list, 1, {items[i], out});
    return out;
  };
  auto node = [&](int64_t t, std::vector<Value> children) { return Value::Adt(tree, 1, {token(t), cons_list(children)}); };
  Value trees = cons_list({node(10, {node(11, {leaf(1), leaf(2)}), leaf(3)}),
                           node(12, {leaf(4), node(13, {leaf(5), leaf(6), leaf(7)})}),
                           node(11, {leaf(8), leaf(9), leaf(0), node(10, {leaf(1)})})});
  auto calls = Calls(*module, "loss", "tests/generic/treelstm_calls.jsonl");
  std::vector<Value> args = {trees, Value(Tensor::FromVector<int64_t>({3}, {1, 2, 3})), calls[0][2]};

  GenericProgram program(module, "loss");
  Inspection inspection = program.Inspect(args);
  std::map<const SegmentCode*, int> runs;
  for (const generic::Run& run : inspection.runs) ++runs[run.code];
  int products = 0;
  for (const auto& [code, fewest] : FewestRuns(inspection)) {
    const std::string text = PrintFunction("segment", code->program);
    if (text.find("matmul(") == std::string::npos && text.find("dense(") == std::string::npos) continue;
    EXPECT_EQ(runs[code], fewest) << text;
    ++products;
  }
  EXPECT_EQ(products, 5);  // a leaf's, an inner node's input, its cell, a child's forget gate, the classifier

  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", args, {2});
  ExecuteOptions options;
  options.grad = true;
  Execution got = Execute(inspection, options);
  EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5));
  const std::vector<int> wrt{2};
  EXPECT_TRUE(ValueAllClose(CallResult(args, &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
}

int Height(const Value& tree) {
  int h = 0;
  for (const Value& f : tree.fields()) {
    if (f.kind() == Value::Kind::kAdt) h = std::max(h, Height(f) + 1);
  }
  return h;
}

// How a minibatch loss is written does not change how its trees batch: the
// prelude's `@fold` with a closure, and `@map` followed by a sum of the list
// it built, run every program that multiplies matrices as often as the
// plain recursion over the list does, no more than the longest chain of its
// instances requires: the tallest tree's height, plus one.
TEST(GenericTier, AFoldOrAMapBatchesTheTreesAsThePlainRecursionDoes) {
  Snapshot plain = LoadProgram("tests/tools/testdata/tree_rnn.pj"), fold = LoadProgram("tests/generic/models/tree_rnn_fold.pj"),
           map = LoadProgram("tests/generic/models/tree_rnn_map.pj");
  auto calls = Calls(*fold, "loss", "tests/generic/tree_rnn_calls.jsonl");
  auto plain_calls = Calls(*plain, "loss", "tests/generic/tree_rnn_calls.jsonl");
  auto map_calls = Calls(*map, "loss", "tests/generic/tree_rnn_calls.jsonl");
  GenericProgram plain_program(plain, "loss"), fold_program(fold, "loss"), map_program(map, "loss");
  auto product_runs = [](const Inspection& s) {
    std::map<std::string, int> runs, fewest;
    auto fewest_by_code = FewestRuns(s);
    for (const generic::Run& run : s.runs) {
      const std::string text = PrintFunction("segment", run.code->program);
      if (text.find("dense(") == std::string::npos && text.find("matmul(") == std::string::npos) continue;
      ++runs[text];
      fewest[text] = fewest_by_code[run.code];
    }
    EXPECT_EQ(runs, fewest);
    return runs;
  };
  for (size_t c = 0; c < 6; ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    std::map<std::string, int> want = product_runs(plain_program.Inspect(plain_calls[c]));
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(product_runs(fold_program.Inspect(calls[c])), want);
    EXPECT_EQ(product_runs(map_program.Inspect(map_calls[c])), want);
    int tallest = 0;
    for (const Value* l = &plain_calls[c][0]; l->tag() == 1; l = &l->fields()[1]) tallest = std::max(tallest, Height(l->fields()[0]));
    for (const auto& [text, runs] : want) EXPECT_LE(runs, tallest + 1) << text;
  }
}

// Structures the program builds are walked as those it is given: a list
// built by an accumulator passed down a recursion, a nested pattern that
// looks through a structure built in one cell into one built in another, a
// subtree of an argument returned by a cell, a match on a constructor built
// in the same cell. Values and gradients are the interpreter's; a structure
// the entry returns is refused, naming the entry.
// An `if` on a tensor value runs each branch for the instances that take
// it, as one batched call: here rows whose products are positive take a
// sqrt, the others pass through. No row evaluates the branch it did not
// take: a sqrt of a negative product there would give NaN, and NaN times the
// zero cotangent a select of both branches gives it would poison the
// weight's gradient.
TEST(GenericTier, ABranchRunsOnlyTheInstancesThatTakeIt) {
  Module m;
  m.AddSource(R"(
def @rows(%xs: List[Tensor[(1, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %h = matmul(%x, %w);
      let %y = if (greater(min(%h), 0f32)) { sqrt(%h) } else { mul(%h, 2f32) };
      add(sum(%y), @rows(%rest, %w))
    },
  }
}
)", "rows.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(0.1f, 1.0f);
  Value xs = Value::Adt(list, 0, {});
  const std::vector<bool> positive = {true, false, true, true, false, true, false, true, true, false};
  for (bool p : positive) {
    std::vector<float> row(4);
    for (float& v : row) v = (p ? 1.0f : -1.0f) * unit(rng);
    xs = Value::Adt(list, 1, {Value(Tensor::FromVector<float>({1, 4}, row)), xs});
  }
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng);
  std::vector<Value> args = {xs, Value(Tensor::FromVector<float>({4, 4}, w))};
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "rows", args, {1});
  GenericProgram program(module, "rows");
  std::unique_ptr<JitSession> jit = JitSession::Create();
  for (JitSession* compile : {static_cast<JitSession*>(nullptr), jit.get()}) {  // baseline code, then native
    Inspection inspection = program.Inspect(args);
    ExecuteOptions options;
    options.grad = true;
    options.compile_now = compile;
    Execution got = Execute(inspection, options);
    EXPECT_EQ(got.skipped_rows, 10);  // each row skips the branch it does not take
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-5, 1e-5)) << got.value.ToString() << " vs " << want.value.ToString();
    const std::vector<int> wrt{1};
    ValueAndGrad grads = CallResult(args, &wrt, got);
    EXPECT_TRUE(ValueAllClose(grads.grads[0], want.grads[0], 1e-4, 1e-5))
        << grads.grads[0].ToString() << " vs " << want.grads[0].ToString();
    // The sqrt branch ran once, over the 6 rows that took it.
    int sqrt_rows = -1;
    for (const generic::Run& run : inspection.runs) {
      if (PrintFunction("s", run.code->program).find("sqrt(") != std::string::npos) {
        EXPECT_EQ(sqrt_rows, -1) << "one run of the branch";
        sqrt_rows = static_cast<int>(run.members.size());
      }
    }
    EXPECT_EQ(sqrt_rows, 10);  // placed for every row; 6 of them ran
  }
}

// One call of `program`'s "loss" on `args` (a structure, then a weight)
// through InspectAndExecute in grad mode: its value and the weight's
// gradient are the interpreter's, and so is value mode on the same walk.
// Returns the grad-mode run; `inspection` is its walk.
Execution ExpectTheInterpretersAnswers(GenericProgram& program, const std::vector<Value>& args, Inspection& inspection) {
  Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*program.module(), "loss", args, {1});
  ExecuteOptions options;
  options.grad = true;
  Execution got = InspectAndExecute(program, args, options, inspection);
  EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-5, 1e-5)) << got.value.ToString() << " vs " << want.value.ToString();
  const std::vector<int> wrt{1};
  EXPECT_TRUE(ValueAllClose(CallResult(args, &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
  EXPECT_TRUE(ValueAllClose(Execute(inspection, ExecuteOptions{}).value, want.value, 1e-5, 1e-5)) << "value mode";
  return got;
}

// A loop the data ends (a recursion inside a branch, passing no structure)
// is unrolled by the inspector: the i-th iteration of every example is one
// batched run, and the examples that stopped skip it. Here each element
// says how many steps it takes (1 to 9); past the 4 iterations unrolled at
// first the call runs again, deeper (8, then 16), and later calls start
// there.
TEST(GenericTier, ALoopTheDataEndsRunsEachIterationBatchedAndUnrollsDeeperOnDemand) {
  Module m;
  m.AddSource(R"(
def @steps(%h: Tensor[(1, 4), f32], %k: Tensor[(), i64], %w: Tensor[(4, 4), f32]) -> Tensor[(1, 4), f32] {
  if (greater(%k, 0)) { @steps(tanh(matmul(%h, %w)), sub(%k, 1), %w) } else { %h }
}
def @loss(%xs: List[(Tensor[(1, 4), f32], Tensor[(), i64])], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(@steps(%x.0, %x.1, %w)), @loss(%rest, %w)),
  }
}
)", "steps.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto minibatch = [&](const std::vector<int64_t>& steps) {
    Value xs = Value::Adt(list, 0, {});
    for (int64_t k : steps) {
      std::vector<float> row(4);
      for (float& v : row) v = unit(rng);
      xs = Value::Adt(list, 1, {Value::Tuple({Value(Tensor::FromVector<float>({1, 4}, row)),
                                              Value(Tensor::FromVector<int64_t>({}, {k}))}),
                                xs});
    }
    return xs;
  };
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng);
  const Value weight(Tensor::FromVector<float>({4, 4}, w));
  GenericProgram program(module, "loss");
  for (const auto& [steps, reruns] : std::vector<std::pair<std::vector<int64_t>, int>>{
           {{1, 3, 9, 2}, 2}, {{9, 0, 5, 7}, 0}, {{2, 2, 1, 3}, 0}}) {
    Inspection inspection;
    Execution got = ExpectTheInterpretersAnswers(program, {minibatch(steps), weight}, inspection);
    EXPECT_EQ(got.reruns, reruns);
    // Each iteration's step is one run over the four examples: the first
    // call's and 16 unrolled.
    int step_runs = 0;
    for (const generic::Run& run : inspection.runs) {
      if (PrintFunction("s", run.code->program).find("tanh(") == std::string::npos) continue;
      ++step_runs;
      EXPECT_EQ(run.members.size(), 4u);
    }
    EXPECT_EQ(step_runs, 17);
    EXPECT_GT(got.skipped_rows, 0);
  }
}

// Loops nest: an outer loop whose every step runs an inner loop, each
// unrolled (and deepened) on its own, and a loop whose state is a tuple.
TEST(GenericTier, NestedLoopsOverTupleStatesMatchTheInterpreter) {
  Module m;
  m.AddSource(R"(
def @inner(%h: Tensor[(1, 4), f32], %k: Tensor[(), i64], %w: Tensor[(4, 4), f32]) -> Tensor[(1, 4), f32] {
  if (greater(%k, 0)) { @inner(tanh(matmul(%h, %w)), sub(%k, 1), %w) } else { %h }
}
def @outer(%s: (Tensor[(1, 4), f32], Tensor[(), f32]), %k: Tensor[(), i64], %w: Tensor[(4, 4), f32])
    -> (Tensor[(1, 4), f32], Tensor[(), f32]) {
  if (greater(%k, 0)) {
    let %h = @inner(%s.0, %k, %w);
    @outer((mul(%h, 0.9f32), add(%s.1, sum(%h))), sub(%k, 1), %w)
  } else {
    %s
  }
}
def @loss(%xs: List[(Tensor[(1, 4), f32], Tensor[(), i64])], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %s = @outer((%x.0, 0f32), %x.1, %w);
      add(add(sum(%s.0), %s.1), @loss(%rest, %w))
    },
  }
}
)", "nested.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng);
  const Value weight(Tensor::FromVector<float>({4, 4}, w));
  GenericProgram program(module, "loss");
  for (const std::vector<int64_t>& steps : std::vector<std::vector<int64_t>>{{2, 0, 6}, {7, 1, 3, 5}, {1}}) {
    Value xs = Value::Adt(list, 0, {});
    for (int64_t k : steps) {
      std::vector<float> row(4);
      for (float& v : row) v = unit(rng);
      xs = Value::Adt(list, 1, {Value::Tuple({Value(Tensor::FromVector<float>({1, 4}, row)),
                                              Value(Tensor::FromVector<int64_t>({}, {k}))}),
                                xs});
    }
    Inspection inspection;
    ExpectTheInterpretersAnswers(program, {xs, weight}, inspection);
  }
}

// A loop that does not end is refused once its unrolling would pass half
// the depth the program walks (GenericOptions::max_depth), naming the loop:
// the call takes the other tiers, which report it their way.
TEST(GenericTier, ALoopPastTheDeepestWalkIsRefusedByName) {
  Module m;
  m.AddSource(R"(
def @spin(%h: Tensor[(1, 4), f32]) -> Tensor[(1, 4), f32] {
  if (greater(sum(mul(%h, %h)), -1f32)) { @spin(tanh(%h)) } else { %h }
}
def @loss(%xs: List[Tensor[(1, 4), f32]]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(@spin(%x)), @loss(%rest)),
  }
}
)", "spin.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  Value xs = Value::Adt(list, 1, {Value(Tensor::FromVector<float>({1, 4}, {1, 2, 3, 4})), Value::Adt(list, 0, {})});
  GenericOptions options;
  options.max_depth = 64;
  GenericProgram program(module, "loss", options);
  Inspection inspection;
  try {
    InspectAndExecute(program, {xs}, ExecuteOptions{}, inspection);
    FAIL() << "a loop that does not end was run";
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find("the loop @spin ran past 32 iterations"), std::string::npos) << e.what();
  }
}

// A condition may be data (a flag each node of the tree carries picks its
// cell) or a constant (a leaf's `if (true)`): read from the structure or the
// cell at run time as a computed one is.
TEST(GenericTier, ConditionsThatAreDataOrConstantsChooseAsTheInterpreterDoes) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(1, 4), f32]), Node(Tree, Tree, Tensor[(), bool]) }
def @enc(%t: Tree, %u: Tensor[(8, 4), f32]) -> Tensor[(1, 4), f32] {
  match (%t) {
    Leaf(%x) => if (true) { tanh(%x) } else { %x },
    Node(%l, %r, %flag) => {
      let %x = concat(@enc(%l, %u), @enc(%r, %u), axis=1);
      if (%flag) { tanh(matmul(%x, %u)) } else { sigmoid(matmul(%x, %u)) }
    },
  }
}
def @loss(%ts: List[Tree], %u: Tensor[(8, 4), f32]) -> Tensor[(), f32] {
  match (%ts) {
    Nil => 0f32,
    Cons(%t, %rest) => add(sum(@enc(%t, %u)), @loss(%rest, %u)),
  }
}
)", "flags.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr tree = module->FindType("Tree"), list = module->FindType("List");
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto matrix = [&](int64_t rows, int64_t cols) {
    std::vector<float> v(rows * cols);
    for (float& x : v) x = unit(rng);
    return Value(Tensor::FromVector<float>({rows, cols}, v));
  };
  auto random_tree = [&](auto& self, int depth) -> Value {
    if (depth == 0 || rng() % 3 == 0) return Value::Adt(tree, 0, {matrix(1, 4)});
    return Value::Adt(tree, 1, {self(self, depth - 1), self(self, depth - 1),
                                Value(Tensor::FromVector<bool>({}, {rng() % 2 == 0}))});
  };
  const Value u = matrix(8, 4);
  GenericProgram program(module, "loss");
  for (int call = 0; call < 4; ++call) {
    Value ts = Value::Adt(list, 0, {});
    for (int i = 0; i < 3; ++i) ts = Value::Adt(list, 1, {random_tree(random_tree, 4), ts});
    Inspection inspection;
    ExpectTheInterpretersAnswers(program, {ts, u}, inspection);
  }
}

TEST(GenericTier, WalksStructuresTheProgramBuilds) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(1, 4), f32]), Node(Tree, Tree) }
type Rows = List[Tensor[(1, 4), f32]];
def @leaves(%t: Tree, %acc: Rows) -> Rows {
  match (%t) {
    Leaf(%x) => Cons(tanh(%x), %acc),
    Node(%l, %r) => @leaves(%l, @leaves(%r, %acc)),
  }
}
def @pairs(%xs: Rows, %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Cons(%a, Cons(%b, %rest)) => add(sum(mul(matmul(%a, %w), %b)), @pairs(Cons(%b, %rest), %w)),
    _ => 0f32,
  }
}
def @leftmost(%t: Tree) -> Tree {
  match (%t) {
    Leaf(_) => %t,
    Node(%l, _) => @leftmost(%l),
  }
}
def @first(%t: Tree) -> Tensor[(1, 4), f32] {
  match (%t) {
    Leaf(%x) => %x,
    Node(%l, _) => @first(%l),
  }
}
def @loss(%t: Tree, %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  let %ws: List[Tensor[(4, 4), f32]] = Cons(mul(%w, 2f32), Nil);
  let %v = match (%ws) {
    Cons(%x, _) => %x,
    Nil => %w,
  };
  add(@pairs(@leaves(%t, Nil), %v), sum(matmul(@first(@leftmost(%t)), %w)))
}
def @built(%t: Tree) -> Rows {
  @leaves(%t, Nil)
}
def @mixed(%t: Tree, %w: Tensor[(4, 4), f32]) -> (Tensor[(), f32], Rows, Tree) {
  (sum(matmul(@first(%t), %w)), @leaves(%t, Nil), @leftmost(%t))
}
)", "built.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr tree = module->FindType("Tree");
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto row = [&] {
    std::vector<float> x(4);
    for (float& v : x) v = normal(rng);
    return Value(Tensor::FromVector<float>({1, 4}, x));
  };
  auto random_tree = [&](auto& self, int depth) -> Value {
    if (depth == 0 || rng() % 3 == 0) return Value::Adt(tree, 0, {row()});
    return Value::Adt(tree, 1, {self(self, depth - 1), self(self, depth - 1)});
  };
  std::vector<float> w(16);
  for (float& v : w) v = 0.5f * normal(rng);
  Value weights(Tensor::FromVector<float>({4, 4}, w));
  GenericProgram program(module, "loss");
  for (int c = 0; c < 8; ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    std::vector<Value> args = {random_tree(random_tree, 1 + c % 4), weights};
    Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*module, "loss", args, {1});
    ExecuteOptions options;
    options.grad = true;
    Execution got = Execute(program.Inspect(args), options);
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-5)) << got.value.ToString() << " vs " << want.value.ToString();
    const std::vector<int> wrt{1};
    EXPECT_TRUE(ValueAllClose(CallResult(args, &wrt, got).grads[0], want.grads[0], 1e-4, 1e-5));
  }
  // Entries returning structures: the list the cells built (its rows from
  // the runs), a tuple of a tensor, that list and a subtree of the argument
  // (returned as it is). Value mode gives the interpreter's values; a
  // gradient needs a scalar loss.
  GenericProgram built(module, "built"), mixed(module, "mixed");
  for (int c = 0; c < 6; ++c) {
    SCOPED_TRACE("call " + std::to_string(c));
    const Value t = random_tree(random_tree, 1 + c % 4);
    Execution list = Execute(built.Inspect({t}), ExecuteOptions{});
    EXPECT_TRUE(ValueAllClose(list.value, Interpreter().Call(*module, "built", {t}), 1e-5, 1e-6)) << list.value.ToString();
    EXPECT_GT(list.native_runs + list.baseline_runs, 0);
    Execution all = Execute(mixed.Inspect({t, weights}), ExecuteOptions{});
    EXPECT_TRUE(ValueAllClose(all.value, Interpreter().Call(*module, "mixed", {t, weights}), 1e-5, 1e-6))
        << all.value.ToString();
  }
  ExecuteOptions grad;
  grad.grad = true;
  try {
    Execute(mixed.Inspect({random_tree(random_tree, 2), weights}), grad);
    FAIL() << "differentiated a result that holds structures";
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find("gradients of a result that holds structures"), std::string::npos) << e.what();
  }
}

// A function value the tier cannot resolve when it builds a cell is refused
// with where it is, and the program keeps the other tiers.
TEST(GenericTier, RefusesAFunctionValueInsideAStructureWithItsPlace) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(), f32]), Node(Tree, Tree) }
def @sum(%t: Tree) -> Tensor[(), f32] {
  match (%t) {
    Leaf(%x) => %x,
    Node(%l, %r) => add(@sum(%l), @sum(%r)),
  }
}
def @loss(%t: Tree, %w: Tensor[(), f32]) -> Tensor[(), f32] {
  let %f = fn (%x: Tensor[(), f32]) -> Tensor[(), f32] { mul(%x, %w) };
  let %pair = (%f, @sum(%t));
  %pair.0(%pair.1)
}
def @returns(%t: Tree, %w: Tensor[(), f32]) -> Tensor[(), f32] {
  let %g = @make(%t, %w);
  %g(%w)
}
def @make(%t: Tree, %w: Tensor[(), f32]) -> fn(Tensor[(), f32]) -> Tensor[(), f32] {
  match (%t) {
    Leaf(%x) => fn (%y: Tensor[(), f32]) -> Tensor[(), f32] { mul(%x, %y) },
    Node(%l, _) => @make(%l, %w),
  }
}
)", "closures.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr tree = module->FindType("Tree");
  auto leaf = [&](float x) { return Value::Adt(tree, 0, {Value(Tensor::FromVector<float>({}, {x}))}); };
  Value t = Value::Adt(tree, 1, {leaf(2), Value::Adt(tree, 1, {leaf(3), leaf(4)})});
  Value w(Tensor::FromVector<float>({}, {0.5f}));
  // A tuple holding a closure is an ordinary value: served.
  GenericProgram served(module, "loss");
  Execution got = Execute(served.Inspect({t, w}), ExecuteOptions{});
  EXPECT_TRUE(ValueAllClose(got.value, Interpreter().Call(*module, "loss", {t, w}), 1e-6, 1e-6));
  // A cell returning a function value is refused, naming the function.
  GenericProgram refused(module, "returns");
  try {
    refused.Inspect({t, w});
    FAIL() << "served a cell returning a function value";
  } catch (const Refusal& e) {
    EXPECT_NE(std::string(e.what()).find("@make returns a function value"), std::string::npos) << e.what();
  }
}

// Per-example sizes: each example of the DAG encoder has a sentence matrix
// of its own length (2-5 rows of 6 here). A leaf reads one row of it: the
// inspector takes that row (an operator that only moves data, DataOp), so
// the leaves of every length are one segment program and one run per level.
// The root's attention reads the whole sentence: its program pads the
// sentence to the longest of the run (generic/pad.h), so it too is one
// program for every length.
TEST(GenericTier, EverySentenceLengthRunsOneProgramAtTheLeavesAndAtTheRoot) {
  Snapshot module = LoadProgram("tests/generic/models/dag.pj");
  auto calls = Calls(*module, "loss", "tests/generic/dag_calls.jsonl");
  GenericProgram program(module, "loss");
  std::set<const SegmentCode*> row_readers, sentence_readers;
  for (const auto& args : calls) {
    Inspection inspection = program.Inspect(args);
    for (const generic::Run& run : inspection.runs) {
      const std::string text = PrintFunction("segment", run.code->program);
      EXPECT_EQ(text.find("take("), std::string::npos) << text;
      for (size_t i = 0; i < run.code->inputs.size(); ++i) {
        const Shape& shape = run.code->inputs[i].shape;
        if (run.code->shared[i] || shape.size() != 2 || shape[1] != 6) continue;
        EXPECT_TRUE(run.code->data[i]) << text;  // a sentence or its row: never differentiated
        if (shape[0] == 1) {
          row_readers.insert(run.code);
          continue;
        }
        EXPECT_NE(text.find("softmax("), std::string::npos) << "reads a whole sentence outside the root:\n" << text;
        ASSERT_FALSE(run.code->padded.empty()) << text;
        EXPECT_TRUE(run.code->padded[i]);
        sentence_readers.insert(run.code);
      }
    }
  }
  EXPECT_EQ(row_readers.size(), 1u);
  EXPECT_EQ(sentence_readers.size(), 1u);
}

// What a padded program computes is what each instance's own does, for
// every operation the padding handles: contractions and reductions along
// the per-example axis (attention, a mean, a max, a logsumexp, a norm, a
// log_softmax along it, X^T X), operations on the padding whose derivative
// at zero is infinite (sqrt, log), and indices of per-example length
// (an embedding bag), losses over rows with a label each (a tagger's: their
// mean over the rows within the length, or each row's). Lengths 1 to 9 run
// as one run per call (a length of 1
// joins the program longer ones made); the gradient of the weight is the
// interpreter's (a NaN from the padding would poison it).
TEST(GenericTier, PerExampleLengthsRunAsOnePaddedProgramWithTheInterpretersAnswers) {
  Module m;
  m.AddSource(R"(
type Example = (Tensor[(?, 4), f32], Tensor[(?,), i64]);
def @example(%e: Example, %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  let %x = %e.0;
  let %k = matmul(%x, %w);
  let %q = sum(%x, axes=[0], keepdims=true);
  let %att = softmax(matmul(%q, %k, transpose_b=true), axis=1);
  let %a = sum(matmul(%att, %x));
  let %b = sum(mean(sigmoid(%k), axes=[0]));
  let %c = sum(max(add(%k, 1f32), axes=[0]));
  let %d = sum(logsumexp(%k, axes=[0]));
  let %f = sum(sqrt(add(mul(%k, %k), 0.5f32)));
  let %g = sum(log(add(exp(%k), 1f32)));
  let %h = sum(norm(tanh(%k), axes=[1]));
  let %i = sum(mul(log_softmax(%k, axis=0), sigmoid(%k)));
  let %j = sum(mul(matmul(transpose(%x), %k), %w));
  let %bag = sum(take(%w, %e.1), axes=[0]);
  let %l = sum(mul(%bag, sum(%k, axes=[0])));
  let %m = add(cross_entropy(%k, %e.1), sum(nll(log_softmax(%k, axis=1), %e.1, mean=false)));
  add(add(add(add(%a, %b), add(%c, %d)), add(add(%f, %g), add(%h, %i))), add(add(%j, mul(0.1f32, %l)), %m))
}
def @loss(%xs: List[Example], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%e, %rest) => add(@example(%e, %w), @loss(%rest, %w)),
  }
}
)", "lengths.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto minibatch = [&](const std::vector<int64_t>& lengths) {
    Value xs = Value::Adt(list, 0, {});
    for (int64_t n : lengths) {
      std::vector<float> rows(n * 4);
      for (float& v : rows) v = unit(rng);
      std::vector<int64_t> ids(n);
      for (int64_t& i : ids) i = static_cast<int64_t>(rng() % 4);
      xs = Value::Adt(list, 1, {Value::Tuple({Value(Tensor::FromVector<float>({n, 4}, rows)),
                                              Value(Tensor::FromVector<int64_t>({n}, ids))}),
                                xs});
    }
    return xs;
  };
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng);
  const Value weight(Tensor::FromVector<float>({4, 4}, w));
  GenericProgram program(module, "loss");
  std::set<const SegmentCode*> examples;
  for (const std::vector<int64_t>& lengths :
       std::vector<std::vector<int64_t>>{{3, 7, 2, 9, 5}, {1, 4, 4, 8}, {6, 6, 6}, {2, 9, 1, 3, 7, 5}}) {
    Inspection inspection;
    ExpectTheInterpretersAnswers(program, {minibatch(lengths), weight}, inspection);
    int runs = 0;
    for (const generic::Run& run : inspection.runs) {
      if (PrintFunction("s", run.code->program).find("softmax(") == std::string::npos) continue;
      ++runs;
      EXPECT_EQ(run.members.size(), lengths.size());
      examples.insert(run.code);
    }
    EXPECT_EQ(runs, 1);
  }
  EXPECT_EQ(examples.size(), 1u) << "one program for every length";
}

// A program the padding cannot serve keeps one program per length, with the
// same answers, and says why (SegmentCode::unpadded, the trace's
// generic-compile events): here a concatenation along the per-example axis
// (of a value the segment computes: one of data alone is the inspector's,
// DataOp).
TEST(GenericTier, APaddingTheProgramDoesNotAllowKeepsOneProgramPerLength) {
  Module m;
  m.AddSource(R"(
def @loss(%xs: List[Tensor[(?, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(softmax(matmul(concat(tanh(%x), %x, axis=0), %w), axis=0)), @loss(%rest, %w)),
  }
}
)", "concat.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  Value xs = Value::Adt(list, 0, {});
  for (int64_t n : {3, 5, 3, 2}) {
    std::vector<float> rows(n * 4);
    for (float& v : rows) v = unit(rng);
    xs = Value::Adt(list, 1, {Value(Tensor::FromVector<float>({n, 4}, rows)), xs});
  }
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng);
  GenericProgram program(module, "loss");
  Inspection inspection;
  ExpectTheInterpretersAnswers(program, {xs, Value(Tensor::FromVector<float>({4, 4}, w))}, inspection);
  std::set<const SegmentCode*> per_length;
  for (const generic::Run& run : inspection.runs) {
    if (PrintFunction("s", run.code->program).find("concat(") == std::string::npos) continue;
    EXPECT_TRUE(run.code->padded.empty());
    EXPECT_NE(run.code->unpadded.find("pad: concat along a per-example axis"), std::string::npos)
        << run.code->unpadded;
    per_length.insert(run.code);
  }
  EXPECT_EQ(per_length.size(), 3u) << "lengths 2, 3 and 5";
}

// Values of the per-example length that flow from run to run (a graph
// network's node states, round after round, read beside the graph's
// adjacency (n, n)) pad where they flow: each round is one run over every
// graph of the minibatch, whatever their node counts, one program serves
// every count (the adjacency padded along both axes), and the values and
// gradients are the interpreter's. A mean over the nodes reads each
// graph's own count.
TEST(GenericTier, NodeStatesOfEveryGraphSizeRunEachRoundAsOnePaddedRun) {
  Module m;
  m.AddSource(R"(
type Nat { Z, S(Nat) }
type Graph = (Tensor[(?, 4), f32], Tensor[(?, ?), f32]);
def @rounds(%k: Nat, %h: Tensor[(?, 4), f32], %adj: Tensor[(?, ?), f32], %w: Tensor[(4, 4), f32]) -> Tensor[(?, 4), f32] {
  match (%k) {
    Z => %h,
    S(%k1) => @rounds(%k1, add(%h, relu(matmul(matmul(%adj, %h), %w))), %adj, %w),
  }
}
def @loss(%gs: List[Graph], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%gs) {
    Nil => 0f32,
    Cons(%g, %rest) => add(sum(mean(@rounds(S(S(S(Z))), tanh(%g.0), %g.1, %w), axes=[0])), @loss(%rest, %w)),
  }
}
def @states(%gs: List[Graph], %w: Tensor[(4, 4), f32]) -> List[Tensor[(?, 4), f32]] {
  match (%gs) {
    Nil => Nil,
    Cons(%g, %rest) => Cons(@rounds(S(S(Z)), tanh(%g.0), %g.1, %w), @states(%rest, %w)),
  }
}
)", "graphs.pj");
  Snapshot module = m.snapshot();
  TypeDefPtr list = module->FindType("List");
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  auto minibatch = [&](const std::vector<int64_t>& nodes) {
    Value gs = Value::Adt(list, 0, {});
    for (int64_t n : nodes) {
      std::vector<float> x(n * 4), adj(n * n);
      for (float& v : x) v = unit(rng);
      for (float& v : adj) v = unit(rng) > 0.3f ? 0.0f : 1.0f / static_cast<float>(n);
      gs = Value::Adt(list, 1, {Value::Tuple({Value(Tensor::FromVector<float>({n, 4}, x)),
                                              Value(Tensor::FromVector<float>({n, n}, adj))}),
                                gs});
    }
    return gs;
  };
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng) * 0.5f;
  const Value weight(Tensor::FromVector<float>({4, 4}, w));
  GenericProgram program(module, "loss");
  std::set<const SegmentCode*> round_codes;
  for (const std::vector<int64_t>& nodes :
       std::vector<std::vector<int64_t>>{{3, 7, 2, 9, 5}, {4, 4, 8}, {6, 1, 11, 3, 2, 5}}) {
    const std::vector<Value> args = {minibatch(nodes), weight};
    // A prefetch knows the rounds' padding from the features' lengths.
    const Ahead ahead = program.InspectAhead(args);
    const int64_t longest = *std::max_element(nodes.begin(), nodes.end());
    const std::vector<PadTo> padding{{PadBucket(longest), true, 1}, {PadBucket(longest), true, 3}};
    Inspection inspection;
    ExpectTheInterpretersAnswers(program, args, inspection);
    EXPECT_TRUE(inspection.kept);
    int round_runs = 0;
    for (const generic::Run& run : inspection.runs) {
      if (PrintFunction("s", run.code->program).find("relu(") == std::string::npos) continue;
      ++round_runs;
      EXPECT_TRUE(std::any_of(ahead.variants.begin(), ahead.variants.end(), [&](const VariantRef& v) {
        std::vector<PadTo> pads = v.pads;  // the node states' and the adjacency's, in either order
        std::erase_if(pads, [](const PadTo& p) { return p.extent == 0; });
        std::sort(pads.begin(), pads.end(), [](const PadTo& a, const PadTo& b) { return a.axes < b.axes; });
        return v.code == run.code && v.rows == run.rows && pads == padding;
      })) << "the prefetch's variants hold the round's";
      EXPECT_EQ(run.members.size(), nodes.size());
      round_codes.insert(run.code);
      ASSERT_FALSE(run.code->padded.empty());
      for (size_t i = 0; i < run.code->inputs.size(); ++i) {
        const Shape& shape = run.code->inputs[i].shape;
        if (run.code->shared[i]) continue;
        EXPECT_EQ(run.code->padded[i], shape[1] == 4 ? 1u : 3u) << "node states along their first axis, adjacency along both";
      }
      EXPECT_TRUE(std::any_of(run.code->output_length.begin(), run.code->output_length.end(),
                              [](int p) { return p >= 0; }))
          << "the new states have the per-example length";
    }
    EXPECT_EQ(round_runs, 3);
    // An entry returning each graph's states (a List): each its own rows.
    GenericProgram states(module, "states");
    Execution got = Execute(states.Inspect(args), ExecuteOptions{});
    EXPECT_TRUE(ValueAllClose(got.value, Interpreter().Call(*module, "states", args), 1e-5, 1e-6)) << got.value.ToString();
  }
  EXPECT_EQ(round_codes.size(), 1u) << "one program for every node count";
}

// Self-attention over sentences of their own lengths, layer after layer
// (a recursion over a Nat): each layer's output, of the sentence's length,
// feeds the next layer's run, its attention scores (n, n) masked along both
// axes, one program for every length; values and gradients are the
// interpreter's.
TEST(GenericTier, SelfAttentionLayersOverSentencesOfEveryLengthRunAsOnePaddedProgram) {
  Module m;
  m.AddSource(R"(
type Nat { Z, S(Nat) }
def @layers(%k: Nat, %x: Tensor[(?, 4), f32], %w: Tensor[(4, 4), f32]) -> Tensor[(?, 4), f32] {
  match (%k) {
    Z => %x,
    S(%k1) => {
      let %q = matmul(%x, %w);
      let %att = softmax(matmul(%q, %x, transpose_b=true), axis=1);
      @layers(%k1, layer_norm(add(%x, matmul(%att, %x)), ones(shape=[4]), zeros(shape=[4]), eps=0.001), %w)
    },
  }
}
def @loss(%xs: List[Tensor[(?, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(max(@layers(S(S(Z)), %x, %w), axes=[0])), @loss(%rest, %w)),
  }
}
)", "attention.pj");
  Snapshot module = m.snapshot();
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::vector<float> w(16);
  for (float& v : w) v = unit(rng);
  const Value weight(Tensor::FromVector<float>({4, 4}, w));
  TypeDefPtr list = module->FindType("List");
  GenericProgram program(module, "loss");
  std::set<const SegmentCode*> layer_codes;
  for (const std::vector<int64_t>& lengths : std::vector<std::vector<int64_t>>{{3, 7, 2, 9}, {5, 5, 12, 4, 6}}) {
    Value xs = Value::Adt(list, 0, {});
    for (int64_t n : lengths) {
      std::vector<float> rows(n * 4);
      for (float& v : rows) v = unit(rng);
      xs = Value::Adt(list, 1, {Value(Tensor::FromVector<float>({n, 4}, rows)), xs});
    }
    Inspection inspection;
    ExpectTheInterpretersAnswers(program, {xs, weight}, inspection);
    int layer_runs = 0;
    for (const generic::Run& run : inspection.runs) {
      if (PrintFunction("s", run.code->program).find("softmax(") == std::string::npos) continue;
      ++layer_runs;
      EXPECT_EQ(run.members.size(), lengths.size());
      layer_codes.insert(run.code);
    }
    EXPECT_EQ(layer_runs, 2);
  }
  EXPECT_EQ(layer_codes.size(), 1u) << "one program for every length";
}

INSTANTIATE_TEST_SUITE_P(Models, GenericTest,
                         ::testing::Values(Model{"treelstm", "examples/treelstm/treelstm.pj", "tests/generic/treelstm_calls.jsonl", {2}},
                                           Model{"seq_lstm", "tests/tools/testdata/seq_lstm.pj", "tests/generic/seq_lstm_calls.jsonl", {2, 3}},
                                           Model{"tree_rnn", "tests/tools/testdata/tree_rnn.pj", "tests/generic/tree_rnn_calls.jsonl", {1}},
                                           Model{"tree_rnn_fold", "tests/generic/models/tree_rnn_fold.pj", "tests/generic/tree_rnn_calls.jsonl", {1}},
                                           Model{"tree_rnn_map", "tests/generic/models/tree_rnn_map.pj", "tests/generic/tree_rnn_calls.jsonl", {1}},
                                           Model{"tree_rnn_gated", "tests/generic/models/tree_rnn_gated.pj", "tests/generic/tree_rnn_calls.jsonl", {1}},
                                           Model{"tree_rnn_settle", "tests/generic/models/tree_rnn_settle.pj", "tests/generic/tree_rnn_calls.jsonl", {1}},
                                           Model{"tree_rnn_closures", "tests/generic/models/tree_rnn_closures.pj", "tests/generic/tree_rnn_calls.jsonl", {1}},
                                           Model{"char_lm", "tests/generic/models/char_lm.pj", "tests/generic/char_lm_calls.jsonl", {1, 2}},
                                           Model{"typed_ast", "tests/generic/models/typed_ast.pj", "tests/generic/typed_ast_calls.jsonl", {1}},
                                           Model{"nmn", "tests/generic/models/nmn.pj", "tests/generic/nmn_calls.jsonl", {1}},
                                           Model{"dag", "tests/generic/models/dag.pj", "tests/generic/dag_calls.jsonl", {1}},
                                           Model{"act", "tests/generic/models/act.pj", "tests/generic/act_calls.jsonl", {1}},
                                           Model{"spinn", "tests/generic/models/spinn.pj", "tests/generic/spinn_calls.jsonl", {1}},
                                           Model{"gnn", "tests/generic/models/gnn.pj", "tests/generic/gnn_calls.jsonl", {2}},
                                           Model{"attention", "tests/generic/models/attention.pj", "tests/generic/attention_calls.jsonl", {2}}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pejit::generic
