// \file Native code for residual programs with control flow (value mode).
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
// Gradients through control flow are not compiled yet: a grad-mode program
// with an `if` or a call is refused (autodiff.h says so first).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "jit/compiler.h"
#include "jit/executable.h"

namespace pejit {

struct ControlFlowStats {
  int regions = 0;   // compiled straight-line regions, in every function
  int branches = 0;  // dynamic `if`s
  int calls = 0;     // calls of residual functions
};

// `main` and the residual functions it calls (by name, as MakeGlobal spells
// them). Throws JitFailure naming what it cannot compile: a program without
// control flow (CompileResidual serves it), a region LLVM refuses, a value
// that is not tensors in tuples crossing between regions.
ExecutablePtr CompileControlFlow(JitSession& session, const Func& main,
                                 const std::vector<std::pair<std::string, Func>>& functions,
                                 const CompileOptions& options = {}, ControlFlowStats* stats = nullptr);

// Whether `program`'s body has a dynamic `if` or calls a global.
bool HasControlFlow(const Func& program);

// The type of an atom (variables, constants, projections and tuples of
// them) from its variables' annotations, without type-checking the program
// around it; null for anything else.
Type AtomType(const Expr& atom);

}  // namespace pejit
