// Reverse-mode automatic differentiation of residual programs.
//
// A residual program (pe/) is straight-line code: tensor parameters, a chain
// of `let %v = op(atoms...)` (plus tuples and projections for operators with
// several outputs, and let-bound constants), and an atom as the result.
// Differentiating it is the textbook source transformation, and it stays
// small because every operator carries its own vector-Jacobian product
// (OpDef::grad) written against GradBuilder: the interpreter's tape runs those
// rules on tensors, and IrGradBuilder below runs them to emit IR instead. Both
// tiers therefore differentiate with the same rules, in the same order.
//
// 1. Forward. The residual's lets are lowered in order into the new program's
//    let list, each keeping its variable, so the forward half of the result
//    is the residual itself. Every tensor becomes a GradValue (an atom and its
//    type). Tuples and projections are resolved here, at compile time, to the
//    GradValues of their fields, so a multi-output operator (split, chunk) is
//    one application with several outputs, as GradContext wants; an output
//    the residual never projects is bound only if a gradient rule asks for it.
// 2. Activity. A value is active when it depends on a parameter in `wrt`
//    through differentiable operators: exactly what the tape would record.
//    Only active applications are differentiated and only active inputs
//    receive gradients, so constants, indices and the other parameters cost
//    no backward code.
// 3. Backward. d loss = 1. Applications are visited in reverse; each with a
//    gradient on some output runs its rule, and the contributions reaching a
//    value are summed with `add`, first one first, as the tape sums them. So
//    both tiers agree to rounding, usually bitwise.
// 4. Result. `(loss, d loss/d w0, d loss/d w1, ...)`, each gradient of its
//    parameter's type; a parameter with no path to the loss gets zeros.
// 5. Dead code. Rules compute a gradient for every input, including ones
//    nobody wants (the inactive operand of a `mul`); backward lets the result
//    does not depend on are dropped. The forward lets stay as they were.
//
// Refused with JitFailure: anything that is not straight-line tensor code
// (calls to residual functions, which come from dynamic loops and fuel
// overruns; `if`; `match`; closures; constructors), results other than a
// Tensor[(), f32], and `wrt` entries that are not float tensor parameters.
// Shapes must be static where gradients flow (residuals' always are): the
// rules decide broadcasting and reductions from them.
#include "jit/autodiff.h"

#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ir/visitor.h"
#include "ops/op.h"

namespace pejit {
namespace {

// A GradBuilder whose values are atoms (variables or constants) of the program
// being built: emitting an operator appends a let binding to it.
class IrGradBuilder final : public GradBuilder {
 public:
  // A value the program already has: a parameter, a constant, a let variable.
  GradValue Bind(Expr atom, TensorType type) {
    slots_.push_back({std::move(atom), std::move(type), nullptr, -1});
    return static_cast<GradValue>(slots_.size() - 1);
  }

  // The atom of `value`. An operator output not projected yet gets its
  // projection let here, bound to `as` when given (the residual's variable).
  Expr Atom(GradValue value, const Var& as = nullptr) {
    if (!slots_.at(value).atom) {
      Var v = as ? as : NewVar(TensorTy(slots_[value].type));
      lets_.emplace_back(v, MakeProj(slots_[value].tuple, slots_[value].index));
      slots_[value].atom = std::move(v);
    }
    return slots_[value].atom;
  }

  // Appends `let %as = op(inputs)` (a fresh variable when `as` is null) and
  // returns the outputs. `attrs` must be normalized. Throws OpError.
  std::vector<GradValue> Apply(const OpDef& op, std::span<const GradValue> inputs, const Attrs& attrs,
                               const SourceLoc& loc, const Var& as) {
    std::vector<TensorType> in_types;
    std::vector<Expr> args;
    for (GradValue v : inputs) {
      in_types.push_back(TypeOf(v));
      args.push_back(Atom(v));
    }
    std::vector<TensorType> out_types = InferTypes(op, in_types, attrs);
    Expr call = std::make_shared<OpCallNode>(&op, std::move(args), attrs, loc);
    if (out_types.size() == 1) {
      Var v = as ? as : NewVar(TensorTy(out_types[0]));
      lets_.emplace_back(v, std::move(call));
      return {Bind(std::move(v), std::move(out_types[0]))};
    }
    // Several outputs: a tuple variable; its fields are projected on first use.
    std::vector<Type> field_types;
    for (const TensorType& t : out_types) field_types.push_back(TensorTy(t));
    Var tuple = as ? as : NewVar(TupleTy(std::move(field_types)));
    lets_.emplace_back(tuple, std::move(call));
    std::vector<GradValue> outputs;
    for (size_t i = 0; i < out_types.size(); ++i) {
      slots_.push_back({nullptr, std::move(out_types[i]), tuple, static_cast<int>(i)});
      outputs.push_back(static_cast<GradValue>(slots_.size() - 1));
    }
    return outputs;
  }

