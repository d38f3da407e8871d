// Run under `mpirun -np N` by mpi_test.sh: the gradient all-reduce and the
// broadcast across real ranks. Exits 0 when every check holds on this rank,
// else prints what failed (naming the rank) and exits 1.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dist/communicator.h"

using pejit::DType;
using pejit::Tensor;

int main() {
  pejit::dist::Communicator& world = pejit::dist::Communicator::World();
  const int rank = world.rank(), size = world.size();
  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
      ++failures;
    }
  };
  check(size >= 2, "expected at least 2 ranks, got " + std::to_string(size));
  // Small tensors sharing a bucket and a large one spanning several (a
  // bucket of 1,000 bytes: 250 floats).
  world.set_bucket_bytes(1000);
  const std::vector<int64_t> sizes = {1, 3, 250, 1001, 7};
  auto fill = [&](int r) {
    std::vector<Tensor> tensors;
    for (size_t t = 0; t < sizes.size(); ++t) {
      Tensor x = Tensor::Empty(DType::kF32, {sizes[t]});
      for (int64_t i = 0; i < sizes[t]; ++i) x.data<float>()[i] = 0.1f * static_cast<float>(r + 1) + 1e-3f * i + t;
      tensors.push_back(x);
    }
    return tensors;
  };
  std::vector<Tensor> mine = fill(rank);
  world.AllReduceSum(mine);
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (int64_t i = 0; i < sizes[t]; ++i) {
      double want = 0;
      for (int r = 0; r < size; ++r) want += fill(r)[t].data<float>()[i];
      const float got = mine[t].data<float>()[i];
      if (std::fabs(got - want) > 1e-5 * std::fabs(want) + 1e-6) {
        check(false, "tensor " + std::to_string(t) + "[" + std::to_string(i) + "] = " + std::to_string(got) +
                         ", want " + std::to_string(want));
        break;
      }
    }
  }
  // Every rank holds the same bits: rank 0's, broadcast, compared.
  std::vector<Tensor> rank0;
  for (const Tensor& t : mine) rank0.push_back(t.Clone());
  world.Broadcast(rank0, 0);
  for (size_t t = 0; t < sizes.size(); ++t) {
    check(std::memcmp(rank0[t].raw_data(), mine[t].raw_data(), mine[t].nbytes()) == 0,
          "tensor " + std::to_string(t) + " differs from rank 0's in some bit");
  }
  // The same reduction again gives the same bits (a fixed order).
  std::vector<Tensor> again = fill(rank);
  world.AllReduceSum(again);
  for (size_t t = 0; t < sizes.size(); ++t) {
    check(std::memcmp(again[t].raw_data(), mine[t].raw_data(), mine[t].nbytes()) == 0,
          "a second reduction of tensor " + std::to_string(t) + " differs from the first");
  }
  check(world.stats().calls == 2, "stats: " + std::to_string(world.stats().calls) + " calls, want 2");
  if (failures == 0 && rank == 0) std::printf("allreduce_check: %d ranks agree\n", size);
  return failures == 0 ? 0 : 1;
}
