#include <algorithm>

#include "ops/defs/defs.h"

namespace pejit {

Shape BroadcastShapes(std::string_view op, const std::string& lhs_name, const Shape& lhs,
                      const std::string& rhs_name, const Shape& rhs) {
  size_t rank = std::max(lhs.size(), rhs.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t a = i < rank - lhs.size() ? 1 : lhs[i - (rank - lhs.size())];
    int64_t b = i < rank - rhs.size() ? 1 : rhs[i - (rank - rhs.size())];
    if (a == b || b == 1) {
      out[i] = a;
    } else if (a == 1) {
      out[i] = b;
    } else if (a == kUnknownDim || b == kUnknownDim) {
      // One side is known and not 1: a match is the only valid outcome.
      out[i] = a == kUnknownDim ? b : a;
    } else {
      throw OpError(op, "cannot broadcast " + lhs_name + " " + ShapeToString(lhs) + " with " +
                            rhs_name + " " + ShapeToString(rhs));
    }
  }
  return out;
}

int NormalizeAxis(std::string_view op, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank) {
    throw OpError(op, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

void RequireDType(std::string_view op, const std::string& input, const TensorType& type,
                  std::initializer_list<DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), type.dtype) != allowed.end()) return;
  std::string names;
  for (DType d : allowed) names += std::string(names.empty() ? "" : " or ") + std::string(DTypeName(d));
  throw OpError(op, input + " must be " + names + ", got " + type.ToString());
}

}  // namespace pejit
