// \file Runs an Inspection: every run one batched call of its segment's code.
//
// Forward, runs go in the inspection's order: a run's stacked inputs are gathered row by row
// from the slots its instances read (earlier runs' outputs, the entry's
// tensors, the structure's tokens), padded to the run's row bucket with
// copies of its first row, and its segment's code runs once over all rows.
// A loop the data ends is unrolled by the inspector (generic/cell.h): its
// i-th iterations of every example are one run, and the examples that stop
// earlier skip the later ones as a branch not taken; an example going on
// past the unrolled depth stops the call, which InspectAndExecute inspects
// deeper and runs again.
// A run of a branch's segment (an `if` on a tensor, generic/cell.h) packs
// the instances whose conditions take it into its first rows, reading each
// condition from the run that computed it: the examples that took the
// branch run it as one batched call, and no instance evaluates a branch it
// did not take (a select of both, as jax.vmap of lax.cond does, would
// evaluate a sqrt of the negative values the condition excluded, and their
// NaN times a zero cotangent would poison the weights' gradients).
// Backward (grad mode), runs go in reverse: each takes the cotangents of its
// outputs, runs the segment's vector-Jacobian product, and adds each row's
// input cotangents into the slot it was read from: the output rows of
// earlier runs, or the gradient of an entry tensor (a shared parameter's
// arrives summed over the rows already). Padded rows get zero cotangents,
// so they add nothing to any gradient. A weight's gradient is one product
// per call over every run's row factors, in parts of a fixed number of rows
// that the call's team (support/team.h) shares out: two threads give the
// bits one gives.
// An inspection cut into lanes (Inspection::lanes) runs each lane's runs in
// order, thread k of the team lane k's (one thread: all runs in order), a
// run waiting for the runs of other lanes it reads (forward) or that read
// it or add into the same runs before it (backward); each lane sums its own
// entry-tensor gradients and row factors, added in lane order, so that two
// threads give the bits one gives. A run's own code then runs on its thread
// alone.
//
// A segment's code for a row bucket is made on first use with its baseline
// code: the variant's programs lowered without fusion, every step a
// registered kernel or a copy, intermediates in the arena
// (jit/native_executable.h's LowerToKernelPlan: no code generator, a
// fraction of a millisecond to make; the interpreter where lowering
// refuses). A worker then compiles it with LLVM (CompileVariant) and the
// native code replaces the baseline code: a run never waits for a compiler.
// Until a run's own bucket has native code, it may take a larger bucket's
// code, native or baseline (padding at most to 2 rows + 8), rather than
// make its own on the caller's thread: in epoch 0 most of the caller's
// time went into making variants (NMN: 55 of 111 ms, bench/RESULTS.md).
// Where no larger bucket within that padding has native code, the run goes
// in pieces that other buckets' native code serves (value mode and grad
// mode alike, each piece's backward on its rows of the run's cotangents):
// a minibatch with more rows than any compiled so far, common in the
// epoch after the first, runs natively rather than on baseline code.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include <vector>

#include "generic/program.h"
#include "ir/abi.h"
#include "ir/value.h"
#include "jit/compiler.h"

namespace pejit {
}

