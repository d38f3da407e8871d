#include "jit/native_executable.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "jit/schedule.h"
#include "support/team.h"

namespace pejit {

// The most estimated work (jit/schedule.h's costs) one claim of a team runs:
// a thread runs its steps in order anyway, so a chunk only makes what
// another thread may take from it coarser.
constexpr double kChunkNs = 20000;
namespace {

using Clock = std::chrono::steady_clock;

// The calling thread's arena for the intermediate buffers of one compiled
// call, grown to the largest call it ran and kept (for the thread's life):
// instead of a malloc and free of megabytes per step (a minibatch of trees),
// memory still in cache from the previous step. A thread runs one compiled
// call at a time; a call made from inside another (none today) gets memory
// of its own.
class ThreadArena {
 public:
  explicit ThreadArena(int64_t bytes) {
    State& s = state();
    if (s.busy || bytes > s.capacity) {
      // Rounded up so that slowly growing minibatches do not reallocate every time.
      int64_t capacity = bytes > (int64_t{1} << 60) ? bytes : std::max<int64_t>(4096, bytes + bytes / 4);
      capacity = (capacity + 63) / 64 * 64;
      owned_.reset(static_cast<char*>(std::aligned_alloc(64, static_cast<size_t>(capacity))));
      if (!owned_) throw TensorAllocError(capacity, "the compiled code's arena (its intermediate tensors)");
      if (s.busy) {
        data_ = owned_.get();
        return;
      }
      s.memory = std::move(owned_);
      s.capacity = capacity;
    }
    s.busy = true;
    data_ = s.memory.get();
  }
  ~ThreadArena() {
    if (!owned_) state().busy = false;
  }
  ThreadArena(const ThreadArena&) = delete;
  ThreadArena& operator=(const ThreadArena&) = delete;
  char* data() const { return data_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  struct State {
    std::unique_ptr<char, Free> memory;
    int64_t capacity = 0;
    bool busy = false;
  };
  static State& state() {
    thread_local State s;
    return s;
  }
  std::unique_ptr<char, Free> owned_;  // set only for a nested call's own memory
  char* data_ = nullptr;
};

}  // namespace

NativeExecutable::NativeExecutable(Plan plan, std::vector<int> step_kernel, std::vector<int64_t> outer,
                                   std::vector<KernelRef> kernels, std::vector<std::shared_ptr<const CodeObject>> objects,
                                   size_t code_bytes, bool poison, bool profile, bool baseline)
    : plan_(std::move(plan)),
      step_kernel_(std::move(step_kernel)),
      outer_(std::move(outer)),
      kernels_(std::move(kernels)),
      objects_(std::move(objects)),
      code_bytes_(code_bytes),
      baseline_(baseline),
      poison_(poison),
      step_ns_(profile ? plan_.steps.size() : 0) {
  if (step_kernel_.size() != plan_.steps.size() || outer_.size() != plan_.steps.size()) {
    throw std::invalid_argument("a plan of " + std::to_string(plan_.steps.size()) + " steps with " +
                                std::to_string(step_kernel_.size()) + " kernel slots");
  }
  for (size_t s = 0; s < plan_.steps.size(); ++s) {
    const int k = step_kernel_[s];
    if ((k >= 0) != (plan_.steps[s].kind == PlanStep::Kind::kFused) || k >= static_cast<int>(kernels_.size()) ||
        (k >= 0 && !kernels_[k].fn)) {
      throw std::invalid_argument("step " + std::to_string(s) + " of the plan has no kernel of its kind");
    }
    step_fn_.push_back(k >= 0 ? kernels_[k].fn : nullptr);
  }
  // What each step reads and writes, in the order its kernel wants them.
  for (const PlanStep& step : plan_.steps) {
    operand_begin_.push_back(operands_.size());
    if (step.kind == PlanStep::Kind::kFused) {
      operands_.push_back(step.outputs[0]);
      for (const FusedNode& n : step.nodes) {
        if (n.kind == FusedNode::Kind::kLoad) operands_.push_back(n.buffer);
      }
    } else {
      operands_.insert(operands_.end(), step.inputs.begin(), step.inputs.end());
      operands_.insert(operands_.end(), step.outputs.begin(), step.outputs.end());
    }
  }
  operand_begin_.push_back(operands_.size());
  // A fused step's part starts its operands that many rows in: each
  // operand's bytes per row of the outermost loop (0: broadcast along it).
  operand_row_bytes_.assign(operands_.size(), 0);
  for (size_t s = 0; s < plan_.steps.size(); ++s) {
    if (plan_.steps[s].kind != PlanStep::Kind::kFused) continue;
    const Shape& out = plan_.buffers[plan_.steps[s].outputs[0]].type.shape;
    if (out.empty() || out[0] <= 1) continue;
    for (size_t k = operand_begin_[s]; k < operand_begin_[s + 1]; ++k) {
      const PlanBuffer& buf = plan_.buffers[operands_[k]];
      if (buf.type.shape.size() == out.size() && buf.type.shape[0] == out[0]) operand_row_bytes_[k] = buf.bytes() / out[0];
    }
  }
  // The stages (jit/schedule.h): from Lower, or an image's, checked.
  try {
    CheckStages(plan_);
  } catch (const JitFailure& e) {
    throw std::invalid_argument(e.what());
  }
  for (size_t st = 0; st < plan_.steps.size(); ++st) {
    for (int64_t part = 0; part < plan_.steps[st].parts; ++part) tasks_.push_back({static_cast<int>(st), part});
  }
  for (const std::vector<int>& preds : StepDependences(plan_)) {
    pred_begin_.push_back(preds_.size());
    preds_.insert(preds_.end(), preds.begin(), preds.end());
  }
  pred_begin_.push_back(preds_.size());
  for (const PlanStep& step : plan_.steps) {
    lanes_ = std::max(lanes_, step.lane + 1);
    work_ns_ += StepCostNs(plan_, step);
  }
  // Where each buffer is, resolved once: a run then walks short arrays
  // instead of every buffer's description.
  for (size_t b = 0; b < plan_.buffers.size(); ++b) {
    const PlanBuffer& buf = plan_.buffers[b];
    int i = static_cast<int>(b);
    switch (buf.kind) {
      case PlanBuffer::Kind::kParam: params_.push_back({i, buf.param}); break;
      case PlanBuffer::Kind::kArena: arena_.push_back({i, buf.offset}); break;
      case PlanBuffer::Kind::kConstant: constants_.push_back({i, const_cast<void*>(buf.constant.raw_data())}); break;
      case PlanBuffer::Kind::kAlias: {
        auto [root, offset] = plan_.ViewOf(i);
        views_.push_back({i, root, offset});
        break;
      }
      case PlanBuffer::Kind::kResult: break;
    }
  }
}

std::vector<Tensor> NativeExecutable::Run(std::span<const Tensor> inputs) const {
  if (inputs.size() != plan_.params.size()) {
    throw std::invalid_argument("compiled function takes " + std::to_string(plan_.params.size()) + " inputs, got " +
                                std::to_string(inputs.size()));
  }
  std::vector<Tensor> results;
  ThreadArena arena(plan_.arena_bytes);
  std::vector<void*> address(plan_.buffers.size(), nullptr);
  for (auto [b, param] : params_) {
    const Tensor& in = inputs[param];
    const TensorType& want = plan_.buffers[b].type;
    if (!in.defined() || in.type() != want) {
      throw std::invalid_argument("input " + std::to_string(param) + " of the compiled function must be " +
                                  want.ToString() + ", got " + (in.defined() ? in.type().ToString() : "nothing"));
    }
    address[b] = const_cast<void*>(in.raw_data());
  }
  for (auto [b, offset] : arena_) address[b] = arena.data() + offset;
  for (auto [b, data] : constants_) address[b] = data;
  for (int b : plan_.results) {
    const TensorType& t = plan_.buffers[b].type;
    results.push_back(Tensor::Empty(t.dtype, t.shape));
    address[b] = results.back().raw_data();
  }
  for (const View& v : views_) address[v.buffer] = static_cast<char*>(address[v.root]) + v.offset;
  // With a team, every step runs as soon as the steps it depends on are
  // done, on the thread that owns it (GroupsFor); alone (or poisoning
  // buffers after their last use, which needs the plan's order), step by
  // step.
  Team* team = Team::Current();
  if (team && team->max_threads() > 1 && !poison_ && tasks_.size() > 1) {
    const Groups& groups = GroupsFor(team->max_threads());
    // Parts done per step, where Groups::counter puts them.
    auto lines = std::make_unique<CounterLine[]>(groups.counter_lines);
    auto finished = [&](int step) -> std::atomic<int64_t>& {
      const int64_t c = groups.counter[static_cast<size_t>(step)];
      return lines[static_cast<size_t>(c / CounterLine::kCounters)].parts[c % CounterLine::kCounters];
    };
    // After a step fails, the others are only marked done (their inputs may
    // be garbage): the steps waiting for them end, and Run rethrows the error.
    std::atomic<bool> failed{false};
    team->Run(
        groups.group_end, groups.order.data(),
        [&](int64_t c) {
          std::exception_ptr error;
          for (int64_t i = groups.chunk_begin[static_cast<size_t>(c)]; i < groups.chunk_begin[static_cast<size_t>(c) + 1]; ++i) {
            const Task& task = tasks_[static_cast<size_t>(groups.chunk_tasks[static_cast<size_t>(i)])];
            if (!failed.load(std::memory_order_relaxed)) {
              try {
                RunPart(task, address);
              } catch (...) {
                failed.store(true, std::memory_order_relaxed);
                error = std::current_exception();
              }
            }
            finished(task.step).fetch_add(1, std::memory_order_release);
          }
          if (error) std::rethrow_exception(error);
        },
        [&](int64_t c) {
          return groups.ChunkReady(static_cast<size_t>(c), plan_,
                                   [&](int p) { return finished(p).load(std::memory_order_acquire); });
        });
  } else if (poison_) {
    for (const PlanStage& stage : plan_.stages) {
      for (int s = stage.begin; s < stage.end; ++s) {
        for (int64_t part = 0; part < plan_.steps[s].parts; ++part) RunPart({s, part}, address);
      }
      for (int s = stage.begin; s < stage.end; ++s) Poison(s, address);
    }
  } else {
    RunAlone(address);
  }
  if (!step_ns_.empty()) runs_.fetch_add(1, std::memory_order_relaxed);
  return results;
}

// One thread runs the lanes (jit/lanes.h) one after another as far as they
// allow, as that many threads would, each to its next step that cannot run
// yet: one lane's buffers are in the caches at a time, not every lane's.
void NativeExecutable::RunAlone(const std::vector<void*>& address) const {
  if (lanes_ == 1) {  // most calls: no groups to look up (a lock and a map)
    for (const Task& task : tasks_) RunPart(task, address);
    return;
  }
  const Groups& groups = GroupsFor(lanes_);
  std::vector<int64_t> finished(plan_.steps.size(), 0), next(groups.group_end.size(), 0);
  for (size_t k = 1; k < next.size(); ++k) next[k] = groups.group_end[k - 1];
  // The lowest chunk not run is always ready: every pass runs one at least.
  for (size_t left = groups.order.size(); left > 0;) {
    for (size_t k = 0; k < next.size(); ++k) {
      for (; next[k] < groups.group_end[k]; ++next[k], --left) {
        const size_t c = static_cast<size_t>(groups.order[static_cast<size_t>(next[k])]);
        if (!groups.ChunkReady(c, plan_, [&](int p) { return finished[p]; })) break;
        for (int64_t i = groups.chunk_begin[c]; i < groups.chunk_begin[c + 1]; ++i) {
          const Task& task = tasks_[static_cast<size_t>(groups.chunk_tasks[static_cast<size_t>(i)])];
          RunPart(task, address);
          ++finished[task.step];
        }
      }
    }
  }
}

// A step of lane l is thread l's (modulo the team's size): its lane's
// buffers stay in that core's caches, step after step and call after call
// (jit/lanes.h). Of a step of no lane, thread k of n takes the k-th share of
// its parts: the same rows of every step, so a step mostly reads what the
// same thread wrote before. Steps of no lane in one part are the caller's.
const NativeExecutable::Groups& NativeExecutable::GroupsFor(int threads) const {
  std::lock_guard<std::mutex> lock(groups_mu_);
  std::unique_ptr<const Groups>& cached = groups_[threads];
  if (!cached) cached = MakeGroups(static_cast<size_t>(threads));
  return *cached;
}

std::unique_ptr<const NativeExecutable::Groups> NativeExecutable::MakeGroups(size_t n) const {
  // Each task's thread, and the tasks thread by thread.
  std::vector<int64_t> owner(tasks_.size());
  for (size_t t = 0; t < tasks_.size(); ++t) {
    const PlanStep& step = plan_.steps[static_cast<size_t>(tasks_[t].step)];
    owner[t] = step.lane >= 0   ? step.lane % static_cast<int64_t>(n)
               : step.parts > 1 ? tasks_[t].part * static_cast<int64_t>(n) / step.parts
                                : 0;
  }
  const ByKey by_thread = OrderByKey(owner, n);
  auto groups = std::make_unique<Groups>();
  MakeChunks(n, owner, by_thread.order, by_thread.end, *groups);
  LayOutCounters(n, by_thread.order, by_thread.end, *groups);
  return groups;
}

void NativeExecutable::MakeChunks(size_t n, const std::vector<int64_t>& owner, const std::vector<int64_t>& by_group,
                                  const std::vector<int64_t>& task_end, Groups& groups) const {
  // A step of one part is its thread's alone.
  std::vector<int64_t> step_owner(plan_.steps.size(), -1);
  for (size_t t = 0; t < tasks_.size(); ++t) {
    if (plan_.steps[static_cast<size_t>(tasks_[t].step)].parts == 1) step_owner[static_cast<size_t>(tasks_[t].step)] = owner[t];
  }
  struct Chunk {
    int64_t first_task;
    size_t group;
    std::vector<int64_t> tasks;
  };
  std::vector<Chunk> chunks;
  for (size_t k = 0; k < n; ++k) {
    double cost = 0;
    for (int64_t i = k == 0 ? 0 : task_end[k - 1]; i < task_end[k]; ++i) {
      const int64_t t = by_group[static_cast<size_t>(i)];
      const int step = tasks_[static_cast<size_t>(t)].step;
      const PlanStep& s = plan_.steps[static_cast<size_t>(step)];
      // A divided step's parts go alone; so does a step waiting for another thread's.
      bool alone = s.parts > 1 || chunks.empty() || chunks.back().group != k ||
                   plan_.steps[static_cast<size_t>(tasks_[static_cast<size_t>(chunks.back().tasks[0])].step)].parts > 1;
      for (size_t p = pred_begin_[static_cast<size_t>(step)]; !alone && p < pred_begin_[static_cast<size_t>(step) + 1]; ++p) {
        alone = step_owner[static_cast<size_t>(preds_[p])] != static_cast<int64_t>(k);
      }
      const double step_cost = StepCostNs(plan_, s);
      if (alone || cost + step_cost > kChunkNs) {
        chunks.push_back({t, k, {}});
        cost = 0;
      }
      chunks.back().tasks.push_back(t);
      cost += step_cost;
    }
  }
  std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) { return a.first_task < b.first_task; });
  std::vector<int64_t> chunk_of_step(plan_.steps.size(), -1);
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (int64_t t : chunks[c].tasks) {
      int64_t& at = chunk_of_step[static_cast<size_t>(tasks_[static_cast<size_t>(t)].step)];
      at = std::max(at, static_cast<int64_t>(c));
    }
  }
  groups.chunk_begin = {0};
  groups.chunk_pred_begin = {0};
  std::vector<int64_t> chunk_group(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    chunk_group[c] = static_cast<int64_t>(chunks[c].group);
    groups.chunk_tasks.insert(groups.chunk_tasks.end(), chunks[c].tasks.begin(), chunks[c].tasks.end());
    groups.chunk_begin.push_back(static_cast<int64_t>(groups.chunk_tasks.size()));
    std::vector<int> preds;  // of its steps, outside it
    for (int64_t t : chunks[c].tasks) {
      const size_t step = static_cast<size_t>(tasks_[static_cast<size_t>(t)].step);
      for (size_t p = pred_begin_[step]; p < pred_begin_[step + 1]; ++p) {
        if (chunk_of_step[static_cast<size_t>(preds_[p])] != static_cast<int64_t>(c)) preds.push_back(preds_[p]);
      }
    }
    std::sort(preds.begin(), preds.end());
    preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
    for (int p : preds) {
      // What Team::Run needs to finish: a chunk waits only for chunks
      // numbered below it. Checked, as a wait that cannot end would hang.
      if (chunk_of_step[static_cast<size_t>(p)] > static_cast<int64_t>(c)) {
        throw JitFailure("executable: chunk " + std::to_string(c) + " waits for step " + std::to_string(p) +
                         " of a chunk after it");
      }
      groups.chunk_preds.push_back(p);
    }
    groups.chunk_pred_begin.push_back(groups.chunk_preds.size());
  }
  ByKey by_thread = OrderByKey(chunk_group, n);
  groups.order = std::move(by_thread.order);
  groups.group_end = std::move(by_thread.end);
}

