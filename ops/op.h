// \file The operator registry: one entry per operator, shared by every tier.
//
// An operator is defined once, in ops/defs/*.cc, with
//   - its inputs' names and its typed attributes,
//   - a shape/type rule (works with unknown `?` dims, for the IR's checker),
//   - a reference kernel writing into preallocated outputs,
//   - a gradient rule (vector-Jacobian product) written with registered
//     operators against GradBuilder, so that the interpreter's tape (eagerly)
//     and the compiler (into IR) derive gradients the same way,
//   - a fusion kind and, for elementwise ops, the scalar it computes per
//     element (what jit/ generates code from).
#pragma once

#include <algorithm>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "ops/attrs.h"
#include "ops/tensor.h"

namespace pejit {

// Bad input to an operator: what() is "op: message", e.g.
// "matmul: inner dimensions differ: lhs (3, 4) vs rhs (5, 2)".
class OpError : public std::runtime_error {
 public:
  OpError(std::string_view op, const std::string& message)
      : std::runtime_error(std::string(op) + ": " + message) {}
};

// How an operator may be fused by jit/ (TVM's pattern kinds).
enum class FusionKind : uint8_t {
  kElementwise,  // out[i] = f(in[i]), same shapes
  kBroadcast,    // elementwise after numpy broadcasting of the inputs
  kInjective,    // each output element is one input element (reshape, slice, ...)
  kReduction,    // reduces axes (sum, softmax, ...)
  kGemm,         // matrix products, run by OpenBLAS
  kOpaque,       // anything else (gather, scatter, loss)
};

// How an operator runs over instances stacked along a new leading axis: an
// operand is stacked (one slice per instance) or shared (the same for every
// instance: a weight matrix, an embedding table). Both batching passes
// (jit/batch.h, jit/vectorize.h) read it through jit/batch_rules.h.
enum class BatchRule : uint8_t {
  kNone,         // no rule: instances run one by one
  kElementwise,  // any operand stacked, the others broadcast (the default of
                 // elementwise and broadcast operators with a scalar function)
  kGemm,         // the first operand's rows stacked (2-D, not transpose_a);
                 // the others (weights, bias) shared
  kGather,       // the indices (operand 1) stacked, the table (operand 0) shared
  kReshape,      // the target `shape` gains the leading axis
  kAxis,         // the `axis` attribute moves by one (chunk, split, concat, softmax, argmax)
  kReduce,       // the `axes` attribute moves by one (sum, mean, max)
  kLastAxis,     // the first operand stacked, the operator working along its
                 // last axis; the others (layer_norm's gamma and beta) shared
  kLeading,      // every index of the operands' leading axes maps alone
                 // (one_hot): operands stacked, attributes unchanged
  kRowLoss,      // a loss over rows (cross_entropy, nll): the instances' rows
                 // run as one batch of per-row losses, then each instance's
                 // mean is taken over its own rows
  kShapeAttrs,   // a shape operator whose attributes name axes (transpose's
                 // perm, squeeze's and slice's axes, expand_dims's and
                 // stack's axis), give one entry per axis (pad) or a shape
                 // (broadcast_to, sum_to): they gain the leading stack axis;
                 // every operand stacked
};

// How an operator that only moves bytes of its operands moves them; the
// compiler lowers such calls to views and memcpy blocks instead of kernels
// (jit/moves.h). kNone: the operator computes.
enum class MoveKind : uint8_t {
  kNone,
  kCopy,    // the operand, whole
  kView,    // the operand's bytes as they lie, in another shape (reshape, squeeze)
  kGather,  // rows of operand 0 at the indices in operand 1 (take)
  kConcat,  // the operands one after another along `axis` (concat; stack, each
            // with that axis inserted)
  kSlice,   // the box of operand 0 that `axes`, `begins` and `ends` give (slice)
};

// What one element of an elementwise/broadcast operator computes.
#define PEJIT_SCALAR_OPS(X)                                                        \
  X(kNone) X(kNeg) X(kAbs) X(kExp) X(kLog) X(kTanh) X(kSigmoid) X(kRelu) X(kSqrt)  \
  X(kPow) X(kAdd) X(kSub) X(kMul) X(kDiv) X(kMaximum) X(kMinimum)                 \
  X(kLess) X(kLessEqual) X(kGreater) X(kGreaterEqual) X(kEqual) X(kNotEqual)      \
  X(kAnd) X(kOr) X(kNot) X(kWhere) X(kCast) X(kCopy) X(kZero) X(kOne) X(kClip)
enum class ScalarOp : uint8_t {
#define PEJIT_ENUM_ITEM(name) name,
  PEJIT_SCALAR_OPS(PEJIT_ENUM_ITEM)
#undef PEJIT_ENUM_ITEM
};

// A value in the program a gradient rule is adding to: an eager tensor for the
// interpreter's tape, a variable for the compiler.
using GradValue = int32_t;
inline constexpr GradValue kNoGrad = -1;

struct OpDef;

class GradBuilder {
 public:
  virtual ~GradBuilder() = default;
  // Appends `op(inputs; attrs)` and returns its outputs. Attributes are
  // normalized (validated, defaults filled) by the caller.
  virtual std::vector<GradValue> EmitOp(const OpDef& op, std::span<const GradValue> inputs,
                                        const Attrs& attrs) = 0;
  virtual GradValue Constant(const Tensor& value) = 0;
  // By value: the builder may grow (and move its storage) while a rule runs.
  virtual TensorType TypeOf(GradValue value) const = 0;

