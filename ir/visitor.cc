#include "ir/visitor.h"

#include <algorithm>
#include <unordered_set>

namespace pejit {
namespace {

void ForEachChild(const Expr& e, const std::function<void(const Expr&)>& fn) {
  switch (e->kind) {
    case ExprKind::kVar: case ExprKind::kConstant: case ExprKind::kGlobal: return;
    case ExprKind::kOpCall: for (const Expr& a : As<OpCallNode>(e)->args) fn(a); return;
    case ExprKind::kCall:
      fn(As<CallNode>(e)->callee);
      for (const Expr& a : As<CallNode>(e)->args) fn(a);
      return;
    case ExprKind::kLet:
      fn(As<LetNode>(e)->value);
      fn(As<LetNode>(e)->body);
      return;
    case ExprKind::kIf:
      fn(As<IfNode>(e)->cond);
      fn(As<IfNode>(e)->then_branch);
      fn(As<IfNode>(e)->else_branch);
      return;
    case ExprKind::kTuple: for (const Expr& f : As<TupleNode>(e)->fields) fn(f); return;
    case ExprKind::kProj: fn(As<ProjNode>(e)->tuple); return;
    case ExprKind::kFunc: fn(As<FuncNode>(e)->body); return;
    case ExprKind::kCtor: for (const Expr& a : As<CtorNode>(e)->args) fn(a); return;
    case ExprKind::kMatch:
      fn(As<MatchNode>(e)->scrutinee);
      for (const Clause& c : As<MatchNode>(e)->clauses) fn(c.body);
      return;
  }
}

}  // namespace

void PostOrderVisit(const Expr& root, const std::function<void(const Expr&)>& fn) {
  // An explicit stack: residual programs nest tens of thousands of lets deep.
  std::unordered_set<const ExprNode*> done;
  std::vector<std::pair<Expr, bool>> stack = {{root, false}};
  while (!stack.empty()) {
    auto [e, expanded] = stack.back();
    stack.pop_back();
    if (done.count(e.get())) continue;
    if (expanded) {
      done.insert(e.get());
      fn(e);
      continue;
    }
    stack.push_back({e, true});
    std::vector<Expr> children;
    ForEachChild(e, [&](const Expr& c) { children.push_back(c); });
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      if (!done.count(it->get())) stack.push_back({*it, false});
    }
  }
}

std::vector<const VarNode*> FreeVars(const FuncNode& f) {
  std::unordered_set<const ExprNode*> bound, seen;
  std::vector<const VarNode*> free;
  for (const Var& p : f.params) bound.insert(p.get());
  std::function<void(const Pattern&)> bind_pattern = [&](const Pattern& p) {
    if (p->var) bound.insert(p->var.get());
    for (const Pattern& sub : p->fields) bind_pattern(sub);
  };
  // Binders first (each variable is bound once, anywhere in the body), then uses.
  PostOrderVisit(f.body, [&](const Expr& e) {
    if (auto* let = As<LetNode>(e)) bound.insert(let->var.get());
    if (auto* fn = As<FuncNode>(e)) {
      for (const Var& p : fn->params) bound.insert(p.get());
    }
    if (auto* m = As<MatchNode>(e)) {
      for (const Clause& c : m->clauses) bind_pattern(c.pattern);
    }
  });
  PostOrderVisit(f.body, [&](const Expr& e) {
    if (e->kind == ExprKind::kVar && !bound.count(e.get()) && seen.insert(e.get()).second) {
      free.push_back(As<VarNode>(e));
    }
  });
  return free;
}

