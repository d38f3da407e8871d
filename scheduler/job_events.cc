#include "scheduler/job_events.h"

#include <algorithm>

namespace pejit {

Event JobEvents::Make(EventKind kind, int64_t start, int64_t duration) const {
  Event e = MakeEvent(kind, entry_, signature_, start, duration);
  e.fields.push_back({"job", job_});
  return e;
}

void JobEvents::Pe(int64_t start, int64_t us, const PeStats& stats) const {
  if (!On(EventKind::kPe)) return;
  Event e = Make(EventKind::kPe, start, us);
  e.fields.push_back({"residual_ops", stats.residual_ops});
  e.fields.push_back({"params", stats.params});
  e.fields.push_back({"unfoldings", stats.unfoldings});
  // Helpers whose code came from the PE cache, and those this job kept
  // there (only when there are: most jobs have neither).
  if (stats.reused_specializations > 0) {
    e.fields.push_back({"reused_specializations", stats.reused_specializations});
    std::string reused;
    for (const std::string& helper : stats.reused) reused += (reused.empty() ? "" : ",") + helper;
    e.fields.push_back({"reused", reused});
  }
  if (stats.cached_specializations > 0) e.fields.push_back({"cached_specializations", stats.cached_specializations});
  EmitQuietly(*sink_, e);
}

void JobEvents::Batch(int64_t start, int64_t us, const BatchStats& stats) const {
  if (!On(EventKind::kBatch)) return;
  Event e = Make(EventKind::kBatch, start, us);
  e.fields.push_back({"groups", stats.groups});
  e.fields.push_back({"ops_before", stats.ops_before});
  e.fields.push_back({"ops_after", stats.ops_after});
  e.fields.push_back({"copied_bytes", stats.copied_bytes});
  e.fields.push_back({"lanes", static_cast<int64_t>(stats.lanes)});
  if (stats.lanes > 1) {
    e.fields.push_back({"lane_cut_bytes", stats.lane_cut_bytes});
  } else {
    e.fields.push_back({"one_lane", stats.why_one_lane});
  }
  EmitQuietly(*sink_, e);
}

void JobEvents::Autodiff(int64_t start, int64_t us, size_t wrt_leaves) const {
  if (!On(EventKind::kAutodiff)) return;
  Event e = Make(EventKind::kAutodiff, start, us);
  e.fields.push_back({"wrt_leaves", static_cast<int64_t>(wrt_leaves)});
  EmitQuietly(*sink_, e);
}

void JobEvents::Compile(int64_t start, int64_t end, const Executable& exec, const CompileNotes& notes) const {
  if (notes.jit) {
    const CompileReport& r = *notes.jit;
    // The report has durations, not times: the stages ran back to back from
    // the hook's start, which places them (clamped to the hook's span).
    auto us = [](double ms) { return static_cast<int64_t>(ms * 1e3); };
    int64_t passes_end = std::min(end, start + us(r.lower_ms));
    if (On(EventKind::kPasses)) {
      Event e = Make(EventKind::kPasses, start, passes_end - start);
      e.fields.push_back({"kernels", static_cast<int64_t>(r.kernels)});
      e.fields.push_back({"fused_kernels", static_cast<int64_t>(r.fused_kernels)});
      e.fields.push_back({"arena_bytes", r.arena_bytes});
      e.fields.push_back({"copy_steps", static_cast<int64_t>(r.copy_steps)});
      e.fields.push_back({"copied_bytes", r.copied_bytes});
      EmitQuietly(*sink_, e);
    }
    if (On(EventKind::kCodegen)) {
      int64_t ir = us(r.codegen_ms), opt = us(r.optimize_ms), mc = us(r.machine_code_ms);
      int64_t codegen_end = std::min(end, passes_end + ir + opt + mc);
      Event e = Make(EventKind::kCodegen, passes_end, codegen_end - passes_end);
      e.fields.push_back({"ir_us", ir});
      e.fields.push_back({"opt_us", opt});
      e.fields.push_back({"machine_code_us", mc});
      e.fields.push_back({"distinct_kernels", static_cast<int64_t>(r.distinct_fused_kernels)});
      e.fields.push_back({"reused_kernels", static_cast<int64_t>(r.reused_fused_kernels)});
      e.fields.push_back({"code_bytes", static_cast<int64_t>(r.code_bytes)});
      EmitQuietly(*sink_, e);
    }
  }
  if (On(EventKind::kCompile)) {
    Event e = Make(EventKind::kCompile, start, end - start);
    e.fields.push_back({"tier", std::string(exec.tier())});
    e.fields.push_back({"code_bytes", static_cast<int64_t>(exec.code_bytes())});
    if (!notes.fallback.empty()) e.fields.push_back({"fallback", notes.fallback});
    EmitQuietly(*sink_, e);
  }
}

void JobEvents::Swap(const JobTimes& times, const std::string& tier, const std::string& mode, bool grad,
                     size_t code_bytes, const CompileNotes& notes) const {
  if (!On(EventKind::kSwap)) return;
  Event e = MakeEvent(EventKind::kSwap, entry_, signature_, times.start, NowMicros() - times.start);
  e.fields.push_back({"tier", tier});
  e.fields.push_back({"job", job_});
  e.fields.push_back({"mode", mode});
  e.fields.push_back({"pe_us", times.pe_us});
  if (times.batch_us >= 0) e.fields.push_back({"batch_us", times.batch_us});
  if (grad) e.fields.push_back({"autodiff_us", times.autodiff_us});
  if (notes.jit) {
    // The line of the issue: pe=… passes=… llvm=… kernels=… code=…
    e.fields.push_back({"passes_us", static_cast<int64_t>(notes.jit->lower_ms * 1e3)});
    e.fields.push_back(
        {"llvm_us",
         static_cast<int64_t>((notes.jit->codegen_ms + notes.jit->optimize_ms + notes.jit->machine_code_ms) * 1e3)});
    e.fields.push_back({"kernels", static_cast<int64_t>(notes.jit->kernels)});
  } else {
    e.fields.push_back({"compile_us", times.compile_us});
  }
  e.fields.push_back({"code_bytes", static_cast<int64_t>(code_bytes)});
  e.fields.push_back({"wait_us", times.start - times.enqueued});
  if (!notes.fallback.empty()) e.fields.push_back({"fallback", notes.fallback});
  EmitQuietly(*sink_, e);
}

void JobEvents::End(bool refused, const JobTimes& times, const std::string& mode, const std::string& reason) const {
  EventKind kind = refused ? EventKind::kRefused : EventKind::kFailed;
  if (!On(kind)) return;
  Event e = Make(kind, times.start, NowMicros() - times.start);
  e.fields.push_back({"mode", mode});
  e.fields.push_back({"wait_us", times.start - times.enqueued});
  e.fields.push_back({"reason", reason});
  EmitQuietly(*sink_, e);
}

}  // namespace pejit
