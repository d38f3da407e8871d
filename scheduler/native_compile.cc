#include "scheduler/native_compile.h"

#include "jit/control_flow.h"
#include "scheduler/residual_executable.h"

namespace pejit {
namespace {

std::string Describe(const ControlFlowStats& stats) {
  std::string out = "compiled as " + std::to_string(stats.regions) + " native regions";
  if (stats.vjp_regions > 0) out += " (" + std::to_string(stats.vjp_regions) + " with a compiled VJP)";
  out += " between " + std::to_string(stats.branches) + " branches and " + std::to_string(stats.calls) + " calls";
  if (stats.refined > 0) out += "; " + std::to_string(stats.refined) + " sizes from what the program computes";
  if (stats.batched_groups > 0) {
    out += "; " + std::to_string(stats.batched_rows) + " examples' branches and loops batched as " +
           std::to_string(stats.batched_groups);
  }
  return out;
}

}  // namespace

CompileFn CompileNative(std::shared_ptr<JitSession> session, CompileOptions options) {
  return [session = std::move(session), shared = std::move(options)](const CompileTask& task,
                                                                     CompileNotes& notes) -> ExecutablePtr {
    CompileOptions regions = shared;
    regions.origin = task.entry;
    CompileOptions options = regions;  // the whole residual: kept by signature, not by text
    options.store = nullptr;
    const Residual& residual = task.residual;
    ControlFlowOptions control;
    control.compile = regions;
    control.batch_branches = task.batch;
    // Every region baseline code now, native code (LLVM's, or the store's)
    // on a worker later (the engine's session outlives its tier-ups).
    if (task.baseline_first) control.tier_ups = &notes.tier_ups;
    if (task.differentiate) {
      // Grad mode through control flow: only the region driver differentiates
      // it (the residual interpreter tier runs value mode only).
      ControlFlowStats stats;
      control.wrt = task.differentiate;
      ExecutablePtr exec = CompileControlFlow(*session, residual.main, residual.functions, control, &stats);
      notes.fallback = "autodiff takes straight-line code only; " + Describe(stats);
      return exec;
    }
    try {
      if (task.baseline_first) {
        return BaselineFirst(
            residual.main, [session, main = residual.main, options] { return session->Compile(main, options); },
            notes.tier_ups);
      }
      CompileReport report;
      ExecutablePtr exec = session->Compile(residual.main, options, &report);
      notes.jit = std::move(report);
      return exec;
    } catch (const JitFailure& native) {
      // Control flow (a dynamic `if`, a loop the data ends): its
      // straight-line regions native, the decisions between them driven.
      if (HasControlFlow(residual.main)) {
        try {
          ControlFlowStats stats;
          ExecutablePtr exec = CompileControlFlow(*session, residual.main, residual.functions, control, &stats);
          notes.fallback = std::string(native.what()) + "; " + Describe(stats);
          return exec;
        } catch (const JitFailure& regions) {
          notes.fallback = regions.what();
        }
      }
      try {
        ExecutablePtr exec = CompileWithResidualInterpreter(residual);
        notes.fallback = native.what() + (notes.fallback.empty() ? "" : "; " + notes.fallback);
        return exec;
      } catch (const std::exception& fallback) {
        throw JitFailure(std::string(native.what()) + "; residual interpreter: " + fallback.what());
      }
    }
  };
}

}  // namespace pejit
