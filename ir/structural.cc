#include "ir/structural.h"

#include <cstring>
#include <functional>
#include <unordered_map>

namespace pejit {
namespace {

class EqualChecker {
 public:
  bool Equal(const Expr& a_in, const Expr& b_in) {
    // Let-chains in a loop: residual programs are chains of thousands of lets.
    Expr a = a_in, b = b_in;
    while (a != b && a && b && a->kind == ExprKind::kLet && b->kind == ExprKind::kLet) {
      auto *x = As<LetNode>(a), *y = As<LetNode>(b);
      if (!Equal(x->value, y->value) || !Bind(x->var, y->var)) return false;
      a = x->body;
      b = y->body;
    }
    if (a == b) return true;
    if (!a || !b || a->kind != b->kind) return false;
    switch (a->kind) {
      case ExprKind::kVar: {
        auto it = bound_.find(a.get());
        return it != bound_.end() ? it->second == b.get() : false;
      }
      case ExprKind::kConstant:
        return pejit::Equal(As<ConstantNode>(a)->value, As<ConstantNode>(b)->value);
      case ExprKind::kOpCall: {
        auto *x = As<OpCallNode>(a), *y = As<OpCallNode>(b);
        return x->op == y->op && x->attrs == y->attrs && All(x->args, y->args);
      }
      case ExprKind::kCall: {
        auto *x = As<CallNode>(a), *y = As<CallNode>(b);
        return Equal(x->callee, y->callee) && All(x->args, y->args);
      }
      case ExprKind::kLet: return false;  // handled above
      case ExprKind::kIf: {
        auto *x = As<IfNode>(a), *y = As<IfNode>(b);
        return Equal(x->cond, y->cond) && Equal(x->then_branch, y->then_branch) &&
               Equal(x->else_branch, y->else_branch);
      }
      case ExprKind::kTuple: return All(As<TupleNode>(a)->fields, As<TupleNode>(b)->fields);
      case ExprKind::kProj: {
        auto *x = As<ProjNode>(a), *y = As<ProjNode>(b);
        return x->index == y->index && x->field == y->field && Equal(x->tuple, y->tuple);
      }
      case ExprKind::kFunc: {
        auto *x = As<FuncNode>(a), *y = As<FuncNode>(b);
        if (x->params.size() != y->params.size() || x->type_params != y->type_params ||
            !TypeEqual(x->ret_type, y->ret_type)) {
          return false;
        }
        for (size_t i = 0; i < x->params.size(); ++i) {
          if (!Bind(x->params[i], y->params[i])) return false;
        }
        return Equal(x->body, y->body);
      }
      case ExprKind::kGlobal: return As<GlobalNode>(a)->name == As<GlobalNode>(b)->name;
      case ExprKind::kCtor: {
        auto *x = As<CtorNode>(a), *y = As<CtorNode>(b);
        return x->adt->name == y->adt->name && x->tag == y->tag && All(x->args, y->args);
      }
      case ExprKind::kMatch: {
        auto *x = As<MatchNode>(a), *y = As<MatchNode>(b);
        if (!Equal(x->scrutinee, y->scrutinee) || x->clauses.size() != y->clauses.size()) return false;
        for (size_t i = 0; i < x->clauses.size(); ++i) {
          if (!PatternEqual(x->clauses[i].pattern, y->clauses[i].pattern) ||
              !Equal(x->clauses[i].body, y->clauses[i].body)) {
            return false;
          }
        }
        return true;
      }
    }
    return false;
  }

 private:
  // Variables bound in `a`, mapped to their counterparts in `b`.
  std::unordered_map<const ExprNode*, const ExprNode*> bound_;

  bool Bind(const Var& a, const Var& b) {
    if (!TypeEqual(a->annotation, b->annotation)) return false;
    bound_[a.get()] = b.get();
    return true;
  }

  bool All(const std::vector<Expr>& a, const std::vector<Expr>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!Equal(a[i], b[i])) return false;
    }
    return true;
  }

  bool PatternEqual(const Pattern& a, const Pattern& b) {
    if (a->kind != b->kind || a->fields.size() != b->fields.size()) return false;
    if (a->kind == PatternKind::kVar && !Bind(a->var, b->var)) return false;
    if (a->kind == PatternKind::kCtor && (a->adt->name != b->adt->name || a->tag != b->tag)) return false;
    for (size_t i = 0; i < a->fields.size(); ++i) {
      if (!PatternEqual(a->fields[i], b->fields[i])) return false;
    }
    return true;
  }
};

