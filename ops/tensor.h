// \file Tensors: typed, row-major, contiguous buffers with shared ownership.
//
// A Tensor is a cheap handle (copying it shares the buffer); Clone() copies
// the data. Buffers are 64-byte aligned so kernels and compiled code can use
// aligned vector loads. Scalars are 0-d tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ops/dtype.h"
#include "ops/shape.h"

namespace pejit {

// A dimension known only at call time (written `?` in IR types). Shape rules
// accept it; tensors never have one.
inline constexpr int64_t kUnknownDim = -1;

int64_t NumElements(const Shape& shape);     // 1 for a scalar; needs known dims
Shape RowMajorStrides(const Shape& shape);   // in elements
std::string ShapeToString(const Shape& shape);  // "(3, 4)", "(5,)", "()", "(?, 4)"

// The static type of a tensor value: what shape rules compute with.
struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;

  int rank() const { return static_cast<int>(shape.size()); }
  bool IsFullyKnown() const;
  std::string ToString() const;  // "Tensor[(3, 4), f32]"
  friend bool operator==(const TensorType&, const TensorType&) = default;
};

// The bytes a tensor of type `t` holds; throws std::invalid_argument past
// kMaxTensorBytes, so that sums of a few sizes (an arena, a batch) cannot
// wrap either (issue 24).
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 56;
int64_t NumBytes(const TensorType& t);

// Thrown when the allocator has no room for a tensor: still a std::bad_alloc
// (the engine treats every one alike: the job fails, the worker lives on),
// but one that says how much was asked for and for what.
class TensorAllocError : public std::bad_alloc {
 public:
  explicit TensorAllocError(const TensorType& type);
  // For memory that holds tensors without being one (a compiled plan's arena).
  TensorAllocError(int64_t bytes, std::string_view what);
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing

  static Tensor Empty(DType dtype, Shape shape);  // uninitialized contents
  static Tensor Zeros(DType dtype, Shape shape);
  static Tensor Ones(DType dtype, Shape shape);
  static Tensor Full(DType dtype, Shape shape, double value);
  template <typename T>
  static Tensor FromVector(Shape shape, const std::vector<T>& values);
  static Tensor Scalar(float value) { return FromVector<float>({}, {value}); }
  static Tensor ScalarOf(DType dtype, double value) { return Full(dtype, {}, value); }
  // Views memory owned elsewhere (an arena of compiled code); `keep_alive`
  // is held for as long as the tensor, and may be null.
  static Tensor Wrap(void* data, DType dtype, Shape shape, std::shared_ptr<void> keep_alive);

  bool defined() const { return buffer_ != nullptr; }
  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  const TensorType& type() const { return type_; }
  Shape strides() const { return RowMajorStrides(type_.shape); }
  int rank() const { return type_.rank(); }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * SizeOf(type_.dtype); }

  // Typed access; throws std::logic_error when T does not match dtype().
  template <typename T> T* data();
  template <typename T> const T* data() const;
  void* raw_data() { return data_; }
  const void* raw_data() const { return data_; }

  // Element `i` of the flattened tensor, converted to double.
  double ElementAsDouble(int64_t i) const;
  // The value of a 1-element tensor (any rank), converted to double.
  double item() const;

  Tensor Clone() const;
  // Same buffer, another shape with the same number of elements.
  Tensor Reshaped(Shape shape) const;

  std::string ToString() const;  // numpy-like; elided when large

 private:
  std::shared_ptr<void> buffer_;
  void* data_ = nullptr;
  TensorType type_;
  int64_t numel_ = 0;

  void CheckDType(DType expected) const;
};

// Same dtype, same shape, bitwise-equal elements (NaN == NaN).
bool Equal(const Tensor& a, const Tensor& b);
// Same dtype and shape and |a - b| <= atol + rtol * |b| elementwise.
bool AllClose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// Largest |a - b| / (atol + |b|); for test failure messages.
double MaxRelativeError(const Tensor& a, const Tensor& b, double atol = 1e-8);

template <typename T>
T* Tensor::data() {
  CheckDType(DTypeOf<T>());
  return static_cast<T*>(data_);
}

template <typename T>
const T* Tensor::data() const {
  CheckDType(DTypeOf<T>());
  return static_cast<const T*>(data_);
}

template <typename T>
Tensor Tensor::FromVector(Shape shape, const std::vector<T>& values) {
  Tensor t = Empty(DTypeOf<T>(), std::move(shape));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    throw std::invalid_argument("Tensor::FromVector: " + std::to_string(values.size()) +
                                " values for shape " + ShapeToString(t.shape()));
  }
  std::copy(values.begin(), values.end(), t.data<T>());
  return t;
}

}  // namespace pejit
