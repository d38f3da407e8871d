// \file `pejit trace`: the statistics, Chrome trace and log lines of a trace
// file written through PEJIT_TRACE or EngineOptions::trace_file
// (docs/tracing.md).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace pejit {

class TraceCommand {
 public:
  // Adds `trace` with its subcommands `summary`, `chrome` and `log` to `app`.
  explicit TraceCommand(CLI::App& app);
  // Whether the command line chose `trace`.
  bool parsed() const;
  // Runs the chosen subcommand; 0 on success. Throws std::runtime_error
  // naming the file (and line) of a bad or unreadable trace.
  int Run() const;

 private:
  CLI::App* trace_;
  CLI::App* summary_;
  CLI::App* chrome_;
  CLI::App* log_;
  std::string file_, output_, level_ = "debug";
};

}  // namespace pejit
