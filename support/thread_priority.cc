#include "support/thread_priority.h"

#include <cerrno>

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pejit {

#if defined(__linux__)

namespace {
int ThreadId() { return static_cast<int>(syscall(SYS_gettid)); }
}  // namespace

int CurrentThreadId() { return ThreadId(); }

bool SetThreadNice(int tid, int nice) {
  return tid > 0 && setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) == 0;
}

int CurrentThreadNice() {
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(ThreadId()));
  return errno == 0 ? nice : 0;
}

ScopedLowerPriority::ScopedLowerPriority(int nice) {
  if (nice <= 0) return;
  thread_ = ThreadId();
  errno = 0;
  old_nice_ = getpriority(PRIO_PROCESS, static_cast<id_t>(thread_));
  if (errno != 0 || old_nice_ >= nice) return;
  lowered_ = setpriority(PRIO_PROCESS, static_cast<id_t>(thread_), nice) == 0;
}

ScopedLowerPriority::~ScopedLowerPriority() {
  if (lowered_) setpriority(PRIO_PROCESS, static_cast<id_t>(thread_), old_nice_);
}

#else

int CurrentThreadNice() { return 0; }
int CurrentThreadId() { return 0; }
bool SetThreadNice(int, int) { return false; }
ScopedLowerPriority::ScopedLowerPriority(int) {}
ScopedLowerPriority::~ScopedLowerPriority() = default;

#endif

}  // namespace pejit
