// Every differentiable operator's gradient rule agrees with central finite
// differences, computed in double precision on random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "ops/eager.h"
#include "ops/random.h"

namespace pejit {
namespace {

using Ints = std::vector<int64_t>;

struct GradCase {
  std::string name;  // test-case label
  std::string op;
  std::vector<Tensor> inputs;
  Attrs attrs;
  std::vector<int> wrt;  // inputs to check (float inputs only)
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

// L = Σ_k Σ_i w_k[i] * out_k[i] with fixed random weights, so the output
// gradient is a random tensor rather than all ones.
double Objective(const OpDef& op, const std::vector<Tensor>& inputs, const Attrs& attrs,
                 const std::vector<Tensor>& weights) {
  std::vector<Tensor> outs = RunOp(op, inputs, attrs);
  double total = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    for (int64_t i = 0; i < outs[k].numel(); ++i) total += weights[k].ElementAsDouble(i) * outs[k].ElementAsDouble(i);
  }
  return total;
}

void CheckGradient(const GradCase& c) {
  SCOPED_TRACE(c.name);
  const OpDef& op = LookupOp(c.op);
  ASSERT_TRUE(op.differentiable());
  Attrs attrs = NormalizeAttrs(op, c.attrs);
  std::vector<Tensor> outs = RunOp(op, c.inputs, attrs);
  Rng rng(1234);
  std::vector<Tensor> weights;
  for (const Tensor& o : outs) weights.push_back(RandomUniform(rng, o.shape(), -1, 1, DType::kF64));

  std::vector<Tensor> grads = EagerVjp(op, c.inputs, outs, weights, attrs);
  ASSERT_EQ(grads.size(), c.inputs.size());
  const double h = 1e-6;
  for (int w : c.wrt) {
    SCOPED_TRACE("input " + std::to_string(w));
    ASSERT_TRUE(grads[w].defined()) << "no gradient for a float input";
    ASSERT_EQ(grads[w].type(), c.inputs[w].type());
    for (int64_t i = 0; i < c.inputs[w].numel(); ++i) {
      std::vector<Tensor> plus = c.inputs, minus = c.inputs;
      plus[w] = c.inputs[w].Clone();
      minus[w] = c.inputs[w].Clone();
      plus[w].data<double>()[i] += h;
      minus[w].data<double>()[i] -= h;
      double numeric = (Objective(op, plus, attrs, weights) - Objective(op, minus, attrs, weights)) / (2 * h);
      double analytic = grads[w].ElementAsDouble(i);
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "element " << i;
    }
  }
}

Tensor U(Rng& rng, Shape shape, double lo = -2, double hi = 2) {
  return RandomUniform(rng, std::move(shape), lo, hi, DType::kF64);
}

// Values whose magnitude is at least `margin`: keeps relu away from its kink.
Tensor AwayFromZero(Rng& rng, Shape shape, double margin = 0.1) {
  Tensor t = U(rng, std::move(shape));
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] < 0 ? p[i] - margin : p[i] + margin;
  return t;
}

// Distinct values, all at least `gap` apart: no ties for max and maximum.
Tensor Distinct(Rng& rng, Shape shape, double gap = 0.05) {
  Tensor t = Tensor::Empty(DType::kF64, std::move(shape));
  std::vector<double> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) v[i] = gap * static_cast<double>(i) - 1.0;
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.NextInt(0, static_cast<int64_t>(i))]);
  std::copy(v.begin(), v.end(), t.data<double>());
  return t;
}

