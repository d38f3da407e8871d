#include "jit/simplify.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "jit/straight.h"
#include "ops/eager.h"
#include "ops/packed_gemm.h"

namespace pejit {

namespace {

bool AllOnes(const Tensor& t) {
  if (!IsFloat(t.dtype())) return false;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.ElementAsDouble(i) != 1.0) return false;
  }
  return true;
}

// An expanding operator's constant result (a broadcast_to of a scalar, a
// zeros of the rows' shape) is left to compute: folded, it would be a
// tensor of code-owned bytes as large as the rows, read by every run,
// where a fused kernel reads the scalar.
constexpr int64_t kMaxFoldedExpansion = 64;  // elements

}  // namespace

Straight FoldConstants(Straight s) {
  std::unordered_map<const ExprNode*, Expr> subst;
  std::unordered_set<const ExprNode*> ones;  // variables holding 1 in every element
  auto is_ones = [&](const Expr& e) {
    if (auto* c = As<ConstantNode>(e)) return AllOnes(c->value);
    return ones.count(e.get()) > 0;
  };
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
    if (call && !constant) {
      const std::string& op = call->op->name;
      // x * 1 is x, exactly (NaN, infinities and signed zeros included), where
      // the product has x's type: the seed of a vector-Jacobian product.
      if (op == "mul" && call->args.size() == 2) {
        for (int k = 0; k < 2; ++k) {
          const Expr& x = call->args[k];
          if (is_ones(call->args[1 - k]) && AsTensor(b.var->annotation) && TensorTypeOf(x) == TensorTypeOf(b.var)) {
            subst[b.var.get()] = x;
            break;
          }
        }
        if (subst.count(b.var.get())) continue;
      }
      if ((op == "broadcast_to" || op == "reshape") && is_ones(call->args[0])) ones.insert(b.var.get());
    }
    if (!constant) {
      if (auto* p = As<ProjNode>(b.value); p && p->tuple->kind == ExprKind::kTuple) {
        subst[b.var.get()] = As<TupleNode>(p->tuple)->fields[p->index];
        continue;
      }
      kept.push_back(b);
      continue;
    }
    std::vector<Tensor> inputs;
    int64_t input_elements = 0;
    for (const Expr& a : call->args) {
      inputs.push_back(As<ConstantNode>(a)->value);
      input_elements += inputs.back().numel();
    }
    std::vector<Tensor> out = RunOp(*call->op, inputs, call->attrs);
    int64_t out_elements = 0;
    for (const Tensor& t : out) out_elements += t.numel();
    if (out_elements > std::max(input_elements, kMaxFoldedExpansion)) {
      if (out.size() == 1 && AllOnes(out[0])) ones.insert(b.var.get());
      kept.push_back(b);
      continue;
    }
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
  return s;
}

Straight EliminateCommonSubexpressions(Straight s) {
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
  return s;
}

Straight EliminateDeadCode(Straight s) {
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
  return s;
}

