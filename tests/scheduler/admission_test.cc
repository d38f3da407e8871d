// Admission (scheduler/admission.h) queues a specialization for a signature
// the generic tier serves only when what it saves before the run's horizon
// exceeds what its job costs: a minibatch that repeats every step soon, one
// that repeats once an epoch only once the run has lasted many epochs, and
// never more admitted work than the horizon can repay. Times are arguments:
// nothing here depends on a clock.
#include "scheduler/admission.h"

#include <gtest/gtest.h>

namespace pejit {
namespace {

constexpr int64_t kMs = 1000;

// A signature seen `calls` times, one every `interval`, whose generic call took `generic`, at `alive` into the run.
Admission::Recurrence Seen(int64_t calls, int64_t interval, int64_t generic, int64_t alive) {
  return {calls, alive - (calls - 1) * interval, alive, generic, alive};
}

TEST(Admission, AMinibatchSeenOnceIsNotSpecialized) {
  Admission a;
  EXPECT_FALSE(a.Decide(Seen(1, 0, 2 * kMs, 10'000 * kMs)).admit);
}

TEST(Admission, AMinibatchThatRepeatsEveryStepIsSpecializedWithinASecond) {
  Admission a;
  // 2 ms a step; the prior job (50 ms) and ratio (0.5): saves 1 ms a call.
  EXPECT_FALSE(a.Decide(Seen(2, 2 * kMs, 2 * kMs, 60 * kMs)).admit);  // ready only after the horizon
  Admission::Decision d = a.Decide(Seen(100, 2 * kMs, 2 * kMs, 200 * kMs));
  EXPECT_TRUE(d.admit) << d.reason;
  EXPECT_EQ(d.pending, 0);
  EXPECT_NEAR(d.saving_us, 1 * kMs, 1);
  EXPECT_NEAR(d.benefit_us, 1 * kMs * (200 - 50) / 2, 1);
}

TEST(Admission, AMinibatchOfAReshuffledEpochWaitsUntilTheRunHasLastedLongEnough) {
  Admission a;
  a.JobEnded(66 * kMs, 0, false);  // a job of this entry took 66 ms
  // Epochs of 90 ms, a generic call of 1.2 ms: at epoch 1 it would save nothing in time.
  Admission::Decision early = a.Decide(Seen(2, 90 * kMs, 1200, 180 * kMs));
  EXPECT_FALSE(early.admit) << early.reason;
  EXPECT_NE(early.reason.find("<= a job's 66.0 ms"), std::string::npos) << early.reason;
  // After 200 epochs (18 s) a specialization repays its job.
  EXPECT_TRUE(a.Decide(Seen(200, 90 * kMs, 1200, 18'000 * kMs)).admit);
}

TEST(Admission, PendingJobsDelayWhenTheNextWouldBeReadyAndEndingThemFreesTheQueue) {
  Admission a;
  // Saves 1 ms a call, a call every 10 ms, 800 ms into the run: the k-th
  // job is ready after k jobs (50 ms each), and pays while it leaves more
  // than 50 calls before the horizon: 5 of them.
  a.JobEnded(50 * kMs, 0, false);  // one measured: the estimate is no longer a prior alone
  const Admission::Recurrence r = Seen(50, 10 * kMs, 2 * kMs, 800 * kMs);
  int admitted = 0;
  for (int i = 0; i < 100 && a.Decide(r).admit; ++i) ++admitted;
  EXPECT_EQ(admitted, 5);
  EXPECT_FALSE(a.Decide(r).admit);
  a.JobEnded(50 * kMs, 0, true);
  EXPECT_TRUE(a.Decide(r).admit);
  EXPECT_EQ(a.Decide(r).pending, admitted);
}

TEST(Admission, ASpecializationNoFasterThanTheGenericCodeIsNeverAdmitted) {
  Admission a;
  a.SpecializationRan(3 * kMs, 2 * kMs);  // slower than the generic call: saves nothing
  Admission::Decision d = a.Decide(Seen(1000, 2 * kMs, 2 * kMs, 100'000 * kMs));
  EXPECT_FALSE(d.admit) << d.reason;
  EXPECT_EQ(d.saving_us, 0);
}

// Before a job of the entry was measured, its cost is a prior: one job is
// admitted, and the next only once it ended.
TEST(Admission, UntilAJobWasMeasuredOneIsAdmittedAtATime) {
  Admission a;
  const Admission::Recurrence r = Seen(50, 10 * kMs, 2 * kMs, 800 * kMs);
  EXPECT_TRUE(a.Decide(r).admit);
  Admission::Decision second = a.Decide(r);
  EXPECT_FALSE(second.admit);
  EXPECT_NE(second.reason.find("first job, not measured yet, is pending"), std::string::npos) << second.reason;
  a.JobEnded(50 * kMs, 0, true);
  EXPECT_TRUE(a.Decide(r).admit);
  EXPECT_TRUE(a.Decide(r).admit) << "measured: as many as the horizon repays";
}

// A job partially evaluates and compiles the whole call: its cost is
// estimated from the operations the generic call ran, at the prior rate
// until a job of known size was measured, then at that job's rate.
TEST(Admission, AJobIsEstimatedFromTheSizeOfItsCall) {
  Admission a;
  Admission::Recurrence small = Seen(2, 400 * kMs, 20 * kMs, 1'000 * kMs), large = small;
  small.ops = 800;
  large.ops = 60'000;
  Admission::Decision d = a.Decide(large);
  EXPECT_NEAR(d.job_us, 60'000 * Admission::kPriorUsPerOp, 1);
  EXPECT_FALSE(d.admit) << d.reason;  // 600 ms of a worker for two calls of 10 ms saved
  d = a.Decide(small);
  EXPECT_NEAR(d.job_us, 800 * Admission::kPriorUsPerOp, 1);
  EXPECT_TRUE(d.admit) << d.reason;
  a.JobEnded(40 * kMs, 800, true);  // 50 us an operation
  EXPECT_NEAR(a.Decide(small).job_us, 40 * kMs, 1);
  EXPECT_NEAR(a.Decide(large).job_us, 3'000 * kMs, 1);
}

}  // namespace
}  // namespace pejit
