#include "generic/executor.h"

#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>

#include "interp/interpreter.h"
#include "jit/autodiff.h"
#include "jit/batch_rules.h"
#include "jit/compiler.h"
#include "jit/native_executable.h"
#include "jit/straight.h"
#include "jit/plan.h"
#include "jit/simplify.h"
#include "jit/vectorize.h"
#include "jit/vjp.h"
#include "ops/eager.h"
#include "ops/packed_gemm.h"
#include "ir/printer.h"
#include "ir/visitor.h"
#include "support/team.h"

#include <unordered_map>
#include <unordered_set>

namespace pejit::generic {
namespace {

// A segment variant run by the tier-0 interpreter: the baseline code of a
// program lowering refuses.
class InterpretedSegment final : public Executable {
 public:
  explicit InterpretedSegment(Func program) : program_(std::move(program)), result_type_(ResultTypeOf(Decompose(program_).result)) {}

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override {
    std::vector<Value> args(inputs.begin(), inputs.end());
    return TensorLeaves(interpreter_.Apply(empty_, program_, args, "segment"));
  }
  const Type& result_type() const override { return result_type_; }
  size_t code_bytes() const override { return 0; }
  const char* tier() const override { return "generic-interpreter"; }

 private:
  Func program_;
  Type result_type_;
  ModuleSnapshot empty_;
  Interpreter interpreter_;
};

// A segment's programs in grad mode: the vector-Jacobian product of
// `forward` (sum over the f32 outputs of sum(output * cotangent),
// differentiated for the f32 inputs), split in two so that the backward
// program reads the forward intermediates it needs (the residuals, extra
// outputs of the forward program) instead of computing them again.
struct GradPrograms {
  Func forward, backward;  // backward null: nothing to differentiate
  std::vector<int> grad_inputs, grad_outputs;
  int residuals = 0;
  std::vector<SegmentCode::Factor> factors;
  std::vector<SegmentCode::Output> forward_outputs, backward_outputs;
};

// The terms of a shared input's gradient when it is a sum over the run's
// rows, as the GEMM and broadcast rules give a weight's and a bias's:
// products matmul(P, Q, transpose_a=true), and reductions sum_to(G, S) (or
// sum(G, axes=[0])) whose summed axes include the rows; false for anything
// else.
bool RowTerms(const Expr& grad, const std::unordered_map<const ExprNode*, const Expr*>& value_of,
              std::vector<SegmentCode::Factor>& factors, std::vector<Expr>& outputs, int param) {
  auto it = value_of.find(grad.get());
  if (it == value_of.end()) return false;
  const auto* call = As<OpCallNode>(*it->second);
  if (!call) return false;
  const std::string& op = call->op->name;
  if (op == "add") {
    return TensorTypeOf(call->args[0]) == TensorTypeOf(call->args[1]) &&
           RowTerms(call->args[0], value_of, factors, outputs, param) &&
           RowTerms(call->args[1], value_of, factors, outputs, param);
  }
  if (op == "matmul" && call->attrs.GetBool("transpose_a") && !call->attrs.GetBool("transpose_b") &&
      TensorTypeOf(call->args[0]).rank() == 2) {
    factors.push_back({param, SegmentCode::Factor::Kind::kProduct, {}});
    outputs.push_back(call->args[0]);
    outputs.push_back(call->args[1]);
    return true;
  }
  const TensorType g = TensorTypeOf(call->args[0]);
  Shape target;
  if (op == "sum_to") {
    target = call->attrs.GetInts("shape");
    bool rows_summed = target.size() < g.shape.size() || (!target.empty() && target[0] == 1);
    if (!rows_summed || g.dtype != DType::kF32) return false;
  } else if (op == "sum" && call->attrs.GetInts("axes") == std::vector<int64_t>{0} && !call->attrs.GetBool("keepdims") &&
             g.dtype == DType::kF32) {
    target.assign(g.shape.begin() + 1, g.shape.end());
  } else {
    return false;
  }
  factors.push_back({param, SegmentCode::Factor::Kind::kRowSum, target});
  outputs.push_back(call->args[0]);
  return true;
}

// Makes `s` return the values `logical` names, each once and none that is
// a parameter, looking through reshapes: a result that is an input, a
// repeat or a reshape of either would be copied into a fresh tensor, where
// the executor can take it from where it is. Returns where each of
// `logical` is then found.
std::vector<SegmentCode::Output> ReturnByReference(Straight& s, const std::vector<Expr>& logical) {
  std::unordered_map<const ExprNode*, const Expr*> value_of;
  for (const Binding& b : s.bindings) value_of[b.var.get()] = &b.value;
  std::unordered_map<const ExprNode*, int> param_index, result_index;
  for (size_t p = 0; p < s.params.size(); ++p) param_index[s.params[p].get()] = static_cast<int>(p);
  std::vector<Expr> results;
  std::vector<SegmentCode::Output> outputs;
  for (const Expr& e : logical) {
    Expr root = e;
    for (auto it = value_of.find(root.get()); it != value_of.end(); it = value_of.find(root.get())) {
      const auto* call = As<OpCallNode>(*it->second);
      if (!call || call->op->name != "reshape") break;
      root = call->args[0];
    }
    SegmentCode::Output out;
    out.shape = TensorTypeOf(e).shape;
    if (auto p = param_index.find(root.get()); p != param_index.end()) {
      out.from_input = true;
      out.index = p->second;
    } else {
      auto [r, fresh] = result_index.emplace(root.get(), static_cast<int>(results.size()));
      if (fresh) results.push_back(root);
      out.index = r->second;
    }
    outputs.push_back(std::move(out));
  }
  // A program returns something: the first value, copied, which no output
  // reads (RunProgram does not run such a program).
  if (results.empty() && !logical.empty()) results.push_back(logical[0]);
  s.result = MakeTuple(std::move(results));
  return outputs;
}

// The logical outputs of a program run on `inputs` that returned `results`.
std::vector<Tensor> LogicalOutputs(const std::vector<SegmentCode::Output>& outputs, std::span<const Tensor> inputs,
                                   std::vector<Tensor> results) {
  std::vector<Tensor> out;
  out.reserve(outputs.size());
  for (const SegmentCode::Output& o : outputs) {
    const Tensor& t = o.from_input ? inputs[o.index] : results.at(o.index);
    out.push_back(t.shape() == o.shape ? t : t.Reshaped(o.shape));
  }
  return out;
}

// The logical outputs of `code` (a variant's program, whose outputs are
// `outputs`) on `inputs`, `run_inputs` what it takes (with packed weights
// appended). A program all of whose outputs are inputs (the gradient of a
// sum is the cotangent as it came) is not run.
std::vector<Tensor> RunProgram(const Executable& code, const std::vector<SegmentCode::Output>& outputs,
                               std::span<const Tensor> inputs, std::span<const Tensor> run_inputs) {
  if (std::all_of(outputs.begin(), outputs.end(), [](const SegmentCode::Output& o) { return o.from_input; })) {
    return LogicalOutputs(outputs, inputs, {});
  }
  return LogicalOutputs(outputs, inputs, RunSizedToTeam(code, run_inputs));
}

GradPrograms MakeGradPrograms(const Func& vectorized, const std::vector<bool>& shared, const std::vector<bool>& data) {
  GradPrograms g;
  Straight f = Decompose(vectorized);
  for (const Var& p : f.params) {
    if (TensorTypeOf(p).dtype == DType::kF64) throw Refusal("generic: gradients through f64 tensors are not served");
  }
  const auto* outputs = As<TupleNode>(f.result);
  for (const Expr& o : outputs->fields) {
    if (TensorTypeOf(o).dtype == DType::kF64) throw Refusal("generic: gradients through f64 tensors are not served");
  }
  std::optional<SplitVjp> split = MakeSplitVjp(f, data);
  if (!split) {  // nothing to differentiate: the forward alone
    Straight plain = f;
    g.forward_outputs = ReturnByReference(plain, outputs->fields);
    g.forward = Recompose(plain);
    return g;
  }
  g.grad_inputs = split->grad_inputs;
  g.grad_outputs = split->grad_outputs;
  g.residuals = split->residuals;
  Straight& fwd = split->forward;
  // The VJP's seeds are each cotangent times a broadcast 1: folded first, a
  // gradient that is a cotangent as it came (a sum's, a copy's) is seen to be
  // an input, returned by reference instead of copied by the program.
  split->backward = FoldConstants(std::move(split->backward));
  Straight& bwd = split->backward;
  g.forward_outputs = ReturnByReference(fwd, As<TupleNode>(fwd.result)->fields);

  // A shared input's gradient (a weight's) is a sum over the run's rows;
  // summed over every run of a call it is one product over all their rows.
  // So the backward returns the row factors, and the executor multiplies
  // them once per call (jit/plan.h's CombineSums, across runs).
  std::unordered_map<const ExprNode*, const Expr*> value_of;
  for (const Binding& b : bwd.bindings) value_of[b.var.get()] = &b.value;
  const auto* grads = As<TupleNode>(bwd.result);
  // The VJP's own value (fields[0], the sum) is not needed: dropped, its
  // reductions die with it.
  std::vector<Expr> kept, factor_results;
  std::vector<int> kept_inputs;
  for (size_t k = 0; k < g.grad_inputs.size(); ++k) {
    int p = g.grad_inputs[k];
    std::vector<SegmentCode::Factor> factors;
    std::vector<Expr> outputs;
    if (p < static_cast<int>(shared.size()) && shared[p] && RowTerms(grads->fields[1 + k], value_of, factors, outputs, p)) {
      g.factors.insert(g.factors.end(), factors.begin(), factors.end());
      factor_results.insert(factor_results.end(), outputs.begin(), outputs.end());
    } else {
      kept.push_back(grads->fields[1 + k]);
      kept_inputs.push_back(p);
    }
  }
  g.grad_inputs = std::move(kept_inputs);
  kept.insert(kept.end(), factor_results.begin(), factor_results.end());
  g.backward_outputs = ReturnByReference(bwd, kept);
  g.forward = Recompose(fwd);
  g.backward = EliminateDeadCode(Recompose(bwd));
  return g;
}

// Products of a segment program against a shared f32 matrix (a weight)
// read it packed for ops/packed_gemm.h's micro-kernel, from a parameter
// appended for it: the executor packs each weight once per call for every
// run that reads it, where a program of its own would repack it per run.
Func PackSharedWeights(const Func& program, const std::vector<bool>& shared, std::vector<SegmentCode::Pack>& packs) {
  if (!PackedGemmFast()) return program;
  Straight s = Decompose(program);
  std::map<const ExprNode*, int> param_index;
  for (size_t p = 0; p < shared.size() && p < s.params.size(); ++p) {
    if (shared[p]) param_index[s.params[p].get()] = static_cast<int>(p);
  }
  std::map<std::pair<int, bool>, Var> packed;
  for (Binding& b : s.bindings) {
    auto* call = As<OpCallNode>(b.value);
    std::optional<bool> transpose_b = call ? PackableProduct(*call) : std::nullopt;
    if (!transpose_b) continue;
    auto it = param_index.find(call->args[1].get());
    if (it == param_index.end()) continue;
    Var& p = packed[{it->second, *transpose_b}];
    if (!p) {
      TensorType w = TensorTypeOf(call->args[1]);
      int64_t k = *transpose_b ? w.shape[1] : w.shape[0], n = *transpose_b ? w.shape[0] : w.shape[1];
      p = MakeVar("packed" + std::to_string(packs.size()), TensorTy(DType::kF32, PackedShape(k, n)));
      packs.push_back({it->second, *transpose_b});
      s.params.push_back(p);
    }
    b.value = PackedProduct(*call, p, TensorTypeOf(b.var));
  }
  return Recompose(s);
}

// dst[c * ld + r] = src[r * cols + c]: 4x4 blocks through SSE registers
// (every x86-64 has them), the edges one by one.
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst, int64_t ld) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4) {
      __m128 a = _mm_loadu_ps(src + r * cols + c), b = _mm_loadu_ps(src + (r + 1) * cols + c);
      __m128 x = _mm_loadu_ps(src + (r + 2) * cols + c), y = _mm_loadu_ps(src + (r + 3) * cols + c);
      _MM_TRANSPOSE4_PS(a, b, x, y);
      _mm_storeu_ps(dst + c * ld + r, a);
      _mm_storeu_ps(dst + (c + 1) * ld + r, b);
      _mm_storeu_ps(dst + (c + 2) * ld + r, x);
      _mm_storeu_ps(dst + (c + 3) * ld + r, y);
    }
    for (; c < cols; ++c) {
      for (int64_t k = 0; k < 4; ++k) dst[c * ld + r + k] = src[(r + k) * cols + c];
    }
  }
  for (; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * ld + r] = src[r * cols + c];
  }
}

