// Every registered operator's kernel against a naive reference written here:
// plain index loops computing in double, on random shapes from a fixed seed,
// plus the edge cases of broadcasting (size-1 dims, 0-d scalars, empty tensors).
//
// Kernels run as the runtime runs them: attributes normalized, outputs typed
// by the op's shape rule and preallocated. Each test suite is named after the
// op it checks (`scatter_add` -> ScatterAddKernel); the last test fails when a
// registered op has no such suite.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/attrs.h"
#include "ops/op.h"
#include "ops/random.h"
#include "ops/tensor.h"

namespace pejit {
namespace {

using Ints = std::vector<int64_t>;

// Fixed, so a failure reproduces.
constexpr uint64_t kSeed = 20240611;

const std::vector<DType> kFloatTypes = {DType::kF32, DType::kF64};
const std::vector<DType> kNumericTypes = {DType::kF32, DType::kF64, DType::kI64};
const std::vector<DType> kAllTypes = {DType::kF32, DType::kF64, DType::kI64, DType::kBool};

// ---- Index arithmetic ------------------------------------------------------------------------------------

// Calls fn(index) for each multi-index of `shape` in row-major order: once,
// with an empty index, for a scalar; never for a shape with a 0 dim.
template <typename Fn>
void ForEachIndex(const Shape& shape, Fn&& fn) {
  for (int64_t d : shape) {
    if (d == 0) return;
  }
  Shape index(shape.size(), 0);
  while (true) {
    fn(static_cast<const Shape&>(index));
    int d = static_cast<int>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

int64_t Flat(const Shape& index, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

std::string IndexString(int64_t flat, const Shape& shape) {
  Shape index(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return ShapeToString(index);
}

// The flat offset read from a tensor of shape `in` broadcast to an output at
// `out_index`: right-aligned, size-1 dims repeated.
int64_t BroadcastFlat(const Shape& out_index, const Shape& in) {
  size_t lead = out_index.size() - in.size();
  int64_t flat = 0;
  for (size_t d = 0; d < in.size(); ++d) flat = flat * in[d] + (in[d] == 1 ? 0 : out_index[lead + d]);
  return flat;
}

// Numpy's rule, written independently of the ops' own.
Shape BroadcastShape(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i + a.size() >= rank ? a[i + a.size() - rank] : 1;
    int64_t db = i + b.size() >= rank ? b[i + b.size() - rank] : 1;
    EXPECT_TRUE(da == db || da == 1 || db == 1)
        << "test bug: " << ShapeToString(a) << " and " << ShapeToString(b) << " do not broadcast";
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int Normalize(int64_t axis, int rank) { return static_cast<int>(axis < 0 ? axis + rank : axis); }

// ---- Random inputs ---------------------------------------------------------------------------------------

Shape RandomShape(Rng& rng, int min_rank, int max_rank, int64_t max_dim) {
  Shape shape(rng.NextInt(min_rank, max_rank + 1));
  for (int64_t& d : shape) d = rng.NextInt(1, max_dim + 1);
  return shape;
}

// A shape that broadcasts to `shape`: some leading dims dropped, some others 1.
Shape BroadcastableTo(Rng& rng, const Shape& shape) {
  Shape s(shape.begin() + rng.NextInt(0, static_cast<int64_t>(shape.size()) + 1), shape.end());
  for (int64_t& d : s) {
    if (rng.NextInt(0, 3) == 0) d = 1;
  }
  return s;
}

Ints RandomPermutation(Rng& rng, int n) {
  Ints perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = n - 1; i > 0; --i) std::swap(perm[i], perm[rng.NextInt(0, i + 1)]);
  return perm;
}

Tensor Generate(DType dtype, const Shape& shape, const std::function<double()>& next) {
  Tensor t = Tensor::Empty(dtype, shape);
  DispatchDType(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(next());
  });
  return t;
}

// Floats uniform in [lo, hi); i64 in [-20, 20); bools either way.
Tensor RandomValues(Rng& rng, DType dtype, const Shape& shape, double lo = -2, double hi = 2) {
  switch (dtype) {
    case DType::kI64: return RandomInt(rng, shape, -20, 20);
    case DType::kBool: return Generate(dtype, shape, [&] { return static_cast<double>(rng.NextInt(0, 2)); });
    default: return RandomUniform(rng, shape, lo, hi, dtype);
  }
}

// Half the elements from {-1, 0, 1}, so comparisons and max/min meet ties.
Tensor TiedValues(Rng& rng, DType dtype, const Shape& shape) {
  if (dtype == DType::kBool) return RandomValues(rng, dtype, shape);
  return Generate(dtype, shape, [&] {
    if (rng.NextInt(0, 2) == 0) return static_cast<double>(rng.NextInt(-1, 2));
    return dtype == DType::kI64 ? static_cast<double>(rng.NextInt(-20, 20)) : -2 + 4 * rng.NextUniform();
  });
}

// ---- References and comparison ---------------------------------------------------------------------------

// Element i as a double; bools read as their byte, so a kernel writing any
// byte other than 0 or 1 (or leaving the poison pattern) is caught.
double Get(const Tensor& t, int64_t i) {
  if (t.dtype() == DType::kBool) return static_cast<const uint8_t*>(t.raw_data())[i];
  return t.ElementAsDouble(i);
}

struct Expected {
  Expected(DType dtype, Shape shape)
      : dtype(dtype), shape(std::move(shape)), values(NumElements(this->shape)) {}

  DType dtype;
  Shape shape;
  std::vector<double> values;
  // What each element's rounding error is measured against: the sum of the
  // magnitudes of its terms for accumulated results (the classic bound for
  // floating-point sums; relative to the result itself, a sum that cancels to
  // near zero could not be checked at any tolerance), |value| when empty.
  std::vector<double> scales;
};

// kExact: data movement, selections, and every non-float result. kRounding:
// float math, within 1e-5 (f32) or 1e-12 (f64) of the reference relative to
// its scale.
enum class Tol { kExact, kRounding };

::testing::AssertionResult Matches(const Tensor& got, const Expected& want, Tol tol) {
  TensorType want_type{want.dtype, want.shape};
  if (got.type() != want_type) {
    return ::testing::AssertionFailure()
           << "got " << got.type().ToString() << ", want " << want_type.ToString();
  }
  const bool exact = tol == Tol::kExact || !IsFloat(want.dtype);
  const double rtol = want.dtype == DType::kF32 ? 1e-5 : 1e-12;
  int64_t bad = 0;
  std::ostringstream detail;
  detail.precision(17);
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g = Get(got, i), w = want.values[i];
    bool ok;
    if (std::isnan(g) || std::isnan(w)) {
      ok = std::isnan(g) && std::isnan(w);
    } else if (exact) {
      ok = g == w;
    } else {
      ok = std::abs(g - w) <= rtol * (want.scales.empty() ? std::abs(w) : want.scales[i]);
    }
    if (!ok && ++bad <= 5) {
      detail << "\n  at " << IndexString(i, want.shape) << ": got " << g << ", want " << w;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.numel() << " elements differ" << detail.str();
}

std::string Describe(std::string_view name, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  std::string s = std::string(name) + "(";
  for (size_t i = 0; i < inputs.size(); ++i) s += (i ? ", " : "") + inputs[i].type().ToString();
  if (!attrs.empty()) s += "; " + attrs.ToString();
  return s + ")";
}

// Runs `name`'s kernel on outputs preallocated from the op's shape rule and
// filled with a poison byte pattern, so an element the kernel leaves unwritten
// shows up as a mismatch. Kernels must leave their inputs untouched.
std::vector<Tensor> RunKernel(std::string_view name, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpDef& op = LookupOp(name);
  Attrs normalized = NormalizeAttrs(op, attrs);
  std::vector<TensorType> types;
  std::vector<Tensor> before;
  for (const Tensor& t : inputs) {
    types.push_back(t.type());
    before.push_back(t.Clone());
  }
  std::vector<Tensor> outputs;
  for (const TensorType& t : InferTypes(op, types, normalized)) {
    Tensor out = Tensor::Empty(t.dtype, t.shape);
    std::memset(out.raw_data(), 0x7f, out.nbytes());
    outputs.push_back(out);
  }
  op.kernel(inputs, outputs, normalized);
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_TRUE(Equal(inputs[i], before[i])) << name << " wrote into input " << i;
  }
  return outputs;
}

// Runs a single-output op and compares its result with `want`.
void Check(std::string_view name, const std::vector<Tensor>& inputs, const Attrs& attrs, const Expected& want,
           Tol tol) {
  SCOPED_TRACE(Describe(name, inputs, attrs));
  std::vector<Tensor> out;
  try {
    out = RunKernel(name, inputs, attrs);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw: " << e.what();
    return;
  }
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(Matches(out[0], want, tol));
}

// The output of a data-movement op: element i of `want` is x's element
// source(index) (flat), or 0 where source returns -1.
Expected Gather(const Tensor& x, Shape shape, const std::function<int64_t(const Shape&)>& source) {
  Expected want(x.dtype(), std::move(shape));
  ForEachIndex(want.shape, [&](const Shape& i) {
    int64_t from = source(i);
    want.values[Flat(i, want.shape)] = from < 0 ? 0.0 : Get(x, from);
  });
  return want;
}

// ---- Elementwise -----------------------------------------------------------------------------------------

const std::vector<Shape> kUnaryShapes = {{}, {1}, {0}, {7}, {2, 0, 3}, {3, 5}, {2, 3, 17}, {1, 1, 4, 1}};

void CheckUnary(std::string_view name, const std::vector<DType>& dtypes, Tol tol,
                const std::function<double(double)>& f, double lo, double hi, const Attrs& attrs = {}) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = kUnaryShapes;
  for (int i = 0; i < 6; ++i) shapes.push_back(RandomShape(rng, 0, 4, 5));
  for (DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      Tensor x = RandomValues(rng, dtype, shape, lo, hi);
      Expected want(dtype, shape);
      for (int64_t i = 0; i < x.numel(); ++i) want.values[i] = f(Get(x, i));
      Check(name, {x}, attrs, want, tol);
    }
  }
}

TEST(NegKernel, NegatesEachElement) {
  CheckUnary("neg", kNumericTypes, Tol::kExact, [](double x) { return -x; }, -3, 3);
}

TEST(AbsKernel, TakesTheMagnitudeOfEachElement) {
  CheckUnary("abs", kNumericTypes, Tol::kExact, [](double x) { return std::fabs(x); }, -3, 3);
}

TEST(ClipKernel, LimitsEachElementToTheBounds) {
  for (auto [lo, hi] : {std::pair{-1.0, 1.0}, std::pair{0.0, 0.0}, std::pair{-5.0, 2.0}}) {
    CheckUnary("clip", kNumericTypes, Tol::kExact, [lo, hi](double x) { return std::min(std::max(x, lo), hi); }, -3, 3,
               {{"min", lo}, {"max", hi}});
  }
  Rng rng(kSeed);
  Tensor x = RandomValues(rng, DType::kF32, {3});
  EXPECT_THROW(RunKernel("clip", {x}, {{"min", 1.0}, {"max", -1.0}}), OpError);
  EXPECT_THROW(RunKernel("clip", {RandomValues(rng, DType::kI64, {3})}, {{"min", 0.5}, {"max", 2.0}}), OpError);
}

TEST(ZerosLikeKernel, FillsXsTypeWithZeros) {
  CheckUnary("zeros_like", kNumericTypes, Tol::kExact, [](double) { return 0.0; }, -3, 3);
}

TEST(OnesLikeKernel, FillsXsTypeWithOnes) {
  CheckUnary("ones_like", kNumericTypes, Tol::kExact, [](double) { return 1.0; }, -3, 3);
}

TEST(LogicalNotKernel, NegatesEachBool) {
  CheckUnary("logical_not", {DType::kBool}, Tol::kExact, [](double x) { return x != 0 ? 0.0 : 1.0; }, 0, 1);
}

TEST(ExpKernel, MatchesExp) {
  CheckUnary("exp", kFloatTypes, Tol::kRounding, [](double x) { return std::exp(x); }, -6, 6);
}

TEST(LogKernel, MatchesLogOnPositiveInputs) {
  CheckUnary("log", kFloatTypes, Tol::kRounding, [](double x) { return std::log(x); }, 0.01, 20);
}

TEST(TanhKernel, MatchesTanh) {
  CheckUnary("tanh", kFloatTypes, Tol::kRounding, [](double x) { return std::tanh(x); }, -4, 4);
}

TEST(SigmoidKernel, IsOneOverOnePlusExpOfMinusX) {
  auto sigmoid = [](double x) { return 1 / (1 + std::exp(-x)); };
  CheckUnary("sigmoid", kFloatTypes, Tol::kRounding, sigmoid, -12, 12);
}

TEST(ReluKernel, ZeroesNegativeElementsAndKeepsOthers) {
  CheckUnary("relu", kFloatTypes, Tol::kExact, [](double x) { return x > 0 ? x : 0; }, -2, 2);
}

TEST(SqrtKernel, MatchesSqrtOnNonNegativeInputs) {
  CheckUnary("sqrt", kFloatTypes, Tol::kRounding, [](double x) { return std::sqrt(x); }, 0, 30);
}

TEST(PowKernel, RaisesPositiveBasesToTheExponentAttribute) {
  for (double p : {2.0, 3.0, 0.5, -1.5, 1.0, 0.0}) {
    CheckUnary("pow", kFloatTypes, Tol::kRounding, [p](double x) { return std::pow(x, p); }, 0.1, 4,
               {{"exponent", p}});
  }
}

TEST(PowKernel, RaisesNegativeBasesToIntegerExponents) {
  for (double p : {2.0, 3.0, -1.0}) {
    CheckUnary("pow", kFloatTypes, Tol::kRounding, [p](double x) { return std::pow(x, p); }, -3, -0.1,
               {{"exponent", p}});
  }
}

// Pairs of input shapes: the edge cases, then random broadcasts.
std::vector<std::pair<Shape, Shape>> BinaryShapes(Rng& rng) {
  std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4}, {3, 4}},        {{}, {}},         {{2, 3}, {}},        {{}, {2, 3}},       {{3, 4}, {4}},
      {{4}, {3, 4}},           {{3, 1}, {1, 4}}, {{2, 3, 4}, {3, 1}}, {{2, 1, 4}, {1, 3, 1}},
      {{1}, {5}},              {{5}, {1}},       {{1, 1}, {}},        {{2, 17}, {17}},    {{17, 2}, {17, 1}},
      {{0}, {}},               {{0, 3}, {3}},    {{0, 3}, {1, 3}},    {{2, 0, 4}, {1, 4}}, {{1}, {0}},
      {{0}, {1, 0}},           {{3, 0}, {3, 1}}, {{5, 1, 3}, {1, 4, 1}},
  };
  for (int i = 0; i < 12; ++i) {
    Shape out = RandomShape(rng, 0, 4, 4);
    cases.push_back({BroadcastableTo(rng, out), BroadcastableTo(rng, out)});
  }
  return cases;
}

