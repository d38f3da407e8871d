// \file Reverse-mode automatic differentiation of residual programs.
//
// Takes a residual program (pe/) whose result is a scalar f32 loss and
// returns one program, with the same parameters, computing
//   (loss, d loss / d param[w0], d loss / d param[w1], ...)
// for the parameters `wrt` (which must be float tensors). The backward pass
// is built from the operators' registered gradient rules (ops/, GradBuilder),
// the same rules the interpreter's tape applies, so both tiers differentiate
// alike. The result is ordinary IR: it prints, type-checks and runs.
#pragma once

#include <vector>

#include "ir/expr.h"
#include "jit/executable.h"

namespace pejit {

// Throws JitFailure for programs it cannot differentiate: calls to residual
// functions, dynamic `if` or `match`, or a result that is not Tensor[(), f32].
Func Differentiate(const Func& residual, const std::vector<int>& wrt);

}  // namespace pejit
