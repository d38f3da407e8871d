// \file The partial evaluator: specializes an entry to one call's static skeleton.
//
// Given an entry and arguments, it evaluates everything that depends only on
// the arguments' static skeleton (pe/signature.h) and leaves a residual
// program computing the rest from the dynamic leaves. For a Tree-LSTM over a
// minibatch of trees, the recursion over the trees disappears and a
// straight-line program of tensor operators remains. See partial_eval.cc for
// the design and its limitations.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ir/module.h"
#include "ir/value.h"
#include "pe/pe_cache.h"
#include "pe/signature.h"
#include "support/refusal.h"

namespace pejit {

struct PeOptions {
  // Function bodies unfolded (inlined) in one run; past it, a call becomes a
  // call to a residual function specialized on the generalized arguments.
  int64_t fuel = 1'000'000;
  // Operators in the residual program; past it, partial evaluation fails.
  int64_t max_residual_ops = 200'000;
  // Stack the evaluator may use, over all its segments: it recurses with the
  // program and its data, and past the calling thread's share continues on
  // stack segments of its own (support/stack_segments.h), so depth is bounded
  // by this budget, not by a thread's stack. Past it, partial evaluation
  // fails rather than exhaust memory: a runaway recursion stops here (about
  // 1.5 KiB per level of a recursion over a list, so ~700,000 levels; memory
  // is used only as deep as the recursion goes).
  int64_t max_stack_bytes = int64_t{1} << 30;
};

// Partial evaluation gave up; the call should run in the interpreter. what()
// says why, e.g. "residual over 200000 operators (PeOptions::max_residual_ops)".
class PeFailure : public Refusal {
 public:
  using Refusal::Refusal;
};

struct PeStats {
  int64_t residual_ops = 0;     // operator calls in the residual
  int64_t params = 0;           // dynamic leaves
  int64_t unfoldings = 0;       // function bodies inlined
  int64_t folded_ops = 0;       // operators computed at specialization time
  int64_t shared_calls = 0;     // calls answered by an identical earlier call
  int64_t residual_functions = 0;  // specialized functions kept as calls (loops)
  // Recursive calls under a dynamic `if` whose static tensors (a counter)
  // were generalized, leaving a residual loop (partial_eval.cc, step 4).
  int64_t generalized_calls = 0;
  // With a PeCache: helper calls whose residual code came from the cache
  // (another entry's, or an earlier run's), and helper specializations this
  // run added to it. Counts above include the reused code as if unfolded.
  int64_t reused_specializations = 0;
  int64_t cached_specializations = 0;
  std::vector<std::string> reused;  // the helpers reused, in order ("forward")
  double seconds = 0;
};

struct Residual {
  // The residual entry: one parameter per dynamic leaf, in Flatten's order.
  Func main;
  // Specialized functions `main` calls (dynamic loops, fuel overruns).
  std::vector<std::pair<std::string, Func>> functions;
  // ADT types the residual constructs or receives.
  std::vector<TypeDefPtr> types;
  PeStats stats;

  // The residual as a .pj program: its types, the functions, and `@main`.
  std::string ToText() const;
  // The residual in a module of its own (type-checked), with entry "main".
  Snapshot ToModule() const;
};

// With `cache`, helper specializations are looked up in and added to it
// (pe_cache.h); the residual is the same either way.
Residual PartialEvaluate(const ModuleSnapshot& module, const std::string& entry, const std::vector<Value>& args,
                         const std::vector<bool>& static_args = {}, const PeOptions& options = {},
                         PeCache* cache = nullptr);

}  // namespace pejit
