#include "jit/batch_branches.h"

#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ir/structural.h"
#include "ir/visitor.h"
#include "jit/executable.h"
#include "jit/straight.h"
#include "jit/vectorize.h"
#include "ops/op.h"

namespace pejit {
namespace {

// What a variable of the original program is in the stacked one: an atom,
// and whether it holds every row's value (rows, member...) or one value all
// rows share (`member` is the original type either way).
struct Val {
  Expr atom;
  bool stacked = false;
  Type member;
};
using Env = std::unordered_map<const VarNode*, Val>;

// The type of an atom (jit/straight.h's AtomType), which the values this
// pass builds all have.
Type TypeOfAtom(const Expr& e) {
  Type type = AtomType(e);
  if (!type) throw JitFailure("batch branches: a value of no known type");
  return type;
}

bool FullyKnown(const Type& t) {
  if (const TensorTypeNode* tensor = AsTensor(t)) return tensor->type.IsFullyKnown();
  if (const TupleTypeNode* tuple = AsTuple(t)) {
    for (const Type& f : tuple->fields) {
      if (!FullyKnown(f)) return false;
    }
    return true;
  }
  return false;
}

Type Stacked(const Type& t, int64_t rows) {
  if (const TensorTypeNode* tensor = AsTensor(t)) {
    Shape shape = tensor->type.shape;
    shape.insert(shape.begin(), rows);
    return TensorTy(tensor->type.dtype, std::move(shape));
  }
  std::vector<Type> fields;
  for (const Type& f : AsTuple(t)->fields) fields.push_back(Stacked(f, rows));
  return TupleTy(std::move(fields));
}

// The variables `e` reads that it does not bind, in the order a post-order
// walk first meets them (the same order for isomorphic expressions).
std::vector<const VarNode*> FreeVarsOf(const Expr& e) {
  std::unordered_set<const VarNode*> bound;
  PostOrderVisit(e, [&](const Expr& x) {
    if (const LetNode* let = As<LetNode>(x)) bound.insert(let->var.get());
    if (const FuncNode* f = As<FuncNode>(x)) {
      for (const Var& p : f->params) bound.insert(p.get());
    }
  });
  std::vector<const VarNode*> out;
  std::unordered_set<const VarNode*> seen;
  PostOrderVisit(e, [&](const Expr& x) {
    if (const VarNode* v = As<VarNode>(x); v && !bound.count(v) && seen.insert(v).second) out.push_back(v);
  });
  return out;
}

// Rewrites free variables anywhere in an expression (branches, nested lets).
class Rename final : public ExprMutator {
 public:
  explicit Rename(const std::unordered_map<const ExprNode*, Expr>& to) {
    for (const auto& [from, e] : to) memo_[from] = e;
  }
};

// Let-chains built front to back.
class Emitter {
 public:
  Expr Bind(const std::string& name, Expr value, Type type) {
    Var var = MakeVar(name, std::move(type));
    lets_.emplace_back(var, std::move(value));
    return var;
  }
  void BindVar(Var var, Expr value) { lets_.emplace_back(std::move(var), std::move(value)); }
  Expr Op(const std::string& name, std::vector<Expr> args, const Attrs& attrs = {}) {
    const OpDef& op = LookupOp(name);
    Attrs normalized = NormalizeAttrs(op, attrs);
    std::vector<TensorType> in;
    for (const Expr& a : args) in.push_back(TensorTypeOf(a));
    std::vector<TensorType> out = InferTypes(op, in, normalized);
    return Bind("b", MakeOpCall(name, std::move(args), normalized), TensorTy(out.at(0)));
  }
  Expr Finish(Expr tail) const {
    for (auto it = lets_.rbegin(); it != lets_.rend(); ++it) tail = MakeLet(it->first, it->second, tail);
    return tail;
  }
  std::vector<std::pair<Var, Expr>>& lets() { return lets_; }

