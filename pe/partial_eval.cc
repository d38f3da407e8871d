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
//    So does a recursive call of a global inside a dynamic `if` branch opened
//    since the function's latest unfolding began, when its arguments differ
//    from that unfolding's only in the values of static tensors: a loop whose
//    exit the data decides, counting with a literal counter ("until the norm
//    is below 0.1, at most 1000 times"). Unfolding it would nest one residual
//    `if` per step until a budget ran out; generalizing the counter leaves
//    one residual loop. A recursion over static structure under a dynamic
//    `if` (a tree's children) changes the structure it passes and unfolds.
// 5. Bounds: the residual's operator count and the stack the evaluator uses
//    are bounded; past either, PeFailure says which. The evaluator recurses
//    with the program and its data (a recursion over a 100,000-element list
//    nests 100,000 calls deep); past the calling thread's share of stack it
//    continues on stack segments of its own (support/stack_segments.h), so
//    the bound is a budget over all segments, not a thread's stack.
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
//        budget or the stack budget would run out, where an unfolding inside
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
//  b. Function values cannot be left in the residual. A dynamic `if` that
//     returns a function is a choice (PVal::Kind::kChoice, pe_values.h),
//     whose uses run on both values under a residual `if`; it is refused
//     only where the function itself would have to be a residual value
//     (Settle: returned by the entry, passed to a residual function).
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
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "ir/printer.h"
#include "ir/visitor.h"
#include "ops/eager.h"
#include "pe/template_builder.h"
#include "support/stack_segments.h"

namespace pejit {
namespace {

using namespace pe_detail;

// The evaluator's stack segments: the first, on the calling thread (an engine
// worker, a tool's main thread), as much as any such thread has to spare;
// the red zone, the most one level of the evaluation uses between two
// checks (sanitizers' frames are several times larger).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kFirstSegmentBytes = size_t{3} << 20, kRedZoneBytes = size_t{1536} << 10;
#else
constexpr size_t kFirstSegmentBytes = size_t{1} << 20, kRedZoneBytes = size_t{512} << 10;
#endif
constexpr size_t kSegmentBytes = size_t{64} << 20;

class PartialEvaluator {
 public:
  PartialEvaluator(const ModuleSnapshot& module, const PeOptions& options, PeCache* cache)
      : module_(module),
        options_(options),
        cache_(cache && cache->enabled() ? cache : nullptr) {}

  Residual Run(const std::string& entry, const std::vector<Value>& args, const std::vector<bool>& static_args) {
    auto start = std::chrono::steady_clock::now();
    stack_.Start();
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
    const PVal* result = Apply(nullptr, NewGlobal(&entry_), pargs);
    Expr reified = Reify(result, def.func->loc);
    Expr body = CloseScope(std::move(reified));

    Residual out;
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
  // The evaluator recurses with the program and its data; deep recursion
  // continues on stack segments of its own (support/stack_segments.h).
  StackSegments stack_{kFirstSegmentBytes, kSegmentBytes, kRedZoneBytes};
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
  IndexTable active_func_heads_;  // the latest unfolding of each function, by HashPtr(func)
  std::vector<ActiveEntry> active_;
  size_t active_floor_ = 0;
  int32_t dynamic_branches_ = 0;  // dynamic `if` branches being specialized, nested

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

  const PVal* NewChoice(const PVal* cond, const PVal* then_value, const PVal* else_value) {
    PVal* p = arena_.New();
    p->kind = PVal::Kind::kChoice;
    p->skeleton = Mix(Mix(Mix(7, cond->skeleton), then_value->skeleton), else_value->skeleton);
    p->size = 3;
    const PVal** fields = arena_.Array<const PVal*>(3);
    fields[0] = cond;
    fields[1] = then_value;
    fields[2] = else_value;
    p->fields = fields;
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

  // Named after the source variable it stands for (the printer makes names
  // unique), and placed where its value is computed in the source, so that
  // a later stage's complaint about it can say where.
  Var NewVar(const Type& type, const SourceLoc& loc) {
    Var v = MakeVar(hint_ && !hint_->empty() ? *hint_ : std::string("t"), type, loc);
    hint_ = nullptr;
    return v;
  }

  Var Emit(Expr value, const Type& type) {
    Var v = NewVar(type, value->loc);
    scopes_.back().lets.push_back({v, std::move(value)});
    return v;
  }

  // A value's type as refusals name it: tensors with their shapes, ADT
  // values by their type's name alone.
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
    if (v->kind == PVal::Kind::kChoice) return Fits(v->fields[1], t) && Fits(v->fields[2], t);
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
    if (stack_.NearEnd()) return stack_.OnNewSegment([&] { return Reify(p, loc); });
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
      case PVal::Kind::kChoice: return Settle(p, loc)->atom;
      case PVal::Kind::kClosure:
      case PVal::Kind::kGlobal:
        throw PeFailure(loc.ToString() + ": a function value cannot be left in the residual program");
    }
    return nullptr;
  }

