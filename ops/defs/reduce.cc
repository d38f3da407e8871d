// Reductions: sum, mean, max, min, logsumexp and norm over axes (with
// keepdims), argmax, argmin, softmax, log_softmax.
#include <cmath>
#include <limits>

#include "ops/defs/loops.h"
#include "ops/defs/defs.h"

namespace pejit {

void SumToKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs);  // shape.cc

namespace {

using Ints = std::vector<int64_t>;

// Which axes a reduction removes: `axes`, or all of them when empty.
std::vector<bool> ReducedAxes(std::string_view op, const Ints& axes, int rank) {
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) {
    int axis = NormalizeAxis(op, a, rank);
    if (reduced[axis]) throw OpError(op, "axis " + std::to_string(a) + " is given twice");
    reduced[axis] = true;
  }
  return reduced;
}

// The input's shape with reduced axes set to 1: the output's elements in order.
Shape KeepDimsShape(std::string_view op, const Shape& shape, const Ints& axes) {
  std::vector<bool> reduced = ReducedAxes(op, axes, static_cast<int>(shape.size()));
  Shape keep = shape;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (reduced[i]) keep[i] = 1;
  }
  return keep;
}

TypeRule ReduceType(std::string op, bool float_only) {
  return [op, float_only](std::span<const TensorType> in, const Attrs& attrs) -> std::vector<TensorType> {
    if (float_only) {
      RequireDType(op, "x", in[0], {DType::kF32, DType::kF64});
    } else {
      RequireDType(op, "x", in[0], {DType::kF32, DType::kF64, DType::kI64});
    }
    const Ints& axes = attrs.GetInts("axes");
    std::vector<bool> reduced = ReducedAxes(op, axes, in[0].rank());
    Shape out;
    for (int i = 0; i < in[0].rank(); ++i) {
      if (!reduced[i]) {
        out.push_back(in[0].shape[i]);
      } else if (attrs.GetBool("keepdims")) {
        out.push_back(1);
      }
    }
    return {{in[0].dtype, out}};
  };
}

// The output gradient reshaped to keepdims form, broadcast back to x's shape.
GradValue SpreadBack(GradBuilder& b, const GradContext& c, GradValue g) {
  const Shape x_shape = b.TypeOf(c.inputs[0]).shape;
  Shape keep = KeepDimsShape("reduce", x_shape, c.attrs.GetInts("axes"));
  GradValue kept = b.Emit("reshape", {g}, {{"shape", keep}});
  return b.BroadcastTo(kept, x_shape);
}

void SumKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  Tensor kept = out[0].Reshaped(KeepDimsShape("sum", in[0].shape(), attrs.GetInts("axes")));
  std::array<Tensor, 1> outs = {kept};
  SumToKernel(in, outs, attrs);
}

void MeanKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  SumKernel(in, out, attrs);
  int64_t count = out[0].numel() == 0 ? 1 : in[0].numel() / out[0].numel();
  DispatchDType(out[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      T* p = out[0].data<T>();
      const T scale = T(1) / static_cast<T>(count);
      for (int64_t i = 0; i < out[0].numel(); ++i) p[i] *= scale;
    }
  });
}

// max (kMin false) or min over axes.
template <bool kMin>
void ExtremumKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const char* name = kMin ? "min" : "max";
  if (in[0].numel() == 0 && out[0].numel() > 0) throw OpError(name, "reduction over an empty axis");
  Shape keep = KeepDimsShape(name, in[0].shape(), attrs.GetInts("axes"));
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (!std::is_same_v<T, bool>) {
      auto better = [](T a, T b) { return kMin ? a < b : a > b; };
      const T* src = in[0].data<T>();
      T* dst = out[0].data<T>();
      std::fill_n(dst, out[0].numel(), kMin ? std::numeric_limits<T>::max() : std::numeric_limits<T>::lowest());
      ForEachBroadcastRow<1>(in[0].shape(), std::array<Shape, 1>{BroadcastStrides(keep, in[0].shape())},
                             [&](int64_t o, auto off, int64_t n, auto inner) {
                               const T* s = src + o;
                               T* d = dst + off[0];
                               if (inner[0] == 1) {
                                 for (int64_t i = 0; i < n; ++i) d[i] = better(s[i], d[i]) ? s[i] : d[i];
                               } else {
                                 T m = d[0];
                                 for (int64_t i = 0; i < n; ++i) m = better(s[i], m) ? s[i] : m;
                                 d[0] = m;
                               }
                             });
    }
  });
}

