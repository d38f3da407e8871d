// The engine: the call path and the jobs of code_cache.h, on a oneTBB arena.
//
// The numbers (1)-(7) and (J1)-(J6) are the steps of the essay in
// code_cache.h. The generic tier's part is engine_generic.cc, the
// persistent cache's engine_disk.cc (engine_impl.h says why). Threads: any
// number of callers; the workers of one tbb::task_arena, each running one job
// at a time; the module's editing thread, which runs OnEdit. Everything they share is behind the cache's and
// the queue's locks, or in atomics; the only hand-off TSan cannot see is TBB
// passing a task to a worker, annotated in Spawn.
#include "scheduler/engine_impl.h"

#include "jit/pullback.h"

#include "support/cpu_clock.h"

namespace pejit {

namespace {

// TBB hands a task to a worker through synchronization TSan cannot see
// (libtbb is not instrumented); this address carries that edge.
char task_handoff;

// RunJob's stage while PrepareResidual runs: PipelineReport::stage says which.
const char* const kPipelineStage = "pipeline";

// Job numbers for events, unique in the process (engines may share a trace file).
std::atomic<int64_t> next_job_id{1};


CodeStatus::State ToCodeState(SlotState s) {
  switch (s) {
    case SlotState::kCold: return CodeStatus::State::kCold;
    case SlotState::kPending: return CodeStatus::State::kPending;
    case SlotState::kReady: return CodeStatus::State::kReady;
    case SlotState::kFailed: return CodeStatus::State::kFailed;
  }
  return CodeStatus::State::kNone;
}

}  // namespace

const char* CodeStateName(CodeStatus::State s) {
  switch (s) {
    case CodeStatus::State::kNone: return "none";
    case CodeStatus::State::kCold: return "cold";
    case CodeStatus::State::kPending: return "pending";
    case CodeStatus::State::kReady: return "ready";
    case CodeStatus::State::kFailed: return "failed";
  }
  return "?";
}

namespace {

int DefaultWorkers() { return std::max(1, tbb::info::default_concurrency() - 1); }

// The engine's LLVM session. With a compile hook of the caller's, LLVM is
// optional (the generic tier then runs its segments in the interpreter).
std::shared_ptr<JitSession> MakeSession(bool optional) {
  try {
    return JitSession::Create();
  } catch (const JitFailure&) {
    if (!optional) throw;
    return nullptr;
  }
}

// Options a running engine would trip over later, refused at its start.
EngineOptions Checked(EngineOptions o) {
  if (o.workers < 0 || o.workers > kMaxWorkers) {
    throw std::invalid_argument("EngineOptions::workers is " + std::to_string(o.workers) + "; it must be 0 (cores - 1) to " +
                                std::to_string(kMaxWorkers));
  }
  if (o.step_threads < 0 || o.step_threads > kMaxWorkers + 1) {
    throw std::invalid_argument("EngineOptions::step_threads is " + std::to_string(o.step_threads) +
                                "; it must be 0 (workers + 1) to " + std::to_string(kMaxWorkers + 1));
  }
  return o;
}

// Whether per-minibatch code can return `ret`: in value mode and for
// pullbacks only tensors nested in tuples (grad mode returns the loss and
// gradients, whatever the result).
bool CompilesResult(const Type& ret, bool grad, bool pullback) { return (grad && !pullback) || IsTensorTree(ret); }

}  // namespace

EngineImpl::EngineImpl(EngineOptions opts)
    : options(Checked(std::move(opts))),
      workers(options.workers > 0 ? options.workers : DefaultWorkers()),
      step_threads(options.step_threads > 0 ? std::min(options.step_threads, workers + 1) : workers + 1),
      cache(CacheLimits{options.code_cache_bytes, std::max(1, options.max_specializations_per_entry),
                        std::max(1, options.max_tracked_signatures_per_entry), options.retained_code_bytes}),
      pe_cache(options.pe_cache),
      interpreter_(options.interpreter),
      jit_(MakeSession(static_cast<bool>(options.compile))),
      compile_options_(options.compile_options),
      compile_(options.compile ? options.compile : CompileNative(jit_, options.compile_options)),
      trace_(ResolveTraceSettings(options.log_level, options.trace_file), options.events),
      sink_(trace_.sink()),
      started_us_(NowMicros()),
      arena_(workers, /*reserved_for_masters=*/0) {
  // The plan's parts are the parallelism (jit/schedule.h); OpenBLAS's own
  // threads would oversubscribe the cores the team and the workers use.
  SetBlasThreads(1);
  // TBB starts at most default_concurrency − 1 workers unless told otherwise
  // (process-wide: the smallest live global_control wins).
  if (workers > tbb::info::default_concurrency() - 1) {
    parallelism_ = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                         static_cast<size_t>(workers) + 1);
  }
  arena_.initialize();
  // Specializations persist only when the default hook (LLVM) makes them.
  std::string dir = options.cache_dir;
  if (dir.empty()) {
    if (const char* env = std::getenv("PEJIT_CACHE_DIR")) dir = env;
  }
  if (!dir.empty() && !options.compile && jit_) {
    disk_ = std::make_unique<DiskCache>(dir, options.cache_dir_bytes);
    disk_cpu_ = jit_->host_cpu() + " " + jit_->host_features();
    const CompileOptions& c = options.compile_options;  // what changes the code made
    disk_options_ = "batch=" + std::to_string(options.batch) + ";fuel=" + std::to_string(options.pe.fuel) +
                    (c.opt_level != 3 ? ";O" + std::to_string(c.opt_level) : "") +
                    (c.profile ? ";profile" : "") + (c.poison_dead_buffers ? ";poison" : "") +
                    (!c.lower.fuse ? ";nofuse" : "") + (!c.lower.cse ? ";nocse" : "") +
                    (!c.lower.pack_gemm ? ";nopack" : "");
    // Every program compiled persists, under the one compile entry point
    // (JitSession::Compile's CodeStore): generic segments, control-flow
    // regions (a control-flow specialization is a driver over them: the job
    // still partially evaluates, its regions load).
    compile_options_.store = MakeProgramStore();
    compile_ = CompileNative(jit_, compile_options_);
  }
  module.Subscribe([this](const ModuleEdit& edit) { OnEdit(edit); });
  if (On(EventKind::kStart)) {
    Event e = Make(EventKind::kStart, "", nullptr, started_us_);
    e.fields.push_back({"policy", options.policy.ToString()});
    e.fields.push_back({"workers", static_cast<int64_t>(workers)});
    Emit(e);
  }
  if (jit_ && options.policy.kind != Policy::Kind::kInterpreter) {
    HandToWorker(/*job=*/false, &EngineImpl::WarmUp);
  }
}

// LLVM set up on a worker while the first calls run on tier 0: the first
// compile a call waits for (a generic segment's quick code) would otherwise
// pay 10-20 ms of LLVM's own set-up on the worker that compiles it.
void EngineImpl::WarmUp() {
  const int64_t start = NowMicros();
  std::string error;
  bool warmed = true;
  try {
    warmed = jit_->WarmUp();
  } catch (const std::exception& e) {
    error = e.what();  // the first real compile meets it again and says so for its job
  }
  if (On(EventKind::kWarmUp)) {
    Event e = Make(EventKind::kWarmUp, "", nullptr, start, NowMicros() - start);
    e.fields.push_back({"state", std::string(warmed ? "set-up" : "ready")});
    if (!error.empty()) e.fields.push_back({"error", error});
    Emit(e);
  }
}

