// An artifact's entries.pjx (runtime/artifact.h) reads back what was
// written, and an artifact whose files do not belong together is refused
// before any of its code is loaded: a model.pj edited after the export, an
// entry model.pj does not define or defines with another type, an entry
// count that is not a number (its checksum recomputed: a careless tool, not
// damage).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "runtime/artifact.h"
#include "support/hash.h"
#include "support/mac.h"

namespace pejit {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModel = "def @f(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { mul(%x, 2f32) }\n";

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

class ArtifactTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name, std::ios::binary) << text; }
  std::string Read(const std::string& name) {
    std::ifstream in(dir_ / name, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  fs::path dir_;
};

TEST_F(ArtifactTest, EntriesReadBackWhatWasWritten) {
  ExportedEntries written{Sha256Hex(kModel), {{"f", "value", "sig", "fn(Tensor[(2,), f32]) -> Tensor[(2,), f32]", "image"},
                                              {"f", "grad:0", "sig2", "t", std::string("\0\1", 2)}}};
  WriteExportedEntries((dir_ / "entries.pjx").string(), written);
  ExportedEntries read = ReadExportedEntries((dir_ / "entries.pjx").string());
  EXPECT_EQ(read.model_sha256, written.model_sha256);
  ASSERT_EQ(read.entries.size(), 2u);
  EXPECT_EQ(read.entries[1].mode, "grad:0");
  EXPECT_EQ(read.entries[1].type, "t");
  EXPECT_EQ(read.entries[1].image, std::string("\0\1", 2));
}

TEST_F(ArtifactTest, ACountThatIsNotANumberIsRefusedByName) {
  WriteExportedEntries((dir_ / "entries.pjx").string(), {Sha256Hex(kModel), {{"f", "value", "s", "t", "i"}}});
  std::string file = Read("entries.pjx");
  const size_t at = file.find("1", 16 + 8 + 64 + 8);  // the count's text, after the model's digest
  ASSERT_NE(at, std::string::npos);
  for (char c : {'x', '9'}) {  // not a number; more entries than the file holds
    file[at] = c;
    const uint64_t checksum = Fnv1a(file.data() + 16, file.size() - 16);
    std::memcpy(file.data() + 8, &checksum, 8);
    Write("entries.pjx", file);
    EXPECT_EQ(ErrorOf([&] { ReadExportedEntries((dir_ / "entries.pjx").string()); }),
              (dir_ / "entries.pjx").string() + ": the entry count is not a number of entries it could hold");
  }
}

// Before code.so is opened: nothing of an artifact that does not belong together runs.
TEST_F(ArtifactTest, AModelThatIsNotTheExportedOneIsRefused) {
  const std::string type = "fn(Tensor[(2,), f32]) -> Tensor[(2,), f32]";
  Write("model.pj", kModel);
  WriteExportedEntries((dir_ / "entries.pjx").string(), {Sha256Hex(kModel), {{"f", "value", "s", type, "i"}}});
  Write("model.pj", std::string(kModel) + "# edited\n");
  std::string error = ErrorOf([&] { Artifact artifact(dir_.string()); });
  EXPECT_NE(error.find("model.pj is not the model its code was exported from"), std::string::npos) << error;
  EXPECT_NE(error.find("export the model again"), std::string::npos) << error;

  Write("model.pj", kModel);
  WriteExportedEntries((dir_ / "entries.pjx").string(), {Sha256Hex(kModel), {{"g", "value", "s", type, "i"}}});
  error = ErrorOf([&] { Artifact artifact(dir_.string()); });
  EXPECT_NE(error.find("has code for @g, which model.pj does not define"), std::string::npos) << error;

  WriteExportedEntries((dir_ / "entries.pjx").string(),
                       {Sha256Hex(kModel), {{"f", "value", "s", "fn(Tensor[(3,), f32]) -> Tensor[(3,), f32]", "i"}}});
  error = ErrorOf([&] { Artifact artifact(dir_.string()); });
  EXPECT_EQ(error, "@f in model.pj has type " + type + "; its exported code was made for fn(Tensor[(3,), f32]) -> Tensor[(3,), f32]");
}

}  // namespace
}  // namespace pejit