// log(sum(exp(x))) over axes, stable: the max is taken out first. An empty
// reduction gives -inf (log 0).
void LogSumExpKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  Shape keep = KeepDimsShape("logsumexp", in[0].shape(), attrs.GetInts("axes"));
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      T* dst = out[0].data<T>();
      const int64_t n_out = out[0].numel();
      if (in[0].numel() == 0) {
        std::fill_n(dst, n_out, -std::numeric_limits<T>::infinity());
        return;
      }
      Tensor m = Tensor::Empty(in[0].dtype(), keep);
      std::array<Tensor, 1> ms = {m};
      ExtremumKernel<false>(in, ms, attrs);
      T* pm = m.data<T>();
      for (int64_t i = 0; i < n_out; ++i) {
        if (!std::isfinite(pm[i])) pm[i] = 0;  // all -inf (or an inf, a NaN): the shift changes nothing
      }
      std::fill_n(dst, n_out, T(0));
      const T* src = in[0].data<T>();
      ForEachBroadcastRow<1>(in[0].shape(), std::array<Shape, 1>{BroadcastStrides(keep, in[0].shape())},
                             [&](int64_t o, auto off, int64_t n, auto inner) {
                               const T* s = src + o;
                               for (int64_t i = 0; i < n; ++i) {
                                 const int64_t k = off[0] + i * inner[0];
                                 dst[k] += std::exp(s[i] - pm[k]);
                               }
                             });
      for (int64_t i = 0; i < n_out; ++i) dst[i] = pm[i] + std::log(dst[i]);
    }
  });
}

// The Euclidean norm over axes: sqrt(sum(x * x)).
void NormKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      Tensor squares = Tensor::Empty(in[0].dtype(), in[0].shape());
      const T* x = in[0].data<T>();
      T* sq = squares.data<T>();
      for (int64_t i = 0; i < in[0].numel(); ++i) sq[i] = x[i] * x[i];
      std::array<Tensor, 1> ins = {squares};
      SumKernel(ins, out, attrs);
      T* y = out[0].data<T>();
      for (int64_t i = 0; i < out[0].numel(); ++i) y[i] = std::sqrt(y[i]);
    }
  });
}

// A reduction's result and its output gradient, broadcast back to x's shape.
struct AtX {
  GradValue y, g;
};
AtX ResultAndGradAtX(GradBuilder& b, const GradContext& c) {
  const Shape x_shape = b.TypeOf(c.inputs[0]).shape;
  Shape keep = KeepDimsShape("reduce", x_shape, c.attrs.GetInts("axes"));
  auto spread = [&](GradValue v) { return b.BroadcastTo(b.Emit("reshape", {v}, {{"shape", keep}}), x_shape); };
  return {spread(c.outputs[0]), spread(c.output_grads[0])};
}

// x / norm, and 0 where the norm is 0 (a subgradient, as PyTorch's).
std::vector<GradValue> NormGrad(GradBuilder& b, const GradContext& c) {
  GradValue x = c.inputs[0];
  const TensorType xt = b.TypeOf(x);
  auto [y, g] = ResultAndGradAtX(b, c);
  GradValue zero = b.ScalarConstant(0, xt.dtype);
  GradValue positive = b.Emit("greater", {y, zero});
  GradValue safe = b.Emit("where", {positive, y, b.ScalarConstant(1, xt.dtype)});
  return {b.Emit("where", {positive, b.Div(b.Mul(g, x), safe), zero})};
}

