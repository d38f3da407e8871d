// \file The tiered Engine: what users call. The one header a program includes.
//
// Functions run in the interpreter at once while a oneTBB worker pool
// partially evaluates and compiles them against each call's structure; the
// compiled code is swapped in when it is ready, and a call whose code is not
// ready runs in the interpreter instead of waiting (see code_cache.h for the
// call path and the swap protocol).
//
//   pejit::Engine engine({.policy = pejit::Policy::Parse("eager")});
//   engine.module().AddSource(text, "model.pj");
//   pejit::Entry loss = engine.entry("loss");
//   auto [value, grads] = loss.value_and_grad({trees, labels, params}, {2});
//
// docs/api.md has a whole training loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "ir/value.h"
#include "jit/compiler.h"
#include "jit/executable.h"
#include "jit/tiered.h"
#include "pe/partial_eval.h"
#include "pe/signature.h"
#include "scheduler/events.h"
#include "scheduler/policy.h"

namespace pejit {

// What a compile hook is asked to build, for hooks and tests that want to know.
struct CompileInfo {
  std::string entry;
  Signature signature;
  bool grad = false;
  std::vector<int> wrt;  // grad mode: the argument indices
};

// What a compile hook may report about its work, for the `passes`,
// `codegen` and `compile` events and the `swap` line.
struct CompileNotes {
  // The LLVM compiler's stages (jit/compiler.h), when it built the code.
  std::optional<CompileReport> jit;
  // Why a preferred tier refused, when a fallback tier built the code
  // instead (CompileNative: LLVM's reason, the residual interpreter serving).
  std::string fallback;
  // Programs whose code is baseline code for now (CompileTask::baseline_first):
  // the engine compiles their native code on a worker after the swap.
  std::vector<TierUp> tier_ups;
};

// What a compile hook is given: a residual program, in grad mode already
// differentiated (its main returns (loss, gradients...)) unless it has
// control flow (a dynamic `if`, residual functions), which autodiff
// (jit/autodiff.h) does not take: then `differentiate` holds the dynamic
// leaves to differentiate for, and the hook returns (loss, gradients...)
// of the undifferentiated residual itself.
struct CompileTask {
  const Residual& residual;
  std::optional<std::vector<int>> differentiate;
  std::string entry;  // whose specialization this is (for the hook's own reports)
  bool batch = true;  // EngineOptions::batch: batch branches and loops across examples too
  // EngineOptions::baseline_first (not under policy sync): the hook may
  // return baseline code (jit/tiered.h) and leave native code to
  // CompileNotes::tier_ups.
  bool baseline_first = false;
};

// Turns a CompileTask into an Executable. Throws to refuse: a JitFailure (or
// PeFailure) refuses the signature, anything else fails it; either way the
// slot keeps the message as its reason.
//
// Three forms convert: `ExecutablePtr(const CompileTask&, CompileNotes&)`;
// or, for a hook that differentiates nothing itself (a task with
// `differentiate` is then refused for it), `ExecutablePtr(const Residual&)`,
// or `ExecutablePtr(const Residual&, CompileNotes&)` for a hook that reports.
class CompileFn {
 public:
  using Full = std::function<ExecutablePtr(const CompileTask&, CompileNotes&)>;

  CompileFn() = default;
  CompileFn(std::nullptr_t) {}
  template <class F>
    requires std::is_invocable_r_v<ExecutablePtr, F&, const CompileTask&, CompileNotes&>
  CompileFn(F f) : fn_(std::move(f)) {}
  template <class F>
    requires std::is_invocable_r_v<ExecutablePtr, F&, const Residual&, CompileNotes&>
  CompileFn(F f) : fn_([f = std::move(f)](const CompileTask& task, CompileNotes& notes) mutable {
      if (task.differentiate) RefuseUndifferentiated();
      return f(task.residual, notes);
    }) {}
  template <class F>
    requires(std::is_invocable_r_v<ExecutablePtr, F&, const Residual&> &&
             !std::is_invocable_r_v<ExecutablePtr, F&, const Residual&, CompileNotes&>)
  CompileFn(F f) : fn_([f = std::move(f)](const CompileTask& task, CompileNotes&) mutable {
      if (task.differentiate) RefuseUndifferentiated();
      return f(task.residual);
    }) {}

