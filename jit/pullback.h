// \file A straight-line program compiled as the two halves of its
// vector-Jacobian product (jit/vjp.h): per-minibatch code for a call whose
// backward comes later, with a cotangent (the engine's value_and_pullback).
//
// The forward returns the result's tensors and the residuals the backward
// reads; the backward takes the parameters, a cotangent per float result and
// those residuals, and returns the gradients of sum(result * cotangent).
// Compiled once per signature, like a grad-mode specialization, but for a
// result of any tensors, not a scalar loss.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "ir/expr.h"
#include "jit/compiler.h"
#include "jit/executable.h"

namespace pejit {

class PullbackExecutable final : public Executable {
 public:
  // Compiles `program` (straight-line tensor code whose result is tensors in
  // tuples), its parameters marked in `constant` left undifferentiated.
  // Throws JitFailure: control flow, nothing to differentiate (no float
  // parameter or result), or what compiling throws.
  static std::shared_ptr<const PullbackExecutable> Compile(JitSession& session, const Func& program,
                                                           const std::vector<bool>& constant,
                                                           const CompileOptions& options = {});

  struct Forward {
    std::vector<Tensor> results;    // the result's tensor leaves, depth first
    std::vector<Tensor> residuals;  // what RunBackward reads
  };
  Forward RunForward(std::span<const Tensor> inputs) const;
  // d sum(results * cotangents) / d each parameter, undefined for those not
  // differentiated (`constant`, integer). `cotangents`: one per result
  // leaf, undefined for zeros (and read only at float leaves).
  std::vector<Tensor> RunBackward(std::span<const Tensor> inputs, const std::vector<Tensor>& cotangents,
                                  std::vector<Tensor> residuals) const;

  // Executable: the forward's results (its residuals dropped).
  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override { return RunForward(inputs).results; }
  const Type& result_type() const override { return result_type_; }
  size_t code_bytes() const override { return forward_->code_bytes() + backward_->code_bytes(); }
  const char* tier() const override { return forward_->tier(); }

 private:
  PullbackExecutable() = default;
  ExecutablePtr forward_, backward_;
  Type result_type_;
  std::vector<TensorType> result_leaves_;
  std::vector<int> grad_inputs_, grad_outputs_;
  size_t params_ = 0;
};

}  // namespace pejit
