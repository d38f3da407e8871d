#include "jit/control_flow.h"

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "ir/value.h"
#include "ir/visitor.h"
#include "jit/pipeline.h"

namespace pejit {
namespace {

using Env = std::unordered_map<const VarNode*, Value>;

struct Block;

// One step of a block, in evaluation order.
struct Step {
  enum class Kind : uint8_t { kRegion, kIf, kCall, kBind, kBlock };
  Kind kind = Kind::kRegion;
  const VarNode* var = nullptr;  // kIf, kCall, kBind, kBlock: what it binds
  // kRegion: native code from `inputs` (tensors) to `outputs` (tensor trees).
  ExecutablePtr exe;
  std::vector<const VarNode*> inputs;
  std::vector<std::pair<const VarNode*, Type>> outputs;
  // kIf (kBlock: a nested let chain, `then_block`)
  Expr cond;
  std::unique_ptr<Block> then_block, else_block;
  // kCall
  int function = -1;
  std::vector<Expr> args;
  // kBind: a variable, projection or tuple of atoms
  Expr value;
};

struct Block {
  std::vector<Step> steps;
  Expr tail;
};

struct Function {
  std::vector<const VarNode*> params;
  Block body;
};

Value Rebuild(const Type& t, const std::vector<Tensor>& flat, size_t& at) {
  if (AsTensor(t)) return Value(flat.at(at++));
  std::vector<Value> fields;
  for (const Type& f : AsTuple(t)->fields) fields.push_back(Rebuild(f, flat, at));
  return Value::Tuple(std::move(fields));
}

void FlattenInto(const Value& v, std::vector<Tensor>& out) {
  if (v.is_tensor()) {
    out.push_back(v.tensor());
    return;
  }
  for (const Value& f : v.fields()) FlattenInto(f, out);
}

const char* KindName(ExprKind k) {
  switch (k) {
    case ExprKind::kCall: return "a call of a function value";
    case ExprKind::kFunc: return "a function";
    case ExprKind::kCtor: return "a constructor";
    case ExprKind::kMatch: return "a match";
    case ExprKind::kLet: return "a let";
    case ExprKind::kIf: return "an `if`";
    case ExprKind::kOpCall: return "an operator";
    default: return "an expression";
  }
}

// An expression the driver evaluates itself: no operator.
bool IsAtom(const Expr& e) {
  switch (e->kind) {
    case ExprKind::kVar:
    case ExprKind::kConstant: return true;
    case ExprKind::kProj: return IsAtom(static_cast<const ProjNode&>(*e).tuple);
    case ExprKind::kTuple:
      for (const Expr& f : static_cast<const TupleNode&>(*e).fields) {
        if (!IsAtom(f)) return false;
      }
      return true;
    default: return false;
  }
}

void VarsOf(const Expr& e, std::vector<const VarNode*>& out) {
  PostOrderVisit(e, [&](const Expr& x) {
    if (x->kind == ExprKind::kVar) out.push_back(static_cast<const VarNode*>(x.get()));
  });
}

class ControlFlowProgram final : public Executable {
 public:
  // Compiles every region in `session`, which must outlive the program (it
  // holds their code).
  ControlFlowProgram(JitSession& session, const CompileOptions& options) : session_(session), options_(options) {}

  const ControlFlowStats& stats() const { return stats_; }

  void Build(const Func& main, const std::vector<std::pair<std::string, Func>>& functions) {
    for (size_t i = 0; i < functions.size(); ++i) function_index_[functions[i].first] = static_cast<int>(i);
    functions_.resize(functions.size());
    for (size_t i = 0; i < functions.size(); ++i) functions_[i] = BuildFunction(*functions[i].second);
    main_ = BuildFunction(*main);
    result_type_ = main->ret_type ? main->ret_type : AtomType(main_.body.tail);
    if (!result_type_ || !IsTensorTree(result_type_)) {
      throw JitFailure("control flow: the program returns " + (result_type_ ? TypeToString(result_type_) : "a value of unknown type") +
                       ", not tensors nested in tuples");
    }
  }

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override {
    if (inputs.size() != main_.params.size()) {
      throw std::invalid_argument("the program takes " + std::to_string(main_.params.size()) + " tensors, not " +
                                  std::to_string(inputs.size()));
    }
    Env env;
    for (size_t i = 0; i < inputs.size(); ++i) env.emplace(main_.params[i], Value(inputs[i]));
    Value result = Exec(main_.body, env, 0);
    std::vector<Tensor> out;
    FlattenInto(result, out);
    return out;
  }
  const Type& result_type() const override { return result_type_; }
  size_t code_bytes() const override { return code_bytes_; }
  const char* tier() const override { return "native"; }

