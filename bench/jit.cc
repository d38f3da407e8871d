// The compiled tier against the interpreter on the Tree-LSTM (hidden 128,
// embed 64, 25 ListOps trees): a training step (loss and gradients) each way,
// compiled without batching, batched before autodiff (what the engine does)
// and batched after it, the batched one on 1 and 2 threads (a team per
// call, as EngineOptions::step_threads); the team alone on independent
// products (BM_TeamStage), and what one cache line takes to go from one core
// to the other and back (BM_CoreToCore: on a VM, its vCPUs' placement, which
// decides how much a divided step pays for data the other thread wrote);
// the compile time of one specialization split by
// stage, and of a small program in a warm session (a segment variant's); a fused elementwise kernel's throughput beside memcpy of the
// same bytes; and a loop the data ends, its regions native, against the
// interpreter.
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <span>
#include <thread>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "jit/control_flow.h"
#include "jit/pipeline.h"
#include "ops/blas.h"
#include "ops/packed_gemm.h"
#include "pe/partial_eval.h"
#include "jit/native_executable.h"
#include "jit/schedule.h"
#include "support/team.h"

namespace pejit {
namespace {

struct Workload {
  Module module;
  Snapshot snapshot;
  std::vector<Value> args;
  std::vector<int> wrt_leaves;  // the parameters' leaves among Flatten(args)
  int nodes = 0;

  explicit Workload(int trees, uint64_t seed = 1) {
    SetBlasThreads(1);
    module.AddSource(treelstm::ModelSource(), "treelstm.pj");
    snapshot = module.snapshot();
    treelstm::Batch b = treelstm::GeneratedListOpsBatch(seed, trees, *snapshot);
    nodes = b.nodes;
    Rng rng(1);
    args = {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, 64, 128, listops::kClasses})};
    wrt_leaves = FloatWrtLeaves(args, std::vector<int>{2});  // the parameters
  }
};

void BM_TrainStepInterpreter(benchmark::State& state) {
  Workload w(static_cast<int>(state.range(0)));
  Interpreter interp;
  for (auto _ : state) benchmark::DoNotOptimize(interp.CallWithGrad(*w.snapshot, "loss", w.args, {2}));
  state.counters["trees_per_s"] = benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStepInterpreter)->Arg(25)->Unit(benchmark::kMillisecond);

enum BatchMode { kUnbatched = 0, kBatchBeforeAutodiff = 1, kBatchAfterAutodiff = 2 };

// PE, then the pipeline (jit/pipeline.h) with batching as `mode` says: the
// program a training step compiles. Batching after autodiff is the order the
// pipeline does not take, measured beside it.
Func TrainingProgram(const Workload& w, int64_t mode, double* pe_ms, double* batch_ms, double* autodiff_ms,
                     BatchStats* stats) {
  auto t0 = std::chrono::steady_clock::now();
  Func residual = PartialEvaluate(*w.snapshot, "loss", w.args).main;
  *pe_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  PipelineOptions options;
  options.batch = mode == kBatchBeforeAutodiff;
  options.wrt_leaves = w.wrt_leaves;
  PipelineReport report;
  Func f = PrepareResidual(residual, options, &report);
  *batch_ms += report.batch_ms;
  *autodiff_ms += report.autodiff_ms;
  if (report.batched) *stats = report.batch;
  if (mode == kBatchAfterAutodiff) {
    auto t1 = std::chrono::steady_clock::now();
    f = Batch(f, stats);
    *batch_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
  }
  return f;
}

// Runs executables as the engine's calls do (scheduler/engine.h,
// step_threads): a team per call, whose helpers come from an arena of
// `threads` − 1 workers while the call has stages worth dividing.
class CallThreads {
 public:
  explicit CallThreads(int threads)
      : threads_(threads), arena_(std::max(1, threads - 1)), helpers_(arena_, threads - 1) {}
  std::vector<Tensor> Run(const Executable& exe, std::span<const Tensor> leaves) {
    Team team(&helpers_, threads_);
    ScopedTeam scoped(&team);
    std::vector<Tensor> out = exe.Run(leaves);
    ++calls_;
    helped_ += team.threads_used() > 1;
    return out;
  }
  // The share of calls a helper took part in.
  double helped() const { return calls_ ? static_cast<double>(helped_) / static_cast<double>(calls_) : 0; }

