// \file The MLP of mlp.pj, from C++: its program text, parameters, and
// minibatches of Fashion-MNIST as program values.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "examples/mlp/fashion_mnist.h"
#include "ir/value.h"
#include "ops/random.h"

namespace pejit::mlp {

// examples/mlp/mlp.pj, built into the program.
std::string_view ModelSource();

inline constexpr int kHidden = 256;

// The parameter tuple of mlp.pj: (w1, b1, w2, b2), Xavier-uniform weights
// and zero biases.
Value InitParams(Rng& rng);

// The images (B, 784) and labels (B,) of examples order[begin, begin + count)
// of `split`, copied into tensors of their own.
struct Batch {
  Value images;
  Value labels;
  int64_t size() const { return labels.tensor().numel(); }
};
Batch MakeBatch(const Split& split, const std::vector<int64_t>& order, size_t begin, size_t count);

}  // namespace pejit::mlp
