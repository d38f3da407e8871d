// Editing the module while it runs (issue 13): an edit drops exactly the
// specializations that used a changed definition and nothing else is
// compiled again; a call that began before a `Replace` finishes with the old
// code, and every call that begins after `Replace` returned runs the new
// definition; edits the module rejects change neither the module nor any
// compiled code; and the code an edit invalidated lends its fused kernels to
// the re-specialization.
#include <gtest/gtest.h>

#include <future>
#include <set>
#include <string>
#include <thread>

#include "scheduler/trace_stats.h"
#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;
using State = CodeStatus::State;

std::set<std::string> EntriesOf(const std::vector<Event>& events) {
  std::set<std::string> out;
  for (const Event& e : events) out.insert(e.entry);
  return out;
}

class LiveEditTest : public testing::Test {
 protected:
  void Start(EngineOptions options) {
    events_ = std::make_shared<RecordingSink>();
    options.events = events_;
    engine_ = std::make_unique<Engine>(std::move(options));
    engine_->module().AddSource(kProgram, "program.pj");
    Rng rng(5);
    emb_ = RandomMatrix(rng, 10, 4);
    x_ = RandomMatrix(rng, 2, 3);
    w_ = RandomMatrix(rng, 3, 2);
    v_ = Value(RandomUniform(rng, {6}, -1, 1));
  }
  Value Reference(const std::string& entry, const std::vector<Value>& args) {
    return Interpreter().Call(*engine_->module().snapshot(), entry, args);
  }
  Value K(float k) { return Value(Tensor::FromVector<float>({}, {k})); }

  std::shared_ptr<RecordingSink> events_;
  std::unique_ptr<Engine> engine_;
  Value emb_, x_, w_, v_;
};

// @loss reaches @helper through @encode; @other and @scale do not use it.
TEST_F(LiveEditTest, AnEditInvalidatesExactlyTheSpecializationsThatUsedAChangedDefinition) {
  Start(Options(Policy::Eager(), [](EngineOptions& o) { o.compile = CompileWithResidualInterpreter; }));
  Entry loss = engine_->entry("loss"), other = engine_->entry("other"), scale = engine_->entry("scale");
  std::vector<Value> largs = {MakeTree(*engine_->module().snapshot(), 4, 0, 10), emb_};
  std::vector<Value> oargs = {x_, w_}, sargs = {v_, K(2)};
  ASSERT_TRUE(loss.wait_ready(largs).ready());
  ASSERT_TRUE(loss.with_grad({1}).wait_ready(largs).ready());
  ASSERT_TRUE(other.wait_ready(oargs).ready());
  ASSERT_TRUE(scale.wait_ready(sargs).ready());
  events_->Clear();

  engine_->module().AddSource(kHelperChanged, "edit.pj", /*replace_existing=*/true);

  std::vector<Event> edits = events_->Of(EventKind::kEdit);
  ASSERT_EQ(edits.size(), 1u);
  EXPECT_EQ(edits[0].Text("kind"), "replace");
  EXPECT_EQ(edits[0].Text("definitions"), "@helper");
  EXPECT_EQ(edits[0].Text("affected"), "@encode, @helper, @loss");
  EXPECT_EQ(edits[0].Text("slots"), "2");
  EXPECT_EQ(EntriesOf(events_->Of(EventKind::kInvalidate)), std::set<std::string>{"loss"});
  EXPECT_EQ(loss.status(largs).state, State::kNone);
  EXPECT_EQ(loss.with_grad({1}).status(largs).state, State::kNone);

  // The others keep their code: their calls are compiled, and nothing is
  // compiled for them again.
  int64_t other_compiled = other.stats().calls_residual_interpreter, scale_compiled = scale.stats().calls_residual_interpreter;
  EXPECT_TRUE(ValueAllClose(other.call(oargs), Reference("other", oargs), 1e-6));
  EXPECT_TRUE(ValueAllClose(scale.call(sargs), Reference("scale", sargs), 1e-6));
  EXPECT_EQ(other.stats().calls_residual_interpreter, other_compiled + 1);
  EXPECT_EQ(scale.stats().calls_residual_interpreter, scale_compiled + 1);
  ASSERT_TRUE(loss.wait_ready(largs).ready());
  ASSERT_TRUE(loss.with_grad({1}).wait_ready(largs).ready());
  EXPECT_EQ(EntriesOf(events_->Of(EventKind::kCompile)), std::set<std::string>{"loss"});
  EXPECT_EQ(events_->Count(EventKind::kCompile, "loss"), 2);
  EXPECT_TRUE(ValueAllClose(loss.call(largs), Reference("loss", largs), 1e-6));

  // Adding a definition, and removing one nothing calls, invalidate nothing.
  events_->Clear();
  engine_->module().AddSource("def @unused(%x: Tensor[(), f32]) -> Tensor[(), f32] { neg(%x) }", "more.pj");
  engine_->module().Remove("unused");
  std::vector<Event> quiet = events_->Of(EventKind::kEdit);
  ASSERT_EQ(quiet.size(), 2u);
  EXPECT_EQ(quiet[0].Text("kind"), "add");
  EXPECT_EQ(quiet[1].Text("kind"), "remove");
  EXPECT_EQ(quiet[0].Text("slots"), "0");
  EXPECT_EQ(quiet[1].Text("slots"), "0");
  EXPECT_EQ(events_->Count(EventKind::kInvalidate), 0);
  EXPECT_EQ(loss.status(largs).state, State::kReady);
  EXPECT_EQ(other.status(oargs).state, State::kReady);
}

