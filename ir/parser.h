// \file Parsing the text format of docs/language.md.
//
// Errors are IrError with file:line:col and, for misspelled names, a
// suggestion: "treelstm.pj:14:9: unknown constructor 'Lief'; did you mean 'Leaf'?".
// The parser resolves names (variables, constructors, operators, types) but
// does not type-check: Module does that when the definitions are added.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"

namespace pejit {

struct ParsedProgram {
  std::vector<TypeDefPtr> types;                    // in source order
  std::vector<std::pair<std::string, Func>> defs;   // name (without '@'), function
};

// Finds a type defined outside the text being parsed (in the module it will
// be added to); null when there is none. A constructor the text does not
// declare is looked up too: by its own name (a lookup may answer with the
// type declaring it), then among the constructors of the types the text names.
using TypeLookup = std::function<TypeDefPtr(const std::string& name)>;

// Parses a whole file. `filename` appears in error locations.
ParsedProgram ParseProgram(std::string_view text, const std::string& filename, const TypeLookup& lookup = nullptr);

// Parses one expression, with the types in `lookup`; free variables are an
// error. For tests and tools.
Expr ParseExpr(std::string_view text, const TypeLookup& lookup = nullptr);

// Parses one type.
Type ParseType(std::string_view text, const TypeLookup& lookup = nullptr);

}  // namespace pejit
