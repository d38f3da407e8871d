// \file The statistics of a run, from its events: the block an engine logs
// when it is destroyed with logging on, and what `pejit trace summary`
// prints from a trace file.
//
// Both add the same events to a TraceStats, so a trace file of the run gives
// the same text as the engine printed. Counts follow EntryStats: `refused`
// plus `failed` is EntryStats::failed, and `evicted` counts ready code only
// (a cold or failed slot forgotten by the tracked-signature bound is listed
// among the reasons, not counted).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "scheduler/events.h"

namespace pejit {

// Microsecond durations of one stage, in arrival order.
struct Durations {
  std::vector<int64_t> us;

  void Add(int64_t d) { us.push_back(d); }
  size_t count() const { return us.size(); }
  int64_t total() const;
  // Nearest-rank percentile, q in (0, 1]; 0 when empty.
  int64_t Percentile(double q) const;
  int64_t max() const;
};

struct TierTotals {
  int64_t calls = 0;
  int64_t us = 0;  // summed call durations
};

struct EntryTotals {
  std::map<std::string, TierTotals> tiers;  // "interpreter", "residual-interpreter", "native", "generic"
  int64_t hits = 0, misses = 0, enqueued = 0, compiled = 0, refused = 0, failed = 0, evicted = 0, invalidated = 0,
          cancelled = 0, prefetched = 0;
  // Specializations compiled by jobs queued after a module edit first
  // invalidated this entry's code: the cost of changing the program while it
  // runs. (A job queued before the edit that finishes after it is not one.)
  int64_t recompiled = 0;

  int64_t calls() const;
  int64_t calls(const std::string& tier) const;
};

class TraceStats {
 public:
  void Add(const Event& event);

  const std::map<std::string, EntryTotals>& entries() const { return entries_; }
  // "job" (the swap's span: dequeue to publish), "queue wait", "pe",
  // "batch", "autodiff", "passes", "codegen", "compile"; "generic inspect"
  // (the inspector's walks: one per generic call, or per prefetch when the
  // call takes the prefetch's schedule) and "generic compile" (per segment
  // variant).
  const Durations& stage(const std::string& name) const;
  // (kind, entry, reason) → how many: refused and failed with their reason,
  // evict with its reason (and the state when not ready), invalidate with
  // the definitions (counting slots), cancel with its reason.
  using ReasonKey = std::tuple<std::string, std::string, std::string>;
  const std::map<ReasonKey, int64_t>& reasons() const { return reasons_; }
  int engines() const { return engines_; }
  // Module edits by kind ("add", "replace", "remove"), and the
  // specializations they dropped and kept for their kernels.
  const std::map<std::string, int64_t>& edits() const { return edits_; }
  int64_t edit_slots() const { return edit_slots_; }
  int64_t edit_retained() const { return edit_retained_; }

  // The statistics as text lines, each ending in '\n'.
  std::string Render() const;

 private:
  std::map<std::string, EntryTotals> entries_;
  std::map<std::string, Durations> stages_;
  std::map<ReasonKey, int64_t> reasons_;
  int engines_ = 0;
  std::map<std::string, int64_t> edits_;
  std::set<int64_t> after_edit_jobs_;  // jobs queued for an entry after its first invalidation
  int64_t edit_slots_ = 0, edit_retained_ = 0;
  std::string policy_;
  int64_t workers_ = 0;
  int64_t first_us_ = 0, last_us_ = 0;
  bool any_ = false;
};

// Adds every event it is sent to a TraceStats.
class StatsSink final : public EventSink {
 public:
  void Emit(const Event& event) override;
  TraceStats stats() const;

 private:
  mutable std::mutex mu_;
  TraceStats stats_;
};

}  // namespace pejit