namespace pejit::generic {

struct ExecuteOptions {
  bool grad = false;  // the entry's result must then be a scalar f32 loss
  // Compile every variant the call needs that has no native code yet,
  // before running it (tests, `--policy sync`). Null: use what is there.
  JitSession* compile_now = nullptr;
  // What compile_now compiles with (its store: the engine's persistent code cache).
  CompileOptions compile_options;
  // A variant a run makes takes the native code compile_options' store kept
  // (a warm persistent cache), loaded by this session, before baseline code.
  JitSession* load_kept = nullptr;
};

struct Execution {
  Value value;
  // Grad mode: d result / d each entry-argument tensor (Inspection::roots
  // order); undefined where no gradient flows (integer tensors, unused ones).
  std::vector<Tensor> root_grads;
  // Runs on native code (LLVM's), and on a variant's baseline code.
  int native_runs = 0, baseline_runs = 0;
  // Instances of branches (of `if`s on tensors) whose conditions did not
  // take them: not run, and no row of any run.
  int64_t skipped_rows = 0;
  // InspectAndExecute: runs thrown away because a loop went on past the
  // iterations the inspection unrolled.
  int reruns = 0;
  // Variants that ran without native code, once each, and their segments' ids.
  std::vector<SegmentCode::Variant*> missing_native;
  std::vector<SegmentCode*> missing_codes;
  // With ExecuteOptions::compile_now: the variants it compiled, and when.
  struct Compiled {
    SegmentCode* code = nullptr;
    SegmentCode::Variant* variant = nullptr;
    std::chrono::steady_clock::time_point start, end;
  };
  std::vector<Compiled> compiled;
};

// Throws Refusal (a program the vector-Jacobian product cannot be taken of),
// Deeper (a loop past the iterations unrolled) or the errors of the code it
// runs (EvalError, OpError, JitFailure).
Execution Execute(const Inspection& inspection, const ExecuteOptions& options);

// A call: inspected, and run; run again, inspected deeper, while a loop the
// data ends goes on past the iterations unrolled (Deeper). `inspection` is
// the last one's. Throws what Inspect and Execute throw but Deeper.
Execution InspectAndExecute(GenericProgram& program, const std::vector<Value>& args, const ExecuteOptions& options,
                            Inspection& inspection);

// A call's forward pass in grad mode, for a result of any type (tensors in
// tuples), its backward left for the result's cotangent: a pullback
// (ir/abi.h's ValueAndPullback). It keeps the runs' inputs and residuals.
class PendingBackward {
 public:
  virtual ~PendingBackward() = default;
  // d sum(result * cotangent) / d each entry tensor (Execution::root_grads'
  // order), `cotangents` one per tensor leaf of the result (undefined where
  // it takes none, as ir/abi.h's CotangentLeaves gives them). Once: a second
  // call throws std::logic_error. Throws what Execute throws.
  virtual std::vector<Tensor> Backward(const std::vector<Tensor>& cotangents) = 0;
};

struct Forward {
  Execution run;  // the value, and the forward's runs
  std::shared_ptr<const Inspection> inspection;
  std::unique_ptr<PendingBackward> backward;
};

// InspectAndExecute's forward half in grad mode (`options.grad` is set).
// The backward reads the inspection's program (its cells and segments):
// `program` must outlive `backward`. Throws what InspectAndExecute throws,
// and Refusal for a result with f64 leaves.
Forward InspectAndForward(GenericProgram& program, const std::vector<Value>& args, ExecuteOptions options);

// The gradients of the `wrt` arguments, each shaped like its argument, from
// an execution's root_grads (zeros where none reached a float leaf, an
// integer leaf itself). Throws Refusal when an argument of `wrt` holds a
// structure value (HoldsStructure).
std::vector<Value> ArgumentGrads(const std::vector<Value>& args, const std::vector<int>& wrt,
                                 const std::vector<Tensor>& root_grads);

// The call's value and, with `wrt`, its gradients, each shaped like its
// argument, from `run` (its value moved out), as every tier answers
// (ir/abi.h's FromResults): zeros for a float leaf nothing reached, the leaf
// itself for an integer one. Throws Refusal when an argument of `wrt` holds
// a structure value (HoldsStructure).
ValueAndGrad CallResult(const std::vector<Value>& args, const std::vector<int>* wrt, Execution& run);
// Whether `arg` holds a structure (ADT) value anywhere: CallResult refuses
// a gradient for it, so a caller asking for its gradient can be refused before
// anything runs.
bool HoldsStructure(const Value& arg);

// The variant of `code` for `rows` rows (and, for a segment that pads
// inputs, the padding `pads`: RunPadding's), made (forward and, in grad mode,
// backward programs, with their baseline code, or with the native code
// `kept`'s store kept: ExecuteOptions::load_kept) on first use. Thread-safe.
SegmentCode::Variant& VariantFor(SegmentCode& code, int64_t rows, bool grad, const std::vector<PadTo>& pads = {},
                                 const ExecuteOptions* kept = nullptr);
// The same variant, its programs not made yet if they were not: cheap, for
// asking a worker to make and compile it (a prefetch, or a value-mode run
// that other variants' native code served). Thread-safe.
SegmentCode::Variant& VariantEntry(SegmentCode& code, int64_t rows, bool grad, const std::vector<PadTo>& pads = {});

// Compiles those of a variant's programs that have no native code yet (made
// first if they were not, without baseline code) and publishes them; the
// variant's next runs use them. Compiles with `options` (a store in them
// loads what an earlier run compiled: jit/compiler.h's CodeStore), their
// machine code by LLVM's quick code generator (kQuick: native code soonest,
// a third of the time; a variant that has native code is left as it is) or
// its optimizing one (kOptimized: 5-10% faster code, which replaces quick
// code). A store's optimized code, when it has the variant's, is taken
// instead of either; quick code is not kept. Thread-safe. Returns which
// code generator's code the variant runs now. Throws JitFailure; the variant
// keeps (or gets) its baseline code then.
enum class CodeGen { kQuick, kOptimized };
CodeGen CompileVariant(JitSession& jit, SegmentCode& code, SegmentCode::Variant& variant,
                       const CompileOptions& options = {}, CodeGen codegen = CodeGen::kOptimized);

}  // namespace pejit::generic
