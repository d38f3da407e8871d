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

class Optimizer {
 public:
  // Throws std::invalid_argument for an unknown kind.
  static std::unique_ptr<Optimizer> Create(const OptimizerOptions& options);
  virtual ~Optimizer() = default;

  // Updates the float tensors of `params` in place from `grads`, which has
  // the same structure (as Entry::value_and_grad returns). Returns the
  // gradients' global norm before clipping.
  double Step(const Value& params, const Value& grads);

 protected:
  explicit Optimizer(OptimizerOptions options) : options_(std::move(options)) {}
  // Updates one parameter tensor (index `i` in depth-first order).
  virtual void Update(size_t i, float* param, const float* grad, int64_t n) = 0;
  OptimizerOptions options_;
  int64_t steps_ = 0;
};

}  // namespace pejit
