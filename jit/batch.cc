#include "jit/batch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <type_traits>
#include <unordered_map>
#include <variant>

#include "jit/batch_rules.h"
#include "jit/lanes.h"
#include "jit/straight.h"
#include "ops/op.h"

namespace pejit {
namespace {

using Rule = BatchRule;

// A light operation's level packs (stage, rank within the stage).
constexpr int kStageShift = 24;

// Keys are byte strings compared whole: fixed-width binary fields, built
// without formatting (this runs for every operator of large programs).
template <typename T>
void AppendBytes(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void AppendType(std::string& key, const TensorType& t) {
  key.push_back(static_cast<char>(t.dtype));
  key.push_back(static_cast<char>(t.shape.size()));
  key.append(reinterpret_cast<const char*>(t.shape.data()), t.shape.size() * sizeof(int64_t));
}

void AppendIdentity(std::string& key, const Expr& atom) {
  if (auto* c = As<ConstantNode>(atom)) {
    key.push_back('c');
    AppendType(key, c->value.type());
    AppendBytes(key, static_cast<int64_t>(c->value.nbytes()));
    key.append(static_cast<const char*>(c->value.raw_data()), c->value.nbytes());
  } else {
    key.push_back('v');
    AppendBytes(key, atom.get());
  }
}

void AppendAttrs(std::string& key, const Attrs& attrs) {
  AppendBytes(key, attrs.items().size());
  for (const auto& [name, value] : attrs.items()) {
    AppendBytes(key, name.size());
    key += name;
    key.push_back(static_cast<char>(value.index()));
    std::visit(
        [&](const auto& v) {
          if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::vector<int64_t>>) {
            AppendBytes(key, v.size());
            key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t));
          } else {
            AppendBytes(key, v);
          }
        },
        value);
  }
}

// What a variable of the input program is in the output.
struct Ref {
  enum class Kind : uint8_t { kAtom, kRow, kTuple };
  Kind kind = Kind::kAtom;
  Expr atom;                // kAtom
  int batch = -1;           // kRow: row `row` of output `output` of batches_[batch]
  int output = 0;
  int64_t row = 0;
  std::vector<Ref> fields;  // kTuple

  // Whether AppendKey would append the same bytes, without building them.
  bool SameAs(const Ref& o) const {
    if (kind != o.kind) return false;
    switch (kind) {
      case Kind::kAtom: {
        auto* c = As<ConstantNode>(atom);
        auto* oc = As<ConstantNode>(o.atom);
        if (!c || !oc) return !c && !oc && atom.get() == o.atom.get();
        return c->value.type() == oc->value.type() && c->value.nbytes() == oc->value.nbytes() &&
               std::memcmp(c->value.raw_data(), oc->value.raw_data(), c->value.nbytes()) == 0;
      }
      case Kind::kRow: return batch == o.batch && output == o.output && row == o.row;
      case Kind::kTuple:
        if (fields.size() != o.fields.size()) return false;
        for (size_t i = 0; i < fields.size(); ++i) {
          if (!fields[i].SameAs(o.fields[i])) return false;
        }
        return true;
    }
    return false;
  }
  void AppendKey(std::string& key) const {
    switch (kind) {
      case Kind::kAtom: AppendIdentity(key, atom); return;
      case Kind::kRow:
        key.push_back('r');
        AppendBytes(key, batch);
        AppendBytes(key, output);
        AppendBytes(key, row);
        return;
      case Kind::kTuple:
        key.push_back('(');
        AppendBytes(key, fields.size());
        for (const Ref& f : fields) f.AppendKey(key);
        return;
    }
  }
};

Ref AtomRef(Expr atom) {
  Ref r;
  r.atom = std::move(atom);
  return r;
}

class Batcher {
 public:
  Batcher(Straight in, BatchStats& stats, int max_lanes) : in_(std::move(in)), stats_(stats) {
    LaneSplit split = SplitIntoLanes(in_, max_lanes);
    lane_of_ = std::move(split.lane_of);
    stats_.lanes = split.lanes;
    stats_.lane_cut_bytes = split.cut_bytes;
    stats_.why_one_lane = std::move(split.why_one);
  }

  Func Run() {
    for (const Var& p : in_.params) refs_[p.get()] = AtomRef(p);
    Group();
    EmitGroups();
    Straight out;
    out.params = in_.params;
    out.result = MaterializeResult(in_.result);  // may emit row reads
    out.bindings = std::move(out_.bindings());
    for (const Binding& b : out.bindings) stats_.ops_after += b.value->kind == ExprKind::kOpCall;
    return Recompose(out);
  }

