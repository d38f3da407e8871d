#include "ir/module.h"

#include <set>
#include <string_view>
#include <unordered_map>

#include <functional>

#include "ir/parser.h"
#include "ir/prelude.h"
#include "ir/printer.h"
#include "ir/typecheck.h"
#include "ir/value.h"
#include "ir/visitor.h"
#include "support/spelling.h"

namespace pejit {

// ---- ModuleSnapshot ------------------------------------------------------------

const Definition* ModuleSnapshot::Find(std::string_view name) const {
  auto it = defs_.find(name);
  return it == defs_.end() ? nullptr : it->second.get();
}

const Definition& ModuleSnapshot::Get(std::string_view name) const {
  if (const Definition* d = Find(name)) return *d;
  std::vector<std::string> globals;
  for (const std::string& n : Names()) globals.push_back("@" + n);
  throw IrError({}, "unknown definition '@" + std::string(name) + "'" + DidYouMean("@" + std::string(name), globals));
}

TypeDefPtr ModuleSnapshot::FindType(std::string_view name) const {
  auto it = types_.find(name);
  return it == types_.end() ? nullptr : it->second;
}

std::string ModuleSnapshot::ForeignConstructors(const TypeDef& made) const {
  TypeDefPtr mine = FindType(made.name);
  return !mine || mine.get() == &made ? std::string() : pejit::ForeignConstructors(made, *mine);
}

bool ModuleSnapshot::CanHoldFloat(const Type& root) const {
  std::vector<Type> stack = {root};
  std::set<std::string> seen;  // ADT types expanded already (recursive types)
  while (!stack.empty()) {
    Type t = std::move(stack.back());
    stack.pop_back();
    switch (t->kind) {
      case TypeKind::kTensor:
        if (IsFloat(AsTensor(t)->type.dtype)) return true;
        break;
      case TypeKind::kTuple:
        for (const Type& f : AsTuple(t)->fields) stack.push_back(f);
        break;
      case TypeKind::kAdt: {
        const AdtTypeNode* adt = AsAdt(t);
        if (!seen.insert(TypeToString(t)).second) break;
        TypeDefPtr def = FindType(adt->name);
        if (!def) break;
        std::map<std::string, Type> bindings;  // List[Tensor[(), f32]]: T is the f32 tensor
        for (size_t i = 0; i < def->params.size() && i < adt->args.size(); ++i) bindings[def->params[i]] = adt->args[i];
        for (const CtorDef& c : def->ctors) {
          for (const Type& f : c.fields) stack.push_back(SubstituteTypeVars(f, bindings));
        }
        break;
      }
      case TypeKind::kVar: return true;
      case TypeKind::kFunc: break;
    }
  }
  return false;
}

std::vector<std::string> ModuleSnapshot::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, _] : defs_) names.push_back(name);
  return names;
}

std::set<std::string> ModuleSnapshot::Callees(std::string_view name) const {
  std::set<std::string> seen;
  std::vector<std::string> work = {std::string(name)};
  while (!work.empty()) {
    std::string n = work.back();
    work.pop_back();
    const Definition* d = Find(n);
    if (!d) continue;
    for (const std::string& c : d->callees) {
      if (seen.insert(c).second) work.push_back(c);
    }
  }
  return seen;
}

std::set<std::string> ModuleSnapshot::Dependents(std::string_view name) const {
  return Dependents(std::vector<std::string>{std::string(name)});
}

std::set<std::string> ModuleSnapshot::Dependents(const std::vector<std::string>& names) const {
  // One index of callers and one search from all names: linear in the
  // module, however many names an edit changed.
  std::unordered_map<std::string_view, std::vector<std::string_view>> callers;
  for (const auto& [n, d] : defs_) {
    for (const std::string& c : d->callees) callers[c].push_back(n);
  }
  std::set<std::string> seen;
  std::vector<std::string_view> work(names.begin(), names.end());
  while (!work.empty()) {
    std::string_view n = work.back();
    work.pop_back();
    auto it = callers.find(n);
    if (it == callers.end()) continue;
    for (std::string_view caller : it->second) {
      if (seen.emplace(caller).second) work.push_back(caller);
    }
  }
  return seen;
}

std::map<std::string, uint64_t> ModuleSnapshot::VersionsOf(std::string_view name) const {
  std::map<std::string, uint64_t> versions;
  versions[std::string(name)] = Get(name).version;
  for (const std::string& c : Callees(name)) {
    if (const Definition* d = Find(c)) versions[c] = d->version;
  }
  return versions;
}

std::string ModuleSnapshot::Print() const {
  std::string out;
  for (const auto& [_, t] : types_) out += PrintTypeDef(*t) + "\n\n";
  for (const auto& [name, d] : defs_) out += PrintFunction(name, d->func) + "\n\n";
  if (!out.empty()) out.pop_back();
  return out;
}

// ---- Module ------------------------------------------------------------------------

Module::Module() : current_(std::make_shared<ModuleSnapshot>()) {}

Snapshot Module::snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return current_;
}

