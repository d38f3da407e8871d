// \file Native code for residual programs with control flow, and its gradients.
//
// Partial evaluation leaves control flow where the data decides it: a
// dynamic `if` (a branch on a tensor), a residual function (a loop the data
// ends). LLVM code generation (compiler.h) takes straight-line code only, so
// such a residual is cut into *regions*: maximal runs of straight-line lets
// between control steps, each compiled through the pipeline (pipeline.h:
// batched, fused, LLVM) as a program from the tensors it reads to the ones
// used after it. The control steps between regions (which branch, which
// call, taking a tuple apart) are run by a small driver over the regions'
// results. What a branch or a loop body computes runs native; only the
// decisions are taken in C++.
//
// Gradients (grad mode) follow the path a run took, as the interpreter's
// tape does, but a region at a time: the forward records each region it ran
// with its inputs and the intermediates its backward needs, and the backward
// runs the regions' vector-Jacobian products in reverse. Each region is
// compiled as the two halves of its VJP (vjp.h, as the generic tier's
// segments are): a forward that also returns those residuals, and a
// backward from them, differentiated by autodiff.h's rules.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "jit/compiler.h"
#include "jit/executable.h"
#include "jit/tiered.h"

namespace pejit {

struct ControlFlowOptions {
  CompileOptions compile;
  // Grad mode: the parameters of `main` to differentiate for (float
  // tensors); `main` must return a scalar f32 loss, and the program returns
  // (loss, d loss / d param[w], ...) as autodiff.h's programs do.
  std::optional<std::vector<int>> wrt;
  // Baseline code first (jit/tiered.h): each region's program (batched and,
  // in grad mode, split into its VJP's halves) is lowered to baseline code
  // at once and the compile of its native code appended here, to be run
  // later while the session lives; null: native code at once.
  std::vector<TierUp>* tier_ups = nullptr;
  // Batch the independent instances of one branch or loop across the
  // examples of a minibatch (batch_branches.h); off: each runs alone.
  bool batch_branches = true;
};

struct ControlFlowStats {
  int regions = 0;      // compiled straight-line regions, in every function
  int vjp_regions = 0;  // grad mode: regions a gradient passes, with a compiled VJP
  int branches = 0;  // dynamic `if`s
  int calls = 0;     // calls of residual functions
  int refined = 0;   // variables whose shape the program determines beyond its declarations (refine_shapes.h)
  int batched_groups = 0;  // sets of instances of one branch or loop run as one (batch_branches.h)
  int batched_rows = 0;    // the instances in them
};

// `main` and the residual functions it calls (by name, as MakeGlobal spells
// them). Throws JitFailure naming what it cannot compile: a program without
// control flow (CompileResidual serves it), a region LLVM refuses, a value
// that is not tensors in tuples crossing between regions.
ExecutablePtr CompileControlFlow(JitSession& session, const Func& main,
                                 const std::vector<std::pair<std::string, Func>>& functions,
                                 const ControlFlowOptions& options = {}, ControlFlowStats* stats = nullptr);

// Whether `program`'s body has a dynamic `if` or calls a global.
bool HasControlFlow(const Func& program);


}  // namespace pejit