 private:
  int threads_;
  int64_t calls_ = 0, helped_ = 0;
  tbb::task_arena arena_;
  ArenaHelpers helpers_;
};

void BM_TrainStepCompiled(benchmark::State& state) {
  Workload w(static_cast<int>(state.range(0)));
  CallThreads threads(static_cast<int>(state.range(2)));
  auto session = JitSession::Create();
  double ignored = 0;
  BatchStats stats;
  CompileReport report;
  ExecutablePtr exe =
      session->Compile(TrainingProgram(w, state.range(1), &ignored, &ignored, &ignored, &stats), {}, &report);
  std::vector<Tensor> leaves = Flatten(w.args);
  for (auto _ : state) benchmark::DoNotOptimize(threads.Run(*exe, leaves));
  state.counters["trees_per_s"] = benchmark::Counter(static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["batched_groups"] = static_cast<double>(stats.groups);
  state.counters["helped_calls"] = threads.helped();
  // Bytes the step moves without computing: gathers, concatenations, slices (forward and backward).
  state.counters["copied_KiB"] = static_cast<double>(report.copied_bytes) / 1024;
  state.counters["copy_steps"] = report.copy_steps;
  // The parallel schedule: lanes (jit/lanes.h), and the share of the
  // step's estimated cost in steps of a lane or split into parts (what
  // threads other than the caller may take).
  state.counters["lanes"] = stats.lanes;
  if (auto* native = dynamic_cast<const NativeExecutable*>(exe.get())) {
    const Plan& plan = native->plan();
    double cost = 0, divided = 0;
    for (const PlanStep& step : plan.steps) {
      const double c = StepCostNs(plan, step);
      cost += c;
      if (step.lane >= 0 || step.parts > 1) divided += c;
    }
    state.counters["divided_cost_share"] = cost > 0 ? divided / cost : 0;
  }
  // Where the step's time goes, from a profiling build of the same program.
  CompileOptions profiling;
  profiling.profile = true;
  ExecutablePtr profiled = session->Compile(TrainingProgram(w, state.range(1), &ignored, &ignored, &ignored, &stats),
                                            profiling);
  for (int i = 0; i < 20; ++i) threads.Run(*profiled, leaves);
  double total = 0, gemm = 0, flops = 0, fused = 0, copy = 0;
  for (const ProfileLine& line : profiled->profile()) {
    total += line.seconds;
    if (line.flops > 0) gemm += line.seconds, flops += line.flops * static_cast<double>(profiled->profiled_runs());
    if (line.step == "fused") fused += line.seconds;
    if (line.step == "copy") copy += line.seconds;
  }
  // Per step, summed over the threads that ran it.
  const double runs = static_cast<double>(profiled->profiled_runs());
  state.counters["busy_ms"] = total / runs * 1e3;
  state.counters["gemm_ms"] = gemm / runs * 1e3;
  state.counters["fused_share"] = fused / total;
  state.counters["copy_share"] = copy / total;
  state.counters["gemm_share"] = gemm / total;
  state.counters["gemm_GFLOPs"] = gemm > 0 ? flops / gemm * 1e-9 : 0;
}
// `threads`: the caller and helpers, as EngineOptions::step_threads; with
// more than one, gemm_share and the shares are of the threads' summed time.
BENCHMARK(BM_TrainStepCompiled)
    ->ArgNames({"trees", "batch", "threads"})
    ->Args({25, kUnbatched, 1})
    ->Args({25, kBatchBeforeAutodiff, 1})
    ->Args({25, kBatchBeforeAutodiff, 2})
    ->Args({25, kBatchAfterAutodiff, 1})
    ->Args({100, kBatchBeforeAutodiff, 1})
    ->Args({100, kBatchBeforeAutodiff, 2})
    ->Unit(benchmark::kMillisecond);

// The team alone (support/team.h): a stage of 8 independent products
// (rows × 128 by 128 × 384, each its own operands), run by 1 or 2 threads,
// stage after stage as a plan runs them.
void BM_TeamStage(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  constexpr int kTasks = 8;
  constexpr int64_t k = 128, n = 384;
  std::vector<std::vector<float>> a(kTasks, std::vector<float>(rows * k, 0.5f)), c(kTasks, std::vector<float>(rows * n));
  std::vector<float> packed(NumElements(PackedShape(k, n)), 0.25f);
  tbb::task_arena arena(std::max(1, threads - 1));
  ArenaHelpers helpers(arena, threads - 1);
  std::function<void(int64_t)> task = [&](int64_t i) {
    GemmPacked(rows, n, k, a[i].data(), k, packed.data(), c[i].data(), n, false);
  };
  for (auto _ : state) {
    Team team(&helpers, threads);
    for (int stage = 0; stage < 100; ++stage) team.Run(kTasks, task);
  }
  state.counters["GFLOPs"] = benchmark::Counter(2.0 * rows * n * k * kTasks * 100, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TeamStage)->ArgNames({"rows", "threads"})->ArgsProduct({{8, 64}, {1, 2}})->Unit(benchmark::kMicrosecond);

// One cache line bounced between two threads (on a 2-core machine, the two
// cores): the round trip in ns. A divided step reads rows the other thread
// wrote; this is what each line of them costs.
void BM_CoreToCore(benchmark::State& state) {
  constexpr int64_t kRounds = 100000;
  double ns = 0;
  for (auto _ : state) {
    std::atomic<int64_t> ball{0};
    std::thread other([&] {
      for (int64_t i = 0; i < kRounds; ++i) {
        while (ball.load(std::memory_order_acquire) != 2 * i + 1) {
        }
        ball.store(2 * i + 2, std::memory_order_release);
      }
    });
    auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kRounds; ++i) {
      ball.store(2 * i + 1, std::memory_order_release);
      while (ball.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
    ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / kRounds;
    other.join();
  }
  state.counters["round_trip_ns"] = ns;
}
BENCHMARK(BM_CoreToCore)->Iterations(3)->Unit(benchmark::kMillisecond);

// One specialization of a training step, from arguments to machine code:
// cold (a fresh session) or warm (the specialization of another minibatch
// still live, as in an engine's code cache, so its kernels can be reused).
void BM_CompileSpecialization(benchmark::State& state) {
  Workload w(static_cast<int>(state.range(0)));
  auto session = JitSession::Create();
  double pe = 0, batch = 0, autodiff = 0, lower = 0, codegen = 0, optimize = 0, machine = 0;
  CompileReport report;
  BatchStats stats;
  ExecutablePtr earlier;
  if (state.range(2)) {
    Workload other(static_cast<int>(state.range(0)), 2);
    double ignored = 0;
    earlier = session->Compile(TrainingProgram(other, state.range(1), &ignored, &ignored, &ignored, &stats));
  }
  for (auto _ : state) {
    Func program = TrainingProgram(w, state.range(1), &pe, &batch, &autodiff, &stats);
    benchmark::DoNotOptimize(session->Compile(program, {}, &report));
    lower += report.lower_ms;
    codegen += report.codegen_ms;
    optimize += report.optimize_ms;
    machine += report.machine_code_ms;
  }
  double n = static_cast<double>(state.iterations());
  state.counters["pe_ms"] = pe / n;
  state.counters["batch_ms"] = batch / n;
  state.counters["autodiff_ms"] = autodiff / n;
  state.counters["passes_ms"] = lower / n;
  state.counters["llvm_ir_ms"] = codegen / n;
  state.counters["llvm_opt_ms"] = optimize / n;
  state.counters["machine_code_ms"] = machine / n;
  state.counters["kernels"] = report.kernels;
  state.counters["fused_kernels"] = report.fused_kernels;
  state.counters["distinct_kernels"] = report.distinct_fused_kernels;
  state.counters["reused_kernels"] = report.reused_fused_kernels;
  state.counters["arena_KiB"] = static_cast<double>(report.arena_bytes) / 1024;
  state.counters["buffers_KiB"] = static_cast<double>(report.buffer_bytes) / 1024;
  state.counters["code_KiB"] = static_cast<double>(report.code_bytes) / 1024;
}
BENCHMARK(BM_CompileSpecialization)
    ->ArgNames({"trees", "batch", "warm"})
    ->Args({25, kUnbatched, 0})
    ->Args({25, kBatchBeforeAutodiff, 0})
    ->Args({25, kBatchBeforeAutodiff, 1})
    ->Args({25, kBatchAfterAutodiff, 0})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

// A small segment-sized program (three elementwise operators) compiled in
// a session that has compiled before, as the generic tier's workers compile
// a segment's row buckets: the fixed cost of an LLVM compile, by stage. Each
// iteration's program has a shape of its own, so no kernel is reused.
// Args: the IR's optimization level (CompileOptions::opt_level: 1 is the
// loop pipeline a variant's quick code gets), and 0 quick machine code (a
// variant's first), 1 optimizing.
void BM_CompileSmallProgram(benchmark::State& state) {
  auto session = JitSession::Create();
  CompileOptions options;
  options.opt_level = static_cast<int>(state.range(0));
  options.optimize_machine_code = state.range(1) != 0;
  auto program = [](int64_t cols) {
    Module m;
    const std::string t = "Tensor[(8, " + std::to_string(cols) + "), f32]";
    m.AddSource("def @f(%x: " + t + ", %y: " + t + ") { tanh(add(mul(%x, %y), %y)) }", "f.pj");
    Rng rng(1);
    std::vector<Value> args = {Value(RandomUniform(rng, {8, cols}, -1, 1)), Value(RandomUniform(rng, {8, cols}, -1, 1))};
    return PartialEvaluate(*m.snapshot(), "f", args).main;
  };
  // The session's first compile: one-time setup (the process's first, when
  // this benchmark runs alone, LLVM's too), not timed with the others.
  Func first = program(7);
  const auto first_start = std::chrono::steady_clock::now();
  session->Compile(first, options);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - first_start).count();
  int64_t cols = 8;
  double optimize = 0, machine = 0;
  CompileReport report;
  for (auto _ : state) {
    state.PauseTiming();
    Func f = program(cols++);
    state.ResumeTiming();
    benchmark::DoNotOptimize(session->Compile(f, options, &report));
    optimize += report.optimize_ms;
    machine += report.machine_code_ms;
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["llvm_opt_ms"] = optimize / n;
  state.counters["machine_code_ms"] = machine / n;
  state.counters["first_compile_ms"] = first_ms;
}
BENCHMARK(BM_CompileSmallProgram)
    ->ArgNames({"O", "optimized"})
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(40);

// A fused kernel reading two tensors and writing one, beside memcpy.
void BM_FusedKernel(benchmark::State& state) {
  const int64_t n = state.range(0);
  Module m;
  m.AddSource("def @f(%x: Tensor[(" + std::to_string(n) + ",), f32], %y: Tensor[(" + std::to_string(n) +
                  ",), f32]) { add(mul(%x, %y), %y) }",
              "f.pj");
  Rng rng(1);
  std::vector<Value> args = {Value(RandomUniform(rng, {n}, -1, 1)), Value(RandomUniform(rng, {n}, -1, 1))};
  auto session = JitSession::Create();
  ExecutablePtr exe = session->Compile(PartialEvaluate(*m.snapshot(), "f", args).main);
  std::vector<Tensor> leaves = Flatten(args);
  for (auto _ : state) benchmark::DoNotOptimize(exe->Run(leaves));
  state.SetBytesProcessed(state.iterations() * 3 * n * 4);
}
BENCHMARK(BM_FusedKernel)->Arg(1 << 16)->Arg(1 << 20);

// A fused kernel with a transcendental (tanh) on rows in cache, compiled at
// each IR optimization level and code generator: what a cheaper compile
// costs the code. Args: O, optimizing machine code.
void BM_FusedTanhKernel(benchmark::State& state) {
  constexpr int64_t kRows = 64, kCols = 128;
  Module m;
  const std::string t = "Tensor[(" + std::to_string(kRows) + ", " + std::to_string(kCols) + "), f32]";
  m.AddSource("def @f(%x: " + t + ", %y: " + t + ") { tanh(add(mul(%x, %y), %y)) }", "f.pj");
  Rng rng(1);
  std::vector<Value> args = {Value(RandomUniform(rng, {kRows, kCols}, -1, 1)),
                             Value(RandomUniform(rng, {kRows, kCols}, -1, 1))};
  auto session = JitSession::Create();
  CompileOptions options;
  options.opt_level = static_cast<int>(state.range(0));
  options.optimize_machine_code = state.range(1) != 0;
  ExecutablePtr exe = session->Compile(PartialEvaluate(*m.snapshot(), "f", args).main, options);
  std::vector<Tensor> leaves = Flatten(args);
  for (auto _ : state) benchmark::DoNotOptimize(exe->Run(leaves));
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}
BENCHMARK(BM_FusedTanhKernel)->ArgNames({"O", "optimized"})->ArgsProduct({{0, 1, 2, 3}, {0, 1}});

void BM_Memcpy(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> a(n, 1.0f), b(n);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), n * 4);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * n * 4);
}
BENCHMARK(BM_Memcpy)->Arg(1 << 16)->Arg(1 << 20);

