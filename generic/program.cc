#include "generic/program.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "ir/printer.h"
#include "ir/visitor.h"

namespace pejit::generic {

int64_t RowBucket(int64_t n) {
  if (n <= 4) return n;
  int64_t p = 4;
  while (true) {
    if (n <= p) return p;
    if (n <= p + p / 2) return p + p / 2;
    p *= 2;
  }
}

struct GenericProgram::Instance {
  int cell = -1;
  std::vector<int> children;              // per call site
  std::vector<const Tensor*> leaves;      // tensors the patterns bound
  std::vector<Slot> result;               // tensor leaves of the result (Place)
};

namespace {

bool Matches(const Pattern& p, const Value& v) {
  switch (p->kind) {
    case PatternKind::kWildcard:
    case PatternKind::kVar: return true;
    case PatternKind::kTuple:
      for (size_t i = 0; i < p->fields.size(); ++i) {
        if (!Matches(p->fields[i], v.fields()[i])) return false;
      }
      return true;
    case PatternKind::kCtor:
      if (v.kind() != Value::Kind::kAdt || v.tag() != p->tag || v.adt()->name != p->adt->name) return false;
      for (size_t i = 0; i < p->fields.size(); ++i) {
        if (!Matches(p->fields[i], v.fields()[i])) return false;
      }
      return true;
  }
  return false;
}

// What a variable bound to `v` contributes, in the order the builder's
// Decode reads it: structures and tensor leaves.
void Flatten(const Value& v, std::vector<const Value*>& structures, std::vector<const Tensor*>& leaves) {
  switch (v.kind()) {
    case Value::Kind::kTensor: leaves.push_back(&v.tensor()); return;
    case Value::Kind::kAdt: structures.push_back(&v); return;
    case Value::Kind::kTuple:
      for (const Value& f : v.fields()) Flatten(f, structures, leaves);
      return;
    default: throw Refusal("generic: a function value inside a structure");
  }
}

void BindPattern(const Pattern& p, const Value& v, std::vector<const Value*>& structures,
                 std::vector<const Tensor*>& leaves, std::string& types) {
  switch (p->kind) {
    case PatternKind::kWildcard: return;
    case PatternKind::kVar:
      EncodeValue(v, types);
      Flatten(v, structures, leaves);
      return;
    case PatternKind::kCtor:
    case PatternKind::kTuple:
      for (size_t i = 0; i < p->fields.size(); ++i) BindPattern(p->fields[i], v.fields()[i], structures, leaves, types);
      return;
  }
}

// The entry arguments' tensors outside structures, and the arguments'
// encoding with each tensor's share class (its index among them).
void EncodeRoot(const Value& v, std::vector<Tensor>& roots, std::vector<const Value*>& structures, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kTensor: {
      std::string t;
      EncodeValue(v, t);
      int32_t share = static_cast<int32_t>(roots.size());
      std::memcpy(t.data() + t.size() - sizeof share, &share, sizeof share);
      out += t;
      roots.push_back(v.tensor());
      return;
    }
    case Value::Kind::kAdt:
      out.push_back('S');
      structures.push_back(&v);
      return;
    case Value::Kind::kTuple: {
      out.push_back('U');
      int32_t n = static_cast<int32_t>(v.fields().size());
      out.append(reinterpret_cast<const char*>(&n), sizeof n);
      for (const Value& f : v.fields()) EncodeRoot(f, roots, structures, out);
      return;
    }
    default: throw Refusal("generic: a function value as an argument");
  }
}

void TensorLeaves(const ValueTree& v, std::vector<int>& out) {
  if (v.kind == ValueTree::Kind::kTensor) out.push_back(v.value);
  for (const ValueTree& f : v.fields) TensorLeaves(f, out);
}

}  // namespace

GenericProgram::GenericProgram(Snapshot module, std::string entry, GenericOptions options)
    : module_(std::move(module)), entry_(std::move(entry)), options_(options) {
  if (!module_->Find(entry_)) throw Refusal("generic: no definition @" + entry_);
  cell_functions_ = CellFunctions(*module_, entry_);
  // Without a match there is no structure to walk: every call of one
  // signature computes alike, which the per-signature tiers already serve.
  bool walks = false;
  for (const std::string& f : cell_functions_) {
    PostOrderVisit(module_->Get(f).func->body, [&](const Expr& e) { walks |= e->kind == ExprKind::kMatch; });
  }
  if (!walks) throw Refusal("generic: @" + entry_ + " matches on no structure; its shapes alone decide what it computes");
}

