// \file A calling thread and the helper threads it borrows for one call.
//
// A compiled step runs on the thread that called it. While nothing is being
// compiled, the engine's workers sit idle; a Team lets the call borrow them
// for its plan's lanes and divided steps (jit/schedule.h), and gives them
// back the moment their pool recalls them (a compile job arrived): a helper
// leaves after the task it is running, and the caller does whatever is left.
// The caller never waits for a helper to arrive, so a busy pool costs a call
// nothing but the work it does alone.
//
// Tasks each write their own bytes, and wait for the tasks whose bytes they
// read; which thread runs which task does not change any result, so a call
// gives the same bits with one thread or many. What the threads share sits
// on cache lines each thread writes alone: on cores far apart a line that
// changes hands costs about what a small task does.
#pragma once

#include <tbb/task_arena.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace pejit {

// Where helpers come from: the engine's oneTBB arena, or a test's threads.
class HelperPool {
 public:
  virtual ~HelperPool() = default;
  // Helpers this pool may lend one call at most.
  virtual int capacity() const = 0;
  // Runs `help` on up to `count` threads of the pool, now or later (it
  // returns at once); a helper that starts after its call ended finds
  // nothing to do and returns.
  virtual void Lend(int count, std::function<void()> help) = 0;
  // True while work of the pool's own wants its threads: helpers then
  // return after their current task, and calls borrow none.
  virtual bool recalled() const = 0;
};

// Helpers from a oneTBB arena's workers (the engine's: its compile jobs
// recall them). The destructor waits for every lent helper to return, so
// the pool must go before the arena.
class ArenaHelpers final : public HelperPool {
 public:
  ArenaHelpers(tbb::task_arena& arena, int capacity, std::function<bool()> recalled = {});
  ~ArenaHelpers() override;
  ArenaHelpers(const ArenaHelpers&) = delete;
  ArenaHelpers& operator=(const ArenaHelpers&) = delete;

  int capacity() const override { return capacity_; }
  void Lend(int count, std::function<void()> help) override;
  bool recalled() const override { return recalled_ && recalled_(); }

 private:
  tbb::task_arena& arena_;
  const int capacity_;
  const std::function<bool()> recalled_;
  std::mutex mu_;
  std::condition_variable returned_;
  int64_t out_ = 0;  // lent, not yet returned
  std::deque<std::function<void()>> pending_;  // lent, not yet started
};

// Positions 0 .. key.size() - 1 ordered by their key (0 .. n - 1), each
// key's in increasing order, and where each key's end in that order: tasks
// by the group (thread) that owns them, as Team::Run takes them.
struct ByKey {
  std::vector<int64_t> order, end;
};
ByKey OrderByKey(const std::vector<int64_t>& key, size_t n);

class Team {
 public:
  // `max_threads` counts the caller: 1 runs every stage on it alone.
  Team(HelperPool* pool, int max_threads);
  ~Team();  // ends the call: helpers still here return
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  // Runs task(0) .. task(tasks - 1), each once, on the caller and any
  // helpers; returns when all are done. Tasks are in max_threads() groups,
  // group g = [group_end[g - 1], group_end[g]): thread g of the team runs
  // its own group first, so that a caller which gives each thread the same
  // rows of every step keeps those rows in that thread's cache; then it
  // takes tasks of groups whose thread is busy or absent. The first
  // exception a task throws is rethrown here, once no task runs any more.
  void Run(std::span<const int64_t> group_end, const std::function<void(int64_t)>& task);
  // The same for tasks that depend on one another: group g holds the tasks
  // order[group_end[g - 1]] .. order[group_end[g] - 1] (order null: the
  // positions themselves), each group in increasing task number; a thread
  // takes a group's next task only once ready(task) is true. A task may
  // depend only on tasks numbered below it (ready must turn true once they
  // are all done), so that the lowest task not done is always ready and
  // nothing waits forever. Thread g takes another group's tasks only when
  // its own has none left, or when no thread of that group's number is
  // there: one thread keeps its group's data in its caches (jit/lanes.h).
  // With one thread, the tasks run in increasing number.
  void Run(std::span<const int64_t> group_end, const int64_t* order, const std::function<void(int64_t)>& task,
           const std::function<bool(int64_t)>& ready);
  // The same with `tasks` in max_threads() groups of consecutive tasks.
  void Run(int64_t tasks, const std::function<void(int64_t)>& task);

  // Threads that may take part (the caller and the helpers it may borrow).
  int max_threads() const { return max_threads_; }
  // Threads that ran a task so far: the caller and the helpers that came (a
  // helper may return before the others: not how many ran at once).
  int threads_used() const;

  // The team compiled calls on this thread use (null: run serially); set
  // by a ScopedTeam.
  static Team* Current();

 private:
  struct Shared;
  HelperPool* pool_;
  int max_threads_;
  std::shared_ptr<Shared> shared_;
};

// Makes `team` Current() on this thread for the object's life.
class ScopedTeam {
 public:
  explicit ScopedTeam(Team* team);
  ~ScopedTeam();
  ScopedTeam(const ScopedTeam&) = delete;
  ScopedTeam& operator=(const ScopedTeam&) = delete;

 private:
  Team* previous_;
};

}  // namespace pejit
