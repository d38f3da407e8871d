// What the tracing log costs an interpreter call (issue 9: with logging off
// it should not be measurable). The same small call — @scale, a (64,) f32
// vector times a scalar, under policy interpreter so every call runs in
// tier 0 — made directly on the Interpreter, and through the Engine with no
// sink (logging off), a sink that wants no event, the info-level log (calls
// summed, to a logger that drops its lines) with the statistics, and the
// JSON-lines trace file. And an empty compiled entry's call, the C++ side
// of the Python binding's overhead.
#include <benchmark/benchmark.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "interp/interpreter.h"
#include "scheduler/engine.h"
#include "scheduler/trace_sinks.h"
#include "scheduler/trace_stats.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
def @scale(%x: Tensor[(?,), f32], %k: Tensor[(), f32]) -> Tensor[(?,), f32] { mul(%x, %k) }
def @nothing(%x: Tensor[(), f32]) -> Tensor[(), f32] { %x }
)";

std::vector<Value> Args() {
  std::vector<float> x(64, 1.5f);
  return {Value(Tensor::FromVector<float>({64}, x)), Value(Tensor::Scalar(2))};
}

// A sink that asks for nothing: what an installed but quiet sink costs.
class NothingWanted final : public EventSink {
 public:
  bool Wants(EventKind) const override { return false; }
  void Emit(const Event&) override {}
};

void BM_InterpreterCall(benchmark::State& state) {
  Module module;
  module.AddSource(kProgram, "bench.pj");
  Snapshot snap = module.snapshot();
  Interpreter interpreter;
  std::vector<Value> args = Args();
  for (auto _ : state) benchmark::DoNotOptimize(interpreter.Call(*snap, "scale", args));
}
BENCHMARK(BM_InterpreterCall);

enum Tracing { kOff = 0, kQuietSink = 1, kInfoLog = 2, kTraceFile = 3 };

void BM_EngineCall(benchmark::State& state) {
  auto tracing = static_cast<Tracing>(state.range(0));
  EngineOptions options;
  options.workers = 1;
  options.policy = Policy::Interpreter();
  options.log_level = "off";  // whatever PEJIT_LOG says
  std::string path;
  if (tracing == kQuietSink) options.events = std::make_shared<NothingWanted>();
  if (tracing == kInfoLog) {
    // The engine's info-level sinks, with a logger that drops its lines (the
    // engine's own would print the statistics into the benchmark's output).
    auto logger = std::make_shared<spdlog::logger>("bench", std::make_shared<spdlog::sinks::null_sink_mt>());
    options.events = std::make_shared<FanOutSink>(std::vector<std::shared_ptr<EventSink>>{
        std::make_shared<LogSink>(LogLevel::kInfo, logger), std::make_shared<StatsSink>()});
  }
  if (tracing == kTraceFile) {
    path = "/tmp/pejit-bench-trace-" + std::to_string(::getpid()) + ".jsonl";
    options.trace_file = path;
  }
  {
    Engine engine(options);
    engine.module().AddSource(kProgram, "bench.pj");
    Entry scale = engine.entry("scale");
    std::vector<Value> args = Args();
    for (auto _ : state) benchmark::DoNotOptimize(scale.call(args));
  }
  if (!path.empty()) std::remove(path.c_str());
  const char* names[] = {"off", "quiet sink", "info log + statistics", "trace file"};
  state.SetLabel(names[tracing]);
}
BENCHMARK(BM_EngineCall)->Arg(kOff)->Arg(kQuietSink)->Arg(kInfoLog)->Arg(kTraceFile);

// An entry that returns its argument, compiled: the engine's own per-call
// cost, which bench/python_binding.py subtracts from the same call made
// from Python to get the binding's.
void BM_EmptyEntryCall(benchmark::State& state) {
  EngineOptions options;
  options.workers = 1;
  options.log_level = "off";
  Engine engine(options);
  engine.module().AddSource(kProgram, "bench.pj");
  Entry nothing = engine.entry("nothing");
  std::vector<Value> args = {Value(Tensor::Scalar(1.5f))};
  if (!nothing.wait_ready(args).ready()) state.SkipWithError("@nothing did not compile");
  for (auto _ : state) benchmark::DoNotOptimize(nothing.call(args));
  state.SetLabel(nothing.status(args).tier);
}
BENCHMARK(BM_EmptyEntryCall);

}  // namespace
}  // namespace pejit
