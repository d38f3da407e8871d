#include "scheduler/engine_flags.h"

#include "scheduler/policy.h"
#include "scheduler/trace_sinks.h"
#include "support/cli_checks.h"
#include "support/input_file.h"

namespace pejit {

void AddEngineFlags(CLI::App& app, EngineFlags& flags) {
  app.add_option("--workers", flags.workers, "background compile workers (0: cores - 1)")
      ->capture_default_str()
      ->check(WholeNumber(0, kMaxWorkers));
  app.add_option("--policy", flags.policy, "eager, hot:N, interpreter or sync")
      ->capture_default_str()
      ->check(ParsedBy(&Policy::Parse, "POLICY"));
  app.add_option("--log", flags.log_level, "the JIT's log on stderr: off, info, debug or trace (default: PEJIT_LOG)")
      ->check(ParsedBy(&LogLevelFrom, "LEVEL"));
  app.add_option("--trace", flags.trace_file, "write the JIT's events to this JSON-lines file (default: PEJIT_TRACE)");
  app.add_option("--cache-dir", flags.cache_dir,
                 "keep compiled code in this directory for later runs, and load what earlier runs kept there "
                 "(default: PEJIT_CACHE_DIR)");
}

void ApplyEngineFlags(const EngineFlags& flags, EngineOptions& options) {
  options.workers = flags.workers;
  options.policy = Policy::Parse(flags.policy);
  options.log_level = flags.log_level;
  options.trace_file = UserPath(flags.trace_file);
  options.cache_dir = UserPath(flags.cache_dir);
}

}  // namespace pejit
