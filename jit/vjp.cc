#include "jit/vjp.h"

#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ir/visitor.h"
#include "jit/autodiff.h"
#include "jit/batch_rules.h"

namespace pejit {

std::optional<SplitVjp> MakeSplitVjp(const Straight& f, const std::vector<bool>& constant) {
  SplitVjp g;
  for (size_t p = 0; p < f.params.size(); ++p) {
    if (p < constant.size() && constant[p]) continue;
    if (IsFloat(TensorTypeOf(f.params[p]).dtype)) g.grad_inputs.push_back(static_cast<int>(p));
  }
  const auto* outputs = As<TupleNode>(f.result);
  if (!outputs) throw JitFailure("vjp: the program's result is not a tuple");
  Straight s = f;
  StraightEmitter out("g");
  Expr total;
  for (size_t o = 0; o < outputs->fields.size(); ++o) {
    TensorType t = TensorTypeOf(outputs->fields[o]);
    if (!IsFloat(t.dtype)) continue;
    g.grad_outputs.push_back(static_cast<int>(o));
    Var cotangent = MakeVar("c" + std::to_string(o), TensorTy(t));
    s.params.push_back(cotangent);
    Expr term = out.Op("sum", {out.Op("mul", {outputs->fields[o], cotangent}, {}, {})}, {}, {});
    if (t.dtype != DType::kF32) term = out.Op("cast", {term}, {{"dtype", DType::kF32}}, {});
    total = total ? Expr(out.Op("add", {total, term}, {}, {})) : term;
  }
  if (!total || g.grad_inputs.empty()) return std::nullopt;
  for (Binding& b : out.bindings()) s.bindings.push_back(std::move(b));
  s.result = total;
  // Differentiate keeps the forward lets, with their variables, ahead of the
  // backward ones: what follows them is the backward program.
  Straight d = Decompose(Differentiate(Recompose(s), g.grad_inputs));
  std::unordered_set<const VarNode*> forward_vars;
  for (const Binding& b : f.bindings) forward_vars.insert(b.var.get());
  std::vector<Binding> back;
  for (const Binding& b : d.bindings) {
    if (!forward_vars.count(b.var.get())) back.push_back(b);
  }
  std::vector<Var> residuals;
  std::unordered_set<const ExprNode*> seen;
  auto collect = [&](const Expr& e) {
    PostOrderVisit(e, [&](const Expr& x) {
      if (x->kind == ExprKind::kVar && forward_vars.count(static_cast<const VarNode*>(x.get())) &&
          seen.insert(x.get()).second) {
        residuals.push_back(std::static_pointer_cast<const VarNode>(x));
      }
    });
  };
  for (const Binding& b : back) collect(b.value);
  collect(d.result);

  g.forward = f;
  g.backward.params = d.params;
  std::vector<Expr> results = outputs->fields;
  StraightEmitter fields("r");
  std::unordered_map<const ExprNode*, Expr> subst;
  for (const Var& r : residuals) {
    if (const TupleTypeNode* tuple = AsTuple(r->annotation)) {  // a multi-output operator's: by its fields
      std::vector<Expr> parts;
      for (size_t i = 0; i < tuple->fields.size(); ++i) {
        if (!AsTensor(tuple->fields[i])) throw JitFailure("vjp: a nested tuple kept for the backward pass");
        results.push_back(fields.Proj(r, static_cast<int>(i), r->loc));
        Var p = MakeVar(r->name + "_" + std::to_string(i), tuple->fields[i]);
        g.backward.params.push_back(p);
        parts.push_back(p);
        ++g.residuals;
      }
      Var rebuilt = MakeVar(r->name, r->annotation);
      g.backward.bindings.push_back({rebuilt, MakeTuple(std::move(parts))});
      subst[r.get()] = rebuilt;
    } else {
      results.push_back(r);
      Var p = MakeVar(r->name, r->annotation);
      g.backward.params.push_back(p);
      subst[r.get()] = p;
      ++g.residuals;
    }
  }
  for (Binding& b : fields.bindings()) g.forward.bindings.push_back(std::move(b));
  g.forward.result = MakeTuple(std::move(results));
  for (const Binding& b : back) g.backward.bindings.push_back({b.var, Substitute(b.value, subst)});
  g.backward.result = Substitute(d.result, subst);
  return g;
}

}  // namespace pejit