 private:
  std::vector<std::pair<Var, Expr>> lets_;
};

// A tuple of atoms, bound.
Expr Tuple(std::vector<Expr> fields, Emitter& out) {
  std::vector<Type> types;
  for (const Expr& f : fields) types.push_back(TypeOfAtom(f));
  return out.Bind("tuple", MakeTuple(std::move(fields)), TupleTy(std::move(types)));
}

// `take` of every tensor of stacked `atom` (tensors in tuples): rows
// `rows` (a vector of row indices), or one row (a scalar index) unstacked.
Expr Gather(const Expr& atom, const Expr& rows, Emitter& out) {
  const Type type = TypeOfAtom(atom);
  if (AsTensor(type)) return out.Op("take", {atom, rows});
  std::vector<Expr> fields;
  for (size_t i = 0; i < AsTuple(type)->fields.size(); ++i) {
    Expr field = out.Bind("field", MakeProj(atom, static_cast<int>(i)), AsTuple(type)->fields[i]);
    fields.push_back(Gather(field, rows, out));
  }
  return Tuple(std::move(fields), out);
}

// The sides a stacked condition splits the rows of `mask` into.
std::pair<Expr, Expr> Sides(const Expr& mask, const Expr& cond, Emitter& out) {
  return {out.Op("logical_and", {mask, cond}), out.Op("logical_and", {mask, out.Op("logical_not", {cond})})};
}

// A let's type, which stacking needs fully known.
const Type& KnownType(const Var& var) {
  if (!var->annotation || !FullyKnown(var->annotation)) {
    throw JitFailure("batch branches: %" + var->name + " has no fully known type");
  }
  return var->annotation;
}

class Batcher {
 public:
  // Names of the stacked versions are numbered after `functions`, so that
  // each group's are new (a loop batched in two groups has two versions).
  Batcher(const std::vector<std::pair<std::string, Func>>& functions, int64_t rows)
      : rows_(rows), first_number_(functions.size()) {
    for (const auto& [name, f] : functions) functions_[name] = f;
  }

  // The stacked computation of `template_value` (an `if` or a residual
  // call of one instance) for all rows, in `out`; `env` holds its free
  // variables. Every row is live.
  Val Run(const Var& result, const Expr& template_value, Env env, Emitter& out) {
    Expr mask = MakeConstant(Tensor::Full(DType::kBool, {rows_}, 1.0));
    Expr body = MakeLet(result, template_value, result);
    return Block(body, env, mask, out);
  }

  std::vector<std::pair<std::string, Func>>& made() { return made_; }

 private:
  // Runs the let-chain `body` for the rows of `mask` (every row holds a
  // value some example of the mask computes), emitting into `out`. With
  // `acc` (a stacked value of the block's type), the block is in tail
  // position of a stacked function: its result is `acc` with the rows of
  // `mask` set, and a call or branch that ends it stays last, so that a
  // loop's next iteration is a tail call the driver runs in one frame.
  Val Block(const Expr& body, Env& env, const Expr& mask, Emitter& out, const Expr& acc = nullptr) {
    std::vector<const LetNode*> chunk;
    const Expr* e = &body;
    while (const LetNode* let = As<LetNode>(*e)) {
      const Expr& value = let->value;
      const bool last = let->body.get() == let->var.get();
      if (value->kind == ExprKind::kOpCall || value->kind == ExprKind::kTuple || value->kind == ExprKind::kProj) {
        chunk.push_back(let);
      } else if (acc && last && (value->kind == ExprKind::kIf || value->kind == ExprKind::kCall)) {
        Chunk(chunk, env, out);
        return TailStep(*let, env, mask, out, acc);
      } else {
        Chunk(chunk, env, out);
        chunk.clear();
        env[let->var.get()] = Step(*let, env, mask, out);
      }
      e = &let->body;
    }
    Chunk(chunk, env, out);
    Val v = Atom(*e, env, out);
    if (!acc) return v;
    return {Select(mask, StackAll(v, out), acc, TypeOfAtom(acc), out), true, v.member};
  }

