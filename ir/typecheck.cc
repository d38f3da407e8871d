// Bidirectional type checking: types flow up from the leaves, and an expected
// type flows down where one is known (a let annotation, a result type, a
// parameter type). The expected type only serves to instantiate type
// parameters that the arguments cannot determine, such as `Nil` of List[T].
#include "ir/typecheck.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "support/spelling.h"

namespace pejit {
namespace {

using Bindings = std::map<std::string, Type>;

// Two types of the same structure, with dims that differ made unknown: the
// type of an `if` or `match` whose branches differ only in `?` dims.
Type Join(const Type& a, const Type& b) {
  if (TypeEqual(a, b)) return a;
  if (auto *x = AsTensor(a), *y = AsTensor(b); x && y) {
    TensorType t = x->type;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] != y->type.shape[i]) t.shape[i] = kUnknownDim;
    }
    return TensorTy(t);
  }
  if (auto *x = AsTuple(a), *y = AsTuple(b); x && y) {
    std::vector<Type> fields;
    for (size_t i = 0; i < x->fields.size(); ++i) fields.push_back(Join(x->fields[i], y->fields[i]));
    return RecordTy(x->names.empty() ? y->names : x->names, std::move(fields));
  }
  return a;  // compatible function/ADT types: keep the first
}

// Where to report a problem with `e` as used in `parent`: a variable node
// carries the location of its declaration, so its parent's is used instead.
const SourceLoc& UseLoc(const Expr& e, const ExprNode* parent) {
  return e->kind == ExprKind::kVar ? parent->loc : e->loc;
}

class Checker {
 public:
  Checker(const TypeEnv& env, std::string name) : env_(env), name_(std::move(name)) {}

  Type CheckFunc(const FuncNode* f, const Type& expected) {
    std::vector<Type> params;
    for (const Var& p : f->params) {
      if (!p->annotation) throw IrError(p->loc, "parameter %" + p->name + " needs a type");
      CheckTypeWellFormed(p->annotation, env_, p->loc);
      Bind(p, p->annotation);
      params.push_back(p->annotation);
    }
    Type want = f->ret_type;
    if (want) CheckTypeWellFormed(want, env_, f->loc);
    if (!want) {
      if (auto* ft = AsFunc(expected)) want = ft->ret;
    }
    Type body = Infer(f->body, want);
    if (f->ret_type && !TypeCompatible(f->ret_type, body)) {
      throw IrError(UseLoc(f->body, f), "result of " + Where() + " is " + TypeToString(body) + ", but its declared type is " +
                                      TypeToString(f->ret_type));
    }
    return GenericFuncTy(f->type_params, std::move(params), f->ret_type ? f->ret_type : body);
  }

  Type Infer(const Expr& e, const Type& expected) {
    // Let-chains iteratively: residual programs are very long chains.
    std::vector<const LetNode*> lets;
    Expr cur = e;
    while (cur->kind == ExprKind::kLet) {
      const LetNode* let = As<LetNode>(cur);
      const Var& var = let->var;
      if (var->annotation) CheckTypeWellFormed(var->annotation, env_, var->loc);
      Type value = Infer(let->value, var->annotation);
      if (var->annotation && !TypeCompatible(var->annotation, value)) {
        throw IrError(UseLoc(let->value, let), "%" + var->name + " is declared " + TypeToString(var->annotation) +
                                           " but bound to " + TypeToString(value));
      }
      Bind(var, var->annotation ? var->annotation : value);
      lets.push_back(let);
      cur = let->body;
    }
    Type t = InferNode(cur, expected);
    cur->checked_type = t;
    for (const LetNode* let : lets) let->checked_type = t;
    return t;
  }

 private:
  const TypeEnv& env_;
  std::string name_;
  std::unordered_map<const ExprNode*, Type> vars_;

  std::string Where() const { return "@" + name_; }

  void Bind(const Var& v, const Type& t) {
    vars_[v.get()] = t;
    v->checked_type = t;
  }

