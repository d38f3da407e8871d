// The code cache: edits drop exactly the specializations that used what
// changed; failures are remembered with their reason and calls stay on the
// interpreter; past the budgets the least recently used code goes, but never
// from under a call that is running it.
#include <gtest/gtest.h>

#include <future>
#include <string>

#include "jit/executable.h"
#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;
using namespace std::chrono_literals;
using State = CodeStatus::State;

class CacheTest : public testing::Test {
 protected:
  void Start(EngineOptions options) {
    events_ = std::make_shared<RecordingSink>();
    if (!options.events) options.events = events_;
    engine_ = std::make_unique<Engine>(std::move(options));
    engine_->module().AddSource(kProgram, "program.pj");
    Rng rng(9);
    emb_ = RandomMatrix(rng, 10, 4);
    x_ = RandomMatrix(rng, 2, 3);
    w_ = RandomMatrix(rng, 3, 2);
  }
  std::vector<Value> TreeArgs(int leaves, int shape = 0) {
    return {MakeTree(*engine_->module().snapshot(), leaves, shape, 10), emb_};
  }
  Value Reference(const std::string& entry, const std::vector<Value>& args) {
    return Interpreter().Call(*engine_->module().snapshot(), entry, args);
  }

  std::shared_ptr<RecordingSink> events_;
  std::unique_ptr<Engine> engine_;
  Value emb_, x_, w_;
};

// Replacing @helper, which @loss uses and @other does not, drops @loss's
// slots (value and grad) and keeps @other's.
TEST_F(CacheTest, ReplacingAHelperDropsOnlyTheSlotsOfEntriesThatUseIt) {
  Start(Options(Policy::Eager()));
  Entry loss = engine_->entry("loss"), other = engine_->entry("other");
  std::vector<Value> largs = TreeArgs(4), oargs = {x_, w_};
  ASSERT_TRUE(loss.wait_ready(largs).ready());
  ASSERT_TRUE(loss.with_grad({1}).wait_ready(largs).ready());
  ASSERT_TRUE(other.wait_ready(oargs).ready());
  Value before = loss.call(largs);
  EXPECT_EQ(engine_->stats().slots, 3u);

  engine_->module().AddSource(kHelperChanged, "edit.pj", /*replace_existing=*/true);

  EXPECT_EQ(loss.stats().invalidated, 2);
  EXPECT_EQ(other.stats().invalidated, 0);
  EXPECT_EQ(loss.status(largs).state, State::kNone);
  EXPECT_EQ(other.status(oargs).state, State::kReady);
  std::vector<Event> inv = events_->Of(EventKind::kInvalidate);
  ASSERT_EQ(inv.size(), 1u);
  EXPECT_EQ(inv[0].entry, "loss");
  EXPECT_EQ(inv[0].Text("definitions"), "@helper");
  EXPECT_EQ(inv[0].Text("slots"), "2");

  // @other keeps running its compiled code.
  int64_t other_compiled = other.stats().calls_compiled();
  EXPECT_TRUE(ValueAllClose(other.call(oargs), Reference("other", oargs), 1e-6));
  EXPECT_EQ(other.stats().calls_compiled(), other_compiled + 1);

  // @loss runs the new definition at once, in the interpreter...
  int64_t interpreted = loss.stats().calls_interpreter;
  Value after = loss.call(largs);
  EXPECT_EQ(loss.stats().calls_interpreter, interpreted + 1);
  EXPECT_TRUE(ValueEqual(after, Reference("loss", largs)));
  EXPECT_FALSE(ValueAllClose(after, before));
  // ...and is specialized again in the background.
  ASSERT_TRUE(loss.wait_ready(largs).ready());
  EXPECT_TRUE(ValueAllClose(loss.call(largs), after, 1e-6));
  EXPECT_EQ(loss.stats().compiled, 3);
}

TEST_F(CacheTest, AnEditThatChangesNothingALoadUsesKeepsItsSlots) {
  Start(Options(Policy::Eager()));
  Entry loss = engine_->entry("loss");
  std::vector<Value> args = TreeArgs(3);
  ASSERT_TRUE(loss.wait_ready(args).ready());
  engine_->module().AddSource("def @unrelated(%x: Tensor[(), f32]) -> Tensor[(), f32] { %x }", "more.pj");
  EXPECT_EQ(loss.status(args).state, State::kReady);
  EXPECT_EQ(loss.stats().invalidated, 0);
}

