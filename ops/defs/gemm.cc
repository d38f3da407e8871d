// Matrix products: matmul (2-D and batched 3-D, optionally transposed
// operands) and dense (x·Wᵀ + b) through OpenBLAS; and the forms jit/'s
// lowering rewrites them into when one right operand serves many products:
// gemm_pack (the operand in panels, ops/packed_gemm.h), packed_matmul and
// packed_dense (products against it). The packed forms are not
// differentiable: they appear after differentiation.
#include "ops/blas.h"
#include "ops/defs/defs.h"
#include "ops/packed_gemm.h"

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

// Splitting a product among threads (OpDef::split): by rows of the output
// while there are at least two units of them, else by columns; a batched
// product by batch entries. No dot product is divided: every element is
// still one sum over all of k (with the packed kernels, in the whole
// product's order; OpenBLAS may order it by the part's shape, ops/op.h).
constexpr int64_t kRowUnit = 12;           // whole blocks of the packed micro-kernels (12 rows; 6 with AVX2)
constexpr int64_t kColUnit = kPackedPanel;  // whole panels

bool SplitsRows(int64_t m) { return m >= 2 * kRowUnit; }

int64_t MaxParts2d(int64_t m, int64_t n) {
  return SplitsRows(m) ? (m + kRowUnit - 1) / kRowUnit : std::max<int64_t>(1, (n + kColUnit - 1) / kColUnit);
}

int64_t MatmulMaxParts(std::span<const TensorType>, std::span<const TensorType> out, const Attrs&) {
  const Shape& c = out[0].shape;
  if (c.size() == 3) return std::max<int64_t>(1, c[0]);
  return MaxParts2d(c[0], c[1]);
}

void MatmulPart(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs, int64_t part, int64_t parts) {
  bool ta = attrs.GetBool("transpose_a"), tb = attrs.GetBool("transpose_b");
  GemmDims d = MatmulDims(in[0].shape(), in[1].shape(), ta, tb);
  int r = in[0].rank();
  int64_t lda = in[0].shape()[r - 1], ldb = in[1].shape()[r - 1];
  DispatchDType(in[0].dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      const T *a = in[0].data<T>(), *b = in[1].data<T>();
      T* c = out[0].data<T>();
      if (r == 3) {
        auto [first, last] = PartOf(d.batch, 1, part, parts);
        for (int64_t i = first; i < last; ++i) {
          Gemm(ta, tb, d.m, d.n, d.k, T(1), a + i * d.m * d.k, lda, b + i * d.k * d.n, ldb, T(0), c + i * d.m * d.n, d.n);
        }
      } else if (SplitsRows(d.m)) {
        auto [first, last] = PartOf(d.m, kRowUnit, part, parts);
        if (first == last) return;
        // Row i of op(A) starts at a + i·lda, or at column i when A is stored transposed.
        Gemm(ta, tb, last - first, d.n, d.k, T(1), a + (ta ? first : first * lda), lda, b, ldb, T(0), c + first * d.n, d.n);
      } else {
        auto [first, last] = PartOf(d.n, kColUnit, part, parts);
        if (first == last) return;
        Gemm(ta, tb, d.m, last - first, d.k, T(1), a, lda, b + (tb ? first * ldb : first), ldb, T(0), c + first, d.n);
      }
    }
  });
}

void MatmulKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) { MatmulPart(in, out, attrs, 0, 1); }

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

std::vector<GradValue> DenseGrad(GradBuilder& b, const GradContext& c) {
  GradValue x = c.inputs[0], w = c.inputs[1], g = c.output_grads[0];
  return {b.Emit("matmul", {g, w}),
          b.Emit("matmul", {g, x}, {{"transpose_a", true}}),
          b.Emit("sum", {g}, {{"axes", std::vector<int64_t>{0}}})};
}

int64_t DenseMaxParts(std::span<const TensorType>, std::span<const TensorType> out, const Attrs&) {
  return std::max<int64_t>(1, (out[0].shape[0] + kRowUnit - 1) / kRowUnit);
}