  // The call or branch that ends a block in tail position (Block's `acc`).
  Val TailStep(const LetNode& let, Env& env, const Expr& mask, Emitter& out, const Expr& acc) {
    const Type& type = KnownType(let.var);
    const Type stacked_type = Stacked(type, rows_);
    if (const IfNode* n = As<IfNode>(let.value)) {
      Val cond = Atom(n->cond, env, out);
      if (!cond.stacked) {
        Emitter then_out, else_out;
        Env then_env = env, else_env = env;
        Val a = Block(n->then_branch, then_env, mask, then_out, acc);
        Val b = Block(n->else_branch, else_env, mask, else_out, acc);
        Expr branch = MakeIf(cond.atom, then_out.Finish(a.atom), else_out.Finish(b.atom));
        return {out.Bind("branch", branch, stacked_type), true, type};
      }
      const auto [taken, not_taken] = Sides(mask, cond.atom, out);
      // The side whose last step calls (the loop's next iteration, the
      // function itself first) goes last: its call is then a tail call.
      bool then_last = EndsInCall(n->then_branch, self_) && !EndsInCall(n->else_branch, self_);
      if (!then_last && !EndsInCall(n->else_branch, self_)) {
        then_last = EndsInCall(n->then_branch, "") && !EndsInCall(n->else_branch, "");
      }
      const Expr& first = then_last ? n->else_branch : n->then_branch;
      const Expr& second = then_last ? n->then_branch : n->else_branch;
      Expr acc1 = Branch(first, type, then_last ? not_taken : taken, env, out, acc);
      return {Branch(second, type, then_last ? taken : not_taken, env, out, acc1), true, type};
    }
    Val call = Call(let, env, mask, out, acc);
    if (call.stacked) return call;  // the stacked function merged into acc
    return {Select(mask, StackAll(call, out), acc, stacked_type, out), true, type};
  }

  // Whether block `e` ends in a call of residual function `name` (any,
  // when empty), directly or on a side of the `if` it ends in.
  static bool EndsInCall(const Expr& e, const std::string& name) {
    const Expr* at = &e;
    const LetNode* last = nullptr;
    while (const LetNode* let = As<LetNode>(*at)) {
      last = let;
      at = &let->body;
    }
    if (!last || at->get() != last->var.get()) return false;
    if (const IfNode* n = As<IfNode>(last->value)) return EndsInCall(n->then_branch, name) || EndsInCall(n->else_branch, name);
    const CallNode* call = As<CallNode>(last->value);
    const GlobalNode* callee = call ? As<GlobalNode>(call->callee) : nullptr;
    return callee && (name.empty() || callee->name == name);
  }

  // A let whose value is not straight-line code.
  Val Step(const LetNode& let, Env& env, const Expr& mask, Emitter& out) {
    const Expr& value = let.value;
    const Type& type = KnownType(let.var);
    switch (value->kind) {
      case ExprKind::kVar:
        return env.at(static_cast<const VarNode*>(value.get()));
      case ExprKind::kConstant:
        return {value, false, type};
      case ExprKind::kLet: return Block(value, env, mask, out);
      case ExprKind::kIf: return If(static_cast<const IfNode&>(*value), type, env, mask, out);
      case ExprKind::kCall: return Call(let, env, mask, out, nullptr);
      default:
        throw JitFailure("batch branches: a let of kind " + std::to_string(static_cast<int>(value->kind)));
    }
  }