  Type InferNode(const Expr& e, const Type& expected) {
    switch (e->kind) {
      case ExprKind::kVar: {
        auto it = vars_.find(e.get());
        if (it == vars_.end()) throw IrError(e->loc, "variable %" + As<VarNode>(e)->name + " is not bound here");
        return it->second;
      }
      case ExprKind::kConstant: {
        const ConstantNode* c = As<ConstantNode>(e);
        if (const TensorTypeNode* want = AsTensor(expected)) Retype(c, want->type.dtype);
        return TensorTy(c->value.type());
      }
      case ExprKind::kOpCall: return InferOpCall(As<OpCallNode>(e));
      case ExprKind::kCall: return InferCall(As<CallNode>(e), expected);
      case ExprKind::kLet: return Infer(e, expected);
      case ExprKind::kIf: {
        const IfNode* n = As<IfNode>(e);
        Type cond = Infer(n->cond, nullptr);
        if (!TypeEqual(cond, ScalarTy(DType::kBool))) {
          throw IrError(UseLoc(n->cond, n), "condition of if must be Tensor[(), bool], got " + TypeToString(cond));
        }
        Type a = Infer(n->then_branch, expected);
        Type b = Infer(n->else_branch, expected ? expected : a);
        if (!TypeCompatible(a, b)) {
          throw IrError(e->loc, "branches of if differ: " + TypeToString(a) + " vs " + TypeToString(b));
        }
        return Join(a, b);
      }
      case ExprKind::kTuple: {
        const TupleNode* n = As<TupleNode>(e);
        const TupleTypeNode* want = AsTuple(expected);
        std::vector<Type> fields;
        for (size_t i = 0; i < n->fields.size(); ++i) {
          fields.push_back(Infer(n->fields[i], want && want->fields.size() == n->fields.size() ? want->fields[i] : nullptr));
        }
        // A literal where a record is expected is that record (its names).
        if (want && want->fields.size() == fields.size()) return RecordTy(want->names, std::move(fields));
        return TupleTy(std::move(fields));
      }
      case ExprKind::kProj: {
        const ProjNode* n = As<ProjNode>(e);
        Type t = Infer(n->tuple, nullptr);
        const TupleTypeNode* tuple = AsTuple(t);
        const std::string what = "." + (n->field.empty() ? std::to_string(n->index) : n->field);
        if (!tuple) throw IrError(e->loc, what + " of a non-tuple " + TypeToString(t));
        if (!n->field.empty()) {
          if (tuple->names.empty()) {
            throw IrError(e->loc, what + " of a tuple without field names, " + TypeToString(t) +
                                      " (declare it as a record, {" + n->field + ": ...}, or write its index)");
          }
          int i = tuple->FieldIndex(n->field);
          if (i < 0) throw IrError(e->loc, "record " + TypeToString(t) + " has no field '" + n->field + "'");
          if (n->index != i) n->index = i;  // once: a definition checked again (a module edit) reads it only
        }
        if (n->index < 0 || n->index >= static_cast<int>(tuple->fields.size())) {
          throw IrError(e->loc, "tuple " + TypeToString(t) + " has no field " + std::to_string(n->index));
        }
        return tuple->fields[n->index];
      }
      case ExprKind::kFunc: return CheckFunc(As<FuncNode>(e), expected);
      case ExprKind::kGlobal: {
        // A generic definition as a value: an instance, of the type the
        // context wants.
        const GlobalNode* g = As<GlobalNode>(e);
        Type t = GlobalType(g->name, e->loc);
        const FuncTypeNode* f = AsFunc(t);
        if (!f || f->type_params.empty()) return t;
        Bindings b;
        if (!AsFunc(expected) || !Unify(FuncTy(f->params, f->ret), expected, b) || !AllBound(f->type_params, b)) {
          throw IrError(e->loc, "@" + g->name + " is generic (" + TypeToString(t) +
                                    "): pass it where its instance's type is known, as an argument of a declared "
                                    "function type");
        }
        return SubstituteTypeVars(FuncTy(f->params, f->ret), b);
      }
      case ExprKind::kCtor: return InferCtor(As<CtorNode>(e), expected);
      case ExprKind::kMatch: return InferMatch(As<MatchNode>(e), expected);
    }
    throw IrError(e->loc, "unknown expression kind");
  }

  Type GlobalType(const std::string& name, const SourceLoc& loc) {
    Type t = env_.global_type(name, loc);
    if (!t) {
      std::vector<std::string> globals;
      for (const std::string& n : env_.global_names()) globals.push_back("@" + n);
      throw IrError(loc, "unknown definition '@" + name + "'" + DidYouMean("@" + name, globals));
    }
    return t;
  }

