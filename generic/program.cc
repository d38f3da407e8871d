#include "generic/program.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>

#include "ir/printer.h"
#include "ir/visitor.h"
#include "jit/lanes.h"
#include "ops/eager.h"
#include "support/machine_load.h"

namespace pejit::generic {

int64_t RowBucket(int64_t n) {
  if (n <= 8) return n;
  int64_t step = 2;  // a quarter of the octave's start: 8..16 by 2, 16..32 by 4, ...
  while (n > step * 8) step *= 2;
  return (n + step - 1) / step * step;
}

// One cell instance met by the walk. Its children, bound tensors, segment
// instances and result slots live in flat arrays of the walk (Walker).
struct GenericProgram::Instance {
  const Cell* cell = nullptr;
  int children = 0, leaves = 0;  // offsets into Walker::children / leaves
  int inputs = 0;                // offset into the input slots its caller passed (Place)
  int data_ops = 0;              // offset into what its data ops made (Place)
  int segments = 0;              // offset into the segment instance ids (Place)
  int guards = 0;                // offset into the guards placed (Inspection::guards), per cell guard
  int base_guard = -1;           // the guard it runs under, from a call inside a branch (or -1)
  int result = 0;                // offset into the result slots (Place)
};

namespace {

// Calls f(si) for each segment instance whose rows `place` reads: a row's,
// and through a select, its condition's and both its slots' (the one the
// run does not take is a branch's output that ran, or was skipped, before).
template <typename F>
void ForEachRow(const Inspection& s, const Place& place, F&& f) {
  if (place.kind == Place::Kind::kRow) {
    f(place.index);
  } else if (place.kind == Place::Kind::kMoved) {
    for (const MovedPlace::Block& b : s.moved[place.index].blocks) ForEachRow(s, b.source, f);
    for (const Place& term : s.moved[place.index].sum) ForEachRow(s, term, f);
  } else if (place.kind == Place::Kind::kSelect) {
    const SelectPlace& sel = s.selects[place.index];
    ForEachRow(s, sel.cond, f);
    ForEachRow(s, sel.then, f);
    ForEachRow(s, sel.otherwise, f);
  }
}

// Calls f(si) for each segment instance computing a condition of guard `g`
// (and its parents'), but for those another one waits for (GuardPlace::chained).
template <typename F>
void ForEachGuardRow(const Inspection& s, int g, F&& f) {
  for (; g >= 0; g = s.guards[g].parent) {
    ForEachRow(s, s.guards[g].cond, f);
    if (s.guards[g].chained) return;
  }
}

// Calls f(si) for each segment instance instance `i` waits for: those its
// inputs read, and those computing the conditions of its guard.
template <typename F>
void ForEachDependency(const Inspection& s, int i, F&& f) {
  for (int k = s.si_input_begin[i]; k < s.si_input_begin[i + 1]; ++k) ForEachRow(s, s.si_inputs[k], f);
  if (!s.si_guard.empty()) ForEachGuardRow(s, s.si_guard[i], f);
}

// A structure the walk meets: a value of the call's arguments, or one a cell
// built (ValueTree::Kind::kBuilt, in its cell or in the question that passed
// it on), with the instance whose values its tensors are and where the walk
// saved that instance's structures, which the one built may hold.
struct StructRef {
  const Value* value = nullptr;
  const ValueTree* built = nullptr;
  int32_t instance = -1;
  int32_t frame = -1;  // into Walker::frames
};

// A tensor a pattern bound: one in the arguments' structures, or value
// `value` of instance `instance`, put in a structure that instance built.
struct Leaf {
  const Tensor* tensor = nullptr;
  int32_t instance = -1;
  int32_t value = -1;
};

}  // namespace

// The flat arrays of one walk.
struct GenericProgram::Walker {
  std::vector<Instance> instances;
  std::vector<int> children;                // per instance, its call sites' instances, in order
  std::vector<Leaf> leaves;                 // per instance, the tensors its patterns bound
  std::vector<StructRef> structures;        // a stack: each frame's structures from its base
  std::vector<StructRef> frames;            // frames saved for the structures built in them
  std::vector<std::vector<int>> pending;    // per depth: children of the instance being walked there
  std::vector<Leaf> leaf_stack;             // each frame's bound tensors from its base
  std::vector<StructRef> returned;          // a callee's result structures, reused
  std::string edge;                         // the answer being looked up, reused
  std::unordered_map<std::string, int> loop_depth;  // per loop's callee key: iterations on the walk's stack
  std::vector<Frontier> frontiers;                  // a frontier child is -1 - its index here
};

namespace {

// A pattern that binds or ignores whatever it meets: its value is not read
// (the walk is bound by memory latency: each value read may be a miss).
bool Irrefutable(const Pattern& p) { return p->kind == PatternKind::kWildcard || p->kind == PatternKind::kVar; }

bool Matches(const Pattern& p, const Value& v) {
  switch (p->kind) {
    case PatternKind::kWildcard:
    case PatternKind::kVar: return true;
    case PatternKind::kCtor:
      if (v.kind() != Value::Kind::kAdt || v.tag() != p->tag) return false;
      if (v.adt() != p->adt && v.adt()->name != p->adt->name) return false;  // one definition, or its copy
      [[fallthrough]];
    case PatternKind::kTuple:
      for (size_t i = 0; i < p->fields.size(); ++i) {
        if (!Irrefutable(p->fields[i]) && !Matches(p->fields[i], v.fields()[i])) return false;
      }
      return true;
  }
  return false;
}

bool Matches(const Pattern& p, const StructRef& s, const std::vector<StructRef>& frames);

// Whether `p` matches `v`, a part of a structure a cell built, whose
// structures from elsewhere are at `frame`.
bool MatchesBuilt(const Pattern& p, const ValueTree& v, int frame, const std::vector<StructRef>& frames) {
  if (Irrefutable(p)) return true;
  switch (v.kind) {
    case ValueTree::Kind::kStructure: return Matches(p, frames[frame + v.value], frames);
    case ValueTree::Kind::kBuilt:
      if (p->kind != PatternKind::kCtor || v.tag != p->tag || v.adt->name != p->adt->name) return false;
      break;
    case ValueTree::Kind::kTuple:
      if (p->kind != PatternKind::kTuple) return false;
      break;
    default: return false;
  }
  for (size_t i = 0; i < p->fields.size(); ++i) {
    if (!MatchesBuilt(p->fields[i], v.fields[i], frame, frames)) return false;
  }
  return true;
}

bool Matches(const Pattern& p, const StructRef& s, const std::vector<StructRef>& frames) {
  return s.value ? Matches(p, *s.value) : MatchesBuilt(p, *s.built, s.frame, frames);
}

// What a variable bound to `v` contributes, in the order the builder's
// Decode reads it: structures and tensor leaves.
void Flatten(const Value& v, std::vector<StructRef>& structures, std::vector<Leaf>& leaves) {
  switch (v.kind()) {
    case Value::Kind::kTensor: leaves.push_back({&v.tensor()}); return;
    case Value::Kind::kAdt: structures.push_back({&v}); return;
    case Value::Kind::kTuple:
      for (const Value& f : v.fields()) Flatten(f, structures, leaves);
      return;
    default: throw Refusal("generic: a function value inside a structure");
  }
}

void BindPattern(const Pattern& p, const Value& v, std::vector<StructRef>& structures, std::vector<Leaf>& leaves,
                 std::string& types) {
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

// BindPattern on `v`, a part of a structure instance `instance` built.
void BindBuilt(const Pattern& p, const ValueTree& v, int instance, int frame, const std::vector<StructRef>& frames,
               std::vector<StructRef>& structures, std::vector<Leaf>& leaves, std::string& types);

void BindRef(const Pattern& p, const StructRef& s, const std::vector<StructRef>& frames,
             std::vector<StructRef>& structures, std::vector<Leaf>& leaves, std::string& types) {
  if (s.value) return BindPattern(p, *s.value, structures, leaves, types);
  BindBuilt(p, *s.built, s.instance, s.frame, frames, structures, leaves, types);
}

void FlattenBuilt(const ValueTree& v, int instance, int frame, const std::vector<StructRef>& frames,
                  std::vector<StructRef>& structures, std::vector<Leaf>& leaves) {
  switch (v.kind) {
    case ValueTree::Kind::kTensor: leaves.push_back({nullptr, instance, v.value}); return;
    case ValueTree::Kind::kStructure: structures.push_back(frames[frame + v.value]); return;
    case ValueTree::Kind::kBuilt: structures.push_back({nullptr, &v, instance, frame}); return;
    case ValueTree::Kind::kTuple:
      for (const ValueTree& f : v.fields) FlattenBuilt(f, instance, frame, frames, structures, leaves);
      return;
    case ValueTree::Kind::kFunction: throw Refusal("generic: a function value inside a structure");
    case ValueTree::Kind::kBottom: throw std::logic_error("generic: a probe's value in a walk");
  }
}

void BindBuilt(const Pattern& p, const ValueTree& v, int instance, int frame, const std::vector<StructRef>& frames,
               std::vector<StructRef>& structures, std::vector<Leaf>& leaves, std::string& types) {
  if (p->kind == PatternKind::kWildcard) return;
  if (p->kind == PatternKind::kVar) {
    types += v.key;
    FlattenBuilt(v, instance, frame, frames, structures, leaves);
    return;
  }
  if (v.kind == ValueTree::Kind::kStructure) {  // a pattern looking into one it holds
    return BindRef(p, frames[frame + v.value], frames, structures, leaves, types);
  }
  for (size_t i = 0; i < p->fields.size(); ++i) {
    BindBuilt(p->fields[i], v.fields[i], instance, frame, frames, structures, leaves, types);
  }
}

// The entry arguments' tensors outside structures, and the arguments'
// encoding with each tensor's share class (its index among them).
void EncodeRoot(const Value& v, std::vector<Tensor>& roots, std::vector<const Value*>& structures, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kTensor:
      EncodeTensor(v.tensor().type(), static_cast<int32_t>(roots.size()), out);
      roots.push_back(v.tensor());
      return;
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

// The tensors a call passes or a cell returns as such: those in structures
// the cell built travel with the structure (the walk's Leaf).
void TensorLeaves(const ValueTree& v, std::vector<int>& out) {
  if (v.kind == ValueTree::Kind::kTensor) out.push_back(v.value);
  if (v.kind == ValueTree::Kind::kBuilt) return;
  for (const ValueTree& f : v.fields) TensorLeaves(f, out);
}

// The structures a result holds, in the order the caller's builder numbers
// them (its result key's order): those of a callee's frame from `base`, and those the
// callee built, with that frame saved at `*frame` (saved once, on need).
void ResultStructures(const ValueTree& v, int instance, size_t base, int* frame, std::vector<StructRef>& structures,
                      std::vector<StructRef>& frames, std::vector<StructRef>& out) {
  switch (v.kind) {
    case ValueTree::Kind::kStructure: out.push_back(structures[base + v.value]); return;
    case ValueTree::Kind::kBuilt:
      if (*frame < 0) {
        *frame = static_cast<int>(frames.size());
        frames.insert(frames.end(), structures.begin() + base, structures.end());
      }
      out.push_back({nullptr, &v, instance, *frame});
      return;
    case ValueTree::Kind::kTuple:
      for (const ValueTree& f : v.fields) ResultStructures(f, instance, base, frame, structures, frames, out);
      return;
    default: return;
  }
}

}  // namespace

GenericProgram::GenericProgram(Snapshot module, std::string entry, GenericOptions options,
                               std::shared_ptr<SegmentTable> segments)
    : module_(std::move(module)),
      entry_(std::move(entry)),
      options_(options),
      segments_(segments ? std::move(segments) : std::make_shared<SegmentTable>()) {
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

bool LanesPay(int lanes, int cores, std::optional<double> others_cores) {
  if (!others_cores || cores <= 0) return true;
  return cores - *others_cores >= lanes - 0.3;
}

int GenericProgram::cells() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(cells_.size());
}

int GenericProgram::segment_codes() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(std::set<SegmentCode*>(codes_.begin(), codes_.end()).size());
}

std::vector<int64_t> PadKey(const std::vector<PadTo>& pads) {
  std::vector<int64_t> key;
  for (const PadTo& p : pads) {
    if (p.extent > 0) key.push_back((p.extent * 2 + (p.masked ? 1 : 0)) << 32 | p.axes);
  }
  return key;
}

std::vector<PadTo> RunPadding(const SegmentCode& code, int members, const std::function<int64_t(int, int)>& length) {
  std::vector<PadTo> pads;
  if (code.padded.empty()) return pads;
  pads.resize(code.padded.size());
  std::vector<std::pair<int64_t, int64_t>> range(code.padded.size(), {INT64_MAX, 0});  // shortest, longest
  int64_t shortest = INT64_MAX, longest = 0;
  for (size_t p = 0; p < code.padded.size(); ++p) {
    if (!code.padded[p]) continue;
    for (int m = 0; m < members; ++m) {
      const int64_t n = length(m, static_cast<int>(p));
      range[p] = {std::min(range[p].first, n), std::max(range[p].second, n)};
    }
    shortest = std::min(shortest, range[p].first);
    longest = std::max(longest, range[p].second);
  }
  const int64_t extent = shortest == longest && longest >= 2 ? longest : PadBucket(longest);
  for (size_t p = 0; p < code.padded.size(); ++p) {
    if (code.padded[p]) pads[p] = {extent, range[p].first != extent, code.padded[p]};
  }
  return pads;
}

namespace {

// How a segment program pads (generic/pad.h): the program padded at the
// key extent, per input its axes padded (0: none), and per input why it
// was not, where padding it was tried.
struct Probed {
  PaddedSegment keyed;
  std::vector<uint32_t> padded;
  std::vector<std::string> why;
};

// Pads every input whose first axis may be its example's length, as far as
// the program allows it: a data input along every axis of that length
// first (an adjacency (n, n)), then along its first; an input of length 1
// only with `ones`. Inputs that pad only together (a graph's adjacency
// times its node states) are tried all at once first; else one at a time,
// each kept if the program pads with it and those before, again while one
// more pads.
Probed ProbePadding(const Func& program, const std::vector<bool>& shared, const std::vector<bool>& data, bool ones) {
  const size_t n = shared.size();
  Probed out{{program, {}}, std::vector<uint32_t>(n, 0), std::vector<std::string>(n)};
  std::vector<std::vector<uint32_t>> tries(n);
  for (size_t i = 0; i < n; ++i) {
    const TensorType& t = AsTensor(program->params[i]->annotation)->type;
    if (shared[i] || t.rank() == 0 || t.shape[0] < (ones ? 1 : 2)) continue;
    uint32_t all = 0;
    for (int a = 0; a < t.rank(); ++a) all |= data[i] && t.shape[a] == t.shape[0] ? 1u << a : 0u;
    tries[i] = all > 1 ? std::vector<uint32_t>{all, 1} : std::vector<uint32_t>{1};
  }
  std::vector<PadTo> probe(n);
  auto keep = [&] {
    for (size_t i = 0; i < n; ++i) out.padded[i] = probe[i].extent ? probe[i].axes : 0;
  };
  for (size_t k = 0; k < 2; ++k) {
    for (size_t i = 0; i < n; ++i) {
      probe[i] = tries[i].empty() ? PadTo{} : PadTo{kPadKeyExtent, true, tries[i][std::min(k, tries[i].size() - 1)]};
    }
    try {
      out.keyed = PadSegment(program, probe);
      keep();
      return out;
    } catch (const Refusal&) {
      probe.assign(n, PadTo{});
    }
  }
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i < n; ++i) {
      for (size_t k = 0; k < tries[i].size() && !probe[i].extent; ++k) {
        probe[i] = {kPadKeyExtent, true, tries[i][k]};
        try {
          out.keyed = PadSegment(program, probe);
          again = true;
        } catch (const Refusal& e) {
          probe[i] = {};
          out.why[i] = e.what();
        }
      }
    }
  }
  keep();
  return out;
}

}  // namespace

