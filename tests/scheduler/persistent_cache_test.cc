// The engine and its persistent code cache (EngineOptions::cache_dir): a
// later engine on the same directory runs a signature's first call natively
// from the stored code, with no compile job; an edited definition misses it;
// a damaged entry is refused, removed and recompiled, never run; control
// flow's regions persist; drain()
// leaves every queued signature stored for the next engine.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "jit/pass.h"
#include "scheduler/disk_cache.h"
#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;
using State = CodeStatus::State;
namespace fs = std::filesystem;

class PersistentCacheTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("pejit_cache_" + std::to_string(::getpid()) + "_" +
                                            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // An engine on the cache directory, recording its events in `events_`.
  std::unique_ptr<Engine> Start(Policy policy, const std::function<void(EngineOptions&)>& more = {}) {
    events_ = std::make_shared<RecordingSink>();
    auto engine = std::make_unique<Engine>(Options(policy, [&](EngineOptions& o) {
      o.cache_dir = dir_.string();
      o.events = events_;
      if (more) more(o);
    }));
    engine->module().AddSource(kProgram, "program.pj");
    return engine;
  }
  std::vector<Value> Args(Engine& engine) {
    Rng rng(5);
    return {MakeTree(*engine.module().snapshot(), 4, 0, 10), RandomMatrix(rng, 10, 4)};
  }
  void ExpectTheInterpretersGradient(Engine& engine, const ValueAndGrad& got, const std::vector<Value>& args) {
    ValueAndGrad want = Interpreter().CallWithGrad(*engine.module().snapshot(), "loss", args, {1});
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-5, 1e-6));
    EXPECT_TRUE(ValueAllClose(got.grads.at(0), want.grads.at(0), 1e-4, 1e-6));
  }
  // Fills the cache with @loss's grad-mode specialization of Args.
  // (A worker stores code after publishing it: the engine's end waits for that.)
  void Fill() {
    std::unique_ptr<Engine> first = Start(Policy::Sync());
    std::vector<Value> args = Args(*first);
    first->entry("loss").with_grad({1}).value_and_grad(args);
    ASSERT_EQ(first->entry("loss").with_grad({1}).status(args).state, State::kReady);
    first.reset();
    ASSERT_EQ(events_->Count(EventKind::kCacheStore), 1);
  }

  fs::path dir_;
  std::shared_ptr<RecordingSink> events_;
};

TEST_F(PersistentCacheTest, ALaterEngineRunsTheFirstCallFromTheStoredCodeWithoutACompileJob) {
  Fill();
  std::unique_ptr<Engine> engine = Start(Policy::Eager());
  std::vector<Value> args = Args(*engine);
  Entry loss = engine->entry("loss");
  ExpectTheInterpretersGradient(*engine, loss.with_grad({1}).value_and_grad(args), args);
  EntryStats stats = loss.stats();
  EXPECT_EQ(stats.loaded, 1);
  EXPECT_EQ(stats.calls_native, 1);
  EXPECT_EQ(stats.calls_interpreter, 0);
  EXPECT_EQ(events_->Count(EventKind::kEnqueue), 0);
  ASSERT_EQ(events_->Count(EventKind::kCacheLoad), 1);
  Event load = events_->Of(EventKind::kCacheLoad)[0];
  EXPECT_EQ(load.entry, "loss");
  EXPECT_EQ(loss.with_grad({1}).status(args).tier, "native");
  // Value mode is another specialization: compiled, and stored beside it.
  loss.call(args);
  EXPECT_EQ(events_->Count(EventKind::kCacheLoad), 1);
  ASSERT_TRUE(loss.wait_ready(args).ready());
  engine.reset();
  EXPECT_EQ(events_->Count(EventKind::kCacheStore), 1);
}

