// The tiered engine: calls never wait for a compile, compiled code takes
// over once it is ready, policies decide when to compile, jobs are ordered by
// urgency, and shutdown does not wait for queued work.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "ops/blas.h"
#include "support/thread_priority.h"
#include "tests/scheduler/fixtures.h"
#include "support/interrupt.h"

namespace pejit {
namespace {

using namespace testing_scheduler;
using namespace std::chrono_literals;
using State = CodeStatus::State;

class EngineTest : public testing::Test {
 protected:
  // Builds the engine with `options`, loads the program, and makes arguments.
  void Start(EngineOptions options) {
    events_ = std::make_shared<RecordingSink>();
    if (!options.events) options.events = events_;
    engine_ = std::make_unique<Engine>(std::move(options));
    engine_->module().AddSource(kProgram, "program.pj");
    Rng rng(5);
    emb_ = RandomMatrix(rng, 10, 4);
  }
  std::vector<Value> TreeArgs(int leaves, int shape = 0) {
    return {MakeTree(*engine_->module().snapshot(), leaves, shape, 10), emb_};
  }
  Value Reference(const std::string& entry, const std::vector<Value>& args) {
    return Interpreter().Call(*engine_->module().snapshot(), entry, args);
  }

  std::shared_ptr<RecordingSink> events_;
  std::unique_ptr<Engine> engine_;
  Value emb_;
};

// With a compile held until the calls are done (as a slow one would
// be), calls made while it runs return at once from the interpreter; after
// wait_ready the compiled code serves them.
TEST_F(EngineTest, CallsDuringASlowCompileRunInTheInterpreterThenCompiledCodeTakesOver) {
  std::atomic<bool> compile_started{false}, compile_finished{false};
  Gate gate;  // opened once the calls are done
  EngineOptions options;
  options.generic = false;  // the per-minibatch tiers (fixtures.h)
  options.workers = 1;
  options.policy = Policy::Eager();
  options.before_compile = [&, opened = gate.opened()](const CompileInfo&) {
    compile_started = true;
    opened.wait();
  };
  options.compile = [&](const Residual& r) {
    ExecutablePtr e = CompileWithResidualInterpreter(r);
    compile_finished = true;
    return e;
  };
  Start(std::move(options));
  Entry loss = engine_->entry("loss");
  std::vector<Value> args = TreeArgs(5);
  Value expected = Reference("loss", args);

  EXPECT_TRUE(ValueEqual(loss.call(args), expected));  // the miss: queues the job, runs tier 0
  ASSERT_TRUE(Eventually([&] { return compile_started.load(); }));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(ValueEqual(loss.call(args), expected));
    EXPECT_FALSE(compile_finished) << "call " << i << " waited for the compile";
  }
  EXPECT_EQ(loss.status(args).state, State::kPending);
  EntryStats s = loss.stats();
  EXPECT_EQ(s.calls_interpreter, 6);
  EXPECT_EQ(s.calls_compiled(), 0);
  EXPECT_EQ(s.misses, 6);

  gate.Open();
  CodeStatus ready = loss.wait_ready(args);
  EXPECT_TRUE(compile_finished);
  ASSERT_EQ(ready.state, State::kReady) << ready.reason;
  EXPECT_EQ(ready.tier, "residual-interpreter");
  EXPECT_GT(ready.code_bytes, 0u);

  EXPECT_TRUE(ValueAllClose(loss.call(args), expected, 1e-6));
  s = loss.stats();
  EXPECT_EQ(s.calls_interpreter, 6);
  EXPECT_EQ(s.calls_residual_interpreter, 1);
  EXPECT_EQ(s.calls_compiled(), 0);  // a residual program in the interpreter is not native code
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.compiled, 1);

  // One signature, one job, its stages in the order of the pipeline (the
  // misses of the calls in between interleave with them). The third call
  // that missed it while it compiled had the job run at the caller's
  // priority (`admission`, decision boost), once. (The worker's LLVM
  // `warm-up` belongs to no signature and comes whenever the worker is free.)
  std::vector<std::string> order;
  for (const Event& e : events_->events()) {
    if (e.kind != EventKind::kCall && e.kind != EventKind::kEdit && e.kind != EventKind::kWarmUp &&
        (e.kind != EventKind::kMiss || order.size() == 1))
      order.emplace_back(e.name());
  }
  EXPECT_EQ(order,
            (std::vector<std::string>{"start", "miss", "enqueue", "pe", "batch", "admission", "compile", "swap", "hit"}));
  EXPECT_EQ(events_->Count(EventKind::kEnqueue), 1);
  for (const Event& e : events_->events()) {
    if (e.kind == EventKind::kAdmission) {
      EXPECT_EQ(e.Text("decision"), "boost") << e.Text("reason");
    }
  }
}

TEST_F(EngineTest, CallsReportTheirTierAndDurationAsEvents) {
  Start(Options(Policy::Sync()));
  Entry other = engine_->entry("other");
  Rng rng(3);
  std::vector<Value> args = {RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)};
  other.call(args);
  std::vector<Event> calls = events_->Of(EventKind::kCall, "other");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].Text("tier"), "native");
  EXPECT_EQ(calls[0].Text("mode"), "value");
  EXPECT_EQ(calls[0].signature, ComputeSignature(args).ShortHash());
  EXPECT_GE(calls[0].duration_us, 0);
  EXPECT_GT(calls[0].thread, 0u);
}

