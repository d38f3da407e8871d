// The structure-generic tier inside the engine: unseen structures run on
// shared code from their first call, with the interpreter's answers; what
// the tier has not compiled yet (a taller tree, a new constructor) is served
// at once and compiled in the background; what it does not serve goes to the
// other tiers with the reason in the log; and a module edit replaces its code.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>

#include "jit/pass.h"
#include "scheduler/engine.h"
#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;

EngineOptions GenericOptions(Policy policy, std::shared_ptr<RecordingSink> events) {
  return Options(policy, [&](EngineOptions& o) {
    o.generic = true;
    o.specialize_after_calls = 0;
    o.events = std::move(events);
  });
}

bool Close(const Value& a, const Value& b) { return ValueAllClose(a, b, 1e-5, 1e-6); }

// A grad-mode call of "loss" gives the interpreter's value and its gradient
// with respect to argument 1.
void ExpectTheInterpretersGradient(const Entry& loss, const ModuleSnapshot& s, const std::vector<Value>& args) {
  ValueAndGrad got = loss.with_grad({1}).value_and_grad(args);
  ValueAndGrad want = Interpreter().CallWithGrad(s, "loss", args, {1});
  EXPECT_TRUE(Close(got.value, want.value));
  EXPECT_TRUE(Close(got.grads[0], want.grads[0]));
}

// A List of random (n, 4) matrices, one per length n: each example's
// tensor of its own length, the list built back to front.
Value MatricesOfLengths(const ModuleSnapshot& s, Rng& rng, const std::vector<int64_t>& lengths) {
  TypeDefPtr list = s.FindType("List");
  Value xs = Value::Adt(list, 0, {});
  for (int64_t n : lengths) xs = Value::Adt(list, 1, {RandomMatrix(rng, n, 4), xs});
  return xs;
}

TEST(GenericEngine, EveryNewStructureRunsGenericCodeFromItsFirstCall) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(3);
  Value emb = RandomMatrix(rng, 10, 4);
  Entry loss = engine.entry("loss");
  for (int shape = 0; shape < 12; ++shape) {
    SCOPED_TRACE("shape " + std::to_string(shape));
    std::vector<Value> args = {MakeTree(*s, 2 + shape % 5, shape, 10), emb};
    ExpectTheInterpretersGradient(loss, *s, args);
  }
  EntryStats st = loss.stats();
  EXPECT_EQ(st.calls_generic, 12);
  EXPECT_EQ(st.generic_native_runs, st.generic_runs) << "policy sync compiles what a call runs first";
  EXPECT_EQ(st.compiled, 0) << "no per-structure specialization";
  int64_t new_cells = 0;  // each cell reported once, by the call that built it
  for (const Event& e : events->Of(EventKind::kCall, "loss")) {
    EXPECT_EQ(e.Text("tier"), "generic");
    if (e.Find("new_cells")) new_cells += std::stoll(e.Text("new_cells"));
  }
  EXPECT_GT(std::stoll(events->Of(EventKind::kCall, "loss").front().Text("new_cells")), 0);
  // The code is the model's, not the data's: a comb's cells and segments are few.
  EngineStats es = engine.stats();
  EXPECT_EQ(es.generic_cells, new_cells);
  EXPECT_GT(es.generic_segments, 0);
  EXPECT_LT(es.generic_segments, 12);
}