// A compile that throws fails its slot with the reason; calls keep
// working in the interpreter with the same results; the signature is not
// compiled again until the module changes.
TEST_F(CacheTest, AFailingCompileIsRememberedWithItsReasonAndNotRetried) {
  std::atomic<int> compiles{0};
  Start(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.compile = [&](const Residual&) -> ExecutablePtr {
      compiles++;
      throw JitFailure("no kernel for tanh (test)");
    };
  }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> args = TreeArgs(4);
  CodeStatus s = loss.wait_ready(args);
  ASSERT_EQ(s.state, State::kFailed);
  EXPECT_EQ(s.reason, "compile: no kernel for tanh (test)");
  // A JitFailure declines the program: refused, not failed.
  std::vector<Event> refused = events_->Of(EventKind::kRefused, "loss");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].Text("reason"), "compile: no kernel for tanh (test)");
  EXPECT_EQ(events_->Count(EventKind::kFailed), 0);

  for (int i = 0; i < 5; ++i) EXPECT_TRUE(ValueEqual(loss.call(args), Reference("loss", args)));
  EXPECT_EQ(loss.wait_ready(args).state, State::kFailed);
  EXPECT_EQ(compiles, 1);
  EntryStats st = loss.stats();
  EXPECT_EQ(st.refused, 1);
  EXPECT_EQ(st.failed, 0);
  EXPECT_EQ(st.calls_interpreter, 5);
  EXPECT_EQ(st.calls_compiled(), 0);

  // A new definition is a new chance.
  engine_->module().AddSource(kHelperAgain, "edit.pj", /*replace_existing=*/true);
  loss.call(args);
  EXPECT_EQ(loss.wait_ready(args).state, State::kFailed);
  EXPECT_EQ(compiles, 2);
}

TEST_F(CacheTest, EachStageThatRefusesSaysWhy) {
  Start(Options(Policy::Sync()));
  auto reason = [](Engine& engine, const std::string& entry, const std::vector<Value>& args) {
    Entry e = engine.entry(entry);
    e.call(args);  // runs, in the interpreter
    return e.status(args).reason;
  };
  EXPECT_EQ(
      reason(*engine_, "wrap", {Value(Tensor::FromVector<float>({2}, {1, 2}))}),
      "result: @wrap returns List[Tensor[(2,), f32]]; only results of tensors nested in tuples are compiled");

  Engine small(Options(Policy::Sync(), [](EngineOptions& o) { o.pe.max_residual_ops = 3; }));
  small.module().AddSource(kProgram, "program.pj");
  EXPECT_EQ(reason(small, "loss", {MakeTree(*small.module().snapshot(), 5, 0, 10), emb_}),
            "pe: residual over 3 operators (PeOptions::max_residual_ops)");
}

TEST_F(CacheTest, ACompileHookReturningNothingFailsTheSlot) {
  Start(Options(Policy::Sync(),
                [](EngineOptions& o) { o.compile = [](const Residual&) { return ExecutablePtr(); }; }));
  Entry other = engine_->entry("other");
  EXPECT_TRUE(ValueEqual(other.call({x_, w_}), Reference("other", {x_, w_})));
  EXPECT_EQ(other.status({x_, w_}).reason, "compile: the compile hook returned no executable");
}

// Compiled code that throws when it runs: that call and the later ones get
// the interpreter's answer, and the slot is failed, not compiled again.
TEST_F(CacheTest, CodeThatThrowsAtRunTimeFallsBackToTheInterpreter) {
  std::atomic<int> compiles{0};
  Start(Options(Policy::Sync(), [&](EngineOptions& o) {
    o.compile = [&](const Residual& r) -> ExecutablePtr {
      compiles++;
      return std::make_shared<SizedExecutable>(CompileWithResidualInterpreter(r), 100,
                                               [] { throw std::runtime_error("segfault averted (test)"); });
    };
  }));
  Entry other = engine_->entry("other");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ValueEqual(other.call({x_, w_}), Reference("other", {x_, w_})));
  EXPECT_EQ(other.status({x_, w_}).reason, "run: segfault averted (test)");
  EntryStats s = other.stats();
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.calls_interpreter, 3);
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(engine_->stats().code_bytes, 0u);
}

