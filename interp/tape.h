// \file Reverse-mode autodiff by a tape recorded while the interpreter runs.
//
// Every operator application whose inputs carry a tape id is recorded with
// its inputs and outputs; Backward replays the tape in reverse, applying each
// operator's registered gradient rule (ops/, the same rules the compiler
// uses) through EagerVjp, and sums the gradients that reach each tensor.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/value.h"
#include "ops/op.h"

namespace pejit {

class Tape {
 public:
  // A new leaf: a tensor gradients are wanted for.
  Value Watch(const Value& tensor);
  // Records op(inputs) = outputs when any input is on the tape, and returns
  // the outputs with tape ids; otherwise returns them unchanged.
  std::vector<Value> Record(const OpDef& op, const Attrs& attrs, const std::vector<Value>& inputs,
                            std::vector<Tensor> outputs);
  // The gradients of `loss` (a value on this tape, or not: then all are zero)
  // with respect to the tensors with the given tape ids; zeros where no path.
  std::vector<Tensor> Backward(const Value& loss, const std::vector<Value>& leaves) const;
  // The same for any outputs: the gradients of the sum over `seeds` of
  // sum(value * cotangent) (a vector-Jacobian product). A seed whose value
  // is not on the tape, or whose cotangent is undefined, adds nothing.
  std::vector<Tensor> Backward(const std::vector<std::pair<Value, Tensor>>& seeds,
                               const std::vector<Value>& leaves) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    const OpDef* op;
    Attrs attrs;
    std::vector<Tensor> inputs;
    std::vector<int64_t> input_ids;   // -1 for inputs not on the tape
    std::vector<Tensor> outputs;
    std::vector<int64_t> output_ids;
  };
  std::vector<Entry> entries_;
  int64_t next_id_ = 0;
};

}  // namespace pejit
