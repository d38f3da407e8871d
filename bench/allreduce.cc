// The gradient all-reduce's cost per byte (dist/, issue 28), under mpirun:
//   mpirun -np 2 bazel-bin/bench/allreduce [--bucket-bytes N]
// For sizes from 1 KiB to 64 MiB of f32 (one tensor, and the same bytes in
// 64 tensors), the median wall time of 15 reductions after 3 warm-ups;
// rank 0 prints a JSON line per size, then t = alpha + beta * bytes (alpha
// the smallest size's time, beta the slope from 1 MiB up).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "dist/communicator.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t bucket_bytes = size_t{4} << 20;
  CLI::App app{"Time the dist/ gradient all-reduce per size (run under mpirun); prints JSON lines"};
  app.add_option("--bucket-bytes", bucket_bytes, "bucket size")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  pejit::dist::Communicator& world = pejit::dist::Communicator::World();
  world.set_bucket_bytes(bucket_bytes);
  std::vector<double> xs, ys;
  for (size_t bytes = 1024; bytes <= (size_t{64} << 20); bytes *= 4) {
    for (int pieces : {1, 64}) {
      const int64_t per = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4 / static_cast<size_t>(pieces)));
      std::vector<pejit::Tensor> tensors;
      for (int p = 0; p < pieces; ++p) tensors.push_back(pejit::Tensor::Full(pejit::DType::kF32, {per}, 1.0));
      std::vector<double> times;
      for (int rep = 0; rep < 18; ++rep) {
        auto start = std::chrono::steady_clock::now();
        world.AllReduceSum(tensors);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (rep >= 3) times.push_back(s);
      }
      const double t = Median(times);
      if (pieces == 1) {
        xs.push_back(static_cast<double>(bytes));
        ys.push_back(t);
      }
      if (world.rank() == 0) {
        std::printf("%s\n", nlohmann::json({{"ranks", world.size()},
                                            {"bytes", bytes},
                                            {"tensors", pieces},
                                            {"bucket_bytes", bucket_bytes},
                                            {"seconds", t},
                                            {"gb_per_s", static_cast<double>(bytes) / t / 1e9}})
                                .dump()
                                .c_str());
      }
    }
  }
  // Latency: the smallest size's time; bandwidth: the slope from 1 MiB to
  // the largest (cache-resident sizes make a least-squares fit meaningless).
  const size_t mib = static_cast<size_t>(std::find(xs.begin(), xs.end(), double(1 << 20)) - xs.begin());
  const double alpha = ys.front(), beta = (ys.back() - ys[mib]) / (xs.back() - xs[mib]);
  if (world.rank() == 0) {
    std::printf("%s\n", nlohmann::json({{"fit", "seconds = alpha + beta * bytes"},
                                        {"ranks", world.size()},
                                        {"alpha_us", alpha * 1e6},
                                        {"beta_ns_per_byte", beta * 1e9}})
                            .dump()
                            .c_str());
  }
  return 0;
}