// Past the byte budget the least recently used specialization goes.
TEST_F(CacheTest, PastTheByteBudgetTheLeastRecentlyUsedIsEvicted) {
  Start(Options(Policy::Eager(), [](EngineOptions& o) {
    o.code_cache_bytes = 2500;
    o.compile = [](const Residual& r) {
      return std::make_shared<SizedExecutable>(CompileWithResidualInterpreter(r), 1000);
    };
  }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> a = TreeArgs(2), b = TreeArgs(3), c = TreeArgs(4);
  ASSERT_TRUE(loss.wait_ready(a).ready());
  ASSERT_TRUE(loss.wait_ready(b).ready());
  EXPECT_EQ(engine_->stats().code_bytes, 2000u);
  loss.call(a);  // a is now more recent than b
  ASSERT_TRUE(loss.wait_ready(c).ready());
  EXPECT_EQ(loss.status(a).state, State::kReady);
  EXPECT_EQ(loss.status(b).state, State::kNone);
  EXPECT_EQ(loss.status(c).state, State::kReady);
  EXPECT_EQ(engine_->stats().code_bytes, 2000u);
  EXPECT_EQ(loss.stats().evicted, 1);
  std::vector<Event> ev = events_->Of(EventKind::kEvict);
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].Text("reason"), "budget");
  EXPECT_EQ(ev[0].signature, ComputeSignature(b).ShortHash());
  EXPECT_EQ(ev[0].Text("bytes"), "1000");
  // An evicted signature is specialized again when it comes back.
  EXPECT_TRUE(ValueAllClose(loss.call(b), Reference("loss", b), 1e-6));
  EXPECT_TRUE(loss.wait_ready(b).ready());
}

TEST_F(CacheTest, EachEntryKeepsAtMostItsMaximumOfSpecializations) {
  Start(Options(Policy::Eager(), [](EngineOptions& o) { o.max_specializations_per_entry = 2; }));
  Entry loss = engine_->entry("loss"), other = engine_->entry("other");
  ASSERT_TRUE(other.wait_ready({x_, w_}).ready());
  for (int n = 2; n < 6; ++n) ASSERT_TRUE(loss.wait_ready(TreeArgs(n)).ready());
  EXPECT_EQ(loss.stats().evicted, 2);
  EXPECT_EQ(loss.status(TreeArgs(2)).state, State::kNone);
  EXPECT_EQ(loss.status(TreeArgs(5)).state, State::kReady);
  EXPECT_EQ(other.status({x_, w_}).state, State::kReady);  // other entries' are not theirs to evict
  EXPECT_EQ(events_->Of(EventKind::kEvict)[0].Text("reason"), "entry-max");
}

// An evicted Executable lives on while a call is still running it.
TEST_F(CacheTest, EvictionNeverFreesCodeACallIsRunning) {
  auto alive = std::make_shared<std::atomic<int>>(0);
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> block_next{false};
  Start(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.max_specializations_per_entry = 1;
    o.compile = [&](const Residual& r) {
      return std::make_shared<SizedExecutable>(
          CompileWithResidualInterpreter(r), 100,
          [&] {
            if (block_next.exchange(false)) {
              entered.set_value();
              released.wait();
            }
          },
          alive);
    };
  }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> a = TreeArgs(2), b = TreeArgs(3);
  ASSERT_TRUE(loss.wait_ready(a).ready());
  EXPECT_EQ(*alive, 1);
  block_next = true;
  std::future<Value> running = std::async(std::launch::async, [&] { return loss.call(a); });
  entered.get_future().wait();  // the call is inside a's code

  ASSERT_TRUE(loss.wait_ready(b).ready());  // evicts a (one per entry)
  EXPECT_EQ(loss.status(a).state, State::kNone);
  EXPECT_EQ(*alive, 2);  // a's code is still alive: the call holds it
  release.set_value();
  EXPECT_TRUE(ValueAllClose(running.get(), Reference("loss", a), 1e-6));
  EXPECT_EQ(*alive, 1);  // freed when the call let go
}

}  // namespace
}  // namespace pejit