using InputGen = std::function<Tensor(Rng&, DType, const Shape&)>;

Tensor DefaultGen(Rng& rng, DType dtype, const Shape& shape) { return RandomValues(rng, dtype, shape); }

void CheckBinary(std::string_view name, const std::vector<DType>& dtypes, bool compare, Tol tol,
                 const std::function<double(double, double)>& f, const InputGen& lhs_gen = DefaultGen,
                 const InputGen& rhs_gen = DefaultGen) {
  Rng rng(kSeed);
  for (DType dtype : dtypes) {
    for (const auto& [lhs_shape, rhs_shape] : BinaryShapes(rng)) {
      Tensor a = lhs_gen(rng, dtype, lhs_shape), b = rhs_gen(rng, dtype, rhs_shape);
      Expected want(compare ? DType::kBool : dtype, BroadcastShape(a.shape(), b.shape()));
      ForEachIndex(want.shape, [&](const Shape& i) {
        want.values[Flat(i, want.shape)] =
            f(Get(a, BroadcastFlat(i, a.shape())), Get(b, BroadcastFlat(i, b.shape())));
      });
      Check(name, {a, b}, {}, want, tol);
    }
  }
}

TEST(AddKernel, AddsWithBroadcasting) {
  CheckBinary("add", kNumericTypes, false, Tol::kRounding, [](double a, double b) { return a + b; });
}

TEST(SubKernel, SubtractsWithBroadcasting) {
  CheckBinary("sub", kNumericTypes, false, Tol::kRounding, [](double a, double b) { return a - b; });
}

TEST(MulKernel, MultipliesWithBroadcasting) {
  CheckBinary("mul", kNumericTypes, false, Tol::kRounding, [](double a, double b) { return a * b; });
}

TEST(DivKernel, DividesWithBroadcasting) {
  // Divisors kept away from 0 with either sign.
  InputGen divisors = [](Rng& rng, DType dtype, const Shape& shape) {
    return Generate(dtype, shape,
                    [&] { return (rng.NextInt(0, 2) ? 1 : -1) * (0.5 + 2 * rng.NextUniform()); });
  };
  CheckBinary("div", kFloatTypes, false, Tol::kRounding, [](double a, double b) { return a / b; }, DefaultGen,
              divisors);
}

TEST(MaximumKernel, TakesTheLargerElementWithBroadcasting) {
  CheckBinary("maximum", kNumericTypes, false, Tol::kExact, [](double a, double b) { return std::max(a, b); },
              TiedValues, TiedValues);
}

TEST(MinimumKernel, TakesTheSmallerElementWithBroadcasting) {
  CheckBinary("minimum", kNumericTypes, false, Tol::kExact, [](double a, double b) { return std::min(a, b); },
              TiedValues, TiedValues);
}

TEST(LessKernel, ComparesWithBroadcastingIntoBool) {
  CheckBinary("less", kNumericTypes, true, Tol::kExact, [](double a, double b) { return a < b ? 1.0 : 0.0; },
              TiedValues, TiedValues);
}

TEST(GreaterKernel, ComparesWithBroadcastingIntoBool) {
  auto greater = [](double a, double b) { return a > b ? 1.0 : 0.0; };
  CheckBinary("greater", kNumericTypes, true, Tol::kExact, greater, TiedValues, TiedValues);
}

TEST(EqualKernel, ComparesWithBroadcastingIntoBoolForEveryDType) {
  CheckBinary("equal", kAllTypes, true, Tol::kExact, [](double a, double b) { return a == b ? 1.0 : 0.0; },
              TiedValues, TiedValues);
}

TEST(LessEqualKernel, ComparesWithBroadcastingIntoBool) {
  CheckBinary("less_equal", kNumericTypes, true, Tol::kExact, [](double a, double b) { return a <= b ? 1.0 : 0.0; },
              TiedValues, TiedValues);
}

TEST(GreaterEqualKernel, ComparesWithBroadcastingIntoBool) {
  CheckBinary("greater_equal", kNumericTypes, true, Tol::kExact,
              [](double a, double b) { return a >= b ? 1.0 : 0.0; }, TiedValues, TiedValues);
}

TEST(NotEqualKernel, ComparesWithBroadcastingIntoBoolForEveryDType) {
  CheckBinary("not_equal", kAllTypes, true, Tol::kExact, [](double a, double b) { return a != b ? 1.0 : 0.0; },
              TiedValues, TiedValues);
}

TEST(LogicalAndKernel, HoldsWhereBothHoldWithBroadcasting) {
  CheckBinary("logical_and", {DType::kBool}, true, Tol::kExact,
              [](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; });
}

TEST(LogicalOrKernel, HoldsWhereEitherHoldsWithBroadcasting) {
  CheckBinary("logical_or", {DType::kBool}, true, Tol::kExact,
              [](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; });
}

TEST(WhereKernel, PicksLhsWhereCondHoldsWithThreeWayBroadcasting) {
  Rng rng(kSeed);
  struct Case {
    Shape cond, lhs, rhs;
  };
  std::vector<Case> cases = {
      {{}, {}, {}},           {{3, 4}, {3, 4}, {3, 4}}, {{3, 1}, {1, 4}, {}},    {{4}, {3, 1}, {3, 4}},
      {{}, {2, 3}, {3}},      {{2, 1, 3}, {3}, {4, 1}}, {{2, 17}, {17}, {2, 1}}, {{0, 3}, {3}, {}},
      {{1}, {0}, {1}},        {{2, 0}, {1}, {2, 1}},    {{5}, {}, {}},
  };
  for (int i = 0; i < 10; ++i) {
    Shape out = RandomShape(rng, 0, 4, 4);
    cases.push_back({BroadcastableTo(rng, out), BroadcastableTo(rng, out), BroadcastableTo(rng, out)});
  }
  for (DType dtype : kAllTypes) {
    for (const Case& c : cases) {
      Tensor cond = RandomValues(rng, DType::kBool, c.cond);
      Tensor a = RandomValues(rng, dtype, c.lhs), b = RandomValues(rng, dtype, c.rhs);
      Expected want(dtype, BroadcastShape(c.cond, BroadcastShape(c.lhs, c.rhs)));
      ForEachIndex(want.shape, [&](const Shape& i) {
        bool pick_lhs = Get(cond, BroadcastFlat(i, c.cond)) != 0;
        want.values[Flat(i, want.shape)] =
            pick_lhs ? Get(a, BroadcastFlat(i, c.lhs)) : Get(b, BroadcastFlat(i, c.rhs));
      });
      Check("where", {cond, a, b}, {}, want, Tol::kExact);
    }
  }
}

