// \file A network that changes while it trains: the model of growing.pj and
// the edits that grow it through the engine's live module.
//
// The schedule (GrowingModel, one method per change):
//   0. growing.pj: trunk (784 → H, ReLU) and a linear head (H → 10).
//   1. Grow:   add @branch1 (H → K, ReLU) and replace @head with
//              linear(h) + dense(@branch1(h)), the branch's output weights
//              zero: the network computes what it did before, and training
//              grows the branch from there.
//   2. Deepen: add @branch2 (H → K → K, two ReLU layers) and replace @head to
//              use it instead of @branch1, the new layer the identity
//              (relu(I·relu(z) + 0) = relu(z): again function-preserving).
//   3. Prune:  remove @branch1, which nothing calls any more.
// Each replacement of @head invalidates the specializations of `loss` and
// `infer` (they call it) and none of `activity` (it does not); their calls
// run in the interpreter until the background job has the new code ready.
// Re-specializing reuses what did not change: @trunk's PE template
// (pe/pe_cache.h) and the fused kernels of the invalidated code
// (EngineOptions::retained_code_bytes).
//
// BadEdits() tries what the module must refuse: a @head whose result no
// longer fits its callers, and removing @trunk, which is still called.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "examples/mlp/fashion_mnist.h"
#include "ir/value.h"
#include "ops/random.h"
#include "scheduler/engine.h"

namespace pejit::growing {

// examples/growing/growing.pj, built into the program.
std::string_view ModelSource();

// Images (N, 784) in [0, 1] and labels: one random base image plus its
// class's random pattern (pixels within ±`separation`) plus uniform noise
// (`noise` wide), clipped; the classes overlap, so that accuracy has room
// to grow. For runs without the Fashion-MNIST package, and for tests.
mlp::Split SyntheticSplit(Rng& rng, int64_t n, double separation = 0.08, double noise = 0.8,
                          uint64_t prototypes_seed = 1);

struct Sizes {
  int hidden = 128;  // H: the trunk's features
  int branch = 64;   // K: the branch's units
};

// What one edit of the schedule did.
struct ChangeReport {
  std::string name;                   // "grow", "deepen", "prune"
  std::vector<std::string> edits;     // "add @branch1", "replace @head", ...
  uint64_t generation_before = 0, generation_after = 0;
};

class GrowingModel {
 public:
  // Adds growing.pj to `engine`'s module (which must not have it yet) and
  // initializes the parameters: Xavier-uniform weights, zero biases.
  GrowingModel(Engine& engine, Sizes sizes, uint64_t seed);

  Entry& loss() { return loss_; }
  Entry& infer() { return infer_; }
  Entry& activity() { return activity_; }

  // The trainable parameters: the trunk (w, b), and the head's Layers value.
  // Their structure changes with Grow and Deepen.
  const Value& trunk() const { return trunk_; }
  const Value& head() const { return head_; }

  std::vector<Value> LossArgs(const Value& images, const Value& labels) const {
    return {images, labels, trunk_, head_};
  }
  static std::vector<int> LossWrt() { return {2, 3}; }
  std::vector<Value> InferArgs(const Value& images) const { return {images, trunk_, head_}; }
  std::vector<Value> ActivityArgs(const Value& images) const { return {images, trunk_}; }

  // Which of the schedule's changes ran: 0 (none) to 3.
  int stage() const { return stage_; }
  // The next change of the schedule (Grow, then Deepen, then Prune). Throws
  // std::logic_error when all three ran.
  ChangeReport Next();
  ChangeReport Grow();
  ChangeReport Deepen();
  ChangeReport Prune();

  // Tries edits the module must reject; returns each one's error message
  // (an edit that was accepted throws std::logic_error: the model would be
  // broken).
  std::vector<std::string> BadEdits();

 private:
  Engine& engine_;
  Sizes sizes_;
  Rng rng_;
  Entry loss_, infer_, activity_;
  Value trunk_, head_;
  int stage_ = 0;
};

// The text of the definitions each change adds or replaces (for docs and tests).
std::string_view Branch1Source();
std::string_view GrownHeadSource();
std::string_view Branch2Source();
std::string_view DeepHeadSource();

}  // namespace pejit::growing
