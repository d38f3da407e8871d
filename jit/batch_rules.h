// \file How one operator runs over instances stacked along a new leading axis.
//
// Both batching passes use these rules: Batch() (jit/batch.h), which merges
// the isomorphic operator calls of one residual program, and Vectorize()
// (jit/vectorize.h), which turns a program over one instance into the same
// program over N instances. An operand is *stacked* (one slice per
// instance, along a new axis 0) or *shared* (the same value for every
// instance: a weight matrix, an embedding table); an operator's rule, which
// its registration names (OpDef::batch), says which operands may be which,
// and how the operator's attributes change.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/expr.h"
#include "jit/straight.h"

namespace pejit {

// The operator's BatchRule (ops/op.h), where it applies to this call: a
// GEMM batches only over the rows of a 2-D first operand that is not
// transposed.
BatchRule BatchRuleOf(const OpCallNode& call);
// GEMMs, gathers and reductions (layer_norm among them): what batching is for.
bool IsHeavy(BatchRule rule);
// Operands every instance must share under the rule (a GEMM's weights).
bool MustShare(BatchRule rule, size_t position);
// Operands that must be stacked for the rule to mean anything.
bool MustStack(BatchRule rule, size_t position);

// Appends typed let bindings of operator calls and projections, named
// `prefix` + a counter: the straight-line code a batching pass emits.
class StraightEmitter {
 public:
  explicit StraightEmitter(std::string prefix = "b") : prefix_(std::move(prefix)) {}
  // Normalizes the attributes and infers the result type (throws OpError).
  Var Op(std::string_view op, std::vector<Expr> args, const Attrs& attrs, const SourceLoc& loc);
  Var Proj(const Expr& tuple, int index, const SourceLoc& loc);
  // A binding made by the caller (a copy of an input binding).
  void Append(Var var, Expr value) { bindings_.push_back({std::move(var), std::move(value)}); }
  Var Fresh(Type type) { return MakeVar(prefix_ + std::to_string(fresh_++), std::move(type)); }

  std::vector<Binding>& bindings() { return bindings_; }

 private:
  std::string prefix_;
  std::vector<Binding> bindings_;
  int fresh_ = 0;
};

// `shape` with a leading axis of `n`.
Shape Prepend(int64_t n, const Shape& shape);

// Emits `call` applied to `k` instances: `args[p]` is stacked (shape
// (k, member...)) where `stacked[p]`, else the shared member operand. Returns
// the stacked outputs. The rule must not be kNone, and must-share operands
// must not be stacked.
std::vector<Var> EmitStackedOp(StraightEmitter& out, const OpCallNode& call, BatchRule rule,
                               std::vector<Expr> args, const std::vector<bool>& stacked, int64_t k);

}  // namespace pejit
