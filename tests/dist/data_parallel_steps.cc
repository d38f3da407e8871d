// Run by mpi_test.sh alone and under `mpirun -np 2`: one epoch of the
// Tree-LSTM trainer (examples/treelstm) on generated ListOps, policy sync
// (every step compiled, so that runs are deterministic). Rank 0 prints the
// steps' losses as one JSON line and saves the checkpoint to argv[1].
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "dist/communicator.h"
#include "examples/treelstm/trainer.h"
#include "ops/blas.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: data_parallel_steps CHECKPOINT\n");
    return 2;
  }
  pejit::dist::Communicator& world = pejit::dist::Communicator::World();
  try {
    pejit::SetBlasThreads(1);
    pejit::treelstm::RunOptions o;
    o.listops_train = 400;  // 20 global minibatches of 20 trees
    o.listops_dev = 0;
    o.batch = 20;
    o.embed = 16;
    o.hidden = 16;
    pejit::EngineOptions engine;
    engine.policy = pejit::Policy::Sync();
    engine.workers = 1;
    engine.log_level = "off";
    pejit::treelstm::Trainer trainer(o, pejit::treelstm::LoadDataset(o), engine, &world);
    pejit::treelstm::EpochResult r = trainer.TrainEpoch();
    if (world.rank() == 0) {
      trainer.Save(argv[1]);
      std::printf("%s\n", nlohmann::json({{"losses", r.losses}, {"ranks", world.size()}}).dump().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    world.Abort(e.what());
  }
}