std::vector<std::string> ReferencedGlobals(const Expr& e) {
  std::vector<std::string> names;
  PostOrderVisit(e, [&](const Expr& n) {
    if (n->kind == ExprKind::kGlobal) names.push_back(As<GlobalNode>(n)->name);
  });
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

Expr ExprMutator::Mutate(const Expr& e) {
  auto it = memo_.find(e.get());
  if (it != memo_.end()) return it->second;
  Expr out;
  switch (e->kind) {
    case ExprKind::kVar: out = VisitVar(std::static_pointer_cast<const VarNode>(e)); break;
    case ExprKind::kConstant: out = VisitConstant(e); break;
    case ExprKind::kOpCall: out = VisitOpCall(As<OpCallNode>(e), e); break;
    case ExprKind::kCall: out = VisitCall(As<CallNode>(e), e); break;
    case ExprKind::kLet: out = MutateLetChain(e); break;
    case ExprKind::kIf: out = VisitIf(As<IfNode>(e), e); break;
    case ExprKind::kTuple: out = VisitTuple(As<TupleNode>(e), e); break;
    case ExprKind::kProj: out = VisitProj(As<ProjNode>(e), e); break;
    case ExprKind::kFunc: out = VisitFunc(As<FuncNode>(e), e); break;
    case ExprKind::kGlobal: out = VisitGlobal(e); break;
    case ExprKind::kCtor: out = VisitCtor(As<CtorNode>(e), e); break;
    case ExprKind::kMatch: out = VisitMatch(As<MatchNode>(e), e); break;
  }
  memo_[e.get()] = out;
  return out;
}

Expr ExprMutator::VisitVar(const Var& var) { return var; }

std::vector<Expr> ExprMutator::MutateAll(const std::vector<Expr>& es, bool* changed) {
  std::vector<Expr> out;
  out.reserve(es.size());
  for (const Expr& e : es) {
    out.push_back(Mutate(e));
    if (out.back() != e) *changed = true;
  }
  return out;
}

Expr ExprMutator::VisitOpCall(const OpCallNode* n, const Expr& self) {
  bool changed = false;
  auto args = MutateAll(n->args, &changed);
  return changed ? std::make_shared<OpCallNode>(n->op, std::move(args), n->attrs, n->loc) : self;
}

Expr ExprMutator::VisitCall(const CallNode* n, const Expr& self) {
  bool changed = false;
  Expr callee = Mutate(n->callee);
  auto args = MutateAll(n->args, &changed);
  return changed || callee != n->callee ? MakeCall(callee, std::move(args), n->loc) : self;
}

Expr ExprMutator::VisitIf(const IfNode* n, const Expr& self) {
  Expr c = Mutate(n->cond), t = Mutate(n->then_branch), e = Mutate(n->else_branch);
  return c != n->cond || t != n->then_branch || e != n->else_branch ? MakeIf(c, t, e, n->loc) : self;
}

Expr ExprMutator::VisitTuple(const TupleNode* n, const Expr& self) {
  bool changed = false;
  auto fields = MutateAll(n->fields, &changed);
  return changed ? MakeTuple(std::move(fields), n->loc) : self;
}

Expr ExprMutator::VisitProj(const ProjNode* n, const Expr& self) {
  Expr t = Mutate(n->tuple);
  return t != n->tuple ? std::make_shared<ProjNode>(t, n->index, n->loc, n->field) : self;
}

Expr ExprMutator::VisitFunc(const FuncNode* n, const Expr& self) {
  bool changed = false;
  std::vector<Var> params;
  for (const Var& p : n->params) {
    Expr m = Mutate(p);
    params.push_back(std::static_pointer_cast<const VarNode>(m));
    if (m != p) changed = true;
  }
  Expr body = Mutate(n->body);
  return changed || body != n->body ? MakeFunc(std::move(params), body, n->ret_type, n->loc, n->type_params) : self;
}

Expr ExprMutator::VisitCtor(const CtorNode* n, const Expr& self) {
  bool changed = false;
  auto args = MutateAll(n->args, &changed);
  return changed ? std::make_shared<CtorNode>(n->adt, n->tag, std::move(args), n->loc) : self;
}

Pattern ExprMutator::MutatePattern(const Pattern& p) {
  bool changed = false;
  std::vector<Pattern> fields;
  for (const Pattern& f : p->fields) {
    fields.push_back(MutatePattern(f));
    if (fields.back() != f) changed = true;
  }
  Var var = p->var;
  if (var) {
    var = std::static_pointer_cast<const VarNode>(Mutate(p->var));
    if (var != p->var) changed = true;
  }
  if (!changed) return p;
  auto out = std::make_shared<PatternNode>(*p);
  out->fields = std::move(fields);
  out->var = std::move(var);
  return out;
}

Expr ExprMutator::VisitMatch(const MatchNode* n, const Expr& self) {
  bool changed = false;
  Expr s = Mutate(n->scrutinee);
  std::vector<Clause> clauses;
  for (const Clause& c : n->clauses) {
    Clause m{MutatePattern(c.pattern), Mutate(c.body)};
    if (m.pattern != c.pattern || m.body != c.body) changed = true;
    clauses.push_back(std::move(m));
  }
  return changed || s != n->scrutinee ? MakeMatch(s, std::move(clauses), n->loc) : self;
}

std::pair<Var, Expr> ExprMutator::VisitLetBinding(const LetNode* n) {
  Expr value = Mutate(n->value);
  Var var = std::static_pointer_cast<const VarNode>(Mutate(n->var));
  return {var, value};
}

Expr ExprMutator::MutateLetChain(const Expr& e) {
  struct Step {
    const LetNode* let;
    Expr self;
    Var var;
    Expr value;
  };
  std::vector<Step> chain;
  Expr cur = e;
  while (cur->kind == ExprKind::kLet && !memo_.count(cur.get())) {
    const LetNode* let = As<LetNode>(cur);
    auto [var, value] = VisitLetBinding(let);
    chain.push_back({let, cur, var, value});
    cur = let->body;
  }
  Expr body = Mutate(cur);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const LetNode* let = it->let;
    Expr rebuilt = it->var == let->var && it->value == let->value && body == let->body
                       ? it->self
                       : MakeLet(it->var, it->value, body, let->loc);
    memo_[it->self.get()] = rebuilt;
    body = rebuilt;
  }
  return body;
}

