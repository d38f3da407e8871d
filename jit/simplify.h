// \file The simplifications lowering runs first: straight-line programs in,
// equivalent straight-line programs out (same parameters), each alone. Each
// takes and returns the straight-line form (jit/straight.h), so that
// lowering decomposes a program once for all of them; the Func versions
// decompose and recompose around one (tests, the generic tier).
//
// Lowering (jit/plan.h) runs them in this order: FoldConstants,
// CombineSums, PackGemmOperands (where the CPU runs the packed micro-kernel),
// EliminateCommonSubexpressions, EliminateDeadCode. The generic tier's
// segment compiler uses PackableProduct and PackedProduct too.
#pragma once

#include <optional>

#include "ir/expr.h"
#include "jit/straight.h"
#include "ops/op.h"

namespace pejit {

Straight FoldConstants(Straight program);
Straight EliminateCommonSubexpressions(Straight program);
Straight EliminateDeadCode(Straight program);
Straight CombineSums(Straight program);
Straight PackGemmOperands(Straight program);
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
// alone with its operand stays OpenBLAS's.
Func PackGemmOperands(const Func& program);
// A product the micro-kernel can take: an f32 2-D matmul without
// transpose_a, or a dense. Returns the
// orientation (transpose_b) in which its right operand args[1] is packed;
// nullopt for anything else.
std::optional<bool> PackableProduct(const OpCallNode& call);
// `call` (a PackableProduct of type `result`) against `packed`: its right
// operand through gemm_pack in that orientation.
Expr PackedProduct(const OpCallNode& call, const Expr& packed, const TensorType& result);

}  // namespace pejit
