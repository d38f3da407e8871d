#include "support/stack_segments.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pejit {
namespace {

struct Segment {
  const std::function<void()>* body;
  std::exception_ptr error;
};

void* RunBody(void* arg) {
  auto* segment = static_cast<Segment*>(arg);
  try {
    (*segment->body)();
  } catch (...) {
    segment->error = std::current_exception();
  }
  return nullptr;
}

// The bytes of this thread's stack below `frame`, less a margin for the
// guard page and what runs below the last check; 0 when unknown.
size_t StackLeftBelow(const char* frame) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
  void* low = nullptr;
  size_t size = 0;
  int rc = pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  constexpr size_t kMargin = size_t{64} << 10;
  const char* bottom = static_cast<const char*>(low);
  if (rc != 0 || frame < bottom + kMargin) return 0;
  return static_cast<size_t>(frame - bottom) - kMargin;
}

}  // namespace

void StackSegments::Start() {
  char here;
  base_ = &here;
  size_t left = StackLeftBelow(&here);
  limit_ = left > 0 ? std::min(first_bytes_, left) : first_bytes_;
  below_ = 0;
}

void StackSegments::RunSegment(const std::function<void()>& body) {
  // The caller's segment, restored when this one ends (also by an exception).
  const char* const base = base_;
  const size_t limit = limit_;
  const int64_t below = below_;
  const int64_t depth = Depth();
  const std::function<void()> run = [&] {
    char here;
    base_ = &here;
    // What the thread library kept (its descriptor, static TLS) is not ours.
    size_t left = StackLeftBelow(&here);
    limit_ = left > 0 ? std::min(segment_bytes_, left) : segment_bytes_ / 2;
    below_ = depth;
    // A segment that could not hold one level would start the next at once.
    if (limit_ < 2 * red_zone_) {
      throw std::runtime_error("a stack segment has " + std::to_string(limit_ >> 10) + " KiB, less than twice the " +
                               std::to_string(red_zone_ >> 10) + " KiB one level may use");
    }
    body();
  };
  Segment segment{&run, nullptr};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, segment_bytes_);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, RunBody, &segment);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    throw std::runtime_error("cannot start a thread for a stack segment of " + std::to_string(segment_bytes_ >> 20) +
                             " MiB: " + std::strerror(rc));
  }
  pthread_join(thread, nullptr);
  base_ = base;
  limit_ = limit;
  below_ = below;
  if (segment.error) std::rethrow_exception(segment.error);
}

}  // namespace pejit
