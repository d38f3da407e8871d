// The engine shares one PE cache (pe/pe_cache.h) among its jobs: the helper
// a `loss` job specialized is replayed by the `infer` job on the same
// skeleton, its `pe` events say so, and both entries' compiled code still
// agrees with the interpreter.
#include <gtest/gtest.h>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "ops/random.h"
#include "scheduler/engine.h"
#include "scheduler/residual_executable.h"

namespace pejit {
namespace {

// Two entries over one @forward, as the two-entry MLP has them.
constexpr char kMlp[] = R"(
def @forward(%x: Tensor[(?, 4), f32], %p: (Tensor[(8, 4), f32], Tensor[(8,), f32], Tensor[(3, 8), f32], Tensor[(3,), f32]))
    -> Tensor[(?, 3), f32] {
  dense(relu(dense(%x, %p.0, %p.1)), %p.2, %p.3)
}

def @loss(%x: Tensor[(?, 4), f32], %y: Tensor[(?,), i64],
          %p: (Tensor[(8, 4), f32], Tensor[(8,), f32], Tensor[(3, 8), f32], Tensor[(3,), f32])) -> Tensor[(), f32] {
  cross_entropy(@forward(%x, %p), %y)
}

def @infer(%x: Tensor[(?, 4), f32], %p: (Tensor[(8, 4), f32], Tensor[(8,), f32], Tensor[(3, 8), f32], Tensor[(3,), f32]))
    -> Tensor[(?,), i64] {
  argmax(@forward(%x, %p), axis=1)
}
)";

class PeCacheEngineTest : public testing::Test {
 protected:
  void Start(EngineOptions options) {
    options.policy = Policy::Sync();
    options.workers = 1;
    options.compile = [](const Residual& r) { return CompileWithResidualInterpreter(r); };
    options.events = events_;
    engine_ = std::make_unique<Engine>(std::move(options));
    engine_->module().AddSource(kMlp, "mlp.pj");
    Rng rng(3);
    x_ = Value(RandomUniform(rng, {5, 4}, -1, 1));
    y_ = Value(Tensor::FromVector<int64_t>({5}, {0, 1, 2, 1, 0}));
    p_ = Value::Tuple({Value(RandomUniform(rng, {8, 4}, -1, 1)), Value(RandomUniform(rng, {8}, -1, 1)),
                       Value(RandomUniform(rng, {3, 8}, -1, 1)), Value(RandomUniform(rng, {3}, -1, 1))});
  }

  std::shared_ptr<RecordingSink> events_ = std::make_shared<RecordingSink>();
  std::unique_ptr<Engine> engine_;
  Value x_, y_, p_;
};

TEST_F(PeCacheEngineTest, InferReplaysTheForwardTheLossJobSpecialized) {
  Start({});
  Interpreter interp;
  Snapshot s = engine_->module().snapshot();
  ValueAndGrad got = engine_->entry("loss").with_grad({2}).value_and_grad({x_, y_, p_});
  ValueAndGrad want = interp.CallWithGrad(*s, "loss", {x_, y_, p_}, {2});
  EXPECT_TRUE(ValueEqual(got.value, want.value));
  ASSERT_EQ(got.grads.size(), 1u);
  EXPECT_TRUE(ValueEqual(got.grads[0], want.grads[0]));
  EXPECT_TRUE(ValueEqual(engine_->entry("infer").call({x_, p_}), interp.Call(*s, "infer", {x_, p_})));
  EXPECT_EQ(engine_->entry("infer").stats().calls_residual_interpreter, 1);

  std::vector<Event> loss = events_->Of(EventKind::kPe, "loss");
  std::vector<Event> infer = events_->Of(EventKind::kPe, "infer");
  ASSERT_EQ(loss.size(), 1u);
  ASSERT_EQ(infer.size(), 1u);
  EXPECT_EQ(loss[0].Text("cached_specializations"), "1");  // @forward, specialized once
  EXPECT_EQ(loss[0].Find("reused_specializations"), nullptr);
  EXPECT_EQ(infer[0].Text("reused_specializations"), "1");  // ... and reused
  EXPECT_EQ(infer[0].Text("reused"), "forward");
}

TEST_F(PeCacheEngineTest, TurnedOffNothingIsReused) {
  EngineOptions options;
  options.pe_cache.max_entries = 0;
  Start(std::move(options));
  engine_->entry("loss").with_grad({2}).value_and_grad({x_, y_, p_});
  engine_->entry("infer").call({x_, p_});
  std::vector<Event> infer = events_->Of(EventKind::kPe, "infer");
  ASSERT_EQ(infer.size(), 1u);
  EXPECT_EQ(infer[0].Find("reused_specializations"), nullptr);
  EXPECT_EQ(infer[0].Find("cached_specializations"), nullptr);  // nothing kept either
}

}  // namespace
}  // namespace pejit