  ExecutablePtr operator()(const CompileTask& task, CompileNotes& notes) const { return fn_(task, notes); }
  explicit operator bool() const { return static_cast<bool>(fn_); }

 private:
  [[noreturn]] static void RefuseUndifferentiated();
  Full fn_;
};

inline constexpr int kMaxWorkers = 256;

struct EngineOptions {
  // Background workers; 0: hardware threads − 1, at least 1. At most
  // kMaxWorkers (the Engine's constructor throws std::invalid_argument).
  int workers = 0;
  // Niceness a worker runs its jobs at (Linux; 0: the caller's priority), so
  // that on a busy machine compiling yields the CPU to the training thread
  // instead of sharing a core with it (support/thread_priority.h). Not under
  // policy sync, whose callers wait for the worker.
  int worker_nice = 10;
  Policy policy = Policy::Eager();
  // Threads a compiled call may use, the calling thread included: while no
  // compile job is queued or running, a call borrows up to this many − 1
  // workers for the stages of its plan worth dividing (jit/schedule.h), and
  // a job that arrives takes its worker back after the part it is running.
  // A specialization's results are the same bits whatever the number (a
  // generic call's depend on its lanes: generic_lanes). 0: workers + 1; 1: each
  // call on its own thread. The engine sets OpenBLAS to one thread
  // (process-wide): parts are its unit of parallelism, and BLAS's own
  // threads would oversubscribe the cores.
  int step_threads = 0;
  // Sum of Executable::code_bytes() over the ready specializations; past it
  // the least recently used are evicted.
  size_t code_cache_bytes = size_t{256} << 20;
  // Code of specializations a module edit invalidated, kept (never run: its
  // definitions' versions are gone) so that re-specializing after the edit
  // reuses the fused kernels that did not change (the JIT session reuses
  // kernels of live code, jit/compiler.h). The oldest go first past this many
  // bytes of Executable::code_bytes(); 0 frees invalidated code at once.
  size_t retained_code_bytes = size_t{64} << 20;
  // Ready specializations kept per entry (LRU beyond).
  int max_specializations_per_entry = 1024;
  // Signatures tracked per entry while cold (hot:N) or failed (LRU beyond).
  int max_tracked_signatures_per_entry = 1024;
  PeOptions pe;
  // Helper specializations kept across jobs, so that PE of one entry reuses
  // what PE of another did for the same helper and skeleton (pe/pe_cache.h).
  // max_entries = 0 turns it off.
  PeCacheOptions pe_cache;
  // The structure-generic tier (generic/program.h): a call whose program it
  // serves runs at once on code shared by every structure (one batched run
  // per segment of the model's cells and tree level), compiled per segment
  // and row bucket in the background and never per minibatch. A call it
  // does not serve (a function value inside a structure, a structure nested deeper than
  // it walks) takes the per-minibatch tiers below, and the log says why.
  bool generic = true;
  // With the generic tier serving, a signature gets its own per-minibatch
  // specialization (PE, batching, fusion across the whole program) once it
  // has been called this many times: minibatches that repeat; 0: never.
  int specialize_after_calls = 2;
  // Batch isomorphic independent operations of residual programs (one GEMM
  // per tree level instead of one per node; jit/batch.h), and the instances
  // of one branch or loop across a minibatch's examples (jit/batch_branches.h).
  bool batch = true;
  // The generic tier may cut a call's segment instances into step_threads
  // lanes between its examples (generic/program.h's Inspection::lanes),
  // which the call's team runs side by side: while other processes leave a
  // core for each helper (generic::LanesPay; lanes lose when a helper is
  // preempted) and a cost model of work and runs says they gain. A call's
  // bits depend on its lanes, not on the threads that came. Off by default:
  // the Child-Sum Tree-LSTM of hidden 128 gained 8-14% on two idle cores,
  // but a typed AST encoder of hidden 64 lost a quarter where the model
  // said it would gain (bench/RESULTS.md, issue 51).
  bool generic_lanes = false;
  // A specialization's job publishes baseline code first (its programs
  // lowered to registered kernels, no code generator: jit/tiered.h), so
  // that calls leave the interpreter within milliseconds of partial
  // evaluation; a worker then compiles the native code and swaps it in
  // (the `tier-up` event). Not under policy sync, which waits for native
  // code. With the default compile hook.
  bool baseline_first = true;
  InterpreterOptions interpreter;
  // Null: native code with LLVM (CompileNative, scheduler/native_compile.h).
  CompileFn compile;
  // What LLVM compiles with, for the default hook and the generic tier's
  // segments alike (jit/compiler.h: optimization level, profiling, NaN
  // poisoning of dead buffers, and the instrument shown every pass, jit/pass.h,
  // called on the thread that runs the pass: workers and, for the generic
  // tier's segment passes, the calling thread, possibly several at once).
  // The segments' machine code is always made by the optimizing code
  // generator.
  CompileOptions compile_options;
  // The persistent code cache (scheduler/disk_cache.h): a directory where
  // compiled specializations are written and from which a later engine, in
  // this process or another, loads them on a signature's first call instead
  // of compiling (the call runs native at once). Empty: PEJIT_CACHE_DIR, or
  // none. Only with the default compile hook. The Engine's constructor
  // throws std::runtime_error for a directory it cannot create.
  std::string cache_dir;
  uint64_t cache_dir_bytes = uint64_t{1} << 30;  // past it, least recently used entries go
  // Run on the worker just before partial evaluation and just before
  // `compile` (tests use them to make a job slow, or inject faults: an
  // exception of any type, std::bad_alloc; the job fails, the call that
  // asked for it runs on the interpreter, the worker goes on).
  std::function<void(const CompileInfo&)> before_pe;
  std::function<void(const CompileInfo&)> before_compile;
  // Receives the engine's events (scheduler/events.h); null: none, at no cost.
  std::shared_ptr<EventSink> events;
  // The tracing log (docs/tracing.md): "off", "info", "debug" or "trace" on
  // the `pejit` spdlog logger, with a statistics block when the engine is
  // destroyed; empty: PEJIT_LOG's value (unset: off). Anything else throws
  // std::invalid_argument from the constructor.
  std::string log_level;
  // A JSON-lines file of every event, written by a thread of its own;
  // empty: PEJIT_TRACE's value (unset: none). One that cannot be opened
  // throws std::runtime_error from the constructor.
  std::string trace_file;
};

struct EntryOptions {
  // Arguments whose whole value (tensor contents included) becomes part of
  // the signature, like jax.jit's static_argnums: specialized on, not passed.
  std::vector<int> static_argnums;
  // Grad mode, fixed for the handle as jax.value_and_grad binds argnums: the
  // arguments whose gradients value_and_grad returns, in this order. Unset:
  // value mode. Every other method of the handle (prefetch, wait_ready,
  // status) then concerns the same mode, so that warming one mode and
  // running the other cannot happen by omission.
  std::optional<std::vector<int>> wrt = std::nullopt;  // initialized: {.static_argnums = ...} draws no GCC 12 warning
};

struct EntryStats {
  int64_t calls_interpreter = 0;           // tier 0
  int64_t calls_residual_interpreter = 0;  // residual programs in the interpreter
  int64_t calls_native = 0;                // any other compiled tier (LLVM)
  int64_t calls_baseline = 0;              // specializations' baseline code, before their native code (jit/tiered.h)
  int64_t calls_generic = 0;               // the structure-generic tier
  int64_t calls_generic_native = 0;        // ... of which every run was native code
  int64_t generic_runs = 0;                // ... batched segment runs it made
  int64_t generic_native_runs = 0;         // ... of which native code (the others interpreted, while compiling)
  int64_t hits = 0;                        // calls that found ready code
  int64_t misses = 0;                      // calls that did not (policy interpreter: not counted)
  int64_t compiled = 0;                    // specializations published
  int64_t refused = 0;                     // specializations refused: the program is one no compiled tier serves (a limit)
  int64_t failed = 0;                      // specializations that failed otherwise (the job, or their code at run time: a bug)
  int64_t evicted = 0;                     // ready slots evicted by the budgets
  int64_t invalidated = 0;                 // slots dropped by module edits
  int64_t cancelled = 0;                   // queued jobs dropped (edits, shutdown)
  int64_t prefetched = 0;                  // prefetch requests that queued a job
  int64_t loaded = 0;                      // specializations loaded from the persistent code cache

