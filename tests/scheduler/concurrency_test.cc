// Many threads calling entries while another thread replaces
// definitions and a tiny code cache evicts all the time: every call returns
// what the interpreter returns, and (under --config=tsan and --config=asan)
// nothing races, leaks or is freed while in use.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;
using namespace std::chrono_literals;

// @helper as first written (kProgram), for the editor to alternate with kHelperAgain.
constexpr char kHelperFirst[] = R"(
def @helper(%x: Tensor[(1, ?), f32]) -> Tensor[(1, ?), f32] { tanh(%x) }
)";

struct Case {
  std::vector<Value> args;
  Value value;
  ValueAndGrad grad;  // with respect to argument 1
};

TEST(EngineConcurrency, CallsEditsAndEvictionsAtOnceGiveTheInterpretersAnswers) {
  auto events = std::make_shared<RecordingSink>();
  EngineOptions options = Options(Policy::Eager(), [&](EngineOptions& o) {
    o.workers = 2;
    // Compiling through the residual interpreter takes milliseconds: this test
    // is about the engine's concurrency (LLVM's has tests/jit).
    o.compile = CompileWithResidualInterpreter;
    o.code_cache_bytes = 1;  // every swap evicts all other ready code
    o.max_specializations_per_entry = 2;
    o.events = events;
  });
  Engine engine(options);
  engine.module().AddSource(kProgram, "program.pj");
  Entry loss = engine.entry("loss"), other = engine.entry("other");

  Rng rng(21);
  Value emb = RandomMatrix(rng, 10, 4);
  Interpreter interpreter;
  Snapshot snap = engine.module().snapshot();
  std::vector<Case> trees, matrices;
  for (int s = 0; s < 6; ++s) {
    Case c;
    c.args = {MakeTree(*snap, 2 + s % 3, s, 10), emb};
    c.value = interpreter.Call(*snap, "loss", c.args);
    c.grad = interpreter.CallWithGrad(*snap, "loss", c.args, {1});
    trees.push_back(c);
  }
  for (int rows = 1; rows <= 3; ++rows) {
    Case c;
    c.args = {RandomMatrix(rng, rows, 3), RandomMatrix(rng, 3, 2)};
    c.value = interpreter.Call(*snap, "other", c.args);
    matrices.push_back(c);
  }

  constexpr int kCallers = 4, kIterations = 120, kEdits = 40;
  std::atomic<int> wrong{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kCallers; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kIterations; ++i) {
        try {
          const Case& tc = trees[(t * 5 + i) % trees.size()];
          const Case& mc = matrices[(t + i) % matrices.size()];
          switch ((t + i) % 5) {
            case 0:
            case 1:
              if (!ValueAllClose(loss.call(tc.args), tc.value, 1e-5)) wrong++;
              break;
            case 2: {
              ValueAndGrad vg = loss.with_grad({1}).value_and_grad(tc.args);
              if (!ValueAllClose(vg.value, tc.grad.value, 1e-5) ||
                  !ValueAllClose(vg.grads.at(0), tc.grad.grads[0], 1e-4, 1e-6)) {
                wrong++;
              }
              break;
            }
            case 3:
              if (!ValueAllClose(other.call(mc.args), mc.value, 1e-5)) wrong++;
              break;
            case 4:
              loss.prefetch(trees[(t + i + 1) % trees.size()].args);
              loss.status(tc.args);
              break;
          }
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
          errors++;
        }
      }
    });
  }
  // The editor: @helper alternates between two spellings of the same function,
  // so every answer stays the same while every edit invalidates @loss's code.
  std::thread editor([&] {
    Eventually([&] { return loss.stats().calls() >= kCallers; });
    for (int i = 0; i < kEdits; ++i) {
      engine.module().AddSource(i % 2 ? kHelperFirst : kHelperAgain, "edit.pj", /*replace_existing=*/true);
      std::this_thread::sleep_for(1ms);
    }
  });
  for (std::thread& t : threads) t.join();
  editor.join();

  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(errors, 0);
  EntryStats l = loss.stats(), o = other.stats();
  int64_t expected_calls = 0;
  for (int t = 0; t < kCallers; ++t) {
    for (int i = 0; i < kIterations; ++i) expected_calls += (t + i) % 5 != 4;
  }
  EXPECT_EQ(l.calls() + o.calls(), expected_calls);
  EXPECT_EQ(o.invalidated, 0);  // @other does not use @helper
  EXPECT_EQ(events->Count(EventKind::kCall), expected_calls);
  // How many compiles finished while the callers ran depends on how much CPU
  // the workers got; waiting for two of @other's signatures, one after the
  // other, makes two swaps, and with room for one slot the second evicts.
  ASSERT_EQ(other.wait_ready(matrices[0].args).state, CodeStatus::State::kReady);
  ASSERT_EQ(other.wait_ready(matrices[1].args).state, CodeStatus::State::kReady);
  l = loss.stats();
  o = other.stats();
  EXPECT_GT(o.compiled, 1);
  EXPECT_GT(l.evicted + o.evicted, 0);
  std::printf(
      "calls: %lld interpreter, %lld compiled; compiled %lld, evicted %lld, invalidated %lld, cancelled "
      "%lld\n",
      static_cast<long long>(l.calls_interpreter + o.calls_interpreter),
      static_cast<long long>(l.calls_compiled() + o.calls_compiled()),
      static_cast<long long>(l.compiled + o.compiled), static_cast<long long>(l.evicted + o.evicted),
      static_cast<long long>(l.invalidated), static_cast<long long>(l.cancelled));
}

// However many threads miss on one signature at once, it is compiled once.
TEST(EngineConcurrency, ASignatureIsNeverCompiledTwiceAtOnce) {
  std::atomic<int> compiles{0};
  Engine engine(Options(Policy::Eager(), [&](EngineOptions& o) {
    o.workers = 2;
    o.before_compile = [&](const CompileInfo&) {
      compiles++;
      std::this_thread::sleep_for(50ms);
    };
  }));
  engine.module().AddSource(kProgram, "program.pj");
  Entry loss = engine.entry("loss");
  Rng rng(2);
  std::vector<Value> args = {MakeTree(*engine.module().snapshot(), 6, 1, 10), RandomMatrix(rng, 10, 4)};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      if (t % 2) {
        loss.call(args);
      } else {
        EXPECT_TRUE(loss.wait_ready(args).ready());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(loss.wait_ready(args).ready());
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(loss.stats().compiled, 1);
}

}  // namespace
}  // namespace pejit
