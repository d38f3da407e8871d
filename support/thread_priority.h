// \file Background work that yields the CPU to the threads it serves.
//
// The engine's workers compile while the training thread runs. On a machine
// with as many busy threads as cores, the kernel's fair scheduler would split
// a core between them and a training step would take up to twice its time:
// the stall the tiered design exists to avoid. A worker therefore runs its
// jobs at a lower priority (a higher Linux niceness) than the caller.
#pragma once

namespace pejit {

// Raises the calling thread's niceness to at least `nice` (1..19) for the
// object's lifetime; 0 or less changes nothing. Restoring the old value on
// destruction needs CAP_SYS_NICE or a large enough RLIMIT_NICE; without them
// the thread keeps the lower priority (which only ever makes it yield more).
// Best effort: a platform or process that refuses leaves the priority as is.
class ScopedLowerPriority {
 public:
  explicit ScopedLowerPriority(int nice);
  ~ScopedLowerPriority();
  ScopedLowerPriority(const ScopedLowerPriority&) = delete;
  ScopedLowerPriority& operator=(const ScopedLowerPriority&) = delete;

 private:
  int thread_ = 0;
  int old_nice_ = 0;
  bool lowered_ = false;
};

// The calling thread's niceness (Linux: per thread), or 0 where unknown.
int CurrentThreadNice();

// The calling thread's kernel id (Linux), 0 elsewhere.
int CurrentThreadId();

// Sets thread `tid`'s niceness; false where refused (raising a priority needs
// CAP_SYS_NICE or a large enough RLIMIT_NICE) or unsupported.
bool SetThreadNice(int tid, int nice);

}  // namespace pejit
