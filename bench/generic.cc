// The structure-generic tier (generic/) on the Tree-LSTM (hidden 128, embed
// 64, 32-tree ListOps minibatches): the inspector's time per minibatch, a
// training step on minibatches it has never seen, segments native (compiled
// once, on the first minibatches) beside the interpreter, and the generic
// step beside each minibatch's own specialization, timed alternately.
#include <benchmark/benchmark.h>

#include <tbb/task_arena.h>

#include <chrono>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "generic/executor.h"
#include "generic/program.h"
#include "interp/interpreter.h"
#include "ir/abi.h"
#include "jit/compiler.h"
#include "jit/pipeline.h"
#include "ops/blas.h"
#include "pe/partial_eval.h"
#include "support/team.h"

namespace pejit {
namespace {

struct Workload {
  Module module;
  Snapshot snapshot;
  std::vector<std::vector<Value>> calls;  // distinct minibatches
  int nodes = 0;

  explicit Workload(int trees, int minibatches) {
    SetBlasThreads(1);
    module.AddSource(treelstm::ModelSource(), "treelstm.pj");
    snapshot = module.snapshot();
    Rng rng(1);
    Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 64, 128, listops::kClasses});
    for (int m = 0; m < minibatches; ++m) {
      treelstm::Batch b = treelstm::GeneratedListOpsBatch(100 + m, trees, *snapshot);
      nodes += b.nodes;
      calls.push_back({b.trees, b.labels, params});
    }
  }
};

void BM_GenericInspect(benchmark::State& state) {
  Workload w(32, 8);
  generic::GenericProgram program(w.snapshot, "loss");
  for (const auto& args : w.calls) program.Inspect(args);  // cells built
  size_t i = 0;
  double runs = 0, levels = 0, rows = 0, padded = 0, instances = 0;
  for (auto _ : state) {
    generic::Inspection s = program.Inspect(w.calls[i++ % w.calls.size()]);
    runs += s.runs.size();
    levels += s.levels;
    instances += s.instances;
    for (const generic::Run& r : s.runs) {
      rows += r.members.size();
      padded += r.rows;
    }
  }
  double n = static_cast<double>(state.iterations());
  state.counters["cells"] = program.cells();
  state.counters["nodes"] = w.nodes / static_cast<double>(w.calls.size());
  state.counters["cell_instances"] = instances / n;
  state.counters["runs"] = runs / n;
  state.counters["levels"] = levels / n;
  state.counters["rows_per_run"] = rows / runs;
  state.counters["padding"] = padded / rows - 1;
}
BENCHMARK(BM_GenericInspect)->Unit(benchmark::kMicrosecond);

// The inspector as a training loop meets it: the minibatch's values were
// made long before and a step's tensors have pushed them out of the cache
// since. Between iterations (untimed) 64 MiB are written; every minibatch
// is walked once (its inspection was not kept ahead).
void BM_GenericInspectCold(benchmark::State& state) {
  Workload w(32, 64);
  generic::GenericProgram program(w.snapshot, "loss");
  for (const auto& args : w.calls) program.Inspect(args);  // cells built
  std::vector<int64_t> evict(size_t{64} << 17);
  size_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (size_t k = 0; k < evict.size(); k += 8) evict[k] += static_cast<int64_t>(k);
    benchmark::ClobberMemory();
    state.ResumeTiming();
    benchmark::DoNotOptimize(program.Inspect(w.calls[i++ % w.calls.size()]));
  }
  state.counters["nodes"] = w.nodes / static_cast<double>(w.calls.size());
}
BENCHMARK(BM_GenericInspectCold)->Unit(benchmark::kMicrosecond);

// Compiles the segment variants the first `warm` minibatches run in grad
// mode (their code outlives the session: executables hold it).
void CompileSegments(generic::GenericProgram& program, const Workload& w, int warm) {
  auto jit = JitSession::Create();
  generic::ExecuteOptions compile;
  compile.grad = true;
  compile.compile_now = jit.get();
  for (int i = 0; i < warm; ++i) generic::Execute(program.Inspect(w.calls[i]), compile);
}

