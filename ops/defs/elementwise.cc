// Elementwise and broadcast operators: unary math, binary arithmetic with
// numpy broadcasting (floor_div and mod as Python's), comparisons, logical
// operators on bool, where, cast, copy.
#include <cmath>
#include <limits>

#include "ops/defs/loops.h"
#include "ops/defs/defs.h"

namespace pejit {
namespace {

// ---- What one element computes --------------------------------------------

template <ScalarOp S>
struct Scalar;
template <> struct Scalar<ScalarOp::kNeg> { template <class T> static T F(T a, double) { return -a; } };
template <> struct Scalar<ScalarOp::kAbs> {
  template <class T> static T F(T a, double) {
    if constexpr (std::is_floating_point_v<T>) return std::fabs(a);  // |-0| is +0, as LLVM's fabs
    else return a < T(0) ? -a : a;
  }
};
template <> struct Scalar<ScalarOp::kNot> { static bool F(bool a, double) { return !a; } };
template <> struct Scalar<ScalarOp::kZero> { template <class T> static T F(T, double) { return T(0); } };
template <> struct Scalar<ScalarOp::kOne> { template <class T> static T F(T, double) { return T(1); } };
template <> struct Scalar<ScalarOp::kExp> { template <class T> static T F(T a, double) { return std::exp(a); } };
template <> struct Scalar<ScalarOp::kLog> { template <class T> static T F(T a, double) { return std::log(a); } };
template <> struct Scalar<ScalarOp::kTanh> { template <class T> static T F(T a, double) { return std::tanh(a); } };
template <> struct Scalar<ScalarOp::kSigmoid> {
  template <class T> static T F(T a, double) { return T(1) / (T(1) + std::exp(-a)); }
};
template <> struct Scalar<ScalarOp::kRelu> { template <class T> static T F(T a, double) { return a > T(0) ? a : T(0); } };
template <> struct Scalar<ScalarOp::kSqrt> { template <class T> static T F(T a, double) { return std::sqrt(a); } };
template <> struct Scalar<ScalarOp::kPow> {
  template <class T> static T F(T a, double p) { return p == 2.0 ? a * a : std::pow(a, static_cast<T>(p)); }
};
template <> struct Scalar<ScalarOp::kAdd> { template <class T> static T F(T a, T b) { return a + b; } };
template <> struct Scalar<ScalarOp::kSub> { template <class T> static T F(T a, T b) { return a - b; } };
template <> struct Scalar<ScalarOp::kMul> { template <class T> static T F(T a, T b) { return a * b; } };
template <> struct Scalar<ScalarOp::kDiv> { template <class T> static T F(T a, T b) { return a / b; } };
template <> struct Scalar<ScalarOp::kMaximum> { template <class T> static T F(T a, T b) { return a > b ? a : b; } };
template <> struct Scalar<ScalarOp::kMinimum> { template <class T> static T F(T a, T b) { return a < b ? a : b; } };
template <> struct Scalar<ScalarOp::kLess> { template <class T> static bool F(T a, T b) { return a < b; } };
template <> struct Scalar<ScalarOp::kGreater> { template <class T> static bool F(T a, T b) { return a > b; } };
template <> struct Scalar<ScalarOp::kEqual> { template <class T> static bool F(T a, T b) { return a == b; } };
template <> struct Scalar<ScalarOp::kLessEqual> { template <class T> static bool F(T a, T b) { return a <= b; } };
template <> struct Scalar<ScalarOp::kGreaterEqual> { template <class T> static bool F(T a, T b) { return a >= b; } };
template <> struct Scalar<ScalarOp::kNotEqual> { template <class T> static bool F(T a, T b) { return a != b; } };
template <> struct Scalar<ScalarOp::kAnd> { template <class T> static bool F(T a, T b) { return a && b; } };
template <> struct Scalar<ScalarOp::kOr> { template <class T> static bool F(T a, T b) { return a || b; } };

// ---- Kernels -----------------------------------------------------------------

template <ScalarOp S, typename T>
void UnaryLoop(const Tensor& x, Tensor& out, double param) {
  const T* in = x.data<T>();
  T* o = out.data<T>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = Scalar<S>::F(in[i], param);
}

template <ScalarOp S>
Kernel UnaryKernel() {
  if constexpr (S == ScalarOp::kNot) {
    return [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) { UnaryLoop<S, bool>(in[0], out[0], 0); };
  } else {
    return [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
      double param = S == ScalarOp::kPow ? attrs.GetFloat("exponent") : 0.0;
      switch (in[0].dtype()) {
        case DType::kF32: return UnaryLoop<S, float>(in[0], out[0], param);
        case DType::kF64: return UnaryLoop<S, double>(in[0], out[0], param);
        case DType::kI64:
          if constexpr (S == ScalarOp::kNeg || S == ScalarOp::kAbs || S == ScalarOp::kZero || S == ScalarOp::kOne) {
            return UnaryLoop<S, int64_t>(in[0], out[0], param);
          }
          [[fallthrough]];
        default: throw std::logic_error("unary kernel: unsupported dtype");
      }
    };
  }
}

template <ScalarOp S, typename T, typename Out>
void BinaryLoop(const Tensor& a, const Tensor& b, Tensor& out) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  Out* po = out.data<Out>();
  if (a.shape() == b.shape()) {
    for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = Scalar<S>::F(pa[i], pb[i]);
    return;
  }
  std::array<Shape, 2> strides = {BroadcastStrides(a.shape(), out.shape()),
                                  BroadcastStrides(b.shape(), out.shape())};
  ForEachBroadcastRow<2>(out.shape(), strides, [&](int64_t o, auto off, int64_t n, auto inner) {
    const T* ra = pa + off[0];
    const T* rb = pb + off[1];
    Out* ro = po + o;
    // One branch per stride pattern so each loop vectorizes.
    if (inner[0] == 1 && inner[1] == 1) {
      for (int64_t i = 0; i < n; ++i) ro[i] = Scalar<S>::F(ra[i], rb[i]);
    } else if (inner[0] == 1) {
      const T vb = rb[0];
      for (int64_t i = 0; i < n; ++i) ro[i] = Scalar<S>::F(ra[i], vb);
    } else if (inner[1] == 1) {
      const T va = ra[0];
      for (int64_t i = 0; i < n; ++i) ro[i] = Scalar<S>::F(va, rb[i]);
    } else {
      const Out v = Scalar<S>::F(ra[0], rb[0]);
      for (int64_t i = 0; i < n; ++i) ro[i] = v;
    }
  });
}

template <ScalarOp S, bool kCompare>
Kernel BinaryKernel() {
  return [](std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
    DispatchDType(in[0].dtype(), [&](auto zero) {
      using T = decltype(zero);
      using Out = std::conditional_t<kCompare, bool, T>;
      if constexpr (std::is_same_v<T, bool> && !kCompare) {
        throw std::logic_error("binary kernel: bool arithmetic");
      } else {
        BinaryLoop<S, T, Out>(in[0], in[1], out[0]);
      }
    });
  };
}

void WhereKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  DispatchDType(out[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    const bool* pc = in[0].data<bool>();
    const T* pa = in[1].data<T>();
    const T* pb = in[2].data<T>();
    T* po = out[0].data<T>();
    const Shape& shape = out[0].shape();
    std::array<Shape, 3> strides = {BroadcastStrides(in[0].shape(), shape),
                                    BroadcastStrides(in[1].shape(), shape),
                                    BroadcastStrides(in[2].shape(), shape)};
    ForEachBroadcastRow<3>(shape, strides, [&](int64_t o, auto off, int64_t n, auto inner) {
      for (int64_t i = 0; i < n; ++i) {
        po[o + i] = pc[off[0] + i * inner[0]] ? pa[off[1] + i * inner[1]] : pb[off[2] + i * inner[2]];
      }
    });
  });
}

void CastKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  DispatchDType(in[0].dtype(), [&](auto from_zero) {
    using From = decltype(from_zero);
    DispatchDType(out[0].dtype(), [&](auto to_zero) {
      using To = decltype(to_zero);
      const From* src = in[0].data<From>();
      To* dst = out[0].data<To>();
      for (int64_t i = 0, n = in[0].numel(); i < n; ++i) dst[i] = static_cast<To>(src[i]);
    });
  });
}

// min <= max is checked by the type rule; the bounds in x's type.
void ClipKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (!std::is_same_v<T, bool>) {
      const T lo = static_cast<T>(attrs.GetFloat("min")), hi = static_cast<T>(attrs.GetFloat("max"));
      const T* x = in[0].data<T>();
      T* y = out[0].data<T>();
      for (int64_t i = 0, n = in[0].numel(); i < n; ++i) y[i] = x[i] < lo ? lo : x[i] > hi ? hi : x[i];
    }
  });
}

// Floor division and its remainder, as Python's // and %: the quotient
// rounds toward -inf and the remainder takes the divisor's sign, so that
// x == y * floor_div(x, y) + mod(x, y). An integer division by zero is an
// error (a float one gives inf or nan).
template <bool kMod>
void FloorDivKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const char* name = kMod ? "mod" : "floor_div";
  std::array<Shape, 2> strides = {BroadcastStrides(in[0].shape(), out[0].shape()),
                                  BroadcastStrides(in[1].shape(), out[0].shape())};
  auto loop = [&]<typename T>(T) {
    const T* a = in[0].data<T>();
    const T* b = in[1].data<T>();
    T* o = out[0].data<T>();
    ForEachBroadcastRow<2>(out[0].shape(), strides, [&](int64_t at, auto off, int64_t n, auto inner) {
      for (int64_t i = 0; i < n; ++i) {
        T x = a[off[0] + i * inner[0]], y = b[off[1] + i * inner[1]];
        if constexpr (std::is_integral_v<T>) {
          if (y == 0) throw OpError(name, "integer division by zero");
          if (x == std::numeric_limits<T>::min() && y == -1) {
            if (!kMod) throw OpError(name, "the quotient of the smallest i64 by -1 overflows");
            o[at + i] = 0;
            continue;
          }
          T q = x / y, r = x % y;
          if (r != 0 && ((r < 0) != (y < 0))) {
            --q;
            r += y;
          }
          o[at + i] = kMod ? r : q;
        } else {
          T q = std::floor(x / y);
          o[at + i] = kMod ? x - y * q : q;
        }
      }
    });
  };
  switch (in[0].dtype()) {
    case DType::kF32: loop(float{}); break;
    case DType::kF64: loop(double{}); break;
    case DType::kI64: loop(int64_t{}); break;
    default: throw OpError(name, "does not take " + in[0].type().ToString());
  }
}

void CopyKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  std::copy_n(static_cast<const char*>(in[0].raw_data()), in[0].nbytes(),
              static_cast<char*>(out[0].raw_data()));
}

// ---- Type rules --------------------------------------------------------------

TypeRule BinaryType(std::string op, std::vector<DType> allowed, bool compare) {
  return [op, allowed, compare](std::span<const TensorType> in, const Attrs&) -> std::vector<TensorType> {
    if (in[0].dtype != in[1].dtype) {
      throw OpError(op, "dtypes differ: lhs " + in[0].ToString() + " vs rhs " + in[1].ToString());
    }
    if (std::find(allowed.begin(), allowed.end(), in[0].dtype) == allowed.end()) {
      throw OpError(op, "does not take " + std::string(DTypeName(in[0].dtype)) + " inputs");
    }
    Shape shape = BroadcastShapes(op, "lhs", in[0].shape, "rhs", in[1].shape);
    return {{compare ? DType::kBool : in[0].dtype, shape}};
  };
}

// ---- Registration -------------------------------------------------------------

const std::vector<DType> kFloats = {DType::kF32, DType::kF64};
const std::vector<DType> kNumeric = {DType::kF32, DType::kF64, DType::kI64};

OpDef& AddUnary(Registry& r, const std::string& name, ScalarOp scalar, Kernel kernel,
                std::vector<DType> allowed, GradRule grad, std::vector<AttrSpec> attrs = {}) {
  OpDef op;
  op.name = name;
  op.input_names = {"x"};
  op.attrs = std::move(attrs);
  op.fusion = FusionKind::kElementwise;
  op.scalar = scalar;
  op.infer = [name, allowed](std::span<const TensorType> in, const Attrs&) -> std::vector<TensorType> {
    if (std::find(allowed.begin(), allowed.end(), in[0].dtype) == allowed.end()) {
      throw OpError(name, "does not take " + in[0].ToString());
    }
    return {in[0]};
  };
  op.kernel = std::move(kernel);
  op.grad = std::move(grad);
  return AddOp(r, std::move(op));
}

void AddBinary(Registry& r, const std::string& name, ScalarOp scalar, Kernel kernel,
               std::vector<DType> allowed, bool compare, GradRule grad) {
  OpDef op;
  op.name = name;
  op.input_names = {"lhs", "rhs"};
  op.fusion = FusionKind::kBroadcast;
  op.scalar = scalar;
  op.same_dtype_from = 0;
  op.infer = BinaryType(name, std::move(allowed), compare);
  op.kernel = std::move(kernel);
  op.grad = std::move(grad);
  AddOp(r, std::move(op));
}