std::vector<GradValue> LogSumExpGrad(GradBuilder& b, const GradContext& c) {
  auto [y, g] = ResultAndGradAtX(b, c);
  return {b.Mul(g, b.Emit("exp", {b.Sub(c.inputs[0], y)}))};  // the softmax over the reduced axes
}

// max's and min's: the output gradient to the elements equal to the result.
std::vector<GradValue> ExtremumGrad(GradBuilder& b, const GradContext& c) {
  GradValue x = c.inputs[0];
  const TensorType xt = b.TypeOf(x);
  Shape keep = KeepDimsShape("max", xt.shape, c.attrs.GetInts("axes"));
  GradValue y = b.BroadcastTo(b.Emit("reshape", {c.outputs[0]}, {{"shape", keep}}), xt.shape);
  // Ties share the gradient equally.
  GradValue mask = b.Emit("cast", {b.Emit("equal", {x, y})}, {{"dtype", xt.dtype}});
  GradValue count = b.SumTo(mask, keep);
  GradValue g = b.Div(b.Emit("reshape", {c.output_grads[0]}, {{"shape", keep}}), count);
  return {b.Mul(mask, b.BroadcastTo(g, xt.shape))};
}

// argmax (kMin false) or argmin along one axis: the first of tied elements.
template <bool kMin>
void ArgExtremumKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const char* name = kMin ? "argmin" : "argmax";
  int axis = NormalizeAxis(name, attrs.GetInt("axis"), in[0].rank());
  AxisSplit s = SplitAt(in[0].shape(), axis);
  if (s.along == 0 && out[0].numel() > 0) throw OpError(name, "reduction over an empty axis");
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* src = in[0].data<T>();
    int64_t* dst = out[0].data<int64_t>();
    for (int64_t o = 0; o < s.outer; ++o) {
      for (int64_t j = 0; j < s.inner; ++j) {
        const T* p = src + o * s.along * s.inner + j;
        int64_t best = 0;
        for (int64_t k = 1; k < s.along; ++k) {
          if (kMin ? p[k * s.inner] < p[best * s.inner] : p[k * s.inner] > p[best * s.inner]) best = k;
        }
        dst[o * s.inner + j] = best;
      }
    }
  });
}

// softmax (log = false) or log_softmax (log = true) along one axis, stable.
template <bool kLog>
void SoftmaxKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  int axis = NormalizeAxis(kLog ? "log_softmax" : "softmax", attrs.GetInt("axis"), in[0].rank());
  AxisSplit s = SplitAt(in[0].shape(), axis);
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* src = in[0].data<T>();
      T* dst = out[0].data<T>();
      for (int64_t o = 0; o < s.outer; ++o) {
        for (int64_t j = 0; j < s.inner; ++j) {
          const T* x = src + o * s.along * s.inner + j;
          T* y = dst + o * s.along * s.inner + j;
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t k = 0; k < s.along; ++k) m = std::max(m, x[k * s.inner]);
          T sum = 0;
          for (int64_t k = 0; k < s.along; ++k) {
            T e = std::exp(x[k * s.inner] - m);
            if (!kLog) y[k * s.inner] = e;
            sum += e;
          }
          if constexpr (kLog) {
            T log_sum = m + std::log(sum);
            for (int64_t k = 0; k < s.along; ++k) y[k * s.inner] = x[k * s.inner] - log_sum;
          } else {
            T inv = T(1) / sum;
            for (int64_t k = 0; k < s.along; ++k) y[k * s.inner] *= inv;
          }
        }
      }
    }
  });
}

std::vector<TensorType> SoftmaxType(std::span<const TensorType> in, const Attrs& attrs) {
  RequireDType("softmax", "x", in[0], {DType::kF32, DType::kF64});
  if (in[0].rank() == 0) throw OpError("softmax", "needs a tensor of rank >= 1");
  NormalizeAxis("softmax", attrs.GetInt("axis"), in[0].rank());
  return {in[0]};
}

