// Tiers agree over a whole training run: the small Tree-LSTM of
// examples/treelstm, trained with SGD on the engine's gradients, gives the
// same loss curve (to 1e-4) whether everything runs in the interpreter,
// compiled code takes over in the background, or every step is compiled first.
#include <gtest/gtest.h>

#include <cmath>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using testing_scheduler::Options;

constexpr int kEpochs = 3;
constexpr int kBatch = 4;
constexpr float kLearningRate = 0.3f;

// params − lr · grads, field by field, in new tensors.
Value Sgd(const Value& params, const Value& grads) {
  std::vector<Value> out;
  for (size_t k = 0; k < params.fields().size(); ++k) {
    const Tensor& p = params.fields()[k].tensor();
    const Tensor& g = grads.fields()[k].tensor();
    Tensor next = p.Clone();
    float* x = next.data<float>();
    const float* dx = g.data<float>();
    for (int64_t i = 0; i < next.numel(); ++i) x[i] -= kLearningRate * dx[i];
    out.emplace_back(next);
  }
  return Value::Tuple(std::move(out));
}

struct Curve {
  std::vector<double> losses;
  EntryStats stats;
};

Curve Train(Policy policy) {
  Engine engine(Options(policy));
  engine.module().AddSource(treelstm::ModelSource(), "treelstm.pj");
  Entry loss = engine.entry("loss");

  listops::GeneratorOptions small;
  small.max_depth = 3;
  small.max_args = 3;
  listops::Splits data = listops::GenerateSplits(11, 4 * kBatch, 0, 0, small);
  std::vector<treelstm::Batch> batches;
  for (size_t i = 0; i < data.train.size(); i += kBatch) {
    std::vector<const listops::Example*> b;
    for (size_t j = i; j < i + kBatch; ++j) b.push_back(&data.train[j]);
    batches.push_back(treelstm::MakeBatch(b, *engine.module().snapshot()));
  }
  Rng rng(1);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 8, 6, listops::kClasses});

  Curve curve;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    for (const treelstm::Batch& b : batches) {
      ValueAndGrad vg = loss.with_grad({2}).value_and_grad({b.trees, b.labels, params});
      curve.losses.push_back(vg.value.tensor().item());
      params = Sgd(params, vg.grads[0]);
    }
    if (epoch == 0 && policy.kind == Policy::Kind::kEager) {
      // Let the background compiles of epoch 0 finish: later epochs run compiled code.
      for (const treelstm::Batch& b : batches) {
        CodeStatus s = loss.with_grad({2}).wait_ready({b.trees, b.labels, params});
        EXPECT_TRUE(s.ready()) << s.reason;
      }
    }
  }
  curve.stats = loss.stats();
  return curve;
}

TEST(TreeLstmTraining, SameLossCurveWithEveryPolicy) {
  Curve interpreted = Train(Policy::Interpreter());
  Curve eager = Train(Policy::Eager());
  Curve sync = Train(Policy::Sync());
  const int steps = kEpochs * 4;

  ASSERT_EQ(interpreted.losses.size(), static_cast<size_t>(steps));
  EXPECT_EQ(interpreted.stats.calls_interpreter, steps);
  EXPECT_EQ(interpreted.stats.calls_compiled(), 0);
  EXPECT_EQ(sync.stats.calls_compiled(), steps) << "sync ran steps in the interpreter";
  EXPECT_EQ(sync.stats.compiled, 4);  // one specialization per minibatch structure
  EXPECT_GE(eager.stats.calls_compiled(), steps - 4) << "eager's later epochs did not run compiled code";

  for (int i = 0; i < steps; ++i) {
    double ref = interpreted.losses[i];
    double tol = 1e-4 * std::max(1.0, std::abs(ref));
    EXPECT_NEAR(eager.losses[i], ref, tol) << "step " << i;
    EXPECT_NEAR(sync.losses[i], ref, tol) << "step " << i;
  }
  // It learns: the last epoch's loss is below the first's.
  double first = 0, last = 0;
  for (int i = 0; i < 4; ++i) {
    first += interpreted.losses[i];
    last += interpreted.losses[steps - 4 + i];
  }
  EXPECT_LT(last, first);
}

}  // namespace
}  // namespace pejit