 private:
  Straight in_;
  BatchStats& stats_;
  StraightEmitter out_;

  // Per input binding: its lane (jit/lanes.h), its group and the bindings it waits for.
  std::vector<int> lane_of_;
  std::vector<int> group_of_;
  std::vector<Rule> rule_of_;
  std::vector<std::vector<int>> members_;  // per group, ascending
  std::vector<std::vector<int>> successors_;
  std::vector<int> pending_;

  struct Batch {
    std::vector<Var> outputs;  // stacked: [rows, ...member shape]
    int lane;
  };
  std::vector<Batch> batches_;
  std::unordered_map<const ExprNode*, Ref> refs_;
  std::unordered_map<std::string, Expr> stacks_;  // Ref keys of the rows → their stack
  std::map<std::tuple<int, int, int64_t>, Expr> rows_;

  // ---- Grouping: key and level per operator call --------------------------------

  std::string KeyOf(const OpCallNode& call, Rule rule) {
    std::string key;
    key.reserve(128);
    AppendBytes(key, call.loc.file.get());
    AppendBytes(key, call.loc.line);
    AppendBytes(key, call.loc.col);
    AppendBytes(key, call.op);
    AppendAttrs(key, call.attrs);
    for (size_t p = 0; p < call.args.size(); ++p) {
      const Expr& a = call.args[p];
      AppendType(key, TensorTypeOf(a));
      bool shared = MustShare(rule, p) || a->kind == ExprKind::kConstant;
      key.push_back(shared ? '=' : '|');
      if (shared) AppendIdentity(key, a);
    }
    return key;
  }

  void Group() {
    const size_t n = in_.bindings.size();
    group_of_.assign(n, -1);
    rule_of_.assign(n, Rule::kNone);
    successors_.assign(n, {});
    pending_.assign(n, 0);
    std::unordered_map<const ExprNode*, int> binding_of;
    std::unordered_map<std::string, int> key_ids;
    std::map<std::tuple<int, int64_t, int>, int> group_ids;  // (key, level, lane) → group
    // levels[i]: for every batchable key among binding i's ancestors (itself
    // included), the largest level there; sorted by key.
    std::vector<std::vector<std::pair<int, int64_t>>> levels(n);
    // stage[i]: the largest level of a heavy operation among binding i's
    // ancestors (itself included).
    std::vector<int64_t> stage(n, 0);
    std::vector<int> remaining_uses(n, 0);

    auto producers_of = [&](const Expr& value) {
      std::vector<int> out;
      ForEachOperand(value, [&](const Expr& a) {
        if (a->kind != ExprKind::kVar) return;
        auto it = binding_of.find(a.get());
        if (it != binding_of.end()) out.push_back(it->second);
      });
      std::sort(out.begin(), out.end());
      out.erase(std::unique(out.begin(), out.end()), out.end());
      return out;
    };

    std::vector<std::vector<int>> producers(n);
    for (size_t i = 0; i < n; ++i) {
      producers[i] = producers_of(in_.bindings[i].value);
      for (int p : producers[i]) ++remaining_uses[p];
      binding_of[in_.bindings[i].var.get()] = static_cast<int>(i);
    }
    std::vector<std::pair<int, int64_t>> next;  // merge scratch
    for (size_t i = 0; i < n; ++i) {
      const Binding& b = in_.bindings[i];
      std::vector<std::pair<int, int64_t>> merged;
      for (int p : producers[i]) {
        stage[i] = std::max(stage[i], stage[p]);
        bool last_use = --remaining_uses[p] == 0;
        if (merged.empty()) {
          // The first producer's table is the start; taken over when this is
          // its last consumer (most bindings have one producer).
          if (last_use) {
            merged = std::move(levels[p]);
          } else {
            merged = levels[p];
          }
        } else {
          next.clear();
          std::merge(merged.begin(), merged.end(), levels[p].begin(), levels[p].end(), std::back_inserter(next));
          merged.clear();
          for (const auto& kv : next) {
            if (!merged.empty() && merged.back().first == kv.first) {
              merged.back().second = std::max(merged.back().second, kv.second);
            } else {
              merged.push_back(kv);
            }
          }
        }
        // The producer's table is not needed once its last consumer has merged it.
        if (last_use) std::vector<std::pair<int, int64_t>>().swap(levels[p]);
        successors_[p].push_back(static_cast<int>(i));
      }
      pending_[i] = static_cast<int>(producers[i].size());

      int group = -1;
      if (auto* call = As<OpCallNode>(b.value)) {
        ++stats_.ops_before;
        Rule rule = BatchRuleOf(*call);
        rule_of_[i] = rule;
        if (rule != Rule::kNone) {
          int key = key_ids.emplace(KeyOf(*call, rule), static_cast<int>(key_ids.size())).first->second;
          auto it = std::lower_bound(merged.begin(), merged.end(), std::make_pair(key, int64_t{0}));
          int64_t before = it != merged.end() && it->first == key ? it->second : 0;
          int64_t level;
          if (IsHeavy(rule)) {
            level = before + 1;
            stage[i] = std::max(stage[i], level);
          } else {
            // A light operation's level is its stage (the heavy work it
            // follows), then its rank among same-key ancestors of that stage:
            // the adds summing a node's children, however many, share the
            // levels of the other nodes' adds that feed the same tree level.
            level = (stage[i] << kStageShift) + 1;
            if (before >> kStageShift == stage[i]) level = before + 1;
          }
          if (it != merged.end() && it->first == key) {
            it->second = level;
          } else {
            merged.insert(it, {key, level});
          }
          auto [g, inserted] =
              group_ids.emplace(std::make_tuple(key, level, lane_of_[i]), static_cast<int>(members_.size()));
          if (inserted) members_.emplace_back();
          group = g->second;
        }
      }
      if (group < 0) {  // on its own
        group = static_cast<int>(members_.size());
        members_.emplace_back();
      }
      group_of_[i] = group;
      members_[group].push_back(static_cast<int>(i));
      levels[i] = std::move(merged);
    }
  }