  // An unsuffixed number takes `dtype` when it holds the number exactly.
  static void Retype(const ConstantNode* c, DType dtype) {
    if (c->value.dtype() == dtype) return;
    for (const Tensor& r : c->retypes) {
      if (r.dtype() == dtype) {
        c->value = r;
        return;
      }
    }
  }

  Type InferOpCall(const OpCallNode* n) {
    std::vector<TensorType> inputs;
    for (size_t i = 0; i < n->args.size(); ++i) {
      Type t = Infer(n->args[i], nullptr);
      const TensorTypeNode* tensor = AsTensor(t);
      if (!tensor) {
        throw IrError(UseLoc(n->args[i], n), "input " + std::to_string(i) + " of " + n->op->name +
                                           " must be a tensor, got " + TypeToString(t));
      }
      inputs.push_back(tensor->type);
    }
    // Inputs that share a dtype (OpDef::same_dtype_from): an unsuffixed
    // number among them takes the others' (`mul(%x, 2)` on f32).
    if (n->op->same_dtype_from >= 0) {
      auto literal = [&](size_t i) {
        const auto* c = As<ConstantNode>(n->args[i]);
        return c && !c->retypes.empty() ? c : nullptr;
      };
      std::optional<DType> dtype;
      for (size_t i = n->op->same_dtype_from; i < inputs.size() && !dtype; ++i) {
        if (!literal(i)) dtype = inputs[i].dtype;
      }
      for (size_t i = n->op->same_dtype_from; dtype && i < inputs.size(); ++i) {
        if (const ConstantNode* c = literal(i)) {
          Retype(c, *dtype);
          n->args[i]->checked_type = TensorTy(c->value.type());
          inputs[i] = c->value.type();
        }
      }
    }
    std::vector<TensorType> out;
    try {
      out = InferTypes(*n->op, inputs, n->attrs);
    } catch (const OpError& err) {
      throw IrError(n->loc, err.what());
    }
    if (out.size() == 1) return TensorTy(out[0]);
    std::vector<Type> fields;
    for (const TensorType& t : out) fields.push_back(TensorTy(t));
    return TupleTy(std::move(fields));
  }

  Type InferCall(const CallNode* n, const Type& expected) {
    const bool global = n->callee->kind == ExprKind::kGlobal;
    // A generic definition is instantiated by this call (below), not as a value.
    Type callee = global ? GlobalType(As<GlobalNode>(n->callee)->name, n->callee->loc) : Infer(n->callee, nullptr);
    const FuncTypeNode* f = AsFunc(callee);
    std::string what = global ? "@" + As<GlobalNode>(n->callee)->name : "function";
    if (!f) throw IrError(n->loc, "cannot call a value of type " + TypeToString(callee));
    if (f->params.size() != n->args.size()) {
      throw IrError(n->loc, what + " takes " + std::to_string(f->params.size()) + " argument" +
                                (f->params.size() == 1 ? "" : "s") + ", got " + std::to_string(n->args.size()));
    }
    if (!f->type_params.empty()) {
      Type instance = Instantiate(n, f, what, expected);
      n->callee->checked_type = instance;
      return AsFunc(instance)->ret;
    }
    if (global) n->callee->checked_type = callee;
    for (size_t i = 0; i < n->args.size(); ++i) {
      Type arg = Infer(n->args[i], f->params[i]);
      if (!TypeCompatible(f->params[i], arg)) {
        throw IrError(UseLoc(n->args[i], n), "argument " + std::to_string(i) + " of " + what + " must be " +
                                           TypeToString(f->params[i]) + ", got " + TypeToString(arg));
      }
    }
    return f->ret;
  }

  static bool AllBound(const std::vector<std::string>& params, const Bindings& b) {
    return std::all_of(params.begin(), params.end(), [&](const std::string& p) { return b.count(p) > 0; });
  }

