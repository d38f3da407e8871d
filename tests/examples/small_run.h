// \file What the Tree-LSTM trainer's tests share: a small run, and the
// parameters as one vector to compare runs exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "examples/treelstm/trainer.h"
#include "train/optimizer.h"

namespace pejit::testing_support {

// 24 generated ListOps trees (and 8 for dev) in minibatches of 8, widths of 8:
// three steps an epoch, small enough to train under the sanitizers.
inline treelstm::RunOptions SmallRun(uint64_t seed) {
  treelstm::RunOptions o;
  o.listops_train = 24;
  o.listops_dev = 8;
  o.batch = 8;
  o.embed = 8;
  o.hidden = 8;
  o.seed = seed;
  o.train_sample = 8;
  return o;
}

// Every parameter's values, in the order ParameterLeaves walks them.
inline std::vector<float> FlatParameters(const Value& params) {
  std::vector<float> out;
  for (const Tensor& t : ParameterLeaves(params)) out.insert(out.end(), t.data<float>(), t.data<float>() + t.numel());
  return out;
}

}  // namespace pejit::testing_support