int GenericProgram::cells() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(cells_.size());
}

int GenericProgram::segment_codes() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(codes_.size());
}

std::vector<SegmentCode*> GenericProgram::codes() const {
  std::lock_guard lock(mu_);
  std::vector<SegmentCode*> out;
  for (const SegmentCode& c : codes_) out.push_back(const_cast<SegmentCode*>(&c));
  return out;
}

int GenericProgram::AddCell(Cell cell) {
  for (Segment& seg : cell.segments) {
    std::string text = PrintFunction("segment", seg.program);
    for (bool s : seg.shared) text.push_back(s ? 's' : 'r');
    auto [it, fresh] = code_by_text_.emplace(std::move(text), static_cast<int>(codes_.size()));
    if (fresh) {
      SegmentCode& code = codes_.emplace_back();
      code.id = it->second;
      code.program = seg.program;
      code.shared = seg.shared;
      for (const Var& p : seg.program->params) code.inputs.push_back(AsTensor(p->annotation)->type);
      const Expr* tail = &seg.program->body;
      while (auto* let = As<LetNode>(*tail)) {
        ++code.ops;
        tail = &let->body;
      }
      auto* result = As<TupleNode>(*tail);
      for (const Expr& f : result->fields) {
        const Type& t = f->kind == ExprKind::kVar ? static_cast<const VarNode&>(*f).annotation : f->checked_type;
        code.outputs.push_back(AsTensor(t) ? AsTensor(t)->type : TensorType{});
      }
    }
    seg.code = it->second;
  }
  cells_.push_back(std::move(cell));
  return static_cast<int>(cells_.size()) - 1;
}

int GenericProgram::NodeFor(const std::string& key, const std::vector<Answer>& answers) {
  std::variant<Question, Cell> built = BuildCell(*module_, cell_functions_, key, answers);
  TrieNode node;
  if (auto* q = std::get_if<Question>(&built)) {
    node.question = std::move(*q);
  } else {
    node.cell = AddCell(std::move(std::get<Cell>(built)));
  }
  nodes_.push_back(std::move(node));
  return static_cast<int>(nodes_.size()) - 1;
}

int GenericProgram::RootNode(const std::string& key) {
  auto it = roots_.find(key);
  if (it != roots_.end()) return it->second;
  int node = NodeFor(key, {});
  nodes_[node].key = key;
  nodes_[node].root = node;
  roots_.emplace(key, node);
  return node;
}

int GenericProgram::Walk(int root, std::vector<const Value*> structures, std::vector<Instance>& instances,
                         int depth) {
  if (depth > options_.max_depth) {
    throw Refusal("generic: the structure nests cells deeper than " + std::to_string(options_.max_depth));
  }
  int id = static_cast<int>(instances.size());
  instances.emplace_back();
  std::vector<Answer> path;
  int node = root;
  while (nodes_[node].cell < 0) {
    TrieNode& n = nodes_[node];
    Answer answer;
    std::string edge;  // the answer as the trie's edges spell it
    if (n.question.kind == Question::Kind::kMatch) {
      const Value& v = *structures.at(n.question.structure);
      const MatchNode& match = *n.question.match;
      int clause = -1;
      for (size_t c = 0; c < match.clauses.size() && clause < 0; ++c) {
        if (Matches(match.clauses[c].pattern, v)) clause = static_cast<int>(c);
      }
      if (clause < 0) {
        throw Refusal("generic: no clause of the match at " + match.loc.ToString() + " matches " + v.Describe());
      }
      answer.clause = clause;
      BindPattern(match.clauses[clause].pattern, v, structures, instances[id].leaves, answer.types);
      edge.append(reinterpret_cast<const char*>(&clause), sizeof clause);
      edge += answer.types;
    } else {
      if (n.callee_root < 0) n.callee_root = RootNode(n.question.callee_key);
      std::vector<const Value*> args;
      for (int s : n.question.structure_args) args.push_back(structures.at(s));
      int callee_root = nodes_[node].callee_root;
      int child = Walk(callee_root, std::move(args), instances, depth + 1);
      instances[id].children.push_back(child);
      answer.types = edge = cells_[instances[child].cell].result_key;
    }
    path.push_back(std::move(answer));
    auto it = nodes_[node].next.find(edge);
    int next;
    if (it != nodes_[node].next.end()) {
      next = it->second;
    } else {  // a new branch: build the cell from the root with every answer so far
      int from = nodes_[node].root;
      next = NodeFor(nodes_[from].key, path);
      nodes_[next].root = from;
      nodes_[node].next.emplace(std::move(edge), next);
    }
    node = next;
  }
  instances[id].cell = nodes_[node].cell;
  return id;
}

