// \file Optimizers that update parameter structures (tuples or ADT values of
// tensors) in place, between calls: what every training loop shares.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ir/value.h"

namespace pejit {

struct OptimizerOptions {
  std::string kind = "adagrad";  // adagrad, sgd or adam
  double learning_rate = 0.05;
  double weight_decay = 0;       // L2, added to the gradient
  double clip_norm = 0;          // > 0: scale gradients to at most this global norm
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;  // adam (epsilon also adagrad's)
};

// The f32 tensors of a parameter structure (a tensor, or tuples/ADT values
// of them), depth-first: what optimizers update and checkpoints save.
// Handles sharing the structure's buffers, not copies.
std::vector<Tensor> ParameterLeaves(const Value& params);

// What an optimizer carries from step to step besides the parameters, for
// checkpoints: its step count and per-parameter buffers (adagrad: the sums of
// squared gradients; adam: the first moments, then the second; sgd: none),
// in the parameters' depth-first order, each as long as its parameter.
struct OptimizerState {
  std::string kind;
  int64_t steps = 0;
  std::vector<std::vector<float>> buffers;  // empty before the first step
};

class Optimizer {
 public:
  // Throws std::invalid_argument for an unknown kind.
  static std::unique_ptr<Optimizer> Create(const OptimizerOptions& options);
  virtual ~Optimizer() = default;

  // Updates the float tensors of `params` in place from `grads`, which has
  // the same structure (as Entry::value_and_grad returns). Returns the
  // gradients' global norm before clipping.
  // Throws std::invalid_argument, before changing anything, when the
  // structures differ or a restored state does not fit the parameters, and
  // std::domain_error when a gradient is NaN or infinite (a diverged step
  // would make every parameter it touches NaN). Throws std::overflow_error,
  // after the update, when it made a parameter NaN or infinite: the
  // parameters are then unusable (SaveCheckpoint refuses them).
  double Step(const Value& params, const Value& grads);

  const std::string& kind() const { return options_.kind; }
  OptimizerState state() const;
  // Carries on from `state` (another optimizer's, of the same kind; throws
  // std::invalid_argument otherwise). Its buffers are checked against the
  // parameters at the next Step.
  void set_state(OptimizerState state);

 protected:
  explicit Optimizer(OptimizerOptions options) : options_(std::move(options)) {}
  // Creates the buffers of parameters of these sizes on the first step, or
  // checks that restored ones have them (throwing std::invalid_argument).
  virtual void Prepare(const std::vector<int64_t>& sizes) = 0;
  // Updates one parameter tensor (index `i` in depth-first order).
  virtual void Update(size_t i, float* param, const float* grad, int64_t n) = 0;
  virtual std::vector<std::vector<float>> buffers() const = 0;
  virtual void set_buffers(std::vector<std::vector<float>> buffers) = 0;
  OptimizerOptions options_;
  int64_t steps_ = 0;
};

}  // namespace pejit
