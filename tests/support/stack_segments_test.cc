// Recursion deeper than a thread's stack (support/stack_segments.h): it
// continues on segments of its own, gives its result and its exceptions back
// to the caller, and measures its depth across segments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <stdexcept>

#include "support/stack_segments.h"

namespace pejit {
namespace {

// A recursion with 1 KiB frames: 200,000 levels are ~200 MiB of stack, far
// past a thread's 8 MiB; small segments make it switch often.
class Deep {
 public:
  explicit Deep(StackSegments& stack) : stack_(stack) {}

  int64_t Sum(int64_t n) {
    if (stack_.NearEnd()) return stack_.OnNewSegment([&] { return Sum(n); });
    char frame[1024];
    std::memset(frame, static_cast<int>(n & 0x7f), sizeof frame);
    deepest_ = std::max(deepest_, stack_.Depth());
    if (n == throw_at_) throw std::runtime_error("at " + std::to_string(n));
    int64_t below = n == 0 ? 0 : Sum(n - 1);
    return below + n + (frame[n % sizeof frame] - static_cast<char>(n & 0x7f));  // the frame survived
  }

  int64_t deepest_ = 0;
  int64_t throw_at_ = -1;

 private:
  StackSegments& stack_;
};

TEST(StackSegmentsTest, ARecursionPastTheThreadsStackContinuesOnSegmentsAndReturnsItsResult) {
  StackSegments stack(size_t{256} << 10, size_t{8} << 20, size_t{64} << 10);
  stack.Start();
  Deep deep(stack);
  const int64_t n = 200000;
  EXPECT_EQ(deep.Sum(n), n * (n + 1) / 2);
  // The depth counts every segment: at least the frames' bytes.
  EXPECT_GT(deep.deepest_, n * 1024);
  // Back in the first segment, where it started.
  EXPECT_LT(stack.Depth(), 4096);
}

TEST(StackSegmentsTest, AnExceptionDeepInsideReachesTheCallerAndTheSegmentsUnwind) {
  StackSegments stack(size_t{256} << 10, size_t{8} << 20, size_t{64} << 10);
  stack.Start();
  Deep deep(stack);
  deep.throw_at_ = 10;  // thrown ~190,000 levels down, many segments below
  try {
    deep.Sum(200000);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "at 10");
  }
  EXPECT_LT(stack.Depth(), 4096);
  deep.throw_at_ = -1;
  EXPECT_EQ(deep.Sum(1000), 1000 * 1001 / 2);  // usable again
}

}  // namespace
}  // namespace pejit
