// The evaluation machine (a CEK machine, in the literature's terms):
//
//   1. Control is either an expression to evaluate or a value just computed.
//   2. The environment is the current activation: one flat map from variable
//      nodes to values per function call. Variables are unique nodes, so a
//      flat map per call is exact, and closures copy the values of their free
//      variables when they are made.
//   3. The continuation is an explicit stack of frames, one per expression
//      waiting for a subresult. A call pushes a Return frame that owns the
//      caller's activation; a call in tail position (the top frame already a
//      Return) replaces the activation instead, so loops run in constant space.
//
// Operator applications go through ops/ (RunOp) and, when a tape is active,
// are recorded on it for reverse-mode autodiff.
#include "interp/interpreter.h"

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "interp/tape.h"
#include "ir/visitor.h"
#include "ops/eager.h"
#include "support/interrupt.h"

namespace pejit {
namespace {

using Activation = std::unordered_map<const ExprNode*, Value>;

// Free variables of function literals, computed once per node. Entries are
// keyed by address and checked against a weak pointer: a node freed after a
// module edit may have its address reused by another.
class FreeVarCache {
 public:
  using Vars = std::shared_ptr<const std::vector<const VarNode*>>;

  Vars Get(const Func& f) {
    {
      std::shared_lock lock(mu_);
      auto it = cache_.find(f.get());
      if (it != cache_.end() && it->second.node.lock() == f) return it->second.vars;
    }
    Vars vars = std::make_shared<const std::vector<const VarNode*>>(FreeVars(*f));
    std::unique_lock lock(mu_);
    cache_[f.get()] = Entry{f, vars};
    return vars;
  }

 private:
  struct Entry {
    std::weak_ptr<const FuncNode> node;
    Vars vars;
  };
  std::shared_mutex mu_;
  std::unordered_map<const FuncNode*, Entry> cache_;
};

enum class FrameKind : uint8_t { kOpArgs, kCallee, kCallArgs, kLet, kIf, kTuple, kProj, kCtor, kMatch, kReturn };

struct Frame {
  FrameKind kind;
  const ExprNode* node;
  std::vector<Value> values;            // collected subresults
  Value callee;                         // kCallArgs
  std::unique_ptr<Activation> saved;    // kReturn: the caller's activation
  const FuncNode* func = nullptr;       // kReturn: the function called (the first of a tail-call chain), held by `callee`
};

// Whether `v` has type `t` where static checking cannot tell (a dimension
// `?` in an inferred type, an op whose result shape depends on its input):
// tensors by dtype and known dimensions, tuples field by field, an ADT value
// by its type's name and a function by kind (their fields and bodies are
// checked where they were built). Shallow, so that checking every return,
// `let` and constructor costs a few comparisons whatever a value holds.
bool Fits(const Value& v, const Type& t) {
  switch (t->kind) {
    case TypeKind::kTensor: return v.is_tensor() && TensorTypeFits(AsTensor(t)->type, v.tensor().type());
    case TypeKind::kTuple: {
      const auto& fields = AsTuple(t)->fields;
      if (v.kind() != Value::Kind::kTuple || v.fields().size() != fields.size()) return false;
      for (size_t i = 0; i < fields.size(); ++i) {
        if (!Fits(v.fields()[i], fields[i])) return false;
      }
      return true;
    }
    case TypeKind::kAdt: return v.kind() == Value::Kind::kAdt && v.adt()->name == AsAdt(t)->name;
    case TypeKind::kFunc: return v.kind() == Value::Kind::kClosure;
    case TypeKind::kVar: return true;
  }
  return false;
}

bool Matches(const Pattern& p, const Value& v, Activation& act) {
  switch (p->kind) {
    case PatternKind::kWildcard: return true;
    case PatternKind::kVar: act[p->var.get()] = v; return true;
    case PatternKind::kTuple:
      for (size_t i = 0; i < p->fields.size(); ++i) {
        if (!Matches(p->fields[i], v.fields()[i], act)) return false;
      }
      return true;
    case PatternKind::kCtor:
      if (v.tag() != p->tag || v.adt()->name != p->adt->name) return false;
      for (size_t i = 0; i < p->fields.size(); ++i) {
        if (!Matches(p->fields[i], v.fields()[i], act)) return false;
      }
      return true;
  }
  return false;
}

class Machine {
 public:
  Machine(const ModuleSnapshot& module, FreeVarCache& free_vars, const InterpreterOptions& options, Tape* tape,
          std::string entry)
      : module_(module), free_vars_(free_vars), options_(options), tape_(tape), entry_(std::move(entry)) {}

