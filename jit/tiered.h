// \file Code that is replaced while it runs: baseline code now, native code once compiled.
//
// A specialization's programs are lowered to baseline code first (a plan of
// registered kernels, jit/native_executable.h's LowerToKernelPlan: a
// fraction of a millisecond a program, where LLVM takes tens to hundreds),
// so that a call can leave the interpreter as soon as partial evaluation is
// done; a worker compiles the native code later and Replace swaps it in.
// Calls already running keep the code they started with (each holds its own
// reference); the next ones take the new code. The result type never
// changes: both codes come from one program.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "ir/expr.h"
#include "jit/executable.h"

namespace pejit {

class TieredExecutable final : public Executable {
 public:
  explicit TieredExecutable(ExecutablePtr baseline);

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override { return current()->Run(inputs); }
  const Type& result_type() const override { return result_type_; }
  size_t code_bytes() const override { return current()->code_bytes(); }
  // The tier of the code that runs now.
  const char* tier() const override { return current()->tier(); }
  std::vector<ProfileLine> profile() const override { return current()->profile(); }
  int64_t profiled_runs() const override { return current()->profiled_runs(); }
  double work_ns() const override { return current()->work_ns(); }

  ExecutablePtr current() const;
  // Swaps in `native`, compiled from the same program. Thread-safe.
  void Replace(ExecutablePtr native);

 private:
  const Type result_type_;
  mutable std::mutex mu_;  // a lock, not std::atomic<std::shared_ptr>: libstdc++'s is invisible to TSan
  ExecutablePtr code_;
};

// A program's native code still to compile, and the baseline code standing
// in for it meanwhile. `compile` makes the native code (it may throw: the
// baseline code then stays).
struct TierUp {
  std::shared_ptr<TieredExecutable> exec;
  std::function<ExecutablePtr()> compile;
};

// `program`'s baseline code in a TieredExecutable, and in `tier_ups` what
// compiles its native code through `native`. Throws JitFailure when the
// program cannot be lowered.
ExecutablePtr BaselineFirst(const Func& program, std::function<ExecutablePtr()> native, std::vector<TierUp>& tier_ups);

}  // namespace pejit
