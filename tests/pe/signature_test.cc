// The leaves a gradient is taken for (FloatWrtLeaves): what the engine, the
// `pejit compile --grad` command and bench/jit all ask autodiff for.
#include <gtest/gtest.h>

#include "pe/signature.h"

namespace pejit {
namespace {

Value F32(std::vector<float> v) { return Value(Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v)); }
Value I64(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

TEST(FloatWrtLeavesTest, TheFloatLeavesOfTheWrtArgumentsInFlattenOrder) {
  // Leaves: 0 word (i64), 1 emb; 2 label (i64); 3 w, 4 b, 5 step (i64).
  std::vector<Value> args = {Value::Tuple({I64(3), F32({1, 2})}), I64(1),
                             Value::Tuple({F32({1}), F32({2}), I64(7)})};
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{2}), (std::vector<int>{3, 4}));
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{2, 0}), (std::vector<int>{1, 3, 4}));  // ascending
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{0, 0}), (std::vector<int>{1}));        // each once
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{1}), (std::vector<int>{}));            // integers have none
}

TEST(FloatWrtLeavesTest, StaticArgumentsHaveNoLeaves) {
  std::vector<Value> args = {F32({1}), F32({2}), F32({3})};
  // Argument 0 is static: Flatten skips it, so argument 2's leaf is index 1.
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{2}, {true}), (std::vector<int>{1}));
  EXPECT_EQ(FloatWrtLeaves(args, std::vector<int>{0}, {true}), (std::vector<int>{}));
}

TEST(FloatWrtLeavesTest, FromLeavesAlreadyFlattened) {
  std::vector<Value> args = {I64(1), Value::Tuple({F32({1}), F32({2})})};
  std::vector<Tensor> leaves = Flatten(args);
  std::vector<size_t> first = {0, 1};
  EXPECT_EQ(FloatWrtLeaves(leaves, first, std::vector<int>{1}), FloatWrtLeaves(args, std::vector<int>{1}));
}

TEST(FloatWrtLeavesTest, AnIndexThatNamesNoArgumentIsRefused) {
  try {
    FloatWrtLeaves({F32({1})}, std::vector<int>{3});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "gradient with respect to argument 3: there is no such argument (the call has 1)");
  }
}

}  // namespace
}  // namespace pejit