// What a value becomes in `dtype`: floats round (f32) or stay, integers
// truncate toward zero, bools are "not zero".
double Converted(double v, DType dtype) {
  switch (dtype) {
    case DType::kF32: return static_cast<double>(static_cast<float>(v));
    case DType::kF64: return v;
    case DType::kI64: return std::trunc(v);
    case DType::kBool: return v != 0 ? 1.0 : 0.0;
  }
  return NAN;
}

TEST(CastKernel, ConvertsBetweenEveryPairOfDTypes) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = {{}, {0}, {2, 0}, {3, 4}, {37}};
  for (DType from : kAllTypes) {
    for (DType to : kAllTypes) {
      for (const Shape& shape : shapes) {
        // Floats: zeros, negative and positive fractions (truncation), and
        // f64 values with more bits than f32 holds (rounding).
        auto float_value = [&] {
          if (rng.NextInt(0, 2)) return 0.75 * static_cast<double>(rng.NextInt(-8, 9));
          return -50 + 100 * rng.NextUniform();
        };
        Tensor x = IsFloat(from) ? Generate(from, shape, float_value) : RandomValues(rng, from, shape);
        Expected want(to, shape);
        for (int64_t i = 0; i < x.numel(); ++i) want.values[i] = Converted(Get(x, i), to);
        Check("cast", {x}, {{"dtype", to}}, want, Tol::kExact);
      }
    }
  }
}

TEST(CopyKernel, CopiesEveryDType) {
  CheckUnary("copy", kAllTypes, Tol::kExact, [](double x) { return x; }, -2, 2);
}

// ---- Matrix products -------------------------------------------------------------------------------------

// op(A)·op(B) by the triple loop, per batch; the scale of each element is
// Σ|a·b| over its terms.
Expected MatmulReference(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  const int r = a.rank();
  const int64_t batch = r == 3 ? a.shape()[0] : 1;
  const int64_t a0 = a.shape()[r - 2], a1 = a.shape()[r - 1], b0 = b.shape()[r - 2], b1 = b.shape()[r - 1];
  const int64_t m = ta ? a1 : a0, k = ta ? a0 : a1, n = tb ? b0 : b1;
  Expected want(a.dtype(), r == 3 ? Shape{batch, m, n} : Shape{m, n});
  want.scales.resize(want.values.size());
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, magnitude = 0;
        for (int64_t p = 0; p < k; ++p) {
          double x = Get(a, s * a0 * a1 + (ta ? p * a1 + i : i * a1 + p));
          double y = Get(b, s * b0 * b1 + (tb ? j * b1 + p : p * b1 + j));
          sum += x * y;
          magnitude += std::abs(x * y);
        }
        want.values[(s * m + i) * n + j] = sum;
        want.scales[(s * m + i) * n + j] = magnitude;
      }
    }
  }
  return want;
}

struct GemmCase {
  int64_t batch, m, k, n;
};

void CheckMatmul(const std::vector<GemmCase>& cases, bool batched) {
  Rng rng(kSeed);
  for (DType dtype : kFloatTypes) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (const GemmCase& c : cases) {
          Shape a_shape = ta ? Shape{c.k, c.m} : Shape{c.m, c.k};
          Shape b_shape = tb ? Shape{c.n, c.k} : Shape{c.k, c.n};
          if (batched) {
            a_shape.insert(a_shape.begin(), c.batch);
            b_shape.insert(b_shape.begin(), c.batch);
          }
          Tensor a = RandomValues(rng, dtype, a_shape), b = RandomValues(rng, dtype, b_shape);
          Check("matmul", {a, b}, {{"transpose_a", ta}, {"transpose_b", tb}}, MatmulReference(a, b, ta, tb),
                Tol::kRounding);
        }
      }
    }
  }
}

std::vector<GemmCase> RandomGemmCases(Rng& rng, int count, int64_t max_batch) {
  std::vector<GemmCase> cases;
  for (int i = 0; i < count; ++i) {
    cases.push_back({rng.NextInt(1, max_batch + 1), rng.NextInt(1, 8), rng.NextInt(1, 8), rng.NextInt(1, 8)});
  }
  return cases;
}

TEST(MatmulKernel, Computes2DProductsForAllTransposeCombinations) {
  Rng rng(kSeed);
  std::vector<GemmCase> cases = {{1, 1, 1, 1}, {1, 1, 5, 7}, {1, 6, 5, 1}, {1, 4, 1, 3}, {1, 17, 33, 65}};
  for (const GemmCase& c : RandomGemmCases(rng, 6, 1)) cases.push_back(c);
  CheckMatmul(cases, false);
}

TEST(MatmulKernel, ComputesBatched3DProductsForAllTransposeCombinations) {
  Rng rng(kSeed + 1);
  std::vector<GemmCase> cases = {{1, 3, 4, 5}, {4, 1, 1, 1}, {3, 1, 6, 2}, {2, 9, 17, 5}};
  for (const GemmCase& c : RandomGemmCases(rng, 6, 4)) cases.push_back(c);
  CheckMatmul(cases, true);
}

TEST(MatmulKernel, GivesZerosForAnEmptyInnerDimensionAndEmptyResultsForEmptyOuterOnes) {
  CheckMatmul({{1, 3, 0, 4}, {1, 0, 3, 4}, {1, 3, 4, 0}, {1, 0, 0, 0}}, false);
  CheckMatmul({{2, 3, 0, 4}, {0, 3, 4, 5}, {2, 0, 3, 4}, {2, 3, 4, 0}}, true);
}

void CheckDense(const std::vector<GemmCase>& cases) {
  // Here m is the batch, k the input features and n the output features.
  Rng rng(kSeed);
  for (DType dtype : kFloatTypes) {
    for (const GemmCase& c : cases) {
      Tensor x = RandomValues(rng, dtype, {c.m, c.k});
      Tensor w = RandomValues(rng, dtype, {c.n, c.k});
      Tensor bias = RandomValues(rng, dtype, {c.n});
      Expected want(dtype, {c.m, c.n});
      want.scales.resize(want.values.size());
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t o = 0; o < c.n; ++o) {
          double sum = Get(bias, o), magnitude = std::abs(Get(bias, o));
          for (int64_t p = 0; p < c.k; ++p) {
            double term = Get(x, i * c.k + p) * Get(w, o * c.k + p);
            sum += term;
            magnitude += std::abs(term);
          }
          want.values[i * c.n + o] = sum;
          want.scales[i * c.n + o] = magnitude;
        }
      }
      Check("dense", {x, w, bias}, {}, want, Tol::kRounding);
    }
  }
}

TEST(DenseKernel, ComputesXTimesWeightTransposedPlusBias) {
  Rng rng(kSeed);
  std::vector<GemmCase> cases = {{1, 1, 1, 1}, {1, 1, 8, 3}, {1, 5, 3, 1}, {1, 16, 33, 9}};
  for (const GemmCase& c : RandomGemmCases(rng, 8, 1)) cases.push_back(c);
  CheckDense(cases);
}

TEST(DenseKernel, GivesTheBiasForNoInputFeaturesAndEmptyResultsForNoRowsOrOutputs) {
  CheckDense({{1, 3, 0, 4}, {1, 0, 5, 4}, {1, 3, 5, 0}});
}

// The packed forms jit/ lowers repeated products to: gemm_pack lays op(B) out
// in panels of 16 columns, packed_matmul / packed_dense multiply by it. The
// shapes cross the micro-kernel's 6-row and 16-column tiles and their tails.
std::vector<GemmCase> PackedCases(Rng& rng) {
  std::vector<GemmCase> cases = {{1, 1, 1, 1}, {1, 6, 8, 16}, {1, 7, 3, 17}, {1, 13, 33, 40}, {1, 5, 128, 15},
                                 {1, 25, 64, 48}, {1, 12, 1, 32}};
  for (int i = 0; i < 6; ++i) cases.push_back({1, rng.NextInt(1, 30), rng.NextInt(1, 40), rng.NextInt(1, 70)});
  return cases;
}

TEST(GemmPackKernel, LaysTheOperandOutInPanelsOfSixteenColumnsPaddedWithZeros) {
  Rng rng(kSeed);
  for (bool tb : {false, true}) {
    for (const GemmCase& c : PackedCases(rng)) {
      Tensor b = RandomValues(rng, DType::kF32, tb ? Shape{c.n, c.k} : Shape{c.k, c.n});
      const int64_t panels = (c.n + 15) / 16;
      Expected want(DType::kF32, {panels, c.k, 16});
      for (int64_t p = 0; p < panels; ++p) {
        for (int64_t l = 0; l < c.k; ++l) {
          for (int64_t j = 0; j < 16; ++j) {
            const int64_t col = p * 16 + j;
            want.values[(p * c.k + l) * 16 + j] = col >= c.n ? 0.0 : Get(b, tb ? col * c.k + l : l * c.n + col);
          }
        }
      }
      Check("gemm_pack", {b}, {{"transpose_b", tb}}, want, Tol::kExact);
    }
  }
}

TEST(PackedMatmulKernel, MatchesMatmulAgainstTheUnpackedOperand) {
  Rng rng(kSeed + 2);
  for (bool tb : {false, true}) {
    for (const GemmCase& c : PackedCases(rng)) {
      Tensor a = RandomValues(rng, DType::kF32, {c.m, c.k});
      Tensor b = RandomValues(rng, DType::kF32, tb ? Shape{c.n, c.k} : Shape{c.k, c.n});
      Tensor packed = RunKernel("gemm_pack", {b}, {{"transpose_b", tb}})[0];
      Check("packed_matmul", {a, packed}, {{"n", c.n}}, MatmulReference(a, b, false, tb), Tol::kRounding);
    }
  }
}

TEST(PackedMatmulKernel, GivesEmptyResultsForNoRowsAndZerosForNoInnerDimension) {
  Tensor packed = RunKernel("gemm_pack", {Tensor::Zeros(DType::kF32, {0, 20})}, {})[0];
  EXPECT_EQ(packed.shape(), (Shape{2, 0, 16}));
  Tensor none = RunKernel("packed_matmul", {Tensor::Zeros(DType::kF32, {0, 0}), packed}, {{"n", int64_t{20}}})[0];
  EXPECT_EQ(none.shape(), (Shape{0, 20}));
  Tensor zeros = RunKernel("packed_matmul", {Tensor::Ones(DType::kF32, {3, 0}), packed}, {{"n", int64_t{20}}})[0];
  for (int64_t i = 0; i < zeros.numel(); ++i) EXPECT_EQ(zeros.data<float>()[i], 0.0f);
}