  // ---- Agenda: emit whole groups as soon as every member is computable ----------

  void EmitGroups() {
    const size_t groups = members_.size();
    std::vector<std::vector<int>> ready(groups);
    std::vector<int> unemitted(groups);
    for (size_t g = 0; g < groups; ++g) unemitted[g] = static_cast<int>(members_[g].size());
    using Item = std::pair<int, int>;  // (first member, group): keeps the input's order where it can
    std::priority_queue<Item, std::vector<Item>, std::greater<>> complete;
    std::set<int> partial;
    auto mark_ready = [&](int i) {
      int g = group_of_[i];
      ready[g].push_back(i);
      if (static_cast<int>(ready[g].size()) == unemitted[g]) {
        partial.erase(g);
        complete.push({*std::min_element(ready[g].begin(), ready[g].end()), g});
      } else {
        partial.insert(g);
      }
    };
    for (size_t i = 0; i < pending_.size(); ++i) {
      if (pending_[i] == 0) mark_ready(static_cast<int>(i));
    }
    size_t emitted = 0;
    while (emitted < pending_.size()) {
      int g;
      if (!complete.empty()) {
        g = complete.top().second;
        complete.pop();
      } else {
        // Groups wait on one another (a chain of adds of data-dependent length
        // makes the adds of one level wait for cells the next level's adds
        // feed): split the group with most computable members, a light one
        // (elementwise, reshapes) before a heavy one (GEMMs, gathers,
        // reductions), so that every tree level keeps one GEMM.
        auto cost = [&](int g) {
          return std::make_pair(IsHeavy(rule_of_[members_[g][0]]), -static_cast<int64_t>(ready[g].size()));
        };
        g = *std::min_element(partial.begin(), partial.end(), [&](int a, int b) { return cost(a) < cost(b); });
        partial.erase(g);
      }
      std::vector<int> now = std::move(ready[g]);
      ready[g].clear();
      std::sort(now.begin(), now.end());
      unemitted[g] -= static_cast<int>(now.size());
      emitted += now.size();
      Emit(now);
      for (int i : now) {
        for (int s : successors_[i]) {
          if (--pending_[s] == 0) mark_ready(s);
        }
      }
    }
  }

  // ---- Emission ------------------------------------------------------------------

  Var NewBinding(std::string_view op, std::vector<Expr> args, const Attrs& attrs, const SourceLoc& loc) {
    return out_.Op(op, std::move(args), attrs, loc);
  }

  Ref RefOf(const Expr& atom) const {
    if (atom->kind == ExprKind::kConstant) return AtomRef(atom);
    return refs_.at(atom.get());
  }

