// \file The code cache: one slot per specialization, the swap protocol, eviction and invalidation.
//
// A slot is one specialization: an entry, a mode (value, or grad with respect
// to some arguments), a signature (pe/signature.h) and the versions of every
// definition the entry uses (ModuleSnapshot::VersionsOf) in the snapshot the
// call runs on. Keying on the versions makes stale code unreachable the moment
// a definition changes, whatever the timing of invalidation; invalidation only
// unlinks it and counts it (the engine may keep the unlinked code a while, for
// the JIT to reuse its kernels: EngineOptions::retained_code_bytes).
//
// A call (the numbers are EngineImpl::Run's, engine.cc):
//   1. takes a module snapshot and the entry's definition versions in it
//      (cached per snapshot generation);
//   2. computes the signature of its arguments (static arguments included);
//   3. looks its slot up (a shared lock, no allocation besides the key), and
//      one this engine never had in the persistent code cache
//      (disk_cache.h), which loads it ready;
//   4. ready: copies the slot's Executable (a shared_ptr), runs it on the
//      flattened dynamic leaves, and rebuilds the result Value (in grad
//      mode, the gradients, by the slot's gradient layout); done;
//   5. the structure-generic tier (generic/program.h), where it serves the
//      entry, runs the call on code shared by every structure; a signature
//      that keeps coming back may be admitted to a job of its own
//      (admission.h); done;
//   6. otherwise, per policy: creates the slot pending and enqueues one job
//      (eager, sync, hot:N at its N-th call; never twice: only the thread
//      that creates the slot or moves it cold → pending enqueues), or moves
//      a queued job up (most recent miss first; job_queue.h);
//   7. runs tier 0, the interpreter, on the same snapshot — unless the policy
//      is sync, which waits for the slot and then goes to step 4.
// A job, on a oneTBB worker:
//   J1. drops out if its slot was invalidated or the engine is shutting down;
//   J2. partially evaluates the entry on the call's snapshot and arguments;
//   J3. batches a straight-line residual and, in grad mode, differentiates it
//       with respect to the float leaves of the wrt arguments
//       (jit/pipeline.h); a residual with control flow (a dynamic `if`, a
//       loop the data ends) stays as it is, for the compile hook to compile
//       as regions and differentiate (jit/control_flow.h);
//   J4. runs the compile hook (LLVM, or the residual interpreter; unless a
//       caller waits, baseline code first, whose LLVM compile a later
//       tier-up runs: jit/tiered.h);
//   J5. publishes: the Executable is written into the slot, then the slot's
//       state is set to ready with one release store — the swap;
//   J6. evicts least-recently-used ready slots past the byte budget and the
//       per-entry maximum.
// Any exception in J2-J4 fails the slot with its reason (one release store
// of `failed` after the reason is written); failed slots are not retried
// until an edit drops them.
//
// What the swap protocol guarantees:
//   a. A call sees either no code (runs tier 0) or a whole Executable: the
//      Executable and its result type are written before the release store
//      of `ready` and never written again, and readers acquire the state
//      before reading them. (A TieredExecutable swaps baseline code for
//      native code inside itself, under its own lock.)
//   b. Compiled code is freed only when no call can be running it: a call
//      holds its own shared_ptr to the Executable while it runs; eviction and
//      invalidation only unlink the slot from the map.
//   c. A slot has at most one job, so a signature is never compiled twice at
//      once; a pending slot always has its job queued or running.
//   d. Code compiled for old definitions is never run for a call on a newer
//      snapshot: the versions are part of the key. A call that raced with an
//      edit and would insert a slot for superseded versions inserts nothing.
//
// Known limitations:
//   1. LRU eviction scans the map: fine for the hundreds of slots the
//      budgets allow, not for millions.
//   2. A failed slot evicted by the tracked-signature bound (cold and failed
//      slots per entry) forgets its failure, and its signature may be
//      retried once more.
//   3. A definition reached only through a function value passed as a static
//      argument is not in VersionsOf: replacing it does not invalidate.
//   4. Jobs are not interruptible: shutdown and invalidation wait for (or
//      discard the result of) a running compile. A compile hook or event sink
//      that itself waits on the engine (policy sync, wait_ready) from a
//      worker can deadlock once every worker waits.
//   5. Compiled code is trusted to fail where tier 0 fails: arguments are
//      type-checked before a job specializes them, but a data-dependent error
//      tier 0 reports (an index out of range) is only caught if the compiled
//      tier checks it too.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/module.h"
#include "jit/executable.h"
#include "pe/signature.h"