EngineImpl::~EngineImpl() {
  stopping_.store(true);
  // Queued jobs are cancelled now; running ones finish (a compile cannot be
  // interrupted) and every task handed to TBB returns before members go.
  for (const JobPtr& job : queue.TakeAll()) Cancel(*job, "the engine shut down");
  {
    std::unique_lock<std::mutex> lock(tasks_mu_);
    tasks_cv_.wait(lock, [&] { return outstanding_ == 0; });
  }
  // Nothing runs any more: the last event, then the statistics and the file.
  if (On(EventKind::kStop)) {
    int64_t now = NowMicros();
    Emit(Make(EventKind::kStop, "", nullptr, started_us_, now - started_us_));
  }
  trace_.Finish();
}

EntryState& EngineImpl::State(const std::string& name) {
  std::lock_guard<std::mutex> lock(entries_mu_);
  auto& state = entries_[name];
  if (!state) state = std::make_unique<EntryState>(name);
  return *state;
}

// ---- Events ------------------------------------------------------------------------

Event EngineImpl::Make(EventKind kind, const std::string& entry, const Signature* sig, int64_t start_us,
                       int64_t duration_us) const {
  return MakeEvent(kind, entry, sig ? sig->ShortHash() : std::string(), start_us, duration_us);
}

void EngineImpl::Emit(const Event& e) const { EmitQuietly(*sink_, e); }

// ---- The call path -------------------------------------------------------------------

void EngineImpl::Prepare(Request& r) {
  // (1) The snapshot this call runs on, and the entry's definition versions in it.
  r.snapshot = module.snapshot();
  if (options.policy.kind == Policy::Kind::kInterpreter) {
    r.uncacheable = "policy interpreter never compiles";
    return;
  }
  if (r.wrt && !CompilableWrt(*r.wrt, r.args.size(), r.static_args)) {
    r.uncacheable = "wrt must name distinct dynamic arguments";
    return;
  }
  if (r.wrt) {  // an argument without a gradient is an error, which tier 0 gives
    const Definition* def = r.snapshot->Find(r.entry.name);
    if (def) r.uncacheable = WhyNoGradient(*r.snapshot, *def->func, *r.wrt);
    if (!r.uncacheable.empty()) return;
  }
  VersionsPtr versions;
  {
    std::lock_guard<std::mutex> lock(r.entry.versions_mu);
    if (r.entry.versions && r.entry.versions_generation == r.snapshot->generation())
      versions = r.entry.versions;
  }
  if (!versions) {
    if (!r.snapshot->Find(r.entry.name)) {
      r.uncacheable = "no definition @" + r.entry.name;
      return;
    }
    versions = DefinitionVersions::Of(*r.snapshot, r.entry.name);
    std::lock_guard<std::mutex> lock(r.entry.versions_mu);
    if (r.snapshot->generation() >= r.entry.versions_generation) {
      r.entry.versions_generation = r.snapshot->generation();
      r.entry.versions = versions;
    }
  }
  // (2) The signature.
  try {
    r.key = SlotKey{&r.entry, ModeName(r.wrt), signatures.Compute(r.args, r.static_args), std::move(versions)};
  } catch (const std::invalid_argument& e) {
    r.uncacheable = e.what();  // a function value among dynamic arguments: tier 0 only
    return;
  }
  // Structures made with another module's constructors of the same name:
  // tier 0 refuses them (CheckArguments) before any tier reads them.
  for (const auto& [made, arg] : r.key.signature.adts) {
    if (std::string why = r.snapshot->ForeignConstructors(*made); !why.empty()) {
      r.uncacheable = "argument " + std::to_string(arg) + " holds " + why;
      r.cacheable = false;
      return;
    }
  }
  r.cacheable = true;
}

ValueAndGrad EngineImpl::Run(Request& r) {
  if (sink_) r.start_us = NowMicros();
  // Compiled code below may divide its stages among idle workers.
  Team team(&helpers_, step_threads);
  ScopedTeam scoped_team(&team);
  Prepare(r);
  if (!r.cacheable) return RunInterpreter(r);
  // (3) Look the slot up; one this engine never had may be on disk.
  SlotPtr slot = cache.Find(r.key);
  if (!slot && disk_) slot = LoadFromDisk(r);
  // (4) Ready: run the compiled code.
  if (slot && slot->Load() == SlotState::kReady) {
    // How much faster a specialization is than the generic code that served
    // its signature before: its second run (the first pays for first touches).
    const bool measure = slot->generic_us.load(std::memory_order_relaxed) > 0;
    const int64_t start = measure ? NowMicros() : 0;
    if (auto out = RunCompiled(r, *slot)) {
      if (measure && slot->runs_compiled.fetch_add(1, std::memory_order_relaxed) == 1) {
        r.entry.admission.SpecializationRan(NowMicros() - start, slot->generic_us.exchange(0, std::memory_order_relaxed));
      }
      return std::move(*out);
    }
  }
  // (5) The structure-generic tier: code shared by every structure. A
  // signature that keeps coming back gets its own specialization too.
  if (options.generic) {
    const int64_t generic_start = NowMicros();
    if (auto out = RunGeneric(r)) {
      if (options.specialize_after_calls > 0 && !(slot && slot->Load() == SlotState::kReady)) {
        Miss(r, std::move(slot), options.specialize_after_calls, NowMicros() - generic_start);
      }
      return std::move(*out);
    }
  }
  // (6) A miss: queue a job per policy.
  if (SlotPtr ready = MissAndSyncWait(r, std::move(slot))) {
    if (auto out = RunCompiled(r, *ready)) return std::move(*out);
  }
  // (7) Tier 0.
  return RunInterpreter(r);
}

std::optional<ValueAndGrad> EngineImpl::RunCompiled(Request& r, Slot& slot) {
  int64_t start = r.start_us;
  // Our own reference: eviction or invalidation may unlink the slot while
  // this call runs, but the code stays until the last holder lets go.
  ExecutablePtr exec = slot.exec;
  // Baseline code is swapped for native code inside the executable (jit/tiered.h):
  // which ran is what it says now.
  const std::string_view tier = exec->tier();
  std::string failure;
  ValueAndGrad out;
  try {
    // Flatten, run, rebuild (ir/abi.h).
    std::vector<size_t> first;
    std::vector<Tensor> leaves = signatures.Flatten(r.args, r.static_args, &first);
    const int64_t run_start = tier == kKernelPlanTier ? NowMicros() : 0;
    std::vector<Tensor> results = exec->Run(leaves);
    if (run_start) slot.rent_ns.fetch_add((NowMicros() - run_start) * 1000, std::memory_order_relaxed);
    out = FromResults(exec->result_type(), r.args, r.wrt, leaves, first, slot.gradient_result, results);
  } catch (const Interrupted&) {
    throw;  // the caller's stop: the code is not at fault
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    FailCompiledRun(r, slot, failure);
    return std::nullopt;
  }
  Count(r.entry.hits);
  Count(tier == "residual-interpreter" ? r.entry.calls_residual
        : tier == kKernelPlanTier      ? r.entry.calls_baseline
                                       : r.entry.calls_native);
  if (sink_) {
    int64_t end = NowMicros();
    if (On(EventKind::kHit)) {
      Event e = Make(EventKind::kHit, r.entry.name, &r.key.signature, start);
      e.fields.push_back({"tier", std::string(tier)});
      Emit(e);
    }
    if (On(EventKind::kCall)) {
      Event e = Make(EventKind::kCall, r.entry.name, &r.key.signature, start, end - start);
      e.fields.push_back({"tier", std::string(tier)});
      e.fields.push_back({"mode", std::string(r.wrt ? "grad" : "value")});
      e.fields.push_back({"threads", static_cast<int64_t>(Team::Current()->threads_used())});
      Emit(e);
    }
  }
  return out;
}