TEST_F(PersistentCacheTest, DrainCompilesEveryQueuedSignatureIntoTheCacheForTheNextEngine) {
  // Prefetched signatures a run never called: without drain() the engine's
  // end would cancel what its worker had not reached.
  const int kShapes = 6;
  std::vector<std::vector<Value>> calls;
  {
    std::unique_ptr<Engine> first = Start(Policy::Eager());
    Rng rng(5);
    for (int shape = 0; shape < kShapes; ++shape) {
      calls.push_back({MakeTree(*first->module().snapshot(), 5 + shape, shape, 10), RandomMatrix(rng, 10, 4)});
      first->entry("loss").with_grad({1}).prefetch(calls.back());
    }
    std::vector<int64_t> left;
    first->drain([&](int64_t n) { left.push_back(n); });
    EXPECT_EQ(first->stats().queued, 0u);
    ASSERT_FALSE(left.empty());
    EXPECT_EQ(left.back(), 0);
    for (const auto& args : calls) EXPECT_EQ(first->entry("loss").with_grad({1}).status(args).state, State::kReady);
  }
  EXPECT_EQ(events_->Count(EventKind::kCancel), 0);
  EXPECT_EQ(events_->Count(EventKind::kCacheStore), kShapes);
  std::unique_ptr<Engine> second = Start(Policy::Eager());
  Entry loss = second->entry("loss").with_grad({1});
  for (const auto& args : calls) ExpectTheInterpretersGradient(*second, loss.value_and_grad(args), args);
  EXPECT_EQ(loss.stats().loaded, kShapes);
  EXPECT_EQ(loss.stats().calls_native, kShapes);
  EXPECT_EQ(events_->Count(EventKind::kEnqueue), 0);
}

// A residual with control flow (here a loop the data ends) runs as a driver
// over compiled regions: the regions' code persists, keyed by its text, so a
// later engine partially evaluates again but compiles nothing.
TEST_F(PersistentCacheTest, ControlFlowRegionsAreStoredAndALaterEngineCompilesNone) {
  std::vector<Value> loop = {I(5), Value(Tensor::Scalar(1.5f))};
  auto run_both_modes = [&](Engine& engine) {
    Entry count_down = engine.entry("count_down");
    Snapshot s = engine.module().snapshot();
    EXPECT_TRUE(ValueAllClose(count_down.call(loop), Interpreter().Call(*s, "count_down", loop), 1e-6, 1e-7));
    ValueAndGrad got = count_down.with_grad({1}).value_and_grad(loop);
    ValueAndGrad want = Interpreter().CallWithGrad(*s, "count_down", loop, {1});
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-6, 1e-7));
    EXPECT_TRUE(ValueAllClose(got.grads.at(0), want.grads.at(0), 1e-5, 1e-6));
    EXPECT_EQ(count_down.status(loop).tier, "native");
    EXPECT_EQ(count_down.with_grad({1}).status(loop).tier, "native");
  };
  {
    std::unique_ptr<Engine> first = Start(Policy::Sync());
    run_both_modes(*first);
  }
  // Equal region texts are one entry: the first engine loads its own.
  const int stored = events_->Count(EventKind::kCacheStore);
  const int asked = stored + events_->Count(EventKind::kCacheLoad);
  int regions = 0;
  for (const auto& [key, path] : DiskCache(dir_.string(), EngineOptions{}.cache_dir_bytes).List()) {
    regions += key.entry == "program";  // kept by JitSession::Compile's store, by its text
  }
  EXPECT_GT(regions, 0);
  EXPECT_EQ(regions, stored);  // nothing else of count_down's is native straight-line code

  std::unique_ptr<Engine> second = Start(Policy::Sync());
  run_both_modes(*second);
  EXPECT_EQ(events_->Count(EventKind::kCacheStore), 0);
  EXPECT_EQ(events_->Count(EventKind::kCacheLoad), asked);
}

TEST_F(PersistentCacheTest, AnEditedDefinitionMissesTheStoredCode) {
  Fill();
  std::unique_ptr<Engine> engine = Start(Policy::Sync());
  engine->module().AddSource(kHelperChanged, "edit.pj", /*replace_existing=*/true);
  std::vector<Value> args = Args(*engine);
  ExpectTheInterpretersGradient(*engine, engine->entry("loss").with_grad({1}).value_and_grad(args), args);
  EXPECT_EQ(events_->Count(EventKind::kCacheLoad), 0);
  EXPECT_EQ(engine->entry("loss").stats().compiled, 1);
  engine.reset();  // stores the edited definitions' code
  // An edit that changes no definition's text (the same @helper again) still hits.
  std::unique_ptr<Engine> same = Start(Policy::Sync());
  same->module().AddSource(kHelperChanged, "edit.pj", /*replace_existing=*/true);
  same->module().AddSource(kHelperChanged, "again.pj", /*replace_existing=*/true);
  same->entry("loss").with_grad({1}).value_and_grad(Args(*same));
  EXPECT_EQ(events_->Count(EventKind::kCacheLoad), 1);
}

