// \file The compiler's middle end: a residual program lowered to a plan of
// kernels over buffers, with its memory laid out in one arena.
//
// Lowering runs these passes, each small and testable alone:
//   1. Check: the program is straight-line tensor code (lets of operator
//      calls, tuples and projections) with fully known shapes.
//   2. Simplify (jit/simplify.h, Func to Func): constant folding, per-level
//      sums combined, products against one right operand sharing its packing
//      (where the CPU runs ops/packed_gemm.h's micro-kernel),
//      common-subexpression elimination, dead-code elimination.
//   3. Fuse: trees of elementwise/broadcast operators whose inner results have
//      one use become one kernel (one loop nest, no intermediate buffers).
//   4. Alias (the rules in jit/moves.h): reshape-like operators, and reads of a block of consecutive
//      rows (`take` of constant consecutive indices, `slice` of the leading
//      axis), view their input's bytes at an offset instead of copying.
//   5. Copy (jit/moves.h): operators that only move bytes (gathers of constant rows,
//      concatenations, stacks, slices) become lists of blocks to memcpy, and
//      a copy of bytes another copy just made (a gather into a concatenation,
//      then permuted) reads them where they came from: one step, no buffer
//      in between. A value concatenated whole is computed in place, inside
//      the concatenation's buffer.
//   6. Plan memory: every intermediate buffer gets an offset in one arena;
//      buffers whose lifetimes do not overlap share bytes.
// The plan prints as text (`pejit compile --emit fused`) and is what
// jit/compiler.cc turns into LLVM IR (fused steps) and runs (the others).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "jit/executable.h"
#include "jit/moves.h"
#include "jit/pass.h"
#include "ops/op.h"

namespace pejit {

struct PlanBuffer {
  enum class Kind : uint8_t { kParam, kConstant, kArena, kResult, kAlias };
  Kind kind;
  TensorType type;
  int param = -1;         // kParam: parameter index
  Tensor constant;        // kConstant
  int64_t offset = 0;     // kArena: byte offset in the arena; kAlias: in alias_of's bytes
  int result = -1;        // kResult: index among the result tensors
  int alias_of = -1;      // kAlias: buffer whose bytes it views
  int first_step = -1, last_step = -1;  // lifetime, in steps
  // kArena: the lane of every step reading or writing it (-1: none has a
  // lane), or kSeveralLanes.
  static constexpr int kSeveralLanes = -2;
  int lane = -1;
  std::string name;       // for printing

  int64_t bytes() const { return NumBytes(type); }
};

// One node of a fused kernel's per-element expression.
struct FusedNode {
  enum class Kind : uint8_t { kLoad, kImmediate, kOp };
  Kind kind;
  int buffer = -1;           // kLoad
  double immediate = 0;      // kImmediate (a scalar constant)
  ScalarOp op = ScalarOp::kNone;  // kOp
  double param = 0;          // kOp: pow's exponent, clip's lower bound
  double param2 = 0;         // kOp: clip's upper bound
  std::vector<int> args;     // kOp: indices of earlier nodes
  DType dtype = DType::kF32; // the node's element type
};

struct PlanStep {
  enum class Kind : uint8_t { kKernel, kFused, kCopy };
  Kind kind;
  // kKernel: a registered operator's kernel, called through the runtime.
  // kCopy: the operator (one with a MoveKind: take, concat, ...) whose bytes `blocks` move.
  const OpDef* op = nullptr;
  Attrs attrs;
  std::vector<int> inputs, outputs;  // buffers
  // kFused: `nodes` computes outputs[0] elementwise over its shape.
  std::vector<FusedNode> nodes;
  std::vector<std::string> fused_ops;  // names of the operators fused, in order
  // kCopy: every byte of outputs[0], in order of `to`.
  std::vector<CopyBlock> blocks;

  // Parts it splits into for threads (jit/schedule.h): rows of a fused
  // kernel's outermost loop, ranges of a copy's output, the operator's
  // KernelSplit for a kernel. 1: whole.
  int64_t parts = 1;
  // The lane of the minibatch's work it belongs to (jit/lanes.h), -1 for
  // none: lane k's steps are thread k's, its buffers in an arena region of
  // its own.
  int lane = -1;

  int64_t copied_bytes() const;  // of `blocks`
};

// Steps [begin, end) that touch no bytes another of them writes
// (jit/schedule.h): the steps of one depth, whose buffers the memory plan
// never lets share bytes.
struct PlanStage {
  int begin = 0, end = 0;
};

struct Plan {
  std::vector<PlanBuffer> buffers;
  std::vector<PlanStep> steps;
  std::vector<PlanStage> stages;  // cover `steps` in order
  std::vector<int> params;    // buffer per parameter
  std::vector<int> results;   // buffer per result tensor (depth first)
  Type result_type;
  int64_t arena_bytes = 0;    // after sharing
  int64_t buffer_bytes = 0;   // all intermediates side by side

  int64_t copied_bytes() const;  // what the copy steps move per run
  // The buffer whose bytes `buffer` views (itself unless a view) and the byte
  // offset there, following views of views.
  std::pair<int, int64_t> ViewOf(int buffer) const;

  int kernels() const { return static_cast<int>(steps.size()); }
  std::string ToString() const;
};

struct LowerOptions {
  bool fuse = true;
  bool cse = true;
  bool pack_gemm = true;  // PackGemmOperands (jit/simplify.h), where PackedGemmFast()
  // Shown each lowering pass (jit/pass.h); null: none. Not owned.
  const PassInstrument* instrument = nullptr;
};

// Lowers a residual program; throws JitFailure naming what it cannot compile.
Plan Lower(const Func& program, const LowerOptions& options = {});

// A fused step's loop nest: its output's shape with inner size-1 dimensions
// dropped and adjacent inner ones merged where every operand walks them
// contiguously. The outermost dimension stays as it is, even of size 1: it is
// the kernel's argument, so that a cell computed for one tree node ((1, H))
// and for a batch of them ((n, 1, H)) calls the same kernel.
struct LoopNest {
  Shape dims;                       // extents, outermost first
  std::vector<Shape> load_strides;  // per load, in elements (0: broadcast)
  std::vector<int> loads;           // indices of the step's load nodes
};

// A fused step's nest; throws JitFailure when a load's shape does not
// broadcast to the output's (an image's plan is checked with it, jit/image.h).
LoopNest NestOf(const Plan& plan, const PlanStep& step);

// What a fused step's kernel computes, up to its outermost extent (the
// kernel's argument): steps with equal keys call one function, and an
// image's kernel is the one compiled for its step's key.
std::string FusedKernelKey(const Plan& plan, const PlanStep& step, const LoopNest& nest);

}  // namespace pejit
