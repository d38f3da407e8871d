#include "ops/eager.h"

namespace pejit {

std::vector<Tensor> RunOp(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs) {
  std::vector<TensorType> in_types;
  in_types.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) throw OpError(op.name, "input " + std::to_string(i) + " is undefined");
    in_types.push_back(inputs[i].type());
  }
  std::vector<TensorType> out_types = InferTypes(op, in_types, attrs);
  std::vector<Tensor> outputs;
  outputs.reserve(out_types.size());
  for (auto& t : out_types) outputs.push_back(Tensor::Empty(t.dtype, std::move(t.shape)));
  op.kernel(inputs, outputs, attrs);
  return outputs;
}

Tensor CallOp(std::string_view name, std::vector<Tensor> inputs, const Attrs& attrs) {
  const OpDef& op = LookupOp(name);
  std::vector<Tensor> out = RunOp(op, inputs, NormalizeAttrs(op, attrs));
  if (out.size() != 1) throw OpError(name, "has " + std::to_string(out.size()) + " outputs; use RunOp");
  return out[0];
}

GradValue EagerGradBuilder::Add(Tensor value) {
  values_.push_back(std::move(value));
  return static_cast<GradValue>(values_.size() - 1);
}

std::vector<GradValue> EagerGradBuilder::EmitOp(const OpDef& op, std::span<const GradValue> inputs,
                                                const Attrs& attrs) {
  std::vector<Tensor> in;
  in.reserve(inputs.size());
  for (GradValue v : inputs) in.push_back(values_.at(v));
  std::vector<GradValue> out;
  for (Tensor& t : RunOp(op, in, attrs)) out.push_back(Add(std::move(t)));
  return out;
}

std::vector<Tensor> EagerVjp(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                             std::span<const Tensor> output_grads, const Attrs& attrs) {
  if (!op.differentiable()) throw OpError(op.name, "is not differentiable");
  EagerGradBuilder b;
  std::vector<GradValue> in, out, out_grads;
  for (const Tensor& t : inputs) in.push_back(b.Add(t));
  for (const Tensor& t : outputs) out.push_back(b.Add(t));
  for (const Tensor& t : output_grads) out_grads.push_back(t.defined() ? b.Add(t) : kNoGrad);
  std::vector<GradValue> grads = op.grad(b, GradContext{in, out, out_grads, attrs});
  std::vector<Tensor> result;
  for (GradValue g : grads) result.push_back(g == kNoGrad ? Tensor() : b.Get(g));
  return result;
}

}  // namespace pejit
