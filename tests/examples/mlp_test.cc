// The MLP example of examples/mlp: the IDX reader on files written here
// (good and corrupt). No data set needed.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "examples/mlp/fashion_mnist.h"
#include "examples/mlp/idx.h"

namespace pejit {
namespace {

using mlp::IdxArray;
using mlp::ReadIdx;

std::string Temp(const std::string& name) { return testing::TempDir() + "/" + name; }

// An IDX file's bytes: `magic`, the big-endian sizes, then `data`.
std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string out;
  auto put = [&](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift & 0xFF));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  out.append(data.begin(), data.end());
  return out;
}

void WritePlain(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// What `f` throws as std::runtime_error ("" when it returns).
template <class F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

std::vector<uint8_t> Iota(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

TEST(IdxReader, ReadsPlainAndGzipFilesAlike) {
  std::string bytes = IdxBytes(0x803, {2, 3, 4}, Iota(24));
  WritePlain(Temp("plain.idx"), bytes);
  WriteGzip(Temp("packed.idx.gz"), bytes);
  ASSERT_NE(Slurp(Temp("packed.idx.gz")), bytes);  // really compressed
  for (const std::string& path : {Temp("plain.idx"), Temp("packed.idx.gz")}) {
    IdxArray a = ReadIdx(path, 3);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4})) << path;
    EXPECT_EQ(a.data, Iota(24)) << path;
  }
  WritePlain(Temp("labels.idx"), IdxBytes(0x801, {5}, {9, 0, 3, 3, 1}));
  EXPECT_EQ(ReadIdx(Temp("labels.idx"), 1).data, (std::vector<uint8_t>{9, 0, 3, 3, 1}));
}

TEST(IdxReader, RejectsABadMagicNumberSayingWhatItFound) {
  std::string path = Temp("magic.idx");
  WritePlain(path, IdxBytes(0x801, {24}, Iota(24)));  // labels, read as images
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 3); }),
            path + ": bad magic number 0x00000801, expected 0x00000803 (1 dimensions, not 3)");
  WritePlain(path, IdxBytes(0xD03, {1, 2, 3}, Iota(24)));  // floats
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 3); }),
            path + ": bad magic number 0x00000D03, expected 0x00000803 (elements of type code 0x0D, not unsigned "
                   "bytes (0x08))");
  WritePlain(path, "P5\n28 28\n255\n" + std::string(784, '\0'));  // a PGM image
  EXPECT_TRUE(Contains(ErrorOf([&] { ReadIdx(path, 3); }), "(not an IDX file)"));
  WritePlain(path, "");
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 1); }), path + ": 0 bytes, too short for an IDX file");
}

TEST(IdxReader, RejectsTruncatedFiles) {
  std::string bytes = IdxBytes(0x803, {2, 3, 4}, Iota(24));
  std::string path = Temp("short.idx");
  WritePlain(path, bytes.substr(0, bytes.size() - 5));
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 3); }),
            path + ": truncated: the header says 2 x 3 x 4 = 24 bytes of data, the file has 19");
  WritePlain(path, bytes.substr(0, 10));
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 3); }), path + ": truncated header (10 bytes, 16 needed for 3 dimensions)");

  // A gzip stream cut short: zlib notices the missing end.
  std::string big = IdxBytes(0x803, {100, 28, 28}, Iota(78400));
  WriteGzip(Temp("whole.idx.gz"), big);
  std::string packed = Slurp(Temp("whole.idx.gz"));
  std::string cut = Temp("cut.idx.gz");
  WritePlain(cut, packed.substr(0, packed.size() / 2));
  EXPECT_TRUE(Contains(ErrorOf([&] { ReadIdx(cut, 3); }), cut + ": bad gzip data (unexpected end of file)"));
  // Only its 8-byte trailer (CRC and length) missing: still refused.
  WritePlain(cut, packed.substr(0, packed.size() - 8));
  EXPECT_TRUE(Contains(ErrorOf([&] { ReadIdx(cut, 3); }), cut + ": bad gzip data"));
}

TEST(IdxReader, RejectsTrailingBytesAndMissingFiles) {
  std::string path = Temp("long.idx");
  WritePlain(path, IdxBytes(0x801, {3}, {1, 2, 3, 4}));
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 1); }),
            path + ": trailing bytes: the header says 3 = 3 bytes of data, the file has 4");
  EXPECT_EQ(ErrorOf([&] { ReadIdx(Temp("absent.idx"), 1); }),
            Temp("absent.idx") + ": cannot open (No such file or directory)");
  WritePlain(path, IdxBytes(0x803, {0xFFFFFFFF, 0xFFFFFFFF, 1}, {}));
  EXPECT_EQ(ErrorOf([&] { ReadIdx(path, 3); }), path + ": implausible sizes 4294967295 x 4294967295...");
}