int64_t RowBytes(const TensorType& t) { return NumElements(t.shape) * static_cast<int64_t>(SizeOf(t.dtype)); }

int CountRoots(const Value& v) {
  if (v.is_tensor()) return 1;
  if (v.kind() != Value::Kind::kTuple) return 0;
  int n = 0;
  for (const Value& f : v.fields()) n += CountRoots(f);
  return n;
}

}  // namespace

bool HoldsStructure(const Value& arg) {
  bool structure = false;
  ForEachNode(arg, [&](const Value& v) { structure |= v.kind() == Value::Kind::kAdt; });
  return structure;
}

std::vector<Value> ArgumentGrads(const std::vector<Value>& args, const std::vector<int>& wrt,
                                 const std::vector<Tensor>& root_grads) {
  for (int i : wrt) {
    if (HoldsStructure(args.at(i))) throw Refusal("generic: a gradient with respect to a structure argument");
  }
  // The wrt arguments alone (the others hold the structures, which are not
  // walked again): an argument without structures has its roots for
  // leaves, in the same order.
  std::vector<Value> wrt_args;
  std::vector<size_t> first_root;
  for (int i : wrt) {
    size_t root = 0;
    for (int a = 0; a < i; ++a) root += CountRoots(args[a]);
    wrt_args.push_back(args[i]);
    first_root.push_back(root);
  }
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(wrt_args, {}, &first);
  std::vector<Tensor> leaf_grads(leaves.size());
  for (size_t a = 0; a < wrt_args.size(); ++a) {
    const size_t end = a + 1 < first.size() ? first[a + 1] : leaves.size();
    for (size_t j = first[a]; j < end; ++j) leaf_grads[j] = root_grads.at(first_root[a] + (j - first[a]));
  }
  std::vector<int> local(wrt_args.size());
  for (size_t k = 0; k < local.size(); ++k) local[k] = static_cast<int>(k);
  return GradsFromLeaves(wrt_args, local, leaves, first, leaf_grads);
}

ValueAndGrad CallResult(const std::vector<Value>& args, const std::vector<int>* wrt, Execution& run) {
  ValueAndGrad out;
  out.value = std::move(run.value);
  if (wrt) out.grads = ArgumentGrads(args, *wrt, run.root_grads);
  return out;
}

namespace {

// The native variant that runs the next `left` rows of a value-mode run: the
// smallest that takes them all padding at most a third, else the largest
// that fits in them, else the smallest that pads at most 8x (padded rows of
// native code are cheaper than the interpreter's: 125 rows of the
// Tree-LSTM's leaf segment take 1 ms interpreted, 256 rows 0.1 ms native);
// null when none does.
SegmentCode::Variant* NativePiece(const std::vector<std::pair<int64_t, SegmentCode::Variant*>>& native, int64_t left) {
  SegmentCode::Variant* pick = nullptr;
  auto smallest = [&](auto fits) {
    for (const auto& [rows, v] : native) {
      if (fits(rows) && (!pick || rows < pick->rows)) pick = v;
    }
  };
  smallest([&](int64_t rows) { return rows >= left && rows * 3 <= left * 4; });
  if (pick) return pick;
  for (const auto& [rows, v] : native) {
    if (rows <= left && (!pick || rows > pick->rows)) pick = v;
  }
  if (pick) return pick;
  smallest([&](int64_t rows) { return rows <= 8 * left; });
  return pick;
}

// A variant's programs, made from the segment program (immutable once
// interned: read without the lock).
struct Programs {
  Func forward, backward;
  std::vector<SegmentCode::Pack> forward_packs, backward_packs;
  std::vector<int> grad_inputs, grad_outputs;
  int residuals = 0;
  std::vector<SegmentCode::Factor> factors;
  std::vector<SegmentCode::Output> forward_outputs, backward_outputs;
};

Programs MakePrograms(const SegmentCode& code, int64_t rows, bool grad, const std::vector<PadTo>& pads) {
  Programs p;
  // The segment pass list (jit/pass.h), in its order.
  const PassInstrument& shown = *code.instrument;
  Func program = code.program;
  std::vector<bool> shared = code.shared, data = code.data;
  if (!pads.empty()) {  // the masks it appends are data
    program = RunPass(shown, "pad", [&] { return PadSegment(code.program, pads).program; });
    for (const PadTo& pad : pads) {
      if (!pad.masked) continue;
      shared.push_back(false);
      data.push_back(true);
    }
  }
  std::vector<bool> stacked;
  for (bool s : shared) stacked.push_back(!s);
  Func vectorized = RunPass(shown, "vectorize", [&] { return Vectorize(program, stacked, rows); });
  auto pack = [&](const Func& program, std::vector<SegmentCode::Pack>& packs) {
    return RunPass(shown, "pack-shared-weights", [&] { return PackSharedWeights(program, shared, packs); });
  };
  if (grad) {
    GradPrograms g = RunPass(
        shown, "vjp", [&] { return MakeGradPrograms(vectorized, shared, data); },
        [](const GradPrograms& g) {
          return PrintFunction("forward", g.forward) + (g.backward ? "\n" + PrintFunction("backward", g.backward) : "");
        });
    p.forward = pack(g.forward, p.forward_packs);
    if (g.backward) p.backward = pack(g.backward, p.backward_packs);
    p.grad_inputs = std::move(g.grad_inputs);
    p.grad_outputs = std::move(g.grad_outputs);
    p.residuals = g.residuals;
    p.factors = std::move(g.factors);
    p.forward_outputs = std::move(g.forward_outputs);
    p.backward_outputs = std::move(g.backward_outputs);
  } else {
    Straight f = Decompose(vectorized);
    p.forward_outputs = ReturnByReference(f, As<TupleNode>(f.result)->fields);
    p.forward = pack(Recompose(f), p.forward_packs);
  }
  return p;
}

// A variant program's baseline code: a plan of registered kernels, made in
// the time lowering takes; the interpreter's where lowering refuses it.
ExecutablePtr BaselineCode(const Func& program) {
  if (!program) return nullptr;
  try {
    return LowerToKernelPlan(program);
  } catch (const JitFailure&) {
    return std::make_shared<InterpretedSegment>(program);
  }
}

// What a variant's native code is compiled with: one variant's code serves
// every minibatch of its row bucket, worth the optimizing code generator
// once it has code that runs natively.
CompileOptions VariantOptions(const CompileOptions& options, CodeGen codegen = CodeGen::kOptimized) {
  CompileOptions o = options;
  o.optimize_machine_code = codegen == CodeGen::kOptimized;
  // Quick code's IR gets the loop pipeline only (jit/compiler.h): the same
  // kernels' speed at about half LLVM's time.
  if (codegen == CodeGen::kQuick) o.opt_level = std::min(o.opt_level, 1);
  return o;
}

// Whether every program of `v` runs native code, readable without the lock.
void PublishNative(SegmentCode::Variant& v) { v.native.store(v.forward_native && (!v.backward || v.backward_native)); }

// Publishes `p` as `v`'s programs, with the code given for each, unless
// another thread made them meanwhile (MakePrograms is deterministic: code
// made for its programs runs theirs). Under the segment's lock. Whether it
// published.
bool Publish(SegmentCode::Variant& v, Programs&& p, ExecutablePtr forward_code, ExecutablePtr backward_code) {
  if (v.made) return false;
  v.forward = std::move(p.forward);
  v.backward = std::move(p.backward);
  v.forward_packs = std::move(p.forward_packs);
  v.backward_packs = std::move(p.backward_packs);
  v.grad_inputs = std::move(p.grad_inputs);
  v.grad_outputs = std::move(p.grad_outputs);
  v.residuals = p.residuals;
  v.factors = std::move(p.factors);
  v.forward_outputs = std::move(p.forward_outputs);
  v.backward_outputs = std::move(p.backward_outputs);
  v.forward_code = std::make_shared<TieredExecutable>(std::move(forward_code));
  if (backward_code) v.backward_code = std::make_shared<TieredExecutable>(std::move(backward_code));
  v.made = true;
  return true;
}

// Makes `v`'s programs and their code if they are not: native code a
// store kept (`kept`'s load_kept: a warm persistent cache, loaded in about
// the time baseline code takes to make), else baseline code. Built without
// the lock (other runs of the segment go on meanwhile), published under it,
// all or nothing.
void Make(SegmentCode& code, SegmentCode::Variant& v, const ExecuteOptions* kept) {
  {
    std::lock_guard lock(code.mu);
    if (v.made) return;
  }
  Programs p = MakePrograms(code, v.rows, v.grad, v.pads);
  ExecutablePtr forward_native, backward_native;
  if (kept && kept->load_kept && p.forward) {
    const CompileOptions options = VariantOptions(kept->compile_options);
    forward_native = kept->load_kept->Kept(p.forward, options);
    if (forward_native && p.backward) backward_native = kept->load_kept->Kept(p.backward, options);
  }
  ExecutablePtr forward_code = forward_native ? forward_native : BaselineCode(p.forward);
  ExecutablePtr backward_code = backward_native ? backward_native : BaselineCode(p.backward);
  std::lock_guard lock(code.mu);
  if (!Publish(v, std::move(p), std::move(forward_code), std::move(backward_code))) return;
  for (const ExecutablePtr& native : {forward_native, backward_native}) {
    if (native) v.code_bytes.fetch_add(native->code_bytes());
  }
  v.forward_native = forward_native != nullptr;
  v.backward_native = backward_native != nullptr;
  v.optimized = v.forward_native;  // what the store kept is optimized code
  PublishNative(v);
}

}  // namespace

