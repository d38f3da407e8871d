#include "jit/control_flow.h"

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "ir/printer.h"
#include "ir/value.h"
#include "ir/visitor.h"
#include "jit/batch_branches.h"
#include "jit/native_executable.h"
#include "jit/pipeline.h"
#include "jit/refine_shapes.h"
#include "jit/straight.h"
#include "jit/vjp.h"
#include "ops/eager.h"
#include "support/interrupt.h"

namespace pejit {
namespace {

// A program with control flow as text: its residual functions, then main.
std::string ProgramWithFunctions(const Func& main, const std::vector<std::pair<std::string, Func>>& functions) {
  std::string out;
  for (const auto& [name, f] : functions) out += PrintFunction(name, f) + "\n";
  return out + PrintFunction("main", main);
}

// A variable's value in the driver and, in grad mode, the tape ids of its
// tensors depth first (-1: no gradient reaches it, a constant's).
struct Slot {
  Value value;
  std::vector<int> ids;
};
using Env = std::unordered_map<const VarNode*, Slot>;

struct Block;
struct Step;

// Grad mode: the path one run took, as the regions it ran in order, each
// with what its vector-Jacobian product reads: the region's inputs and the
// intermediates its forward kept (vjp.h's residuals).
struct Tape {
  struct Entry {
    const Step* step;
    std::vector<Tensor> inputs;  // then the residuals
    std::vector<int> input_ids;
    int first_output;  // its output leaves' ids: first_output, first_output + 1, ...
  };
  std::vector<Entry> entries;
  int next_id = 0;
};

// One step of a block, in evaluation order.
struct Step {
  enum class Kind : uint8_t { kRegion, kIf, kCall, kBind, kBlock };
  Kind kind = Kind::kRegion;
  const VarNode* var = nullptr;  // kIf, kCall, kBind, kBlock: what it binds
  // kRegion: native code from `inputs` (tensors) to `outputs` (tensor trees).
  ExecutablePtr exe;
  std::vector<const VarNode*> inputs;
  std::vector<std::pair<const VarNode*, Type>> outputs;
  int output_leaves = 0;
  // kRegion in grad mode, when gradients can pass through it (a float
  // input and a float output): `exe` also returns the residuals after the
  // output leaves, and `vjp` is the backward half (jit/vjp.h): (inputs, a
  // cotangent per float output leaf, residuals) -> (the VJP's value, a
  // gradient per float input).
  ExecutablePtr vjp;
  std::vector<int> float_inputs;        // indices into `inputs`
  std::vector<int> float_leaves;        // indices into the flattened outputs
  std::vector<Tensor> zero_cotangents;  // one per float leaf: where no gradient came
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

int LeafCount(const Value& v) {
  if (v.is_tensor()) return 1;
  int n = 0;
  for (const Value& f : v.fields()) n += LeafCount(f);
  return n;
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
bool IsDriverAtom(const Expr& e) {
  switch (e->kind) {
    case ExprKind::kVar:
    case ExprKind::kConstant: return true;
    case ExprKind::kProj: return IsDriverAtom(static_cast<const ProjNode&>(*e).tuple);
    case ExprKind::kTuple:
      for (const Expr& f : static_cast<const TupleNode&>(*e).fields) {
        if (!IsDriverAtom(f)) return false;
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
  // holds their code). With `wrt`, grad mode: the program's result is a
  // scalar f32 loss, and it computes (loss, d loss / d param[w], ...).
  ControlFlowProgram(JitSession& session, const ControlFlowOptions& options)
      : session_(session), options_(options.compile), wrt_(options.wrt), tier_ups_(options.tier_ups) {}

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
    if (wrt_) {
      const TensorTypeNode* loss = AsTensor(result_type_);
      if (!loss || loss->type != TensorType{DType::kF32, {}}) {
        throw JitFailure("control flow: the result must be a scalar f32 loss (Tensor[(), f32]), got " +
                         TypeToString(result_type_));
      }
      std::vector<Type> results = {result_type_};
      for (int w : *wrt_) {
        if (w < 0 || static_cast<size_t>(w) >= main->params.size() || !IsFloat(AsTensor(main->params[w]->annotation)->type.dtype)) {
          throw JitFailure("control flow: gradients are taken for float tensor parameters only, not for parameter " +
                           std::to_string(w));
        }
        results.push_back(main->params[w]->annotation);
      }
      result_type_ = TupleTy(std::move(results));
    }
  }

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override {
    if (inputs.size() != main_.params.size()) {
      throw std::invalid_argument("the program takes " + std::to_string(main_.params.size()) + " tensors, not " +
                                  std::to_string(inputs.size()));
    }
    Env env;
    std::optional<Tape> tape;
    if (wrt_) tape.emplace();
    for (size_t i = 0; i < inputs.size(); ++i) {
      Slot& slot = env[main_.params[i]];
      slot.value = Value(inputs[i]);
      if (tape) slot.ids = {tape->next_id++};  // parameter i's id is i
    }
    Slot result = Exec(main_.body, env, 0, tape ? &*tape : nullptr);
    std::vector<Tensor> out;
    FlattenInto(result.value, out);
    if (tape) {
      std::vector<Tensor> gradients = Backward(*tape, result.ids.at(0));
      for (int w : *wrt_) {
        out.push_back(gradients[w].defined() ? gradients[w] : Tensor::Zeros(inputs[w].dtype(), inputs[w].shape()));
      }
    }
    return out;
  }
  const Type& result_type() const override { return result_type_; }
  size_t code_bytes() const override {
    size_t bytes = 0;
    for (const ExecutablePtr& code : codes_) bytes += code->code_bytes();
    return bytes;
  }
  // kKernelPlanTier while a region still runs baseline code (jit/tiered.h).
  // Asked at every call: once every region is native it stays so, and the
  // regions are not asked again.
  const char* tier() const override {
    if (all_native_.load(std::memory_order_acquire)) return "native";
    for (const ExecutablePtr& code : codes_) {
      if (std::string_view(code->tier()) == kKernelPlanTier) return kKernelPlanTier;
    }
    all_native_.store(true, std::memory_order_release);
    return "native";
  }

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
    if (!IsDriverAtom(block.tail)) {
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
        if (!IsDriverAtom(value)) return false;
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
      if (IsDriverAtom(value)) {
        step.kind = Step::Kind::kBind;
        step.value = value;
      } else if (value->kind == ExprKind::kIf) {
        const IfNode& n = static_cast<const IfNode&>(*value);
        if (!IsDriverAtom(n.cond)) throw JitFailure("control flow: an `if` whose condition is not a variable");
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
          if (!IsDriverAtom(a)) throw JitFailure("control flow: a call of @" + name + " with an argument that is not a variable");
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
    for (const Type& type : types) step.output_leaves += static_cast<int>(CountTensorLeaves(type));
    if (!wrt_ || !AddVjp(step, params, lets)) {
      step.exe = CompileRegion(
          MakeFunc(std::move(params), WithLets(lets, MakeTuple(std::move(results))), TupleTy(std::move(types))));
    }
    codes_.push_back(step.exe);
    ++stats_.regions;
    block.steps.push_back(std::move(step));
  }

  // A region's straight-line program through the pipeline (batched), then
  // native code, or baseline code now and native code as a tier-up.
  ExecutablePtr CompileRegion(const Func& region) {
    PipelineOptions pipeline;
    pipeline.compile = options_;
    Func prepared = PrepareResidual(region, pipeline);
    if (!tier_ups_) return session_.Compile(prepared, options_);
    return BaselineFirst(
        prepared, [session = &session_, prepared, options = options_] { return session->Compile(prepared, options); },
        *tier_ups_);
  }

  static Expr WithLets(const std::vector<const LetNode*>& lets, Expr body) {
    for (auto it = lets.rbegin(); it != lets.rend(); ++it) body = MakeLet((*it)->var, (*it)->value, body, (*it)->loc);
    return body;
  }

  // Grad mode: region `step` (its `lets` from `params`) as the two halves
  // of its vector-Jacobian product (jit/vjp.h), each through the pipeline
  // (batching, LLVM) as straight-line code is: the forward, returning the
  // output leaves and the residuals, becomes `exe`, the backward `vjp`.
  // False when no gradient passes through it (no float input or output).
  bool AddVjp(Step& step, const std::vector<Var>& params, const std::vector<const LetNode*>& lets) {
    std::vector<std::pair<Var, Expr>> projections;  // lets after the region's
    std::vector<Expr> leaves;
    std::function<void(const Var&)> flatten = [&](const Var& v) {
      const TupleTypeNode* tuple = AsTuple(v->annotation);
      if (!tuple) {
        leaves.push_back(v);
        return;
      }
      for (size_t i = 0; i < tuple->fields.size(); ++i) {
        Var field = MakeVar(v->name + "." + std::to_string(i), tuple->fields[i]);
        projections.emplace_back(field, MakeProj(v, static_cast<int>(i)));
        flatten(field);
      }
    };
    for (const auto& output : step.outputs) flatten(vars_.at(output.first));
    Expr body = MakeTuple(leaves);
    for (auto it = projections.rbegin(); it != projections.rend(); ++it) body = MakeLet(it->first, it->second, body);
    std::optional<SplitVjp> split = MakeSplitVjp(Decompose(MakeFunc(params, WithLets(lets, body))));
    if (!split) return false;
    for (int k : split->grad_outputs) {
      const TensorType type = TensorTypeOf(leaves[k]);
      if (!type.IsFullyKnown()) {
        throw JitFailure("control flow: a region's output of type " + type.ToString() +
                         " has a shape not known when compiling");
      }
      step.zero_cotangents.push_back(Tensor::Zeros(type.dtype, type.shape));
    }
    step.exe = CompileRegion(Recompose(split->forward));
    step.vjp = CompileRegion(Recompose(split->backward));
    step.float_inputs = std::move(split->grad_inputs);
    step.float_leaves = std::move(split->grad_outputs);
    codes_.push_back(step.vjp);
    ++stats_.vjp_regions;
    return true;
  }

  // The value of an atom and, with a tape, its tensors' ids.
  static Slot Eval(const Expr& e, const Env& env, bool ids) {
    switch (e->kind) {
      case ExprKind::kVar: return env.at(static_cast<const VarNode*>(e.get()));
      case ExprKind::kConstant: {
        Slot s{Value(static_cast<const ConstantNode&>(*e).value), {}};
        if (ids) s.ids = {-1};
        return s;
      }
      case ExprKind::kProj: {
        const ProjNode& p = static_cast<const ProjNode&>(*e);
        Slot tuple = Eval(p.tuple, env, ids);
        Slot s{tuple.value.fields().at(p.index), {}};
        if (ids) {
          int first = 0;
          for (int i = 0; i < p.index; ++i) first += LeafCount(tuple.value.fields()[i]);
          s.ids.assign(tuple.ids.begin() + first, tuple.ids.begin() + first + LeafCount(s.value));
        }
        return s;
      }
      case ExprKind::kTuple: {
        Slot s;
        std::vector<Value> fields;
        for (const Expr& f : static_cast<const TupleNode&>(*e).fields) {
          Slot field = Eval(f, env, ids);
          fields.push_back(std::move(field.value));
          s.ids.insert(s.ids.end(), field.ids.begin(), field.ids.end());
        }
        s.value = Value::Tuple(std::move(fields));
        return s;
      }
      default: throw std::logic_error("control flow: not an atom");
    }
  }

  static bool Taken(const Expr& cond, const Env& env) {
    return Eval(cond, env, false).value.tensor().data<bool>()[0];
  }

  // Runs `block` in `env`. A call, branch or nested block in tail position
  // (its value is the block's) continues in this frame: a loop the data
  // ends runs as many iterations as it takes in constant native stack. A
  // call elsewhere nests, at most kMaxCallDepth deep. With `tape`, records
  // the regions it runs.
  Slot Exec(const Block& first, Env& outer, int depth, Tape* tape) const {
    const Block* block = &first;
    Env* env = &outer;
    Env owned;  // a tail call's frame
    for (;;) {
      PollInterrupt();  // a loop the data never ends: its caller may stop it (Ctrl-C)
      const size_t n = block->steps.size();
      const bool tail = n > 0 && block->tail->kind == ExprKind::kVar &&
                        block->steps.back().var == static_cast<const VarNode*>(block->tail.get());
      for (size_t i = 0; i + (tail ? 1 : 0) < n; ++i) Run(block->steps[i], *env, depth, tape);
      if (!tail) return Eval(block->tail, *env, tape != nullptr);
      const Step& last = block->steps.back();
      switch (last.kind) {
        case Step::Kind::kIf: block = Taken(last.cond, *env) ? last.then_block.get() : last.else_block.get(); continue;
        case Step::Kind::kBlock: block = last.then_block.get(); continue;
        case Step::Kind::kCall: {
          const Function& f = functions_[last.function];
          Env next;
          for (size_t i = 0; i < f.params.size(); ++i) next.emplace(f.params[i], Eval(last.args.at(i), *env, tape != nullptr));
          owned = std::move(next);
          env = &owned;
          block = &f.body;
          continue;
        }
        default: Run(last, *env, depth, tape); return Eval(block->tail, *env, tape != nullptr);
      }
    }
  }

  void Run(const Step& step, Env& env, int depth, Tape* tape) const {
    switch (step.kind) {
      case Step::Kind::kRegion: {
        std::vector<Tensor> in;
        in.reserve(step.inputs.size());
        for (const VarNode* v : step.inputs) in.push_back(env.at(v).value.tensor());
        std::vector<Tensor> out = RunSizedToTeam(*step.exe, in);
        // Grad mode: the outputs get ids, and the run is recorded with the
        // residuals its forward returned after the outputs, when a gradient
        // can pass (the region has a VJP, and an input has an id).
        int first_output = -1;
        if (tape && step.vjp) {
          std::vector<int> input_ids;
          input_ids.reserve(step.inputs.size());
          bool active = false;
          for (const VarNode* v : step.inputs) {
            input_ids.push_back(env.at(v).ids.at(0));
            active |= input_ids.back() >= 0;
          }
          if (active) {
            first_output = tape->next_id;
            tape->next_id += step.output_leaves;
            in.insert(in.end(), std::make_move_iterator(out.begin() + step.output_leaves),
                      std::make_move_iterator(out.end()));
            tape->entries.push_back({&step, std::move(in), std::move(input_ids), first_output});
          }
        }
        size_t at = 0;
        for (const auto& [v, type] : step.outputs) {
          Slot& slot = env[v];
          const size_t first = at;
          slot.value = Rebuild(type, out, at);
          if (!tape) continue;
          slot.ids.resize(at - first);
          for (size_t k = 0; k < slot.ids.size(); ++k) {
            slot.ids[k] = first_output < 0 ? -1 : first_output + static_cast<int>(first + k);
          }
        }
        return;
      }
      case Step::Kind::kBind: env[step.var] = Eval(step.value, env, tape != nullptr); return;
      case Step::Kind::kBlock: env[step.var] = Exec(*step.then_block, env, depth, tape); return;
      case Step::Kind::kIf:
        env[step.var] = Exec(Taken(step.cond, env) ? *step.then_block : *step.else_block, env, depth, tape);
        return;
      case Step::Kind::kCall: {
        if (depth >= kMaxCallDepth) {
          throw std::runtime_error("control flow: residual calls nest deeper than " + std::to_string(kMaxCallDepth) +
                                   " (not in tail position)");
        }
        const Function& f = functions_[step.function];
        Env callee;
        for (size_t i = 0; i < f.params.size(); ++i) callee.emplace(f.params[i], Eval(step.args.at(i), env, tape != nullptr));
        env[step.var] = Exec(f.body, callee, depth + 1, tape);
        return;
      }
    }
  }


  // The recorded regions' vector-Jacobian products in reverse order, from
  // d loss = 1 at `loss_id`: the gradient reaching each parameter (undefined
  // where none did). Gradients reaching one value are summed in the order
  // they arrive. Consumes the tape.
  std::vector<Tensor> Backward(Tape& tape, int loss_id) const {
    std::vector<Tensor> grads(tape.next_id);
    if (loss_id >= 0) grads[loss_id] = Tensor::Scalar(1.0f);
    for (auto it = tape.entries.rbegin(); it != tape.entries.rend(); ++it) {
      const Step& step = *it->step;
      // (inputs..., cotangents..., residuals...)
      std::vector<Tensor> in = std::move(it->inputs);
      const auto cotangents_at = in.begin() + static_cast<std::ptrdiff_t>(step.inputs.size());
      std::vector<Tensor> cotangents;
      bool reached = false;
      for (size_t k = 0; k < step.float_leaves.size(); ++k) {
        Tensor& g = grads[it->first_output + step.float_leaves[k]];
        reached |= g.defined();
        cotangents.push_back(g.defined() ? std::move(g) : step.zero_cotangents[k]);
      }
      if (!reached) continue;
      in.insert(cotangents_at, std::make_move_iterator(cotangents.begin()), std::make_move_iterator(cotangents.end()));
      std::vector<Tensor> out = RunSizedToTeam(*step.vjp, in);
      for (size_t j = 0; j < step.float_inputs.size(); ++j) {
        const int id = it->input_ids[step.float_inputs[j]];
        if (id < 0) continue;
        Tensor& g = grads[id];
        g = g.defined() ? CallOp("add", {g, out[1 + j]}) : std::move(out[1 + j]);
      }
    }
    grads.resize(main_.params.size());
    return grads;
  }

  JitSession& session_;
  CompileOptions options_;
  std::optional<std::vector<int>> wrt_;
  std::vector<TierUp>* tier_ups_;
  ControlFlowStats stats_;
  std::map<std::string, int> function_index_;
  std::unordered_map<const VarNode*, Var> vars_;  // the owners of the variables regions use
  std::vector<Function> functions_;
  Function main_;
  Type result_type_;
  std::vector<ExecutablePtr> codes_;  // every region's, and every VJP's
  mutable std::atomic<bool> all_native_{false};
};

}  // namespace

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
                                 const ControlFlowOptions& options, ControlFlowStats* stats) {
  if (!HasControlFlow(main)) throw JitFailure("control flow: the program is straight-line code");
  auto program = std::make_shared<ControlFlowProgram>(session, options);
  // The control-flow pass list (jit/pass.h); its regions then go through
  // the residual and lowering lists.
  const PassInstrument& instrument = options.compile.instrument;
  if (instrument.after) {
    instrument.after("residual", PassProduct{nullptr, [&] { return ProgramWithFunctions(main, functions); }}, 0);
  }
  RefinedProgram refined = RunPass(
      instrument, "refine-shapes", [&] { return RefineShapes(main, functions); },
      [](const RefinedProgram& p) { return ProgramWithFunctions(p.main, p.functions); });
  BatchedBranches batched{refined.main, refined.functions};
  if (options.batch_branches) {
    batched = RunPass(
        instrument, "batch-branches", [&] { return BatchBranches(refined.main, refined.functions); },
        [](const BatchedBranches& p) { return ProgramWithFunctions(p.main, p.functions); });
  }
  program->Build(batched.main, batched.functions);
  if (stats) {
    *stats = program->stats();
    stats->refined = refined.refined;
    stats->batched_groups = batched.groups;
    stats->batched_rows = batched.rows;
  }
  return program;
}

}  // namespace pejit