SlotPtr EngineImpl::MissAndSyncWait(Request& r, SlotPtr slot) {
  slot = Miss(r, std::move(slot));
  if (!slot || options.policy.kind != Policy::Kind::kSync) return nullptr;
  Wait(*slot);
  return slot->Load() == SlotState::kReady ? slot : nullptr;
}

void EngineImpl::FailCompiledRun(Request& r, Slot& slot, const std::string& failure) {
  // Failure isolation: this call and later ones go to the other tiers, which
  // give the same answer or the proper error.
  if (!cache.FailReady(slot, "run: " + failure)) return;
  Count(r.entry.failed);
  if (On(EventKind::kFailed)) {
    Event e = Make(EventKind::kFailed, r.entry.name, &r.key.signature);
    e.fields.push_back({"reason", slot.reason});
    Emit(e);
  }
  NotifyWaiters();
}

void EngineImpl::EmitBackward(const std::string& entry, const std::string& signature, const char* tier,
                              int64_t start_us) const {
  if (!On(EventKind::kCall)) return;
  Event e = MakeEvent(EventKind::kCall, entry, signature, start_us, NowMicros() - start_us);
  e.fields.push_back({"tier", std::string(tier)});
  e.fields.push_back({"mode", std::string("backward")});
  Emit(e);
}

ValueAndPullback EngineImpl::RunPullback(Request& r) {
  if (sink_) r.start_us = NowMicros();
  Team team(&helpers_, step_threads);
  ScopedTeam scoped_team(&team);
  Prepare(r);
  if (r.cacheable) {
    r.key.mode = "pullback:" + r.key.mode;  // its own code and refusals, apart from grad mode's
    // The steps of Run: this signature's own code when ready; the generic
    // tier (a signature that keeps coming back gets its own code too); a
    // miss queues a job per policy; tier 0.
    SlotPtr slot = cache.Find(r.key);
    if (slot && slot->Load() == SlotState::kReady) {
      if (auto out = RunCompiledPullback(r, *slot)) return std::move(*out);
    }
    if (options.generic) {
      const int64_t generic_start = NowMicros();
      if (auto out = RunGenericPullback(r)) {
        if (options.specialize_after_calls > 0 && !(slot && slot->Load() == SlotState::kReady)) {
          // What the call costs on the generic tier, for admission: its
          // backward runs later, and costs about what its forward did (2.0
          // against 2.3 ms for the Tree-LSTM's @roots, bench/RESULTS.md).
          Miss(r, std::move(slot), options.specialize_after_calls, 2 * (NowMicros() - generic_start));
        }
        return std::move(*out);
      }
    }
    if (SlotPtr ready = MissAndSyncWait(r, std::move(slot))) {
      if (auto out = RunCompiledPullback(r, *ready)) return std::move(*out);
    }
  }
  // Tier 0: the tape, kept.
  const int64_t start = r.start_us;
  Count(r.entry.calls_interpreter);
  ValueAndPullback out = interpreter_.CallWithPullback(*r.snapshot, r.entry.name, r.args, *r.wrt);
  out.tier = "interpreter";
  if (On(EventKind::kCall)) {
    Event e = Make(EventKind::kCall, r.entry.name, r.cacheable ? &r.key.signature : nullptr, start,
                   NowMicros() - start);
    e.fields.push_back({"tier", std::string("interpreter")});
    e.fields.push_back({"mode", std::string("pullback")});
    Emit(e);
  }
  if (sink_) {
    out.pullback = [this, pullback = std::move(out.pullback), name = r.entry.name,
                    signature = r.cacheable ? r.key.signature.ShortHash() : std::string()](const Value& cotangent) {
      const int64_t start = NowMicros();
      std::vector<Value> grads = pullback(cotangent);
      EmitBackward(name, signature, "interpreter", start);
      return grads;
    };
  }
  return out;
}

std::optional<ValueAndPullback> EngineImpl::RunCompiledPullback(Request& r, Slot& slot) {
  const int64_t start = r.start_us;
  auto exec = std::dynamic_pointer_cast<const PullbackExecutable>(slot.exec);
  if (!exec) return std::nullopt;  // a pullback slot holds what CompilePullback made
  std::string failure;
  ValueAndPullback out;
  try {
    std::vector<size_t> first;
    std::vector<Tensor> leaves = signatures.Flatten(r.args, r.static_args, &first);
    PullbackExecutable::Forward forward = exec->RunForward(leaves);
    size_t pos = 0;
    out.value = ValueFromTensors(exec->result_type(), forward.results, pos);
    out.tier = exec->tier();
    // What the backward reads, once; shared by the function's copies.
    struct Kept {
      std::vector<Tensor> residuals;
      bool used = false;
    };
    auto kept = std::make_shared<Kept>(Kept{std::move(forward.residuals)});
    out.pullback = [this, exec, kept, leaves = std::move(leaves), first = std::move(first), value = out.value,
                    args = r.args, wrt = *r.wrt, snapshot = r.snapshot, name = r.entry.name,
                    signature = r.key.signature.ShortHash()](const Value& cotangent) {
      std::vector<Tensor> seeds = CotangentLeaves(value, cotangent, "@" + name);
      if (kept->used) throw std::logic_error("@" + name + ": a pullback runs once");
      kept->used = true;
      const int64_t begin = sink_ ? NowMicros() : 0;
      std::vector<Value> grads;
      try {
        Team team(&helpers_, step_threads);
        ScopedTeam scoped_team(&team);
        grads = GradsFromLeaves(args, wrt, leaves, first,
                                exec->RunBackward(leaves, seeds, std::move(kept->residuals)));
      } catch (const Interrupted&) {
        throw;
      } catch (const std::exception& e) {
        // A fault of the compiled backward: tier 0 answers, computing the forward again.
        if (On(EventKind::kFailed)) {
          Event ev = MakeEvent(EventKind::kFailed, name, signature, 0, 0);
          ev.fields.push_back({"reason", std::string("pullback's backward: ") + e.what()});
          Emit(ev);
        }
        return interpreter_.CallWithPullback(*snapshot, name, args, wrt).pullback(cotangent);
      }
      if (sink_) EmitBackward(name, signature, exec->tier(), begin);
      return grads;
    };
  } catch (const Interrupted&) {
    throw;
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    FailCompiledRun(r, slot, failure);
    return std::nullopt;
  }
  Count(r.entry.hits);
  Count(r.entry.calls_native);
  if (On(EventKind::kCall)) {
    Event e = Make(EventKind::kCall, r.entry.name, &r.key.signature, start, NowMicros() - start);
    e.fields.push_back({"tier", std::string(exec->tier())});
    e.fields.push_back({"mode", std::string("pullback")});
    e.fields.push_back({"threads", static_cast<int64_t>(Team::Current()->threads_used())});
    Emit(e);
  }
  return out;
}

ValueAndGrad EngineImpl::RunInterpreter(Request& r) {
  int64_t start = r.start_us;
  Count(r.entry.calls_interpreter);
  ValueAndGrad out;
  if (r.wrt) {
    out = interpreter_.CallWithGrad(*r.snapshot, r.entry.name, r.args, *r.wrt);
  } else {
    out.value = interpreter_.Call(*r.snapshot, r.entry.name, r.args);
  }
  if (On(EventKind::kCall)) {
    Event e = Make(EventKind::kCall, r.entry.name, r.cacheable ? &r.key.signature : nullptr, start,
                   NowMicros() - start);
    e.fields.push_back({"tier", std::string("interpreter")});
    e.fields.push_back({"mode", std::string(r.wrt ? "grad" : "value")});
    Emit(e);
  }
  return out;
}

