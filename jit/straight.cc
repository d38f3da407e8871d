#include "jit/straight.h"

#include <algorithm>
#include <string>

namespace pejit {

bool IsAtom(const Expr& e) { return e->kind == ExprKind::kVar || e->kind == ExprKind::kConstant; }

namespace {

// Why result `e` of a function defined at `def` is not atoms nested in
// tuples, or empty.
std::string ResultProblem(const Expr& e, const SourceLoc& def) {
  if (IsAtom(e)) return "";
  if (auto* t = As<TupleNode>(e)) {
    for (const Expr& f : t->fields) {
      if (std::string why = ResultProblem(f, def); !why.empty()) return why;
    }
    return "";
  }
  // A residual program is built, not parsed: its nodes rarely have a
  // position, its entry has the definition's.
  const SourceLoc& loc = e->loc.known() ? e->loc : def;
  std::string where = loc.known() ? loc.ToString() + ": " : std::string();
  if (auto* ctor = As<CtorNode>(e)) {
    return where + "the result must be tensors in tuples, not a " + ctor->adt->name + " value (" +
           ctor->ctor_name() + "): an entry returning a structure runs in the interpreter";
  }
  return where + "the result must be tensors in tuples, not a computation";
}

// Decomposes `f` into `*s` (only checks it, when null); returns why it is
// not straight-line tensor code, or empty when it is.
std::string TryDecompose(const Func& f, Straight* s) {
  if (s) s->params = f->params;
  for (const Var& p : f->params) {
    if (!AsTensor(p->annotation)) return "parameter %" + p->name + " is not a tensor";
    if (!AsTensor(p->annotation)->type.IsFullyKnown()) {
      // Shapes the program determines are known by now (refine_shapes.h):
      // this one it leaves open, so only its declaration can say it.
      return (p->loc.known() ? p->loc.ToString() + ": " : std::string()) + "%" + p->name + " is " +
             TypeToString(p->annotation) + ", a size the program does not determine (the values it may hold differ "
             "in it, or only a declaration with `?` gives it): write the size in the declaration of the value computed "
             "here";
    }
  }
  Expr e = f->body;
  while (e->kind == ExprKind::kLet) {
    const LetNode* let = As<LetNode>(e);
    const Expr& v = let->value;
    bool ok = IsAtom(v);
    if (auto* call = As<OpCallNode>(v)) {
      ok = std::all_of(call->args.begin(), call->args.end(), IsAtom);
    } else if (auto* t = As<TupleNode>(v)) {
      ok = std::all_of(t->fields.begin(), t->fields.end(), IsAtom);
    } else if (auto* p = As<ProjNode>(v)) {
      ok = p->tuple->kind == ExprKind::kVar;
    }
    if (!ok) {
      std::string what = v->kind == ExprKind::kIf ? "a dynamic if" : v->kind == ExprKind::kCall ? "a call" :
                         v->kind == ExprKind::kMatch ? "a match" : "a nested expression";
      std::string hint;
      if (auto* call = As<CallNode>(v)) {
        if (auto* global = As<GlobalNode>(call->callee)) {
          what += " of @" + global->name;
          hint = " (a residual function: partial evaluation left a recursion that the static arguments do not "
                 "bound, or ran out of fuel)";
        }
      }
      // A residual program is built, not parsed: its nodes have no file position.
      return (v->loc.known() ? v->loc.ToString() + ": " : std::string()) + "cannot compile " + what + " (%" +
             let->var->name + "); only straight-line tensor code is compiled" + hint;
    }
    if (!let->var->annotation) return "%" + let->var->name + " has no type";
    if (s) s->bindings.push_back({let->var, v});
    e = let->body;
  }
  if (std::string why = ResultProblem(e, f->loc); !why.empty()) return why;
  if (s) s->result = e;
  return "";
}

}  // namespace

Straight Decompose(const Func& f) {
  Straight s;
  if (std::string why = TryDecompose(f, &s); !why.empty()) throw JitFailure(why);
  return s;
}

std::string WhyNotStraightLine(const Func& f) { return TryDecompose(f, nullptr); }

Func Recompose(const Straight& s) {
  Expr body = s.result;
  for (auto it = s.bindings.rbegin(); it != s.bindings.rend(); ++it) body = MakeLet(it->var, it->value, body);
  return MakeFunc(s.params, body);
}

Expr Substitute(const Expr& e, const std::unordered_map<const ExprNode*, Expr>& subst) {
  if (e->kind == ExprKind::kVar) {
    auto it = subst.find(e.get());
    return it == subst.end() ? e : it->second;
  }
  auto all = [&](const std::vector<Expr>& es, bool& changed) {
    std::vector<Expr> out;
    for (const Expr& x : es) {
      out.push_back(Substitute(x, subst));
      changed |= out.back() != x;
    }
    return out;
  };
  bool changed = false;
  if (auto* c = As<OpCallNode>(e)) {
    auto args = all(c->args, changed);
    return changed ? std::make_shared<OpCallNode>(c->op, std::move(args), c->attrs, c->loc) : e;
  }
  if (auto* t = As<TupleNode>(e)) {
    auto fields = all(t->fields, changed);
    return changed ? MakeTuple(std::move(fields), t->loc) : e;
  }
  if (auto* p = As<ProjNode>(e)) {
    Expr tuple = Substitute(p->tuple, subst);
    if (tuple == p->tuple) return e;
    if (auto* t = As<TupleNode>(tuple)) return t->fields[p->index];
    return MakeProj(tuple, p->index, p->loc);
  }
  return e;
}

TensorType TensorTypeOf(const Expr& atom) {
  if (auto* c = As<ConstantNode>(atom)) return c->value.type();
  const TensorTypeNode* t = AsTensor(As<VarNode>(atom)->annotation);
  if (!t) throw JitFailure("%" + As<VarNode>(atom)->name + " is not a tensor");
  return t->type;
}


Type ResultTypeOf(const Expr& result) {
  if (auto* t = As<TupleNode>(result)) {
    std::vector<Type> fields;
    for (const Expr& f : t->fields) fields.push_back(ResultTypeOf(f));
    return TupleTy(std::move(fields));
  }
  return TensorTy(TensorTypeOf(result));
}

Type AtomType(const Expr& e) {
  switch (e->kind) {
    case ExprKind::kVar: return static_cast<const VarNode&>(*e).annotation;
    case ExprKind::kConstant: return TensorTy(static_cast<const ConstantNode&>(*e).value.type());
    case ExprKind::kProj: {
      const ProjNode& p = static_cast<const ProjNode&>(*e);
      const TupleTypeNode* tuple = AsTuple(AtomType(p.tuple));
      if (!tuple || p.index < 0 || static_cast<size_t>(p.index) >= tuple->fields.size()) return nullptr;
      return tuple->fields[p.index];
    }
    case ExprKind::kTuple: {
      std::vector<Type> fields;
      for (const Expr& f : static_cast<const TupleNode&>(*e).fields) {
        fields.push_back(AtomType(f));
        if (!fields.back()) return nullptr;
      }
      return TupleTy(std::move(fields));
    }
    default: return nullptr;
  }
}

}  // namespace pejit