// Each thread's steps' counters on lines of their own (a step's is written
// by the thread running it, read by threads waiting for it), a step divided
// between threads on a line alone.
void NativeExecutable::LayOutCounters(size_t n, const std::vector<int64_t>& by_group, const std::vector<int64_t>& task_end,
                                      Groups& groups) const {
  constexpr int64_t kLine = CounterLine::kCounters;
  auto next_line = [](int64_t at) { return (at + kLine - 1) / kLine * kLine; };
  groups.counter.assign(plan_.steps.size(), -1);
  int64_t used = 0;
  for (size_t k = 0; k < n; ++k) {
    for (int64_t i = k == 0 ? 0 : task_end[k - 1]; i < task_end[k]; ++i) {
      const int step = tasks_[static_cast<size_t>(by_group[static_cast<size_t>(i)])].step;
      if (groups.counter[static_cast<size_t>(step)] >= 0) continue;
      if (plan_.steps[static_cast<size_t>(step)].parts > 1) {
        used = next_line(used);
        groups.counter[static_cast<size_t>(step)] = used;
        used += kLine;
      } else {
        groups.counter[static_cast<size_t>(step)] = used++;
      }
    }
    used = next_line(used);
  }
  for (int64_t& c : groups.counter) {
    if (c < 0) c = used++;  // a step of no parts: its counter stays 0
  }
  groups.counter_lines = std::max<int64_t>(1, next_line(used) / kLine);
}

