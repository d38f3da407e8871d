// Injective operators that move elements without computing on them:
// transpose, reshape, expand_dims, squeeze, concat, stack, split, chunk, slice, pad,
// broadcast_to, and sum_to (broadcast_to's gradient, a reduction).
#include <algorithm>
#include <cstring>
#include <numeric>

#include "ops/defs/loops.h"
#include "ops/defs/defs.h"

namespace pejit {
namespace {

using Ints = std::vector<int64_t>;

bool Known(int64_t d) { return d != kUnknownDim; }

// Copies a strided view of `in` (starting at element `base`, with `strides`
// per output dimension) into the contiguous `out`.
void StridedCopy(const Tensor& in, int64_t base, const Shape& strides, Tensor& out) {
  DispatchDType(in.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = in.data<T>() + base;
    T* dst = out.data<T>();
    ForEachBroadcastRow<1>(out.shape(), std::array<Shape, 1>{strides},
                           [&](int64_t o, auto off, int64_t n, auto inner) {
                             const T* s = src + off[0];
                             if (inner[0] == 1) {
                               std::copy_n(s, n, dst + o);
                             } else {
                               for (int64_t i = 0; i < n; ++i) dst[o + i] = s[i * inner[0]];
                             }
                           });
  });
}

void CopyBytes(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  std::memcpy(out[0].raw_data(), in[0].raw_data(), in[0].nbytes());
}

// ---- transpose --------------------------------------------------------------

Ints Permutation(const Attrs& attrs, int rank) {
  Ints perm = attrs.GetInts("perm");
  if (perm.empty()) {
    for (int i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  return perm;
}

std::vector<TensorType> TransposeType(std::span<const TensorType> in, const Attrs& attrs) {
  Ints perm = Permutation(attrs, in[0].rank());
  Ints sorted = perm;
  std::sort(sorted.begin(), sorted.end());
  Ints identity(in[0].rank());
  std::iota(identity.begin(), identity.end(), 0);
  if (sorted != identity) {
    throw OpError("transpose", "perm " + AttrValueToString(perm) + " is not a permutation of the " +
                                   std::to_string(in[0].rank()) + " axes of x " + ShapeToString(in[0].shape));
  }
  Shape out;
  for (int64_t p : perm) out.push_back(in[0].shape[p]);
  return {{in[0].dtype, out}};
}

void TransposeKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  Ints perm = Permutation(attrs, in[0].rank());
  Shape own = in[0].strides(), strides;
  for (int64_t p : perm) strides.push_back(own[p]);
  StridedCopy(in[0], 0, strides, out[0]);
}

// ---- reshape, expand_dims, squeeze ------------------------------------------

std::vector<TensorType> ReshapeType(std::span<const TensorType> in, const Attrs& attrs) {
  Shape target = attrs.GetInts("shape");
  int infer_at = -1;
  int64_t known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] == -1) {
      if (infer_at >= 0) throw OpError("reshape", "shape " + ShapeToString(target) + " has more than one -1");
      infer_at = static_cast<int>(i);
    } else if (target[i] < 0) {
      throw OpError("reshape", "shape " + AttrValueToString(target) + " has a negative dimension");
    } else if (__builtin_mul_overflow(known, target[i], &known)) {
      throw OpError("reshape", "shape " + AttrValueToString(target) + " has more elements than 2^63");
    }
  }
  if (!in[0].IsFullyKnown()) return {{in[0].dtype, target}};  // -1 stays unknown
  int64_t total = NumElements(in[0].shape);
  if (infer_at >= 0) {
    if (known == 0 || total % known != 0) {
      throw OpError("reshape", "cannot reshape x " + ShapeToString(in[0].shape) + " to " +
                                   AttrValueToString(target));
    }
    target[infer_at] = total / known;
  }
  if (NumElements(target) != total) {
    throw OpError("reshape", "cannot reshape x " + ShapeToString(in[0].shape) + " (" + std::to_string(total) +
                                 " elements) to " + ShapeToString(target));
  }
  return {{in[0].dtype, target}};
}

