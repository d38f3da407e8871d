// The partial evaluator.
//
// 0. Values become partially static values (PValue): a static tensor, a
//    dynamic atom (a variable or constant of the residual program, with its
//    type), or a tuple, ADT value or closure whose parts are PValues. The
//    arguments' skeleton is static; their tensors are dynamic parameters.
// 1. The evaluator walks the program like the interpreter does, but on
//    PValues. An operator whose inputs are all static is computed now
//    (folded); otherwise it is emitted into the current let-list with atoms as
//    inputs, and its result is a new atom. So every dynamic computation is
//    let-bound exactly once and sharing is kept: a value used twice is an atom
//    used twice.
// 2. `match` on a static constructor and `if` on a static condition pick
//    their branch. An `if` on a dynamic condition is residualized with both
//    branches specialized, each in a let-list of its own.
// 3. Calls are unfolded: the callee's body is evaluated with its parameters
//    bound to the argument PValues. A call with the very same argument
//    PValues as an earlier one in scope returns that call's result (the
//    language is pure).
// 4. Termination: a call to a function already being unfolded on the same
//    skeleton (a loop on dynamic data), or any call once the fuel is spent,
//    becomes a call to a residual function specialized on the generalized
//    arguments (every tensor a parameter, structure kept). Those functions
//    are memoized by skeleton, so a loop becomes a recursive residual function.
// 5. Bounds: the residual's operator count and the native stack the
//    evaluator uses are bounded; past either, PeFailure says which.
//
// Known limitations:
//  a. A `match` on a dynamic ADT value (the result of a residual function)
//     is refused.
//  b. Function values cannot be left in the residual: a dynamic `if` that
//     returns a closure is refused.
//  c. Unfolded results are not shared across runs; PE of `infer` after
//     `loss` redoes the shared helper's work (see notes/issue 11).
#include "pe/partial_eval.h"

#include <chrono>
#include <functional>
#include <unordered_map>

#include "ir/printer.h"
#include "ir/visitor.h"
#include "ops/eager.h"

namespace pejit {
namespace {

struct PVal;
using PValue = std::shared_ptr<const PVal>;

struct PVal {
  enum class Kind : uint8_t { kDynamic, kStatic, kTuple, kAdt, kClosure, kGlobal };
  Kind kind;
  Expr atom;                   // kDynamic
  Type type;                   // kDynamic
  Tensor value;                // kStatic
  std::vector<PValue> fields;  // kTuple, kAdt
  TypeDefPtr adt;              // kAdt
  int tag = -1;                // kAdt
  Func func;                   // kClosure
  std::vector<std::pair<const VarNode*, PValue>> captured;  // kClosure
  std::string global;          // kGlobal
  uint64_t skeleton = 0;       // hash of the static skeleton, computed once
};

uint64_t Mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

uint64_t HashBytes(const void* data, size_t n) {
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(data), n));
}

uint64_t HashTensorType(const TensorType& t) {
  uint64_t h = Mix(17, static_cast<uint64_t>(t.dtype));
  for (int64_t d : t.shape) h = Mix(h, static_cast<uint64_t>(d));
  return h;
}

PValue Dynamic(Expr atom, Type type) {
  auto p = std::make_shared<PVal>();
  p->kind = PVal::Kind::kDynamic;
  const TensorTypeNode* t = AsTensor(type);
  p->skeleton = Mix(1, t ? HashTensorType(t->type) : std::hash<std::string>{}(TypeToString(type)));
  p->atom = std::move(atom);
  p->type = std::move(type);
  return p;
}

PValue Static(Tensor value) {
  auto p = std::make_shared<PVal>();
  p->kind = PVal::Kind::kStatic;
  p->skeleton = Mix(Mix(2, HashTensorType(value.type())), HashBytes(value.raw_data(), value.nbytes()));
  p->value = std::move(value);
  return p;
}

PValue Tuple(std::vector<PValue> fields) {
  auto p = std::make_shared<PVal>();
  p->kind = PVal::Kind::kTuple;
  p->skeleton = Mix(3, fields.size());
  for (const PValue& f : fields) p->skeleton = Mix(p->skeleton, f->skeleton);
  p->fields = std::move(fields);
  return p;
}

