// \file Segments that only move bytes: places, not runs.
//
// A recursion that builds a matrix of its results (a minibatch's root
// states, `concat(@tree(%t).h, @roots(%rest), axis=0)`; a sequence's
// outputs) leaves segments whose program only moves the bytes of its inputs
// (jit/moves.h: concatenations, reshapes, slices, takes of constant rows).
// Run as segments, each was a run of its own per list position (a
// different row count each time), one after another: 33 runs of one row a
// minibatch of 32 trees, a tenth of a generic training step, and one
// segment program (one compile) per position. The inspector makes such a
// segment's outputs *moved places* instead (Inspection::moved): lists of
// byte blocks of its inputs' places, read where a run gathers its inputs
// and written where a backward adds its cotangents (generic/executor.h).
// No code runs them, and they add no level to the chain of runs. A
// segment that only adds whole values (a minibatch's losses summed by a
// recursion over its list, a Child-Sum Tree-LSTM's children's states) is
// a place too: its value is summed where a run reads it, in the order the
// segment would add, and its cotangent goes to every term.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ir/expr.h"
#include "ops/tensor.h"

namespace pejit::generic {

// Bytes [from, from + bytes) of node `source` go to [to, to + bytes).
struct MoveBlock {
  int source = 0;
  int64_t from = 0, to = 0, bytes = 0;
};

// A value of the segment: one of its inputs as it is, blocks of earlier
// nodes (in order of `to`, covering every byte of `type`), or the
// elementwise sum of earlier nodes (`sum`, f32, each of `type`, added as
// `add(sum[0], sum[1])` adds them).
struct MoveNode {
  int input = -1;
  std::vector<MoveBlock> blocks;
  std::vector<int> sum;
  TensorType type;
};

struct SegmentMoves {
  std::vector<MoveNode> nodes;  // the inputs first, each before the nodes reading it
  std::vector<int> outputs;     // per output of the segment, its node
};

// The moves `program` (a segment's: parameters, then operator calls, then a
// tuple of outputs) makes of its inputs, when every operation only moves
// bytes, or adds two f32 values of its result's type (a sum over a list
// written as a recursion, `add(%x, @sum(%rest))`, or a child-sum), and
// every type is fully known; nullopt otherwise (the segment computes: it
// runs). A view (reshape) is its operand's node: the same bytes.
std::optional<SegmentMoves> MovesOf(const Func& program);

}  // namespace pejit::generic