void DensePart(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&, int64_t part, int64_t parts) {
  const Tensor &x = in[0], &w = in[1], &bias = in[2];
  int64_t k = x.shape()[1], m = w.shape()[0];
  // Plain variables: a lambda may not capture structured bindings before C++20 in clang 14 (tools/fuzz.sh).
  const auto range = PartOf(x.shape()[0], kRowUnit, part, parts);
  const int64_t first = range.first, last = range.second;
  if (first == last) return;
  DispatchDType(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_floating_point_v<T>) {
      T* y = out[0].data<T>() + first * m;
      for (int64_t i = 0; i < last - first; ++i) std::copy_n(bias.data<T>(), m, y + i * m);
      Gemm(false, true, last - first, m, k, T(1), x.data<T>() + first * k, k, w.data<T>(), k, T(1), y, m);
    }
  });
}

void DenseKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) { DensePart(in, out, attrs, 0, 1); }

std::vector<TensorType> GemmPackType(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType& b = in[0];
  RequireDType("gemm_pack", "rhs", b, {DType::kF32});
  if (b.rank() != 2) throw OpError("gemm_pack", "rhs must be rank 2: got " + ShapeToString(b.shape));
  bool tb = attrs.GetBool("transpose_b");
  int64_t k = tb ? b.shape[1] : b.shape[0], n = tb ? b.shape[0] : b.shape[1];
  if (k == kUnknownDim || n == kUnknownDim) return {{DType::kF32, {kUnknownDim, k, kPackedPanel}}};
  return {{DType::kF32, PackedShape(k, n)}};
}

void GemmPackKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  const Tensor& b = in[0];
  bool tb = attrs.GetBool("transpose_b");
  int64_t k = tb ? b.shape()[1] : b.shape()[0], n = tb ? b.shape()[0] : b.shape()[1];
  PackGemmRhs(tb, k, n, b.data<float>(), b.shape()[1], out[0].data<float>());
}

// Checks lhs (m, k) against a packed operand (panels, k, 16) of n columns;
// returns m.
int64_t CheckPacked(std::string_view op, const TensorType& lhs, const TensorType& packed, int64_t n) {
  RequireDType(op, "lhs", lhs, {DType::kF32});
  RequireDType(op, "packed", packed, {DType::kF32});
  if (lhs.rank() != 2 || packed.rank() != 3 || packed.shape[2] != kPackedPanel) {
    throw OpError(op, "needs lhs (m, k) and packed (panels, k, " + std::to_string(kPackedPanel) + ") from gemm_pack: got " +
                          ShapeToString(lhs.shape) + " and " + ShapeToString(packed.shape));
  }
  auto differ = [](int64_t a, int64_t b) { return a != b && a != kUnknownDim && b != kUnknownDim; };
  if (differ(lhs.shape[1], packed.shape[1])) {
    throw OpError(op, "inner dimensions differ: lhs " + ShapeToString(lhs.shape) + " vs packed " + ShapeToString(packed.shape));
  }
  if (n != kUnknownDim && (n < 0 || differ(PackedShape(0, n)[0], packed.shape[0]))) {
    throw OpError(op, std::to_string(n) + " columns do not fit packed " + ShapeToString(packed.shape));
  }
  return lhs.shape[0];
}

std::vector<TensorType> PackedMatmulType(std::span<const TensorType> in, const Attrs& attrs) {
  int64_t n = attrs.GetInt("n");
  return {{DType::kF32, {CheckPacked("packed_matmul", in[0], in[1], n), n}}};
}

int64_t PackedMaxParts(std::span<const TensorType>, std::span<const TensorType> out, const Attrs&) {
  return MaxParts2d(out[0].shape[0], out[0].shape[1]);
}

// Rows [first, last) of the output, or the columns of whole panels [first, last).
void PackedPart(const Tensor& a, const Tensor& packed, float* c, int64_t n, bool accumulate, int64_t part, int64_t parts) {
  int64_t m = a.shape()[0], k = a.shape()[1];
  if (SplitsRows(m)) {
    auto [first, last] = PartOf(m, kRowUnit, part, parts);
    if (first < last) GemmPacked(last - first, n, k, a.data<float>() + first * k, k, packed.data<float>(), c + first * n, n, accumulate);
  } else {
    auto [first, last] = PartOf(n, kColUnit, part, parts);
    if (first < last) {
      GemmPacked(m, last - first, k, a.data<float>(), k, packed.data<float>() + first / kPackedPanel * k * kPackedPanel,
                 c + first, n, accumulate);
    }
  }
}

