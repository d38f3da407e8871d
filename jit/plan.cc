#include "jit/plan.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "ir/printer.h"
#include "jit/straight.h"
#include "ops/eager.h"
#include "ops/packed_gemm.h"

namespace pejit {

// ---- Passes ------------------------------------------------------------------------

Func FoldConstants(const Func& program) {
  Straight s = Decompose(program);
  std::unordered_map<const ExprNode*, Expr> subst;
  std::vector<Binding> kept;
  for (Binding b : s.bindings) {
    b.value = Substitute(b.value, subst);
    if (IsAtom(b.value)) {
      subst[b.var.get()] = b.value;
      continue;
    }
    auto* call = As<OpCallNode>(b.value);
    bool constant = call && std::all_of(call->args.begin(), call->args.end(),
                                        [](const Expr& a) { return a->kind == ExprKind::kConstant; });
    if (!constant) {
      if (auto* p = As<ProjNode>(b.value); p && p->tuple->kind == ExprKind::kTuple) {
        subst[b.var.get()] = As<TupleNode>(p->tuple)->fields[p->index];
        continue;
      }
      kept.push_back(b);
      continue;
    }
    std::vector<Tensor> inputs;
    for (const Expr& a : call->args) inputs.push_back(As<ConstantNode>(a)->value);
    std::vector<Tensor> out = RunOp(*call->op, inputs, call->attrs);
    if (out.size() == 1) {
      subst[b.var.get()] = MakeConstant(out[0], call->loc);
    } else {
      std::vector<Expr> fields;
      for (const Tensor& t : out) fields.push_back(MakeConstant(t, call->loc));
      subst[b.var.get()] = MakeTuple(std::move(fields));
    }
  }
  s.bindings = std::move(kept);
  s.result = Substitute(s.result, subst);
  return Recompose(s);
}

Func EliminateCommonSubexpressions(const Func& program) {
  Straight s = Decompose(program);
  std::unordered_map<const ExprNode*, Expr> subst;
  // Key: operator, attributes and argument identities (constants by value).
  std::map<std::string, Var> seen;
  auto key_of = [](const Expr& value) {
    std::string key;
    auto add_atom = [&](const Expr& a) {
      if (auto* c = As<ConstantNode>(a)) {
        key += "c" + c->value.type().ToString() + ":";
        key.append(static_cast<const char*>(c->value.raw_data()), c->value.nbytes());
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "v%p", static_cast<const void*>(a.get()));
        key += buf;
      }
      key += ';';
    };
    if (auto* c = As<OpCallNode>(value)) {
      key = c->op->name + "(" + c->attrs.ToString() + ")";
      for (const Expr& a : c->args) add_atom(a);
    } else if (auto* p = As<ProjNode>(value)) {
      key = "." + std::to_string(p->index);
      add_atom(p->tuple);
    } else if (auto* t = As<TupleNode>(value)) {
      key = "tuple";
      for (const Expr& f : t->fields) add_atom(f);
    }
    return key;
  };
  std::vector<Binding> kept;
  for (Binding b : s.bindings) {
    b.value = Substitute(b.value, subst);
    if (IsAtom(b.value)) {
      subst[b.var.get()] = b.value;
      continue;
    }
    std::string key = key_of(b.value);
    auto it = seen.find(key);
    if (it != seen.end()) {
      subst[b.var.get()] = it->second;
      continue;
    }
    seen.emplace(std::move(key), b.var);
    kept.push_back(b);
  }
  s.bindings = std::move(kept);
  s.result = Substitute(s.result, subst);
  return Recompose(s);
}

Func EliminateDeadCode(const Func& program) {
  Straight s = Decompose(program);
  std::unordered_set<const ExprNode*> live;
  std::function<void(const Expr&)> mark = [&](const Expr& e) {
    if (e->kind == ExprKind::kVar) live.insert(e.get());
    if (auto* c = As<OpCallNode>(e)) for (const Expr& a : c->args) mark(a);
    if (auto* t = As<TupleNode>(e)) for (const Expr& f : t->fields) mark(f);
    if (auto* p = As<ProjNode>(e)) mark(p->tuple);
  };
  mark(s.result);
  std::vector<Binding> kept;
  for (auto it = s.bindings.rbegin(); it != s.bindings.rend(); ++it) {
    if (!live.count(it->var.get())) continue;
    mark(it->value);
    kept.push_back(*it);
  }
  std::reverse(kept.begin(), kept.end());
  s.bindings = std::move(kept);
  return Recompose(s);
}

