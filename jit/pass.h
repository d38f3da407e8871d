// \file Passes: named steps from a program to an equivalent one, each run
// the same way, under one instrument.
//
// Every transformation between partial evaluation and machine code is a
// pass with a name, run through RunPass, which times it and shows the caller's
// instrument the program it produced (`pejit compile --print-after=NAME`,
// tests, timings in reports). The pass lists, each in its one order:
//
//   residual      a whole-minibatch residual (jit/pipeline.h), and each
//                 control-flow region: batch, autodiff
//   control-flow  a residual with branches and loops (jit/control_flow.h):
//                 refine-shapes, batch-branches; then its regions go
//                 through `residual` and `lowering`
//   segment       a generic-tier segment's variant for a row count
//                 (generic/executor.cc): pad (a segment serving
//                 several lengths, generic/pad.h), vectorize, vjp (grad mode: the
//                 forward that keeps residuals and the backward),
//                 pack-shared-weights (of each); then, compiled, `lowering`
//   lowering      every compile (jit/plan.h), on straight-line code:
//                 fold-constants, combine-sums, pack-gemm, cse, dce
//
// "residual" names the program as a pipeline receives it (no pass ran).
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "ir/expr.h"

namespace pejit {

// What a pass produced, as an instrument sees it.
struct PassProduct {
  const Func* program = nullptr;        // a pass from Func to Func: its result; else null
  std::function<std::string()> text;  // the product as text, made only when called
};

struct PassInstrument {
  // After each pass that ran: its name, its product and the time it took.
  std::function<void(std::string_view pass, const PassProduct& product, double ms)> after;
};

struct PassList {
  std::string_view pipeline;
  std::vector<std::string_view> passes;
};
// The lists above, in order.
const std::vector<PassList>& PassLists();
// Whether `name` is a pass of some list, or "residual".
bool IsPassName(std::string_view name);

// `program` as text, for instruments: PrintFunction("main", program).
std::string ProgramText(const Func& program);

// Runs `pass` (any callable returning the pass's product) as pass `name`:
// times it, adds the time to `*ms` when given, and shows `instrument` the
// product, printed by `text` (ProgramText for a Func).
template <typename Pass, typename Text>
auto RunPass(const PassInstrument& instrument, std::string_view name, Pass&& pass, Text&& text,
             double* ms = nullptr) {
  auto start = std::chrono::steady_clock::now();
  auto product = pass();
  double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (ms) *ms += took;
  if (instrument.after) {
    PassProduct shown;
    if constexpr (std::is_same_v<decltype(product), Func>) shown.program = &product;
    shown.text = [&] { return text(product); };
    instrument.after(name, shown, took);
  }
  return product;
}
template <typename Pass>
Func RunPass(const PassInstrument& instrument, std::string_view name, Pass&& pass, double* ms = nullptr) {
  return RunPass(instrument, name, std::forward<Pass>(pass), ProgramText, ms);
}
// Shows `instrument` a program no pass made (the residual as a pipeline receives it).
void ShowProgram(const PassInstrument& instrument, std::string_view name, const Func& program);

// An instrument that prints the program after each pass named in `passes`
// ("all": every pass) to `out` under a "# after PASS (MS ms)" line, one
// program at a time (passes run on several threads at once). Empty
// `passes`: an instrument that shows nothing.
PassInstrument PrintAfter(const std::vector<std::string>& passes, std::FILE* out);

}  // namespace pejit
