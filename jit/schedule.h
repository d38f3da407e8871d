// \file The parallel schedule of a plan: stages, steps split into parts,
// and the dependences threads wait on, decided when the plan is made.
//
// A compiled step runs its plan on the calling thread and, while the
// engine's workers have nothing to compile, on them too (support/team.h).
// What may run side by side is fixed here, from the plan alone:
//   - Stages. Steps are ordered as late as their results are needed (ALAP
//     over the dependences of the bytes they read and write), and the steps
//     of one depth form a stage: no step of a stage reads or writes bytes
//     another one writes. The memory plan counts lifetimes in whole stages,
//     so that buffers sharing arena bytes are never needed at once by steps
//     that could run side by side.
//   - Parts. A step whose cost (estimated from its shapes) is worth several
//     threads is split: a fused kernel by rows of its outermost loop, a copy
//     by ranges of its output's bytes, a product by its operator's
//     KernelSplit (ops/op.h). The number of parts depends on the step
//     alone, never on how many threads run it, and which thread runs a part
//     does not change its bits: results are the same bits with one thread
//     or many.
//   - Dependences (StepDependences). A step runs as soon as the steps whose
//     bytes it needs are done, on the thread that owns it: lane k's steps
//     (jit/lanes.h) on thread k, the parts of a step of no lane shared out.
#pragma once

#include <cstdint>
#include <vector>

#include "jit/plan.h"

namespace pejit {

// The least estimated work a part of a split step should have. A part run
// by another thread than the one that wrote its inputs reads them from that
// core: where a cache line takes ~450 ns between cores (this project's VMs,
// at times), a fused kernel or copy doing so runs 2-4x slower, and smaller
// parts lost a Tree-LSTM step 13% there (bench/RESULTS.md, issue 29).
// Estimated, so ~4 us of real product work.
inline constexpr double kPartNs = 10000;
// The least estimated work of a control-flow region (jit/control_flow.h)
// worth a second thread: below it, handing steps to a helper (its wake-up,
// the data's cache lines moving to its core) costs more than the helper
// saves, and a batched loop runs such regions back to back. ACT's loop
// regions (issue 51; 17-23 steps, 40-50 us estimated each) ran 1,100
// calls/s with a helper and 1,200-1,800 on the caller alone; with this
// bound, 1,530-1,650. The generic tier's segment runs follow it too
// (RunSizedToTeam): on a tree RNN of hidden 64 its steady state rose 30%
// (all compiled, alternated: 640-700 -> 830-950 calls/s) and a character LM's
// 40%; at hidden 256 (runs above the bound) and on the Child-Sum
// Tree-LSTM trainer it was unchanged (bench/RESULTS.md, session 32). An
// earlier trial on the tree RNN had read 700-870 -> 450-900 calls/s, within
// its noise.
inline constexpr double kTeamWorkNs = 10 * kPartNs;
// The most parts a step splits into: enough for 8 threads. A constant, so
// that results never depend on the machine.
inline constexpr int64_t kMaxParts = 8;

// Estimated nanoseconds `step` takes on one core (GEMM at ~50 GFLOP/s,
// memory at ~8 GB/s): a coarse model, good enough to tell a 1 µs step from a
// 50 µs one.
double StepCostNs(const Plan& plan, const PlanStep& step);
// 2·m·n·k of a matrix product step (batched: summed over its entries), 0
// for others: the cost model's and the profile's (jit/executable.h) FLOPs.
double GemmFlops(const Plan& plan, const PlanStep& step);

// Orders `plan.steps` by stages and fills `plan.stages` and each step's
// `parts`. Runs before memory planning (buffers' offsets unassigned).
void ScheduleStages(Plan& plan);

// Each step's predecessors on the memory as planned (buffers sharing arena
// bytes included): the earlier steps that wrote bytes it reads or writes,
// or read bytes it overwrites. Steps run on several threads as soon as
// their predecessors are done (native_executable.h); derived from the plan,
// never trusted from an image.
std::vector<std::vector<int>> StepDependences(const Plan& plan);

// Throws JitFailure naming the steps when two steps of one stage touch
// overlapping bytes (one of them writing), or the stages do not cover the
// steps in order, or a step's parts are out of range: for plans read back
// from an image, whose memory plan is already made.
void CheckStages(const Plan& plan);

}  // namespace pejit
