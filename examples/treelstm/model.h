// \file The Tree-LSTM model of treelstm.pj, from C++: its program text,
// parameters, and examples (ListOps or SST) as program values.
#pragma once

#include <string_view>
#include <vector>

#include "examples/treelstm/data.h"
#include "examples/treelstm/listops.h"
#include "ir/module.h"
#include "ir/value.h"
#include "ops/random.h"

namespace pejit::treelstm {

// examples/treelstm/treelstm.pj, built into the program.
std::string_view ModelSource();

struct Sizes {
  int vocabulary = listops::kVocabularySize;
  int embed = 64;
  int hidden = 128;
  int classes = listops::kClasses;
};

// The parameter tuple of treelstm.pj: Xavier-uniform matrices, normal(0, 0.1)
// embeddings, zero biases except the forget gate's (1, so that cells remember
// at first).
Value InitParams(Rng& rng, const Sizes& sizes);

// A token tree as a `Tree` value (types from the module).
Value TreeValue(const TokenTree& t, const ModuleSnapshot& module);

// The `loss` arguments for a minibatch: (List[Tree], labels (B,) i64).
struct Batch {
  Value trees;
  Value labels;
  int nodes = 0;  // tree nodes in the minibatch
};
Batch MakeBatch(const std::vector<const Example*>& examples, const ModuleSnapshot& module);
// One minibatch of `trees` generated ListOps expressions (the training split
// of listops::GenerateSplits for `seed`), for tests and benchmarks.
Batch GeneratedListOpsBatch(uint64_t seed, int trees, const ModuleSnapshot& module);

}  // namespace pejit::treelstm