void Module::Subscribe(std::function<void(const ModuleEdit&)> listener) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  listeners_.push_back(std::move(listener));
}

void Module::AddType(TypeDef def) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  Commit(*snapshot(), {std::make_shared<const TypeDef>(std::move(def))}, {}, ModuleEdit::Kind::kAdd);
}

uint64_t Module::Add(const std::string& name, const Func& f) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  Snapshot base = snapshot();
  if (base->Find(name)) throw IrError(f->loc, "@" + name + " is already defined; use Replace to change it");
  Commit(*base, {}, {{name, f}}, ModuleEdit::Kind::kAdd);
  return snapshot()->Get(name).version;
}

uint64_t Module::Replace(const std::string& name, const Func& f) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  Snapshot base = snapshot();
  base->Get(name);  // throws with a suggestion when there is no such definition
  Commit(*base, {}, {{name, f}}, ModuleEdit::Kind::kReplace);
  return snapshot()->Get(name).version;
}

std::vector<std::string> Module::AddAll(const std::vector<std::pair<std::string, Func>>& defs) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  Snapshot base = snapshot();
  for (const auto& [name, f] : defs) {
    if (base->Find(name)) throw IrError(f->loc, "@" + name + " is already defined; use Replace to change it");
  }
  return Commit(*base, {}, defs, ModuleEdit::Kind::kAdd);
}

void Module::Remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  Snapshot base = snapshot();
  base->Get(name);
  std::set<std::string> callers = base->Dependents(name);
  callers.erase(name);
  if (!callers.empty()) {
    std::string list;
    for (const std::string& c : callers) list += (list.empty() ? "@" : ", @") + c;
    throw IrError({}, "cannot remove @" + name + ": still called by " + list);
  }
  auto next = std::make_shared<ModuleSnapshot>(*base);
  next->defs_.erase(name);
  next->generation_ = base->generation_ + 1;
  ModuleEdit edit{ModuleEdit::Kind::kRemove, {name}, {name}, nullptr};
  Publish(std::move(next), std::move(edit));
}

std::vector<std::string> Module::AddSource(std::string_view text, const std::string& filename, bool replace_existing) {
  std::lock_guard<std::mutex> lock(edit_mu_);
  Snapshot base = snapshot();
  // Names the module does not have come from the prelude (ir/prelude.h).
  const Prelude& prelude = Prelude::Shared();
  std::set<std::string> prelude_types;
  ParsedProgram program = ParseProgram(text, filename, [&](const std::string& n) {
    if (TypeDefPtr own = base->FindType(n)) return own;
    TypeDefPtr t = prelude.FindType(n);
    if (t) prelude_types.insert(t->name);
    return t;
  });
  std::set<std::string> defined;
  for (const std::string& n : base->Names()) defined.insert(n);
  for (const auto& [name, f] : program.defs) defined.insert(name);
  auto own_type = [&](const std::string& n) -> TypeDefPtr {
    for (const TypeDefPtr& t : program.types) {
      if (t->name == n) return t;
    }
    return base->FindType(n);
  };
  Prelude::Pull pull = prelude.For(program.defs, defined, own_type, prelude_types);
  // A constructor is named by itself: a prelude type taken beside a type of
  // the program's with a constructor of the same name would make it mean two.
  std::vector<TypeDefPtr> others = program.types;
  for (const auto& [name, other] : base->types()) others.push_back(other);
  for (const TypeDefPtr& t : pull.types) {
    for (const CtorDef& c : t->ctors) {
      for (const TypeDefPtr& other : others) {
        if (other->FindCtor(c.name) >= 0) {
          throw IrError(other->loc, "constructor " + c.name + " of type " + other->name + " is also one of the prelude's " +
                                        t->name + ", which " + filename + " names: rename one, or define " + t->name +
                                        " in the program");
        }
      }
    }
  }
  program.types.insert(program.types.end(), pull.types.begin(), pull.types.end());
  program.defs.insert(program.defs.end(), pull.defs.begin(), pull.defs.end());
  bool replaces = false;
  for (const auto& [name, f] : program.defs) {
    if (base->Find(name)) {
      if (!replace_existing) throw IrError(f->loc, "@" + name + " is already defined in the module");
      replaces = true;
    }
  }
  return Commit(*base, program.types, program.defs, replaces ? ModuleEdit::Kind::kReplace : ModuleEdit::Kind::kAdd);
}

