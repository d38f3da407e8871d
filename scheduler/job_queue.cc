#include "scheduler/job_queue.h"

namespace pejit {

const char* JobPriorityName(JobPriority p) {
  switch (p) {
    case JobPriority::kWait:
      return "wait";
    case JobPriority::kNext:
      return "next";
    case JobPriority::kMiss:
      return "miss";
    case JobPriority::kIdle:
      return "idle";
  }
  return "?";
}

bool JobQueue::Push(JobPtr job, JobPriority priority) {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot* slot = job->slot.get();
  if (index_.count(slot)) {
    RequeueLocked(slot, priority);
    return false;
  }
  Order order = OrderFor(priority);
  queue_.emplace(order, std::move(job));
  index_.emplace(slot, order);
  return true;
}

bool JobQueue::Requeue(const Slot* slot, JobPriority priority) {
  std::lock_guard<std::mutex> lock(mu_);
  return RequeueLocked(slot, priority);
}

bool JobQueue::RequeueLocked(const Slot* slot, JobPriority priority) {
  auto it = index_.find(slot);
  if (it == index_.end()) return false;
  auto queued = static_cast<JobPriority>(it->second.first);
  bool moves = false;
  switch (priority) {
    case JobPriority::kWait:
    case JobPriority::kMiss:
      moves = queued != JobPriority::kWait;
      break;
    case JobPriority::kNext:
      moves = queued == JobPriority::kMiss || queued == JobPriority::kIdle;
      break;
    case JobPriority::kIdle:
      break;
  }
  if (!moves) return false;
  auto node = queue_.extract(it->second);
  Order order = OrderFor(priority);
  node.key() = order;
  queue_.insert(std::move(node));
  it->second = order;
  return true;
}

JobPtr JobQueue::Pop(JobPriority at_most) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty() || queue_.begin()->first.first > static_cast<int>(at_most)) return nullptr;
  auto node = queue_.extract(queue_.begin());
  index_.erase(node.mapped()->slot.get());
  return std::move(node.mapped());
}

std::vector<JobPtr> JobQueue::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobPtr> all;
  for (auto& [_, job] : queue_) all.push_back(std::move(job));
  queue_.clear();
  index_.clear();
  return all;
}

size_t JobQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace pejit
