// Other processes' share of the CPU, from the kernel's counters as Linux
// writes them.
#include <gtest/gtest.h>

#include <string>

#include "support/machine_load.h"

namespace pejit {
namespace {

// Two cores; this process is "(my proc) x" with utime 300, stime 100.
const std::string kStat =
    "cpu  1000 0 500 8000 100 0 0 0 0 0\ncpu0 500 0 250 4000 50 0 0 0 0 0\ncpu1 500 0 250 4000 50 0 0 0 0 0\n"
    "intr 0\n";
const std::string kSelf = "4242 (my proc) x) S 1 4242 4242 0 -1 4194304 100 0 0 0 300 100 0 0 20 0 5 0 1 2 3\n";

TEST(MachineLoad, ParsesTheMachinesAndItsOwnTicks) {
  std::optional<CpuTicks> t = ParseCpuTicks(kStat, kSelf);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->machine_busy, 1500);
  EXPECT_EQ(t->machine_total, 9600);
  EXPECT_EQ(t->self, 400);  // a process name with spaces and ')' is skipped whole
  EXPECT_FALSE(ParseCpuTicks("intr 0\n", kSelf).has_value());
  EXPECT_FALSE(ParseCpuTicks(kStat, "4242 (x) S 1").has_value());
  EXPECT_FALSE(ParseCpuTicks(kStat, "4242 (x) S 1 2 3 4 5 6 7 8 9 10 x1 12 13").has_value());  // utime not a number
}

TEST(MachineLoad, OthersAreTheMachinesBusyTicksLessThisProcesss) {
  // 200 ticks on two cores (100 per core): the machine busy 150, this process 50 of it.
  CpuTicks before{1000, 9000, 300}, after{1150, 9200, 350};
  EXPECT_DOUBLE_EQ(MachineLoad::OthersCores(before, after, 2), 1.0);  // another process held a core
  CpuTicks idle_others{1000 + 100, 9200, 300 + 100};
  EXPECT_DOUBLE_EQ(MachineLoad::OthersCores(before, idle_others, 2), 0.0);
  EXPECT_DOUBLE_EQ(MachineLoad::OthersCores(before, before, 2), 0.0);  // no time passed
}

TEST(MachineLoad, ReadsThisMachinesCountersOnLinux) {
  MachineLoad load;
  EXPECT_FALSE(load.OthersCores(std::chrono::milliseconds(0)).has_value());  // one sample: no figure yet
  std::optional<double> others = load.OthersCores(std::chrono::milliseconds(0));
  ASSERT_TRUE(others.has_value());
  EXPECT_GE(*others, 0.0);
  EXPECT_LE(*others, load.cores());
  EXPECT_GT(load.cores(), 0);
}

}  // namespace
}  // namespace pejit