// A tensor of its own length per example (a sentence of n rows) is padded
// into one segment program (generic/pad.h): every length runs its code, the
// statistics count the padded segment, and each compile says its padding.
TEST(GenericEngine, PerExampleLengthsShareOnePaddedSegmentAndSayItsPadding) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(R"(
def @loss(%xs: List[Tensor[(?, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %k = matmul(%x, %w);
      add(sum(matmul(softmax(matmul(sum(%x, axes=[0], keepdims=true), %k, transpose_b=true), axis=1), %x)),
          @loss(%rest, %w))
    },
  }
}
)", "lengths.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(5);
  Value w = RandomMatrix(rng, 4, 4);
  Entry loss = engine.entry("loss");
  for (const std::vector<int64_t>& lengths : std::vector<std::vector<int64_t>>{{3, 8, 5}, {2, 6, 6, 9}, {7, 7}}) {
    std::vector<Value> args = {MatricesOfLengths(*s, rng, lengths), w};
    ExpectTheInterpretersGradient(loss, *s, args);
  }
  EXPECT_EQ(loss.stats().calls_generic, 3);
  EngineStats es = engine.stats();
  EXPECT_EQ(es.generic_padded_segments, 1);
  std::set<std::string> paddings;
  for (const Event& e : events->Of(EventKind::kGenericCompile, "loss")) {
    if (e.Find("padded")) paddings.insert(e.Text("padded"));
  }
  // Lengths 3-8 pad to 8 with a mask, 2-9 to 10; 7 and 7 need none.
  EXPECT_EQ(paddings, (std::set<std::string>{"8m", "10m", "7"}));
}

// A value of the per-example length that a recursion passes on (a graph
// network's node states, from round to round) is padded where it flows:
// each run's output at the run's extent, each reader reading its
// instances' own rows. New lengths make no new programs.
TEST(GenericEngine, AValueOfThePerExampleLengthFlowsFromRunToRunPadded) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(R"(
type Nat { Z, S(Nat) }
def @rounds(%k: Nat, %h: Tensor[(?, 4), f32], %w: Tensor[(4, 4), f32]) -> Tensor[(?, 4), f32] {
  match (%k) {
    Z => %h,
    S(%k1) => @rounds(%k1, tanh(matmul(%h, %w)), %w),
  }
}
def @loss(%xs: List[Tensor[(?, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(mean(@rounds(S(S(Z)), %x, %w), axes=[0])), @loss(%rest, %w)),
  }
}
)", "rounds.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(6);
  Value w = RandomMatrix(rng, 4, 4);
  Entry loss = engine.entry("loss");
  ExpectTheInterpretersGradient(loss, *s, {MatricesOfLengths(*s, rng, {3, 5, 3}), w});
  const EngineStats first = engine.stats();
  EXPECT_GE(first.generic_padded_segments, 1);
  ExpectTheInterpretersGradient(loss, *s, {MatricesOfLengths(*s, rng, {2, 7, 4, 7, 1}), w});
  EXPECT_EQ(loss.stats().calls_generic, 2);
  EXPECT_EQ(engine.stats().generic_segments, first.generic_segments) << "new lengths, no new programs";
  for (const Event& e : events->Of(EventKind::kGenericCompile, "loss")) {
    EXPECT_FALSE(e.Find("unpadded")) << e.Text("unpadded");
  }
}

// A per-example length the padding cannot serve (a concatenation along
// it) keeps one program per length, with the interpreter's answers, and
// each compile of one says why in the trace.
TEST(GenericEngine, ALengthThePaddingCannotServeSaysWhyInEachCompile) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(R"(
def @loss(%xs: List[Tensor[(?, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(softmax(matmul(concat(tanh(%x), %x, axis=0), %w), axis=0)), @loss(%rest, %w)),
  }
}
)", "unpadded.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(6);
  Value w = RandomMatrix(rng, 4, 4);
  Entry loss = engine.entry("loss");
  std::vector<Value> args = {MatricesOfLengths(*s, rng, {3, 5, 3}), w};
  ExpectTheInterpretersGradient(loss, *s, args);
  EXPECT_EQ(loss.stats().calls_generic, 1);
  std::set<std::string> why;
  for (const Event& e : events->Of(EventKind::kGenericCompile, "loss")) {
    if (e.Find("unpadded")) why.insert(e.Text("unpadded"));
  }
  ASSERT_EQ(why.size(), 2u) << "lengths 3 and 5, each its own program";
  for (const std::string& w : why) {
    EXPECT_NE(w.find("pad: concat along a per-example axis"), std::string::npos) << w;
  }
}

