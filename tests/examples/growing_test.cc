// examples/growing: each change of the schedule keeps what the network
// computes (the new layers start as zero or the identity), invalidates the
// code of `loss` and `infer` and never that of `activity`, compiled code
// agrees with the interpreter after every change, the re-specialization
// after Deepen reuses everything that did not change, and the bad edits are
// refused without touching the module.
#include <gtest/gtest.h>

#include <set>

#include "examples/growing/growing.h"
#include "examples/mlp/model.h"
#include "interp/interpreter.h"
#include "scheduler/residual_executable.h"

namespace pejit {
namespace {

std::set<std::string> Invalidated(const RecordingSink& events) {
  std::set<std::string> out;
  for (const Event& e : events.Of(EventKind::kInvalidate)) out.insert(e.entry);
  return out;
}

class GrowingTest : public testing::Test {
 protected:
  GrowingTest() : engine_(MakeOptions(events_)), model_(engine_, {32, 16}, 11) {
    Rng rng(4);
    data_ = growing::SyntheticSplit(rng, 64);
    std::vector<int64_t> order(64);
    for (int64_t i = 0; i < 64; ++i) order[static_cast<size_t>(i)] = i;
    batch_ = mlp::MakeBatch(data_, order, 0, 16);
  }
  static EngineOptions MakeOptions(std::shared_ptr<RecordingSink>& events) {
    events = std::make_shared<RecordingSink>();
    EngineOptions o;
    o.workers = 1;
    o.events = events;
    return o;
  }
  std::vector<Value> LossArgs() const { return model_.LossArgs(batch_.images, batch_.labels); }
  // Compiled value and gradients, checked against the interpreter's.
  ValueAndGrad CompiledAgreesWithInterpreter() {
    std::vector<Value> args = LossArgs();
    CodeStatus status = model_.loss().wait_ready(args);
    EXPECT_TRUE(status.ready()) << status.reason;
    int64_t compiled = model_.loss().stats().calls_compiled();
    ValueAndGrad got = model_.loss().value_and_grad(args);
    EXPECT_EQ(model_.loss().stats().calls_compiled(), compiled + 1);
    ValueAndGrad want =
        Interpreter().CallWithGrad(*engine_.module().snapshot(), "loss", args, growing::GrowingModel::LossWrt());
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-4, 1e-6));
    for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_TRUE(ValueAllClose(got.grads[i], want.grads[i], 1e-4, 1e-6));
    return got;
  }
  float Loss() {
    return Interpreter().Call(*engine_.module().snapshot(), "loss", LossArgs()).tensor().data<float>()[0];
  }

  std::shared_ptr<RecordingSink> events_;
  Engine engine_;
  growing::GrowingModel model_;
  mlp::Split data_;
  mlp::Batch batch_;
};

TEST_F(GrowingTest, EachChangeKeepsTheFunctionAndInvalidatesOnlyTheEntriesThatCallTheHead) {
  CompiledAgreesWithInterpreter();
  std::vector<Value> probe = model_.ActivityArgs(batch_.images);
  ASSERT_TRUE(model_.activity().wait_ready(probe).ready());

  for (const char* change : {"grow", "deepen"}) {
    SCOPED_TRACE(change);
    float before = Loss();
    events_->Clear();
    growing::ChangeReport report = model_.Next();
    EXPECT_EQ(report.name, change);
    EXPECT_EQ(report.generation_after, report.generation_before + 2);  // add a branch, replace @head
    EXPECT_EQ(Invalidated(*events_), (std::set<std::string>{"loss"}));  // infer was never compiled here
    EXPECT_EQ(model_.activity().status(probe).state, CodeStatus::State::kReady);
    EXPECT_NEAR(Loss(), before, 1e-6);  // the new layers start as zero or the identity
    CompiledAgreesWithInterpreter();
    EXPECT_EQ(events_->Count(EventKind::kCompile, "activity"), 0);
  }

  // Deepen's head has the same kernels as Grow's: its job compiles none, and
  // replays @trunk from the PE cache.
  std::vector<Event> codegen = events_->Of(EventKind::kCodegen, "loss");
  ASSERT_EQ(codegen.size(), 1u);
  EXPECT_EQ(codegen[0].Text("reused_kernels"), codegen[0].Text("distinct_kernels"));
  std::vector<Event> pe = events_->Of(EventKind::kPe, "loss");
  ASSERT_EQ(pe.size(), 1u);
  EXPECT_EQ(pe[0].Text("reused"), "trunk");

  // Prune removes @branch1, which nothing calls: nothing is invalidated.
  events_->Clear();
  growing::ChangeReport prune = model_.Next();
  EXPECT_EQ(prune.edits, std::vector<std::string>{"remove @branch1"});
  EXPECT_EQ(events_->Count(EventKind::kInvalidate), 0);
  EXPECT_EQ(engine_.module().snapshot()->Find("branch1"), nullptr);
  EXPECT_EQ(model_.loss().status(LossArgs()).state, CodeStatus::State::kReady);
  EXPECT_THROW(model_.Next(), std::logic_error);
}

TEST_F(GrowingTest, BadEditsAreRefusedWithTheirReasonAndChangeNothing) {
  CompiledAgreesWithInterpreter();
  Snapshot before = engine_.module().snapshot();
  events_->Clear();
  std::vector<std::string> errors = model_.BadEdits();
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_NE(errors[0].find("this change breaks @"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("input 1 of add must be a tensor, got Layers"), std::string::npos) << errors[1];
  EXPECT_NE(errors[2].find("cannot remove @trunk: still called by @activity, @infer, @loss"), std::string::npos)
      << errors[2];
  EXPECT_EQ(engine_.module().snapshot(), before);
  EXPECT_EQ(events_->Count(EventKind::kEdit), 0);
  EXPECT_EQ(model_.loss().status(LossArgs()).state, CodeStatus::State::kReady);
}

}  // namespace
}  // namespace pejit