// Sum of `v` along the softmax axis, kept as size 1.
GradValue SumAlongAxis(GradBuilder& b, GradValue v, const Attrs& attrs) {
  Shape keep = b.TypeOf(v).shape;
  keep[NormalizeAxis("softmax", attrs.GetInt("axis"), static_cast<int>(keep.size()))] = 1;
  return b.SumTo(v, keep);
}

}  // namespace

void RegisterReduceOps(Registry& r) {
  std::vector<AttrSpec> reduce_attrs = {{"axes", AttrKind::kInts, Ints{}}, {"keepdims", AttrKind::kBool, false}};
  auto add = [&r](std::string name, std::vector<AttrSpec> attrs, TypeRule infer, Kernel kernel, GradRule grad) {
    OpDef op;
    op.name = std::move(name);
    op.input_names = {"x"};
    op.attrs = std::move(attrs);
    op.fusion = FusionKind::kReduction;
    // Over `axes` (sum, mean, ...), or along one `axis` (argmax, softmax).
    op.batch = op.attrs[0].name == "axes" ? BatchRule::kReduce : BatchRule::kAxis;
    op.infer = std::move(infer);
    op.kernel = std::move(kernel);
    op.grad = std::move(grad);
    AddOp(r, std::move(op));
  };
  add("sum", reduce_attrs, ReduceType("sum", false), SumKernel,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        return {SpreadBack(b, c, c.output_grads[0])};
      });
  add("mean", reduce_attrs, ReduceType("mean", true), MeanKernel,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        const TensorType x = b.TypeOf(c.inputs[0]);
        int64_t out_numel = std::max<int64_t>(1, NumElements(b.TypeOf(c.outputs[0]).shape));
        double scale = 1.0 / static_cast<double>(std::max<int64_t>(1, NumElements(x.shape) / out_numel));
        return {SpreadBack(b, c, b.Mul(c.output_grads[0], b.ScalarConstant(scale, x.dtype)))};
      });
  add("max", reduce_attrs, ReduceType("max", false), ExtremumKernel<false>, ExtremumGrad);
  add("min", reduce_attrs, ReduceType("min", false), ExtremumKernel<true>, ExtremumGrad);
  add("logsumexp", reduce_attrs, ReduceType("logsumexp", true), LogSumExpKernel, LogSumExpGrad);
  add("norm", reduce_attrs, ReduceType("norm", true), NormKernel, NormGrad);
  for (const char* name : {"argmax", "argmin"}) {
    const std::string op = name;
    add(op, {{"axis", AttrKind::kInt, int64_t{-1}}, {"keepdims", AttrKind::kBool, false}},
        [op](std::span<const TensorType> in, const Attrs& attrs) -> std::vector<TensorType> {
          RequireDType(op, "x", in[0], {DType::kF32, DType::kF64, DType::kI64});
          if (in[0].rank() == 0) throw OpError(op, "needs a tensor of rank >= 1");
          int axis = NormalizeAxis(op, attrs.GetInt("axis"), in[0].rank());
          Shape out = in[0].shape;
          if (attrs.GetBool("keepdims")) {
            out[axis] = 1;
          } else {
            out.erase(out.begin() + axis);
          }
          return {{DType::kI64, out}};
        },
        op == "argmin" ? Kernel(ArgExtremumKernel<true>) : Kernel(ArgExtremumKernel<false>), nullptr);
  }
  add("softmax", {{"axis", AttrKind::kInt, int64_t{-1}}}, SoftmaxType, SoftmaxKernel<false>,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        GradValue y = c.outputs[0], g = c.output_grads[0];
        return {b.Mul(y, b.Sub(g, SumAlongAxis(b, b.Mul(g, y), c.attrs)))};
      });
  add("log_softmax", {{"axis", AttrKind::kInt, int64_t{-1}}}, SoftmaxType, SoftmaxKernel<true>,
      [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        GradValue y = c.outputs[0], g = c.output_grads[0];
        return {b.Sub(g, b.Mul(b.Emit("exp", {y}), SumAlongAxis(b, g, c.attrs)))};
      });
}

}  // namespace pejit
