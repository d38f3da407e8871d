// \file Per-example sizes: one segment program for every length, padded and masked.
//
// A tensor in the data whose length differs from example to example (a
// DAG encoder's sentence matrix of n rows, n from 5 to 25) makes the cells
// that read it one per length, and their segments one program per length:
// the examples of a minibatch then run as one small run per length, and the
// code grows with the lengths the data set holds. PadSegment makes one
// program of them: the first axis of each such input at one extent, the
// longest of a run's instances (bucketed), every shorter instance's input
// padded with zeros and its true length given as a mask, and every value
// the padded axes reach read as the instance's own program would:
//   - each operation reads zeros past the lengths (a `where` with the mask
//     before it, only where a value's padding may be other than zero), and
//     one whose derivative at zero is infinite (log, sqrt, a division by a
//     padded value) reads through a `where` even then, so that its
//     cotangent stops there;
//   - a reduction along a padded axis reads its identity there (-inf
//     before a max, a softmax, a logsumexp; zeros before a sum or a
//     contraction), and a mean divides by the true length, as the mean of
//     a loss over rows (cross_entropy, nll of per-row labels) does;
//   - an operation whose meaning depends on the length (slicing or
//     concatenating along a padded axis, reshaping one into another,
//     randomness) is refused: such a segment keeps one program per length.
// A result may have the per-example length along its first axis (a graph
// network's node states, passed from round to round): it holds zeros past
// it, and the executor reads each instance's rows of it, so that values of
// per-example length flow from run to run at whatever extent each run pads
// to. A parameter may have the length along several axes (an adjacency
// matrix (n, n)); a result only along its first.
// Zeros at every operation's input keep the backward pass exact too: a
// cotangent past the lengths is zero, and what multiplies it is finite.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/expr.h"
#include "support/refusal.h"

namespace pejit::generic {

// How one parameter of a segment is padded: the axes in `axes` (bit a:
// axis a; all of one length) at `extent` (0: the parameter is not padded);
// `masked` when some instance's length is shorter than `extent`.
struct PadTo {
  int64_t extent = 0;
  bool masked = false;
  uint32_t axes = 1;
  friend bool operator==(const PadTo&, const PadTo&) = default;
};

struct PaddedSegment {
  Func program;
  // Per result (the fields of the segment's result tuple): the parameter
  // whose length its first axis has, zeros past it; -1 where none.
  std::vector<int> lengths;
};

// `program` (a straight-line segment over one instance, returning a tuple)
// with its parameters padded as `pads` says (one per parameter, or fewer:
// the rest unpadded). One bool parameter `(extent,)` is appended per masked
// parameter, in their order, true at the positions its instance has (along
// each of its padded axes). Throws Refusal naming the operation that cannot
// be padded.
PaddedSegment PadSegment(const Func& program, const std::vector<PadTo>& pads);

// The extent a padded program is keyed by: segments whose programs differ
// only in their padded lengths have one key, the text of their program with
// every candidate padded and masked at this extent.
inline constexpr int64_t kPadKeyExtent = 7919;

}  // namespace pejit::generic