std::vector<GradValue> ReshapeGrad(GradBuilder& b, const GradContext& c) {
  return {b.Emit("reshape", {c.output_grads[0]}, {{"shape", b.TypeOf(c.inputs[0]).shape}})};
}

std::vector<TensorType> ExpandDimsType(std::span<const TensorType> in, const Attrs& attrs) {
  Shape out = in[0].shape;
  int axis = NormalizeAxis("expand_dims", attrs.GetInt("axis"), in[0].rank() + 1);
  out.insert(out.begin() + axis, 1);
  return {{in[0].dtype, out}};
}

std::vector<TensorType> SqueezeType(std::span<const TensorType> in, const Attrs& attrs) {
  const Shape& shape = in[0].shape;
  std::vector<bool> drop(shape.size(), false);
  const Ints& axes = attrs.GetInts("axes");
  if (axes.empty()) {
    for (size_t i = 0; i < shape.size(); ++i) drop[i] = shape[i] == 1;
  }
  for (int64_t a : axes) {
    int axis = NormalizeAxis("squeeze", a, in[0].rank());
    if (shape[axis] != 1 && Known(shape[axis])) {
      throw OpError("squeeze", "axis " + std::to_string(a) + " of x " + ShapeToString(shape) + " is not 1");
    }
    drop[axis] = true;
  }
  Shape out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (!drop[i]) out.push_back(shape[i]);
  }
  return {{in[0].dtype, out}};
}

// ---- concat, stack, split ----------------------------------------------------

std::vector<TensorType> ConcatType(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType& first = in[0];
  if (first.rank() == 0) throw OpError("concat", "cannot concatenate scalars (use stack)");
  int axis = NormalizeAxis("concat", attrs.GetInt("axis"), first.rank());
  Shape out = first.shape;
  for (size_t i = 1; i < in.size(); ++i) {
    const TensorType& t = in[i];
    bool ok = t.dtype == first.dtype && t.rank() == first.rank();
    for (int d = 0; ok && d < first.rank(); ++d) {
      if (d != axis && t.shape[d] != first.shape[d] && Known(t.shape[d]) && Known(first.shape[d])) ok = false;
    }
    if (!ok) {
      throw OpError("concat", "input " + std::to_string(i) + " " + t.ToString() + " does not match input 0 " +
                                  first.ToString() + " outside axis " + std::to_string(axis));
    }
    out[axis] = Known(out[axis]) && Known(t.shape[axis]) ? out[axis] + t.shape[axis] : kUnknownDim;
  }
  return {{first.dtype, out}};
}

void ConcatKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  int axis = NormalizeAxis("concat", attrs.GetInt("axis"), in[0].rank());
  size_t elem = SizeOf(out[0].dtype());
  AxisSplit o = SplitAt(out[0].shape(), axis);
  char* dst = static_cast<char*>(out[0].raw_data());
  int64_t row_bytes = o.along * o.inner * elem;
  int64_t offset = 0;
  for (const Tensor& t : in) {
    int64_t block = t.shape()[axis] * o.inner * elem;
    const char* src = static_cast<const char*>(t.raw_data());
    for (int64_t i = 0; i < o.outer; ++i) std::memcpy(dst + i * row_bytes + offset, src + i * block, block);
    offset += block;
  }
}

// Gradient of concatenating along `axis`: each input's slice of the gradient.
std::vector<GradValue> SliceBack(GradBuilder& b, GradValue g, std::span<const GradValue> inputs, int axis,
                                 bool squeeze) {
  std::vector<GradValue> grads;
  int64_t offset = 0;
  for (GradValue input : inputs) {
    int64_t size = squeeze ? 1 : b.TypeOf(input).shape[axis];
    GradValue piece = b.Emit("slice", {g}, {{"axes", Ints{axis}}, {"begins", Ints{offset}}, {"ends", Ints{offset + size}}});
    if (squeeze) piece = b.Emit("reshape", {piece}, {{"shape", b.TypeOf(input).shape}});
    grads.push_back(piece);
    offset += size;
  }
  return grads;
}

