// \file Segment programs written in a test: (params) -> (results...), as
// the generic tier's cells make them (a straight line returning a tuple).
#pragma once

#include <utility>
#include <vector>

#include "jit/batch_rules.h"
#include "jit/straight.h"

namespace pejit::generic::testing_segments {

// The segment program (params) -> (results...), its bindings emitted by
// `body(StraightEmitter&)`, which returns the results.
template <typename Body>
Func Segment(std::vector<Var> params, Body body) {
  StraightEmitter out;
  std::vector<Expr> results = body(out);
  Straight s;
  s.params = std::move(params);
  s.bindings = std::move(out.bindings());
  s.result = MakeTuple(std::move(results));
  return Recompose(s);
}

}  // namespace pejit::generic::testing_segments
