// Tensors: construction, sharing, printing, comparison and seeded random init.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "ops/op.h"
#include "ops/random.h"
#include "ops/tensor.h"

namespace pejit {
namespace {

TEST(Tensor, ShapesPrintLikeNumpy) {
  EXPECT_EQ(ShapeToString({}), "()");
  EXPECT_EQ(ShapeToString({5}), "(5,)");
  EXPECT_EQ(ShapeToString({3, 4}), "(3, 4)");
  EXPECT_EQ(ShapeToString({kUnknownDim, 4}), "(?, 4)");
  EXPECT_EQ((TensorType{DType::kI64, {2, 3}}).ToString(), "Tensor[(2, 3), i64]");
}

TEST(Tensor, ScalarIsZeroDimensional) {
  Tensor s = Tensor::Scalar(2.5f);
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.item(), 2.5);
  EXPECT_EQ(s.ToString(), "2.5");
}

TEST(Tensor, BuffersAre64ByteAlignedAndStridesRowMajor) {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::Zeros(DType::kF32, {n, 3});
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
    EXPECT_EQ(t.strides(), (Shape{3, 1}));
  }
  EXPECT_EQ(RowMajorStrides({2, 3, 4}), (Shape{12, 4, 1}));
}

TEST(Tensor, CopiesShareTheBufferAndCloneDoesNot) {
  Tensor a = Tensor::Zeros(DType::kF32, {4});
  Tensor shared = a;
  Tensor cloned = a.Clone();
  a.data<float>()[0] = 7;
  EXPECT_EQ(shared.data<float>()[0], 7);
  EXPECT_EQ(cloned.data<float>()[0], 0);
}

TEST(Tensor, FullOnesAndFromVectorFillEveryElement) {
  Tensor f = Tensor::Full(DType::kI64, {2, 2}, 9);
  Tensor o = Tensor::Ones(DType::kF64, {3});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f.data<int64_t>()[i], 9);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(o.data<double>()[i], 1.0);
  EXPECT_THROW(Tensor::FromVector<float>({2, 2}, {1, 2, 3}), std::invalid_argument);
}

TEST(Tensor, TypedAccessChecksTheDType) {
  Tensor t = Tensor::Zeros(DType::kF32, {2});
  EXPECT_THROW(t.data<double>(), std::logic_error);
  EXPECT_THROW(Tensor().data<float>(), std::logic_error);
}

TEST(Tensor, ReshapedKeepsTheElementCount) {
  Tensor t = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(t.Reshaped({3, 2}).shape(), (Shape{3, 2}));
  EXPECT_THROW(t.Reshaped({4}), std::invalid_argument);
}

// Issue 24: a product of dimensions that wraps must not pass for a small tensor.
TEST(Tensor, ShapesWhoseElementOrByteCountOverflowsAreRefused) {
  EXPECT_THROW(NumElements({int64_t{1} << 62, 4}), std::invalid_argument);
  EXPECT_THROW(NumElements({int64_t{1} << 32, int64_t{1} << 32}), std::invalid_argument);
  EXPECT_EQ(NumElements({int64_t{1} << 62, 4, 0}), 0);  // no elements whatever the others
  EXPECT_EQ(NumElements({int64_t{1} << 31, int64_t{1} << 31}), int64_t{1} << 62);
  EXPECT_THROW(Tensor::Empty(DType::kF32, {int64_t{1} << 61, 2}), std::invalid_argument);  // 2^64 bytes
  EXPECT_THROW(Tensor::Empty(DType::kF32, {int64_t{1} << 62, 4}), std::invalid_argument);
  EXPECT_EQ(NumBytes({DType::kF64, {3, 5}}), 120);
  EXPECT_EQ(NumBytes({DType::kF32, {int64_t{1} << 27, int64_t{1} << 27}}), kMaxTensorBytes);
  EXPECT_THROW(NumBytes({DType::kF32, {int64_t{1} << 30, int64_t{1} << 30}}), std::invalid_argument);  // 2^62 bytes
  try {
    InferTypes(LookupOp("broadcast_to"), std::vector<TensorType>{{DType::kF32, {}}},
               NormalizeAttrs(LookupOp("broadcast_to"), {{"shape", std::vector<int64_t>{int64_t{1} << 62, 4}}}));
    FAIL() << "broadcast_to accepted 2^64 elements";
  } catch (const OpError& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast_to: "), std::string::npos) << e.what();
  }
  const int64_t half = int64_t{1} << 62;  // before + after = 2^63: wrapped to a negative size
  EXPECT_THROW(InferTypes(LookupOp("pad"), std::vector<TensorType>{{DType::kF32, {4}}},
                          NormalizeAttrs(LookupOp("pad"), {{"before", std::vector<int64_t>{half}},
                                                           {"after", std::vector<int64_t>{half}}})),
               OpError);
  EXPECT_THROW(InferTypes(LookupOp("broadcast_to"), std::vector<TensorType>{{DType::kF32, {}}},
                          NormalizeAttrs(LookupOp("broadcast_to"), {{"shape", std::vector<int64_t>{-3, 4}}})),
               OpError);
  EXPECT_THROW(InferTypes(LookupOp("sum_to"), std::vector<TensorType>{{DType::kF32, {1, 4}}},
                          NormalizeAttrs(LookupOp("sum_to"), {{"shape", std::vector<int64_t>{-3, 4}}})),
               OpError);
  // Three sizes of 2^62 add up past 2^63: the sum wrapped.
  EXPECT_THROW(InferTypes(LookupOp("split"), std::vector<TensorType>{{DType::kF32, {4}}},
                          NormalizeAttrs(LookupOp("split"), {{"sizes", std::vector<int64_t>{half, half, half}}})),
               OpError);
}

