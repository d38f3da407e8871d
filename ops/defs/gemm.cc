// Matrix products through OpenBLAS: matmul (2-D and batched 3-D, optionally
// transposed operands) and dense (x·Wᵀ + b).
#include "ops/blas.h"
#include "ops/defs/defs.h"

namespace pejit {
namespace {

// Dimensions of one (possibly batched, possibly transposed) product.
struct GemmDims {
  int64_t batch = 1, m = 0, n = 0, k = 0;
};

GemmDims MatmulDims(const Shape& a, const Shape& b, bool ta, bool tb) {
  int r = static_cast<int>(a.size());
  GemmDims d;
  d.batch = r == 3 ? a[0] : 1;
  d.m = ta ? a[r - 1] : a[r - 2];
  d.k = ta ? a[r - 2] : a[r - 1];
  d.n = tb ? b[r - 2] : b[r - 1];
  return d;
}

std::vector<TensorType> MatmulType(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType &a = in[0], &b = in[1];
  RequireDType("matmul", "lhs", a, {DType::kF32, DType::kF64});
  if (a.dtype != b.dtype) throw OpError("matmul", "dtypes differ: lhs " + a.ToString() + " vs rhs " + b.ToString());
  if (a.rank() != b.rank() || (a.rank() != 2 && a.rank() != 3)) {
    throw OpError("matmul", "inputs must both be rank 2 or both rank 3: lhs " + ShapeToString(a.shape) +
                                " vs rhs " + ShapeToString(b.shape));
  }
  bool ta = attrs.GetBool("transpose_a"), tb = attrs.GetBool("transpose_b");
  int r = a.rank();
  int64_t ka = ta ? a.shape[r - 2] : a.shape[r - 1];
  int64_t kb = tb ? b.shape[r - 1] : b.shape[r - 2];
  if (ka != kb && ka != kUnknownDim && kb != kUnknownDim) {
    throw OpError("matmul", "inner dimensions differ: lhs " + ShapeToString(a.shape) + " vs rhs " +
                                ShapeToString(b.shape) + (ta || tb ? " (after transposes)" : ""));
  }
  if (r == 3 && a.shape[0] != b.shape[0] && a.shape[0] != kUnknownDim && b.shape[0] != kUnknownDim) {
    throw OpError("matmul", "batch dimensions differ: lhs " + ShapeToString(a.shape) + " vs rhs " +
                                ShapeToString(b.shape));
  }
  Shape out;
  if (r == 3) out.push_back(a.shape[0] != kUnknownDim ? a.shape[0] : b.shape[0]);
  out.push_back(ta ? a.shape[r - 1] : a.shape[r - 2]);
  out.push_back(tb ? b.shape[r - 2] : b.shape[r - 1]);
  return {{a.dtype, out}};
}

void MatmulKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  bool ta = attrs.GetBool("transpose_a"), tb = attrs.GetBool("transpose_b");
  GemmDims d = MatmulDims(in[0].shape(), in[1].shape(), ta, tb);
  int r = in[0].rank();
  int64_t lda = in[0].shape()[r - 1], ldb = in[1].shape()[r - 1];
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      for (int64_t i = 0; i < d.batch; ++i) {
        Gemm(ta, tb, d.m, d.n, d.k, T(1), in[0].data<T>() + i * d.m * d.k, lda,
             in[1].data<T>() + i * d.k * d.n, ldb, T(0), out[0].data<T>() + i * d.m * d.n, d.n);
      }
    }
  });
}

std::vector<GradValue> MatmulGrad(GradBuilder& b, const GradContext& c) {
  GradValue A = c.inputs[0], B = c.inputs[1], g = c.output_grads[0];
  bool ta = c.attrs.GetBool("transpose_a"), tb = c.attrs.GetBool("transpose_b");
  auto mm = [&](GradValue x, GradValue y, bool tx, bool ty) {
    return b.Emit("matmul", {x, y}, {{"transpose_a", tx}, {"transpose_b", ty}});
  };
  if (!ta && !tb) return {mm(g, B, false, true), mm(A, g, true, false)};
  if (ta && !tb) return {mm(B, g, false, true), mm(A, g, false, false)};
  if (!ta && tb) return {mm(g, B, false, false), mm(g, A, true, false)};
  return {mm(B, g, true, true), mm(g, A, true, true)};
}

std::vector<TensorType> DenseType(std::span<const TensorType> in, const Attrs&) {
  const TensorType &x = in[0], &w = in[1], &bias = in[2];
  RequireDType("dense", "x", x, {DType::kF32, DType::kF64});
  if (x.dtype != w.dtype || x.dtype != bias.dtype) {
    throw OpError("dense", "dtypes differ: x " + x.ToString() + ", weight " + w.ToString() + ", bias " +
                               bias.ToString());
  }
  if (x.rank() != 2 || w.rank() != 2 || bias.rank() != 1) {
    throw OpError("dense", "needs x (batch, in), weight (out, in), bias (out,): got x " +
                               ShapeToString(x.shape) + ", weight " + ShapeToString(w.shape) +
                               ", bias " + ShapeToString(bias.shape));
  }
  auto differ = [](int64_t a, int64_t b) { return a != b && a != kUnknownDim && b != kUnknownDim; };
  if (differ(x.shape[1], w.shape[1])) {
    throw OpError("dense", "inner dimensions differ: x " + ShapeToString(x.shape) + " vs weight " +
                               ShapeToString(w.shape));
  }
  if (differ(w.shape[0], bias.shape[0])) {
    throw OpError("dense", "bias " + ShapeToString(bias.shape) + " does not match weight " +
                               ShapeToString(w.shape));
  }
  return {{x.dtype, {x.shape[0], w.shape[0]}}};
}

void DenseKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&) {
  const Tensor &x = in[0], &w = in[1], &bias = in[2];
  int64_t batch = x.shape()[0], k = x.shape()[1], m = w.shape()[0];
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      T* y = out[0].data<T>();
      const T* pb = bias.data<T>();
      for (int64_t i = 0; i < batch; ++i) std::copy_n(pb, m, y + i * m);
      Gemm(false, true, batch, m, k, T(1), x.data<T>(), k, w.data<T>(), k, T(1), y, m);
    }
  });
}

std::vector<GradValue> DenseGrad(GradBuilder& b, const GradContext& c) {
  GradValue x = c.inputs[0], w = c.inputs[1], g = c.output_grads[0];
  return {b.Emit("matmul", {g, w}),
          b.Emit("matmul", {g, x}, {{"transpose_a", true}}),
          b.Emit("sum", {g}, {{"axes", std::vector<int64_t>{0}}})};
}

}  // namespace

void RegisterGemmOps(Registry& r) {
  OpDef matmul;
  matmul.name = "matmul";
  matmul.input_names = {"lhs", "rhs"};
  matmul.attrs = {{"transpose_a", AttrKind::kBool, false}, {"transpose_b", AttrKind::kBool, false}};
  matmul.fusion = FusionKind::kGemm;
  matmul.infer = MatmulType;
  matmul.kernel = MatmulKernel;
  matmul.grad = MatmulGrad;
  AddOp(r, std::move(matmul));

  OpDef dense;
  dense.name = "dense";
  dense.input_names = {"x", "weight", "bias"};
  dense.fusion = FusionKind::kGemm;
  dense.infer = DenseType;
  dense.kernel = DenseKernel;
  dense.grad = DenseGrad;
  AddOp(r, std::move(dense));
}

}  // namespace pejit
