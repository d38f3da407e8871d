// Checkpoint files: what is saved loads back bit for bit, the save replaces
// the file atomically, damaged files and diverged states are refused with
// their name, and so are destinations that cannot hold a checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "support/hash.h"
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
  const std::string text = Contents(good);
  auto write = [](const std::string& name, const std::string& bytes) {
    std::string path = TempPath(name);
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  };

  std::string cut = write("cut.ckpt", text.substr(0, text.size() - 4));
  EXPECT_EQ(ErrorOf(cut), cut + ": truncated before its checksum");
  // Into the last tensor: the trailer (25 bytes) and one of its floats.
  std::string truncated = write("truncated.ckpt", text.substr(0, text.size() - 25 - 4));
  EXPECT_EQ(ErrorOf(truncated), truncated + ": truncated in tensor optimizer.1");
  std::string header_only = write("header_only.ckpt", text.substr(0, text.find('\n')));
  EXPECT_EQ(ErrorOf(header_only), header_only + ": truncated after its header");
  std::string longer = write("longer.ckpt", text + "x");
  EXPECT_NE(ErrorOf(longer).find(": the header does not describe the file"), std::string::npos) << ErrorOf(longer);

  // One flipped bit anywhere: in a value, or in the header's epoch digit.
  std::string in_value = text;
  in_value[text.find('\n') + 4] ^= 0x40;  // the top exponent bit of parameter 0's first value
  std::string flipped = write("flipped.ckpt", in_value);
  EXPECT_EQ(ErrorOf(flipped).rfind(flipped + ": checksum mismatch: the file is damaged", 0), 0u) << ErrorOf(flipped);
  std::string in_header = text;
  in_header[text.find("\"epoch\":3") + 8] ^= 0x04;  // '3' -> '7'
  std::string epoch = write("epoch_flipped.ckpt", in_header);
  EXPECT_EQ(ErrorOf(epoch).rfind(epoch + ": checksum mismatch", 0), 0u) << ErrorOf(epoch);

  std::string other = write("other.ckpt", "7\t[MAX 1 2 ]\n");
  EXPECT_EQ(ErrorOf(other), other + ": not a pejit checkpoint");
  std::string future = write("future.ckpt", R"({"format":"pejit checkpoint","version":3})" "\n");
  EXPECT_EQ(ErrorOf(future), future + ": checkpoint version 3, this program reads version 2");
  std::string old = write("old.ckpt", R"({"format":"pejit checkpoint","version":1,"epoch":1})" "\n");
  EXPECT_EQ(ErrorOf(old), old + ": checkpoint version 1, this program reads version 2");

  EXPECT_EQ(ErrorOf(TempPath("missing.ckpt")).rfind(TempPath("missing.ckpt") + ": cannot read", 0), 0u);
  // A device would be read forever.
  EXPECT_EQ(ErrorOf("/dev/zero"), "/dev/zero: cannot be read as a checkpoint: it is not a regular file (a device, pipe or socket)");
}

