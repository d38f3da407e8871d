// \file The specialization jobs waiting for a worker, most urgent first.
//
// Four classes, in this order:
//  - wait: a caller blocks until the job is done (policy sync, wait_ready).
//  - next: signatures the program said it calls next (a data loader's coming
//    minibatches), oldest request first. Compiled before it gets there, they
//    run compiled the first time they are called: in a training loop's first
//    epoch, where every minibatch is new, that is the only way to a hit.
//  - miss: signatures a call missed, the most recently missed first: that is
//    the minibatch the loop is on now (older misses may never come back).
//  - idle: prefetched for some later time (an evaluation set), oldest first:
//    they run when the workers would otherwise be idle.
// A miss moves a queued job to the front of the missed ones, out of `next`
// too: the call it was compiled ahead of has come and gone (only a waiting
// caller's job stays where it is).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/module.h"
#include "ir/value.h"
#include "scheduler/code_cache.h"

namespace pejit {

enum class JobPriority : uint8_t { kWait = 0, kNext = 1, kMiss = 2, kIdle = 3 };
const char* JobPriorityName(JobPriority p);  // "wait", "next", "miss", "idle"

// Everything a worker needs to specialize one slot.
struct Job {
  SlotPtr slot;
  Snapshot snapshot;  // the snapshot of the call that asked
  std::vector<Value> args;
  std::vector<bool> static_args;
  bool grad = false;
  bool pullback = false;  // grad mode's value_and_pullback: a PullbackExecutable (jit/pullback.h)
  std::vector<int> wrt;  // grad mode
  int64_t enqueued_us = 0;
  int64_t id = 0;  // for events: which enqueue a job's stages and end belong to
};
using JobPtr = std::shared_ptr<Job>;

class JobQueue {
 public:
  // Queues `job` unless its slot already has a job queued, which is then
  // requeued at `priority` instead. Returns true when `job` was added.
  bool Push(JobPtr job, JobPriority priority);
  // The queued job of `slot`, if any, asked for again at `priority`: `wait`
  // moves it to the waiting jobs; a miss moves it to the front of the missed
  // ones unless a caller waits for it; `next` moves a missed or idle job to
  // the back of the next ones; `idle` changes nothing. Returns true when the
  // job moved.
  bool Requeue(const Slot* slot, JobPriority priority);
  // The most urgent job, or null; with `at_most`, only a job of that class
  // or a more urgent one (null otherwise).
  JobPtr Pop(JobPriority at_most = JobPriority::kIdle);
  // Everything queued, emptying the queue (shutdown).
  std::vector<JobPtr> TakeAll();
  size_t size() const;

 private:
  // (priority, order): miss jobs by descending sequence number, the others
  // by ascending one.
  using Order = std::pair<int, int64_t>;
  Order OrderFor(JobPriority priority) {
    int64_t seq = ++sequence_;
    return {static_cast<int>(priority), priority == JobPriority::kMiss ? -seq : seq};
  }
  bool RequeueLocked(const Slot* slot, JobPriority priority);

  mutable std::mutex mu_;
  int64_t sequence_ = 0;
  std::map<Order, JobPtr> queue_;
  std::unordered_map<const Slot*, Order> index_;
};

}  // namespace pejit