// Under policy eager a worker gives each segment variant native code
// twice: quick code first, then optimized code replacing it once nothing
// else waits. Every call has the interpreter's answers meanwhile.
TEST(GenericEngine, AVariantGetsQuickNativeCodeThenOptimizedCode) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Eager(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(4);
  Value emb = RandomMatrix(rng, 10, 4);
  Entry loss = engine.entry("loss");
  for (int call = 0; call < 6; ++call) {
    std::vector<Value> args = {MakeTree(*s, 2 + call, call, 10), emb};
    ExpectTheInterpretersGradient(loss, *s, args);
    if (call == 2) engine.drain();
  }
  engine.drain();
  std::map<std::pair<int64_t, int64_t>, std::vector<std::string>> codegen;  // by (segment, rows), in order
  for (const Event& e : events->Of(EventKind::kGenericCompile, "loss")) {
    codegen[{std::stoll(e.Text("segment")), std::stoll(e.Text("rows"))}].push_back(e.Text("codegen"));
  }
  ASSERT_FALSE(codegen.empty());
  for (const auto& [variant, order] : codegen) {
    EXPECT_EQ(order, (std::vector<std::string>{"quick", "optimized"})) << "segment " << variant.first << ", rows "
                                                                       << variant.second;
  }
}

// EngineOptions::compile_options reach every compile the engine makes, on
// the thread that compiles: the generic tier's segments (vectorized, then
// lowered through the lowering passes) and a signature's own specialization
// (the residual passes first).
TEST(GenericEngine, ItsCompileOptionsReachEveryCompile) {
  for (bool generic : {true, false}) {
    SCOPED_TRACE(generic ? "generic tier" : "specialization");
    std::mutex mu;
    std::map<std::string, int> shown;
    Engine engine(Options(Policy::Sync(), [&](EngineOptions& o) {
      o.generic = generic;
      o.specialize_after_calls = 0;
      o.compile_options.instrument.after = [&](std::string_view pass, const PassProduct& product, double) {
        std::lock_guard lock(mu);
        ++shown[std::string(pass)];
        EXPECT_EQ(product.program != nullptr, pass != "vjp") << pass;  // vjp makes two programs
        EXPECT_FALSE(product.text().empty()) << pass;
      };
    }));
    engine.module().AddSource(kProgram, "program.pj");
    Snapshot s = engine.module().snapshot();
    Rng rng(4);
    std::vector<Value> args = {MakeTree(*s, 4, 1, 10), RandomMatrix(rng, 10, 4)};
    Entry loss = engine.entry("loss").with_grad({1});
    ValueAndGrad got = loss.value_and_grad(args);  // policy sync: compiled before it runs
    ValueAndGrad want = Interpreter().CallWithGrad(*s, "loss", args, {1});
    EXPECT_TRUE(Close(got.grads[0], want.grads[0]));
    std::lock_guard lock(mu);
    EXPECT_GT(shown["dce"], 0) << "every compile goes through the lowering passes";
    EXPECT_EQ(shown["autodiff"], generic ? 0 : 1) << "segments are differentiated before, a residual in, the pipeline";
    // A segment's variants: vectorized, split into their VJP's halves, each
    // half's weights packed.
    EXPECT_EQ(shown["vjp"], shown["vectorize"]);
    EXPECT_EQ(shown["pack-shared-weights"], generic ? 2 * shown["vectorize"] : 0);
    EXPECT_EQ(shown["vectorize"] > 0, generic);
    EXPECT_EQ(loss.stats().calls_generic, generic ? 1 : 0);
  }
}

