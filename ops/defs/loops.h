// \file Internal to ops/: loops shared by kernels (broadcast rows, axis splits).
#pragma once

#include <array>

#include "ops/tensor.h"

namespace pejit {

// Strides (in elements) that read a tensor of `shape` broadcast to `out`: 0
// along broadcast dimensions. `shape` is right-aligned with `out`.
inline Shape BroadcastStrides(const Shape& shape, const Shape& out) {
  Shape strides(out.size(), 0);
  Shape own = RowMajorStrides(shape);
  size_t offset = out.size() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    strides[offset + i] = shape[i] == 1 ? 0 : own[i];
  }
  return strides;
}

// Calls row(out_offset, in_offsets, n, inner_strides) for each innermost row
// of `out` (n elements), with the offsets of each of the N inputs. The inner
// strides are 0 or 1, so the row loop is a plain vectorizable loop.
template <size_t N, typename Row>
void ForEachBroadcastRow(const Shape& out, const std::array<Shape, N>& in_strides, Row&& row) {
  int rank = static_cast<int>(out.size());
  int64_t total = NumElements(out);
  if (total == 0) return;
  if (rank == 0) {
    row(int64_t{0}, std::array<int64_t, N>{}, int64_t{1}, std::array<int64_t, N>{});
    return;
  }
  int64_t n = out[rank - 1];
  std::array<int64_t, N> inner{};
  for (size_t k = 0; k < N; ++k) inner[k] = in_strides[k][rank - 1];
  Shape index(rank, 0);
  std::array<int64_t, N> offsets{};
  for (int64_t out_offset = 0; out_offset < total; out_offset += n) {
    row(out_offset, offsets, n, inner);
    // Advance the multi-index over all but the innermost dimension.
    for (int d = rank - 2; d >= 0; --d) {
      ++index[d];
      for (size_t k = 0; k < N; ++k) offsets[k] += in_strides[k][d];
      if (index[d] < out[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= index[d] * in_strides[k][d];
      index[d] = 0;
    }
  }
}

// Elements before `axis`, along it, and after it.
struct AxisSplit {
  int64_t outer = 1, along = 1, inner = 1;
};
inline AxisSplit SplitAt(const Shape& shape, int axis) {
  AxisSplit s;
  for (int i = 0; i < axis; ++i) s.outer *= shape[i];
  s.along = shape[axis];
  for (size_t i = axis + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

}  // namespace pejit