SegmentCode* SegmentTable::Intern(const Func& program, const std::vector<bool>& shared, const std::vector<bool>& data) {
  // The key is the program padded (ProbePadding), so that every length of
  // it has one code. A length of 1 joins the code longer ones made, but
  // makes none: an axis of 1 is more often a row than a length (a leaf's
  // token vector, a recursion's state row), and padding every run of rows
  // to 2 would double its work.
  Probed probed = ProbePadding(program, shared, data, /*ones=*/false);
  std::optional<Probed> joined;
  for (size_t i = 0; i < shared.size() && !joined; ++i) {
    const TensorType& t = AsTensor(program->params[i]->annotation)->type;
    if (!shared[i] && t.rank() > 0 && t.shape[0] == 1) joined = ProbePadding(program, shared, data, /*ones=*/true);
  }
  std::string unpadded;
  for (size_t i = 0; i < shared.size() && unpadded.empty(); ++i) {
    if (!probed.padded[i] && !probed.why[i].empty()) {
      unpadded = "input " + std::to_string(i) + " " + AsTensor(program->params[i]->annotation)->type.ToString() +
                 ": " + probed.why[i];
    }
  }
  auto key_of = [&](const Func& f, const std::vector<uint32_t>& pads) {
    std::string text = PrintFunction("segment", f);
    for (size_t i = 0; i < shared.size(); ++i) {
      text.push_back(shared[i] ? 's' : pads[i] ? 'p' : data[i] ? 'd' : 'r');
      if (pads[i]) text += std::to_string(pads[i]);
    }
    PostOrderVisit(f->body, [&](const Expr& e) {  // the printer abbreviates large constants
      if (auto* c = As<ConstantNode>(e)) text.append(static_cast<const char*>(c->value.raw_data()), c->value.nbytes());
    });
    return text;
  };
  std::string text = key_of(probed.keyed.program, probed.padded);
  std::string with_ones = joined && joined->padded != probed.padded ? key_of(joined->keyed.program, joined->padded) : "";
  std::lock_guard lock(mu_);
  if (!with_ones.empty() && by_text_.contains(with_ones)) {
    probed = std::move(*joined);
    text = std::move(with_ones);
  }
  auto [it, fresh] = by_text_.emplace(std::move(text), nullptr);
  if (!fresh) return it->second;
  SegmentCode& code = codes_.emplace_back();
  code.id = static_cast<int>(codes_.size()) - 1;
  code.instrument = &instrument_;
  code.program = program;
  code.shared = shared;
  code.data = data;
  if (std::any_of(probed.padded.begin(), probed.padded.end(), [](uint32_t axes) { return axes != 0; })) {
    code.padded = std::move(probed.padded);
    code.output_length = std::move(probed.keyed.lengths);
  }
  code.unpadded = std::move(unpadded);
  int per_row = 0, once = 0;
  for (bool s : shared) code.input_slot.push_back(s ? once++ : per_row++);
  for (const Var& p : program->params) code.inputs.push_back(AsTensor(p->annotation)->type);
  const Expr* tail = &program->body;
  while (auto* let = As<LetNode>(*tail)) {
    ++code.ops;
    code.work += OperationWork(let->var, let->value);
    tail = &let->body;
  }
  for (const Expr& f : As<TupleNode>(*tail)->fields) {
    const Type& t = f->kind == ExprKind::kVar ? static_cast<const VarNode&>(*f).annotation : f->checked_type;
    code.outputs.push_back(AsTensor(t) ? AsTensor(t)->type : TensorType{});
  }
  it->second = &code;
  return &code;
}