TEST(PackedMatmulKernel, RejectsOperandsThatDoNotFitWithTheShapes) {
  Tensor packed = RunKernel("gemm_pack", {Tensor::Zeros(DType::kF32, {8, 20})}, {})[0];  // k 8, n 20: 2 panels
  auto message = [&](const Tensor& a, int64_t n) {
    try {
      RunKernel("packed_matmul", {a, packed}, {{"n", n}});
    } catch (const OpError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(Tensor::Zeros(DType::kF32, {3, 7}), 20),
            "packed_matmul: inner dimensions differ: lhs (3, 7) vs packed (2, 8, 16)");
  EXPECT_EQ(message(Tensor::Zeros(DType::kF32, {3, 8}), 40), "packed_matmul: 40 columns do not fit packed (2, 8, 16)");
  EXPECT_THROW(RunKernel("packed_matmul", {Tensor::Zeros(DType::kF64, {3, 8}), packed}, {{"n", int64_t{20}}}), OpError);
  EXPECT_THROW(RunKernel("gemm_pack", {Tensor::Zeros(DType::kF32, {2, 3, 4})}, {}), OpError);
}

TEST(PackedDenseKernel, MatchesDense) {
  Rng rng(kSeed + 3);
  for (const GemmCase& c : PackedCases(rng)) {
    Tensor x = RandomValues(rng, DType::kF32, {c.m, c.k});
    Tensor w = RandomValues(rng, DType::kF32, {c.n, c.k});
    Tensor bias = RandomValues(rng, DType::kF32, {c.n});
    Tensor packed = RunKernel("gemm_pack", {w}, {{"transpose_b", true}})[0];
    Expected want = MatmulReference(x, w, false, true);
    for (size_t i = 0; i < want.values.size(); ++i) {
      want.values[i] += Get(bias, static_cast<int64_t>(i) % c.n);
      want.scales[i] += std::abs(Get(bias, static_cast<int64_t>(i) % c.n));
    }
    Check("packed_dense", {x, packed, bias}, {}, want, Tol::kRounding);
  }
}

// ---- Data movement ---------------------------------------------------------------------------------------

TEST(TransposeKernel, PermutesAxes) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    std::vector<Shape> shapes = {{}, {5}, {3, 4}, {1, 7}, {2, 0, 3}, {2, 3, 4, 5}};
    for (int i = 0; i < 6; ++i) shapes.push_back(RandomShape(rng, 1, 4, 5));
    for (const Shape& shape : shapes) {
      Tensor x = RandomValues(rng, dtype, shape);
      for (int trial = 0; trial < 3; ++trial) {
        Ints perm = RandomPermutation(rng, x.rank());
        Shape out;
        for (int64_t p : perm) out.push_back(shape[p]);
        Expected want = Gather(x, out, [&](const Shape& i) {
          Shape from(shape.size());
          for (size_t d = 0; d < perm.size(); ++d) from[perm[d]] = i[d];
          return Flat(from, shape);
        });
        Check("transpose", {x}, {{"perm", perm}}, want, Tol::kExact);
      }
    }
  }
}

TEST(TransposeKernel, ReversesAxesWhenPermIsEmpty) {
  Rng rng(kSeed);
  for (const Shape& shape : std::vector<Shape>{{}, {4}, {3, 5}, {2, 3, 4}, {2, 1, 0, 3}}) {
    Tensor x = RandomValues(rng, DType::kF32, shape);
    Shape out(shape.rbegin(), shape.rend());
    Expected want = Gather(x, out, [&](const Shape& i) { return Flat(Shape(i.rbegin(), i.rend()), shape); });
    Check("transpose", {x}, {}, want, Tol::kExact);
  }
}

// A random shape with as many elements as `shape`: its dims shuffled, some
// neighbours merged, size-1 dims inserted.
Shape Regroup(Rng& rng, const Shape& shape) {
  Shape out;
  for (int64_t p : RandomPermutation(rng, static_cast<int>(shape.size()))) {
    if (!out.empty() && rng.NextInt(0, 3) == 0) {
      out.back() *= shape[p];
    } else {
      out.push_back(shape[p]);
    }
    if (rng.NextInt(0, 4) == 0) out.push_back(1);
  }
  return out;
}

// The same elements in the same order, under another shape.
Expected SameElements(const Tensor& x, const Shape& shape) {
  return Gather(x, shape, [&](const Shape& i) { return Flat(i, shape); });
}

TEST(ReshapeKernel, KeepsRowMajorOrderUnderTheNewShape) {
  Rng rng(kSeed);
  std::vector<std::pair<Shape, Shape>> cases = {
      {{}, {1, 1}}, {{1, 1, 1}, {}}, {{6}, {2, 3}}, {{2, 3}, {3, 2}}, {{0, 3}, {3, 0, 5}}, {{4, 5}, {20}},
  };
  for (int i = 0; i < 12; ++i) {
    Shape shape = RandomShape(rng, 0, 4, 4);
    cases.push_back({shape, Regroup(rng, shape)});
  }
  for (DType dtype : kAllTypes) {
    for (const auto& [from, to] : cases) {
      Tensor x = RandomValues(rng, dtype, from);
      Check("reshape", {x}, {{"shape", to}}, SameElements(x, to), Tol::kExact);
    }
  }
}

TEST(ReshapeKernel, InfersTheDimensionGivenAsMinusOne) {
  Rng rng(kSeed);
  for (int trial = 0; trial < 12; ++trial) {
    Shape from = RandomShape(rng, 0, 4, 4);
    Shape to = Regroup(rng, from);
    if (to.empty()) to.push_back(1);
    Ints attr = to;
    attr[rng.NextInt(0, static_cast<int64_t>(to.size()))] = -1;
    Tensor x = RandomValues(rng, DType::kF32, from);
    Check("reshape", {x}, {{"shape", attr}}, SameElements(x, to), Tol::kExact);
  }
}

TEST(ExpandDimsKernel, InsertsASize1AxisAtEveryPosition) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {3}, {2, 3}, {2, 0, 4}, {1, 3, 1, 2}}) {
      Tensor x = RandomValues(rng, dtype, shape);
      int rank = x.rank();
      for (int64_t axis = -rank - 1; axis <= rank; ++axis) {
        Shape out = shape;
        out.insert(out.begin() + Normalize(axis, rank + 1), 1);
        Check("expand_dims", {x}, {{"axis", axis}}, SameElements(x, out), Tol::kExact);
      }
    }
  }
}

TEST(SqueezeKernel, DropsAllSize1AxesWhenAxesIsEmpty) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {1}, {3}, {1, 3, 1}, {1, 1, 1}, {2, 1, 0, 1}}) {
      Tensor x = RandomValues(rng, dtype, shape);
      Shape out;
      for (int64_t d : shape) {
        if (d != 1) out.push_back(d);
      }
      Check("squeeze", {x}, {}, SameElements(x, out), Tol::kExact);
    }
  }
}

TEST(SqueezeKernel, DropsOnlyTheGivenAxesCountingNegativeOnesFromTheEnd) {
  Rng rng(kSeed);
  Tensor x = RandomValues(rng, DType::kF64, {1, 3, 1, 1, 2});
  struct Case {
    Ints axes;
    Shape out;
  };
  for (const Case& c : std::vector<Case>{{{0}, {3, 1, 1, 2}},
                                         {{2}, {1, 3, 1, 2}},
                                         {{-2}, {1, 3, 1, 2}},
                                         {{-5, 3}, {3, 1, 2}},
                                         {{3, 0, 2}, {3, 2}}}) {
    Check("squeeze", {x}, {{"axes", c.axes}}, SameElements(x, c.out), Tol::kExact);
  }
}

TEST(ConcatKernel, JoinsInputsAlongTheAxis) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (int trial = 0; trial < 16; ++trial) {
      Shape base = RandomShape(rng, 1, 4, 3);
      if (trial == 0) base[0] = 0;  // empty outside the axis too
      const int rank = static_cast<int>(base.size());
      const int axis = static_cast<int>(rng.NextInt(0, rank));
      const int64_t attr_axis = rng.NextInt(0, 2) ? axis : axis - rank;
      std::vector<Tensor> inputs;
      Ints offsets = {0};
      for (int64_t n = rng.NextInt(1, 5), j = 0; j < n; ++j) {
        Shape s = base;
        s[axis] = rng.NextInt(0, 4);
        inputs.push_back(RandomValues(rng, dtype, s));
        offsets.push_back(offsets.back() + s[axis]);
      }
      Shape out = base;
      out[axis] = offsets.back();
      Expected want(dtype, out);
      ForEachIndex(out, [&](const Shape& i) {
        size_t j = std::upper_bound(offsets.begin(), offsets.end(), i[axis]) - offsets.begin() - 1;
        Shape from = i;
        from[axis] -= offsets[j];
        want.values[Flat(i, out)] = Get(inputs[j], Flat(from, inputs[j].shape()));
      });
      Check("concat", inputs, {{"axis", attr_axis}}, want, Tol::kExact);
    }
  }
}

TEST(StackKernel, JoinsInputsAlongANewAxis) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (int trial = 0; trial < 16; ++trial) {
      Shape shape = trial == 0 ? Shape{} : trial == 1 ? Shape{2, 0} : RandomShape(rng, 0, 3, 4);
      const int rank = static_cast<int>(shape.size());
      const int axis = static_cast<int>(rng.NextInt(0, rank + 1));
      const int64_t attr_axis = rng.NextInt(0, 2) ? axis : axis - rank - 1;
      std::vector<Tensor> inputs;
      for (int64_t n = rng.NextInt(1, 5), j = 0; j < n; ++j) {
        inputs.push_back(RandomValues(rng, dtype, shape));
      }
      Shape out = shape;
      out.insert(out.begin() + axis, static_cast<int64_t>(inputs.size()));
      Expected want(dtype, out);
      ForEachIndex(out, [&](const Shape& i) {
        Shape from = i;
        from.erase(from.begin() + axis);
        want.values[Flat(i, out)] = Get(inputs[i[axis]], Flat(from, shape));
      });
      Check("stack", inputs, {{"axis", attr_axis}}, want, Tol::kExact);
    }
  }
}

