#include "scheduler/native_compile.h"

#include "scheduler/residual_executable.h"

namespace pejit {

CompileFn CompileNative(std::shared_ptr<JitSession> session) {
  return [session = std::move(session)](const Residual& residual) -> ExecutablePtr {
    try {
      return session->Compile(residual.main);
    } catch (const JitFailure& native) {
      try {
        return CompileWithResidualInterpreter(residual);
      } catch (const std::exception& fallback) {
        throw JitFailure(std::string(native.what()) + "; residual interpreter: " + fallback.what());
      }
    }
  };
}

}  // namespace pejit