std::vector<SegmentCode*> SegmentTable::codes() const {
  std::lock_guard lock(mu_);
  std::vector<SegmentCode*> out;
  for (const SegmentCode& c : codes_) out.push_back(const_cast<SegmentCode*>(&c));
  return out;
}

int GenericProgram::AddCell(Cell cell) {
  for (Segment& seg : cell.segments) {
    if ((seg.moves = MovesOf(seg.program))) continue;  // placed, not run
    // Instances of one segment program batch together only when they share
    // the same entry tensors (two layers' cells may be alike but for their
    // weights): the run's id is the program and those tensors.
    SegmentCode* code = segments_->Intern(seg.program, seg.shared, seg.data);
    auto [it, fresh] = run_id_.emplace(std::make_pair(code, seg.share_roots), static_cast<int>(codes_.size()));
    if (fresh) {
      codes_.push_back(code);
      run_roots_.push_back(&it->first.second);  // a map's keys stay where they are
    }
    seg.code = it->second;
    for (size_t k = 0; k < seg.inputs.size(); ++k) {
      if (!seg.shared[k]) seg.row_inputs.push_back(seg.inputs[k]);
    }
  }
  for (const CallSite& call : cell.calls) {
    std::vector<int> leaves;
    for (const ValueTree& a : call.args) TensorLeaves(a, leaves);
    std::erase_if(leaves, [&](int v) { return cell.sources[v].kind == Source::Kind::kRoot; });
    cell.call_leaves.push_back(std::move(leaves));
  }
  TensorLeaves(cell.result, cell.result_leaves);
  cells_.push_back(std::move(cell));
  return static_cast<int>(cells_.size()) - 1;
}

GenericProgram::TrieNode* GenericProgram::NodeFor(const std::string& key, const std::vector<Answer>& answers) {
  std::variant<Question, Cell> built = BuildCell(*module_, cell_functions_, key, answers);
  TrieNode& node = nodes_.emplace_back();
  if (auto* q = std::get_if<Question>(&built)) {
    node.question = std::move(*q);
  } else {
    node.cell = AddCell(std::move(std::get<Cell>(built)));
  }
  return &node;
}

GenericProgram::TrieNode* GenericProgram::RootNode(const std::string& key) {
  auto it = roots_.find(key);
  if (it != roots_.end()) return it->second;
  TrieNode* node = NodeFor(key, {});
  node->key = key;
  node->root = node;
  roots_.emplace(key, node);
  return node;
}

int GenericProgram::UnrollOf(const std::string& loop) const {
  auto it = unroll_.find(loop);
  return it == unroll_.end() ? kFirstUnroll : it->second;
}

void GenericProgram::Deepen(const Deeper& deeper) {
  std::lock_guard lock(mu_);
  const Frontier& f = deeper.frontier;
  int& unroll = unroll_.emplace(f.key, kFirstUnroll).first->second;
  unroll = std::max(unroll, 2 * std::max(f.depth, 1));
  // Unrolled iterations nest in the walk as cells do: half its depth is
  // left to the structure around the loop.
  if (unroll > options_.max_depth / 2) {
    throw Refusal("generic: the loop @" + f.key.substr(0, f.key.find('\0')) + " ran past " + std::to_string(f.depth) +
                  " iterations, the most the walk unrolls (half of its depth, " + std::to_string(options_.max_depth) + ")");
  }
}

