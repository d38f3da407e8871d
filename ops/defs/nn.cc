// Operators of neural-network models: take (embedding lookup) and its
// gradient scatter_add, gather (take along any axis), one_hot, cross_entropy and nll over i64 labels,
// layer_norm, and dropout with its random generator an argument.
#include <cmath>
#include <limits>

#include "ops/defs/defs.h"

namespace pejit {
namespace {

void CheckIndex(std::string_view op, int64_t index, int64_t size, const char* what) {
  if (index < 0 || index >= size) {
    throw OpError(op, "index " + std::to_string(index) + " is out of range for " + what + " of size " +
                          std::to_string(size));
  }
}

int64_t RowSize(const Shape& table) {
  int64_t row = 1;
  for (size_t i = 1; i < table.size(); ++i) row *= table[i];
  return row;
}

std::vector<TensorType> TakeType(std::span<const TensorType> in, const Attrs&) {
  const TensorType &table = in[0], &indices = in[1];
  RequireDType("take", "indices", indices, {DType::kI64});
  if (table.rank() == 0) throw OpError("take", "table must have rank >= 1, got " + table.ToString());
  Shape out = indices.shape;
  out.insert(out.end(), table.shape.begin() + 1, table.shape.end());
  return {{table.dtype, out}};
}

void TakeKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor &table = in[0], &indices = in[1];
  int64_t rows = table.shape()[0], row = RowSize(table.shape());
  size_t row_bytes = row * SizeOf(table.dtype());
  const int64_t* idx = indices.data<int64_t>();
  const char* src = static_cast<const char*>(table.raw_data());
  char* dst = static_cast<char*>(out[0].raw_data());
  for (int64_t i = 0; i < indices.numel(); ++i) {
    CheckIndex("take", idx[i], rows, "table rows");
    std::copy_n(src + idx[i] * row_bytes, row_bytes, dst + i * row_bytes);
  }
}

// gather(x, indices, axis=k) is numpy's take along an axis: out =
// x.shape[:k] + indices.shape + x.shape[k+1:], each index picking a slice of
// x along axis k. `take` is its axis-0 case, which batching, the JIT's moves
// and scatter_add know; this one runs by its kernel in every tier.
std::vector<TensorType> GatherType(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType &x = in[0], &indices = in[1];
  RequireDType("gather", "indices", indices, {DType::kI64});
  if (x.rank() == 0) throw OpError("gather", "x must have rank >= 1, got " + x.ToString());
  const int axis = NormalizeAxis("gather", attrs.GetInt("axis"), x.rank());
  Shape out(x.shape.begin(), x.shape.begin() + axis);
  out.insert(out.end(), indices.shape.begin(), indices.shape.end());
  out.insert(out.end(), x.shape.begin() + axis + 1, x.shape.end());
  return {{x.dtype, out}};
}

void GatherKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const Tensor &x = in[0], &indices = in[1];
  const Shape& shape = x.shape();
  const int axis = NormalizeAxis("gather", attrs.GetInt("axis"), x.rank());
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < axis; ++i) outer *= shape[i];
  for (size_t i = axis + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t size = shape[axis], n = indices.numel();
  const size_t slice = static_cast<size_t>(inner) * SizeOf(x.dtype());
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] < 0 || idx[i] >= size) CheckIndex("gather", idx[i], size, ("axis " + std::to_string(axis) + " of x").c_str());
  }
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out[0].raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < n; ++i, dst += slice) std::copy_n(src + (o * size + idx[i]) * slice, slice, dst);
  }
}

