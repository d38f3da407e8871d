#include "jit/plan.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "jit/moves.h"
#include "jit/schedule.h"
#include "jit/simplify.h"
#include "jit/straight.h"
#include "ops/packed_gemm.h"

namespace pejit {

namespace {

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
    Straight s = Decompose(program);  // checks; the passes below edit this form
    // The lowering pass list (jit/pass.h), in its order.
    const PassInstrument* shown = options_.instrument;
    auto pass = [&](std::string_view name, Straight (*simplify)(Straight)) {
      if (!shown || !shown->after) {
        s = simplify(std::move(s));
        return;
      }
      RunPass(*shown, name, [&] {  // shown as a program, recomposed only for the instrument
        s = simplify(std::move(s));
        return Recompose(s);
      });
    };
    pass("fold-constants", FoldConstants);
    pass("combine-sums", CombineSums);
    if (options_.pack_gemm && PackedGemmFast()) pass("pack-gemm", PackGemmOperands);
    if (options_.cse) pass("cse", EliminateCommonSubexpressions);
    pass("dce", EliminateDeadCode);

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
    ScheduleStages(plan_);
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
    step.lane = call->loc.lane;
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
      if (step.kind != PlanStep::Kind::kCopy || step.op->moves != MoveKind::kConcat) continue;
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

  // Each buffer's first and last step, widened to whole stages: buffers
  // that share arena bytes then never meet in a stage, whose steps may run
  // at once (jit/schedule.h).
  void Lifetimes() {
    std::vector<int> stage_of(plan_.steps.size());
    for (size_t i = 0; i < plan_.stages.size(); ++i) {
      for (int s = plan_.stages[i].begin; s < plan_.stages[i].end; ++s) stage_of[s] = static_cast<int>(i);
    }
    std::vector<bool> touched(plan_.buffers.size(), false);
    auto touch = [&](int root, int lane) {
      PlanBuffer& buf = plan_.buffers[root];
      if (!touched[root]) {
        touched[root] = true;
        buf.lane = lane;
      } else if (buf.lane != lane) {
        buf.lane = PlanBuffer::kSeveralLanes;
      }
    };
    for (size_t s = 0; s < plan_.steps.size(); ++s) {
      int step = static_cast<int>(s);
      for (int b : plan_.steps[s].outputs) {  // written in place of a concatenation: its root
        PlanBuffer& buf = plan_.buffers[Root(b)];
        touch(Root(b), plan_.steps[s].lane);
        if (buf.first_step < 0) buf.first_step = step;
        buf.last_step = std::max(buf.last_step, step);
      }
      for (int b : plan_.steps[s].inputs) {
        PlanBuffer& root = plan_.buffers[Root(b)];
        touch(Root(b), plan_.steps[s].lane);
        root.last_step = std::max(root.last_step, step);
      }
    }
    for (PlanBuffer& buf : plan_.buffers) {
      if (buf.first_step >= 0) buf.first_step = plan_.stages[stage_of[buf.first_step]].begin;
      if (buf.last_step >= 0) buf.last_step = plan_.stages[stage_of[buf.last_step]].end - 1;
    }
  }

  // Each lane's buffers in a region of the arena of their own (jit/lanes.h),
  // so that bytes one thread writes are never another's in a later step or
  // call, after the buffers of several lanes and those of none. Buffers of
  // several lanes share their bytes with no other buffer: two buffers
  // sharing bytes make the second's writer wait for the first's last reader
  // (jit/schedule.h), which would otherwise put threads running different
  // lanes in step where the program's data does not. Regions start on a page.
  void PlanMemory() {
    std::map<int, std::vector<int>> by_lane;
    for (size_t b = 0; b < plan_.buffers.size(); ++b) {
      const PlanBuffer& buf = plan_.buffers[b];
      if (buf.kind == PlanBuffer::Kind::kArena && buf.first_step >= 0) by_lane[buf.lane].push_back(static_cast<int>(b));
    }
    constexpr int64_t kRegionAlign = 4096;
    int64_t top = 0;
    for (auto& [lane, buffers] : by_lane) {
      const int64_t base = (top + kRegionAlign - 1) / kRegionAlign * kRegionAlign;
      const int64_t size = PlanRegion(buffers, /*reuse=*/lane != PlanBuffer::kSeveralLanes);
      for (int b : buffers) plan_.buffers[b].offset += base;
      top = base + size;
      if (top > kMaxTensorBytes) throw JitFailure("plan: the intermediates need an arena of more than 2^56 bytes");
    }
    plan_.arena_bytes = top;
  }

