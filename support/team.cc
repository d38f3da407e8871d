#include "support/team.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/parallel.h"

namespace pejit {

ByKey OrderByKey(const std::vector<int64_t>& key, size_t n) {
  ByKey out{std::vector<int64_t>(key.size()), std::vector<int64_t>(n, 0)};
  for (int64_t k : key) ++out.end[static_cast<size_t>(k)];
  for (size_t k = 1; k < n; ++k) out.end[k] += out.end[k - 1];
  std::vector<int64_t> next(n, 0);
  for (size_t k = 1; k < n; ++k) next[k] = out.end[k - 1];
  for (size_t i = 0; i < key.size(); ++i) out.order[static_cast<size_t>(next[static_cast<size_t>(key[i])]++)] = static_cast<int64_t>(i);
  return out;
}
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A thread that found nothing to run looks again after a pause growing with
// its misses, up to a few hundred nanoseconds: each look reads lines the
// other threads are writing, and every read makes their next write wait for
// the line to come back.
inline void Backoff(int misses) {
  for (int i = std::min(misses, 32); i > 0; --i) CpuRelax();
}

// A helper that found no task for this long goes back to its pool (the
// caller borrows it again when work is left): it spins while the tasks it
// waits for finish, microseconds apart, but must not hold a core through a
// long serial stretch.
constexpr auto kIdleBeforeLeaving = std::chrono::microseconds(200);

thread_local Team* current_team = nullptr;

}  // namespace

// What the caller and its helpers share; helpers hold it, so that one
// starting after its call ended still reads valid memory.
struct Team::Shared {
  // One group's claim word, alone on its cache line: the run's number in
  // the high 32 bits, the group's tasks nobody has claimed yet in the low
  // 32 (claimed in order). Claiming one is a compare-and-swap of this word,
  // so a thread holding a stale run number claims nothing.
  //
  // The line is its thread's: on cores far apart a line changing hands
  // costs about what a small task does, so other threads touch it only when
  // they have nothing to run, and then seldom (Backoff).
  struct alignas(64) Group {
    std::atomic<uint64_t> claim{0};
    // Threads reading the run's tasks (this group's, `order`, `ready`)
    // before claiming one of this group: the caller changes them only when
    // no group has any (a task may be claimed, done and the run over while
    // a slower thread still looks at it). On the claim word's line, which
    // the reader loads next.
    std::atomic<int> peeking{0};
    // Tasks of the run that threads of this group's number ran (of any
    // group): the caller sums them to see the run end.
    std::atomic<int64_t> done{0};
    // The group's tasks: written before `claim` publishes the run, read
    // only while `peeking` counts the reader.
    int64_t first = 0, count = 0;
  };
  // Helpers of a group's number here now: read at every claim of another
  // group, written as helpers come and go, so on a line of its own.
  struct alignas(64) Presence {
    std::atomic<int> helpers{0};
  };

  Shared(HelperPool* pool, int groups) : pool(pool), groups(static_cast<size_t>(groups)), presence(static_cast<size_t>(groups)) {}

  HelperPool* pool;
  std::vector<Group> groups;
  std::vector<Presence> presence;  // per group
  // The run's: set before its claim words are published.
  const std::function<void(int64_t)>* task = nullptr;
  const std::function<bool(int64_t)>* ready = nullptr;
  const int64_t* order = nullptr;  // group positions to tasks
  uint64_t run = 0;  // the caller's alone
  // Read by helpers at every turn, written once or twice a call.
  alignas(64) std::atomic<bool> ended{false};
  std::atomic<int> helpers{0};      // lent and not yet returned
  std::atomic<int> helped{0};       // helpers that ran a task of this call
  std::atomic<int> next_helper{0};  // numbers the helpers that arrive
  std::mutex error_mu;
  std::exception_ptr error;

  enum class Claim { kRan, kNotReady, kNone };