std::vector<GradCase> AllCases() {
  Rng rng(42);
  std::vector<GradCase> cases;
  auto add = [&](std::string name, std::string op, std::vector<Tensor> in, Attrs attrs, std::vector<int> wrt) {
    cases.push_back({std::move(name), std::move(op), std::move(in), std::move(attrs), std::move(wrt)});
  };
  // Unary.
  for (const char* op : {"neg", "exp", "tanh", "sigmoid", "copy"}) add(op, op, {U(rng, {3, 4})}, {}, {0});
  add("log", "log", {U(rng, {3, 4}, 0.2, 3)}, {}, {0});
  add("sqrt", "sqrt", {U(rng, {3, 4}, 0.2, 3)}, {}, {0});
  add("relu", "relu", {AwayFromZero(rng, {3, 4})}, {}, {0});
  add("abs", "abs", {AwayFromZero(rng, {3, 4})}, {}, {0});
  // Negative elements lie within the bounds, positive ones above: no element near a kink.
  add("clip", "clip", {AwayFromZero(rng, {3, 4})}, {{"min", -5.0}, {"max", 0.05}}, {0});
  add("pow_3", "pow", {U(rng, {5})}, {{"exponent", 3.0}}, {0});
  add("pow_2", "pow", {U(rng, {5})}, {{"exponent", 2.0}}, {0});
  add("pow_half", "pow", {U(rng, {5}, 0.2, 3)}, {{"exponent", 0.5}}, {0});
  add("scalar_exp", "exp", {U(rng, {})}, {}, {0});
  // Binary, with broadcasting both ways.
  for (const char* op : {"add", "sub", "mul"}) {
    add(std::string(op) + "_same", op, {U(rng, {3, 4}), U(rng, {3, 4})}, {}, {0, 1});
    add(std::string(op) + "_row", op, {U(rng, {3, 4}), U(rng, {4})}, {}, {0, 1});
    add(std::string(op) + "_outer", op, {U(rng, {3, 1}), U(rng, {2, 1, 4})}, {}, {0, 1});
    add(std::string(op) + "_scalar", op, {U(rng, {}), U(rng, {2, 3})}, {}, {0, 1});
  }
  add("div_same", "div", {U(rng, {3, 4}), U(rng, {3, 4}, 0.5, 2)}, {}, {0, 1});
  add("div_row", "div", {U(rng, {3, 4}), U(rng, {1, 4}, 0.5, 2)}, {}, {0, 1});
  {
    Tensor both = Distinct(rng, {2, 6});
    Tensor a = CallOp("slice", {both}, {{"axes", Ints{0}}, {"begins", Ints{0}}, {"ends", Ints{1}}});
    Tensor b = CallOp("slice", {both}, {{"axes", Ints{0}}, {"begins", Ints{1}}, {"ends", Ints{2}}});
    add("maximum", "maximum", {a, b}, {}, {0, 1});
    add("minimum", "minimum", {a, b}, {}, {0, 1});
    add("maximum_broadcast", "maximum", {a.Reshaped({6}), U(rng, {3, 1}, 5, 6)}, {}, {0, 1});
  }
  {
    Tensor cond = CallOp("greater", {U(rng, {3, 4}), Tensor::ScalarOf(DType::kF64, 0)});
    add("where", "where", {cond, U(rng, {3, 4}), U(rng, {4})}, {}, {1, 2});
  }
  add("cast_f64_to_f64", "cast", {U(rng, {2, 3})}, {{"dtype", DType::kF64}}, {0});
  // Matrix products.
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Shape a = ta ? Shape{4, 3} : Shape{3, 4}, b = tb ? Shape{5, 4} : Shape{4, 5};
      std::string name = std::string("matmul") + (ta ? "_ta" : "") + (tb ? "_tb" : "");
      add(name, "matmul", {U(rng, a), U(rng, b)}, {{"transpose_a", ta}, {"transpose_b", tb}}, {0, 1});
    }
  }
  add("matmul_batched", "matmul", {U(rng, {2, 3, 4}), U(rng, {2, 4, 2})}, {}, {0, 1});
  add("matmul_batched_tb", "matmul", {U(rng, {2, 3, 4}), U(rng, {2, 2, 4})}, {{"transpose_b", true}}, {0, 1});
  add("dense", "dense", {U(rng, {3, 4}), U(rng, {5, 4}), U(rng, {5})}, {}, {0, 1, 2});
  // Moving elements.
  add("transpose", "transpose", {U(rng, {2, 3, 4})}, {{"perm", Ints{2, 0, 1}}}, {0});
  add("transpose_default", "transpose", {U(rng, {2, 3})}, {}, {0});
  add("reshape", "reshape", {U(rng, {2, 6})}, {{"shape", Ints{3, -1}}}, {0});
  add("expand_dims", "expand_dims", {U(rng, {2, 3})}, {{"axis", int64_t{-1}}}, {0});
  add("squeeze", "squeeze", {U(rng, {2, 1, 3, 1})}, {{"axes", Ints{1}}}, {0});
  add("concat", "concat", {U(rng, {2, 3}), U(rng, {2, 1}), U(rng, {2, 2})}, {{"axis", int64_t{1}}}, {0, 1, 2});
  add("stack", "stack", {U(rng, {2, 3}), U(rng, {2, 3})}, {{"axis", int64_t{1}}}, {0, 1});
  add("split", "split", {U(rng, {5, 2})}, {{"axis", int64_t{0}}, {"sizes", Ints{2, 3}}}, {0});
  add("chunk", "chunk", {U(rng, {2, 6})}, {{"axis", int64_t{1}}, {"chunks", int64_t{3}}}, {0});
  add("slice", "slice", {U(rng, {4, 5})}, {{"axes", Ints{1, 0}}, {"begins", Ints{1, -3}}, {"ends", Ints{-1, 4}}}, {0});
  add("pad", "pad", {U(rng, {2, 3})}, {{"before", Ints{1, 0}}, {"after", Ints{0, 2}}}, {0});
  add("broadcast_to", "broadcast_to", {U(rng, {3, 1})}, {{"shape", Ints{2, 3, 4}}}, {0});
  add("sum_to", "sum_to", {U(rng, {2, 3, 4})}, {{"shape", Ints{3, 1}}}, {0});
  // Reductions.
  add("sum_axis", "sum", {U(rng, {3, 4})}, {{"axes", Ints{1}}}, {0});
  add("sum_all", "sum", {U(rng, {2, 3, 2})}, {}, {0});
  add("sum_keepdims", "sum", {U(rng, {2, 3, 2})}, {{"axes", Ints{0, 2}}, {"keepdims", true}}, {0});
  add("mean_axis", "mean", {U(rng, {3, 4})}, {{"axes", Ints{0}}}, {0});
  add("mean_all", "mean", {U(rng, {3, 4})}, {}, {0});
  add("max_axis", "max", {Distinct(rng, {3, 4})}, {{"axes", Ints{1}}}, {0});
  add("max_all_keepdims", "max", {Distinct(rng, {3, 4})}, {{"keepdims", true}}, {0});
  add("min_axis", "min", {Distinct(rng, {3, 4})}, {{"axes", Ints{0}}}, {0});
  add("norm_axis", "norm", {U(rng, {3, 4})}, {{"axes", Ints{1}}}, {0});
  add("norm_all", "norm", {U(rng, {2, 3})}, {}, {0});
  add("logsumexp_axis", "logsumexp", {U(rng, {3, 4})}, {{"axes", Ints{1}}}, {0});
  add("logsumexp_all_keepdims", "logsumexp", {U(rng, {2, 3, 2})}, {{"axes", Ints{0, 2}}, {"keepdims", true}}, {0});
  add("softmax", "softmax", {U(rng, {3, 4})}, {}, {0});
  add("softmax_axis0", "softmax", {U(rng, {3, 4})}, {{"axis", int64_t{0}}}, {0});
  add("log_softmax", "log_softmax", {U(rng, {3, 4})}, {}, {0});
  add("log_softmax_axis0", "log_softmax", {U(rng, {2, 3, 2})}, {{"axis", int64_t{1}}}, {0});
  // Models.
  Tensor indices = Tensor::FromVector<int64_t>({5}, {2, 0, 2, 3, 2});  // repeats: gradients add up
  add("take", "take", {U(rng, {4, 3}), indices}, {}, {0});
  add("take_2d_indices", "take", {U(rng, {4, 3}), indices.Reshaped({5, 1})}, {}, {0});
  add("scatter_add", "scatter_add", {U(rng, {5, 3}), indices}, {{"rows", int64_t{4}}}, {0});
  add("gather_axis0", "gather", {U(rng, {4, 3}), indices}, {}, {0});
  add("gather_axis1", "gather", {U(rng, {2, 4, 3}), indices}, {{"axis", int64_t{1}}}, {0});
  add("gather_last_2d_indices", "gather", {U(rng, {3, 4}), indices.Reshaped({5, 1})}, {{"axis", int64_t{-1}}}, {0});
  add("gather_scalar_index", "gather", {U(rng, {2, 4, 3}), Tensor::FromVector<int64_t>({}, {3})}, {{"axis", int64_t{1}}}, {0});
  Tensor labels = Tensor::FromVector<int64_t>({3}, {1, 0, 3});
  add("cross_entropy", "cross_entropy", {U(rng, {3, 4}), labels}, {}, {0});
  add("nll", "nll", {U(rng, {3, 4}), labels}, {}, {0});
  add("cross_entropy_rows", "cross_entropy", {U(rng, {3, 4}), labels}, {{"mean", false}}, {0});
  add("nll_rows", "nll", {U(rng, {3, 4}), labels}, {{"mean", false}}, {0});
  add("dropout", "dropout", {U(rng, {4, 6}), Tensor::FromVector<int64_t>({}, {11})}, {{"rate", 0.3}}, {0});
  add("layer_norm", "layer_norm", {U(rng, {3, 5}), U(rng, {5}), U(rng, {5})}, {}, {0, 1, 2});
  add("layer_norm_3d", "layer_norm", {U(rng, {2, 2, 4}), U(rng, {4}), U(rng, {4})}, {{"eps", 0.1}}, {0, 1, 2});
  // x / y within (2.2, 2.8): away from the jumps of floor(x / y).
  add("mod", "mod", {U(rng, {3, 4}, 2.4, 2.8), U(rng, {4}, 1.0, 1.1)}, {}, {0, 1});
  return cases;
}

