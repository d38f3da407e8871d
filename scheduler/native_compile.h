// \file The engine's default compile step: LLVM, with a fallback tier.
#pragma once

#include <functional>
#include <memory>

#include "jit/compiler.h"
#include "scheduler/engine.h"

namespace pejit {

// Compiles a residual with `session` (native code). A residual with control
// flow (a dynamic `if`, a loop on dynamic data) is compiled as native
// straight-line regions with a driver between them (jit/control_flow.h),
// which differentiates it too in grad mode; in value mode, one that fails
// that runs in the residual interpreter (still specialized, no longer
// native); a residual every tier refuses is refused with the reasons.
// Reports LLVM's stages, or the reason for the fallback, in CompileNotes.
// Everything compiles with `options` (EngineOptions::compile_options), the
// task's entry its CompileOptions::origin; a store in them keeps the
// control-flow regions (each a program that may come again), not the whole
// residual, which the engine keeps by its call signature.
// With CompileTask::baseline_first, each program (the residual, or each
// region) gets baseline code at once and its native compile is left in
// CompileNotes::tier_ups.
CompileFn CompileNative(std::shared_ptr<JitSession> session, CompileOptions options = {});

}  // namespace pejit
