// \file The engine's default compile step: LLVM, with a fallback tier.
#pragma once

#include <memory>

#include "jit/compiler.h"
#include "scheduler/engine.h"

namespace pejit {

// Compiles a residual with `session` (native code). A residual the JIT
// refuses, such as one with a loop on dynamic data, runs in the residual
// interpreter instead (still specialized, no longer native); a residual both
// refuse fails the slot with both reasons. Reports LLVM's stages, or the
// reason for the fallback, in CompileNotes.
CompileFn CompileNative(std::shared_ptr<JitSession> session);

}  // namespace pejit
