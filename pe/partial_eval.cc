// The partial evaluator.
//
// 0. Values become partially static values (PVal): a static tensor, a
//    dynamic atom (a variable of the residual program, with its type), or a
//    tuple, ADT value or closure whose parts are PVals. The arguments'
//    skeleton is static; their tensors are dynamic parameters.
// 1. The evaluator walks the program like the interpreter does, but on
//    PVals. An operator whose inputs are all static is computed now
//    (folded); otherwise it is emitted into the current let-list with atoms as
//    inputs, and its result is a new atom. So every dynamic computation is
//    let-bound exactly once and sharing is kept: a value used twice is an atom
//    used twice.
// 2. `match` on a static constructor and `if` on a static condition pick
//    their branch. An `if` on a dynamic condition is residualized with both
//    branches specialized, each in a let-list of its own.
// 3. Calls are unfolded: the callee's body is evaluated with its parameters
//    bound to the argument PVals. A call with the very same argument PVals
//    as an earlier one in scope returns that call's result (the language is
//    pure).
// 4. Termination: a call to a function already being unfolded on the same
//    skeleton (a loop on dynamic data), or any call once the fuel is spent,
//    becomes a call to a residual function specialized on the generalized
//    arguments (every tensor a parameter, structure kept). Those functions
//    are memoized by skeleton, so a loop becomes a recursive residual function.
// 5. Bounds: the residual's operator count and the native stack the
//    evaluator uses are bounded; past either, PeFailure says which.
// 6. Cost: one run is linear in the size of the residual. Nothing is looked
//    up by scanning: PVals live in an arena of the run (no reference counts,
//    freed at once), variables are bound in one table with an undo log
//    (function bodies are lexically scoped, so a body only ever sees its own
//    bindings and its closure's), the call memo and the set of unfoldings in
//    progress are hash chains that shrink in stack order, tensor types are
//    interned, and an operator's result types are inferred once per program
//    node and input types.
// 7. Across runs (with a PeCache, pe_cache.h): the outermost calls of a run
//    to a global helper (not the entry itself; one recording at a time) are
//    keyed by the helper, its and its callees' versions, and the skeleton of
//    the arguments with their sharing (which argument nodes are one node,
//    which dynamic ones one atom, which static ones one buffer). On a miss
//    the unfolding is recorded: the let-bindings it appended, rewritten over
//    slots (the argument nodes' atoms, the tensors it materialized, its own
//    variables), its result, and the memo entries it left that the caller
//    can still reach, as values over the argument nodes. On a hit the
//    template is replayed: the same bindings with fresh variables over this
//    call's atoms, the same result and memo entries, the same counts. So a
//    replay emits exactly what the unfolding would; the template is the
//    helper's residual function, generalized on its dynamic arguments, and
//    inlined, because the compiled tiers want straight-line code (a call to
//    a residual function would leave a program LLVM does not take).
//    Exactness needs the unfolding to have been independent of its context,
//    and the replaying context to be one where it still would be:
//      - a recording that calls a residual function (a loop, no fuel) or
//        whose memo was answered from before the call is not kept;
//      - a replay is refused (the call unfolds) where the fuel, the size
//        budget or the native stack would run out, where an unfolding inside
//        would meet one in progress (a loop), or where a call inside on the
//        arguments alone (a "probe") would be answered by the caller's memo;
//      - tensors the helper folded are copied per replay, so that two
//        replays never share a materialized constant two unfoldings would
//        not have shared.
//    Arguments holding function values are not keyed (closures' code would
//    need versions of its own); such calls unfold as usual.
//
// Known limitations:
//  a. A `match` on a dynamic ADT value (the result of a residual function)
//     is refused.
//  b. Function values cannot be left in the residual: a dynamic `if` that
//     returns a closure is refused.
//  c. Only outermost helper calls are kept across runs (a helper nested in
//     one is part of its template); a helper whose recording is refused
//     (step 7) is not kept, and neither are the helpers inside it.
#include "pe/partial_eval.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "ir/printer.h"
#include "ir/visitor.h"
#include "ops/eager.h"

namespace pejit {

// (7) The residual code of one helper call, as a function of the helper's
// argument nodes. Immutable once made; shared by the runs that replay it.
struct PeTemplate {
  // Slots are the template's atoms, numbered: the dynamic argument nodes'
  // atoms, then materialized tensors, then the variables of `lets`. Lists of
  // indices live in the shared arrays below, as [first, first + count).
  struct Static {
    int32_t arg_node = -1;  // the tensor of this static argument node, or
    Tensor value;           // this tensor,
    bool fresh = false;     // computed by the helper: each replay gets a copy
  };
  // What bindings made by one program node have in common (few per
  // template): the bound variable's name and type, the operator call's
  // operator, attributes and location.
  struct Site {
    std::string name;
    Type type;
    const OpDef* op = nullptr;
    Attrs attrs;
    SourceLoc loc;
  };
  struct Let {
    enum class Kind : uint8_t { kOp, kProj, kExpr };
    Kind kind;
    int32_t site;
    int32_t index = 0;              // kProj: the field; kExpr: in `exprs`
    uint32_t first = 0, count = 0;  // kOp: operands (a slot, or ~k for literals[k]); kProj: the tuple's slot;
                                    // kExpr: its free variables, in `free`
  };
  // A value the helper returned or a call inside it answered.
  struct Val {
    enum class Kind : uint8_t { kArg, kDynamic, kStatic, kTuple, kAdt };
    Kind kind;
    int tag = -1;
    int32_t index = -1;             // kArg: argument node; kDynamic: slot; kStatic: statics
    uint32_t first = 0, count = 0;  // kTuple, kAdt: fields, in `fields`
    Type type;                      // kDynamic
    TypeDefPtr adt;                 // kAdt
  };
  // A call inside the helper whose memo entry the caller could still hit:
  // on values `ids[first..]`, answered by value `result`.
  struct Call {
    int32_t callee;  // in `names`
    uint32_t first, count;
    int32_t result;
  };
  // A call inside the helper on argument nodes alone (`ids[first..]` are
  // argument nodes): where the caller's memo already answers it, a fresh
  // unfolding would share that answer, so no replay.
  struct Probe {
    int32_t callee;
    uint32_t first, count;
  };

  std::string helper;
  std::vector<int32_t> param_nodes;  // per param slot: its argument node
  std::vector<int32_t> consts;       // per const slot: its statics entry
  std::vector<Static> statics;
  std::vector<Site> sites;
  std::vector<Let> lets;
  std::vector<Expr> exprs;  // kExpr bindings' values, rewritten over their free variables
  std::vector<Expr> literals;
  std::vector<Val> values;  // fields before the values holding them
  int32_t result = -1;
  std::vector<Call> calls;
  std::vector<Probe> probes;
  std::vector<std::string> names;  // the globals calls and probes call
  std::vector<int32_t> operands, fields, ids;
  std::vector<std::pair<const VarNode*, int32_t>> free;
  std::vector<uint64_t> unfold_keys;  // skeleton keys of the unfoldings inside, sorted
  int64_t unfoldings = 0, residual_ops = 0, folded_ops = 0, shared_calls = 0;
  int64_t stack_bytes = 0;  // native stack the unfolding took
};

class PeCacheAccess {
 public:
  static std::shared_ptr<const PeTemplate> Find(PeCache& c, const std::string& key) { return c.Find(key); }
  static bool Insert(PeCache& c, const std::string& key, std::shared_ptr<const PeTemplate> t, int64_t bindings) {
    return c.Insert(key, std::move(t), bindings);
  }
  static bool Enabled(const PeCache& c) { return c.enabled(); }
};

namespace {

uint64_t Mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }
uint64_t HashPtr(const void* p) { return std::hash<const void*>{}(p); }

uint64_t HashBytes(const void* data, size_t n) {
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(data), n));
}

uint64_t HashTensorType(const TensorType& t) {
  uint64_t h = Mix(17, static_cast<uint64_t>(t.dtype));
  for (int64_t d : t.shape) h = Mix(h, static_cast<uint64_t>(d));
  return h;
}

// The node behind `e`, whose kind the caller has checked (As<> would
// dynamic_cast on every step of the walk).
template <typename Node>
const Node& NodeOf(const Expr& e) {
  return *static_cast<const Node*>(e.get());
}

// ---- Flat tables --------------------------------------------------------------

// Open addressing from a 64-bit key (a hash, or an address) to an index; the
// tables below chain entries with equal keys through their `next` index.
class IndexTable {
 public:
  IndexTable() { Rehash(64); }

  int32_t Get(uint64_t key) const {
    key = Fix(key);
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == 0) return -1;
    }
  }

  // Room for `n` keys without rehashing.
  void Reserve(size_t n) {
    size_t size = keys_.size();
    while (size < 2 * n + 2) size *= 2;
    if (size != keys_.size()) Rehash(size);
  }

  // The value of `key`, inserted as -1 when absent. Valid until the next call.
  int32_t& At(uint64_t key) {
    key = Fix(key);
    if (2 * (used_ + 1) > keys_.size()) Rehash(2 * keys_.size());
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == 0) {
        keys_[i] = key;
        values_[i] = -1;
        ++used_;
        return values_[i];
      }
    }
  }

 private:
  static uint64_t Fix(uint64_t key) { return key ? key : 0x51ed27ull; }  // 0 marks a free slot
  size_t Slot(uint64_t key) const { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_); }

  void Rehash(size_t size) {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<int32_t> values = std::move(values_);
    keys_.assign(size, 0);
    values_.assign(size, -1);
    mask_ = size - 1;
    shift_ = 64 - std::countr_zero(size);
    used_ = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i]) At(keys[i]) = values[i];
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  size_t used_ = 0, mask_ = 0;
  int shift_ = 0;
};

