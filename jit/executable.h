// \file What a specialization compiles to: a function of the dynamic leaves.
//
// An Executable runs a residual program (pe/) on its parameters, the dynamic
// leaves of a call's arguments in Flatten order, and returns the tensors of
// its result, depth first. It is immutable and safe to call from many threads
// at once; holders share it, and its code is released when the last lets go.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ir/type.h"
#include "ops/tensor.h"
#include "support/refusal.h"

namespace pejit {

// A program the JIT will not compile; what() says why. The call stays on the
// interpreter.
class JitFailure : public Refusal {
 public:
  using Refusal::Refusal;
};

// Where a compiled function's time went, per kind of step (CompileOptions::profile).
struct ProfileLine {
  std::string step;     // "fused", "copy" (moves bytes: jit/plan.h), or the operator's name ("matmul", ...)
  int64_t steps = 0;    // steps of that kind in the program
  double seconds = 0;   // summed over every run so far
  double flops = 0;     // per run: multiply-adds × 2 of GEMM steps, else 0
};

// The tier of baseline code: a plan of registered kernels made without a
// code generator (jit/native_executable.h's LowerToKernelPlan), which native
// code replaces (jit/tiered.h).
inline constexpr char kKernelPlanTier[] = "kernel-plan";

class Executable {
 public:
  virtual ~Executable() = default;
  // Throws std::invalid_argument when inputs do not match the parameters.
  virtual std::vector<Tensor> Run(std::span<const Tensor> inputs) const = 0;
  // The program's result type: tensors nested in tuples.
  virtual const Type& result_type() const = 0;
  // Bytes of machine code and constant data held (0 when not native).
  virtual size_t code_bytes() const = 0;
  // "native", kKernelPlanTier or "residual-interpreter": the tier it runs in
  // now, for stats and logs.
  virtual const char* tier() const = 0;
  // Time per kind of step, slowest first; empty unless compiled to profile.
  virtual std::vector<ProfileLine> profile() const { return {}; }
  // Completed runs (counted only when profiling).
  virtual int64_t profiled_runs() const { return 0; }
  // Its estimated work on one core in nanoseconds (jit/schedule.h's
  // StepCostNs), 0 when not known: whether a second thread can pay.
  virtual double work_ns() const { return 0; }
};
using ExecutablePtr = std::shared_ptr<const Executable>;

}  // namespace pejit