// A training loop prefetches the minibatches it will call: each is walked
// once, at its prefetch (policy sync: at once, on the caller's thread), and
// its call runs that schedule with its own parameters; the trace counts every
// walk once.
TEST(GenericEngine, APrefetchedMinibatchIsWalkedOnceAndItsCallTakesTheSchedule) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(5);
  Entry loss = engine.entry("loss");
  std::vector<Value> trees;
  for (int b = 0; b < 4; ++b) trees.push_back(MakeTree(*s, 3 + b, 40 + b, 10));
  for (const Value& t : trees) loss.with_grad({1}).prefetch({t, RandomMatrix(rng, 10, 4)}, Prefetch::kNext);
  for (const Value& t : trees) {
    std::vector<Value> args = {t, RandomMatrix(rng, 10, 4)};  // parameters the prefetch did not see
    ExpectTheInterpretersGradient(loss, *s, args);
  }
  std::vector<Event> calls = events->Of(EventKind::kCall, "loss"), walks = events->Of(EventKind::kGenericInspect, "loss");
  ASSERT_EQ(calls.size(), 4u);
  ASSERT_EQ(walks.size(), 4u);
  ASSERT_EQ(events->Of(EventKind::kPrefetch, "loss").size(), 4u);
  int64_t new_cells = 0;
  for (const Event& e : calls) {
    EXPECT_EQ(e.Text("tier"), "generic");
    EXPECT_EQ(e.Text("schedule"), "prefetched");
    EXPECT_FALSE(e.Find("new_cells")) << "the prefetch built them";
  }
  for (const Event& e : walks) {
    EXPECT_TRUE(e.Find("inspect_us"));
    EXPECT_EQ(e.Text("priority"), "next");
    if (e.Find("new_cells")) new_cells += std::stoll(e.Text("new_cells"));
  }
  EXPECT_EQ(engine.stats().generic_cells, new_cells);
}

// Under policy eager a worker walks a prefetched minibatch ahead of its call;
// a call that comes before a worker took the walk walks itself (the queued
// walk dropped), one that comes after waits for the walk and takes it. Whichever way, each minibatch is
// walked exactly once and every call gets the interpreter's answer.
TEST(GenericEngine, AWorkerWalksPrefetchedMinibatchesAheadAndNoneIsWalkedTwice) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Eager(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(6);
  Entry loss = engine.entry("loss").with_grad({1});
  const int n = 24;
  std::vector<Value> trees;
  for (int b = 0; b < n; ++b) trees.push_back(MakeTree(*s, 2 + b % 6, 60 + b, 10));
  Interpreter interp;
  const int lookahead = 3;
  for (int b = 0; b < lookahead; ++b) loss.prefetch({trees[b], RandomMatrix(rng, 10, 4)}, Prefetch::kNext);
  for (int b = 0; b < n; ++b) {
    if (b + lookahead < n) loss.prefetch({trees[b + lookahead], RandomMatrix(rng, 10, 4)}, Prefetch::kNext);
    std::vector<Value> args = {trees[b], RandomMatrix(rng, 10, 4)};
    ValueAndGrad got = loss.value_and_grad(args);
    ValueAndGrad want = interp.CallWithGrad(*s, "loss", args, {1});
    EXPECT_TRUE(Close(got.value, want.value)) << "minibatch " << b;
    EXPECT_TRUE(Close(got.grads[0], want.grads[0])) << "minibatch " << b;
  }
  std::vector<Event> calls = events->Of(EventKind::kCall, "loss");
  ASSERT_EQ(calls.size(), static_cast<size_t>(n));
  int taken = 0, walked_at_call = 0;
  int64_t new_cells = 0;
  for (const Event& e : calls) {
    EXPECT_EQ(e.Text("tier"), "generic");
    (e.Find("schedule") ? taken : walked_at_call)++;
    if (e.Find("new_cells")) new_cells += std::stoll(e.Text("new_cells"));
  }
  std::vector<Event> walks = events->Of(EventKind::kGenericInspect, "loss");
  for (const Event& e : walks) {
    if (e.Find("new_cells")) new_cells += std::stoll(e.Text("new_cells"));
  }
  // A walk finished after its call had walked would not be taken.
  EXPECT_EQ(static_cast<int>(walks.size()), taken);
  EXPECT_EQ(taken + walked_at_call, n);
  EXPECT_EQ(engine.stats().generic_cells, new_cells) << "each cell built once, by one walk";
}