PValue Adt(TypeDefPtr adt, int tag, std::vector<PValue> fields) {
  auto p = std::make_shared<PVal>();
  p->kind = PVal::Kind::kAdt;
  p->skeleton = Mix(Mix(4, std::hash<std::string>{}(adt->name)), static_cast<uint64_t>(tag));
  for (const PValue& f : fields) p->skeleton = Mix(p->skeleton, f->skeleton);
  p->adt = std::move(adt);
  p->tag = tag;
  p->fields = std::move(fields);
  return p;
}

PValue Closure(Func func, std::vector<std::pair<const VarNode*, PValue>> captured) {
  auto p = std::make_shared<PVal>();
  p->kind = PVal::Kind::kClosure;
  p->skeleton = Mix(5, std::hash<const void*>{}(func.get()));
  for (const auto& [_, v] : captured) p->skeleton = Mix(p->skeleton, v->skeleton);
  p->func = std::move(func);
  p->captured = std::move(captured);
  return p;
}

PValue Global(std::string name) {
  auto p = std::make_shared<PVal>();
  p->kind = PVal::Kind::kGlobal;
  p->skeleton = Mix(6, std::hash<std::string>{}(name));
  p->global = std::move(name);
  return p;
}

// Same static skeleton (what a specialization may depend on).
bool SameSkeleton(const PValue& a, const PValue& b) {
  if (a == b) return true;
  if (a->skeleton != b->skeleton || a->kind != b->kind) return false;
  switch (a->kind) {
    case PVal::Kind::kDynamic: return TypeEqual(a->type, b->type);
    case PVal::Kind::kStatic: return Equal(a->value, b->value);
    case PVal::Kind::kAdt:
      if (a->tag != b->tag || a->adt->name != b->adt->name) return false;
      [[fallthrough]];
    case PVal::Kind::kTuple:
      if (a->fields.size() != b->fields.size()) return false;
      for (size_t i = 0; i < a->fields.size(); ++i) {
        if (!SameSkeleton(a->fields[i], b->fields[i])) return false;
      }
      return true;
    case PVal::Kind::kClosure:
      if (a->func != b->func || a->captured.size() != b->captured.size()) return false;
      for (size_t i = 0; i < a->captured.size(); ++i) {
        if (!SameSkeleton(a->captured[i].second, b->captured[i].second)) return false;
      }
      return true;
    case PVal::Kind::kGlobal: return a->global == b->global;
  }
  return false;
}

using Env = std::unordered_map<const ExprNode*, PValue>;

// A let-list being filled, with the calls already answered in it.
struct Scope {
  std::vector<std::pair<Var, Expr>> lets;
  // Calls answered in this scope, by callee and argument identity. The
  // arguments are held, so their addresses stay theirs.
  std::unordered_map<uint64_t, std::vector<std::pair<std::vector<PValue>, PValue>>> calls;
  bool function_root = false;                       // the body of a residual function
  // Function roots: tensors materialized once. The tensor is kept alive with
  // its variable, so that its buffer's address cannot be reused by another.
  std::unordered_map<const void*, std::pair<Tensor, Var>> constants;
  std::vector<std::pair<Var, Expr>> constant_lets;
};

// A residual function specialized on a generalized skeleton.
struct Specialization {
  const FuncNode* func;
  std::vector<PValue> args;  // generalized: tensors dynamic parameters
  std::string name;
  Type ret;
};

class PartialEvaluator {
 public:
  PartialEvaluator(const ModuleSnapshot& module, const PeOptions& options) : module_(module), options_(options) {}

  Residual Run(const std::string& entry, const std::vector<Value>& args, const std::vector<bool>& static_args) {
    auto start = std::chrono::steady_clock::now();
    char base;
    stack_base_ = &base;
    const Definition& def = module_.Get(entry);
    entry_ = entry;
    if (def.func->params.size() != args.size()) {
      throw PeFailure("@" + entry + " takes " + std::to_string(def.func->params.size()) + " arguments, got " +
                      std::to_string(args.size()));
    }
    std::vector<Var> params;
    std::vector<PValue> pargs;
    for (size_t i = 0; i < args.size(); ++i) {
      bool whole = i < static_args.size() && static_args[i];
      pargs.push_back(FromValue(args[i], whole, params));
    }
    scopes_.push_back(Scope{});
    scopes_.back().function_root = true;
    PValue result = Apply(nullptr, Global(entry), pargs);
    Expr body = CloseScope(Reify(result, def.func->loc));

    Residual out;
    out.main = MakeFunc(std::move(params), body, nullptr, def.func->loc);
    out.functions = std::move(residual_functions_);
    for (const auto& [_, t] : module_.types()) out.types.push_back(t);
    stats_.params = static_cast<int64_t>(out.main->params.size());
    stats_.residual_functions = static_cast<int64_t>(out.functions.size());
    stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.stats = stats_;
    return out;
  }