  // The instance of generic function type `f` this call makes: the
  // arguments' types bind the type parameters they mention, left to right,
  // those that are constructors or numbers last (`Nil` and `0` take the type
  // the others bound: @reverse_onto(%xs, Nil)); the type the context expects
  // of the result binds those only the result mentions. Returns the
  // instance's (non-generic) function type.
  Type Instantiate(const CallNode* n, const FuncTypeNode* f, const std::string& what, const Type& expected) {
    Bindings b;
    std::vector<size_t> order;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < n->args.size(); ++i) {
        const bool waits = n->args[i]->kind == ExprKind::kCtor || n->args[i]->kind == ExprKind::kConstant;
        if (waits == (pass == 1)) order.push_back(i);
      }
    }
    for (size_t i : order) {
      Type want = SubstituteTypeVars(f->params[i], b);
      // Checked against the parameter's type only once it names no type
      // parameter left unbound (the caller's own may have the same names).
      std::vector<std::string> unbound;
      for (const std::string& p : f->type_params) {
        if (!b.count(p)) unbound.push_back(p);
      }
      Type arg = Infer(n->args[i], HasTypeVars(f->params[i], &unbound) ? nullptr : want);
      if (!Unify(f->params[i], arg, b)) {
        throw IrError(UseLoc(n->args[i], n), "argument " + std::to_string(i) + " of " + what + " must be " +
                                           TypeToString(SubstituteTypeVars(f->params[i], b)) + ", got " +
                                           TypeToString(arg));
      }
    }
    if (expected && !AllBound(f->type_params, b)) Unify(f->ret, expected, b);
    for (const std::string& p : f->type_params) {
      if (!b.count(p)) {
        throw IrError(n->loc, "cannot tell type parameter " + p + " of " + what + " (" + TypeToString(FuncTy(f->params, f->ret)) +
                                  ") from its arguments; declare the type of its result where it is bound");
      }
    }
    return SubstituteTypeVars(FuncTy(f->params, f->ret), b);
  }

  // Binds type parameters in `pattern` (a ctor field type) to match `actual`.
  bool Unify(const Type& pattern, const Type& actual, Bindings& b) {
    if (const TypeVarNode* v = AsTypeVar(pattern)) {
      auto it = b.find(v->name);
      if (it == b.end()) {
        b[v->name] = actual;
        return true;
      }
      if (!TypeCompatible(it->second, actual)) return false;
      it->second = Join(it->second, actual);
      return true;
    }
    if (!pattern || !actual || pattern->kind != actual->kind) return false;
    switch (pattern->kind) {
      case TypeKind::kTuple: {
        const auto &p = AsTuple(pattern)->fields, &a = AsTuple(actual)->fields;
        if (p.size() != a.size()) return false;
        for (size_t i = 0; i < p.size(); ++i) {
          if (!Unify(p[i], a[i], b)) return false;
        }
        return true;
      }
      case TypeKind::kAdt: {
        const AdtTypeNode *p = AsAdt(pattern), *a = AsAdt(actual);
        if (p->name != a->name || p->args.size() != a->args.size()) return false;
        for (size_t i = 0; i < p->args.size(); ++i) {
          if (!Unify(p->args[i], a->args[i], b)) return false;
        }
        return true;
      }
      case TypeKind::kFunc: {
        const FuncTypeNode *p = AsFunc(pattern), *a = AsFunc(actual);
        if (p->params.size() != a->params.size() || !Unify(p->ret, a->ret, b)) return false;
        for (size_t i = 0; i < p->params.size(); ++i) {
          if (!Unify(p->params[i], a->params[i], b)) return false;
        }
        return true;
      }
      default: return TypeCompatible(pattern, actual);
    }
  }

  Type InferCtor(const CtorNode* n, const Type& expected) {
    const TypeDef& adt = *n->adt;
    const CtorDef& ctor = adt.ctors[n->tag];
    if (ctor.fields.size() != n->args.size()) {
      throw IrError(n->loc, "constructor " + ctor.name + " takes " + std::to_string(ctor.fields.size()) +
                                " field" + (ctor.fields.size() == 1 ? "" : "s") + ", got " +
                                std::to_string(n->args.size()));
    }
    Bindings b;
    if (const AdtTypeNode* want = AsAdt(expected); want && want->name == adt.name && want->args.size() == adt.params.size()) {
      for (size_t i = 0; i < adt.params.size(); ++i) b[adt.params[i]] = want->args[i];
    }
    for (size_t i = 0; i < n->args.size(); ++i) {
      Type arg = Infer(n->args[i], SubstituteTypeVars(ctor.fields[i], b));
      if (!Unify(ctor.fields[i], arg, b)) {
        throw IrError(UseLoc(n->args[i], n), "field " + std::to_string(i) + " of " + ctor.name + " must be " +
                                           TypeToString(SubstituteTypeVars(ctor.fields[i], b)) + ", got " +
                                           TypeToString(arg));
      }
    }
    std::vector<Type> args;
    for (const std::string& p : adt.params) {
      auto it = b.find(p);
      if (it == b.end()) {
        throw IrError(n->loc, "cannot infer type parameter " + p + " of " + adt.name + " for " + ctor.name +
                                  "; annotate it, e.g. let %x: " + adt.name + "[...] = ...");
      }
      args.push_back(it->second);
    }
    return AdtTy(adt.name, std::move(args));
  }

  void CheckPattern(const Pattern& p, const Type& t) {
    switch (p->kind) {
      case PatternKind::kWildcard: return;
      case PatternKind::kVar: Bind(p->var, t); return;
      case PatternKind::kTuple: {
        const TupleTypeNode* tuple = AsTuple(t);
        if (!tuple || tuple->fields.size() != p->fields.size()) {
          throw IrError(p->loc, "tuple pattern of " + std::to_string(p->fields.size()) + " fields cannot match " +
                                    TypeToString(t));
        }
        for (size_t i = 0; i < p->fields.size(); ++i) CheckPattern(p->fields[i], tuple->fields[i]);
        return;
      }
      case PatternKind::kCtor: {
        const AdtTypeNode* adt = AsAdt(t);
        const CtorDef& ctor = p->adt->ctors[p->tag];
        if (!adt || adt->name != p->adt->name) {
          throw IrError(p->loc, "constructor " + ctor.name + " of " + p->adt->name + " cannot match " + TypeToString(t));
        }
        if (ctor.fields.size() != p->fields.size()) {
          throw IrError(p->loc, "constructor " + ctor.name + " has " + std::to_string(ctor.fields.size()) +
                                    " field" + (ctor.fields.size() == 1 ? "" : "s") + ", the pattern " +
                                    std::to_string(p->fields.size()));
        }
        Bindings b;
        for (size_t i = 0; i < p->adt->params.size() && i < adt->args.size(); ++i) b[p->adt->params[i]] = adt->args[i];
        for (size_t i = 0; i < p->fields.size(); ++i) CheckPattern(p->fields[i], SubstituteTypeVars(ctor.fields[i], b));
        return;
      }
    }
  }

  Type InferMatch(const MatchNode* n, const Type& expected) {
    Type scrutinee = Infer(n->scrutinee, nullptr);
    if (n->clauses.empty()) throw IrError(n->loc, "match needs at least one clause");
    Type result;
    for (const Clause& c : n->clauses) {
      CheckPattern(c.pattern, scrutinee);
      Type t = Infer(c.body, expected ? expected : result);
      if (result && !TypeCompatible(result, t)) {
        throw IrError(UseLoc(c.body, n), "clauses of match differ: " + TypeToString(result) + " vs " + TypeToString(t));
      }
      result = result ? Join(result, t) : t;
    }
    return result;
  }
};

}  // namespace

