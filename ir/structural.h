// \file Structural equality and hashing of IR, up to renaming of bound variables.
//
// Two expressions are equal when they have the same shape of nodes, the same
// operators, attributes, constants (bitwise), globals and constructors, and
// their bound variables (let, parameters, patterns) correspond one to one;
// free variables are equal only to themselves. Type annotations are compared,
// checked types are not. Equal expressions have equal hashes.
#pragma once

#include <cstddef>

#include "ir/expr.h"

namespace pejit {

bool StructuralEqual(const Expr& a, const Expr& b);
size_t StructuralHash(const Expr& e);

}  // namespace pejit
