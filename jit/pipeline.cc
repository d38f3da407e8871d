#include "jit/pipeline.h"

#include <chrono>

#include "jit/autodiff.h"
#include "jit/straight.h"

namespace pejit {
namespace {

double MillisecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

Func PrepareResidual(const Func& residual, const PipelineOptions& options, PipelineReport* report) {
  PipelineReport local;
  PipelineReport& r = report ? *report : local;
  auto print = [&](std::string_view stage, const Func& program) {
    if (options.print_after) options.print_after(stage, program);
  };
  print("residual", residual);
  Func program = residual;
  if (options.batch) r.batch_skipped = WhyNotStraightLine(program);
  if (options.batch && r.batch_skipped.empty()) {
    r.stage = "batch";
    auto start = std::chrono::steady_clock::now();
    program = Batch(program, &r.batch, options.lanes);
    r.batched = true;
    r.batch_ms = MillisecondsSince(start);
    print("batch", program);
  }
  if (options.wrt_leaves) {
    r.stage = "autodiff";
    auto start = std::chrono::steady_clock::now();
    program = Differentiate(program, *options.wrt_leaves);
    r.autodiff_ms = MillisecondsSince(start);
    print("autodiff", program);
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
