#include "support/interrupt.h"

#include <chrono>
#include <cstdint>

namespace pejit {
namespace {

struct ThreadState {
  const InterruptCheck* check = nullptr;
  uint32_t count = 0;
  std::chrono::steady_clock::time_point last{};
};

thread_local ThreadState state;

}  // namespace

ScopedInterruptCheck::ScopedInterruptCheck(InterruptCheck check) : check_(std::move(check)), previous_(state.check) {
  state.check = &check_;
}

ScopedInterruptCheck::~ScopedInterruptCheck() { state.check = previous_; }

void PollInterrupt() {
  if (!state.check || (++state.count & 1023) != 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - state.last < std::chrono::milliseconds(kInterruptPollMs)) return;
  state.last = now;
  if ((*state.check)()) throw Interrupted();
}

void CheckInterruptNow() {
  if (state.check && (*state.check)()) throw Interrupted();
}

}  // namespace pejit
