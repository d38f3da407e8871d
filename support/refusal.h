// \file Refusal: a program a tier declines, as opposed to a fault.
//
// Every tier above the interpreter takes only part of what the interpreter
// runs: partial evaluation stops at its limits (PeFailure), the JIT compiles
// straight-line tensor code (JitFailure), the generic tier serves programs
// its cells cover (generic/cell.h). Declining is an expected outcome: the
// call runs on the tier below, and the trace says `refused` with what().
// Anything else that throws while specializing is a fault (`failed`). The
// engine tells the two apart by this one base type.
#pragma once

#include <stdexcept>

namespace pejit {

class Refusal : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace pejit