  // A call of a residual function: the same call for every row when no
  // argument is stacked, else its stacked version's, whose rows outside
  // `mask` are `acc`'s (zeros without one).
  Val Call(const LetNode& let, Env& env, const Expr& mask, Emitter& out, const Expr& acc) {
    const CallNode& call = static_cast<const CallNode&>(*let.value);
    const Type& type = let.var->annotation;
    const GlobalNode* callee = As<GlobalNode>(call.callee);
    if (!callee || !functions_.count(callee->name)) {
      throw JitFailure("batch branches: a call that is not of a residual function");
    }
    std::vector<Val> args;
    bool any_stacked = false;
    for (const Expr& a : call.args) {
      args.push_back(Atom(a, env, out));
      any_stacked |= args.back().stacked;
    }
    if (!any_stacked) {
      std::vector<Expr> atoms;
      for (const Val& a : args) atoms.push_back(a.atom);
      return {out.Bind(let.var->name, MakeCall(call.callee, std::move(atoms)), type), false, type};
    }
    // A constant argument is stacked: a loop's counter or sum starts as
    // one and is data the next iteration, and one stacked version of the
    // loop serves both calls.
    std::vector<bool> pattern;
    for (const Val& a : args) pattern.push_back(a.stacked || a.atom->kind == ExprKind::kConstant);
    const auto& [name, stacked] = Function(callee->name, pattern);
    std::vector<Expr> atoms = {mask};
    for (size_t i = 0; i < args.size(); ++i) atoms.push_back(stacked[i] ? StackAll(args[i], out) : args[i].atom);
    const Type stacked_type = Stacked(type, rows_);
    if (acc) {
      atoms.push_back(acc);
      return {out.Bind(let.var->name, MakeCall(MakeGlobal(name), std::move(atoms)), stacked_type), true, type};
    }
    // Rows outside the mask return zeros: what follows reads a copy of a
    // row in it instead, as everywhere else in the block.
    atoms.push_back(Zeros(stacked_type, out));
    Expr result = out.Bind(let.var->name, MakeCall(MakeGlobal(name), std::move(atoms)), stacked_type);
    return {Gather(result, RowsOf(mask, out), out), true, type};
  }

  // Row indices that keep the rows of `mask` and give every other row the
  // first row in it (the mask holds at least one).
  Expr RowsOf(const Expr& mask, Emitter& out) {
    Expr first = out.Op("argmax", {out.Op("cast", {mask}, {{"dtype", DType::kI64}})});
    std::vector<int64_t> iota(rows_);
    for (int64_t i = 0; i < rows_; ++i) iota[i] = i;
    return out.Op("where", {mask, MakeConstant(Tensor::FromVector<int64_t>({rows_}, iota)), first});
  }

  Val If(const IfNode& n, const Type& type, Env& env, const Expr& mask, Emitter& out) {
    Val cond = Atom(n.cond, env, out);
    if (!cond.stacked) {  // every row takes the same branch
      Emitter then_out, else_out;
      Env then_env = env, else_env = env;
      Val a = Block(n.then_branch, then_env, mask, then_out);
      Val b = Block(n.else_branch, else_env, mask, else_out);
      Expr then_block = then_out.Finish(StackAll(a, then_out));
      Expr else_block = else_out.Finish(StackAll(b, else_out));
      return {out.Bind("branch", MakeIf(cond.atom, then_block, else_block), Stacked(type, rows_)), true, type};
    }
    const auto [taken, not_taken] = Sides(mask, cond.atom, out);
    Expr a = Branch(n.then_branch, type, taken, env, out);
    Expr b = Branch(n.else_branch, type, not_taken, env, out);
    return {Select(cond.atom, a, b, Stacked(type, rows_), out), true, type};
  }

  // `branch` for the rows of `mask`, when any row is in it (zeros, or `acc`
  // in tail position, otherwise): the stacked values it reads are first
  // gathered so that every row outside the mask holds the first row in it.
  Expr Branch(const Expr& branch, const Type& type, const Expr& mask, const Env& env, Emitter& out,
              const Expr& acc = nullptr) {
    const Type stacked_type = Stacked(type, rows_);
    Expr count = out.Op("sum", {out.Op("cast", {mask}, {{"dtype", DType::kF32}})});
    Expr any = out.Op("greater", {count, MakeConstant(Tensor::Scalar(0.5f))});
    Emitter in;
    Env inner = env;
    Expr rows = RowsOf(mask, in);
    for (const VarNode* v : FreeVarsOf(branch)) {
      auto it = inner.find(v);
      if (it == inner.end() || !it->second.stacked) continue;
      it->second.atom = Gather(it->second.atom, rows, in);
    }
    Val result = Block(branch, inner, mask, in, acc);
    Expr then_block = in.Finish(StackAll(result, in));
    Emitter none;
    Expr else_block = none.Finish(acc ? acc : Zeros(stacked_type, none));
    return out.Bind("branch", MakeIf(any, then_block, else_block), stacked_type);
  }