Func CombineSums(const Func& program) {
  Straight s = Decompose(program);
  std::unordered_map<const ExprNode*, int> uses, binding_of;
  std::function<void(const Expr&)> count = [&](const Expr& e) {
    if (e->kind == ExprKind::kVar) ++uses[e.get()];
    if (auto* c = As<OpCallNode>(e)) for (const Expr& a : c->args) count(a);
    if (auto* t = As<TupleNode>(e)) for (const Expr& f : t->fields) count(f);
    if (auto* p = As<ProjNode>(e)) count(p->tuple);
  };
  for (size_t i = 0; i < s.bindings.size(); ++i) {
    count(s.bindings[i].value);
    binding_of[s.bindings[i].var.get()] = static_cast<int>(i);
  }
  count(s.result);
  count(s.result);  // results are used outside
  auto call_of = [&](const Expr& atom, const char* op) -> const OpCallNode* {
    auto it = binding_of.find(atom.get());
    if (it == binding_of.end() || uses[atom.get()] != 1) return nullptr;
    auto* call = As<OpCallNode>(s.bindings[it->second].value);
    return call && call->op->name == op ? call : nullptr;
  };
  // An add whose operands have its own type (no broadcasting): a node of a sum.
  auto is_sum = [&](const OpCallNode* add, const TensorType& type) {
    return add && TensorTypeOf(add->args[0]) == type && TensorTypeOf(add->args[1]) == type;
  };
  // Sums of single-use adds whose value is consumed by another such add are
  // part of that one's sum: only the outermost is rewritten.
  std::unordered_set<const ExprNode*> inner;
  for (const Binding& b : s.bindings) {
    auto* add = As<OpCallNode>(b.value);
    if (!add || add->op->name != "add" || !is_sum(add, TensorTypeOf(b.var))) continue;
    for (const Expr& a : add->args) {
      if (is_sum(call_of(a, "add"), TensorTypeOf(b.var))) inner.insert(a.get());
    }
  }
  std::vector<Binding> out;
  int fresh = 0;
  auto emit = [&](std::string_view op, std::vector<Expr> args, const Attrs& attrs) -> Expr {
    const OpDef& def = LookupOp(op);
    Attrs normalized = NormalizeAttrs(def, attrs);
    std::vector<TensorType> in;
    for (const Expr& a : args) in.push_back(TensorTypeOf(a));
    Var v = MakeVar("sum" + std::to_string(fresh++), TensorTy(InferTypes(def, in, normalized)[0]));
    out.push_back({v, std::make_shared<OpCallNode>(&def, std::move(args), normalized, SourceLoc{})});
    return v;
  };
  for (const Binding& b : s.bindings) {
    auto* add = As<OpCallNode>(b.value);
    if (!add || add->op->name != "add" || inner.count(b.var.get()) || !is_sum(add, TensorTypeOf(b.var))) {
      out.push_back(b);
      continue;
    }
    const TensorType type = TensorTypeOf(b.var);
    // The sum's terms, by kind.
    std::vector<Expr> others;
    std::vector<std::pair<Expr, const OpCallNode*>> scatters, products;  // (term, its call)
    std::function<void(const Expr&)> collect = [&](const Expr& term) {
      if (const OpCallNode* a = call_of(term, "add"); is_sum(a, type)) {
        for (const Expr& t : a->args) collect(t);
      } else if (const OpCallNode* sc = call_of(term, "scatter_add");
                 sc && sc->args[1]->kind == ExprKind::kConstant) {
        scatters.emplace_back(term, sc);
      } else if (const OpCallNode* mm = call_of(term, "matmul");
                 mm && mm->attrs.GetBool("transpose_a") && !mm->attrs.GetBool("transpose_b") &&
                 TensorTypeOf(mm->args[0]).rank() == 2 && TensorTypeOf(mm->args[1]).rank() == 2) {
        products.emplace_back(term, mm);
      } else {
        others.push_back(term);
      }
    };
    for (const Expr& a : add->args) collect(a);
    if (scatters.size() < 2 && products.size() < 2) {
      out.push_back(b);
      continue;
    }
    auto concat = [&](std::vector<Expr> values) {
      return values.size() == 1 ? values[0] : emit("concat", std::move(values), {{"axis", int64_t{0}}});
    };
    std::vector<Expr> terms;
    if (scatters.size() >= 2) {
      std::vector<Expr> values;
      std::vector<int64_t> indices;
      for (const auto& [term, sc] : scatters) {
        const Tensor& idx = As<ConstantNode>(sc->args[1])->value;
        for (int64_t k = 0; k < idx.numel(); ++k) indices.push_back(idx.data<int64_t>()[k]);
        Shape flat = TensorTypeOf(sc->args[0]).shape;
        flat.erase(flat.begin(), flat.begin() + idx.rank());
        flat.insert(flat.begin(), idx.numel());
        values.push_back(emit("reshape", {sc->args[0]}, {{"shape", flat}}));
      }
      auto count_indices = static_cast<int64_t>(indices.size());
      terms.push_back(emit("scatter_add",
                           {concat(std::move(values)), MakeConstant(Tensor::FromVector<int64_t>({count_indices}, indices))},
                           scatters[0].second->attrs));
    } else {
      for (const auto& [term, sc] : scatters) others.push_back(term);
    }
    if (products.size() >= 2) {
      std::vector<Expr> a, c;
      for (const auto& [term, mm] : products) {
        a.push_back(mm->args[0]);
        c.push_back(mm->args[1]);
      }
      terms.push_back(emit("matmul", {concat(std::move(a)), concat(std::move(c))}, products[0].second->attrs));
    } else {
      for (const auto& [term, mm] : products) others.push_back(term);
    }
    terms.insert(terms.end(), others.begin(), others.end());
    Expr sum = terms[0];
    for (size_t k = 1; k + 1 < terms.size(); ++k) sum = emit("add", {sum, terms[k]}, {});
    out.push_back({b.var, terms.size() == 1 ? MakeOpCall("reshape", {sum}, {{"shape", type.shape}})
                                            : std::make_shared<OpCallNode>(add->op, std::vector<Expr>{sum, terms.back()},
                                                                           add->attrs, add->loc)});
  }
  s.bindings = std::move(out);
  return EliminateDeadCode(Recompose(s));
}

