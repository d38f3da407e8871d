// Entry::value_and_pullback: a call's value of any type now, the gradients
// of sum(value * cotangent) later, from the forward's own state (the
// generic tier's runs, tier 0's tape), equal to a grad-mode call of the
// vector-Jacobian product written out in the language.
#include <gtest/gtest.h>

#include <stdexcept>

#include "scheduler/engine.h"
#include "tests/scheduler/fixtures.h"

namespace pejit {
namespace {

using namespace testing_scheduler;

// @states returns a tree's state, its square beside a flag, and a weight
// as it came in: row outputs of runs, a bool that takes no cotangent, and an
// argument. @vjp is what a pullback computes, written out.
constexpr char kStates[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }

def @enc(%t: Tree, %emb: Tensor[(?, 4), f32], %w: Tensor[(4, 4), f32]) -> Tensor[(1, 4), f32] {
  match (%t) {
    Leaf(%i) => tanh(take(%emb, reshape(%i, shape=[1]))),
    Node(%l, %r) => tanh(matmul(add(@enc(%l, %emb, %w), @enc(%r, %emb, %w)), %w)),
  }
}

def @states(%t: Tree, %emb: Tensor[(?, 4), f32], %w: Tensor[(4, 4), f32])
    -> (Tensor[(1, 4), f32], (Tensor[(1, 4), f32], Tensor[(), bool]), Tensor[(4, 4), f32]) {
  let %h = @enc(%t, %emb, %w);
  (%h, (mul(%h, %h), greater(sum(%h), 0f32)), %w)
}

def @vjp(%t: Tree, %emb: Tensor[(?, 4), f32], %w: Tensor[(4, 4), f32],
         %c: (Tensor[(1, 4), f32], (Tensor[(1, 4), f32], Tensor[(), bool]), Tensor[(4, 4), f32])) -> Tensor[(), f32] {
  let %s = @states(%t, %emb, %w);
  let %s1 = %s.1;
  let %c1 = %c.1;
  add(add(sum(mul(%s.0, %c.0)), sum(mul(%s1.0, %c1.0))), sum(mul(%s.2, %c.2)))
}
)";

EngineOptions WithGeneric(Policy policy, std::shared_ptr<RecordingSink> events = nullptr, bool generic = true) {
  return Options(policy, [&](EngineOptions& o) {
    o.generic = generic;
    o.specialize_after_calls = 0;
    o.events = std::move(events);
  });
}

bool Close(const Value& a, const Value& b) { return ValueAllClose(a, b, 1e-5, 1e-6); }

Value RandomCotangent(Rng& rng) {
  Value flag(Tensor::FromVector<bool>({}, {true}));
  return Value::Tuple({Value(RandomUniform(rng, {1, 4}, -1, 1)),
                       Value::Tuple({Value(RandomUniform(rng, {1, 4}, -1, 1)), flag}),
                       Value(RandomUniform(rng, {4, 4}, -1, 1))});
}

struct Case {
  const char* name;
  Policy policy;
  bool generic;      // the generic tier on
  const char* tier;  // the tier that must serve the calls
};

class PullbackTest : public ::testing::TestWithParam<Case> {};

// Random trees most of which no call has seen, each pullback against the
// interpreter's gradient of @vjp with the same cotangent.
TEST_P(PullbackTest, GivesTheGradientsOfTheVectorJacobianProduct) {
  Engine engine(WithGeneric(GetParam().policy, nullptr, GetParam().generic));
  engine.module().AddSource(kStates, "states.pj");
  Snapshot s = engine.module().snapshot();
  Entry states = engine.entry("states", {.wrt = std::vector<int>{1, 2}});
  Interpreter interpreter;
  Rng rng(7);
  Value emb = RandomMatrix(rng, 9, 4);
  Value w = RandomMatrix(rng, 4, 4);
  for (int shape = 0; shape < 8; ++shape) {
    SCOPED_TRACE("shape " + std::to_string(shape));
    std::vector<Value> args = {MakeTree(*s, 2 + shape % 4, shape, 9), emb, w};
    ValueAndPullback got = states.value_and_pullback(args);
    EXPECT_EQ(got.tier, GetParam().tier);
    EXPECT_TRUE(Close(got.value, interpreter.Call(*s, "states", args)));
    Value cotangent = RandomCotangent(rng);
    std::vector<Value> grads = got.pullback(cotangent);
    std::vector<Value> vjp_args = args;
    vjp_args.push_back(cotangent);
    ValueAndGrad want = interpreter.CallWithGrad(*s, "vjp", vjp_args, {1, 2});
    ASSERT_EQ(grads.size(), 2u);
    EXPECT_TRUE(Close(grads[0], want.grads[0]));
    EXPECT_TRUE(Close(grads[1], want.grads[1]));
  }
  EntryStats st = states.stats();
  const std::string tier = GetParam().tier;
  EXPECT_EQ(st.calls_generic, tier == "generic" ? 8 : 0);
  EXPECT_EQ(st.calls_interpreter, tier == "interpreter" ? 8 : 0);
  EXPECT_EQ(st.calls_native, tier == "native" ? 8 : 0);
  if (tier == "native") {  // a specialization per tree shape: 4 shapes among the 8 trees
    EXPECT_EQ(st.compiled, 4);
  } else {
    EXPECT_EQ(st.compiled, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Tiers, PullbackTest,
                         ::testing::Values(Case{"interpreter", Policy::Interpreter(), true, "interpreter"},
                                           Case{"generic_sync", Policy::Sync(), true, "generic"},
                                           Case{"generic_eager", Policy::Eager(), true, "generic"},
                                           Case{"specialized_sync", Policy::Sync(), false, "native"}),
                         [](const auto& info) { return std::string(info.param.name); });

// The forward's state is the pullback's: it answers for the program it ran,
// even after an edit made the entry another one, and may run on another
// thread or never.
TEST(Pullback, AnswersForTheProgramItsForwardRanAfterAnEdit) {
  Engine engine(WithGeneric(Policy::Sync()));
  engine.module().AddSource(kStates, "states.pj");
  Snapshot before = engine.module().snapshot();
  Entry states = engine.entry("states", {.wrt = std::vector<int>{2}});
  Rng rng(8);
  std::vector<Value> args = {MakeTree(*before, 5, 1, 9), RandomMatrix(rng, 9, 4), RandomMatrix(rng, 4, 4)};
  ValueAndPullback pending = states.value_and_pullback(args);
  states.value_and_pullback(args);  // dropped without running
  engine.module().AddSource(R"(
def @enc(%t: Tree, %emb: Tensor[(?, 4), f32], %w: Tensor[(4, 4), f32]) -> Tensor[(1, 4), f32] {
  match (%t) {
    Leaf(%i) => sigmoid(take(%emb, reshape(%i, shape=[1]))),
    Node(%l, %r) => sigmoid(matmul(add(@enc(%l, %emb, %w), @enc(%r, %emb, %w)), %w)),
  }
}
)", "edit.pj", /*replace_existing=*/true);
  Value cotangent = RandomCotangent(rng);
  std::vector<Value> grads;
  std::thread([&] { grads = pending.pullback(cotangent); }).join();
  std::vector<Value> vjp_args = args;
  vjp_args.push_back(cotangent);
  ValueAndGrad want = Interpreter().CallWithGrad(*before, "vjp", vjp_args, {2});
  EXPECT_TRUE(Close(grads.at(0), want.grads[0]));
  // The next call runs the edited program.
  ValueAndPullback after = states.value_and_pullback(args);
  EXPECT_TRUE(Close(after.value, Interpreter().Call(*engine.module().snapshot(), "states", args)));
  EXPECT_FALSE(Close(after.value, pending.value));
}

// Misuse is an error naming the entry and the place, and leaves the
// pullback usable; a pullback runs once.
TEST(Pullback, RefusesAWrongCotangentAndASecondRun) {
  for (Policy policy : {Policy::Interpreter(), Policy::Sync()}) {
    SCOPED_TRACE(policy.ToString());
    Engine engine(WithGeneric(policy));
    engine.module().AddSource(kStates, "states.pj");
    Snapshot s = engine.module().snapshot();
    Rng rng(9);
    std::vector<Value> args = {MakeTree(*s, 3, 0, 9), RandomMatrix(rng, 9, 4), RandomMatrix(rng, 4, 4)};
    EXPECT_THROW(engine.entry("states").value_and_pullback(args), std::logic_error) << "a value-mode handle";
    ValueAndPullback r = engine.entry("states", {.wrt = std::vector<int>{1}}).value_and_pullback(args);
    Value good = RandomCotangent(rng);
    Value wrong_shape = Value::Tuple({good.fields()[0], Value::Tuple({Value(RandomUniform(rng, {2, 4}, -1, 1)),
                                                                      good.fields()[1].fields()[1]}),
                                      good.fields()[2]});
    try {
      r.pullback(wrong_shape);
      ADD_FAILURE() << "a (2, 4) cotangent for a (1, 4) result";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("@states"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("result.1.0"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("Tensor[(2, 4), f32]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(r.pullback(Value::Tuple({good.fields()[0]})), std::invalid_argument) << "a tuple of one";
    EXPECT_EQ(r.pullback(good).size(), 1u);
    EXPECT_THROW(r.pullback(good), std::logic_error) << "a second run";
  }
}

// Per-minibatch code compiles straight-line residuals only: a loop the data
// ends is refused for pullbacks, with the reason, and tier 0 serves it.
TEST(Pullback, AResidualWithControlFlowIsRefusedAndTier0ServesIt) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(WithGeneric(Policy::Sync(), events, /*generic=*/false));
  engine.module().AddSource(R"(
def @halve(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] {
  if (greater(sum(%x), 1f32)) { @halve(mul(%x, 0.5f32)) } else { %x }
}
)", "loops.pj");
  Entry halve = engine.entry("halve", {.wrt = std::vector<int>{0}});
  Value x(Tensor::FromVector<float>({2}, {3.0f, 2.0f}));
  ValueAndPullback r = halve.value_and_pullback({x});
  EXPECT_EQ(r.tier, "interpreter");
  // halve(x) = x / 8 here: its pullback scales the cotangent by 1/8.
  Value ct(Tensor::FromVector<float>({2}, {8.0f, 16.0f}));
  EXPECT_TRUE(Close(r.pullback(ct)[0], Value(Tensor::FromVector<float>({2}, {1.0f, 2.0f}))));
  ASSERT_FALSE(events->Of(EventKind::kRefused, "halve").empty());
  EXPECT_NE(events->Of(EventKind::kRefused, "halve")[0].Text("reason").find("compile"), std::string::npos)
      << events->Of(EventKind::kRefused, "halve")[0].Text("reason");
}

// The log says which tier ran each half.
TEST(Pullback, TheLogSaysWhereTheForwardAndTheBackwardRan) {
  auto events = std::make_shared<RecordingSink>();
  Engine engine(WithGeneric(Policy::Sync(), events));
  engine.module().AddSource(kStates, "states.pj");
  Snapshot s = engine.module().snapshot();
  Rng rng(10);
  std::vector<Value> args = {MakeTree(*s, 4, 0, 9), RandomMatrix(rng, 9, 4), RandomMatrix(rng, 4, 4)};
  engine.entry("states", {.wrt = std::vector<int>{1, 2}}).value_and_pullback(args).pullback(RandomCotangent(rng));
  std::vector<std::string> modes;
  for (const Event& e : events->Of(EventKind::kCall, "states")) {
    EXPECT_EQ(e.Text("tier"), "generic");
    modes.push_back(e.Text("mode"));
  }
  EXPECT_EQ(modes, (std::vector<std::string>{"pullback", "backward"}));
}

}  // namespace
}  // namespace pejit
