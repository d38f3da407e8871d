#include "examples/mlp/model.h"

#include <cstring>
#include <stdexcept>

namespace pejit {
extern const char kMlpSource[];  // mlp_source.cc, generated from mlp.pj
}

namespace pejit::mlp {

std::string_view ModelSource() { return kMlpSource; }

Value InitParams(Rng& rng) {
  return Value::Tuple({
      Value(XavierUniform(rng, {kHidden, kPixels})),
      Value(Tensor::Zeros(DType::kF32, {kHidden})),
      Value(XavierUniform(rng, {kClasses, kHidden})),
      Value(Tensor::Zeros(DType::kF32, {kClasses})),
  });
}

Batch MakeBatch(const Split& split, const std::vector<int64_t>& order, size_t begin, size_t count) {
  if (begin + count > order.size()) {
    throw std::out_of_range("MakeBatch: examples [" + std::to_string(begin) + ", " + std::to_string(begin + count) +
                            ") of an order of " + std::to_string(order.size()));
  }
  const int64_t b = static_cast<int64_t>(count);
  const int64_t row = split.images.shape()[1];
  Tensor images = Tensor::Empty(DType::kF32, {b, row}), labels = Tensor::Empty(DType::kI64, {b});
  const float* from = split.images.data<float>();
  for (int64_t i = 0; i < b; ++i) {
    int64_t e = order[begin + static_cast<size_t>(i)];
    if (e < 0 || e >= split.size()) {
      throw std::out_of_range("MakeBatch: example " + std::to_string(e) + " of a split of " +
                              std::to_string(split.size()));
    }
    std::memcpy(images.data<float>() + i * row, from + e * row, static_cast<size_t>(row) * sizeof(float));
    labels.data<int64_t>()[i] = split.labels.data<int64_t>()[e];
  }
  return {Value(images), Value(labels)};
}

}  // namespace pejit::mlp