// The gradient adds each slice of the output's gradient back where it was
// read: the index axes moved to the front, scatter_add's rows, then that
// axis moved back to `axis` (no transposes along axis 0).
std::vector<GradValue> GatherGrad(GradBuilder& b, const GradContext& c) {
  const TensorType x = b.TypeOf(c.inputs[0]), indices = b.TypeOf(c.inputs[1]);
  const int axis = NormalizeAxis("gather", c.attrs.GetInt("axis"), x.rank());
  const int q = indices.rank(), rank = x.rank();
  GradValue g = c.output_grads[0];
  if (axis > 0) {
    std::vector<int64_t> to_front;
    for (int i = 0; i < q; ++i) to_front.push_back(axis + i);
    for (int i = 0; i < axis; ++i) to_front.push_back(i);
    for (int i = axis + q; i < rank - 1 + q; ++i) to_front.push_back(i);
    g = b.Emit("transpose", {g}, {{"perm", to_front}});
  }
  g = b.Emit("scatter_add", {g, c.inputs[1]}, {{"rows", x.shape[axis]}});
  if (axis > 0) {
    std::vector<int64_t> back;
    for (int i = 1; i <= axis; ++i) back.push_back(i);
    back.push_back(0);
    for (int i = axis + 1; i < rank; ++i) back.push_back(i);
    g = b.Emit("transpose", {g}, {{"perm", back}});
  }
  return {g, kNoGrad};
}

std::vector<TensorType> ScatterAddType(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType &values = in[0], &indices = in[1];
  RequireDType("scatter_add", "values", values, {DType::kF32, DType::kF64});
  RequireDType("scatter_add", "indices", indices, {DType::kI64});
  int64_t rows = attrs.GetInt("rows");
  if (rows < 0) throw OpError("scatter_add", "rows must be >= 0");
  bool prefix = values.rank() >= indices.rank();
  for (int i = 0; prefix && i < indices.rank(); ++i) {
    prefix = values.shape[i] == indices.shape[i] || values.shape[i] == kUnknownDim ||
             indices.shape[i] == kUnknownDim;
  }
  if (!prefix) {
    throw OpError("scatter_add", "values " + ShapeToString(values.shape) + " must start with the indices' shape " +
                                     ShapeToString(indices.shape));
  }
  Shape out = {rows};
  out.insert(out.end(), values.shape.begin() + indices.rank(), values.shape.end());
  return {{values.dtype, out}};
}

void ScatterAddKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor &values = in[0], &indices = in[1];
  int64_t rows = out[0].shape()[0], row = RowSize(out[0].shape());
  const int64_t* idx = indices.data<int64_t>();
  DispatchDType(values.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* src = values.data<T>();
      T* dst = out[0].data<T>();
      std::fill_n(dst, out[0].numel(), T(0));
      for (int64_t i = 0; i < indices.numel(); ++i) {
        CheckIndex("scatter_add", idx[i], rows, "rows");
        T* d = dst + idx[i] * row;
        const T* s = src + i * row;
        for (int64_t j = 0; j < row; ++j) d[j] += s[j];
      }
    }
  });
}

void OneHotKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  int64_t depth = attrs.GetInt("depth");
  const int64_t* idx = in[0].data<int64_t>();
  DispatchDType(out[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* dst = out[0].data<T>();
    std::fill_n(dst, out[0].numel(), T(0));
    for (int64_t i = 0; i < in[0].numel(); ++i) {
      CheckIndex("one_hot", idx[i], depth, "depth");
      dst[i * depth + idx[i]] = T(1);
    }
  });
}

// Shared by cross_entropy (on logits) and nll (on log-probabilities): the
// mean over the batch, or with `mean=false` one loss per row (what batching
// instances of a loss computes, jit/batch_rules.h's kRowLoss).
std::vector<TensorType> LossType(std::string op, std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType &scores = in[0], &labels = in[1];
  RequireDType(op, "scores", scores, {DType::kF32, DType::kF64});
  RequireDType(op, "labels", labels, {DType::kI64});
  if (scores.rank() != 2 || labels.rank() != 1) {
    throw OpError(op, "needs scores (batch, classes) and labels (batch,), got scores " +
                          ShapeToString(scores.shape) + " and labels " + ShapeToString(labels.shape));
  }
  if (scores.shape[0] != labels.shape[0] && scores.shape[0] != kUnknownDim && labels.shape[0] != kUnknownDim) {
    throw OpError(op, "batch sizes differ: scores " + ShapeToString(scores.shape) + " vs labels " +
                          ShapeToString(labels.shape));
  }
  if (!attrs.GetBool("mean")) return {{scores.dtype, {scores.shape[0]}}};
  return {{scores.dtype, {}}};
}

