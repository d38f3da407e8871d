// \file Printing IR in the text format of docs/language.md.
//
// The printer gives variables unique names where two different variables
// would otherwise print alike in one scope, so the text always parses back to
// a structurally equal program.
#pragma once

#include <string>

#include "ir/expr.h"
#include "ir/type.h"

namespace pejit {

std::string PrintExpr(const Expr& e);
// "def @name(%x: T, ...) -> R {\n  body\n}"
std::string PrintFunction(const std::string& name, const Func& f);
// "type Tree {\n  Leaf(Tensor[(), i64]),\n  Node(Tree, Tree),\n}"
std::string PrintTypeDef(const TypeDef& def);

}  // namespace pejit
