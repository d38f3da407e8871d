#include "jit/lanes.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "ops/op.h"

namespace pejit {
namespace {

// How far from an even share a cut may move to find fewer bytes crossing,
// as a fraction of one lane's share.
constexpr double kCutWindow = 0.2;
// Lanes must run side by side: at least this share of each lane's work may
// start before the half of the previous lane's share closest to it is done
// (a chain of products cut in two would run one half after the other).
constexpr double kMinOverlap = 0.8;
// Bytes crossing lanes per unit of work (a multiply-add or an element
// written) beyond which dividing costs more in data moving between cores
// than it saves.
constexpr double kMaxCutBytesPerWork = 0.05;

int64_t BytesOf(const Type& type) {
  if (!type) return 0;
  if (const TensorTypeNode* t = AsTensor(type)) {
    int64_t n = NumBytes(t->type);
    return n < 0 ? 0 : n;
  }
  int64_t bytes = 0;
  if (const TupleTypeNode* tuple = AsTuple(type)) {
    for (const Type& f : tuple->fields) bytes += BytesOf(f);
  }
  return bytes;
}

double WorkOf(const Binding& b) { return OperationWork(b.var, b.value); }

}  // namespace

double OperationWork(const Var& var, const Expr& value) {
  auto* call = As<OpCallNode>(value);
  if (!call) return 0;
  double work = static_cast<double>(BytesOf(var->annotation)) / 4;
  const std::string& op = call->op->name;
  if ((op == "matmul" || op == "dense") && call->args.size() >= 2) {
    const TensorType a = TensorTypeOf(call->args[0]);
    if (a.rank() >= 1) {
      const AttrValue* transposed = call->attrs.Find("transpose_a");
      const bool ta = transposed && std::get<bool>(*transposed) && a.rank() >= 2;
      const int64_t inner = ta ? a.shape[a.rank() - 2] : a.shape.back();
      work *= static_cast<double>(std::max<int64_t>(inner, 1));
    }
  }
  return work;
}

SourceLoc InLane(SourceLoc loc, int lane) {
  loc.lane = lane;
  return loc;
}

LaneSplit SplitIntoLanes(const Straight& program, int max_lanes) {
  LaneSplit split;
  const size_t n = program.bindings.size();
  split.lane_of.assign(n, -1);
  std::vector<double> before(n + 1, 0);  // work of bindings [0, p)
  for (size_t i = 0; i < n; ++i) before[i + 1] = before[i] + WorkOf(program.bindings[i]);
  split.work = before[n];
  if (max_lanes < 2) {
    split.why_one = "one lane asked for";
    return split;
  }
  if (split.work < kMinLaneWork) {
    split.why_one = "too little work to divide";
    return split;
  }
  // crossing[p]: bytes of the values bound before p and read at or after p.
  std::unordered_map<const ExprNode*, size_t> index;
  for (size_t i = 0; i < n; ++i) index[program.bindings[i].var.get()] = i;
  std::vector<int64_t> crossing(n + 1, 0);
  std::vector<std::vector<size_t>> producers_of(n);
  for (size_t i = 0; i < n; ++i) {
    std::vector<size_t>& producers = producers_of[i];
    ForEachOperand(program.bindings[i].value, [&](const Expr& a) {
      if (a->kind != ExprKind::kVar) return;
      if (auto it = index.find(a.get()); it != index.end()) producers.push_back(it->second);
    });
    std::sort(producers.begin(), producers.end());
    producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
    for (size_t u : producers) {
      const int64_t bytes = BytesOf(program.bindings[u].var->annotation);
      crossing[u + 1] += bytes;
      crossing[i + 1] -= bytes;
    }
  }
  for (size_t p = 1; p <= n; ++p) crossing[p] += crossing[p - 1];
  // Each cut: within the window around its even share, where the bytes
  // crossing plus the work away from the share are least: a byte moved
  // between cores costs about what a multiply-add does, so a cut moves off
  // the share to fall between two trees rather than inside one, but not to
  // save a few bytes (the values an end-of-program join reads, which cross
  // wherever the cut is, grow along the program).
  const int lanes = max_lanes;
  const double share = split.work / lanes;
  std::vector<size_t> cuts;
  size_t previous = 0;
  for (int k = 1; k < lanes; ++k) {
    const double target = share * k;
    size_t best = 0;
    bool found = false;
    for (size_t p = previous + 1; p < n; ++p) {
      if (before[p] < target - kCutWindow * share) continue;
      if (before[p] > target + kCutWindow * share) break;
      auto cost = [&](size_t q) { return static_cast<double>(crossing[q]) + std::abs(before[q] - target); };
      if (!found || cost(p) < cost(best)) best = p, found = true;
    }
    if (!found) {
      split.why_one = "no place to cut near an even share of the work (one operation holds most of it)";
      return split;
    }
    cuts.push_back(best);
    split.cut_bytes += crossing[best];
    previous = best;
  }
  if (static_cast<double>(split.cut_bytes) > kMaxCutBytesPerWork * split.work) {
    split.why_one = "the program does not divide: " + std::to_string(split.cut_bytes) +
                    " bytes would cross lanes for " + std::to_string(static_cast<int64_t>(split.work)) + " of work";
    split.cut_bytes = 0;
    return split;
  }
  // How far into the program each binding must wait, at the latest, for
  // work of an earlier lane (transitively): a lane whose work mostly waits
  // for the end of the one before it would not run beside it.
  auto lane_at = [&](size_t i) {
    return static_cast<int>(std::upper_bound(cuts.begin(), cuts.end(), i) - cuts.begin());
  };
  std::vector<double> waits(n, 0);
  std::vector<double> overlapping(static_cast<size_t>(lanes), 0), lane_work(static_cast<size_t>(lanes), 0);
  for (size_t i = 0; i < n; ++i) {
    const int lane = lane_at(i);
    for (size_t u : producers_of[i]) waits[i] = std::max(waits[i], lane_at(u) < lane ? before[u + 1] : waits[u]);
    const double work = before[i + 1] - before[i];
    lane_work[static_cast<size_t>(lane)] += work;
    const double start = lane == 0 ? 0 : before[cuts[static_cast<size_t>(lane - 1)]];
    if (waits[i] <= start - share / 2) overlapping[static_cast<size_t>(lane)] += work;
  }
  for (int k = 1; k < lanes; ++k) {
    if (overlapping[static_cast<size_t>(k)] < kMinOverlap * lane_work[static_cast<size_t>(k)]) {
      split.why_one = "the lanes would wait for each other: lane " + std::to_string(k) + " needs the end of lane " +
                      std::to_string(k - 1) + " for most of its work";
      split.cut_bytes = 0;
      return split;
    }
  }
  split.lanes = lanes;
  for (size_t i = 0; i < n; ++i) split.lane_of[i] = lane_at(i);
  return split;
}

}  // namespace pejit
