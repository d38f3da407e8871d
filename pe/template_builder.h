// \file Internal to pe/: a recorded helper call made a PeTemplate, and a
// template's expressions rewritten for a replay.
#pragma once

#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "ir/visitor.h"
#include "pe/partial_eval.h"
#include "pe/pe_template.h"
#include "pe/pe_values.h"

namespace pejit::pe_detail {

// What the partial evaluator knows when a recorded unfolding ends: the scope
// its lets went to, the call memo, the run's statistics so far, and its table
// of ADT types.
struct RecordingContext {
  const Scope& scope;
  const std::vector<CallEntry>& calls;
  const PeStats& stats;
  std::function<const TypeDefPtr&(const TypeDef*)> adt_of;
};

// Fills `t` with the template of the finished, context-free unfolding `rec`
// whose result is `result`. False when something in it cannot be stood for
// (a variable from outside, a function value): the helper is not kept.
bool BuildTemplate(const Recording& rec, const RecordingContext& context, const PVal* result, PeTemplate& t);

// A kExpr binding of a template with fresh variables, over the slots' atoms.
class TemplateRewriter : public ExprMutator {
 public:
  TemplateRewriter(std::span<const std::pair<const VarNode*, int32_t>> free, const std::vector<Expr>& slots) {
    for (const auto& [var, slot] : free) memo_[var] = slots[slot];
  }

 protected:
  std::pair<Var, Expr> VisitLetBinding(const LetNode* n) override {
    Expr value = Mutate(n->value);
    Var var = MakeVar(n->var->name, n->var->annotation, n->var->loc);
    memo_[n->var.get()] = var;
    return {var, value};
  }
};

}  // namespace pejit::pe_detail