SlotPtr EngineImpl::Insert(Request& r, SlotState initial, bool* inserted) {
  std::vector<Eviction> evicted;
  SlotPtr slot =
      cache.FindOrInsert(r.key, r.entry.name, initial, r.snapshot->generation(), module, inserted, &evicted);
  ReportEvictions(evicted);
  return slot;
}

SlotPtr EngineImpl::Miss(Request& r, SlotPtr slot, int hot_calls, int64_t generic_us) {
  const bool served = hot_calls > 0;  // another tier (the generic one) served this call
  if (!served) Count(r.entry.misses);
  if (!served && On(EventKind::kMiss)) {
    Event e = Make(EventKind::kMiss, r.entry.name, &r.key.signature);
    e.fields.push_back({"state", std::string(slot ? SlotStateName(slot->Load()) : "new")});
    e.fields.push_back({"policy", options.policy.ToString()});
    e.fields.push_back({"queue", static_cast<int64_t>(queue.size())});
    Emit(e);
  }
  bool hot = served || options.policy.kind == Policy::Kind::kHot;
  if (!served) hot_calls = options.policy.hot_calls;
  // Under sync the caller waits for the job (not when another tier served it).
  JobPriority priority = options.policy.kind == Policy::Kind::kSync && !served ? JobPriority::kWait : JobPriority::kMiss;
  bool inserted = false;
  if (!slot) {
    slot = Insert(r, hot ? SlotState::kCold : SlotState::kPending, &inserted);
    if (!slot) return nullptr;  // raced with an edit: this call's definitions are already gone
    if (inserted && !hot) {
      Enqueue(r, slot, priority);
      return slot;
    }
  }
  if (served) {
    slot->generic_us.store(generic_us, std::memory_order_relaxed);
    slot->generic_ops.store(r.generic_ops, std::memory_order_relaxed);
    if (int64_t never = 0; slot->first_call_us.load(std::memory_order_relaxed) == 0) {
      slot->first_call_us.compare_exchange_strong(never, NowMicros(), std::memory_order_relaxed);
    }
  }
  SlotState state = slot->Load();
  if (state == SlotState::kPending) {
    queue.Requeue(slot.get(), priority);  // most recently missed first
    // Its code is wanted again and again: a job at the workers' lower
    // priority gets a tenth of a core beside another busy process, and
    // every call meanwhile takes tier 0. Such a job runs at the caller's
    // priority (best effort: raising a thread's needs privileges). Not the
    // job of a signature the generic tier serves: there it only speeds up
    // what already runs compiled.
    if (!served && slot->pending_misses.fetch_add(1, std::memory_order_relaxed) + 1 >= kBoostAfterMisses) {
      Boost(r, *slot);
    }
  } else if (state == SlotState::kCold) {
    int64_t calls = slot->calls.fetch_add(1, std::memory_order_relaxed) + 1;
    if (served) {
      if (calls >= hot_calls && Admit(r, *slot, calls) && !Promote(r, slot, priority)) {
        JobEnded(*slot, -1);  // another call promoted it first: this admission queued nothing
      }
    } else if (!hot || calls >= hot_calls) {
      Promote(r, slot, priority);
    }
  }
  return slot;
}

void EngineImpl::Boost(Request& r, Slot& slot) {
  const int thread = slot.job_thread.load(std::memory_order_acquire);
  if (thread == 0 || slot.boosted.exchange(true, std::memory_order_relaxed)) return;  // not running yet, or done
  const bool raised = SetThreadNice(thread, CurrentThreadNice());
  if (On(EventKind::kAdmission)) {
    Event e = Make(EventKind::kAdmission, r.entry.name, &r.key.signature);
    e.fields.push_back({"decision", std::string("boost")});
    e.fields.push_back({"reason", std::to_string(slot.pending_misses.load(std::memory_order_relaxed)) +
                                      " calls missed it while it compiled: its job runs at the caller's priority" +
                                      (raised ? "" : " (refused by the system)")});
    e.fields.push_back({"mode", r.key.mode});
    Emit(e);
  }
}

bool EngineImpl::Admit(Request& r, Slot& slot, int64_t calls) {
  // A result that holds structures stays with the generic tier, which
  // serves it: its job would only be refused.
  if (!CompilesResult(AsFunc(r.snapshot->Get(r.entry.name).type)->ret, r.wrt != nullptr, r.pullback)) {
    if (On(EventKind::kAdmission)) {
      Event e = Make(EventKind::kAdmission, r.entry.name, &r.key.signature);
      e.fields.push_back({"decision", std::string("postpone")});
      e.fields.push_back({"reason", std::string("its result holds structures: per-minibatch code returns tensors only")});
      e.fields.push_back({"mode", r.key.mode});
      e.fields.push_back({"calls", calls});
      Emit(e);
    }
    return false;
  }
  const int64_t now = NowMicros();
  Admission::Decision d = r.entry.admission.Decide({calls, slot.first_call_us.load(std::memory_order_relaxed), now,
                                                    slot.generic_us.load(std::memory_order_relaxed), now - started_us_,
                                                    slot.generic_ops.load(std::memory_order_relaxed)});
  if (d.admit) slot.admitted.store(true, std::memory_order_relaxed);
  if (On(EventKind::kAdmission)) {
    Event e = Make(EventKind::kAdmission, r.entry.name, &r.key.signature);
    e.fields.push_back({"decision", std::string(d.admit ? "admit" : "postpone")});
    e.fields.push_back({"reason", d.reason});
    e.fields.push_back({"mode", r.key.mode});
    e.fields.push_back({"calls", calls});
    e.fields.push_back({"interval_us", static_cast<int64_t>(d.interval_us)});
    e.fields.push_back({"saving_us", static_cast<int64_t>(d.saving_us)});
    e.fields.push_back({"benefit_us", static_cast<int64_t>(d.benefit_us)});
    e.fields.push_back({"job_us", static_cast<int64_t>(d.job_us)});
    e.fields.push_back({"ops", slot.generic_ops.load(std::memory_order_relaxed)});
    e.fields.push_back({"pending", d.pending});
    Emit(e);
  }
  return d.admit;
}

bool EngineImpl::Promote(Request& r, const SlotPtr& slot, JobPriority priority) {
  SlotState cold = SlotState::kCold;
  // Only the thread that moves the slot out of cold queues its job (guarantee c).
  if (!slot->state.compare_exchange_strong(cold, SlotState::kPending, std::memory_order_acq_rel))
    return false;
  Enqueue(r, slot, priority);
  return true;
}

void EngineImpl::Enqueue(Request& r, const SlotPtr& slot, JobPriority priority) {
  auto job = std::make_shared<Job>();
  job->slot = slot;
  job->snapshot = r.snapshot;
  job->args = r.args;
  job->static_args = r.static_args;
  // A static argument's values are baked into the code, which is keyed by
  // them as they were at the call: the job reads its own copy, so that a
  // caller who changes the array afterwards (a numpy array the call shared)
  // cannot make code of other values under this key.
  for (size_t i = 0; i < job->args.size() && i < job->static_args.size(); ++i) {
    if (!job->static_args[i]) continue;
    std::vector<Value> copies;
    for (const Tensor& t : TensorLeaves(job->args[i])) copies.emplace_back(t.Clone());
    job->args[i] = ReplaceTensorLeaves(job->args[i], copies);
  }
  job->grad = r.wrt != nullptr;
  job->pullback = r.pullback;
  if (r.wrt) job->wrt = *r.wrt;
  job->enqueued_us = NowMicros();
  job->id = next_job_id.fetch_add(1, std::memory_order_relaxed);
  int64_t id = job->id;
  if (!queue.Push(std::move(job), priority)) return;
  if (On(EventKind::kEnqueue)) {
    Event e = Make(EventKind::kEnqueue, r.entry.name, &r.key.signature);
    e.fields.push_back({"job", id});
    e.fields.push_back({"priority", std::string(JobPriorityName(priority))});
    e.fields.push_back({"queue", static_cast<int64_t>(queue.size())});
    e.fields.push_back({"mode", r.key.mode});
    Emit(e);
  }
  Spawn();
}