// Gradient-rule shorthands: x, y (output), g (output gradient).
#define PEJIT_GRAD(...)                                                          \
  [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {            \
    [[maybe_unused]] GradValue x = c.inputs[0];                                   \
    [[maybe_unused]] GradValue y = c.outputs[0];                                  \
    [[maybe_unused]] GradValue g = c.output_grads[0];                             \
    [[maybe_unused]] DType dt = b.TypeOf(y).dtype;                                \
    __VA_ARGS__                                                                   \
  }

}  // namespace

void RegisterElementwiseOps(Registry& r) {
  using S = ScalarOp;
  AddUnary(r, "neg", S::kNeg, UnaryKernel<S::kNeg>(), kNumeric, PEJIT_GRAD(return {b.Neg(g)};));
  // d|x|/dx is the sign of x, 0 at 0 (as PyTorch's).
  AddUnary(r, "abs", S::kAbs, UnaryKernel<S::kAbs>(), kNumeric, PEJIT_GRAD({
             GradValue zero = b.ScalarConstant(0, dt);
             GradValue negative = b.Emit("where", {b.Emit("less", {x, zero}), b.Neg(g), zero});
             return {b.Emit("where", {b.Emit("greater", {x, zero}), g, negative})};
           }));
  AddUnary(r, "exp", S::kExp, UnaryKernel<S::kExp>(), kFloats, PEJIT_GRAD(return {b.Mul(g, y)};));
  AddUnary(r, "log", S::kLog, UnaryKernel<S::kLog>(), kFloats, PEJIT_GRAD(return {b.Div(g, x)};));
  AddUnary(r, "tanh", S::kTanh, UnaryKernel<S::kTanh>(), kFloats,
           PEJIT_GRAD(return {b.Mul(g, b.Sub(b.ScalarConstant(1, dt), b.Mul(y, y)))};));
  AddUnary(r, "sigmoid", S::kSigmoid, UnaryKernel<S::kSigmoid>(), kFloats,
           PEJIT_GRAD(return {b.Mul(g, b.Mul(y, b.Sub(b.ScalarConstant(1, dt), y)))};));
  AddUnary(r, "relu", S::kRelu, UnaryKernel<S::kRelu>(), kFloats, PEJIT_GRAD({
             GradValue positive = b.Emit("greater", {x, b.ScalarConstant(0, dt)});
             return {b.Emit("where", {positive, g, b.ScalarConstant(0, dt)})};
           }));
  AddUnary(r, "sqrt", S::kSqrt, UnaryKernel<S::kSqrt>(), kFloats,
           PEJIT_GRAD(return {b.Div(b.Mul(g, b.ScalarConstant(0.5, dt)), y)};));
  AddUnary(r, "pow", S::kPow, UnaryKernel<S::kPow>(), kFloats, PEJIT_GRAD({
             double p = c.attrs.GetFloat("exponent");
             GradValue d = b.Mul(b.ScalarConstant(p, dt), b.Emit("pow", {x}, {{"exponent", p - 1}}));
             return {b.Mul(g, d)};
           }),
           {{"exponent", AttrKind::kFloat, std::nullopt}});

#define PEJIT_BINARY_GRAD(...)                                                   \
  [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {            \
    GradValue lhs = c.inputs[0], rhs = c.inputs[1], g = c.output_grads[0];        \
    [[maybe_unused]] GradValue y = c.outputs[0];                                  \
    const Shape ls = b.TypeOf(lhs).shape, rs = b.TypeOf(rhs).shape;               \
    [[maybe_unused]] DType dt = b.TypeOf(lhs).dtype;                              \
    __VA_ARGS__                                                                   \
  }
  AddBinary(r, "add", S::kAdd, BinaryKernel<S::kAdd, false>(), kNumeric, false,
            PEJIT_BINARY_GRAD(return {b.SumTo(g, ls), b.SumTo(g, rs)};));
  AddBinary(r, "sub", S::kSub, BinaryKernel<S::kSub, false>(), kNumeric, false,
            PEJIT_BINARY_GRAD(return {b.SumTo(g, ls), b.SumTo(b.Neg(g), rs)};));
  AddBinary(r, "mul", S::kMul, BinaryKernel<S::kMul, false>(), kNumeric, false,
            PEJIT_BINARY_GRAD(return {b.SumTo(b.Mul(g, rhs), ls), b.SumTo(b.Mul(g, lhs), rs)};));
  AddBinary(r, "div", S::kDiv, BinaryKernel<S::kDiv, false>(), kFloats, false, PEJIT_BINARY_GRAD({
              GradValue g_over_rhs = b.Div(g, rhs);
              return {b.SumTo(g_over_rhs, ls), b.SumTo(b.Neg(b.Mul(g_over_rhs, y)), rs)};
            }));
  AddBinary(r, "maximum", S::kMaximum, BinaryKernel<S::kMaximum, false>(), kNumeric, false,
            PEJIT_BINARY_GRAD({
              GradValue zero = b.ScalarConstant(0, dt);
              GradValue lhs_wins = b.Emit("greater", {lhs, rhs});
              return {b.SumTo(b.Emit("where", {lhs_wins, g, zero}), ls),
                      b.SumTo(b.Emit("where", {lhs_wins, zero, g}), rs)};
            }));
  AddBinary(r, "minimum", S::kMinimum, BinaryKernel<S::kMinimum, false>(), kNumeric, false,
            PEJIT_BINARY_GRAD({
              GradValue zero = b.ScalarConstant(0, dt);
              GradValue lhs_wins = b.Emit("less", {lhs, rhs});
              return {b.SumTo(b.Emit("where", {lhs_wins, g, zero}), ls),
                      b.SumTo(b.Emit("where", {lhs_wins, zero, g}), rs)};
            }));
#undef PEJIT_BINARY_GRAD
  const std::vector<DType> kComparable = {DType::kF32, DType::kF64, DType::kI64, DType::kBool};
  AddBinary(r, "less", S::kLess, BinaryKernel<S::kLess, true>(), kNumeric, true, nullptr);
  AddBinary(r, "greater", S::kGreater, BinaryKernel<S::kGreater, true>(), kNumeric, true, nullptr);
  AddBinary(r, "equal", S::kEqual, BinaryKernel<S::kEqual, true>(), kComparable, true, nullptr);
  AddBinary(r, "less_equal", S::kLessEqual, BinaryKernel<S::kLessEqual, true>(), kNumeric, true, nullptr);
  AddBinary(r, "greater_equal", S::kGreaterEqual, BinaryKernel<S::kGreaterEqual, true>(), kNumeric, true, nullptr);
  AddBinary(r, "not_equal", S::kNotEqual, BinaryKernel<S::kNotEqual, true>(), kComparable, true, nullptr);
  AddBinary(r, "logical_and", S::kAnd, BinaryKernel<S::kAnd, true>(), {DType::kBool}, true, nullptr);
  AddBinary(r, "logical_or", S::kOr, BinaryKernel<S::kOr, true>(), {DType::kBool}, true, nullptr);
  AddUnary(r, "logical_not", S::kNot, UnaryKernel<S::kNot>(), {DType::kBool}, nullptr);

  {
    OpDef op;
    op.name = "where";
    op.input_names = {"cond", "lhs", "rhs"};
    op.fusion = FusionKind::kBroadcast;
    op.scalar = S::kWhere;
    op.same_dtype_from = 1;
    op.infer = [](std::span<const TensorType> in, const Attrs&) -> std::vector<TensorType> {
      RequireDType("where", "cond", in[0], {DType::kBool});
      if (in[1].dtype != in[2].dtype) {
        throw OpError("where", "dtypes differ: lhs " + in[1].ToString() + " vs rhs " + in[2].ToString());
      }
      Shape shape = BroadcastShapes("where", "lhs", in[1].shape, "rhs", in[2].shape);
      shape = BroadcastShapes("where", "cond", in[0].shape, "values", shape);
      return {{in[1].dtype, shape}};
    };
    op.kernel = WhereKernel;
    op.grad = [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
      GradValue cond = c.inputs[0], g = c.output_grads[0];
      GradValue zero = b.ScalarConstant(0, b.TypeOf(g).dtype);
      return {kNoGrad, b.SumTo(b.Emit("where", {cond, g, zero}), b.TypeOf(c.inputs[1]).shape),
              b.SumTo(b.Emit("where", {cond, zero, g}), b.TypeOf(c.inputs[2]).shape)};
    };
    AddOp(r, std::move(op));
  }
  {
    OpDef op;
    op.name = "cast";
    op.input_names = {"x"};
    op.attrs = {{"dtype", AttrKind::kDType, std::nullopt}};
    op.fusion = FusionKind::kElementwise;
    op.scalar = S::kCast;
    op.infer = [](std::span<const TensorType> in, const Attrs& attrs) -> std::vector<TensorType> {
      return {{attrs.GetDType("dtype"), in[0].shape}};
    };
    op.kernel = CastKernel;
    // Differentiable between float types; integer and bool casts pass nothing back.
    op.grad = [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
      DType from = b.TypeOf(c.inputs[0]).dtype, to = b.TypeOf(c.outputs[0]).dtype;
      if (!IsFloat(from) || !IsFloat(to)) return {kNoGrad};
      return {b.Emit("cast", {c.output_grads[0]}, {{"dtype", from}})};
    };
    AddOp(r, std::move(op));
  }
  // Tensors of x's type, of zeros and of ones: their value does not depend
  // on x, so nothing flows back (the tape and autodiff pass no gradient).
  AddUnary(r, "zeros_like", S::kZero, UnaryKernel<S::kZero>(), kNumeric, nullptr);
  AddUnary(r, "ones_like", S::kOne, UnaryKernel<S::kOne>(), kNumeric, nullptr);
  {
    OpDef op;
    op.name = "clip";
    op.input_names = {"x"};
    op.attrs = {{"min", AttrKind::kFloat, std::nullopt}, {"max", AttrKind::kFloat, std::nullopt}};
    op.fusion = FusionKind::kElementwise;
    op.scalar = S::kClip;
    op.infer = [](std::span<const TensorType> in, const Attrs& attrs) -> std::vector<TensorType> {
      RequireDType("clip", "x", in[0], {DType::kF32, DType::kF64, DType::kI64});
      const double lo = attrs.GetFloat("min"), hi = attrs.GetFloat("max");
      if (!(lo <= hi)) throw OpError("clip", "min " + std::to_string(lo) + " is above max " + std::to_string(hi));
      if (in[0].dtype == DType::kI64 && (lo != std::floor(lo) || hi != std::floor(hi))) {
        throw OpError("clip", "an i64 tensor's bounds must be integers");
      }
      return {in[0]};
    };
    op.kernel = ClipKernel;
    // The gradient passes where x lies within the bounds, ends included (as PyTorch's clamp).
    op.grad = [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
      GradValue x = c.inputs[0], g = c.output_grads[0];
      const DType dt = b.TypeOf(x).dtype;
      GradValue inside = b.Emit("logical_and", {b.Emit("greater_equal", {x, b.ScalarConstant(c.attrs.GetFloat("min"), dt)}),
                                                b.Emit("less_equal", {x, b.ScalarConstant(c.attrs.GetFloat("max"), dt)})});
      return {b.Emit("where", {inside, g, b.ScalarConstant(0, dt)})};
    };
    AddOp(r, std::move(op));
  }
  AddUnary(r, "copy", S::kCopy, CopyKernel, {DType::kF32, DType::kF64, DType::kI64, DType::kBool},
           PEJIT_GRAD(return {g};))
      .moves = MoveKind::kCopy;
  // Run as kernels (no scalar function of their own in fused code).
  for (bool is_mod : {false, true}) {
    OpDef op;
    op.name = is_mod ? "mod" : "floor_div";
    op.input_names = {"lhs", "rhs"};
    op.fusion = FusionKind::kOpaque;
    op.same_dtype_from = 0;
    op.infer = BinaryType(op.name, kNumeric, false);
    op.kernel = is_mod ? Kernel(FloorDivKernel<true>) : Kernel(FloorDivKernel<false>);
    if (is_mod) {  // x - y * floor(x / y): slope 1 in x, -floor(x / y) in y, where it is continuous
      op.grad = [](GradBuilder& b, const GradContext& c) -> std::vector<GradValue> {
        GradValue x = c.inputs[0], y = c.inputs[1], g = c.output_grads[0];
        GradValue q = b.Emit("floor_div", {x, y});
        return {b.SumTo(g, b.TypeOf(x).shape), b.SumTo(b.Neg(b.Mul(g, q)), b.TypeOf(y).shape)};
      };
    }
    AddOp(r, std::move(op));
  }
}

}  // namespace pejit