namespace pejit {

struct EntryState;  // the engine's per-entry state (engine.cc)

// The versions of an entry and of everything it calls, in one snapshot.
struct DefinitionVersions {
  std::map<std::string, uint64_t> versions;
  std::string key;  // "name=version;..." — equality of the map
  uint64_t hash = 0;

  static std::shared_ptr<const DefinitionVersions> Of(const ModuleSnapshot& snapshot,
                                                      const std::string& entry);
  // True when every definition still has this version in `snapshot`.
  bool CurrentIn(const ModuleSnapshot& snapshot) const;
};
using VersionsPtr = std::shared_ptr<const DefinitionVersions>;

struct SlotKey {
  EntryState* entry = nullptr;  // whose specialization; the cache uses it as an identity only
  std::string mode;             // "value", or "grad:" and the wrt argument indices
  Signature signature;
  VersionsPtr versions;

  size_t Hash() const;
  friend bool operator==(const SlotKey& a, const SlotKey& b);
};

struct SlotKeyHash {
  size_t operator()(const SlotKey& k) const { return k.Hash(); }
};

enum class SlotState : uint8_t {
  kCold,     // seen, not worth compiling yet (policy hot:N)
  kPending,  // its job is queued or running
  kReady,    // `exec` runs it
  kFailed,   // `reason` says why; calls stay on tier 0
};
const char* SlotStateName(SlotState s);

// Why a slot left the map.
enum class SlotDrop : uint8_t { kNone, kInvalidated, kEvicted, kShutdown, kRunFailure };

struct Slot {
  Slot(SlotKey k, std::string entry_name, SlotState initial)
      : key(std::move(k)), entry_name(std::move(entry_name)), state(initial) {}

  const SlotKey key;
  const std::string entry_name;

  // The swap: everything below `state` is written before the release store
  // of kReady or kFailed and only read after an acquire load saw it.
  std::atomic<SlotState> state;
  ExecutablePtr exec;  // kReady
  // kReady, grad mode: ir/abi.h's CallLayout::gradient_result (computed
  // once, by the job, for every call of the signature).
  std::vector<int> gradient_result;
  std::string tier;    // kReady: exec->tier()
  size_t bytes = 0;    // kReady: exec->code_bytes() (at the swap, then at its tier-up: under the cache's lock)
  std::string reason;  // kFailed

  std::atomic<SlotDrop> dropped{SlotDrop::kNone};
  std::atomic<uint64_t> last_used{0};   // LRU clock
  std::atomic<int64_t> calls{0};        // for hot:N
  // A signature the generic tier serves (scheduler/admission.h): when it
  // first came, what its latest generic call took and how many operations
  // it ran, whether its job was admitted (cleared by whoever ends the job),
  // and its compiled runs so far.
  std::atomic<int64_t> first_call_us{0}, generic_us{0}, generic_ops{0};
  std::atomic<bool> admitted{false};
  std::atomic<int> runs_compiled{0};
  // The worker thread running its job (0: none), and the calls that missed
  // it while it was pending: a job the training loop keeps waiting for runs
  // at the caller's priority (EngineImpl::Miss).
  std::atomic<int> job_thread{0}, pending_misses{0};
  std::atomic<bool> boosted{false};
  std::atomic<bool> run_failed{false};  // the one thread that fails a ready slot
  // Published as baseline code whose native code is still to compile
  // (jit/tiered.h): wait_ready waits for it, and asks for it first.
  std::atomic<bool> tiering{false}, tier_up_wanted{false};
  std::atomic<int64_t> rent_ns{0};  // time calls spent on its baseline code (the rent rule, engine_impl.h)
  // Set by the job after it counted and reported its outcome (statistics,
  // events, evictions): waiting for code returns only then, so that what a
  // waiter reads next includes the job that made it.
  std::atomic<bool> settled{false};

  SlotState Load() const { return state.load(std::memory_order_acquire); }