  int64_t calls() const {
    return calls_interpreter + calls_residual_interpreter + calls_native + calls_baseline + calls_generic;
  }
  // Calls that ran native code only: compiled specializations, and generic
  // calls none of whose runs took baseline code. What a "compiled share"
  // counts.
  int64_t calls_compiled() const { return calls_native + calls_generic_native; }
  // Generic calls some of whose runs took baseline code while their native
  // code compiled: faster than tier 0, but not compiled.
  int64_t calls_generic_interpreted() const { return calls_generic - calls_generic_native; }
};

// Where one signature's code stands.
struct CodeStatus {
  enum class State : uint8_t {
    kNone,     // no slot (never seen, evicted, invalidated, or policy interpreter)
    kCold,     // seen, below the hot:N threshold
    kPending,  // being specialized
    kReady,    // compiled code serves it
    kFailed,   // refused; `reason` says why
  };
  State state = State::kNone;
  std::string reason;  // kFailed; kNone from wait_ready: why nothing was compiled
  std::string tier;    // kReady: "residual-interpreter", "native"
  size_t code_bytes = 0;

  bool ready() const { return state == State::kReady; }
  bool failed() const { return state == State::kFailed; }
};
const char* CodeStateName(CodeStatus::State s);

using ValueAndGrad = Interpreter::ValueAndGrad;

// How soon a prefetched signature is called (Entry::prefetch).
enum class Prefetch : uint8_t {
  kNext,      // among the next few calls, in the order prefetched
  kWhenIdle,  // some time later (an evaluation set)
};

class EngineImpl;   // engine.cc
struct EntryState;  // engine.cc

// A handle on one entry of an engine's module, in one mode: value mode
// (call) or grad mode (value_and_grad, for the arguments EntryOptions::wrt
// names). Cheap to copy; valid while its Engine lives. All methods may be
// called from many threads at once.
class Entry {
 public:
  const std::string& name() const;
  // Grad mode's arguments; null in value mode.
  const std::vector<int>* wrt() const { return wrt_ ? &*wrt_ : nullptr; }

