// \file Lanes: a minibatch's independent work divided between threads.
//
// A residual program evaluates its minibatch's examples one after another
// (partial evaluation follows the program's order: a map over trees leaves
// tree 1's cells, then tree 2's, ...), and they meet only at the end (the
// loss over every root) and in the weight gradients. Two threads dividing
// every batched step by rows (jit/schedule.h) keep exchanging rows: a level
// gathers its children from rows the other core wrote, arena bytes change
// hands from buffer to buffer, and each weight gradient reads every row.
// On a machine where a cache line takes half a microsecond from one core to
// the other, that costs as much as dividing saves.
//
// Instead, SplitIntoLanes cuts the program's bindings, in their order, into
// `lanes` contiguous ranges of about equal estimated work, each cut where
// the fewest bytes flow across it (between two trees rather than inside
// one). Batching then merges instances within a lane only: each lane has its
// own batched step per level, its own buffers (a region of the arena of its
// own, jit/plan.h) and its own weight-gradient products, summed across lanes
// in lane order at the end (jit/simplify.h). Thread k runs lane k's steps
// (native_executable.h), so a lane's rows stay in one core's caches through
// the whole step, call after call.
//
// The lanes are fixed by the program alone, never by the threads at hand:
// a plan computes the same bits on one thread or many. A lane is carried by
// each operation's SourceLoc::lane.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jit/straight.h"

namespace pejit {

// A program below this estimated work (multiply-adds and elements written,
// jit/lanes.cc) stays in one lane: a couple of ListOps trees (a Tree-LSTM
// training step of ~0.1 ms). Lanes cost at compile time (twice the batched
// operations to differentiate, lower and compile) and gain little on short
// steps (0.7-1.5 ms: 1.08x on two threads); but a step in one lane on two
// threads loses more (0.85-0.9x: its split steps' parts cross cores), and
// the large programs, which hold most of the compile time, are in lanes
// anyway.
inline constexpr double kMinLaneWork = 5e6;

struct LaneSplit {
  int lanes = 1;
  std::vector<int> lane_of;  // per binding of the program; -1 (no lane) when one lane
  double work = 0;           // estimated, in total
  int64_t cut_bytes = 0;     // bytes one lane reads of values another computed
  std::string why_one;       // why one lane, when lanes == 1
};

// At most `max_lanes` lanes (1: one lane, nothing divided). One lane when the
// program is small, or does not divide: no cut within reach of an even share
// of the work leaves the lanes reading little of one another's values.
LaneSplit SplitIntoLanes(const Straight& program, int max_lanes);

// Multiply-adds of a product, plus the elements an operation writes (`var`
// = `value`): what decides how long its batched step takes, roughly. Zero
// for what is not an operator call.
double OperationWork(const Var& var, const Expr& value);

// `loc` in lane `lane`.
SourceLoc InLane(SourceLoc loc, int lane);

}  // namespace pejit