TEST(SplitKernel, CutsAlongTheAxisIntoPiecesOfTheGivenSizes) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (int trial = 0; trial < 16; ++trial) {
      Shape shape = RandomShape(rng, 1, 4, 4);
      const int rank = static_cast<int>(shape.size());
      const int axis = static_cast<int>(rng.NextInt(0, rank));
      const int64_t attr_axis = rng.NextInt(0, 2) ? axis : axis - rank;
      // Sizes from sorted cut points: some pieces are empty.
      Ints cuts = {0, shape[axis]};
      for (int64_t n = rng.NextInt(0, 4), j = 0; j < n; ++j) cuts.push_back(rng.NextInt(0, shape[axis] + 1));
      std::sort(cuts.begin(), cuts.end());
      Ints sizes;
      for (size_t j = 1; j < cuts.size(); ++j) sizes.push_back(cuts[j] - cuts[j - 1]);
      Tensor x = RandomValues(rng, dtype, shape);
      Attrs attrs = {{"axis", attr_axis}, {"sizes", sizes}};
      SCOPED_TRACE(Describe("split", {x}, attrs));
      std::vector<Tensor> out = RunKernel("split", {x}, attrs);
      ASSERT_EQ(out.size(), sizes.size());
      for (size_t j = 0; j < sizes.size(); ++j) {
        Shape piece = shape;
        piece[axis] = sizes[j];
        Expected want = Gather(x, piece, [&](const Shape& i) {
          Shape from = i;
          from[axis] += cuts[j];
          return Flat(from, shape);
        });
        EXPECT_TRUE(Matches(out[j], want, Tol::kExact)) << "output " << j;
      }
    }
  }
}

TEST(ChunkKernel, CutsAlongTheAxisIntoEqualPieces) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (int trial = 0; trial < 12; ++trial) {
      Shape shape = RandomShape(rng, 1, 4, 4);
      const int rank = static_cast<int>(shape.size());
      const int axis = static_cast<int>(rng.NextInt(0, rank));
      const int64_t chunks = rng.NextInt(1, 4);
      shape[axis] *= chunks;  // divisible
      Tensor x = RandomValues(rng, dtype, shape);
      Attrs attrs = {{"axis", int64_t{axis}}, {"chunks", chunks}};
      SCOPED_TRACE(Describe("chunk", {x}, attrs));
      std::vector<Tensor> out = RunKernel("chunk", {x}, attrs);
      ASSERT_EQ(static_cast<int64_t>(out.size()), chunks);
      const int64_t size = shape[axis] / chunks;
      for (int64_t j = 0; j < chunks; ++j) {
        Shape piece = shape;
        piece[axis] = size;
        Expected want = Gather(x, piece, [&](const Shape& i) {
          Shape from = i;
          from[axis] += j * size;
          return Flat(from, shape);
        });
        EXPECT_TRUE(Matches(out[j], want, Tol::kExact)) << "output " << j;
      }
    }
  }
}

// Checks slice(x) against the region [lo, hi) of each axis; `begins`/`ends`
// are the attributes as given (possibly negative).
void CheckSlice(const Tensor& x, const Ints& axes, const Ints& begins, const Ints& ends, const Shape& lo,
                const Shape& hi) {
  Shape out(x.rank());
  for (int d = 0; d < x.rank(); ++d) out[d] = hi[d] - lo[d];
  Expected want = Gather(x, out, [&](const Shape& i) {
    Shape from = i;
    for (int d = 0; d < x.rank(); ++d) from[d] += lo[d];
    return Flat(from, x.shape());
  });
  Check("slice", {x}, {{"axes", axes}, {"begins", begins}, {"ends", ends}}, want, Tol::kExact);
}

TEST(SliceKernel, TakesTheRegionBetweenBeginsAndEnds) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    Tensor scalar = RandomValues(rng, dtype, {});
    CheckSlice(scalar, {}, {}, {}, {}, {});
    for (int trial = 0; trial < 20; ++trial) {
      Shape shape = RandomShape(rng, 1, 4, 5);
      const int rank = static_cast<int>(shape.size());
      Tensor x = RandomValues(rng, dtype, shape);
      Shape lo(rank, 0), hi = shape;
      Ints axes, begins, ends;
      for (int64_t a : RandomPermutation(rng, rank)) {
        if (rng.NextInt(0, 3) == 0) continue;  // this axis stays whole
        lo[a] = rng.NextInt(0, shape[a] + 1);
        hi[a] = rng.NextInt(lo[a], shape[a] + 1);  // lo == hi: empty
        axes.push_back(rng.NextInt(0, 2) ? a : a - rank);
        begins.push_back(lo[a]);
        ends.push_back(hi[a]);
      }
      CheckSlice(x, axes, begins, ends, lo, hi);
    }
  }
}

TEST(SliceKernel, CountsNegativeBoundsFromTheEnd) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (int trial = 0; trial < 20; ++trial) {
      Shape shape = RandomShape(rng, 1, 4, 5);
      const int rank = static_cast<int>(shape.size());
      Tensor x = RandomValues(rng, dtype, shape);
      Shape lo(rank, 0), hi = shape;
      Ints axes, begins, ends;
      for (int a = 0; a < rank; ++a) {
        lo[a] = rng.NextInt(0, shape[a]);
        hi[a] = rng.NextInt(lo[a], shape[a] + 1);
        axes.push_back(a);
        // -k is dim - k; 0 would mean the start, so an end at dim stays positive.
        begins.push_back(rng.NextInt(0, 3) ? lo[a] - shape[a] : lo[a]);
        ends.push_back(hi[a] < shape[a] && rng.NextInt(0, 3) ? hi[a] - shape[a] : hi[a]);
      }
      CheckSlice(x, axes, begins, ends, lo, hi);
    }
  }
}

TEST(PadKernel, SurroundsTheInputWithZeros) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    std::vector<Shape> shapes = {{}, {3}, {0}, {2, 0}, {1, 1}};
    for (int i = 0; i < 10; ++i) shapes.push_back(RandomShape(rng, 1, 4, 4));
    for (const Shape& shape : shapes) {
      Tensor x = RandomValues(rng, dtype, shape);
      Ints before, after;
      Shape out = shape;
      for (size_t d = 0; d < shape.size(); ++d) {
        before.push_back(rng.NextInt(0, 3));
        after.push_back(rng.NextInt(0, 3));
        out[d] += before[d] + after[d];
      }
      Expected want = Gather(x, out, [&](const Shape& i) -> int64_t {
        Shape from = i;
        for (size_t d = 0; d < shape.size(); ++d) {
          from[d] -= before[d];
          if (from[d] < 0 || from[d] >= shape[d]) return -1;
        }
        return Flat(from, shape);
      });
      Check("pad", {x}, {{"before", before}, {"after", after}}, want, Tol::kExact);
    }
  }
}

TEST(BroadcastToKernel, RepeatsSize1AndMissingLeadingDims) {
  Rng rng(kSeed);
  std::vector<std::pair<Shape, Shape>> cases = {
      {{}, {}},   {{}, {2, 3}},         {{3}, {2, 3}},      {{3, 1}, {3, 4}},
      {{1}, {0}}, {{3, 1}, {2, 3, 0}}, {{1, 17}, {3, 17}},
  };
  for (int i = 0; i < 12; ++i) {
    Shape target = RandomShape(rng, 0, 4, 4);
    cases.push_back({BroadcastableTo(rng, target), target});
  }
  for (DType dtype : kAllTypes) {
    for (const auto& [from, to] : cases) {
      Tensor x = RandomValues(rng, dtype, from);
      Expected want = Gather(x, to, [&](const Shape& i) { return BroadcastFlat(i, from); });
      Check("broadcast_to", {x}, {{"shape", to}}, want, Tol::kExact);
    }
  }
}

TEST(SumToKernel, SumsBroadcastDimsBackToTheTargetShape) {
  Rng rng(kSeed);
  std::vector<std::pair<Shape, Shape>> cases = {
      {{}, {}},      {{2, 3}, {}},     {{2, 3}, {3}},    {{2, 3}, {2, 1}},
      {{0, 3}, {3}}, {{3, 0}, {3, 1}}, {{2, 3}, {1, 1}}, {{4, 17}, {17}},
  };
  for (int i = 0; i < 12; ++i) {
    Shape shape = RandomShape(rng, 0, 4, 4);
    cases.push_back({shape, BroadcastableTo(rng, shape)});
  }
  for (DType dtype : kNumericTypes) {
    for (const auto& [from, to] : cases) {
      Tensor x = RandomValues(rng, dtype, from);
      Expected want(dtype, to);
      want.scales.resize(want.values.size());
      ForEachIndex(from, [&](const Shape& i) {
        double v = Get(x, Flat(i, from));
        want.values[BroadcastFlat(i, to)] += v;
        want.scales[BroadcastFlat(i, to)] += std::abs(v);
      });
      Check("sum_to", {x}, {{"shape", to}}, want, Tol::kRounding);
    }
  }
}

// ---- Reductions ------------------------------------------------------------------------------------------

// Where each element of x lands in a reduction over `axes` (all when empty).
struct Reduction {
  Shape out;                  // with or without the reduced axes, per keepdims
  Shape kept;                 // reduced axes as size 1: the same elements, in order
  int64_t count = 1;          // elements per output element
  std::vector<int64_t> into;  // per element of x, the flat index of its output element
};

Reduction Reduce(const Shape& x, const Ints& axes, bool keepdims) {
  const int rank = static_cast<int>(x.size());
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t a : axes) reduced[Normalize(a, rank)] = true;
  Reduction r;
  r.kept = x;
  for (int d = 0; d < rank; ++d) {
    if (reduced[d]) {
      r.kept[d] = 1;
      r.count *= x[d];
      if (keepdims) r.out.push_back(1);
    } else {
      r.out.push_back(x[d]);
    }
  }
  r.into.resize(NumElements(x));
  ForEachIndex(x, [&](const Shape& i) { r.into[Flat(i, x)] = BroadcastFlat(i, r.kept); });
  return r;
}

// Axes to reduce over for a tensor of `rank`: all (empty), one, some in any
// order, all listed; each possibly negative.
std::vector<Ints> AxesCombos(Rng& rng, int rank) {
  std::vector<Ints> combos = {{}};
  if (rank == 0) return combos;
  auto maybe_negative = [&](int64_t a) { return rng.NextInt(0, 2) ? a : a - rank; };
  combos.push_back({maybe_negative(rng.NextInt(0, rank))});
  Ints some;
  for (int64_t a : RandomPermutation(rng, rank)) {
    if (rng.NextInt(0, 2)) some.push_back(maybe_negative(a));
  }
  combos.push_back(some);
  Ints all;
  for (int64_t a : RandomPermutation(rng, rank)) all.push_back(maybe_negative(a));
  combos.push_back(all);
  return combos;
}