// Files whose checksum is right but whose values a run must not take: the
// state of a diverged run, an epoch count past what the trainer counts.
TEST(Checkpoint, WellFormedFilesWithValuesOutOfRangeAreRefused) {
  std::string good = TempPath("to_edit.ckpt");
  SaveCheckpoint(good, Example());
  const std::string text = Contents(good);
  const size_t newline = text.find('\n');
  auto reseal = [&](const std::string& name, nlohmann::json header, std::string payload) {
    std::string body = header.dump() + "\n" + payload;
    char trailer[32];
    std::snprintf(trailer, sizeof trailer, "fnv1a64 %016llx\n", static_cast<unsigned long long>(Fnv1a(body.data(), body.size())));
    std::string path = TempPath(name);
    std::ofstream(path, std::ios::binary) << body << trailer;
    return path;
  };
  const nlohmann::json header = nlohmann::json::parse(text.substr(0, newline));
  const std::string payload = text.substr(newline + 1, text.size() - newline - 1 - 25);
  ASSERT_NO_THROW(LoadCheckpoint(reseal("resealed.ckpt", header, payload)));  // the helper reseals faithfully

  nlohmann::json far = header;
  far["epoch"] = int64_t{1} << 31;
  std::string path = reseal("far.ckpt", far, payload);
  EXPECT_EQ(ErrorOf(path), path + ": epoch 2147483648 is out of range (0 to 2^31 - 1)");

  nlohmann::json steps = header;  // the next step would overflow it
  steps["optimizer"]["steps"] = std::numeric_limits<int64_t>::max();
  path = reseal("steps.ckpt", steps, payload);
  EXPECT_EQ(ErrorOf(path), path + ": optimizer step count 9223372036854775807 is out of range (0 to 2^53)");

  nlohmann::json fewer = header;  // a tensor left out of the header, its values still in the file
  fewer["tensors"].erase(fewer["tensors"].size() - 1);
  path = reseal("fewer.ckpt", fewer, payload);
  EXPECT_NE(ErrorOf(path).find(std::to_string(fewer["tensors"].size()) + " tensors take"), std::string::npos)
      << ErrorOf(path);
  EXPECT_NE(ErrorOf(path).find("the header does not describe the file"), std::string::npos) << ErrorOf(path);

  nlohmann::json below = header;  // no integer type holds it: nlohmann reads a double
  below["epoch"] = nlohmann::json::parse("-9223372036854775809");
  path = reseal("below.ckpt", below, payload);
  EXPECT_EQ(ErrorOf(path), path + ": bad checkpoint header: the epoch is -9.223372036854776e+18, out of int64's range");

  std::string nan_payload = payload;
  const float nan = std::nanf("");
  std::memcpy(nan_payload.data() + 4, &nan, sizeof nan);  // parameter 0, index 1
  path = reseal("nan.ckpt", header, nan_payload);
  EXPECT_EQ(ErrorOf(path), path + ": tensor param.0 holds nan at index 1 (the run that saved it had diverged)");
}

TEST(Checkpoint, ADivergedStateIsNotSavedAndThePreviousFileIsKept) {
  std::string path = TempPath("diverged.ckpt");
  SaveCheckpoint(path, Example());
  const std::string before = Contents(path);
  Checkpoint c = Example();
  c.params[1].data<float>()[2] = std::numeric_limits<float>::infinity();
  try {
    SaveCheckpoint(path, c);
    ADD_FAILURE() << "saved an infinite parameter";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": parameter 1 holds inf at index 2 (not saved: the previous checkpoint is kept)");
  }
  EXPECT_EQ(Contents(path), before);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Checkpoint, DestinationsThatCannotHoldACheckpointAreRefusedBeforeAnyWork) {
  const std::string dir = TempPath("destinations");
  std::filesystem::create_directories(dir);
  const std::string data = dir + "/train.tsv", target = dir + "/target.ckpt", link = dir + "/link.ckpt";
  std::ofstream(data) << "2\t[MAX 1 2 ]\n";
  std::ofstream(target) << "precious";
  std::filesystem::remove(link);
  std::filesystem::create_symlink(target, link);
  auto refusal = [](const std::string& path, const std::vector<std::string>& inputs) -> std::string {
    try {
      CheckCheckpointDestination(path, inputs);
    } catch (const std::runtime_error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(refusal(dir + "/new.ckpt", {data}), "(accepted)");
  EXPECT_FALSE(std::filesystem::exists(dir + "/new.ckpt.tmp"));  // the probe leaves nothing behind
  EXPECT_EQ(refusal(link, {}), link + ": cannot hold a checkpoint: it is a symbolic link (give the file it points to, or another name)");
  EXPECT_EQ(refusal(dir, {}), dir + ": cannot hold a checkpoint: it is a directory");
  EXPECT_EQ(refusal("/dev/null", {}), "/dev/null: cannot hold a checkpoint: it is not a regular file (a device, pipe or socket)");
  EXPECT_EQ(refusal(dir + "/./train.tsv", {data}), dir + "/./train.tsv: is " + data + ", which this run reads: a checkpoint would overwrite it");
  EXPECT_EQ(refusal(dir + "/no_such_dir/x.ckpt", {}).rfind(dir + "/no_such_dir/x.ckpt.tmp: cannot write", 0), 0u);
  // SaveCheckpoint refuses the same: the link's target is left as it was.
  EXPECT_THROW(SaveCheckpoint(link, Example()), std::runtime_error);
  EXPECT_EQ(Contents(target), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
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