void NativeExecutable::RunPart(Task task, const std::vector<void*>& address) const {
  const size_t s = static_cast<size_t>(task.step);
  const PlanStep& step = plan_.steps[s];
  const bool profile = !step_ns_.empty();
  Clock::time_point start;
  if (profile) start = Clock::now();
  thread_local std::vector<void*> ptrs;
  ptrs.clear();
  for (size_t k = operand_begin_[s]; k < operand_begin_[s + 1]; ++k) ptrs.push_back(address[operands_[k]]);
  if (step_fn_[s]) {
    int64_t rows = outer_[s];
    if (step.parts > 1) {
      auto [first, last] = PartOf(outer_[s], 1, task.part, step.parts);
      for (size_t k = operand_begin_[s]; k < operand_begin_[s + 1]; ++k) {
        ptrs[k - operand_begin_[s]] = static_cast<char*>(ptrs[k - operand_begin_[s]]) + first * operand_row_bytes_[k];
      }
      rows = last - first;
    }
    if (rows > 0) step_fn_[s](ptrs.data(), rows);
  } else if (step.kind == PlanStep::Kind::kCopy) {
    char* to = static_cast<char*>(ptrs.back());
    if (step.parts == 1) {
      for (const CopyBlock& b : step.blocks) {
        std::memcpy(to + b.to, static_cast<const char*>(ptrs[b.input]) + b.from, b.bytes);
      }
    } else {
      // This part's range of the output's bytes, from the blocks (in order
      // of `to`, checked by CheckStages) that overlap it.
      auto [lo, hi] = PartOf(plan_.buffers[step.outputs[0]].bytes(), 64, task.part, step.parts);
      auto b = std::partition_point(step.blocks.begin(), step.blocks.end(),
                                    [lo = lo](const CopyBlock& x) { return x.to + x.bytes <= lo; });
      for (; b != step.blocks.end() && b->to < hi; ++b) {
        int64_t from = std::max(lo, b->to), until = std::min(hi, b->to + b->bytes);
        std::memcpy(to + from, static_cast<const char*>(ptrs[b->input]) + b->from + (from - b->to),
                    static_cast<size_t>(until - from));
      }
    }
  } else {
    RunKernel(step, ptrs, task.part);
  }
  if (profile) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    step_ns_[s].fetch_add(ns, std::memory_order_relaxed);
  }
}

