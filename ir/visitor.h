// \file Walking and rewriting IR.
//
// ExprMutator is the base of passes that take IR and return IR (LLVM/Halide
// style): override the Visit method of the node kinds a pass changes; the rest
// are rebuilt only when a child changed, so untouched subtrees stay shared.
// Results are memoized per node, so a DAG stays a DAG. Let-chains are walked
// with a loop, not recursion, because residual programs are long chains.
#pragma once

#include <functional>
#include <unordered_map>
#include <vector>

#include "ir/expr.h"

namespace pejit {

// Calls fn on every expression node reachable from e, each once, children
// before parents (pattern variables are not visited).
void PostOrderVisit(const Expr& e, const std::function<void(const Expr&)>& fn);

// Variables used in f's body but bound outside f: what a closure captures.
std::vector<const VarNode*> FreeVars(const FuncNode& f);

// Names of the globals that e refers to, sorted, without duplicates.
std::vector<std::string> ReferencedGlobals(const Expr& e);

class ExprMutator {
 public:
  virtual ~ExprMutator() = default;
  Expr Mutate(const Expr& e);
  Pattern MutatePattern(const Pattern& p);

 protected:
  // Each returns the rewritten node; the defaults rebuild from mutated children.
  virtual Expr VisitVar(const Var& var);
  virtual Expr VisitConstant(const Expr& e) { return e; }
  virtual Expr VisitOpCall(const OpCallNode* n, const Expr& self);
  virtual Expr VisitCall(const CallNode* n, const Expr& self);
  virtual Expr VisitIf(const IfNode* n, const Expr& self);
  virtual Expr VisitTuple(const TupleNode* n, const Expr& self);
  virtual Expr VisitProj(const ProjNode* n, const Expr& self);
  virtual Expr VisitFunc(const FuncNode* n, const Expr& self);
  virtual Expr VisitGlobal(const Expr& e) { return e; }
  virtual Expr VisitCtor(const CtorNode* n, const Expr& self);
  virtual Expr VisitMatch(const MatchNode* n, const Expr& self);
  // One binding of a let-chain: returns the new binding's variable and value.
  // The default mutates both (a var that maps to itself is kept).
  virtual std::pair<Var, Expr> VisitLetBinding(const LetNode* n);

  // A variable maps to itself unless a pass records otherwise.
  std::unordered_map<const ExprNode*, Expr> memo_;

 private:
  Expr MutateLetChain(const Expr& e);
  std::vector<Expr> MutateAll(const std::vector<Expr>& es, bool* changed);
};

// A copy of f with fresh nodes and fresh variables throughout (sharing inside
// f is kept). The module checks and publishes copies, so a caller's nodes are
// never written by type checking.
Func CloneFunc(const Func& f);

}  // namespace pejit
