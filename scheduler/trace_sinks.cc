#include "scheduler/trace_sinks.h"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>

#include "scheduler/trace_file.h"
#include "scheduler/trace_stats.h"
#include "support/spelling.h"

namespace pejit {
namespace {

constexpr const char* kLevelNames[] = {"off", "info", "debug", "trace"};

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kOff: return spdlog::level::off;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kTrace: return spdlog::level::trace;
  }
  return spdlog::level::off;
}

// The least verbose level at which some event of `kind` shows.
LogLevel KindLevel(EventKind kind) {
  switch (kind) {
    case EventKind::kStart:
    case EventKind::kStop:
    case EventKind::kSwap:
    case EventKind::kRefused:
    case EventKind::kGenericRefused:
    case EventKind::kFailed:
    case EventKind::kEvict:
    case EventKind::kEdit:
    case EventKind::kInvalidate:
    case EventKind::kCacheRefused:
    case EventKind::kMiss: return LogLevel::kInfo;
    case EventKind::kCall:
    case EventKind::kHit: return LogLevel::kTrace;
    default: return LogLevel::kDebug;
  }
}

// `value` as it reads in a line: quoted when it has spaces or quotes, or is empty.
std::string Quoted(const std::string& value) {
  if (!value.empty() && value.find_first_of(" \"\\\t\n") == std::string::npos) return value;
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out + "\"";
}