// Compiled results are the interpreter's, in the entry's result structure
// (a tuple here), for values and for gradients in each argument's structure.
TEST_F(EngineTest, CompiledCodeReturnsWhatTheInterpreterReturns) {
  Start(Options(Policy::Sync()));
  Entry other = engine_->entry("other");
  Rng rng(3);
  std::vector<Value> args = {RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)};
  Value v = other.call(args);
  EXPECT_TRUE(ValueAllClose(v, Reference("other", args), 1e-6));
  ASSERT_EQ(v.kind(), Value::Kind::kTuple);
  EXPECT_EQ(other.stats().calls_compiled(), 1);

  Entry loss = engine_->entry("loss");
  std::vector<Value> targs = TreeArgs(4, 1);
  ValueAndGrad got = loss.with_grad({1}).value_and_grad(targs);
  ValueAndGrad want = Interpreter().CallWithGrad(*engine_->module().snapshot(), "loss", targs, {1});
  ASSERT_EQ(loss.stats().calls_compiled(), 1) << loss.with_grad({1}).status(targs).reason;
  EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-5));
  ASSERT_EQ(got.grads.size(), 1u);
  EXPECT_TRUE(ValueAllClose(got.grads[0], want.grads[0], 1e-5, 1e-6));
  // The tree cannot hold a float tensor: asking for its gradient is tier 0's
  // error, not compiled code that answers with the tree.
  EXPECT_THROW(loss.with_grad({1, 0}).value_and_grad(targs), EvalError);
  EXPECT_EQ(loss.with_grad({1, 0}).status(targs).state, State::kNone);
}

// Under eager a job publishes baseline code first (its programs lowered to
// registered kernels, no code generator: jit/tiered.h) and a worker swaps
// native code in later: calls on either give the interpreter's answers; the
// swap says kernel-plan and a tier-up follows; after drain the code is
// native. So for a straight-line specialization and for a loop the data
// ends, whose regions each tier up.
TEST_F(EngineTest, AJobPublishesBaselineCodeThenTiersUpToNativeCode) {
  Start(Options(Policy::Eager()));
  Rng rng(8);
  Entry other = engine_->entry("other");
  Entry count_down = engine_->entry("count_down");
  const std::vector<Value> m = {RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)};
  const std::vector<Value> loop = {I(5), Value(Tensor::Scalar(1.5f))};
  auto expect_answers = [&] {
    EXPECT_TRUE(ValueAllClose(other.call(m), Reference("other", m), 1e-6));
    EXPECT_TRUE(ValueAllClose(count_down.call(loop), Reference("count_down", loop), 1e-6, 1e-7));
  };
  expect_answers();  // the interpreter; the jobs are queued
  ASSERT_TRUE(Eventually([&] {
    return other.status(m).state == State::kReady && count_down.status(loop).state == State::kReady;
  }));
  expect_answers();  // baseline code, or native code if its tier-up was quick
  engine_->drain();
  expect_answers();
  for (const auto& [name, entry, args] : {std::tuple{"other", other, m}, std::tuple{"count_down", count_down, loop}}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(entry.status(args).tier, "native");
    std::vector<Event> swaps = events_->Of(EventKind::kSwap, name), ups = events_->Of(EventKind::kTierUp, name);
    ASSERT_EQ(swaps.size(), 1u);
    EXPECT_EQ(swaps[0].Text("tier"), "kernel-plan");
    ASSERT_EQ(ups.size(), 1u);
    EXPECT_EQ(ups[0].Text("job"), swaps[0].Text("job"));
    EXPECT_GT(std::stoll(ups[0].Text("code_bytes")), 0);
    EXPECT_EQ(ups[0].Find("reason"), nullptr);
    EntryStats st = entry.stats();
    EXPECT_EQ(st.calls_interpreter, 1);
    EXPECT_EQ(st.calls_baseline + st.calls_native, 2);
    EXPECT_GE(st.calls_native, 1);  // the call after drain
  }
  EXPECT_GT(std::stoll(events_->Of(EventKind::kTierUp, "count_down")[0].Text("programs")), 1);
  // The code cache counts the native code against its budget (baseline code holds none).
  EXPECT_EQ(engine_->stats().code_bytes, other.status(m).code_bytes + count_down.status(loop).code_bytes);
  EXPECT_GT(other.status(m).code_bytes, 0u);
}

// A caller that waits for code (wait_ready, policy sync) gets native code
// from the job, not baseline code first; so does every job with
// EngineOptions::baseline_first off.
TEST_F(EngineTest, AWaitedJobOrOneWithoutBaselineFirstPublishesNativeCode) {
  for (bool baseline_first : {true, false}) {
    SCOPED_TRACE(baseline_first ? "waited" : "baseline_first off");
    Start(Options(Policy::Eager(), [&](EngineOptions& o) { o.baseline_first = baseline_first; }));
    Rng rng(9);
    Entry other = engine_->entry("other");
    const std::vector<Value> m = {RandomMatrix(rng, 2, 3), RandomMatrix(rng, 3, 2)};
    if (baseline_first) {
      EXPECT_EQ(other.wait_ready(m).tier, "native");
    } else {
      other.call(m);
      engine_->drain();
    }
    EXPECT_TRUE(ValueAllClose(other.call(m), Reference("other", m), 1e-6));
    std::vector<Event> swaps = events_->Of(EventKind::kSwap, "other");
    ASSERT_EQ(swaps.size(), 1u);
    EXPECT_EQ(swaps[0].Text("tier"), "native");
    EXPECT_EQ(events_->Count(EventKind::kTierUp), 0);
    EXPECT_EQ(other.stats().calls_baseline, 0);
  }
}

