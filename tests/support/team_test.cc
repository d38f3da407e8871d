// A call's team (support/team.h): every task once, on the caller and the
// helpers it borrowed; errors come back to the caller; a recalled pool's
// helpers leave after the task they are running.
#include "support/team.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tests/support/thread_pool.h"

namespace pejit {
namespace {

using testing_support::ThreadPool;

// Runs stages of two tasks, task 0 in the caller's group and task 1 in
// group 1, where task 0 waits for task 1 to start: a helper takes its own
// group while the caller is busy. A helper may go back to its pool idle
// before the stage comes (on a slow machine); task 0 then stops waiting, the
// caller runs task 1 itself, and the stage is tried again. `in_task_1` runs
// in task 1; returns the thread that ran it, a helper's.
std::thread::id HelperRunsGroupOne(Team& team, ThreadPool& pool, const std::function<void()>& in_task_1 = {}) {
  const int64_t group_end[] = {1, 2};
  const std::thread::id caller = std::this_thread::get_id();
  for (;;) {
    std::atomic<bool> started{false};
    std::thread::id ran;
    team.Run(group_end, [&](int64_t i) {
      if (i == 0) {
        while (!started.load() && !pool.all_returned()) std::this_thread::yield();
      } else {
        ran = std::this_thread::get_id();
        if (ran != caller && in_task_1) in_task_1();
        started = true;
      }
    });
    if (ran != caller) return ran;
  }
}

TEST(Team, RunsEveryTaskOnceWhateverTheNumberOfThreads) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(3);
    Team team(&pool, threads);
    EXPECT_EQ(team.max_threads(), threads);
    for (int64_t tasks : {1, 2, 3, 7, 64}) {
      for (int stage = 0; stage < 50; ++stage) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(tasks));
        team.Run(tasks, [&](int64_t i) { runs[static_cast<size_t>(i)].fetch_add(1); });
        for (int64_t i = 0; i < tasks; ++i) ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1) << threads << " threads, task " << i;
      }
    }
  }
}

// Tasks that depend on earlier ones (a random graph, in random groups): each
// runs once, after every task it depends on, on any number of threads, and
// with a pool that lends nobody (the caller then takes every group).
TEST(Team, TasksRunOnceTheirDependencesAreDone) {
  constexpr int64_t kTasks = 300;
  std::mt19937 random(7);
  std::vector<std::vector<int64_t>> deps(kTasks);
  for (int64_t t = 1; t < kTasks; ++t) {
    for (int k = 0; k < 3; ++k) deps[static_cast<size_t>(t)].push_back(static_cast<int64_t>(random() % static_cast<uint32_t>(t)));
  }
  struct NoHelpers final : HelperPool {
    int capacity() const override { return 3; }
    void Lend(int, std::function<void()>) override {}
    bool recalled() const override { return false; }
  } nobody;
  for (int threads : {1, 2, 4}) {
    for (bool lent : {true, false}) {
      ThreadPool pool(3);
      Team team(lent ? static_cast<HelperPool*>(&pool) : &nobody, threads);
      // Random groups, each in increasing task number.
      std::vector<std::vector<int64_t>> by_group(static_cast<size_t>(threads));
      for (int64_t t = 0; t < kTasks; ++t) by_group[random() % static_cast<uint32_t>(threads)].push_back(t);
      std::vector<int64_t> order, group_end;
      for (const auto& g : by_group) {
        order.insert(order.end(), g.begin(), g.end());
        group_end.push_back(static_cast<int64_t>(order.size()));
      }
      for (int round = 0; round < 20; ++round) {
        std::vector<std::atomic<int>> runs(kTasks);
        std::vector<std::atomic<bool>> done(kTasks);
        std::atomic<int> late{0};
        team.Run(
            group_end, order.data(),
            [&](int64_t t) {
              for (int64_t d : deps[static_cast<size_t>(t)]) late += !done[static_cast<size_t>(d)].load();
              runs[static_cast<size_t>(t)].fetch_add(1);
              done[static_cast<size_t>(t)].store(true);
            },
            [&](int64_t t) {
              for (int64_t d : deps[static_cast<size_t>(t)]) {
                if (!done[static_cast<size_t>(d)].load()) return false;
              }
              return true;
            });
        ASSERT_EQ(late.load(), 0) << threads << " threads";
        for (int64_t t = 0; t < kTasks; ++t) ASSERT_EQ(runs[static_cast<size_t>(t)].load(), 1) << "task " << t;
      }
    }
  }
}

TEST(Team, ATeamIsNeverLargerThanItsPoolAllows) {
  ThreadPool pool(1);
  EXPECT_EQ(Team(&pool, 4).max_threads(), 2);
  EXPECT_EQ(Team(nullptr, 4).max_threads(), 1);
}

TEST(Team, EachThreadTakesItsOwnGroupFirst) {
  ThreadPool pool(1);
  Team team(&pool, 2);
  EXPECT_NE(HelperRunsGroupOne(team, pool), std::this_thread::get_id());
  EXPECT_EQ(team.threads_used(), 2);
}

TEST(Team, TheCallerRunsEverythingWhenNoHelperComes) {
  struct NoHelpers final : HelperPool {
    int capacity() const override { return 3; }
    void Lend(int, std::function<void()>) override {}
    bool recalled() const override { return false; }
  } pool;
  Team team(&pool, 4);
  std::set<std::thread::id> ran;
  team.Run(16, [&](int64_t) { ran.insert(std::this_thread::get_id()); });
  EXPECT_EQ(ran, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(team.threads_used(), 1);
}

TEST(Team, TheFirstErrorComesBackToTheCallerAfterTheOtherTasks) {
  ThreadPool pool(1);
  Team team(&pool, 2);
  std::atomic<int> ran{0};
  EXPECT_THROW(team.Run(8,
                        [&](int64_t i) {
                          ran.fetch_add(1);
                          if (i == 3) throw std::runtime_error("task 3");
                        }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 8);
  // The team still works.
  std::atomic<int> again{0};
  team.Run(4, [&](int64_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 4);
}

// A compile job arriving takes its core back after the task its helper is
// running: the rest of the call runs on the caller.
TEST(Team, ARecalledHelperLeavesAfterItsCurrentTask) {
  ThreadPool pool(1);
  Team team(&pool, 2);
  // A job arrives while the helper runs its task.
  HelperRunsGroupOne(team, pool, [&] { pool.Recall(true); });
  ASSERT_TRUE(pool.WaitAllReturned()) << "the helper did not leave";
  const int lent = pool.lent();
  std::set<std::thread::id> ran;
  std::mutex mu;
  for (int stage = 0; stage < 10; ++stage) {
    team.Run(8, [&](int64_t) {
      std::lock_guard<std::mutex> lock(mu);
      ran.insert(std::this_thread::get_id());
    });
  }
  EXPECT_EQ(ran, std::set<std::thread::id>{std::this_thread::get_id()});
  EXPECT_EQ(pool.lent(), lent) << "nothing borrowed while recalled";
  // The job done, stages borrow again.
  pool.Recall(false);
  HelperRunsGroupOne(team, pool);
  EXPECT_GT(pool.lent(), lent);
}

}  // namespace
}  // namespace pejit
