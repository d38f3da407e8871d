// \file A straight-line program's vector-Jacobian product, split in two.
//
// For `program` (tensor parameters, a tuple of tensor results), the VJP is
// autodiff.h's gradient, for the float (f32, f64) parameters, of the sum
// over the float results of sum(result * cotangent). Split so that the backward half reads
// the forward intermediates it needs (the residuals) instead of computing
// them again:
//   forward:  (params...) -> (results..., residuals...)
//   backward: (params..., a cotangent per float result..., residuals...)
//             -> (the VJP's value, d/d each float param...)
// Both the generic tier's segments (generic/executor.cc) and the native
// regions of residuals with control flow (control_flow.h) differentiate
// this way.
#pragma once

#include <optional>
#include <vector>

#include "jit/straight.h"

namespace pejit {

struct SplitVjp {
  Straight forward;               // result: a tuple, the program's results then the residuals
  Straight backward;              // result: a tuple, the VJP's value then the gradients
  std::vector<int> grad_inputs;   // the float parameters, differentiated for
  std::vector<int> grad_outputs;  // the float results, which take cotangents
  int residuals = 0;
};

// `program`'s result must be a tuple of tensor atoms. Its float parameters
// are differentiated for, but those `constant` marks (data no gradient can
// reach: a sentence a leaf reads a row of). nullopt when there is nothing to
// differentiate (no such parameter or no float result). Throws JitFailure as
// autodiff.h does, and for a multi-output operator's tuple kept whole by the
// forward half and nested further than one level.
std::optional<SplitVjp> MakeSplitVjp(const Straight& program, const std::vector<bool>& constant = {});

}  // namespace pejit
