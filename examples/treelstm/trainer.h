// \file The Tree-LSTM demo's training run as a library: data sets, fixed
// minibatches, steps through the tiered engine, accuracy and checkpoints.
// train.cc is its command line; tests drive it directly.
//
// A run is deterministic for its options and seed under policies
// `interpreter` and `sync` (which run every step in one tier); under `eager`
// and `hot:N` which steps run compiled depends on timing, and compiled code
// may differ from the interpreter in the last bits of a float.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "examples/treelstm/data.h"
#include "examples/treelstm/model.h"
#include "scheduler/engine.h"
#include "train/lookahead.h"
#include "train/optimizer.h"

namespace pejit::treelstm {

struct RunOptions {
  std::string data = "listops";      // "listops" or "sst"
  std::string train_file, dev_file;  // listops: generated when train_file is empty; sst: train_file needed
  bool strict = false;               // a malformed line stops the run instead of being skipped
  int listops_train = 6000, listops_dev = 500;  // generated expressions
  int sst_min_count = 1;             // rarer training words become <unk>
  int batch = 25, embed = 64, hidden = 64;
  OptimizerOptions optimizer;
  uint64_t seed = 1;
  bool reshuffle = false;            // new minibatches every epoch instead of fixed ones
  // Minibatches prefetched ahead of the step (Prefetch::kNext), so that their
  // code can be ready when the loop gets there, even in epoch 0; 0: none.
  int lookahead = 8;
  int train_sample = 500;            // training trees that TrainAccuracy measures
  // A finite loss this many times the run's first steps' (their median) is
  // a run diverging without NaN (1e30 and climbing): warned of once, or with
  // stop_on_blowup the run stops there as on NaN. 0: never.
  double blowup = 1e4;
  bool stop_on_blowup = false;
};

struct Dataset {
  std::string name;  // "listops (generated)", "listops", "sst"
  std::vector<Example> train, dev;
  int vocabulary = 0, classes = 0;
  std::vector<std::string> warnings;  // "file:line: message" of skipped lines
};
// Generates or reads the data `options` asks for. Throws std::runtime_error
// for missing or unreadable files, no training examples, or (strict) the
// first malformed line.
Dataset LoadDataset(const RunOptions& options);

struct EpochResult {
  int epoch = 0;
  double loss = 0;             // mean over the epoch's trees
  std::vector<double> losses;  // each step's (the mean over its minibatch)
  std::vector<double> step_ms; // each step's loss, gradients and update, wall time
  std::vector<double> step_cpu_ms;  // ... CPU time of the training thread: wall >> CPU is a stall
  int64_t trees = 0, steps = 0;
  int64_t compiled_steps = 0;            // ran native code only (EntryStats::calls_compiled)
  int64_t generic_interpreted_steps = 0;  // generic, some runs on baseline code (not LLVM's)
  double seconds = 0;
  std::chrono::steady_clock::time_point started;  // when its first step began
  // From `started` to the start of the first step that ran native code only
  // (issue 54: how soon training leaves the interpreter); -1: no such step.
  double first_compiled_ms = -1;
  std::vector<std::string> warnings;     // this epoch's (RunOptions::blowup)
};

class Trainer {
 public:
  // Builds the engine, initial parameters (from the seed) and minibatches.
  // With a `group` of several ranks (dist/), data-parallel: each rank takes
  // its share of every global minibatch (RunOptions::batch trees, shared by
  // node count), the gradients are summed across ranks, and every rank makes
  // the same step; rank 0's initial parameters are broadcast.
  Trainer(RunOptions options, Dataset data, EngineOptions engine = {}, dist::Communicator* group = nullptr);
  ~Trainer();

  int epoch() const { return epoch_; }  // epochs done
  const RunOptions& options() const { return options_; }
  const Dataset& data() const { return data_; }
  const Value& params() const { return params_; }
  Entry loss() const;  // in grad mode for the parameters (argument 2)
  const Engine& engine() const { return *engine_; }
  Engine& engine() { return *engine_; }
  size_t steps_per_epoch() const { return batches_.size(); }

  // Called after each step with the steps done and the epoch so far.
  using StepCallback = std::function<void(size_t done, const EpochResult& so_far)>;
  // Throws std::runtime_error naming the epoch and step when a loss or
  // gradient is NaN or infinite (the parameters are left as before that
  // step) or an update overflows a parameter: a diverged run stops rather
  // than trains on NaN, and epoch() stays at the last completed epoch.
  EpochResult TrainEpoch(const StepCallback& after_step = {});

  // Share of dev trees (none: 0), or of a fixed sample of training trees
  // (options().train_sample of them), whose class `infer` gets right.
  double DevAccuracy() const;
  double TrainAccuracy() const;
  bool has_dev() const { return !dev_batches_.empty(); }

  // Checkpoints hold the parameters, the optimizer's state, the epochs done,
  // and the options that shape the run (the data set and a fingerprint of
  // its training trees, sizes, seed, batch, every optimizer setting); Resume
  // throws std::runtime_error naming the file when
  // they differ from this run's, so that a resumed run carries on exactly
  // where the saved one stopped.
  void Save(const std::string& path) const;
  void Resume(const std::string& path);

 private:
  // The first steps' losses (RunOptions::blowup's baseline), and whether it warned.
  std::vector<double> first_losses_;
  bool blowup_warned_ = false;

  std::vector<Batch> MakeValues(const std::vector<std::vector<const Example*>>& batches) const;
  // This rank's share of each minibatch (all of it alone; empty when a
  // minibatch has fewer trees than ranks and none fell to this one).
  std::vector<Batch> MakeShares(const std::vector<std::vector<const Example*>>& batches) const;
  // The loss and gradients of a global minibatch of `global_trees` trees,
  // from this rank's share and the other ranks' (summed by the group).
  ValueAndGrad GlobalStep(const Batch& share, size_t global_trees);
  double Accuracy(const std::vector<Batch>& set) const;

  RunOptions options_;
  Dataset data_;
  std::string train_fingerprint_;  // of data_.train, for checkpoints (hashed once, not at every save)
  dist::Communicator* group_;      // null: this process trains alone
  std::unique_ptr<Engine> engine_;
  Snapshot module_;
  Value params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<std::vector<const Example*>> batches_;
  std::vector<Batch> dev_batches_, sample_batches_;
  int epoch_ = 0;
};

// The minibatches of a loop over `batches` kept `ahead` steps prefetched in
// `loss`'s mode (train/lookahead.h); past the end, the next epoch's (the
// same minibatches) when `wraps`. The trainer and bench/treelstm use it.
Lookahead BatchLookahead(Entry loss, const std::vector<Batch>& batches, const Value& params, int ahead, bool wraps);

// Minibatches of `size` examples of similar size (bucketed by node count),
// in a shuffled order; deterministic for `rng`'s state.
std::vector<std::vector<const Example*>> MakeBatches(const std::vector<Example>& examples, int size, Rng& rng);

}  // namespace pejit::treelstm
