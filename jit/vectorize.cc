#include "jit/vectorize.h"

#include <unordered_map>

#include "jit/batch_rules.h"
#include "jit/executable.h"
#include "jit/straight.h"
#include "ops/op.h"

namespace pejit {
namespace {

// What a variable of the input is in the output: a tensor atom, stacked or
// shared, or a tuple of such.
struct Lifted {
  Expr atom;
  bool stacked = false;
  bool tuple = false;
  std::vector<Lifted> fields;
};

class Vectorizer {
 public:
  Vectorizer(int64_t rows) : rows_(rows), out_("v") {}

  Func Run(const Func& program, const std::vector<bool>& stacked) {
    Straight in = Decompose(program);
    if (stacked.size() != in.params.size()) {
      throw JitFailure("vectorize: " + std::to_string(stacked.size()) + " stacked flags for " +
                       std::to_string(in.params.size()) + " parameters");
    }
    Straight result;
    for (size_t p = 0; p < in.params.size(); ++p) {
      const Var& param = in.params[p];
      Var lifted = param;
      if (stacked[p]) {
        TensorType member = TensorTypeOf(param);
        lifted = MakeVar(param->name, TensorTy(member.dtype, Prepend(rows_, member.shape)), param->loc);
      }
      result.params.push_back(lifted);
      vars_[param.get()] = Lifted{lifted, static_cast<bool>(stacked[p]), false, {}};
    }
    for (const Binding& b : in.bindings) vars_[b.var.get()] = Lift(b);
    result.result = Result(in.result);
    result.bindings = std::move(out_.bindings());
    return Recompose(result);
  }

 private:
  int64_t rows_;
  StraightEmitter out_;
  std::unordered_map<const VarNode*, Lifted> vars_;

  Lifted Of(const Expr& atom) const {
    if (atom->kind == ExprKind::kConstant) return Lifted{atom, false, false, {}};
    return vars_.at(static_cast<const VarNode*>(atom.get()));
  }

  static Lifted FromOutputs(const std::vector<Var>& outputs, bool stacked, bool tuple) {
    if (!tuple) return Lifted{outputs[0], stacked, false, {}};
    Lifted t;
    t.tuple = true;
    for (const Var& v : outputs) t.fields.push_back(Lifted{v, stacked, false, {}});
    return t;
  }

  std::vector<Var> Outputs(const Var& result, const SourceLoc& loc) {
    const TupleTypeNode* tuple = AsTuple(result->annotation);
    if (!tuple) return {result};
    std::vector<Var> fields;
    for (size_t o = 0; o < tuple->fields.size(); ++o) fields.push_back(out_.Proj(result, static_cast<int>(o), loc));
    return fields;
  }

  Lifted Lift(const Binding& b) {
    if (auto* tuple = As<TupleNode>(b.value)) {
      Lifted t;
      t.tuple = true;
      for (const Expr& f : tuple->fields) t.fields.push_back(Of(f));
      return t;
    }
    if (auto* proj = As<ProjNode>(b.value)) {
      Lifted t = Of(proj->tuple);
      if (!t.tuple) throw JitFailure("vectorize: projection of a tensor");
      return t.fields.at(proj->index);
    }
    const auto& call = static_cast<const OpCallNode&>(*b.value);
    bool is_tuple = AsTuple(b.var->annotation) != nullptr;
    std::vector<Expr> args;
    std::vector<bool> stacked;
    bool any_stacked = false;
    for (const Expr& a : call.args) {
      Lifted l = Of(a);
      args.push_back(l.atom);
      stacked.push_back(l.stacked);
      any_stacked |= l.stacked;
    }
    if (!any_stacked) {  // the same for every instance: computed once
      Var result = out_.Op(call.op->name, std::move(args), call.attrs, call.loc);
      return FromOutputs(Outputs(result, call.loc), false, is_tuple);
    }
    BatchRule rule = BatchRuleOf(call);
    bool ruled = rule != BatchRule::kNone;
    for (size_t p = 0; p < args.size() && ruled; ++p) ruled = !(stacked[p] && MustShare(rule, p));
    if (ruled) return FromOutputs(EmitStackedOp(out_, call, rule, std::move(args), stacked, rows_), true, is_tuple);
    return FromOutputs(Unrolled(call, args, stacked), true, is_tuple);
  }

  // The operator once per instance on its slices, the results stacked.
  std::vector<Var> Unrolled(const OpCallNode& call, const std::vector<Expr>& args, const std::vector<bool>& stacked) {
    std::vector<std::vector<Expr>> per_output;
    for (int64_t i = 0; i < rows_; ++i) {
      std::vector<Expr> slice_args;
      for (size_t p = 0; p < args.size(); ++p) {
        slice_args.push_back(stacked[p] ? Expr(out_.Op("take", {args[p], MakeConstant(Tensor::ScalarOf(DType::kI64, static_cast<double>(i)))}, {}, call.loc))
                                        : args[p]);
      }
      std::vector<Var> outputs = Outputs(out_.Op(call.op->name, std::move(slice_args), call.attrs, call.loc), call.loc);
      per_output.resize(outputs.size());
      for (size_t o = 0; o < outputs.size(); ++o) per_output[o].push_back(outputs[o]);
    }
    std::vector<Var> stacked_outputs;
    for (std::vector<Expr>& values : per_output) {
      stacked_outputs.push_back(out_.Op("stack", std::move(values), {{"axis", int64_t{0}}}, call.loc));
    }
    return stacked_outputs;
  }

  Expr Result(const Expr& e) {
    if (auto* tuple = As<TupleNode>(e)) {
      std::vector<Expr> fields;
      for (const Expr& f : tuple->fields) fields.push_back(Result(f));
      return MakeTuple(std::move(fields), e->loc);
    }
    return Stacked(Of(e), e->loc);
  }

  Expr Stacked(const Lifted& l, const SourceLoc& loc) {
    if (l.tuple) {
      std::vector<Expr> fields;
      for (const Lifted& f : l.fields) fields.push_back(Stacked(f, loc));
      return MakeTuple(std::move(fields), loc);
    }
    if (l.stacked) return l.atom;
    return out_.Op("broadcast_to", {l.atom}, {{"shape", Prepend(rows_, TensorTypeOf(l.atom).shape)}}, loc);
  }
};

}  // namespace

Func Vectorize(const Func& program, const std::vector<bool>& stacked, int64_t rows) {
  if (rows < 1) throw JitFailure("vectorize: rows must be at least 1, not " + std::to_string(rows));
  return Vectorizer(rows).Run(program, stacked);
}

}  // namespace pejit
