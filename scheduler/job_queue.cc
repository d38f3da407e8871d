#include "scheduler/job_queue.h"

namespace pejit {

bool JobQueue::Push(JobPtr job, JobPriority priority) {
  std::lock_guard<std::mutex> lock(mu_);
  const Slot* slot = job->slot.get();
  if (index_.count(slot)) {
    RaiseLocked(slot, priority);
    return false;
  }
  Order order = OrderFor(priority);
  queue_.emplace(order, std::move(job));
  index_.emplace(slot, order);
  return true;
}

void JobQueue::Raise(const Slot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  RaiseLocked(slot, JobPriority::kMiss);
}

void JobQueue::RaiseLocked(const Slot* slot, JobPriority priority) {
  auto it = index_.find(slot);
  if (it == index_.end()) return;
  // A prefetch request never demotes a missed job.
  if (priority == JobPriority::kPrefetch) return;
  auto node = queue_.extract(it->second);
  Order order = OrderFor(priority);
  node.key() = order;
  queue_.insert(std::move(node));
  it->second = order;
}

JobPtr JobQueue::Pop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return nullptr;
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
