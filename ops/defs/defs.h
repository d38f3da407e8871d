// \file Internal to ops/: how the operator definitions reach the registry,
// and the shape-rule helpers they share.
#pragma once

#include <string>

#include "ops/op.h"

namespace pejit {

class Registry;
// Registers `op` and returns it as registered: a family's helper returns it
// so that an operator's batching and move rules are set where it is defined.
OpDef& AddOp(Registry& registry, OpDef op);

// Each file of ops/defs/ registers one family of operators.
void RegisterElementwiseOps(Registry& registry);  // elementwise.cc
void RegisterGemmOps(Registry& registry);         // gemm.cc
void RegisterShapeOps(Registry& registry);        // shape.cc
void RegisterReduceOps(Registry& registry);       // reduce.cc
void RegisterNnOps(Registry& registry);           // nn.cc

// Numpy broadcasting of two shapes (unknown dims allowed); throws OpError
// naming both inputs: "add: cannot broadcast lhs (3, 4) with rhs (5,)".
Shape BroadcastShapes(std::string_view op, const std::string& lhs_name, const Shape& lhs,
                      const std::string& rhs_name, const Shape& rhs);
// `axis` in [-rank, rank) as a non-negative axis; throws OpError.
int NormalizeAxis(std::string_view op, int64_t axis, int rank);
// Throws OpError unless `type`'s dtype is one of `allowed`.
void RequireDType(std::string_view op, const std::string& input, const TensorType& type,
                  std::initializer_list<DType> allowed);

}  // namespace pejit