class OpGradient : public testing::TestWithParam<GradCase> {};

TEST_P(OpGradient, MatchesCentralFiniteDifferences) { CheckGradient(GetParam()); }

INSTANTIATE_TEST_SUITE_P(AllOps, OpGradient, testing::ValuesIn(AllCases()),
                         [](const testing::TestParamInfo<GradCase>& info) { return info.param.name; });

TEST(OpGradient, EveryDifferentiableOpHasAGradientCase) {
  std::set<std::string> covered;
  for (const GradCase& c : AllCases()) covered.insert(c.op);
  for (const OpDef* op : AllOps()) {
    if (op->differentiable()) {
      EXPECT_TRUE(covered.count(op->name)) << op->name << " has a gradient rule but no gradient test";
    }
  }
}

TEST(OpGradient, NonDifferentiableOpsAreExactlyTheDiscreteOnes) {
  std::set<std::string> none;
  for (const OpDef* op : AllOps()) {
    if (!op->differentiable()) none.insert(op->name);
  }
  // The discrete ones (a mask, a shape, a constant are piecewise constant),
  // and the packed products jit/ lowers to after differentiating.
  EXPECT_EQ(none, (std::set<std::string>{"argmax", "argmin", "equal", "gemm_pack", "greater", "greater_equal", "less",
                                         "less_equal", "logical_and", "logical_not", "logical_or", "not_equal",
                                         "one_hot", "ones_like", "packed_dense", "packed_matmul",
                                         "zeros_like", "floor_div", "dropout_mask", "zeros", "ones",
                                         "shape_of"}));
}

