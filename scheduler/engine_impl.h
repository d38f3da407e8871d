// \file The engine's state and its methods, shared by the files that implement them.
//
// Internal to scheduler/: programs include engine.h. EngineImpl is one class
// whose methods live by concern: engine.cc (construction, the call path,
// the work queue and jobs, edits, waiting, the public API),
// engine_generic.cc (the structure-generic tier's calls, walks and segment
// compiles), engine_disk.cc (the persistent code cache's plumbing).
#pragma once

#include "scheduler/engine.h"
#include "scheduler/native_compile.h"

#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_set>

#include "generic/executor.h"
#include "generic/program.h"
#include "ir/abi.h"
#include "ir/printer.h"
#include "jit/control_flow.h"
#include "jit/image.h"
#include "jit/native_executable.h"
#include "jit/pipeline.h"
#include "ops/blas.h"
#include "scheduler/admission.h"
#include "scheduler/code_cache.h"
#include "scheduler/disk_cache.h"
#include "scheduler/job_events.h"
#include "scheduler/job_queue.h"
#include "scheduler/residual_executable.h"
#include "scheduler/trace_sinks.h"
#include "support/interrupt.h"
#include "support/parallel.h"
#include "support/team.h"
#include "support/thread_priority.h"

namespace pejit {

inline void Count(std::atomic<int64_t>& c, int64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }

// The job queue's class of a prefetch.
inline JobPriority PriorityOf(pejit::Prefetch when) {
  return when == pejit::Prefetch::kNext ? JobPriority::kNext : JobPriority::kIdle;
}

struct EntryState {
  explicit EntryState(std::string n) : name(std::move(n)) {}
  const std::string name;

  std::atomic<int64_t> calls_interpreter{0}, calls_residual{0}, calls_native{0}, calls_baseline{0}, calls_generic{0},
      calls_generic_native{0};
  std::atomic<int64_t> generic_runs{0}, generic_native_runs{0};
  std::atomic<int64_t> hits{0}, misses{0}, compiled{0}, refused{0}, failed{0}, evicted{0}, invalidated{0}, cancelled{0},
      prefetched{0}, loaded{0};

  // The structure-generic tier for the entry's definitions as of
  // `generic_versions` (its key); null with `generic_refusal` when it does
  // not serve them.
  std::mutex generic_mu;
  std::string generic_versions;
  std::shared_ptr<generic::GenericProgram> generic;
  std::string generic_refusal;
  // Signatures whose structure reaches a construct the tier does not serve
  // (a Refusal): their later calls go straight to the other tiers, and the
  // `generic-refused` event is said once per signature, not per call.
  std::unordered_set<SlotKey, SlotKeyHash> generic_refused;

  // Which repeating signatures the generic tier serves get a job.
  Admission admission;

  // The entry's definition versions in the newest snapshot seen so far.
  std::mutex versions_mu;
  uint64_t versions_generation = 0;
  VersionsPtr versions;

  // The persistent code cache's hash of the entry's definitions, for the
  // definitions of `definitions_versions` (a VersionsOf key).
  std::mutex definitions_mu;
  std::string definitions_versions;
  uint64_t definitions_hash = 0;
};

class EngineImpl {
 public:
  explicit EngineImpl(EngineOptions options);
  ~EngineImpl();

  // One call of an entry, from steps (1)-(2) on.
  struct Request {
    EntryState& entry;
    const std::vector<bool>& static_args;
    const std::vector<Value>& args;
    const std::vector<int>* wrt;  // null: value mode
    Snapshot snapshot;
    SlotKey key;
    bool cacheable = false;
    std::string uncacheable;  // why not, when not
    int64_t start_us = 0;     // when the call began, for its event (0 with no sink)
    bool pullback = false;    // value_and_pullback (with wrt): its slot key's mode is its own
    int64_t generic_ops = 0;  // the generic tier served it: the operations its runs' instances ran
  };

  ValueAndGrad Run(Request& r);
  // A grad-mode request's value and pullback, through the tiers as Run
  // goes: per-minibatch code (a PullbackExecutable: its forward's residuals
  // kept for its backward), the generic tier (its forward's runs kept), tier
  // 0 (its tape kept). Slots of their own (mode "pullback:grad:..."), never
  // on disk.
  ValueAndPullback RunPullback(Request& r);
  void Prefetch(Request& r, pejit::Prefetch when);
  CodeStatus WaitReady(Request& r);
  CodeStatus Status(Request& r);
  void Drain(const std::function<void(int64_t)>& progress);
  // Takes the most urgent waiting work (a walk, a segment compile, a job)
  // and runs it on the calling thread, at the workers' niceness when
  // `background`; false when nothing waits. A worker runs one per task
  // handed to the arena; Drain runs them too.
  bool RunOneWaiting(bool background);
  std::string CacheDir() const { return disk_ ? disk_->dir() : std::string(); }
  EntryState& State(const std::string& name);
  std::vector<std::shared_ptr<generic::GenericProgram>> GenericPrograms();
  const std::shared_ptr<generic::SegmentTable>& GenericSegments() const { return segments_; }

