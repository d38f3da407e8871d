// \file CPU time, to report beside wall time: a step that took longer while
// its thread used no more CPU was descheduled, not slowed.
#pragma once

#include <ctime>

namespace pejit {

// Seconds on a POSIX CPU-time clock: CLOCK_THREAD_CPUTIME_ID,
// CLOCK_PROCESS_CPUTIME_ID, or another thread's (pthread_getcpuclockid).
double CpuSeconds(clockid_t clock);

inline double ThreadCpuSeconds() { return CpuSeconds(CLOCK_THREAD_CPUTIME_ID); }    // the calling thread
inline double ProcessCpuSeconds() { return CpuSeconds(CLOCK_PROCESS_CPUTIME_ID); }  // all threads

}  // namespace pejit
