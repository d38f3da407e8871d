#include "jit/refine_shapes.h"

#include <unordered_map>

#include "ir/visitor.h"

namespace pejit {
namespace {

// A construct the inference does not follow (a constructor, a closure, an
// operator that rejects its inferred inputs): the program is left as it is.
struct GiveUp {};

// `declared` made more precise by `inferred` where they agree; `declared`
// itself where they do not (or where nothing was inferred).
Type Meet(const Type& declared, const Type& inferred) {
  if (!declared || !inferred) return declared;
  if (const TensorTypeNode* d = AsTensor(declared)) {
    const TensorTypeNode* i = AsTensor(inferred);
    if (!i || i->type.dtype != d->type.dtype || i->type.rank() != d->type.rank()) return declared;
    Shape shape = d->type.shape;
    bool more = false;
    for (int k = 0; k < d->type.rank(); ++k) {
      const int64_t want = d->type.shape[k], got = i->type.shape[k];
      if (want != kUnknownDim && got != kUnknownDim && want != got) return declared;  // a type error: left to the checks
      if (want == kUnknownDim && got != kUnknownDim) {
        shape[k] = got;
        more = true;
      }
    }
    return more ? TensorTy(d->type.dtype, std::move(shape)) : declared;
  }
  if (const TupleTypeNode* d = AsTuple(declared)) {
    const TupleTypeNode* i = AsTuple(inferred);
    if (!i || i->fields.size() != d->fields.size()) return declared;
    std::vector<Type> fields;
    bool more = false;
    for (size_t k = 0; k < d->fields.size(); ++k) {
      fields.push_back(Meet(d->fields[k], i->fields[k]));
      more |= fields.back() != d->fields[k];
    }
    return more ? TupleTy(std::move(fields)) : declared;
  }
  return declared;
}

bool SameType(const Type& a, const Type& b) { return a == b || (a && b && TypeEqual(a, b)); }

// Types by abstract interpretation, iterated to the least fixpoint.
class Inference {
 public:
  Inference(const Func& main, const std::vector<std::pair<std::string, Func>>& functions) : main_(main) {
    for (const auto& [name, f] : functions) functions_.emplace(name, f);
  }

  void Run() {
    // Each round may only move a function's parameter or result types up
    // the lattice (a dim from nothing to known to `?`): a few rounds suffice.
    for (int round = 0; round < 64; ++round) {
      changed_ = false;
      for (const Var& p : main_->params) env_[p.get()] = p->annotation;
      main_result_ = Infer(main_->body);
      for (const auto& [name, f] : functions_) {
        auto params = params_.find(name);
        if (params == params_.end()) continue;  // not called (yet)
        for (size_t i = 0; i < f->params.size(); ++i) env_[f->params[i].get()] = params->second[i];
        Type result = Infer(f->body);
        Type& ret = ret_[name];
        Type joined = JoinTypes(ret, result);
        if (!SameType(joined, ret)) {
          ret = joined;
          changed_ = true;
        }
      }
      if (!changed_) return;
    }
    throw GiveUp{};
  }

  // The inferred type of each variable (null: nothing inferred).
  Type VarType(const VarNode* v) const {
    auto it = env_.find(v);
    return it == env_.end() ? nullptr : it->second;
  }
  Type MainResult() const { return main_result_; }
  Type ResultType(const std::string& name) const {
    auto it = ret_.find(name);
    return it == ret_.end() ? nullptr : it->second;
  }

