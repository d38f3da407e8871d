// \file Operators that only move bytes: the view or the memcpy blocks a call is.
//
// An operator registered with a MoveKind (ops/op.h) computes nothing: its
// result is bytes of its operands. Lowering (jit/plan.h) makes a call of one
// a view of its operand where the bytes already lie as the result wants them
// (a reshape; a take of consecutive constant rows; a slice of the leading
// axis), else a copy step of blocks where they can be listed (a take of
// constant rows, a concatenation, a slice), else it stays a kernel. Both
// rules look at the call and its result type alone.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/expr.h"
#include "ops/op.h"

namespace pejit {

// Bytes [from, from + bytes) of a copy step's input `input` (an index into
// its `inputs`) go to [to, to + bytes) of its output.
struct CopyBlock {
  int input = 0;
  int64_t from = 0, to = 0, bytes = 0;
};

// Appends `b` to `blocks` (in order of `to`), extending the last block when
// `b` continues it in both input and output.
void AppendBlock(std::vector<CopyBlock>& blocks, const CopyBlock& b);

// When `call`'s result is bytes of its first operand as they lie (a
// reshape, or a block of consecutive rows: a batched value read in part),
// their byte offset there; nullopt otherwise.
std::optional<int64_t> ViewOffset(const OpCallNode& call, const TensorType& result);

// The blocks `call` moves, in order of `to`, when it only moves bytes, at
// most 65,536 of them; nullopt for other operators (and for indices out of
// range, which the kernel reports at run time).
std::optional<std::vector<CopyBlock>> CopyBlocks(const OpCallNode& call, const TensorType& result);

}  // namespace pejit