void EngineImpl::Spawn() {
  // One task per queued job; each takes whichever job is most urgent when it
  // starts, so TBB's own (FIFO) order does not matter.
  HandToWorker(/*job=*/true, &EngineImpl::RunOneJob);
}

void EngineImpl::RunOneJob() { RunOneWaiting(/*background=*/true); }

void EngineImpl::HandToWorker(bool job, void (EngineImpl::*body)()) {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    ++outstanding_;
    if (job) jobs_in_flight_.fetch_add(1, std::memory_order_relaxed);
  }
  TsanRelease(&task_handoff);
  // The task holds nothing to destroy after its last touch of `this` (no
  // std::function: TBB frees the task after it returns, by then the engine
  // may be gone).
  arena_.enqueue([this, job, body] {
    TsanAcquire(&task_handoff);
    (this->*body)();
    // The last touch of `this`: under the lock, so the destructor cannot see
    // zero and free the engine before notify_all returns.
    std::lock_guard<std::mutex> lock(tasks_mu_);
    if (job) jobs_in_flight_.fetch_sub(1, std::memory_order_relaxed);
    --outstanding_;
    tasks_cv_.notify_all();  // the destructor waits for 0, Drain for any change
  });
}

bool EngineImpl::RunOneWaiting(bool background) {
  // The work order, most urgent first:
  //   1. a specialization job a caller waits for (policy sync, wait_ready),
  //      then the native code of a specialization one waits for;
  //   2. the walk of a prefetched next call (the call may wait for it);
  //   3. a generic segment variant's compile (every later minibatch runs it);
  //   4. specialization jobs prefetched next or missed (job_queue.h's order);
  //   5. native code for specializations published with baseline code;
  //   6. walks prefetched for some later time, then jobs prefetched so;
  //   7. optimized code for generic variants that run quick native code.
  std::optional<GenericWalk> walk;
  std::optional<GenericCompile> compile;
  auto take = [](auto& queue, auto& into) {
    if (queue.empty()) return false;
    into = std::move(queue.front());
    queue.pop_front();
    return true;
  };
  std::optional<TierUpJob> tier_up;
  auto take_walk = [&](std::deque<GenericWalk>& walks) {
    if (!take(walks, walk)) return false;
    walking_.emplace_back(walk->entry, walk->structures);
    return true;
  };
  JobPtr job = queue.Pop(JobPriority::kWait);
  const bool waited = job != nullptr;
  if (!job) {
    std::unique_lock<std::mutex> lock(generic_queue_mu_);
    if (!TakeTierUp(tier_up, /*wanted_only=*/true) && !take_walk(walks_next_) && !take(generic_queue_, compile)) {
      lock.unlock();
      job = queue.Pop(JobPriority::kMiss);
      if (!job) {
        lock.lock();
        if (!TakeTierUp(tier_up, /*wanted_only=*/false)) take_walk(walks_idle_);
      }
    }
  }
  const int nice = background ? options.worker_nice : 0;
  if (walk) {
    // At the caller's priority: its call may wait for this walk.
    RunGenericWalk(*walk);
    std::lock_guard<std::mutex> lock(generic_queue_mu_);
    walking_.erase(std::find(walking_.begin(), walking_.end(), std::make_pair(walk->entry, walk->structures)));
    walked_cv_.notify_all();
    return true;
  }
  if (compile) {
    // At the caller's priority too: a segment variant's code serves every
    // later minibatch. Lowered, beside another busy process, the worker
    // got a tenth of a core: the module network's epoch 0 gained (0.75x ->
    // 0.93x the interpreter, its runs on baseline code meanwhile), but the
    // Child-Sum Tree-LSTM's fell by a fifth, its first compiles (LLVM's
    // warm-up among them) started by prefetches before any run had paid
    // for them (bench/RESULTS.md, "Issue 51").
    RunGenericCompile(*compile);
    return true;
  }
  if (tier_up) {
    // The calls it speeds up run already, on baseline code: it yields to
    // them until the rent rule says otherwise (engine_impl.h); a caller
    // waiting for it takes it at its own priority.
    const Slot& slot = *tier_up->slot;
    const bool urgent =
        slot.tier_up_wanted.load() || slot.rent_ns.load(std::memory_order_relaxed) / 1000 >= tier_up_.Us();
    ScopedLowerPriority lowered(urgent ? 0 : nice);
    RunTierUp(*tier_up, nice > 0 && !urgent);
    return true;
  }
  if (!job) job = queue.Pop();
  if (job) {
    ScopedLowerPriority lowered(options.policy.kind == Policy::Kind::kSync ? 0 : nice);
    RunJob(*job, waited || options.policy.kind == Policy::Kind::kSync);
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(generic_queue_mu_);
    if (!take(generic_optimize_, compile)) return false;
  }
  // Optimized code replacing quick code speeds up what runs natively
  // already: in the background.
  ScopedLowerPriority lowered(nice);
  RunGenericCompile(*compile);
  return true;
}

void EngineImpl::Drain(const std::function<void(int64_t)>& progress) {
  auto left = [&] {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    return outstanding_;
  };
  // The caller's core compiles too rather than sleep (the work's own task,
  // when a worker takes it, finds nothing left and ends).
  int64_t reported = -1;
  while (!stopping_.load() && RunOneWaiting(/*background=*/false)) {
    if (progress) progress(reported = left());
  }
  std::unique_lock<std::mutex> lock(tasks_mu_);
  int64_t seen = outstanding_;
  while (outstanding_ > 0) {
    WaitInterruptibly(tasks_cv_, lock, [&] { return outstanding_ != seen; });
    seen = outstanding_;
    if (progress) {
      lock.unlock();
      progress(reported = seen);
      lock.lock();
    }
  }
  // The last report is the end, even when the tasks counted above ended
  // before this thread looked again.
  lock.unlock();
  if (progress && reported != 0) progress(0);
}

void EngineImpl::Cancel(Job& job, const char* why) {
  Slot& slot = *job.slot;
  EntryState& entry = *slot.key.entry;
  ReportEvictions(cache.Fail(slot, std::string("cancelled: ") + why));
  Count(entry.cancelled);
  JobEnded(slot, -1);
  if (On(EventKind::kCancel)) {
    Event e = Make(EventKind::kCancel, entry.name, &slot.key.signature);
    e.fields.push_back({"job", job.id});
    e.fields.push_back({"reason", std::string(why)});
    Emit(e);
  }
  Settle(slot);
}

bool EngineImpl::TakeTierUp(std::optional<TierUpJob>& into, bool wanted_only) {
  for (auto it = tier_up_queue_.begin(); it != tier_up_queue_.end(); ++it) {
    if (wanted_only && !it->slot->tier_up_wanted.load(std::memory_order_acquire)) continue;
    into = std::move(*it);
    tier_up_queue_.erase(it);
    return true;
  }
  return false;
}