class Hasher {
 public:
  size_t Hash(const Expr& e_in) {
    Expr e = e_in;
    while (e->kind == ExprKind::kLet) {  // let-chains in a loop
      auto* n = As<LetNode>(e);
      Mix(static_cast<size_t>(ExprKind::kLet));
      Hash(n->value);
      Bind(n->var);
      e = n->body;
    }
    Mix(static_cast<size_t>(e->kind));
    switch (e->kind) {
      case ExprKind::kVar: {
        auto it = bound_.find(e.get());
        // Bound variables hash by binding order, free ones by identity.
        Mix(it != bound_.end() ? it->second : std::hash<const void*>{}(e.get()));
        break;
      }
      case ExprKind::kConstant: {
        const Tensor& t = As<ConstantNode>(e)->value;
        Mix(static_cast<size_t>(t.dtype()));
        for (int64_t d : t.shape()) Mix(static_cast<size_t>(d));
        Mix(std::hash<std::string_view>{}(
            std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes())));
        break;
      }
      case ExprKind::kOpCall: {
        auto* n = As<OpCallNode>(e);
        Mix(std::hash<std::string>{}(n->op->name));
        Mix(n->attrs.Hash());
        for (const Expr& a : n->args) Hash(a);
        break;
      }
      case ExprKind::kCall: {
        auto* n = As<CallNode>(e);
        Hash(n->callee);
        for (const Expr& a : n->args) Hash(a);
        break;
      }
      case ExprKind::kLet: break;  // handled above
      case ExprKind::kIf: {
        auto* n = As<IfNode>(e);
        Hash(n->cond);
        Hash(n->then_branch);
        Hash(n->else_branch);
        break;
      }
      case ExprKind::kTuple:
        for (const Expr& f : As<TupleNode>(e)->fields) Hash(f);
        Mix(As<TupleNode>(e)->fields.size());
        break;
      case ExprKind::kProj:
        Mix(static_cast<size_t>(As<ProjNode>(e)->index));
        Mix(std::hash<std::string>{}(As<ProjNode>(e)->field));
        Hash(As<ProjNode>(e)->tuple);
        break;
      case ExprKind::kFunc: {
        auto* n = As<FuncNode>(e);
        for (const Var& p : n->params) Bind(p);
        Mix(n->params.size());
        Hash(n->body);
        break;
      }
      case ExprKind::kGlobal: Mix(std::hash<std::string>{}(As<GlobalNode>(e)->name)); break;
      case ExprKind::kCtor: {
        auto* n = As<CtorNode>(e);
        Mix(std::hash<std::string>{}(n->adt->name));
        Mix(static_cast<size_t>(n->tag));
        for (const Expr& a : n->args) Hash(a);
        break;
      }
      case ExprKind::kMatch: {
        auto* n = As<MatchNode>(e);
        Hash(n->scrutinee);
        for (const Clause& c : n->clauses) {
          HashPattern(c.pattern);
          Hash(c.body);
        }
        break;
      }
    }
    return h_;
  }

 private:
  size_t h_ = 0x6a09e667;
  std::unordered_map<const ExprNode*, size_t> bound_;
  size_t bindings_ = 0;

  void Mix(size_t v) { h_ ^= v + 0x9e3779b97f4a7c15ull + (h_ << 6) + (h_ >> 2); }
  // Binding order numbers bound variables; a variable bound again (a shared
  // subtree) gets a new number, as its re-parsed copy would.
  void Bind(const Var& v) { bound_[v.get()] = ++bindings_; }
  void HashPattern(const Pattern& p) {
    Mix(static_cast<size_t>(p->kind));
    if (p->kind == PatternKind::kVar) Bind(p->var);
    if (p->kind == PatternKind::kCtor) Mix(static_cast<size_t>(p->tag));
    for (const Pattern& f : p->fields) HashPattern(f);
  }
};

}  // namespace

bool StructuralEqual(const Expr& a, const Expr& b) { return EqualChecker().Equal(a, b); }
size_t StructuralHash(const Expr& e) { return Hasher().Hash(e); }

}  // namespace pejit
