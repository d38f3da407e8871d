// \file The calling convention of compiled code: how one call's values cross
// into code over flat tensors, and back.
//
// Every tier that runs code over tensors (whole-minibatch specializations,
// control-flow regions, the structure-generic tier), the persistent cache,
// the runtime of exported code and the tools use this one convention:
//
//   arguments  the call's *dynamic leaves* (Flatten): arguments left to
//              right, each walked depth first, tuple and constructor fields
//              left to right; arguments marked static contribute none. A
//              residual program's parameters are these, in this order.
//   results    value mode: the result's tensor leaves, depth first
//              (ValueFromTensors rebuilds the value).
//              grad mode, with respect to arguments `wrt`: the loss, then the
//              gradient of each leaf FloatWrtLeaves names, in its order
//              (CallLayout::gradient_result says where each leaf's is).
//
// FromResults turns results so laid out into what Interpreter::CallWithGrad
// returns for the same call, so that every tier answers alike.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ir/type.h"
#include "ir/value.h"
#include "ops/tensor.h"

namespace pejit {

// A call's value and, in grad mode, one gradient per index of `wrt`, shaped
// like that argument.
struct ValueAndGrad {
  Value value;               // the loss in grad mode
  std::vector<Value> grads;  // one per index of `wrt`
};

// A call's value and its pullback (jax.vjp's pair): given a cotangent of the
// value, the gradients of sum(value * cotangent) with respect to each
// argument of `wrt`, shaped like it, as ValueAndGrad's are. The forward
// pass's state (a tape, a generic call's runs) lives in the pullback until
// it runs (once: a second call throws std::logic_error) or is dropped.
struct ValueAndPullback {
  Value value;
  std::function<std::vector<Value>(const Value& cotangent)> pullback;
  std::string tier;  // where the forward ran (the engine's: "generic", "interpreter")
};

// The cotangent of `value`, one tensor per tensor leaf of `value`
// (TensorLeaves order): `cotangent`'s leaf where `value`'s is a float tensor,
// undefined at an integer or bool leaf (which takes no cotangent; the
// cotangent may hold any tensor there). Throws std::invalid_argument, naming
// `where` and the leaf's path, when `cotangent` has another structure (tuple
// arity, constructor) or a float leaf of another dtype or shape.
std::vector<Tensor> CotangentLeaves(const Value& value, const Value& cotangent, const std::string& where);

// The dynamic leaves of `args`, in the order above (each argument's
// TensorLeaves, ir/value.h); given `first`, where argument i's begin.
std::vector<Tensor> Flatten(const std::vector<Value>& args, const std::vector<bool>& static_args = {},
                            std::vector<size_t>* first = nullptr);

// The leaves a gradient with respect to arguments `wrt` is taken for: the
// indices, into the dynamic leaves, of the float tensors of those arguments,
// ascending and each once (integer leaves such as word ids have none, static
// arguments have no leaves). Throws std::invalid_argument for an index that
// names no argument.
std::vector<int> FloatWrtLeaves(const std::vector<Value>& args, std::span<const int> wrt,
                                const std::vector<bool>& static_args = {});
// The same from leaves already flattened, where argument i's leaves begin at
// `first[i]` (and end where the next one's begin, the last one's at the end).
std::vector<int> FloatWrtLeaves(std::span<const Tensor> leaves, std::span<const size_t> first,
                                std::span<const int> wrt);

// Whether compiled code can serve a grad call with respect to `wrt`: every
// index names a distinct dynamic argument. Anything else is the
// interpreter's to accept (an index named twice) or reject.
bool CompilableWrt(const std::vector<int>& wrt, size_t nargs, const std::vector<bool>& static_args);

// What code for an entry returning `ret` returns on a call's arguments.
struct CallLayout {
  size_t results = 0;                // tensors returned
  std::vector<int> wrt_leaves;       // grad mode: FloatWrtLeaves
  std::vector<int> gradient_result;  // grad mode: per dynamic leaf, its gradient's result index, or -1
};
CallLayout LayoutOf(const Type& ret, const std::vector<Value>& args, const std::vector<bool>& static_args,
                    const std::vector<int>* wrt);
// Grad mode's `gradient_result` for the gradients of `wrt_leaves` among
// `leaves` dynamic leaves: the loss is result 0, wrt leaf g's gradient result g + 1.
std::vector<int> GradientResultOf(size_t leaves, const std::vector<int>& wrt_leaves);

// The call's value (value mode: of type `result_type`) or loss and gradients
// (grad mode: `wrt` non-null) from `results` laid out as above; `leaves` and
// `first` are Flatten's for the call. A leaf without a gradient result
// (gradient_result -1: an integer) stands for itself in its gradient; an
// undefined gradient result is zeros (no gradient reached that leaf).
// Throws std::logic_error when the results do not fit the layout.
ValueAndGrad FromResults(const Type& result_type, const std::vector<Value>& args, const std::vector<int>* wrt,
                         const std::vector<Tensor>& leaves, const std::vector<size_t>& first,
                         const std::vector<int>& gradient_result, const std::vector<Tensor>& results);
// Each `wrt` argument's gradient, shaped like it, from one gradient per
// dynamic leaf (`leaf_grads`, in `leaves`' order, `first` as Flatten's): an
// undefined one is zeros for a float leaf (no gradient reached it) and the
// leaf itself for an integer one. FromResults's grad mode, and a pullback's.
std::vector<Value> GradsFromLeaves(const std::vector<Value>& args, const std::vector<int>& wrt,
                                   const std::vector<Tensor>& leaves, const std::vector<size_t>& first,
                                   const std::vector<Tensor>& leaf_grads);

}  // namespace pejit
