// \file Data-parallel loops on the oneTBB pool, visible to ThreadSanitizer.
//
// Debian's libtbb is not built with -fsanitize=thread, so TSan cannot see that
// tbb::parallel_for's caller waits for its bodies: a body's reads of the
// caller's stack look racy against the caller's later writes. ParallelFor adds
// the two happens-before edges TBB really guarantees (caller → every body,
// every body → caller after the loop) and no others, so races between two
// bodies of one loop are still reported.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdint>

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace pejit {

// Publishes this thread's writes to whoever later calls TsanAcquire(addr).
inline void TsanRelease(const void* addr) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

// Sees the writes published by earlier TsanRelease(addr) calls.
inline void TsanAcquire(const void* addr) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

// Runs body(chunk_begin, chunk_end) over [begin, end) in chunks of about
// `grain` elements on the current TBB arena; returns when all chunks are done.
template <typename Body>
void ParallelFor(int64_t begin, int64_t end, int64_t grain, Body&& body) {
  char started = 0, finished = 0;
  TsanRelease(&started);
  tbb::parallel_for(tbb::blocked_range<int64_t>(begin, end, grain),
                    [&](const tbb::blocked_range<int64_t>& chunk) {
                      TsanAcquire(&started);
                      body(chunk.begin(), chunk.end());
                      TsanRelease(&finished);
                    });
  TsanAcquire(&finished);
}

}  // namespace pejit
