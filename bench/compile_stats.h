// \file What the background compiler did during one benchmark process, from
// the engine's events (scheduler/events.h): per specialization, the job's
// span (dequeue to publish: PE, batching, autodiff, passes, LLVM), the time
// from the signature's first sight (a miss or a prefetch) to its swap, and
// the code bytes it published. bench/treelstm_pejit and bench/mlp_pejit put
// its summary in their JSON line.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "scheduler/events.h"

namespace pejit::bench {

class CompileStatsSink final : public EventSink {
 public:
  bool Wants(EventKind kind) const override;
  void Emit(const Event& event) override;

  // {"specializations", "refused", "failed", "compile_ms_p50"/"_p99"/"_max",
  //  "first_sight_to_swap_ms_p50"/"_p99"/"_max", "code_bytes_total",
  //  "code_bytes_p50"/"_max", "by_entry": {entry: specializations}};
  // percentiles are nearest-rank, 0 when nothing was compiled.
  nlohmann::json Summary() const;
  // Jobs that have ended so far (swapped, loaded from the code cache, refused
  // or failed): a difference of two readings says whether the compiler
  // finished anything in between.
  int64_t jobs_ended() const;
  // Jobs enqueued and not ended (nor cancelled): queued or compiling now.
  int64_t jobs_in_flight() const;

 private:
  struct Swap {
    std::string entry;
    int64_t job_us = 0, first_sight_to_swap_us = 0, code_bytes = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, int64_t> first_seen_us_;  // entry + '/' + signature
  std::vector<Swap> swaps_;
  int64_t refused_ = 0, failed_ = 0, cancelled_ = 0, enqueued_ = 0, loaded_by_jobs_ = 0;
};

// Nearest-rank percentile, q in (0, 1]; 0 for no values.
double Percentile(std::vector<double> values, double q);

// The process's peak resident memory so far, MB (getrusage); 0 if unknown.
double MaxRssMb();


}  // namespace pejit::bench
