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
  // Record the structural call instances of the run (Residual::instances).
  // Costs a little per emitted binding; the PE cache is bypassed, since a
  // replayed template would not say which instance each binding came from.
  bool record_instances = false;
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

// One structural call instance of a run (PeOptions::record_instances): the
// entry's unfolding (instance 0), or that of a function that matches on one
// of its parameters, called inside another instance. Instances of a
// recursion over a tree are its nodes; what instances with one key (function,
// clauses taken, the types they receive) emit is the same code, the cell the
// generic tier is to compile once (docs/architecture.md).
struct CallInstance {
  std::string function;
  int parent = -1;    // the instance whose evaluation made this call
  int position = 0;   // among the parent's structural calls, from 0
  int calls = 0;      // structural calls it made
  // The clause every match on a known constructor took while evaluating this
  // instance's body (its inlined helpers' too), in order.
  std::vector<int> clauses;
  // The types of its arguments, constructors left out ("List"), and of its
  // result, as text; a static tensor with a hash of its contents.
  std::string arg_types, result_type;
  // The residual atoms its arguments and its result hold, each with its path
  // of field numbers ("2.4": argument 2's field 4; "1" for the result's
  // field 1, "" for the result itself): what its code reads from outside,
  // what its caller reads of it.
  std::vector<std::pair<std::string, Expr>> arg_atoms, result_atoms;
};

struct Residual {
  // The residual entry: one parameter per dynamic leaf, in Flatten's order.
  Func main;
  // Specialized functions `main` calls (dynamic loops, fuel overruns).
  std::vector<std::pair<std::string, Func>> functions;
  // ADT types the residual constructs or receives.
  std::vector<TypeDefPtr> types;
  PeStats stats;
  // With PeOptions::record_instances: the structural call instances, and for
  // every let-binding of `main`, in order, the instance that emitted it (-1
  // for the tensors materialized once at the top).
  std::vector<CallInstance> instances;
  std::vector<int> binding_instance;

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