// Under policy eager nothing waits: a structure whose cells or row buckets
// are new runs at once, its new segments interpreted, and their native code
// arrives from the worker.
TEST(GenericEngine, ATallerTreeIsServedAtOnceAndItsNewCodeCompilesInTheBackground) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Eager(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(4);
  Value emb = RandomMatrix(rng, 10, 4);
  Entry loss = engine.entry("loss");
  Interpreter interp;
  std::vector<Value> small = {MakeTree(*s, 3, 0, 10), emb};
  ASSERT_TRUE(Eventually([&] {
    EXPECT_TRUE(Close(loss.call(small), interp.Call(*s, "loss", small)));
    return events->Of(EventKind::kCall, "loss").back().Text("native_runs") ==
           events->Of(EventKind::kCall, "loss").back().Text("runs");
  }));
  // 40 leaves: levels and row counts the small tree never had. Its first
  // call runs them at once (value mode: in pieces of the row counts that
  // have native code, or interpreted), and their own code compiles.
  const int64_t native_before = engine.stats().generic_native_variants;
  std::vector<Value> tall = {MakeTree(*s, 40, 1, 10), emb};
  EXPECT_TRUE(Close(loss.call(tall), interp.Call(*s, "loss", tall)));
  EXPECT_EQ(events->Of(EventKind::kCall, "loss").back().Text("tier"), "generic");
  ASSERT_TRUE(Eventually([&] {
    EXPECT_TRUE(Close(loss.call(tall), interp.Call(*s, "loss", tall)));
    Event e = events->Of(EventKind::kCall, "loss").back();
    return e.Text("native_runs") == e.Text("runs") && engine.stats().generic_native_variants > native_before;
  }));
  // Grad mode runs its own variants: the tall tree's first gradient, right.
  ExpectTheInterpretersGradient(loss, *s, tall);
  // A generic call counts as compiled only when every one of its runs was
  // native; the others (the first call's, at least) are counted apart.
  int64_t all_native = 0, interpreted = 0;
  for (const Event& e : events->Of(EventKind::kCall, "loss")) {
    ++(e.Text("native_runs") == e.Text("runs") ? all_native : interpreted);
  }
  EntryStats st = loss.stats();
  EXPECT_GT(interpreted, 0);
  EXPECT_EQ(st.calls_generic_native, all_native);
  EXPECT_EQ(st.calls_generic_interpreted(), interpreted);
  EXPECT_EQ(st.calls_compiled(), st.calls_native + all_native);
}

// A program the tier declines takes the per-minibatch tiers, and the log
// says why: @count_down matches on nothing (its `if` is on a tensor).
TEST(GenericEngine, AProgramItDeclinesTakesTheOtherTiersAndTheLogSaysWhy) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Entry count_down = engine.entry("count_down");
  std::vector<Value> args = {I(3), Value(Tensor::Scalar(1.5f))};
  EXPECT_EQ(count_down.call(args).tensor().item(), 12.0);
  EXPECT_EQ(count_down.stats().calls_generic, 0);
  std::vector<Event> refused = events->Of(EventKind::kGenericRefused, "count_down");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].Text("reason").find("matches on no structure"), std::string::npos) << refused[0].Text("reason");
}