void PackedMatmulPart(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&, int64_t part, int64_t parts) {
  PackedPart(in[0], in[1], out[0].data<float>(), out[0].shape()[1], false, part, parts);
}

void PackedMatmulKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  PackedMatmulPart(in, out, attrs, 0, 1);
}

std::vector<TensorType> PackedDenseType(std::span<const TensorType> in, const Attrs&) {
  const TensorType& bias = in[2];
  RequireDType("packed_dense", "bias", bias, {DType::kF32});
  if (bias.rank() != 1) throw OpError("packed_dense", "bias must be rank 1: got " + ShapeToString(bias.shape));
  return {{DType::kF32, {CheckPacked("packed_dense", in[0], in[1], bias.shape[0]), bias.shape[0]}}};
}

void PackedDensePart(std::span<const Tensor> in, std::span<Tensor> out, const Attrs&, int64_t part, int64_t parts) {
  const Tensor &x = in[0], &bias = in[2];
  int64_t m = x.shape()[0], n = bias.shape()[0];
  float* y = out[0].data<float>();
  // The bias where this part's products land, then the products added.
  if (SplitsRows(m)) {
    auto [first, last] = PartOf(m, kRowUnit, part, parts);
    for (int64_t i = first; i < last; ++i) std::copy_n(bias.data<float>(), n, y + i * n);
  } else {
    auto [first, last] = PartOf(n, kColUnit, part, parts);
    for (int64_t i = 0; i < m; ++i) std::copy(bias.data<float>() + first, bias.data<float>() + last, y + i * n + first);
  }
  PackedPart(x, in[1], y, n, true, part, parts);
}

void PackedDenseKernel(std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs) {
  PackedDensePart(in, out, attrs, 0, 1);
}

}  // namespace

void RegisterGemmOps(Registry& r) {
  OpDef matmul;
  matmul.name = "matmul";
  matmul.input_names = {"lhs", "rhs"};
  matmul.attrs = {{"transpose_a", AttrKind::kBool, false}, {"transpose_b", AttrKind::kBool, false}};
  matmul.fusion = FusionKind::kGemm;
  matmul.batch = BatchRule::kGemm;
  matmul.infer = MatmulType;
  matmul.kernel = MatmulKernel;
  matmul.split = {MatmulMaxParts, MatmulPart};
  matmul.grad = MatmulGrad;
  AddOp(r, std::move(matmul));

  OpDef dense;
  dense.name = "dense";
  dense.input_names = {"x", "weight", "bias"};
  dense.fusion = FusionKind::kGemm;
  dense.batch = BatchRule::kGemm;
  dense.infer = DenseType;
  dense.kernel = DenseKernel;
  dense.split = {DenseMaxParts, DensePart};
  dense.grad = DenseGrad;
  AddOp(r, std::move(dense));

  OpDef pack;
  pack.name = "gemm_pack";
  pack.input_names = {"rhs"};
  pack.attrs = {{"transpose_b", AttrKind::kBool, false}};
  pack.infer = GemmPackType;
  pack.kernel = GemmPackKernel;
  AddOp(r, std::move(pack));

  OpDef packed_matmul;
  packed_matmul.name = "packed_matmul";
  packed_matmul.input_names = {"lhs", "packed"};
  packed_matmul.attrs = {{"n", AttrKind::kInt, std::nullopt}};
  packed_matmul.fusion = FusionKind::kGemm;
  packed_matmul.infer = PackedMatmulType;
  packed_matmul.kernel = PackedMatmulKernel;
  packed_matmul.split = {PackedMaxParts, PackedMatmulPart};
  AddOp(r, std::move(packed_matmul));

  OpDef packed_dense;
  packed_dense.name = "packed_dense";
  packed_dense.input_names = {"x", "packed", "bias"};
  packed_dense.fusion = FusionKind::kGemm;
  packed_dense.infer = PackedDenseType;
  packed_dense.kernel = PackedDenseKernel;
  packed_dense.split = {PackedMaxParts, PackedDensePart};
  AddOp(r, std::move(packed_dense));
}

}  // namespace pejit