int GenericProgram::Walk(TrieNode* root, size_t base, Walker& w, int depth) {
  if (depth > options_.max_depth) {
    throw Refusal("generic: the structure nests cells deeper than " + std::to_string(options_.max_depth));
  }
  if (w.pending.size() <= static_cast<size_t>(depth)) w.pending.resize(depth + 1);
  w.pending[depth].clear();
  const size_t leaf_base = w.leaf_stack.size();  // this instance's bound tensors, in binding order
  // Numbered before its callees: a structure it builds and passes on names it.
  const int self = static_cast<int>(w.instances.size());
  w.instances.emplace_back();
  TrieNode* n = root;
  while (n->cell < 0) {
    Answer answer;
    std::string& edge = w.edge;  // the answer as the trie's edges spell it
    edge.clear();
    if (n->question.kind == Question::Kind::kMatch) {
      const StructRef v = w.structures[base + n->question.structure];
      const MatchNode& match = *n->question.match;
      int clause = -1;
      for (size_t c = 0; c < match.clauses.size() && clause < 0; ++c) {
        if (Matches(match.clauses[c].pattern, v, w.frames)) clause = static_cast<int>(c);
      }
      if (clause < 0) {
        throw Refusal("generic: no clause of the match at " + match.loc.ToString() + " matches " +
                      (v.value ? v.value->Describe() : "the structure built as " + v.built->adt->ctors[v.built->tag].name));
      }
      edge.append(reinterpret_cast<const char*>(&clause), sizeof clause);
      BindRef(match.clauses[clause].pattern, v, w.frames, w.structures, w.leaf_stack, edge);
      answer.clause = clause;
    } else if (int* unrolled = n->question.guarded && n->question.structure_args.empty()
                                   ? &w.loop_depth[n->question.callee_key]
                                   : nullptr;
               unrolled && *unrolled >= UnrollOf(n->question.callee_key)) {
      // A loop's iteration past the depth unrolled: a frontier, its result
      // key inferred, its instance not walked.
      const std::string& key = n->question.callee_key;
      auto probed = probed_.find(key);
      if (probed == probed_.end()) {
        bool structure = false;
        std::string result = ProbeResultKey(*module_, cell_functions_, key, &structure);
        if (structure) {
          throw Refusal("generic: @" + key.substr(0, key.find('\0')) +
                        ", a loop the data ends, returns a structure; the tier unrolls loops over tensors");
        }
        probed = probed_.emplace(key, std::move(result)).first;
      }
      edge = probed->second;
      w.pending[depth].push_back(-1 - static_cast<int>(w.frontiers.size()));
      w.frontiers.push_back({key, *unrolled});
    } else {
      const Question& q = n->question;
      if (!n->callee_root) n->callee_root = RootNode(q.callee_key);
      if (unrolled) ++*unrolled;
      const size_t child_base = w.structures.size();
      int frame = -1;  // this instance's structures, saved for those it built and passes
      for (int s : q.structure_args) {
        if (s >= 0) {
          const StructRef passed = w.structures[base + s];
          w.structures.push_back(passed);
          continue;
        }
        if (frame < 0) {
          frame = static_cast<int>(w.frames.size());
          w.frames.insert(w.frames.end(), w.structures.begin() + base, w.structures.begin() + child_base);
        }
        w.structures.push_back({nullptr, &q.built[-1 - s], self, frame});
      }
      int child = Walk(n->callee_root, child_base, w, depth + 1);
      const Cell& callee = *w.instances[child].cell;
      w.returned.clear();
      if (!callee.result_type) {  // the structures it returns are this instance's next ones
        int callee_frame = -1;
        ResultStructures(callee.result, child, child_base, &callee_frame, w.structures, w.frames, w.returned);
      }
      w.structures.resize(child_base);
      w.structures.insert(w.structures.end(), w.returned.begin(), w.returned.end());
      w.pending[depth].push_back(child);
      edge = callee.result_key;
      if (unrolled) --*unrolled;
    }
    auto it = n->next.find(edge);
    if (it != n->next.end()) {
      n = it->second;
      continue;
    }
    // A new branch: build the cell from its root with every answer so far.
    answer.types = answer.clause >= 0 ? edge.substr(sizeof(int)) : edge;
    std::vector<Answer> path = n->path;
    path.push_back(std::move(answer));
    TrieNode* next = NodeFor(n->root->key, path);
    next->root = n->root;
    next->path = std::move(path);
    n->next.emplace(edge, next);
    n = next;
  }
  Instance& inst = w.instances[self];
  inst.cell = &cells_[n->cell];
  inst.children = static_cast<int>(w.children.size());
  w.children.insert(w.children.end(), w.pending[depth].begin(), w.pending[depth].end());
  inst.leaves = static_cast<int>(w.leaves.size());
  w.leaves.insert(w.leaves.end(), w.leaf_stack.begin() + leaf_base, w.leaf_stack.end());
  w.leaf_stack.resize(leaf_base);
  return self;
}

namespace {

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// A data op on one instance's operands. Most instances' operands have the
// exact types the cell knows (a node's label, a leaf's word): their result
// type is the cell's, and a view shares its operand's bytes. Type inference
// and an allocation per instance were a quarter of a tree walk.
Tensor RunDataOp(const DataOp& op, std::span<const Tensor> args) {
  const OpDef& def = *op.call->op;
  bool exact = op.out.IsFullyKnown();
  for (size_t a = 0; a < args.size() && exact; ++a) {
    exact = args[a].dtype() == op.in[a].dtype && args[a].shape() == op.in[a].shape;
  }
  if (!exact) return RunOp(def, args, op.call->attrs).at(0);
  if (def.moves == MoveKind::kView) return args[0].Reshaped(op.out.shape);
  Tensor out = Tensor::Empty(op.out.dtype, op.out.shape);
  def.kernel(args, std::span<Tensor>(&out, 1), op.call->attrs);
  return out;
}

}  // namespace

Inspection GenericProgram::Inspect(const std::vector<Value>& args) {
  auto start = std::chrono::steady_clock::now();
  std::vector<Tensor> roots;
  std::vector<const Value*> structures;
  std::string encoded;
  for (const Value& a : args) EncodeRoot(a, roots, structures, encoded);
  auto finish = [&](Inspection inspection, bool kept) {
    inspection.roots = std::move(roots);
    if (kept) inspection.new_cells = 0;
    inspection.kept = kept;
    inspection.inspect_ms = MillisSince(start);
    return inspection;
  };
  // A kept inspection is taken without waiting for a walk of another call in
  // progress (a worker walking a later minibatch ahead).
  if (std::optional<Inspection> kept = TakeKept(encoded, structures)) return finish(std::move(*kept), true);
  std::lock_guard lock(mu_);
  // The walk in progress may have been this call's own.
  if (std::optional<Inspection> kept = TakeKept(encoded, structures)) return finish(std::move(*kept), true);
  return finish(Walked(encoded, std::move(structures)), false);
}