void EngineImpl::RunJob(Job& job, bool waited) {
  Slot& slot = *job.slot;
  EntryState& entry = *slot.key.entry;
  const Signature& sig = slot.key.signature;
  // (J1) Drop out when nobody can use the result.
  SlotDrop dropped = slot.dropped.load(std::memory_order_acquire);
  if (stopping_.load()) return Cancel(job, "the engine shut down");
  if (dropped == SlotDrop::kInvalidated) return Cancel(job, "a definition it uses changed");
  JobTimes times;
  times.enqueued = job.enqueued_us;
  times.start = NowMicros();
  // For Boost while it runs. A boost racing with the job's end may raise
  // the worker's next job too, at worst.
  struct RunningOn {
    Slot& slot;
    explicit RunningOn(Slot& s) : slot(s) { slot.job_thread.store(CurrentThreadId(), std::memory_order_release); }
    ~RunningOn() { slot.job_thread.store(0, std::memory_order_release); }
  } running_on(slot);
  const JobEvents events(sink_, entry.name, sig, job.id);
  const char* stage = "arguments";
  ExecutablePtr exec;
  std::vector<int> gradient_result;  // grad mode: Slot::gradient_result
  CompileNotes notes;
  PipelineReport prepared;
  try {
    const Definition& def = job.snapshot->Get(entry.name);
    CheckArguments(*job.snapshot, entry.name, *def.func, job.args);
    stage = "result";
    const FuncTypeNode* type = AsFunc(def.type);
    if (!CompilesResult(type->ret, job.grad, job.pullback)) {
      throw JitFailure("@" + entry.name + " returns " + TypeToString(type->ret) +
                       "; only results of tensors nested in tuples are compiled");
    }
    // (J2) Code an earlier run stored (a prefetched signature, loaded on
    // the worker instead of compiled); else partial evaluation on the
    // call's own snapshot.
    if (disk_ && !job.pullback) {  // a pullback's two programs are not kept on disk
      stage = "cache";
      if (std::optional<DiskHit> hit = LoadImage(entry, *job.snapshot, slot.key, job.args, job.static_args,
                                                 job.grad ? &job.wrt : nullptr, job.id)) {
        ReportEvictions(cache.Publish(slot, hit->exec, std::move(hit->gradient_result)));
        JobEnded(slot, -1);
        Settle(slot);
        return;
      }
    }
    stage = "pe";
    if (options.before_pe) options.before_pe(CompileInfo{entry.name, sig, job.grad, job.wrt});
    int64_t start = NowMicros();
    Residual residual =
        PartialEvaluate(*job.snapshot, entry.name, job.args, job.static_args, options.pe, &pe_cache);
    times.pe_us = NowMicros() - start;
    events.Pe(start, times.pe_us, residual.stats);
    // (J3) Batching and, in grad mode, autodiff (jit/pipeline.h), both of
    // straight-line code. A residual with control flow (a dynamic `if`, a
    // loop the data ends) stays as it is, and the compile hook decides what
    // it can do with it, differentiating it too (CompileTask).
    const bool differentiate = job.grad && !job.pullback;  // the pullback's split comes after the pipeline
    CallLayout layout = LayoutOf(type->ret, job.args, job.static_args, differentiate ? &job.wrt : nullptr);
    const size_t expected_results = layout.results;
    gradient_result = std::move(layout.gradient_result);
    PipelineOptions pipeline;
    pipeline.batch = options.batch;
    pipeline.compile = options.compile_options;  // the instrument sees these passes too
    // Baseline code first, unless a caller waits for native code, or the
    // generic tier serves the signature (compiled already: its own
    // specialization is only worth running natively).
    const bool served = slot.generic_us.load(std::memory_order_relaxed) > 0;
    CompileTask task{residual, std::nullopt, slot.key.entry->name, options.batch,
                     options.baseline_first && !waited && !served};
    if (differentiate) {
      (HasControlFlow(residual.main) ? task.differentiate : pipeline.wrt_leaves) = std::move(layout.wrt_leaves);
    }
    // A program that is not straight-line code stays unbatched; what
    // throws here is batching or autodiff, which `prepared.stage` names.
    stage = kPipelineStage;
    start = NowMicros();
    residual.main = PrepareResidual(residual.main, pipeline, &prepared);
    if (prepared.batched) {
      times.batch_us = static_cast<int64_t>(prepared.batch_ms * 1e3);
      events.Batch(start, times.batch_us, prepared.batch);
    }
    if (pipeline.wrt_leaves) {
      times.autodiff_us = static_cast<int64_t>(prepared.autodiff_ms * 1e3);
      events.Autodiff(start + std::max<int64_t>(times.batch_us, 0), times.autodiff_us, pipeline.wrt_leaves->size());
    }
    // (J4) Compile. A hook that returns nothing or the wrong results is
    // broken (failed), not a program the compilers decline (refused).
    stage = "compile";
    if (options.before_compile) options.before_compile(CompileInfo{entry.name, sig, job.grad, job.wrt});
    start = NowMicros();
    exec = job.pullback ? CompilePullback(job, residual.main) : compile_(task, notes);
    int64_t end = NowMicros();
    times.compile_us = end - start;
    if (!exec) throw std::logic_error("the compile hook returned no executable");
    if (!IsTensorTree(exec->result_type()) || CountTensorLeaves(exec->result_type()) != expected_results) {
      throw std::logic_error("the compiled code returns " + TypeToString(exec->result_type()) + ", expected " +
                             std::to_string(expected_results) + " tensors");
    }
    events.Compile(start, end, *exec, notes);
  } catch (...) {
    // Refused: a program outside what PE and the compilers take (a limit or
    // a construct they decline). Failed: anything else that threw, including
    // std::bad_alloc and a hook's exception of any type: the worker lives on.
    bool refused = false;
    std::string what;
    try {
      throw;
    } catch (const Refusal& ex) {
      refused = true;
      what = ex.what();
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
      what = "an exception that is not a std::exception";
    }
    std::string reason = std::string(stage == kPipelineStage ? prepared.stage : stage) + ": " + what;
    ReportEvictions(cache.Fail(slot, reason));
    Count(refused ? entry.refused : entry.failed);
    events.End(refused, times, slot.key.mode, reason);
    JobEnded(slot, NowMicros() - times.start);
    Settle(slot);
    return;
  }
  // (J5) The swap, and (J6) eviction. Waiters wake after the evictions are
  // counted and the evicted slots released by this thread (and, for
  // baseline code, after its tier-up).
  if (!notes.tier_ups.empty()) slot.tiering.store(true, std::memory_order_release);
  {
    std::vector<Eviction> evicted = cache.Publish(slot, exec, std::move(gradient_result));
    Count(entry.compiled);
    events.Swap(times, slot.tier, slot.key.mode, job.grad, slot.bytes, notes);
    ReportEvictions(evicted);
  }
  JobEnded(slot, NowMicros() - times.start);
  Settle(slot);
  if (!notes.tier_ups.empty()) {
    TierUpJob up{job.slot, std::move(notes.tier_ups), job.id, std::nullopt};
    // The slot's own code is tiered (a straight-line specialization): stored once native.
    if (disk_ && up.tier_ups.front().exec == exec) up.store = DiskKeyOf(entry, *job.snapshot, slot.key);
    {
      std::lock_guard<std::mutex> lock(generic_queue_mu_);
      tier_up_queue_.push_back(std::move(up));
    }
    Spawn();
  } else if (disk_ && !job.pullback) {
    StoreToDisk(job, slot, exec);
  }
}

ExecutablePtr EngineImpl::CompilePullback(const Job& job, const Func& residual) {
  if (!jit_) throw JitFailure("pullbacks compile with the engine's own compiler, not a compile hook");
  // The parameters not differentiated: every leaf but the wrt arguments' float ones.
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(job.args, job.static_args, &first);
  std::vector<bool> constant(leaves.size(), true);
  for (int leaf : FloatWrtLeaves(leaves, first, job.wrt)) constant[leaf] = false;
  CompileOptions options = CompileOptionsFor(job.slot->entry_name);
  options.store = nullptr;  // kept by signature, not by text, and not on disk
  return PullbackExecutable::Compile(*jit_, residual, constant, options);
}