  Value Run(const Func& f, const std::vector<Value>& args) {
    act_ = std::make_unique<Activation>();
    for (size_t i = 0; i < f->params.size(); ++i) (*act_)[f->params[i].get()] = args[i];
    Value result = Eval(f->body);
    CheckResult(result, *f, &entry_);
    return result;
  }

 private:
  const ModuleSnapshot& module_;
  FreeVarCache& free_vars_;
  const InterpreterOptions& options_;
  Tape* tape_;
  std::string entry_;
  std::unique_ptr<Activation> act_;
  std::vector<Frame> stack_;

  [[noreturn]] void Fail(const ExprNode* at, const std::string& message) {
    throw EvalError("@" + entry_ + ": " + (at && at->loc.known() ? at->loc.ToString() + ": " : "") + message);
  }

  // A function's result against its declared type.
  void CheckResult(const Value& v, const FuncNode& f, const std::string* name) {
    if (!f.ret_type || Fits(v, f.ret_type)) return;
    Fail(&f, "the result of " + (name ? "@" + *name : std::string("the function")) + " is " + v.Describe() +
                 ", not its declared " + TypeToString(f.ret_type));
  }

  void Push(FrameKind kind, const ExprNode* node) {
    if (static_cast<int64_t>(stack_.size()) >= options_.max_frames) {
      Fail(node, "recursion too deep: more than " + std::to_string(options_.max_frames) +
                     " interpreter frames (InterpreterOptions::max_frames)");
    }
    stack_.push_back(Frame{kind, node, {}, {}, nullptr, nullptr});
  }

  Value ApplyOp(const OpCallNode* n, std::vector<Value> args) {
    std::vector<Tensor> inputs;
    inputs.reserve(args.size());
    for (const Value& a : args) inputs.push_back(a.tensor());
    std::vector<Tensor> outputs;
    try {
      outputs = RunOp(*n->op, inputs, n->attrs);
    } catch (const OpError& e) {
      Fail(n, e.what());
    } catch (const TensorAllocError& e) {  // says where, as an op's own error does
      Fail(n, e.what());
    }
    std::vector<Value> results;
    if (tape_) {
      results = tape_->Record(*n->op, n->attrs, args, std::move(outputs));
    } else {
      for (Tensor& t : outputs) results.emplace_back(std::move(t));
    }
    return results.size() == 1 ? results[0] : Value::Tuple(std::move(results));
  }

  Value MakeClosure(const Expr& self) {
    auto closure = std::make_shared<Closure>();
    closure->func = std::static_pointer_cast<const FuncNode>(self);
    for (const VarNode* v : *free_vars_.Get(closure->func)) closure->captured.emplace_back(v, Lookup(v));
    return Value::Function(std::move(closure));
  }

  const Value& Lookup(const ExprNode* var) {
    auto it = act_->find(var);
    if (it == act_->end()) Fail(var, "variable %" + static_cast<const VarNode*>(var)->name + " has no value");
    return it->second;
  }