SegmentCode::Variant& VariantEntry(SegmentCode& code, int64_t rows, bool grad, const std::vector<PadTo>& pads) {
  std::lock_guard lock(code.mu);
  auto& slot = code.variants[{PadKey(pads), rows * 2 + (grad ? 1 : 0)}];
  if (!slot) {
    slot = std::make_unique<SegmentCode::Variant>();
    slot->rows = rows;
    slot->grad = grad;
    slot->pads = pads;
  }
  return *slot;
}

SegmentCode::Variant& VariantFor(SegmentCode& code, int64_t rows, bool grad, const std::vector<PadTo>& pads,
                                 const ExecuteOptions* kept) {
  SegmentCode::Variant& v = VariantEntry(code, rows, grad, pads);
  Make(code, v, kept);
  return v;
}

CodeGen CompileVariant(JitSession& jit, SegmentCode& code, SegmentCode::Variant& variant, const CompileOptions& options,
                       CodeGen codegen) {
  // A variant no run has made yet is made here without its baseline code:
  // native code is about to replace it.
  std::optional<Programs> fresh;
  Func forward, backward;
  bool made, bare;  // bare: no native code yet
  {
    std::lock_guard lock(code.mu);
    made = variant.made;
    bare = !variant.forward_native && !variant.backward_native;
    if (made) {
      // Quick code is replaced by optimized code; optimized code stays.
      const bool replace = codegen == CodeGen::kOptimized && !variant.optimized;
      if (!variant.forward_native || replace) forward = variant.forward;
      if (variant.backward && (!variant.backward_native || replace)) backward = variant.backward;
    }
  }
  if (!made) {
    fresh = MakePrograms(code, variant.rows, variant.grad, variant.pads);
    forward = fresh->forward;
    backward = fresh->backward;
  }
  // Optimized code an earlier run kept (a warm store) serves at once.
  // Quick code is never kept: the optimizing compile that follows it is.
  ExecutablePtr forward_exe, backward_exe;
  if (options.store && bare) {
    const CompileOptions optimized = VariantOptions(options, CodeGen::kOptimized);
    ExecutablePtr kept_forward = forward ? jit.Kept(forward, optimized) : nullptr;
    ExecutablePtr kept_backward = backward && (kept_forward || !forward) ? jit.Kept(backward, optimized) : nullptr;
    if ((kept_forward || !forward) && (kept_backward || !backward)) {
      forward_exe = std::move(kept_forward);
      backward_exe = std::move(kept_backward);
      codegen = CodeGen::kOptimized;
    }
  }
  CompileOptions shared = VariantOptions(options, codegen);
  if (codegen == CodeGen::kQuick) shared.store = nullptr;
  auto make = [&](const Func& program) {
    if (!program) return ExecutablePtr();
    return jit.Compile(program, shared);
  };
  try {
    if (!forward_exe && !backward_exe) {
      forward_exe = make(forward);
      backward_exe = make(backward);
    }
  } catch (...) {
    if (fresh) Make(code, variant, nullptr);  // runnable meanwhile: the variant gets its baseline code
    throw;
  }
  const bool compiled = forward_exe || backward_exe;
  std::lock_guard lock(code.mu);
  if (fresh) Publish(variant, std::move(*fresh), forward_exe, backward_exe);
  // The native code replaced (quick code) leaves the count.
  auto replace = [&](TieredExecutable& tiered, bool& native, ExecutablePtr exe) {
    if (native) variant.code_bytes.fetch_sub(tiered.current()->code_bytes());
    variant.code_bytes.fetch_add(exe->code_bytes());
    tiered.Replace(std::move(exe));
    native = true;
  };
  if (forward_exe) replace(*variant.forward_code, variant.forward_native, std::move(forward_exe));
  if (backward_exe) replace(*variant.backward_code, variant.backward_native, std::move(backward_exe));
  if (compiled) variant.optimized = codegen == CodeGen::kOptimized;
  PublishNative(variant);
  variant.queued.store(false);  // a backward program made later can be compiled again
  return variant.optimized ? CodeGen::kOptimized : CodeGen::kQuick;
}

namespace {

// The entry tensor shared input `p` of `run`'s program reads.
int SharedRoot(const Run& run, int p) { return (*run.shared_roots)[run.code->input_slot[p]]; }

// target += src; the first term is copied (no zero-fill and no add: a
// gradient most runs reach once, as an embedding table's from the leaves').
void AddInto(Tensor& target, const TensorType& type, const float* src) {
  if (!target.defined()) {
    target = Tensor::Empty(type.dtype, type.shape);
    std::memcpy(target.raw_data(), src, target.nbytes());
    return;
  }
  float* dst = target.data<float>();
  for (int64_t i = 0; i < target.numel(); ++i) dst[i] += src[i];
}

// A variant of `code` that runs `rows` rows now in place of their own
// bucket's: of those that pad the run to at most 2 rows + 8, the smallest
// with native code, else the smallest made; null when none is. Padded rows
// are copies of a real row with zero cotangents: they change no result.
SegmentCode::Variant* StandIn(SegmentCode& code, int64_t rows, bool grad, const std::vector<PadTo>& pads) {
  const int64_t most = 2 * rows + 8;
  SegmentCode::Variant* made = nullptr;
  std::lock_guard lock(code.mu);
  const std::vector<int64_t> key = PadKey(pads);
  for (auto it = code.variants.lower_bound({key, rows * 2});
       it != code.variants.end() && it->first.first == key && it->second->rows <= most; ++it) {
    SegmentCode::Variant& v = *it->second;
    if (v.grad != grad) continue;
    if (v.native.load()) return &v;
    if (!made && v.made) made = &v;
  }
  return made;
}

// One call of Execute: the runs forward, the result, and in grad mode the
// runs backward and the shared weights' gradients, each a method over the
// call's state.
class CallRun {
 public:
  CallRun(const Inspection& inspection, const ExecuteOptions& options)
      : inspection_(inspection),
        options_(options),
        n_runs_(inspection.runs.size()),
        outputs_(n_runs_),
        inputs_(n_runs_),
        refs_(n_runs_),
        variants_(n_runs_),
        out_types_(n_runs_),
        lengths_(n_runs_),
        lanes_(static_cast<size_t>(std::max(inspection.lanes, 1))) {
    if (!inspection.si_guard.empty()) {  // rows move as branches' runs pack the instances that take them
      rows_ = inspection.si_row;
      active_.resize(n_runs_);
      guard_state_ = std::make_unique<std::atomic<int8_t>[]>(inspection.guards.size());
    }
    if (inspection.lanes > 1) pieces_.resize(n_runs_);  // not resized while lanes run
  }

  Execution Run() {
    RunForward();
    if (!options_.grad) return std::move(result_);
    RunBackward(nullptr);
    return std::move(result_);
  }

  // The forward runs, and the result's value: what Run does first, and
  // what a pullback's forward does (in grad mode, keeping the backward's
  // inputs).
  void RunForward() {
    ForEachRun(false, [&](size_t r) { Forward(r); });
    for (LaneSums& lane : lanes_) {
      result_.native_runs += std::exchange(lane.native_runs, 0);
      result_.baseline_runs += std::exchange(lane.baseline_runs, 0);
      result_.skipped_rows += std::exchange(lane.skipped_rows, 0);
    }
    result_.value = ResultValue();
  }

  // The backward runs seeded with `cotangents` (one per tensor leaf of the
  // result; undefined: none), or with 1 at a scalar loss when null; then
  // the weights' gradients. Fills Execution::root_grads.
  void RunBackward(const std::vector<Tensor>* cotangents) {
    Backward(cotangents);
    MergeLanes();
    SumProducts();
    SumRows();
  }

  Execution& result() { return result_; }

 private:
  // Where a member's per-row input came from (Gather): a row of an earlier
  // run's output, or (source.run -1) the place itself.
  struct RowRef {
    RowSource source;
    const Place* place = nullptr;
  };

  // A run's (or piece's) two factors of a weight's gradient product, `rows` rows each.
  struct RowFactor {
    Tensor lhs, rhs;
    int64_t rows;
  };

  // What a lane's runs add up: a lane's runs go one after another (on
  // whichever thread), so its sums have one writer at a time; MergeLanes
  // adds them up in lane order, so that the bits depend on the lanes alone.
  struct LaneSums {
    std::vector<Tensor> root_grads;
    std::map<int, std::vector<RowFactor>> row_factors;              // per entry tensor: its gradient's products
    std::map<std::pair<int, Shape>, std::vector<Tensor>> row_sums;  // per entry tensor and shape: its reductions
    int native_runs = 0, baseline_runs = 0;
    int64_t skipped_rows = 0;
  };

  // body(r) for every run r: forward in increasing r, backward in
  // decreasing r. With lanes (Inspection::lanes) and a team of more than
  // one thread, lane l's runs are thread l's (modulo the team), each after
  // its lane's run before it and the runs of other lanes it needs: forward,
  // those it reads; backward, those reading it, and the readers of the
  // same runs it adds cotangents into that come before it (two lanes never
  // add into one run at once, and add in the order one thread would). The
  // runs' own code then runs alone on its thread (no nested team).
  void ForEachRun(bool backward, const std::function<void(size_t)>& body) {
    Team* team = Team::Current();
    const int lanes = inspection_.lanes;
    const int64_t n = static_cast<int64_t>(n_runs_);
    auto run_of = [&](int64_t t) { return static_cast<size_t>(backward ? n - 1 - t : t); };
    if (lanes <= 1 || !team || team->max_threads() <= 1 || n == 0) {
      for (int64_t t = 0; t < n; ++t) body(run_of(t));
      return;
    }
    const std::vector<int>& pred_begin = inspection_.run_pred_begin;
    const std::vector<int>& preds = inspection_.run_preds;
    auto lane = [&](int64_t r) { return inspection_.runs[static_cast<size_t>(r)].lane; };
    // Per task: its lane's task before it, and the tasks of other lanes it waits for.
    std::vector<int64_t> before(n, -1), last(lanes, -1);
    std::vector<std::vector<int64_t>> waits(n);
    auto task_of = [&](int64_t r) { return backward ? n - 1 - r : r; };
    if (!backward) {
      for (int64_t r = 0; r < n; ++r) {
        for (int k = pred_begin[r]; k < pred_begin[r + 1]; ++k) {
          if (lane(preds[k]) != lane(r)) waits[r].push_back(preds[k]);
        }
      }
    } else {
      std::vector<std::vector<int>> readers(n);  // ascending
      for (int64_t r = 0; r < n; ++r) {
        for (int k = pred_begin[r]; k < pred_begin[r + 1]; ++k) readers[preds[k]].push_back(static_cast<int>(r));
      }
      for (int64_t p = 0; p < n; ++p) {
        const std::vector<int>& rs = readers[p];
        for (size_t j = 0; j < rs.size(); ++j) {
          if (lane(rs[j]) != lane(p)) waits[task_of(p)].push_back(task_of(rs[j]));
          if (j + 1 < rs.size() && lane(rs[j]) != lane(rs[j + 1])) waits[task_of(rs[j])].push_back(task_of(rs[j + 1]));
        }
      }
    }
    std::vector<int64_t> thread(n);
    for (int64_t t = 0; t < n; ++t) {
      const int l = lane(static_cast<int64_t>(run_of(t)));
      before[t] = last[l];
      last[l] = t;
      thread[t] = l % team->max_threads();
    }
    const ByKey by_thread = OrderByKey(thread, static_cast<size_t>(team->max_threads()));
    auto done = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(n));
    std::atomic<bool> failed{false};
    auto finished = [&](int64_t t) { return t < 0 || done[t].load(std::memory_order_acquire) != 0; };
    team->Run(by_thread.end, by_thread.order.data(),
              [&](int64_t t) {
                struct MarkDone {  // also after a throw: tasks waiting on it run (and return)
                  std::atomic<uint8_t>& flag;
                  ~MarkDone() { flag.store(1, std::memory_order_release); }
                } mark{done[t]};
                if (failed.load(std::memory_order_acquire)) return;
                try {
                  ScopedTeam alone(nullptr);
                  body(run_of(t));
                } catch (...) {
                  failed.store(true, std::memory_order_release);
                  throw;
                }
              },
              [&](int64_t t) {
                if (!finished(before[t])) return false;
                return std::all_of(waits[t].begin(), waits[t].end(), finished);
              });
  }

