#include "ops/dtype.h"

namespace pejit {

size_t SizeOf(DType dtype) {
  return DispatchDType(dtype, [](auto v) { return sizeof(v); });
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI64: return "i64";
    case DType::kBool: return "bool";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (DType d : {DType::kF32, DType::kF64, DType::kI64, DType::kBool}) {
    if (DTypeName(d) == name) return d;
  }
  return std::nullopt;
}

}  // namespace pejit