// Mean over the batch (or, with `mean=false`, each row's) of
// -log softmax(scores)[label] (kLogits) or of -scores[label] (scores already
// log-probabilities).
template <bool kLogits>
void LossKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const char* op = kLogits ? "cross_entropy" : "nll";
  int64_t batch = in[0].shape()[0], classes = in[0].shape()[1];
  const int64_t* labels = in[1].data<int64_t>();
  const bool mean = attrs.GetBool("mean");
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T* s = in[0].data<T>();
      T* rows = out[0].data<T>();
      double total = 0;
      for (int64_t i = 0; i < batch; ++i) {
        CheckIndex(op, labels[i], classes, "classes");
        const T* row = s + i * classes;
        double loss = -static_cast<double>(row[labels[i]]);
        if constexpr (kLogits) {
          T m = -std::numeric_limits<T>::infinity();
          for (int64_t j = 0; j < classes; ++j) m = std::max(m, row[j]);
          T sum = 0;
          for (int64_t j = 0; j < classes; ++j) sum += std::exp(row[j] - m);
          loss += static_cast<double>(m + std::log(sum));
        }
        if (!mean) rows[i] = static_cast<T>(loss);
        total += loss;
      }
      if (mean) rows[0] = static_cast<T>(batch ? total / static_cast<double>(batch) : 0.0);
    }
  });
}

template <bool kLogits>
std::vector<GradValue> LossGrad(GradBuilder& b, const GradContext& c) {
  GradValue scores = c.inputs[0], labels = c.inputs[1], g = c.output_grads[0];
  const TensorType t = b.TypeOf(scores);
  GradValue target = b.Emit("one_hot", {labels}, {{"depth", t.shape[1]}, {"dtype", t.dtype}});
  // Each row's cotangent: the output's over the batch size, or its own row's.
  GradValue scale = c.attrs.GetBool("mean")
                        ? b.Div(g, b.ScalarConstant(static_cast<double>(std::max<int64_t>(1, t.shape[0])), t.dtype))
                        : b.Emit("reshape", {g}, {{"shape", Shape{t.shape[0], 1}}});
  GradValue diff = kLogits ? b.Sub(b.Emit("softmax", {scores}), target) : b.Neg(target);
  return {b.Mul(diff, scale), kNoGrad};
}

// ---- dropout: the mask a function of (key, element index) ----------------------
//
// Every tier computes the same mask because it is not drawn from a generator
// with state: element i of the mask for key k keeps its value when
// splitmix64(k, i), as a uniform number in [0, 1), is at least the rate. A
// training loop passes a new key per step (an i64 scalar argument).

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::vector<TensorType> DropoutType(std::string_view op, std::span<const TensorType> in, const Attrs& attrs) {
  RequireDType(op, "x", in[0], {DType::kF32, DType::kF64});
  RequireDType(op, "key", in[1], {DType::kI64});
  if (in[1].rank() != 0) throw OpError(op, "key must be an i64 scalar, got " + in[1].ToString());
  const double rate = attrs.GetFloat("rate");
  if (!(rate >= 0 && rate < 1)) throw OpError(op, "rate must be in [0, 1), got " + std::to_string(rate));
  return {in[0]};
}