 private:
  Type Infer(const Expr& e) {
    switch (e->kind) {
      case ExprKind::kVar: {
        auto it = env_.find(e.get());
        if (it == env_.end()) throw GiveUp{};
        return it->second;
      }
      case ExprKind::kConstant: return TensorTy(As<ConstantNode>(e)->value.type());
      case ExprKind::kOpCall: {
        const auto* call = As<OpCallNode>(e);
        std::vector<TensorType> inputs;
        bool known = true;
        for (const Expr& a : call->args) {
          Type t = Infer(a);
          if (!t) {
            known = false;
            continue;
          }
          const TensorTypeNode* tensor = AsTensor(t);
          if (!tensor) throw GiveUp{};
          inputs.push_back(tensor->type);
        }
        if (!known) return nullptr;
        std::vector<TensorType> out;
        try {
          out = InferTypes(*call->op, inputs, call->attrs);
        } catch (const OpError&) {
          throw GiveUp{};
        }
        if (out.size() == 1) return TensorTy(out[0]);
        std::vector<Type> fields;
        for (const TensorType& t : out) fields.push_back(TensorTy(t));
        return TupleTy(std::move(fields));
      }
      case ExprKind::kCall: {
        const auto* call = As<CallNode>(e);
        const auto* global = As<GlobalNode>(call->callee);
        auto f = global ? functions_.find(global->name) : functions_.end();
        if (f == functions_.end() || f->second->params.size() != call->args.size()) throw GiveUp{};
        auto [params, fresh] = params_.try_emplace(global->name, call->args.size());
        changed_ |= fresh;
        for (size_t i = 0; i < call->args.size(); ++i) {
          Type joined = JoinTypes(params->second[i], Infer(call->args[i]));
          if (!SameType(joined, params->second[i])) {
            params->second[i] = joined;
            changed_ = true;
          }
        }
        return ResultType(global->name);
      }
      case ExprKind::kLet: {
        Expr at = e;
        while (const auto* let = As<LetNode>(at)) {
          env_[let->var.get()] = Infer(let->value);
          at = let->body;
        }
        return Infer(at);
      }
      case ExprKind::kIf: {
        const auto* n = As<IfNode>(e);
        Infer(n->cond);
        // A branch that gives nothing yet (a recursion not resolved) does
        // not widen the other's.
        return JoinTypes(Infer(n->then_branch), Infer(n->else_branch));
      }
      case ExprKind::kTuple: {
        std::vector<Type> fields;
        for (const Expr& f : As<TupleNode>(e)->fields) {
          fields.push_back(Infer(f));
          if (!fields.back()) return nullptr;
        }
        return TupleTy(std::move(fields));
      }
      case ExprKind::kProj: {
        const auto* p = As<ProjNode>(e);
        Type t = Infer(p->tuple);
        if (!t) return nullptr;
        const TupleTypeNode* tuple = AsTuple(t);
        if (!tuple || p->index < 0 || static_cast<size_t>(p->index) >= tuple->fields.size()) throw GiveUp{};
        return tuple->fields[p->index];
      }
      default: throw GiveUp{};
    }
  }

  const Func& main_;
  std::unordered_map<std::string, Func> functions_;
  std::unordered_map<const ExprNode*, Type> env_;
  std::unordered_map<std::string, std::vector<Type>> params_;
  std::unordered_map<std::string, Type> ret_;
  Type main_result_;
  bool changed_ = false;
};

// Gives each variable its refined type: one new variable per old one, for
// its binding and every use.
class Retype : public ExprMutator {
 public:
  explicit Retype(const Inference& inference) : inference_(inference) {}
  int refined = 0;

  Func Function(const Func& f, const Type& result) {
    std::vector<Var> params;
    for (const Var& p : f->params) params.push_back(std::static_pointer_cast<const VarNode>(Mutate(p)));
    Expr body = Mutate(f->body);
    Type ret = Meet(f->ret_type, result);
    bool same = body == f->body && ret == f->ret_type;
    for (size_t i = 0; i < params.size(); ++i) same &= params[i] == f->params[i];
    return same ? f : MakeFunc(std::move(params), std::move(body), std::move(ret), f->loc, f->type_params);
  }

 protected:
  Expr VisitVar(const Var& var) override {
    Type t = Meet(var->annotation, inference_.VarType(var.get()));
    if (t == var->annotation) return var;
    ++refined;
    return MakeVar(var->name, std::move(t), var->loc);
  }

 private:
  const Inference& inference_;
};

}  // namespace

Type JoinTypes(const Type& a, const Type& b) {
  if (!a) return b;
  if (!b) return a;
  if (const TensorTypeNode* x = AsTensor(a)) {
    const TensorTypeNode* y = AsTensor(b);
    if (!y || x->type.dtype != y->type.dtype || x->type.rank() != y->type.rank()) return nullptr;
    if (x->type == y->type) return a;
    Shape shape = x->type.shape;
    for (int k = 0; k < x->type.rank(); ++k) {
      if (shape[k] != y->type.shape[k]) shape[k] = kUnknownDim;
    }
    return TensorTy(x->type.dtype, std::move(shape));
  }
  if (const TupleTypeNode* x = AsTuple(a)) {
    const TupleTypeNode* y = AsTuple(b);
    if (!y || x->fields.size() != y->fields.size()) return nullptr;
    std::vector<Type> fields;
    bool same = true;
    for (size_t k = 0; k < x->fields.size(); ++k) {
      fields.push_back(JoinTypes(x->fields[k], y->fields[k]));
      if (!fields.back()) return nullptr;
      same &= fields.back() == x->fields[k];
    }
    return same ? a : TupleTy(std::move(fields));
  }
  return TypeEqual(a, b) ? a : nullptr;
}

RefinedProgram RefineShapes(const Func& main, const std::vector<std::pair<std::string, Func>>& functions) {
  RefinedProgram out{main, functions, 0};
  Inference inference(main, functions);
  try {
    inference.Run();
  } catch (const GiveUp&) {
    return out;
  }
  Retype retype(inference);
  out.main = retype.Function(main, inference.MainResult());
  for (auto& [name, f] : out.functions) f = retype.Function(f, inference.ResultType(name));
  out.refined = retype.refined;
  return out;
}

}  // namespace pejit