Ahead GenericProgram::InspectAhead(const std::vector<Value>& args) {
  auto start = std::chrono::steady_clock::now();
  Kept kept;
  std::vector<Tensor> roots;
  std::vector<const Value*> structures;
  for (const Value& a : args) EncodeRoot(a, roots, structures, kept.encoded);
  auto variants_of = [](const Inspection& s) {
    Ahead ahead;
    std::set<std::tuple<SegmentCode*, std::vector<int64_t>, int64_t>> seen;
    // A padded input's length, where the walk knows it: a structure's
    // tensor's, or a run's output's of the length it has from one (a
    // graph's node states, round after round, from its features); -1
    // where only the call knows it (an entry tensor, a select).
    std::map<std::pair<int, int>, int64_t> known_rows;  // by instance and output
    auto length_of = [&](const Place& at) {
      std::vector<std::pair<int, int>> chain;  // rows whose length is the next place's
      const Place* place = &at;
      int64_t n = -1;
      for (;;) {
        auto first = [](const Shape& shape) { return shape.empty() ? int64_t{-1} : shape[0]; };
        if (place->kind == Place::Kind::kStruct || place->kind == Place::Kind::kConstant) {
          n = first(place->tensor->shape());
        } else if (place->kind == Place::Kind::kMoved) {
          n = first(s.moved[place->index].type.shape);
        } else if (place->kind == Place::Kind::kRow) {
          const std::pair<int, int> row{place->index, place->output};
          if (auto it = known_rows.find(row); it != known_rows.end()) {
            n = it->second;
          } else {
            const SegmentCode& code = *s.runs[s.si_run[place->index]].code;
            const int p = code.output_length.empty() ? -1 : code.output_length[place->output];
            if (p >= 0) {
              chain.push_back(row);
              place = &s.si_inputs[s.si_input_begin[place->index] + code.input_slot[p]];
              continue;
            }
            n = first(code.outputs[place->output].shape);
          }
        }
        break;
      }
      for (const auto& row : chain) known_rows[row] = n;
      return n;
    };
    for (const Run& run : s.runs) {
      bool known = true;
      std::vector<PadTo> pads = RunPadding(*run.code, static_cast<int>(run.members.size()), [&](int m, int p) {
        const int64_t n = length_of(s.si_inputs[s.si_input_begin[run.members[m]] + run.code->input_slot[p]]);
        known = known && n >= 0;
        return std::max<int64_t>(n, 1);
      });
      if (!known || !seen.emplace(run.code, PadKey(pads), run.rows).second) continue;
      ahead.variants.push_back({run.code, std::move(pads), run.rows});
    }
    return ahead;
  };
  std::lock_guard lock(mu_);
  {
    std::lock_guard kept_lock(kept_mu_);
    auto already = FindKept(kept.encoded, structures);  // prefetched twice: walked once
    if (already != kept_.end()) {
      Ahead ahead = variants_of(already->inspection);
      ahead.inspect_ms = MillisSince(start);
      return ahead;
    }
  }
  for (const Value* v : structures) kept.structures.push_back(v->fields_identity());
  kept.inspection = Walked(kept.encoded, std::move(structures));  // no roots: the call brings its own
  Ahead ahead = variants_of(kept.inspection);
  ahead.new_cells = kept.inspection.new_cells;
  std::lock_guard kept_lock(kept_mu_);
  kept_.push_back(std::move(kept));
  if (kept_.size() > kMaxKept) kept_.pop_front();
  ahead.inspect_ms = MillisSince(start);
  return ahead;
}

std::optional<Inspection> GenericProgram::TakeKept(const std::string& encoded, const std::vector<const Value*>& structures) {
  std::lock_guard lock(kept_mu_);
  auto kept = FindKept(encoded, structures);
  if (kept == kept_.end()) return std::nullopt;
  Inspection inspection = std::move(kept->inspection);
  kept_.erase(kept);
  return inspection;
}

std::deque<GenericProgram::Kept>::iterator GenericProgram::FindKept(const std::string& encoded,
                                                                    const std::vector<const Value*>& structures) {
  // Those whose minibatch is gone (never called, or called already) first:
  // an erase inside a deque invalidates every iterator.
  std::erase_if(kept_, [](const Kept& k) {
    return std::any_of(k.structures.begin(), k.structures.end(), [](const auto& s) { return s.expired(); });
  });
  return std::find_if(kept_.begin(), kept_.end(), [&](const Kept& k) {
    if (k.encoded != encoded || k.structures.size() != structures.size()) return false;
    for (size_t i = 0; i < structures.size(); ++i) {
      if (k.structures[i].lock() != structures[i]->fields_identity().lock()) return false;
    }
    return true;
  });
}

// Groups segment instances into runs in an order the dependencies allow.
// No inspection runs a program fewer times than the longest chain of its
// instances in which each depends, through any others, on the one before:
// an instance's *rank* is its place in such a chain (a Tree-LSTM's cell: the
// node's height, whatever the child counts that spread its ASAP level). An
// agenda (on-the-fly batching, Neubig et al. 2017) runs next a program all
// of whose instances of its lowest rank left are ready, with every ready one
// of its instances, so that programs reach that bound where the dependencies
// allow it; when none is complete (ranks of two programs can wait on each
// other), the program of fewest operators runs what is ready of it: a
// split run of a cheap program (a sum) costs less than one of a program
// with matrix products.
static void AgendaRuns(const std::vector<int>& si_level, const std::vector<int>& si_code,
                       const std::vector<SegmentCode*>& codes, const std::vector<const std::vector<int>*>& run_roots,
                       Inspection& inspection) {
  const int n = static_cast<int>(si_level.size());
  const int programs = static_cast<int>(codes.size());  // si_code numbers them
  // Ranks for programs of more than one instance (at most 64 of them, and
  // at most 2^24 chain entries in all: the others rank by ASAP level),
  // computed in evaluation order, which the dependencies follow.
  const int kRanked = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 24) / std::max(n, 1), 1, 64));
  std::vector<int> instances(programs, 0), column(programs, -1);
  for (int c : si_code) ++instances[c];
  int columns = 0;
  for (int p = 0; p < programs && columns < kRanked; ++p) {
    if (instances[p] > 1) column[p] = columns++;
  }
  std::vector<int> chain(static_cast<size_t>(n) * columns, 0), rank(n);
  std::vector<int> pending(n, 0), succ_begin(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    int* mine = chain.data() + static_cast<size_t>(i) * columns;
    ForEachDependency(inspection, i, [&](int before_si) {
      ++pending[i];
      ++succ_begin[before_si + 1];
      const int* before = chain.data() + static_cast<size_t>(before_si) * columns;
      for (int c = 0; c < columns; ++c) mine[c] = std::max(mine[c], before[c]);
    });
    const int c = column[si_code[i]];
    rank[i] = c < 0 ? si_level[i] : mine[c]++;
  }
  for (int i = 0; i < n; ++i) succ_begin[i + 1] += succ_begin[i];
  std::vector<int> succ(succ_begin[n]), fill(succ_begin.begin(), succ_begin.end() - 1);
  for (int i = 0; i < n; ++i) {
    ForEachDependency(inspection, i, [&](int before_si) { succ[fill[before_si]++] = i; });
  }
  // Per program and rank, instances not run yet and those of them ready.
  std::vector<int> rank_begin(programs + 1, 0);
  for (int i = 0; i < n; ++i) rank_begin[si_code[i] + 1] = std::max(rank_begin[si_code[i] + 1], rank[i] + 1);
  for (int p = 0; p < programs; ++p) rank_begin[p + 1] += rank_begin[p];
  std::vector<int> left(rank_begin[programs], 0), ready_n(rank_begin[programs], 0), lowest(programs, 0);
  for (int i = 0; i < n; ++i) ++left[rank_begin[si_code[i]] + rank[i]];

  std::vector<std::vector<int>> ready(programs);
  std::vector<int64_t> depth(programs, 0);
  std::vector<int> active;  // programs with ready instances
  auto make_ready = [&](int i) {
    int p = si_code[i];
    if (ready[p].empty()) active.push_back(p);
    ready[p].push_back(i);
    depth[p] += si_level[i];
    ++ready_n[rank_begin[p] + rank[i]];
  };
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) make_ready(i);
  }
  inspection.si_run.assign(n, -1);
  inspection.si_row.assign(n, -1);
  while (!active.empty()) {
    // depth[p] / |ready[p]| < depth[q] / |ready[q]|, ties to the lower program
    auto shallower = [&](int p, int q) {
      int64_t lhs = depth[p] * static_cast<int64_t>(ready[q].size()), rhs = depth[q] * static_cast<int64_t>(ready[p].size());
      return lhs < rhs || (lhs == rhs && p < q);
    };
    auto complete = [&](int p) {
      int at = rank_begin[p] + lowest[p];
      return ready_n[at] == left[at];
    };
    size_t best = active.size();
    for (size_t a = 0; a < active.size(); ++a) {
      if (complete(active[a]) && (best == active.size() || shallower(active[a], active[best]))) best = a;
    }
    if (best == active.size()) {  // the cheapest program runs what is ready of it
      best = 0;
      for (size_t a = 1; a < active.size(); ++a) {
        const int ops = codes[active[a]]->ops, best_ops = codes[active[best]]->ops;
        if (ops < best_ops || (ops == best_ops && shallower(active[a], active[best]))) best = a;
      }
    }
    const int p = active[best];
    active[best] = active.back();
    active.pop_back();
    Run run;
    run.code = codes[p];
    run.shared_roots = run_roots[p];
    run.members = std::move(ready[p]);
    ready[p].clear();
    depth[p] = 0;
    std::sort(run.members.begin(), run.members.end());  // rows in evaluation order
    const int r = static_cast<int>(inspection.runs.size());
    for (size_t row = 0; row < run.members.size(); ++row) {
      const int i = run.members[row];
      inspection.si_run[i] = r;
      inspection.si_row[i] = static_cast<int>(row);
      --left[rank_begin[p] + rank[i]];
      --ready_n[rank_begin[p] + rank[i]];
    }
    while (rank_begin[p] + lowest[p] < rank_begin[p + 1] - 1 && left[rank_begin[p] + lowest[p]] == 0) ++lowest[p];
    for (int i : run.members) {
      for (int k = succ_begin[i]; k < succ_begin[i + 1]; ++k) {
        if (--pending[succ[k]] == 0) make_ready(succ[k]);
      }
    }
    inspection.runs.push_back(std::move(run));
  }
}