// Fashion-MNIST-shaped files: `n` images of `side`x28 pixels.
void WriteSplit(const std::string& images, const std::string& labels, int n, int side,
                const std::vector<uint8_t>& label_bytes, uint8_t pixel_step = 1) {
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * side * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * pixel_step);
  WriteGzip(images, IdxBytes(0x803, {static_cast<uint32_t>(n), static_cast<uint32_t>(side), 28}, pixels));
  WriteGzip(labels, IdxBytes(0x801, {static_cast<uint32_t>(label_bytes.size())}, label_bytes));
}

TEST(FashionMnist, ReadsASplitWithPixelsScaledToTheUnitInterval) {
  std::string images = Temp("images.gz"), labels = Temp("labels.gz");
  WriteSplit(images, labels, 3, 28, {9, 0, 4}, /*pixel_step=*/51);  // 0, 51, 102, 153, 204, 255, 50, ...
  mlp::Split s = mlp::ReadSplit(images, labels);
  ASSERT_EQ(s.images.shape(), (Shape{3, 784}));
  ASSERT_EQ(s.labels.shape(), (Shape{3}));
  const float* p = s.images.data<float>();
  EXPECT_EQ(p[0], 0.0f);
  EXPECT_FLOAT_EQ(p[1], 0.2f);
  EXPECT_EQ(p[5], 1.0f);
  EXPECT_FLOAT_EQ(p[784 + 6], static_cast<float>(static_cast<uint8_t>((784 + 6) * 51)) / 255);
  EXPECT_EQ(*std::min_element(p, p + 3 * 784), 0.0f);
  EXPECT_EQ(*std::max_element(p, p + 3 * 784), 1.0f);
  EXPECT_EQ(std::vector<int64_t>(s.labels.data<int64_t>(), s.labels.data<int64_t>() + 3),
            (std::vector<int64_t>{9, 0, 4}));
}

TEST(FashionMnist, RejectsOtherImageSizesBadLabelsAndMismatchedCounts) {
  std::string images = Temp("images.gz"), labels = Temp("labels.gz");
  WriteSplit(images, labels, 2, 27, {1, 2});
  EXPECT_EQ(ErrorOf([&] { mlp::ReadSplit(images, labels); }), images + ": images of 27x28 pixels, expected 28x28");
  WriteSplit(images, labels, 2, 28, {1, 10});
  EXPECT_EQ(ErrorOf([&] { mlp::ReadSplit(images, labels); }),
            labels + ": label 10 of example 1 is not a class (0-9)");
  WriteSplit(images, labels, 2, 28, {1, 2, 3});
  EXPECT_EQ(ErrorOf([&] { mlp::ReadSplit(images, labels); }), labels + ": 3 labels for the 2 images of " + images);
}

TEST(FashionMnist, AMissingDataSetNamesTheCommandThatInstallsIt) {
  std::string dir = Temp("no-fashion-mnist");
  std::filesystem::create_directories(dir);
  std::string message = ErrorOf([&] { mlp::LoadFashionMnist(dir); });
  EXPECT_TRUE(Contains(message, "Fashion-MNIST not found: no " + dir + "/train-images-idx3-ubyte[.gz]"));
  EXPECT_TRUE(Contains(message, "bash tools/setup.sh mlp"));
}

TEST(FashionMnist, LoadsAFolderOfPlainOrCompressedFiles) {
  std::string dir = Temp("mini-fashion-mnist");
  std::filesystem::create_directories(dir);
  WriteSplit(dir + "/train-images-idx3-ubyte.gz", dir + "/train-labels-idx1-ubyte.gz", 4, 28, {0, 1, 2, 3});
  WritePlain(dir + "/t10k-images-idx3-ubyte", IdxBytes(0x803, {2, 28, 28}, std::vector<uint8_t>(2 * 784, 255)));
  WritePlain(dir + "/t10k-labels-idx1-ubyte", IdxBytes(0x801, {2}, {7, 8}));
  mlp::FashionMnist d = mlp::LoadFashionMnist(dir);
  EXPECT_EQ(d.train.size(), 4);
  EXPECT_EQ(d.test.size(), 2);
  EXPECT_EQ(d.test.images.data<float>()[2 * 784 - 1], 1.0f);
  EXPECT_EQ(d.test.labels.data<int64_t>()[1], 8);
}

}  // namespace
}  // namespace pejit
