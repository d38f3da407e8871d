// \file The Module: named definitions with any number of entries, edited live.
//
// Every definition can be called by name, and definitions share the functions
// they call. The module grows and changes while other threads run it:
//
//   1. Readers take a Snapshot(): an immutable view of all definitions and
//      types. A call runs entirely on the snapshot it started with, so it sees
//      a whole old or a whole new definition, never a mix.
//   2. Writers (Add, Replace, Remove, AddSource, ...) are serialized. Each
//      checks its change on a copy of the state; on success it publishes the
//      new state with one pointer swap, on failure it throws IrError and the
//      module is unchanged.
//   3. Every change gives the changed definitions a new version (a counter
//      that only grows), and reports to subscribers which definitions changed
//      and, through the call graph, which depend on them: what the engine
//      must invalidate.
//
// The module type-checks a private copy of each function it is given
// (CloneFunc), so checking never writes into nodes someone else holds.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"

namespace pejit {

struct Definition {
  std::string name;
  Func func;                          // type-checked; owned by the module
  Type type;                          // its function type
  uint64_t version = 0;               // unique across the module, grows on each change
  std::vector<std::string> callees;   // globals it refers to directly, sorted
};
using DefinitionPtr = std::shared_ptr<const Definition>;

class ModuleSnapshot {
 public:
  // Null when there is no definition `name`.
  const Definition* Find(std::string_view name) const;
  // Throws IrError "unknown definition '@lsos'; did you mean '@loss'?".
  const Definition& Get(std::string_view name) const;
  TypeDefPtr FindType(std::string_view name) const;
  // Why values made with `made`'s constructors cannot be read as this
  // module's type of that name (ForeignConstructors, ir/value.h), or "" when
  // they can: it is that type, a copy of it, or a type the module lacks.
  std::string ForeignConstructors(const TypeDef& made) const;
  // Whether a value of `type` can hold a float tensor: a tensor of f32 or
  // f64, or a tuple or constructor field that can (a type variable can). A
  // gradient is taken only for arguments of such types.
  bool CanHoldFloat(const Type& type) const;

  std::vector<std::string> Names() const;  // sorted
  const std::map<std::string, DefinitionPtr, std::less<>>& definitions() const { return defs_; }
  const std::map<std::string, TypeDefPtr, std::less<>>& types() const { return types_; }
  uint64_t generation() const { return generation_; }  // grows with every edit

  // Everything `name` calls, directly or not (itself only if recursive).
  std::set<std::string> Callees(std::string_view name) const;
  // Everything that calls `name`, directly or not (itself only if recursive).
  std::set<std::string> Dependents(std::string_view name) const;
  // Everything that calls any of `names`, in one pass over the module.
  std::set<std::string> Dependents(const std::vector<std::string>& names) const;
  // The versions of `name` and of all its callees: compiled code of `name` is
  // valid exactly as long as these do not change.
  std::map<std::string, uint64_t> VersionsOf(std::string_view name) const;

  // The whole module in the text format (types, then definitions, by name).
  std::string Print() const;

 private:
  friend class Module;
  std::map<std::string, DefinitionPtr, std::less<>> defs_;
  std::map<std::string, TypeDefPtr, std::less<>> types_;
  uint64_t generation_ = 0;
};
using Snapshot = std::shared_ptr<const ModuleSnapshot>;

// What one edit changed, for subscribers such as the engine's code cache.
struct ModuleEdit {
  enum class Kind { kAdd, kReplace, kRemove } kind;
  std::vector<std::string> changed;     // definitions added, replaced or removed
  std::set<std::string> affected;       // those and everything that depends on them
  Snapshot after;
};

class Module {
 public:
  Module();

  Snapshot snapshot() const;

  // Adds type definitions; a name may be defined once.
  void AddType(TypeDef def);
  // Adds a new definition; returns its version.
  uint64_t Add(const std::string& name, const Func& f);
  // Replaces an existing definition. Callers that no longer type-check with
  // the new one make the replacement fail.
  uint64_t Replace(const std::string& name, const Func& f);
  // Adds several new definitions at once; they may call each other.
  std::vector<std::string> AddAll(const std::vector<std::pair<std::string, Func>>& defs);
  // Removes a definition that nothing else calls.
  void Remove(const std::string& name);
  // Parses a .pj text and adds all its types and definitions at once (they
  // may refer to each other); returns the names of the definitions added. An
  // existing name is an error unless `replace_existing`.
  std::vector<std::string> AddSource(std::string_view text, const std::string& filename,
                                     bool replace_existing = false);

  // Subscribers are called after each successful edit, on the editing thread,
  // in the order they subscribed.
  void Subscribe(std::function<void(const ModuleEdit&)> listener);

 private:
  using Defs = std::vector<std::pair<std::string, Func>>;
  // Checks `defs` (new or replacing) against `base`, re-checks callers whose
  // callee's type changed, and publishes the result.
  std::vector<std::string> Commit(const ModuleSnapshot& base, std::vector<TypeDefPtr> types, const Defs& defs,
                                  ModuleEdit::Kind kind);
  void Publish(std::shared_ptr<ModuleSnapshot> next, ModuleEdit edit);

  mutable std::mutex snapshot_mu_;  // guards current_ only for the pointer copy
  Snapshot current_;
  std::mutex edit_mu_;              // serializes writers
  uint64_t next_version_ = 1;
  std::vector<std::function<void(const ModuleEdit&)>> listeners_;
};

}  // namespace pejit
