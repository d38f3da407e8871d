// \file Running a plan (jit/plan.h): the executable compiled code is.
//
// A NativeExecutable walks its plan's steps: a fused step calls its kernel
// (machine code, `void k(ptr* buffers, i64 outer)`), a copy step moves
// blocks of bytes, any other step runs the operator's registered kernel on
// views of the buffers. Intermediate buffers live in the calling thread's
// arena. It does not know where the machine code came from: the JIT
// (compiler.h) or an image loaded from disk (image.h); a CodeObject keeps
// that code loaded while an executable calls into it. This file links no
// LLVM, so that a runtime without the compiler can run plans.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "jit/executable.h"
#include "jit/plan.h"

namespace pejit {

using KernelFn = void (*)(void* const* buffers, int64_t outer);

// One object file's machine code: its symbols stay callable while a holder
// lives. `name` is unique across processes (it prefixes the symbols), so
// that an object written by one process can be linked beside another's.
struct CodeObject {
  std::string name;
  std::shared_ptr<const std::string> object;  // the relocatable object file, as linked
  std::shared_ptr<void> loaded;               // what unloads the code when dropped
};

// A fused kernel an executable calls, and where its code is.
struct KernelRef {
  KernelFn fn = nullptr;
  std::string symbol;
  std::string key;   // what it computes (the JIT's kernel key), for sharing
  int object = -1;   // index into the executable's objects
};

class NativeExecutable final : public Executable {
 public:
  // `step_kernel[s]`: the index in `kernels` of fused step s's kernel, -1
  // for other steps; `outer[s]`: that kernel's outermost extent.
  NativeExecutable(Plan plan, std::vector<int> step_kernel, std::vector<int64_t> outer, std::vector<KernelRef> kernels,
                   std::vector<std::shared_ptr<const CodeObject>> objects, size_t code_bytes, bool poison,
                   bool profile, bool baseline = false);

  std::vector<Tensor> Run(std::span<const Tensor> inputs) const override;
  std::vector<ProfileLine> profile() const override;
  int64_t profiled_runs() const override { return runs_.load(std::memory_order_relaxed); }
  double work_ns() const override { return work_ns_; }
  const Type& result_type() const override { return plan_.result_type; }
  size_t code_bytes() const override { return code_bytes_; }
  // "native" for what the JIT compiled (or an image of it); kKernelPlanTier
  // for baseline code (LowerToKernelPlan), made without the compiler.
  const char* tier() const override { return baseline_ ? kKernelPlanTier : "native"; }

  // What an image (image.h) records.
  const Plan& plan() const { return plan_; }
  const std::vector<int>& step_kernel() const { return step_kernel_; }
  const std::vector<int64_t>& outer() const { return outer_; }
  const std::vector<KernelRef>& kernels() const { return kernels_; }
  const std::vector<std::shared_ptr<const CodeObject>>& objects() const { return objects_; }

 private:
  struct Task {  // part `part` of step `step`
    int step;
    int64_t part;
  };
  void RunPart(Task task, const std::vector<void*>& address) const;
  void RunAlone(const std::vector<void*>& address) const;
  void RunKernel(const PlanStep& step, const std::vector<void*>& ptrs, int64_t part) const;
  void Poison(int step, const std::vector<void*>& address) const;

