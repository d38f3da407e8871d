// \file The engine's options as every command-line tool spells them:
// --workers, --step-threads, --policy, --log, --trace, --cache-dir, --no-batch, --no-baseline and --print-after, declared once so that the demos,
// `pejit replay` and the benchmarks check them alike and say the same about
// them (a bad value is refused when the line is parsed, by the parsers the
// engine itself uses).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "scheduler/engine.h"

namespace pejit {

struct EngineFlags {
  int workers = 0;               // 0: cores - 1
  int step_threads = 0;          // EngineOptions::step_threads (0: workers + 1)
  std::string policy = "eager";  // Policy::Parse
  std::string log_level;         // empty: PEJIT_LOG (docs/tracing.md)
  std::string trace_file;        // empty: PEJIT_TRACE
  std::string cache_dir;         // empty: PEJIT_CACHE_DIR, or none
  bool no_batch = false;         // EngineOptions::batch off
  bool no_baseline = false;      // EngineOptions::baseline_first off
  bool generic_lanes = false;    // EngineOptions::generic_lanes on
  // Passes (jit/pass.h) or "all": every compile's program after them, on
  // stderr (EngineOptions::compile_options.instrument).
  std::vector<std::string> print_after;
};

// Adds the options to `app`, writing into `flags`, whose values are the
// defaults shown by --help.
void AddEngineFlags(CLI::App& app, EngineFlags& flags);

// Sets `options`' workers, step threads, policy, log level, trace file, code cache, batching and pass printing. A
// relative path is the user's (UserPath), not the runfiles directory's.
void ApplyEngineFlags(const EngineFlags& flags, EngineOptions& options);

// With a persistent code cache, a run's end: waits for the compiles still
// queued (Engine::drain) behind a progress bar on stderr, so that the next
// run over the cache finds every signature this one met. Without a cache,
// nothing (the destructor cancels them). Returns the seconds it waited.
double FinishCompilesIntoCache(Engine& engine);

}  // namespace pejit
