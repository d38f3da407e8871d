#include "scheduler/trace_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "scheduler/trace_file.h"
#include "scheduler/trace_sinks.h"
#include "support/bounded.h"

namespace pejit {
namespace {

const Durations kNoDurations;

// The stages of a job, in pipeline order, with the event that times each.
struct StageSource {
  const char* name;
  EventKind kind;
};
constexpr StageSource kStages[] = {
    {"pe", EventKind::kPe},         {"batch", EventKind::kBatch},       {"autodiff", EventKind::kAutodiff},
    {"passes", EventKind::kPasses}, {"codegen", EventKind::kCodegen},   {"compile", EventKind::kCompile},
};

const char* const kTiers[] = {"interpreter", "residual-interpreter", "native", "generic"};

// Rows of cells as aligned text, two spaces apart, each line indented by
// `indent`; `align` has an 'l' or 'r' per column (default: the first left,
// the others right).
std::string Table(const std::vector<std::vector<std::string>>& rows, std::string_view align = "l",
                  const std::string& indent = "") {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c) line += "  ";
      bool left = c < align.size() ? align[c] == 'l' : false;
      line += left ? fmt::format("{:<{}}", row[c], width[c]) : fmt::format("{:>{}}", row[c], width[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

int64_t Durations::total() const { return std::accumulate(us.begin(), us.end(), int64_t{0}); }

int64_t Durations::Percentile(double q) const {
  if (us.empty()) return 0;
  std::vector<int64_t> sorted = us;
  std::sort(sorted.begin(), sorted.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

int64_t Durations::max() const { return us.empty() ? 0 : *std::max_element(us.begin(), us.end()); }

int64_t EntryTotals::calls() const {
  int64_t n = 0;
  for (const auto& [tier, t] : tiers) n += t.calls;
  return n;
}

int64_t EntryTotals::calls(const std::string& tier) const {
  auto it = tiers.find(tier);
  return it == tiers.end() ? 0 : it->second.calls;
}

const Durations& TraceStats::stage(const std::string& name) const {
  auto it = stages_.find(name);
  return it == stages_.end() ? kNoDurations : it->second;
}

void TraceStats::Add(const Event& e) {
  if (!any_ || e.start_us < first_us_) first_us_ = e.start_us;
  last_us_ = any_ ? std::max(last_us_, e.start_us + e.duration_us) : e.start_us + e.duration_us;
  any_ = true;
  for (const StageSource& s : kStages) {
    if (e.kind == s.kind) stages_[s.name].Add(e.duration_us);
  }
  if (e.kind == EventKind::kStart) {
    ++engines_;
    policy_ = StringField(e, "policy");
    workers_ = CountField(e, "workers");
    return;
  }
  if (e.kind == EventKind::kEdit) {
    edits_[StringField(e, "kind")]++;
    edit_slots_ += CountField(e, "slots");
    edit_retained_ += CountField(e, "retained");
    return;
  }
  if (e.kind == EventKind::kStop || e.entry.empty()) return;
  EntryTotals& t = entries_[e.entry];
  switch (e.kind) {
    case EventKind::kCall: {
      TierTotals& tier = t.tiers[StringField(e, "tier")];
      tier.calls++;
      tier.us += e.duration_us;
      // A walk of the structure: at the call, or ahead of it on a worker
      // (generic-inspect; the call then takes the schedule: "schedule": "prefetched").
      if (e.Find("inspect_us") && !e.Find("schedule")) stages_["generic inspect"].Add(CountField(e, "inspect_us"));
      break;
    }
    case EventKind::kGenericCompile: stages_["generic compile"].Add(e.duration_us); break;
    case EventKind::kGenericRefused: reasons_[{std::string(e.name()), e.entry, StringField(e, "reason")}]++; break;
    case EventKind::kAdmission: reasons_[{std::string(e.name()), e.entry, StringField(e, "decision")}]++; break;
    case EventKind::kHit: t.hits++; break;
    case EventKind::kMiss: t.misses++; break;
    case EventKind::kEnqueue:
      t.enqueued++;
      if (t.invalidated > 0) after_edit_jobs_.insert(CountField(e, "job"));
      break;
    case EventKind::kPrefetch:
      if (StringField(e, "state") == "queued") t.prefetched++;
      break;
    case EventKind::kGenericInspect: stages_["generic inspect"].Add(CountField(e, "inspect_us")); break;
    case EventKind::kCacheLoad: stages_["cache load"].Add(e.duration_us); break;
    case EventKind::kCacheStore: stages_["cache store"].Add(e.duration_us); break;
    case EventKind::kCacheRefused: reasons_[{std::string(e.name()), e.entry, StringField(e, "reason")}]++; break;
    case EventKind::kSwap:
      t.compiled++;
      if (after_edit_jobs_.count(CountField(e, "job"))) t.recompiled++;
      stages_["job"].Add(e.duration_us);
      if (e.Find("wait_us")) stages_["queue wait"].Add(CountField(e, "wait_us"));
      break;
    case EventKind::kRefused:
    case EventKind::kFailed:
      (e.kind == EventKind::kRefused ? t.refused : t.failed)++;
      if (e.Find("wait_us")) stages_["queue wait"].Add(CountField(e, "wait_us"));
      reasons_[{std::string(e.name()), e.entry, StringField(e, "reason")}]++;
      break;
    case EventKind::kCancel:
      t.cancelled++;
      reasons_[{"cancel", e.entry, StringField(e, "reason")}]++;
      break;
    case EventKind::kEvict: {
      std::string state = StringField(e, "state");
      if (state == "ready") {
        t.evicted++;
        reasons_[{"evict", e.entry, StringField(e, "reason")}]++;
      } else {
        reasons_[{"evict", e.entry, StringField(e, "reason") + " (" + state + ", not counted)"}]++;
      }
      break;
    }
    case EventKind::kInvalidate: {
      int64_t slots = CountField(e, "slots");
      t.invalidated += slots;
      reasons_[{"invalidate", e.entry, StringField(e, "definitions")}] += slots;
      break;
    }
    default: break;
  }
}

std::string TraceStats::Render() const {
  std::string out = "pejit statistics";
  if (engines_ == 1) {
    out += fmt::format(": policy {}, {} worker{}", policy_, workers_, workers_ == 1 ? "" : "s");
  } else if (engines_ > 1) {
    out += fmt::format(": {} engines", engines_);
  }
  out += fmt::format(", {} of events\n", FormatMicros(any_ ? last_us_ - first_us_ : 0));
  if (entries_.empty()) return out + "no entry was called\n";

  // Calls: how many ran in each tier, with their mean duration.
  // A tier's column shows when it has calls, or is one of the first three.
  std::vector<const char*> tiers;
  for (const char* tier : kTiers) {
    bool used = tiers.size() < 3;
    for (const auto& [entry, t] : entries_) used |= t.calls(tier) > 0;
    if (used) tiers.push_back(tier);
  }
  std::vector<std::vector<std::string>> calls = {{"entry", "calls"}};
  for (const char* tier : tiers) calls[0].push_back(tier);
  calls[0].insert(calls[0].end(), {"hits", "misses"});
  for (const auto& [entry, t] : entries_) {
    std::vector<std::string> row = {Bounded(entry, 80), std::to_string(t.calls())};
    for (const char* tier : tiers) {
      auto it = t.tiers.find(tier);
      if (it == t.tiers.end() || it->second.calls == 0) {
        row.push_back("0");
      } else {
        row.push_back(fmt::format("{} ({}/call)", it->second.calls, FormatMicros(it->second.us / it->second.calls)));
      }
    }
    row.push_back(std::to_string(t.hits));
    row.push_back(std::to_string(t.misses));
    calls.push_back(std::move(row));
  }
  out += Table(calls);

  // Specializations: what became of the jobs.
  std::vector<std::vector<std::string>> specs = {{"entry", "queued", "compiled", "refused", "failed", "evicted",
                                                  "invalidated", "cancelled", "prefetched"}};
  for (const auto& [entry, t] : entries_) {
    specs.push_back({Bounded(entry, 80), std::to_string(t.enqueued), std::to_string(t.compiled), std::to_string(t.refused),
                     std::to_string(t.failed), std::to_string(t.evicted), std::to_string(t.invalidated),
                     std::to_string(t.cancelled), std::to_string(t.prefetched)});
  }
  out += Table(specs);

  // Module edits: what changed while the program ran, and what it cost.
  if (!edits_.empty()) {
    int64_t total = 0;
    std::string kinds;
    for (const auto& [kind, n] : edits_) {
      total += n;
      kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", kind, n);
    }
    out += fmt::format("module edits: {} ({}); {} specialization{} invalidated, {} kept for their kernels\n", total,
                       kinds, edit_slots_, edit_slots_ == 1 ? "" : "s", edit_retained_);
    std::vector<std::vector<std::string>> rows = {{"entry", "invalidated", "recompiled", "compiled before"}};
    for (const auto& [entry, t] : entries_) {
      rows.push_back({Bounded(entry, 80), std::to_string(t.invalidated), std::to_string(t.recompiled),
                      std::to_string(t.compiled - t.recompiled)});
    }
    out += Table(rows);
  }

  // Times of the jobs and their stages.
  std::vector<std::vector<std::string>> times = {{"stage", "count", "total", "p50", "p99", "max"}};
  for (const char* name : {"job", "queue wait", "pe", "batch", "autodiff", "passes", "codegen", "compile", "generic inspect",
                           "generic compile", "cache load", "cache store"}) {
    const Durations& d = stage(name);
    if (d.count() == 0) continue;
    times.push_back({name, std::to_string(d.count()), FormatMicros(d.total()), FormatMicros(d.Percentile(0.5)),
                     FormatMicros(d.Percentile(0.99)), FormatMicros(d.max())});
  }
  if (times.size() > 1) out += Table(times);

  if (!reasons_.empty()) {
    out += "reasons\n";
    std::vector<std::vector<std::string>> rows;
    for (const auto& [key, n] : reasons_) {
      const auto& [kind, entry, reason] = key;
      rows.push_back({kind, Bounded(entry, 80), std::to_string(n), Bounded(reason, 400)});
    }
    out += Table(rows, "llrl", "  ");
  }
  return out;
}

void StatsSink::Emit(const Event& event) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.Add(event);
}

TraceStats StatsSink::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace pejit