  // The lanes' sums, in lane order, into the call's: its entry tensors'
  // gradients so far, and the row factors and sums SumProducts and SumRows
  // multiply and reduce.
  void MergeLanes() {
    for (LaneSums& lane : lanes_) {
      for (size_t root = 0; root < lane.root_grads.size(); ++root) {
        Tensor& grad = lane.root_grads[root];
        if (!grad.defined()) continue;
        if (!result_.root_grads[root].defined()) {
          result_.root_grads[root] = std::move(grad);
        } else {
          AddInto(result_.root_grads[root], inspection_.roots[root].type(), grad.data<float>());
        }
      }
      for (auto& [root, factors] : lane.row_factors) {
        std::vector<RowFactor>& all = row_factors_[root];
        all.insert(all.end(), std::make_move_iterator(factors.begin()), std::make_move_iterator(factors.end()));
      }
      for (auto& [key, terms] : lane.row_sums) {
        std::vector<Tensor>& all = row_sums_[key];
        all.insert(all.end(), std::make_move_iterator(terms.begin()), std::make_move_iterator(terms.end()));
      }
      lane = LaneSums();
    }
  }

  // Weights packed for the micro-kernel, once per call: (entry tensor, transpose_b).
  void AppendPacks(const generic::Run& run, const std::vector<SegmentCode::Pack>& packs, std::vector<Tensor>& in) {
    std::lock_guard lock(mu_);  // lanes pack a weight once, whichever comes first
    for (const SegmentCode::Pack& pack : packs) {
      const int root = SharedRoot(run, pack.param);
      Tensor& t = packed_[{root, pack.transpose_b}];
      if (!t.defined()) t = CallOp("gemm_pack", {inspection_.roots.at(root)}, {{"transpose_b", pack.transpose_b}});
      in.push_back(t);
    }
  }

  // The row segment instance `si` has in its run's outputs.
  int RowIndex(int si) const {
    const int row = rows_.empty() ? inspection_.si_row[si] : rows_[si];
    if (row < 0) throw std::logic_error("generic: a value read from a branch not taken");
    return row;
  }

  // A bool scalar's value (an `if`'s condition).
  bool Truth(const Place& place) const {
    bool truth = false;
    CopyPlace(place, sizeof(bool), reinterpret_cast<char*>(&truth));
    return truth;
  }

  // The slot a select reads through: the branch its condition took.
  const Place& Chosen(const Place& place) const {
    const Place* p = &place;
    while (p->kind == Place::Kind::kSelect) {
      const SelectPlace& s = inspection_.selects[p->index];
      p = Truth(s.cond) ? &s.then : &s.otherwise;
    }
    if (p->kind == Place::Kind::kFrontier) throw Deeper(inspection_.frontiers[p->index]);
    return *p;
  }

  // Whether guard `g` holds (-1: none): its parent's first, whose branch
  // computes its condition.
  bool Holds(int g) {
    if (g < 0) return true;
    // Two lanes may read one guard (a cut inside an example): both find the same.
    int8_t state = guard_state_[g].load(std::memory_order_relaxed);
    if (state == 0) {
      const GuardPlace& guard = inspection_.guards[g];
      state = Holds(guard.parent) && Truth(guard.cond) == guard.when ? 1 : 2;
      guard_state_[g].store(state, std::memory_order_relaxed);
    }
    return state == 1;
  }

  // The members of run `r` that run: all of them, or those of a branch's
  // run whose guards held (Forward packs them; a run none of whose
  // instances holds is skipped, and asked for no members).
  std::span<const int> Members(size_t r) const {
    if (active_.empty() || active_[r].empty()) return inspection_.runs[r].members;
    return active_[r];
  }

  // Packs the members of run `r` whose guards hold into its first rows;
  // false when it has a guarded member and none holds (the run is skipped).
  bool PackGuarded(size_t r) {
    const generic::Run& run = inspection_.runs[r];
    if (active_.empty() || std::all_of(run.members.begin(), run.members.end(),
                                       [&](int si) { return inspection_.si_guard[si] < 0; })) {
      return true;
    }
    std::vector<int>& active = active_[r];
    for (int si : run.members) {
      if (Holds(inspection_.si_guard[si])) {
        rows_[si] = static_cast<int>(active.size());
        active.push_back(si);
      } else {
        rows_[si] = -1;
        ++lanes_[run.lane].skipped_rows;
      }
    }
    return !active.empty();
  }

  const char* RowOf(const Place& slot, int64_t bytes) const {
    const Place& place = Chosen(slot);
    const Tensor* t = nullptr;
    switch (place.kind) {
      case Place::Kind::kRoot: t = &inspection_.roots[place.index]; break;
      case Place::Kind::kStruct:
      case Place::Kind::kConstant: t = place.tensor; break;
      case Place::Kind::kRow: {
        const int row = RowIndex(place.index);  // first: a skipped run has no outputs
        const int r = inspection_.si_run[place.index];
        const Tensor& out = outputs_[r][place.output];
        return static_cast<const char*>(out.raw_data()) + row * RowStride(r, place.output, bytes);
      }
      case Place::Kind::kMoved: throw std::logic_error("generic: a moved place read as one row");
      case Place::Kind::kSelect:
      case Place::Kind::kFrontier: break;  // Chosen resolved it, or threw
    }
    if (static_cast<int64_t>(t->nbytes()) != bytes) {
      throw Refusal("generic: a tensor of " + std::to_string(t->nbytes()) + " bytes where the cell reads " +
                    std::to_string(bytes));
    }
    return static_cast<const char*>(t->raw_data());
  }

  // Copies `bytes` bytes of what `slot` holds into `dst`: one memcpy from a
  // row or a tensor, block by block from a moved place (generic/moves.h).
  void CopyPlace(const Place& slot, int64_t bytes, char* dst) const {
    const Place& place = Chosen(slot);
    if (place.kind != Place::Kind::kMoved) {
      std::memcpy(dst, RowOf(place, bytes), bytes);
      return;
    }
    const MovedPlace& moved = inspection_.moved[place.index];
    if (RowBytes(moved.type) != bytes) {
      throw Refusal("generic: " + moved.type.ToString() + " where the cell reads " + std::to_string(bytes) + " bytes");
    }
    if (!moved.sum.empty()) {  // the first term, then each other one added to it
      const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
      float* out = reinterpret_cast<float*>(dst);
      CopyPlace(moved.sum[0], bytes, dst);
      std::vector<float> term;
      for (size_t k = 1; k < moved.sum.size(); ++k) {
        const Place& t = Chosen(moved.sum[k]);
        const float* x;
        if (t.kind == Place::Kind::kMoved) {
          term.resize(static_cast<size_t>(n));
          CopyPlace(t, bytes, reinterpret_cast<char*>(term.data()));
          x = term.data();
        } else {
          x = reinterpret_cast<const float*>(RowOf(t, bytes));
        }
        for (int64_t i = 0; i < n; ++i) out[i] += x[i];
      }
      return;
    }
    for (const MovedPlace::Block& b : moved.blocks) {
      const Place& source = Chosen(b.source);
      if (source.kind == Place::Kind::kMoved) {  // a concatenation of concatenations: copied whole, then cut
        const int64_t whole = RowBytes(inspection_.moved[source.index].type);
        if (b.from == 0 && b.bytes == whole) {
          CopyPlace(source, whole, dst + b.to);
        } else {
          std::vector<char> all(static_cast<size_t>(whole));
          CopyPlace(source, whole, all.data());
          std::memcpy(dst + b.to, all.data() + b.from, b.bytes);
        }
        continue;
      }
      std::memcpy(dst + b.to, RowOf(source, SourceBytes(source)) + b.from, b.bytes);
    }
  }

  // The bytes of one member's value at a place that is not moved.
  int64_t SourceBytes(const Place& place) const {
    switch (place.kind) {
      case Place::Kind::kRoot: return static_cast<int64_t>(inspection_.roots[place.index].nbytes());
      case Place::Kind::kStruct:
      case Place::Kind::kConstant: return static_cast<int64_t>(place.tensor->nbytes());
      case Place::Kind::kRow: return RowBytes(ValueType(place));
      default: throw std::logic_error("generic: the bytes of a place that holds none");
    }
  }

  // A variant that ran without native code of its own, once per call.
  void Missing(SegmentCode& code, SegmentCode::Variant& variant) {
    std::lock_guard lock(mu_);
    if (std::find(result_.missing_native.begin(), result_.missing_native.end(), &variant) !=
        result_.missing_native.end()) {
      return;
    }
    result_.missing_native.push_back(&variant);
    result_.missing_codes.push_back(&code);
  }

  // The slot member `si` of a run of `code` reads its input `p` from.
  const Place& Slot(int si, const SegmentCode& code, size_t p) const {
    return inspection_.si_inputs[inspection_.si_input_begin[si] + code.input_slot[p]];
  }

  // Run r's output o as its rows hold it: an output of the per-example
  // length (SegmentCode::output_length) at the run's extent.
  const TensorType& OutType(int r, int o) const {
    const std::vector<TensorType>& padded = out_types_[r];
    return padded.empty() ? inspection_.runs[r].code->outputs[o] : padded[o];
  }

  // The bytes between rows of run r's output o: `bytes`, a member's value,
  // unless the output has the per-example length (then the run's extent's;
  // looked up only then, as this is the gather's inner loop).
  int64_t RowStride(int r, int o, int64_t bytes) const {
    return out_types_[r].empty() ? bytes : RowBytes(out_types_[r][o]);
  }

  // The type of one member's value at a run's row (`place` a kRow): an
  // output of the per-example length at that member's length.
  TensorType ValueType(const Place& place) const {
    const int r = inspection_.si_run[place.index];
    TensorType t = inspection_.runs[r].code->outputs[place.output];
    if (!lengths_[r].empty() && !lengths_[r][place.output].empty()) {
      t.shape[0] = lengths_[r][place.output][RowIndex(place.index)];
    }
    return t;
  }