// key=value, with *_us as a duration and *_bytes as a size (the unit leaves the key).
std::string Field(const std::string& key, const FieldValue& value) {
  if (const auto* i = std::get_if<int64_t>(&value)) {
    if (key.size() > 3 && key.ends_with("_us")) return key.substr(0, key.size() - 3) + "=" + FormatMicros(*i);
    if (key.size() > 6 && key.ends_with("_bytes")) return key.substr(0, key.size() - 6) + "=" + FormatBytes(*i);
    if (key == "bytes") return key + "=" + FormatBytes(*i);
    return key + "=" + std::to_string(*i);
  }
  if (const auto* d = std::get_if<double>(&value)) return key + "=" + fmt::format("{:g}", *d);
  return key + "=" + Quoted(std::get<std::string>(value));
}

}  // namespace

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (int i = 0; i < 4; ++i) {
    if (lower == kLevelNames[i]) {
      *level = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

LogLevel LevelOf(const Event& event) {
  if (event.kind == EventKind::kMiss && event.Text("state") != "new") return LogLevel::kDebug;
  // A signature only remembered (cold, or failed and logged then) pushed
  // out by newer ones: in a reshuffled run, nearly every minibatch's, most
  // of an info log's lines. Only code leaving the cache changes where calls run.
  if (event.kind == EventKind::kEvict && event.Text("state") != "ready") return LogLevel::kDebug;
  return KindLevel(event.kind);
}

std::string FormatMicros(int64_t us) {
  if (us < 100) return fmt::format("{}us", us);
  if (us < 1000) return fmt::format("{:.2f}ms", static_cast<double>(us) / 1e3);
  if (us < 1'000'000) return fmt::format("{:.1f}ms", static_cast<double>(us) / 1e3);
  return fmt::format("{:.2f}s", static_cast<double>(us) / 1e6);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return fmt::format("{}B", bytes);
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.1f}KiB", static_cast<double>(bytes) / 1024);
  return fmt::format("{:.1f}MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string FormatEvent(const Event& e, size_t entry_width) {
  std::string line = fmt::format("{:<10} {:<{}}  {:<12}", e.name(), e.entry, entry_width,
                                 e.signature.empty() ? "" : "sig=" + e.signature);
  std::vector<std::string> used;
  auto take = [&](const char* key) {
    used.emplace_back(key);
    return e.Text(key);
  };
  std::string lead;
  switch (e.kind) {
    case EventKind::kCall:
      lead = fmt::format("{:<20} {:>8}  {}", take("tier"), FormatMicros(e.duration_us), take("mode"));
      break;
    case EventKind::kHit: lead = take("tier"); break;
    case EventKind::kMiss: {
      std::string state = take("state"), policy = take("policy"), queue = take("queue");
      lead = policy == "sync" ? fmt::format("-> wait for the compile ({}, queue={})", state, queue)
                              : fmt::format("-> interpreter ({}, queue={})", state, queue);
      break;
    }
    case EventKind::kSwap: lead = take("tier"); break;
    case EventKind::kCompile: lead = take("tier") + "  " + FormatMicros(e.duration_us); break;
    case EventKind::kStop: lead = "after " + FormatMicros(e.duration_us); break;
    case EventKind::kPe:
    case EventKind::kAutodiff:
    case EventKind::kBatch:
    case EventKind::kPasses:
    case EventKind::kCodegen:
    case EventKind::kGenericCompile: lead = FormatMicros(e.duration_us); break;
    default: break;
  }
  if (!lead.empty()) line += "  " + lead;
  for (const auto& [key, value] : e.fields) {
    if (std::find(used.begin(), used.end(), key) != used.end()) continue;
    line += "  " + Field(key, value);
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

std::shared_ptr<spdlog::logger> PejitLogger() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (auto existing = spdlog::get("pejit")) return existing;
  auto logger = std::make_shared<spdlog::logger>("pejit", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern("[%n] %v");
  logger->set_level(spdlog::level::warn);
  try {
    spdlog::register_logger(logger);
  } catch (const spdlog::spdlog_ex&) {
    // Registered by the program between get and here: theirs is the one.
    if (auto existing = spdlog::get("pejit")) return existing;
  }
  return logger;
}

// ---- FanOutSink ----------------------------------------------------------------------

FanOutSink::FanOutSink(std::vector<std::shared_ptr<EventSink>> sinks) : sinks_(std::move(sinks)) {}

bool FanOutSink::Wants(EventKind kind) const {
  return std::any_of(sinks_.begin(), sinks_.end(), [&](const auto& s) { return s->Wants(kind); });
}

void FanOutSink::Emit(const Event& event) {
  for (const auto& s : sinks_) {
    if (!s->Wants(event.kind)) continue;
    try {
      s->Emit(event);
    } catch (...) {
      // One sink's failure is not the others' business.
    }
  }
}

// ---- LogSink ------------------------------------------------------------------------

LogSink::LogSink(LogLevel level, std::shared_ptr<spdlog::logger> logger, int64_t call_window_us)
    : level_(level), logger_(std::move(logger)), window_us_(call_window_us) {
  if (level_ != LogLevel::kOff && logger_->level() > SpdlogLevel(level_)) logger_->set_level(SpdlogLevel(level_));
}

bool LogSink::Wants(EventKind kind) const {
  if (level_ == LogLevel::kOff) return false;
  return kind == EventKind::kCall || KindLevel(kind) <= level_;
}

void LogSink::Log(LogLevel level, const std::string& line) {
  logger_->log(SpdlogLevel(level), spdlog::string_view_t(line));
}

std::string LogSink::CallsLine(const std::string& entry, const Window& w) const {
  std::string line = fmt::format("{:<10} {:<{}}  {:<12}", "calls", entry, entry_width_.load(), "");
  for (const auto& [tier, sum] : w.tiers) {
    line += fmt::format("  {}={} ({}/call)", tier, sum.calls, FormatMicros(sum.us / std::max<int64_t>(1, sum.calls)));
  }
  return line + fmt::format("  over {}", FormatMicros(w.end_us - w.start_us));
}

void LogSink::Emit(const Event& event) {
  if (level_ == LogLevel::kOff) return;
  size_t width = entry_width_.load(std::memory_order_relaxed);
  while (event.entry.size() > width &&
         !entry_width_.compare_exchange_weak(width, event.entry.size(), std::memory_order_relaxed)) {
  }
  if (event.kind == EventKind::kCall && level_ < LogLevel::kTrace) {
    std::lock_guard<std::mutex> lock(calls_mu_);
    Window& w = windows_[event.entry];
    if (w.tiers.empty()) w.start_us = event.start_us;
    TierSum& sum = w.tiers[event.Text("tier")];
    sum.calls++;
    sum.us += event.duration_us;
    w.end_us = std::max(w.end_us, event.start_us + event.duration_us);
    if (event.start_us - w.start_us >= window_us_) {
      Log(LogLevel::kInfo, CallsLine(event.entry, w));
      w = Window{};
    }
    return;
  }
  LogLevel level = LevelOf(event);
  if (level <= level_) Log(level, FormatEvent(event, entry_width_.load(std::memory_order_relaxed)));
}

void LogSink::FlushCalls() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  for (auto& [entry, w] : windows_) {
    if (!w.tiers.empty()) Log(LogLevel::kInfo, CallsLine(entry, w));
    w = Window{};
  }
}

// ---- JsonLinesSink --------------------------------------------------------------------

namespace {
constexpr size_t kChunkBytes = 64 << 10;
constexpr auto kWriterPeriod = std::chrono::milliseconds(100);
}  // namespace

JsonLinesSink::JsonLinesSink(const std::string& path, bool append)
    : path_(path), file_(std::fopen(path.c_str(), append ? "ab" : "wb")) {
  if (!file_) throw std::runtime_error("cannot open the trace file " + path + ": " + std::strerror(errno));
  writer_ = std::thread([this] { Writer(); });
}

JsonLinesSink::~JsonLinesSink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_writer_.notify_one();
  writer_.join();
  std::fclose(file_);
}

void JsonLinesSink::Emit(const Event& event) {
  std::string line = EventToJson(event);
  line += '\n';
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ += line;
    ++queued_;
    wake = pending_.size() >= kChunkBytes;
  }
  if (wake) wake_writer_.notify_one();
}

void JsonLinesSink::Writer() {
  std::string chunk;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_writer_.wait_for(lock, kWriterPeriod, [&] { return stop_ || flush_ || pending_.size() >= kChunkBytes; });
    chunk.swap(pending_);
    uint64_t upto = queued_;
    bool stopping = stop_;
    bool failed = !error_.empty();
    flush_ = false;
    lock.unlock();
    std::string error;
    if (!chunk.empty() && !failed) {
      if (std::fwrite(chunk.data(), 1, chunk.size(), file_) != chunk.size() || std::fflush(file_) != 0) {
        error = std::string("writing ") + path_ + ": " + std::strerror(errno);
      }
    }
    chunk.clear();
    lock.lock();
    if (!error.empty() && error_.empty()) error_ = error;
    done_ = upto;
    written_.notify_all();
    if (stopping && pending_.empty()) return;
  }
}

