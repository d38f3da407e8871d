// \file Element types of tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pejit {

// f32 is what models compute in; f64 exists so gradients can be checked
// against finite differences; i64 holds indices, labels and counters.
enum class DType : uint8_t { kF32, kF64, kI64, kBool };

size_t SizeOf(DType dtype);
std::string_view DTypeName(DType dtype);  // "f32", "f64", "i64", "bool"
std::optional<DType> ParseDType(std::string_view name);
inline bool IsFloat(DType d) { return d == DType::kF32 || d == DType::kF64; }

// Calls fn(T{}) with the C++ type of `dtype` (bool tensors hold one byte each).
template <typename Fn>
decltype(auto) DispatchDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32: return fn(float{});
    case DType::kF64: return fn(double{});
    case DType::kI64: return fn(int64_t{});
    case DType::kBool: return fn(bool{});
  }
  __builtin_unreachable();
}

template <typename T> constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kF32; }
template <> constexpr DType DTypeOf<double>() { return DType::kF64; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kI64; }
template <> constexpr DType DTypeOf<bool>() { return DType::kBool; }

}  // namespace pejit
