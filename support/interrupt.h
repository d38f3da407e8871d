// \file Stopping a long call from outside it (Ctrl-C in Python).
//
// A call may run for as long as its program says, forever in a loop that
// never ends. Whoever makes the call (the Python binding, with the GIL
// released) installs a check for its thread; the loops that may run long
// (the interpreter's, a compiled program's driver over its regions) and the
// waits of a call (for a compile, for a walk) poll it, and throw
// Interrupted when it says stop. Work on other threads (compiles) is not
// the call's and goes on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>

namespace pejit {

class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("interrupted") {}
};

// True when the call should stop. Runs on the calling thread, at most every
// kInterruptPollMs while the call computes, or each time a wait wakes.
using InterruptCheck = std::function<bool()>;
inline constexpr int kInterruptPollMs = 20;

// Installs `check` for this thread until destroyed (the previous one back).
class ScopedInterruptCheck {
 public:
  explicit ScopedInterruptCheck(InterruptCheck check);
  ~ScopedInterruptCheck();
  ScopedInterruptCheck(const ScopedInterruptCheck&) = delete;
  ScopedInterruptCheck& operator=(const ScopedInterruptCheck&) = delete;

 private:
  InterruptCheck check_;
  const InterruptCheck* previous_;
};

// Where a long loop may stop: throws Interrupted when this thread's check
// says so. Cheap enough for every step of the interpreter: it reads the
// clock once in 1024 calls and runs the check at most every kInterruptPollMs.
void PollInterrupt();

// For a wait that wakes every kInterruptPollMs: throws Interrupted when this
// thread's check says so, asking it each time.
void CheckInterruptNow();

// cv.wait(lock, done), woken every kInterruptPollMs to ask this thread's
// check (CheckInterruptNow, `lock` released meanwhile): a call's wait its
// caller may stop.
template <typename Done>
void WaitInterruptibly(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Done done) {
  while (!cv.wait_for(lock, std::chrono::milliseconds(kInterruptPollMs), done)) {
    lock.unlock();
    CheckInterruptNow();
    lock.lock();
  }
}

}  // namespace pejit