void EngineImpl::RunTierUp(TierUpJob& job, bool lowered) {
  Slot& slot = *job.slot;
  struct Done {  // wakes wait_ready however this ends
    EngineImpl& engine;
    Slot& slot;
    ~Done() {
      slot.tiering.store(false, std::memory_order_release);
      engine.NotifyWaiters();
    }
  } done{*this, slot};
  if (stopping_.load() || slot.dropped.load(std::memory_order_acquire) != SlotDrop::kNone) return;
  const int64_t start = NowMicros();
  const double cpu_start = ThreadCpuSeconds();
  std::string failure;
  size_t code_bytes = 0;
  for (TierUp& up : job.tier_ups) {
    try {
      ExecutablePtr native = up.compile();
      code_bytes += native->code_bytes();
      if (job.store) WriteToDisk(*job.store, slot.entry_name, &slot.key.signature, *native, job.job);
      up.exec->Replace(std::move(native));
    } catch (const std::exception& e) {
      failure = e.what();  // this program keeps its baseline code
    }
  }
  // Its cost is the CPU it took: its wall time grows with how little CPU a
  // lowered worker got, and would raise the bar its own rent must pass.
  tier_up_.Add(static_cast<int64_t>((ThreadCpuSeconds() - cpu_start) * 1e6));
  ReportEvictions(cache.Recount(slot));
  if (On(EventKind::kTierUp)) {
    Event e = Make(EventKind::kTierUp, slot.entry_name, &slot.key.signature, start, NowMicros() - start);
    e.fields.push_back({"job", job.job});
    e.fields.push_back({"programs", static_cast<int64_t>(job.tier_ups.size())});
    e.fields.push_back({"code_bytes", static_cast<int64_t>(code_bytes)});
    if (!failure.empty()) e.fields.push_back({"reason", failure});
    e.fields.push_back({"rent_us", slot.rent_ns.load(std::memory_order_relaxed) / 1000});
    e.fields.push_back({"priority", std::string(lowered ? "lowered" : "caller")});
    Emit(e);
  }
}

void EngineImpl::ReportEvictions(const std::vector<Eviction>& evicted) {
  for (const Eviction& ev : evicted) {
    EntryState& entry = *ev.slot->key.entry;
    bool ready = ev.slot->Load() == SlotState::kReady;
    if (ready) Count(entry.evicted);
    if (On(EventKind::kEvict)) {
      Event e = Make(EventKind::kEvict, entry.name, &ev.slot->key.signature);
      e.fields.push_back({"reason", std::string(ev.reason)});
      e.fields.push_back({"state", std::string(SlotStateName(ev.slot->Load()))});
      e.fields.push_back({"bytes", static_cast<int64_t>(ready ? ev.slot->bytes : 0)});
      Emit(e);
    }
  }
}

void EngineImpl::OnEdit(const ModuleEdit& edit) {
  std::vector<SlotPtr> dropped = cache.Invalidate(edit);
  std::map<EntryState*, int64_t> per_entry;
  for (const SlotPtr& slot : dropped) per_entry[slot->key.entry]++;
  int64_t retained = cache.Retain(dropped);
  std::string changed;
  for (const std::string& name : edit.changed) changed += (changed.empty() ? "@" : ", @") + name;
  if (On(EventKind::kEdit)) {
    Event e = Make(EventKind::kEdit, "", nullptr);
    const char* kind = edit.kind == ModuleEdit::Kind::kAdd       ? "add"
                       : edit.kind == ModuleEdit::Kind::kReplace ? "replace"
                                                                 : "remove";
    e.fields.push_back({"kind", std::string(kind)});
    e.fields.push_back({"definitions", changed});
    std::string affected;
    for (const std::string& name : edit.affected) affected += (affected.empty() ? "@" : ", @") + name;
    e.fields.push_back({"affected", affected});
    e.fields.push_back({"slots", static_cast<int64_t>(dropped.size())});
    e.fields.push_back({"retained", retained});
    Emit(e);
  }
  for (const auto& [entry, n] : per_entry) {
    Count(entry->invalidated, n);
    if (On(EventKind::kInvalidate)) {
      Event e = Make(EventKind::kInvalidate, entry->name, nullptr);
      e.fields.push_back({"definitions", changed});
      e.fields.push_back({"slots", n});
      Emit(e);
    }
  }
}

// ---- Waiting ------------------------------------------------------------------------

void EngineImpl::NotifyWaiters() {
  // Taking the lock orders this after a waiter's check of the slot state.
  { std::lock_guard<std::mutex> lock(wait_mu_); }
  wait_cv_.notify_all();
}

void EngineImpl::Settle(Slot& slot) {
  slot.settled.store(true, std::memory_order_release);
  NotifyWaiters();
}

void EngineImpl::Wait(const Slot& slot) {
  std::unique_lock<std::mutex> lock(wait_mu_);
  WaitInterruptibly(wait_cv_, lock, [&] {
    SlotState s = slot.Load();
    return (s == SlotState::kReady || s == SlotState::kFailed) && slot.settled.load(std::memory_order_acquire) &&
           !slot.tiering.load(std::memory_order_acquire);
  });
}

CodeStatus EngineImpl::StatusOf(const Slot& slot) {
  CodeStatus status;
  status.state = ToCodeState(slot.Load());
  if (status.state == CodeStatus::State::kReady) {
    status.tier = slot.exec->tier();  // what runs now: baseline code is replaced in place
    status.code_bytes = slot.exec->code_bytes();
  } else if (status.state == CodeStatus::State::kFailed) {
    status.reason = slot.reason;
  }
  return status;
}

void EngineImpl::Prefetch(Request& r, pejit::Prefetch when) {
  Prepare(r);
  if (!r.cacheable) return;
  const SlotPtr slot = cache.Find(r.key, /*touch=*/false);
  // Its specialization is ready: the call will run that, there is nothing
  // to prepare (a walk would only keep the worker from helping the steps).
  if (slot && slot->Load() == SlotState::kReady) return EmitPrefetch(r, SlotStateName(SlotState::kReady), PriorityOf(when));
  // Stored by an earlier run: a job loads it on a worker before the call.
  if (disk_ && !slot && disk_->Has(DiskKeyOf(r.entry, *r.snapshot, r.key))) return PrefetchSpecialized(r, when);
  // The generic tier serves the call: walk its structure and compile what
  // it will run, on a worker (policy sync: now, as it compiles now).
  if (options.generic && jit_ && GenericFor(r)) {
    EmitPrefetch(r, "generic", PriorityOf(when));
    if (options.policy.kind != Policy::Kind::kSync) return QueueGenericWalk(r, when);
    if (PrefetchGeneric(r, when)) return;
  }
  PrefetchSpecialized(r, when);
}

void EngineImpl::PrefetchSpecialized(Request& r, pejit::Prefetch when) {
  JobPriority priority = PriorityOf(when);
  bool inserted = false;
  SlotPtr slot = Insert(r, SlotState::kPending, &inserted);
  bool queued = false, requeued = false;
  if (slot && inserted) {
    Enqueue(r, slot, priority);
    queued = true;
  } else if (slot && slot->Load() == SlotState::kCold) {
    queued = Promote(r, slot, priority);
  } else if (slot && slot->Load() == SlotState::kPending) {
    requeued = queue.Requeue(slot.get(), priority);
  }
  if (queued) Count(r.entry.prefetched);
  EmitPrefetch(r,
               queued     ? "queued"
               : requeued ? "requeued"
               : slot     ? SlotStateName(slot->Load())
                          : "stale",
               priority);
}

