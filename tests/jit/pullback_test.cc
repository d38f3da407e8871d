// jit/pullback.h: a straight-line program (lets of operator calls, as PE
// leaves residuals) compiled as its forward, which
// keeps the residuals, and its backward, which takes a cotangent later:
// the interpreter's tape seeded with the same cotangent gives the same
// gradients, and what `constant` marks gets none.
#include "jit/pullback.h"

#include <gtest/gtest.h>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "ops/random.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
def @f(%x: Tensor[(2, 3), f32], %w: Tensor[(3, 4), f32], %n: Tensor[(2,), i64])
    -> (Tensor[(2, 4), f32], (Tensor[(2,), f32], Tensor[(2,), i64])) {
  let %a: Tensor[(2, 4), f32] = matmul(%x, %w);
  let %h: Tensor[(2, 4), f32] = tanh(%a);
  let %q: Tensor[(2, 4), f32] = mul(%h, %h);
  let %s: Tensor[(2,), f32] = sum(%q, axes=[1]);
  (%h, (%s, %n))
}
)";

TEST(PullbackExecutable, GivesTheTapesGradientsForACotangent) {
  Module m;
  m.AddSource(kProgram, "f.pj");
  Snapshot s = m.snapshot();
  std::unique_ptr<JitSession> jit = JitSession::Create();
  Rng rng(3);
  const std::vector<Tensor> inputs = {RandomUniform(rng, {2, 3}, -1, 1), RandomUniform(rng, {3, 4}, -1, 1),
                                      Tensor::FromVector<int64_t>({2}, {4, 5})};
  const std::vector<Tensor> cotangents = {RandomUniform(rng, {2, 4}, -1, 1), RandomUniform(rng, {2}, -1, 1),
                                          Tensor()};
  std::vector<Value> args(inputs.begin(), inputs.end());
  ValueAndPullback want = Interpreter().CallWithPullback(*s, "f", args, {0, 1});
  std::vector<Value> want_grads = want.pullback(Value::Tuple(
      {Value(cotangents[0]), Value::Tuple({Value(cotangents[1]), Value(inputs[2])})}));

  auto exec = PullbackExecutable::Compile(*jit, s->Get("f").func, {false, false, true});
  EXPECT_EQ(TypeToString(exec->result_type()), TypeToString(AsFunc(s->Get("f").type)->ret));
  PullbackExecutable::Forward forward = exec->RunForward(inputs);
  ASSERT_EQ(forward.results.size(), 3u);
  EXPECT_TRUE(AllClose(forward.results[0], TensorLeaves(want.value)[0], 1e-5, 1e-6));
  EXPECT_TRUE(AllClose(forward.results[1], TensorLeaves(want.value)[1], 1e-5, 1e-6));
  std::vector<Tensor> grads = exec->RunBackward(inputs, cotangents, std::move(forward.residuals));
  ASSERT_EQ(grads.size(), 3u);
  EXPECT_TRUE(AllClose(grads[0], want_grads[0].tensor(), 1e-5, 1e-6));
  EXPECT_TRUE(AllClose(grads[1], want_grads[1].tensor(), 1e-5, 1e-6));
  EXPECT_FALSE(grads[2].defined()) << "an integer parameter";

  // The weight alone: the data's gradient is not computed.
  auto weight_only = PullbackExecutable::Compile(*jit, s->Get("f").func, {true, false, true});
  PullbackExecutable::Forward again = weight_only->RunForward(inputs);
  std::vector<Tensor> w_only = weight_only->RunBackward(inputs, cotangents, std::move(again.residuals));
  EXPECT_FALSE(w_only[0].defined());
  EXPECT_TRUE(AllClose(w_only[1], want_grads[1].tensor(), 1e-5, 1e-6));
}

TEST(PullbackExecutable, RefusesControlFlowAndNothingToDifferentiate) {
  Module m;
  m.AddSource(R"(
def @branch(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { if (greater(sum(%x), 0f32)) { %x } else { neg(%x) } }
def @ints(%n: Tensor[(2,), i64]) -> Tensor[(2,), i64] { let %m: Tensor[(2,), i64] = add(%n, %n); %m }
)", "g.pj");
  Snapshot s = m.snapshot();
  std::unique_ptr<JitSession> jit = JitSession::Create();
  EXPECT_THROW(PullbackExecutable::Compile(*jit, s->Get("branch").func, {false}), JitFailure);
  try {
    PullbackExecutable::Compile(*jit, s->Get("ints").func, {false});
    ADD_FAILURE() << "an integer program";
  } catch (const JitFailure& e) {
    EXPECT_NE(std::string(e.what()).find("nothing to differentiate"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pejit