  // Starts the call of `fn`; returns the body to evaluate.
  Expr Enter(const ExprNode* call, const Value& fn, std::vector<Value> args) {
    if (fn.kind() != Value::Kind::kClosure) Fail(call, "cannot call " + fn.Describe());
    const Closure& c = fn.closure();
    Func f = c.func;
    if (!f) f = module_.Get(c.global).func;  // resolved on this call's snapshot
    if (f->params.size() != args.size()) {
      Fail(call, "function takes " + std::to_string(f->params.size()) + " arguments, got " + std::to_string(args.size()));
    }
    auto callee = std::make_unique<Activation>();
    for (const auto& [var, value] : c.captured) (*callee)[var] = value;
    for (size_t i = 0; i < args.size(); ++i) (*callee)[f->params[i].get()] = std::move(args[i]);
    if (stack_.empty() || stack_.back().kind != FrameKind::kReturn) {
      Push(FrameKind::kReturn, call);
      stack_.back().saved = std::move(act_);
      stack_.back().func = f.get();
      stack_.back().callee = fn;  // keeps `f` and the name for CheckResult alive
    }  // else a tail call: the frame returns for the first function of the chain, whose type the caller relies on
    act_ = std::move(callee);
    return f->body;
  }

  Value Eval(const Expr& root) {
    Expr expr = root;
    Value value;
    bool have_value = false;
    for (;;) {
      PollInterrupt();  // a program may loop forever: its caller may stop it (Ctrl-C)
      if (!have_value) {
        const ExprNode* n = expr.get();
        switch (n->kind) {
          case ExprKind::kVar: value = Lookup(n); have_value = true; break;
          case ExprKind::kConstant: value = Value(As<ConstantNode>(expr)->value); have_value = true; break;
          case ExprKind::kOpCall: {
            const OpCallNode* op = As<OpCallNode>(expr);
            if (op->args.empty()) {
              value = ApplyOp(op, {});
              have_value = true;
            } else {
              Push(FrameKind::kOpArgs, n);
              expr = op->args[0];
            }
            break;
          }
          case ExprKind::kCall: Push(FrameKind::kCallee, n); expr = As<CallNode>(expr)->callee; break;
          case ExprKind::kLet: Push(FrameKind::kLet, n); expr = As<LetNode>(expr)->value; break;
          case ExprKind::kIf: Push(FrameKind::kIf, n); expr = As<IfNode>(expr)->cond; break;
          case ExprKind::kTuple: {
            const TupleNode* t = As<TupleNode>(expr);
            if (t->fields.empty()) {
              value = Value::Tuple({});
              have_value = true;
            } else {
              Push(FrameKind::kTuple, n);
              expr = t->fields[0];
            }
            break;
          }
          case ExprKind::kProj: Push(FrameKind::kProj, n); expr = As<ProjNode>(expr)->tuple; break;
          case ExprKind::kFunc: value = MakeClosure(expr); have_value = true; break;
          case ExprKind::kGlobal: {
            auto closure = std::make_shared<Closure>();
            closure->global = As<GlobalNode>(expr)->name;
            value = Value::Function(std::move(closure));
            have_value = true;
            break;
          }
          case ExprKind::kCtor: {
            const CtorNode* c = As<CtorNode>(expr);
            if (c->args.empty()) {
              value = Value::Adt(c->adt, c->tag, {});
              have_value = true;
            } else {
              Push(FrameKind::kCtor, n);
              expr = c->args[0];
            }
            break;
          }
          case ExprKind::kMatch: Push(FrameKind::kMatch, n); expr = As<MatchNode>(expr)->scrutinee; break;
        }
        continue;
      }

      // A value is ready: hand it to the innermost waiting frame.
      if (stack_.empty()) return value;
      Frame& top = stack_.back();
      const ExprNode* n = top.node;
      switch (top.kind) {
        case FrameKind::kOpArgs: {
          auto* op = static_cast<const OpCallNode*>(n);
          top.values.push_back(std::move(value));
          if (top.values.size() < op->args.size()) {
            expr = op->args[top.values.size()];
            have_value = false;
          } else {
            std::vector<Value> args = std::move(top.values);
            stack_.pop_back();
            value = ApplyOp(op, std::move(args));
          }
          break;
        }
        case FrameKind::kCallee: {
          auto* call = static_cast<const CallNode*>(n);
          if (call->args.empty()) {
            stack_.pop_back();
            expr = Enter(n, value, {});
            have_value = false;
          } else {
            top.kind = FrameKind::kCallArgs;
            top.callee = std::move(value);
            expr = call->args[0];
            have_value = false;
          }
          break;
        }
        case FrameKind::kCallArgs: {
          auto* call = static_cast<const CallNode*>(n);
          top.values.push_back(std::move(value));
          if (top.values.size() < call->args.size()) {
            expr = call->args[top.values.size()];
          } else {
            Value fn = std::move(top.callee);
            std::vector<Value> args = std::move(top.values);
            stack_.pop_back();
            expr = Enter(n, fn, std::move(args));
          }
          have_value = false;
          break;
        }
        case FrameKind::kLet: {
          auto* let = static_cast<const LetNode*>(n);
          if (let->var->annotation && !Fits(value, let->var->annotation)) {
            Fail(n, "%" + let->var->name + " is " + value.Describe() + ", not its annotated " +
                        TypeToString(let->var->annotation));
          }
          (*act_)[let->var.get()] = std::move(value);
          stack_.pop_back();
          expr = let->body;
          have_value = false;
          break;
        }
        case FrameKind::kIf: {
          auto* i = static_cast<const IfNode*>(n);
          stack_.pop_back();
          bool cond = value.tensor().data<bool>()[0];
          expr = cond ? i->then_branch : i->else_branch;
          have_value = false;
          break;
        }
        case FrameKind::kTuple: {
          auto* t = static_cast<const TupleNode*>(n);
          top.values.push_back(std::move(value));
          if (top.values.size() < t->fields.size()) {
            expr = t->fields[top.values.size()];
            have_value = false;
          } else {
            value = Value::Tuple(std::move(top.values));
            stack_.pop_back();
          }
          break;
        }
        case FrameKind::kProj: {
          auto* p = static_cast<const ProjNode*>(n);
          stack_.pop_back();
          Value field = value.fields()[p->index];
          value = std::move(field);
          break;
        }
        case FrameKind::kCtor: {
          auto* c = static_cast<const CtorNode*>(n);
          top.values.push_back(std::move(value));
          if (top.values.size() < c->args.size()) {
            expr = c->args[top.values.size()];
            have_value = false;
          } else {
            const auto& fields = c->adt->ctors[c->tag].fields;
            for (size_t i = 0; i < fields.size() && i < top.values.size(); ++i) {
              if (!Fits(top.values[i], fields[i])) {
                Fail(n, "field " + std::to_string(i) + " of " + c->adt->ctors[c->tag].name + " is " +
                            top.values[i].Describe() + ", not its declared " + TypeToString(fields[i]));
              }
            }
            value = Value::Adt(c->adt, c->tag, std::move(top.values));
            stack_.pop_back();
          }
          break;
        }
        case FrameKind::kMatch: {
          auto* m = static_cast<const MatchNode*>(n);
          stack_.pop_back();
          const Clause* chosen = nullptr;
          for (const Clause& c : m->clauses) {
            if (Matches(c.pattern, value, *act_)) {
              chosen = &c;
              break;
            }
          }
          if (!chosen) Fail(n, "no clause of match fits " + value.Describe());
          expr = chosen->body;
          have_value = false;
          break;
        }
        case FrameKind::kReturn: {
          const Closure& called = top.callee.closure();  // every return frame is a call's (Enter)
          CheckResult(value, *top.func, called.func ? nullptr : &called.global);
          act_ = std::move(top.saved);
          stack_.pop_back();
          break;
        }
      }
    }
  }
};

}  // namespace

struct Interpreter::Impl {
  InterpreterOptions options;
  mutable FreeVarCache free_vars;
};

Interpreter::Interpreter(InterpreterOptions options) : impl_(std::make_unique<Impl>()) { impl_->options = options; }
Interpreter::~Interpreter() = default;

namespace {

const Definition& EntryOf(const ModuleSnapshot& module, const std::string& entry) {
  const Definition* d = module.Find(entry);
  if (!d) {
    try {
      module.Get(entry);  // for the "did you mean" message
    } catch (const IrError& e) {
      throw EvalError(e.what());
    }
  }
  return *d;
}

}  // namespace

void CheckArguments(const ModuleSnapshot& module, const std::string& entry, const FuncNode& f,
                    const std::vector<Value>& args) {
  const FindTypeFn find_type = [&](const std::string& name) { return module.FindType(name); };
  if (f.params.size() != args.size()) {
    throw EvalError("@" + entry + " takes " + std::to_string(f.params.size()) + " argument" +
                    (f.params.size() == 1 ? "" : "s") + ", got " + std::to_string(args.size()));
  }
  for (size_t i = 0; i < args.size(); ++i) {
    try {
      CheckValueType(args[i], f.params[i]->annotation, "argument " + std::to_string(i) + " (%" + f.params[i]->name + ")",
                     &find_type);
    } catch (const std::invalid_argument& e) {
      throw EvalError("@" + entry + ": " + e.what());
    }
  }
}

std::string WhyNoGradient(const ModuleSnapshot& module, const FuncNode& f, std::span<const int> wrt) {
  for (int i : wrt) {
    if (i < 0 || static_cast<size_t>(i) >= f.params.size()) {
      return "wrt index " + std::to_string(i) + " is not an argument (it takes " + std::to_string(f.params.size()) + ")";
    }
    const Var& param = f.params[i];
    if (!module.CanHoldFloat(param->annotation)) {
      return "wrt argument " + std::to_string(i) + " (%" + param->name + ": " + TypeToString(param->annotation) +
             ") cannot hold a float tensor, so it has no gradient";
    }
  }
  return "";
}

Value Interpreter::Call(const ModuleSnapshot& module, const std::string& entry, const std::vector<Value>& args) const {
  const Definition& d = EntryOf(module, entry);
  CheckArguments(module, entry, *d.func, args);
  Machine m(module, impl_->free_vars, impl_->options, nullptr, entry);
  return m.Run(d.func, args);
}

Value Interpreter::Apply(const ModuleSnapshot& module, const Func& f, const std::vector<Value>& args,
                         const std::string& what) const {
  CheckArguments(module, what, *f, args);
  Machine m(module, impl_->free_vars, impl_->options, nullptr, what);
  return m.Run(f, args);
}

namespace {

// A call recorded on a tape: the tensors of its `wrt` arguments watched.
struct Recorded {
  std::shared_ptr<Tape> tape = std::make_shared<Tape>();
  std::vector<Value> traced;                // the arguments, watched leaves in place
  std::vector<std::vector<Value>> leaves;   // per wrt position: its argument's leaves
  std::vector<int> first;                   // per wrt position: an earlier one naming the same argument, or -1
  std::vector<Value> float_leaves;          // the watched leaves, in order
  bool replayed = false;                    // a pullback's: the tape replays once

