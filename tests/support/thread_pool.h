// \file Helpers on threads of the test's own (support/team.h's HelperPool),
// which ThreadSanitizer sees, and whose recall a test sets.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "support/team.h"

namespace pejit::testing_support {

class ThreadPool final : public HelperPool {
 public:
  explicit ThreadPool(int capacity) : capacity_(capacity) {}
  ~ThreadPool() override {
    for (std::thread& t : threads_) t.join();
  }
  int capacity() const override { return capacity_; }
  void Lend(int count, std::function<void()> help) override {
    std::lock_guard<std::mutex> lock(mu_);
    lent_ += count;
    for (int i = 0; i < count; ++i) {
      threads_.emplace_back([this, help] {
        help();
        std::lock_guard<std::mutex> lock(mu_);
        ++returned_;
        changed_.notify_all();
      });
    }
  }
  bool recalled() const override { return recalled_.load(); }

  void Recall(bool on) { recalled_ = on; }
  // Waits until every helper lent so far has returned; false after `seconds`.
  bool WaitAllReturned(int seconds = 60) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(seconds), [&] { return returned_ == lent_; });
  }
  bool all_returned() {
    std::lock_guard<std::mutex> lock(mu_);
    return returned_ == lent_;
  }
  int lent() {
    std::lock_guard<std::mutex> lock(mu_);
    return lent_;
  }

 private:
  const int capacity_;
  std::atomic<bool> recalled_{false};
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::thread> threads_;
  int lent_ = 0, returned_ = 0;
};

}  // namespace pejit::testing_support
