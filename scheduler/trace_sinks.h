// \file The sinks that make the engine's events a log and a trace file, and
// how an engine picks them (EngineOptions, PEJIT_LOG, PEJIT_TRACE).
//
// docs/tracing.md is the user's side of this file: the levels, the line of
// each event, the JSON-lines schema.
//
//   LogSink        one aligned line per event on the `pejit` spdlog logger
//                  ("[pejit] swap  loss  sig=3f2a91c0  native  pe=4.1ms ...");
//                  at info and debug calls are summed per entry and tier into
//                  a `calls` line per window, at trace each call is a line.
//   JsonLinesSink  every event as a JSON line (trace_file.h), formatted on the
//                  emitting thread and written by a thread of its own: a
//                  worker never waits for the disk.
//   StatsSink      the run's statistics (trace_stats.h).
//   FanOutSink     several sinks as one.
// EngineTrace assembles them for an engine and finishes them when it is
// destroyed: the statistics block, then the trace file flushed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "scheduler/events.h"

namespace spdlog {
class logger;
}

namespace pejit {

class StatsSink;  // trace_stats.h

enum class LogLevel : uint8_t { kOff, kInfo, kDebug, kTrace };

// "off", "info", "debug" or "trace", in any case; false for anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);
// The same, or std::invalid_argument naming the choices (and the nearest one).
LogLevel LogLevelFrom(std::string_view text);

// The least verbose level that shows `event`: info for what changes where
// calls run (start, stop, swap, refused, failed, evict, invalidate, and the
// miss of a signature seen for the first time), debug for the rest of a
// job's life (enqueue, pe, autodiff, passes, codegen, compile, cancel,
// prefetch, every miss), trace for each call and hit.
LogLevel LevelOf(const Event& event);

// "42us", "0.42ms", "31.5ms", "2.41s": a duration in microseconds for people.
std::string FormatMicros(int64_t us);
// "512B", "14.2KiB", "3.1MiB".
std::string FormatBytes(int64_t bytes);

// One event as a log line without the "[pejit] " prefix: the name and the
// entry padded to columns (the entry to `entry_width`), the signature, then
// the event's own fields, known ones in a fixed form and any others as
// key=value (docs/tracing.md has each).
std::string FormatEvent(const Event& event, size_t entry_width = 10);

// The "pejit" spdlog logger: created on first use (stderr, lines
// "[pejit] message", level warn, so that only warnings show until a LogSink
// lowers it to its own level) and registered with spdlog, where
// spdlog::get("pejit") finds it.
std::shared_ptr<spdlog::logger> PejitLogger();

// Forwards each event to the sinks that want it; one sink throwing does not
// keep the event from the others.
class FanOutSink final : public EventSink {
 public:
  explicit FanOutSink(std::vector<std::shared_ptr<EventSink>> sinks);
  bool Wants(EventKind kind) const override;
  void Emit(const Event& event) override;

 private:
  std::vector<std::shared_ptr<EventSink>> sinks_;
};

class LogSink final : public EventSink {
 public:
  static constexpr int64_t kDefaultCallWindowUs = 10'000'000;

  // Logs to `logger` the events `level` shows (LevelOf). Below trace, calls
  // are summed per entry and tier, and an entry's `calls` line is logged
  // when one of its calls starts `call_window_us` or more after the first
  // call of the window (event time, not wall time).
  LogSink(LogLevel level, std::shared_ptr<spdlog::logger> logger, int64_t call_window_us = kDefaultCallWindowUs);
  bool Wants(EventKind kind) const override;
  void Emit(const Event& event) override;
  // Logs the `calls` lines of the calls summed so far, and starts new windows.
  void FlushCalls();
  LogLevel level() const { return level_; }

 private:
  struct TierSum {
    int64_t calls = 0, us = 0;
  };
  struct Window {
    int64_t start_us = 0, end_us = 0;
    std::map<std::string, TierSum> tiers;
  };
  void Log(LogLevel level, const std::string& line);
  std::string CallsLine(const std::string& entry, const Window& w) const;

  const LogLevel level_;
  std::shared_ptr<spdlog::logger> logger_;
  const int64_t window_us_;
  std::atomic<size_t> entry_width_{10};  // grows with longer entry names
  std::mutex calls_mu_;
  std::map<std::string, Window> windows_;  // per entry, under calls_mu_
};

// Writes every event as one JSON line. Emit formats the line and appends it
// to a buffer under a short lock; a writer thread of the sink's own writes
// the buffer out in chunks (when it grows past 64 KiB, on Flush, or every
// 100 ms), so the emitting threads never do I/O.
class JsonLinesSink final : public EventSink {
 public:
  // Opens `path`, truncating it (appending when `append`); throws
  // std::runtime_error naming the path and the system's reason.
  explicit JsonLinesSink(const std::string& path, bool append = false);
  // Writes every event emitted before, then closes the file.
  ~JsonLinesSink() override;
  JsonLinesSink(const JsonLinesSink&) = delete;
  JsonLinesSink& operator=(const JsonLinesSink&) = delete;

  void Emit(const Event& event) override;
  // Blocks until every event emitted before the call is written and flushed.
  void Flush();
  const std::string& path() const { return path_; }
  // The first write error, "" when none (events after it are dropped).
  std::string error() const;

 private:
  void Writer();

  const std::string path_;
  std::FILE* file_;
  mutable std::mutex mu_;
  std::condition_variable wake_writer_, written_;
  std::string pending_;
  uint64_t queued_ = 0, done_ = 0;  // lines handed in, lines written
  bool flush_ = false, stop_ = false;
  std::string error_;
  std::thread writer_;
};

// What an engine logs and traces.
struct TraceSettings {
  LogLevel log = LogLevel::kOff;
  std::string file;                   // JSON lines; "" for none
  bool file_from_environment = false;
  std::vector<std::string> warnings;  // environment values that were ignored, and why
};

// The options' values, with PEJIT_LOG and PEJIT_TRACE for those left empty.
// A bad option value throws std::invalid_argument naming the option; a bad
// PEJIT_LOG is a warning in `warnings`, and logging stays off.
TraceSettings ResolveTraceSettings(const std::string& log_level, const std::string& trace_file);

// The sinks of one engine: the program's own (EngineOptions::events), plus
// what `settings` asks for — a LogSink and a StatsSink when logging is on, a
// JsonLinesSink for a trace file. Engines of one process tracing to the same
// path share its sink: the file is truncated when the process first opens
// it, and later engines append.
class EngineTrace {
 public:
  // Throws std::runtime_error when the trace file named by an option cannot
  // be opened; one named by PEJIT_TRACE is a logged warning instead.
  EngineTrace(const TraceSettings& settings, std::shared_ptr<EventSink> user);
  ~EngineTrace();
  EngineTrace(const EngineTrace&) = delete;
  EngineTrace& operator=(const EngineTrace&) = delete;

  // What the engine emits to; null when nobody listens.
  EventSink* sink() const { return sink_.get(); }
  // Call after the engine's last event: logs the pending `calls` lines and
  // the statistics block (when logging), and flushes the trace file.
  void Finish();

 private:
  std::shared_ptr<EventSink> sink_;
  std::shared_ptr<LogSink> log_;
  std::shared_ptr<StatsSink> stats_;
  std::shared_ptr<JsonLinesSink> file_;
};

}  // namespace pejit