// A loop the data ends (issue 23): a recurrent cell iterated until its
// state settles, at most 200 times; hidden state (8, H). Partial evaluation
// leaves it a residual function; the compiled tier runs its straight-line
// regions native between the driver's decisions (jit/control_flow.h),
// against the interpreter on the original program. Counter: iterations.
struct SettleWorkload {
  Module module;
  std::vector<Value> args;
  explicit SettleWorkload(int64_t hidden) {
    SetBlasThreads(1);
    const std::string h = std::to_string(hidden);
    module.AddSource("def @settle(%h: Tensor[(8, " + h + "), f32], %w: Tensor[(" + h + ", " + h + "), f32], %n: Tensor[(), i64])"
                     " -> Tensor[(8, " + h + "), f32] {\n"
                     "  let %next = tanh(add(matmul(%h, %w), mul(%h, 0.5f32)));\n"
                     "  if (logical_or(less(norm(sub(%next, %h)), 0.0001f32), less_equal(%n, 0))) { %next }\n"
                     "  else { @settle(%next, %w, sub(%n, 1)) }\n"
                     "}\n"
                     "def @run(%h: Tensor[(8, " + h + "), f32], %w: Tensor[(" + h + ", " + h + "), f32]) -> Tensor[(), f32] {\n"
                     "  sum(@settle(%h, %w, 200))\n"
                     "}\n",
                     "settle.pj");
    Rng rng(3);
    const float scale = 1.0f / static_cast<float>(hidden);
    args = {Value(RandomUniform(rng, {8, hidden}, -1, 1)), Value(RandomUniform(rng, {hidden, hidden}, -scale, scale))};
  }
};