  Expr Materialize(const Ref& ref) {
    switch (ref.kind) {
      case Ref::Kind::kAtom: return ref.atom;
      case Ref::Kind::kRow: {
        auto key = std::make_tuple(ref.batch, ref.output, ref.row);
        auto it = rows_.find(key);
        if (it != rows_.end()) return it->second;
        const Var& stacked = batches_[ref.batch].outputs[ref.output];
        // One row of a batch, read as it lies: lowering views it.
        Var row = NewBinding("take", {stacked, MakeConstant(Tensor::ScalarOf(DType::kI64, ref.row))}, {},
                             InLane(stacked->loc, batches_[ref.batch].lane));
        rows_.emplace(key, row);
        return row;
      }
      case Ref::Kind::kTuple: break;
    }
    throw JitFailure("batch: a tuple used where a tensor is expected");
  }

  Expr MaterializeResult(const Expr& e) {
    if (auto* t = As<TupleNode>(e)) {
      std::vector<Expr> fields;
      for (const Expr& f : t->fields) fields.push_back(MaterializeResult(f));
      return MakeTuple(std::move(fields), t->loc);
    }
    return MaterializeRef(RefOf(e));
  }

  Expr MaterializeRef(const Ref& ref) {
    if (ref.kind != Ref::Kind::kTuple) return Materialize(ref);
    std::vector<Expr> fields;
    for (const Ref& f : ref.fields) fields.push_back(MaterializeRef(f));
    return MakeTuple(std::move(fields));
  }

  // The rows stacked in order: a gather per run of rows from one batch (none
  // for a batch read whole), a stack per run of other values, one concat.
  Expr Concatenate(const std::vector<Ref>& rows, const TensorType& member, const SourceLoc& loc) {
    std::vector<Expr> pieces;
    for (size_t i = 0; i < rows.size();) {
      const Ref& r = rows[i];
      if (r.kind != Ref::Kind::kRow) {
        std::vector<Expr> values;
        for (; i < rows.size() && rows[i].kind != Ref::Kind::kRow; ++i) values.push_back(Materialize(rows[i]));
        stats_.copied_bytes += static_cast<int64_t>(values.size()) * NumBytes(member);
        pieces.push_back(NewBinding("stack", std::move(values), {{"axis", int64_t{0}}}, loc));
        continue;
      }
      std::vector<int64_t> indices;
      size_t j = i;
      for (; j < rows.size() && rows[j].kind == Ref::Kind::kRow && rows[j].batch == r.batch &&
             rows[j].output == r.output;
           ++j) {
        indices.push_back(rows[j].row);
      }
      const Var& source = batches_[r.batch].outputs[r.output];
      bool consecutive = true;  // then lowering views the rows, copying nothing
      for (size_t k = 1; consecutive && k < indices.size(); ++k) consecutive = indices[k] == indices[0] + static_cast<int64_t>(k);
      bool whole = consecutive && indices[0] == 0 && static_cast<int64_t>(indices.size()) == TensorTypeOf(source).shape[0];
      if (whole) {
        pieces.push_back(source);
      } else {
        auto count = static_cast<int64_t>(indices.size());
        Expr index = MakeConstant(Tensor::FromVector<int64_t>({count}, indices));
        pieces.push_back(NewBinding("take", {source, index}, {}, loc));
        if (!consecutive) stats_.copied_bytes += count * NumBytes(member);
      }
      i = j;
    }
    if (pieces.size() == 1) return pieces[0];
    stats_.copied_bytes += static_cast<int64_t>(rows.size()) * NumBytes(member);
    return NewBinding("concat", pieces, {{"axis", int64_t{0}}}, loc);
  }

