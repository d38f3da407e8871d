#include "bench/compile_stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>

namespace pejit::bench {

double MaxRssMb() {
  struct rusage usage;
  return ::getrusage(RUSAGE_SELF, &usage) == 0 ? static_cast<double>(usage.ru_maxrss) / 1024.0 : 0.0;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

bool CompileStatsSink::Wants(EventKind kind) const {
  switch (kind) {
    case EventKind::kMiss:
    case EventKind::kPrefetch:
    case EventKind::kEnqueue:
    case EventKind::kSwap:
    case EventKind::kCacheLoad:
    case EventKind::kRefused:
    case EventKind::kFailed:
    case EventKind::kCancel:
      return true;
    default:
      return false;
  }
}

void CompileStatsSink::Emit(const Event& e) {
  std::lock_guard lock(mu_);
  const std::string key = e.entry + '/' + e.signature;
  switch (e.kind) {
    case EventKind::kMiss:
    case EventKind::kPrefetch:
    case EventKind::kEnqueue:
      first_seen_us_.try_emplace(key, e.start_us);
      enqueued_ += e.kind == EventKind::kEnqueue;
      break;
    case EventKind::kSwap: {
      const FieldValue* bytes = e.Find("code_bytes");
      const int64_t end_us = e.start_us + e.duration_us;
      auto seen = first_seen_us_.find(key);
      swaps_.push_back({e.entry, e.duration_us, seen == first_seen_us_.end() ? e.duration_us : end_us - seen->second,
                        bytes && std::holds_alternative<int64_t>(*bytes) ? std::get<int64_t>(*bytes) : 0});
      break;
    }
    case EventKind::kCacheLoad:
      loaded_by_jobs_ += e.Find("job") != nullptr;  // a job that loaded instead of compiling ends here
      break;
    case EventKind::kRefused:
      ++refused_;
      break;
    case EventKind::kFailed:
      ++failed_;
      break;
    case EventKind::kCancel:
      ++cancelled_;
      break;
    default:
      break;
  }
}

int64_t CompileStatsSink::jobs_ended() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(swaps_.size()) + loaded_by_jobs_ + refused_ + failed_;
}

int64_t CompileStatsSink::jobs_in_flight() const {
  std::lock_guard lock(mu_);
  return enqueued_ - static_cast<int64_t>(swaps_.size()) - loaded_by_jobs_ - refused_ - failed_ - cancelled_;
}

nlohmann::json CompileStatsSink::Summary() const {
  std::lock_guard lock(mu_);
  std::vector<double> job_ms, sight_ms, bytes;
  nlohmann::json by_entry = nlohmann::json::object();
  int64_t total_bytes = 0;
  for (const Swap& s : swaps_) {
    job_ms.push_back(1e-3 * static_cast<double>(s.job_us));
    sight_ms.push_back(1e-3 * static_cast<double>(s.first_sight_to_swap_us));
    bytes.push_back(static_cast<double>(s.code_bytes));
    total_bytes += s.code_bytes;
    by_entry[s.entry] = by_entry.value(s.entry, 0) + 1;
  }
  return {{"specializations", swaps_.size()},
          {"refused", refused_},
          {"failed", failed_},
          {"compile_ms_p50", Percentile(job_ms, 0.5)},
          {"compile_ms_p99", Percentile(job_ms, 0.99)},
          {"compile_ms_max", Percentile(job_ms, 1.0)},
          {"first_sight_to_swap_ms_p50", Percentile(sight_ms, 0.5)},
          {"first_sight_to_swap_ms_p99", Percentile(sight_ms, 0.99)},
          {"first_sight_to_swap_ms_max", Percentile(sight_ms, 1.0)},
          {"code_bytes_total", total_bytes},
          {"code_bytes_p50", Percentile(bytes, 0.5)},
          {"code_bytes_max", Percentile(bytes, 1.0)},
          {"by_entry", by_entry}};
}

}  // namespace pejit::bench