// A short list of pointers, on the stack unless it is long: the argument
// lists of calls and operators, built for every node evaluated.
template <typename T, size_t N = 8>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  SmallVec(const SmallVec&) = delete;
  SmallVec& operator=(const SmallVec&) = delete;

  void push_back(T v) {
    if (size_ < N) {
      inline_[size_++] = v;
      return;
    }
    if (size_ == N) heap_.assign(inline_, inline_ + N);
    heap_.push_back(v);
    ++size_;
  }
  size_t size() const { return size_; }
  const T* data() const { return size_ <= N ? inline_ : heap_.data(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  const T& operator[](size_t i) const { return data()[i]; }
  const T& back() const { return data()[size_ - 1]; }
  operator std::span<const T>() const { return {data(), size_}; }

 private:
  T inline_[N];
  std::vector<T> heap_;
  size_t size_ = 0;
};

// ---- Partially static values ----------------------------------------------------

// A type as the evaluator keeps it: tensor types interned per run, so that
// equal types are one object and their hash is computed once.
struct TypeInfo {
  Type type;
  const TensorTypeNode* tensor = nullptr;  // null for other kinds
  uint64_t hash = 0;
};

struct ClosureInfo {
  Func func;
  const VarNode* const* vars;  // what it captures, as many as the PVal's fields
};

struct GlobalInfo {
  const std::string* name;
  const FuncNode* func = nullptr;  // resolved at the first call
};

// Small (64 bytes): what is rare lives behind a pointer.
struct PVal {
  enum class Kind : uint8_t { kDynamic, kStatic, kTuple, kAdt, kClosure, kGlobal };
  Kind kind = Kind::kStatic;
  int tag = -1;                         // kAdt
  uint32_t size = 0;                    // fields (kTuple, kAdt) or captured values (kClosure)
  uint64_t skeleton = 0;                // hash of the static skeleton
  const PVal* const* fields = nullptr;  // kTuple, kAdt: fields; kClosure: captured values
  Expr atom;                            // kDynamic
  const TypeInfo* type = nullptr;       // kDynamic
  union {
    const Tensor* value = nullptr;  // kStatic
    const TypeDef* adt;             // kAdt (held by the run's adt table)
    const ClosureInfo* closure;     // kClosure
    GlobalInfo* global;             // kGlobal
  };

  std::span<const PVal* const> Fields() const { return {fields, size}; }
};

// Same static skeleton (what a specialization may depend on).
bool SameSkeleton(const PVal* a, const PVal* b) {
  if (a == b) return true;
  if (a->skeleton != b->skeleton || a->kind != b->kind) return false;
  switch (a->kind) {
    case PVal::Kind::kDynamic: return a->type == b->type || TypeEqual(a->type->type, b->type->type);
    case PVal::Kind::kStatic: return Equal(*a->value, *b->value);
    case PVal::Kind::kAdt:
      if (a->tag != b->tag || (a->adt != b->adt && a->adt->name != b->adt->name)) return false;
      [[fallthrough]];
    case PVal::Kind::kTuple:
      if (a->size != b->size) return false;
      for (size_t i = 0; i < a->size; ++i) {
        if (!SameSkeleton(a->fields[i], b->fields[i])) return false;
      }
      return true;
    case PVal::Kind::kClosure:
      if (a->closure->func != b->closure->func || a->size != b->size) return false;
      for (size_t i = 0; i < a->size; ++i) {
        if (!SameSkeleton(a->fields[i], b->fields[i])) return false;
      }
      return true;
    case PVal::Kind::kGlobal: return *a->global->name == *b->global->name;
  }
  return false;
}

// Where one run's PVals and their field arrays live: allocated in blocks,
// freed together when the run ends.
class PValArena {
 public:
  PVal* New() {
    if (used_ == kBlock) {
      blocks_.push_back(std::make_unique<PVal[]>(kBlock));
      used_ = 0;
    }
    return &blocks_.back()[used_++];
  }

  const Tensor* Keep(Tensor t) { return &tensors_.emplace_back(std::move(t)); }
  const ClosureInfo* Keep(ClosureInfo c) { return &closures_.emplace_back(std::move(c)); }
  GlobalInfo* Keep(GlobalInfo g) { return &globals_.emplace_back(g); }

  template <typename T>
  T* Array(size_t n) {
    static_assert(sizeof(T) == sizeof(void*) && std::is_trivially_copyable_v<T>);
    if (n == 0) return nullptr;
    if (ptr_used_ + n > ptr_cap_) {
      ptr_cap_ = std::max<size_t>(n, 4096);
      ptr_blocks_.push_back(std::make_unique<void*[]>(ptr_cap_));
      ptr_used_ = 0;
    }
    void** p = ptr_blocks_.back().get() + ptr_used_;
    ptr_used_ += n;
    return static_cast<T*>(static_cast<void*>(p));
  }

 private:
  static constexpr size_t kBlock = 256;
  std::vector<std::unique_ptr<PVal[]>> blocks_;
  size_t used_ = kBlock;
  std::vector<std::unique_ptr<void*[]>> ptr_blocks_;
  size_t ptr_used_ = 0, ptr_cap_ = 0;
  std::deque<Tensor> tensors_;
  std::deque<ClosureInfo> closures_;
  std::deque<GlobalInfo> globals_;
};

// A let-list being filled.
struct Scope {
  std::vector<std::pair<Var, Expr>> lets;
  std::vector<int32_t> let_instances;  // PeOptions::record_instances: who emitted each let
  size_t calls_mark = 0;      // the call memo's size when the scope opened
  bool function_root = false;  // the body of a residual function (or main)
  // Function roots: tensors materialized once. The tensor is kept alive with
  // its variable, so that its buffer's address cannot be reused by another.
  std::unordered_map<const void*, std::pair<Tensor, Var>> constants;
  std::vector<std::pair<Var, Expr>> constant_lets;
};

// A residual function specialized on a generalized skeleton.
struct Specialization {
  const FuncNode* func;
  std::vector<const PVal*> args;  // generalized: tensors dynamic parameters
  std::string name;
  Type ret;
};

// A call answered in a scope, by callee and argument identity.
struct CallEntry {
  uint64_t key;
  const FuncNode* func;
  const std::string* global;  // the callee's name, null for a closure
  const PVal* const* ids;  // the arguments, then the closure (if any)
  uint32_t size;
  int32_t scope;
  const PVal* result;
  int32_t next;
};

// A call being unfolded, by callee and argument skeleton.
struct ActiveEntry {
  uint64_t key;
  const FuncNode* func;
  const PVal* closure;  // null for a global
  std::span<const PVal* const> args;
  int32_t next;
};

// Result types of one operator node for some input types.
struct InferEntry {
  const OpCallNode* node;
  std::vector<const TypeInfo*> inputs;
  std::vector<const TypeInfo*> outputs;
  int32_t next;
};

// (7) A helper call described for the cache, and, while its unfolding runs,
// what the template will need to know about it.
struct Recording {
  std::string key;
  std::string helper;
  std::vector<const PVal*> nodes;  // the argument nodes, in the key's order
  IndexTable node_index;           // a node's address → its index in `nodes`
  IndexTable static_buffer;        // a static node's buffer → the first node holding it

  bool valid = true;  // false: the unfolding depended on its context
  int scope = -1;
  size_t lets_mark = 0, calls_mark = 0;
  int64_t unfoldings = 0, residual_ops = 0, folded_ops = 0, shared_calls = 0;  // before
  const char* stack_start = nullptr;
  const char* stack_low = nullptr;
  std::vector<std::pair<Tensor, Var>> consts;  // tensors materialized, by first use
  IndexTable const_index;                      // a buffer → its index in `consts`
  IndexTable fresh;                            // buffers the helper computed
  // Probes, flattened: per probe its callee's name, then its argument nodes.
  std::vector<std::pair<const std::string*, uint32_t>> probes;  // callee, first
  std::vector<int32_t> probe_args;
  std::vector<uint64_t> unfold_keys;
};

// A kExpr binding of a template with fresh variables, over the slots' atoms.
class TemplateRewriter : public ExprMutator {
 public:
  TemplateRewriter(std::span<const std::pair<const VarNode*, int32_t>> free, const std::vector<Expr>& slots) {
    for (const auto& [var, slot] : free) memo_[var] = slots[slot];
  }

 protected:
  std::pair<Var, Expr> VisitLetBinding(const LetNode* n) override {
    Expr value = Mutate(n->value);
    Var var = MakeVar(n->var->name, n->var->annotation, n->var->loc);
    memo_[n->var.get()] = var;
    return {var, value};
  }
};

// Whether a template can hold `e` (what PE emits), and the variables it uses
// from outside, in order of first use.
bool FreeVarsOfResidual(const Expr& e, std::vector<const VarNode*>& free) {
  std::unordered_set<const ExprNode*> bound, seen;
  bool ok = true;
  PostOrderVisit(e, [&](const Expr& n) {
    switch (n->kind) {
      case ExprKind::kLet: bound.insert(NodeOf<LetNode>(n).var.get()); break;
      case ExprKind::kVar: case ExprKind::kConstant: case ExprKind::kOpCall: case ExprKind::kIf:
      case ExprKind::kTuple: case ExprKind::kProj: case ExprKind::kCtor: break;
      default: ok = false;
    }
  });
  PostOrderVisit(e, [&](const Expr& n) {
    if (n->kind == ExprKind::kVar && !bound.count(n.get()) && seen.insert(n.get()).second) {
      free.push_back(&NodeOf<VarNode>(n));
    }
  });
  return ok;
}

class PartialEvaluator {
 public:
  PartialEvaluator(const ModuleSnapshot& module, const PeOptions& options, PeCache* cache)
      : module_(module),
        options_(options),
        cache_(cache && PeCacheAccess::Enabled(*cache) && !options.record_instances ? cache : nullptr) {}

  Residual Run(const std::string& entry, const std::vector<Value>& args, const std::vector<bool>& static_args) {
    auto start = std::chrono::steady_clock::now();
    char base;
    stack_base_ = &base;
    const Definition& def = module_.Get(entry);
    entry_ = entry;
    if (def.func->params.size() != args.size()) {
      throw PeFailure("@" + entry + " takes " + std::to_string(def.func->params.size()) + " arguments, got " +
                      std::to_string(args.size()));
    }
    std::vector<Var> params;
    std::vector<const PVal*> pargs;
    for (size_t i = 0; i < args.size(); ++i) {
      bool whole = i < static_args.size() && static_args[i];
      pargs.push_back(FromValue(args[i], whole, params));
    }
    OpenScope(true);
    if (options_.record_instances) {
      instances_.push_back({entry, -1, 0, 0, {}, ArgTypes(pargs), "", Atoms(pargs, true), {}});
      current_instance_ = 0;
    }
    const PVal* result = Apply(nullptr, NewGlobal(&entry_), pargs);
    Expr reified = Reify(result, def.func->loc);
    if (options_.record_instances) {
      instances_[0].result_type = TypeText(result);
      instances_[0].result_atoms = Atoms({&result, 1}, false);
      const Scope& root = scopes_.back();
      binding_instance_.assign(root.constant_lets.size(), -1);
      binding_instance_.insert(binding_instance_.end(), root.let_instances.begin(), root.let_instances.end());
    }
    Expr body = CloseScope(std::move(reified));

    Residual out;
    out.instances = std::move(instances_);
    out.binding_instance = std::move(binding_instance_);
    out.main = MakeFunc(std::move(params), body, nullptr, def.func->loc);
    out.functions = std::move(residual_functions_);
    for (const auto& [_, t] : module_.types()) out.types.push_back(t);
    stats_.params = static_cast<int64_t>(out.main->params.size());
    stats_.residual_functions = static_cast<int64_t>(out.functions.size());
    stats_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.stats = stats_;
    return out;
  }

 private:
  const ModuleSnapshot& module_;
  const PeOptions& options_;
  PeCache* cache_;
  std::string entry_;
  const char* stack_base_ = nullptr;
  PeStats stats_;
  PValArena arena_;
  std::vector<Scope> scopes_;
  int root_scope_ = -1;                 // the innermost function root in scopes_
  const std::string* hint_ = nullptr;   // name for the next emitted variable
  std::vector<Specialization> specializations_;
  std::vector<std::pair<std::string, Func>> residual_functions_;

  // Variable bindings: one slot per variable node, and an undo log that a
  // function body's bindings are rolled back with when it returns.
  IndexTable var_slots_;
  std::vector<const PVal*> slot_values_;
  std::vector<std::pair<int32_t, const PVal*>> undo_;

  // The call memo (3): entries of open scopes, in the order they were made.
  IndexTable call_heads_;
  std::vector<CallEntry> calls_;

  // Unfoldings in progress (4); those below active_floor_ belong to the
  // function a residual function is being specialized inside of.
  IndexTable active_heads_;
  std::vector<ActiveEntry> active_;
  size_t active_floor_ = 0;

  // Interned tensor types, and other types by identity.
  IndexTable type_heads_;
  std::vector<std::unique_ptr<TypeInfo>> types_;
  std::vector<int32_t> type_next_;
  IndexTable infer_heads_;
  std::vector<InferEntry> infers_;

  // Per program node: the global's PVal, a function literal's free variables.
  IndexTable global_index_;
  std::vector<const PVal*> globals_;
  std::unordered_map<const FuncNode*, std::vector<const VarNode*>> free_vars_;
  // ADT types by address (PVals point at them), with their hashes.
  IndexTable adt_index_;
  std::vector<TypeDefPtr> adts_;
  std::vector<uint64_t> adt_hashes_;

  // PeOptions::record_instances: the instances so far, the one being
  // evaluated, main's bindings' instances, and which functions are structural.
  std::vector<CallInstance> instances_;
  int current_instance_ = -1;
  std::vector<int> binding_instance_;
  std::unordered_map<const FuncNode*, bool> structural_;

  // (7) The helper call being recorded (one at a time: the outermost), the
  // templates replayed (their tensors are pointed at), definitions by name.
  std::unique_ptr<Recording> recording_;
  std::vector<std::shared_ptr<const PeTemplate>> replayed_;
  std::unordered_map<std::string, std::string> version_keys_;
  std::unordered_map<std::string, const FuncNode*> functions_;

  // ---- Values ----------------------------------------------------------------------

  const TypeInfo* Intern(const TensorType& t) {
    uint64_t h = HashTensorType(t);
    int32_t& head = type_heads_.At(Mix(1, h));
    for (int32_t i = head; i >= 0; i = type_next_[i]) {
      const TypeInfo& info = *types_[i];
      if (info.tensor && info.tensor->type.dtype == t.dtype && info.tensor->type.shape == t.shape) return &info;
    }
    auto info = std::make_unique<TypeInfo>();
    info->type = TensorTy(t);
    info->tensor = AsTensor(info->type);
    info->hash = Mix(1, h);
    int32_t index = static_cast<int32_t>(types_.size());
    type_next_.push_back(head);
    head = index;
    types_.push_back(std::move(info));
    return types_.back().get();
  }

  const TypeInfo* Intern(const Type& type) {
    if (const TensorTypeNode* t = AsTensor(type)) return Intern(t->type);
    int32_t& head = type_heads_.At(Mix(2, HashPtr(type.get())));
    for (int32_t i = head; i >= 0; i = type_next_[i]) {
      if (types_[i]->type == type) return types_[i].get();
    }
    auto info = std::make_unique<TypeInfo>();
    info->type = type;
    info->hash = Mix(1, std::hash<std::string>{}(TypeToString(type)));
    int32_t index = static_cast<int32_t>(types_.size());
    type_next_.push_back(head);
    head = index;
    types_.push_back(std::move(info));
    return types_.back().get();
  }

  const PVal* NewDynamic(Expr atom, const TypeInfo* type) {
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kDynamic;
    p->skeleton = type->hash;
    p->atom = std::move(atom);
    p->type = type;
    return p;
  }

  // `value` must outlive the run (the arena's, or a program constant's).
  const PVal* NewStatic(const Tensor* value) {
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kStatic;
    p->skeleton = Mix(Mix(2, HashTensorType(value->type())), HashBytes(value->raw_data(), value->nbytes()));
    p->value = value;
    return p;
  }
  const PVal* NewStatic(Tensor value) { return NewStatic(arena_.Keep(std::move(value))); }

  const PVal* NewTuple(std::span<const PVal* const> fields) {
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kTuple;
    p->skeleton = Mix(3, fields.size());
    for (const PVal* f : fields) p->skeleton = Mix(p->skeleton, f->skeleton);
    p->size = static_cast<uint32_t>(fields.size());
    const PVal** copy = arena_.Array<const PVal*>(fields.size());
    std::copy(fields.begin(), fields.end(), copy);
    p->fields = copy;
    return p;
  }

  // The shared owner of an ADT type the run has seen, by address.
  const TypeDefPtr& AdtOf(const TypeDef* adt) { return adts_[adt_index_.Get(HashPtr(adt))]; }

  const PVal* NewAdt(const TypeDefPtr& adt, int tag, std::span<const PVal* const> fields) {
    int32_t& index = adt_index_.At(HashPtr(adt.get()));
    if (index < 0) {
      index = static_cast<int32_t>(adts_.size());
      adts_.push_back(adt);
      adt_hashes_.push_back(Mix(4, std::hash<std::string>{}(adt->name)));
    }
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kAdt;
    p->skeleton = Mix(adt_hashes_[index], static_cast<uint64_t>(tag));
    for (const PVal* f : fields) p->skeleton = Mix(p->skeleton, f->skeleton);
    p->adt = adt.get();
    p->tag = tag;
    p->size = static_cast<uint32_t>(fields.size());
    const PVal** copy = arena_.Array<const PVal*>(fields.size());
    std::copy(fields.begin(), fields.end(), copy);
    p->fields = copy;
    return p;
  }

  const PVal* NewClosure(const ClosureInfo* closure, std::span<const PVal* const> values) {
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kClosure;
    p->skeleton = Mix(5, HashPtr(closure->func.get()));
    for (const PVal* v : values) p->skeleton = Mix(p->skeleton, v->skeleton);
    p->closure = closure;
    p->size = static_cast<uint32_t>(values.size());
    const PVal** copy = arena_.Array<const PVal*>(values.size());
    std::copy(values.begin(), values.end(), copy);
    p->fields = copy;
    return p;
  }

  const PVal* NewGlobal(const std::string* name) {
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kGlobal;
    p->skeleton = Mix(6, std::hash<std::string>{}(*name));
    p->global = arena_.Keep(GlobalInfo{name});
    return p;
  }

  // The PVal of a global reference, one per program node.
  const PVal* GlobalOf(const GlobalNode& g) {
    int32_t& index = global_index_.At(HashPtr(&g));
    if (index < 0) {
      index = static_cast<int32_t>(globals_.size());
      globals_.push_back(NewGlobal(&g.name));
    }
    return globals_[index];
  }

  // ---- Bindings ----------------------------------------------------------------------

  void Bind(const VarNode* var, const PVal* value) {
    int32_t& slot = var_slots_.At(HashPtr(var));
    if (slot < 0) {
      slot = static_cast<int32_t>(slot_values_.size());
      slot_values_.push_back(nullptr);
    }
    undo_.push_back({slot, slot_values_[slot]});
    slot_values_[slot] = value;
  }

  const PVal* Lookup(const VarNode* var) const {
    int32_t slot = var_slots_.Get(HashPtr(var));
    return slot < 0 ? nullptr : slot_values_[slot];
  }

  void Unbind(size_t mark) {
    while (undo_.size() > mark) {
      slot_values_[undo_.back().first] = undo_.back().second;
      undo_.pop_back();
    }
  }

  // ---- Building the residual ---------------------------------------------------

  // Named after the source variable it stands for; the printer makes names unique.
  Var NewVar(const Type& type) {
    Var v = MakeVar(hint_ && !hint_->empty() ? *hint_ : std::string("t"), type);
    hint_ = nullptr;
    return v;
  }

  Var Emit(Expr value, const Type& type) {
    Var v = NewVar(type);
    scopes_.back().lets.push_back({v, std::move(value)});
    if (options_.record_instances) scopes_.back().let_instances.push_back(current_instance_);
    return v;
  }

  // ---- Structural call instances (PeOptions::record_instances) ----------------------

  // Whether `f`'s body matches on one of its parameters.
  bool Structural(const FuncNode& f) {
    auto [it, added] = structural_.try_emplace(&f, false);
    if (added) {
      PostOrderVisit(f.body, [&](const Expr& e) {
        auto* m = As<MatchNode>(e);
        if (!m || m->scrutinee->kind != ExprKind::kVar) return;
        for (const auto& p : f.params) it->second = it->second || m->scrutinee.get() == p.get();
      });
    }
    return it->second;
  }

  // A value's type as the instance keys see it: tensors with their shapes,
  // ADT values by their type's name alone.
  std::string TypeText(const PVal* v) {
    switch (v->kind) {
      case PVal::Kind::kDynamic: return TypeToString(v->type->type);
      case PVal::Kind::kStatic: {
        // A static value is part of the key: the code that reads it was folded on it.
        const Tensor& t = *v->value;
        char hash[24];
        std::snprintf(hash, sizeof hash, "%016llx",
                      static_cast<unsigned long long>(HashBytes(t.raw_data(), t.nbytes())));
        return TypeToString(Intern(t.type())->type) + " static " + hash;
      }
      case PVal::Kind::kAdt: return v->adt->name;
      case PVal::Kind::kTuple: {
        std::string out = "(";
        for (uint32_t i = 0; i < v->size; ++i) out += (i ? ", " : "") + TypeText(v->fields[i]);
        return out + ")";
      }
      default: return "fn";
    }
  }

  // Whether a value of (residual) type `got` may have type `want`: ir's
  // TypeCompatible, but a type variable fits anything (a generic function's
  // declared List[T] holds a List of tensors).
  static bool TypeFits(const Type& got, const Type& want) {
    if (want->kind == TypeKind::kVar || got->kind == TypeKind::kVar) return true;
    if (got->kind != want->kind) return false;
    switch (want->kind) {
      case TypeKind::kTensor: return TensorTypeFits(AsTensor(want)->type, AsTensor(got)->type);
      case TypeKind::kTuple: {
        const auto &g = AsTuple(got)->fields, &w = AsTuple(want)->fields;
        if (g.size() != w.size()) return false;
        for (size_t i = 0; i < w.size(); ++i) {
          if (!TypeFits(g[i], w[i])) return false;
        }
        return true;
      }
      case TypeKind::kAdt: return AsAdt(got)->name == AsAdt(want)->name;
      default: return true;
    }
  }

  // Whether `v` may have type `t`, as the interpreter checks each return,
  // annotated `let` and constructor at run time (interp/interpreter.cc,
  // Fits): a program the interpreter stops with an error must not
  // specialize into code that answers.
  static bool Fits(const PVal* v, const Type& t) {
    if (v->kind == PVal::Kind::kDynamic) return TypeFits(v->type->type, t);  // a residual tuple, ADT or tensor
    switch (t->kind) {
      case TypeKind::kTensor: return v->kind == PVal::Kind::kStatic && TensorTypeFits(AsTensor(t)->type, v->value->type());
      case TypeKind::kTuple: {
        const auto& fields = AsTuple(t)->fields;
        if (v->kind != PVal::Kind::kTuple || v->size != fields.size()) return false;
        for (size_t i = 0; i < fields.size(); ++i) {
          if (!Fits(v->fields[i], fields[i])) return false;
        }
        return true;
      }
      case TypeKind::kAdt: return v->kind == PVal::Kind::kAdt && v->adt->name == AsAdt(t)->name;
      case TypeKind::kFunc: return v->kind == PVal::Kind::kClosure || v->kind == PVal::Kind::kGlobal;
      case TypeKind::kVar: return true;
    }
    return false;
  }

  void CheckResult(const PVal* result, const FuncNode& f, const std::string* name) {
    if (!f.ret_type || Fits(result, f.ret_type)) return;
    throw PeFailure(f.loc.ToString() + ": the result of " + (name ? "@" + *name : std::string("the function")) +
                    " is " + TypeText(result) + ", not its declared " + TypeToString(f.ret_type));
  }

  // The dynamic atoms of `values`, depth first, with their paths.
  static std::vector<std::pair<std::string, Expr>> Atoms(std::span<const PVal* const> values, bool top_is_tuple) {
    std::vector<std::pair<std::string, Expr>> out;
    std::vector<std::pair<std::string, const PVal*>> stack;
    for (size_t i = values.size(); i-- > 0;) stack.push_back({top_is_tuple ? std::to_string(i) : "", values[i]});
    while (!stack.empty()) {
      auto [path, v] = stack.back();
      stack.pop_back();
      if (v->kind == PVal::Kind::kDynamic) out.push_back({path, v->atom});
      if (v->kind == PVal::Kind::kTuple || v->kind == PVal::Kind::kAdt || v->kind == PVal::Kind::kClosure) {
        for (uint32_t i = v->size; i-- > 0;) {
          stack.push_back({path + (path.empty() ? "" : ".") + std::to_string(i), v->fields[i]});
        }
      }
    }
    return out;
  }

  std::string ArgTypes(std::span<const PVal* const> args) {
    std::string out;
    for (const PVal* a : args) out += (out.empty() ? "" : ", ") + TypeText(a);
    return out;
  }

  void OpenScope(bool function_root) {
    scopes_.emplace_back();
    scopes_.back().function_root = function_root;
    scopes_.back().calls_mark = calls_.size();
    if (function_root) root_scope_ = static_cast<int>(scopes_.size()) - 1;
  }

  Expr CloseScope(Expr result) {
    Scope scope = std::move(scopes_.back());
    scopes_.pop_back();
    if (scope.function_root) {
      root_scope_ = -1;
      for (int i = static_cast<int>(scopes_.size()) - 1; i >= 0 && root_scope_ < 0; --i) {
        if (scopes_[i].function_root) root_scope_ = i;
      }
    }
    // Calls answered in this scope are out of scope now; the chains lose
    // their newest entries, which are exactly these.
    while (calls_.size() > scope.calls_mark) {
      call_heads_.At(calls_.back().key) = calls_.back().next;
      calls_.pop_back();
    }
    Expr body = std::move(result);
    // Moved, not copied: the nodes' reference counts stay untouched (and out of the cache).
    for (auto it = scope.lets.rbegin(); it != scope.lets.rend(); ++it) {
      body = MakeLet(std::move(it->first), std::move(it->second), std::move(body));
    }
    for (auto it = scope.constant_lets.rbegin(); it != scope.constant_lets.rend(); ++it) {
      body = MakeLet(std::move(it->first), std::move(it->second), std::move(body));
    }
    return body;
  }

  // A static tensor as an atom: scalars inline, larger tensors let-bound once
  // per residual function.
  Expr Materialize(const Tensor& t) {
    if (t.numel() == 1) return MakeConstant(t);
    Scope& root = scopes_[root_scope_];
    auto found = root.constants.find(t.raw_data());
    if (found != root.constants.end()) {
      if (recording_) NoteConstant(t, found->second.second);
      return found->second.second;
    }
    Var v = MakeVar("const", Intern(t.type())->type);
    root.constant_lets.push_back({v, MakeConstant(t)});
    root.constants.emplace(t.raw_data(), std::make_pair(t, v));
    if (recording_) NoteConstant(t, v);
    return v;
  }

  Expr Reify(const PVal* p, const SourceLoc& loc) {
    CheckStack(&loc);
    switch (p->kind) {
      case PVal::Kind::kDynamic: return p->atom;
      case PVal::Kind::kStatic: return Materialize(*p->value);
      case PVal::Kind::kTuple: {
        std::vector<Expr> fields;
        fields.reserve(p->size);
        for (const PVal* f : p->Fields()) fields.push_back(Reify(f, loc));
        return MakeTuple(std::move(fields));
      }
      case PVal::Kind::kAdt: {
        std::vector<Expr> fields;
        fields.reserve(p->size);
        for (const PVal* f : p->Fields()) fields.push_back(Reify(f, loc));
        return std::make_shared<CtorNode>(AdtOf(p->adt), p->tag, std::move(fields), SourceLoc{});
      }
      case PVal::Kind::kClosure:
      case PVal::Kind::kGlobal:
        throw PeFailure(loc.ToString() + ": a function value cannot be left in the residual program");
    }
    return nullptr;
  }

  // The type of a value that can be residualized as a tensor or a tuple.
  Type TypeOf(const PVal* p) {
    switch (p->kind) {
      case PVal::Kind::kDynamic: return p->type->type;
      case PVal::Kind::kStatic: return Intern(p->value->type())->type;
      case PVal::Kind::kTuple: {
        std::vector<Type> fields;
        for (const PVal* f : p->Fields()) fields.push_back(TypeOf(f));
        return TupleTy(std::move(fields));
      }
      default: return nullptr;
    }
  }

  // ---- Values in, and generalization -------------------------------------------

  const PVal* FromValue(const Value& v, bool whole_static, std::vector<Var>& params) {
    CheckStack(nullptr);
    switch (v.kind()) {
      case Value::Kind::kTensor: {
        if (whole_static) return NewStatic(v.tensor());
        const TypeInfo* type = Intern(v.tensor().type());
        Var p = MakeVar("p" + std::to_string(params.size()), type->type);
        params.push_back(p);
        return NewDynamic(p, type);
      }
      case Value::Kind::kTuple:
      case Value::Kind::kAdt: {
        std::vector<const PVal*> fields;
        fields.reserve(v.fields().size());
        for (const Value& f : v.fields()) fields.push_back(FromValue(f, whole_static, params));
        return v.kind() == Value::Kind::kTuple ? NewTuple(fields) : NewAdt(v.adt(), v.tag(), fields);
      }
      case Value::Kind::kClosure:
        if (!whole_static) throw PeFailure("a function value among dynamic arguments");
        throw PeFailure("function values as static arguments are not supported");
      case Value::Kind::kNone: break;
    }
    throw PeFailure("an empty value among the arguments");
  }

  // `p` with every tensor (static or dynamic) replaced by a new parameter.
  const PVal* Generalize(const PVal* p, std::vector<Var>& params, std::vector<Expr>& actuals, const SourceLoc& loc) {
    CheckStack(&loc);
    switch (p->kind) {
      case PVal::Kind::kDynamic:
      case PVal::Kind::kStatic: {
        const TypeInfo* type = Intern(TypeOf(p));
        Var v = MakeVar("p" + std::to_string(params.size()), type->type);
        params.push_back(v);
        actuals.push_back(Reify(p, loc));
        return NewDynamic(v, type);
      }
      case PVal::Kind::kTuple:
      case PVal::Kind::kAdt: {
        std::vector<const PVal*> fields;
        for (const PVal* f : p->Fields()) fields.push_back(Generalize(f, params, actuals, loc));
        return p->kind == PVal::Kind::kTuple ? NewTuple(fields) : NewAdt(AdtOf(p->adt), p->tag, fields);
      }
      case PVal::Kind::kClosure: {
        std::vector<const PVal*> captured;
        for (const PVal* v : p->Fields()) captured.push_back(Generalize(v, params, actuals, loc));
        return NewClosure(p->closure, captured);
      }
      case PVal::Kind::kGlobal: return p;
    }
    return p;
  }

  // ---- Evaluation ------------------------------------------------------------------

  // `at`: the expression being evaluated or built, for the message; none while
  // reading the arguments.
  void CheckStack(const SourceLoc* at) {
    char here;
    if (recording_ && &here < recording_->stack_low) recording_->stack_low = &here;
    if (stack_base_ - &here > options_.max_stack_bytes) {
      const std::string where = at && at->known() ? at->ToString() + ": " : std::string("the arguments: ");
      throw PeFailure(where + "partial evaluation nests deeper than " + std::to_string(options_.max_stack_bytes) +
                      " bytes of native stack allow (PeOptions::max_stack_bytes)");
    }
  }

  const PVal* Eval(const Expr& root) {
    CheckStack(&root->loc);
    const Expr* e = &root;
    while ((*e)->kind == ExprKind::kLet) {  // let-chains iteratively
      const LetNode& let = NodeOf<LetNode>(*e);
      hint_ = &let.var->name;
      const PVal* value = Eval(let.value);
      hint_ = nullptr;
      if (let.var->annotation && !Fits(value, let.var->annotation)) {
        throw PeFailure(let.loc.ToString() + ": %" + let.var->name + " is " + TypeText(value) + ", not its annotated " +
                        TypeToString(let.var->annotation));
      }
      Bind(let.var.get(), value);
      e = &let.body;
    }
    switch ((*e)->kind) {
      case ExprKind::kVar: {
        const VarNode& var = NodeOf<VarNode>(*e);
        const PVal* value = Lookup(&var);
        if (!value) throw PeFailure(var.loc.ToString() + ": %" + var.name + " has no value");
        return value;
      }
      case ExprKind::kConstant: return NewStatic(&NodeOf<ConstantNode>(*e).value);
      case ExprKind::kOpCall: return EvalOp(NodeOf<OpCallNode>(*e));
      case ExprKind::kCall: {
        const CallNode& call = NodeOf<CallNode>(*e);
        const PVal* callee = Eval(call.callee);
        SmallVec<const PVal*> args;
        for (const Expr& a : call.args) args.push_back(Eval(a));
        return Apply(&call, callee, args);
      }
      case ExprKind::kIf: return EvalIf(NodeOf<IfNode>(*e));
      case ExprKind::kTuple: {
        const TupleNode& tuple = NodeOf<TupleNode>(*e);
        SmallVec<const PVal*> fields;
        for (const Expr& f : tuple.fields) fields.push_back(Eval(f));
        return NewTuple(fields);
      }
      case ExprKind::kProj: {
        const ProjNode& proj = NodeOf<ProjNode>(*e);
        const PVal* t = Eval(proj.tuple);
        if (t->kind == PVal::Kind::kTuple) return t->fields[proj.index];
        const TupleTypeNode* type = t->kind == PVal::Kind::kDynamic ? AsTuple(t->type->type) : nullptr;
        if (!type || proj.index < 0 || static_cast<size_t>(proj.index) >= type->fields.size()) {
          throw PeFailure(proj.loc.ToString() + ": projection ." + std::to_string(proj.index) + " of a value that is not a tuple of that size");
        }
        const TypeInfo* field = Intern(type->fields[proj.index]);
        return NewDynamic(Emit(MakeProj(t->atom, proj.index), field->type), field);
      }
      case ExprKind::kFunc: {
        const FuncNode& f = NodeOf<FuncNode>(*e);
        auto [it, added] = free_vars_.try_emplace(&f);
        if (added) it->second = FreeVars(f);
        std::vector<const PVal*> captured;
        captured.reserve(it->second.size());
        for (const VarNode* v : it->second) {
          const PVal* value = Lookup(v);
          if (!value) throw PeFailure(f.loc.ToString() + ": %" + v->name + " has no value");
          captured.push_back(value);
        }
        return NewClosure(arena_.Keep(ClosureInfo{std::static_pointer_cast<const FuncNode>(*e), it->second.data()}),
                          captured);
      }
      case ExprKind::kGlobal: return GlobalOf(NodeOf<GlobalNode>(*e));
      case ExprKind::kCtor: {
        const CtorNode& c = NodeOf<CtorNode>(*e);
        SmallVec<const PVal*> fields;
        for (const Expr& a : c.args) fields.push_back(Eval(a));
        const auto& declared = c.adt->ctors[c.tag].fields;
        for (size_t i = 0; i < declared.size() && i < fields.size(); ++i) {
          if (!Fits(fields[i], declared[i])) {
            throw PeFailure(c.loc.ToString() + ": field " + std::to_string(i) + " of " + c.adt->ctors[c.tag].name +
                            " is " + TypeText(fields[i]) + ", not its declared " + TypeToString(declared[i]));
          }
        }
        return NewAdt(c.adt, c.tag, fields);
      }
      case ExprKind::kMatch: return EvalMatch(NodeOf<MatchNode>(*e));
      case ExprKind::kLet: break;
    }
    throw PeFailure("unexpected expression");
  }

  // Result types of `n` on these inputs, inferred once per node and types.
  const std::vector<const TypeInfo*>& InferOutputs(const OpCallNode& n, std::span<const TypeInfo* const> inputs) {
    uint64_t key = HashPtr(&n);
    for (const TypeInfo* t : inputs) key = Mix(key, HashPtr(t));
    int32_t& head = infer_heads_.At(key);
    for (int32_t i = head; i >= 0; i = infers_[i].next) {
      const InferEntry& entry = infers_[i];
      if (entry.node == &n && std::equal(inputs.begin(), inputs.end(), entry.inputs.begin(), entry.inputs.end())) {
        return entry.outputs;
      }
    }
    std::vector<TensorType> types;
    types.reserve(inputs.size());
    for (const TypeInfo* t : inputs) types.push_back(t->tensor->type);
    std::vector<TensorType> out;
    try {
      out = InferTypes(*n.op, types, n.attrs);
    } catch (const OpError& err) {
      throw PeFailure(n.loc.ToString() + ": " + err.what());
    }
    InferEntry entry{&n, {inputs.begin(), inputs.end()}, {}, -1};
    for (const TensorType& t : out) entry.outputs.push_back(Intern(t));
    entry.next = infer_heads_.At(key);  // `head` may have moved with the interning
    infer_heads_.At(key) = static_cast<int32_t>(infers_.size());
    infers_.push_back(std::move(entry));
    return infers_.back().outputs;
  }

  const PVal* EvalOp(const OpCallNode& n) {
    const std::string* hint = hint_;
    hint_ = nullptr;
    SmallVec<const PVal*> args;
    bool all_static = true;
    for (const Expr& a : n.args) {
      args.push_back(Eval(a));
      all_static &= args.back()->kind == PVal::Kind::kStatic;
    }
    if (all_static) {
      std::vector<Tensor> inputs;
      inputs.reserve(args.size());
      for (const PVal* a : args) inputs.push_back(*a->value);
      std::vector<Tensor> outputs;
      try {
        outputs = RunOp(*n.op, inputs, n.attrs);
      } catch (const OpError& err) {
        throw PeFailure(n.loc.ToString() + ": " + err.what());
      }
      ++stats_.folded_ops;
      if (recording_) {
        for (const Tensor& t : outputs) recording_->fresh.At(HashPtr(t.raw_data())) = 1;
      }
      if (outputs.size() == 1) return NewStatic(std::move(outputs[0]));
      std::vector<const PVal*> fields;
      for (Tensor& t : outputs) fields.push_back(NewStatic(std::move(t)));
      return NewTuple(fields);
    }
    std::vector<Expr> atoms;
    SmallVec<const TypeInfo*> types;
    atoms.reserve(args.size());
    for (const PVal* a : args) {
      atoms.push_back(Reify(a, n.loc));
      const TypeInfo* type = a->kind == PVal::Kind::kDynamic  ? a->type
                             : a->kind == PVal::Kind::kStatic ? Intern(a->value->type())
                                                              : nullptr;
      if (!type || !type->tensor) throw PeFailure(n.loc.ToString() + ": " + n.op->name + " got a non-tensor input");
      types.push_back(type);
    }
    const std::vector<const TypeInfo*>& out = InferOutputs(n, types);
    if (++stats_.residual_ops > options_.max_residual_ops) {
      throw PeFailure("residual over " + std::to_string(options_.max_residual_ops) +
                      " operators (PeOptions::max_residual_ops)");
    }
    Expr call = std::make_shared<OpCallNode>(n.op, std::move(atoms), n.attrs, n.loc);
    hint_ = hint;
    if (out.size() == 1) return NewDynamic(Emit(call, out[0]->type), out[0]);
    std::vector<Type> fields;
    for (const TypeInfo* t : out) fields.push_back(t->type);
    Var tuple = Emit(call, TupleTy(fields));
    std::vector<const PVal*> parts;
    for (size_t i = 0; i < out.size(); ++i) {
      parts.push_back(NewDynamic(Emit(MakeProj(tuple, static_cast<int>(i)), out[i]->type), out[i]));
    }
    return NewTuple(parts);
  }

  const PVal* EvalIf(const IfNode& n) {
    const std::string* hint = hint_;
    hint_ = nullptr;
    const PVal* cond = Eval(n.cond);
    if (cond->kind == PVal::Kind::kStatic) return Eval(cond->value->data<bool>()[0] ? n.then_branch : n.else_branch);
    auto branch = [&](const Expr& e) {
      OpenScope(false);
      const PVal* r = Eval(e);
      return CloseScope(Reify(r, e->loc));
    };
    Expr then_branch = branch(n.then_branch);
    Expr else_branch = branch(n.else_branch);
    if (!n.checked_type) throw PeFailure(n.loc.ToString() + ": the type of a dynamic `if` is unknown");
    const TypeInfo* type = Intern(n.checked_type);
    hint_ = hint;
    return NewDynamic(Emit(MakeIf(cond->atom, then_branch, else_branch, n.loc), type->type), type);
  }

  bool Match(const Pattern& p, const PVal* v, const SourceLoc& loc) {
    switch (p->kind) {
      case PatternKind::kWildcard: return true;
      case PatternKind::kVar: Bind(p->var.get(), v); return true;
      case PatternKind::kTuple:
      case PatternKind::kCtor:
        if (v->kind == PVal::Kind::kDynamic) {
          // A tuple pattern takes a residual tuple (a dynamic `if`'s) apart
          // with projections; a dynamic ADT value cannot be matched (a).
          const TupleTypeNode* type = p->kind == PatternKind::kTuple ? AsTuple(v->type->type) : nullptr;
          if (!type) throw PeFailure(loc.ToString() + ": match on a dynamic value (" + TypeToString(v->type->type) + ")");
          for (size_t i = 0; i < p->fields.size(); ++i) {
            if (p->fields[i]->kind == PatternKind::kWildcard) continue;
            const TypeInfo* field = Intern(type->fields[i]);
            if (!Match(p->fields[i], NewDynamic(Emit(MakeProj(v->atom, static_cast<int>(i)), field->type), field), loc)) {
              return false;
            }
          }
          return true;
        }
        if (p->kind == PatternKind::kCtor && v->tag != p->tag) return false;
        for (size_t i = 0; i < p->fields.size(); ++i) {
          if (!Match(p->fields[i], v->fields[i], loc)) return false;
        }
        return true;
    }
    return false;
  }

  const PVal* EvalMatch(const MatchNode& n) {
    const PVal* v = Eval(n.scrutinee);
    for (size_t i = 0; i < n.clauses.size(); ++i) {
      const Clause& c = n.clauses[i];
      if (!Match(c.pattern, v, n.loc)) continue;
      if (options_.record_instances && v->kind == PVal::Kind::kAdt) {
        instances_[current_instance_].clauses.push_back(static_cast<int>(i));
      }
      return Eval(c.body);
    }
    throw PeFailure(n.loc.ToString() + ": no clause of match fits the value");
  }

  // ---- (7) Templates ---------------------------------------------------------------

  const FuncNode* FunctionNamed(const std::string& name) {
    auto [it, added] = functions_.try_emplace(name, nullptr);
    if (added) it->second = module_.Get(name).func.get();
    return it->second;
  }

  // The versions of `helper` and of everything it calls, as part of a key.
  const std::string& VersionKey(const std::string& helper) {
    auto [it, added] = version_keys_.try_emplace(helper);
    if (added) {
      for (const auto& [name, version] : module_.VersionsOf(helper)) {
        it->second += name + "=" + std::to_string(version) + ";";
      }
    }
    return it->second;
  }

  template <typename T>
  static void Put(std::string& key, T v) {
    key.append(reinterpret_cast<const char*>(&v), sizeof v);
  }

  static void PutType(std::string& key, const TypeInfo& t) {
    if (t.tensor) {
      key.push_back('T');
      Put(key, static_cast<uint8_t>(t.tensor->type.dtype));
      Put(key, static_cast<uint32_t>(t.tensor->type.shape.size()));
      for (int64_t d : t.tensor->type.shape) Put(key, d);
    } else {
      key += TypeToString(t.type);
      key.push_back('\0');
    }
  }

  // The key of `helper` on `args`: its versions and the arguments' skeleton,
  // sharing included (which nodes are the same node, which dynamic nodes the
  // same atom, which static nodes the same buffer: unfoldings differ by it).
  // False for arguments a template cannot stand for (function values).
  bool Describe(const std::string& helper, std::span<const PVal* const> args, Recording& rec) {
    std::string& key = rec.key;
    key = helper;
    key.push_back('\0');
    key += VersionKey(helper);
    key.push_back('\0');
    IndexTable atom_node;
    std::vector<const PVal*> stack(args.rbegin(), args.rend());
    while (!stack.empty()) {
      const PVal* p = stack.back();
      stack.pop_back();
      int32_t seen = rec.node_index.Get(HashPtr(p));
      if (seen >= 0) {
        key.push_back('R');
        Put(key, seen);
        continue;
      }
      int32_t index = static_cast<int32_t>(rec.nodes.size());
      rec.node_index.At(HashPtr(p)) = index;
      rec.nodes.push_back(p);
      switch (p->kind) {
        case PVal::Kind::kDynamic: {
          if (p->atom->kind != ExprKind::kVar) return false;
          key.push_back('D');
          PutType(key, *p->type);
          int32_t& first = atom_node.At(HashPtr(p->atom.get()));
          if (first < 0) first = index;
          Put(key, first);
          break;
        }
        case PVal::Kind::kStatic: {
          const Tensor& t = *p->value;
          key.push_back('S');
          PutType(key, *Intern(t.type()));
          key.append(static_cast<const char*>(t.raw_data()), t.nbytes());
          int32_t& first = rec.static_buffer.At(HashPtr(t.raw_data()));
          if (first < 0) first = index;
          Put(key, first);
          break;
        }
        case PVal::Kind::kTuple:
        case PVal::Kind::kAdt:
          if (p->kind == PVal::Kind::kTuple) {
            key.push_back('(');
          } else {
            key.push_back('A');
            key += p->adt->name;
            key.push_back('\0');
            Put(key, p->tag);
          }
          Put(key, p->size);
          for (uint32_t i = p->size; i-- > 0;) stack.push_back(p->fields[i]);
          break;
        case PVal::Kind::kClosure:
        case PVal::Kind::kGlobal: return false;
      }
    }
    rec.helper = helper;
    return true;
  }

  void StartRecording(std::unique_ptr<Recording> rec, int64_t unfoldings_before) {
    char here;
    rec->scope = static_cast<int>(scopes_.size()) - 1;
    rec->lets_mark = scopes_.back().lets.size();
    rec->calls_mark = calls_.size();
    rec->unfoldings = unfoldings_before;
    rec->residual_ops = stats_.residual_ops;
    rec->folded_ops = stats_.folded_ops;
    rec->shared_calls = stats_.shared_calls;
    rec->stack_start = rec->stack_low = &here;
    recording_ = std::move(rec);
  }

  // A memo lookup inside the recorded helper: an answer from outside it makes
  // the unfolding depend on its context; a miss on argument nodes only is a
  // probe that a replay must repeat.
  void NoteLookup(int32_t found, const std::string* global, std::span<const PVal* const> ids) {
    Recording& rec = *recording_;
    if (found >= 0) {
      if (static_cast<size_t>(found) < rec.calls_mark) rec.valid = false;
      return;
    }
    if (!global) return;
    size_t first = rec.probe_args.size();
    for (const PVal* id : ids) {
      int32_t node = rec.node_index.Get(HashPtr(id));
      if (node < 0) {
        rec.probe_args.resize(first);
        return;
      }
      rec.probe_args.push_back(node);
    }
    rec.probes.push_back({global, static_cast<uint32_t>(first)});
  }

  void NoteConstant(const Tensor& t, const Var& var) {
    int32_t& index = recording_->const_index.At(HashPtr(t.raw_data()));
    if (index >= 0) return;
    index = static_cast<int32_t>(recording_->consts.size());
    recording_->consts.push_back({t, var});
  }

  void FinishRecording(const PVal* result) {
    std::unique_ptr<Recording> rec = std::move(recording_);
    if (!rec->valid) return;
    auto t = std::make_shared<PeTemplate>();
    TemplateBuilder builder(*this, *rec, *t);
    if (!builder.Build(result)) return;
    auto bindings = static_cast<int64_t>(t->lets.size());
    if (PeCacheAccess::Insert(*cache_, rec->key, std::move(t), bindings)) ++stats_.cached_specializations;
  }

  // The template of a finished, context-free unfolding. Build() is false
  // when something in it cannot be stood for (a variable from outside, a
  // function value).
  class TemplateBuilder {
   public:
    TemplateBuilder(PartialEvaluator& pe, const Recording& rec, PeTemplate& t) : pe_(pe), rec_(rec), t_(t) {}

    bool Build(const PVal* result) {
      t_.helper = rec_.helper;
      const Scope& scope = pe_.scopes_[rec_.scope];
      size_t lets = scope.lets.size() - rec_.lets_mark;
      slot_of_.Reserve(rec_.nodes.size() + rec_.consts.size() + lets);
      for (size_t k = 0; k < rec_.nodes.size(); ++k) {
        const PVal* p = rec_.nodes[k];
        if (p->kind != PVal::Kind::kDynamic) continue;
        int32_t& slot = slot_of_.At(HashPtr(p->atom.get()));
        if (slot < 0) {
          slot = slots_++;
          t_.param_nodes.push_back(static_cast<int32_t>(k));
        }
      }
      for (const auto& [tensor, var] : rec_.consts) {
        slot_of_.At(HashPtr(var.get())) = slots_++;
        t_.consts.push_back(StaticIndex(tensor));
      }
      t_.lets.reserve(lets);
      t_.operands.reserve(3 * lets);
      for (size_t i = rec_.lets_mark; i < scope.lets.size(); ++i) {
        if (!AddLet(scope.lets[i].first, scope.lets[i].second)) return false;
      }
      t_.result = Convert(result, 0);
      if (t_.result < 0 || !AddCalls(result)) return false;

      for (size_t i = 0; i < rec_.probes.size(); ++i) {
        uint32_t first = rec_.probes[i].second;
        uint32_t end = i + 1 < rec_.probes.size() ? rec_.probes[i + 1].second
                                                  : static_cast<uint32_t>(rec_.probe_args.size());
        t_.probes.push_back({Name(*rec_.probes[i].first), static_cast<uint32_t>(t_.ids.size()), end - first});
        t_.ids.insert(t_.ids.end(), rec_.probe_args.begin() + first, rec_.probe_args.begin() + end);
      }
      t_.unfold_keys = rec_.unfold_keys;
      std::sort(t_.unfold_keys.begin(), t_.unfold_keys.end());
      t_.unfold_keys.erase(std::unique(t_.unfold_keys.begin(), t_.unfold_keys.end()), t_.unfold_keys.end());
      const PeStats& now = pe_.stats_;
      t_.unfoldings = now.unfoldings - rec_.unfoldings;
      t_.residual_ops = now.residual_ops - rec_.residual_ops;
      t_.folded_ops = now.folded_ops - rec_.folded_ops;
      t_.shared_calls = now.shared_calls - rec_.shared_calls;
      t_.stack_bytes = rec_.stack_start - rec_.stack_low;
      return true;
    }

   private:
    PartialEvaluator& pe_;
    const Recording& rec_;
    PeTemplate& t_;
    IndexTable slot_of_;    // a variable → its slot
    int32_t slots_ = 0;
    IndexTable static_of_;  // a buffer → its statics entry
    IndexTable value_of_;   // a PVal → its value
    IndexTable name_of_;    // a global's name (by address) → its index in names
    IndexTable visible_;    // PVals the caller can reach after the call
    IndexTable site_heads_;  // a site's hash → its newest site, chained by site_next_
    std::vector<int32_t> site_next_;
    std::vector<const PVal*> stack_;

    int32_t Name(const std::string& name) {
      int32_t& index = name_of_.At(HashPtr(&name));
      if (index < 0) {
        index = static_cast<int32_t>(t_.names.size());
        t_.names.push_back(name);
      }
      return index;
    }

    int32_t StaticIndex(const Tensor& v) {
      int32_t index = static_of_.Get(HashPtr(v.raw_data()));
      if (index >= 0) return index;
      index = static_cast<int32_t>(t_.statics.size());
      static_of_.At(HashPtr(v.raw_data())) = index;
      PeTemplate::Static st;
      st.arg_node = rec_.static_buffer.Get(HashPtr(v.raw_data()));
      if (st.arg_node < 0) {
        st.value = v;
        st.fresh = rec_.fresh.Get(HashPtr(v.raw_data())) >= 0;
      }
      t_.statics.push_back(std::move(st));
      return index;
    }

    int32_t SiteOf(const VarNode& var, const OpCallNode* op) {
      static const Attrs kNoAttrs;
      static const SourceLoc kNoLoc;
      const Attrs& attrs = op ? op->attrs : kNoAttrs;
      const SourceLoc& loc = op ? op->loc : kNoLoc;
      uint64_t key = Mix(Mix(HashPtr(var.annotation.get()), std::hash<std::string>{}(var.name)), HashPtr(op ? op->op : nullptr));
      key = Mix(Mix(key, HashPtr(&attrs.items())), Mix(HashPtr(loc.file.get()), Mix(loc.line, loc.col)));
      int32_t& head = site_heads_.At(key);
      for (int32_t i = head; i >= 0; i = site_next_[i]) {
        const PeTemplate::Site& s = t_.sites[i];
        if (s.name == var.name && s.type == var.annotation && s.op == (op ? op->op : nullptr) && s.attrs == attrs &&
            s.loc.file == loc.file && s.loc.line == loc.line && s.loc.col == loc.col) {
          return i;
        }
      }
      int32_t index = static_cast<int32_t>(t_.sites.size());
      t_.sites.push_back({var.name, var.annotation, op ? op->op : nullptr, attrs, loc});
      site_next_.push_back(head);
      head = index;
      return index;
    }

    bool AddLet(const Var& var, const Expr& value) {
      PeTemplate::Let let;
      const OpCallNode* site_op = nullptr;
      let.first = static_cast<uint32_t>(t_.operands.size());
      bool simple = false;
      if (value->kind == ExprKind::kOpCall) {
        const OpCallNode& op = NodeOf<OpCallNode>(value);
        simple = true;
        for (const Expr& a : op.args) {
          if (a->kind == ExprKind::kVar) {
            int32_t slot = slot_of_.Get(HashPtr(a.get()));
            if (slot < 0) return false;
            t_.operands.push_back(slot);
          } else if (a->kind == ExprKind::kConstant) {
            t_.operands.push_back(~static_cast<int32_t>(t_.literals.size()));
            t_.literals.push_back(a);
          } else {
            simple = false;
            t_.operands.resize(let.first);
            break;
          }
        }
        if (simple) {
          let.kind = PeTemplate::Let::Kind::kOp;
          site_op = &op;
        }
      } else if (value->kind == ExprKind::kProj && NodeOf<ProjNode>(value).tuple->kind == ExprKind::kVar) {
        int32_t slot = slot_of_.Get(HashPtr(NodeOf<ProjNode>(value).tuple.get()));
        if (slot < 0) return false;
        simple = true;
        let.kind = PeTemplate::Let::Kind::kProj;
        t_.operands.push_back(slot);
        let.index = NodeOf<ProjNode>(value).index;
      }
      if (simple) {
        let.count = static_cast<uint32_t>(t_.operands.size()) - let.first;
      } else {
        std::vector<const VarNode*> free;
        if (!FreeVarsOfResidual(value, free)) return false;
        let.first = static_cast<uint32_t>(t_.free.size());
        for (const VarNode* v : free) {
          int32_t slot = slot_of_.Get(HashPtr(v));
          if (slot < 0) return false;
          t_.free.push_back({v, slot});
        }
        let.count = static_cast<uint32_t>(free.size());
        let.kind = PeTemplate::Let::Kind::kExpr;
        let.index = static_cast<int32_t>(t_.exprs.size());
        t_.exprs.push_back(value);
      }
      let.site = SiteOf(*var, site_op);
      slot_of_.At(HashPtr(var.get())) = slots_++;
      t_.lets.push_back(std::move(let));
      return true;
    }

    // The value `p` stands for; its fields first. -1: not representable.
    int32_t Convert(const PVal* p, int depth) {
      int32_t known = value_of_.Get(HashPtr(p));
      if (known >= 0) return known;
      if (depth > 1000) return -1;
      PeTemplate::Val v;
      int32_t node = rec_.node_index.Get(HashPtr(p));
      if (node >= 0) {
        v.kind = PeTemplate::Val::Kind::kArg;
        v.index = node;
      } else {
        switch (p->kind) {
          case PVal::Kind::kDynamic:
            v.kind = PeTemplate::Val::Kind::kDynamic;
            v.index = slot_of_.Get(HashPtr(p->atom.get()));
            if (v.index < 0) return -1;
            v.type = p->type->type;
            break;
          case PVal::Kind::kStatic:
            v.kind = PeTemplate::Val::Kind::kStatic;
            v.index = StaticIndex(*p->value);
            break;
          case PVal::Kind::kTuple:
          case PVal::Kind::kAdt: {
            v.kind = p->kind == PVal::Kind::kTuple ? PeTemplate::Val::Kind::kTuple : PeTemplate::Val::Kind::kAdt;
            if (p->kind == PVal::Kind::kAdt) {
              v.adt = pe_.AdtOf(p->adt);
              v.tag = p->tag;
            }
            SmallVec<int32_t> fields;
            for (const PVal* f : p->Fields()) {
              int32_t field = Convert(f, depth + 1);
              if (field < 0) return -1;
              fields.push_back(field);
            }
            v.first = static_cast<uint32_t>(t_.fields.size());
            v.count = static_cast<uint32_t>(fields.size());
            t_.fields.insert(t_.fields.end(), fields.begin(), fields.end());
            break;
          }
          case PVal::Kind::kClosure:
          case PVal::Kind::kGlobal: return -1;
        }
      }
      int32_t index = static_cast<int32_t>(t_.values.size());
      t_.values.push_back(std::move(v));
      value_of_.At(HashPtr(p)) = index;
      return index;
    }

    // Marks `root` and everything in it reachable.
    void Show(const PVal* root) {
      stack_.push_back(root);
      while (!stack_.empty()) {
        const PVal* p = stack_.back();
        stack_.pop_back();
        int32_t& seen = visible_.At(HashPtr(p));
        if (seen >= 0) continue;
        seen = 1;
        if (p->kind == PVal::Kind::kTuple || p->kind == PVal::Kind::kAdt || p->kind == PVal::Kind::kClosure) {
          for (const PVal* f : p->Fields()) stack_.push_back(f);
        }
      }
    }

    // The calls answered inside whose entries the caller can still reach:
    // on values it can reach (the arguments', the result's, and those of
    // such calls' results).
    bool AddCalls(const PVal* result) {
      const std::vector<CallEntry>& calls = pe_.calls_;
      for (const PVal* node : rec_.nodes) visible_.At(HashPtr(node)) = 1;
      Show(result);
      std::vector<bool> exposed(calls.size() - rec_.calls_mark, false);
      for (bool changed = true; changed;) {
        changed = false;
        for (size_t i = rec_.calls_mark; i < calls.size(); ++i) {
          if (exposed[i - rec_.calls_mark]) continue;
          const CallEntry& c = calls[i];
          bool reachable = true;
          for (uint32_t k = 0; reachable && k < c.size; ++k) reachable = visible_.Get(HashPtr(c.ids[k])) >= 0;
          if (!reachable) continue;
          exposed[i - rec_.calls_mark] = true;
          Show(c.result);
          changed = true;
        }
      }
      for (size_t i = rec_.calls_mark; i < calls.size(); ++i) {
        if (!exposed[i - rec_.calls_mark]) continue;
        const CallEntry& c = calls[i];
        if (!c.global) return false;
        PeTemplate::Call call{Name(*c.global), 0, c.size, Convert(c.result, 0)};
        if (call.result < 0) return false;
        SmallVec<int32_t> ids;
        for (uint32_t k = 0; k < c.size; ++k) {
          int32_t id = Convert(c.ids[k], 0);
          if (id < 0) return false;
          ids.push_back(id);
        }
        call.first = static_cast<uint32_t>(t_.ids.size());
        t_.ids.insert(t_.ids.end(), ids.begin(), ids.end());
        t_.calls.push_back(call);
      }
      return true;
    }
  };

  // The helper call `at` describes, answered by emitting `t`'s code on its
  // argument nodes; null when a fresh unfolding here could differ from it
  // (then the caller unfolds).
  const PVal* Replay(std::shared_ptr<const PeTemplate> shared, const Recording& at) {
    const PeTemplate& t = *shared;
    // The budgets a fresh unfolding would run into.
    char here;
    if (stats_.unfoldings + t.unfoldings > options_.fuel ||
        stats_.residual_ops + t.residual_ops > options_.max_residual_ops ||
        (stack_base_ - &here) + t.stack_bytes > options_.max_stack_bytes) {
      return nullptr;
    }
    // Unfoldings in progress here that one inside would take for a loop.
    for (uint64_t key : t.unfold_keys) {
      int32_t i = active_heads_.Get(key);
      if (i >= 0 && static_cast<size_t>(i) >= active_floor_) return nullptr;
    }
    // Calls inside on the arguments alone that the memo here would answer.
    std::vector<const FuncNode*> functions(t.names.size(), nullptr);
    auto function = [&](int32_t name) {
      if (!functions[name]) functions[name] = FunctionNamed(t.names[name]);
      return functions[name];
    };
    for (const PeTemplate::Probe& probe : t.probes) {
      const FuncNode* f = function(probe.callee);
      SmallVec<const PVal*> ids;
      for (uint32_t k = 0; k < probe.count; ++k) ids.push_back(at.nodes[t.ids[probe.first + k]]);
      if (FindCall(CallKey(f, ids), f, ids) >= 0) return nullptr;
    }

    std::vector<Expr> slots;
    slots.reserve(t.param_nodes.size() + t.consts.size() + t.lets.size());
    for (int32_t node : t.param_nodes) slots.push_back(at.nodes[node]->atom);
    std::vector<const Tensor*> statics(t.statics.size(), nullptr);
    auto static_tensor = [&](int32_t i) {
      if (!statics[i]) {
        const PeTemplate::Static& st = t.statics[i];
        statics[i] = st.arg_node >= 0 ? at.nodes[st.arg_node]->value
                     : st.fresh       ? arena_.Keep(st.value.Clone())  // a new buffer, as a fresh fold makes
                                      : &st.value;
      }
      return statics[i];
    };
    for (int32_t c : t.consts) slots.push_back(Materialize(*static_tensor(c)));
    std::vector<std::pair<Var, Expr>>& lets = scopes_.back().lets;
    lets.reserve(lets.size() + t.lets.size());
    for (const PeTemplate::Let& let : t.lets) {
      const PeTemplate::Site& site = t.sites[let.site];
      Expr value;
      switch (let.kind) {
        case PeTemplate::Let::Kind::kOp: {
          std::vector<Expr> args;
          args.reserve(let.count);
          for (uint32_t k = 0; k < let.count; ++k) {
            int32_t o = t.operands[let.first + k];
            args.push_back(o >= 0 ? slots[o] : t.literals[~o]);
          }
          value = std::make_shared<OpCallNode>(site.op, std::move(args), site.attrs, site.loc);
          break;
        }
        case PeTemplate::Let::Kind::kProj: value = MakeProj(slots[t.operands[let.first]], let.index); break;
        case PeTemplate::Let::Kind::kExpr:
          value = TemplateRewriter({t.free.data() + let.first, let.count}, slots).Mutate(t.exprs[let.index]);
          break;
      }
      Var var = MakeVar(site.name, site.type);
      lets.push_back({var, std::move(value)});
      slots.push_back(std::move(var));
    }
    stats_.unfoldings += t.unfoldings;
    stats_.residual_ops += t.residual_ops;
    stats_.folded_ops += t.folded_ops;
    stats_.shared_calls += t.shared_calls;
    ++stats_.reused_specializations;
    stats_.reused.push_back(t.helper);

    std::vector<const PVal*> values(t.values.size(), nullptr);
    for (size_t i = 0; i < t.values.size(); ++i) {
      const PeTemplate::Val& v = t.values[i];
      switch (v.kind) {
        case PeTemplate::Val::Kind::kArg: values[i] = at.nodes[v.index]; break;
        case PeTemplate::Val::Kind::kDynamic: values[i] = NewDynamic(slots[v.index], Intern(v.type)); break;
        case PeTemplate::Val::Kind::kStatic: values[i] = NewStatic(static_tensor(v.index)); break;
        case PeTemplate::Val::Kind::kTuple:
        case PeTemplate::Val::Kind::kAdt: {
          SmallVec<const PVal*> fields;
          for (uint32_t k = 0; k < v.count; ++k) fields.push_back(values[t.fields[v.first + k]]);
          values[i] = v.kind == PeTemplate::Val::Kind::kTuple ? NewTuple(fields) : NewAdt(v.adt, v.tag, fields);
          break;
        }
      }
    }
    for (const PeTemplate::Call& c : t.calls) {
      const FuncNode* f = function(c.callee);
      SmallVec<const PVal*> ids;
      for (uint32_t k = 0; k < c.count; ++k) ids.push_back(values[t.ids[c.first + k]]);
      AddCall(CallKey(f, ids), f, &t.names[c.callee], ids, values[c.result]);
    }
    const PVal* result = values[t.result];
    replayed_.push_back(std::move(shared));
    return result;
  }

  // ---- Calls --------------------------------------------------------------------------

  // (3) The same call, on the same argument values, answered in a scope
  // visible from here (up to the innermost function root).
  static uint64_t CallKey(const FuncNode* f, std::span<const PVal* const> ids) {
    uint64_t key = HashPtr(f);
    for (const PVal* a : ids) key = Mix(key, HashPtr(a));
    return key;
  }

  // The index of the entry answering the call, or -1.
  int32_t FindCall(uint64_t key, const FuncNode* f, std::span<const PVal* const> ids) {
    for (int32_t i = call_heads_.Get(key); i >= 0; i = calls_[i].next) {
      const CallEntry& c = calls_[i];
      if (c.scope < root_scope_ || c.func != f || c.size != ids.size()) continue;
      if (std::equal(ids.begin(), ids.end(), c.ids)) return i;
    }
    return -1;
  }

  void AddCall(uint64_t key, const FuncNode* f, const std::string* global, std::span<const PVal* const> ids,
               const PVal* result) {
    const PVal** copy = arena_.Array<const PVal*>(ids.size());
    std::copy(ids.begin(), ids.end(), copy);
    int32_t& head = call_heads_.At(key);
    calls_.push_back({key, f, global, copy, static_cast<uint32_t>(ids.size()),
                      static_cast<int32_t>(scopes_.size()) - 1, result, head});
    head = static_cast<int32_t>(calls_.size()) - 1;
  }

  // (4) Whether f on these arguments' skeleton is being unfolded already.
  bool IsActive(uint64_t key, const FuncNode* f, const PVal* closure, std::span<const PVal* const> args) {
    for (int32_t i = active_heads_.Get(key); i >= 0 && static_cast<size_t>(i) >= active_floor_;
         i = active_[i].next) {
      const ActiveEntry& a = active_[i];
      if (a.func != f || a.args.size() != args.size()) continue;
      if (closure && (!a.closure || !SameSkeleton(a.closure, closure))) continue;
      bool same = true;
      for (size_t k = 0; same && k < args.size(); ++k) same = SameSkeleton(a.args[k], args[k]);
      if (same) return true;
    }
    return false;
  }

  void PushActive(uint64_t key, const FuncNode* f, const PVal* closure, std::span<const PVal* const> args) {
    if (recording_) recording_->unfold_keys.push_back(key);
    int32_t& head = active_heads_.At(key);
    active_.push_back({key, f, closure, args, head});
    head = static_cast<int32_t>(active_.size()) - 1;
  }

  void PopActive() {
    active_heads_.At(active_.back().key) = active_.back().next;
    active_.pop_back();
  }

  const PVal* Apply(const CallNode* call, const PVal* callee, std::span<const PVal* const> args) {
    static const SourceLoc kNowhere;
    const SourceLoc& loc = call ? call->loc : kNowhere;
    const FuncNode* f;
    const PVal* closure = nullptr;
    if (callee->kind == PVal::Kind::kGlobal) {
      GlobalInfo& g = *callee->global;
      if (!g.func) g.func = module_.Get(*g.name).func.get();
      f = g.func;
    } else if (callee->kind == PVal::Kind::kClosure) {
      f = callee->closure->func.get();
      closure = callee;
    } else {
      throw PeFailure(loc.ToString() + ": call of a value that is not a known function");
    }
    const std::string* hint = hint_;
    hint_ = nullptr;

    // (a) The same call, on the same argument values, already answered in scope.
    SmallVec<const PVal*> identity;
    for (const PVal* a : args) identity.push_back(a);
    if (closure) identity.push_back(closure);
    uint64_t key = CallKey(f, identity);
    const std::string* global = closure ? nullptr : callee->global->name;
    int32_t shared = FindCall(key, f, identity);
    if (recording_) NoteLookup(shared, global, identity);
    if (shared >= 0) {
      ++stats_.shared_calls;
      return calls_[shared].result;
    }

    // (b) A loop on dynamic data, or no fuel left: call a residual function.
    uint64_t skeleton = HashPtr(f);
    for (const PVal* a : args) skeleton = Mix(skeleton, a->skeleton);
    if (closure) skeleton = Mix(skeleton, closure->skeleton);
    const PVal* result;
    if (IsActive(skeleton, f, closure, args) || stats_.unfoldings >= options_.fuel) {
      hint_ = hint;
      result = CallSpecialization(*f, callee, args, loc);
    } else {
      // (7) A helper call the cache may answer, or should learn.
      std::unique_ptr<Recording> record;
      result = nullptr;
      if (cache_ && !recording_ && call && global) {
        auto candidate = std::make_unique<Recording>();
        if (Describe(*global, args, *candidate)) {
          if (std::shared_ptr<const PeTemplate> t = PeCacheAccess::Find(*cache_, candidate->key)) {
            result = Replay(std::move(t), *candidate);
          } else {
            record = std::move(candidate);
          }
        }
      }
      if (!result) {
        // (c) Unfold.
        int64_t unfoldings_before = stats_.unfoldings;
        ++stats_.unfoldings;
        size_t mark = undo_.size();
        if (closure) {
          for (size_t i = 0; i < closure->size; ++i) Bind(closure->closure->vars[i], closure->fields[i]);
        }
        for (size_t i = 0; i < args.size(); ++i) Bind(f->params[i].get(), args[i]);
        PushActive(skeleton, f, closure, args);
        bool recorded = record != nullptr;  // nested unfoldings leave the recording to this one
        if (recorded) StartRecording(std::move(record), unfoldings_before);
        int caller = current_instance_;
        bool instance = options_.record_instances && call && global && Structural(*f);
        if (instance) {
          instances_.push_back({*global, caller, instances_[caller].calls++, 0, {}, ArgTypes(args), "", Atoms(args, true), {}});
          current_instance_ = static_cast<int>(instances_.size()) - 1;
        }
        result = Eval(f->body);
        CheckResult(result, *f, global);
        if (instance) {
          instances_[current_instance_].result_type = TypeText(result);
          instances_[current_instance_].result_atoms = Atoms({&result, 1}, false);
          current_instance_ = caller;
        }
        if (recorded) FinishRecording(result);
        PopActive();
        Unbind(mark);
      }
    }
    AddCall(key, f, global, identity, result);
    return result;
  }

  // A call to f specialized on the generalized skeleton of (callee, args).
  const PVal* CallSpecialization(const FuncNode& f, const PVal* callee, std::span<const PVal* const> args,
                                 const SourceLoc& loc) {
    if (recording_) recording_->valid = false;  // a residual function: not a template
    std::vector<Var> params;
    std::vector<Expr> actuals;
    std::vector<const PVal*> general;
    for (const PVal* a : args) general.push_back(Generalize(a, params, actuals, loc));
    const PVal* general_callee =
        callee->kind == PVal::Kind::kClosure ? Generalize(callee, params, actuals, loc) : callee;
    general.push_back(general_callee);

    const Specialization* spec = nullptr;
    for (const Specialization& s : specializations_) {
      if (s.func != &f || s.args.size() != general.size()) continue;
      bool same = true;
      for (size_t i = 0; same && i < general.size(); ++i) same = SameSkeleton(s.args[i], general[i]);
      if (same) {
        spec = &s;
        break;
      }
    }
    if (!spec) spec = &Specialize(f, general, params, loc);
    const TypeInfo* ret = Intern(spec->ret);
    Expr call = MakeCall(MakeGlobal(spec->name), std::move(actuals), loc);
    return NewDynamic(Emit(call, ret->type), ret);
  }

  const Specialization& Specialize(const FuncNode& f, const std::vector<const PVal*>& general,
                                   const std::vector<Var>& params, const SourceLoc& loc) {
    std::string name = entry_ + "_spec" + std::to_string(specializations_.size());
    Type ret = AsFunc(f.checked_type) ? AsFunc(f.checked_type)->ret : f.body->checked_type;
    if (!ret) throw PeFailure(loc.ToString() + ": the type of a residual function is unknown");
    specializations_.push_back({&f, general, name, ret});
    size_t index = specializations_.size() - 1;

    // Its body: f's body on the generalized arguments, in a fresh residual
    // function, where the unfoldings of the caller are not in progress.
    const PVal* callee = general.back();
    const PVal* closure = callee->kind == PVal::Kind::kClosure ? callee : nullptr;
    // Held in the arena: specializations_ may grow while the body is evaluated.
    const PVal** general_copy = arena_.Array<const PVal*>(general.size() - 1);
    std::copy(general.begin(), general.end() - 1, general_copy);
    std::span<const PVal* const> general_args(general_copy, general.size() - 1);
    size_t mark = undo_.size();
    if (closure) {
      for (size_t i = 0; i < closure->size; ++i) Bind(closure->closure->vars[i], closure->fields[i]);
    }
    for (size_t i = 0; i < f.params.size(); ++i) Bind(f.params[i].get(), general[i]);
    uint64_t skeleton = HashPtr(&f);
    for (const PVal* a : general_args) skeleton = Mix(skeleton, a->skeleton);
    if (closure) skeleton = Mix(skeleton, closure->skeleton);
    size_t saved_floor = active_floor_;
    active_floor_ = active_.size();
    PushActive(skeleton, &f, closure, general_args);
    OpenScope(true);
    const PVal* result = Eval(f.body);
    CheckResult(result, f, callee->kind == PVal::Kind::kGlobal ? callee->global->name : nullptr);
    Expr body = CloseScope(Reify(result, f.loc));
    PopActive();
    active_floor_ = saved_floor;
    Unbind(mark);
    residual_functions_.push_back({name, MakeFunc(params, body, ret, f.loc)});
    return specializations_[index];
  }
};

}  // namespace

Residual PartialEvaluate(const ModuleSnapshot& module, const std::string& entry, const std::vector<Value>& args,
                         const std::vector<bool>& static_args, const PeOptions& options, PeCache* cache) {
  PartialEvaluator pe(module, options, cache);
  return pe.Run(entry, args, static_args);
}

std::string Residual::ToText() const {
  std::string out;
  for (const TypeDefPtr& t : types) out += PrintTypeDef(*t) + "\n\n";
  for (const auto& [name, f] : functions) out += PrintFunction(name, f) + "\n\n";
  out += PrintFunction("main", main) + "\n";
  return out;
}

Snapshot Residual::ToModule() const {
  Module m;
  for (const TypeDefPtr& t : types) m.AddType(*t);
  std::vector<std::pair<std::string, Func>> all = functions;
  all.push_back({"main", main});
  m.AddAll(all);
  return m.snapshot();
}

}  // namespace pejit
