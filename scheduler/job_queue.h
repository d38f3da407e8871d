// \file The specialization jobs waiting for a worker, most urgent first.
//
// Jobs for signatures a call missed come first, the most recently missed
// first: that is the minibatch the training loop is on now (older misses may
// never come back). Prefetch jobs come after every miss job, oldest first, so
// they run when the workers would otherwise be idle, in the order a data
// loader handed them in. A miss on a queued prefetch job raises it.
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

enum class JobPriority : uint8_t { kMiss = 0, kPrefetch = 1 };

// Everything a worker needs to specialize one slot.
struct Job {
  SlotPtr slot;
  Snapshot snapshot;  // the snapshot of the call that asked
  std::vector<Value> args;
  std::vector<bool> static_args;
  bool grad = false;
  std::vector<int> wrt;  // grad mode
  int64_t enqueued_us = 0;
  int64_t id = 0;  // for events: which enqueue a job's stages and end belong to
};
using JobPtr = std::shared_ptr<Job>;

class JobQueue {
 public:
  // Queues `job` unless its slot already has a job queued, which is then
  // raised to `priority` if that is more urgent (a miss always moves to the
  // front). Returns true when `job` was added.
  bool Push(JobPtr job, JobPriority priority);
  // Moves the queued job of `slot`, if any, to the front.
  void Raise(const Slot* slot);
  // The most urgent job, or null.
  JobPtr Pop();
  // Everything queued, emptying the queue (shutdown).
  std::vector<JobPtr> TakeAll();
  size_t size() const;

 private:
  // (priority, order): miss jobs by descending sequence number, prefetch
  // jobs by ascending one.
  using Order = std::pair<int, int64_t>;
  Order OrderFor(JobPriority priority) {
    int64_t seq = ++sequence_;
    return {static_cast<int>(priority), priority == JobPriority::kMiss ? -seq : seq};
  }
  void RaiseLocked(const Slot* slot, JobPriority priority);

  mutable std::mutex mu_;
  int64_t sequence_ = 0;
  std::map<Order, JobPtr> queue_;
  std::unordered_map<const Slot*, Order> index_;
};

}  // namespace pejit