std::optional<bool> PackableProduct(const OpCallNode& call) {
  constexpr int64_t kMaxInner = 1024;  // the micro-kernel keeps a panel (k·16 floats) near L1
  auto f32_matrix = [](const Expr& e) {
    const TensorType t = TensorTypeOf(e);
    return t.dtype == DType::kF32 && t.rank() == 2;
  };
  const std::string& op = call.op->name;
  bool product = (op == "matmul" && !call.attrs.GetBool("transpose_a") && f32_matrix(call.args[1])) || op == "dense";
  if (!product || !f32_matrix(call.args[0]) || TensorTypeOf(call.args[0]).shape[1] > kMaxInner) return std::nullopt;
  return op == "dense" || call.attrs.GetBool("transpose_b");
}

Expr PackedProduct(const OpCallNode& call, const Expr& packed, const TensorType& result) {
  return call.op->name == "dense"
             ? MakeOpCall("packed_dense", {call.args[0], packed, call.args[2]}, {}, call.loc)
             : MakeOpCall("packed_matmul", {call.args[0], packed}, {{"n", result.shape[1]}}, call.loc);
}

Func PackGemmOperands(const Func& program) {
  Straight s = Decompose(program);
  std::vector<Binding> out;
  int fresh = 0;
  auto pack = [&](const Expr& rhs, bool transpose_b) -> Expr {
    const OpDef& def = LookupOp("gemm_pack");
    Attrs attrs = NormalizeAttrs(def, {{"transpose_b", transpose_b}});
    Var v = MakeVar("pack" + std::to_string(fresh++), TensorTy(InferTypes(def, {{TensorTypeOf(rhs)}}, attrs)[0]));
    out.push_back({v, std::make_shared<OpCallNode>(&def, std::vector<Expr>{rhs}, attrs, SourceLoc{})});
    return v;
  };
  // The right operand and its orientation of a product the micro-kernel can
  // take, or null.
  auto packable = [&](const OpCallNode* call) -> std::pair<const ExprNode*, bool> {
    std::optional<bool> transpose_b = call ? PackableProduct(*call) : std::nullopt;
    return transpose_b ? std::make_pair(call->args[1].get(), *transpose_b) : std::make_pair(nullptr, false);
  };
  // A product whose operand no other product shares stays OpenBLAS's, which
  // packs it as well and, unlike the micro-kernel, may use several threads
  // (an MLP's layer over a large minibatch).
  std::map<std::pair<const ExprNode*, bool>, int> products;
  for (const Binding& b : s.bindings) {
    if (auto key = packable(As<OpCallNode>(b.value)); key.first) ++products[key];
  }
  for (Binding b : s.bindings) {
    auto* call = As<OpCallNode>(b.value);
    auto key = packable(call);
    if (key.first && products[key] >= 2) b.value = PackedProduct(*call, pack(call->args[1], key.second), TensorTypeOf(b.var));
    out.push_back(std::move(b));
  }
  s.bindings = std::move(out);
  return Recompose(s);
}

// ---- Lowering ------------------------------------------------------------------------

namespace {

// Appends `b` to `blocks` (in order of `to`), extending the last block when
// `b` continues it in both input and output.
void AppendBlock(std::vector<CopyBlock>& blocks, const CopyBlock& b) {
  if (b.bytes == 0) return;
  if (!blocks.empty()) {
    CopyBlock& last = blocks.back();
    if (last.input == b.input && last.from + last.bytes == b.from && last.to + last.bytes == b.to) {
      last.bytes += b.bytes;
      return;
    }
  }
  blocks.push_back(b);
}

// The position of `buffer` in a step's `inputs`, appending it when absent.
int InputIndex(std::vector<int>& inputs, int buffer) {
  auto it = std::find(inputs.begin(), inputs.end(), buffer);
  if (it != inputs.end()) return static_cast<int>(it - inputs.begin());
  inputs.push_back(buffer);
  return static_cast<int>(inputs.size()) - 1;
}

bool Fusible(const OpCallNode* call) {
  FusionKind k = call->op->fusion;
  return (k == FusionKind::kElementwise || k == FusionKind::kBroadcast) && call->op->scalar != ScalarOp::kNone;
}

class Lowering {
 public:
  explicit Lowering(const LowerOptions& options) : options_(options) {}

  Plan Run(const Func& program) {
    Func f = program;
    Decompose(f);  // checks
    f = FoldConstants(f);
    f = CombineSums(f);
    if (options_.pack_gemm && PackedGemmFast()) f = PackGemmOperands(f);
    if (options_.cse) f = EliminateCommonSubexpressions(f);
    f = EliminateDeadCode(f);
    Straight s = Decompose(f);

    for (size_t i = 0; i < s.params.size(); ++i) {
      int b = NewBuffer(PlanBuffer::Kind::kParam, TensorTypeOf(s.params[i]), s.params[i]->name);
      plan_.buffers[b].param = static_cast<int>(i);
      plan_.params.push_back(b);
      buffers_of_[s.params[i].get()] = {b};
    }
    CountUses(s);
    for (const Binding& b : s.bindings) LowerBinding(b);
    std::erase_if(plan_.steps, [](const PlanStep& step) { return step.outputs.empty(); });  // composed copies
    LowerResult(s.result);
    ConcatenateInPlace();
    std::erase_if(plan_.steps, [](const PlanStep& step) { return step.outputs.empty(); });
    plan_.result_type = ResultTypeOf(s.result);
    Lifetimes();
    PlanMemory();
    return std::move(plan_);
  }