void EngineImpl::EmitPrefetch(const Request& r, const std::string& state, JobPriority priority) {
  if (!On(EventKind::kPrefetch)) return;
  Event e = Make(EventKind::kPrefetch, r.entry.name, &r.key.signature);
  e.fields.push_back({"state", state});
  e.fields.push_back({"priority", std::string(JobPriorityName(priority))});
  Emit(e);
}

CodeStatus EngineImpl::WaitReady(Request& r) {
  for (;;) {
    Prepare(r);
    if (!r.cacheable) return CodeStatus{CodeStatus::State::kNone, r.uncacheable, "", 0};
    bool inserted = false;
    SlotPtr slot = Insert(r, SlotState::kPending, &inserted);
    if (!slot) continue;  // raced with an edit: again on the new snapshot
    if (inserted) {
      Enqueue(r, slot, JobPriority::kWait);
    } else if (slot->Load() == SlotState::kCold) {
      Promote(r, slot, JobPriority::kWait);
    } else if (slot->Load() == SlotState::kPending) {
      queue.Requeue(slot.get(), JobPriority::kWait);
    }
    // Published as baseline code: its native code goes first.
    slot->tier_up_wanted.store(true, std::memory_order_release);
    Wait(*slot);
    // Specialized for definitions that changed meanwhile: the next call could
    // not use it, so wait for the code of the current ones.
    if (slot->dropped.load(std::memory_order_acquire) == SlotDrop::kInvalidated && !stopping_.load())
      continue;
    return StatusOf(*slot);
  }
}

CodeStatus EngineImpl::Status(Request& r) {
  Prepare(r);
  if (!r.cacheable) return CodeStatus{CodeStatus::State::kNone, r.uncacheable, "", 0};
  SlotPtr slot = cache.Find(r.key, /*touch=*/false);
  return slot ? StatusOf(*slot) : CodeStatus{};
}

// ---- Public API ------------------------------------------------------------------------

Engine::Engine(EngineOptions options) : impl_(std::make_unique<EngineImpl>(std::move(options))) {}
Engine::~Engine() = default;

Module& Engine::module() { return impl_->module; }
const EngineOptions& Engine::options() const { return impl_->options; }

namespace {

// Throws std::invalid_argument unless every index names an argument of @name.
void CheckArgumentIndices(const std::string& name, size_t arity, const std::vector<int>& indices, const char* what) {
  for (int i : indices) {
    if (i < 0 || static_cast<size_t>(i) >= arity) {
      throw std::invalid_argument(std::string(what) + ": @" + name + " takes " + std::to_string(arity) +
                                  " arguments; there is no argument " + std::to_string(i));
    }
  }
}

}  // namespace

Entry Engine::entry(const std::string& name, EntryOptions options) {
  const Definition& def = impl_->module.snapshot()->Get(name);
  size_t arity = def.func->params.size();
  CheckArgumentIndices(name, arity, options.static_argnums, "static_argnums");
  if (options.wrt) CheckArgumentIndices(name, arity, *options.wrt, "wrt");
  std::vector<bool> static_args(arity, false);
  for (int i : options.static_argnums) static_args[i] = true;
  return Entry(impl_.get(), &impl_->State(name), std::move(static_args), std::move(options.wrt));
}

void Engine::drain(const std::function<void(int64_t left)>& progress) { impl_->Drain(progress); }

EngineStats Engine::stats() const {
  EngineStats out;
  out.code_bytes = impl_->cache.bytes();
  out.slots = impl_->cache.size();
  out.queued = impl_->queue.size();
  out.retained_bytes = impl_->cache.retained_bytes();
  out.workers = impl_->workers;
  out.step_threads = impl_->step_threads;
  out.cache_dir = impl_->CacheDir();
  for (const auto& program : impl_->GenericPrograms()) out.generic_cells += program->cells();
  for (generic::SegmentCode* code : impl_->GenericSegments()->codes()) {
    ++out.generic_segments;
    if (!code->padded.empty()) ++out.generic_padded_segments;
    std::lock_guard<std::mutex> lock(code->mu);
    for (const auto& [key, variant] : code->variants) {
      if (!variant->made) continue;  // asked for, not made yet
      ++out.generic_variants;
      if (variant->native.load()) {
        ++out.generic_native_variants;
        out.generic_code_bytes += variant->code_bytes.load();
      }
    }
  }
  return out;
}

const std::string& Entry::name() const { return state_->name; }

Entry Entry::with_grad(std::vector<int> wrt) const {
  CheckArgumentIndices(state_->name, static_args_.size(), wrt, "wrt");
  return Entry(engine_, state_, static_args_, std::move(wrt));
}

Entry Entry::without_grad() const { return Entry(engine_, state_, static_args_, std::nullopt); }

Value Entry::call(const std::vector<Value>& args) const {
  if (wrt_) {
    throw std::logic_error("@" + state_->name +
                           ": call() on a handle made for value_and_grad (wrt); take value mode's with without_grad()");
  }
  EngineImpl::Request r{*state_, static_args_, args, nullptr, {}, {}, false, {}};
  return engine_->Run(r).value;
}

ValueAndGrad Entry::value_and_grad(const std::vector<Value>& args) const {
  if (!wrt_) {
    throw std::logic_error("@" + state_->name +
                           ": value_and_grad() on a value-mode handle; make it with wrt (EntryOptions::wrt or with_grad())");
  }
  EngineImpl::Request r{*state_, static_args_, args, &*wrt_, {}, {}, false, {}};
  return engine_->Run(r);
}

ValueAndPullback Entry::value_and_pullback(const std::vector<Value>& args) const {
  if (!wrt_) {
    throw std::logic_error("@" + state_->name +
                           ": value_and_pullback() on a value-mode handle; make it with wrt (EntryOptions::wrt or "
                           "with_grad())");
  }
  EngineImpl::Request r{*state_, static_args_, args, &*wrt_, {}, {}, false, {}};
  r.pullback = true;
  return engine_->RunPullback(r);
}

void Entry::prefetch(const std::vector<Value>& args, Prefetch when) const {
  EngineImpl::Request r{*state_, static_args_, args, wrt(), {}, {}, false, {}};
  engine_->Prefetch(r, when);
}

CodeStatus Entry::wait_ready(const std::vector<Value>& args) const {
  EngineImpl::Request r{*state_, static_args_, args, wrt(), {}, {}, false, {}};
  return engine_->WaitReady(r);
}

CodeStatus Entry::status(const std::vector<Value>& args) const {
  EngineImpl::Request r{*state_, static_args_, args, wrt(), {}, {}, false, {}};
  return engine_->Status(r);
}

EntryStats Entry::stats() const {
  auto get = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  const EntryState& s = *state_;
  EntryStats out;
  out.calls_interpreter = get(s.calls_interpreter);
  out.calls_residual_interpreter = get(s.calls_residual);
  out.calls_native = get(s.calls_native);
  out.calls_baseline = get(s.calls_baseline);
  out.calls_generic = get(s.calls_generic);
  out.calls_generic_native = get(s.calls_generic_native);
  out.generic_runs = get(s.generic_runs);
  out.generic_native_runs = get(s.generic_native_runs);
  out.hits = get(s.hits);
  out.misses = get(s.misses);
  out.compiled = get(s.compiled);
  out.refused = get(s.refused);
  out.failed = get(s.failed);
  out.evicted = get(s.evicted);
  out.invalidated = get(s.invalidated);
  out.cancelled = get(s.cancelled);
  out.prefetched = get(s.prefetched);
  out.loaded = get(s.loaded);
  return out;
}

void CompileFn::RefuseUndifferentiated() {
  throw JitFailure("the compile hook takes differentiated programs only, and autodiff takes no control flow");
}

}  // namespace pejit