 private:
  // Nested (non-tail) residual calls: each is a few hundred bytes of native
  // stack, on whatever thread calls.
  static constexpr int kMaxCallDepth = 2000;

  Function BuildFunction(const FuncNode& f) {
    Function out;
    for (const Var& p : f.params) {
      if (!AsTensor(p->annotation)) {
        throw JitFailure("control flow: parameter %" + p->name + " is " + TypeToString(p->annotation) + ", not a tensor");
      }
      out.params.push_back(p.get());
      vars_[p.get()] = p;
    }
    out.body = BuildBlock(f.body);
    return out;
  }

  // The steps of a let chain: runs of lets with operators become regions,
  // the rest control steps.
  Block BuildBlock(const Expr& body) {
    std::vector<const LetNode*> lets;
    const Expr* e = &body;
    while ((*e)->kind == ExprKind::kLet) {
      lets.push_back(static_cast<const LetNode*>(e->get()));
      e = &lets.back()->body;
    }
    Block block;
    block.tail = *e;
    if (!IsAtom(block.tail)) {
      throw JitFailure("control flow: a block ends in " + std::string(KindName(block.tail->kind)) + ", not a variable");
    }
    // The last step that reads each variable (lets.size(): the tail).
    std::unordered_map<const VarNode*, size_t> last_use;
    std::vector<const VarNode*> used;
    for (size_t i = 0; i < lets.size(); ++i) {
      used.clear();
      VarsOf(lets[i]->value, used);
      for (const VarNode* v : used) last_use[v] = i;
    }
    used.clear();
    VarsOf(block.tail, used);
    for (const VarNode* v : used) last_use[v] = lets.size();

    std::vector<const LetNode*> region;
    std::unordered_set<const VarNode*> in_region;
    auto flush = [&](size_t next) {
      if (!region.empty()) AddRegion(block, region, next, last_use);
      region.clear();
      in_region.clear();
    };
    for (size_t i = 0; i < lets.size(); ++i) {
      const LetNode& let = *lets[i];
      vars_[let.var.get()] = let.var;
      const Expr& value = let.value;
      const bool local = [&] {  // an atom of values this region computes
        if (!IsAtom(value)) return false;
        used.clear();
        VarsOf(value, used);
        for (const VarNode* v : used) {
          if (!in_region.count(v)) return false;
        }
        return true;
      }();
      if (value->kind == ExprKind::kOpCall || value->kind == ExprKind::kConstant || local) {
        region.push_back(&let);
        in_region.insert(let.var.get());
        continue;
      }
      flush(i);
      Step step;
      step.var = let.var.get();
      if (IsAtom(value)) {
        step.kind = Step::Kind::kBind;
        step.value = value;
      } else if (value->kind == ExprKind::kIf) {
        const IfNode& n = static_cast<const IfNode&>(*value);
        if (!IsAtom(n.cond)) throw JitFailure("control flow: an `if` whose condition is not a variable");
        step.kind = Step::Kind::kIf;
        step.cond = n.cond;
        step.then_block = std::make_unique<Block>(BuildBlock(n.then_branch));
        step.else_block = std::make_unique<Block>(BuildBlock(n.else_branch));
        ++stats_.branches;
      } else if (value->kind == ExprKind::kLet) {
        step.kind = Step::Kind::kBlock;
        step.then_block = std::make_unique<Block>(BuildBlock(value));
      } else if (value->kind == ExprKind::kCall && static_cast<const CallNode&>(*value).callee->kind == ExprKind::kGlobal) {
        const CallNode& call = static_cast<const CallNode&>(*value);
        const std::string& name = static_cast<const GlobalNode&>(*call.callee).name;
        auto it = function_index_.find(name);
        if (it == function_index_.end()) throw JitFailure("control flow: a call of @" + name + ", which is not a residual function");
        step.kind = Step::Kind::kCall;
        step.function = it->second;
        for (const Expr& a : call.args) {
          if (!IsAtom(a)) throw JitFailure("control flow: a call of @" + name + " with an argument that is not a variable");
          step.args.push_back(a);
        }
        ++stats_.calls;
      } else {
        throw JitFailure("control flow: " + std::string(KindName(value->kind)) + " at " + value->loc.ToString() +
                         " is not compiled");
      }
      block.steps.push_back(std::move(step));
    }
    flush(lets.size());
    return block;
  }

