// \file The specialization pipeline after partial evaluation, written once.
//
// A residual program (pe/) becomes native code through the same stages for
// every caller, the engine's workers, `pejit compile` and bench/jit alike:
//
//   batch     independent instances of one computation merged (batch.h);
//             before autodiff, so that the backward pass is batched alike
//   autodiff  grad mode only: (loss, gradients) of the chosen leaves (autodiff.h)
//   compile   lowering (plan.h) and LLVM (compiler.h), by a JitSession
//
// PrepareResidual() runs the first two, which every compile step takes (the engine's
// compile hook may be another tier than LLVM); CompileResidual() all three. Each
// stage is a pass of jit/pass.h's lists (batch and autodiff here, lowering's
// inside the compile), run under `compile.instrument`, which sees the program
// after each (tests, `pejit compile --print-after`). The pipeline takes the
// residual's main function, not the partial evaluator's result, so that jit/
// does not depend on pe/.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/expr.h"
#include "jit/batch.h"
#include "jit/compiler.h"

namespace pejit {

struct PipelineOptions {
  bool batch = true;
  // Batching cuts a large program into at most this many lanes, one thread's
  // each (jit/lanes.h); fixed here, not by the threads a call finds, so that
  // results do not depend on them.
  int lanes = 2;
  // Grad mode: the residual parameters (dynamic leaves) to differentiate for;
  // the program's result must then be a scalar f32 loss. Empty: value mode.
  std::optional<std::vector<int>> wrt_leaves;
  CompileOptions compile;  // its instrument sees the residual, then every pass
};

struct PipelineReport {
  bool batched = false;
  // Why the program was not batched when batching was asked for (it is not
  // straight-line code: a dynamic `if`); the compile step then decides.
  std::string batch_skipped;
  // The stage running, or the last that ran ("batch", "autodiff"): where an
  // exception from PrepareResidual came from.
  const char* stage = "residual";
  BatchStats batch;
  double batch_ms = 0, autodiff_ms = 0;
  CompileReport compile;  // CompileResidual() only
};

// Batches (when asked and the program is straight-line code) and
// differentiates (grad mode). Throws JitFailure (a Refusal) when a grad-mode
// program cannot be differentiated, or batching declines a construct.
Func PrepareResidual(const Func& residual, const PipelineOptions& options, PipelineReport* report = nullptr);

// PrepareResidual(), then lowering and LLVM in `session`. Throws JitFailure.
ExecutablePtr CompileResidual(JitSession& session, const Func& residual, const PipelineOptions& options,
                      PipelineReport* report = nullptr);

}  // namespace pejit