std::vector<Shape> ReductionShapes(Rng& rng) {
  std::vector<Shape> shapes = {{}, {1}, {7}, {3, 1}, {2, 17}};
  for (int i = 0; i < 10; ++i) shapes.push_back(RandomShape(rng, 1, 4, 4));
  return shapes;
}

// Sum (mean = false) or mean over random axes with keepdims on and off.
void CheckSumOrMean(std::string_view name, const std::vector<DType>& dtypes, bool mean) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = ReductionShapes(rng);
  shapes.push_back({0, 3});  // empty: sums to 0; means are 0/0
  shapes.push_back({3, 0, 2});
  for (DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      Tensor x = RandomValues(rng, dtype, shape);
      for (const Ints& axes : AxesCombos(rng, x.rank())) {
        for (bool keepdims : {false, true}) {
          Reduction r = Reduce(shape, axes, keepdims);
          Expected want(dtype, r.out);
          want.scales.resize(want.values.size());
          for (int64_t i = 0; i < x.numel(); ++i) {
            want.values[r.into[i]] += Get(x, i);
            want.scales[r.into[i]] += std::abs(Get(x, i));
          }
          if (mean) {
            for (size_t i = 0; i < want.values.size(); ++i) {
              want.values[i] /= static_cast<double>(r.count);
              want.scales[i] /= static_cast<double>(r.count);
            }
          }
          Check(name, {x}, {{"axes", axes}, {"keepdims", keepdims}}, want, Tol::kRounding);
        }
      }
    }
  }
}

TEST(SumKernel, SumsOverAxesWithAndWithoutKeepdims) { CheckSumOrMean("sum", kNumericTypes, false); }

TEST(MeanKernel, AveragesOverAxesWithAndWithoutKeepdims) { CheckSumOrMean("mean", kFloatTypes, true); }

// max, or min (`min` true), over every combination of axes.
void CheckMax(Rng& rng, const Tensor& x, bool min = false) {
  for (const Ints& axes : AxesCombos(rng, x.rank())) {
    for (bool keepdims : {false, true}) {
      Reduction r = Reduce(x.shape(), axes, keepdims);
      Expected want(x.dtype(), r.out);
      std::fill(want.values.begin(), want.values.end(), min ? INFINITY : -INFINITY);
      for (int64_t i = 0; i < x.numel(); ++i) {
        double& w = want.values[r.into[i]];
        w = min ? std::min(w, Get(x, i)) : std::max(w, Get(x, i));
      }
      Check(min ? "min" : "max", {x}, {{"axes", axes}, {"keepdims", keepdims}}, want, Tol::kExact);
    }
  }
}

TEST(MinKernel, TakesTheSmallestOverAxesWithAndWithoutKeepdims) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = ReductionShapes(rng);
  for (DType dtype : kNumericTypes) {
    for (const Shape& shape : shapes) CheckMax(rng, TiedValues(rng, dtype, shape), /*min=*/true);
  }
  Tensor empty = RandomValues(rng, DType::kF32, {0, 3});
  EXPECT_THROW(RunKernel("min", {empty}, {{"axes", Ints{0}}}), OpError);
}

TEST(NormKernel, IsTheSquareRootOfTheSumOfSquaresOverAxes) {
  Rng rng(kSeed);
  for (const Shape& shape : ReductionShapes(rng)) {
    for (DType dtype : kFloatTypes) {
      Tensor x = RandomValues(rng, dtype, shape);
      for (const Ints& axes : AxesCombos(rng, x.rank())) {
        for (bool keepdims : {false, true}) {
          Reduction r = Reduce(x.shape(), axes, keepdims);
          Expected want(dtype, r.out);
          for (int64_t i = 0; i < x.numel(); ++i) want.values[r.into[i]] += Get(x, i) * Get(x, i);
          for (double& v : want.values) v = std::sqrt(v);
          Check("norm", {x}, {{"axes", axes}, {"keepdims", keepdims}}, want, Tol::kRounding);
        }
      }
    }
  }
}

TEST(LogsumexpKernel, IsTheLogOfTheSumOfExpsOverAxesStableForLargeInputs) {
  Rng rng(kSeed);
  for (const Shape& shape : ReductionShapes(rng)) {
    for (DType dtype : kFloatTypes) {
      // Around 500: exp overflows unless the maximum is taken out first.
      Tensor x = RandomUniform(rng, shape, 495, 505, dtype);
      for (const Ints& axes : AxesCombos(rng, x.rank())) {
        for (bool keepdims : {false, true}) {
          Reduction r = Reduce(x.shape(), axes, keepdims);
          Expected want(dtype, r.out);
          std::vector<double> sums(want.values.size(), 0.0);
          for (int64_t i = 0; i < x.numel(); ++i) sums[r.into[i]] += std::exp(Get(x, i) - 500);
          for (size_t o = 0; o < sums.size(); ++o) want.values[o] = 500 + std::log(sums[o]);  // -inf when empty
          Check("logsumexp", {x}, {{"axes", axes}, {"keepdims", keepdims}}, want, Tol::kRounding);
        }
      }
    }
  }
}

TEST(MaxKernel, TakesTheLargestOverAxesWithAndWithoutKeepdims) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = ReductionShapes(rng);
  for (DType dtype : kNumericTypes) {
    for (const Shape& shape : shapes) CheckMax(rng, TiedValues(rng, dtype, shape));
  }
}

TEST(MaxKernel, IsNegativeWhenAllElementsAre) {
  Rng rng(kSeed);
  for (DType dtype : kNumericTypes) {
    for (const Shape& shape : ReductionShapes(rng)) {
      Tensor x =
          dtype == DType::kI64 ? RandomInt(rng, shape, -9, -2) : RandomUniform(rng, shape, -9, -2, dtype);
      CheckMax(rng, x);
    }
  }
}

TEST(MaxKernel, GivesAnEmptyResultWhenOnlyKeptAxesAreEmpty) {
  Rng rng(kSeed);
  Tensor x = RandomValues(rng, DType::kF32, {0, 3});
  Check("max", {x}, {{"axes", Ints{1}}}, Expected(DType::kF32, {0}), Tol::kExact);
}

TEST(MaxKernel, ThrowsOnAReductionOverAnEmptyAxis) {
  Rng rng(kSeed);
  Tensor x = RandomValues(rng, DType::kF32, {0, 3});
  EXPECT_THROW(RunKernel("max", {x}, {{"axes", Ints{0}}}), OpError);
  EXPECT_THROW(RunKernel("max", {x}, {}), OpError);
}

TEST(ArgmaxKernel, GivesTheIndexOfTheFirstLargestAlongTheAxis) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = {{1}, {7}, {3, 1}, {2, 17}, {2, 0, 3}};
  for (int i = 0; i < 10; ++i) shapes.push_back(RandomShape(rng, 1, 4, 5));
  for (DType dtype : kNumericTypes) {
    for (const Shape& shape : shapes) {
      Tensor x = TiedValues(rng, dtype, shape);
      const int rank = x.rank();
      for (int64_t axis = -rank; axis < rank; ++axis) {
        if (shape[Normalize(axis, rank)] == 0) continue;  // nothing to pick from
        for (bool keepdims : {false, true}) {
          Reduction r = Reduce(shape, {axis}, keepdims);
          Expected want(DType::kI64, r.out);
          std::vector<double> best(want.values.size(), -INFINITY);
          ForEachIndex(shape, [&](const Shape& i) {
            double v = Get(x, Flat(i, shape));
            int64_t o = BroadcastFlat(i, r.kept);
            if (v > best[o]) {  // strictly: ties keep the first
              best[o] = v;
              want.values[o] = static_cast<double>(i[Normalize(axis, rank)]);
            }
          });
          Check("argmax", {x}, {{"axis", axis}, {"keepdims", keepdims}}, want, Tol::kExact);
        }
      }
    }
  }
}

TEST(ArgminKernel, GivesTheIndexOfTheFirstSmallestAlongTheAxis) {
  Rng rng(kSeed);
  for (DType dtype : kNumericTypes) {
    for (Shape shape : {Shape{7}, Shape{3, 1}, Shape{2, 17}, RandomShape(rng, 1, 4, 5)}) {
      Tensor x = TiedValues(rng, dtype, shape);
      const int rank = x.rank();
      for (int64_t axis = -rank; axis < rank; ++axis) {
        Reduction r = Reduce(shape, {axis}, false);
        Expected want(DType::kI64, r.out);
        std::vector<double> best(want.values.size(), INFINITY);
        ForEachIndex(shape, [&](const Shape& i) {
          double v = Get(x, Flat(i, shape));
          int64_t o = BroadcastFlat(i, r.kept);
          if (v < best[o]) {  // strictly: ties keep the first
            best[o] = v;
            want.values[o] = static_cast<double>(i[Normalize(axis, rank)]);
          }
        });
        Check("argmin", {x}, {{"axis", axis}}, want, Tol::kExact);
      }
    }
  }
}

// softmax (log = false) or log_softmax along each axis of random tensors.
void CheckSoftmax(std::string_view name, bool log, double lo, double hi) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = {{1}, {6}, {3, 1}, {2, 17}, {0, 4}, {2, 0}};
  for (int i = 0; i < 10; ++i) shapes.push_back(RandomShape(rng, 1, 4, 5));
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : shapes) {
      Tensor x = RandomValues(rng, dtype, shape, lo, hi);
      const int rank = x.rank();
      for (int64_t axis = -rank; axis < rank; ++axis) {
        // Per slice along the axis: its max and log Σ exp(x - max).
        Reduction r = Reduce(shape, {axis}, true);
        std::vector<double> max(NumElements(r.kept), -INFINITY), sum(max.size(), 0.0);
        for (int64_t i = 0; i < x.numel(); ++i) max[r.into[i]] = std::max(max[r.into[i]], Get(x, i));
        for (int64_t i = 0; i < x.numel(); ++i) sum[r.into[i]] += std::exp(Get(x, i) - max[r.into[i]]);
        Expected want(dtype, shape);
        if (log) want.scales.resize(want.values.size());
        for (int64_t i = 0; i < x.numel(); ++i) {
          double v = Get(x, i), shifted = v - max[r.into[i]], log_sum = std::log(sum[r.into[i]]);
          if (log) {
            want.values[i] = shifted - log_sum;
            // x - logsumexp cancels for the largest entries: the error is
            // relative to both terms, plus 1 for the sum's relative error.
            want.scales[i] = std::abs(v) + std::abs(max[r.into[i]] + log_sum) + 1;
          } else {
            want.values[i] = std::exp(shifted) / sum[r.into[i]];
          }
        }
        Check(name, {x}, {{"axis", axis}}, want, Tol::kRounding);
      }
    }
  }
}

TEST(SoftmaxKernel, NormalizesExpAlongTheAxis) { CheckSoftmax("softmax", false, -4, 4); }