// Compile options that change the code made are part of the key: code of
// another optimization level or with profiling is not loaded; an instrument,
// which changes nothing made, is not.
TEST_F(PersistentCacheTest, CompileOptionsThatChangeTheCodeMissTheStoredCode) {
  Fill();
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    std::unique_ptr<Engine> engine = Start(Policy::Sync(), [&](EngineOptions& o) {
      if (variant == 0) o.compile_options.opt_level = 1;
      if (variant == 1) o.compile_options.profile = true;
      if (variant == 2) o.compile_options.instrument.after = [](std::string_view, const PassProduct&, double) {};
    });
    std::vector<Value> args = Args(*engine);
    ExpectTheInterpretersGradient(*engine, engine->entry("loss").with_grad({1}).value_and_grad(args), args);
    EXPECT_EQ(events_->Count(EventKind::kCacheLoad), variant == 2 ? 1 : 0);
  }
}

// The generic tier's segments persist under every policy: a later engine
// links every segment an earlier one compiled (under sync, at the call)
// and compiles none.
TEST_F(PersistentCacheTest, GenericSegmentsAreStoredAndALaterEngineCompilesNone) {
  auto generic = [](EngineOptions& o) {
    o.generic = true;
    o.specialize_after_calls = 0;
  };
  int64_t stored = 0;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    std::unique_ptr<Engine> engine = Start(Policy::Sync(), generic);
    std::vector<Value> args = Args(*engine);
    Entry loss = engine->entry("loss");
    ExpectTheInterpretersGradient(*engine, loss.with_grad({1}).value_and_grad(args), args);
    EXPECT_EQ(loss.stats().calls_generic, 1);
    engine.reset();
    if (run == 0) {
      stored = events_->Count(EventKind::kCacheStore);
      EXPECT_GT(stored, 0);
      EXPECT_EQ(events_->Count(EventKind::kCacheLoad), 0);
    } else {
      EXPECT_EQ(events_->Count(EventKind::kCacheStore), 0);
      EXPECT_EQ(events_->Count(EventKind::kCacheLoad), stored);
    }
  }
}

// A warm cache serves a generic call natively from its first run: a
// variant a run makes loads the code an earlier engine stored (on the
// calling thread, in about the time baseline code takes) instead of making
// baseline code and waiting for a worker.
TEST_F(PersistentCacheTest, AWarmCacheServesTheFirstGenericCallNatively) {
  auto generic = [](EngineOptions& o) {
    o.generic = true;
    o.specialize_after_calls = 0;
  };
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run);
    std::unique_ptr<Engine> engine = Start(Policy::Eager(), generic);
    std::vector<Value> args = Args(*engine);
    Entry loss = engine->entry("loss");
    ExpectTheInterpretersGradient(*engine, loss.with_grad({1}).value_and_grad(args), args);
    EXPECT_EQ(loss.stats().calls_generic, 1);
    // Cold: baseline code, the native code compiled by a worker (and stored).
    EXPECT_EQ(loss.stats().calls_generic_native, run == 0 ? 0 : 1);
    engine->drain();
    EXPECT_EQ(events_->Count(EventKind::kCacheLoad) > 0, run == 1);
  }
}

TEST_F(PersistentCacheTest, ADamagedEntryIsRefusedRemovedAndRecompiled) {
  Fill();
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().extension() != ".pjc") continue;  // the entries, not the key
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(e.path()) / 2));
    f.put('\x5a');
  }
  std::unique_ptr<Engine> engine = Start(Policy::Sync());
  std::vector<Value> args = Args(*engine);
  ExpectTheInterpretersGradient(*engine, engine->entry("loss").with_grad({1}).value_and_grad(args), args);
  ASSERT_EQ(events_->Count(EventKind::kCacheRefused), 1);
  const std::string reason = events_->Of(EventKind::kCacheRefused)[0].Text("reason");
  EXPECT_NE(reason.find("not authenticated"), std::string::npos) << reason;
  EXPECT_EQ(events_->Count(EventKind::kCacheLoad), 0);
  EXPECT_EQ(engine->entry("loss").stats().compiled, 1);
  engine.reset();
  EXPECT_EQ(events_->Count(EventKind::kCacheStore), 1);  // written again, whole
}

TEST(PersistentCache, ADirectoryThatCannotBeMadeIsAnErrorAtTheStart) {
  EngineOptions o = Options(Policy::Eager());
  o.cache_dir = "/proc/pejit-cannot-be-here";
  EXPECT_THROW(Engine{o}, std::runtime_error);
}

}  // namespace
}  // namespace pejit
