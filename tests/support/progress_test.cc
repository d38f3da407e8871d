// The progress bar written to a file (not a terminal): a line at every
// 1/lines of the epoch and at its end, each the whole bar.
#include <gtest/gtest.h>

#include <string>

#include "support/progress.h"

namespace pejit {
namespace {

TEST(ProgressBarTest, AFileGetsALineAtEveryQuarterAndTheEnd) {
  testing::internal::CaptureStderr();
  ProgressBar bar("epoch 2", "steps", 10, 4);
  for (size_t done = 1; done <= 10; ++done) bar.Update(done, "loss " + std::to_string(done));
  std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out,
            "  epoch 2 [####....................] 2/10 steps  loss 2\n"
            "  epoch 2 [#########...............] 4/10 steps  loss 4\n"
            "  epoch 2 [##############..........] 6/10 steps  loss 6\n"
            "  epoch 2 [###################.....] 8/10 steps  loss 8\n"
            "  epoch 2 [########################] 10/10 steps  loss 10\n");
}

TEST(ProgressBarTest, FewerStepsThanLinesPrintsEveryStep) {
  testing::internal::CaptureStderr();
  ProgressBar bar("epoch 0", "calls", 2, 10);
  bar.Update(1, "a");
  bar.Update(2, "b");
  EXPECT_EQ(testing::internal::GetCapturedStderr(),
            "  epoch 0 [############............] 1/2 calls  a\n"
            "  epoch 0 [########################] 2/2 calls  b\n");
}

}  // namespace
}  // namespace pejit