void CheckTypeWellFormed(const Type& t, const TypeEnv& env, const SourceLoc& loc) {
  if (!t) return;
  switch (t->kind) {
    case TypeKind::kTensor: {
      for (int64_t d : AsTensor(t)->type.shape) {
        if (d < 0 && d != kUnknownDim) throw IrError(loc, "negative dimension in " + TypeToString(t));
      }
      return;
    }
    case TypeKind::kTuple: for (const Type& f : AsTuple(t)->fields) CheckTypeWellFormed(f, env, loc); return;
    case TypeKind::kFunc:
      for (const Type& p : AsFunc(t)->params) CheckTypeWellFormed(p, env, loc);
      CheckTypeWellFormed(AsFunc(t)->ret, env, loc);
      return;
    case TypeKind::kAdt: {
      const AdtTypeNode* a = AsAdt(t);
      TypeDefPtr def = env.type_def(a->name);
      if (!def) throw IrError(loc, "unknown type '" + a->name + "'");
      if (def->params.size() != a->args.size()) {
        throw IrError(loc, "type " + a->name + " takes " + std::to_string(def->params.size()) +
                               " type argument" + (def->params.size() == 1 ? "" : "s") + ", got " +
                               std::to_string(a->args.size()));
      }
      for (const Type& arg : a->args) CheckTypeWellFormed(arg, env, loc);
      return;
    }
    case TypeKind::kVar: return;
  }
}

Type CheckFunction(const std::string& name, const Func& f, const TypeEnv& env) {
  Checker checker(env, name);
  Type t = checker.CheckFunc(f.get(), nullptr);
  f->checked_type = t;
  return t;
}

}  // namespace pejit