  // Claims and runs group g's next task if it is ready; thread `self`
  // counts it done.
  Claim RunOneOf(Group& g, size_t self) {
    if (&g != &groups[self] && (g.claim.load(std::memory_order_relaxed) & 0xffffffffu) == 0) {
      return Claim::kNone;  // another thread's line, not taken from it for nothing
    }
    g.peeking.fetch_add(1, std::memory_order_seq_cst);
    uint64_t word = g.claim.load(std::memory_order_seq_cst);
    int64_t index = -1;
    while ((word & 0xffffffffu) != 0) {
      const int64_t position = g.first + g.count - static_cast<int64_t>(word & 0xffffffffu);
      const int64_t t = order ? order[position] : position;
      if (*ready && !(*ready)(t)) {
        g.peeking.fetch_sub(1, std::memory_order_release);
        return Claim::kNotReady;
      }
      if (g.claim.compare_exchange_weak(word, word - 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        index = t;
        break;
      }
    }
    g.peeking.fetch_sub(1, std::memory_order_release);
    if (index < 0) return Claim::kNone;
    try {
      (*task)(index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mu);
      if (!error) error = std::current_exception();
    }
    groups[self].done.fetch_add(1, std::memory_order_release);
    return Claim::kRan;
  }

  int64_t Done() const {
    int64_t sum = 0;
    for (const Group& g : groups) sum += g.done.load(std::memory_order_acquire);
    return sum;
  }

  // One task for thread `self`: its own group's next if ready; another
  // group's only when its own has none left, or when no thread of that
  // group's number is here to take it (a helper not come yet, or gone): a
  // lane's rows then stay on their thread until the work runs out.
  bool RunOne(size_t self) {
    const Claim own = RunOneOf(groups[self], self);
    if (own == Claim::kRan) return true;
    for (size_t k = 1; k < groups.size(); ++k) {
      const size_t g = (self + k) % groups.size();
      const bool unattended = g != 0 && presence[g].helpers.load(std::memory_order_acquire) == 0;
      if ((own == Claim::kNone || unattended) && RunOneOf(groups[g], self) == Claim::kRan) return true;
    }
    return false;
  }

  void Help() {
    using Clock = std::chrono::steady_clock;
    // Threads 1 .. groups − 1; a helper lent after another left may share
    // its number (it then prefers the same group: only locality suffers).
    const size_t self = 1 + static_cast<size_t>(next_helper.fetch_add(1, std::memory_order_relaxed)) % (groups.size() - 1);
    presence[self].helpers.fetch_add(1, std::memory_order_acq_rel);
    Clock::time_point idle_since = Clock::now();
    int misses = 0;
    bool counted = false;
    while (!ended.load(std::memory_order_acquire) && !pool->recalled()) {
      if (RunOne(self)) {
        if (!counted) helped.fetch_add(1, std::memory_order_relaxed);
        counted = true;
        misses = 0;
        idle_since = Clock::now();
        continue;
      }
      Backoff(++misses);
      if (misses % 64 == 0 && Clock::now() - idle_since > kIdleBeforeLeaving) break;
    }
    presence[self].helpers.fetch_sub(1, std::memory_order_acq_rel);
    helpers.fetch_sub(1, std::memory_order_release);
  }

  void WaitForPeekers() const {
    for (const Group& g : groups) {
      while (g.peeking.load(std::memory_order_seq_cst) != 0) CpuRelax();
    }
  }
};

ArenaHelpers::ArenaHelpers(tbb::task_arena& arena, int capacity, std::function<bool()> recalled)
    : arena_(arena), capacity_(capacity), recalled_(std::move(recalled)) {}

ArenaHelpers::~ArenaHelpers() {
  std::unique_lock<std::mutex> lock(mu_);
  returned_.wait(lock, [&] { return out_ == 0; });
}

void ArenaHelpers::Lend(int count, std::function<void()> help) {
  for (int i = 0; i < count; ++i) {
    {
      // Through a queue of ours, not the task's captures: TBB is not built
      // for ThreadSanitizer, which would not see the hand-off of a capture.
      std::lock_guard<std::mutex> lock(mu_);
      ++out_;
      pending_.push_back(help);
    }
    TsanRelease(this);
    arena_.enqueue([this] {
      TsanAcquire(this);
      std::function<void()> next;
      {
        std::lock_guard<std::mutex> lock(mu_);
        next = std::move(pending_.front());
        pending_.pop_front();
      }
      next();
      std::lock_guard<std::mutex> lock(mu_);
      --out_;
      returned_.notify_all();
    });
  }
}

Team::Team(HelperPool* pool, int max_threads)
    : pool_(pool), max_threads_(pool ? std::max(1, std::min(max_threads, pool->capacity() + 1)) : 1) {}

Team::~Team() {
  if (shared_) shared_->ended.store(true, std::memory_order_release);
}

void Team::Run(int64_t tasks, const std::function<void(int64_t)>& task) {
  std::vector<int64_t> group_end(static_cast<size_t>(max_threads_));
  for (size_t g = 0; g < group_end.size(); ++g) {
    group_end[g] = tasks * static_cast<int64_t>(g + 1) / max_threads_;
  }
  Run(group_end, task);
}

void Team::Run(std::span<const int64_t> group_end, const std::function<void(int64_t)>& task) {
  Run(group_end, nullptr, task, {});
}

void Team::Run(std::span<const int64_t> group_end, const int64_t* order, const std::function<void(int64_t)>& task,
               const std::function<bool(int64_t)>& ready) {
  if (static_cast<int>(group_end.size()) != max_threads_) {
    throw std::invalid_argument("Team::Run: " + std::to_string(group_end.size()) + " groups for a team of " +
                                std::to_string(max_threads_));
  }
  const int64_t tasks = group_end.back();
  if (tasks <= 0) return;
  if (max_threads_ <= 1 || tasks == 1) {
    // One thread: in the order of the tasks, which readiness respects.
    std::vector<int64_t> sequence(static_cast<size_t>(tasks));
    for (int64_t i = 0; i < tasks; ++i) sequence[static_cast<size_t>(i)] = order ? order[i] : i;
    std::sort(sequence.begin(), sequence.end());
    for (int64_t t : sequence) task(t);
    return;
  }
  if (!shared_) {  // most calls never get here: made at their first divided run
    shared_ = std::make_shared<Shared>(pool_, max_threads_);
  }
  Shared& s = *shared_;
  // Borrow helpers when none is here (none lent yet, or all went back idle)
  // and the pool has no work of its own.
  auto borrow = [&] {
    if (s.helpers.load(std::memory_order_acquire) == 0 && !pool_->recalled()) {
      const int count = max_threads_ - 1;
      s.helpers.store(count, std::memory_order_relaxed);
      pool_->Lend(count, [shared = shared_] { shared->Help(); });
    }
  };
  borrow();
  s.WaitForPeekers();  // of the previous run
  s.task = &task;
  s.ready = &ready;
  s.order = order;
  for (Shared::Group& g : s.groups) g.done.store(0, std::memory_order_relaxed);
  ++s.run;
  int64_t first = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const int64_t count = group_end[g] - first;
    if (count < 0 || count > 0xffffffffLL) throw std::invalid_argument("Team::Run: a group of " + std::to_string(count) + " tasks");
    s.groups[g].first = first;
    s.groups[g].count = count;
    first = group_end[g];
  }
  for (Shared::Group& g : s.groups) {
    g.claim.store((s.run << 32) | static_cast<uint64_t>(g.count), std::memory_order_seq_cst);
  }
  int misses = 0;
  for (;;) {
    // Helpers that went back (idle while the caller ran a long task alone,
    // or recalled by a job since done) are borrowed again while work is left.
    if (s.RunOne(0)) {
      misses = 0;
      borrow();
      continue;
    }
    if (s.Done() == tasks) break;
    Backoff(++misses);
    if (misses % 256 == 0) borrow();
  }
  s.WaitForPeekers();  // `ready` and `order` are the caller's: they end with the run
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(s.error_mu);
    std::swap(error, s.error);
  }
  if (error) std::rethrow_exception(error);
}

int Team::threads_used() const { return 1 + (shared_ ? shared_->helped.load(std::memory_order_relaxed) : 0); }

Team* Team::Current() { return current_team; }

ScopedTeam::ScopedTeam(Team* team) : previous_(current_team) { current_team = team; }
ScopedTeam::~ScopedTeam() { current_team = previous_; }

}  // namespace pejit
