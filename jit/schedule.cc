#include "jit/schedule.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>

namespace pejit {
namespace {

// Bytes [begin, end) of memory `memory` a step reads or writes. Before the
// memory plan every root buffer is memory of its own; after it, the arena's
// buffers are one memory (-1) at their offsets.
struct Access {
  int memory;
  int64_t begin, end;
  bool write;
  int step;
};

Access BytesOf(const Plan& plan, int buffer, bool planned, bool write, int step) {
  auto [root, offset] = plan.ViewOf(buffer);
  const PlanBuffer& r = plan.buffers[root];
  const int64_t bytes = plan.buffers[buffer].bytes();
  if (planned && r.kind == PlanBuffer::Kind::kArena) offset += r.offset;
  int memory = planned && r.kind == PlanBuffer::Kind::kArena ? -1 : root;
  return {memory, offset, offset + bytes, write, step};
}

bool Overlap(const Access& a, const Access& b) {
  return a.memory == b.memory && a.begin < b.end && b.begin < a.end;
}

template <typename Fn>
void ForEachAccess(const Plan& plan, int step, bool planned, Fn&& fn) {
  const PlanStep& s = plan.steps[step];
  for (int b : s.inputs) fn(BytesOf(plan, b, planned, false, step));
  for (int b : s.outputs) fn(BytesOf(plan, b, planned, true, step));
}

// The rows of a fused step's outermost loop (its output's first extent).
int64_t OuterRows(const Plan& plan, const PlanStep& step) {
  const Shape& shape = plan.buffers[step.outputs[0]].type.shape;
  return shape.empty() ? 1 : shape[0];
}

int64_t PartsOf(const Plan& plan, const PlanStep& step) {
  const double cost = StepCostNs(plan, step);
  int64_t limit = kMaxParts;
  switch (step.kind) {
    case PlanStep::Kind::kFused: limit = std::min(limit, OuterRows(plan, step)); break;
    case PlanStep::Kind::kCopy: break;
    case PlanStep::Kind::kKernel: {
      if (!step.op->split.kernel || !step.op->split.max_parts) return 1;
      std::vector<TensorType> in, out;
      for (int b : step.inputs) in.push_back(plan.buffers[b].type);
      for (int b : step.outputs) out.push_back(plan.buffers[b].type);
      limit = std::min(limit, step.op->split.max_parts(in, out, step.attrs));
      break;
    }
  }
  return std::max<int64_t>(1, std::min<int64_t>(limit, static_cast<int64_t>(cost / kPartNs)));
}

}  // namespace

double StepCostNs(const Plan& plan, const PlanStep& step) {
  constexpr double kFlopsPerNs = 50, kBytesPerNs = 8, kElementOpsPerNs = 16;
  auto bytes = [&](const std::vector<int>& buffers) {
    double sum = 0;
    for (int b : buffers) sum += static_cast<double>(plan.buffers[b].bytes());
    return sum;
  };
  switch (step.kind) {
    case PlanStep::Kind::kCopy: return 2.0 * static_cast<double>(step.copied_bytes()) / kBytesPerNs;
    case PlanStep::Kind::kFused: {
      double elements = static_cast<double>(NumElements(plan.buffers[step.outputs[0]].type.shape));
      return (bytes(step.inputs) + bytes(step.outputs)) / kBytesPerNs +
             elements * static_cast<double>(step.nodes.size()) / kElementOpsPerNs;
    }
    case PlanStep::Kind::kKernel: {
      if (const double flops = GemmFlops(plan, step); flops > 0) return flops / kFlopsPerNs;
      return (bytes(step.inputs) + bytes(step.outputs)) / kBytesPerNs;
    }
  }
  return 0;
}

double GemmFlops(const Plan& plan, const PlanStep& step) {
  if (step.kind != PlanStep::Kind::kKernel || step.op->fusion != FusionKind::kGemm || step.inputs.empty() ||
      step.outputs.empty()) {
    return 0;
  }
  // 2·k per output element, k the left operand's inner extent.
  const Shape& a = plan.buffers[step.inputs[0]].type.shape;
  if (a.size() < 2) return 0;
  const AttrValue* transposed = step.attrs.Find("transpose_a");
  const bool ta = transposed && std::get<bool>(*transposed);
  const int64_t k = ta ? a[a.size() - 2] : a.back();
  const double out = static_cast<double>(NumElements(plan.buffers[step.outputs[0]].type.shape));
  return 2.0 * out * static_cast<double>(k);
}

void ScheduleStages(Plan& plan) {
  const int n = static_cast<int>(plan.steps.size());
  // Each step's predecessors: the earlier steps whose bytes it must see
  // written (it reads or overwrites them) or must not overwrite before
  // they read them.
  std::vector<std::vector<int>> preds(n);
  struct Seen {
    std::vector<Access> reads, writes;
  };
  std::unordered_map<int, Seen> seen;  // by memory
  for (int j = 0; j < n; ++j) {
    std::vector<Access> mine;
    ForEachAccess(plan, j, /*planned=*/false, [&](const Access& a) {
      if (a.begin == a.end) return;
      Seen& s = seen[a.memory];
      for (const Access& w : s.writes) {
        if (Overlap(a, w)) preds[j].push_back(w.step);
      }
      if (a.write) {
        for (const Access& r : s.reads) {
          if (Overlap(a, r)) preds[j].push_back(r.step);
        }
      }
      mine.push_back(a);
    });
    for (const Access& a : mine) (a.write ? seen[a.memory].writes : seen[a.memory].reads).push_back(a);
    std::sort(preds[j].begin(), preds[j].end());
    preds[j].erase(std::unique(preds[j].begin(), preds[j].end()), preds[j].end());
    std::erase(preds[j], j);
  }
  // Depth as soon as possible, then each step as late as its successors
  // allow: work nothing waits for (an input's projection, a weight's
  // packing) lands beside the step that needs it, not at the start, which
  // keeps producers near consumers and buffers short-lived.
  std::vector<int> asap(n, 0), alap(n);
  int depth = 0;
  for (int j = 0; j < n; ++j) {
    for (int p : preds[j]) asap[j] = std::max(asap[j], asap[p] + 1);
    depth = std::max(depth, asap[j]);
  }
  std::fill(alap.begin(), alap.end(), depth);
  for (int j = n - 1; j >= 0; --j) {
    for (int p : preds[j]) alap[p] = std::min(alap[p], alap[j] - 1);
  }
  std::vector<int> order(n);
  for (int j = 0; j < n; ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return alap[a] < alap[b]; });
  std::vector<PlanStep> steps;
  steps.reserve(n);
  for (int j : order) steps.push_back(std::move(plan.steps[j]));
  plan.steps = std::move(steps);

