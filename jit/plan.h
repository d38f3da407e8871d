// \file The compiler's middle end: a residual program lowered to a plan of
// kernels over buffers, with its memory laid out in one arena.
//
// Lowering runs these passes, each small and testable alone (jit/plan.cc):
//   1. Check: the program is straight-line tensor code (lets of operator
//      calls, tuples and projections) with fully known shapes.
//   2. Simplify: constant folding, per-level sums combined, products
//      against one right operand sharing its packing (where the CPU runs
//      ops/packed_gemm.h's micro-kernel), common-subexpression elimination,
//      dead-code elimination.
//   3. Fuse: trees of elementwise/broadcast operators whose inner results have
//      one use become one kernel (one loop nest, no intermediate buffers).
//   4. Alias: reshape-like operators, and reads of a block of consecutive
//      rows (`take` of constant consecutive indices, `slice` of the leading
//      axis), view their input's bytes at an offset instead of copying.
//   5. Copy: operators that only move bytes (gathers of constant rows,
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

// Bytes [from, from + bytes) of a copy step's input `input` (an index into
// its `inputs`) go to [to, to + bytes) of its output.
struct CopyBlock {
  int input = 0;
  int64_t from = 0, to = 0, bytes = 0;
};

struct PlanStep {
  enum class Kind : uint8_t { kKernel, kFused, kCopy };
  Kind kind;
  // kKernel: a registered operator's kernel, called through the runtime.
  // kCopy: the operator (take, concat, stack, slice, copy) whose bytes `blocks` move.
  const OpDef* op = nullptr;
  Attrs attrs;
  std::vector<int> inputs, outputs;  // buffers
  // kFused: `nodes` computes outputs[0] elementwise over its shape.
  std::vector<FusedNode> nodes;
  std::vector<std::string> fused_ops;  // names of the operators fused, in order
  // kCopy: every byte of outputs[0], in order of `to`.
  std::vector<CopyBlock> blocks;

  int64_t copied_bytes() const;  // of `blocks`
};

struct Plan {
  std::vector<PlanBuffer> buffers;
  std::vector<PlanStep> steps;
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
  bool pack_gemm = true;  // PackGemmOperands, where PackedGemmFast()
};

// Lowers a residual program; throws JitFailure naming what it cannot compile.
Plan Lower(const Func& program, const LowerOptions& options = {});

// The passes, exposed for tests: each takes a straight-line program and
// returns an equivalent one (same parameters).
Func FoldConstants(const Func& program);
Func EliminateCommonSubexpressions(const Func& program);
Func EliminateDeadCode(const Func& program);
// Sums whose terms are computed per tree level become one computation over
// all levels' rows:
//  - scatter_adds of literal constant indices (so, after FoldConstants) into
//    the same rows (a batched value's gradient, gathered from by many levels)
//    become one scatter_add of the values concatenated: one zeroed buffer,
//    not one per term;
//  - products over rows, matmul(a_i, b_i, transpose_a=true) (a weight's
//    gradient, one per level), become one matmul of the a_i and of the b_i
//    concatenated: one GEMM whose inner dimension is every level's rows,
//    not many with a few rows each.
// Reassociates the sum: the last bits may differ.
Func CombineSums(const Func& program);
// f32 2-D matmuls (lhs not transposed) and denses that share a right operand
// in one orientation become a gemm_pack of it and packed_matmul /
// packed_dense against it; CSE then leaves one pack per operand, so a weight
// read by every tree level, forward and backward, is packed once per
// orientation per call instead of by OpenBLAS at every product. A product
// alone with its operand stays OpenBLAS's. Not for inner dimensions over
// 1024.
Func PackGemmOperands(const Func& program);
// A product the micro-kernel can take: an f32 2-D matmul without
// transpose_a, or a dense, inner dimension at most 1024. Returns the
// orientation (transpose_b) in which its right operand args[1] is packed;
// nullopt for anything else.
std::optional<bool> PackableProduct(const OpCallNode& call);
// `call` (a PackableProduct of type `result`) against `packed`: its right
// operand through gemm_pack in that orientation.
Expr PackedProduct(const OpCallNode& call, const Expr& packed, const TensorType& result);

}  // namespace pejit
