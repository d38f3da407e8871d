// \file Branches and loops on tensor values, batched across a minibatch's examples.
//
// Partial evaluation of a minibatch loss leaves, per example, the same
// control flow wherever the data decides it: an `if` on the example's
// tensors, whose branch calls a residual function (a loop the data ends,
// as in adaptive computation time). The control-flow compiler
// (control_flow.h) runs each example's branches and iterations alone, a
// few rows of work per step. BatchBranches makes the independent instances
// of one such branch in `main` (isomorphic, up to which variables they
// read, none reading another's result) one computation over their examples
// stacked along a new leading axis, and each residual function it calls a
// function over stacked rows:
//   - straight-line code runs once for every row (jit/vectorize.h's rules);
//   - an `if` on a stacked condition runs each branch once, for the rows
//     that take it, if any does, and a `where` picks each row's result: the
//     i-th iteration of every example still looping is one batched step,
//     and the loop ends when its last example does;
//   - a branch's rows that do not take it compute a copy of a row that
//     does (every stacked value it reads is gathered from such a row first).
//     So no row evaluates an operation on values its own example never gave
//     it: no index out of range, no log of a negative, no NaN whose zero
//     cotangent would still poison a weight's gradient (0 * NaN), as a
//     plain select of both branches would (jax.vmap of lax.cond).
// Rows whose values no caller reads (outside a branch's mask) get zero
// cotangents, so gradients equal the per-example program's.
//
// A stacked function takes, after its arguments, what the rows outside its
// mask return (`acc`), and merges each row's result into it where the row
// leaves: a loop's next iteration stays a tail call, which the driver runs
// in one frame however many iterations the longest example takes.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"

namespace pejit {

struct BatchedBranches {
  Func main;
  std::vector<std::pair<std::string, Func>> functions;  // the originals, then the stacked versions
  int groups = 0;  // sets of independent instances made one
  int rows = 0;    // instances in them
};

// `main` and the residual functions it calls by name, with fully known
// shapes (after refine_shapes.h). A set of instances it cannot batch (a
// shape still open, a construct it does not handle) is left as it was.
BatchedBranches BatchBranches(const Func& main, const std::vector<std::pair<std::string, Func>>& functions);

}  // namespace pejit