  Plan plan_;
  std::vector<int> step_kernel_;
  std::vector<int64_t> outer_;
  std::vector<KernelRef> kernels_;
  std::vector<KernelFn> step_fn_;  // per step: its kernel, or null
  // Step s's operands are operands_[operand_begin_[s] .. operand_begin_[s + 1]).
  std::vector<int> operands_;
  std::vector<size_t> operand_begin_;
  std::vector<int64_t> operand_row_bytes_;  // per operand of a fused step: bytes per outermost row
  // Every step's parts, in the order of the steps.
  std::vector<Task> tasks_;
  // Step s waits for steps preds_[pred_begin_[s] .. pred_begin_[s + 1]) (jit/schedule.h).
  std::vector<int> preds_;
  std::vector<size_t> pred_begin_;
  int lanes_ = 1;  // the plan's (jit/lanes.h)
  double work_ns_ = 0;  // estimated: StepCostNs summed
  // The tasks by thread, for a team of n threads (built at its first call).
  // A team claims runs of a thread's tasks, not single ones: a claim costs
  // about a tenth of a microsecond, and half the steps take under one. Chunk c
  // is tasks chunk_tasks[chunk_begin[c] .. chunk_begin[c + 1]), consecutive
  // tasks of one thread whose steps wait for nothing of another thread's but
  // its first (so that a chunk waits only for chunks numbered below it,
  // which Team::Run needs), numbered by their first task.
  struct Groups {
    std::vector<int64_t> chunk_begin, chunk_tasks;
    std::vector<int64_t> order;      // chunks, group by group
    std::vector<int64_t> group_end;  // per thread
    // Chunk c waits for steps chunk_preds[chunk_pred_begin[c] .. chunk_pred_begin[c + 1]).
    std::vector<int> chunk_preds;
    std::vector<size_t> chunk_pred_begin;
    std::vector<int64_t> counter;    // per step: its parts-done counter, numbered over CounterLines
    int64_t counter_lines = 0;

    // Whether every step chunk c waits for is done: all its parts, as
    // `parts_done(p)` counts them for step p.
    template <typename PartsDone>
    bool ChunkReady(size_t c, const Plan& plan, PartsDone&& parts_done) const {
      for (size_t k = chunk_pred_begin[c]; k < chunk_pred_begin[c + 1]; ++k) {
        if (parts_done(chunk_preds[k]) != plan.steps[static_cast<size_t>(chunk_preds[k])].parts) return false;
      }
      return true;
    }
  };
  struct alignas(64) CounterLine {
    static constexpr int64_t kCounters = 8;
    std::atomic<int64_t> parts[kCounters];
  };
  const Groups& GroupsFor(int threads) const;
  std::unique_ptr<const Groups> MakeGroups(size_t threads) const;
  void MakeChunks(size_t threads, const std::vector<int64_t>& owner, const std::vector<int64_t>& by_group,
                  const std::vector<int64_t>& task_end, Groups& groups) const;
  void LayOutCounters(size_t threads, const std::vector<int64_t>& by_group, const std::vector<int64_t>& task_end,
                      Groups& groups) const;
  mutable std::mutex groups_mu_;
  mutable std::map<int, std::unique_ptr<const Groups>> groups_;
  std::vector<std::pair<int, int>> params_;       // (buffer, input)
  std::vector<std::pair<int, int64_t>> arena_;    // (buffer, offset in the arena)
  std::vector<std::pair<int, void*>> constants_;  // (buffer, data)
  struct View {
    int buffer, root;
    int64_t offset;
  };
  std::vector<View> views_;  // every view buffer: the buffer it views and where
  // Dropped with the last holder, when no call can still be running the code.
  std::vector<std::shared_ptr<const CodeObject>> objects_;
  size_t code_bytes_;
  bool baseline_ = false;
  bool poison_;
  mutable std::vector<std::atomic<int64_t>> step_ns_;  // per step, when profiling
  mutable std::atomic<int64_t> runs_{0};
};

// Code made with no code generator: `program` lowered without fusion (every
// elementwise operator its own step), each step a registered kernel or a
// copy, the intermediates in the arena. It costs what lowering costs (tens to
// hundreds of microseconds for a generic segment, against milliseconds for
// LLVM) and runs the interpreter's operators without its environment, boxing
// and allocations: the generic tier's first code for a segment variant,
// while a worker compiles the fused one. Throws JitFailure as Lower does.
ExecutablePtr LowerToKernelPlan(const Func& program, LowerOptions options = {});

// Runs `exe` on the current Team (support/team.h), or on the caller alone
// when its estimated work is below kTeamWorkNs (jit/schedule.h): a small
// program is run many times a call (a control-flow region per iteration, a
// generic segment per level), and a helper's wake-up and the data's cache
// lines moving to its core cost it more than the helper saves.
std::vector<Tensor> RunSizedToTeam(const Executable& exe, std::span<const Tensor> inputs);

}  // namespace pejit