// An entry whose result holds structures (a List of rows) is served by the
// tier with the interpreter's values, call after call of one signature,
// and never queued for per-minibatch code, which returns tensors only.
TEST(GenericEngine, AResultThatHoldsStructuresStaysWithTheTierAndIsNeverQueued) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.generic = true;
    o.specialize_after_calls = 2;
    o.events = events;
  }));
  engine.module().AddSource(R"(
def @each(%xs: List[Tensor[(1, 3), f32]], %w: Tensor[(3, 3), f32]) -> List[Tensor[(1, 3), f32]] {
  match (%xs) { Cons(%x, %rest) => Cons(tanh(matmul(%x, %w)), @each(%rest, %w)), Nil => Nil }
}
)", "each.pj");
  Snapshot s = engine.module().snapshot();
  TypeDefPtr list = s->FindType("List");
  Rng rng(5);
  Value xs = Value::Adt(list, 0, {});
  for (int i = 0; i < 4; ++i) xs = Value::Adt(list, 1, {RandomMatrix(rng, 1, 3), xs});
  const std::vector<Value> args = {xs, RandomMatrix(rng, 3, 3)};
  Entry each = engine.entry("each");
  for (int call = 0; call < 6; ++call) EXPECT_TRUE(Close(each.call(args), Interpreter().Call(*s, "each", args)));
  // Walked ahead on a worker, as a training loop's lookahead asks: the
  // kept inspection carries the result's skeleton to the call.
  Value other = Value::Adt(list, 1, {RandomMatrix(rng, 1, 3), Value::Adt(list, 0, {})});
  each.prefetch({other, args[1]}, Prefetch::kNext);
  engine.drain();
  EXPECT_TRUE(Close(each.call({other, args[1]}), Interpreter().Call(*s, "each", {other, args[1]})));
  ASSERT_EQ(events->Of(EventKind::kCall, "each").size(), 7u);
  EXPECT_EQ(events->Of(EventKind::kCall, "each").back().Text("schedule"), "prefetched");
  engine.drain();
  EntryStats st = each.stats();
  EXPECT_EQ(st.calls_generic, 7);
  EXPECT_EQ(st.failed, 0);
  EXPECT_TRUE(events->Of(EventKind::kEnqueue, "each").empty());
  std::vector<Event> admissions = events->Of(EventKind::kAdmission, "each");
  ASSERT_FALSE(admissions.empty());
  EXPECT_NE(admissions.back().Text("reason").find("result holds structures"), std::string::npos);
}

// A list of 2-vectors whose sums are `sums`, the last first.
Value ListOfSums(const TypeDefPtr& list, const std::vector<float>& sums) {
  Value xs = Value::Adt(list, 0, {});
  for (float v : sums) xs = Value::Adt(list, 1, {Value(Tensor::FromVector<float>({2}, {v, 0.0f})), xs});
  return xs;
}

// An `if` on a tensor value in the list's cell is the data's choice: the
// tier runs each branch for the elements that take it, on every signature.
TEST(GenericEngine, AnIfOnTensorValuesIsServedByTheTier) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(R"(
def @magnitude(%xs: List[Tensor[(2,), f32]]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %s = sum(%x);
      add(if (greater(%s, 0f32)) { %s } else { neg(%s) }, @magnitude(%rest))
    },
  }
}
)", "magnitude.pj");
  TypeDefPtr list = engine.module().snapshot()->FindType("List");
  Entry magnitude = engine.entry("magnitude");
  EXPECT_FLOAT_EQ(magnitude.call({ListOfSums(list, {1.0f, -2.0f})}).tensor().item(), 3.0f);
  EXPECT_FLOAT_EQ(magnitude.call({ListOfSums(list, {-1.0f, 2.0f, -4.0f})}).tensor().item(), 7.0f);
  EXPECT_FLOAT_EQ(magnitude.call({ListOfSums(list, {-1.0f, -2.0f})}).tensor().item(), 3.0f);  // one branch only
  EXPECT_EQ(magnitude.stats().calls_generic, 3);
  EXPECT_TRUE(events->Of(EventKind::kGenericRefused, "magnitude").empty());
}