// A call inside the old compiled code when `Replace` runs finishes with it;
// a call that starts once `Replace` has returned runs the new definition
// (in the interpreter, until its code is ready), and so does every later one.
TEST_F(LiveEditTest, ACallInsideTheOldCodeFinishesWithItAndCallsAfterReplaceSeeTheNewOne) {
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> block_next{false};
  Start(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.compile = [&](const Residual& r) {
      return std::make_shared<SizedExecutable>(CompileWithResidualInterpreter(r), 100, [&] {
        if (block_next.exchange(false)) {
          entered.set_value();
          released.wait();
        }
      });
    };
  }));
  Entry scale = engine_->entry("scale");
  std::vector<Value> args = {v_, K(3)};
  Value old_result = Reference("scale", args);
  ASSERT_TRUE(scale.wait_ready(args).ready());
  block_next = true;
  std::future<Value> running = std::async(std::launch::async, [&] { return scale.call(args); });
  entered.get_future().wait();  // inside the old code

  engine_->module().AddSource("def @scale(%x: Tensor[(?,), f32], %k: Tensor[(), f32]) -> Tensor[(?,), f32] "
                              "{ add(mul(%x, %k), 1f32) }",
                              "edit.pj", /*replace_existing=*/true);
  Value new_result = Reference("scale", args);
  ASSERT_FALSE(ValueAllClose(new_result, old_result));
  EXPECT_TRUE(ValueEqual(scale.call(args), new_result));  // Replace has returned: the new definition

  release.set_value();
  EXPECT_TRUE(ValueAllClose(running.get(), old_result, 1e-6));  // the old call kept the old code
  ASSERT_TRUE(scale.wait_ready(args).ready());
  EXPECT_TRUE(ValueAllClose(scale.call(args), new_result, 1e-6));
}

// Several threads call @scale while this one replaces it with ×1, ×2, ...:
// a call sees a whole definition, never an older one than the last whose
// Replace had returned when it started.
TEST_F(LiveEditTest, EveryCallRunsADefinitionAtLeastAsNewAsTheLastReplaceThatReturnedBeforeIt) {
  Start(Options(Policy::Eager(), [](EngineOptions& o) {
    o.workers = 2;
    o.compile = CompileWithResidualInterpreter;
  }));
  Entry scale = engine_->entry("scale");
  auto definition = [](int k) {
    return "def @scale(%x: Tensor[(?,), f32], %k: Tensor[(), f32]) -> Tensor[(?,), f32] { mul(%x, " +
           std::to_string(k) + "f32) }";
  };
  engine_->module().AddSource(definition(1), "v1.pj", true);
  std::atomic<int> published{1};
  std::atomic<bool> done{false};
  std::atomic<int> calls{0}, too_old{0}, unknown{0};
  const Value ones(Tensor::FromVector<float>({3}, {1, 1, 1}));
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      while (!done.load()) {
        int at_least = published.load();
        Tensor out = scale.call({ones, K(0)}).tensor();
        int k = static_cast<int>(out.data<float>()[0]);
        if (static_cast<float>(k) != out.data<float>()[0] || out.data<float>()[2] != out.data<float>()[0]) ++unknown;
        if (k < at_least) ++too_old;
        ++calls;
      }
    });
  }
  for (int k = 2; k <= 30; ++k) {
    engine_->module().AddSource(definition(k), "v" + std::to_string(k) + ".pj", true);
    published.store(k);
    int seen = calls.load();
    ASSERT_TRUE(Eventually([&] { return calls.load() >= seen + 6; }));
  }
  // Whether a compile finished between two edits depends on timing; after
  // the last edit, wait for its code, so that the calls after it run compiled
  // (of 6 calls finished, at most 3 were already running on the interpreter).
  ASSERT_TRUE(scale.wait_ready({ones, K(0)}).ready());
  int seen = calls.load();
  ASSERT_TRUE(Eventually([&] { return calls.load() >= seen + 6; }));
  done.store(true);
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(too_old.load(), 0);
  EXPECT_EQ(unknown.load(), 0);
  EXPECT_GT(scale.stats().calls_residual_interpreter, 0);  // both tiers took part
  EXPECT_GT(scale.stats().calls_interpreter, 0);
}