 private:
  const LowerOptions& options_;
  Plan plan_;
  std::unordered_map<const ExprNode*, std::vector<int>> buffers_of_;  // var → its buffers
  std::unordered_map<const ExprNode*, const OpCallNode*> producer_;    // var → fusible op computing it
  std::unordered_map<const ExprNode*, int> uses_;
  std::unordered_set<const ExprNode*> inlined_;                          // fused into their consumer
  std::unordered_map<const ExprNode*, int> constant_buffers_;
  std::unordered_map<int, size_t> copy_step_of_;  // buffer → the copy step writing it

  int NewBuffer(PlanBuffer::Kind kind, TensorType type, std::string name) {
    PlanBuffer b;
    b.kind = kind;
    b.type = std::move(type);
    b.name = std::move(name);
    plan_.buffers.push_back(std::move(b));
    return static_cast<int>(plan_.buffers.size()) - 1;
  }

  void CountUses(const Straight& s) {
    std::function<void(const Expr&)> count = [&](const Expr& e) {
      if (e->kind == ExprKind::kVar) ++uses_[e.get()];
      if (auto* c = As<OpCallNode>(e)) for (const Expr& a : c->args) count(a);
      if (auto* t = As<TupleNode>(e)) for (const Expr& f : t->fields) count(f);
      if (auto* p = As<ProjNode>(e)) count(p->tuple);
    };
    for (const Binding& b : s.bindings) count(b.value);
    count(s.result);
    count(s.result);  // results are used outside: never inlined
    if (!options_.fuse) return;
    // A fusible value with one use, by a fusible operator of the same shape,
    // is computed inside that operator's kernel, unless that is far away:
    // computing it later keeps its inputs alive until then (a gradient summed
    // over a whole tree would otherwise hold every partial sum in memory).
    // A kernel reads at most kMaxFusedInputs operands: a longer chain (a
    // weight's gradient summed over a data-dependent number of tree levels)
    // becomes a few kernels, of forms that recur from one minibatch to the
    // next and so are compiled once (jit/compiler.cc shares them).
    constexpr size_t kFusionWindow = 16;  // bindings between producer and consumer
    constexpr int kMaxFusedInputs = 8;
    std::unordered_map<const ExprNode*, size_t> position;
    std::unordered_map<const ExprNode*, int> inputs;  // of the kernel computing a fusible value
    for (size_t i = 0; i < s.bindings.size(); ++i) {
      const Binding& b = s.bindings[i];
      position[b.var.get()] = i;
      auto* call = As<OpCallNode>(b.value);
      if (!call || !Fusible(call)) continue;
      producer_[b.var.get()] = call;
      TensorType out = TensorTypeOf(b.var);
      int total = static_cast<int>(call->args.size());
      for (const Expr& a : call->args) {
        if (a->kind != ExprKind::kVar || !producer_.count(a.get()) || uses_[a.get()] != 1) continue;
        if (TensorTypeOf(a).shape != out.shape || i - position.at(a.get()) > kFusionWindow) continue;
        if (total - 1 + inputs[a.get()] > kMaxFusedInputs) continue;
        total += inputs[a.get()] - 1;
        inlined_.insert(a.get());
      }
      inputs[b.var.get()] = total;
    }
  }

  int BufferOfAtom(const Expr& atom) {
    if (auto* c = As<ConstantNode>(atom)) {
      auto it = constant_buffers_.find(atom.get());
      if (it != constant_buffers_.end()) return it->second;
      int b = NewBuffer(PlanBuffer::Kind::kConstant, c->value.type(), "const");
      plan_.buffers[b].constant = c->value;
      constant_buffers_[atom.get()] = b;
      return b;
    }
    auto it = buffers_of_.find(atom.get());
    if (it == buffers_of_.end() || it->second.size() != 1) {
      throw JitFailure("%" + As<VarNode>(atom)->name + " is not a tensor computed before its use");
    }
    return it->second[0];
  }

  // The per-element expression of `call` into `nodes`; returns its node index.
  int Inline(const OpCallNode* call, DType out_dtype, PlanStep& step) {
    std::vector<int> args;
    for (const Expr& a : call->args) {
      if (a->kind == ExprKind::kVar && inlined_.count(a.get())) {
        const OpCallNode* inner = producer_.at(a.get());
        args.push_back(Inline(inner, TensorTypeOf(a).dtype, step));
        step.fused_ops.push_back(inner->op->name);
        continue;
      }
      FusedNode leaf;
      leaf.dtype = TensorTypeOf(a).dtype;
      if (auto* c = As<ConstantNode>(a); c && c->value.numel() == 1) {
        leaf.kind = FusedNode::Kind::kImmediate;
        leaf.immediate = c->value.ElementAsDouble(0);
      } else {
        leaf.kind = FusedNode::Kind::kLoad;
        leaf.buffer = BufferOfAtom(a);
        step.inputs.push_back(leaf.buffer);
      }
      step.nodes.push_back(leaf);
      args.push_back(static_cast<int>(step.nodes.size()) - 1);
    }
    FusedNode n;
    n.kind = FusedNode::Kind::kOp;
    n.op = call->op->scalar;
    n.args = std::move(args);
    n.dtype = out_dtype;
    if (n.op == ScalarOp::kPow) n.param = call->attrs.GetFloat("exponent");
    if (n.op == ScalarOp::kClip) {
      n.param = call->attrs.GetFloat("min");
      n.param2 = call->attrs.GetFloat("max");
    }
    step.nodes.push_back(std::move(n));
    return static_cast<int>(step.nodes.size()) - 1;
  }

