// Partial evaluation of the Tree-LSTM (examples/treelstm) against minibatches
// of ListOps trees: time per minibatch and residual size, for 25, 50 and 100
// trees (PE is meant to be linear in the number of tree nodes).
#include <benchmark/benchmark.h>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

void BM_PartialEvaluateLoss(benchmark::State& state) {
  const int trees = static_cast<int>(state.range(0));
  Module module;
  module.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot s = module.snapshot();
  listops::Splits data = listops::GenerateSplits(1, trees, 0, 0);
  std::vector<const listops::Example*> batch;
  for (const auto& ex : data.train) batch.push_back(&ex);
  treelstm::Batch b = treelstm::MakeBatch(batch, *s);
  Rng rng(1);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 64, 128, listops::kClasses});
  std::vector<Value> args = {b.trees, b.labels, params};

  PeStats stats;
  for (auto _ : state) {
    Residual r = PartialEvaluate(*s, "loss", args);
    stats = r.stats;
    benchmark::DoNotOptimize(r.main);
  }
  state.counters["trees"] = trees;
  state.counters["nodes"] = b.nodes;
  state.counters["residual_ops"] = static_cast<double>(stats.residual_ops);
  state.counters["params"] = static_cast<double>(stats.params);
  state.counters["unfoldings"] = static_cast<double>(stats.unfoldings);
  // Seconds of PE per tree node (the invariant a linear PE keeps).
  state.counters["s_per_node"] = benchmark::Counter(static_cast<double>(b.nodes),
                                                    benchmark::Counter::kIsIterationInvariantRate |
                                                        benchmark::Counter::kInvert);
}
BENCHMARK(BM_PartialEvaluateLoss)->Arg(25)->Arg(50)->Arg(100)->Unit(benchmark::kMillisecond);

void BM_SignatureAndFlatten(benchmark::State& state) {
  Module module;
  module.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot s = module.snapshot();
  listops::Splits data = listops::GenerateSplits(1, 25, 0, 0);
  std::vector<const listops::Example*> batch;
  for (const auto& ex : data.train) batch.push_back(&ex);
  treelstm::Batch b = treelstm::MakeBatch(batch, *s);
  Rng rng(1);
  std::vector<Value> args = {b.trees, b.labels, treelstm::InitParams(rng, {})};
  for (auto _ : state) {
    benchmark::DoNotOptimize(ComputeSignature(args));
    benchmark::DoNotOptimize(Flatten(args));
  }
  state.counters["nodes"] = b.nodes;
}
BENCHMARK(BM_SignatureAndFlatten)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pejit
