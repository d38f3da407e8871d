#include "jit/moves.h"

#include <algorithm>

#include "jit/straight.h"

namespace pejit {

void AppendBlock(std::vector<CopyBlock>& blocks, const CopyBlock& b) {
  if (b.bytes == 0) return;
  if (!blocks.empty()) {
    CopyBlock& last = blocks.back();
    if (last.input == b.input && last.from + last.bytes == b.from && last.to + last.bytes == b.to) {
      last.bytes += b.bytes;
      return;
    }
  }
  blocks.push_back(b);
}

std::optional<int64_t> ViewOffset(const OpCallNode& call, const TensorType& result) {
  const MoveKind moves = call.op->moves;
  if (moves == MoveKind::kNone) return std::nullopt;
  if (moves == MoveKind::kView) return 0;
  const TensorType in = TensorTypeOf(call.args[0]);
  const int64_t row_bytes = in.rank() == 0 ? 0 : NumElements(in.shape) / std::max<int64_t>(1, in.shape[0]) *
                                                      static_cast<int64_t>(SizeOf(in.dtype));
  if (moves == MoveKind::kGather && in.rank() >= 1) {
    // Rows first, last, first + 1, ... of the table: constant, consecutive indices.
    auto* index = As<ConstantNode>(call.args[1]);
    if (!index || index->value.numel() == 0) return std::nullopt;
    auto at = [&](int64_t i) { return static_cast<int64_t>(index->value.ElementAsDouble(i)); };
    const int64_t first = at(0);
    for (int64_t i = 1; i < index->value.numel(); ++i) {
      if (at(i) != first + i) return std::nullopt;
    }
    if (first < 0 || first + index->value.numel() > in.shape[0]) return std::nullopt;
    return first * row_bytes;
  }
  if (moves == MoveKind::kSlice && in.rank() >= 1) {
    // Contiguous when only the leading axis is cut.
    const Shape& out = result.shape;
    for (size_t a = 1; a < out.size(); ++a) {
      if (out[a] != in.shape[a]) return std::nullopt;
    }
    const std::vector<int64_t> axes = call.attrs.GetInts("axes"), begins = call.attrs.GetInts("begins");
    int64_t begin = 0;
    for (size_t i = 0; i < axes.size(); ++i) {
      int64_t axis = axes[i] < 0 ? axes[i] + in.rank() : axes[i];
      if (axis == 0) begin = begins[i] < 0 ? begins[i] + in.shape[0] : begins[i];
    }
    return begin * row_bytes;
  }
  return std::nullopt;
}

std::optional<std::vector<CopyBlock>> CopyBlocks(const OpCallNode& call, const TensorType& result) {
  constexpr int64_t kMaxCopyBlocks = 1 << 16;
  const MoveKind moves = call.op->moves;
  const int64_t elem = static_cast<int64_t>(SizeOf(result.dtype));
  auto product = [](const Shape& shape, size_t from, size_t to) {
    int64_t n = 1;
    for (size_t i = from; i < to; ++i) n *= shape[i];
    return n;
  };
  std::vector<CopyBlock> blocks;
  auto add = [&](int input, int64_t from, int64_t to, int64_t bytes) { AppendBlock(blocks, {input, from, to, bytes}); };
  if (moves == MoveKind::kCopy) {
    add(0, 0, 0, NumElements(result.shape) * elem);
    return blocks;
  }
  if (moves == MoveKind::kGather) {
    auto* index = As<ConstantNode>(call.args[1]);
    const TensorType table = TensorTypeOf(call.args[0]);
    if (!index || index->value.numel() > kMaxCopyBlocks) return std::nullopt;
    const int64_t row = product(table.shape, 1, table.shape.size()) * elem;
    for (int64_t i = 0; i < index->value.numel(); ++i) {
      auto r = static_cast<int64_t>(index->value.ElementAsDouble(i));
      if (r < 0 || r >= table.shape[0]) return std::nullopt;
      add(0, r * row, i * row, row);
    }
    return blocks;
  }
  if (moves == MoveKind::kConcat) {
    // Per index of the axes before `axis`, each input's block in turn.
    const int rank = static_cast<int>(result.rank());
    int64_t axis = call.attrs.GetInt("axis");
    if (axis < 0) axis += rank;
    const int64_t outer = product(result.shape, 0, static_cast<size_t>(axis));
    if (outer * static_cast<int64_t>(call.args.size()) > kMaxCopyBlocks) return std::nullopt;
    std::vector<int64_t> piece(call.args.size());
    for (size_t i = 0; i < call.args.size(); ++i) piece[i] = NumElements(TensorTypeOf(call.args[i]).shape) / outer * elem;
    int64_t to = 0;
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t i = 0; i < call.args.size(); ++i) {
        add(static_cast<int>(i), o * piece[i], to, piece[i]);
        to += piece[i];
      }
    }
    return blocks;
  }
  if (moves == MoveKind::kSlice) {
    // Contiguous runs: the last axis cut and every axis after it.
    const Shape in = TensorTypeOf(call.args[0]).shape;
    const size_t rank = in.size();
    Shape begin(rank, 0);
    const std::vector<int64_t> axes = call.attrs.GetInts("axes"), begins = call.attrs.GetInts("begins");
    for (size_t i = 0; i < axes.size(); ++i) {
      int64_t axis = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
      begin[axis] = begins[i] < 0 ? begins[i] + in[axis] : begins[i];
    }
    size_t cut = 0;  // the last axis whose extent changes, + 1
    for (size_t a = 0; a < rank; ++a) {
      if (result.shape[a] != in[a]) cut = a + 1;
    }
    if (cut == 0) {
      add(0, 0, 0, NumElements(in) * elem);
      return blocks;
    }
    const int64_t runs = product(result.shape, 0, cut - 1);
    if (runs > kMaxCopyBlocks) return std::nullopt;
    const Shape strides = RowMajorStrides(in);
    const int64_t run = result.shape[cut - 1] * strides[cut - 1] * elem;
    Shape at(cut - 1, 0);  // index over the axes before the cut one
    for (int64_t r = 0; r < runs; ++r) {
      int64_t from = begin[cut - 1] * strides[cut - 1];
      for (size_t a = 0; a + 1 < cut; ++a) from += (begin[a] + at[a]) * strides[a];
      add(0, from * elem, r * run, run);
      for (size_t a = cut - 1; a-- > 0;) {  // next index, last axis fastest
        if (++at[a] < result.shape[a]) break;
        at[a] = 0;
      }
    }
    return blocks;
  }
  return std::nullopt;
}

}  // namespace pejit