TEST(SoftmaxKernel, DoesNotOverflowOnLargeLogits) { CheckSoftmax("softmax", false, 990, 1000); }

TEST(LogSoftmaxKernel, IsXMinusLogSumExpAlongTheAxis) { CheckSoftmax("log_softmax", true, -4, 4); }

TEST(LogSoftmaxKernel, DoesNotOverflowOnLargeLogits) { CheckSoftmax("log_softmax", true, 990, 1000); }

// ---- Neural-network operators ----------------------------------------------------------------------------

TEST(TakeKernel, GathersRowsOfTheTableAtEachIndex) {
  Rng rng(kSeed);
  std::vector<Shape> tables = {{5}, {4, 3}, {1, 2}, {3, 2, 2}, {3, 0}};
  std::vector<Shape> index_shapes = {{}, {0}, {1}, {6}, {2, 3}, {2, 0}};
  for (DType dtype : kAllTypes) {
    for (const Shape& table_shape : tables) {
      Tensor table = RandomValues(rng, dtype, table_shape);
      for (const Shape& index_shape : index_shapes) {
        Tensor indices = RandomInt(rng, index_shape, 0, table_shape[0]);
        const int64_t row = NumElements(Shape(table_shape.begin() + 1, table_shape.end()));
        Shape out = index_shape;
        out.insert(out.end(), table_shape.begin() + 1, table_shape.end());
        Expected want = Gather(table, out, [&](const Shape& i) {
          auto split = i.begin() + index_shape.size();
          Shape where(i.begin(), split), within(split, i.end());
          Shape row_shape(table_shape.begin() + 1, table_shape.end());
          return static_cast<int64_t>(Get(indices, Flat(where, index_shape))) * row + Flat(within, row_shape);
        });
        Check("take", {table, indices}, {}, want, Tol::kExact);
      }
    }
  }
}

// gather along axis k: out[a, i, b] = x[a, indices[i], b], with a the axes
// before k and b those after, for every axis (negative ones too).
TEST(GatherKernel, PicksSlicesAlongAnyAxisAtEachIndex) {
  Rng rng(kSeed);
  std::vector<Shape> shapes = {{5}, {4, 3}, {2, 3, 4}, {3, 0}, {2, 0, 3}};
  std::vector<Shape> index_shapes = {{}, {0}, {1}, {6}, {2, 3}};
  for (DType dtype : kAllTypes) {
    for (const Shape& x_shape : shapes) {
      Tensor x = RandomValues(rng, dtype, x_shape);
      const int rank = static_cast<int>(x_shape.size());
      for (int axis = -rank; axis < rank; ++axis) {
        const int k = axis < 0 ? axis + rank : axis;
        if (x_shape[k] == 0) continue;  // no index fits an empty axis
        for (const Shape& index_shape : index_shapes) {
          Tensor indices = RandomInt(rng, index_shape, 0, x_shape[k]);
          const int q = static_cast<int>(index_shape.size());
          Shape out(x_shape.begin(), x_shape.begin() + k);
          out.insert(out.end(), index_shape.begin(), index_shape.end());
          out.insert(out.end(), x_shape.begin() + k + 1, x_shape.end());
          Expected want = Gather(x, out, [&](const Shape& i) {
            Shape where(i.begin() + k, i.begin() + k + q), source(i.begin(), i.begin() + k);
            source.push_back(static_cast<int64_t>(Get(indices, Flat(where, index_shape))));
            source.insert(source.end(), i.begin() + k + q, i.end());
            return Flat(source, x_shape);
          });
          SCOPED_TRACE(ShapeToString(x_shape) + " axis " + std::to_string(axis) + " indices " + ShapeToString(index_shape));
          Check("gather", {x, indices}, {{"axis", int64_t{axis}}}, want, Tol::kExact);
        }
      }
    }
  }
}

TEST(GatherKernel, RefusesAnIndexOutsideTheAxisAndAnAxisOutsideTheRank) {
  Tensor x = Tensor::Zeros(DType::kF32, {2, 3});
  try {
    RunKernel("gather", {x, Tensor::FromVector<int64_t>({2}, {0, 3})}, {{"axis", int64_t{1}}});
    FAIL() << "expected OpError";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("index 3 is out of range for axis 1 of x of size 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(RunKernel("gather", {x, Tensor::FromVector<int64_t>({1}, {-1})}, {{"axis", int64_t{0}}}), OpError);
  EXPECT_THROW(RunKernel("gather", {x, Tensor::FromVector<int64_t>({1}, {0})}, {{"axis", int64_t{2}}}), OpError);
  EXPECT_THROW(RunKernel("gather", {x, Tensor::Zeros(DType::kF32, {1})}, {{"axis", int64_t{0}}}), OpError);
}

TEST(ScatterAddKernel, AccumulatesRowsAtRepeatedIndicesIntoZeros) {
  Rng rng(kSeed);
  struct Case {
    Shape indices, row;
    int64_t rows;
  };
  std::vector<Case> cases = {
      {{}, {}, 3},    {{8}, {}, 3},  {{8}, {2}, 4},     {{2, 5}, {3}, 2}, {{6}, {2, 3}, 7},
      {{0}, {4}, 3},  {{0}, {}, 0},  {{2, 0}, {2}, 1},  {{4}, {0}, 2},    {{30}, {5}, 4},
  };
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      // Indices below rows/2 + 1, so rows above that stay zero.
      Tensor indices = RandomInt(rng, c.indices, 0, std::max<int64_t>(1, c.rows / 2 + 1));
      Shape values_shape = c.indices;
      values_shape.insert(values_shape.end(), c.row.begin(), c.row.end());
      Tensor values = RandomValues(rng, dtype, values_shape);
      Shape out = {c.rows};
      out.insert(out.end(), c.row.begin(), c.row.end());
      Expected want(dtype, out);
      want.scales.resize(want.values.size());
      const int64_t row = NumElements(c.row);
      for (int64_t i = 0; i < indices.numel(); ++i) {
        int64_t to = static_cast<int64_t>(Get(indices, i));
        for (int64_t j = 0; j < row; ++j) {
          want.values[to * row + j] += Get(values, i * row + j);
          want.scales[to * row + j] += std::abs(Get(values, i * row + j));
        }
      }
      Check("scatter_add", {values, indices}, {{"rows", c.rows}}, want, Tol::kRounding);
    }
  }
}

TEST(OneHotKernel, SetsOneAtEachIndexAndZeroElsewhere) {
  Rng rng(kSeed);
  for (DType dtype : kAllTypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {0}, {5}, {2, 3}, {2, 0}}) {
      for (int64_t depth : {1, 2, 5}) {
        Tensor indices = RandomInt(rng, shape, 0, depth);
        Shape out = shape;
        out.push_back(depth);
        Expected want(dtype, out);
        for (int64_t i = 0; i < indices.numel(); ++i) {
          want.values[i * depth + static_cast<int64_t>(Get(indices, i))] = 1;
        }
        Check("one_hot", {indices}, {{"depth", depth}, {"dtype", dtype}}, want, Tol::kExact);
      }
    }
  }
}

TEST(OneHotKernel, DefaultsToF32) {
  Tensor indices = Tensor::FromVector<int64_t>({3}, {2, 0, 1});
  Expected want(DType::kF32, {3, 3});
  want.values = {0, 0, 1, 1, 0, 0, 0, 1, 0};
  Check("one_hot", {indices}, {{"depth", int64_t{3}}}, want, Tol::kExact);
}

// cross_entropy (logits = true) or nll against their batch means (or, with
// `mean=false`, each row's loss), with 1-row, 1-class and empty batches.
void CheckLoss(std::string_view name, bool logits, double lo, double hi, bool mean = true) {
  Rng rng(kSeed);
  std::vector<std::pair<int64_t, int64_t>> sizes = {{1, 1}, {1, 5}, {4, 1}, {0, 3}, {16, 10}};
  for (int i = 0; i < 8; ++i) sizes.push_back({rng.NextInt(1, 7), rng.NextInt(1, 7)});
  for (DType dtype : kFloatTypes) {
    for (auto [batch, classes] : sizes) {
      Tensor scores = RandomValues(rng, dtype, {batch, classes}, lo, hi);
      Tensor labels = RandomInt(rng, {batch}, 0, classes);
      std::vector<double> losses, magnitudes;
      for (int64_t i = 0; i < batch; ++i) {
        double picked = Get(scores, i * classes + static_cast<int64_t>(Get(labels, i)));
        if (!logits) {
          losses.push_back(-picked);
          magnitudes.push_back(std::abs(picked));
          continue;
        }
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j < classes; ++j) max = std::max(max, Get(scores, i * classes + j));
        for (int64_t j = 0; j < classes; ++j) sum += std::exp(Get(scores, i * classes + j) - max);
        losses.push_back(max + std::log(sum) - picked);
        // logsumexp - x[label], like log_softmax: relative to both terms.
        magnitudes.push_back(std::abs(picked) + std::abs(max + std::log(sum)) + 1);
      }
      if (!mean) {
        Expected want(dtype, {batch});
        want.values = losses;
        want.scales = magnitudes;
        Check(name, {scores, labels}, {{"mean", false}}, want, Tol::kRounding);
        continue;
      }
      const double total = std::accumulate(losses.begin(), losses.end(), 0.0);
      const double magnitude = std::accumulate(magnitudes.begin(), magnitudes.end(), 0.0);
      Expected want(dtype, {});
      want.values[0] = batch ? total / static_cast<double>(batch) : 0.0;
      want.scales = {batch ? magnitude / static_cast<double>(batch) : 0.0};
      Check(name, {scores, labels}, {}, want, Tol::kRounding);
    }
  }
}

TEST(CrossEntropyKernel, IsTheBatchMeanOfMinusLogSoftmaxAtTheLabels) {
  CheckLoss("cross_entropy", true, -4, 4);
}

TEST(CrossEntropyKernel, DoesNotOverflowOnLargeLogits) { CheckLoss("cross_entropy", true, 990, 1000); }

TEST(NllKernel, IsTheBatchMeanOfMinusTheScoreAtTheLabels) { CheckLoss("nll", false, -6, 0); }

TEST(CrossEntropyKernel, WithoutTheMeanIsEachRowsLoss) { CheckLoss("cross_entropy", true, -4, 4, /*mean=*/false); }

TEST(NllKernel, WithoutTheMeanIsEachRowsLoss) { CheckLoss("nll", false, -6, 0, /*mean=*/false); }

// ---- Coverage --------------------------------------------------------------------------------------------