  // Appends `let %var = value` as it is (a let-bound constant of the residual).
  void Let(Var var, Expr value) { lets_.emplace_back(std::move(var), std::move(value)); }

  std::vector<GradValue> EmitOp(const OpDef& op, std::span<const GradValue> inputs,
                                const Attrs& attrs) override {
    // Rules pass attributes normalized already; normalizing again is cheap and
    // keeps the IR's invariant even for a careless rule.
    SourceLoc loc;
    loc.lane = lane_;
    return Apply(op, inputs, NormalizeAttrs(op, attrs), loc, nullptr);
  }

  // One-element constants inline, larger ones let-bound: what the partial
  // evaluator does, so later passes see one style.
  GradValue Constant(const Tensor& value) override {
    if (value.numel() == 1) return Bind(MakeConstant(value), value.type());
    Var v = NewVar(TensorTy(value.type()));
    Let(v, MakeConstant(value));
    return Bind(std::move(v), value.type());
  }

  TensorType TypeOf(GradValue value) const override { return slots_.at(value).type; }

  size_t size() const { return slots_.size(); }
  const std::vector<std::pair<Var, Expr>>& lets() const { return lets_; }
  // Variables made from here on are named `hint` (the printer numbers them).
  void set_name_hint(std::string hint) { hint_ = std::move(hint); }
  // Operations emitted from here on are in this lane (jit/lanes.h): a
  // gradient is computed where the value it differentiates was.
  void set_lane(int lane) { lane_ = lane; }

 private:
  struct Slot {
    Expr atom;   // null: field `index` of `tuple`, not projected yet
    TensorType type;
    Var tuple;
    int index;
  };

  Var NewVar(Type type) { return MakeVar(hint_, std::move(type)); }

  std::vector<Slot> slots_;
  std::vector<std::pair<Var, Expr>> lets_;
  std::string hint_ = "t";
  int lane_ = -1;
};

// A value of the forward program: a tensor, or a tuple of values.
struct Val {
  GradValue tensor = kNoGrad;  // kNoGrad: a tuple
  std::vector<Val> fields;
  bool is_tensor() const { return tensor != kNoGrad; }
};

// One operator application on active values, for the backward pass.
struct Application {
  const OpDef* op;
  Attrs attrs;
  std::vector<GradValue> inputs;
  std::vector<GradValue> outputs;
  SourceLoc loc;
};

class Differentiator {
 public:
  Func Run(const FuncNode& f, const std::vector<int>& wrt) {
    // Parameters; those in `wrt` start the active set.
    std::vector<GradValue> params;
    for (size_t i = 0; i < f.params.size(); ++i) {
      const Var& p = f.params[i];
      const TensorTypeNode* t = AsTensor(p->annotation);
      if (!t) {
        Refuse(p->loc, "parameter " + std::to_string(i) + " (%" + p->name + ") is " +
                           (p->annotation ? TypeToString(p->annotation) : "unannotated") +
                           ", not a tensor; residual programs take tensors only");
      }
      params.push_back(builder_.Bind(p, t->type));
      env_[p.get()] = Val{params.back(), {}};
    }
    for (int k : wrt) {
      if (k < 0 || k >= static_cast<int>(params.size())) {
        Refuse({}, "wrt index " + std::to_string(k) + " is not a parameter (the program has " +
                       std::to_string(params.size()) + ")");
      }
      TensorType type = builder_.TypeOf(params[k]);
      if (!IsFloat(type.dtype)) {
        Refuse({}, "wrt parameter " + std::to_string(k) + " (%" + f.params[k]->name + ") is " +
                       type.ToString() + ", not a float tensor");
      }
      MarkActive(params[k], f.params[k]->loc);
    }

    // 1-2. Forward, recording the active applications.
    Val result = Lower(f.body, nullptr);
    if (!result.is_tensor() || builder_.TypeOf(result.tensor) != TensorType{DType::kF32, {}}) {
      Expr tail = f.body;
      while (tail->kind == ExprKind::kLet) tail = static_cast<const LetNode*>(tail.get())->body;
      Refuse(tail->loc, "the result must be a scalar f32 loss (Tensor[(), f32]), got " +
                            TypeToString(TypeOfVal(result)));
    }
    GradValue loss = result.tensor;
    size_t forward_lets = builder_.lets().size();

    // 3. Backward.
    builder_.set_name_hint("g");
    grads_.assign(builder_.size(), kNoGrad);
    if (IsActive(loss)) grads_[loss] = builder_.ScalarConstant(1, DType::kF32);
    for (auto app = tape_.rbegin(); app != tape_.rend(); ++app) Backward(*app);
    builder_.set_lane(-1);

    // 4. The result tuple.
    std::vector<Expr> fields = {builder_.Atom(loss)};
    std::vector<Type> types = {ScalarTy(DType::kF32)};
    for (int k : wrt) {
      TensorType type = builder_.TypeOf(params[k]);
      GradValue g = grads_[params[k]] != kNoGrad ? grads_[params[k]] : builder_.Zeros(type);
      if (builder_.TypeOf(g) != type) {
        throw JitFailure("autodiff: the gradient of parameter %" + f.params[k]->name + " came out " +
                         builder_.TypeOf(g).ToString() + ", not " + type.ToString() +
                         " (a gradient rule's shape bug)");
      }
      fields.push_back(builder_.Atom(g));
      types.push_back(f.params[k]->annotation);
    }
    Expr body = MakeTuple(std::move(fields));

    // 5. Drop the backward lets nothing uses; forward lets are kept as they were.
    const auto& lets = builder_.lets();
    std::unordered_set<const ExprNode*> live;
    auto use = [&](const Expr& e) {
      PostOrderVisit(e, [&](const Expr& x) {
        if (x->kind == ExprKind::kVar) live.insert(x.get());
      });
    };
    use(body);
    std::vector<bool> keep(lets.size(), true);
    for (size_t i = lets.size(); i-- > forward_lets;) {
      keep[i] = live.count(lets[i].first.get()) > 0;
      if (keep[i]) use(lets[i].second);
    }
    for (size_t i = lets.size(); i-- > 0;) {
      if (keep[i]) body = MakeLet(lets[i].first, lets[i].second, std::move(body));
    }
    return MakeFunc(f.params, std::move(body), TupleTy(std::move(types)), f.loc);
  }

