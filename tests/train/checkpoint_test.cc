// Checkpoint files: what is saved loads back bit for bit, the save replaces
// the file atomically, and damaged files are refused with their name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train/checkpoint.h"

namespace pejit {
namespace {

std::string TempPath(const std::string& name) { return testing::TempDir() + "/" + name; }

Checkpoint Example() {
  Checkpoint c;
  c.epoch = 3;
  c.meta = {{"hidden", 8}, {"data", "listops"}};
  c.params = {Tensor::FromVector<float>({2, 2}, {1.5f, -2.0f, 3.25f, 1e-30f}), Tensor::FromVector<float>({3}, {0, 1, 2})};
  c.optimizer = {"adagrad", 12, {{0.5f, 0.25f, 0.125f, 7.0f}, {1, 2, 3}}};
  return c;
}

std::string ErrorOf(const std::string& path) {
  try {
    LoadCheckpoint(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(loaded)";
}

std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Checkpoint, RoundTripsEverything) {
  std::string path = TempPath("round.ckpt");
  Checkpoint c = Example();
  SaveCheckpoint(path, c);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  Checkpoint back = LoadCheckpoint(path);
  EXPECT_EQ(back.epoch, 3);
  EXPECT_EQ(back.meta, c.meta);
  ASSERT_EQ(back.params.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(Equal(back.params[i], c.params[i])) << i;
  EXPECT_EQ(back.optimizer.kind, "adagrad");
  EXPECT_EQ(back.optimizer.steps, 12);
  EXPECT_EQ(back.optimizer.buffers, c.optimizer.buffers);
}

TEST(Checkpoint, SavingReplacesTheFileAndAFailedSaveLeavesTheOldOne) {
  std::string path = TempPath("replace.ckpt");
  Checkpoint c = Example();
  SaveCheckpoint(path, c);
  c.epoch = 4;
  SaveCheckpoint(path, c);
  EXPECT_EQ(LoadCheckpoint(path).epoch, 4);
  // A save whose temporary file cannot be written changes nothing.
  std::filesystem::create_directory(path + ".tmp");
  std::string before = Contents(path);
  c.epoch = 5;
  try {
    SaveCheckpoint(path, c);
    ADD_FAILURE() << "saved through a directory";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ".tmp: cannot write", 0), 0u) << e.what();
  }
  std::filesystem::remove(path + ".tmp");
  EXPECT_EQ(Contents(path), before);
  EXPECT_THROW(SaveCheckpoint(TempPath("no_such_dir/x.ckpt"), c), std::runtime_error);
}

TEST(Checkpoint, DamagedFilesAreRefusedByName) {
  std::string good = TempPath("good.ckpt");
  SaveCheckpoint(good, Example());
  std::string text = Contents(good);

  std::string truncated = TempPath("truncated.ckpt");
  std::ofstream(truncated, std::ios::binary) << text.substr(0, text.size() - 4);
  EXPECT_EQ(ErrorOf(truncated), truncated + ": truncated in tensor optimizer.1");

  std::string longer = TempPath("longer.ckpt");
  std::ofstream(longer, std::ios::binary) << text << "x";
  EXPECT_EQ(ErrorOf(longer), longer + ": bytes after the last tensor");

  std::string other = TempPath("other.ckpt");
  std::ofstream(other) << "7\t[MAX 1 2 ]\n";
  EXPECT_EQ(ErrorOf(other), other + ": not a pejit checkpoint");

  std::string future = TempPath("future.ckpt");
  std::ofstream(future) << R"({"format":"pejit checkpoint","version":2})" << "\n";
  EXPECT_EQ(ErrorOf(future), future + ": checkpoint version 2, this program reads version 1");

  EXPECT_EQ(ErrorOf(TempPath("missing.ckpt")).rfind(TempPath("missing.ckpt") + ": cannot read", 0), 0u);
}

TEST(Checkpoint, RestoreParametersCopiesIntoTheStructureOrRefuses) {
  Value params = Value::Tuple({Value(Tensor::Zeros(DType::kF32, {2, 2})), Value(Tensor::Zeros(DType::kF32, {3}))});
  Checkpoint c = Example();
  RestoreParameters(params, c.params);
  EXPECT_TRUE(Equal(params.fields()[0].tensor(), c.params[0]));
  EXPECT_NE(params.fields()[0].tensor().raw_data(), c.params[0].raw_data());  // copied, not shared
  Value other = Value::Tuple({Value(Tensor::Zeros(DType::kF32, {2, 2})), Value(Tensor::Zeros(DType::kF32, {4}))});
  try {
    RestoreParameters(other, c.params);
    ADD_FAILURE() << "restored a (3,) tensor into a (4,) one";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "parameter 1 has shape (3,) in the checkpoint, (4,) in the model");
  }
  EXPECT_EQ(other.fields()[0].tensor().data<float>()[0], 0.0f);  // nothing copied
}

}  // namespace
}  // namespace pejit
