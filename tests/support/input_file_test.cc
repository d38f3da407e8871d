// Input files: what can be read is read, and what would be read forever (a
// device) or waited on forever (a FIFO) or cannot be read (a directory) is
// refused by name at once.
#include "support/input_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <streambuf>
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
  // A FIFO no one writes to: refused at once, not waited on.
  const std::string fifo = std::string(std::getenv("TEST_TMPDIR")) + "/fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ErrorOf(fifo), "cannot read " + fifo + ": it is a FIFO, not a file (write what it gives to a file first)");
  EXPECT_EQ(ErrorOf("/"), "cannot read /: it is a directory");
  EXPECT_EQ(ErrorOf("/no/such/file"), "cannot read /no/such/file: No such file or directory");
}

// An input with no newline in sight: what is kept is bounded, and a reader
// that stops at a long line has read only as far as the bound.
class Endless : public std::streambuf {
 public:
  int read = 0;

 protected:
  int_type underflow() override { return 'x'; }
  int_type uflow() override {
    ++read;
    return 'x';
  }
};

TEST(InputFile, ALineIsReadUpToABoundAndTheCallerChoosesToStopOrSkip) {
  std::istringstream lines("short\r\nlonger than eight\nlast");
  std::string line;
  bool too_long = true;
  ASSERT_TRUE(ReadLine(lines, line, too_long, 8, /*skip_long_lines=*/true));
  EXPECT_EQ(line, "short");
  EXPECT_FALSE(too_long);
  ASSERT_TRUE(ReadLine(lines, line, too_long, 8, true));
  EXPECT_TRUE(too_long);
  EXPECT_EQ(line, "");
  ASSERT_TRUE(ReadLine(lines, line, too_long, 8, true));  // skipped to the next line
  EXPECT_EQ(line, "last");
  EXPECT_FALSE(ReadLine(lines, line, too_long, 8, true));

  Endless endless;
  std::istream pipe(&endless);
  ASSERT_TRUE(ReadLine(pipe, line, too_long, 1000, /*skip_long_lines=*/false));
  EXPECT_TRUE(too_long);
  EXPECT_EQ(endless.read, 1001);
}

}  // namespace
}  // namespace pejit