  // Region `lets` (ending before step `next`) compiled: its inputs are the
  // variables it reads from before it, its outputs those read after it.
  void AddRegion(Block& block, const std::vector<const LetNode*>& lets, size_t next,
                 const std::unordered_map<const VarNode*, size_t>& last_use) {
    std::unordered_set<const VarNode*> defined;
    std::vector<const VarNode*> used;
    Step step;
    step.kind = Step::Kind::kRegion;
    std::unordered_set<const VarNode*> inputs;
    for (const LetNode* let : lets) {
      used.clear();
      VarsOf(let->value, used);
      for (const VarNode* v : used) {
        if (!defined.count(v) && inputs.insert(v).second) step.inputs.push_back(v);
      }
      defined.insert(let->var.get());
      auto it = last_use.find(let->var.get());
      if (it != last_use.end() && it->second >= next) step.outputs.emplace_back(let->var.get(), let->var->annotation);
    }
    if (step.outputs.empty()) return;  // nothing after it reads what it computes
    std::vector<Var> params;
    for (const VarNode* v : step.inputs) {
      if (!AsTensor(v->annotation)) {
        throw JitFailure("control flow: %" + v->name + " of type " + TypeToString(v->annotation) +
                         " crosses into a region; only tensors do");
      }
      params.push_back(vars_.at(v));
    }
    std::vector<Expr> results;
    std::vector<Type> types;
    for (const auto& [v, type] : step.outputs) {
      if (!type || !IsTensorTree(type)) {
        throw JitFailure("control flow: %" + v->name + " leaves a region as " + (type ? TypeToString(type) : "an untyped value"));
      }
      results.push_back(vars_.at(v));
      types.push_back(type);
    }
    Expr body = MakeTuple(std::move(results));
    for (auto it = lets.rbegin(); it != lets.rend(); ++it) body = MakeLet((*it)->var, (*it)->value, body, (*it)->loc);
    PipelineOptions pipeline;
    pipeline.compile = options_;
    step.exe = CompileResidual(session_, MakeFunc(std::move(params), std::move(body), TupleTy(std::move(types))), pipeline);
    code_bytes_ += step.exe->code_bytes();
    ++stats_.regions;
    block.steps.push_back(std::move(step));
  }

  static Value Eval(const Expr& e, const Env& env) {
    switch (e->kind) {
      case ExprKind::kVar: return env.at(static_cast<const VarNode*>(e.get()));
      case ExprKind::kConstant: return Value(static_cast<const ConstantNode&>(*e).value);
      case ExprKind::kProj: {
        const ProjNode& p = static_cast<const ProjNode&>(*e);
        return Eval(p.tuple, env).fields().at(p.index);
      }
      case ExprKind::kTuple: {
        std::vector<Value> fields;
        for (const Expr& f : static_cast<const TupleNode&>(*e).fields) fields.push_back(Eval(f, env));
        return Value::Tuple(std::move(fields));
      }
      default: throw std::logic_error("control flow: not an atom");
    }
  }

