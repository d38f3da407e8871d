// Partial evaluation of the Tree-LSTM (examples/treelstm) against minibatches
// of ListOps trees: time per minibatch and residual size, for 25, 50 and 100
// trees (PE is meant to be linear in the number of tree nodes), and what the
// cache of helper specializations (pe/pe_cache.h) costs and saves.
#include <benchmark/benchmark.h>

#include <memory>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "pe/partial_eval.h"
#include "pe/signature.h"
#include "support/cpu_clock.h"

namespace pejit {
namespace {

// The model and one minibatch of `trees` ListOps trees.
struct Workload {
  explicit Workload(int trees) {
    Module module;
    module.AddSource(treelstm::ModelSource(), "treelstm.pj");
    snapshot = module.snapshot();
    treelstm::Batch b = treelstm::GeneratedListOpsBatch(1, trees, *snapshot);
    Rng rng(1);
    Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 64, 128, listops::kClasses});
    loss_args = {b.trees, b.labels, params};
    infer_args = {b.trees, params};
    nodes = b.nodes;
  }
  Snapshot snapshot;
  std::vector<Value> loss_args, infer_args;
  int nodes = 0;
};

enum CacheUse {
  kNoCache = 0,    // PartialEvaluate alone
  kRecording = 1,  // a cache that has nothing yet: the helper is recorded
  kReusing = 2,    // `infer` after `loss` filled the cache: @logits replayed
};

// Times `entry` as `use` says. The time splits into evaluating and freeing
// the residual (its nodes are freed one by one, by whoever drops the last
// reference), both in this thread's CPU time, which other processes on a
// busy machine disturb less than wall time.
void Run(benchmark::State& state, const std::string& entry, CacheUse use) {
  Workload w(static_cast<int>(state.range(0)));
  const std::vector<Value>& args = entry == "loss" ? w.loss_args : w.infer_args;
  PeCache warm;
  if (use == kReusing) PartialEvaluate(*w.snapshot, "loss", w.loss_args, {}, {}, &warm);
  PeStats stats;
  double pe_seconds = 0, free_seconds = 0;
  for (auto _ : state) {
    std::unique_ptr<PeCache> empty = use == kRecording ? std::make_unique<PeCache>() : nullptr;
    PeCache* cache = use == kRecording ? empty.get() : use == kReusing ? &warm : nullptr;
    double start = ThreadCpuSeconds();
    {
      Residual r = PartialEvaluate(*w.snapshot, entry, args, {}, {}, cache);
      stats = r.stats;
      benchmark::DoNotOptimize(r.main);
      double end = ThreadCpuSeconds();
      pe_seconds += end - start;
      start = end;
    }
    free_seconds += ThreadCpuSeconds() - start;
  }
  if (use == kReusing && stats.reused_specializations != 1) state.SkipWithError("the cache was not used");
  double iterations = static_cast<double>(state.iterations());
  state.counters["pe_ms"] = 1e3 * pe_seconds / iterations;
  state.counters["free_ms"] = 1e3 * free_seconds / iterations;
  state.counters["pe_us_per_node"] = 1e6 * pe_seconds / iterations / w.nodes;
  state.counters["trees"] = static_cast<double>(state.range(0));
  state.counters["nodes"] = w.nodes;
  state.counters["residual_ops"] = static_cast<double>(stats.residual_ops);
  state.counters["params"] = static_cast<double>(stats.params);
  state.counters["unfoldings"] = static_cast<double>(stats.unfoldings);
  // Seconds per tree node, evaluating and freeing (the invariant a linear PE keeps).
  state.counters["s_per_node"] = benchmark::Counter(static_cast<double>(w.nodes),
                                                    benchmark::Counter::kIsIterationInvariantRate |
                                                        benchmark::Counter::kInvert);
}

void BM_PartialEvaluateLoss(benchmark::State& state) { Run(state, "loss", kNoCache); }
BENCHMARK(BM_PartialEvaluateLoss)->Arg(25)->Arg(50)->Arg(100)->Unit(benchmark::kMillisecond);

// What keeping @logits for later costs the run that records it.
void BM_PartialEvaluateLossRecording(benchmark::State& state) { Run(state, "loss", kRecording); }
BENCHMARK(BM_PartialEvaluateLossRecording)->Arg(25)->Unit(benchmark::kMillisecond);

// `infer` on the minibatch `loss` was specialized for: from scratch, and
// replaying the @logits `loss` kept.
void BM_PartialEvaluateInfer(benchmark::State& state) { Run(state, "infer", kNoCache); }
BENCHMARK(BM_PartialEvaluateInfer)->Arg(25)->Unit(benchmark::kMillisecond);
void BM_PartialEvaluateInferReusing(benchmark::State& state) { Run(state, "infer", kReusing); }
BENCHMARK(BM_PartialEvaluateInferReusing)->Arg(25)->Unit(benchmark::kMillisecond);

void BM_SignatureAndFlatten(benchmark::State& state) {
  Workload w(25);
  for (auto _ : state) {
    benchmark::DoNotOptimize(ComputeSignature(w.loss_args));
    benchmark::DoNotOptimize(Flatten(w.loss_args));
  }
  state.counters["nodes"] = w.nodes;
}
BENCHMARK(BM_SignatureAndFlatten)->Unit(benchmark::kMicrosecond);

// A minibatch's first sight, as a training loop that builds its minibatches
// each epoch has it: the signature and leaves of minibatches walked one after
// another, 64 of them (several MB), so that each is out of the core's caches
// when its turn comes. The cost is memory latency: `nodes` per minibatch.
void BM_SignatureOfAMinibatchNotInCache(benchmark::State& state) {
  Module module;
  module.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot snapshot = module.snapshot();
  Rng rng(1);
  const Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 64, 128, listops::kClasses});
  std::vector<std::vector<Value>> batches;
  int64_t nodes = 0;
  for (uint64_t seed = 1; seed <= 64; ++seed) {
    treelstm::Batch b = treelstm::GeneratedListOpsBatch(seed, static_cast<int>(state.range(0)), *snapshot);
    batches.push_back({b.trees, b.labels, params});
    nodes += b.nodes;
  }
  size_t next = 0;
  std::vector<size_t> first;
  for (auto _ : state) {
    SignatureCache cache;  // as the engine's on a value it has not seen
    const std::vector<Value>& args = batches[next++ % batches.size()];
    benchmark::DoNotOptimize(cache.Compute(args));
    benchmark::DoNotOptimize(cache.Flatten(args, {}, &first));
  }
  state.counters["nodes"] = static_cast<double>(nodes) / static_cast<double>(batches.size());
}
BENCHMARK(BM_SignatureOfAMinibatchNotInCache)->Arg(25)->Arg(100)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pejit