  // Emits a registered single-output operator by name (attributes normalized here).
  GradValue Emit(std::string_view op, std::initializer_list<GradValue> inputs, const Attrs& attrs = {});
  GradValue Add(GradValue a, GradValue b) { return Emit("add", {a, b}); }
  GradValue Sub(GradValue a, GradValue b) { return Emit("sub", {a, b}); }
  GradValue Mul(GradValue a, GradValue b) { return Emit("mul", {a, b}); }
  GradValue Div(GradValue a, GradValue b) { return Emit("div", {a, b}); }
  GradValue Neg(GradValue a) { return Emit("neg", {a}); }
  GradValue ScalarConstant(double value, DType dtype) { return Constant(Tensor::ScalarOf(dtype, value)); }
  GradValue Zeros(const TensorType& type);
  // Sums a broadcast gradient back to `shape` (identity when shapes agree).
  GradValue SumTo(GradValue grad, const Shape& shape);
  // Broadcasts `value` to `shape` (identity when shapes agree).
  GradValue BroadcastTo(GradValue value, const Shape& shape);
};

struct GradContext {
  std::span<const GradValue> inputs;
  std::span<const GradValue> outputs;
  // One per output; kNoGrad where nothing flows back into that output.
  std::span<const GradValue> output_grads;
  const Attrs& attrs;
};

// Returns one gradient per input: kNoGrad for inputs that get none (indices).
using GradRule = std::function<std::vector<GradValue>(GradBuilder&, const GradContext&)>;
using TypeRule =
    std::function<std::vector<TensorType>(std::span<const TensorType> inputs, const Attrs& attrs)>;
using Kernel = std::function<void(std::span<const Tensor> inputs, std::span<Tensor> outputs,
                                  const Attrs& attrs)>;

// How a kernel's work divides among threads (jit/schedule.h splits a
// compiled step that is worth it). `kernel(..., part, parts)` computes part
// `part` of `parts`: disjoint pieces of the outputs that together make all
// of them, whichever thread runs which. Each element's bits may depend on
// `parts` (OpenBLAS may order a dot product's terms by the shape it is
// given; pejit's packed products and row-wise kernels give the whole
// kernel's bits), which is why the schedule fixes `parts` when the plan is
// made, never from the number of threads.
struct KernelSplit {
  // The most parts these operands divide into (1: none).
  std::function<int64_t(std::span<const TensorType> inputs, std::span<const TensorType> outputs,
                        const Attrs& attrs)>
      max_parts;
  std::function<void(std::span<const Tensor> inputs, std::span<Tensor> outputs, const Attrs& attrs,
                     int64_t part, int64_t parts)>
      kernel;
};

// The split of a row-wise kernel: one whose output rows are each computed
// from the same row of every input, all of one leading extent (a split or
// chunk along an inner axis). Part p runs `kernel` on views of rows
// PartOf(rows, 1, p, parts) of every operand. `applies` says for which
// attributes and input types the kernel is row-wise.
KernelSplit RowWiseSplit(Kernel kernel,
                         std::function<bool(std::span<const TensorType> inputs, const Attrs& attrs)> applies);

// Part `part` of `parts` of [0, n) in whole units of `unit` (the last may
// be short): [first, second). Parts beyond the units there are get nothing.
inline std::pair<int64_t, int64_t> PartOf(int64_t n, int64_t unit, int64_t part, int64_t parts) {
  const int64_t units = (n + unit - 1) / unit;
  return {std::min(n, units * part / parts * unit), std::min(n, units * (part + 1) / parts * unit)};
}

struct OpDef {
  std::string name;
  std::vector<std::string> input_names;  // a single "inputs..." name: variadic
  std::vector<AttrSpec> attrs;
  FusionKind fusion = FusionKind::kOpaque;
  ScalarOp scalar = ScalarOp::kNone;
  BatchRule batch = BatchRule::kNone;
  MoveKind moves = MoveKind::kNone;
  // Inputs from this one on must share a dtype (binary arithmetic,
  // comparisons, where's values): an unsuffixed number among them takes the
  // others' when the program is checked. -1: none.
  int same_dtype_from = -1;
  TypeRule infer;
  Kernel kernel;
  KernelSplit split;  // null members: the kernel runs whole
  GradRule grad;  // null: not differentiable (comparisons, argmax, ...)

  bool variadic() const { return input_names.size() == 1 && input_names[0].ends_with("..."); }
  bool differentiable() const { return static_cast<bool>(grad); }
};

// The operator named `name`, or nullptr.
const OpDef* FindOp(std::string_view name);
// The operator named `name`; throws OpError ("unknown operator 'madd'; did you
// mean 'add'?") when there is none.
const OpDef& LookupOp(std::string_view name);
std::vector<const OpDef*> AllOps();  // sorted by name

// Checks attribute names and kinds against the op's schema and fills defaults
// (an int given for a float attribute is converted). Throws OpError.
Attrs NormalizeAttrs(const OpDef& op, const Attrs& attrs);
// Checks the number of inputs and applies the type rule. Throws OpError.
std::vector<TensorType> InferTypes(const OpDef& op, std::span<const TensorType> inputs,
                                   const Attrs& normalized_attrs);

}  // namespace pejit