void BM_DataEndedLoopInterpreted(benchmark::State& state) {
  SettleWorkload w(state.range(0));
  Interpreter interp;
  Snapshot s = w.module.snapshot();
  for (auto _ : state) benchmark::DoNotOptimize(interp.Call(*s, "run", w.args));
}
BENCHMARK(BM_DataEndedLoopInterpreted)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);

void BM_DataEndedLoopCompiled(benchmark::State& state) {
  SettleWorkload w(state.range(0));
  Residual r = PartialEvaluate(*w.module.snapshot(), "run", w.args);
  auto session = JitSession::Create();
  ControlFlowStats stats;
  ExecutablePtr exe = CompileControlFlow(*session, r.main, r.functions, {}, &stats);
  std::vector<Tensor> leaves = Flatten(w.args, {});
  for (auto _ : state) benchmark::DoNotOptimize(exe->Run(leaves));
  state.counters["regions"] = stats.regions;
}
BENCHMARK(BM_DataEndedLoopCompiled)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);

// The same loop's loss and gradients for the state and the weights: the
// interpreter's tape against the regions' compiled VJPs run backwards along
// the recorded path.
void BM_DataEndedLoopGradInterpreted(benchmark::State& state) {
  SettleWorkload w(state.range(0));
  Interpreter interp;
  Snapshot s = w.module.snapshot();
  for (auto _ : state) benchmark::DoNotOptimize(interp.CallWithGrad(*s, "run", w.args, {0, 1}));
}
BENCHMARK(BM_DataEndedLoopGradInterpreted)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);

void BM_DataEndedLoopGradCompiled(benchmark::State& state) {
  SettleWorkload w(state.range(0));
  Residual r = PartialEvaluate(*w.module.snapshot(), "run", w.args);
  auto session = JitSession::Create();
  ControlFlowStats stats;
  ControlFlowOptions options;
  options.wrt = std::vector<int>{0, 1};
  ExecutablePtr exe = CompileControlFlow(*session, r.main, r.functions, options, &stats);
  std::vector<Tensor> leaves = Flatten(w.args, {});
  for (auto _ : state) benchmark::DoNotOptimize(exe->Run(leaves));
  state.counters["regions"] = stats.regions;
  state.counters["vjp_regions"] = stats.vjp_regions;
}
BENCHMARK(BM_DataEndedLoopGradCompiled)->Arg(32)->Arg(128)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pejit
