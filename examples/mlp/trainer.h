// \file The MLP demo's training run as a library: shuffled minibatches of a
// split, SGD steps through the `loss` entry, accuracy through `infer`, and
// the share of calls each tier served. train.cc is its command line; tests
// drive it directly on synthetic data.
//
// An epoch's minibatches are consecutive slices of a shuffled order, so the
// last one is smaller when the batch size does not divide the split: its
// signature is specialized like any other (prefetched at the first step),
// and runs in the interpreter until its code is ready.
//
// A run is deterministic for its options and seed under policies
// `interpreter` and `sync`; under `eager` and `hot:N` which calls run
// compiled depends on timing, and compiled code may differ from the
// interpreter in the last bits of a float.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "examples/mlp/fashion_mnist.h"
#include "examples/mlp/model.h"
#include "scheduler/engine.h"
#include "train/optimizer.h"

namespace pejit::mlp {

struct RunOptions {
  int batch = 64;  // images per minibatch, for training and inference alike
  OptimizerOptions optimizer;
  uint64_t seed = 1;  // initial parameters and the order of each epoch
};

// How many calls of one entry each tier served over some span.
struct TierCounts {
  int64_t interpreter = 0, residual_interpreter = 0, native = 0;

  static TierCounts Between(const EntryStats& before, const EntryStats& after);
  int64_t total() const { return interpreter + residual_interpreter + native; }
  double compiled_share() const;  // native code only (EntryStats::calls_compiled); 0 when no calls
  TierCounts& operator+=(const TierCounts& o);
};

struct EpochResult {
  int epoch = 0;
  double loss = 0;             // mean over the epoch's images
  std::vector<double> losses;  // each step's (the mean over its minibatch)
  int64_t images = 0, steps = 0;
  double seconds = 0;          // batches, steps and updates: the whole loop
  TierCounts tiers;            // of `loss`
};

struct EvalResult {
  double accuracy = 0;  // share of images whose class `infer` gets right
  int64_t images = 0;
  double seconds = 0;
  TierCounts tiers;  // of `infer`
};

class Trainer {
 public:
  // Builds the engine (its module holds mlp.pj), the initial parameters and
  // the test minibatches. Throws std::invalid_argument for a batch size
  // below 1 or an empty training split.
  // With a `group` of several ranks (dist/), data-parallel: each rank takes
  // a contiguous share of every minibatch's images, the gradients are summed
  // across ranks, every rank makes the same step; rank 0's parameters are
  // broadcast first.
  Trainer(RunOptions options, Split train, Split test, EngineOptions engine = {},
          dist::Communicator* group = nullptr);
  ~Trainer();

  const RunOptions& options() const { return options_; }
  const Value& params() const { return params_; }
  Entry loss() const;  // in grad mode for the parameters (argument 2)
  Entry infer() const;
  const Engine& engine() const { return *engine_; }
  Engine& engine() { return *engine_; }
  size_t steps_per_epoch() const;

  // Called after each step with the steps done and the epoch so far.
  using StepCallback = std::function<void(size_t done, const EpochResult& so_far)>;
  // One pass over the training split in a new shuffled order.
  EpochResult TrainEpoch(const StepCallback& after_step = {});
  // `infer` over the whole test split (none: accuracy 0).
  EvalResult Evaluate() const;

 private:
  RunOptions options_;
  Split train_;
  dist::Communicator* group_ = nullptr;  // null: this process trains alone
  std::unique_ptr<Engine> engine_;
  Value params_;
  std::unique_ptr<Optimizer> optimizer_;
  Rng rng_;
  std::vector<Batch> test_batches_;
  int epoch_ = 0;
};

}  // namespace pejit::mlp