  Expr Zeros(const Type& type, Emitter& out) {
    if (const TensorTypeNode* t = AsTensor(type)) return MakeConstant(Tensor::Zeros(t->type.dtype, t->type.shape));
    std::vector<Expr> fields;
    for (const Type& f : AsTuple(type)->fields) fields.push_back(Zeros(f, out));
    return Tuple(std::move(fields), out);
  }

  // Row r of the result is a's where cond[r], else b's.
  Expr Select(const Expr& cond, const Expr& a, const Expr& b, const Type& type, Emitter& out) {
    if (const TensorTypeNode* t = AsTensor(type)) {
      Shape shape(t->type.shape.size(), 1);
      shape[0] = rows_;
      Expr c = out.Op("reshape", {cond}, {{"shape", shape}});
      return out.Op("where", {c, a, b});
    }
    std::vector<Expr> fields;
    for (size_t i = 0; i < AsTuple(type)->fields.size(); ++i) {
      const Type& f = AsTuple(type)->fields[i];
      Expr fa = out.Bind("field", MakeProj(a, static_cast<int>(i)), f);
      Expr fb = out.Bind("field", MakeProj(b, static_cast<int>(i)), f);
      fields.push_back(Select(cond, fa, fb, f, out));
    }
    return Tuple(std::move(fields), out);
  }

  // A value as stacked rows (a shared one repeated).
  Expr StackAll(const Val& v, Emitter& out) {
    if (v.stacked) return v.atom;
    if (AsTensor(v.member)) {
      return out.Op("broadcast_to", {v.atom}, {{"shape", AsTensor(Stacked(v.member, rows_))->type.shape}});
    }
    std::vector<Expr> fields;
    for (size_t i = 0; i < AsTuple(v.member)->fields.size(); ++i) {
      const Type& f = AsTuple(v.member)->fields[i];
      fields.push_back(StackAll({out.Bind("field", MakeProj(v.atom, static_cast<int>(i)), f), false, f}, out));
    }
    return Tuple(std::move(fields), out);
  }

  // An atom of the original program (a variable, constant, projection or
  // tuple of them) in the stacked one.
  Val Atom(const Expr& e, const Env& env, Emitter& out) {
    switch (e->kind) {
      case ExprKind::kVar: return env.at(static_cast<const VarNode*>(e.get()));
      case ExprKind::kConstant: return {e, false, TypeOfAtom(e)};
      case ExprKind::kProj: {
        const ProjNode& p = static_cast<const ProjNode&>(*e);
        Val t = Atom(p.tuple, env, out);
        const TupleTypeNode* tuple = AsTuple(t.member);
        if (!tuple) throw JitFailure("batch branches: a projection of a value that is not a tuple");
        const Type& member = tuple->fields.at(p.index);
        Type type = t.stacked ? Stacked(member, rows_) : member;
        return {out.Bind("field", MakeProj(t.atom, p.index), type), t.stacked, member};
      }
      case ExprKind::kTuple: {
        std::vector<Val> fields;
        bool stacked = false;
        for (const Expr& f : static_cast<const TupleNode&>(*e).fields) {
          fields.push_back(Atom(f, env, out));
          stacked |= fields.back().stacked;
        }
        std::vector<Expr> atoms;
        std::vector<Type> members;
        for (const Val& f : fields) {
          atoms.push_back(stacked ? StackAll(f, out) : f.atom);
          members.push_back(f.member);
        }
        return {Tuple(std::move(atoms), out), stacked, TupleTy(std::move(members))};
      }
      default: throw JitFailure("batch branches: a block ends in an expression that is not an atom");
    }
  }

