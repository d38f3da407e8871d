#include "ops/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

namespace pejit {

int64_t NumElements(const Shape& shape) {
  bool empty = false;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("NumElements: unknown dimension in " + ShapeToString(shape));
    empty |= d == 0;
  }
  if (empty) return 0;  // whatever the other dimensions
  // A product that wrapped would pass for a small tensor (issue 24).
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      throw std::invalid_argument("shape " + ShapeToString(shape) + " has more elements than 2^63");
    }
  }
  return n;
}

int64_t NumBytes(const TensorType& t) {
  const int64_t n = NumElements(t.shape), size = static_cast<int64_t>(SizeOf(t.dtype));
  if (n > kMaxTensorBytes / size) {
    throw std::invalid_argument("a tensor of type " + t.ToString() + " needs more than 2^56 bytes");
  }
  return n * size;
}

Shape RowMajorStrides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

std::string ShapeToString(const Shape& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += shape[i] == kUnknownDim ? "?" : std::to_string(shape[i]);
  }
  if (shape.size() == 1) out += ",";
  return out + ")";
}

bool TensorType::IsFullyKnown() const {
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

std::string TensorType::ToString() const {
  return "Tensor[" + ShapeToString(shape) + ", " + std::string(DTypeName(dtype)) + "]";
}

TensorAllocError::TensorAllocError(const TensorType& type)
    : message_("out of memory: cannot allocate " + std::to_string(NumBytes(type)) + " bytes for a " +
               type.ToString()) {}

TensorAllocError::TensorAllocError(int64_t bytes, std::string_view what)
    : message_("out of memory: cannot allocate " + std::to_string(bytes) + " bytes for " + std::string(what)) {}

Tensor Tensor::Empty(DType dtype, Shape shape) {
  Tensor t;
  t.type_ = {dtype, std::move(shape)};
  t.numel_ = NumElements(t.type_.shape);
  NumBytes(t.type_);  // throws for a size no allocator could give
  // Round up so a vector loop may read a whole 64-byte line past the end.
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw TensorAllocError(t.type_);
  t.buffer_ = std::shared_ptr<void>(p, std::free);
  t.data_ = p;
  return t;
}

Tensor Tensor::Zeros(DType dtype, Shape shape) {
  Tensor t = Empty(dtype, std::move(shape));
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::Ones(DType dtype, Shape shape) { return Full(dtype, std::move(shape), 1.0); }

Tensor Tensor::Full(DType dtype, Shape shape, double value) {
  Tensor t = Empty(dtype, std::move(shape));
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    std::fill_n(static_cast<T*>(t.data_), t.numel_, static_cast<T>(value));
  });
  return t;
}

Tensor Tensor::Wrap(void* data, DType dtype, Shape shape, std::shared_ptr<void> keep_alive) {
  Tensor t;
  t.type_ = {dtype, std::move(shape)};
  t.numel_ = NumElements(t.type_.shape);
  // Without an owner: a pointer that owns nothing (the aliasing constructor
  // over an empty owner), so that wrapping allocates no control block.
  t.buffer_ = keep_alive ? std::move(keep_alive) : std::shared_ptr<void>(std::shared_ptr<void>(), data);
  t.data_ = data;
  return t;
}

void Tensor::CheckDType(DType expected) const {
  if (!defined()) throw std::logic_error("access to an undefined tensor");
  if (expected != type_.dtype) {
    throw std::logic_error("tensor of " + std::string(DTypeName(type_.dtype)) + " accessed as " +
                           std::string(DTypeName(expected)));
  }
}

double Tensor::ElementAsDouble(int64_t i) const {
  return DispatchDType(dtype(), [&](auto zero) {
    using T = decltype(zero);
    return static_cast<double>(static_cast<const T*>(data_)[i]);
  });
}

double Tensor::item() const {
  if (numel_ != 1) {
    throw std::invalid_argument("item() of a tensor with shape " + ShapeToString(shape()));
  }
  return ElementAsDouble(0);
}

Tensor Tensor::Clone() const {
  if (!defined()) return {};
  Tensor t = Empty(dtype(), shape());
  std::memcpy(t.data_, data_, nbytes());
  return t;
}

Tensor Tensor::Reshaped(Shape new_shape) const {
  if (NumElements(new_shape) != numel_) {
    throw std::invalid_argument("cannot reshape " + ShapeToString(shape()) + " to " +
                                ShapeToString(new_shape));
  }
  Tensor t = *this;
  t.type_.shape = std::move(new_shape);
  return t;
}

namespace {

constexpr int64_t kElideAbove = 1000;  // elements; numpy's threshold
constexpr int64_t kEdgeItems = 3;

void FormatElement(std::ostringstream& os, const Tensor& t, int64_t i) {
  double v = t.ElementAsDouble(i);
  if (t.dtype() == DType::kBool) {
    os << (v != 0 ? "true" : "false");
  } else if (t.dtype() == DType::kI64) {
    os << static_cast<int64_t>(v);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    os << buf;
  }
}

void FormatDim(std::ostringstream& os, const Tensor& t, int dim, int64_t offset,
               const Shape& strides, bool elide) {
  int64_t n = t.shape()[dim];
  os << '[';
  for (int64_t i = 0; i < n; ++i) {
    if (elide && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << "..., ";
      i = n - kEdgeItems - 1;
      continue;
    }
    if (dim + 1 == t.rank()) {
      FormatElement(os, t, offset + i);
    } else {
      FormatDim(os, t, dim + 1, offset + i * strides[dim], strides, elide);
    }
    if (i + 1 < n) {
      os << (dim + 1 == t.rank() ? ", " : ",\n" + std::string(dim + 1, ' '));
    }
  }
  os << ']';
}

}  // namespace

std::string Tensor::ToString() const {
  if (!defined()) return "<undefined tensor>";
  std::ostringstream os;
  if (rank() == 0) {
    FormatElement(os, *this, 0);
  } else {
    FormatDim(os, *this, 0, 0, strides(), numel_ > kElideAbove);
  }
  return os.str();
}

bool Equal(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  return a.type() == b.type() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

bool AllClose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (!a.defined() || !b.defined() || a.type() != b.type()) return false;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.ElementAsDouble(i), y = b.ElementAsDouble(i);
    if (std::isnan(x) || std::isnan(y)) {
      if (std::isnan(x) != std::isnan(y)) return false;
      continue;
    }
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) return false;
  }
  return true;
}

double MaxRelativeError(const Tensor& a, const Tensor& b, double atol) {
  if (a.type() != b.type()) return INFINITY;
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    double x = a.ElementAsDouble(i), y = b.ElementAsDouble(i);
    worst = std::max(worst, std::abs(x - y) / (atol + std::abs(y)));
  }
  return worst;
}

}  // namespace pejit
