// \file Type and shape inference of function definitions.
//
// Checks a function against the types of the module it belongs to, using the
// operators' shape rules, and records the type of every node in its
// `checked_type`. Errors are IrError at the offending node's location.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"

namespace pejit {

struct TypeEnv {
  // The function type of global `name`; null when there is none. May throw
  // IrError (a recursive definition without a result type).
  std::function<Type(const std::string& name, const SourceLoc& use)> global_type;
  std::function<TypeDefPtr(const std::string& name)> type_def;
  // Names of all globals, for "did you mean" suggestions.
  std::function<std::vector<std::string>()> global_names;
};

// Checks `f` (the definition `name`) and returns its function type.
Type CheckFunction(const std::string& name, const Func& f, const TypeEnv& env);

// Checks that `t` only names known ADTs with the right number of arguments.
void CheckTypeWellFormed(const Type& t, const TypeEnv& env, const SourceLoc& loc);

}  // namespace pejit
