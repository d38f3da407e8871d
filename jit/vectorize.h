// \file A program over one instance made a program over N instances at once.
//
// The structure-generic tier (generic/) runs each straight-line segment of a
// model's cell once per (segment, level) for every instance at that level: N
// tree nodes of one height, N list positions, N trees. Vectorize() turns the
// segment, written for one instance, into the same computation over N
// instances stacked along a new leading axis: what `jax.vmap` does, with
// jit/batch_rules.h's rules (a GEMM over all rows against the shared weight,
// one gather for all the indices). An operator without a rule for its
// operands runs once per instance on that instance's slice, and the slices'
// results are stacked again, so every program vectorizes.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/expr.h"

namespace pejit {

// `program` is straight-line tensor code (jit/straight.h). Parameter p is
// one instance's value where `stacked[p]` (it becomes a parameter of type
// (rows, member...)), else a value all instances share (its type is kept).
// Every tensor of the result is stacked: (rows, member...), in the same
// tuple structure. Throws JitFailure for a program that is not straight-line.
Func Vectorize(const Func& program, const std::vector<bool>& stacked, int64_t rows);

}  // namespace pejit