// An instance's own cost beside its operations' work (SegmentCode::work),
// in their unit: its rows gathered, its cotangents added, its share of its
// run's bookkeeping (about 1.5 us a row for a Tree-LSTM's cell of hidden
// 128, whose operations are 1e5 multiply-adds).
constexpr double kInstanceWork = 2e4;

// The estimated work of the segment instances before each one (and of all at the back).
static std::vector<double> WorkBefore(const std::vector<int>& si_code, const std::vector<SegmentCode*>& codes) {
  std::vector<double> work(si_code.size() + 1, 0);
  for (size_t i = 0; i < si_code.size(); ++i) work[i + 1] = work[i] + kInstanceWork + codes[si_code[i]]->work;
  return work;
}

// Segment instances cut, in evaluation order, into `lanes` contiguous ranges
// of about equal work, each cut where the fewest dependencies cross it: a
// walk places an example's instances together (a minibatch's trees one
// after another, what joins them after), so the cuts fall between
// examples. Per instance its lane; empty where no cut lies near an even
// share (one instance holding most of the work).
static std::vector<int> CutIntoLanes(const Inspection& inspection, const std::vector<double>& work, int lanes) {
  const int n = static_cast<int>(work.size()) - 1;
  // Dependencies from before c to c or after that lanes wait on: one read
  // more than a quarter of the instances later is the examples' join (their
  // losses summed), which waits for every lane whatever the cut.
  const int reach = n / 4;
  std::vector<int> crossing(n + 1, 0);
  for (int i = 0; i < n; ++i) {
    ForEachDependency(inspection, i, [&](int before) {
      if (i - before > reach) return;
      ++crossing[before + 1];
      --crossing[i + 1];
    });
  }
  for (int c = 1; c <= n; ++c) crossing[c] += crossing[c - 1];
  std::vector<int> lane(n, 0);
  const double window = work[n] / (4.0 * lanes);  // a cut moves at most this far from an even share
  int from = 0;
  for (int k = 1; k < lanes; ++k) {
    const double even = work[n] * k / lanes;
    int best = -1;
    for (int c = from + 1; c < n; ++c) {
      if (std::abs(work[c] - even) > window) continue;
      if (best < 0 || crossing[c] < crossing[best] ||
          (crossing[c] == crossing[best] && std::abs(work[c] - even) < std::abs(work[best] - even))) {
        best = c;
      }
    }
    if (best < 0) return {};
    std::fill(lane.begin() + best, lane.end(), k);
    from = best;
  }
  return lane;
}

// Per run with lanes, the runs it reads rows of (Inspection::run_preds).
static void RunPredecessors(Inspection& inspection) {
  inspection.run_pred_begin.assign(1, 0);
  inspection.run_preds.clear();
  std::vector<int> preds;
  for (const Run& run : inspection.runs) {
    preds.clear();
    for (int i : run.members) {
      ForEachDependency(inspection, i, [&](int before) { preds.push_back(inspection.si_run[before]); });
    }
    std::sort(preds.begin(), preds.end());
    preds.erase(std::unique(preds.begin(), preds.end()), preds.end());
    inspection.run_preds.insert(inspection.run_preds.end(), preds.begin(), preds.end());
    inspection.run_pred_begin.push_back(static_cast<int>(inspection.run_preds.size()));
  }
}

// A run's own cost beside its instances' work, in the same unit: its
// variant looked up, inputs stacked, code called, outputs and cotangents
// allocated, forward and backward (about 30 us for a Tree-LSTM's runs, whose
// instances' work runs at ~2.3e4 units a microsecond).
constexpr double kRunWork = 7e5;
// A unit of work takes this much longer with every lane's thread running
// (two cores of the EPYC VMs here sharing memory; measured per run, 1.1x to
// 1.4x).
constexpr double kSideBySideSlowdown = 1.3;

