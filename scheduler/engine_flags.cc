#include "scheduler/engine_flags.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "jit/pass.h"
#include "scheduler/policy.h"
#include "scheduler/trace_sinks.h"
#include "support/cli_checks.h"
#include "support/input_file.h"
#include "support/progress.h"

namespace pejit {

void AddEngineFlags(CLI::App& app, EngineFlags& flags) {
  app.add_option("--workers", flags.workers, "background compile workers (0: cores - 1)")
      ->capture_default_str()
      ->check(WholeNumber(0, kMaxWorkers));
  app.add_option("--step-threads", flags.step_threads,
                 "threads a compiled step may use while nothing compiles, the caller's included (0: workers + 1; "
                 "1: the caller's alone)")
      ->capture_default_str()
      ->check(WholeNumber(0, kMaxWorkers + 1));
  app.add_option("--policy", flags.policy, "eager, hot:N, interpreter or sync")
      ->capture_default_str()
      ->check(ParsedBy(&Policy::Parse, "POLICY"));
  app.add_option("--log", flags.log_level, "the JIT's log on stderr: off, info, debug or trace (default: PEJIT_LOG)")
      ->check(ParsedBy(&LogLevelFrom, "LEVEL"));
  app.add_option("--trace", flags.trace_file, "write the JIT's events to this JSON-lines file (default: PEJIT_TRACE)");
  app.add_option("--cache-dir", flags.cache_dir,
                 "keep compiled code in this directory for later runs, and load what earlier runs kept there "
                 "(default: PEJIT_CACHE_DIR)");
  app.add_flag("--no-batch", flags.no_batch,
               "compile each example's operations, branches and loops apart instead of batching the independent "
               "instances of each (to measure what batching gives)");
  app.add_flag("--no-baseline", flags.no_baseline,
               "publish a specialization only once LLVM compiled it, not first as baseline code (registered kernels, "
               "no code generator) swapped for native code later (to measure what baseline code gives)");
  app.add_flag("--generic-lanes", flags.generic_lanes,
               "cut a call of the generic tier into lanes of examples run side by side by the step threads, while "
               "other processes leave a core for each helper and the cost model says they gain (wide layers, "
               "many rows)");
  std::vector<std::string> passes = {"all", "residual"};
  for (const PassList& list : PassLists()) passes.insert(passes.end(), list.passes.begin(), list.passes.end());
  app.add_option("--print-after", flags.print_after,
                 "print the program after these passes (comma-separated; jit/pass.h) of every compile, or after "
                 "all, on stderr")
      ->delimiter(',')
      ->check(CLI::IsMember(passes));
}

void ApplyEngineFlags(const EngineFlags& flags, EngineOptions& options) {
  options.workers = flags.workers;
  options.step_threads = flags.step_threads;
  options.policy = Policy::Parse(flags.policy);
  options.log_level = flags.log_level;
  options.trace_file = UserPath(flags.trace_file);
  options.cache_dir = UserPath(flags.cache_dir);
  options.batch = !flags.no_batch;
  options.baseline_first = !flags.no_baseline;
  options.generic_lanes = flags.generic_lanes;
  options.compile_options.instrument = PrintAfter(flags.print_after, stderr);
}

double FinishCompilesIntoCache(Engine& engine) {
  EngineStats stats = engine.stats();
  if (stats.cache_dir.empty()) return 0;
  auto start = std::chrono::steady_clock::now();
  // Queued, and at most one running per worker.
  const int64_t total = static_cast<int64_t>(stats.queued) + stats.workers;
  ProgressBar bar("compiling into " + stats.cache_dir, "jobs", static_cast<size_t>(total));
  engine.drain([&](int64_t left) {
    bar.Update(static_cast<size_t>(std::max<int64_t>(0, total - left)), std::to_string(left) + " left");
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace pejit
