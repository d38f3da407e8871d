// Run by mpi_test.sh alone and under `mpirun -np 2`: one epoch of 20 steps
// of the demos' trainers (examples/), policy sync (every step compiled, so
// that runs are deterministic):
//   data_parallel_steps treelstm CHECKPOINT   the Tree-LSTM on generated ListOps
//   data_parallel_steps mlp                   the MLP on synthetic images
// Rank 0 prints one JSON line: the steps' losses, and for the MLP every
// parameter tensor's sum, sum of squares and first elements; the Tree-LSTM's
// rank 0 saves its checkpoint.
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "examples/mlp/trainer.h"
#include "examples/treelstm/trainer.h"
#include "ops/blas.h"
#include "ops/random.h"

namespace {

pejit::EngineOptions Deterministic() {
  pejit::EngineOptions engine;
  engine.policy = pejit::Policy::Sync();
  engine.workers = 1;
  engine.log_level = "off";
  return engine;
}

nlohmann::json TreeLstm(pejit::dist::Communicator& world, const std::string& checkpoint) {
  pejit::treelstm::RunOptions o;
  o.listops_train = 400;  // 20 global minibatches of 20 trees
  o.listops_dev = 0;
  o.batch = 20;
  o.embed = 16;
  o.hidden = 16;
  pejit::treelstm::Trainer trainer(o, pejit::treelstm::LoadDataset(o), Deterministic(), &world);
  pejit::treelstm::EpochResult r = trainer.TrainEpoch();
  if (world.rank() == 0) trainer.Save(checkpoint);
  return {{"losses", r.losses}};
}

// 400 images of 10 classes: a random prototype per class plus noise.
pejit::mlp::Split Synthetic(int64_t n) {
  pejit::Rng rng(7);
  pejit::Tensor prototypes = pejit::RandomUniform(rng, {pejit::mlp::kClasses, pejit::mlp::kPixels}, 0, 1);
  pejit::mlp::Split s{pejit::Tensor::Empty(pejit::DType::kF32, {n, pejit::mlp::kPixels}),
                      pejit::RandomInt(rng, {n}, 0, pejit::mlp::kClasses)};
  for (int64_t i = 0; i < n; ++i) {
    const float* proto = prototypes.data<float>() + s.labels.data<int64_t>()[i] * pejit::mlp::kPixels;
    float* x = s.images.data<float>() + i * pejit::mlp::kPixels;
    for (int j = 0; j < pejit::mlp::kPixels; ++j) x[j] = proto[j] + static_cast<float>(rng.NextUniform() - 0.5);
  }
  return s;
}

nlohmann::json Mlp(pejit::dist::Communicator& world) {
  pejit::mlp::RunOptions o;
  o.batch = 20;  // 20 steps of the 400 images
  pejit::mlp::Trainer trainer(o, Synthetic(400), Synthetic(20), Deterministic(), &world);
  pejit::mlp::EpochResult r = trainer.TrainEpoch();
  nlohmann::json params = nlohmann::json::array();
  for (const pejit::Tensor& t : pejit::ParameterLeaves(trainer.params())) {
    const float* x = t.data<float>();
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      sum += x[i];
      squares += static_cast<double>(x[i]) * x[i];
    }
    params.push_back({sum, squares});
    for (int64_t i = 0; i < std::min<int64_t>(16, t.numel()); ++i) params.push_back(x[i]);
  }
  return {{"losses", r.losses}, {"params", params}};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "";
  if (!((model == "treelstm" && argc == 3) || (model == "mlp" && argc == 2))) {
    std::fprintf(stderr, "usage: data_parallel_steps treelstm CHECKPOINT | data_parallel_steps mlp\n");
    return 2;
  }
  pejit::dist::Communicator& world = pejit::dist::Communicator::World();
  try {
    pejit::SetBlasThreads(1);
    nlohmann::json out = model == "treelstm" ? TreeLstm(world, argv[2]) : Mlp(world);
    out["ranks"] = world.size();
    if (world.rank() == 0) std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    world.Abort(e.what());
  }
}