 private:
  // Lowers `e` into the builder's let list; a let-bound value keeps the let's
  // variable `as`. Let chains are walked with a loop: residuals are long.
  Val Lower(const Expr& e, const Var& as) {
    switch (e->kind) {
      case ExprKind::kLet: {
        std::string outer = where_;
        Expr cur = e;
        while (cur->kind == ExprKind::kLet) {
          const auto* let = static_cast<const LetNode*>(cur.get());
          where_ = "let #" + std::to_string(++lets_seen_) + " (%" + let->var->name + ")";
          Val v = Lower(let->value, let->var);
          // Keep the residual's projection lets (and their names) where they were.
          if (let->value->kind == ExprKind::kProj && v.is_tensor()) builder_.Atom(v.tensor, let->var);
          env_[let->var.get()] = std::move(v);
          cur = let->body;
        }
        where_ = outer;
        return Lower(cur, as);
      }
      case ExprKind::kVar: {
        auto it = env_.find(e.get());
        if (it == env_.end()) {
          Refuse(e->loc, "%" + static_cast<const VarNode*>(e.get())->name + " is not bound");
        }
        return it->second;
      }
      case ExprKind::kConstant: {
        TensorType type = static_cast<const ConstantNode*>(e.get())->value.type();
        if (!as) return Val{builder_.Bind(e, std::move(type)), {}};
        builder_.Let(as, e);
        return Val{builder_.Bind(as, std::move(type)), {}};
      }
      case ExprKind::kOpCall: return LowerOpCall(*static_cast<const OpCallNode*>(e.get()), as);
      case ExprKind::kTuple: {
        Val tuple;
        for (const Expr& field : static_cast<const TupleNode*>(e.get())->fields) {
          tuple.fields.push_back(Lower(field, nullptr));
        }
        return tuple;
      }
      case ExprKind::kProj: {
        const auto* proj = static_cast<const ProjNode*>(e.get());
        Val tuple = Lower(proj->tuple, nullptr);
        if (tuple.is_tensor() || proj->index < 0 || proj->index >= static_cast<int>(tuple.fields.size())) {
          Refuse(e->loc,
                 "projection ." + std::to_string(proj->index) + " of " + TypeToString(TypeOfVal(tuple)));
        }
        return tuple.fields[proj->index];
      }
      case ExprKind::kCall: {
        const auto* global = As<GlobalNode>(static_cast<const CallNode*>(e.get())->callee);
        NotStraightLine(e, global ? "a call to @" + global->name : "a call of a function value");
      }
      case ExprKind::kIf: NotStraightLine(e, "a dynamic `if`");
      case ExprKind::kMatch: NotStraightLine(e, "a `match`");
      case ExprKind::kFunc: NotStraightLine(e, "a function literal (closure)");
      case ExprKind::kGlobal:
        NotStraightLine(e, "the function value @" + static_cast<const GlobalNode*>(e.get())->name);
      case ExprKind::kCtor:
        NotStraightLine(e, "constructor " + static_cast<const CtorNode*>(e.get())->ctor_name());
    }
    Refuse(e->loc, "unknown expression kind");
  }

