// \file Shapes from what a residual program computes, not from what its source declared.
//
// Partial evaluation types a residual `if` and a residual function's result
// by their declarations: `type Row = Tensor[(1, ?), f32]` leaves a loop's
// carried state `(1, ?)` although every iteration gives `(1, 64)`, and the
// control-flow compiler (control_flow.h) needs known shapes to plan memory.
// RefineShapes gives every let-bound variable and every residual function's
// parameters the most precise type the definitions give: an `if`'s is the
// join of its branches' (dims that agree stay known), a residual function's
// result and parameters are the least fixpoint over its body and every call
// of it (a recursion is assumed to give nothing until a path out of it gives
// something). A dim the program does not determine stays `?`.
//
// The result never contradicts a declaration: where the inferred and the
// declared types disagree on a known dim (a program the interpreter stops
// with a type error), the declaration is kept for the checks downstream.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"

namespace pejit {

struct RefinedProgram {
  Func main;
  std::vector<std::pair<std::string, Func>> functions;
  int refined = 0;  // variables whose type became more precise
};

// `main` and the residual functions it calls by name (MakeGlobal), with
// refined annotations; unchanged nodes are shared.
RefinedProgram RefineShapes(const Func& main, const std::vector<std::pair<std::string, Func>>& functions);

// The least upper bound of two types of one structure: dims that differ
// become `?`; null is "nothing known yet" (the join's identity). Null when
// they differ in dtype, rank or structure.
Type JoinTypes(const Type& a, const Type& b);

}  // namespace pejit