  plan.stages.clear();
  for (int i = 0; i < n;) {
    PlanStage stage;
    stage.begin = i;
    const int level = alap[order[i]];
    for (; i < n && alap[order[i]] == level; ++i) plan.steps[i].parts = PartsOf(plan, plan.steps[i]);
    stage.end = i;
    plan.stages.push_back(stage);
  }
}

std::vector<std::vector<int>> StepDependences(const Plan& plan) {
  // Per memory, disjoint byte ranges, each with the step that last wrote
  // it and the steps that read it since.
  struct Range {
    int64_t end;
    int writer = -1;
    std::vector<int> readers;
  };
  using Ranges = std::map<int64_t, Range>;  // by first byte
  std::unordered_map<int, Ranges> memories;
  // Makes `at` the start of a range when a range spans it.
  auto cut = [](Ranges& ranges, int64_t at) {
    auto it = ranges.upper_bound(at);
    if (it == ranges.begin()) return;
    --it;
    if (it->first < at && at < it->second.end) {
      Range right = it->second;
      it->second.end = at;
      ranges.emplace(at, std::move(right));
    }
  };
  const int n = static_cast<int>(plan.steps.size());
  std::vector<std::vector<int>> preds(static_cast<size_t>(n));
  std::vector<Access> mine;
  for (int j = 0; j < n; ++j) {
    mine.clear();
    ForEachAccess(plan, j, /*planned=*/true, [&](const Access& a) {
      if (a.begin < a.end) mine.push_back(a);
    });
    std::vector<int>& p = preds[static_cast<size_t>(j)];
    for (const Access& a : mine) {
      Ranges& ranges = memories[a.memory];
      cut(ranges, a.begin);
      cut(ranges, a.end);
      for (auto it = ranges.lower_bound(a.begin); it != ranges.end() && it->first < a.end; ++it) {
        if (it->second.writer >= 0) p.push_back(it->second.writer);
        if (a.write) p.insert(p.end(), it->second.readers.begin(), it->second.readers.end());
      }
    }
    // Reads first: a step reading and writing the same bytes is their writer.
    std::stable_partition(mine.begin(), mine.end(), [](const Access& a) { return !a.write; });
    for (const Access& a : mine) {
      Ranges& ranges = memories[a.memory];
      if (a.write) {
        ranges.erase(ranges.lower_bound(a.begin), ranges.lower_bound(a.end));
        ranges.emplace(a.begin, Range{a.end, j, {}});
        continue;
      }
      // Every byte read gets a range recording the reader, gaps included.
      int64_t at = a.begin;
      auto it = ranges.lower_bound(a.begin);
      while (at < a.end) {
        if (it == ranges.end() || it->first > at) {
          const int64_t gap_end = it == ranges.end() ? a.end : std::min(a.end, it->first);
          it = ranges.emplace_hint(it, at, Range{gap_end, -1, {}});
        }
        it->second.readers.push_back(j);
        at = it->second.end;
        ++it;
      }
    }
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
    std::erase(p, j);
  }
  return preds;
}