  // The type of a value that can be residualized as a tensor or a tuple of
  // them; null for any other (a structure, a function, a tuple holding one).
  Type TypeOf(const PVal* p) {
    switch (p->kind) {
      case PVal::Kind::kDynamic: return p->type->type;
      case PVal::Kind::kStatic: return Intern(p->value->type())->type;
      case PVal::Kind::kTuple: {
        std::vector<Type> fields;
        for (const PVal* f : p->Fields()) {
          fields.push_back(TypeOf(f));
          if (!fields.back()) return nullptr;
        }
        return TupleTy(std::move(fields));
      }
      case PVal::Kind::kChoice: {
        Type then_type = TypeOf(p->fields[1]), else_type = TypeOf(p->fields[2]);
        return then_type && else_type && TypeEqual(then_type, else_type) ? then_type : nullptr;
      }
      default: return nullptr;
    }
  }

  // ---- Values in, and generalization -------------------------------------------

  const PVal* FromValue(const Value& v, bool whole_static, std::vector<Var>& params) {
    if (stack_.NearEnd()) return stack_.OnNewSegment([&] { return FromValue(v, whole_static, params); });
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
    if (stack_.NearEnd()) return stack_.OnNewSegment([&] { return Generalize(p, params, actuals, loc); });
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
      case PVal::Kind::kChoice: {
        const PVal* cond = Generalize(p->fields[0], params, actuals, loc);
        const PVal* then_value = Generalize(p->fields[1], params, actuals, loc);
        return NewChoice(cond, then_value, Generalize(p->fields[2], params, actuals, loc));
      }
      case PVal::Kind::kGlobal: return p;
    }
    return p;
  }

  // ---- Evaluation ------------------------------------------------------------------

  // `at`: the expression being evaluated or built, for the message; none while
  // reading the arguments.
  void CheckStack(const SourceLoc* at) {
    const int64_t depth = stack_.Depth();
    if (recording_ && depth > recording_->stack_deepest) recording_->stack_deepest = depth;
    if (depth > options_.max_stack_bytes) {
      const std::string where = at && at->known() ? at->ToString() + ": " : std::string("the arguments: ");
      throw PeFailure(where + "partial evaluation nests deeper than " + std::to_string(options_.max_stack_bytes) +
                      " bytes of native stack allow (PeOptions::max_stack_bytes)");
    }
  }