  // The length (first axis) of what `slot` holds; -1 for a scalar.
  int64_t LengthOf(const Place& slot) const {
    const Place& place = Chosen(slot);
    const Shape* shape = nullptr;
    switch (place.kind) {
      case Place::Kind::kRoot: shape = &inspection_.roots[place.index].shape(); break;
      case Place::Kind::kStruct:
      case Place::Kind::kConstant: shape = &place.tensor->shape(); break;
      case Place::Kind::kMoved: shape = &inspection_.moved[place.index].type.shape; break;
      case Place::Kind::kRow: {
        const TensorType t = ValueType(place);
        return t.shape.empty() ? -1 : t.shape[0];
      }
      default: throw std::logic_error("generic: the length of a place that holds none");
    }
    return shape->empty() ? -1 : (*shape)[0];
  }

  // The padding a run of `members` takes (generic/pad.h).
  std::vector<PadTo> Padding(const generic::Run& run, std::span<const int> members) const {
    const SegmentCode& code = *run.code;
    return RunPadding(code, static_cast<int>(members.size()),
                      [&](int m, int p) { return LengthOf(Slot(members[m], code, p)); });
  }

  // Run r's outputs of the per-example length at the extent of `pads`,
  // and each member's length of them (its length of the input the output
  // has it from).
  void SetPaddedOutputs(size_t r, std::span<const int> members, const std::vector<PadTo>& pads) {
    const SegmentCode& code = *inspection_.runs[r].code;
    if (pads.empty() || std::all_of(code.output_length.begin(), code.output_length.end(), [](int p) { return p < 0; })) {
      return;
    }
    out_types_[r] = code.outputs;
    lengths_[r].assign(code.outputs.size(), {});
    for (size_t o = 0; o < code.outputs.size(); ++o) {
      const int p = code.output_length[o];
      if (p < 0) continue;
      out_types_[r][o].shape[0] = pads[p].extent;
      for (int si : members) lengths_[r][o].push_back(static_cast<int32_t>(LengthOf(Slot(si, code, p))));
    }
  }

  // Copies the box `from` of row-major `src` into the corner of row-major
  // `dst` of shape `to` (each axis of `to` at least `from`'s).
  static void CopyBox(const char* src, const Shape& from, char* dst, const Shape& to, int64_t item, size_t axis = 0) {
    if (axis + 1 >= from.size()) {
      std::memcpy(dst, src, (from.empty() ? 1 : from.back()) * item);
      return;
    }
    int64_t src_step = item, dst_step = item;
    for (size_t a = axis + 1; a < from.size(); ++a) {
      src_step *= from[a];
      dst_step *= to[a];
    }
    for (int64_t i = 0; i < from[axis]; ++i) CopyBox(src + i * src_step, from, dst + i * dst_step, to, item, axis + 1);
  }

  // Member i's mask of a padded input: true at the positions of its length.
  static void FillMask(Tensor& mask, int64_t i, int64_t extent, int64_t n) {
    std::fill_n(mask.data<bool>() + i * extent, n, true);
  }

  // Padded input `p` of members [first, first + count) (rows past count
  // copies of the first), zeros past each member's length, and its mask
  // when the variant takes one. A member's value is data (its padded axes
  // all of its length) or a run's output, read as its first rows.
  void GatherPadded(const SegmentCode& code, const SegmentCode::Variant& v, size_t p, std::span<const int> members,
                    int first, int count, std::vector<Tensor>& in, std::vector<Tensor>& masks) const {
    const PadTo pad = v.pads[p];
    const TensorType member = PaddedInput(code, v, p);
    const int64_t bytes = RowBytes(member), item = SizeOf(member.dtype);
    Tensor stacked = Tensor::Zeros(member.dtype, Prepend(v.rows, member.shape));
    Tensor mask = pad.masked ? Tensor::Zeros(DType::kBool, {v.rows, pad.extent}) : Tensor();
    std::vector<char> moved;
    for (int64_t i = 0; i < v.rows; ++i) {
      const Place& place = Chosen(Slot(members[first + (i < count ? i : 0)], code, p));
      Shape shape;
      const char* src = nullptr;
      if (place.kind == Place::Kind::kRow) {
        const TensorType t = ValueType(place);
        shape = t.shape;
        src = RowOf(place, RowBytes(t));
      } else if (place.kind == Place::Kind::kMoved) {
        const TensorType& t = inspection_.moved[place.index].type;
        shape = t.shape;
        moved.resize(static_cast<size_t>(RowBytes(t)));
        CopyPlace(place, RowBytes(t), moved.data());
        src = moved.data();
      } else {
        const Tensor& t = place.kind == Place::Kind::kRoot ? inspection_.roots[place.index] : *place.tensor;
        shape = t.shape();
        src = static_cast<const char*>(t.raw_data());
      }
      const int64_t n = shape.empty() ? -1 : shape[0];
      bool fits = n >= 0 && n <= pad.extent && shape.size() == member.shape.size() && !(pad.masked && n == 0);
      for (size_t a = 0; fits && a < shape.size(); ++a) {
        fits = pad.axes >> a & 1 ? shape[a] == n : shape[a] == member.shape[a];
      }
      if (!fits) {
        // A masked reduction of nothing would read only its fill (a softmax of -inf).
        throw Refusal("generic: a tensor of " + TensorType{member.dtype, shape}.ToString() +
                      " where the segment reads up to " + member.ToString() +
                      (n == 0 ? " (an empty length is not padded)" : ""));
      }
      CopyBox(src, shape, static_cast<char*>(stacked.raw_data()) + i * bytes, member.shape, item);
      if (pad.masked) FillMask(mask, i, pad.extent, n);
    }
    in[p] = std::move(stacked);
    if (pad.masked) masks.push_back(std::move(mask));
  }

  // Input p of a variant that pads it, as one row holds it.
  static TensorType PaddedInput(const SegmentCode& code, const SegmentCode::Variant& v, size_t p) {
    TensorType t = code.inputs[p];
    for (size_t a = 0; a < t.shape.size(); ++a) {
      if (v.pads[p].axes >> a & 1) t.shape[a] = v.pads[p].extent;
    }
    return t;
  }

  // Input `p` of members [first, first + count), `rows` rows, where an
  // earlier run's output holds it already: rows row0 .. row0 + count - 1 of
  // one output, in the members' order (a cell's segment after a call reads
  // the segment before it; a sequence's step the step before; a run whose
  // rows are not a bucket pads, so 0-6% of a Tree-LSTM's rows in
  // bench/generic), and no padding rows (the rows past a run's
  // members may hold anything: a run in pieces leaves them unwritten, and
  // a NaN there times a zero cotangent is a NaN in a weight's gradient).
  // A view of that output, not a copy, each row of it `member` (a padded
  // input's at the variant's extent: an output of the per-example length
  // at the same extent, zeros past the lengths); undefined otherwise.
  // Nothing writes into a run's outputs after its run.
  // `sources`: where the walk placed them (Inspection::run_sources), or null.
  Tensor RowsInPlace(const TensorType& member, const SegmentCode& code, size_t p, std::span<const int> members,
                     int first, int count, int64_t rows, RowRef* refs, const RowSource* sources) const {
    if (count != rows) return Tensor();
    RowSource head;
    if (sources) {
      head = sources[0];
      if (head.run < 0) return Tensor();
      for (int i = 1; i < count; ++i) {
        if (sources[i].run != head.run || sources[i].output != head.output || sources[i].row != head.row + i) {
          return Tensor();
        }
      }
    } else {
      const Place& place = Chosen(Slot(members[first], code, p));
      if (place.kind != Place::Kind::kRow) return Tensor();
      head = {inspection_.si_run[place.index], RowIndex(place.index), place.output};
      for (int i = 1; i < count; ++i) {
        const Place& next = Chosen(Slot(members[first + i], code, p));
        if (next.kind != Place::Kind::kRow || next.output != head.output || inspection_.si_run[next.index] != head.run ||
            RowIndex(next.index) != head.row + i) {
          return Tensor();
        }
      }
    }
    const Tensor& out = outputs_[head.run][head.output];
    const int64_t bytes = RowBytes(member);
    if (out.dtype() != member.dtype || RowBytes(OutType(head.run, head.output)) != bytes ||
        static_cast<int64_t>(out.nbytes()) < (head.row + rows) * bytes) {
      return Tensor();
    }
    if (refs) {
      for (int i = 0; i < count; ++i) refs[i] = {{head.run, head.row + i, head.output}, nullptr};
    }
    return Tensor::Wrap(static_cast<char*>(const_cast<void*>(out.raw_data())) + head.row * bytes, member.dtype,
                        Prepend(rows, member.shape), std::make_shared<Tensor>(out));
  }

