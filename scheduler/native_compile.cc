#include "scheduler/native_compile.h"

#include "jit/control_flow.h"
#include "scheduler/residual_executable.h"

namespace pejit {

CompileFn CompileNative(std::shared_ptr<JitSession> session) {
  return [session = std::move(session)](const Residual& residual, CompileNotes& notes) -> ExecutablePtr {
    try {
      CompileReport report;
      ExecutablePtr exec = session->Compile(residual.main, {}, &report);
      notes.jit = std::move(report);
      return exec;
    } catch (const JitFailure& native) {
      // Control flow (a dynamic `if`, a loop the data ends): its
      // straight-line regions native, the decisions between them driven.
      if (HasControlFlow(residual.main)) {
        try {
          ControlFlowStats stats;
          ExecutablePtr exec = CompileControlFlow(*session, residual.main, residual.functions, {}, &stats);
          notes.fallback = std::string(native.what()) + "; compiled as " + std::to_string(stats.regions) +
                           " native regions between " + std::to_string(stats.branches) + " branches and " +
                           std::to_string(stats.calls) + " calls";
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