 private:
  const ModuleSnapshot& module_;
  const PeOptions& options_;
  std::string entry_;
  const char* stack_base_ = nullptr;
  PeStats stats_;
  std::vector<Scope> scopes_;
  std::string hint_;  // name for the next emitted variable
  // Unfoldings in progress, by function and argument skeleton: a repeat is a loop.
  std::unordered_map<uint64_t, std::vector<const std::vector<PValue>*>> active_;
  std::vector<Specialization> specializations_;
  std::vector<std::pair<std::string, Func>> residual_functions_;

  // ---- Building the residual ---------------------------------------------------

  // Named after the source variable it stands for; the printer makes names unique.
  Var NewVar(const Type& type) {
    Var v = MakeVar(hint_.empty() ? "t" : std::move(hint_), type);
    hint_.clear();
    return v;
  }

  Var Emit(Expr value, const Type& type) {
    Var v = NewVar(type);
    scopes_.back().lets.push_back({v, std::move(value)});
    return v;
  }

  Expr CloseScope(Expr result) {
    Scope scope = std::move(scopes_.back());
    scopes_.pop_back();
    Expr body = std::move(result);
    for (auto it = scope.lets.rbegin(); it != scope.lets.rend(); ++it) body = MakeLet(it->first, it->second, body);
    for (auto it = scope.constant_lets.rbegin(); it != scope.constant_lets.rend(); ++it) {
      body = MakeLet(it->first, it->second, body);
    }
    return body;
  }