  // The inputs of members [first, first + count) of `run` for variant `v`,
  // stacked to its rows (padded with copies of the first), its padded
  // inputs' masks appended. With `refs`, where each member's per-row input
  // came from (RowRefs: input p's of member i at p * count + i), for the
  // backward to add its cotangents without resolving the slots again.
  // `r`: the run's index, when the members are all of its members (then
  // the walk's Inspection::run_sources say where most rows lie); else -1.
  std::vector<Tensor> Gather(const generic::Run& run, std::span<const int> members, int first, int count,
                             const SegmentCode::Variant& v, std::vector<RowRef>* refs = nullptr,
                             int r = -1) const {
    const SegmentCode& code = *run.code;
    const int64_t rows = v.rows;
    std::vector<Tensor> in(code.inputs.size()), masks;
    if (refs) refs->assign(code.inputs.size() * static_cast<size_t>(count), RowRef{});
    for (size_t p = 0; p < code.inputs.size(); ++p) {
      const TensorType& member = code.inputs[p];
      const int64_t bytes = RowBytes(member);
      if (code.shared[p]) {
        in[p] = inspection_.roots.at(SharedRoot(run, p));
        continue;
      }
      RowRef* ref = refs ? refs->data() + p * count : nullptr;
      const RowSource* sources =
          r >= 0 && !inspection_.run_sources.empty()
              ? inspection_.run_sources.data() + inspection_.run_source_begin[r] + code.input_slot[p] * count
              : nullptr;
      if (!v.pads.empty() && v.pads[p].extent > 0) {
        // A run's output of the per-example length at this extent is read
        // in place (zeros past the lengths); else gathered and padded.
        const PadTo pad = v.pads[p];
        Tensor view = pad.axes == 1 ? RowsInPlace(PaddedInput(code, v, p), code, p, members, first, count, rows,
                                                  ref, sources)
                                    : Tensor();
        if (!view.defined()) {
          if (ref) std::fill_n(ref, count, RowRef{});
          GatherPadded(code, v, p, members, first, count, in, masks);
          continue;
        }
        in[p] = std::move(view);
        if (pad.masked) {
          Tensor mask = Tensor::Zeros(DType::kBool, {rows, pad.extent});
          for (int i = 0; i < count; ++i) FillMask(mask, i, pad.extent, LengthOf(Slot(members[first + i], code, p)));
          masks.push_back(std::move(mask));
        }
        continue;
      }
      if (Tensor view = RowsInPlace(member, code, p, members, first, count, rows, ref, sources); view.defined()) {
        in[p] = std::move(view);
        continue;
      }
      Tensor stacked = Tensor::Empty(member.dtype, Prepend(rows, member.shape));
      char* dst = static_cast<char*>(stacked.raw_data());
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t m = i < count ? i : 0;
        RowSource s = sources ? sources[m] : RowSource{};
        const Place* place = nullptr;
        if (s.run < 0) {
          place = &Chosen(Slot(members[first + m], code, p));
          if (place->kind == Place::Kind::kRow) s = {inspection_.si_run[place->index], RowIndex(place->index), place->output};
        }
        if (s.run >= 0) {  // a row of an earlier run's output (its first rows, of one of per-example length)
          std::memcpy(dst + i * bytes,
                      static_cast<const char*>(outputs_[s.run][s.output].raw_data()) +
                          s.row * RowStride(s.run, s.output, bytes),
                      bytes);
          if (ref && i < count) ref[i] = {s, nullptr};
          continue;
        }
        if (ref && i < count) ref[i] = {{}, place};
        CopyPlace(*place, bytes, dst + i * bytes);
      }
      in[p] = std::move(stacked);
    }
    for (Tensor& m : masks) in.push_back(std::move(m));
    return in;
  }

  // The forward code of a variant on gathered inputs (packed weights appended).
  std::vector<Tensor> RunForward(const generic::Run& run, const SegmentCode::Variant& v, const std::vector<Tensor>& in) {
    if (v.forward_packs.empty()) return RunProgram(*v.forward_code, v.forward_outputs, in, in);
    std::vector<Tensor> packed_in = in;
    AppendPacks(run, v.forward_packs, packed_in);
    return RunProgram(*v.forward_code, v.forward_outputs, in, packed_in);
  }

  void Forward(size_t r) {
    const generic::Run& run = inspection_.runs[r];
    if (!PackGuarded(r)) return;  // a branch no instance took
    const std::span<const int> members = Members(r);
    const int64_t rows = members.size() == run.members.size() ? run.rows : RowBucket(static_cast<int64_t>(members.size()));
    SegmentCode& code = *run.code;
    const std::vector<PadTo> pads = Padding(run, members);
    SetPaddedOutputs(r, members, pads);
    SegmentCode::Variant& own = VariantEntry(code, rows, options_.grad, pads);
    if (options_.compile_now && !own.native.load()) {
      const auto start = std::chrono::steady_clock::now();
      CompileVariant(*options_.compile_now, code, own, options_.compile_options);
      std::lock_guard lock(mu_);
      result_.compiled.push_back({&code, &own, start, std::chrono::steady_clock::now()});
    }
    if (!options_.grad && !own.native.load() && ForwardInNativePieces(r, members, rows, pads)) {
      variants_[r] = &own;
      Missing(code, own);  // its own code still compiles: one run next time, not pieces
      return;
    }
    // Until its own bucket's code is native, the run may take a larger
    // bucket's (padded rows cost less than making a variant on this thread),
    // or, in grad mode, run in pieces other buckets' native code serves.
    SegmentCode::Variant* variant = &own;
    if (!own.native.load()) {
      variant = StandIn(code, rows, options_.grad, pads);
      if (options_.grad && !(variant && variant->native.load()) && ForwardInNativePieces(r, members, rows, pads)) {
        // One piece is a plain run of another variant (ForwardInNativePieces set it).
        if (!pieces_.empty() && !pieces_[r].empty()) variants_[r] = &own;  // its cotangents have the run's rows
        Missing(code, own);
        return;
      }
      // Made now: it runs its baseline code, or what a warm cache kept.
      if (!variant) variant = &VariantFor(code, rows, options_.grad, pads, &options_);
      if (!own.native.load()) Missing(code, own);
    }
    variants_[r] = variant;
    std::vector<Tensor> in = Gather(run, members, 0, static_cast<int>(members.size()), *variant,
                                    options_.grad ? &refs_[r] : nullptr, static_cast<int>(r));
    ++(variant->native.load() ? lanes_[run.lane].native_runs : lanes_[run.lane].baseline_runs);
    outputs_[r] = RunForward(run, *variant, in);
    if (options_.grad) inputs_[r] = std::move(in);
  }

  // Run `r` in pieces that native code serves, so that a row count not
  // compiled yet does not run on baseline code where other counts have
  // native code. Value mode: value-mode variants, or grad-mode ones whose
  // forward training compiled, their extra outputs unused. Grad mode:
  // grad-mode variants whose forward and backward are native; each piece
  // keeps its variant, inputs and residuals for BackwardPieces (pieces_),
  // except a single piece of the run's whole members, which is a plain run
  // of its variant (variants_, inputs_). False when no variant of the
  // segment has native code.
  bool ForwardInNativePieces(size_t r, std::span<const int> members_run, int64_t run_rows,
                             const std::vector<PadTo>& pads) {
    const generic::Run& run = inspection_.runs[r];
    SegmentCode& code = *run.code;
    const bool grad = options_.grad;
    std::vector<std::pair<int64_t, SegmentCode::Variant*>> native;  // by rows
    {
      std::lock_guard lock(code.mu);
      const std::vector<int64_t> pad_key = PadKey(pads);
      for (const auto& [key, v] : code.variants) {
        if (key.first != pad_key) continue;
        const bool serves = grad ? v->grad && v->native.load() : v->native.load() || (v->grad && v->forward_native);
        if (serves) native.emplace_back(v->rows, v.get());
      }
    }
    if (native.empty()) return false;
    const int members = static_cast<int>(members_run.size());
    std::vector<Tensor> out;
    bool all_native = true;
    for (int first = 0; first < members;) {
      const int left = members - first;
      SegmentCode::Variant* pick = NativePiece(native, left);
      if (!pick) {  // the rest on baseline code, in its own row bucket
        pick = &VariantFor(code, RowBucket(left), grad, pads, &options_);
        if (!pick->native.load()) {
          all_native = false;
          Missing(code, *pick);
        }
      }
      const int count = static_cast<int>(std::min<int64_t>(pick->rows, left));
      std::vector<Tensor> in = Gather(run, members_run, first, count, *pick);
      std::vector<Tensor> piece = RunForward(run, *pick, in);
      if (first == 0 && count == members && (grad || pick->rows == run_rows)) {  // one piece: a plain run
        if (grad) {
          variants_[r] = pick;
          inputs_[r] = std::move(in);
        } else {
          piece.resize(code.outputs.size());  // a grad-mode forward's residuals go unused
        }
        outputs_[r] = std::move(piece);
        break;
      }
      if (grad) {
        if (pieces_.empty()) pieces_.resize(n_runs_);
        pieces_[r].push_back({pick, first, count, std::move(in),
                              std::vector<Tensor>(std::make_move_iterator(piece.begin() + code.outputs.size()),
                                                  std::make_move_iterator(piece.end()))});
      }
      if (out.empty()) {
        for (size_t o = 0; o < code.outputs.size(); ++o) {
          const TensorType& t = OutType(static_cast<int>(r), static_cast<int>(o));
          out.push_back(Tensor::Empty(t.dtype, Prepend(run_rows, t.shape)));
        }
      }
      for (size_t o = 0; o < code.outputs.size(); ++o) {
        const int64_t bytes = RowBytes(OutType(static_cast<int>(r), static_cast<int>(o)));
        std::memcpy(static_cast<char*>(out[o].raw_data()) + first * bytes, piece[o].raw_data(), count * bytes);
      }
      first += count;
      if (first == members) {
        outputs_[r] = std::move(out);
        break;
      }
    }
    ++(all_native ? lanes_[run.lane].native_runs : lanes_[run.lane].baseline_runs);
    return true;
  }

  // The result: rows of the runs' outputs, rebuilt into the result type.
  Value ResultValue() const {
    auto tensor_of = [&](const Place& slot, const TensorType& type) -> Tensor {
      const Place& place = Chosen(slot);
      if (place.kind == Place::Kind::kMoved) {
        const TensorType& moved = inspection_.moved[place.index].type;
        Tensor t = Tensor::Empty(moved.dtype, moved.shape);
        CopyPlace(place, RowBytes(moved), static_cast<char*>(t.raw_data()));
        return t;
      }
      if (place.kind != Place::Kind::kRow) {
        return place.kind == Place::Kind::kRoot ? inspection_.roots[place.index] : *place.tensor;
      }
      Tensor t = Tensor::Empty(type.dtype, type.shape);
      std::memcpy(t.raw_data(), RowOf(place, RowBytes(type)), t.nbytes());
      return t;
    };
    size_t leaf = 0;
    if (inspection_.result_shape) {
      // A row's type is its segment's output's (a place elsewhere holds its tensor).
      auto type_of = [&](const Place& slot) {
        const Place& place = Chosen(slot);
        if (place.kind != Place::Kind::kRow) return TensorType{};
        const TensorType t = ValueType(place);
        if (!t.IsFullyKnown()) throw Refusal("generic: a result row of type " + t.ToString() + " in a structure");
        return t;
      };
      auto rebuild = [&](auto& self, const ResultShape& s) -> Value {
        if (s.kind == ResultShape::Kind::kValue) return s.value;
        if (s.kind == ResultShape::Kind::kTensor) {
          const Place& slot = inspection_.result.at(leaf++);
          return Value(tensor_of(slot, type_of(slot)));
        }
        std::vector<Value> fields;
        for (const ResultShape& f : s.fields) fields.push_back(self(self, f));
        return s.kind == ResultShape::Kind::kAdt ? Value::Adt(s.adt, s.tag, std::move(fields))
                                                 : Value::Tuple(std::move(fields));
      };
      return rebuild(rebuild, *inspection_.result_shape);
    }
    auto rebuild = [&](auto& self, const Type& type) -> Value {
      if (auto* t = AsTensor(type)) return Value(tensor_of(inspection_.result.at(leaf++), t->type));
      std::vector<Value> fields;
      for (const Type& f : AsTuple(type)->fields) fields.push_back(self(self, f));
      return Value::Tuple(std::move(fields));
    };
    return rebuild(rebuild, inspection_.result_type);
  }

  // Adds `src` (a member's worth, `elems` floats) to the gradient of what
  // `place` holds. A row's first term is copied: most rows have one reader
  // (a node's state, its parent), so a cotangent is neither zero-filled
  // whole nor added to; the rows nothing reached are zeroed when its run
  // takes it (Cotangent::Take). A moved place's blocks add to their sources.
  void AddToPlace(LaneSums& sums, const Place& slot, int64_t elems, const float* src) {
    const Place& place = Chosen(slot);
    if (place.kind == Place::Kind::kMoved) return AddToMoved(sums, place, src);
    AddRange(sums, place, 0, elems, elems, src);
  }

  // Adds `src` to elements [from, from + n) of what `place` (not a moved
  // one; `elems` elements a member) holds.
  void AddRange(LaneSums& sums, const Place& place, int64_t from, int64_t n, int64_t elems, const float* src) {
    const bool whole = from == 0 && n == elems;
    if (place.kind == Place::Kind::kRoot) {
      Tensor& grad = sums.root_grads[place.index];
      const TensorType type = inspection_.roots[place.index].type();
      if (whole) return AddInto(grad, type, src);
      if (!grad.defined()) grad = Tensor::Zeros(type.dtype, type.shape);
      float* dst = grad.data<float>() + from;
      for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
    } else if (place.kind == Place::Kind::kRow) {
      const int row = RowIndex(place.index);  // first: a skipped run has no variant
      AddToRow(inspection_.si_run[place.index], place.output, row, elems, src, from, n);
    }  // structure tensors and constants take no gradient
  }

  // Adds `src` to elements [from, from + n) (n < 0: all `elems`) of row
  // `row` of run `r`'s output `output`'s cotangent.
  void AddToRow(int r, int output, int row, int64_t elems, const float* src, int64_t from = 0, int64_t n = -1) {
    std::vector<Cotangent>& cot = cotangents_[r];
    if (cot.empty()) cot.resize(inspection_.runs[r].code->outputs.size());
    Cotangent& c = cot[output];
    const TensorType& out = OutType(r, output);
    if (!c.tensor.defined()) {
      c.tensor = Tensor::Empty(out.dtype, Prepend(variants_[r]->rows, out.shape));
      c.written.assign(variants_[r]->rows, 0);
    }
    if (n < 0) n = elems;
    // A row of an output of the per-example length holds more than a
    // member's value: zeros past it.
    const int64_t stride = NumElements(out.shape);
    float* dst = static_cast<float*>(c.tensor.raw_data()) + row * stride;
    if (!c.written[row]) {
      c.written[row] = 1;
      if (from == 0 && n == elems) {
        std::memcpy(dst, src, elems * sizeof(float));
        std::fill(dst + elems, dst + stride, 0.0f);
        return;
      }
      std::fill_n(dst, stride, 0.0f);
    }
    dst += from;
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  // Adds `src` (the moved value's elements) to the places its blocks came
  // from, or to each term of a sum.
  void AddToMoved(LaneSums& sums, const Place& place, const float* src) {
    const MovedPlace& moved = inspection_.moved[place.index];
    for (const Place& term : moved.sum) AddToPlace(sums, term, NumElements(moved.type.shape), src);
    for (const MovedPlace::Block& b : moved.blocks) {
      const Place& source = Chosen(b.source);
      const float* part = src + b.to / static_cast<int64_t>(sizeof(float));
      const int64_t from = b.from / static_cast<int64_t>(sizeof(float)), n = b.bytes / static_cast<int64_t>(sizeof(float));
      if (source.kind != Place::Kind::kMoved) {
        AddRange(sums, source, from, n, SourceBytes(source) / static_cast<int64_t>(sizeof(float)), part);
        continue;
      }
      const int64_t whole = RowBytes(inspection_.moved[source.index].type) / static_cast<int64_t>(sizeof(float));
      if (from == 0 && n == whole) {
        AddToMoved(sums, source, part);
      } else {  // a block of a concatenation of concatenations: zeros around it
        std::vector<float> all(static_cast<size_t>(whole), 0.0f);
        std::copy_n(part, n, all.begin() + from);
        AddToMoved(sums, source, all.data());
      }
    }
  }

  // The runs in reverse, each its segment's VJP on the cotangents its
  // readers added; a shared weight's gradient comes back as row factors,
  // summed once per call (SumProducts, SumRows).
  void Backward(const std::vector<Tensor>* seeds) {
    cotangents_.resize(n_runs_);
    result_.root_grads.assign(inspection_.roots.size(), Tensor());
    for (LaneSums& lane : lanes_) lane.root_grads.assign(inspection_.roots.size(), Tensor());
    if (!seeds) {
      const TensorTypeNode* loss = AsTensor(inspection_.result_type);
      if (!loss || loss->type.dtype != DType::kF32 || !loss->type.shape.empty()) {
        throw Refusal("generic: gradients need a scalar f32 result, not " + TypeToString(inspection_.result_type));
      }
      const float one = 1.0f;
      AddToPlace(lanes_[0], inspection_.result.at(0), 1, &one);
    } else {
      if (seeds->size() != inspection_.result.size()) {
        throw std::logic_error("generic: " + std::to_string(seeds->size()) + " cotangents for a result of " +
                               std::to_string(inspection_.result.size()) + " tensors");
      }
      for (size_t i = 0; i < seeds->size(); ++i) {
        const Tensor& seed = (*seeds)[i];
        if (!seed.defined()) continue;
        if (seed.dtype() != DType::kF32) throw std::logic_error("generic: a cotangent of " + seed.type().ToString());
        AddToPlace(lanes_[0], inspection_.result[i], seed.numel(), seed.data<float>());
      }
    }
    ForEachRun(true, [&](size_t r) {
      if (!cotangents_[r].empty()) BackwardRun(r);
    });
  }

  void BackwardRun(size_t r) {
    if (!pieces_.empty() && !pieces_[r].empty()) return BackwardPieces(r);
    const generic::Run& run = inspection_.runs[r];
    const SegmentCode& code = *run.code;
    SegmentCode::Variant& variant = *variants_[r];
    const std::shared_ptr<TieredExecutable>& backward = variant.backward_code;
    if (!backward) return;
    std::vector<Tensor> in = std::move(inputs_[r]);
    for (int o : variant.grad_outputs) {
      Tensor c = cotangents_[r][o].Take();
      const TensorType& t = OutType(static_cast<int>(r), o);
      in.push_back(c.defined() ? c : Tensor::Zeros(t.dtype, Prepend(variant.rows, t.shape)));
    }
    const size_t first_residual = code.outputs.size();
    for (int k = 0; k < variant.residuals; ++k) in.push_back(std::move(outputs_[r][first_residual + k]));
    AppendPacks(run, variant.backward_packs, in);
    std::vector<Tensor> grads = RunProgram(*backward, variant.backward_outputs, in, in);
    AddGrads(run, variant, grads, Members(r), refs_[r].empty() ? nullptr : &refs_[r]);
    cotangents_[r].clear();
  }

  // A run's pieces backward (ForwardInNativePieces), each its variant's VJP
  // on its rows of the run's cotangents.
  void BackwardPieces(size_t r) {
    const generic::Run& run = inspection_.runs[r];
    const SegmentCode& code = *run.code;
    std::vector<Tensor> cot(code.outputs.size());  // the run's own rows, those no reader wrote zeroed
    for (size_t o = 0; o < cot.size(); ++o) cot[o] = cotangents_[r][o].Take();
    const std::span<const int> members = Members(r);
    for (Piece& piece : pieces_[r]) {
      SegmentCode::Variant& v = *piece.variant;
      if (!v.backward_code) continue;  // nothing it reads takes a gradient (as BackwardRun)
      std::vector<Tensor> in = std::move(piece.inputs);
      for (int o : v.grad_outputs) {
        const TensorType& t = OutType(static_cast<int>(r), o);
        Tensor c = Tensor::Zeros(t.dtype, Prepend(v.rows, t.shape));
        if (cot[o].defined()) {
          const int64_t bytes = RowBytes(t);
          std::memcpy(c.raw_data(), static_cast<const char*>(cot[o].raw_data()) + piece.first * bytes,
                      piece.count * bytes);
        }
        in.push_back(std::move(c));
      }
      for (Tensor& t : piece.residuals) in.push_back(std::move(t));
      AppendPacks(run, v.backward_packs, in);
      std::vector<Tensor> grads = RunProgram(*v.backward_code, v.backward_outputs, in, in);
      AddGrads(run, v, grads, members.subspan(piece.first, piece.count));
    }
    cotangents_[r].clear();
  }

  // Adds what a run's (or piece's) backward returned, `grads` = (d/d
  // grad_inputs..., factor pairs...), to its members' slots and the
  // weights' gradients (row i of a gradient is members[i]'s).
  void AddGrads(const generic::Run& run, const SegmentCode::Variant& variant, std::vector<Tensor>& grads,
                std::span<const int> members, const std::vector<RowRef>* refs = nullptr) {
    const SegmentCode& code = *run.code;
    LaneSums& sums = lanes_[run.lane];
    for (size_t g = 0; g < variant.grad_inputs.size(); ++g) {
      int p = variant.grad_inputs[g];
      const Tensor& grad = grads.at(g);
      const TensorType& member = code.inputs[p];
      if (code.shared[p]) {
        const int root = SharedRoot(run, p);
        AddInto(sums.root_grads[root], inspection_.roots[root].type(), grad.data<float>());
        continue;
      }
      const float* rows = grad.data<float>();
      if (!variant.pads.empty() && variant.pads[p].extent > 0) {
        // Each member's gradient is the first rows of its row (its length).
        const int64_t stride = grad.numel() / grad.shape()[0], item = stride / variant.pads[p].extent;
        for (size_t i = 0; i < members.size(); ++i) {
          const Place& slot = Slot(members[i], code, p);
          const int64_t elems = LengthOf(slot) * item;
          const RowSource* s = refs ? &(*refs)[p * members.size() + i].source : nullptr;
          if (s && s->run >= 0) {
            AddToRow(s->run, s->output, s->row, elems, rows + i * stride);
          } else {
            AddToPlace(sums, slot, elems, rows + i * stride);
          }
        }
        continue;
      }
      const int64_t elems = NumElements(member.shape);
      if (refs) {
        const RowRef* ref = refs->data() + p * members.size();
        for (size_t i = 0; i < members.size(); ++i) {
          if (const RowSource& s = ref[i].source; s.run >= 0) {
            AddToRow(s.run, s.output, s.row, elems, rows + i * elems);
          } else {
            AddToPlace(sums, ref[i].place ? *ref[i].place : Slot(members[i], code, p), elems, rows + i * elems);
          }
        }
        continue;
      }
      for (size_t i = 0; i < members.size(); ++i) AddToPlace(sums, Slot(members[i], code, p), elems, rows + i * elems);
    }
    // Padding rows add exact zeros: their cotangents are zero, their
    // forward values copies of a real row's.
    size_t next = variant.grad_inputs.size();
    for (const SegmentCode::Factor& factor : variant.factors) {
      const int root = SharedRoot(run, factor.param);
      if (factor.kind == SegmentCode::Factor::Kind::kProduct) {
        Tensor& lhs = grads.at(next++);
        Tensor& rhs = grads.at(next++);
        int64_t rows = lhs.shape()[0];
        sums.row_factors[root].push_back({std::move(lhs), std::move(rhs), rows});
      } else {
        sums.row_sums[{root, factor.shape}].push_back(std::move(grads.at(next++)));
      }
    }
  }

  // Each weight's gradient from every run's row factors: one product whose
  // inner dimension is all their rows. Its rows go in parts of kPartRows,
  // fixed by the rows alone (so that the bits are the same with one thread
  // or many), which run on the call's team: the first part adds into the
  // gradient, each other one into a product of its own, added to the
  // gradient in order once all are done.
  void SumProducts() {
    struct Part {
      const std::vector<RowFactor>* factors;
      int64_t begin, end, m, n;
      Tensor out;
      bool accumulate;
      int root;
    };
    std::vector<Part> parts;
    for (auto& [root, factors] : row_factors_) {
      int64_t rows = 0;
      for (const RowFactor& f : factors) rows += f.rows;
      const int64_t m = factors[0].lhs.shape()[1], n = factors[0].rhs.shape()[1];
      if (inspection_.roots[root].numel() != m * n) {
        throw Refusal("generic: a weight gradient of " + std::to_string(m) + "x" + std::to_string(n) +
                      " for a tensor of " + inspection_.roots[root].type().ToString());
      }
      Tensor& grad = result_.root_grads[root];
      if (!PackedGemmFast()) {  // the right factors stacked (rows, n), the left ones (rows, m)
        Tensor lhs = Tensor::Empty(DType::kF32, {rows, m}), rhs = Tensor::Empty(DType::kF32, {rows, n});
        int64_t at = 0;
        for (const RowFactor& f : factors) {
          std::memcpy(lhs.data<float>() + at * m, f.lhs.data<float>(), f.rows * m * sizeof(float));
          std::memcpy(rhs.data<float>() + at * n, f.rhs.data<float>(), f.rows * n * sizeof(float));
          at += f.rows;
        }
        AddInto(grad, inspection_.roots[root].type(), CallOp("matmul", {lhs, rhs}, {{"transpose_a", true}}).data<float>());
        continue;
      }
      const bool accumulate = grad.defined();
      if (!accumulate) {
        const Shape& shape = inspection_.roots[root].shape();
        grad = rows == 0 ? Tensor::Zeros(DType::kF32, shape) : Tensor::Empty(DType::kF32, shape);
      }
      for (int64_t begin = 0; begin < rows; begin += kPartRows) {
        Tensor out = begin == 0 ? grad : Tensor::Empty(DType::kF32, {m, n});
        parts.push_back({&factors, begin, std::min(rows, begin + kPartRows), m, n, out, begin == 0 && accumulate, root});
      }
    }
    auto run = [&](int64_t i) {
      Part& p = parts[static_cast<size_t>(i)];
      MultiplyRowFactors(*p.factors, p.begin, p.end, p.m, p.n, p.out.data<float>(), p.accumulate);
    };
    Team* team = Team::Current();
    if (team && team->max_threads() > 1 && parts.size() > 1) {
      team->Run(static_cast<int64_t>(parts.size()), run);
    } else {
      for (size_t i = 0; i < parts.size(); ++i) run(static_cast<int64_t>(i));
    }
    for (const Part& p : parts) {
      if (p.begin > 0) AddInto(result_.root_grads[p.root], inspection_.roots[p.root].type(), p.out.data<float>());
    }
  }

  // Rows of a weight's product per part: for a 128 x 512 weight (a Tree-LSTM
  // of hidden 128) 134 MFLOP, about 2 ms, worth handing to another core.
  static constexpr int64_t kPartRows = 1024;
  // The term sum over rows [begin, end) of the factors stacked of lhs^T rhs
  // into out (m x n; added to it when `accumulate`). By chunks of kChunk
  // rows: each chunk's left factors transposed and right ones packed while
  // in cache, then multiplied (a Tree-LSTM's call has thousands of rows:
  // transposing and packing them whole wrote beyond L2, and the
  // micro-kernel's panels of k rows left L1).
  static void MultiplyRowFactors(const std::vector<RowFactor>& factors, int64_t begin, int64_t end, int64_t m,
                                 int64_t n, float* out, bool accumulate) {
    constexpr int64_t kChunk = 256;
    const int64_t chunk = std::min(end - begin, kChunk);
    // Buffers each thread keeps from call to call: fresh ones of these
    // sizes (a packed 256 x 512 operand is 512 KiB) come from mmap and cost
    // their page faults at every call.
    thread_local std::vector<float> lhs_buffer, rhs_buffer;
    lhs_buffer.resize(std::max<size_t>(lhs_buffer.size(), static_cast<size_t>(m * chunk)));
    rhs_buffer.resize(std::max<size_t>(rhs_buffer.size(), static_cast<size_t>(NumElements(PackedShape(chunk, n)))));
    float* const lhs = lhs_buffer.data();
    float* const packed_rhs = rhs_buffer.data();
    int64_t at = 0;  // rows of the factors before f
    int64_t done = begin, filled = 0, size = chunk;  // rows multiplied; of the chunk so far; in the chunk
    for (const RowFactor& f : factors) {
      const int64_t first = std::max(begin - at, int64_t{0}), last = std::min(end - at, f.rows);
      at += f.rows;
      for (int64_t row = first; row < last;) {
        if (filled == 0) size = std::min(chunk, end - done);  // the last chunk packs its own k
        const int64_t take = std::min(last - row, size - filled);
        Transpose(f.lhs.data<float>() + row * m, take, m, lhs + filled, chunk);
        PackGemmRhsRows(size, filled, take, n, f.rhs.data<float>() + row * n, n, packed_rhs);
        filled += take;
        row += take;
        if (filled < size) continue;
        GemmPacked(m, n, size, lhs, chunk, packed_rhs, out, n, accumulate);
        accumulate = true;
        done += size;
        filled = 0;
      }
    }
  }

  // Row sums of every run, reduced once per weight and shape, term by term
  // in the runs' order: a term whose trailing axes are the shape (a bias's
  // gradient) has its rows added as they are, another is reduced by
  // sum_to first.
  void SumRows() {
    for (auto& [key, terms] : row_sums_) {
      const Shape& shape = key.second;
      const int64_t n = NumElements(shape);
      Tensor sum = Tensor::Zeros(DType::kF32, shape);
      float* dst = sum.data<float>();
      // Not stacked: runs of one segment may pad to different extents, so
      // that their terms' shapes differ.
      for (const Tensor& t : terms) {
        const Shape& of = t.shape();
        const bool trailing = of.size() >= shape.size() && std::equal(shape.begin(), shape.end(), of.end() - shape.size());
        Tensor reduced = trailing ? t : CallOp("sum_to", {t}, {{"shape", shape}});
        const float* src = reduced.data<float>();
        for (int64_t row = 0; row < reduced.numel() / std::max<int64_t>(n, 1); ++row, src += n) {
          for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
        }
      }
      AddInto(result_.root_grads[key.first], inspection_.roots[key.first].type(), dst);
    }
  }

  // A run output's cotangent: its rows, and which of them a reader wrote.
  struct Cotangent {
    Tensor tensor;
    std::vector<uint8_t> written;
    // The cotangent, the rows no reader wrote (padding, values nothing
    // read) zeroed.
    Tensor Take() {
      if (!tensor.defined()) return tensor;
      const int64_t rows = static_cast<int64_t>(written.size());
      const int64_t bytes = rows == 0 ? 0 : static_cast<int64_t>(tensor.nbytes()) / rows;
      for (int64_t row = 0; row < rows;) {
        if (written[row]) {
          ++row;
          continue;
        }
        int64_t end = row;
        while (end < rows && !written[end]) ++end;
        std::memset(static_cast<char*>(tensor.raw_data()) + row * bytes, 0, (end - row) * bytes);
        row = end;
      }
      return std::move(tensor);
    }
  };

  const Inspection& inspection_;
  const ExecuteOptions& options_;
  const size_t n_runs_;
  Execution result_;
  std::vector<std::vector<Tensor>> outputs_, inputs_;  // per run; inputs kept in grad mode
  std::vector<std::vector<RowRef>> refs_;              // per run in grad mode: where its inputs came from (Gather)
  std::vector<SegmentCode::Variant*> variants_;
  // Per run whose segment has outputs of the per-example length
  // (SegmentCode::output_length), set by its forward: its outputs' types at
  // its extent, and per such output each row's length; empty otherwise.
  std::vector<std::vector<TensorType>> out_types_;
  std::vector<std::vector<std::vector<int32_t>>> lengths_;
  // Grad mode, a run in pieces (ForwardInNativePieces): per piece, the
  // variant that ran it, its members [first, first + count) of the run's,
  // and what its backward reads. Per run; empty (all of it) unless some run
  // ran in pieces.
  struct Piece {
    SegmentCode::Variant* variant;
    int first, count;
    std::vector<Tensor> inputs, residuals;
  };
  std::vector<std::vector<Piece>> pieces_;
  // With guarded instances: each instance's row (-1: its guard failed), the
  // members that ran of the runs that have guarded ones (empty for the
  // others), and each guard's state (0 not read yet, 1 holds, 2 fails).
  // Empty otherwise.
  std::vector<int> rows_;
  std::vector<std::vector<int>> active_;
  std::unique_ptr<std::atomic<int8_t>[]> guard_state_;
  std::vector<LaneSums> lanes_;  // one per lane (one without lanes)
  std::mutex mu_;                // packed_, result_.missing_native and missing_codes, result_.compiled
  std::map<std::pair<int, bool>, Tensor> packed_;
  std::vector<std::vector<Cotangent>> cotangents_;                 // per run, per output
  std::map<int, std::vector<RowFactor>> row_factors_;              // per entry tensor: its gradient's products
  std::map<std::pair<int, Shape>, std::vector<Tensor>> row_sums_;  // per entry tensor and shape: its reductions
};

}  // namespace