  // This entry in grad mode for `wrt`, or in value mode (a new handle; this
  // one is unchanged). Throws std::invalid_argument for an argument the
  // entry does not take.
  Entry with_grad(std::vector<int> wrt) const;
  Entry without_grad() const;

  // Value mode: runs the entry, on compiled code when this signature's is
  // ready, in the interpreter otherwise (policy sync: after compiling).
  // Throws EvalError like Interpreter::Call; std::logic_error on a grad-mode
  // handle.
  Value call(const std::vector<Value>& args) const;
  // Grad mode: the loss (a scalar f32) and its gradients with respect to the
  // handle's `wrt` arguments, each in the structure of its argument, exactly
  // as Interpreter::CallWithGrad returns them. std::logic_error on a
  // value-mode handle.
  ValueAndGrad value_and_grad(const std::vector<Value>& args) const;
  // Grad mode, a result of any type (jax.vjp): the value, and a pullback
  // that maps a cotangent of it (its structure, its float tensors' shapes)
  // to the gradients of sum(value * cotangent) with respect to the `wrt`
  // arguments, shaped as value_and_grad's (ir/abi.h's ValueAndPullback).
  // Every tier keeps its forward's state until the pullback runs, so the
  // forward is not computed again: per-minibatch code compiled as a forward
  // returning its residuals and a backward (jit/pullback.h; straight-line
  // residuals only, never kept on disk), the generic tier its runs, tier 0
  // its tape. The tiers are tried as value_and_grad tries them, in slots of
  // their own. The pullback runs once, on any thread, while the engine
  // lives; a failure of a compiled backward falls back to tier 0 (which
  // computes the forward again) and says so in the log.
  // std::logic_error on a value-mode handle.
  ValueAndPullback value_and_pullback(const std::vector<Value>& args) const;

