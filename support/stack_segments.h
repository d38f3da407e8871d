// \file Recursion deeper than a thread's stack: stack segments of its own.
//
// Some algorithms recurse as deep as their input, and their input is data (the
// partial evaluator unfolds a recursion over a 100,000-element list 100,000
// calls deep). A thread's stack cannot be sized for every input, and an
// explicit work stack would turn each such algorithm inside out. Instead, as
// rustc does with `stacker`, the recursion checks at each level how much of
// its stack segment is left: when less than a red zone, the rest of the
// recursion from that call on runs on a new thread with a stack of its own
// (one more segment) while the caller waits, and its result or exception
// comes back to the caller. Segments are reserved, not committed: a segment
// costs the memory its frames touch. The depth over all segments is
// measured, so that a budget (a runaway recursion) still stops it.
//
// One recursion at a time per object, and only its thread (or a segment's)
// may call it; the caller blocks while a segment runs, so the recursion's
// state needs no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>

namespace pejit {

class StackSegments {
 public:
  // `first_bytes`: the most the calling thread's stack may give below the
  // frame that calls Start (less when less is left); each new segment has
  // `segment_bytes` (less what the thread library keeps there); a segment is left when less than `red_zone` bytes of it
  // remain (the most that one level of the recursion, and what it calls
  // without recursing, may use).
  StackSegments(size_t first_bytes, size_t segment_bytes = size_t{64} << 20, size_t red_zone = size_t{256} << 10)
      : first_bytes_(first_bytes), segment_bytes_(segment_bytes), red_zone_(red_zone) {}

  // Marks the frame the recursion starts from.
  void Start();

  // Bytes of stack the recursion uses now, over every segment.
  int64_t Depth() const {
    char here;
    return below_ + (base_ - &here);
  }

  // Whether the current segment is nearly full: the caller should run its
  // next level through OnNewSegment.
  bool NearEnd() const {
    char here;
    return static_cast<size_t>(base_ - &here) + red_zone_ > limit_;
  }

  // Runs `f` on a new segment and returns its result (or throws what it
  // threw). Throws std::runtime_error when no thread can be started.
  template <typename F>
  auto OnNewSegment(F&& f) -> std::invoke_result_t<F&> {
    using R = std::invoke_result_t<F&>;
    if constexpr (std::is_void_v<R>) {
      RunSegment([&] { f(); });
    } else {
      std::optional<R> result;
      RunSegment([&] { result.emplace(f()); });
      return std::move(*result);
    }
  }

 private:
  // Runs `body` on a new thread whose stack is a new segment, and waits.
  void RunSegment(const std::function<void()>& body);

  const size_t first_bytes_, segment_bytes_, red_zone_;
  const char* base_ = nullptr;  // the current segment's first frame
  size_t limit_ = 0;            // the current segment's usable bytes
  int64_t below_ = 0;           // depth of the segments below the current one
};

}  // namespace pejit