// A replacement that does not type-check, one that breaks a caller, and
// removing a definition still called: each is refused with its reason, and
// the module, the code cache and the entries' code stay as they were.
TEST_F(LiveEditTest, RejectedEditsLeaveTheModuleAndTheCompiledCodeUnchanged) {
  Start(Options(Policy::Eager(), [](EngineOptions& o) { o.compile = CompileWithResidualInterpreter; }));
  Entry loss = engine_->entry("loss");
  std::vector<Value> largs = {MakeTree(*engine_->module().snapshot(), 3, 1, 10), emb_};
  ASSERT_TRUE(loss.wait_ready(largs).ready());
  Snapshot before = engine_->module().snapshot();
  std::string text = before->Print();
  EngineStats stats = engine_->stats();
  events_->Clear();

  auto expect_refused = [&](const std::function<void()>& edit, const std::string& message) {
    try {
      edit();
      ADD_FAILURE() << "accepted an edit that should fail with: " << message;
    } catch (const IrError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    EXPECT_EQ(engine_->module().snapshot(), before);
    EXPECT_EQ(engine_->module().snapshot()->Print(), text);
    EXPECT_EQ(loss.status(largs).state, State::kReady);
    EXPECT_EQ(engine_->stats().slots, stats.slots);
    EXPECT_EQ(engine_->stats().code_bytes, stats.code_bytes);
  };
  expect_refused(
      [&] {
        engine_->module().AddSource("def @helper(%x: Tensor[(1, ?), f32]) -> Tensor[(1, ?), f32] { tanh(%y) }",
                                    "typo.pj", true);
      },
      "%y");
  expect_refused(
      [&] {
        engine_->module().AddSource("def @helper(%x: Tensor[(1, ?), f32]) -> Tensor[(), f32] { sum(%x) }",
                                    "scalar.pj", true);
      },
      "this change breaks @encode");
  expect_refused([&] { engine_->module().Remove("helper"); }, "cannot remove @helper: still called by @encode");
  expect_refused([&] { engine_->module().Remove("hepler"); }, "did you mean '@helper'");

  EXPECT_EQ(events_->Count(EventKind::kEdit), 0);
  EXPECT_EQ(events_->Count(EventKind::kInvalidate), 0);
  EXPECT_EQ(loss.stats().invalidated, 0);
  int64_t compiled = loss.stats().calls_residual_interpreter;
  EXPECT_TRUE(ValueAllClose(loss.call(largs), Reference("loss", largs), 1e-6));
  EXPECT_EQ(loss.stats().calls_residual_interpreter, compiled + 1);
}

// With LLVM: @g's replacement changes one fused kernel of @f; the other is
// taken from the invalidated code, which the engine keeps for that (and never
// runs). Without retention nothing is left to reuse.
constexpr char kKernels[] = R"(
def @g(%y: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] { sigmoid(mul(%y, 2f32)) }
def @f(%x: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] { @g(matmul(tanh(add(%x, 1f32)), %w)) }
)";
constexpr char kNewG[] = R"(
def @g(%y: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] { tanh(mul(%y, 3f32)) }
)";