std::vector<std::string> Module::Commit(const ModuleSnapshot& base, std::vector<TypeDefPtr> types, const Defs& defs,
                                        ModuleEdit::Kind kind) {
  auto next = std::make_shared<ModuleSnapshot>(base);
  for (const TypeDefPtr& t : types) {
    if (next->types_.count(t->name)) throw IrError(t->loc, "type " + t->name + " is already defined");
    next->types_[t->name] = t;
  }

  // (1) Private copies of the new functions, checked on demand so that a
  //     definition may use one defined later in the same batch.
  enum class State { kPending, kChecking, kDone };
  struct Work {
    Func func;
    State state = State::kPending;
    Type type;
  };
  std::map<std::string, Work> work;
  std::vector<std::string> order;
  for (const auto& [name, f] : defs) {
    if (work.count(name)) throw IrError(f->loc, "@" + name + " is defined twice");
    work[name] = Work{CloneFunc(f), State::kPending, nullptr};
    order.push_back(name);
  }

  TypeEnv env;
  std::function<void(const std::string&)> check;
  env.type_def = [&](const std::string& n) { return next->FindType(n); };
  env.global_names = [&] {
    std::vector<std::string> names = next->Names();
    for (const auto& [n, _] : work) names.push_back(n);
    return names;
  };
  env.global_type = [&](const std::string& n, const SourceLoc& use) -> Type {
    auto it = work.find(n);
    if (it == work.end()) {
      const Definition* d = next->Find(n);
      return d ? d->type : nullptr;
    }
    Work& w = it->second;
    // A declared result type is the function's type: its body is checked in
    // its turn, not now (a chain of thousands of forward references would
    // otherwise nest a check per link).
    if (w.state == State::kPending && !w.func->ret_type) check(n);
    if (w.state == State::kDone) return w.type;
    // Recursive use while @n is being checked: its declared type is all we know.
    if (!w.func->ret_type) {
      throw IrError(use, "@" + n + " is recursive; declare its result type: def @" + n + "(...) -> T { ... }");
    }
    std::vector<Type> params;
    for (const Var& p : w.func->params) params.push_back(p->annotation);
    return GenericFuncTy(w.func->type_params, std::move(params), w.func->ret_type);
  };
  check = [&](const std::string& n) {
    Work& w = work.at(n);
    w.state = State::kChecking;
    w.type = CheckFunction(n, w.func, env);
    w.state = State::kDone;
  };

  // (2) Check the new definitions, each after those it calls whose result
  //     type is inferred (found by a search with an explicit stack, so that
  //     checking one never nests checks of a long chain); then callers of any
  //     whose type changed, which are re-published with new versions (their
  //     code may change too).
  std::vector<std::string> worklist;
  {
    std::unordered_map<std::string_view, bool> visited;
    for (const std::string& root : order) {
      if (visited[root]) continue;
      visited[root] = true;
      std::vector<std::pair<std::string, std::vector<std::string>>> stack;
      stack.emplace_back(root, ReferencedGlobals(work.at(root).func));
      while (!stack.empty()) {
        std::vector<std::string>& callees = stack.back().second;
        if (callees.empty()) {
          worklist.push_back(std::move(stack.back().first));
          stack.pop_back();
          continue;
        }
        std::string callee = std::move(callees.back());
        callees.pop_back();
        auto it = work.find(callee);
        if (it == work.end() || it->second.func->ret_type || visited[it->first]) continue;
        visited[it->first] = true;
        stack.emplace_back(it->first, ReferencedGlobals(it->second.func));  // `callees` is not used after
      }
    }
  }
  std::unordered_map<std::string, std::vector<std::string>> base_callers;
  while (!worklist.empty()) {
    std::vector<std::string> recheck;
    for (const std::string& n : worklist) {
      if (work.at(n).state == State::kPending) check(n);
      const Definition* old = base.Find(n);
      if (old && !TypeEqual(old->type, work.at(n).type)) {
        if (base_callers.empty()) {  // built once, on the first changed type
          for (const auto& [caller, d] : base.definitions()) {
            for (const std::string& c : d->callees) base_callers[c].push_back(caller);
          }
        }
        for (const std::string& caller : base_callers[n]) {
          if (!work.count(caller)) {
            work[caller] = Work{CloneFunc(base.Find(caller)->func), State::kPending, nullptr};
            recheck.push_back(caller);
          }
        }
      }
    }
    for (const std::string& caller : recheck) {
      try {
        check(caller);
      } catch (const IrError& e) {
        throw IrError(e.loc(), "this change breaks @" + caller + ": " + e.message());
      }
    }
    worklist = std::move(recheck);
  }

  // (3) Publish with fresh versions.
  ModuleEdit edit{kind, {}, {}, nullptr};
  for (auto& [name, w] : work) {
    auto d = std::make_shared<Definition>();
    d->name = name;
    d->func = w.func;
    d->type = w.type;
    d->version = next_version_++;
    d->callees = ReferencedGlobals(w.func);
    next->defs_[name] = d;
    edit.changed.push_back(name);
  }
  next->generation_ = base.generation_ + 1;
  edit.affected.insert(edit.changed.begin(), edit.changed.end());
  for (const std::string& dep : base.Dependents(edit.changed)) edit.affected.insert(dep);
  for (const std::string& dep : next->Dependents(edit.changed)) edit.affected.insert(dep);
  Publish(std::move(next), std::move(edit));
  return order;
}

void Module::Publish(std::shared_ptr<ModuleSnapshot> next, ModuleEdit edit) {
  Snapshot published = std::move(next);
  {
    std::lock_guard<std::mutex> lock(snapshot_mu_);
    current_ = published;
  }
  edit.after = published;
  for (const auto& listener : listeners_) listener(edit);
}

}  // namespace pejit
