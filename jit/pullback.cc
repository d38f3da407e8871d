#include "jit/pullback.h"

#include <string>

#include "jit/native_executable.h"
#include "jit/straight.h"
#include "jit/vjp.h"

namespace pejit {

namespace {

// The atoms of a straight-line result (atoms nested in tuples), depth first.
void FlattenResult(const Expr& result, std::vector<Expr>& out) {
  if (const auto* t = As<TupleNode>(result)) {
    for (const Expr& f : t->fields) FlattenResult(f, out);
    return;
  }
  out.push_back(result);
}

}  // namespace

std::shared_ptr<const PullbackExecutable> PullbackExecutable::Compile(JitSession& session, const Func& program,
                                                                      const std::vector<bool>& constant,
                                                                      const CompileOptions& options) {
  Straight s = Decompose(program);  // throws JitFailure for control flow
  std::shared_ptr<PullbackExecutable> out(new PullbackExecutable());
  out->result_type_ = ResultTypeOf(s.result);
  std::vector<Expr> leaves;
  FlattenResult(s.result, leaves);
  for (const Expr& leaf : leaves) out->result_leaves_.push_back(TensorTypeOf(leaf));
  s.result = MakeTuple(leaves);  // MakeSplitVjp takes a flat tuple
  std::optional<SplitVjp> split = MakeSplitVjp(s, constant);
  if (!split) throw JitFailure("pullback: nothing to differentiate (no float parameter reaches a float result)");
  out->forward_ = session.Compile(Recompose(split->forward), options);
  out->backward_ = session.Compile(Recompose(split->backward), options);
  out->grad_inputs_ = std::move(split->grad_inputs);
  out->grad_outputs_ = std::move(split->grad_outputs);
  out->params_ = s.params.size();
  return out;
}

PullbackExecutable::Forward PullbackExecutable::RunForward(std::span<const Tensor> inputs) const {
  std::vector<Tensor> all = RunSizedToTeam(*forward_, inputs);
  Forward out;
  const size_t n = result_leaves_.size();
  out.results.assign(std::make_move_iterator(all.begin()), std::make_move_iterator(all.begin() + n));
  out.residuals.assign(std::make_move_iterator(all.begin() + n), std::make_move_iterator(all.end()));
  return out;
}

std::vector<Tensor> PullbackExecutable::RunBackward(std::span<const Tensor> inputs,
                                                    const std::vector<Tensor>& cotangents,
                                                    std::vector<Tensor> residuals) const {
  if (cotangents.size() != result_leaves_.size() || inputs.size() != params_) {
    throw std::logic_error("pullback: " + std::to_string(inputs.size()) + " inputs and " +
                           std::to_string(cotangents.size()) + " cotangents for code of " + std::to_string(params_) +
                           " and " + std::to_string(result_leaves_.size()));
  }
  std::vector<Tensor> in(inputs.begin(), inputs.end());
  for (int k : grad_outputs_) {
    const TensorType& t = result_leaves_[k];
    in.push_back(cotangents[k].defined() ? cotangents[k] : Tensor::Zeros(t.dtype, t.shape));
  }
  for (Tensor& r : residuals) in.push_back(std::move(r));
  std::vector<Tensor> grads = RunSizedToTeam(*backward_, in);  // (the VJP's value, d/d grad_inputs...)
  std::vector<Tensor> out(params_);
  for (size_t g = 0; g < grad_inputs_.size(); ++g) out[grad_inputs_[g]] = std::move(grads.at(g + 1));
  return out;
}

}  // namespace pejit
