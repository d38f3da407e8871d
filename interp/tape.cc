#include "interp/tape.h"

#include "ops/eager.h"

namespace pejit {

Value Tape::Watch(const Value& tensor) { return tensor.WithTapeId(next_id_++); }

std::vector<Value> Tape::Record(const OpDef& op, const Attrs& attrs, const std::vector<Value>& inputs,
                                std::vector<Tensor> outputs) {
  bool traced = false;
  for (const Value& v : inputs) traced |= v.tape_id() >= 0;
  std::vector<Value> result;
  if (!traced || !op.differentiable()) {
    for (Tensor& t : outputs) result.emplace_back(std::move(t));
    return result;
  }
  Entry e{&op, attrs, {}, {}, outputs, {}};
  for (const Value& v : inputs) {
    e.inputs.push_back(v.tensor());
    e.input_ids.push_back(v.tape_id());
  }
  for (Tensor& t : outputs) {
    e.output_ids.push_back(next_id_);
    result.push_back(Value(std::move(t)).WithTapeId(next_id_++));
  }
  entries_.push_back(std::move(e));
  return result;
}

std::vector<Tensor> Tape::Backward(const Value& loss, const std::vector<Value>& leaves) const {
  return Backward({{loss, Tensor::Ones(loss.tensor().dtype(), loss.tensor().shape())}}, leaves);
}

std::vector<Tensor> Tape::Backward(const std::vector<std::pair<Value, Tensor>>& seeds,
                                   const std::vector<Value>& leaves) const {
  std::unordered_map<int64_t, Tensor> grads;
  auto accumulate = [&](int64_t id, const Tensor& g) {
    auto it = grads.find(id);
    if (it == grads.end()) {
      grads.emplace(id, g);
    } else {
      it->second = CallOp("add", {it->second, g});
    }
  };
  for (const auto& [value, cotangent] : seeds) {
    if (value.tape_id() >= 0 && cotangent.defined()) accumulate(value.tape_id(), cotangent);
  }

  for (auto e = entries_.rbegin(); e != entries_.rend(); ++e) {
    std::vector<Tensor> out_grads;
    bool any = false;
    for (int64_t id : e->output_ids) {
      auto it = grads.find(id);
      out_grads.push_back(it == grads.end() ? Tensor() : it->second);
      any |= it != grads.end();
    }
    if (!any) continue;
    std::vector<Tensor> in_grads = EagerVjp(*e->op, e->inputs, e->outputs, out_grads, e->attrs);
    for (size_t i = 0; i < in_grads.size(); ++i) {
      if (e->input_ids[i] >= 0 && in_grads[i].defined()) accumulate(e->input_ids[i], in_grads[i]);
    }
  }

  std::vector<Tensor> result;
  for (const Value& leaf : leaves) {
    auto it = grads.find(leaf.tape_id());
    result.push_back(it != grads.end() ? it->second : Tensor::Zeros(leaf.tensor().dtype(), leaf.tensor().shape()));
  }
  return result;
}

}  // namespace pejit