  Module module;
  const EngineOptions options;
  int workers;
  int step_threads;  // EngineOptions::step_threads resolved: the caller and up to `workers` helpers
  CodeCache cache;
  JobQueue queue;
  PeCache pe_cache;  // shared by the workers' PE runs
  SignatureCache signatures;  // of arguments passed before (a minibatch's trees, every epoch)

 private:
  void Prepare(Request& r);
  std::optional<ValueAndGrad> RunCompiled(Request& r, Slot& slot);
  std::optional<ValueAndGrad> RunGeneric(Request& r);
  std::optional<ValueAndPullback> RunGenericPullback(Request& r);
  std::optional<ValueAndPullback> RunCompiledPullback(Request& r, Slot& slot);
  // A call no code served: Miss (a job per policy); under policy sync, the
  // slot once its job is done, when ready (null otherwise).
  SlotPtr MissAndSyncWait(Request& r, SlotPtr slot);
  // A ready slot's code threw running `r`: failed (once), counted, logged.
  void FailCompiledRun(Request& r, Slot& slot, const std::string& failure);
  // The `call` event of a pullback's backward, which ran on `tier` from `start_us`.
  void EmitBackward(const std::string& entry, const std::string& signature, const char* tier, int64_t start_us) const;
  // A pullback job's code: `residual` (batched) as a PullbackExecutable,
  // differentiated for the job's wrt leaves. Throws JitFailure.
  ExecutablePtr CompilePullback(const Job& job, const Func& residual);
  // One call served by the generic tier: `step` runs it (setting the
  // inspection it ran), ServeGeneric does the rest (refusals, compiles to
  // queue, counts, the call's event). False when the tier does not serve it.
  using GenericStep = std::function<generic::Execution(const std::shared_ptr<generic::GenericProgram>&,
                                                       const generic::ExecuteOptions&, const generic::Inspection*&)>;
  bool ServeGeneric(Request& r, const GenericStep& step);
  std::shared_ptr<generic::GenericProgram> GenericFor(Request& r);
  bool PrefetchGeneric(Request& r, pejit::Prefetch when);
  void PrefetchSpecialized(Request& r, pejit::Prefetch when);
  // The `prefetch` event (docs/tracing.md): what the prefetch found or did.
  void EmitPrefetch(const Request& r, const std::string& state, JobPriority priority);
  void RefuseGeneric(Request& r, const std::string& reason);
  void QueueGenericCompile(const std::string& entry, std::shared_ptr<generic::GenericProgram> program,
                           generic::SegmentCode* code, generic::SegmentCode::Variant* variant);
  ValueAndGrad RunInterpreter(Request& r);
  // The persistent code cache (EngineOptions::cache_dir).
  DiskKey DiskKeyOf(EntryState& entry, const ModuleSnapshot& snapshot, const SlotKey& key) const;
  SlotPtr LoadFromDisk(Request& r);
  struct DiskHit {
    ExecutablePtr exec;
    std::vector<int> gradient_result;
  };
  std::optional<DiskHit> LoadImage(EntryState& entry, const ModuleSnapshot& snapshot, const SlotKey& key,
                                   const std::vector<Value>& args, const std::vector<bool>& static_args,
                                   const std::vector<int>* wrt, int64_t job);
  void StoreToDisk(const Job& job, const Slot& slot, const ExecutablePtr& exec);
  // The code stored under `key` linked, or null; `check` (may be empty)
  // throws to refuse it. Refusals remove the entry and say why.
  ExecutablePtr LinkFromDisk(const DiskKey& key, const std::string& entry, const Signature* sig, int64_t job,
                             const std::function<void(const Executable&)>& check);
  // Writes native code under `key` (other tiers' code is not stored).
  void WriteToDisk(const DiskKey& key, const std::string& entry, const Signature* sig, const Executable& exec,
                   int64_t job);
  void RefuseCacheEntry(const std::string& entry, const Signature* sig, const std::string& reason);
  // The persistent cache as the CodeStore under JitSession::Compile: a
  // program's code by its text (scheduler/engine_disk.cc).
  class ProgramStore;
  std::shared_ptr<CodeStore> MakeProgramStore();
  // What `entry`'s compiles use: EngineOptions::compile_options, with the
  // persistent cache's store when there is one.
  CompileOptions CompileOptionsFor(const std::string& entry) const;
  // `hot_calls` > 0: the generic tier served the call (in `generic_us`):
  // count the signature's calls and, from that many on, queue its job when
  // Admit says it pays, whatever the policy.
  SlotPtr Miss(Request& r, SlotPtr slot, int hot_calls = 0, int64_t generic_us = 0);
  // Whether a signature the generic tier serves, at its `calls`-th call, gets
  // a job (scheduler/admission.h); emits the `admission` event.
  bool Admit(Request& r, Slot& slot, int64_t calls);
  // Runs the job of a pending slot that calls keep missing at the caller's
  // priority; emits an `admission` event (decision boost).
  void Boost(Request& r, Slot& slot);
  static constexpr int kBoostAfterMisses = 3;
  // A job of `slot` ended (worker_us < 0: not measured): its entry's
  // admission learns its time and, if it admitted the job, that it is done.
  static void JobEnded(Slot& slot, int64_t worker_us) {
    slot.key.entry->admission.JobEnded(worker_us, slot.generic_ops.load(std::memory_order_relaxed),
                                       slot.admitted.exchange(false, std::memory_order_relaxed));
  }
  SlotPtr Insert(Request& r, SlotState initial, bool* inserted);
  void Enqueue(Request& r, const SlotPtr& slot, JobPriority priority);
  bool Promote(Request& r, const SlotPtr& slot, JobPriority priority);
  void Spawn();
  // Runs `body` on a worker, counted in outstanding_ (which the destructor
  // and Drain wait for) and, for a job's task, in jobs_in_flight_.
  void HandToWorker(bool job, void (EngineImpl::*body)());
  void RunOneJob();  // a job's task: the most urgent work when it starts
  void WarmUp();     // LLVM set up on the worker (JitSession::WarmUp), traced

