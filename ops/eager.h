// \file Running operators now, on tensors: the interpreter's path, and the
// eager builder that runs gradient rules for its tape and for tests.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "ops/op.h"

namespace pejit {

// Checks the inputs with the op's type rule (throws OpError), allocates the
// outputs and runs the kernel. `attrs` must be normalized (NormalizeAttrs).
std::vector<Tensor> RunOp(const OpDef& op, std::span<const Tensor> inputs, const Attrs& attrs);

// Convenience for code and tests: looks the op up, normalizes the attributes
// and returns its single output.
Tensor CallOp(std::string_view op, std::vector<Tensor> inputs, const Attrs& attrs = {});

// A GradBuilder whose values are tensors computed at once.
class EagerGradBuilder final : public GradBuilder {
 public:
  GradValue Add(Tensor value);
  const Tensor& Get(GradValue value) const { return values_.at(value); }

  std::vector<GradValue> EmitOp(const OpDef& op, std::span<const GradValue> inputs, const Attrs& attrs) override;
  GradValue Constant(const Tensor& value) override { return Add(value); }
  TensorType TypeOf(GradValue value) const override { return values_.at(value).type(); }

 private:
  std::vector<Tensor> values_;
};

// The vector-Jacobian product of one application of `op`: given its inputs,
// outputs and the gradients of its outputs (undefined tensors where none),
// returns the gradients of its inputs (undefined where none flows).
std::vector<Tensor> EagerVjp(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                             std::span<const Tensor> output_grads, const Attrs& attrs);

}  // namespace pejit
