// Input files: what can be read is read, and what would be read forever (a
// device) or cannot be read (a directory) is refused by name at once.
#include "support/input_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace pejit {
namespace {

std::string ErrorOf(const std::string& path) {
  try {
    OpenInputFile(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "no error";
}

TEST(InputFile, ARegularFileIsRead) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/lines.txt";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("one\ntwo\n", f);
  std::fclose(f);
  std::ifstream in = OpenInputFile(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(line, "one");
}

TEST(InputFile, DevicesDirectoriesAndMissingFilesAreRefusedByName) {
  EXPECT_EQ(ErrorOf("/dev/zero"), "cannot read /dev/zero: it is a device, not a file");
  EXPECT_EQ(ErrorOf("/"), "cannot read /: it is a directory");
  EXPECT_EQ(ErrorOf("/no/such/file"), "cannot read /no/such/file");
}

}  // namespace
}  // namespace pejit
