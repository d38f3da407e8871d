// \file What the engine reports while it works: events, and the sinks that receive them.
//
// Every event the engine emits is named once, in PEJIT_EVENTS below (LuaJIT
// keeps its trace-abort reasons the same way): the enum, the name printed in
// logs and the one-line meaning all come from that table. The engine builds
// an Event only when a sink is installed and wants that kind, so with no sink
// (the default) an event costs one pointer test.
//
// The sinks that write logs and trace files are in trace_sinks.h; the
// statistics of a run, from its events, in trace_stats.h.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace pejit {

// X(enumerator, "name", "what it means; its fields"). docs/tracing.md has
// each event's fields with their types and units; a test checks every name
// here has its section there.
#define PEJIT_EVENTS(X)                                                                                         \
  X(kStart, "start", "an engine started; policy, workers")                                                      \
  X(kCall, "call", "a call ran, signature to result; tier (interpreter, residual-interpreter, kernel-plan, native, generic), mode")   \
  X(kHit, "hit", "a call found ready code for its signature; tier")                                             \
  X(kMiss, "miss", "a call found no ready code; state (new, cold, pending, failed), policy, queue")              \
  X(kAdmission, "admission", "a signature the generic tier serves came back: does it get its own job? decision (admit, postpone, boost), reason, mode, calls, interval_us, saving_us, benefit_us, job_us, pending") \
  X(kEnqueue, "enqueue", "a specialization job was queued; job, priority (wait, next, miss, idle), queue, mode") \
  X(kPrefetch, "prefetch", "prefetch asked for a signature; state it found, priority")                          \
  X(kPe, "pe", "partial evaluation of one job; job, residual_ops, params, unfoldings, PE cache use")            \
  X(kAutodiff, "autodiff", "the residual was differentiated (grad mode); job, wrt_leaves")                      \
  X(kBatch, "batch", "the residual was batched; job, groups, ops_before, ops_after, copied_bytes")              \
  X(kPasses, "passes", "the JIT's middle end: fold, CSE, DCE, fuse, memory plan; job, kernels, fused_kernels")  \
  X(kCodegen, "codegen", "LLVM: IR, optimization, machine code; job, ir_us, opt_us, machine_code_us")           \
  X(kCompile, "compile", "the compile hook ran (passes, codegen); job, tier, code_bytes, fallback")             \
  X(kSwap, "swap", "code was published; the span is the job's; job, tier, code_bytes, wait_us, stage times")   \
  X(kTierUp, "tier-up", "a specialization published with baseline code got native code; the span is the compile; job, programs, code_bytes, reason (a program that kept its baseline code)") \
  X(kRefused, "refused", "PE or the compilers declined the signature; it stays on tier 0; job, mode, reason")  \
  X(kFailed, "failed", "a job or its compiled code threw; the slot stays on tier 0 until an edit; reason")      \
  X(kCancel, "cancel", "a queued job was dropped before it ran; job, reason (shutdown, invalidated)")           \
  X(kEvict, "evict", "a slot left the code cache; reason (budget, entry-max, tracked-max), state, bytes")       \
  X(kEdit, "edit", "the module was edited; kind (add, replace, remove), definitions, affected, slots, retained")   \
  X(kInvalidate, "invalidate", "a module edit dropped an entry's slots; definitions, slots")                    \
  X(kGenericCompile, "generic-compile", "a segment of the generic tier got native code; the span is the compile; segment, rows, ops, padded, unpadded") \
  X(kGenericInspect, "generic-inspect", "a worker walked a prefetched call's structure ahead of it; the span is the walk; inspect_us, new_cells, variants, queued") \
  X(kGenericRefused, "generic-refused", "the generic tier declined an entry or a call, which takes the other tiers; mode, reason") \
  X(kCacheLoad, "cache-load", "a specialization was loaded from the persistent code cache; the span is the load; mode, bytes, objects_linked, code_bytes") \
  X(kCacheStore, "cache-store", "a specialization was written to the persistent code cache; the span is the write; job, bytes, evicted") \
  X(kCacheRefused, "cache-refused", "an entry of the persistent code cache was refused (and removed) or could not be written; reason") \
  X(kWarmUp, "warm-up", "a worker set LLVM up before any job, on a throwaway program, so that the first compile a call waits for does not pay for it; the span is the set-up; state (set-up, or ready: the worker had compiled before), error") \
  X(kStop, "stop", "an engine was destroyed; the span is its life")

enum class EventKind : uint8_t {
#define PEJIT_EVENT_ENUM(e, name, doc) e,
  PEJIT_EVENTS(PEJIT_EVENT_ENUM)
#undef PEJIT_EVENT_ENUM
};

inline constexpr int kEventKinds = 0
#define PEJIT_EVENT_COUNT(e, name, doc) +1
    PEJIT_EVENTS(PEJIT_EVENT_COUNT)
#undef PEJIT_EVENT_COUNT
    ;

// "swap", "miss", ...: the name logs and traces use.
std::string_view EventName(EventKind kind);
// The table's one-line description of the event and its fields.
std::string_view EventDoc(EventKind kind);
// The kind named `name`; false when there is none.
bool ParseEventName(std::string_view name, EventKind* kind);

using FieldValue = std::variant<int64_t, double, std::string>;

struct Event {
  EventKind kind;
  std::string entry;        // the entry's name; empty for engine-wide events
  std::string signature;    // Signature::ShortHash(), "" when none
  uint64_t thread = 0;      // small per-process thread number (1, 2, ...), stable for a thread's life
  int64_t start_us = 0;     // steady clock, microseconds
  int64_t duration_us = 0;  // 0 for instant events
  std::vector<std::pair<std::string, FieldValue>> fields;

  std::string_view name() const { return EventName(kind); }
  // The field `key`, or null.
  const FieldValue* Find(std::string_view key) const;
  // A field as text ("" when absent): for tests and log lines.
  std::string Text(std::string_view key) const;
};

// Receives the engine's events, from the training thread and the workers at
// once: implementations must be thread safe, and should be quick (a worker
// waits for Emit to return).
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Asked before an event is built; false makes that event free.
  virtual bool Wants(EventKind kind) const { return true; }
  virtual void Emit(const Event& event) = 0;
};

// Keeps every event in memory, in emission order; for tests.
class RecordingSink final : public EventSink {
 public:
  void Emit(const Event& event) override;
  std::vector<Event> events() const;
  // Events of one kind (and entry, when given).
  std::vector<Event> Of(EventKind kind, std::string_view entry = {}) const;
  int Count(EventKind kind, std::string_view entry = {}) const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

// Microseconds on the steady clock: Event::start_us.
int64_t NowMicros();
// This thread's Event::thread number.
uint64_t ThreadNumber();

// An event of `kind` about `entry` and `signature` (Signature::ShortHash(),
// or empty), on this thread, starting at `start_us` (0: now).
Event MakeEvent(EventKind kind, const std::string& entry, std::string signature, int64_t start_us = 0,
                int64_t duration_us = 0);
// Hands `event` to `sink`, swallowing what the sink throws: a sink's failure
// must not change what the engine computes.
void EmitQuietly(EventSink& sink, const Event& event);

}  // namespace pejit
