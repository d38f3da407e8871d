// \file Keeping a training loop's next calls prefetched, so that they compile before it gets there.
//
// A loop over steps asks, as each step begins, for the call `ahead` steps in
// front of it to be prefetched as next (Prefetch::kNext): the workers take
// those before the jobs of calls already made, in the order the loop will
// make them (scheduler/job_queue.h), and under the generic tier a worker
// walks their structure ahead (generic/program.h). Steps 1 .. ahead-1 are
// asked for when the window opens. `ahead` 0 prefetches nothing.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <vector>

#include "ir/value.h"
#include "scheduler/engine.h"

namespace pejit {

class Lookahead {
 public:
  // `args_of(step)`: the arguments of the call the loop makes at `step`, or
  // nothing (past the end, or a step that calls nothing). Called on the
  // loop's thread only.
  using ArgsOf = std::function<std::optional<std::vector<Value>>(size_t step)>;
  Lookahead(Entry entry, ArgsOf args_of, int ahead);
  // Call as step `step` begins.
  void BeforeStep(size_t step);

 private:
  void Prefetch(size_t step);

  Entry entry_;
  ArgsOf args_of_;
  size_t ahead_;
};

}  // namespace pejit