  // The members' values stacked: [rows.size(), ...member].
  Expr Stack(const std::vector<Ref>& rows, const TensorType& member, const SourceLoc& loc) {
    std::string key;
    for (const Ref& r : rows) r.AppendKey(key);
    auto memo = stacks_.find(key);
    if (memo != stacks_.end()) return memo->second;
    // Runs of consecutive rows from one batch are one gather each. When the
    // rows interleave a few batches (a node's children come from every level
    // below it), that is a gather per row: instead, one gather per batch, then
    // a permutation back into the members' order.
    std::vector<std::pair<int, int>> sources;  // (batch, output) of each run, in order
    for (size_t i = 0; i < rows.size(); ++i) {
      bool run_start = i == 0 || rows[i].kind != Ref::Kind::kRow || rows[i - 1].kind != Ref::Kind::kRow ||
                       rows[i].batch != rows[i - 1].batch || rows[i].output != rows[i - 1].output;
      if (run_start) sources.push_back(rows[i].kind == Ref::Kind::kRow ? std::make_pair(rows[i].batch, rows[i].output)
                                                                      : std::make_pair(-1, static_cast<int>(i)));
    }
    std::vector<std::pair<int, int>> distinct = sources;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    Expr stacked;
    if (distinct.size() + 2 < sources.size()) {  // fewer operations that way
      std::map<std::pair<int, int>, std::vector<size_t>> members_of;  // by source, in order
      for (size_t i = 0; i < rows.size(); ++i) {
        members_of[rows[i].kind == Ref::Kind::kRow ? std::make_pair(rows[i].batch, rows[i].output)
                                                   : std::make_pair(-1, static_cast<int>(i))]
            .push_back(i);
      }
      std::vector<Ref> grouped;
      std::vector<int64_t> position(rows.size());  // of each member's row in `grouped`
      for (const auto& [source, members] : members_of) {
        for (size_t i : members) {
          position[i] = static_cast<int64_t>(grouped.size());
          grouped.push_back(rows[i]);
        }
      }
      Expr gathered = Concatenate(grouped, member, loc);
      Expr permutation = MakeConstant(Tensor::FromVector<int64_t>({static_cast<int64_t>(rows.size())}, position));
      stacked = NewBinding("take", {gathered, permutation}, {}, loc);
      stats_.copied_bytes += static_cast<int64_t>(rows.size()) * NumBytes(member);
    } else {
      stacked = Concatenate(rows, member, loc);
    }
    stacks_.emplace(std::move(key), stacked);
    return stacked;
  }

  void EmitAlone(int i) {
    const Binding& b = in_.bindings[i];
    const ExprNode* var = b.var.get();
    if (IsAtom(b.value)) {
      refs_[var] = RefOf(b.value);
    } else if (auto* t = As<TupleNode>(b.value)) {
      Ref r;
      r.kind = Ref::Kind::kTuple;
      for (const Expr& f : t->fields) r.fields.push_back(RefOf(f));
      refs_[var] = std::move(r);
    } else if (auto* p = As<ProjNode>(b.value)) {
      Ref tuple = RefOf(p->tuple);
      if (tuple.kind == Ref::Kind::kTuple) {
        refs_[var] = tuple.fields.at(p->index);
      } else {
        out_.Append(b.var, MakeProj(tuple.atom, p->index, p->loc));
        refs_[var] = AtomRef(b.var);
      }
    } else {
      auto* call = As<OpCallNode>(b.value);
      std::vector<Expr> args;
      for (const Expr& a : call->args) args.push_back(Materialize(RefOf(a)));
      out_.Append(b.var, std::make_shared<OpCallNode>(call->op, std::move(args), call->attrs, InLane(call->loc, lane_of_[i])));
      refs_[var] = AtomRef(b.var);
    }
  }