  // Runs `block` in `env`. A call, branch or nested block in tail position
  // (its value is the block's) continues in this frame: a loop the data
  // ends runs as many iterations as it takes in constant native stack. A
  // call elsewhere nests, at most kMaxCallDepth deep.
  Value Exec(const Block& first, Env& outer, int depth) const {
    const Block* block = &first;
    Env* env = &outer;
    Env owned;  // a tail call's frame
    for (;;) {
      const size_t n = block->steps.size();
      const bool tail = n > 0 && block->tail->kind == ExprKind::kVar &&
                        block->steps.back().var == static_cast<const VarNode*>(block->tail.get());
      for (size_t i = 0; i + (tail ? 1 : 0) < n; ++i) Run(block->steps[i], *env, depth);
      if (!tail) return Eval(block->tail, *env);
      const Step& last = block->steps.back();
      switch (last.kind) {
        case Step::Kind::kIf:
          block = Eval(last.cond, *env).tensor().data<bool>()[0] ? last.then_block.get() : last.else_block.get();
          continue;
        case Step::Kind::kBlock: block = last.then_block.get(); continue;
        case Step::Kind::kCall: {
          const Function& f = functions_[last.function];
          Env next;
          for (size_t i = 0; i < f.params.size(); ++i) next.emplace(f.params[i], Eval(last.args.at(i), *env));
          owned = std::move(next);
          env = &owned;
          block = &f.body;
          continue;
        }
        default: Run(last, *env, depth); return Eval(block->tail, *env);
      }
    }
  }

  void Run(const Step& step, Env& env, int depth) const {
    switch (step.kind) {
      case Step::Kind::kRegion: {
        std::vector<Tensor> in;
        in.reserve(step.inputs.size());
        for (const VarNode* v : step.inputs) in.push_back(env.at(v).tensor());
        std::vector<Tensor> out = step.exe->Run(in);
        size_t at = 0;
        for (const auto& [v, type] : step.outputs) env[v] = Rebuild(type, out, at);
        return;
      }
      case Step::Kind::kBind: env[step.var] = Eval(step.value, env); return;
      case Step::Kind::kBlock: env[step.var] = Exec(*step.then_block, env, depth); return;
      case Step::Kind::kIf: {
        const bool taken = Eval(step.cond, env).tensor().data<bool>()[0];
        env[step.var] = Exec(taken ? *step.then_block : *step.else_block, env, depth);
        return;
      }
      case Step::Kind::kCall: {
        if (depth >= kMaxCallDepth) {
          throw std::runtime_error("control flow: residual calls nest deeper than " + std::to_string(kMaxCallDepth) +
                                   " (not in tail position)");
        }
        const Function& f = functions_[step.function];
        Env callee;
        for (size_t i = 0; i < f.params.size(); ++i) callee.emplace(f.params[i], Eval(step.args.at(i), env));
        env[step.var] = Exec(f.body, callee, depth + 1);
        return;
      }
    }
  }

  JitSession& session_;
  CompileOptions options_;
  ControlFlowStats stats_;
  std::map<std::string, int> function_index_;
  std::unordered_map<const VarNode*, Var> vars_;  // the owners of the variables regions use
  std::vector<Function> functions_;
  Function main_;
  Type result_type_;
  size_t code_bytes_ = 0;
};

}  // namespace

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

bool HasControlFlow(const Func& program) {
  bool found = false;
  PostOrderVisit(program->body, [&](const Expr& e) {
    found |= e->kind == ExprKind::kIf ||
             (e->kind == ExprKind::kCall && static_cast<const CallNode&>(*e).callee->kind == ExprKind::kGlobal);
  });
  return found;
}

ExecutablePtr CompileControlFlow(JitSession& session, const Func& main,
                                 const std::vector<std::pair<std::string, Func>>& functions,
                                 const CompileOptions& options, ControlFlowStats* stats) {
  if (!HasControlFlow(main)) throw JitFailure("control flow: the program is straight-line code");
  auto program = std::make_shared<ControlFlowProgram>(session, options);
  program->Build(main, functions);
  if (stats) *stats = program->stats();
  return program;
}

}  // namespace pejit
