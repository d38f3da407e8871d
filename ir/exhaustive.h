// \file Matches that some value of their scrutinee's type reaches no clause of.
//
// The interpreter reports such a value when it happens ("no clause of match
// fits B(...)"); `pejit check` reports the match before anything runs. The
// analysis is sound but not complete: it names the constructors of the
// scrutinee's type that no clause's top-level pattern names, when no clause
// matches everything. A constructor named only with refutable sub-patterns
// (`Cons(%x, Nil)` without `Cons(%x, %rest)`) is not reported.
#pragma once

#include <string>
#include <vector>

#include "ir/module.h"

namespace pejit {

struct MatchGap {
  SourceLoc loc;                     // the match
  std::string definition;            // the definition it is in
  std::vector<std::string> missing;  // constructors no clause names
  std::string ToString() const;      // "m.pj:2:36: match in @f has no clause for B"
};

// Every such match in `module`'s definitions, by definition name, then in
// the order they appear.
std::vector<MatchGap> NonExhaustiveMatches(const ModuleSnapshot& module);

}  // namespace pejit