  Val LowerOpCall(const OpCallNode& n, const Var& as) {
    std::vector<GradValue> inputs;
    bool any_active = false;
    for (size_t i = 0; i < n.args.size(); ++i) {
      Val arg = Lower(n.args[i], nullptr);
      if (!arg.is_tensor()) {
        Refuse(n.loc, n.op->name + ": input " + std::to_string(i) + " is " + TypeToString(TypeOfVal(arg)) +
                          ", not a tensor");
      }
      inputs.push_back(arg.tensor);
      any_active |= IsActive(arg.tensor);
    }
    std::vector<GradValue> outputs;
    try {
      outputs = builder_.Apply(*n.op, inputs, n.attrs, n.loc, as);
    } catch (const OpError& err) {
      Refuse(n.loc, err.what());
    }
    // A non-differentiable op (comparison, argmax) ends every path through it.
    if (any_active && n.op->differentiable()) {
      for (GradValue out : outputs) MarkActive(out, n.loc);
      tape_.push_back({n.op, n.attrs, inputs, outputs, n.loc});
    }
    if (outputs.size() == 1) return Val{outputs[0], {}};
    Val tuple;
    for (GradValue out : outputs) tuple.fields.push_back(Val{out, {}});
    return tuple;
  }

  void Backward(const Application& app) {
    std::vector<GradValue> out_grads;
    bool any = false;
    for (GradValue out : app.outputs) {
      out_grads.push_back(grads_[out]);
      any |= grads_[out] != kNoGrad;
    }
    if (!any) return;
    builder_.set_lane(app.loc.lane);
    std::vector<GradValue> in_grads;
    try {
      in_grads = app.op->grad(builder_, GradContext{app.inputs, app.outputs, out_grads, app.attrs});
    } catch (const OpError& err) {
      Refuse(app.loc, "the gradient rule of " + app.op->name + " failed: " + err.what());
    }
    if (in_grads.size() != app.inputs.size()) {
      Refuse(app.loc, "the gradient rule of " + app.op->name + " returned " +
                          std::to_string(in_grads.size()) + " gradients for " +
                          std::to_string(app.inputs.size()) + " inputs");
    }
    for (size_t i = 0; i < in_grads.size(); ++i) {
      GradValue input = app.inputs[i];
      if (in_grads[i] == kNoGrad || !IsActive(input)) continue;
      grads_[input] = grads_[input] == kNoGrad ? in_grads[i] : builder_.Add(grads_[input], in_grads[i]);
    }
  }

  bool IsActive(GradValue v) const { return static_cast<size_t>(v) < active_.size() && active_[v]; }

  void MarkActive(GradValue v, const SourceLoc& loc) {
    if (!builder_.TypeOf(v).IsFullyKnown()) {
      Refuse(loc, "a value on the gradient path has unknown dimensions (" + builder_.TypeOf(v).ToString() +
                      "); gradients need static shapes");
    }
    if (active_.size() <= static_cast<size_t>(v)) active_.resize(v + 1, false);
    active_[v] = true;
  }

  Type TypeOfVal(const Val& v) const {
    if (v.is_tensor()) return TensorTy(builder_.TypeOf(v.tensor));
    std::vector<Type> fields;
    for (const Val& f : v.fields) fields.push_back(TypeOfVal(f));
    return TupleTy(std::move(fields));
  }

  // "autodiff: file:3:7: in let #12 (%h): <why>": where, as far as it is known.
  // Lets are numbered in program order because their names are only hints
  // that many share (the printer numbers them apart).
  [[noreturn]] void Refuse(const SourceLoc& loc, const std::string& why) const {
    std::string at;
    if (loc.known()) at += loc.ToString() + ": ";
    if (!where_.empty()) at += "in " + where_ + ": ";
    throw JitFailure("autodiff: " + at + why);
  }


  [[noreturn]] void NotStraightLine(const Expr& e, const std::string& what) const {
    Refuse(e->loc, what + " cannot be differentiated; only straight-line tensor programs can");
  }

  IrGradBuilder builder_;
  std::unordered_map<const ExprNode*, Val> env_;
  std::vector<Application> tape_;
  std::vector<bool> active_;       // by GradValue
  std::vector<GradValue> grads_;   // by forward GradValue; kNoGrad: none yet
  std::string where_;              // the let being lowered, for messages
  int lets_seen_ = 0;
};

}  // namespace

Func Differentiate(const Func& residual, const std::vector<int>& wrt) {
  return Differentiator().Run(*residual, wrt);
}

}  // namespace pejit