// 2^50 bytes is within kMaxTensorBytes but beyond any x86-64 address space,
// so the allocator refuses it on every machine; the error says what was asked.
TEST(Tensor, AnAllocationTheMachineCannotHoldSaysHowMuchAndForWhat) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers abort on such a request instead of returning null";
#else
  try {
    Tensor::Empty(DType::kF32, {int64_t{1} << 24, int64_t{1} << 24});
    FAIL() << "a 4 PiB tensor was allocated";
  } catch (const TensorAllocError& e) {
    EXPECT_EQ(std::string(e.what()),
              "out of memory: cannot allocate 1125899906842624 bytes for a Tensor[(16777216, 16777216), f32]");
  }
#endif
}

TEST(Tensor, EmptyTensorsHaveNoElements) {
  Tensor t = Tensor::Zeros(DType::kF32, {0, 3});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.ToString(), "[]");
  EXPECT_TRUE(Equal(t, Tensor::Ones(DType::kF32, {0, 3})));
}

TEST(Tensor, PrintsNestedRows) {
  Tensor t = Tensor::FromVector<int64_t>({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(t.ToString(), "[[1, 2],\n [3, 4]]");
  EXPECT_EQ(Tensor::FromVector<bool>({2}, {true, false}).ToString(), "[true, false]");
  EXPECT_EQ(Tensor::FromVector<float>({3}, {0.5f, -1, 1e10f}).ToString(), "[0.5, -1, 1e+10]");
}

TEST(Tensor, ElidesLargeTensorsWhenPrinting) {
  Tensor t = Tensor::Zeros(DType::kI64, {2000});
  EXPECT_EQ(t.ToString(), "[0, 0, 0, ..., 0, 0, 0]");
  Tensor m = Tensor::Zeros(DType::kI64, {100, 100});
  std::string s = m.ToString();
  EXPECT_LT(s.size(), 200u);
  EXPECT_NE(s.find("..."), std::string::npos);
}

TEST(Tensor, EqualIsExactAndAllCloseHasTolerances) {
  Tensor a = Tensor::FromVector<float>({2}, {1.0f, 2.0f});
  Tensor b = Tensor::FromVector<float>({2}, {1.0f, 2.000001f});
  EXPECT_FALSE(Equal(a, b));
  EXPECT_TRUE(AllClose(a, b, 1e-5));
  EXPECT_FALSE(AllClose(a, b, 1e-8, 0));
  EXPECT_FALSE(AllClose(a, a.Reshaped({2, 1})));                     // shapes differ
  EXPECT_FALSE(Equal(a, Tensor::FromVector<double>({2}, {1.0, 2.0})));  // dtypes differ
  Tensor nan = Tensor::FromVector<float>({1}, {NAN});
  EXPECT_TRUE(Equal(nan, nan.Clone()));
  EXPECT_TRUE(AllClose(nan, nan.Clone()));
}

TEST(Random, SameSeedSameTensorsOtherSeedOtherTensors) {
  Rng a(5), b(5), c(6);
  Tensor x = RandomNormal(a, {100}, 0, 1);
  EXPECT_TRUE(Equal(x, RandomNormal(b, {100}, 0, 1)));
  EXPECT_FALSE(Equal(x, RandomNormal(c, {100}, 0, 1)));
}

TEST(Random, UniformStaysInRangeAndNormalHasItsMoments) {
  Rng rng(11);
  Tensor u = RandomUniform(rng, {10000}, -3, 5);
  Tensor n = RandomNormal(rng, {20000}, 2, 0.5, DType::kF64);
  double mean = 0, var = 0;
  for (int64_t i = 0; i < u.numel(); ++i) {
    EXPECT_GE(u.data<float>()[i], -3);
    EXPECT_LT(u.data<float>()[i], 5);
  }
  for (int64_t i = 0; i < n.numel(); ++i) mean += n.data<double>()[i] / n.numel();
  for (int64_t i = 0; i < n.numel(); ++i) var += std::pow(n.data<double>()[i] - mean, 2) / n.numel();
  EXPECT_NEAR(mean, 2, 0.02);
  EXPECT_NEAR(std::sqrt(var), 0.5, 0.02);
}

TEST(Random, XavierBoundDependsOnFanInAndFanOut) {
  Rng rng(3);
  Tensor w = XavierUniform(rng, {64, 32});
  double bound = std::sqrt(6.0 / 96), largest = 0;
  for (int64_t i = 0; i < w.numel(); ++i) largest = std::max(largest, std::abs(double(w.data<float>()[i])));
  EXPECT_LE(largest, bound);
  EXPECT_GT(largest, 0.9 * bound);
  EXPECT_THROW(XavierUniform(rng, {3}), std::invalid_argument);
}

TEST(Random, IntegersCoverTheirRange) {
  Rng rng(1);
  Tensor t = RandomInt(rng, {1000}, 3, 7);
  std::vector<int> seen(10);
  for (int64_t i = 0; i < t.numel(); ++i) seen.at(t.data<int64_t>()[i])++;
  EXPECT_EQ(seen[2] + seen[7], 0);
  for (int v = 3; v < 7; ++v) EXPECT_GT(seen[v], 150);
}

}  // namespace
}  // namespace pejit