  // `buffers` in order of definition; each takes the lowest free range of the
  // region that fits (first fit), and gives it back after its last use
  // (with `reuse`; otherwise keeps it). Free ranges are kept merged, so this
  // is O(n log n) in buffers. Returns the region's size.
  int64_t PlanRegion(std::vector<int>& order, bool reuse) {
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return plan_.buffers[a].first_step < plan_.buffers[b].first_step; });
    auto size_of = [&](int b) { return std::max<int64_t>(64, (plan_.buffers[b].bytes() + 63) / 64 * 64); };
    std::map<int64_t, int64_t> free_ranges;  // offset → size, merged
    int64_t top = 0;                         // the region's end
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
        // Grow the region, reusing a free range that ends at the top.
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
      if (reuse) alive.push({buf.last_step, b});
    }
    return top;
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
  size_t stage = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& s = steps[i];
    if (stage < stages.size() && stages[stage].begin == static_cast<int>(i)) {
      const PlanStage& st = stages[stage++];
      int64_t tasks = 0;
      for (int k = st.begin; k < st.end; ++k) tasks += steps[k].parts;
      out += "stage " + std::to_string(stage - 1) + (tasks > 1 ? ": " + std::to_string(tasks) + " tasks" : "") + "\n";
    }
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
    if (s.parts > 1) out.insert(out.size() - 1, "  ×" + std::to_string(s.parts));
    if (s.lane >= 0) out.insert(out.size() - 1, "  lane " + std::to_string(s.lane));
  }
  std::string res;
  for (int b : results) res += (res.empty() ? "" : ", ") + name(b);
  return out + "return " + res + "\n";
}

LoopNest NestOf(const Plan& plan, const PlanStep& step) {
  const Shape& shape = plan.buffers[step.outputs[0]].type.shape;
  LoopNest nest;
  for (size_t i = 0; i < step.nodes.size(); ++i) {
    if (step.nodes[i].kind == FusedNode::Kind::kLoad) nest.loads.push_back(static_cast<int>(i));
  }
  std::vector<Shape> strides;  // of every load, broadcast to the output's shape
  for (int l : nest.loads) {
    const Shape& in = plan.buffers[step.nodes[l].buffer].type.shape;
    bool broadcasts = in.size() <= shape.size();
    for (size_t d = 0; broadcasts && d < in.size(); ++d) {
      const int64_t out_d = shape[shape.size() - in.size() + d];
      broadcasts = in[d] == out_d || in[d] == 1;
    }
    if (!broadcasts) {
      throw JitFailure("a fused step loads " + ShapeToString(in) + " into " + ShapeToString(shape) + ": not a broadcast");
    }
    Shape st(shape.size(), 0), own = RowMajorStrides(in);
    size_t offset = shape.size() - in.size();
    // Broadcast dimensions have stride 0; a size-1 dimension of the output
    // keeps the row-major stride, whatever it is, for the key's sake.
    for (size_t d = 0; d < in.size(); ++d) st[offset + d] = in[d] == 1 && shape[offset + d] != 1 ? 0 : own[d];
    strides.push_back(st);
  }
  nest.load_strides.resize(nest.loads.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1 && d > 0) continue;
    bool merge = nest.dims.size() > 1;  // never into the outermost
    for (size_t k = 0; merge && k < nest.loads.size(); ++k) {
      merge = nest.load_strides[k].back() == strides[k][d] * shape[d];
    }
    if (merge) {
      nest.dims.back() *= shape[d];
      for (size_t k = 0; k < nest.loads.size(); ++k) nest.load_strides[k].back() = strides[k][d];
    } else {
      nest.dims.push_back(shape[d]);
      for (size_t k = 0; k < nest.loads.size(); ++k) nest.load_strides[k].push_back(strides[k][d]);
    }
  }
  if (nest.dims.empty()) {
    nest.dims.push_back(1);
    for (auto& m : nest.load_strides) m.push_back(0);
  }
  return nest;
}

std::string FusedKernelKey(const Plan& plan, const PlanStep& step, const LoopNest& nest) {
  const PlanBuffer& out = plan.buffers[step.outputs[0]];
  std::string key = std::string(DTypeName(out.type.dtype)) + "|" +
                    ShapeToString(Shape(nest.dims.begin() + 1, nest.dims.end())) + "|";
  for (const Shape& st : nest.load_strides) key += ShapeToString(st);
  key += "|";
  for (const FusedNode& n : step.nodes) {
    key += std::to_string(static_cast<int>(n.kind)) + "," + std::to_string(static_cast<int>(n.op)) + "," +
           std::to_string(static_cast<int>(n.dtype)) + ",";
    char imm[96];
    std::snprintf(imm, sizeof imm, "%a,%a,%a", n.immediate, n.param, n.param2);
    key += imm;
    for (int a : n.args) key += "," + std::to_string(a);
    key += ";";
  }
  return key;
}

}  // namespace pejit