  // Layout: the order of a batch's rows is free, so pick the one that lets an
  // operand be read as it lies. The operand chosen is the one whose members
  // are distinct rows of earlier batches from the fewest batches (the rows of
  // one batch are then read in order: whole or in consecutive blocks, which
  // lowering views instead of copying); its rows sorted give the members'
  // order. Orders propagate: a cell's elementwise chain keeps its GEMM's rows.
  void OrderByLayout(std::vector<int>& members, std::vector<std::vector<Ref>>& operands, Rule rule) const {
    int best = -1;
    size_t best_sources = 0;
    for (size_t p = 0; p < operands.size(); ++p) {
      if (MustShare(rule, p)) continue;
      std::vector<std::tuple<int, int, int64_t>> rows;
      for (const Ref& r : operands[p]) {
        if (r.kind != Ref::Kind::kRow) break;
        rows.emplace_back(r.batch, r.output, r.row);
      }
      if (rows.size() != members.size()) continue;
      std::sort(rows.begin(), rows.end());
      if (std::adjacent_find(rows.begin(), rows.end()) != rows.end()) continue;  // a row read twice
      size_t sources = 1;
      for (size_t i = 1; i < rows.size(); ++i) {
        sources += std::get<0>(rows[i]) != std::get<0>(rows[i - 1]) || std::get<1>(rows[i]) != std::get<1>(rows[i - 1]);
      }
      if (best < 0 || sources < best_sources) best = static_cast<int>(p), best_sources = sources;
    }
    if (best < 0) return;
    std::vector<size_t> order(members.size());
    std::iota(order.begin(), order.end(), 0);
    const std::vector<Ref>& key = operands[best];
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tie(key[a].batch, key[a].output, key[a].row) < std::tie(key[b].batch, key[b].output, key[b].row);
    });
    std::vector<int> sorted_members;
    for (size_t i : order) sorted_members.push_back(members[i]);
    members = std::move(sorted_members);
    for (std::vector<Ref>& refs : operands) {
      std::vector<Ref> sorted;
      for (size_t i : order) sorted.push_back(std::move(refs[i]));
      refs = std::move(sorted);
    }
  }

  void Emit(std::vector<int> members) {
    Rule rule = rule_of_[members[0]];
    if (members.size() < 2 || rule == Rule::kNone) {
      for (int i : members) EmitAlone(i);
      return;
    }
    const auto* first = As<OpCallNode>(in_.bindings[members[0]].value);
    const size_t arity = first->args.size();
    std::vector<std::vector<Ref>> operands(arity);
    for (size_t p = 0; p < arity; ++p) {
      for (int i : members) operands[p].push_back(RefOf(As<OpCallNode>(in_.bindings[i].value)->args[p]));
    }
    OrderByLayout(members, operands, rule);
    std::vector<bool> stacked(arity, false);
    bool any_stacked = false, degenerate = false;
    for (size_t p = 0; p < arity; ++p) {
      if (MustShare(rule, p)) continue;
      const Ref& ref0 = operands[p][0];
      stacked[p] = std::any_of(operands[p].begin(), operands[p].end(), [&](const Ref& r) { return !r.SameAs(ref0); });
      any_stacked |= stacked[p];
      degenerate |= MustStack(rule, p) && !stacked[p];
    }
    if (!any_stacked || degenerate) {  // identical instances: common-subexpression elimination's job
      for (int i : members) EmitAlone(i);
      return;
    }
    const int64_t k = static_cast<int64_t>(members.size());
    const SourceLoc loc = InLane(first->loc, lane_of_[members[0]]);
    std::vector<Expr> args;
    for (size_t p = 0; p < arity; ++p) {
      TensorType member = TensorTypeOf(first->args[p]);
      args.push_back(stacked[p] ? Stack(operands[p], member, loc) : Materialize(operands[p][0]));
    }
    const OpCallNode in_lane(first->op, first->args, first->attrs, loc);
    std::vector<Var> outputs = EmitBatched(in_lane, rule, std::move(args), stacked, k);

    int batch = static_cast<int>(batches_.size());
    batches_.push_back({outputs, lane_of_[members[0]]});
    for (int64_t j = 0; j < k; ++j) {
      const Var& var = in_.bindings[members[j]].var;
      Ref row;
      row.kind = Ref::Kind::kRow;
      row.batch = batch;
      row.row = j;
      if (AsTuple(var->annotation)) {
        Ref tuple;
        tuple.kind = Ref::Kind::kTuple;
        for (size_t o = 0; o < outputs.size(); ++o) {
          row.output = static_cast<int>(o);
          tuple.fields.push_back(row);
        }
        refs_[var.get()] = std::move(tuple);
      } else {
        refs_[var.get()] = row;
      }
    }
    ++stats_.groups;
    stats_.batched_ops += k;
  }

  // The operator applied to stacked operands; returns its stacked outputs.
  std::vector<Var> EmitBatched(const OpCallNode& call, Rule rule, std::vector<Expr> args,
                               const std::vector<bool>& stacked, int64_t k) {
    return EmitStackedOp(out_, call, rule, std::move(args), stacked, k);
  }
};

}  // namespace

std::string BatchStats::ToString() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, "groups=%lld (%lld ops) ops %lld -> %lld copied=%.1fKiB lanes=%d",
                static_cast<long long>(groups), static_cast<long long>(batched_ops),
                static_cast<long long>(ops_before), static_cast<long long>(ops_after), copied_bytes / 1024.0, lanes);
  return buf;
}

Func Batch(const Func& program, BatchStats* stats, int max_lanes) {
  auto start = std::chrono::steady_clock::now();
  BatchStats local;
  BatchStats& s = stats ? *stats : local;
  s = BatchStats{};
  Func out = Batcher(Decompose(program), s, max_lanes).Run();
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace pejit