// One minibatch after the first `warm` per iteration, round robin: none of
// them compiled anything; counters trees/s and the share of runs interpreted.
void TimeUnseen(benchmark::State& state, generic::GenericProgram& program, const Workload& w, int warm,
                const generic::ExecuteOptions& options) {
  size_t i = warm;
  int64_t interpreted = 0, runs = 0;
  for (auto _ : state) {
    generic::Execution e = generic::Execute(program.Inspect(w.calls[i]), options);
    interpreted += e.baseline_runs;
    runs += e.baseline_runs + e.native_runs;
    if (++i == w.calls.size()) i = warm;
  }
  state.counters["trees_per_s"] = benchmark::Counter(32.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["interpreted_share"] = runs ? static_cast<double>(interpreted) / runs : 0;
}

// Training steps on minibatches never seen before: the first `warm` compile
// the segment variants; the timed ones run only native code already there.
void BM_GenericTrainStep(benchmark::State& state) {
  const int warm = 16;
  Workload w(32, warm + 64);
  generic::GenericProgram program(w.snapshot, "loss");
  CompileSegments(program, w, warm);
  generic::ExecuteOptions run;
  run.grad = true;
  TimeUnseen(state, program, w, warm, run);
  state.counters["segment_codes"] = program.segment_codes();
}
BENCHMARK(BM_GenericTrainStep)->Unit(benchmark::kMillisecond);

// Runs each of `calls` both ways, alternately in one loop, so that the
// machine's speed, which on these VMs changes from run to run, is the same
// for both: its own specialization (compiled before timing), then the
// generic tier (`program`), each call on a team of `threads` (the caller and
// helpers from an arena, as the engine's calls borrow its idle workers).
// Counters per call (ms): the specialization's; the generic tier's
// inspection (the walk, which training runs ahead with a lookahead) and
// execution; `generic_over_specialized` is the speed ratio with the walk,
// `..._walk_ahead` without it.
void Alternate(benchmark::State& state, generic::GenericProgram& program, const std::vector<std::vector<Value>>& calls,
               const std::vector<ExecutablePtr>& specialized, const generic::ExecuteOptions& options, int threads = 1) {
  tbb::task_arena arena(std::max(1, threads - 1));
  ArenaHelpers helpers(arena, threads - 1);
  std::vector<std::vector<Tensor>> leaves;
  for (const auto& args : calls) leaves.push_back(Flatten(args));
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  double spec = 0, inspect = 0, execute = 0;
  int64_t native = 0, runs = 0;
  size_t i = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    {
      Team team(&helpers, threads);
      ScopedTeam scoped(&team);
      benchmark::DoNotOptimize(specialized[i]->Run(leaves[i]));
    }
    const auto t1 = Clock::now();
    generic::Inspection inspection = program.Inspect(calls[i]);
    const auto t2 = Clock::now();
    generic::Execution e;
    {
      Team team(&helpers, threads);
      ScopedTeam scoped(&team);
      e = generic::Execute(inspection, options);
    }
    const auto t3 = Clock::now();
    spec += ms(t0, t1);
    inspect += ms(t1, t2);
    execute += ms(t2, t3);
    native += e.native_runs;
    runs += e.native_runs + e.baseline_runs;
    i = (i + 1) % calls.size();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["specialized_ms"] = spec / n;
  state.counters["generic_inspect_ms"] = inspect / n;
  state.counters["generic_execute_ms"] = execute / n;
  state.counters["generic_over_specialized"] = spec / (inspect + execute);
  state.counters["generic_over_specialized_walk_ahead"] = spec / execute;
  state.counters["generic_native_run_share"] = runs ? static_cast<double>(native) / runs : 0;
}

// Issue 51's point 4 (issue 54's point 1): a training step of the generic
// tier against the same minibatch's own specialization (PE, batching,
// autodiff, LLVM: what `--no-generic` runs), both native before timing, on
// one thread and on two (the specialization's lanes and divided steps, the
// generic tier's divided steps and weight products).
void BM_GenericOverSpecialized(benchmark::State& state) {
  Workload w(32, 8);
  generic::GenericOptions lanes;
  lanes.lanes = static_cast<int>(state.range(1));
  lanes.lanes_always = true;
  generic::GenericProgram program(w.snapshot, "loss", lanes);
  CompileSegments(program, w, static_cast<int>(w.calls.size()));
  auto jit = JitSession::Create();
  std::vector<ExecutablePtr> specialized;
  for (const auto& args : w.calls) {
    PipelineOptions options;
    options.wrt_leaves = FloatWrtLeaves(args, std::vector<int>{2});  // the parameters
    specialized.push_back(CompileResidual(*jit, PartialEvaluate(*w.snapshot, "loss", args).main, options));
  }
  generic::ExecuteOptions run;
  run.grad = true;
  Alternate(state, program, w.calls, specialized, run, static_cast<int>(state.range(0)));
}
BENCHMARK(BM_GenericOverSpecialized)
    ->ArgNames({"threads", "lanes"})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({2, 1})
    ->Args({2, 2})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);