namespace {

// Gives every bound variable a fresh node and rebuilds every node.
class Cloner : public ExprMutator {
 protected:
  Expr VisitVar(const Var& var) override {
    // Reached only for free variables (bound ones are in memo_): keep them.
    return var;
  }
  Var Fresh(const Var& v) {
    Var f = MakeVar(v->name, v->annotation, v->loc);
    memo_[v.get()] = f;
    return f;
  }
  Expr VisitConstant(const Expr& e) override {
    const auto* c = As<ConstantNode>(e);
    return MakeLiteral(c->value, c->retypes, e->loc);  // an unsuffixed number stays one
  }
  Expr VisitGlobal(const Expr& e) override { return MakeGlobal(As<GlobalNode>(e)->name, e->loc); }
  Expr VisitOpCall(const OpCallNode* n, const Expr&) override {
    return std::make_shared<OpCallNode>(n->op, Args(n->args), n->attrs, n->loc);
  }
  Expr VisitCall(const CallNode* n, const Expr&) override { return MakeCall(Mutate(n->callee), Args(n->args), n->loc); }
  Expr VisitIf(const IfNode* n, const Expr&) override {
    return MakeIf(Mutate(n->cond), Mutate(n->then_branch), Mutate(n->else_branch), n->loc);
  }
  Expr VisitTuple(const TupleNode* n, const Expr&) override { return MakeTuple(Args(n->fields), n->loc); }
  Expr VisitProj(const ProjNode* n, const Expr&) override {
    return std::make_shared<ProjNode>(Mutate(n->tuple), n->index, n->loc, n->field);
  }
  Expr VisitFunc(const FuncNode* n, const Expr&) override {
    std::vector<Var> params;
    for (const Var& p : n->params) params.push_back(Fresh(p));
    return MakeFunc(std::move(params), Mutate(n->body), n->ret_type, n->loc, n->type_params);
  }
  Expr VisitCtor(const CtorNode* n, const Expr&) override {
    return std::make_shared<CtorNode>(n->adt, n->tag, Args(n->args), n->loc);
  }
  Expr VisitMatch(const MatchNode* n, const Expr&) override {
    Expr s = Mutate(n->scrutinee);
    std::vector<Clause> clauses;
    for (const Clause& c : n->clauses) {
      Pattern p = ClonePattern(c.pattern);
      clauses.push_back({p, Mutate(c.body)});
    }
    return MakeMatch(s, std::move(clauses), n->loc);
  }
  std::pair<Var, Expr> VisitLetBinding(const LetNode* n) override {
    Expr value = Mutate(n->value);
    return {Fresh(n->var), value};
  }

 private:
  std::vector<Expr> Args(const std::vector<Expr>& es) {
    std::vector<Expr> out;
    for (const Expr& e : es) out.push_back(Mutate(e));
    return out;
  }
  Pattern ClonePattern(const Pattern& p) {
    auto out = std::make_shared<PatternNode>(*p);
    if (p->var) out->var = Fresh(p->var);
    out->fields.clear();
    for (const Pattern& f : p->fields) out->fields.push_back(ClonePattern(f));
    return out;
  }
};

}  // namespace

Func CloneFunc(const Func& f) {
  Cloner cloner;
  return std::static_pointer_cast<const FuncNode>(cloner.Mutate(f));
}

}  // namespace pejit