std::vector<ProfileLine> NativeExecutable::profile() const {
  std::map<std::string, ProfileLine> by_kind;
  for (size_t s = 0; s < step_ns_.size(); ++s) {
    const PlanStep& step = plan_.steps[s];
    std::string kind = step.kind == PlanStep::Kind::kFused  ? "fused"
                       : step.kind == PlanStep::Kind::kCopy ? "copy"
                                                            : step.op->name;
    ProfileLine& line = by_kind[kind];
    line.step = kind;
    ++line.steps;
    line.seconds += static_cast<double>(step_ns_[s].load(std::memory_order_relaxed)) * 1e-9;
    line.flops += GemmFlops(plan_, step);
  }
  std::vector<ProfileLine> lines;
  for (auto& [kind, line] : by_kind) lines.push_back(std::move(line));
  std::sort(lines.begin(), lines.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return lines;
}

// A registered operator's kernel, or part `part` of it, on views of the
// buffers (inputs, then outputs).
void NativeExecutable::RunKernel(const PlanStep& step, const std::vector<void*>& ptrs, int64_t part) const {
  std::vector<Tensor> ins, outs;
  size_t k = 0;
  for (int b : step.inputs) {
    const TensorType& t = plan_.buffers[b].type;
    ins.push_back(Tensor::Wrap(ptrs[k++], t.dtype, t.shape, nullptr));
  }
  for (int b : step.outputs) {
    const TensorType& t = plan_.buffers[b].type;
    outs.push_back(Tensor::Wrap(ptrs[k++], t.dtype, t.shape, nullptr));
  }
  // Nothing to compute when every output is empty.
  if (std::any_of(outs.begin(), outs.end(), [](const Tensor& t) { return t.numel() > 0; })) {
    if (step.parts > 1) {
      step.op->split.kernel(ins, outs, step.attrs, part, step.parts);
    } else {
      step.op->kernel(ins, outs, step.attrs);
    }
  }
}

// Debug mode: overwrite arena buffers right after their last use.
void NativeExecutable::Poison(int step, const std::vector<void*>& address) const {
  for (size_t i = 0; i < plan_.buffers.size(); ++i) {
    const PlanBuffer& buf = plan_.buffers[i];
    if (buf.kind == PlanBuffer::Kind::kArena && buf.last_step == step && buf.bytes() > 0) {
      std::memset(address[i], 0xff, static_cast<size_t>(buf.bytes()));  // NaN floats, -1 integers
    }
  }
}

std::vector<Tensor> RunSizedToTeam(const Executable& exe, std::span<const Tensor> inputs) {
  if (exe.work_ns() > 0 && exe.work_ns() < kTeamWorkNs && Team::Current()) {
    ScopedTeam alone(nullptr);
    return exe.Run(inputs);
  }
  return exe.Run(inputs);
}

ExecutablePtr LowerToKernelPlan(const Func& program, LowerOptions options) {
  options.fuse = false;
  Plan plan = Lower(program, options);
  const size_t steps = plan.steps.size();
  return std::make_shared<NativeExecutable>(std::move(plan), std::vector<int>(steps, -1), std::vector<int64_t>(steps, 0),
                                            std::vector<KernelRef>{}, std::vector<std::shared_ptr<const CodeObject>>{},
                                            0, false, false, /*baseline=*/true);
}

}  // namespace pejit