 private:
  friend class CodeCache;
  bool in_cache_ = true;  // guarded by CodeCache::mu_
};
using SlotPtr = std::shared_ptr<Slot>;

struct CacheLimits {
  size_t code_bytes = size_t{256} << 20;   // sum of ready slots' Executable::code_bytes()
  int max_specializations_per_entry = 1024;  // ready slots per entry
  int max_tracked_per_entry = 1024;        // cold and failed slots per entry
  size_t retained_code_bytes = 0;          // code of unlinked slots kept (Retain)
};

struct Eviction {
  SlotPtr slot;
  const char* reason;  // "budget", "entry-max", "tracked-max"
};

class CodeCache {
 public:
  explicit CodeCache(CacheLimits limits) : limits_(limits) {}

  // The slot for `key`, or null. Marks it used (LRU) when `touch`.
  SlotPtr Find(const SlotKey& key, bool touch = true) const;

  // The slot for `key`, inserting one in state `initial` when there is none
  // (`*inserted` says which). `generation` is the snapshot the key's versions
  // come from; when an edit newer than it has been seen and the versions are
  // no longer current in `module`, nothing is inserted and null returned.
  // May evict cold or failed slots of the same entry (returned in `evicted`).
  SlotPtr FindOrInsert(const SlotKey& key, const std::string& entry_name, SlotState initial,
                       uint64_t generation, const Module& module, bool* inserted,
                       std::vector<Eviction>* evicted);

  // J5-J6: publishes `exec` into the pending `slot` (the swap) and evicts
  // past the limits; the new slot itself is kept even when it alone exceeds
  // the byte budget. A slot dropped meanwhile still turns ready (its waiters
  // see it) but is not counted.
  std::vector<Eviction> Publish(Slot& slot, ExecutablePtr exec, std::vector<int> gradient_result = {});
  // The ready `slot`'s code grew in place (its tier-up, jit/tiered.h):
  // counts its bytes again and evicts past the budget, never `slot` itself.
  std::vector<Eviction> Recount(Slot& slot);
  // Fails the pending `slot` with `reason` (one release store).
  std::vector<Eviction> Fail(Slot& slot, std::string reason);
  // A ready slot whose code threw: fails it once (true for the thread that
  // did) and unlinks it, so that its signature is not compiled again.
  bool FailReady(Slot& slot, std::string reason);

  // Unlinks every slot whose versions of a definition in `edit.affected`
  // differ from `edit.after` (or whose definition is gone).
  std::vector<SlotPtr> Invalidate(const ModuleEdit& edit);
  // Unlinks everything (shutdown).
  std::vector<SlotPtr> Clear();

  // Keeps the ready code of `dropped` (slots an edit unlinked) for its
  // kernels, within CacheLimits::retained_code_bytes, oldest first out: the
  // JIT reuses the kernels of live code, and the job that re-specializes
  // after an edit mostly computes the same ones (only what the edit changed
  // is new). Returns how many it kept.
  int64_t Retain(const std::vector<SlotPtr>& dropped);
  size_t retained_bytes() const;

  size_t bytes() const;
  size_t size() const;

  // The LRU clock: every hit takes the next tick.
  uint64_t Tick() const { return clock_.fetch_add(1, std::memory_order_relaxed) + 1; }

 private:
  struct PerEntry {
    int slots = 0;  // in the map
    int ready = 0;  // of which ready
  };
  // Unlinks `slot` (mu_ held exclusively).
  void UnlinkLocked(Slot& slot, SlotDrop why);
  // The least recently used slot to evict: ready ones (of `entry`, when
  // given), or cold and failed ones of `entry`; never `keep`. Null if none.
  SlotPtr LruLocked(const EntryState* entry, bool ready, const Slot* keep) const;
  void EvictTrackedLocked(const EntryState* entry, const Slot* keep, std::vector<Eviction>* evicted);
  // Anyone's least recently used ready slots but `keep`, until the bytes fit the budget.
  void EvictPastBudgetLocked(const Slot& keep, std::vector<Eviction>& evicted);

  const CacheLimits limits_;
  mutable std::shared_mutex mu_;
  std::unordered_map<SlotKey, SlotPtr, SlotKeyHash> map_;
  std::unordered_map<const EntryState*, PerEntry> per_entry_;
  size_t bytes_ = 0;
  uint64_t last_edit_generation_ = 0;
  mutable std::atomic<uint64_t> clock_{0};

  mutable std::mutex retained_mu_;
  std::deque<ExecutablePtr> retained_;  // oldest first
  size_t retained_bytes_ = 0;
};

}  // namespace pejit