Schedule GenericProgram::Inspect(const std::vector<Value>& args) {
  auto start = std::chrono::steady_clock::now();
  Schedule schedule;
  std::vector<const Value*> structures;
  std::string encoded;
  for (const Value& a : args) EncodeRoot(a, schedule.roots, structures, encoded);
  std::vector<Instance> instances;

  std::lock_guard lock(mu_);
  int root = RootNode(InstanceKey(entry_, encoded));
  Walk(root, std::move(structures), instances, 0);

  // Place the segment instances in evaluation order, resolving every slot.
  std::vector<int> si_level, si_code;
  auto place = [&](auto& self, int id, const std::vector<Slot>& inputs) -> void {
    Instance& inst = instances[id];
    const Cell& cell = cells_[inst.cell];
    std::vector<int> seg_si(cell.segments.size(), -1);
    auto resolve = [&](int v) -> Slot {
      const Source& s = cell.sources[v];
      switch (s.kind) {
        case Source::Kind::kInput: return inputs.at(s.index);
        case Source::Kind::kStructLeaf: return Slot{Slot::Kind::kStruct, 0, 0, inst.leaves.at(s.index)};
        case Source::Kind::kSegment: return Slot{Slot::Kind::kRow, seg_si.at(s.index), s.output, nullptr};
        case Source::Kind::kCall:
          return instances[inst.children.at(s.index)].result.at(s.output);
        case Source::Kind::kConstant: return Slot{Slot::Kind::kConstant, 0, 0, &cell.constants.at(s.index)};
      }
      return {};
    };
    for (const Step& step : cell.steps) {
      if (!step.is_call) {
        const Segment& seg = cell.segments[step.index];
        int si = static_cast<int>(si_level.size());
        int level = 0;
        schedule.si_input_begin.push_back(static_cast<int>(schedule.si_inputs.size()));
        for (int v : seg.inputs) {
          Slot slot = resolve(v);
          if (slot.kind == Slot::Kind::kRow) level = std::max(level, si_level[slot.index] + 1);
          schedule.si_inputs.push_back(slot);
        }
        si_level.push_back(level);
        si_code.push_back(seg.code);
        seg_si[step.index] = si;
      } else {
        std::vector<int> leaves;
        for (const ValueTree& a : cell.calls[step.index].args) TensorLeaves(a, leaves);
        std::vector<Slot> child_inputs;
        child_inputs.reserve(leaves.size());
        for (int v : leaves) child_inputs.push_back(resolve(v));
        self(self, inst.children[step.index], child_inputs);
      }
    }
    std::vector<int> leaves;
    TensorLeaves(cell.result, leaves);
    inst.result.clear();
    for (int v : leaves) inst.result.push_back(resolve(v));
  };
  std::vector<Slot> root_inputs;
  for (size_t k = 0; k < schedule.roots.size(); ++k) root_inputs.push_back(Slot{Slot::Kind::kRoot, static_cast<int32_t>(k), 0, nullptr});
  place(place, 0, root_inputs);
  schedule.si_input_begin.push_back(static_cast<int>(schedule.si_inputs.size()));
  schedule.result = instances[0].result;
  schedule.result_type = cells_[instances[0].cell].result_type;
  schedule.instances = static_cast<int64_t>(instances.size());

  // Runs: the segment instances of one (level, program), by level.
  const int n = static_cast<int>(si_level.size());
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return std::tie(si_level[a], si_code[a]) < std::tie(si_level[b], si_code[b]);
  });
  schedule.si_run.assign(n, -1);
  schedule.si_row.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    int si = order[i];
    if (i == 0 || si_level[si] != si_level[order[i - 1]] || si_code[si] != si_code[order[i - 1]]) {
      Run run;
      run.code = &codes_[si_code[si]];
      run.level = si_level[si];
      schedule.runs.push_back(std::move(run));
    }
    Run& run = schedule.runs.back();
    schedule.si_run[si] = static_cast<int>(schedule.runs.size()) - 1;
    schedule.si_row[si] = static_cast<int>(run.members.size());
    run.members.push_back(si);
  }
  for (Run& run : schedule.runs) run.rows = RowBucket(static_cast<int64_t>(run.members.size()));
  schedule.levels = n ? si_level[order.back()] + 1 : 0;
  schedule.inspect_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return schedule;
}

}  // namespace pejit::generic
