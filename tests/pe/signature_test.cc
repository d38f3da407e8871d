// The engine's cache of argument signatures (SignatureCache), which must
// always agree with ComputeSignature and ir/abi.h's Flatten.
#include <gtest/gtest.h>

#include <algorithm>

#include "pe/signature.h"

namespace pejit {
namespace {

Value F32(std::vector<float> v) { return Value(Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v)); }
Value I64(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

// A list of `n` tuples (i64 word, f32 vector of `width`), as a minibatch's trees are.
Value Items(int n, int64_t width) {
  std::vector<Value> items;
  for (int i = 0; i < n; ++i) items.push_back(Value::Tuple({I64(i), F32(std::vector<float>(width, 1.0f))}));
  return Value::Tuple(std::move(items));
}

TEST(SignatureCacheTest, AnArgumentPassedAgainHasTheSignatureItHad) {
  SignatureCache cache;
  Value items = Items(3, 2), params = Value::Tuple({F32({1, 2})});
  std::vector<Value> args = {items, I64(0), params};
  Signature first = cache.Compute(args);
  EXPECT_EQ(first, ComputeSignature(args));
  EXPECT_EQ(first.ShortHash(), ComputeSignature(args).ShortHash());
  EXPECT_EQ(cache.size(), 2u) << "the two tuples, not the tensor";
  std::vector<Value> again = {items, I64(5), params};  // copies of the same values
  EXPECT_EQ(cache.Compute(again), first);
  // Other values of other shapes: other signatures, whatever the cache holds.
  std::vector<Value> other = {Items(3, 3), I64(0), params};
  EXPECT_EQ(cache.Compute(other), ComputeSignature(other));
  EXPECT_NE(cache.Compute(other), first);
  EXPECT_EQ(cache.size(), 3u);
}

// Leaves of arguments the cache has seen come from the cache: the same
// tensors, in the same order, as walking the values.
TEST(SignatureCacheTest, FlattensLikeFlatten) {
  SignatureCache cache;
  Value items = Items(3, 2), params = Value::Tuple({F32({1, 2}), I64(4)});
  std::vector<Value> args = {items, I64(0), params, F32({5})};
  auto expect_same = [&](const std::vector<bool>& static_args) {
    std::vector<size_t> first;
    std::vector<Tensor> got = cache.Flatten(args, static_args, &first), want = Flatten(args, static_args);
    EXPECT_EQ(got.size(), want.size());
    for (size_t j = 0; j < std::min(got.size(), want.size()); ++j) {
      EXPECT_EQ(got[j].raw_data(), want[j].raw_data()) << "leaf " << j;
    }
    return first;
  };
  EXPECT_EQ(expect_same({}), (std::vector<size_t>{0, 6, 7, 9})) << "before the cache has seen them";
  cache.Compute(args);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(expect_same({}), (std::vector<size_t>{0, 6, 7, 9}));
  EXPECT_EQ(expect_same({false, false, true}), (std::vector<size_t>{0, 6, 7, 7}));
}

TEST(SignatureCacheTest, EntriesDieWithTheirValues) {
  SignatureCache cache(/*capacity=*/4);
  // Short-lived values, so that later ones may reuse the addresses of earlier
  // ones: each must still get its own signature.
  for (int n = 1; n <= 40; ++n) {
    std::vector<Value> args = {Items(n % 7 + 1, n % 3 + 1)};
    EXPECT_EQ(cache.Compute(args), ComputeSignature(args)) << n;
    std::vector<size_t> first;
    EXPECT_EQ(cache.Flatten(args, {}, &first).size(), Flatten(args).size()) << n;
    EXPECT_LE(cache.size(), 4u);
  }
}

TEST(SignatureCacheTest, StaticArgumentsAreReadEveryTime) {
  SignatureCache cache;
  Tensor scale = Tensor::FromVector<float>({1}, {2});
  std::vector<Value> args = {Value::Tuple({Value(scale)})};
  Signature before = cache.Compute(args, {true});
  scale.data<float>()[0] = 3;  // written in place, as an optimizer does
  Signature after = cache.Compute(args, {true});
  EXPECT_NE(after, before);
  EXPECT_EQ(after, ComputeSignature(args, {true}));
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace pejit
