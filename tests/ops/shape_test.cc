// Shape behaves as the std::vector<int64_t> it replaced, inline or on the
// heap, and a copied Tensor shares its buffer without sharing its shape.
#include "ops/shape.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "ops/tensor.h"

namespace pejit {
namespace {

std::vector<int64_t> V(const Shape& s) { return s; }

// Every edit done to a Shape and to a std::vector side by side, across the
// inline capacity and back.
TEST(ShapeTest, EditsAsAVectorDoesAcrossTheInlineCapacity) {
  Shape s;
  std::vector<int64_t> v;
  for (int64_t d = 1; d <= 12; ++d) {
    s.push_back(d);
    v.push_back(d);
    ASSERT_EQ(V(s), v) << d;
  }
  s.insert(s.begin() + 3, 99);
  v.insert(v.begin() + 3, 99);
  s.insert(s.begin(), {7, 8});
  v.insert(v.begin(), {7, 8});
  s.erase(s.begin() + 1, s.begin() + 4);
  v.erase(v.begin() + 1, v.begin() + 4);
  s.erase(s.end() - 1);
  v.erase(v.end() - 1);
  EXPECT_EQ(V(s), v);
  s.resize(2);
  v.resize(2);
  EXPECT_EQ(V(s), v);
  s.resize(4, -1);
  v.resize(4, -1);
  EXPECT_EQ(V(s), v);
  s.pop_back();
  v.pop_back();
  EXPECT_EQ(V(s), v);
  s.insert(s.begin() + 1, s.begin(), s.end());  // a range of its own
  const std::vector<int64_t> before = v;
  v.insert(v.begin() + 1, before.begin(), before.end());
  EXPECT_EQ(V(s), v);
  EXPECT_THROW(s.at(s.size()), std::out_of_range);
}

TEST(ShapeTest, CopiesAndMovesKeepTheirOwnDimensions) {
  for (size_t rank : {size_t{0}, size_t{3}, Shape::kInline, Shape::kInline + 4}) {
    Shape a(rank, 5);
    for (size_t i = 0; i < rank; ++i) a[i] = static_cast<int64_t>(i);
    Shape b = a;
    if (rank > 0) b[0] = 42;
    EXPECT_EQ(a.size(), rank);
    if (rank > 0) EXPECT_EQ(a[0], 0);
    Shape c = std::move(b);
    EXPECT_EQ(c.size(), rank);
    if (rank > 0) EXPECT_EQ(c[0], 42);
    EXPECT_TRUE(b.empty());  // NOLINT: moved from, as a vector is left
    b = c;                   // usable again
    EXPECT_EQ(b, c);
    a = std::move(c);
    EXPECT_EQ(a, b);
    a.swap(b);
    EXPECT_EQ(a, b);
  }
}

TEST(ShapeTest, ComparesAndOrdersAsAVector) {
  EXPECT_EQ(Shape({2, 3}), (std::vector<int64_t>{2, 3}));
  EXPECT_NE(Shape({2, 3}), Shape({2, 3, 1}));
  EXPECT_LT(Shape({2, 3}), Shape({2, 3, 1}));
  EXPECT_LT(Shape({1, 9}), Shape({2}));
  std::map<Shape, int> by_shape{{{4, 4}, 1}, {{4}, 2}, {{}, 3}};
  EXPECT_EQ(by_shape.begin()->second, 3);
  EXPECT_EQ(by_shape.at(Shape{4, 4}), 1);
}

// The reason for Shape: a Tensor is a handle, and copies of it are cheap.
TEST(ShapeTest, ACopiedTensorSharesItsBufferNotItsShape) {
  Tensor t = Tensor::Zeros(DType::kF32, {2, 3});
  Tensor r = t.Reshaped({3, 2});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.raw_data(), t.raw_data());
  Tensor big = Tensor::Zeros(DType::kF32, Shape(Shape::kInline + 1, 1));
  Tensor copy = big;
  EXPECT_EQ(copy.shape(), big.shape());
  EXPECT_NE(copy.shape().data(), big.shape().data());
}

}  // namespace
}  // namespace pejit