// The inspection's runs (AgendaRuns), its instances cut into lanes where
// they pay: the helpers are free, other processes leave a core for each
// lane (LanesPay), and the slowest lane's work and runs, slowed as lanes
// side by side are, cost less than all the work and the runs of one lane.
// A lane has about as many runs as the whole (a run per level and
// program), so lanes pay where work per run is large: wide layers, many
// rows.
static void ScheduleRuns(const std::vector<int>& si_level, std::vector<int> si_code,
                         const std::vector<SegmentCode*>& codes, const std::vector<const std::vector<int>*>& run_roots,
                         const GenericOptions& options, Inspection& inspection) {
  AgendaRuns(si_level, si_code, codes, run_roots, inspection);
  const int lanes = options.lanes;
  if (lanes <= 1 || si_code.size() < static_cast<size_t>(std::max(options.min_lane_instances, lanes))) return;
  const std::vector<double> work = WorkBefore(si_code, codes);
  inspection.lane_work = work.back();
  static MachineLoad load;  // the process's: one reading serves every entry
  const std::optional<double> others = load.OthersCores(std::chrono::milliseconds(250));
  inspection.others_cores = others.value_or(-1);
  if (!options.lanes_always) {
    if (options.helpers_busy && options.helpers_busy()) {
      inspection.lanes_why = "the helpers are compiling";
      return;
    }
    if (!LanesPay(lanes, load.cores(), others)) {
      inspection.lanes_why = "other processes take the cores";
      return;
    }
  }
  const std::vector<int> si_lane = CutIntoLanes(inspection, work, lanes);
  if (si_lane.empty()) {
    inspection.lanes_why = "no cut near an even share of the work";
    return;
  }
  // A lane's runs, estimated before its agenda is run (as costly as the
  // walk's other half): the distinct (program, level) pairs of its
  // instances, scaled by the runs one lane took over its own pairs.
  auto pairs = [&](int lane) {
    std::vector<int64_t> keys;
    for (size_t i = 0; i < si_code.size(); ++i) {
      if (lane < 0 || si_lane[i] == lane) keys.push_back(int64_t{si_code[i]} << 32 | si_level[i]);
    }
    std::sort(keys.begin(), keys.end());
    return static_cast<double>(std::unique(keys.begin(), keys.end()) - keys.begin());
  };
  const double one_lane = work.back() + kRunWork * static_cast<double>(inspection.runs.size());
  const double runs_per_pair = static_cast<double>(inspection.runs.size()) / std::max(pairs(-1), 1.0);
  std::vector<double> lane_cost(lanes, 0);
  for (size_t i = 0; i < si_lane.size(); ++i) lane_cost[si_lane[i]] += work[i + 1] - work[i];
  for (int l = 0; l < lanes; ++l) lane_cost[l] += kRunWork * runs_per_pair * pairs(l);
  inspection.lanes_gain = one_lane / (kSideBySideSlowdown * *std::max_element(lane_cost.begin(), lane_cost.end()));
  if (!options.lanes_always && inspection.lanes_gain <= 1) {
    inspection.lanes_why = "estimated to gain nothing";
    return;
  }
  // A program per segment and lane: runs batch within a lane.
  std::vector<SegmentCode*> lane_codes;
  std::vector<const std::vector<int>*> lane_roots;
  for (size_t p = 0; p < codes.size(); ++p) {
    for (int l = 0; l < lanes; ++l) {
      lane_codes.push_back(codes[p]);
      lane_roots.push_back(run_roots[p]);
    }
  }
  for (size_t i = 0; i < si_code.size(); ++i) si_code[i] = si_code[i] * lanes + si_lane[i];
  inspection.runs.clear();
  AgendaRuns(si_level, si_code, lane_codes, lane_roots, inspection);
  for (Run& run : inspection.runs) run.lane = si_lane[run.members[0]];
  inspection.lanes = lanes;
  RunPredecessors(inspection);
}

// Inspection::run_sources: per run, where its members' per-row inputs lie.
static void PlaceRunSources(Inspection& s) {
  if (!s.si_guard.empty()) return;
  s.run_source_begin.assign(1, 0);
  for (const Run& run : s.runs) {
    const SegmentCode& code = *run.code;
    for (size_t p = 0; p < code.inputs.size(); ++p) {
      if (code.shared[p]) continue;
      for (int si : run.members) {
        const Place& place = s.si_inputs[s.si_input_begin[si] + code.input_slot[p]];
        if (place.kind == Place::Kind::kRow) {
          s.run_sources.push_back({s.si_run[place.index], s.si_row[place.index], place.output});
        } else {
          s.run_sources.push_back({});
        }
      }
    }
    s.run_source_begin.push_back(static_cast<int>(s.run_sources.size()));
  }
}