  const PVal* Eval(const Expr& root) {
    if (stack_.NearEnd()) return stack_.OnNewSegment([&] { return Eval(root); });
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
        return Project(t, proj.index, proj.loc);
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
      const PVal* v = Eval(a);
      args.push_back(v->kind == PVal::Kind::kChoice ? Settle(v, n.loc) : v);
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

  // Binds the type variables of `pattern` (a generic definition's
  // annotation) that `actual` (a value's type, or null) determines.
  static void BindTypeVars(const Type& pattern, const Type& actual, std::map<std::string, Type>& bindings) {
    if (!pattern || !actual) return;
    if (const TypeVarNode* v = AsTypeVar(pattern)) {
      bindings.emplace(v->name, actual);
      return;
    }
    const TupleTypeNode *p = AsTuple(pattern), *a = AsTuple(actual);
    if (p && a && p->fields.size() == a->fields.size()) {
      for (size_t i = 0; i < p->fields.size(); ++i) BindTypeVars(p->fields[i], a->fields[i], bindings);
    }
  }

  // Field `index` of a tuple: of its skeleton, of a residual tuple, or of
  // each value a dynamic `if` chose.
  const PVal* Project(const PVal* t, int index, const SourceLoc& loc) {
    if (t->kind == PVal::Kind::kTuple && index >= 0 && static_cast<size_t>(index) < t->size) return t->fields[index];
    if (t->kind == PVal::Kind::kChoice) {
      const PVal* then_field = Project(t->fields[1], index, loc);
      return NewChoice(t->fields[0], then_field, Project(t->fields[2], index, loc));
    }
    const TupleTypeNode* type = t->kind == PVal::Kind::kDynamic ? AsTuple(t->type->type) : nullptr;
    if (!type || index < 0 || static_cast<size_t>(index) >= type->fields.size()) {
      throw PeFailure(loc.ToString() + ": projection ." + std::to_string(index) + " of a value that is not a tuple of that size");
    }
    const TypeInfo* field = Intern(type->fields[index]);
    return NewDynamic(Emit(MakeProj(t->atom, index), field->type), field);
  }

  static bool HoldsFunctionType(const Type& t) {
    if (!t) return false;
    if (t->kind == TypeKind::kFunc) return true;
    if (const TupleTypeNode* tuple = AsTuple(t)) {
      return std::any_of(tuple->fields.begin(), tuple->fields.end(), HoldsFunctionType);
    }
    return false;
  }

  // A chosen value as one the residual program holds: tensors by `where`
  // (both sides are computed already, so a select is exact, and every tier
  // compiles it), tuples and constructors field by field, other residual
  // values by a residual `if`. A function cannot be.
  const PVal* Settle(const PVal* p, const SourceLoc& loc) {
    if (p->kind != PVal::Kind::kChoice) return p;
    const PVal* cond = Settle(p->fields[0], loc);
    const PVal* then_value = Settle(p->fields[1], loc);
    return SettlePair(cond, then_value, Settle(p->fields[2], loc), loc);
  }

  const PVal* SettlePair(const PVal* cond, const PVal* a, const PVal* b, const SourceLoc& loc) {
    if (a == b) return a;
    if (cond->kind == PVal::Kind::kStatic) return cond->value->data<bool>()[0] ? a : b;
    const bool same_tuple = a->kind == PVal::Kind::kTuple && b->kind == PVal::Kind::kTuple && a->size == b->size;
    const bool same_ctor = a->kind == PVal::Kind::kAdt && b->kind == PVal::Kind::kAdt && a->tag == b->tag &&
                           a->adt->name == b->adt->name && a->size == b->size;
    if (same_tuple || same_ctor) {
      SmallVec<const PVal*> fields;
      for (uint32_t i = 0; i < a->size; ++i) fields.push_back(SettlePair(cond, a->fields[i], b->fields[i], loc));
      return same_tuple ? NewTuple(fields) : NewAdt(AdtOf(a->adt), a->tag, fields);
    }
    Type then_type = TypeOf(a), else_type = TypeOf(b);
    if (!then_type || !else_type || !TypeEqual(then_type, else_type)) {
      throw PeFailure(loc.ToString() + ": a dynamic `if` chose between " + Describe(a) + " and " + Describe(b) +
                      ", which no one residual value holds (a function cannot be left in the residual program)");
    }
    const TypeInfo* type = Intern(then_type);
    Expr then_expr = Reify(a, loc), else_expr = Reify(b, loc);
    Expr choice = type->tensor ? Expr(std::make_shared<OpCallNode>(&LookupOp("where"),
                                                                   std::vector<Expr>{cond->atom, then_expr, else_expr},
                                                                   Attrs{}, loc))
                               : MakeIf(cond->atom, then_expr, else_expr, loc);
    return NewDynamic(Emit(choice, type->type), type);
  }

  // The dynamic leaves of `p`, depth first (a choice's condition among them).
  static void DynamicLeaves(const PVal* p, std::vector<const PVal*>& out) {
    if (p->kind == PVal::Kind::kDynamic) {
      out.push_back(p);
    } else if (p->kind != PVal::Kind::kStatic && p->kind != PVal::Kind::kGlobal) {
      for (const PVal* f : p->Fields()) DynamicLeaves(f, out);
    }
  }

  // `p` with its dynamic leaves (DynamicLeaves' order) taken from `leaves`.
  const PVal* WithLeaves(const PVal* p, const PVal* const*& leaves) {
    switch (p->kind) {
      case PVal::Kind::kDynamic: return *leaves++;
      case PVal::Kind::kStatic:
      case PVal::Kind::kGlobal: return p;
      default: break;
    }
    SmallVec<const PVal*> fields;
    for (const PVal* f : p->Fields()) fields.push_back(WithLeaves(f, leaves));
    switch (p->kind) {
      case PVal::Kind::kTuple: return NewTuple(fields);
      case PVal::Kind::kAdt: return NewAdt(AdtOf(p->adt), p->tag, fields);
      case PVal::Kind::kClosure: return NewClosure(p->closure, fields);
      default: return NewChoice(fields[0], fields[1], fields[2]);
    }
  }

  // Zeros of a residual type, for the branch that does not compute a value.
  Expr ZerosOf(const Type& t, const SourceLoc& loc) {
    if (const TensorTypeNode* tensor = AsTensor(t); tensor && tensor->type.IsFullyKnown()) {
      return Materialize(Tensor::Zeros(tensor->type.dtype, tensor->type.shape));
    }
    if (const TupleTypeNode* tuple = AsTuple(t)) {
      std::vector<Expr> fields;
      for (const Type& f : tuple->fields) fields.push_back(ZerosOf(f, loc));
      return MakeTuple(std::move(fields));
    }
    throw PeFailure(loc.ToString() + ": a dynamic `if` that holds a function and a residual " + TypeToString(t) +
                    " on one side only");
  }

  // Evaluates the two sides of a dynamic choice on `cond`, each under a
  // residual branch of its own. A value the residual program can hold (a
  // tensor or a tuple of them) becomes the residual `if`'s. Else (a function,
  // a constructor) the value stays a choice, for its uses to choose between
  // (Apply, Project, MatchValue, Settle); the dynamic leaves a side computed
  // in its branch leave it through the `if` (each branch giving the other's
  // as zeros). Partial evaluation's "trick" for a dynamic value with a static
  // set of possibilities.
  template <typename Then, typename Else>
  const PVal* Select(const PVal* cond, const SourceLoc& loc, Then then_eval, Else else_eval) {
    cond = Settle(cond, loc);
    if (cond->kind == PVal::Kind::kStatic) return cond->value->data<bool>()[0] ? then_eval() : else_eval();
    const PVal* values[2];
    Expr bodies[2];
    Type types[2];
    std::vector<const PVal*> leaves[2];  // each side's dynamic leaves
    std::vector<bool> inside[2];         // computed in its branch
    for (int side = 0; side < 2; ++side) {
      OpenScope(false);
      ++dynamic_branches_;
      values[side] = side == 0 ? then_eval() : else_eval();
      --dynamic_branches_;
      types[side] = TypeOf(values[side]);
      if (types[side]) {
        bodies[side] = CloseScope(Reify(values[side], loc));
        continue;
      }
      std::unordered_set<const ExprNode*> bound;
      for (const auto& [var, value] : scopes_.back().lets) bound.insert(var.get());
      DynamicLeaves(values[side], leaves[side]);
      std::vector<Expr> atoms;
      for (const PVal* l : leaves[side]) {
        inside[side].push_back(bound.count(l->atom.get()) > 0);
        if (inside[side].back()) atoms.push_back(l->atom);
      }
      bodies[side] = CloseScope(MakeTuple(std::move(atoms)));
    }
    if (types[0] && types[1]) {
      if (!TypeEqual(types[0], types[1])) {
        throw PeFailure(loc.ToString() + ": the branches of a dynamic `if` give " + TypeToString(types[0]) + " and " +
                        TypeToString(types[1]));
      }
      const TypeInfo* type = Intern(types[0]);
      return NewDynamic(Emit(MakeIf(cond->atom, bodies[0], bodies[1], loc), type->type), type);
    }
    if (types[0] || types[1]) {
      throw PeFailure(loc.ToString() + ": the branches of a dynamic `if` give " + Describe(values[0]) + " and " +
                      Describe(values[1]));
    }
    // (then's exported leaves..., else's...), each branch giving the other's as zeros.
    std::vector<Type> exported[2], all;
    for (int side = 0; side < 2; ++side) {
      for (size_t i = 0; i < leaves[side].size(); ++i) {
        if (inside[side][i]) exported[side].push_back(leaves[side][i]->type->type);
      }
      all.insert(all.end(), exported[side].begin(), exported[side].end());
    }
    Var both;
    if (!all.empty()) {
      Expr branches[2];
      for (int side = 0; side < 2; ++side) {
        Var mine = MakeVar(side == 0 ? "then" : "else", TupleTy(exported[side]));
        std::vector<Expr> fields;
        for (int other = 0; other < 2; ++other) {
          for (size_t i = 0; i < exported[other].size(); ++i) {
            fields.push_back(other == side ? MakeProj(mine, static_cast<int>(i)) : ZerosOf(exported[other][i], loc));
          }
        }
        branches[side] = MakeLet(mine, bodies[side], MakeTuple(std::move(fields)));
      }
      both = Emit(MakeIf(cond->atom, branches[0], branches[1], loc), TupleTy(all));
    }
    const PVal* rebuilt[2];
    int next = 0;
    for (int side = 0; side < 2; ++side) {
      std::vector<const PVal*> read;
      for (size_t i = 0; i < leaves[side].size(); ++i) {
        if (!inside[side][i]) {
          read.push_back(leaves[side][i]);
          continue;
        }
        const TypeInfo* type = Intern(all[next]);
        read.push_back(NewDynamic(Emit(MakeProj(both, next++), type->type), type));
      }
      const PVal* const* at = read.data();
      rebuilt[side] = WithLeaves(values[side], at);
    }
    return NewChoice(cond, rebuilt[0], rebuilt[1]);
  }

  const PVal* EvalIf(const IfNode& n) {
    const std::string* hint = hint_;
    hint_ = nullptr;
    const PVal* cond = Settle(Eval(n.cond), n.loc);
    if (cond->kind == PVal::Kind::kStatic) return Eval(cond->value->data<bool>()[0] ? n.then_branch : n.else_branch);
    if (HoldsFunctionType(n.checked_type)) {  // a closure the residual program cannot hold: a choice
      return Select(cond, n.loc, [&] { return Eval(n.then_branch); }, [&] { return Eval(n.else_branch); });
    }
    if (!n.checked_type) throw PeFailure(n.loc.ToString() + ": the type of a dynamic `if` is unknown");
    const bool generic = HasTypeVars(n.checked_type);  // an `if` of a generic definition
    Type then_type, else_type;                         // then: what its branches give
    auto branch = [&](const Expr& e, Type& type) {
      OpenScope(false);
      ++dynamic_branches_;
      const PVal* r = Eval(e);
      --dynamic_branches_;
      if (generic) type = TypeOf(r);
      return CloseScope(Reify(r, e->loc));
    };
    Expr then_branch = branch(n.then_branch, then_type);
    Expr else_branch = branch(n.else_branch, else_type);
    Type if_type = n.checked_type;
    if (generic) {  // its instance's: the type both branches give
      if (!then_type || !else_type || !TypeEqual(then_type, else_type)) {
        throw PeFailure(n.loc.ToString() + ": a dynamic `if` of type " + TypeToString(if_type) +
                        " in a generic definition whose branches give " +
                        (then_type ? TypeToString(then_type) : "a value of no tensor type") + " and " +
                        (else_type ? TypeToString(else_type) : "a value of no tensor type"));
      }
      if_type = then_type;
    }
    const TypeInfo* type = Intern(if_type);
    hint_ = hint;
    return NewDynamic(Emit(MakeIf(cond->atom, then_branch, else_branch, n.loc), type->type), type);
  }

  bool Match(const Pattern& p, const PVal* v, const SourceLoc& loc) {
    switch (p->kind) {
      case PatternKind::kWildcard: return true;
      case PatternKind::kVar: Bind(p->var.get(), v); return true;
      case PatternKind::kTuple:
      case PatternKind::kCtor:
        if (v->kind == PVal::Kind::kChoice) {
          if (p->kind == PatternKind::kCtor) {
            throw PeFailure(loc.ToString() + ": a constructor pattern inside a pattern, on " + Describe(v) +
                            " that a dynamic `if` chose; match on it alone");
          }
          for (size_t i = 0; i < p->fields.size(); ++i) {
            if (!Match(p->fields[i], Project(v, static_cast<int>(i), loc), loc)) return false;
          }
          return true;
        }
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

  const PVal* EvalMatch(const MatchNode& n) { return MatchValue(n, Eval(n.scrutinee)); }

  const PVal* MatchValue(const MatchNode& n, const PVal* v) {
    if (v->kind == PVal::Kind::kChoice) {  // each value a dynamic `if` chose, under its branch
      return Select(
          v->fields[0], n.loc, [&] { return MatchValue(n, v->fields[1]); }, [&] { return MatchValue(n, v->fields[2]); });
    }
    for (size_t i = 0; i < n.clauses.size(); ++i) {
      const Clause& c = n.clauses[i];
      if (!Match(c.pattern, v, n.loc)) continue;
      return Eval(c.body);
    }
    throw PeFailure(n.loc.ToString() + ": no clause of match fits " + Describe(v));
  }

  // `v` as the interpreter's messages show a value (Value::Describe): the
  // structure, tensors by type, deeper levels elided; a dynamic value by its
  // residual type.
  static std::string Describe(const PVal* v, int depth = 0) {
    switch (v->kind) {
      case PVal::Kind::kDynamic: return TypeToString(v->type->type);
      case PVal::Kind::kStatic: return v->value->type().ToString();
      case PVal::Kind::kTuple:
      case PVal::Kind::kAdt: {
        std::string inner;
        if (depth >= 4 && v->size > 0) {
          inner = "...";
        } else {
          for (uint32_t i = 0; i < v->size; ++i) inner += (i ? ", " : "") + Describe(v->fields[i], depth + 1);
        }
        if (v->kind == PVal::Kind::kTuple) return "(" + inner + (v->size == 1 ? ",)" : ")");
        const std::string& ctor = v->adt->ctors[v->tag].name;
        return v->size == 0 ? ctor : ctor + "(" + inner + ")";
      }
      case PVal::Kind::kClosure: return "<closure>";
      case PVal::Kind::kGlobal: return "@" + *v->global->name;
      case PVal::Kind::kChoice: return Describe(v->fields[1], depth + 1) + " or " + Describe(v->fields[2], depth + 1);
    }
    return "?";
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
        case PVal::Kind::kGlobal:
        case PVal::Kind::kChoice: return false;
      }
    }
    rec.helper = helper;
    return true;
  }

  void StartRecording(std::unique_ptr<Recording> rec, int64_t unfoldings_before) {
    rec->scope = static_cast<int>(scopes_.size()) - 1;
    rec->lets_mark = scopes_.back().lets.size();
    rec->calls_mark = calls_.size();
    rec->unfoldings = unfoldings_before;
    rec->residual_ops = stats_.residual_ops;
    rec->folded_ops = stats_.folded_ops;
    rec->shared_calls = stats_.shared_calls;
    rec->stack_start = rec->stack_deepest = stack_.Depth();
    rec->active_base = active_.size() - 1;  // the helper's own unfolding is pushed just before
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
    RecordingContext context{scopes_[rec->scope], calls_, stats_,
                             [this](const TypeDef* adt) -> const TypeDefPtr& { return AdtOf(adt); }};
    if (!BuildTemplate(*rec, context, result, *t)) return;
    auto bindings = static_cast<int64_t>(t->lets.size());
    if (cache_->Insert(rec->key, std::move(t), bindings)) ++stats_.cached_specializations;
  }

  // The helper call `at` describes, answered by emitting `t`'s code on its
  // argument nodes; null when a fresh unfolding here could differ from it
  // (then the caller unfolds).
  const PVal* Replay(std::shared_ptr<const PeTemplate> shared, const Recording& at) {
    const PeTemplate& t = *shared;
    // The budgets a fresh unfolding would run into.
    if (stats_.unfoldings + t.unfoldings > options_.fuel ||
        stats_.residual_ops + t.residual_ops > options_.max_residual_ops ||
        stack_.Depth() + t.stack_bytes > options_.max_stack_bytes) {
      return nullptr;
    }
    // Unfoldings in progress here that one inside would take for a loop.
    for (uint64_t key : t.unfold_keys) {
      int32_t i = active_heads_.Get(key);
      if (i >= 0 && static_cast<size_t>(i) >= active_floor_) return nullptr;
    }
    std::vector<const FuncNode*> functions(t.names.size(), nullptr);
    auto function = [&](int32_t name) {
      if (!functions[name]) functions[name] = FunctionNamed(t.names[name]);
      return functions[name];
    };
    // A function unfolded inside that is in progress here too: a call of it
    // under a dynamic branch inside might be a loop here (4), not there.
    for (int32_t name : t.unfolded) {
      if (LatestActive(function(name)) >= 0) return nullptr;
    }
    // Calls inside on the arguments alone that the memo here would answer.
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
    int32_t& of_func = active_func_heads_.At(HashPtr(f));
    active_.push_back({key, f, closure, args, head, of_func, dynamic_branches_});
    head = of_func = static_cast<int32_t>(active_.size()) - 1;
  }

  void PopActive() {
    active_heads_.At(active_.back().key) = active_.back().next;
    active_func_heads_.At(HashPtr(active_.back().func)) = active_.back().next_of_func;
    active_.pop_back();
  }

  // The latest unfolding in progress of f, above the floor, or -1.
  int32_t LatestActive(const FuncNode* f) const {
    int32_t i = active_func_heads_.Get(HashPtr(f));
    while (i >= 0 && active_[i].func != f) i = active_[i].next_of_func;
    return i >= 0 && static_cast<size_t>(i) >= active_floor_ ? i : -1;
  }

  // (4) A recursive call of global f inside a dynamic branch opened since
  // f's latest unfolding began, on arguments that differ from that
  // unfolding's only in the values of static tensors: a loop the data ends.
  bool LoopUnderDynamicBranch(const FuncNode* f, std::span<const PVal* const> args) {
    if (dynamic_branches_ == 0) return false;
    int32_t i = LatestActive(f);
    if (i < 0 || active_[i].closure || active_[i].dynamic_branches >= dynamic_branches_) return false;
    // The decision reads an unfolding from before a recorded helper's: the
    // helper's code depends on where it is called.
    if (recording_ && static_cast<size_t>(i) < recording_->active_base) recording_->valid = false;
    const ActiveEntry& a = active_[i];
    if (a.args.size() != args.size()) return false;
    for (size_t k = 0; k < args.size(); ++k) {
      if (!SameShape(a.args[k], args[k])) return false;
    }
    return true;
  }

  // Same skeleton but for the values of static tensors, which may also be
  // dynamic on either side: what generalizing the tensors makes equal.
  // Iterative: an argument may hold a long static list.
  bool SameShape(const PVal* a, const PVal* b) {
    std::vector<std::pair<const PVal*, const PVal*>> todo = {{a, b}};
    while (!todo.empty()) {
      auto [x, y] = todo.back();
      todo.pop_back();
      if (x == y) continue;
      bool x_tensor = x->kind == PVal::Kind::kStatic || x->kind == PVal::Kind::kDynamic;
      bool y_tensor = y->kind == PVal::Kind::kStatic || y->kind == PVal::Kind::kDynamic;
      if (x_tensor || y_tensor) {
        if (!x_tensor || !y_tensor) return false;
        const TypeInfo* tx = x->kind == PVal::Kind::kStatic ? Intern(x->value->type()) : x->type;
        const TypeInfo* ty = y->kind == PVal::Kind::kStatic ? Intern(y->value->type()) : y->type;
        if (tx != ty && !TypeEqual(tx->type, ty->type)) return false;
        continue;
      }
      if (x->kind != y->kind || x->size != y->size) return false;
      switch (x->kind) {
        case PVal::Kind::kAdt:
          if (x->tag != y->tag || (x->adt != y->adt && x->adt->name != y->adt->name)) return false;
          break;
        case PVal::Kind::kClosure:
          if (x->closure->func != y->closure->func) return false;
          break;
        case PVal::Kind::kGlobal:
          if (*x->global->name != *y->global->name) return false;
          break;
        default: break;
      }
      for (size_t k = 0; k < x->size; ++k) todo.emplace_back(x->fields[k], y->fields[k]);
    }
    return true;
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
    } else if (callee->kind == PVal::Kind::kChoice) {  // the function a dynamic `if` chose
      return Select(
          callee->fields[0], loc, [&] { return Apply(call, callee->fields[1], args); },
          [&] { return Apply(call, callee->fields[2], args); });
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
    bool loop = IsActive(skeleton, f, closure, args) || stats_.unfoldings >= options_.fuel;
    bool generalize = !loop && global && !closure && LoopUnderDynamicBranch(f, args);
    if (loop || generalize) {
      if (generalize) ++stats_.generalized_calls;
      hint_ = hint;
      result = CallSpecialization(*f, callee, args, loc);
    } else {
      // (7) A helper call the cache may answer, or should learn.
      std::unique_ptr<Recording> record;
      result = nullptr;
      if (cache_ && !recording_ && call && global) {
        auto candidate = std::make_unique<Recording>();
        if (Describe(*global, args, *candidate)) {
          if (std::shared_ptr<const PeTemplate> t = cache_->Find(candidate->key)) {
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
        if (recording_ && global) recording_->unfolded.push_back(global);
        PushActive(skeleton, f, closure, args);
        bool recorded = record != nullptr;  // nested unfoldings leave the recording to this one
        if (recorded) StartRecording(std::move(record), unfoldings_before);
        result = Eval(f->body);
        CheckResult(result, *f, global);
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
    if (HasTypeVars(ret)) {  // a generic definition's: the instance's, from its arguments
      std::map<std::string, Type> bindings;
      for (size_t i = 0; i < f.params.size() && i < general.size(); ++i) {
        BindTypeVars(f.params[i]->annotation, TypeOf(general[i]), bindings);
      }
      ret = SubstituteTypeVars(ret, bindings);
      if (HasTypeVars(ret)) {
        throw PeFailure(loc.ToString() + ": a residual function of the generic definition at " + f.loc.ToString() +
                        " whose result type " + TypeToString(ret) + " its tensor arguments do not determine");
      }
    }
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