int64_t ReusedKernels(const Event& codegen) { return std::stoll(codegen.Text("reused_kernels")); }

TEST(LiveEditKernels, InvalidatedCodeLendsItsUnchangedKernelsToTheRespecialization) {
  for (bool retain : {true, false}) {
    SCOPED_TRACE(retain ? "retained" : "not retained");
    auto events = std::make_shared<RecordingSink>();
    Engine engine(Options(Policy::Eager(), [&](EngineOptions& o) {
      o.events = events;
      o.retained_code_bytes = retain ? size_t{1} << 20 : 0;
    }));
    engine.module().AddSource(kKernels, "kernels.pj");
    Entry f = engine.entry("f");
    Rng rng(3);
    std::vector<Value> args = {RandomMatrix(rng, 4, 5), RandomMatrix(rng, 5, 3)};
    ASSERT_TRUE(f.wait_ready(args).ready());
    std::vector<Event> first = events->Of(EventKind::kCodegen, "f");
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(ReusedKernels(first[0]), 0);
    EXPECT_EQ(first[0].Text("distinct_kernels"), "2");

    engine.module().AddSource(kNewG, "g.pj", /*replace_existing=*/true);
    EXPECT_EQ(engine.stats().retained_bytes > 0, retain);
    EXPECT_EQ(events->Of(EventKind::kEdit)[1].Text("retained"), retain ? "1" : "0");
    ASSERT_TRUE(f.wait_ready(args).ready());
    std::vector<Event> again = events->Of(EventKind::kCodegen, "f");
    ASSERT_EQ(again.size(), 2u);
    EXPECT_EQ(again[1].Text("distinct_kernels"), "2");
    EXPECT_EQ(ReusedKernels(again[1]), retain ? 1 : 0);  // tanh(x + 1) is the same kernel
    // The kept code is never run: the call gets the new @g.
    Value expected = Interpreter().Call(*engine.module().snapshot(), "f", args);
    EXPECT_TRUE(ValueAllClose(f.call(args), expected, 1e-5));
    EXPECT_GT(f.stats().calls_native, 0);
  }
}

// The statistics (and `pejit trace summary`) count edits by kind, and as
// recompiled only what jobs queued after an entry's code was invalidated
// compiled: a job that was already running when the edit came is not one.
TEST(LiveEditStatistics, EditsAndRecompilesAreCountedFromTheEvents) {
  auto event = [](EventKind kind, std::string entry, std::vector<std::pair<std::string, FieldValue>> fields) {
    Event e{};
    e.kind = kind;
    e.entry = std::move(entry);
    e.fields = std::move(fields);
    return e;
  };
  TraceStats stats;
  stats.Add(event(EventKind::kEdit, "", {{"kind", std::string("add")}, {"slots", int64_t{0}}, {"retained", int64_t{0}}}));
  stats.Add(event(EventKind::kEnqueue, "loss", {{"job", int64_t{1}}}));
  stats.Add(event(EventKind::kEdit, "", {{"kind", std::string("replace")}, {"slots", int64_t{1}}, {"retained", int64_t{1}}}));
  stats.Add(event(EventKind::kInvalidate, "loss", {{"definitions", std::string("@head")}, {"slots", int64_t{1}}}));
  stats.Add(event(EventKind::kSwap, "loss", {{"job", int64_t{1}}}));  // queued before the edit
  stats.Add(event(EventKind::kEnqueue, "loss", {{"job", int64_t{2}}}));
  stats.Add(event(EventKind::kSwap, "loss", {{"job", int64_t{2}}}));
  stats.Add(event(EventKind::kEdit, "", {{"kind", std::string("remove")}, {"slots", int64_t{0}}, {"retained", int64_t{0}}}));

  EXPECT_EQ(stats.edits(), (std::map<std::string, int64_t>{{"add", 1}, {"remove", 1}, {"replace", 1}}));
  const EntryTotals& loss = stats.entries().at("loss");
  EXPECT_EQ(loss.compiled, 2);
  EXPECT_EQ(loss.recompiled, 1);
  EXPECT_EQ(loss.invalidated, 1);
  std::string text = stats.Render();
  EXPECT_NE(text.find("module edits: 3 (add 1, remove 1, replace 1); 1 specialization invalidated, 1 kept for their "
                      "kernels\n"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace pejit