void JsonLinesSink::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t target = queued_;
  if (done_ >= target) return;
  flush_ = true;
  wake_writer_.notify_one();
  written_.wait(lock, [&] { return done_ >= target; });
}

std::string JsonLinesSink::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

// ---- Settings -------------------------------------------------------------------------

namespace {

// "'bogus' is not a log level (did you mean ...); expected off, info, debug or trace"
std::string NotALevel(std::string_view text) {
  std::string hint = DidYouMean(text, {"off", "info", "debug", "trace"});
  if (!hint.empty() && hint.front() == ';') hint = " (" + hint.substr(2) + ")";
  return "'" + std::string(text) + "' is not a log level" + hint + "; expected off, info, debug or trace";
}

// One JsonLinesSink per path in the process: the first engine truncates the
// file, engines after it append to it.
std::shared_ptr<JsonLinesSink> SharedTraceFile(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<JsonLinesSink>> open;
  static std::set<std::string> opened;
  std::lock_guard<std::mutex> lock(mu);
  if (auto sink = open[path].lock()) return sink;
  auto sink = std::make_shared<JsonLinesSink>(path, /*append=*/opened.count(path) > 0);
  opened.insert(path);
  open[path] = sink;
  return sink;
}

}  // namespace

LogLevel LogLevelFrom(std::string_view text) {
  LogLevel level;
  if (!ParseLogLevel(text, &level)) throw std::invalid_argument(NotALevel(text));
  return level;
}

TraceSettings ResolveTraceSettings(const std::string& log_level, const std::string& trace_file) {
  TraceSettings s;
  if (!log_level.empty()) {
    if (!ParseLogLevel(log_level, &s.log)) {
      throw std::invalid_argument("EngineOptions::log_level: " + NotALevel(log_level));
    }
  } else if (const char* env = std::getenv("PEJIT_LOG"); env && *env) {
    if (!ParseLogLevel(env, &s.log)) {
      s.warnings.push_back("PEJIT_LOG=" + NotALevel(env) + "; logging stays off");
    }
  }
  if (!trace_file.empty()) {
    s.file = trace_file;
  } else if (const char* env = std::getenv("PEJIT_TRACE"); env && *env) {
    s.file = env;
    s.file_from_environment = true;
  }
  return s;
}

// ---- EngineTrace ------------------------------------------------------------------------

EngineTrace::EngineTrace(const TraceSettings& settings, std::shared_ptr<EventSink> user) {
  std::vector<std::string> warnings = settings.warnings;
  std::vector<std::shared_ptr<EventSink>> sinks;
  if (user) sinks.push_back(std::move(user));
  if (settings.log != LogLevel::kOff) {
    log_ = std::make_shared<LogSink>(settings.log, PejitLogger());
    stats_ = std::make_shared<StatsSink>();
    sinks.push_back(log_);
    sinks.push_back(stats_);
  }
  if (!settings.file.empty()) {
    try {
      file_ = SharedTraceFile(settings.file);
      sinks.push_back(file_);
    } catch (const std::runtime_error& e) {
      if (!settings.file_from_environment) throw;
      warnings.push_back(std::string("PEJIT_TRACE: ") + e.what() + "; no trace is written");
    }
  }
  for (const std::string& w : warnings) PejitLogger()->warn("warning: {}", w);
  if (sinks.size() == 1) {
    sink_ = sinks[0];
  } else if (!sinks.empty()) {
    sink_ = std::make_shared<FanOutSink>(std::move(sinks));
  }
}

EngineTrace::~EngineTrace() = default;

void EngineTrace::Finish() {
  if (log_) {
    log_->FlushCalls();
    std::string block = stats_->stats().Render();
    size_t pos = 0;
    while (pos < block.size()) {
      size_t end = block.find('\n', pos);
      if (end == std::string::npos) end = block.size();
      PejitLogger()->info("{}", std::string_view(block).substr(pos, end - pos));
      pos = end + 1;
    }
  }
  if (file_) {
    file_->Flush();
    if (std::string error = file_->error(); !error.empty()) PejitLogger()->warn("warning: trace incomplete: {}", error);
  }
}

}  // namespace pejit