  // A static tensor as an atom: scalars inline, larger tensors let-bound once
  // per residual function.
  Expr Materialize(const Tensor& t) {
    if (t.numel() == 1) return MakeConstant(t);
    Scope* root = nullptr;
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (it->function_root) {
        root = &*it;
        break;
      }
    }
    auto found = root->constants.find(t.raw_data());
    if (found != root->constants.end()) return found->second.second;
    Var v = MakeVar("const", TensorTy(t.type()));
    root->constant_lets.push_back({v, MakeConstant(t)});
    root->constants.emplace(t.raw_data(), std::make_pair(t, v));
    return v;
  }

  Expr Reify(const PValue& p, const SourceLoc& loc) {
    CheckStack();
    switch (p->kind) {
      case PVal::Kind::kDynamic: return p->atom;
      case PVal::Kind::kStatic: return Materialize(p->value);
      case PVal::Kind::kTuple: {
        std::vector<Expr> fields;
        for (const PValue& f : p->fields) fields.push_back(Reify(f, loc));
        return MakeTuple(std::move(fields));
      }
      case PVal::Kind::kAdt: {
        std::vector<Expr> fields;
        for (const PValue& f : p->fields) fields.push_back(Reify(f, loc));
        return std::make_shared<CtorNode>(p->adt, p->tag, std::move(fields), SourceLoc{});
      }
      case PVal::Kind::kClosure:
      case PVal::Kind::kGlobal:
        throw PeFailure(loc.ToString() + ": a function value cannot be left in the residual program");
    }
    return nullptr;
  }

  Type TypeOf(const PValue& p) const {
    switch (p->kind) {
      case PVal::Kind::kDynamic: return p->type;
      case PVal::Kind::kStatic: return TensorTy(p->value.type());
      case PVal::Kind::kTuple: {
        std::vector<Type> fields;
        for (const PValue& f : p->fields) fields.push_back(TypeOf(f));
        return TupleTy(std::move(fields));
      }
      default: return nullptr;
    }
  }

  // ---- Values in, and generalization -------------------------------------------

  PValue FromValue(const Value& v, bool whole_static, std::vector<Var>& params) {
    CheckStack();
    switch (v.kind()) {
      case Value::Kind::kTensor: {
        if (whole_static) return Static(v.tensor());
        Var p = MakeVar("p" + std::to_string(params.size()), TensorTy(v.tensor().type()));
        params.push_back(p);
        return Dynamic(p, p->annotation);
      }
      case Value::Kind::kTuple: {
        std::vector<PValue> fields;
        for (const Value& f : v.fields()) fields.push_back(FromValue(f, whole_static, params));
        return Tuple(std::move(fields));
      }
      case Value::Kind::kAdt: {
        std::vector<PValue> fields;
        for (const Value& f : v.fields()) fields.push_back(FromValue(f, whole_static, params));
        return Adt(v.adt(), v.tag(), std::move(fields));
      }
      case Value::Kind::kClosure:
        if (!whole_static) throw PeFailure("a function value among dynamic arguments");
        throw PeFailure("function values as static arguments are not supported");
      case Value::Kind::kNone: break;
    }
    throw PeFailure("an empty value among the arguments");
  }

  // `p` with every tensor (static or dynamic) replaced by a new parameter.
  PValue Generalize(const PValue& p, std::vector<Var>& params, std::vector<Expr>& actuals, const SourceLoc& loc) {
    CheckStack();
    switch (p->kind) {
      case PVal::Kind::kDynamic:
      case PVal::Kind::kStatic: {
        Type type = TypeOf(p);
        Var v = MakeVar("p" + std::to_string(params.size()), type);
        params.push_back(v);
        actuals.push_back(Reify(p, loc));
        return Dynamic(v, type);
      }
      case PVal::Kind::kTuple:
      case PVal::Kind::kAdt: {
        std::vector<PValue> fields;
        for (const PValue& f : p->fields) fields.push_back(Generalize(f, params, actuals, loc));
        return p->kind == PVal::Kind::kTuple ? Tuple(std::move(fields)) : Adt(p->adt, p->tag, std::move(fields));
      }
      case PVal::Kind::kClosure: {
        std::vector<std::pair<const VarNode*, PValue>> captured;
        for (const auto& [var, v] : p->captured) captured.emplace_back(var, Generalize(v, params, actuals, loc));
        return Closure(p->func, std::move(captured));
      }
      case PVal::Kind::kGlobal: return p;
    }
    return p;
  }

  // ---- Evaluation ------------------------------------------------------------------

  void CheckStack() {
    char here;
    if (stack_base_ - &here > options_.max_stack_bytes) {
      throw PeFailure("program nests deeper than " + std::to_string(options_.max_stack_bytes) +
                      " bytes of native stack allow (PeOptions::max_stack_bytes)");
    }
  }

  PValue Eval(const Expr& root, Env& env) {
    CheckStack();
    Expr e = root;
    while (e->kind == ExprKind::kLet) {  // let-chains iteratively
      const LetNode* let = As<LetNode>(e);
      hint_ = let->var->name;
      env[let->var.get()] = Eval(let->value, env);
      hint_.clear();
      e = let->body;
    }
    switch (e->kind) {
      case ExprKind::kVar: {
        auto it = env.find(e.get());
        if (it == env.end()) throw PeFailure(e->loc.ToString() + ": %" + As<VarNode>(e)->name + " has no value");
        return it->second;
      }
      case ExprKind::kConstant: return Static(As<ConstantNode>(e)->value);
      case ExprKind::kOpCall: return EvalOp(As<OpCallNode>(e), env);
      case ExprKind::kCall: {
        const CallNode* call = As<CallNode>(e);
        PValue callee = Eval(call->callee, env);
        std::vector<PValue> args;
        for (const Expr& a : call->args) args.push_back(Eval(a, env));
        return Apply(call, callee, args);
      }
      case ExprKind::kIf: return EvalIf(As<IfNode>(e), env);
      case ExprKind::kTuple: {
        std::vector<PValue> fields;
        for (const Expr& f : As<TupleNode>(e)->fields) fields.push_back(Eval(f, env));
        return Tuple(std::move(fields));
      }
      case ExprKind::kProj: {
        const ProjNode* proj = As<ProjNode>(e);
        PValue t = Eval(proj->tuple, env);
        if (t->kind == PVal::Kind::kTuple) return t->fields[proj->index];
        const TupleTypeNode* type = AsTuple(t->type);
        Type field = type->fields[proj->index];
        return Dynamic(Emit(MakeProj(t->atom, proj->index), field), field);
      }
      case ExprKind::kFunc: {
        const FuncNode* f = As<FuncNode>(e);
        std::vector<std::pair<const VarNode*, PValue>> captured;
        for (const VarNode* v : FreeVars(*f)) captured.emplace_back(v, env.at(v));
        return Closure(std::static_pointer_cast<const FuncNode>(e), std::move(captured));
      }
      case ExprKind::kGlobal: return Global(As<GlobalNode>(e)->name);
      case ExprKind::kCtor: {
        const CtorNode* c = As<CtorNode>(e);
        std::vector<PValue> fields;
        for (const Expr& a : c->args) fields.push_back(Eval(a, env));
        return Adt(c->adt, c->tag, std::move(fields));
      }
      case ExprKind::kMatch: return EvalMatch(As<MatchNode>(e), env);
      case ExprKind::kLet: break;
    }
    throw PeFailure("unexpected expression");
  }

  PValue EvalOp(const OpCallNode* n, Env& env) {
    std::string hint = std::move(hint_);
    hint_.clear();
    std::vector<PValue> args;
    bool all_static = true;
    for (const Expr& a : n->args) {
      args.push_back(Eval(a, env));
      all_static &= args.back()->kind == PVal::Kind::kStatic;
    }
    if (all_static) {
      std::vector<Tensor> inputs;
      for (const PValue& a : args) inputs.push_back(a->value);
      std::vector<Tensor> outputs;
      try {
        outputs = RunOp(*n->op, inputs, n->attrs);
      } catch (const OpError& err) {
        throw PeFailure(n->loc.ToString() + ": " + err.what());
      }
      ++stats_.folded_ops;
      if (outputs.size() == 1) return Static(outputs[0]);
      std::vector<PValue> fields;
      for (Tensor& t : outputs) fields.push_back(Static(std::move(t)));
      return Tuple(std::move(fields));
    }
    std::vector<Expr> atoms;
    std::vector<TensorType> types;
    for (const PValue& a : args) {
      atoms.push_back(Reify(a, n->loc));
      Type type = TypeOf(a);
      const TensorTypeNode* t = AsTensor(type);
      if (!t) throw PeFailure(n->loc.ToString() + ": " + n->op->name + " got a non-tensor input");
      types.push_back(t->type);
    }
    std::vector<TensorType> out;
    try {
      out = InferTypes(*n->op, types, n->attrs);
    } catch (const OpError& err) {
      throw PeFailure(n->loc.ToString() + ": " + err.what());
    }
    if (++stats_.residual_ops > options_.max_residual_ops) {
      throw PeFailure("residual over " + std::to_string(options_.max_residual_ops) +
                      " operators (PeOptions::max_residual_ops)");
    }
    Expr call = std::make_shared<OpCallNode>(n->op, std::move(atoms), n->attrs, n->loc);
    hint_ = hint;
    if (out.size() == 1) {
      Type type = TensorTy(out[0]);
      return Dynamic(Emit(call, type), type);
    }
    std::vector<Type> fields;
    for (const TensorType& t : out) fields.push_back(TensorTy(t));
    Type tuple_type = TupleTy(fields);
    Var tuple = Emit(call, tuple_type);
    std::vector<PValue> parts;
    for (size_t i = 0; i < fields.size(); ++i) parts.push_back(Dynamic(Emit(MakeProj(tuple, static_cast<int>(i)), fields[i]), fields[i]));
    return Tuple(std::move(parts));
  }

  PValue EvalIf(const IfNode* n, Env& env) {
    std::string hint = std::move(hint_);
    hint_.clear();
    PValue cond = Eval(n->cond, env);
    if (cond->kind == PVal::Kind::kStatic) return Eval(cond->value.data<bool>()[0] ? n->then_branch : n->else_branch, env);
    auto branch = [&](const Expr& e) {
      scopes_.push_back(Scope{});
      PValue r = Eval(e, env);
      return CloseScope(Reify(r, e->loc));
    };
    Expr then_branch = branch(n->then_branch);
    Expr else_branch = branch(n->else_branch);
    Type type = n->checked_type;
    hint_ = hint;
    return Dynamic(Emit(MakeIf(cond->atom, then_branch, else_branch, n->loc), type), type);
  }

  bool Match(const Pattern& p, const PValue& v, Env& env, const SourceLoc& loc) {
    switch (p->kind) {
      case PatternKind::kWildcard: return true;
      case PatternKind::kVar: env[p->var.get()] = v; return true;
      case PatternKind::kTuple:
      case PatternKind::kCtor:
        if (v->kind == PVal::Kind::kDynamic) {
          // A tuple pattern takes a residual tuple (a dynamic `if`'s) apart
          // with projections; a dynamic ADT value cannot be matched (a).
          const TupleTypeNode* type = p->kind == PatternKind::kTuple ? AsTuple(v->type) : nullptr;
          if (!type) throw PeFailure(loc.ToString() + ": match on a dynamic value (" + TypeToString(v->type) + ")");
          for (size_t i = 0; i < p->fields.size(); ++i) {
            if (p->fields[i]->kind == PatternKind::kWildcard) continue;
            const Type& field = type->fields[i];
            if (!Match(p->fields[i], Dynamic(Emit(MakeProj(v->atom, static_cast<int>(i)), field), field), env, loc)) {
              return false;
            }
          }
          return true;
        }
        if (p->kind == PatternKind::kCtor && v->tag != p->tag) return false;
        for (size_t i = 0; i < p->fields.size(); ++i) {
          if (!Match(p->fields[i], v->fields[i], env, loc)) return false;
        }
        return true;
    }
    return false;
  }

  PValue EvalMatch(const MatchNode* n, Env& env) {
    PValue v = Eval(n->scrutinee, env);
    for (const Clause& c : n->clauses) {
      if (Match(c.pattern, v, env, n->loc)) return Eval(c.body, env);
    }
    throw PeFailure(n->loc.ToString() + ": no clause of match fits the value");
  }

  // ---- Calls --------------------------------------------------------------------------

  PValue Apply(const CallNode* call, const PValue& callee, const std::vector<PValue>& args) {
    SourceLoc loc = call ? call->loc : SourceLoc{};
    Func f;
    if (callee->kind == PVal::Kind::kGlobal) {
      f = module_.Get(callee->global).func;
    } else if (callee->kind == PVal::Kind::kClosure) {
      f = callee->func;
    } else {
      throw PeFailure(loc.ToString() + ": call of a value that is not a known function");
    }
    std::string hint = std::move(hint_);
    hint_.clear();

    // (a) The same call, on the same argument values, already answered in scope.
    uint64_t key = std::hash<const void*>{}(f.get());
    std::vector<PValue> identity;
    for (const PValue& a : args) {
      identity.push_back(a);
      key = Mix(key, std::hash<const void*>{}(a.get()));
    }
    if (callee->kind == PVal::Kind::kClosure) {
      identity.push_back(callee);
      key = Mix(key, std::hash<const void*>{}(callee.get()));
    }
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->calls.find(key);
      if (it != scope->calls.end()) {
        for (const auto& [ids, result] : it->second) {
          if (ids == identity) {
            ++stats_.shared_calls;
            return result;
          }
        }
      }
      if (scope->function_root) break;  // atoms of an enclosing function are not in scope
    }

    // (b) A loop on dynamic data, or no fuel left: call a residual function.
    uint64_t skeleton = std::hash<const void*>{}(f.get());
    for (const PValue& a : args) skeleton = Mix(skeleton, a->skeleton);
    if (callee->kind == PVal::Kind::kClosure) skeleton = Mix(skeleton, callee->skeleton);
    bool loop = false;
    auto active = active_.find(skeleton);
    if (active != active_.end()) {
      for (const std::vector<PValue>* running : active->second) {
        bool same = running->size() == args.size();
        for (size_t i = 0; same && i < args.size(); ++i) same = SameSkeleton((*running)[i], args[i]);
        loop |= same;
      }
    }
    PValue result;
    if (loop || stats_.unfoldings >= options_.fuel) {
      hint_ = hint;
      result = CallSpecialization(f, callee, args, loc);
    } else {
      // (c) Unfold.
      ++stats_.unfoldings;
      Env env;
      if (callee->kind == PVal::Kind::kClosure) {
        for (const auto& [var, v] : callee->captured) env[var] = v;
      }
      for (size_t i = 0; i < args.size(); ++i) env[f->params[i].get()] = args[i];
      active_[skeleton].push_back(&args);
      try {
        result = Eval(f->body, env);
      } catch (...) {
        active_[skeleton].pop_back();
        throw;
      }
      active_[skeleton].pop_back();
    }
    scopes_.back().calls[key].push_back({identity, result});
    return result;
  }

  // A call to f specialized on the generalized skeleton of (callee, args).
  PValue CallSpecialization(const Func& f, const PValue& callee, const std::vector<PValue>& args, const SourceLoc& loc) {
    std::vector<Var> params;
    std::vector<Expr> actuals;
    std::vector<PValue> general;
    for (const PValue& a : args) general.push_back(Generalize(a, params, actuals, loc));
    PValue general_callee = callee->kind == PVal::Kind::kClosure ? Generalize(callee, params, actuals, loc) : callee;
    general.push_back(general_callee);

    const Specialization* spec = nullptr;
    for (const Specialization& s : specializations_) {
      if (s.func != f.get() || s.args.size() != general.size()) continue;
      bool same = true;
      for (size_t i = 0; same && i < general.size(); ++i) same = SameSkeleton(s.args[i], general[i]);
      if (same) {
        spec = &s;
        break;
      }
    }
    if (!spec) spec = &Specialize(f, general, params, loc);
    Type ret = spec->ret;
    Expr call = MakeCall(MakeGlobal(spec->name), std::move(actuals), loc);
    return Dynamic(Emit(call, ret), ret);
  }

  const Specialization& Specialize(const Func& f, const std::vector<PValue>& general, const std::vector<Var>& params,
                                   const SourceLoc& loc) {
    std::string name = entry_ + "_spec" + std::to_string(specializations_.size());
    Type ret = AsFunc(f->checked_type) ? AsFunc(f->checked_type)->ret : f->body->checked_type;
    if (!ret) throw PeFailure(loc.ToString() + ": the type of a residual function is unknown");
    specializations_.push_back({f.get(), general, name, ret});
    size_t index = specializations_.size() - 1;

    // Its body: f's body on the generalized arguments, in a fresh residual function.
    Env env;
    const PValue& callee = general.back();
    if (callee->kind == PVal::Kind::kClosure) {
      for (const auto& [var, v] : callee->captured) env[var] = v;
    }
    for (size_t i = 0; i < f->params.size(); ++i) env[f->params[i].get()] = general[i];
    auto saved_active = std::move(active_);
    active_.clear();
    uint64_t skeleton = std::hash<const void*>{}(f.get());
    for (size_t i = 0; i + 1 < general.size(); ++i) skeleton = Mix(skeleton, general[i]->skeleton);
    if (callee->kind == PVal::Kind::kClosure) skeleton = Mix(skeleton, callee->skeleton);
    std::vector<PValue> general_args(general.begin(), general.end() - 1);
    active_[skeleton].push_back(&general_args);
    scopes_.push_back(Scope{});
    scopes_.back().function_root = true;
    PValue result = Eval(f->body, env);
    Expr body = CloseScope(Reify(result, f->loc));
    active_ = std::move(saved_active);
    residual_functions_.push_back({name, MakeFunc(params, body, ret, f->loc)});
    return specializations_[index];
  }
};

}  // namespace

Residual PartialEvaluate(const ModuleSnapshot& module, const std::string& entry, const std::vector<Value>& args,
                         const std::vector<bool>& static_args, const PeOptions& options) {
  PartialEvaluator pe(module, options);
  return pe.Run(entry, args, static_args);
}

std::string Residual::ToText() const {
  std::string out;
  for (const TypeDefPtr& t : types) out += PrintTypeDef(*t) + "\n\n";
  for (const auto& [name, f] : functions) out += PrintFunction(name, f) + "\n\n";
  out += PrintFunction("main", main) + "\n";
  return out;
}

Snapshot Residual::ToModule() const {
  Module m;
  for (const TypeDefPtr& t : types) m.AddType(*t);
  std::vector<std::pair<std::string, Func>> all = functions;
  all.push_back({"main", main});
  m.AddAll(all);
  return m.snapshot();
}

}  // namespace pejit