Straight CombineSums(Straight s) {
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
  auto emit = [&](std::string_view op, std::vector<Expr> args, const Attrs& attrs, int lane = -1) -> Expr {
    const OpDef& def = LookupOp(op);
    Attrs normalized = NormalizeAttrs(def, attrs);
    std::vector<TensorType> in;
    for (const Expr& a : args) in.push_back(TensorTypeOf(a));
    Var v = MakeVar("sum" + std::to_string(fresh++), TensorTy(InferTypes(def, in, normalized)[0]));
    SourceLoc loc;
    loc.lane = lane;
    out.push_back({v, std::make_shared<OpCallNode>(&def, std::move(args), normalized, loc)});
    return v;
  };
  for (const Binding& b : s.bindings) {
    auto* add = As<OpCallNode>(b.value);
    if (!add || add->op->name != "add" || inner.count(b.var.get()) || !is_sum(add, TensorTypeOf(b.var))) {
      out.push_back(b);
      continue;
    }
    const TensorType type = TensorTypeOf(b.var);
    // The sum's terms, by kind; products and scatters by lane (jit/lanes.h):
    // each lane's are combined on their own, and the lanes' sums added in
    // lane order, so that no lane reads another's rows.
    std::vector<Expr> others;
    using Terms = std::vector<std::pair<Expr, const OpCallNode*>>;  // (term, its call)
    std::map<int, Terms> scatters, products;
    size_t scatter_terms = 0, product_terms = 0;
    // Depth first, left to right, with an explicit stack: a sum chains as
    // many adds as the data has elements (a list of 100,000).
    std::vector<Expr> pending(add->args.rbegin(), add->args.rend());
    while (!pending.empty()) {
      Expr term = std::move(pending.back());
      pending.pop_back();
      if (const OpCallNode* a = call_of(term, "add"); is_sum(a, type)) {
        pending.insert(pending.end(), a->args.rbegin(), a->args.rend());
      } else if (const OpCallNode* sc = call_of(term, "scatter_add");
                 sc && sc->args[1]->kind == ExprKind::kConstant) {
        scatters[sc->loc.lane].emplace_back(term, sc);
        ++scatter_terms;
      } else if (const OpCallNode* mm = call_of(term, "matmul");
                 mm && mm->attrs.GetBool("transpose_a") && !mm->attrs.GetBool("transpose_b") &&
                 TensorTypeOf(mm->args[0]).rank() == 2 && TensorTypeOf(mm->args[1]).rank() == 2) {
        products[mm->loc.lane].emplace_back(term, mm);
        ++product_terms;
      } else {
        others.push_back(term);
      }
    }
    if (scatter_terms < 2 && product_terms < 2) {
      out.push_back(b);
      continue;
    }
    auto concat = [&](std::vector<Expr> values, int lane) {
      return values.size() == 1 ? values[0] : emit("concat", std::move(values), {{"axis", int64_t{0}}}, lane);
    };
    std::vector<Expr> terms;
    for (const auto& [lane, lane_scatters] : scatters) {
      if (lane_scatters.size() < 2) {
        for (const auto& [term, sc] : lane_scatters) others.push_back(term);
        continue;
      }
      std::vector<Expr> values;
      std::vector<int64_t> indices;
      for (const auto& [term, sc] : lane_scatters) {
        const Tensor& idx = As<ConstantNode>(sc->args[1])->value;
        for (int64_t k = 0; k < idx.numel(); ++k) indices.push_back(idx.data<int64_t>()[k]);
        Shape flat = TensorTypeOf(sc->args[0]).shape;
        flat.erase(flat.begin(), flat.begin() + idx.rank());
        flat.insert(flat.begin(), idx.numel());
        values.push_back(emit("reshape", {sc->args[0]}, {{"shape", flat}}, lane));
      }
      auto count_indices = static_cast<int64_t>(indices.size());
      terms.push_back(emit("scatter_add",
                           {concat(std::move(values), lane),
                            MakeConstant(Tensor::FromVector<int64_t>({count_indices}, indices))},
                           lane_scatters[0].second->attrs, lane));
    }
    for (const auto& [lane, lane_products] : products) {
      if (lane_products.size() < 2) {
        for (const auto& [term, mm] : lane_products) others.push_back(term);
        continue;
      }
      std::vector<Expr> a, c;
      for (const auto& [term, mm] : lane_products) {
        a.push_back(mm->args[0]);
        c.push_back(mm->args[1]);
      }
      terms.push_back(emit("matmul", {concat(std::move(a), lane), concat(std::move(c), lane)},
                           lane_products[0].second->attrs, lane));
    }
    terms.insert(terms.end(), others.begin(), others.end());
    Expr sum = terms[0];
    for (size_t k = 1; k + 1 < terms.size(); ++k) sum = emit("add", {sum, terms[k]}, {});
    out.push_back({b.var, terms.size() == 1 ? MakeOpCall("reshape", {sum}, {{"shape", type.shape}})
                                            : std::make_shared<OpCallNode>(add->op, std::vector<Expr>{sum, terms.back()},
                                                                           add->attrs, add->loc)});
  }
  s.bindings = std::move(out);
  return EliminateDeadCode(std::move(s));
}

std::optional<bool> PackableProduct(const OpCallNode& call) {
  auto f32_matrix = [](const Expr& e) {
    const TensorType t = TensorTypeOf(e);
    return t.dtype == DType::kF32 && t.rank() == 2;
  };
  const std::string& op = call.op->name;
  bool product = (op == "matmul" && !call.attrs.GetBool("transpose_a") && f32_matrix(call.args[1])) || op == "dense";
  // Any inner dimension: a panel (k x 16 floats) past the L1 cache streams
  // from L2 as well. Against OpenBLAS, single-threaded, k = 3072 by 1024
  // columns: 5 rows 61 against 20 GFLOP/s, 25 rows 54 against 51, 100 rows
  // 74 against 74; k = 8192, 100 rows: 73 against 73 (bench/ops, AVX2). A
  // limit of 1024 sent a hidden-1024 Tree-LSTM's backward products through
  // the U_iou (3072 x 1024) to OpenBLAS, which packed it at every run.
  if (!product || !f32_matrix(call.args[0])) return std::nullopt;
  return op == "dense" || call.attrs.GetBool("transpose_b");
}

Expr PackedProduct(const OpCallNode& call, const Expr& packed, const TensorType& result) {
  return call.op->name == "dense"
             ? MakeOpCall("packed_dense", {call.args[0], packed, call.args[2]}, {}, call.loc)
             : MakeOpCall("packed_matmul", {call.args[0], packed}, {{"n", result.shape[1]}}, call.loc);
}

Straight PackGemmOperands(Straight s) {
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
  return s;
}

Func FoldConstants(const Func& program) { return Recompose(FoldConstants(Decompose(program))); }
Func EliminateCommonSubexpressions(const Func& program) {
  return Recompose(EliminateCommonSubexpressions(Decompose(program)));
}
Func EliminateDeadCode(const Func& program) { return Recompose(EliminateDeadCode(Decompose(program))); }
Func CombineSums(const Func& program) { return Recompose(CombineSums(Decompose(program))); }
Func PackGemmOperands(const Func& program) { return Recompose(PackGemmOperands(Decompose(program))); }

}  // namespace pejit
