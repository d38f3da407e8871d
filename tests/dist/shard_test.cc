// Sharding a global minibatch across ranks by cost, and a group of one
// (no mpirun): what data-parallel training rests on without MPI running.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "dist/communicator.h"

namespace pejit::dist {
namespace {

std::vector<int64_t> Loads(const std::vector<int64_t>& costs, const std::vector<int>& owner, int ranks) {
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  for (size_t i = 0; i < costs.size(); ++i) load[static_cast<size_t>(owner[i])] += costs[i];
  return load;
}

TEST(ShardByCost, BalancesTheRanksNodeCountsAndIsTheSameOnEveryCall) {
  std::vector<int64_t> costs = {31, 5, 9, 9, 40, 2, 17, 23, 11, 8, 3, 26};
  std::vector<int> owner = ShardByCost(costs, 3);
  EXPECT_EQ(owner, ShardByCost(costs, 3));
  std::vector<int64_t> load = Loads(costs, owner, 3);
  const int64_t total = std::accumulate(costs.begin(), costs.end(), int64_t{0});
  EXPECT_EQ(std::accumulate(load.begin(), load.end(), int64_t{0}), total);
  // The costliest-first greedy is within the largest item of the mean.
  for (int64_t l : load) EXPECT_LE(l, total / 3 + 40);
  EXPECT_LE(*std::max_element(load.begin(), load.end()) - *std::min_element(load.begin(), load.end()), 9);
}

TEST(ShardByCost, FewerItemsThanRanksLeaveSomeRanksEmptyAndOneRankTakesAll) {
  std::vector<int> owner = ShardByCost({4, 7}, 4);
  EXPECT_EQ(owner, (std::vector<int>{1, 0}));
  EXPECT_EQ(ShardByCost({4, 7, 1}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(ShardByCost({1}, 0), std::invalid_argument);
}

TEST(Communicator, WithoutMpirunIsAGroupOfOneWhoseReductionsChangeNothing) {
  Communicator& world = Communicator::World();
  ASSERT_FALSE(world.distributed());
  EXPECT_EQ(world.rank(), 0);
  std::vector<Tensor> tensors = {Tensor::FromVector<float>({3}, {1, 2, 3})};
  world.AllReduceSum(tensors);
  EXPECT_EQ(tensors[0].data<float>()[2], 3.0f);
  std::vector<Tensor> wrong = {Tensor::Zeros(DType::kI64, {2})};
  EXPECT_THROW(world.AllReduceSum(wrong), std::invalid_argument);
  EXPECT_THROW(world.set_bucket_bytes(2), std::invalid_argument);
}

}  // namespace
}  // namespace pejit::dist
