// The tools' option checks: a bad value is refused with the option's name and
// what is wanted, in one line, before anything runs.
#include "support/cli_checks.h"

#include <gtest/gtest.h>

#include <climits>
#include <string>
#include <vector>

#include "scheduler/policy.h"
#include "scheduler/trace_sinks.h"

namespace pejit {
namespace {

// CLI11's error for `--opt value`, or "" when the value is taken.
std::string ErrorOf(const CLI::Validator& check, const std::string& value) {
  CLI::App app;
  std::string taken;
  app.add_option("--opt", taken)->check(check);
  std::vector<std::string> args = {value, "--opt"};  // parse() takes them in reverse
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return e.what();
  }
  return "";
}

TEST(CliChecks, AWholeNumberIsOneInRange) {
  const CLI::Validator batch = WholeNumber(1, 65536);
  EXPECT_EQ(ErrorOf(batch, "32"), "");
  EXPECT_EQ(ErrorOf(batch, "65536"), "");
  EXPECT_EQ(ErrorOf(batch, "2.5"), "--opt: must be a whole number from 1 to 65536, not 2.5");
  EXPECT_EQ(ErrorOf(batch, "0"), "--opt: must be a whole number from 1 to 65536, not 0");
  EXPECT_EQ(ErrorOf(batch, "1e99"), "--opt: must be a whole number from 1 to 65536, not 1e99");
  EXPECT_EQ(ErrorOf(batch, "99999999999999999999"),
            "--opt: must be a whole number from 1 to 65536, not 99999999999999999999");
  EXPECT_EQ(ErrorOf(WholeNumber(0, INT_MAX), "2147483648"),
            "--opt: must be a whole number from 0 to 2147483647, not 2147483648");
  EXPECT_EQ(ErrorOf(NonNegativeInteger(), "9223372036854775807"), "");
  EXPECT_EQ(ErrorOf(NonNegativeInteger(), "-5"), "--opt: must be a whole number >= 0, not -5");
}

TEST(CliChecks, ARealIsFinite) {
  EXPECT_EQ(ErrorOf(NonNegativeReal(), "0"), "");
  EXPECT_EQ(ErrorOf(NonNegativeReal(), "0.25"), "");
  EXPECT_EQ(ErrorOf(NonNegativeReal(), "-1"), "--opt: must be a number >= 0, not -1");
  EXPECT_EQ(ErrorOf(NonNegativeReal(), "nan"), "--opt: must be a number >= 0, not nan");
  EXPECT_EQ(ErrorOf(NonNegativeReal(), "inf"), "--opt: must be a number >= 0, not inf");
  EXPECT_EQ(ErrorOf(PositiveReal(), "0"), "--opt: must be a positive number, not 0");
}

TEST(CliChecks, TheLibrarysParserJudgesAndItsMessageNamesTheOption) {
  const CLI::Validator level = ParsedBy(&LogLevelFrom, "LEVEL");
  EXPECT_EQ(ErrorOf(level, "debug"), "");
  EXPECT_EQ(ErrorOf(level, "debgu"),
            "--opt: 'debgu' is not a log level (did you mean 'debug'?); expected off, info, debug or trace");
  const CLI::Validator policy = ParsedBy(&Policy::Parse, "POLICY");
  EXPECT_EQ(ErrorOf(policy, "hot:3"), "");
  EXPECT_NE(ErrorOf(policy, "hot:0").find("--opt: "), std::string::npos);
}

}  // namespace
}  // namespace pejit
