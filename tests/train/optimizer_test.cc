// Optimizers: each update rule against a hand computation, and a state saved
// after some steps carries a new optimizer on exactly as the old one would.
#include <gtest/gtest.h>

#include <cmath>

#include "train/optimizer.h"

namespace pejit {
namespace {

// Parameters as an entry takes them: a tuple holding a matrix and a nested
// tuple with a vector and an i64 tensor (which optimizers leave alone).
Value Params(float a, float b) {
  return Value::Tuple({Value(Tensor::FromVector<float>({2}, {a, b})),
                       Value::Tuple({Value(Tensor::FromVector<float>({1}, {a - b})),
                                     Value(Tensor::FromVector<int64_t>({}, {7}))})});
}

std::vector<float> Flat(const Value& v) {
  std::vector<float> out;
  for (const Tensor& t : ParameterLeaves(v)) out.insert(out.end(), t.data<float>(), t.data<float>() + t.numel());
  return out;
}

TEST(Optimizer, ParameterLeavesAreTheF32TensorsDepthFirst) {
  std::vector<Tensor> leaves = ParameterLeaves(Params(1, 2));
  ASSERT_EQ(leaves.size(), 2u);
  EXPECT_EQ(leaves[0].shape(), (Shape{2}));
  EXPECT_EQ(leaves[1].data<float>()[0], -1.0f);
}

TEST(Optimizer, UpdateRulesMatchHandComputations) {
  Value grads = Params(0.5f, -2.0f);  // gradient 0.5, -2 | 2.5
  {
    Value p = Params(1, 2);
    Optimizer::Create({.kind = "sgd", .learning_rate = 0.1})->Step(p, grads);
    EXPECT_EQ(Flat(p), (std::vector<float>{1 - 0.05f, 2 + 0.2f, -1 - 0.25f}));
  }
  {
    // Adagrad's first step moves every element by lr (g / sqrt(g^2)); its second by lr * g / sqrt(2 g^2).
    Value p = Params(1, 2);
    auto opt = Optimizer::Create({.kind = "adagrad", .learning_rate = 0.1});
    opt->Step(p, grads);
    opt->Step(p, grads);
    std::vector<float> f = Flat(p);
    const double second = 0.1 / std::sqrt(2.0);
    EXPECT_NEAR(f[0], 1 - 0.1 - second, 1e-6);
    EXPECT_NEAR(f[1], 2 + 0.1 + second, 1e-6);
    EXPECT_NEAR(f[2], -1 - 0.1 - second, 1e-6);
  }
  {
    // Adam's bias-corrected first step is lr * sign(g).
    Value p = Params(1, 2);
    Optimizer::Create({.kind = "adam", .learning_rate = 0.1})->Step(p, grads);
    std::vector<float> f = Flat(p);
    EXPECT_NEAR(f[0], 0.9, 1e-6);
    EXPECT_NEAR(f[1], 2.1, 1e-6);
    EXPECT_NEAR(f[2], -1.1, 1e-6);
  }
  {
    // Clipping scales the whole gradient to the norm; weight decay adds decay * w after it.
    Value p = Params(1, 2);
    double norm = Optimizer::Create({.kind = "sgd", .learning_rate = 1, .weight_decay = 0.5, .clip_norm = 1})
                      ->Step(p, Params(3, 4));  // gradient 3, 4 | -1: norm sqrt(26)
    EXPECT_NEAR(norm, std::sqrt(26.0), 1e-9);
    std::vector<float> f = Flat(p);
    const double s = 1 / std::sqrt(26.0);
    EXPECT_NEAR(f[0], 1 - (3 * s + 0.5), 1e-6);
    EXPECT_NEAR(f[1], 2 - (4 * s + 1.0), 1e-6);
    EXPECT_NEAR(f[2], -1 - (-1 * s - 0.5), 1e-6);
  }
}

TEST(Optimizer, AStateCarriesANewOptimizerOnExactly) {
  for (const char* kind : {"sgd", "adagrad", "adam"}) {
    SCOPED_TRACE(kind);
    OptimizerOptions o{.kind = kind, .learning_rate = 0.05};
    auto grad = [](int step) { return Params(0.3f * step - 1, 1.0f / (step + 1)); };
    Value straight = Params(1, 2), resumed = Params(1, 2);
    auto a = Optimizer::Create(o);
    for (int step = 0; step < 5; ++step) a->Step(straight, grad(step));

    auto b = Optimizer::Create(o);
    for (int step = 0; step < 2; ++step) b->Step(resumed, grad(step));
    OptimizerState state = b->state();
    EXPECT_EQ(state.kind, kind);
    EXPECT_EQ(state.steps, 2);
    EXPECT_EQ(state.buffers.size(), std::string(kind) == "sgd" ? 0u : std::string(kind) == "adam" ? 4u : 2u);
    auto c = Optimizer::Create(o);
    c->set_state(state);
    for (int step = 2; step < 5; ++step) c->Step(resumed, grad(step));
    EXPECT_EQ(Flat(resumed), Flat(straight));
  }
}

TEST(Optimizer, AStateThatDoesNotFitIsRefusedBeforeAnyUpdate) {
  auto adagrad = Optimizer::Create({.kind = "adagrad"});
  try {
    adagrad->set_state({"adam", 1, {}});
    ADD_FAILURE() << "took adam's state";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "optimizer state of adam given to adagrad");
  }
  adagrad->set_state({"adagrad", 3, {{1, 1}, {1, 1}}});  // the second buffer should have 1 value
  Value p = Params(1, 2);
  try {
    adagrad->Step(p, Params(1, 1));
    ADD_FAILURE() << "stepped with a state of the wrong size";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "optimizer state: adagrad buffer 1 has 2 values, its parameter 1");
  }
  EXPECT_EQ(Flat(p), Flat(Params(1, 2)));
}

// Settings that would train wrongly without a word (a negative rate ascends)
// are refused when the optimizer is made, naming the setting.
TEST(Optimizer, RefusesSettingsThatWouldTrainWrongly) {
  auto error = [](OptimizerOptions o) {
    try {
      Optimizer::Create(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("made");
  };
  EXPECT_EQ(error({.kind = "sgd", .learning_rate = -0.1}),
            "OptimizerOptions::learning_rate is -0.100000; it must be a positive number");
  EXPECT_EQ(error({.kind = "sgd", .learning_rate = std::nan("")}).rfind("OptimizerOptions::learning_rate is nan", 0), 0u);
  EXPECT_EQ(error({.kind = "adagrad", .weight_decay = -1}), "OptimizerOptions::weight_decay is -1.000000; it must be 0 or more");
  EXPECT_EQ(error({.kind = "adam", .clip_norm = -2}), "OptimizerOptions::clip_norm is -2.000000; it must be 0 (off) or more");
  EXPECT_EQ(error({.kind = "adam", .beta1 = 1}), "OptimizerOptions::beta1 is 1.000000; it must be in [0, 1)");
  EXPECT_EQ(error({.kind = "adam", .learning_rate = 0.01, .weight_decay = 0.1, .clip_norm = 5}), "made");
}

}  // namespace
}  // namespace pejit
