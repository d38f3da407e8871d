// \file The engine's fallback compiled tier: a residual program run by the interpreter.
//
// Where LLVM code generation refuses a residual (CompileNative falls back to
// it), or when EngineOptions::compile is CompileWithResidualInterpreter
// itself, a specialization is its residual program — straight-line tensor
// code with the recursion over the minibatch's structure already gone — run
// by the tier-0 interpreter. It is a real tier ("residual-interpreter"): no
// matching, no calls, no unfolding at run time, and the scheduler treats it
// exactly like native code (cache, swap, eviction).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "interp/interpreter.h"
#include "jit/executable.h"
#include "pe/partial_eval.h"

namespace pejit {

class ResidualExecutable final : public Executable {
 public:
  // Throws JitFailure when `residual` calls residual functions (a dynamic
  // loop) or returns anything but tensors nested in tuples.
  static std::shared_ptr<const ResidualExecutable> Create(const Residual& residual,
                                                          InterpreterOptions options = {});

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override;
  const Type& result_type() const override { return result_type_; }
  // An estimate of the IR and constants it holds: 64 bytes per expression
  // node plus the constants' data. Not machine code, but what it keeps alive,
  // so the code cache's byte budget bounds this tier too.
  size_t code_bytes() const override { return code_bytes_; }
  const char* tier() const override { return "residual-interpreter"; }

 private:
  ResidualExecutable(Func main, Snapshot globals, Type result_type, size_t code_bytes,
                     InterpreterOptions options)
      : main_(std::move(main)),
        globals_(std::move(globals)),
        result_type_(std::move(result_type)),
        code_bytes_(code_bytes),
        interpreter_(options) {}
  Func main_;
  Snapshot globals_;  // what main_'s globals resolve in: nothing, or the residual as a module
  Type result_type_;
  size_t code_bytes_;
  Interpreter interpreter_;
};

// EngineOptions::compile's default.
ExecutablePtr CompileWithResidualInterpreter(const Residual& residual);


}  // namespace pejit