  // `waited`: a caller waits for this job (wait_ready, policy sync), which
  // then compiles native code at once rather than baseline code first.
  void RunJob(Job& job, bool waited);
  void Cancel(Job& job, const char* why);
  void Wait(const Slot& slot);
  // The job's outcome is counted and reported: wakes its waiters.
  void Settle(Slot& slot);
  void NotifyWaiters();
  void ReportEvictions(const std::vector<Eviction>& evicted);
  void OnEdit(const ModuleEdit& edit);
  static CodeStatus StatusOf(const Slot& slot);

  // Events: built only when a sink wants them.
  bool On(EventKind kind) const { return sink_ && sink_->Wants(kind); }
  Event Make(EventKind kind, const std::string& entry, const Signature* sig, int64_t start_us = 0,
             int64_t duration_us = 0) const;
  void Emit(const Event& e) const;

  Interpreter interpreter_;
  std::shared_ptr<JitSession> jit_;  // LLVM for the default compile hook and the generic tier; may be null
  CompileOptions compile_options_;  // options.compile_options, and the store (CompileOptionsFor)
  CompileFn compile_;
  std::unique_ptr<DiskCache> disk_;  // with the default compile hook and a cache directory
  std::string disk_cpu_, disk_options_;  // DiskKey fields every entry shares

