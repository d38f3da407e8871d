// \file Whether a signature the generic tier already serves gets a specialization of its own.
//
// A minibatch's own specialization runs faster than the structure-generic
// code (fusion and batching across the whole minibatch), but it costs a job:
// tens of milliseconds of a worker for PE, batching, autodiff, lowering and
// LLVM, during which compiled steps borrow no helper thread and the generic
// tier's segment compiles wait. With reshuffled epochs of distinct
// minibatches a signature comes back once an epoch, so queuing every repeat
// (the earlier rule: the second call) filled the queue with jobs that were
// not done before the run ended and cost the steady epochs a third of their
// speed (bench/RESULTS.md, "Issue 51").
//
// A specialization is admitted when what it is expected to save before the
// run's horizon exceeds what it costs:
//   saving per call = the signature's generic call time x (1 - r), r the
//                     entry's measured ratio of a specialization's call time to
//                     the generic call of the same signature (0.5 before any);
//   calls to come   = (horizon - when it would be ready) / the signature's
//                     interval between calls, the horizon being as long again
//                     as the engine has run (a run that has gone on for t is
//                     taken to go on for t more), ready after the admitted jobs
//                     still pending and its own (each this job's estimated time);
//   cost            = one job's estimated time: the operations the
//                     signature's generic call ran times the entry's measured
//                     job time per operation (kPriorUsPerOp before any). A
//                     job partially evaluates and compiles the whole call, so
//                     its time grows with the call's size: a flat prior of
//                     50 ms admitted the Child-Sum Tree-LSTM's first three
//                     largest minibatches, whose jobs took 400-800 ms of the
//                     worker each (the steps meanwhile without a helper).
// Until a job of the entry has been measured, one admitted job at a time:
// the prior rate may be off by far (a self-attention encoder's jobs took
// 200 us an operation, eight times the prior), and three jobs admitted at
// once on it took a worker, and the steps' helper thread, for 0.3 s.
// So a minibatch that repeats every step is specialized within a fraction of
// a second, one that repeats every epoch only once the run has lasted many
// epochs, and the queue never holds more admitted work than the horizon can
// repay. The numbers and the decision are the `admission` event's fields.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

namespace pejit {

class Admission {
 public:
  struct Recurrence {
    int64_t calls = 0;       // of the signature so far, this one included
    int64_t first_us = 0;    // when the first came (steady clock)
    int64_t now_us = 0;
    int64_t generic_us = 0;  // what its latest generic call took
    int64_t alive_us = 0;    // how long the engine has run
    int64_t ops = 0;         // the operations its generic call ran (segment operations per instance, summed)
  };
  struct Decision {
    bool admit = false;
    std::string reason;  // for the trace: the comparison, in words
    double interval_us = 0, saving_us = 0, job_us = 0, benefit_us = 0;
    int64_t pending = 0;  // admitted jobs not ended, before this one
  };

  static constexpr double kPriorJobUs = 50e3;  // a call of unknown size
  static constexpr double kPriorUsPerOp = 25;   // the median of 14-110 over five models' jobs
  static constexpr double kPriorRatio = 0.5;

  // Thread-safe. An admitted decision counts as pending until JobEnded.
  Decision Decide(const Recurrence& r);
  // A job of the entry ended: `worker_us` its time (< 0: not measured, a
  // cancelled job or a code-cache load) for a call of `ops` operations (0:
  // not known); `admitted` whether Decide admitted it.
  void JobEnded(int64_t worker_us, int64_t ops, bool admitted);
  // A specialization ran a call in `native_us` where the same signature's
  // generic call took `generic_us`.
  void SpecializationRan(int64_t native_us, int64_t generic_us);

 private:
  mutable std::mutex mu_;
  double job_us_ = 0;     // mean of the jobs measured (exponentially weighted); 0: none
  double us_per_op_ = 0;  // mean job time per operation of the jobs of known size; 0: none
  double ratio_ = 0;   // specialization / generic call time; 0: none measured
  int64_t pending_ = 0;
};

}  // namespace pejit