TEST(OpGradient, IntegerInputsGetNoGradient) {
  Rng rng(7);
  Tensor table = U(rng, {4, 3});
  Tensor indices = Tensor::FromVector<int64_t>({2}, {1, 3});
  Tensor out = CallOp("take", {table, indices});
  std::vector<Tensor> grads = EagerVjp(LookupOp("take"), std::vector<Tensor>{table, indices},
                                       std::vector<Tensor>{out}, std::vector<Tensor>{Tensor::Ones(DType::kF64, {2, 3})},
                                       Attrs{});
  EXPECT_TRUE(grads[0].defined());
  EXPECT_FALSE(grads[1].defined());
}

TEST(OpGradient, CastToIntegerPassesNothingBack) {
  const OpDef& cast = LookupOp("cast");
  Attrs attrs = NormalizeAttrs(cast, {{"dtype", DType::kI64}});
  Tensor x = Tensor::FromVector<double>({2}, {1.5, -2.5});
  std::vector<Tensor> out = RunOp(cast, std::vector<Tensor>{x}, attrs);
  std::vector<Tensor> grads =
      EagerVjp(cast, std::vector<Tensor>{x}, out, std::vector<Tensor>{Tensor::Ones(DType::kI64, {2})}, attrs);
  EXPECT_FALSE(grads[0].defined());
}

TEST(OpGradient, MaxSharesTheGradientAmongTies) {
  const OpDef& max = LookupOp("max");
  Attrs attrs = NormalizeAttrs(max, {});
  Tensor x = Tensor::FromVector<double>({4}, {1, 3, 3, 2});
  std::vector<Tensor> out = RunOp(max, std::vector<Tensor>{x}, attrs);
  std::vector<Tensor> grads =
      EagerVjp(max, std::vector<Tensor>{x}, out, std::vector<Tensor>{Tensor::ScalarOf(DType::kF64, 1)}, attrs);
  EXPECT_TRUE(Equal(grads[0], Tensor::FromVector<double>({4}, {0, 0.5, 0.5, 0})));
}

}  // namespace
}  // namespace pejit