// hot:N compiles a signature at its N-th call, not before.
// A dynamic `if` is not batched as a whole: the residual's straight-line
// regions are compiled natively and a driver takes the branch
// (jit/control_flow.h), with the interpreter's answer.
TEST_F(EngineTest, ADynamicIfRunsAsNativeRegions) {
  Start(Options(Policy::Sync()));
  engine_->module().AddSource(R"(
def @clamp(%x: Tensor[(3,), f32]) -> Tensor[(3,), f32] {
  if (greater(sum(%x), 0f32)) { tanh(%x) } else { neg(%x) }
})", "clamp.pj");
  Entry clamp = engine_->entry("clamp");
  for (float sign : {1.0f, -1.0f}) {
    std::vector<Value> args = {Value(Tensor::FromVector<float>({3}, {sign * 0.5f, 0.25f, sign * 1.0f}))};
    EXPECT_TRUE(ValueAllClose(clamp.call(args), Reference("clamp", args), 1e-6, 1e-7));
    CodeStatus status = clamp.status(args);
    ASSERT_EQ(status.state, State::kReady) << status.reason;
    EXPECT_EQ(status.tier, "native");
  }
  EXPECT_EQ(clamp.stats().calls_compiled(), 2);
}

// Grad mode through control flow: the regions' VJPs along the path the
// call took; a loop the data ends (@count_down) in both modes.
TEST_F(EngineTest, GradientsThroughControlFlowRunAsNativeRegions) {
  Start(Options(Policy::Sync()));
  engine_->module().AddSource(R"(
def @clamp_loss(%x: Tensor[(3,), f32], %w: Tensor[(3,), f32]) -> Tensor[(), f32] {
  let %y = mul(%x, %w);
  sum(mul(if (greater(sum(%y), 0f32)) { tanh(%y) } else { neg(%y) }, %w))
})", "clamp.pj");
  Snapshot s = engine_->module().snapshot();
  auto expect_native = [&](const Entry& entry, const std::string& name, const std::vector<Value>& args,
                           const std::vector<int>& wrt) {
    ValueAndGrad got = entry.with_grad(wrt).value_and_grad(args);
    Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*s, name, args, wrt);
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-6, 1e-7));
    for (size_t k = 0; k < wrt.size(); ++k) EXPECT_TRUE(ValueAllClose(got.grads[k], want.grads[k], 1e-5, 1e-6));
    CodeStatus status = entry.with_grad(wrt).status(args);
    ASSERT_EQ(status.state, State::kReady) << status.reason;
    EXPECT_EQ(status.tier, "native");
  };
  Entry clamp = engine_->entry("clamp_loss");
  Value w(Tensor::FromVector<float>({3}, {0.5f, -1.5f, 2.0f}));
  for (float sign : {1.0f, -1.0f}) {
    expect_native(clamp, "clamp_loss", {Value(Tensor::FromVector<float>({3}, {sign * 0.5f, 0.25f, sign * 1.0f})), w},
                  {0, 1});
  }
  Entry count_down = engine_->entry("count_down");
  std::vector<Value> loop = {I(5), Value(Tensor::Scalar(1.5f))};
  EXPECT_TRUE(ValueAllClose(count_down.call(loop), Reference("count_down", loop), 1e-6, 1e-7));
  EXPECT_EQ(count_down.status(loop).tier, "native");
  expect_native(count_down, "count_down", loop, {1});
  EXPECT_EQ(count_down.stats().calls_compiled(), 2);
}

// A compile hook of the Residual-only form is never handed a program it
// would have to differentiate: that call is refused for it, and the
// interpreter answers.
TEST_F(EngineTest, AHookThatDoesNotDifferentiateIsNotAskedTo) {
  Start(Options(Policy::Sync(), [](EngineOptions& o) { o.compile = CompileWithResidualInterpreter; }));
  Entry count_down = engine_->entry("count_down");
  std::vector<Value> loop = {I(3), Value(Tensor::Scalar(1.5f))};
  ValueAndGrad got = count_down.with_grad({1}).value_and_grad(loop);
  EXPECT_TRUE(ValueAllClose(got.grads.at(0), Value(Tensor::Scalar(8.0f)), 1e-6, 1e-7));
  CodeStatus status = count_down.with_grad({1}).status(loop);
  EXPECT_EQ(status.state, State::kFailed);
  EXPECT_EQ(status.reason, "compile: the compile hook takes differentiated programs only, and autodiff takes no control flow");
}