// out = x * mask / (1 - rate), or the scaled mask alone (x read for its shape).
template <bool kMaskOnly>
void DropoutKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const double rate = attrs.GetFloat("rate"), scale = 1.0 / (1.0 - rate);
  const uint64_t key = SplitMix64(static_cast<uint64_t>(in[1].data<int64_t>()[0]));
  auto loop = [&]<typename T>(T) {
    const T* x = in[0].data<T>();
    T* o = out[0].data<T>();
    for (int64_t i = 0; i < in[0].numel(); ++i) {
      double u = static_cast<double>(SplitMix64(key ^ static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
      T m = u >= rate ? static_cast<T>(scale) : T(0);
      o[i] = kMaskOnly ? m : x[i] * m;
    }
  };
  if (in[0].dtype() == DType::kF32) {
    loop(float{});
  } else {
    loop(double{});
  }
}

// ---- layer_norm over the last axis ---------------------------------------------

std::vector<TensorType> LayerNormType(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType &x = in[0], &gamma = in[1], &beta = in[2];
  RequireDType("layer_norm", "x", x, {DType::kF32, DType::kF64});
  if (x.rank() == 0) throw OpError("layer_norm", "x must have rank >= 1, got " + x.ToString());
  const Shape features = {x.shape.back()};
  for (const auto& [name, t] : {std::pair{"gamma", gamma}, std::pair{"beta", beta}}) {
    bool fits = t.dtype == x.dtype && t.rank() == 1 &&
                (t.shape[0] == features[0] || t.shape[0] == kUnknownDim || features[0] == kUnknownDim);
    if (!fits) {
      throw OpError("layer_norm", std::string(name) + " must be " + TensorType{x.dtype, features}.ToString() +
                                      " (x's last axis), got " + t.ToString());
    }
  }
  if (!(attrs.GetFloat("eps") > 0)) throw OpError("layer_norm", "eps must be > 0");
  return {x};
}

void LayerNormKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const double eps = attrs.GetFloat("eps");
  const int64_t d = in[0].shape().back(), rows = d ? in[0].numel() / d : 0;
  auto loop = [&]<typename T>(T) {
    const T *x = in[0].data<T>(), *gamma = in[1].data<T>(), *beta = in[2].data<T>();
    T* o = out[0].data<T>();
    for (int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * d;
      double mean = 0, var = 0;
      for (int64_t i = 0; i < d; ++i) mean += row[i];
      mean /= static_cast<double>(d);
      for (int64_t i = 0; i < d; ++i) var += (row[i] - mean) * (row[i] - mean);
      var /= static_cast<double>(d);
      const double inv = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < d; ++i) o[r * d + i] = static_cast<T>((row[i] - mean) * inv) * gamma[i] + beta[i];
    }
  };
  if (in[0].dtype() == DType::kF32) {
    loop(float{});
  } else {
    loop(double{});
  }
}

// With x̂ = (x - mean) * inv and gγ = g * gamma, all along the last axis:
// dx = inv * (gγ - mean(gγ) - x̂ * mean(gγ * x̂)), dgamma = Σ g * x̂, dbeta = Σ g.
std::vector<GradValue> LayerNormGrad(GradBuilder& b, const GradContext& c) {
  GradValue x = c.inputs[0], gamma = c.inputs[1], g = c.output_grads[0];
  const TensorType t = b.TypeOf(x);
  const Attrs last = {{"axes", std::vector<int64_t>{t.rank() - 1}}, {"keepdims", true}};
  auto mean = [&](GradValue v) { return b.Emit("mean", {v}, last); };
  GradValue centered = b.Sub(x, mean(x));
  GradValue var = mean(b.Mul(centered, centered));
  GradValue inv = b.Emit("pow", {b.Add(var, b.ScalarConstant(c.attrs.GetFloat("eps"), t.dtype))}, {{"exponent", -0.5}});
  GradValue xhat = b.Mul(centered, inv);
  GradValue gg = b.Mul(g, gamma);
  GradValue dx = b.Mul(inv, b.Sub(b.Sub(gg, mean(gg)), b.Mul(xhat, mean(b.Mul(gg, xhat)))));
  const Shape features = {t.shape.back()};
  return {dx, b.SumTo(b.Mul(g, xhat), features), b.SumTo(g, features)};
}

}  // namespace