  // Segment variants of the generic tier waiting for native code; workers
  // take these before specialization jobs (each is small, and serves every
  // call that runs the segment).
  // A variant's native code: quick code first (native soonest), then, last
  // of all the work, optimized code replacing it (generic/executor.h).
  struct GenericCompile {
    std::string entry;
    std::shared_ptr<generic::GenericProgram> program;  // keeps the variant alive
    generic::SegmentCode* code;
    generic::SegmentCode::Variant* variant;
    generic::CodeGen codegen = generic::CodeGen::kQuick;
  };
  // Segment programs and their code, shared by all entries (generic/program.h).
  std::shared_ptr<generic::SegmentTable> segments_ =
      std::make_shared<generic::SegmentTable>(options.compile_options.instrument);
  // A prefetched call whose structure a worker walks ahead of it
  // (GenericProgram::InspectAhead), so that the caller's thread finds its
  // inspection made: the walk is a tenth of a Tree-LSTM training step and
  // would otherwise run on the training thread. The walk owns what the
  // prefetch's Request referred to.
  struct GenericWalk {
    EntryState* entry;
    std::vector<bool> static_args;
    std::vector<Value> args;
    std::optional<std::vector<int>> wrt;
    Snapshot snapshot;
    SlotKey key;
    pejit::Prefetch when;
    std::vector<const void*> structures;  // StructureIdentities(args)
  };
  std::mutex generic_queue_mu_;
  std::deque<GenericCompile> generic_queue_, generic_optimize_;
  // Walks of `next` prefetches go before segment compiles, `idle` ones after
  // them. A call drops its own walk while it is still queued (it walks
  // itself rather than wait for a worker) and waits for one a worker took
  // (`walking_`, each the entry and StructureIdentities): it is under way,
  // and walking again would only duplicate it.
  std::deque<GenericWalk> walks_next_, walks_idle_;
  std::vector<std::pair<EntryState*, std::vector<const void*>>> walking_;
  std::condition_variable walked_cv_;  // with generic_queue_mu_: a walk left walking_
  void RunGenericCompile(GenericCompile& job);
  // The `generic-compile` event of a variant that got native code: on a
  // worker, or (policy sync) on the calling thread during its call.
  void EmitGenericCompile(const std::string& entry, generic::CodeGen codegen, const generic::SegmentCode& code,
                          const generic::SegmentCode::Variant& variant, int64_t start_us, int64_t duration_us);
  // The rent rule (ski rental) for a tier-up: it runs at the workers' lower
  // priority unless, when a worker takes it, the calls have spent as long on
  // the slot's baseline code as a tier-up's CPU time on average (the prior
  // until one was measured); then at the caller's. Chosen once, when it
  // starts: one that started lowered stays lowered (ACT's one tier-up beside
  // a busy process did, 350-600 ms, its rent passing the prior meanwhile;
  // raising it from the calls once the rent came due showed no gain in two
  // runs, and is not done).
  struct MeanTime {
    std::atomic<int64_t> total_us{0}, count{0};
    int64_t prior_us;
    int64_t Us() const {
      const int64_t n = count.load(std::memory_order_relaxed);
      return n ? total_us.load(std::memory_order_relaxed) / n : prior_us;
    }
    void Add(int64_t us) {
      total_us.fetch_add(us, std::memory_order_relaxed);
      count.fetch_add(1, std::memory_order_relaxed);
    }
  };
  MeanTime tier_up_{.prior_us = 100'000};
  // A published specialization whose programs run baseline code (CompileNotes::
  // tier_ups): their native code, compiled after the specialization jobs a
  // call missed and before idle work; the specialization's own code is then
  // stored to disk when it is the slot's (the others are regions, which
  // their compile stores).
  struct TierUpJob {
    SlotPtr slot;  // skipped once invalidated or evicted
    std::vector<TierUp> tier_ups;
    int64_t job = 0;
    std::optional<DiskKey> store;
  };
  std::deque<TierUpJob> tier_up_queue_;  // with generic_queue_mu_
  // The first queued tier-up, or with `wanted_only` the first a caller
  // waits for (Slot::tier_up_wanted); under generic_queue_mu_.
  bool TakeTierUp(std::optional<TierUpJob>& into, bool wanted_only);
  void RunTierUp(TierUpJob& job, bool lowered);
  void QueueGenericWalk(Request& r, pejit::Prefetch when);
  void ClaimGenericWalk(Request& r);
  void RunGenericWalk(GenericWalk& walk);
  EngineTrace trace_;  // the program's sink, the log and the trace file
  EventSink* sink_;    // trace_.sink(): null when nobody listens
  int64_t started_us_;
  std::unique_ptr<tbb::global_control> parallelism_;
  tbb::task_arena arena_;

  std::mutex entries_mu_;
  std::map<std::string, std::unique_ptr<EntryState>, std::less<>> entries_;

  // Tasks handed to the arena and not yet finished; shutdown waits for 0.
  std::mutex tasks_mu_;
  std::condition_variable tasks_cv_;
  int64_t outstanding_ = 0;
  std::atomic<int64_t> jobs_in_flight_{0};  // outstanding_, read without the lock
  std::atomic<bool> stopping_{false};

  // wait_ready and policy sync sleep here until a slot leaves pending.
  std::mutex wait_mu_;
  std::condition_variable wait_cv_;

  // Lends the arena's workers to compiled calls while no job is in flight;
  // declared last, so destroyed first: it waits for its helpers while the arena and what they read are still there.
  ArenaHelpers helpers_{arena_, workers, [this] {
                          return jobs_in_flight_.load(std::memory_order_relaxed) > 0 || stopping_.load(std::memory_order_relaxed);
                        }};
};

}  // namespace pejit