Inspection GenericProgram::Walked(const std::string& encoded, std::vector<const Value*> structures) {
  Inspection inspection;
  Walker w;
  w.structures.reserve(structures.size());
  for (const Value* v : structures) w.structures.push_back({v});
  const size_t cells_before = cells_.size();
  // Sized as the last call's: minibatches of one data set are alike in size.
  w.instances.reserve(last_.instances);
  w.children.reserve(last_.instances);
  w.leaves.reserve(last_.leaves);
  int top = Walk(RootNode(InstanceKey(entry_, encoded)), 0, w, 0);

  // Place the segment instances in evaluation order, resolving every slot.
  std::vector<int> si_level, si_code, seg_si;
  std::vector<Place> results, inputs_of;  // result slots; input slots of the instances being placed
  std::vector<const Tensor*> computed_of;  // per instance, per data op: what it made, once asked for
  si_level.reserve(last_.segment_instances);
  si_code.reserve(last_.segment_instances);
  seg_si.reserve(last_.segment_instances);
  results.reserve(last_.results);
  inspection.si_input_begin.reserve(last_.segment_instances + 1);
  inspection.si_inputs.reserve(last_.inputs);
  // Appends the slot of instance `id`'s value `v` to `out`, built in place:
  // a Place returned by value is stored in pieces and reloaded whole, which
  // stalls store forwarding on every input (a third of the inspector's
  // time). An instance placed earlier is asked for a tensor it put in a
  // structure it built: its inputs, segments and results stay where they are.
  std::vector<Place> scratch;  // the slots of selects and guards being placed
  std::vector<Place> moved_out;  // the outputs of segments that only move bytes
  std::vector<Place> move_nodes;  // the nodes of the one being placed
  auto resolve = [&](auto& self, int id, int v, std::vector<Place>& out) -> void {
    const Instance& inst = w.instances[id];
    const Source& s = inst.cell->sources[v];
    switch (s.kind) {
      case Source::Kind::kInput: out.push_back(inputs_of[inst.inputs + s.index]); return;
      case Source::Kind::kRoot: out.emplace_back(Place::Kind::kRoot, s.index, 0, nullptr); return;
      case Source::Kind::kStructLeaf: {
        const Leaf& leaf = w.leaves[inst.leaves + s.index];
        if (leaf.tensor) {
          out.emplace_back(Place::Kind::kStruct, 0, 0, leaf.tensor);
        } else {
          self(self, leaf.instance, leaf.value, out);
        }
        return;
      }
      case Source::Kind::kSegment: {
        const int si = seg_si[inst.segments + s.index];
        if (si <= -2) {  // a segment that only moves bytes: its outputs' places
          out.push_back(moved_out[-2 - si + s.output]);
        } else {
          out.emplace_back(Place::Kind::kRow, si, s.output, nullptr);
        }
        return;
      }
      case Source::Kind::kCall: {
        const int child = w.children[inst.children + s.index];
        if (child < 0) {  // a frontier: no instance, no slot
          out.emplace_back(Place::Kind::kFrontier, -1 - child, 0, nullptr);
          return;
        }
        out.push_back(results[w.instances[child].result + s.output]);
        return;
      }
      case Source::Kind::kConstant: out.emplace_back(Place::Kind::kConstant, 0, 0, &inst.cell->constants[s.index]); return;
      case Source::Kind::kDataOp: {
        const int at = inst.data_ops + s.index;
        if (!computed_of[at]) {
          const DataOp& op = inst.cell->data_ops[s.index];
          std::vector<Tensor> args;
          std::vector<Place> arg;
          for (int a : op.args) {
            arg.clear();
            self(self, id, a, arg);
            if (arg[0].kind != Place::Kind::kStruct && arg[0].kind != Place::Kind::kConstant) {
              throw std::logic_error("generic: a data op's operand is not data");
            }
            args.push_back(*arg[0].tensor);
          }
          try {
            inspection.computed->push_back(RunDataOp(op, args));
          } catch (const OpError& e) {
            throw Refusal(std::string("generic: ") + e.what() + " at " + op.call->loc.ToString());
          }
          computed_of[at] = &inspection.computed->back();
        }
        out.emplace_back(Place::Kind::kStruct, 0, 0, computed_of[at]);
        return;
      }
      case Source::Kind::kSelect: {
        const Select& sel = inst.cell->selects[s.index];
        const size_t mark = scratch.size();  // `out` may be `scratch` too: the slots go past its end
        for (int v : {sel.cond, sel.then, sel.otherwise}) self(self, id, v, scratch);
        inspection.selects.push_back({scratch[mark], scratch[mark + 1], scratch[mark + 2]});
        scratch.resize(mark);
        out.emplace_back(Place::Kind::kSelect, static_cast<int32_t>(inspection.selects.size()) - 1, 0, nullptr);
        return;
      }
    }
  };
  // The guard placed for guard `g` of instance `id`'s cell (and its parents), once.
  std::vector<int> guard_of;
  auto guard = [&](auto& self, int id, int g) -> int {
    const Instance& inst = w.instances[id];
    int& placed = guard_of[inst.guards + g];
    if (placed >= 0) return placed;
    const Guard& cell_guard = inst.cell->guards[g];
    const int parent = cell_guard.parent >= 0 ? self(self, id, cell_guard.parent) : inst.base_guard;
    const size_t mark = scratch.size();
    resolve(resolve, id, cell_guard.cond, scratch);
    const Place cond = scratch[mark];
    scratch.resize(mark);
    const bool chained = cond.kind == Place::Kind::kRow &&
                         (inspection.si_guard.empty() ? -1 : inspection.si_guard[cond.index]) == parent;
    placed = static_cast<int>(inspection.guards.size());
    inspection.guards.push_back({cond, cell_guard.when, parent, chained});
    return placed;
  };
  auto place = [&](auto& self, int id, int inputs, int base_guard) -> void {
    Instance& inst = w.instances[id];
    const Cell& cell = *inst.cell;
    inst.inputs = inputs;
    inst.base_guard = base_guard;
    inst.data_ops = static_cast<int>(computed_of.size());
    computed_of.resize(computed_of.size() + cell.data_ops.size(), nullptr);
    inst.segments = static_cast<int>(seg_si.size());
    seg_si.resize(seg_si.size() + cell.segments.size(), -1);
    inst.guards = static_cast<int>(guard_of.size());
    guard_of.resize(guard_of.size() + cell.guards.size(), -1);
    for (const Step& step : cell.steps) {
      if (!step.is_call && cell.segments[step.index].moves) {
        // No instance: its outputs are blocks of its inputs' places.
        const Segment& seg = cell.segments[step.index];
        const SegmentMoves& moves = *seg.moves;
        std::vector<Place>& node = move_nodes;
        node.assign(moves.nodes.size(), Place{});
        const size_t mark = scratch.size();
        for (int v : seg.inputs) resolve(resolve, id, v, scratch);
        for (size_t k = 0; k < moves.nodes.size(); ++k) {
          const MoveNode& n = moves.nodes[k];
          if (n.input >= 0) {
            node[k] = scratch[mark + n.input];
            continue;
          }
          MovedPlace m;
          m.type = n.type;
          for (const MoveBlock& b : n.blocks) m.blocks.push_back({node[b.source], b.from, b.to, b.bytes});
          for (int term : n.sum) m.sum.push_back(node[term]);
          inspection.moved.push_back(std::move(m));
          node[k] = Place{Place::Kind::kMoved, static_cast<int32_t>(inspection.moved.size()) - 1, 0, nullptr};
        }
        scratch.resize(mark);
        seg_si[inst.segments + step.index] = -2 - static_cast<int>(moved_out.size());
        for (int o : moves.outputs) moved_out.push_back(node[o]);
        continue;
      }
      if (!step.is_call) {
        const Segment& seg = cell.segments[step.index];
        int si = static_cast<int>(si_level.size());
        int level = 0;
        auto after = [&](int before_si) { level = std::max(level, si_level[before_si] + 1); };
        inspection.si_input_begin.push_back(static_cast<int>(inspection.si_inputs.size()));
        for (int v : seg.row_inputs) {
          resolve(resolve, id, v, inspection.si_inputs);
          ForEachRow(inspection, inspection.si_inputs.back(), after);
        }
        if (seg.guard >= 0 || base_guard >= 0 || !inspection.si_guard.empty()) {
          inspection.si_guard.resize(si, -1);  // those before had none
          inspection.si_guard.push_back(seg.guard >= 0 ? guard(guard, id, seg.guard) : base_guard);
          ForEachGuardRow(inspection, inspection.si_guard.back(), after);
        }
        si_level.push_back(level);
        si_code.push_back(seg.code);
        seg_si[inst.segments + step.index] = si;
      } else {
        const int child = w.children[inst.children + step.index];
        if (child < 0) continue;  // a frontier
        const int site_guard = cell.calls[step.index].guard;
        const int child_guard = site_guard >= 0 ? guard(guard, id, site_guard) : base_guard;
        // Kept after the call: a structure built of them may be read later.
        const int child_inputs = static_cast<int>(inputs_of.size());
        for (int v : cell.call_leaves[step.index]) resolve(resolve, id, v, inputs_of);
        self(self, child, child_inputs, child_guard);
      }
    }
    inst.result = static_cast<int>(results.size());
    for (int v : cell.result_leaves) resolve(resolve, id, v, results);
  };
  place(place, top, 0, -1);  // the entry's tensors are all kRoot: it has no kInput
  inspection.frontiers = std::move(w.frontiers);
  inspection.si_input_begin.push_back(static_cast<int>(inspection.si_inputs.size()));
  const Cell& top_cell = *w.instances[top].cell;
  if (top_cell.result_type) {
    inspection.result.assign(results.begin() + w.instances[top].result,
                             results.begin() + w.instances[top].result + top_cell.result_leaves.size());
    inspection.result_type = top_cell.result_type;
  } else {
    // The structures the result holds, as their cells built them: a built
    // one's tensors are values of the instance that built it, its
    // structures those of that instance (the top's: the walker's stack).
    auto shape = [&](auto& self, const ValueTree& t, int instance, const StructRef* structures) -> ResultShape {
      ResultShape s;
      switch (t.kind) {
        case ValueTree::Kind::kTensor:
          resolve(resolve, instance, t.value, inspection.result);
          return s;
        case ValueTree::Kind::kStructure: {
          const StructRef& ref = structures[t.value];
          if (ref.value) {
            s.kind = ResultShape::Kind::kValue;
            s.value = *ref.value;
            return s;
          }
          return self(self, *ref.built, ref.instance, w.frames.data() + ref.frame);
        }
        case ValueTree::Kind::kBuilt:
          s.kind = ResultShape::Kind::kAdt;
          s.adt = module_->FindType(t.adt->name);
          s.tag = t.tag;
          break;
        case ValueTree::Kind::kTuple: s.kind = ResultShape::Kind::kTuple; break;
        default: throw Refusal("generic: @" + entry_ + " returns a function value");
      }
      for (const ValueTree& f : t.fields) s.fields.push_back(self(self, f, instance, structures));
      return s;
    };
    inspection.result_shape =
        std::make_shared<const ResultShape>(shape(shape, top_cell.result, top, w.structures.data()));
  }
  inspection.instances = static_cast<int64_t>(w.instances.size());
  last_ = {w.instances.size(), w.leaves.size(), si_level.size(), results.size(), inspection.si_inputs.size()};
  inspection.new_cells = static_cast<int>(cells_.size() - cells_before);

  inspection.levels = si_level.empty() ? 0 : *std::max_element(si_level.begin(), si_level.end()) + 1;
  ScheduleRuns(si_level, std::move(si_code), codes_, run_roots_, options_, inspection);
  for (Run& run : inspection.runs) run.rows = RowBucket(static_cast<int64_t>(run.members.size()));
  PlaceRunSources(inspection);
  return inspection;
}

}  // namespace pejit::generic