  // A run of straight-line lets: vectorized at once (jit/vectorize.h), its
  // parameters the values it reads, its results every variable it binds.
  void Chunk(const std::vector<const LetNode*>& lets, Env& env, Emitter& out) {
    if (lets.empty()) return;
    std::unordered_set<const VarNode*> defined;
    std::vector<Var> params;
    std::vector<const VarNode*> originals;  // what each parameter stands for
    std::vector<bool> stacked;
    std::unordered_map<const ExprNode*, Expr> subst;
    std::vector<Expr> results;
    std::vector<Type> types;
    for (const LetNode* let : lets) {
      for (const VarNode* v : FreeVarsOf(let->value)) {
        if (defined.count(v) || subst.count(v)) continue;
        const Val& val = env.at(v);
        if (!val.stacked && val.atom->kind == ExprKind::kConstant) {
          subst[v] = val.atom;
          continue;
        }
        Var p = MakeVar(v->name, val.member);
        params.push_back(p);
        originals.push_back(v);
        stacked.push_back(val.stacked);
        subst[v] = p;
      }
      defined.insert(let->var.get());
      types.push_back(KnownType(let->var));
      results.push_back(let->var);
    }
    Expr body = MakeTuple(results);
    for (auto it = lets.rbegin(); it != lets.rend(); ++it) {
      body = MakeLet((*it)->var, Substitute((*it)->value, subst), body);
    }
    Straight vec = Decompose(Vectorize(MakeFunc(params, body, TupleTy(types)), stacked, rows_));
    std::unordered_map<const ExprNode*, Expr> to_env;
    for (size_t i = 0; i < params.size(); ++i) to_env[vec.params[i].get()] = env.at(originals[i]).atom;
    for (const Binding& b : vec.bindings) out.BindVar(b.var, Substitute(b.value, to_env));
    Expr result = Substitute(vec.result, to_env);
    const TupleNode* tuple = As<TupleNode>(result);
    for (size_t i = 0; i < lets.size(); ++i) {
      Expr field = tuple ? tuple->fields.at(i)
                         : out.Bind("field", MakeProj(result, static_cast<int>(i)), Stacked(types[i], rows_));
      env[lets[i]->var.get()] = {field, true, types[i]};
    }
  }

  // The stacked version of residual function `name` for arguments stacked
  // as `pattern`: its first parameter is the mask of rows whose results
  // are read (at least one), its last what the rows outside it return.
  // An existing version that stacks at least what `pattern` does serves
  // (the caller stacks the rest), so that a loop has one version. Returns
  // its name and what it stacks.
  std::pair<std::string, std::vector<bool>> Function(const std::string& name, const std::vector<bool>& pattern) {
    for (const Version& v : versions_) {
      bool covers = v.original == name;
      for (size_t i = 0; covers && i < pattern.size(); ++i) covers = v.stacked[i] || !pattern[i];
      if (covers) return {v.name, v.stacked};
    }
    const std::string stacked_name = name + "_rows" + std::to_string(first_number_ + versions_.size());
    versions_.push_back({name, pattern, stacked_name});
    const Func& f = functions_.at(name);
    if (!f->ret_type || !FullyKnown(f->ret_type)) throw JitFailure("batch branches: @" + name + "'s result type is not known");
    // What the rows outside the mask return is a parameter, and the
    // control-flow driver passes tensors only.
    if (!AsTensor(f->ret_type)) throw JitFailure("batch branches: @" + name + " returns a tuple");
    Var mask = MakeVar("mask", TensorTy(DType::kBool, {rows_}));
    std::vector<Var> params = {mask};
    Env env;
    for (size_t i = 0; i < f->params.size(); ++i) {
      const Type& t = f->params[i]->annotation;
      if (!FullyKnown(t)) throw JitFailure("batch branches: @" + name + "'s parameter %" + f->params[i]->name + " has no known type");
      Var p = MakeVar(f->params[i]->name, pattern[i] ? Stacked(t, rows_) : t);
      params.push_back(p);
      env[f->params[i].get()] = {p, static_cast<bool>(pattern[i]), t};
    }
    Var acc = MakeVar("acc", Stacked(f->ret_type, rows_));
    params.push_back(acc);
    Emitter out;
    const std::string caller = std::exchange(self_, name);
    Val result = Block(f->body, env, mask, out, acc);
    self_ = caller;
    Expr body = out.Finish(result.atom);
    made_.emplace_back(stacked_name, MakeFunc(std::move(params), body, Stacked(f->ret_type, rows_)));
    return {stacked_name, pattern};
  }

