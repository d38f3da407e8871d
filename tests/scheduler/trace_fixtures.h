// \file Capturing the `pejit` logger's lines, and scratch files, for the tracing tests.
#pragma once

#include <gtest/gtest.h>
#include <spdlog/sinks/sink.h>
#include <spdlog/spdlog.h>

#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "scheduler/trace_sinks.h"

namespace pejit::testing_trace {

// An spdlog sink keeping each message (without the "[pejit] " pattern).
// Its own lock, not spdlog's base_sink: ThreadSanitizer sees this one.
class CaptureSink final : public spdlog::sinks::sink {
 public:
  void log(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.emplace_back(msg.payload.data(), msg.payload.size());
  }
  void flush() override {}
  void set_pattern(const std::string&) override {}
  void set_formatter(std::unique_ptr<spdlog::formatter>) override {}

  std::vector<std::string> lines() const {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_;
  }
  // The lines that start with `prefix`.
  std::vector<std::string> StartingWith(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const std::string& l : lines()) {
      if (l.rfind(prefix, 0) == 0) out.push_back(l);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// Routes the `pejit` logger to a CaptureSink while it lives (set up before
// any engine, so no thread logs while the sinks change).
class CapturedPejitLog {
 public:
  CapturedPejitLog() : logger_(PejitLogger()), saved_(logger_->sinks()), level_(logger_->level()) {
    logger_->sinks() = {capture_};
  }
  ~CapturedPejitLog() {
    logger_->sinks() = saved_;
    logger_->set_level(level_);
  }
  const CaptureSink& operator*() const { return *capture_; }
  const CaptureSink* operator->() const { return capture_.get(); }

 private:
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<CaptureSink> capture_ = std::make_shared<CaptureSink>();
  std::vector<spdlog::sink_ptr> saved_;
  spdlog::level::level_enum level_;
};

// A fresh path in the test's scratch directory.
inline std::string ScratchPath(const std::string& name) {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  return testing::TempDir() + "/" + info->test_suite_name() + "." + info->name() + "." + name;
}

inline std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

// `text` split at '\n' (no empty last line).
inline std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}

}  // namespace pejit::testing_trace