  void LowerBinding(const Binding& b) {
    const VarNode* var = b.var.get();
    if (IsAtom(b.value)) {
      buffers_of_[var] = {BufferOfAtom(b.value)};
      return;
    }
    if (auto* p = As<ProjNode>(b.value)) {
      buffers_of_[var] = {buffers_of_.at(p->tuple.get()).at(p->index)};
      return;
    }
    if (auto* t = As<TupleNode>(b.value)) {
      std::vector<int> bufs;
      for (const Expr& f : t->fields) bufs.push_back(BufferOfAtom(f));
      buffers_of_[var] = bufs;
      return;
    }
    const OpCallNode* call = As<OpCallNode>(b.value);
    if (inlined_.count(var)) return;  // computed inside its consumer's kernel
    std::vector<int> outs;
    if (const TensorTypeNode* t = AsTensor(b.var->annotation)) {
      outs.push_back(NewBuffer(PlanBuffer::Kind::kArena, t->type, b.var->name));
    } else if (const TupleTypeNode* tuple = AsTuple(b.var->annotation)) {
      for (size_t i = 0; i < tuple->fields.size(); ++i) {
        outs.push_back(NewBuffer(PlanBuffer::Kind::kArena, AsTensor(tuple->fields[i])->type,
                                 b.var->name + "." + std::to_string(i)));
      }
    }
    buffers_of_[var] = outs;

    PlanStep step;
    if (options_.fuse && Fusible(call)) {
      step.kind = PlanStep::Kind::kFused;
      step.outputs = outs;
      Inline(call, TensorTypeOf(b.var).dtype, step);
      step.fused_ops.push_back(call->op->name);
      std::sort(step.inputs.begin(), step.inputs.end());
      step.inputs.erase(std::unique(step.inputs.begin(), step.inputs.end()), step.inputs.end());
    } else {
      step.kind = PlanStep::Kind::kKernel;
      step.op = call->op;
      step.attrs = call->attrs;
      for (const Expr& a : call->args) step.inputs.push_back(BufferOfAtom(a));
      step.outputs = outs;
      // Moving bytes without changing them: view the input instead of copying.
      if (std::optional<int64_t> offset = outs.size() == 1 ? ViewOffset(*call, plan_.buffers[outs[0]].type) : std::nullopt) {
        plan_.buffers[outs[0]].kind = PlanBuffer::Kind::kAlias;
        plan_.buffers[outs[0]].alias_of = step.inputs[0];
        plan_.buffers[outs[0]].offset = *offset;
        return;
      }
      std::optional<std::vector<CopyBlock>> blocks;
      if (outs.size() == 1) blocks = CopyBlocks(*call, plan_.buffers[outs[0]].type);
      if (blocks) {
        step.kind = PlanStep::Kind::kCopy;
        step.blocks = std::move(*blocks);
        ComposeCopies(*call, step);
        copy_step_of_[outs[0]] = plan_.steps.size();
      }
    }
    plan_.steps.push_back(std::move(step));
  }

  // The blocks `call` moves when it only moves bytes, at most kMaxCopyBlocks
  // of them; nullopt for other operators (and for indices out of range,
  // which the kernel reports at run time).
  static std::optional<std::vector<CopyBlock>> CopyBlocks(const OpCallNode& call, const TensorType& result) {
    constexpr int64_t kMaxCopyBlocks = 1 << 16;
    const std::string& op = call.op->name;
    const int64_t elem = static_cast<int64_t>(SizeOf(result.dtype));
    auto product = [](const Shape& shape, size_t from, size_t to) {
      int64_t n = 1;
      for (size_t i = from; i < to; ++i) n *= shape[i];
      return n;
    };
    std::vector<CopyBlock> blocks;
    auto add = [&](int input, int64_t from, int64_t to, int64_t bytes) { AppendBlock(blocks, {input, from, to, bytes}); };
    if (op == "copy") {
      add(0, 0, 0, NumElements(result.shape) * elem);
      return blocks;
    }
    if (op == "take") {
      auto* index = As<ConstantNode>(call.args[1]);
      const TensorType table = TensorTypeOf(call.args[0]);
      if (!index || index->value.numel() > kMaxCopyBlocks) return std::nullopt;
      const int64_t row = product(table.shape, 1, table.shape.size()) * elem;
      for (int64_t i = 0; i < index->value.numel(); ++i) {
        auto r = static_cast<int64_t>(index->value.ElementAsDouble(i));
        if (r < 0 || r >= table.shape[0]) return std::nullopt;
        add(0, r * row, i * row, row);
      }
      return blocks;
    }
    if (op == "concat" || op == "stack") {
      // Per index of the axes before `axis`, each input's block in turn.
      const int rank = static_cast<int>(result.rank());
      int64_t axis = call.attrs.GetInt("axis");
      if (axis < 0) axis += rank;
      const int64_t outer = product(result.shape, 0, static_cast<size_t>(axis));
      if (outer * static_cast<int64_t>(call.args.size()) > kMaxCopyBlocks) return std::nullopt;
      std::vector<int64_t> piece(call.args.size());
      for (size_t i = 0; i < call.args.size(); ++i) piece[i] = NumElements(TensorTypeOf(call.args[i]).shape) / outer * elem;
      int64_t to = 0;
      for (int64_t o = 0; o < outer; ++o) {
        for (size_t i = 0; i < call.args.size(); ++i) {
          add(static_cast<int>(i), o * piece[i], to, piece[i]);
          to += piece[i];
        }
      }
      return blocks;
    }
    if (op == "slice") {
      // Contiguous runs: the last axis cut and every axis after it.
      const Shape in = TensorTypeOf(call.args[0]).shape;
      const size_t rank = in.size();
      Shape begin(rank, 0);
      const std::vector<int64_t> axes = call.attrs.GetInts("axes"), begins = call.attrs.GetInts("begins");
      for (size_t i = 0; i < axes.size(); ++i) {
        int64_t axis = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
        begin[axis] = begins[i] < 0 ? begins[i] + in[axis] : begins[i];
      }
      size_t cut = 0;  // the last axis whose extent changes, + 1
      for (size_t a = 0; a < rank; ++a) {
        if (result.shape[a] != in[a]) cut = a + 1;
      }
      if (cut == 0) {
        add(0, 0, 0, NumElements(in) * elem);
        return blocks;
      }
      const int64_t runs = product(result.shape, 0, cut - 1);
      if (runs > kMaxCopyBlocks) return std::nullopt;
      const Shape strides = RowMajorStrides(in);
      const int64_t run = result.shape[cut - 1] * strides[cut - 1] * elem;
      Shape at(cut - 1, 0);  // index over the axes before the cut one
      for (int64_t r = 0; r < runs; ++r) {
        int64_t from = begin[cut - 1] * strides[cut - 1];
        for (size_t a = 0; a + 1 < cut; ++a) from += (begin[a] + at[a]) * strides[a];
        add(0, from * elem, r * run, run);
        for (size_t a = cut - 1; a-- > 0;) {  // next index, last axis fastest
          if (++at[a] < result.shape[a]) break;
          at[a] = 0;
        }
      }
      return blocks;
    }
    return std::nullopt;
  }

