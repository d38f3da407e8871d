#include "scheduler/native_compile.h"

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
      try {
        ExecutablePtr exec = CompileWithResidualInterpreter(residual);
        notes.fallback = native.what();
        return exec;
      } catch (const std::exception& fallback) {
        throw JitFailure(std::string(native.what()) + "; residual interpreter: " + fallback.what());
      }
    }
  };
}

}  // namespace pejit