Execution Execute(const Inspection& inspection, const ExecuteOptions& options) {
  if (options.grad && inspection.result_shape) {
    throw Refusal("generic: gradients of a result that holds structures (a loss is a scalar)");
  }
  return CallRun(inspection, options).Run();
}

namespace {

// A call whose forward ran in grad mode and whose backward waits for the
// cotangent: the inspection and options its CallRun reads, kept with it.
class Pending final : public PendingBackward {
 public:
  Pending(std::shared_ptr<const Inspection> inspection, const ExecuteOptions& options)
      : inspection_(std::move(inspection)), options_(options), run_(*inspection_, options_) {}

  Execution Forward() {
    run_.RunForward();
    Execution out = std::move(run_.result());
    run_.result() = Execution{};  // the backward's gradients go here
    return out;
  }

  std::vector<Tensor> Backward(const std::vector<Tensor>& cotangents) override {
    if (used_) throw std::logic_error("generic: a pullback runs once");
    used_ = true;
    run_.RunBackward(&cotangents);
    return std::move(run_.result().root_grads);
  }

 private:
  std::shared_ptr<const Inspection> inspection_;
  ExecuteOptions options_;
  CallRun run_;
  bool used_ = false;
};

}  // namespace

Forward InspectAndForward(GenericProgram& program, const std::vector<Value>& args, ExecuteOptions options) {
  options.grad = true;
  for (int reruns = 0;; ++reruns) {
    auto inspection = std::make_shared<Inspection>(program.Inspect(args));
    if (inspection->result_shape) throw Refusal("generic: a pullback of a result that holds structures");
    // A cotangent is added into f32 rows; the tier differentiates nothing else.
    auto check = [](auto& self, const Type& type) -> void {
      if (const TensorTypeNode* t = AsTensor(type)) {
        if (IsFloat(t->type.dtype) && t->type.dtype != DType::kF32) {
          throw Refusal("generic: a pullback of a " + t->type.ToString() + " result (f32 only)");
        }
        return;
      }
      for (const Type& f : AsTuple(type)->fields) self(self, f);
    };
    check(check, inspection->result_type);
    auto pending = std::make_unique<Pending>(inspection, options);
    try {
      Forward out;
      out.run = pending->Forward();
      out.run.reruns = reruns;
      out.inspection = std::move(inspection);
      out.backward = std::move(pending);
      return out;
    } catch (const Deeper& deeper) {
      program.Deepen(deeper);  // or Refusal past the deepest walk
    }
  }
}

Execution InspectAndExecute(GenericProgram& program, const std::vector<Value>& args, const ExecuteOptions& options,
                            Inspection& inspection) {
  for (int reruns = 0;; ++reruns) {
    inspection = program.Inspect(args);
    try {
      Execution run = Execute(inspection, options);
      run.reruns = reruns;
      return run;
    } catch (const Deeper& deeper) {
      program.Deepen(deeper);  // or Refusal past the deepest walk
    }
  }
}

}  // namespace pejit::generic