std::vector<TensorType> StackType(std::span<const TensorType> in, const Attrs& attrs) {
  int axis = NormalizeAxis("stack", attrs.GetInt("axis"), in[0].rank() + 1);
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i] != in[0]) {
      throw OpError("stack", "input " + std::to_string(i) + " " + in[i].ToString() + " differs from input 0 " +
                                 in[0].ToString());
    }
  }
  Shape out = in[0].shape;
  out.insert(out.begin() + axis, static_cast<int64_t>(in.size()));
  return {{in[0].dtype, out}};
}

std::vector<TensorType> SplitType(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[0].rank() == 0) throw OpError("split", "cannot split a scalar");
  int axis = NormalizeAxis("split", attrs.GetInt("axis"), in[0].rank());
  const Ints& sizes = attrs.GetInts("sizes");
  if (sizes.empty()) throw OpError("split", "sizes must not be empty");
  int64_t total = 0;
  std::vector<TensorType> out;
  for (int64_t s : sizes) {
    if (s < 0) throw OpError("split", "sizes " + AttrValueToString(sizes) + " has a negative size");
    if (__builtin_add_overflow(total, s, &total)) {
      throw OpError("split", "sizes " + AttrValueToString(sizes) + " add up to more than 2^63");
    }
    TensorType t = in[0];
    t.shape[axis] = s;
    out.push_back(t);
  }
  if (Known(in[0].shape[axis]) && total != in[0].shape[axis]) {
    throw OpError("split", "sizes " + AttrValueToString(sizes) + " add up to " + std::to_string(total) +
                               ", not to dimension " + std::to_string(axis) + " of x " + ShapeToString(in[0].shape));
  }
  return out;
}

// chunk: split into `chunks` equal pieces (sizes follow from the input, so a
// model can split gates without knowing its hidden size).
std::vector<TensorType> ChunkType(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[0].rank() == 0) throw OpError("chunk", "cannot chunk a scalar");
  int axis = NormalizeAxis("chunk", attrs.GetInt("axis"), in[0].rank());
  int64_t chunks = attrs.GetInt("chunks");
  if (chunks < 1) throw OpError("chunk", "chunks must be >= 1, got " + std::to_string(chunks));
  int64_t dim = in[0].shape[axis];
  if (Known(dim) && dim % chunks != 0) {
    throw OpError("chunk", "dimension " + std::to_string(axis) + " of x " + ShapeToString(in[0].shape) +
                               " does not divide into " + std::to_string(chunks) + " chunks");
  }
  TensorType piece = in[0];
  piece.shape[axis] = Known(dim) ? dim / chunks : kUnknownDim;
  return std::vector<TensorType>(chunks, piece);
}

void SplitKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  int axis = NormalizeAxis("split", attrs.GetInt("axis"), in[0].rank());
  size_t elem = SizeOf(in[0].dtype());
  AxisSplit s = SplitAt(in[0].shape(), axis);
  const char* src = static_cast<const char*>(in[0].raw_data());
  int64_t row_bytes = s.along * s.inner * elem;
  int64_t offset = 0;
  for (Tensor& t : out) {
    int64_t block = t.shape()[axis] * s.inner * elem;
    char* dst = static_cast<char*>(t.raw_data());
    for (int64_t i = 0; i < s.outer; ++i) std::memcpy(dst + i * block, src + i * row_bytes + offset, block);
    offset += block;
  }
}

std::vector<GradValue> SplitGrad(GradBuilder& b, const GradContext& c) {
  std::vector<GradValue> pieces;
  for (size_t i = 0; i < c.outputs.size(); ++i) {
    GradValue g = c.output_grads[i];
    pieces.push_back(g != kNoGrad ? g : b.Zeros(b.TypeOf(c.outputs[i])));
  }
  std::vector<GradValue> grads = b.EmitOp(LookupOp("concat"), pieces, {{"axis", c.attrs.GetInt("axis")}});
  return grads;
}

