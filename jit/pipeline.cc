#include "jit/pipeline.h"

#include "jit/autodiff.h"
#include "jit/pass.h"
#include "jit/straight.h"

namespace pejit {

Func PrepareResidual(const Func& residual, const PipelineOptions& options, PipelineReport* report) {
  PipelineReport local;
  PipelineReport& r = report ? *report : local;
  const PassInstrument& instrument = options.compile.instrument;
  ShowProgram(instrument, "residual", residual);
  Func program = residual;
  if (options.batch) r.batch_skipped = WhyNotStraightLine(program);
  if (options.batch && r.batch_skipped.empty()) {
    r.stage = "batch";
    program = RunPass(instrument, "batch", [&] { return Batch(program, &r.batch, options.lanes); }, &r.batch_ms);
    r.batched = true;
  }
  if (options.wrt_leaves) {
    r.stage = "autodiff";
    program = RunPass(instrument, "autodiff", [&] { return Differentiate(program, *options.wrt_leaves); },
                      &r.autodiff_ms);
  }
  return program;
}

ExecutablePtr CompileResidual(JitSession& session, const Func& residual, const PipelineOptions& options,
                      PipelineReport* report) {
  PipelineReport local;
  PipelineReport& r = report ? *report : local;
  Func program = PrepareResidual(residual, options, &r);
  return session.Compile(program, options.compile, &r.compile);
}

}  // namespace pejit
