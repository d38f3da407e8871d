// \file A small program with two entries sharing nothing but types, and its arguments.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <memory>
#include <thread>
#include <vector>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "ir/value.h"
#include "ops/random.h"
#include "scheduler/engine.h"
#include "scheduler/residual_executable.h"

namespace pejit::testing_scheduler {

// @loss uses @helper (through @encode); @other does not.
constexpr char kProgram[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
type List[T] { Nil, Cons(T, List[T]) }

def @helper(%x: Tensor[(1, ?), f32]) -> Tensor[(1, ?), f32] { tanh(%x) }

def @encode(%t: Tree, %emb: Tensor[(?, ?), f32]) -> Tensor[(1, ?), f32] {
  match (%t) {
    Leaf(%w) => @helper(take(%emb, reshape(%w, shape=[1]))),
    Node(%l, %r) => @helper(add(@encode(%l, %emb), @encode(%r, %emb))),
  }
}

def @loss(%t: Tree, %emb: Tensor[(?, ?), f32]) -> Tensor[(), f32] { sum(mul(@encode(%t, %emb), 0.5f32)) }

def @other(%x: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32]) -> (Tensor[(?, ?), f32], Tensor[(), f32]) {
  let %y = matmul(%x, %w);
  (%y, mean(mul(%y, %y)))
}

def @count_down(%n: Tensor[(), i64], %acc: Tensor[(), f32]) -> Tensor[(), f32] {
  if (greater(%n, 0)) { @count_down(sub(%n, 1), mul(%acc, 2f32)) } else { %acc }
}

def @wrap(%x: Tensor[(2,), f32]) -> List[Tensor[(2,), f32]] { Cons(%x, Nil) }

def @scale(%x: Tensor[(?,), f32], %k: Tensor[(), f32]) -> Tensor[(?,), f32] { mul(%x, %k) }
)";

// The same @helper, written another way with bitwise-equal results.
constexpr char kHelperAgain[] = R"(
def @helper(%x: Tensor[(1, ?), f32]) -> Tensor[(1, ?), f32] { mul(tanh(%x), 1f32) }
)";

// A @helper that computes something else.
constexpr char kHelperChanged[] = R"(
def @helper(%x: Tensor[(1, ?), f32]) -> Tensor[(1, ?), f32] { sigmoid(%x) }
)";

// Options with one worker and `policy`, then whatever `more` sets. (Not
// designated initializers: GCC 12's -Wextra warns about every field left out.)
// The generic tier is off: these tests are about the per-minibatch tiers'
// machinery (slots, jobs, swaps, edits); generic_engine_test has the generic
// tier in the engine.
inline EngineOptions Options(Policy policy, const std::function<void(EngineOptions&)>& more = {}) {
  EngineOptions o;
  o.workers = 1;
  o.policy = policy;
  o.generic = false;
  if (more) more(o);
  return o;
}

inline Value I(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

inline Value RandomMatrix(Rng& rng, int64_t rows, int64_t cols) {
  return Value(RandomUniform(rng, {rows, cols}, -1, 1));
}

// A tree of `leaves` leaves, shaped by `shape` (different shapes, different
// signatures): a left comb when shape is even, a right comb otherwise.
inline Value MakeTree(const ModuleSnapshot& m, int leaves, int shape, int64_t vocabulary) {
  TypeDefPtr tree = m.FindType("Tree");
  auto leaf = [&](int i) { return Value::Adt(tree, 0, {I((i * 7 + shape) % vocabulary)}); };
  Value t = leaf(0);
  for (int i = 1; i < leaves; ++i) {
    t = shape % 2 == 0 ? Value::Adt(tree, 1, {t, leaf(i)}) : Value::Adt(tree, 1, {leaf(i), t});
  }
  return t;
}

// Waits (bounded, for a broken engine not to hang the suite) until `done`.
inline bool Eventually(const std::function<bool()>& done,
                       std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// An Executable that forwards to another and reports a fixed size: makes
// byte budgets exact in tests.
// Holds compile hooks (before_compile) until the test opens it, in place of
// a sleep that a loaded machine outlasts. Opens itself when destroyed, so
// that a test leaving early still lets its engine stop.
class Gate {
 public:
  ~Gate() { Open(); }
  void Open() {
    std::lock_guard lock(mu_);
    if (!open_) promise_.set_value();
    open_ = true;
  }
  // For the hook: blocks until Open (copyable into a lambda that outlives the gate).
  std::shared_future<void> opened() const { return opened_; }

 private:
  std::mutex mu_;
  bool open_ = false;
  std::promise<void> promise_;
  std::shared_future<void> opened_ = promise_.get_future().share();
};

class SizedExecutable final : public Executable {
 public:
  SizedExecutable(ExecutablePtr inner, size_t bytes, std::function<void()> on_run = {},
                  std::shared_ptr<std::atomic<int>> alive = nullptr)
      : inner_(std::move(inner)), bytes_(bytes), on_run_(std::move(on_run)), alive_(std::move(alive)) {
    if (alive_) alive_->fetch_add(1);
  }
  ~SizedExecutable() override {
    if (alive_) alive_->fetch_sub(1);
  }
  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override {
    if (on_run_) on_run_();
    return inner_->Run(inputs);
  }
  const Type& result_type() const override { return inner_->result_type(); }
  size_t code_bytes() const override { return bytes_; }
  const char* tier() const override { return inner_->tier(); }

 private:
  ExecutablePtr inner_;
  size_t bytes_;
  std::function<void()> on_run_;
  std::shared_ptr<std::atomic<int>> alive_;
};

}  // namespace pejit::testing_scheduler