  // When an input of copy `step` is the output of an earlier copy used only
  // here, reads those bytes where that copy took them from, and drops it.
  void ComposeCopies(const OpCallNode& call, PlanStep& step) {
    std::vector<int> inputs;
    std::vector<CopyBlock> blocks;
    std::vector<const PlanStep*> producer(step.inputs.size(), nullptr);
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const Expr& arg = call.args[k];
      auto it = copy_step_of_.find(step.inputs[k]);
      if (arg->kind == ExprKind::kVar && uses_[arg.get()] == 1 && it != copy_step_of_.end()) {
        producer[k] = &plan_.steps[it->second];
      }
    }
    if (std::none_of(producer.begin(), producer.end(), [](const PlanStep* p) { return p != nullptr; })) return;
    for (const CopyBlock& b : step.blocks) {
      const PlanStep* p = producer[b.input];
      if (!p) {
        AppendBlock(blocks, {InputIndex(inputs, step.inputs[b.input]), b.from, b.to, b.bytes});
        continue;
      }
      // The producer's blocks (in order of `to`) that cover [b.from, b.from + b.bytes).
      auto first = std::upper_bound(p->blocks.begin(), p->blocks.end(), b.from,
                                    [](int64_t at, const CopyBlock& q) { return at < q.to; });
      if (first == p->blocks.begin()) throw JitFailure("plan: a copy reads bytes no copy wrote");
      for (auto q = std::prev(first); q != p->blocks.end() && q->to < b.from + b.bytes; ++q) {
        int64_t lo = std::max(b.from, q->to), hi = std::min(b.from + b.bytes, q->to + q->bytes);
        AppendBlock(blocks, {InputIndex(inputs, p->inputs[q->input]), q->from + (lo - q->to), b.to + (lo - b.from), hi - lo});
      }
    }
    for (size_t k = 0; k < producer.size(); ++k) {
      if (!producer[k]) continue;
      PlanStep& dead = plan_.steps[copy_step_of_.at(step.inputs[k])];
      copy_step_of_.erase(dead.outputs[0]);
      dead.outputs.clear();  // removed once lowering is done
    }
    step.inputs = std::move(inputs);
    step.blocks = std::move(blocks);
  }

  // When `call`'s result is bytes of its first operand as they lie (a
  // reshape, or a block of consecutive rows: a batched value read in part),
  // their byte offset there.
  static std::optional<int64_t> ViewOffset(const OpCallNode& call, const TensorType& result) {
    const std::string& op = call.op->name;
    if (call.op->fusion == FusionKind::kInjective && (op == "reshape" || op == "expand_dims" || op == "squeeze")) {
      return 0;
    }
    const TensorType in = TensorTypeOf(call.args[0]);
    const int64_t row_bytes = in.rank() == 0 ? 0 : NumElements(in.shape) / std::max<int64_t>(1, in.shape[0]) *
                                                        static_cast<int64_t>(SizeOf(in.dtype));
    if (op == "take" && in.rank() >= 1) {
      // Rows first, last, first + 1, ... of the table: constant, consecutive indices.
      auto* index = As<ConstantNode>(call.args[1]);
      if (!index || index->value.numel() == 0) return std::nullopt;
      auto at = [&](int64_t i) { return static_cast<int64_t>(index->value.ElementAsDouble(i)); };
      const int64_t first = at(0);
      for (int64_t i = 1; i < index->value.numel(); ++i) {
        if (at(i) != first + i) return std::nullopt;
      }
      if (first < 0 || first + index->value.numel() > in.shape[0]) return std::nullopt;
      return first * row_bytes;
    }
    if (op == "slice" && in.rank() >= 1) {
      // Contiguous when only the leading axis is cut.
      const Shape& out = result.shape;
      for (size_t a = 1; a < out.size(); ++a) {
        if (out[a] != in.shape[a]) return std::nullopt;
      }
      const std::vector<int64_t> axes = call.attrs.GetInts("axes"), begins = call.attrs.GetInts("begins");
      int64_t begin = 0;
      for (size_t i = 0; i < axes.size(); ++i) {
        int64_t axis = axes[i] < 0 ? axes[i] + in.rank() : axes[i];
        if (axis == 0) begin = begins[i] < 0 ? begins[i] + in.shape[0] : begins[i];
      }
      return begin * row_bytes;
    }
    return std::nullopt;
  }