// A structure that reaches what the tier does not serve (here an `if` on a
// tensor choosing between two lists) is refused once per signature: its
// later calls skip the tier, and the log says it once.
TEST(GenericEngine, ASignatureItRefusesIsRefusedOnce) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(R"(
def @prefix(%xs: List[Tensor[(2,), f32]]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => {
      let %s = sum(%x);
      add(%s, @prefix(if (greater(%s, 0f32)) { %rest } else { Nil }))
    },
  }
}
)", "prefix.pj");
  TypeDefPtr list = engine.module().snapshot()->FindType("List");
  Entry prefix = engine.entry("prefix");
  for (int i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(prefix.call({ListOfSums(list, {-1.0f, 2.0f})}).tensor().item(), 1.0f);
  EXPECT_FLOAT_EQ(prefix.call({ListOfSums(list, {-1.0f, 2.0f, 4.0f})}).tensor().item(), 5.0f);  // another signature
  EXPECT_EQ(prefix.stats().calls_generic, 0);
  std::vector<Event> refused = events->Of(EventKind::kGenericRefused, "prefix");
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_NE(refused[0].Text("reason").find("prefix.pj:7:23"), std::string::npos) << refused[0].Text("reason");
  EXPECT_NE(refused[0].Text("reason").find("return structures"), std::string::npos) << refused[0].Text("reason");
  EXPECT_NE(refused[0].signature, refused[1].signature);
}

// The gradient of an argument holding a structure (a tree's leaf vectors)
// is not the generic tier's: refused before it walks or runs anything, and
// the other tiers give the interpreter's gradients.
TEST(GenericEngine, AGradientOfAStructureArgumentIsRefusedBeforeTheRun) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(R"(
def @rows(%xs: List[Tensor[(1, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(), f32] {
  match (%xs) {
    Nil => 0f32,
    Cons(%x, %rest) => add(sum(tanh(matmul(%x, %w))), @rows(%rest, %w)),
  }
}
)", "rows.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(8);
  TypeDefPtr list = s->FindType("List");
  Value xs = Value::Adt(list, 0, {});
  for (int i = 0; i < 3; ++i) xs = Value::Adt(list, 1, {RandomMatrix(rng, 1, 4), xs});
  std::vector<Value> args = {xs, RandomMatrix(rng, 4, 4)};
  Entry rows = engine.entry("rows");
  ValueAndGrad got = rows.with_grad({0, 1}).value_and_grad(args);
  ValueAndGrad want = Interpreter().CallWithGrad(*s, "rows", args, {0, 1});
  EXPECT_TRUE(Close(got.value, want.value));
  EXPECT_TRUE(Close(got.grads[0], want.grads[0]));
  EXPECT_TRUE(Close(got.grads[1], want.grads[1]));
  EXPECT_EQ(rows.stats().calls_generic, 0);
  EXPECT_EQ(rows.stats().generic_runs, 0) << "nothing ran on the generic tier";
  std::vector<Event> refused = events->Of(EventKind::kGenericRefused, "rows");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].Text("reason").find("a structure argument (argument 0)"), std::string::npos)
      << refused[0].Text("reason");
}

// A module edit replaces the entry's generic program: the next call computes
// with the new definition.
TEST(GenericEngine, AnEditOfAFunctionACellInlinesReplacesTheCode) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Sync(), events));
  engine.module().AddSource(kProgram, "program.pj");
  Rng rng(5);
  Value emb = RandomMatrix(rng, 10, 4);
  Entry loss = engine.entry("loss");
  std::vector<Value> args = {MakeTree(*engine.module().snapshot(), 6, 2, 10), emb};
  Value before = loss.call(args);
  engine.module().AddSource(kHelperChanged, "helper.pj", /*replace_existing=*/true);
  Snapshot after = engine.module().snapshot();
  Value now = loss.call(args);
  EXPECT_TRUE(Close(now, Interpreter().Call(*after, "loss", args)));
  EXPECT_FALSE(Close(now, before));
  EXPECT_EQ(loss.stats().calls_generic, 2);
}