  Recorded(const std::vector<Value>& args, const std::vector<int>& wrt)
      : traced(args), leaves(wrt.size()), first(wrt.size(), -1) {
    // Each argument's float tensors put on the tape once: an index named
    // twice gets the same gradient twice.
    for (size_t k = 0; k < wrt.size(); ++k) {
      int i = wrt[k];
      for (size_t e = 0; e < k && first[k] < 0; ++e) {
        if (wrt[e] == i) first[k] = static_cast<int>(e);
      }
      if (first[k] >= 0) continue;
      std::vector<Value> watched;
      for (Tensor& t : TensorLeaves(args[i])) watched.push_back(IsFloat(t.dtype()) ? tape->Watch(t) : Value(t));
      traced[i] = ReplaceTensorLeaves(args[i], watched);
      for (const Value& leaf : watched) {
        if (leaf.tape_id() >= 0) float_leaves.push_back(leaf);
      }
      leaves[k] = std::move(watched);
    }
  }

  // The gradients (one per float leaf, in order) shaped like each wrt argument.
  std::vector<Value> GradsOf(const std::vector<Value>& args, const std::vector<int>& wrt,
                           const std::vector<Tensor>& grads) const {
    std::vector<Value> out;
    size_t g = 0;
    for (size_t k = 0; k < wrt.size(); ++k) {
      if (first[k] >= 0) {
        out.push_back(out[first[k]]);
        continue;
      }
      std::vector<Value> replaced;
      for (const Value& leaf : leaves[k]) {
        replaced.push_back(leaf.tape_id() >= 0 ? Value(grads[g++]) : Value(leaf.tensor()));
      }
      out.push_back(ReplaceTensorLeaves(args[wrt[k]], replaced));
    }
    return out;
  }
};

}  // namespace

Interpreter::ValueAndGrad Interpreter::CallWithGrad(const ModuleSnapshot& module, const std::string& entry,
                                                    const std::vector<Value>& args, const std::vector<int>& wrt) const {
  const Definition& d = EntryOf(module, entry);
  CheckArguments(module, entry, *d.func, args);
  if (std::string why = WhyNoGradient(module, *d.func, wrt); !why.empty()) throw EvalError("@" + entry + ": " + why);
  Recorded rec(args, wrt);
  Machine m(module, impl_->free_vars, impl_->options, rec.tape.get(), entry);
  Value loss = m.Run(d.func, rec.traced);
  if (!loss.is_tensor() || loss.tensor().rank() != 0 || loss.tensor().dtype() != DType::kF32) {
    throw EvalError("@" + entry + ": value_and_grad needs a scalar f32 loss (Tensor[(), f32]), got " + loss.Describe());
  }
  // One backward pass for all leaves.
  ValueAndGrad out;
  out.grads = rec.GradsOf(args, wrt, rec.tape->Backward(loss, rec.float_leaves));
  out.value = Value(loss.tensor());
  return out;
}

ValueAndPullback Interpreter::CallWithPullback(const ModuleSnapshot& module, const std::string& entry,
                                               const std::vector<Value>& args, const std::vector<int>& wrt) const {
  const Definition& d = EntryOf(module, entry);
  CheckArguments(module, entry, *d.func, args);
  if (std::string why = WhyNoGradient(module, *d.func, wrt); !why.empty()) throw EvalError("@" + entry + ": " + why);
  auto rec = std::make_shared<Recorded>(args, wrt);
  Machine m(module, impl_->free_vars, impl_->options, rec->tape.get(), entry);
  Value traced_result = m.Run(d.func, rec->traced);
  ValueAndPullback out;
  // The value without tape ids (they mean nothing off the tape).
  std::vector<Value> plain;
  for (const Tensor& t : TensorLeaves(traced_result)) plain.push_back(Value(t));
  out.value = ReplaceTensorLeaves(traced_result, plain);
  out.pullback = [rec, traced_result, args, wrt, entry](const Value& cotangent) {
    if (rec->replayed) throw std::logic_error("@" + entry + ": a pullback runs once");
    std::vector<Tensor> cts = CotangentLeaves(traced_result, cotangent, "@" + entry);
    rec->replayed = true;
    std::vector<std::pair<Value, Tensor>> seeds;
    std::vector<Value> outputs;
    ForEachNode(traced_result, [&](const Value& v) {
      if (v.is_tensor()) outputs.push_back(v);
    });
    for (size_t i = 0; i < outputs.size(); ++i) seeds.emplace_back(outputs[i], cts[i]);
    std::vector<Value> grads = rec->GradsOf(args, wrt, rec->tape->Backward(seeds, rec->float_leaves));
    rec->tape.reset();  // the tape's tensors go now, not with the last copy of this function
    return grads;
  };
  return out;
}

}  // namespace pejit
