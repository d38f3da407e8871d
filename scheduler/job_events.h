// \file The events of one specialization job, built from what its stages report.
//
// RunJob (engine.cc) runs a job's stages: partial evaluation, batching,
// autodiff, the compile hook, then the swap, or the refusal or failure. Each
// stage reports one event (docs/tracing.md lists their fields); this class
// builds them, so that the stages read without the events between them. An
// event is built only when the sink wants its kind.
#pragma once

#include <cstdint>
#include <string>

#include "jit/batch.h"
#include "pe/partial_eval.h"
#include "scheduler/events.h"
#include "scheduler/engine.h"

namespace pejit {

// Stage times of a job, in microseconds; 0 for a stage that did not run.
struct JobTimes {
  int64_t enqueued = 0;      // when the job was queued
  int64_t start = 0;         // when a worker took it
  int64_t pe_us = 0;
  int64_t batch_us = -1;     // < 0: not batched
  int64_t autodiff_us = 0;   // grad mode
  int64_t compile_us = 0;    // the compile hook
};

class JobEvents {
 public:
  // `sink` may be null: then nothing is ever built.
  JobEvents(EventSink* sink, const std::string& entry, const Signature& signature, int64_t job)
      : sink_(sink), entry_(entry), signature_(signature.ShortHash()), job_(job) {}

  void Pe(int64_t start, int64_t us, const PeStats& stats) const;
  void Batch(int64_t start, int64_t us, const BatchStats& stats) const;
  void Autodiff(int64_t start, int64_t us, size_t wrt_leaves) const;
  // The compile hook ran over [start, end): `passes` and `codegen` from the
  // JIT's report (placed back to back from `start`), then `compile`.
  void Compile(int64_t start, int64_t end, const Executable& exec, const CompileNotes& notes) const;
  // The job published its code: one line with every stage's time.
  void Swap(const JobTimes& times, const std::string& tier, const std::string& mode, bool grad, size_t code_bytes,
            const CompileNotes& notes) const;
  // The job ended without code: refused (PE or a compiler declined) or failed.
  void End(bool refused, const JobTimes& times, const std::string& mode, const std::string& reason) const;

 private:
  bool On(EventKind kind) const { return sink_ && sink_->Wants(kind); }
  Event Make(EventKind kind, int64_t start, int64_t duration) const;

  EventSink* sink_;
  const std::string& entry_;
  const std::string signature_;
  int64_t job_;
};

}  // namespace pejit