void RegisterNnOps(Registry& r) {
  auto add = [&r](std::string name, std::vector<std::string> inputs, std::vector<AttrSpec> attrs, TypeRule infer,
                  Kernel kernel, GradRule grad) -> OpDef& {
    OpDef op;
    op.name = std::move(name);
    op.input_names = std::move(inputs);
    op.attrs = std::move(attrs);
    op.fusion = FusionKind::kOpaque;
    op.infer = std::move(infer);
    op.kernel = std::move(kernel);
    op.grad = std::move(grad);
    return AddOp(r, std::move(op));
  };
  OpDef& take = add("take", {"table", "indices"}, {}, TakeType, TakeKernel,
                    [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
                      int64_t rows = b.TypeOf(c.inputs[0]).shape[0];
                      return {b.Emit("scatter_add", {c.output_grads[0], c.inputs[1]}, {{"rows", rows}}), kNoGrad};
                    });
  take.batch = BatchRule::kGather;
  take.moves = MoveKind::kGather;
  add("gather", {"x", "indices"}, {{"axis", AttrKind::kInt, int64_t{0}}}, GatherType, GatherKernel, GatherGrad);
  add("scatter_add", {"values", "indices"}, {{"rows", AttrKind::kInt, std::nullopt}}, ScatterAddType,
      ScatterAddKernel, [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        return {b.Emit("take", {c.output_grads[0], c.inputs[1]}), kNoGrad};
      });
  add("one_hot", {"indices"}, {{"depth", AttrKind::kInt, std::nullopt}, {"dtype", AttrKind::kDType, DType::kF32}},
      [](std::span<const TensorType> in, const Attrs& attrs) -> std::vector<TensorType> {
        RequireDType("one_hot", "indices", in[0], {DType::kI64});
        if (attrs.GetInt("depth") < 0) throw OpError("one_hot", "depth must be >= 0");
        Shape out = in[0].shape;
        out.push_back(attrs.GetInt("depth"));
        return {{attrs.GetDType("dtype"), out}};
      },
      OneHotKernel, nullptr)
      .batch = BatchRule::kLeading;
  const std::vector<AttrSpec> mean = {{"mean", AttrKind::kBool, true}};
  add("cross_entropy", {"scores", "labels"}, mean,
      [](std::span<const TensorType> in, const Attrs& attrs) { return LossType("cross_entropy", in, attrs); },
      LossKernel<true>, LossGrad<true>)
      .batch = BatchRule::kRowLoss;
  add("nll", {"scores", "labels"}, mean,
      [](std::span<const TensorType> in, const Attrs& attrs) { return LossType("nll", in, attrs); },
      LossKernel<false>, LossGrad<false>)
      .batch = BatchRule::kRowLoss;
  const std::vector<AttrSpec> rate = {{"rate", AttrKind::kFloat, 0.5}};
  add("dropout_mask", {"x", "key"}, rate,
      [](std::span<const TensorType> in, const Attrs& attrs) { return DropoutType("dropout_mask", in, attrs); },
      DropoutKernel<true>, nullptr);
  add("dropout", {"x", "key"}, rate,
      [](std::span<const TensorType> in, const Attrs& attrs) { return DropoutType("dropout", in, attrs); },
      DropoutKernel<false>, [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        GradValue mask = b.Emit("dropout_mask", {c.inputs[0], c.inputs[1]}, {{"rate", c.attrs.GetFloat("rate")}});
        return {b.Mul(c.output_grads[0], mask), kNoGrad};
      });
  add("layer_norm", {"x", "gamma", "beta"}, {{"eps", AttrKind::kFloat, 1e-5}}, LayerNormType, LayerNormKernel,
      LayerNormGrad)
      .batch = BatchRule::kLastAxis;
}

}  // namespace pejit
