// \file Auto-batching: independent instances of one computation become one.
//
// Partial evaluation against a minibatch of trees leaves one copy of the
// model's cell per tree node: hundreds of 1-row GEMMs and small elementwise
// kernels. Batch() merges operator calls that are instances of the same
// computation and do not depend on one another into one call over stacked
// operands, the way TensorFlow Fold and DyNet's autobatching do at run time;
// here it happens once per specialization, at compile time.
//
// Which calls are instances of one computation: same program point (source
// location of the operator call the partial evaluator unrolled), operator,
// attributes and operand types, and the same value for the operands the
// operator's batching rule needs shared (a GEMM's weight matrix, an embedding
// table). Among them, the instance's *level* is one more than the largest
// level of the instances of the same computation it depends on; instances of
// equal level never depend on one another. For a Tree-LSTM, the cell of every
// node of height h across the minibatch shares one level, whatever the shape
// of the trees around it.
//
// Scheduling is agenda-based: a group is emitted once all its members are
// computable; when no group is complete (a dependency cycle between groups),
// the one with most computable members is emitted in part.
//
// A batched value is the members' values stacked along a new leading axis.
// Operands are gathered from earlier batches with `take`, and a member's row
// is read back with `take` where an unbatched operator needs it. The order of
// a batch's rows is chosen so that an operand's rows are read in the order
// they lie: whole, or in blocks of consecutive rows, which lowering turns into
// views of the batch (jit/plan.h); BatchStats counts the bytes still copied. The result is ordinary straight-line IR with the same parameters:
// it type-checks, runs in the interpreter and differentiates.
#pragma once

#include <cstdint>
#include <string>

#include "ir/expr.h"

namespace pejit {

struct BatchStats {
  int64_t ops_before = 0;     // operator calls in the input
  int64_t ops_after = 0;      // ... in the output (batched calls, gathers and reads included)
  int64_t groups = 0;         // batched calls emitted (two instances or more)
  int64_t batched_ops = 0;    // instances merged into them
  int64_t copied_bytes = 0;   // bytes moved per run by gathers and concatenations (views are free)
  int lanes = 1;              // jit/lanes.h
  int64_t lane_cut_bytes = 0;  // ... bytes one lane reads of another's values
  std::string why_one_lane;   // ... why one, when one
  double seconds = 0;

  std::string ToString() const;  // "groups=41 (3000 ops) ops 6666 -> 520 copied=1.2KiB lanes=2"
};

// Instances are merged within a lane only: the program's bindings are first
// cut into at most `max_lanes` lanes (jit/lanes.h), each batched operation
// carrying its lane in its SourceLoc.
//
// Throws JitFailure when `program` is not straight-line tensor code (see
// jit/straight.h).
Func Batch(const Func& program, BatchStats* stats = nullptr, int max_lanes = 1);

}  // namespace pejit