  struct Version {
    std::string original;
    std::vector<bool> stacked;
    std::string name;
  };

  int64_t rows_;
  size_t first_number_;
  std::map<std::string, Func> functions_;
  std::vector<Version> versions_;
  std::string self_;  // the residual function whose stacked version is being built
  std::vector<std::pair<std::string, Func>> made_;
};

bool Candidate(const Expr& value) {
  if (value->kind == ExprKind::kIf) return true;
  const CallNode* call = As<CallNode>(value);
  return call && call->callee->kind == ExprKind::kGlobal;
}

// An instance of a candidate as a function of what it reads, for comparing
// instances up to renaming (ir/structural.h).
struct Instance {
  size_t let = 0;  // index among main's lets
  std::vector<const VarNode*> reads;
  Func shape;
  size_t hash = 0;
};

// Batches the first set of at least two independent isomorphic instances;
// false when there is none left.
bool BatchOneGroup(const std::vector<Var>& params, std::vector<std::pair<Var, Expr>>& lets,
                   const std::unordered_set<const ExprNode*>& made, std::vector<std::pair<std::string, Func>>& functions,
                   BatchedBranches& result) {
  std::unordered_map<const VarNode*, Var> owners;  // what an instance may read: main's parameters and lets
  for (const Var& p : params) owners[p.get()] = p;
  for (const auto& let : lets) owners[let.first.get()] = let.first;
  std::vector<Instance> instances;
  for (size_t i = 0; i < lets.size(); ++i) {
    const auto& [var, value] = lets[i];
    if (made.count(value.get())) continue;
    if (!Candidate(value) || !var->annotation || !FullyKnown(var->annotation)) continue;
    Instance inst;
    inst.let = i;
    inst.reads = FreeVarsOf(value);
    std::vector<Var> reads;
    bool known = true;
    for (const VarNode* v : inst.reads) {
      known &= v->annotation && FullyKnown(v->annotation) && owners.count(v);
      reads.push_back(MakeVar(v->name, v->annotation));
    }
    if (!known) continue;
    std::unordered_map<const ExprNode*, Expr> subst;
    for (size_t k = 0; k < reads.size(); ++k) subst[inst.reads[k]] = reads[k];
    inst.shape = MakeFunc(reads, Rename(subst).Mutate(value), var->annotation);
    inst.hash = StructuralHash(inst.shape);
    instances.push_back(std::move(inst));
  }
  std::vector<bool> used(instances.size(), false);
  for (size_t first = 0; first < instances.size(); ++first) {
    if (used[first]) continue;
    std::vector<size_t> group = {first};
    for (size_t j = first + 1; j < instances.size(); ++j) {
      if (!used[j] && instances[j].hash == instances[first].hash &&
          StructuralEqual(instances[j].shape, instances[first].shape)) {
        group.push_back(j);
      }
    }
    for (size_t j : group) used[j] = true;
    if (group.size() < 2) continue;
    // Independence: an instance reading what an earlier one computes
    // (through any chain of lets) stays out; `later` are the lets that
    // must come after the batched instances.
    std::unordered_set<const VarNode*> tainted;
    std::vector<bool> later(lets.size(), false);
    std::vector<size_t> members;
    size_t next = 0;
    for (size_t i = 0; i < lets.size(); ++i) {
      const bool is_instance = next < group.size() && instances[group[next]].let == i;
      bool reads_tainted = false;
      for (const VarNode* v : FreeVarsOf(lets[i].second)) reads_tainted |= tainted.count(v) > 0;
      if (is_instance && !reads_tainted) members.push_back(group[next]);
      if (is_instance) ++next;
      if (reads_tainted || is_instance) {
        later[i] = true;
        tainted.insert(lets[i].first.get());
      }
    }
    if (members.size() < 2) continue;
    // Members left out (dependent) are `later` lets like any other.
    const Instance& model = instances[members[0]];
    const int64_t rows = static_cast<int64_t>(members.size());
    Emitter out;
    Env env;
    try {
      for (size_t p = 0; p < model.reads.size(); ++p) {
        bool shared = true;
        for (size_t m : members) shared &= instances[m].reads[p] == model.reads[p];
        const Type& type = model.reads[p]->annotation;
        if (shared) {
          env[model.reads[p]] = {owners.at(model.reads[p]), false, type};
          continue;
        }
        if (!AsTensor(type)) throw JitFailure("batch branches: a stacked value that is not a tensor");
        std::vector<Expr> parts;
        for (size_t m : members) parts.push_back(owners.at(instances[m].reads[p]));
        env[model.reads[p]] = {out.Op("stack", std::move(parts), {{"axis", int64_t{0}}}), true, type};
      }
      Batcher batcher(functions, rows);
      const Var& model_var = lets[model.let].first;
      Val stacked = batcher.Run(MakeVar(model_var->name, model_var->annotation), lets[model.let].second, env, out);
      if (!stacked.stacked) throw JitFailure("batch branches: the batched result is not stacked");
      for (size_t k = 0; k < members.size(); ++k) {  // each member's row, under its own variable
        Expr index = MakeConstant(Tensor::FromVector<int64_t>({}, {static_cast<int64_t>(k)}));
        out.BindVar(lets[instances[members[k]].let].first, Gather(stacked.atom, index, out));
      }
      for (auto& fn : batcher.made()) functions.push_back(std::move(fn));
    } catch (const std::exception&) {
      continue;  // this set stays per example (a JitFailure, or an operator or shape the stacked code refuses)
    }
    std::vector<std::pair<Var, Expr>> reordered;
    for (size_t i = 0; i < lets.size(); ++i) {
      if (!later[i]) reordered.push_back(lets[i]);
    }
    for (auto& let : out.lets()) reordered.push_back(std::move(let));
    std::unordered_set<size_t> member_lets;
    for (size_t m : members) member_lets.insert(instances[m].let);
    for (size_t i = 0; i < lets.size(); ++i) {
      if (later[i] && !member_lets.count(i)) reordered.push_back(lets[i]);
    }
    lets = std::move(reordered);
    ++result.groups;
    result.rows += static_cast<int>(rows);
    return true;
  }
  return false;
}

}  // namespace

BatchedBranches BatchBranches(const Func& main, const std::vector<std::pair<std::string, Func>>& functions) {
  BatchedBranches result;
  result.main = main;
  result.functions = functions;
  std::vector<std::pair<Var, Expr>> lets;
  const Expr* e = &main->body;
  while (const LetNode* let = As<LetNode>(*e)) {
    lets.emplace_back(let->var, let->value);
    e = &let->body;
  }
  const Expr tail = *e;
  // Values the batched code introduces are not instances themselves.
  std::unordered_set<const ExprNode*> made;
  for (int round = 0; round < 64; ++round) {
    std::unordered_set<const ExprNode*> before;
    for (const auto& let : lets) before.insert(let.second.get());
    if (!BatchOneGroup(main->params, lets, made, result.functions, result)) break;
    for (const auto& let : lets) {
      if (!before.count(let.second.get())) made.insert(let.second.get());
    }
  }
  if (result.groups == 0) return result;
  Expr body = tail;
  for (auto it = lets.rbegin(); it != lets.rend(); ++it) body = MakeLet(it->first, it->second, body);
  result.main = MakeFunc(main->params, body, main->ret_type, main->loc);
  return result;
}

}  // namespace pejit