  // The buffer `b` reads its bytes from, following aliases.
  int Root(int b) const { return plan_.ViewOf(b).first; }

  void LowerResult(const Expr& result) {
    std::vector<int> atoms;
    std::function<void(const Expr&)> collect = [&](const Expr& e) {
      if (auto* t = As<TupleNode>(e)) {
        for (const Expr& f : t->fields) collect(f);
      } else {
        atoms.push_back(BufferOfAtom(e));
      }
    };
    collect(result);
    std::unordered_set<int> taken;
    for (int b : atoms) {
      PlanBuffer& buf = plan_.buffers[b];
      int index = static_cast<int>(plan_.results.size());
      // A result is a fresh tensor the caller owns: computed ones are written
      // there directly; parameters, constants, views and repeats are copied.
      if (buf.kind == PlanBuffer::Kind::kArena && taken.insert(b).second) {
        buf.kind = PlanBuffer::Kind::kResult;
        buf.result = index;
        plan_.results.push_back(b);
        continue;
      }
      const int64_t bytes = buf.bytes();  // `buf` does not outlive NewBuffer
      int copy = NewBuffer(PlanBuffer::Kind::kResult, buf.type, "result" + std::to_string(index));
      plan_.buffers[copy].result = index;
      PlanStep step;
      step.kind = PlanStep::Kind::kCopy;
      step.op = &LookupOp("copy");
      step.inputs = {b};
      step.outputs = {copy};
      step.blocks = {{0, 0, 0, bytes}};
      plan_.steps.push_back(std::move(step));
      plan_.results.push_back(copy);
    }
  }

  // A value concatenated whole is computed where the concatenation puts it:
  // its buffer becomes a view of the concatenation's, which is then copied
  // only from the inputs that cannot be (parameters, constants, views of
  // part of a buffer, values in another concatenation already). A
  // concatenation left with nothing to copy is dropped.
  void ConcatenateInPlace() {
    for (PlanStep& step : plan_.steps) {
      if (step.kind != PlanStep::Kind::kCopy || (step.op->name != "concat" && step.op->name != "stack")) continue;
      const int out = step.outputs[0];
      std::vector<int> reads(step.inputs.size(), 0);
      for (const CopyBlock& b : step.blocks) ++reads[b.input];
      std::vector<CopyBlock> kept;
      for (const CopyBlock& b : step.blocks) {
        auto [root, offset] = plan_.ViewOf(step.inputs[b.input]);
        PlanBuffer& value = plan_.buffers[root];
        bool whole = reads[b.input] == 1 && b.from == 0 && offset == 0 && b.bytes == value.bytes();
        if (!whole || value.kind != PlanBuffer::Kind::kArena || root == Root(out)) {
          kept.push_back(b);
          continue;
        }
        value.kind = PlanBuffer::Kind::kAlias;
        value.alias_of = out;
        value.offset = b.to;
      }
      if (kept.empty()) {
        step.outputs.clear();  // removed by the caller
        continue;
      }
      std::vector<int> inputs;
      for (CopyBlock& b : kept) b.input = InputIndex(inputs, step.inputs[b.input]);
      step.inputs = std::move(inputs);
      step.blocks = std::move(kept);
    }
  }

  void Lifetimes() {
    for (size_t s = 0; s < plan_.steps.size(); ++s) {
      int step = static_cast<int>(s);
      for (int b : plan_.steps[s].outputs) {  // written in place of a concatenation: its root
        PlanBuffer& buf = plan_.buffers[Root(b)];
        if (buf.first_step < 0) buf.first_step = step;
        buf.last_step = std::max(buf.last_step, step);
      }
      for (int b : plan_.steps[s].inputs) {
        PlanBuffer& root = plan_.buffers[Root(b)];
        root.last_step = std::max(root.last_step, step);
      }
    }
  }

