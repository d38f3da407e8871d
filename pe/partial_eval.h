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

namespace pejit {

struct PeOptions {
  // Function bodies unfolded (inlined) in one run; past it, a call becomes a
  // call to a residual function specialized on the generalized arguments.
  int64_t fuel = 1'000'000;
  // Operators in the residual program; past it, partial evaluation fails.
  int64_t max_residual_ops = 200'000;
  // Native stack the evaluator may use (it recurses over the program); past
  // it, partial evaluation fails rather than crash. Sanitizer builds have
  // frames several times larger, and get a proportionally larger budget.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  int64_t max_stack_bytes = 3 << 20;
#else
  int64_t max_stack_bytes = 1 << 20;
#endif
};

// Partial evaluation gave up; the call should run in the interpreter. what()
// says why, e.g. "residual over 200000 operators (PeOptions::max_residual_ops)".
class PeFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PeStats {
  int64_t residual_ops = 0;     // operator calls in the residual
  int64_t params = 0;           // dynamic leaves
  int64_t unfoldings = 0;       // function bodies inlined
  int64_t folded_ops = 0;       // operators computed at specialization time
  int64_t shared_calls = 0;     // calls answered by an identical earlier call
  int64_t residual_functions = 0;  // specialized functions kept as calls (loops)
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