// Entries share segment code: an entry called for the first time after
// another compiled the same cells runs native code at once (in value mode,
// the grad-mode forward the training entry compiled).
TEST(GenericEngine, AnotherEntryRunsTheCodeTheFirstCompiledForTheSameCells) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(GenericOptions(Policy::Eager(), events));
  engine.module().AddSource(kProgram, "program.pj");
  engine.module().AddSource(
      "def @encoding(%t: Tree, %emb: Tensor[(?, ?), f32]) -> Tensor[(1, ?), f32] { @encode(%t, %emb) }", "more.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(6);
  std::vector<Value> args = {MakeTree(*s, 7, 1, 10), RandomMatrix(rng, 10, 4)};
  Entry loss = engine.entry("loss"), encoding = engine.entry("encoding");
  ASSERT_TRUE(Eventually([&] {
    loss.with_grad({1}).value_and_grad(args);
    Event e = events->Of(EventKind::kCall, "loss").back();
    return e.Text("native_runs") == e.Text("runs");
  }));
  EXPECT_TRUE(Close(encoding.call(args), Interpreter().Call(*s, "encoding", args)));
  Event first = events->Of(EventKind::kCall, "encoding").at(0);
  EXPECT_EQ(first.Text("tier"), "generic");
  EXPECT_NE(first.Text("runs"), "0");
  EXPECT_EQ(first.Text("native_runs"), first.Text("runs"));
}

// A structure made with another module's constructors of the same type name,
// listed in another order, is refused naming the argument in every tier: the
// generic tier would take a clause by the other list's index and read past
// the fields. Made with the same constructors (a copy), it runs.
TEST(GenericEngine, AStructureOfAnotherConstructorListIsRefusedNamingTheArgument) {
  constexpr char kSum[] =
      "def @s(%t: Tree) -> Tensor[(), f32] { match (%t) { Leaf(%x) => %x, Node(%l, %r) => add(@s(%l), @s(%r)) } }\n";
  Module other, copy;
  other.AddSource(std::string("type Tree { Node(Tree, Tree), Leaf(Tensor[(), f32]) }\n") + kSum, "other.pj");
  copy.AddSource(std::string("type Tree { Leaf(Tensor[(), f32]), Node(Tree, Tree) }\n") + kSum, "copy.pj");
  auto tree_of = [](const Module& m) {
    TypeDefPtr tree = m.snapshot()->FindType("Tree");
    const int leaf = tree->FindCtor("Leaf"), node = tree->FindCtor("Node");
    auto l = [&](float x) { return Value::Adt(tree, leaf, {Value(Tensor::FromVector<float>({}, {x}))}); };
    return Value::Adt(tree, node, {l(1), Value::Adt(tree, node, {l(2), l(3)})});
  };
  for (Policy policy : {Policy::Sync(), Policy::Eager(), Policy::Interpreter()}) {
    SCOPED_TRACE(policy.ToString());
    Engine engine(GenericOptions(policy, nullptr));
    engine.module().AddSource(std::string("type Tree { Leaf(Tensor[(), f32]), Node(Tree, Tree) }\n") + kSum, "mine.pj");
    Entry s = engine.entry("s");
    for (int call = 0; call < 3; ++call) {  // again: a signature seen before is checked again
      try {
        s.call({tree_of(other)});
        ADD_FAILURE() << "a Tree of another constructor list ran";
      } catch (const EvalError& e) {
        EXPECT_NE(std::string(e.what()).find("argument 0 (%t): a Tree made by another module's constructors (Node(2), Leaf(1))"),
                  std::string::npos) << e.what();
      }
    }
    EXPECT_TRUE(Close(s.call({tree_of(copy)}), Value(Tensor::FromVector<float>({}, {6}))));
  }
}

}  // namespace
}  // namespace pejit