TEST_F(EngineTest, HotPolicyCompilesOnlyAfterNCalls) {
  std::atomic<int> compiles{0};
  Start(Options(Policy::Parse("hot:3"), [&](EngineOptions& o) {
    o.compile = [&](const Residual& r) {
      compiles++;
      return CompileWithResidualInterpreter(r);
    };
  }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> args = TreeArgs(3);
  loss.call(args);
  loss.call(args);
  EXPECT_EQ(loss.status(args).state, State::kCold);
  EXPECT_EQ(events_->Count(EventKind::kEnqueue), 0);
  EXPECT_EQ(engine_->stats().queued, 0u);

  loss.call(args);  // the third: queued now
  EXPECT_EQ(events_->Count(EventKind::kEnqueue), 1);
  ASSERT_TRUE(Eventually([&] { return loss.status(args).state == State::kReady; }));
  EXPECT_EQ(compiles, 1);
  loss.call(args);
  EntryStats s = loss.stats();
  EXPECT_EQ(s.calls_interpreter, 3);
  EXPECT_EQ(s.calls_residual_interpreter, 1);  // the code the hook made
}

TEST_F(EngineTest, SyncPolicyCompilesBeforeTheFirstCall) {
  Start(Options(Policy::Sync()));
  Entry loss = engine_->entry("loss");
  std::vector<Value> args = TreeArgs(6);
  EXPECT_TRUE(ValueAllClose(loss.call(args), Reference("loss", args), 1e-6));
  EntryStats s = loss.stats();
  EXPECT_EQ(s.calls_interpreter, 0);
  EXPECT_EQ(s.calls_compiled(), 1);
}

TEST_F(EngineTest, InterpreterPolicyNeverCompiles) {
  Start(Options(Policy::Interpreter()));
  Entry loss = engine_->entry("loss");
  std::vector<Value> args = TreeArgs(3);
  loss.prefetch(args);
  CodeStatus s = loss.wait_ready(args);
  EXPECT_EQ(s.state, State::kNone);
  EXPECT_EQ(s.reason, "policy interpreter never compiles");
  EXPECT_TRUE(ValueEqual(loss.call(args), Reference("loss", args)));
  EXPECT_EQ(loss.stats().calls_interpreter, 1);
  EXPECT_EQ(loss.stats().misses, 0);
  EXPECT_EQ(engine_->stats().slots, 0u);
}

// Records the order the only worker compiles jobs in, and holds it on the
// first until Release, so that a test can queue everything else meanwhile.
class CompileOrder {
 public:
  void Install(EngineOptions& o) {
    o.workers = 1;
    o.before_compile = [this](const CompileInfo& info) {
      bool first;
      {
        std::lock_guard<std::mutex> lock(mu_);
        first = order_.empty();
        order_.push_back(info.signature.ShortHash());
      }
      if (first) open_.wait();
    };
  }
  // True once the worker holds the first job.
  bool Holding() {
    std::lock_guard<std::mutex> lock(mu_);
    return !order_.empty();
  }
  void Release() { gate_.set_value(); }
  std::vector<std::string> Order() {
    std::lock_guard<std::mutex> lock(mu_);
    return order_;
  }

 private:
  std::promise<void> gate_;
  std::shared_future<void> open_ = gate_.get_future().share();
  std::mutex mu_;
  std::vector<std::string> order_;
};

std::string Sig(const std::vector<Value>& args) { return ComputeSignature(args).ShortHash(); }

// Jobs for the signature missed most recently go first; prefetched ones wait
// until no missed job is left, in the order they were asked for.
TEST_F(EngineTest, MostRecentMissFirstAndPrefetchWhenIdle) {
  CompileOrder compiles;
  Start(Options(Policy::Eager(), [&](EngineOptions& o) { compiles.Install(o); }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> blocker = TreeArgs(2), a = TreeArgs(3), b = TreeArgs(4), c = TreeArgs(5),
                     d = TreeArgs(6);
  loss.call(blocker);
  ASSERT_TRUE(Eventually([&] { return compiles.Holding(); }));
  loss.prefetch(a);
  loss.prefetch(b);
  loss.call(c);
  loss.call(d);
  EXPECT_EQ(engine_->stats().queued, 4u);
  compiles.Release();
  // (Not wait_ready: a caller blocked on a signature raises its job too.)
  for (const auto& args : {a, b, c, d}) {
    EXPECT_TRUE(Eventually([&] { return loss.status(args).ready(); }));
  }
  EXPECT_EQ(compiles.Order(), (std::vector<std::string>{Sig(blocker), Sig(d), Sig(c), Sig(a), Sig(b)}));
  EXPECT_EQ(loss.stats().prefetched, 2);
}

TEST_F(EngineTest, AMissRaisesAPrefetchedJob) {
  CompileOrder compiles;
  Start(Options(Policy::Eager(), [&](EngineOptions& o) { compiles.Install(o); }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> blocker = TreeArgs(2), a = TreeArgs(3), b = TreeArgs(4);
  loss.call(blocker);
  ASSERT_TRUE(Eventually([&] { return compiles.Holding(); }));
  loss.prefetch(a);
  loss.prefetch(b);
  loss.call(b);  // the training loop reached b before its prefetch ran
  compiles.Release();
  for (const auto& args : {a, b}) {
    EXPECT_TRUE(Eventually([&] { return loss.status(args).ready(); }));
  }
  EXPECT_EQ(compiles.Order(), (std::vector<std::string>{Sig(blocker), Sig(b), Sig(a)}));
  EXPECT_EQ(events_->Count(EventKind::kEnqueue), 3);  // b was queued once
}

// A training loop's next minibatches (Prefetch::kNext) compile before the
// jobs of calls already made, in the order the loop will call them, so that
// their code can be ready when it gets there; one the loop reached first is
// an ordinary miss again. Prefetching a queued missed job as next moves it up.
TEST_F(EngineTest, TheNextMinibatchesCompileBeforeMissedOnes) {
  CompileOrder compiles;
  Start(Options(Policy::Eager(), [&](EngineOptions& o) { compiles.Install(o); }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> blocker = TreeArgs(2), idle = TreeArgs(3), missed = TreeArgs(4), next1 = TreeArgs(5),
                     next2 = TreeArgs(6), reached = TreeArgs(7), again = TreeArgs(8);
  loss.call(blocker);
  ASSERT_TRUE(Eventually([&] { return compiles.Holding(); }));
  loss.prefetch(idle);
  loss.call(again);
  loss.call(missed);
  loss.prefetch(next1, Prefetch::kNext);
  loss.prefetch(reached, Prefetch::kNext);
  loss.prefetch(next2, Prefetch::kNext);
  loss.call(reached);                       // got there before its code
  loss.prefetch(again, Prefetch::kNext);    // missed earlier, and next again
  loss.prefetch(next1, Prefetch::kWhenIdle);  // changes nothing
  EXPECT_EQ(engine_->stats().queued, 6u);
  compiles.Release();
  for (const auto& args : {idle, missed, next1, next2, reached, again}) {
    EXPECT_TRUE(Eventually([&] { return loss.status(args).ready(); }));
  }
  EXPECT_EQ(compiles.Order(), (std::vector<std::string>{Sig(blocker), Sig(next1), Sig(next2), Sig(again),
                                                        Sig(reached), Sig(missed), Sig(idle)}));
  std::vector<std::string> priorities;
  for (const Event& e : events_->Of(EventKind::kEnqueue)) priorities.push_back(e.Text("priority"));
  EXPECT_EQ(priorities, (std::vector<std::string>{"miss", "idle", "miss", "miss", "next", "next", "next"}));
  std::vector<std::string> prefetches;
  for (const Event& e : events_->Of(EventKind::kPrefetch)) prefetches.push_back(e.Text("state"));
  EXPECT_EQ(prefetches, (std::vector<std::string>{"queued", "queued", "queued", "queued", "requeued", "pending"}));
}

// A caller blocked on a signature (wait_ready, policy sync) goes before
// everything queued, the next minibatches included.
TEST_F(EngineTest, AWaitingCallerGoesFirst) {
  CompileOrder compiles;
  Start(Options(Policy::Eager(), [&](EngineOptions& o) { compiles.Install(o); }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> blocker = TreeArgs(2), next = TreeArgs(3), missed = TreeArgs(4), waited = TreeArgs(5);
  loss.call(blocker);
  ASSERT_TRUE(Eventually([&] { return compiles.Holding(); }));
  loss.prefetch(next, Prefetch::kNext);
  loss.call(missed);
  std::thread waiter([&] { EXPECT_TRUE(loss.wait_ready(waited).ready()); });
  ASSERT_TRUE(Eventually([&] {
    for (const Event& e : events_->Of(EventKind::kEnqueue))
      if (e.signature == Sig(waited)) return e.Text("priority") == "wait";
    return false;
  }));
  loss.call(waited);  // a miss while a caller waits: stays first
  compiles.Release();
  waiter.join();
  for (const auto& args : {next, missed}) {
    EXPECT_TRUE(Eventually([&] { return loss.status(args).ready(); }));
  }
  EXPECT_EQ(compiles.Order(), (std::vector<std::string>{Sig(blocker), Sig(waited), Sig(next), Sig(missed)}));
}

// Static arguments are specialized on: each value is a signature of its own,
// and it is not a parameter of the compiled code.
TEST_F(EngineTest, StaticArgumentsArePartOfTheSignature) {
  Start(Options(Policy::Sync()));
  Entry scale = engine_->entry("scale", {.static_argnums = {1}});
  Value x(Tensor::FromVector<float>({3}, {1, 2, 3}));
  Value two(Tensor::Scalar(2)), three(Tensor::Scalar(3));
  EXPECT_TRUE(ValueEqual(scale.call({x, two}), Value(Tensor::FromVector<float>({3}, {2, 4, 6}))));
  EXPECT_TRUE(ValueEqual(scale.call({x, three}), Value(Tensor::FromVector<float>({3}, {3, 6, 9}))));
  EXPECT_TRUE(ValueEqual(scale.call({x, two}), Value(Tensor::FromVector<float>({3}, {2, 4, 6}))));
  EntryStats s = scale.stats();
  EXPECT_EQ(s.compiled, 2);
  EXPECT_EQ(s.calls_compiled(), 3);

  // Without the marking, both values share one signature (statistics are
  // per entry name, whatever the marking).
  Entry dynamic = engine_->entry("scale");
  dynamic.call({x, two});
  dynamic.call({x, three});
  EXPECT_EQ(dynamic.stats().compiled, 3);
}

// A static argument's values are baked into its code, keyed by them as they
// were at the call: changed by the caller afterwards (a numpy array the call
// shared) while the compile waits, the code still computes the call's.
TEST_F(EngineTest, AStaticArgumentChangedAfterTheCallDoesNotChangeItsCode) {
  Gate gate;  // holds partial evaluation until the argument has changed
  EngineOptions options = Options(Policy::Eager());
  options.workers = 1;
  options.before_pe = [opened = gate.opened()](const CompileInfo&) { opened.wait(); };
  Start(std::move(options));
  Entry scale = engine_->entry("scale", {.static_argnums = {1}});
  Value x(Tensor::FromVector<float>({3}, {1, 2, 3}));
  Tensor factor = Tensor::Scalar(2);
  const Value doubled(Tensor::FromVector<float>({3}, {2, 4, 6}));
  EXPECT_TRUE(ValueEqual(scale.call({x, Value(factor)}), doubled));  // tier 0; its compile queued
  factor.data<float>()[0] = 5;  // the caller's buffer, changed in place
  gate.Open();
  const std::vector<Value> two = {x, Value(Tensor::Scalar(2))};
  ASSERT_TRUE(Eventually([&] { return scale.status(two).ready(); }));
  EXPECT_TRUE(ValueEqual(scale.call(two), doubled));
  EXPECT_EQ(scale.stats().calls_compiled() + scale.stats().calls_baseline, 1);  // its code, baseline or native
}

// A call whose program never ends stops when its thread's interrupt check
// says so (Ctrl-C in Python), in tier 0 and in a compiled program's driver,
// and leaves no trace: its specialization is not marked failed, later calls run.
TEST_F(EngineTest, ACallThatWouldNotEndStopsWhenItsCallerAsks) {
  for (Policy policy : {Policy::Interpreter(), Policy::Sync()}) {
    SCOPED_TRACE(policy.ToString());
    Start(Options(policy));
    engine_->module().AddSource(
        "def @spin(%x: Tensor[(), f32]) -> Tensor[(), f32] { if (greater(%x, 0f32)) { @spin(add(%x, 1f32)) } else { %x } }",
        "spin.pj");
    Entry spin = engine_->entry("spin");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    {
      ScopedInterruptCheck stop([&] { return std::chrono::steady_clock::now() > deadline; });
      EXPECT_THROW(spin.call({Value(Tensor::Scalar(1))}), Interrupted);
    }
    EXPECT_TRUE(ValueEqual(spin.call({Value(Tensor::Scalar(-1))}), Value(Tensor::Scalar(-1))));
    EXPECT_EQ(spin.stats().failed, 0);
  }
}

TEST_F(EngineTest, EntriesAreCheckedByName) {
  Start(Options(Policy::Eager()));
  try {
    engine_->entry("los");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean '@loss'?"), std::string::npos) << e.what();
  }
  try {
    engine_->entry("scale", {.static_argnums = {2}});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "static_argnums: @scale takes 2 arguments; there is no argument 2");
  }
}

// A handle has one mode, fixed when it is made (as jax.value_and_grad binds
// argnums): its prefetch, wait_ready and status concern that mode, and the
// other mode's call is an error rather than a silent switch.
TEST_F(EngineTest, AnEntryHandleHasOneModeItsPrefetchWarms) {
  Start(Options(Policy::Eager()));
  EntryOptions grad_options;
  grad_options.wrt = std::vector<int>{1};
  Entry train = engine_->entry("loss", grad_options);
  Entry infer = engine_->entry("loss");
  ASSERT_NE(train.wrt(), nullptr);
  EXPECT_EQ(*train.wrt(), std::vector<int>{1});
  EXPECT_EQ(infer.wrt(), nullptr);
  std::vector<Value> args = TreeArgs(5, 0);
  train.prefetch(args);
  EXPECT_EQ(train.wait_ready(args).state, State::kReady);
  EXPECT_EQ(infer.status(args).state, State::kNone);  // the other mode was not warmed
  EXPECT_EQ(train.without_grad().status(args).state, State::kNone);
  EXPECT_EQ(infer.with_grad({1}).status(args).state, State::kReady);

  ValueAndGrad got = train.value_and_grad(args);
  ValueAndGrad want = Interpreter().CallWithGrad(*engine_->module().snapshot(), "loss", args, {1});
  EXPECT_TRUE(ValueAllClose(got.grads.at(0), want.grads.at(0), 1e-5, 1e-6));
  EXPECT_EQ(train.stats().calls_native, 1);
  EXPECT_THROW(train.call(args), std::logic_error);
  EXPECT_THROW(infer.value_and_grad(args), std::logic_error);
  try {
    infer.with_grad({1, 2});
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "wrt: @loss takes 2 arguments; there is no argument 2");
  }
  grad_options.wrt = std::vector<int>{-1};
  EXPECT_THROW(engine_->entry("loss", grad_options), std::invalid_argument);
}

TEST_F(EngineTest, BadArgumentsFailAsInTheInterpreterAndAreNeverCompiled) {
  Start(Options(Policy::Sync()));
  Entry scale = engine_->entry("scale");
  std::vector<Value> bad = {Value(Tensor::FromVector<int64_t>({2}, {1, 2})), Value(Tensor::Scalar(2))};
  EXPECT_THROW(scale.call(bad), EvalError);
  CodeStatus s = scale.status(bad);
  EXPECT_EQ(s.state, State::kFailed);
  EXPECT_EQ(s.reason.rfind("arguments: @scale: argument 0 (%x): expected", 0), 0u) << s.reason;
  EXPECT_THROW(scale.call(bad), EvalError);
}

TEST(EngineOptionsCheck, AWorkerCountOutOfRangeIsRefusedAtTheStart) {
  for (int workers : {-1, kMaxWorkers + 1, 100000}) {
    EngineOptions o = Options(Policy::Eager(), [&](EngineOptions& e) { e.workers = workers; });
    try {
      Engine engine(o);
      ADD_FAILURE() << workers << " workers accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_EQ(std::string(e.what()), "EngineOptions::workers is " + std::to_string(workers) +
                                           "; it must be 0 (cores - 1) to " + std::to_string(kMaxWorkers));
    }
  }
}

// Destroying an engine cancels the jobs still queued and waits only for the
// one a worker is running. The worker is held in its compile hook until the
// four queued jobs have been cancelled: an engine that ran them instead would
// never report the cancels, and the test fails (after Eventually's bound).
TEST(EngineShutdown, QueuedJobsAreCancelledAndOnlyTheRunningOneFinishes) {
  auto events = std::make_shared<RecordingSink>();
  Gate gate;
  std::atomic<int> started{0};
  EngineOptions options = Options(Policy::Eager(), [&](EngineOptions& o) {
    o.events = events;
    o.before_compile = [&started, opened = gate.opened()](const CompileInfo&) {
      started++;
      opened.wait();
    };
  });
  auto engine = std::make_unique<Engine>(options);
  engine->module().AddSource(kProgram, "program.pj");
  Entry loss = engine->entry("loss");
  Rng rng(1);
  Value emb = RandomMatrix(rng, 10, 4);
  auto tree_args = [&](int shape) {
    return std::vector<Value>{MakeTree(*engine->module().snapshot(), 2 + shape, shape, 10), emb};
  };
  loss.prefetch(tree_args(0));
  ASSERT_TRUE(Eventually([&] { return started > 0; }));
  for (int shape = 1; shape <= 4; ++shape) loss.prefetch(tree_args(shape));
  ASSERT_EQ(engine->stats().queued, 4u);

  std::thread destroyer([&] { engine.reset(); });
  EXPECT_TRUE(Eventually([&] { return events->Count(EventKind::kCancel) == 4; }));
  gate.Open();
  destroyer.join();

  // The engine's tasks have all returned: no job can start any more.
  EXPECT_EQ(started, 1);
  for (const Event& e : events->Of(EventKind::kCancel)) EXPECT_EQ(e.Text("reason"), "the engine shut down");
  EXPECT_EQ(events->Count(EventKind::kSwap) + events->Count(EventKind::kRefused) +
                events->Count(EventKind::kFailed),
            1);  // the running job's own end
  EXPECT_EQ(events->events().back().kind, EventKind::kStop);
}

// Engines made and dropped at once, with two workers racing to take their
// prefetched job: every job queued ends exactly once (run to its end or
// cancelled) before the engine's last event.
TEST(EngineShutdown, EveryQueuedJobEndsOnceBeforeTheEngineStops) {
  for (int i = 0; i < 20; ++i) {
    auto events = std::make_shared<RecordingSink>();
    {
      EngineOptions options = Options(Policy::Eager(), [&](EngineOptions& o) {
        o.workers = 2;
        o.events = events;
      });
      Engine engine(options);
      engine.module().AddSource(kProgram, "program.pj");
      Rng rng(1);
      engine.entry("loss").prefetch({MakeTree(*engine.module().snapshot(), 3, i, 10), RandomMatrix(rng, 10, 4)});
    }
    std::vector<Event> all = events->events();
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(all.back().kind, EventKind::kStop) << "engine " << i;
    std::multiset<std::string> queued, ended;
    for (const Event& e : all) {
      if (e.kind == EventKind::kEnqueue) queued.insert(e.Text("job"));
      if (e.kind == EventKind::kSwap || e.kind == EventKind::kRefused || e.kind == EventKind::kFailed ||
          e.kind == EventKind::kCancel) {
        ended.insert(e.Text("job"));
      }
    }
    EXPECT_EQ(queued.size(), 1u) << "engine " << i;
    EXPECT_EQ(ended, queued) << "engine " << i;
  }
}

TEST(Policy, ParsesEachPolicyAndRefusesOthersClearly) {
  EXPECT_EQ(Policy::Parse("eager"), Policy::Eager());
  EXPECT_EQ(Policy::Parse("interpreter"), Policy::Interpreter());
  EXPECT_EQ(Policy::Parse("sync"), Policy::Sync());
  EXPECT_EQ(Policy::Parse("hot:25"), Policy::Hot(25));
  for (const char* text : {"eager", "hot:1", "hot:1000", "interpreter", "sync"}) {
    EXPECT_EQ(Policy::Parse(text).ToString(), text);
  }
  auto message = [](const char* text) {
    try {
      Policy::Parse(text);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(
      message("egaer"),
      "unknown policy 'egaer' (did you mean 'eager'?); expected eager, hot:N (N >= 1), interpreter or sync");
  EXPECT_EQ(message("jit"), "unknown policy 'jit'; expected eager, hot:N (N >= 1), interpreter or sync");
  EXPECT_EQ(message("hot:0"), "bad policy 'hot:0': N in hot:N must be a whole number >= 1");
  EXPECT_EQ(message("hot:"), "bad policy 'hot:': N in hot:N must be a whole number >= 1");
  EXPECT_EQ(message("hot:3x"), "bad policy 'hot:3x': N in hot:N must be a whole number >= 1");
  EXPECT_THROW(Policy::Hot(0), std::invalid_argument);
}

TEST(Events, EveryKindHasOneDistinctNameInTheTable) {
  std::set<std::string_view> names;
  for (int i = 0; i < kEventKinds; ++i) {
    EventKind kind = static_cast<EventKind>(i);
    EXPECT_TRUE(names.insert(EventName(kind)).second) << EventName(kind);
    EXPECT_FALSE(EventDoc(kind).empty());
    EventKind parsed;
    ASSERT_TRUE(ParseEventName(EventName(kind), &parsed));
    EXPECT_EQ(parsed, kind);
  }
  EventKind unused;
  EXPECT_FALSE(ParseEventName("swapped", &unused));
  for (const char* name : {"call", "hit", "miss", "enqueue", "prefetch", "pe", "autodiff", "compile", "swap",
                           "failed", "cancel", "evict", "invalidate"}) {
    EXPECT_TRUE(names.count(name)) << name;
  }
}

// With no sink, nothing is built; a sink that wants nothing gets nothing.
TEST(Events, ASinkReceivesOnlyTheKindsItWants) {
  struct SwapsOnly final : EventSink {
    bool Wants(EventKind kind) const override { return kind == EventKind::kSwap; }
    void Emit(const Event& e) override {
      std::lock_guard<std::mutex> lock(mu);
      names.emplace_back(e.name());
    }
    std::mutex mu;
    std::vector<std::string> names;
  };
  auto sink = std::make_shared<SwapsOnly>();
  Engine engine(Options(Policy::Sync(), [&](EngineOptions& o) { o.events = sink; }));
  engine.module().AddSource(kProgram, "program.pj");
  Rng rng(1);
  engine.entry("loss").call({MakeTree(*engine.module().snapshot(), 3, 0, 10), RandomMatrix(rng, 10, 4)});
  std::lock_guard<std::mutex> lock(sink->mu);
  EXPECT_EQ(sink->names, (std::vector<std::string>{"swap"}));
}

// Background compiles yield the CPU to the threads they serve: a worker
// runs its job at EngineOptions::worker_nice, except under policy sync,
// whose caller waits for it. (Raising a thread's priority back needs
// privileges a sandbox may not grant, so TBB's workers may keep the niceness
// of earlier tests' jobs, at most the default 10: hence 19 here.)
TEST_F(EngineTest, WorkersCompileAtALowerPriorityUnlessTheCallerWaits) {
  for (bool sync : {true, false}) {
    std::atomic<int> nice_in_compile{-100};
    EngineOptions options;
    options.generic = false;  // the per-minibatch tiers (fixtures.h)
    options.workers = 1;
    options.worker_nice = 19;
    options.policy = sync ? Policy::Sync() : Policy::Eager();
    options.before_compile = [&](const CompileInfo&) { nice_in_compile = CurrentThreadNice(); };
    options.compile = [](const Residual& r) { return CompileWithResidualInterpreter(r); };
    Start(std::move(options));
    Entry loss = engine_->entry("loss");
    std::vector<Value> args = TreeArgs(4);
    loss.call(args);
    ASSERT_EQ(loss.wait_ready(args).state, State::kReady);
    if (sync) {
      EXPECT_LT(nice_in_compile, 19) << "sync";
    } else {
      EXPECT_EQ(nice_in_compile, 19) << "eager";
    }
  }
}

// EngineOptions::step_threads: a compiled call divides its stages with the
// idle worker, borrows none while a compile job is in flight, and gives the
// same bits either way.
TEST_F(EngineTest, CompiledCallsBorrowTheWorkerOnlyWhileNothingCompiles) {
  std::atomic<bool> compiling{false}, release{false};
  EngineOptions options;
  options.generic = false;  // the per-minibatch tiers (fixtures.h)
  options.workers = 1;
  options.step_threads = 2;
  options.before_compile = [&](const CompileInfo& info) {
    if (info.entry != "scale") return;
    compiling = true;
    while (!release) std::this_thread::sleep_for(1ms);
  };
  Start(std::move(options));
  EXPECT_EQ(engine_->stats().step_threads, 2);
  // A product of 33 MFLOP: its stage is divided (jit/schedule.h).
  Rng rng(5);
  std::vector<Value> args = {RandomMatrix(rng, 256, 256), RandomMatrix(rng, 256, 256)};
  Entry other = engine_->entry("other");
  ASSERT_EQ(other.wait_ready(args).state, State::kReady);
  auto last_threads = [&] { return events_->Of(EventKind::kCall, "other").back().Text("threads"); };
  Value alone = other.call(args);
  const Tensor& y = alone.fields()[0].tensor();
  // The worker is lent: some call (the first may end before it arrives) has two threads.
  EXPECT_TRUE(Eventually([&] {
    Value v = other.call(args);
    EXPECT_EQ(std::memcmp(v.fields()[0].tensor().raw_data(), y.raw_data(), y.nbytes()), 0);
    return last_threads() == "2";
  }));
  // A job in flight: calls run alone, and the same bits.
  Entry scale = engine_->entry("scale");
  std::vector<Value> scale_args = {Value(Tensor::FromVector<float>({2}, {1, 2})), Value(Tensor::ScalarOf(DType::kF32, 3))};
  scale.prefetch(scale_args);
  ASSERT_TRUE(Eventually([&] { return compiling.load(); }));
  for (int i = 0; i < 3; ++i) {
    Value v = other.call(args);
    EXPECT_EQ(last_threads(), "1") << "a call while a job compiles";
    EXPECT_EQ(std::memcmp(v.fields()[0].tensor().raw_data(), y.raw_data(), y.nbytes()), 0);
  }
  release = true;
  ASSERT_EQ(scale.wait_ready(scale_args).state, State::kReady);
}

}  // namespace
}  // namespace pejit