  // Queues the specialization of these arguments' signature (in the handle's
  // mode) and returns at once: `kNext` before the jobs of calls already made
  // (the loop's next minibatches: their code can be ready when it gets
  // there), `kWhenIdle` when no other job waits. No effect under policy
  // interpreter.
  void prefetch(const std::vector<Value>& args, Prefetch when = Prefetch::kWhenIdle) const;

  // Blocks until that signature's code (in the handle's mode) is ready or
  // has failed, queueing its job first when there is none (any policy but
  // interpreter, whose answer is kNone at once). For tests and benchmarks.
  CodeStatus wait_ready(const std::vector<Value>& args) const;

  // Where that signature's code (in the handle's mode) stands now; never
  // blocks or queues.
  CodeStatus status(const std::vector<Value>& args) const;

  // Both modes' calls and code.
  EntryStats stats() const;

 private:
  friend class Engine;
  Entry(EngineImpl* engine, EntryState* state, std::vector<bool> static_args, std::optional<std::vector<int>> wrt)
      : engine_(engine), state_(state), static_args_(std::move(static_args)), wrt_(std::move(wrt)) {}
  EngineImpl* engine_;
  EntryState* state_;
  std::vector<bool> static_args_;
  std::optional<std::vector<int>> wrt_;
};

struct EngineStats {
  size_t code_bytes = 0;  // held by ready specializations in the cache
  size_t slots = 0;       // specializations in the cache, any state
  size_t queued = 0;      // jobs waiting for a worker
  size_t retained_bytes = 0;  // invalidated code kept for its kernels (EngineOptions::retained_code_bytes)
  int workers = 0;
  int step_threads = 0;  // EngineOptions::step_threads resolved: threads a compiled step may use
  // The generic tier, over the entries' current programs: cells, distinct
  // segment programs and how many of them pad a per-example length into one
  // program (generic/pad.h), their variants (segment × row bucket × padding)
  // and how many of those have native code, and its bytes.
  int64_t generic_cells = 0, generic_segments = 0, generic_padded_segments = 0, generic_variants = 0,
          generic_native_variants = 0;
  size_t generic_code_bytes = 0;
  std::string cache_dir;  // the persistent code cache in use; empty: none
};

class Engine {
 public:
  // Throws for a bad `log_level` or a `trace_file` that cannot be opened.
  explicit Engine(EngineOptions options = {});
  // Cancels queued jobs, waits for the running ones (at most `workers`;
  // a compile is not interrupted), and frees everything; with logging on,
  // logs the run's statistics; flushes the trace file.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The live module: add, replace and remove definitions at any time; edits
  // invalidate the specializations that used what changed.
  Module& module();

  // The entry `name` of the module, in the mode `options.wrt` says (throws
  // IrError when there is none, and std::invalid_argument for a bad
  // static_argnums or wrt).
  Entry entry(const std::string& name, EntryOptions options = {});

  // Blocks until no job is queued or running: every signature queued so far
  // is compiled (and, with a cache_dir, stored for the next process) or has
  // failed; the calling thread compiles too, at its own priority, while it
  // waits. `progress`, when given, is called with the number of tasks left
  // each time one finishes. Calls from other threads go on meanwhile; jobs
  // they queue are waited for too. A process that wants its successor to
  // start warm calls this before it ends: the destructor cancels what is
  // still queued.
  void drain(const std::function<void(int64_t left)>& progress = {});

  EngineStats stats() const;
  const EngineOptions& options() const;

 private:
  std::unique_ptr<EngineImpl> impl_;
};

}  // namespace pejit
