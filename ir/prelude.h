// \file The prelude: the types and definitions every module has on use.
//
// A source that names List or Option, one of their constructors, or one of
// the prelude's definitions (@map, @fold, @length, @reverse, @append, @zip)
// without defining that name itself gets it from the prelude, with the
// prelude types and definitions it depends on, as if they had been written
// beside it (their locations say prelude.pj). A name a program defines itself
// stays its own, so programs written before the prelude keep their meaning;
// a prelude definition over a type the module defines itself (its own List)
// is not pulled, and its name stays unknown there.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"

namespace pejit {

// The prelude's text (ir/prelude.cc), as `pejit` and the docs show it.
std::string_view PreludeSource();
inline constexpr char kPreludeFile[] = "prelude.pj";

class Prelude {
 public:
  Prelude();  // parses PreludeSource(): its own types and definitions
  // One for the process, parsed on first use; modules take its types
  // themselves, so a type taken before is recognized by identity. Sharing it
  // is safe: types are immutable, and a module checks private copies of the
  // definitions it takes.
  static const Prelude& Shared();

  // The prelude type `name`, or the one declaring constructor `name`; null
  // when the prelude has neither.
  TypeDefPtr FindType(const std::string& name) const;
  // The names a program may use without defining them: the prelude's
  // definitions, and its types' constructors.
  std::vector<std::string> DefinitionNames() const;
  std::vector<std::string> ConstructorNames() const;

  // What a source with `defs` takes from the prelude, given the names the
  // module and the source define (`defined_globals`) and a lookup of the
  // types they define (`own_type`, null for none): the prelude definitions
  // it refers to that nobody defines, with the prelude definitions those
  // call, and the prelude types all of them and `used_types` need, less
  // those the module already took from the prelude.
  struct Pull {
    std::vector<TypeDefPtr> types;
    std::vector<std::pair<std::string, Func>> defs;
  };
  Pull For(const std::vector<std::pair<std::string, Func>>& defs, const std::set<std::string>& defined_globals,
           const std::function<TypeDefPtr(const std::string&)>& own_type,
           const std::set<std::string>& used_types) const;

 private:
  std::vector<TypeDefPtr> types_;
  std::vector<std::pair<std::string, Func>> defs_;
};

}  // namespace pejit