// "scatter_add" -> "ScatterAddKernel": the suite that checks an op.
std::string SuiteFor(std::string_view op) {
  std::string suite;
  bool upper = true;
  for (char c : op) {
    if (c == '_') {
      upper = true;
    } else {
      suite += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
  }
  return suite + "Kernel";
}

// ---- Integer arithmetic, creation, shapes ----------------------------------------------------------------

// Python's // and %: the quotient rounds toward -inf, the remainder has the
// divisor's sign.
TEST(FloorDivKernel, RoundsTowardMinusInfinityAsPythonDoes) {
  Tensor x = Tensor::FromVector<int64_t>({6}, {7, -7, 7, -7, 0, 6});
  Tensor y = Tensor::FromVector<int64_t>({6}, {2, 2, -2, -2, 3, 3});
  Expected want(DType::kI64, {6});
  want.values = {3, -4, -4, 3, 0, 2};
  Check("floor_div", {x, y}, {}, want, Tol::kExact);
  Tensor xf = Tensor::FromVector<float>({4}, {7.5f, -7.5f, 1.0f, -0.5f});
  Tensor two = Tensor::FromVector<float>({}, {2.0f});  // broadcast
  Expected wantf(DType::kF32, {4});
  wantf.values = {3, -4, 0, -1};
  Check("floor_div", {xf, two}, {}, wantf, Tol::kExact);
}

TEST(FloorDivKernel, AnIntegerDivisionByZeroIsAnError) {
  Tensor x = Tensor::FromVector<int64_t>({2}, {1, 2}), y = Tensor::FromVector<int64_t>({2}, {1, 0});
  EXPECT_THROW(RunKernel("floor_div", {x, y}, {}), OpError);
  EXPECT_THROW(RunKernel("mod", {x, y}, {}), OpError);
  Tensor lowest = Tensor::FromVector<int64_t>({}, {std::numeric_limits<int64_t>::min()});
  EXPECT_THROW(RunKernel("floor_div", {lowest, Tensor::FromVector<int64_t>({}, {-1})}, {}), OpError);
  EXPECT_THROW(RunKernel("floor_div", {x, Tensor::FromVector<float>({2}, {1, 2})}, {}), OpError);  // dtypes differ
}

TEST(ModKernel, TakesTheDivisorsSignAndRebuildsTheDividend) {
  Tensor x = Tensor::FromVector<int64_t>({6}, {7, -7, 7, -7, 0, 6});
  Tensor y = Tensor::FromVector<int64_t>({6}, {2, 2, -2, -2, 3, 3});
  Expected want(DType::kI64, {6});
  want.values = {1, 1, -1, -1, 0, 0};
  Check("mod", {x, y}, {}, want, Tol::kExact);
  Rng rng(kSeed);
  Tensor a = RandomInt(rng, {4, 5}, -50, 50), b = RandomInt(rng, {5}, 1, 9);
  Tensor q = RunKernel("floor_div", {a, b}, {})[0], r = RunKernel("mod", {a, b}, {})[0];
  for (int64_t i = 0; i < a.numel(); ++i) {
    int64_t bi = b.data<int64_t>()[i % 5];
    EXPECT_EQ(a.data<int64_t>()[i], bi * q.data<int64_t>()[i] + r.data<int64_t>()[i]);
    EXPECT_TRUE(r.data<int64_t>()[i] >= 0 && r.data<int64_t>()[i] < bi);
  }
  Tensor xf = Tensor::FromVector<double>({3}, {5.5, -5.5, 5.5});
  Tensor yf = Tensor::FromVector<double>({3}, {2, 2, -2});
  Expected wantf(DType::kF64, {3});
  wantf.values = {1.5, 0.5, -0.5};
  Check("mod", {xf, yf}, {}, wantf, Tol::kExact);
}

TEST(ZerosKernel, FillsTheShapeAndDtypeOfItsAttributes) {
  for (DType dtype : kAllTypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {0}, {3}, {2, 5}}) {
      Check("zeros", {}, {{"shape", shape}, {"dtype", dtype}}, Expected(dtype, shape), Tol::kExact);
    }
  }
  EXPECT_THROW(RunKernel("zeros", {}, {{"shape", Shape{2, -1}}}), OpError);
  EXPECT_EQ(RunKernel("zeros", {}, {{"shape", Shape{2}}})[0].dtype(), DType::kF32);
}

TEST(OnesKernel, FillsTheShapeAndDtypeOfItsAttributes) {
  for (DType dtype : kAllTypes) {
    for (const Shape& shape : std::vector<Shape>{{}, {0}, {3}, {2, 5}}) {
      Expected want(dtype, shape);
      std::fill(want.values.begin(), want.values.end(), 1.0);
      Check("ones", {}, {{"shape", shape}, {"dtype", dtype}}, want, Tol::kExact);
    }
  }
}

TEST(ShapeOfKernel, GivesTheDimensionsAsAnI64Vector) {
  Rng rng(kSeed);
  for (const Shape& shape : std::vector<Shape>{{}, {0}, {4}, {2, 0, 3}, {1, 7}}) {
    Expected want(DType::kI64, {static_cast<int64_t>(shape.size())});
    for (size_t i = 0; i < shape.size(); ++i) want.values[i] = static_cast<double>(shape[i]);
    Check("shape_of", {RandomValues(rng, DType::kF32, shape)}, {}, want, Tol::kExact);
  }
}

// ---- dropout and layer_norm ---------------------------------------------------------------------------------

TEST(DropoutMaskKernel, KeepsAboutOneMinusTheRateScaledAndIsAFunctionOfTheKey) {
  Tensor x = Tensor::Zeros(DType::kF32, {100, 100});
  auto key = [](int64_t k) { return Tensor::FromVector<int64_t>({}, {k}); };
  Tensor m = RunKernel("dropout_mask", {x, key(7)}, {{"rate", 0.25}})[0];
  int64_t kept = 0;
  for (int64_t i = 0; i < m.numel(); ++i) {
    float v = m.data<float>()[i];
    ASSERT_TRUE(v == 0.0f || v == static_cast<float>(1.0 / 0.75)) << v;
    kept += v != 0.0f;
  }
  EXPECT_NEAR(static_cast<double>(kept) / m.numel(), 0.75, 0.02);
  EXPECT_TRUE(Equal(m, RunKernel("dropout_mask", {x, key(7)}, {{"rate", 0.25}})[0]));  // the same key, the same mask
  EXPECT_FALSE(Equal(m, RunKernel("dropout_mask", {x, key(8)}, {{"rate", 0.25}})[0]));
  Expected all(DType::kF32, {100, 100});
  std::fill(all.values.begin(), all.values.end(), 1.0);
  Check("dropout_mask", {x, key(7)}, {{"rate", 0.0}}, all, Tol::kExact);
  EXPECT_THROW(RunKernel("dropout_mask", {x, key(7)}, {{"rate", 1.0}}), OpError);
  EXPECT_THROW(RunKernel("dropout_mask", {x, Tensor::FromVector<int64_t>({1}, {7})}, {}), OpError);
  EXPECT_THROW(RunKernel("dropout_mask", {x, Tensor::FromVector<float>({}, {7})}, {}), OpError);
}

TEST(DropoutKernel, IsTheInputTimesItsMask) {
  Rng rng(kSeed);
  for (DType dtype : {DType::kF32, DType::kF64}) {
    Tensor x = RandomValues(rng, dtype, {6, 9}), k = Tensor::FromVector<int64_t>({}, {-3});
    Tensor mask = RunKernel("dropout_mask", {x, k}, {{"rate", 0.5}})[0];
    Expected want(dtype, {6, 9});
    for (int64_t i = 0; i < x.numel(); ++i) want.values[i] = Get(x, i) * Get(mask, i);
    Check("dropout", {x, k}, {{"rate", 0.5}}, want, Tol::kRounding);
  }
}

TEST(LayerNormKernel, NormalizesTheLastAxisThenScalesAndShifts) {
  Rng rng(kSeed);
  for (DType dtype : {DType::kF32, DType::kF64}) {
    for (const Shape& shape : std::vector<Shape>{{5}, {3, 4}, {2, 3, 8}, {0, 4}}) {
      const int64_t d = shape.back();
      Tensor x = RandomValues(rng, dtype, shape, -3, 3), gamma = RandomValues(rng, dtype, {d}),
             beta = RandomValues(rng, dtype, {d});
      Expected want(dtype, shape);
      want.scales.resize(want.values.size());  // x̂ * gamma + beta may cancel to near zero
      for (int64_t r = 0; r * d < x.numel(); ++r) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; ++i) mean += Get(x, r * d + i) / d;
        for (int64_t i = 0; i < d; ++i) var += (Get(x, r * d + i) - mean) * (Get(x, r * d + i) - mean) / d;
        for (int64_t i = 0; i < d; ++i) {
          double scaled = (Get(x, r * d + i) - mean) / std::sqrt(var + 1e-5) * Get(gamma, i);
          want.values[r * d + i] = scaled + Get(beta, i);
          want.scales[r * d + i] = std::abs(scaled) + std::abs(Get(beta, i));
        }
      }
      Check("layer_norm", {x, gamma, beta}, {}, want, Tol::kRounding);
    }
  }
  Tensor x = Tensor::Zeros(DType::kF32, {2, 4});
  EXPECT_THROW(RunKernel("layer_norm", {x, Tensor::Ones(DType::kF32, {3}), Tensor::Zeros(DType::kF32, {4})}, {}), OpError);
  EXPECT_THROW(RunKernel("layer_norm", {x, Tensor::Ones(DType::kF64, {4}), Tensor::Zeros(DType::kF32, {4})}, {}), OpError);
  EXPECT_THROW(RunKernel("layer_norm", {x, Tensor::Ones(DType::kF32, {4}), Tensor::Zeros(DType::kF32, {4})},
                         {{"eps", 0.0}}), OpError);
}

// A newly registered op must come with a kernel test; a suite for an op that
// no longer exists is stale.
TEST(KernelCoverage, EveryRegisteredOpHasAKernelTestSuite) {
  std::set<std::string> suites, expected;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) suites.insert(unit.GetTestSuite(i)->name());
  std::string missing;
  for (const OpDef* op : AllOps()) {
    expected.insert(SuiteFor(op->name));
    if (!suites.count(SuiteFor(op->name))) missing += " " + op->name + " (" + SuiteFor(op->name) + ")";
  }
  EXPECT_TRUE(missing.empty()) << "registered ops without a kernel test suite:" << missing;
  std::string stale;
  for (const std::string& suite : suites) {
    if (suite.ends_with("Kernel") && !expected.count(suite)) stale += " " + suite;
  }
  EXPECT_TRUE(stale.empty()) << "kernel test suites for ops that are not registered:" << stale;
}

}  // namespace
}  // namespace pejit