void CheckStages(const Plan& plan) {
  const int n = static_cast<int>(plan.steps.size());
  int next = 0;
  for (const PlanStage& stage : plan.stages) {
    if (stage.begin != next || stage.end <= stage.begin || stage.end > n) {
      throw JitFailure("plan: stage [" + std::to_string(stage.begin) + ", " + std::to_string(stage.end) +
                       ") does not follow step " + std::to_string(next));
    }
    next = stage.end;
    std::vector<Access> accesses;
    for (int s = stage.begin; s < stage.end; ++s) {
      const PlanStep& step = plan.steps[s];
      if (step.parts < 1 || step.parts > kMaxParts ||
          (step.parts > 1 && step.kind == PlanStep::Kind::kKernel && !step.op->split.kernel)) {
        throw JitFailure("plan: step " + std::to_string(s) + " in " + std::to_string(step.parts) + " parts");
      }
      // A copy's parts find their bytes by a search of its blocks in order of `to`.
      for (size_t b = 1; step.kind == PlanStep::Kind::kCopy && step.parts > 1 && b < step.blocks.size(); ++b) {
        if (step.blocks[b].to < step.blocks[b - 1].to + step.blocks[b - 1].bytes) {
          throw JitFailure("plan: copy step " + std::to_string(s) + " has blocks out of order");
        }
      }
      ForEachAccess(plan, s, /*planned=*/true, [&](const Access& a) {
        if (a.begin < a.end) accesses.push_back(a);
      });
    }
    if (stage.end - stage.begin < 2) continue;
    std::sort(accesses.begin(), accesses.end(),
              [](const Access& a, const Access& b) { return std::tie(a.memory, a.begin) < std::tie(b.memory, b.begin); });
    std::vector<Access> open;  // of this memory, still overlapping the sweep
    for (const Access& a : accesses) {
      std::erase_if(open, [&](const Access& o) { return o.memory != a.memory || o.end <= a.begin; });
      for (const Access& o : open) {
        if (o.step != a.step && (o.write || a.write)) {
          throw JitFailure("plan: steps " + std::to_string(o.step) + " and " + std::to_string(a.step) +
                           " of one stage touch the same bytes");
        }
      }
      open.push_back(a);
    }
  }
  if (next != n) throw JitFailure("plan: the stages end at step " + std::to_string(next) + " of " + std::to_string(n));
}

}  // namespace pejit