// ---- slice and pad -----------------------------------------------------------

// Per-dimension [begin, end) of a slice, negative indices counted from the end.
struct SliceBounds {
  Shape begin, end;
};

SliceBounds Bounds(const Shape& shape, const Attrs& attrs) {
  const Ints &axes = attrs.GetInts("axes"), &begins = attrs.GetInts("begins"), &ends = attrs.GetInts("ends");
  if (axes.size() != begins.size() || axes.size() != ends.size()) {
    throw OpError("slice", "axes, begins and ends must have the same length, got " + std::to_string(axes.size()) +
                               ", " + std::to_string(begins.size()) + " and " + std::to_string(ends.size()));
  }
  SliceBounds b{Shape(shape.size(), 0), shape};
  for (size_t i = 0; i < axes.size(); ++i) {
    int axis = NormalizeAxis("slice", axes[i], static_cast<int>(shape.size()));
    int64_t dim = shape[axis];
    if (!Known(dim)) {
      if (begins[i] < 0 || ends[i] < 0) {
        throw OpError("slice", "negative bounds on axis " + std::to_string(axis) + " of unknown size");
      }
      b.begin[axis] = begins[i];
      b.end[axis] = ends[i];
      continue;
    }
    int64_t lo = begins[i] < 0 ? begins[i] + dim : begins[i];
    int64_t hi = ends[i] < 0 ? ends[i] + dim : ends[i];
    if (lo < 0 || hi > dim || lo > hi) {
      throw OpError("slice", "bounds [" + std::to_string(begins[i]) + ", " + std::to_string(ends[i]) +
                                 ") are out of range for axis " + std::to_string(axis) + " of x " +
                                 ShapeToString(shape));
    }
    b.begin[axis] = lo;
    b.end[axis] = hi;
  }
  return b;
}

std::vector<TensorType> SliceType(std::span<const TensorType> in, const Attrs& attrs) {
  SliceBounds b = Bounds(in[0].shape, attrs);
  Shape out(in[0].shape.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = Known(b.end[i]) ? b.end[i] - b.begin[i] : kUnknownDim;
  return {{in[0].dtype, out}};
}

void SliceKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  SliceBounds b = Bounds(in[0].shape(), attrs);
  Shape strides = in[0].strides();
  int64_t base = 0;
  for (size_t i = 0; i < strides.size(); ++i) base += b.begin[i] * strides[i];
  if (out[0].numel() > 0) StridedCopy(in[0], base, strides, out[0]);
}

std::vector<GradValue> SliceGrad(GradBuilder& b, const GradContext& c) {
  const Shape shape = b.TypeOf(c.inputs[0]).shape;
  SliceBounds bounds = Bounds(shape, c.attrs);
  Ints before(shape.size()), after(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    before[i] = bounds.begin[i];
    after[i] = shape[i] - bounds.end[i];
  }
  return {b.Emit("pad", {c.output_grads[0]}, {{"before", before}, {"after", after}})};
}

std::vector<TensorType> PadType(std::span<const TensorType> in, const Attrs& attrs) {
  const Ints &before = attrs.GetInts("before"), &after = attrs.GetInts("after");
  if (before.size() != in[0].shape.size() || after.size() != in[0].shape.size()) {
    throw OpError("pad", "before and after need one entry per dimension of x " + ShapeToString(in[0].shape));
  }
  Shape out = in[0].shape;
  for (size_t i = 0; i < out.size(); ++i) {
    if (before[i] < 0 || after[i] < 0) throw OpError("pad", "negative padding");
    if (Known(out[i]) && (__builtin_add_overflow(out[i], before[i], &out[i]) ||
                          __builtin_add_overflow(out[i], after[i], &out[i]))) {
      throw OpError("pad", "the padded shape has a dimension past 2^63");
    }
  }
  return {{in[0].dtype, out}};
}

void PadKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  std::memset(out[0].raw_data(), 0, out[0].nbytes());
  if (in[0].numel() == 0) return;
  const Ints& before = attrs.GetInts("before");
  Shape out_strides = out[0].strides();
  int64_t base = 0;
  for (size_t i = 0; i < before.size(); ++i) base += before[i] * out_strides[i];
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = in[0].data<T>();
    T* dst = out[0].data<T>() + base;
    ForEachBroadcastRow<1>(in[0].shape(), std::array<Shape, 1>{out_strides},
                           [&](int64_t o, auto off, int64_t n, auto) { std::copy_n(src + o, n, dst + off[0]); });
  });
}

std::vector<GradValue> PadGrad(GradBuilder& b, const GradContext& c) {
  const Shape shape = b.TypeOf(c.inputs[0]).shape;
  const Ints& before = c.attrs.GetInts("before");
  Ints axes, begins, ends;
  for (size_t i = 0; i < shape.size(); ++i) {
    axes.push_back(static_cast<int64_t>(i));
    begins.push_back(before[i]);
    ends.push_back(before[i] + shape[i]);
  }
  return {b.Emit("slice", {c.output_grads[0]}, {{"axes", axes}, {"begins", begins}, {"ends", ends}})};
}

// ---- broadcast_to and sum_to ---------------------------------------------------

// A target shape's dimensions are sizes, or -1: rows known at call time
// (vectorized code).
void RequireTargetShape(const char* op, const Shape& target) {
  for (int64_t d : target) {
    if (d < 0 && d != kUnknownDim) throw OpError(op, "shape " + AttrValueToString(target) + " has a negative dimension");
  }
}

std::vector<TensorType> BroadcastToType(std::span<const TensorType> in, const Attrs& attrs) {
  const Shape& target = attrs.GetInts("shape");
  RequireTargetShape("broadcast_to", target);
  Shape out = BroadcastShapes("broadcast_to", "x", in[0].shape, "shape", target);
  if (out != target) {
    throw OpError("broadcast_to", "cannot broadcast x " + ShapeToString(in[0].shape) + " to " + ShapeToString(target));
  }
  return {{in[0].dtype, out}};
}

void BroadcastToKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  StridedCopy(in[0], 0, BroadcastStrides(in[0].shape(), out[0].shape()), out[0]);
}

std::vector<TensorType> SumToType(std::span<const TensorType> in, const Attrs& attrs) {
  const Shape& target = attrs.GetInts("shape");
  RequireTargetShape("sum_to", target);
  Shape out = BroadcastShapes("sum_to", "shape", target, "x", in[0].shape);
  if (out != in[0].shape) {
    throw OpError("sum_to", "x " + ShapeToString(in[0].shape) + " is not a broadcast of " + ShapeToString(target));
  }
  RequireDType("sum_to", "x", in[0], {DType::kF32, DType::kF64, DType::kI64});
  return {{in[0].dtype, target}};
}

}  // namespace

// Sums `in` into `out`, whose shape `in` is a broadcast of. Shared with reduce.cc.
void SumToKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (!std::is_same_v<T, bool>) {
      const T* src = in[0].data<T>();
      T* dst = out[0].data<T>();
      std::fill_n(dst, out[0].numel(), T(0));
      ForEachBroadcastRow<1>(in[0].shape(), std::array<Shape, 1>{BroadcastStrides(out[0].shape(), in[0].shape())},
                             [&](int64_t o, auto off, int64_t n, auto inner) {
                               const T* s = src + o;
                               T* d = dst + off[0];
                               if (inner[0] == 1) {
                                 for (int64_t i = 0; i < n; ++i) d[i] += s[i];
                               } else {
                                 T acc = 0;
                                 for (int64_t i = 0; i < n; ++i) acc += s[i];
                                 d[0] += acc;
                               }
                             });
    }
  });
}

