// \file The processes of a data-parallel run, over MPI (Open MPI, Debian's).
//
// Each process (rank) trains on its share of every global minibatch with an
// engine of its own; the gradients are summed across ranks here, and every
// rank applies the same optimizer step to the same parameters. A process
// started without mpirun is a group of one and never touches MPI.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "interp/interpreter.h"
#include "ir/value.h"
#include "ops/tensor.h"

namespace pejit::dist {

using ValueAndGrad = Interpreter::ValueAndGrad;

class Communicator {
 public:
  // This process's group, made on first use: MPI's world when mpirun started
  // the process (MPI initialized for the main thread only, finalized at
  // exit; SIGTERM from mpirun, after another rank failed, prints why this
  // rank stops), else a group of one. Throws std::runtime_error when MPI
  // fails to start.
  static Communicator& World();

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool distributed() const { return size_ > 1; }

  // Sums the f32 tensors across ranks, in place: every rank ends with the
  // same sums, taken in rank order (a reduction MPI may not reorder), so a
  // run with the same number of ranks is reproducible. The tensors are
  // packed into buckets of at most bucket_bytes(): small tensors share one,
  // a large one spans several, and each bucket's reduction starts as soon as
  // it is packed. Throws std::invalid_argument for a tensor of another dtype;
  // every rank must pass tensors of the same shapes, in the same order.
  void AllReduceSum(std::vector<Tensor>& tensors);

  // Rank `root`'s tensors copied into every other rank's (same shapes).
  void Broadcast(std::vector<Tensor>& tensors, int root = 0);

  // Every rank's `mine`, by rank (a group of one: {mine}).
  std::vector<std::string> AllGather(const std::string& mine);

  // Ranks started with different options or data wait for each other for
  // ever (other step counts), crash (other sizes) or silently train other
  // runs (another rate or seed). Compares `settings` (name, value: what
  // shapes the run) with rank 0's, before any step; a difference ends the
  // run on every rank, rank 0 naming the setting and both values (the
  // others wait for its abort, which would cut their messages short).
  void RequireSameSettings(const std::vector<std::pair<std::string, std::string>>& settings);

  // Ends the whole run: prints "pejit: rank R of N: <why>" on stderr and
  // aborts every rank through MPI (a group of one exits with status 1).
  [[noreturn]] void Abort(const std::string& why);

  size_t bucket_bytes() const { return bucket_bytes_; }
  void set_bucket_bytes(size_t bytes);

  // How long a collective may wait for the other ranks (a rank stopped, a
  // node wedged): past it, every rank that arrived ends the run, naming the
  // ranks that did not (Abort). Default 300 s: a step's reductions take
  // milliseconds, and a rank compiling on a busy machine seconds.
  double deadline_seconds() const { return deadline_seconds_; }
  void set_deadline_seconds(double seconds);

  // What the reductions cost so far: calls, bytes summed, wall seconds.
  struct Stats {
    int64_t calls = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  const Stats& stats() const { return stats_; }

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

 private:
  Communicator();
  int rank_ = 0, size_ = 1;
  bool mpi_ = false;
  size_t bucket_bytes_ = size_t{4} << 20;
  double deadline_seconds_ = 300;
  int64_t collectives_ = 0;     // started so far: the same count on every rank
  std::vector<float> staging_;  // the packed buckets, kept between calls
  Stats stats_;
};

// A global minibatch's mean loss and gradients, from this rank's share of
// it: `share` of its `global` items, whose mean loss and gradients `local`
// holds (one gradient per differentiated argument, as Entry::value_and_grad
// returns them), or null for an empty share, which adds zeros shaped like
// `wrt_args` (the differentiated arguments). Weighted by share / global and
// summed across the ranks in one all-reduce, they are the means over the
// whole minibatch, the same on every rank.
ValueAndGrad SumShares(Communicator& group, const ValueAndGrad* local, int64_t share, int64_t global,
                       const std::vector<Value>& wrt_args);

// Which rank takes each item of a global minibatch, balancing the ranks'
// total cost (a tree's node count): the costliest items first, each to the
// rank with the least so far (lowest rank on ties). Deterministic: every
// rank computes the same assignment.
std::vector<int> ShardByCost(const std::vector<int64_t>& costs, int ranks);

}  // namespace pejit::dist
