#include "tools/trace_command.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "scheduler/trace_file.h"
#include "scheduler/trace_sinks.h"
#include "scheduler/trace_stats.h"

namespace pejit {

TraceCommand::TraceCommand(CLI::App& app) {
  trace_ = app.add_subcommand("trace", "Read a trace file written through PEJIT_TRACE (JSON lines, docs/tracing.md)");
  trace_->require_subcommand(1);
  summary_ = trace_->add_subcommand("summary", "Print the run's statistics: calls per tier, specializations, "
                                               "stage times (p50, p99), reasons; what the engine logs at exit");
  summary_->add_option("file", file_, "the trace (.jsonl)")->required()->check(CLI::ExistingFile);
  chrome_ = trace_->add_subcommand("chrome", "Convert to Chrome trace-event JSON, for Perfetto or chrome://tracing");
  chrome_->add_option("file", file_, "the trace (.jsonl)")->required()->check(CLI::ExistingFile);
  chrome_->add_option("-o,--output", output_, "the JSON file to write")->required();
  log_ = trace_->add_subcommand("log", "Print the log lines of the events, as the engine prints them at a level");
  log_->add_option("file", file_, "the trace (.jsonl)")->required()->check(CLI::ExistingFile);
  log_->add_option("--level", level_, "info, debug or trace")
      ->check(CLI::IsMember({"info", "debug", "trace"}))
      ->capture_default_str();
}

bool TraceCommand::parsed() const { return trace_->parsed(); }

int TraceCommand::Run() const {
  std::vector<Event> events = ReadTraceFile(file_);
  if (summary_->parsed()) {
    TraceStats stats;
    for (const Event& e : events) stats.Add(e);
    std::fputs(stats.Render().c_str(), stdout);
    return 0;
  }
  if (chrome_->parsed()) {
    // Through stdio rather than a stream, for errno: "No space left on
    // device" is what the user needs to hear, not "failed".
    std::FILE* out = std::fopen(output_.c_str(), "wb");
    if (!out) throw std::runtime_error("cannot write " + output_ + ": " + std::strerror(errno));
    const std::string text = ChromeTrace(events) + "\n";
    const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size() && std::fflush(out) == 0;
    const int error = errno;
    if (std::fclose(out) != 0 || !written) {
      throw std::runtime_error("writing " + output_ + ": " + std::strerror(written ? errno : error));
    }
    std::printf("%s: %zu events from %s\n", output_.c_str(), events.size(), file_.c_str());
    return 0;
  }
  if (log_->parsed()) {
    LogLevel level = LogLevel::kDebug;
    ParseLogLevel(level_, &level);
    // A logger of its own on standard output, so that the lines are exactly
    // the engine's, calls summed below trace included.
    auto logger = std::make_shared<spdlog::logger>("pejit", std::make_shared<spdlog::sinks::stdout_sink_mt>());
    logger->set_pattern("[%n] %v");
    LogSink sink(level, logger);
    for (const Event& e : events) {
      if (sink.Wants(e.kind)) sink.Emit(e);
    }
    sink.FlushCalls();
    logger->flush();
    return 0;
  }
  return 2;
}

}  // namespace pejit