// zeros and ones: a tensor of the `shape` and `dtype` attributes.
std::vector<TensorType> FilledType(std::string_view op, const Attrs& attrs) {
  TensorType t{attrs.GetDType("dtype"), attrs.GetInts("shape")};
  for (int64_t d : t.shape) {
    if (d < 0) throw OpError(op, "shape " + ShapeToString(t.shape) + " has a negative dimension");
  }
  NumBytes(t);  // throws for a tensor too large to hold
  return {t};
}

void RegisterShapeOps(Registry& r) {
  auto add = [&r](std::string name, std::vector<std::string> inputs, std::vector<AttrSpec> attrs, TypeRule infer,
                  Kernel kernel, GradRule grad, FusionKind fusion = FusionKind::kInjective) -> OpDef& {
    OpDef op;
    op.name = std::move(name);
    op.input_names = std::move(inputs);
    op.attrs = std::move(attrs);
    op.fusion = fusion;
    op.infer = std::move(infer);
    op.kernel = std::move(kernel);
    op.grad = std::move(grad);
    return AddOp(r, std::move(op));
  };
  add("transpose", {"x"}, {{"perm", AttrKind::kInts, Ints{}}}, TransposeType, TransposeKernel,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        Ints perm = Permutation(c.attrs, b.TypeOf(c.inputs[0]).rank()), inverse(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int64_t>(i);
        return {b.Emit("transpose", {c.output_grads[0]}, {{"perm", inverse}})};
      })
      .batch = BatchRule::kShapeAttrs;
  for (bool one : {false, true}) {
    std::string name = one ? "ones" : "zeros";
    add(name, {}, {{"shape", AttrKind::kInts, std::nullopt}, {"dtype", AttrKind::kDType, DType::kF32}},
        [name](std::span<const TensorType>, const Attrs& attrs) { return FilledType(name, attrs); },
        [one](std::span<const Tensor>, std::span<Tensor> out, const Attrs&) {  // in place: out may be an arena's
          char* dst = static_cast<char*>(out[0].raw_data());
          if (!one) {
            std::fill_n(dst, out[0].nbytes(), char{0});
            return;
          }
          Tensor unit = Tensor::Ones(out[0].dtype(), {});
          for (size_t at = 0; at < out[0].nbytes(); at += unit.nbytes()) std::copy_n(static_cast<const char*>(unit.raw_data()), unit.nbytes(), dst + at);
        },
        nullptr, FusionKind::kOpaque);
  }
  // The dimensions of x as an i64 vector (rank,): what `?` stood for.
  add("shape_of", {"x"}, {},
      [](std::span<const TensorType> in, const Attrs&) -> std::vector<TensorType> {
        return {{DType::kI64, {static_cast<int64_t>(in[0].rank())}}};
      },
      [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
        std::copy(in[0].shape().begin(), in[0].shape().end(), out[0].data<int64_t>());
      },
      nullptr, FusionKind::kOpaque);
  OpDef& reshape = add("reshape", {"x"}, {{"shape", AttrKind::kInts, std::nullopt}}, ReshapeType, CopyBytes, ReshapeGrad);
  reshape.batch = BatchRule::kReshape;
  reshape.moves = MoveKind::kView;
  OpDef& expand_dims = add("expand_dims", {"x"}, {{"axis", AttrKind::kInt, std::nullopt}}, ExpandDimsType, CopyBytes,
                           ReshapeGrad);
  expand_dims.moves = MoveKind::kView;
  expand_dims.batch = BatchRule::kShapeAttrs;
  OpDef& squeeze = add("squeeze", {"x"}, {{"axes", AttrKind::kInts, Ints{}}}, SqueezeType, CopyBytes, ReshapeGrad);
  squeeze.moves = MoveKind::kView;
  squeeze.batch = BatchRule::kShapeAttrs;
  OpDef& concat = add("concat", {"inputs..."}, {{"axis", AttrKind::kInt, int64_t{0}}}, ConcatType, ConcatKernel,
                      [](GradBuilder& b, const GradContext& c) {
                        int axis = NormalizeAxis("concat", c.attrs.GetInt("axis"), b.TypeOf(c.outputs[0]).rank());
                        return SliceBack(b, c.output_grads[0], c.inputs, axis, false);
                      });
  concat.batch = BatchRule::kAxis;
  concat.moves = MoveKind::kConcat;
  OpDef& stack = add("stack", {"inputs..."}, {{"axis", AttrKind::kInt, int64_t{0}}}, StackType,
      [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
        // Stacking is concatenating inputs viewed with a size-1 axis inserted.
        int axis = NormalizeAxis("stack", attrs.GetInt("axis"), in[0].rank() + 1);
        std::vector<Tensor> expanded;
        for (const Tensor& t : in) {
          Shape s = t.shape();
          s.insert(s.begin() + axis, 1);
          expanded.push_back(t.Reshaped(s));
        }
        ConcatKernel(expanded, out, Attrs{{"axis", int64_t{axis}}});
      },
      [](GradBuilder& b, const GradContext& c) {
        int axis = NormalizeAxis("stack", c.attrs.GetInt("axis"), b.TypeOf(c.outputs[0]).rank());
        return SliceBack(b, c.output_grads[0], c.inputs, axis, true);
      });
  stack.moves = MoveKind::kConcat;
  stack.batch = BatchRule::kShapeAttrs;
  // Along an inner axis, each row of the pieces is the same row of x.
  auto inner_axis = [](std::span<const TensorType> in, const Attrs& attrs) {
    const int64_t axis = attrs.GetInt("axis");
    return in[0].rank() > 1 && axis != 0 && axis != -in[0].rank();
  };
  OpDef& split = add("split", {"x"}, {{"axis", AttrKind::kInt, int64_t{0}}, {"sizes", AttrKind::kInts, std::nullopt}},
                     SplitType, SplitKernel, SplitGrad);
  split.batch = BatchRule::kAxis;
  split.split = RowWiseSplit(SplitKernel, inner_axis);
  OpDef& chunk = add("chunk", {"x"}, {{"chunks", AttrKind::kInt, std::nullopt}, {"axis", AttrKind::kInt, int64_t{0}}},
                     ChunkType, SplitKernel, SplitGrad);
  chunk.batch = BatchRule::kAxis;
  chunk.split = RowWiseSplit(SplitKernel, inner_axis);
  OpDef& slice = add("slice", {"x"},
      {{"axes", AttrKind::kInts, std::nullopt}, {"begins", AttrKind::kInts, std::nullopt},
       {"ends", AttrKind::kInts, std::nullopt}},
      SliceType, SliceKernel, SliceGrad);
  slice.moves = MoveKind::kSlice;
  slice.batch = BatchRule::kShapeAttrs;
  add("pad", {"x"}, {{"before", AttrKind::kInts, std::nullopt}, {"after", AttrKind::kInts, std::nullopt}}, PadType,
      PadKernel, PadGrad)
      .batch = BatchRule::kShapeAttrs;
  add("broadcast_to", {"x"}, {{"shape", AttrKind::kInts, std::nullopt}}, BroadcastToType, BroadcastToKernel,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        return {b.SumTo(c.output_grads[0], b.TypeOf(c.inputs[0]).shape)};
      },
      FusionKind::kBroadcast)
      .batch = BatchRule::kShapeAttrs;
  add("sum_to", {"x"}, {{"shape", AttrKind::kInts, std::nullopt}}, SumToType, SumToKernel,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        return {b.BroadcastTo(c.output_grads[0], b.TypeOf(c.inputs[0]).shape)};
      },
      FusionKind::kReduction)
      .batch = BatchRule::kShapeAttrs;
}

}  // namespace pejit