  // Buffers in order of definition; each takes the lowest free range of the
  // arena that fits (first fit), and gives it back after its last use.
  // Free ranges are kept merged, so this is O(n log n) in buffers.
  void PlanMemory() {
    std::vector<int> order;
    for (size_t b = 0; b < plan_.buffers.size(); ++b) {
      const PlanBuffer& buf = plan_.buffers[b];
      if (buf.kind == PlanBuffer::Kind::kArena && buf.first_step >= 0) order.push_back(static_cast<int>(b));
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return plan_.buffers[a].first_step < plan_.buffers[b].first_step; });
    auto size_of = [&](int b) { return std::max<int64_t>(64, (plan_.buffers[b].bytes() + 63) / 64 * 64); };
    std::map<int64_t, int64_t> free_ranges;  // offset → size, merged
    int64_t top = 0;                         // the arena's end
    using Expiry = std::pair<int, int>;      // (last step, buffer)
    std::priority_queue<Expiry, std::vector<Expiry>, std::greater<>> alive;
    auto release = [&](int b) {
      int64_t offset = plan_.buffers[b].offset, size = size_of(b);
      auto next = free_ranges.lower_bound(offset);
      if (next != free_ranges.end() && next->first == offset + size) {
        size += next->second;
        next = free_ranges.erase(next);
      }
      if (next != free_ranges.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
          prev->second += size;
          return;
        }
      }
      free_ranges.emplace(offset, size);
    };
    for (int b : order) {
      PlanBuffer& buf = plan_.buffers[b];
      int64_t size = size_of(b);
      if (__builtin_add_overflow(plan_.buffer_bytes, size, &plan_.buffer_bytes)) {
        plan_.buffer_bytes = std::numeric_limits<int64_t>::max();  // a statistic: saturates
      }
      while (!alive.empty() && alive.top().first < buf.first_step) {
        release(alive.top().second);
        alive.pop();
      }
      auto fit = std::find_if(free_ranges.begin(), free_ranges.end(), [&](const auto& r) { return r.second >= size; });
      if (fit != free_ranges.end()) {
        buf.offset = fit->first;
        int64_t rest = fit->second - size;
        free_ranges.erase(fit);
        if (rest > 0) free_ranges.emplace(buf.offset + size, rest);
      } else {
        // Grow the arena, reusing a free range that ends at the top.
        buf.offset = top;
        if (!free_ranges.empty()) {
          auto last = std::prev(free_ranges.end());
          if (last->first + last->second == top) {
            buf.offset = last->first;
            free_ranges.erase(last);
          }
        }
        top = buf.offset + size;  // both at most kMaxTensorBytes + 64: no wrap
        if (top > kMaxTensorBytes) {
          throw JitFailure("plan: the intermediates need an arena of more than 2^56 bytes");
        }
      }
      alive.push({buf.last_step, b});
    }
    plan_.arena_bytes = top;
  }
};

}  // namespace

Plan Lower(const Func& program, const LowerOptions& options) { return Lowering(options).Run(program); }

int64_t PlanStep::copied_bytes() const {
  int64_t bytes = 0;
  for (const CopyBlock& b : blocks) bytes += b.bytes;
  return bytes;
}

int64_t Plan::copied_bytes() const {
  int64_t bytes = 0;
  for (const PlanStep& step : steps) bytes += step.copied_bytes();
  return bytes;
}

std::pair<int, int64_t> Plan::ViewOf(int buffer) const {
  int64_t offset = 0;
  for (; buffers[buffer].kind == PlanBuffer::Kind::kAlias; buffer = buffers[buffer].alias_of) {
    offset += buffers[buffer].offset;
  }
  return {buffer, offset};
}

std::string Plan::ToString() const {
  auto name = [&](int b) {
    const PlanBuffer& buf = buffers[b];
    return "%" + buf.name + "#" + std::to_string(b);
  };
  auto where = [&](int b) -> std::string {
    const PlanBuffer& buf = buffers[b];
    switch (buf.kind) {
      case PlanBuffer::Kind::kParam: return "param " + std::to_string(buf.param);
      case PlanBuffer::Kind::kConstant: return "constant";
      case PlanBuffer::Kind::kArena: return "arena+" + std::to_string(buf.offset);
      case PlanBuffer::Kind::kResult: return "result " + std::to_string(buf.result);
      case PlanBuffer::Kind::kAlias: return "view of " + name(buf.alias_of);
    }
    return "?";
  };
  std::string out = "# " + std::to_string(steps.size()) + " kernels, arena " + std::to_string(arena_bytes) +
                    " bytes (intermediates side by side: " + std::to_string(buffer_bytes) + " bytes)\n";
  for (size_t i = 0; i < params.size(); ++i) {
    out += "param " + name(params[i]) + ": " + buffers[params[i]].type.ToString() + "\n";
  }
  for (size_t b = 0; b < buffers.size(); ++b) {  // bytes of other buffers, as they lie
    const PlanBuffer& buf = buffers[b];
    if (buf.kind != PlanBuffer::Kind::kAlias) continue;
    out += "view   " + name(static_cast<int>(b)) + " = " + name(buf.alias_of) +
           (buf.offset ? " + " + std::to_string(buf.offset) + " bytes" : "") + "  " + buf.type.ToString() + "\n";
  }
  for (const PlanStep& s : steps) {
    std::string outs;
    for (int b : s.outputs) outs += (outs.empty() ? "" : ", ") + name(b) + " [" + where(b) + "]";
    std::string ins;
    for (int b : s.inputs) ins += (ins.empty() ? "" : ", ") + name(b);
    if (s.kind == PlanStep::Kind::kKernel) {
      out += "kernel " + outs + " = " + s.op->name + "(" + ins + (s.attrs.empty() ? "" : "; " + s.attrs.ToString()) + ")\n";
    } else if (s.kind == PlanStep::Kind::kCopy) {
      out += "copy   " + outs + " = " + s.op->name + "(" + ins + ")  " + std::to_string(s.blocks.size()) + " blocks, " +
             std::to_string(s.copied_bytes()) + " bytes\n";
    } else {
      std::string ops;
      for (const std::string& o : s.fused_ops) ops += (ops.empty() ? "" : ", ") + o;
      out += "fused  " + outs + " = {" + ops + "}(" + ins + ")  " + buffers[s.outputs[0]].type.ToString() + "\n";
    }
  }
  std::string res;
  for (int b : results) res += (res.empty() ? "" : ", ") + name(b);
  return out + "return " + res + "\n";
}

}  // namespace pejit
