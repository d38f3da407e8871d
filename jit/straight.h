// \file The straight-line form the compiler's passes work on.
//
// A residual program the JIT compiles is a chain of lets whose values are
// operator calls on atoms (variables and constants), tuples of atoms, or
// projections of a variable, ending in atoms nested in tuples. Decompose()
// checks that and returns the chain as a vector; Recompose() turns it back
// into IR. Passes (jit/plan.h, jit/batch.h) edit the vector.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "ir/expr.h"
#include "jit/executable.h"

namespace pejit {

struct Binding {
  Var var;
  Expr value;  // an operator call, a tuple of atoms, or a projection of a variable
};

struct Straight {
  std::vector<Var> params;
  std::vector<Binding> bindings;
  Expr result;  // an atom or a tuple (nested) of atoms
};

bool IsAtom(const Expr& e);

// Calls fn on every atom a binding's value reads: an operator call's
// arguments, a tuple's fields, the tuple a projection reads, or the atom
// itself.
template <typename Fn>
void ForEachOperand(const Expr& value, Fn&& fn) {
  if (IsAtom(value)) fn(value);
  if (auto* c = As<OpCallNode>(value)) for (const Expr& a : c->args) fn(a);
  if (auto* t = As<TupleNode>(value)) for (const Expr& f : t->fields) fn(f);
  if (auto* p = As<ProjNode>(value)) fn(p->tuple);
}

// Throws JitFailure naming the first construct that is not straight-line
// tensor code (a dynamic if, a call, a match), or a parameter whose shape is
// not fully known.
Straight Decompose(const Func& f);
// What Decompose would throw, or empty when `f` is straight-line tensor code:
// the check passes make before a pass that needs that form.
std::string WhyNotStraightLine(const Func& f);
Func Recompose(const Straight& s);

// Rewrites the variables of an expression through `subst`; a projection of a
// tuple that becomes a literal tuple becomes its field.
Expr Substitute(const Expr& e, const std::unordered_map<const ExprNode*, Expr>& subst);

// The tensor type of an atom; throws JitFailure when it is not a tensor.
TensorType TensorTypeOf(const Expr& atom);

// The type of a straight-line result (Straight::result): atoms nested in tuples.
Type ResultTypeOf(const Expr& result);

// The type of an atom (variables, constants, projections and tuples of
// them) from its variables' annotations, without type-checking the program
// around it; null for anything else (or a variable without annotation).
Type AtomType(const Expr& atom);

}  // namespace pejit