// Inference on minibatches never seen, after training compiled its segments
// (grad mode): what a dev set's first pass runs, the grad-mode forwards
// standing in for value-mode code not compiled yet.
void BM_GenericInferStepAfterTraining(benchmark::State& state) {
  const int warm = 16;
  Workload w(32, warm + 64);
  generic::GenericProgram program(w.snapshot, "loss");
  CompileSegments(program, w, warm);
  TimeUnseen(state, program, w, warm, generic::ExecuteOptions{});
}
BENCHMARK(BM_GenericInferStepAfterTraining)->Unit(benchmark::kMillisecond);

// A dev set's first pass through a new entry (`infer`) after training
// compiled `loss`: the entry's cells are built on its first minibatches,
// its segments found in the shared table. Each iteration is a new entry's
// pass over 32 minibatches never seen.
void BM_GenericFirstInferPass(benchmark::State& state) {
  const int warm = 16, pass = 32;
  Workload w(32, warm + pass);
  generic::GenericProgram loss(w.snapshot, "loss");
  CompileSegments(loss, w, warm);
  for (auto _ : state) {
    generic::GenericProgram infer(w.snapshot, "infer", {}, loss.segments());
    for (int i = warm; i < warm + pass; ++i) {
      std::vector<Value> args = {w.calls[i][0], w.calls[i][2]};
      benchmark::DoNotOptimize(generic::Execute(infer.Inspect(args), generic::ExecuteOptions{}));
    }
  }
  state.counters["trees_per_s"] = benchmark::Counter(32.0 * pass, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_GenericFirstInferPass)->Unit(benchmark::kMillisecond);

// Issue 54's point 5: inference through the generic tier after training
// compiled `loss` in grad mode (what a dev set's first pass runs: `infer`'s
// cells over the shared segments, the grad-mode variants' forwards standing
// in for value-mode code not compiled yet) against each minibatch's own
// value-mode specialization of `infer`, alternately as above. Arg 1: the
// value-mode variants compiled first (a later pass's).
void BM_GenericInferOverSpecialized(benchmark::State& state) {
  Workload w(32, 8);
  generic::GenericProgram loss(w.snapshot, "loss");
  CompileSegments(loss, w, static_cast<int>(w.calls.size()));
  generic::GenericProgram infer(w.snapshot, "infer", {}, loss.segments());
  auto jit = JitSession::Create();
  std::vector<std::vector<Value>> calls;
  std::vector<ExecutablePtr> specialized;
  for (const auto& args : w.calls) {
    calls.push_back({args[0], args[2]});  // the trees and the parameters
    specialized.push_back(CompileResidual(*jit, PartialEvaluate(*w.snapshot, "infer", calls.back()).main, {}));
  }
  if (state.range(0)) {
    generic::ExecuteOptions compile;
    compile.compile_now = jit.get();
    for (const auto& args : calls) generic::Execute(infer.Inspect(args), compile);
  }
  Alternate(state, infer, calls, specialized, generic::ExecuteOptions{});
}
BENCHMARK(BM_GenericInferOverSpecialized)->ArgName("value_code")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(3.0);

void BM_InterpreterTrainStep(benchmark::State& state) {
  Workload w(32, 8);
  Interpreter interp;
  size_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(interp.CallWithGrad(*w.snapshot, "loss", w.calls[i++ % w.calls.size()], {2}));
  state.counters["trees_per_s"] = benchmark::Counter(32.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_InterpreterTrainStep)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pejit
