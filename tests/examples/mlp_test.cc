// The MLP example of examples/mlp: the IDX reader on files written here
// (good and corrupt), the two entries compiled against the interpreter,
// gradients against finite differences, and training runs whose last
// minibatch is smaller than the others. No data set needed: the images are
// synthetic.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include "examples/mlp/fashion_mnist.h"
#include "examples/mlp/idx.h"
#include "examples/mlp/model.h"
#include "examples/mlp/trainer.h"
#include "interp/interpreter.h"
#include "ops/eager.h"

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

// `n` images of 10 classes told apart by a pattern each: a random prototype
// per class plus uniform noise, clamped to [0, 1].
mlp::Split Synthetic(Rng& rng, int64_t n, uint64_t prototype_seed = 99) {
  Rng proto_rng(prototype_seed);
  Tensor prototypes = RandomUniform(proto_rng, {mlp::kClasses, mlp::kPixels}, 0, 1);
  mlp::Split s{Tensor::Empty(DType::kF32, {n, mlp::kPixels}), RandomInt(rng, {n}, 0, mlp::kClasses)};
  for (int64_t i = 0; i < n; ++i) {
    const float* proto = prototypes.data<float>() + s.labels.data<int64_t>()[i] * mlp::kPixels;
    float* x = s.images.data<float>() + i * mlp::kPixels;
    for (int j = 0; j < mlp::kPixels; ++j) {
      x[j] = std::clamp(proto[j] + static_cast<float>(rng.NextUniform() - 0.5), 0.0f, 1.0f);
    }
  }
  return s;
}

std::vector<int64_t> Range(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

void ExpectClose(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double a = actual.ElementAsDouble(i), e = expected.ElementAsDouble(i);
    ASSERT_NEAR(a, e, 1e-4 * std::max(1.0, std::abs(e))) << what << " element " << i;
  }
}

EngineOptions SyncOptions() {
  EngineOptions o;
  o.workers = 1;
  o.policy = Policy::Sync();
  return o;
}

class MlpModel : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(mlp::ModelSource(), "mlp.pj"); }
  Module module_;
  Interpreter interp_;
};

// Both entries, and the `forward` they share, as native code against the
// interpreter: a full minibatch and a smaller one, each its own signature.
TEST_F(MlpModel, BothEntriesCompiledAgreeWithTheInterpreter) {
  Engine engine(SyncOptions());
  engine.module().AddSource(mlp::ModelSource(), "mlp.pj");
  Entry loss = engine.entry("loss"), infer = engine.entry("infer"), forward = engine.entry("forward");
  Rng rng(5);
  Value params = mlp::InitParams(rng);
  mlp::Split data = Synthetic(rng, 40);
  Snapshot s = module_.snapshot();
  for (size_t batch : {16, 5}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    mlp::Batch b = mlp::MakeBatch(data, Range(data.size()), 3, batch);
    std::vector<Value> loss_args = {b.images, b.labels, params}, infer_args = {b.images, params};

    ValueAndGrad compiled = loss.with_grad({2}).value_and_grad(loss_args);
    ValueAndGrad reference = interp_.CallWithGrad(*s, "loss", loss_args, {2});
    EXPECT_EQ(loss.with_grad({2}).status(loss_args).tier, "native");
    ExpectClose(compiled.value.tensor(), reference.value.tensor(), "loss");
    ASSERT_EQ(compiled.grads[0].fields().size(), 4u);
    for (size_t k = 0; k < 4; ++k) {
      ExpectClose(compiled.grads[0].fields()[k].tensor(), reference.grads[0].fields()[k].tensor(),
                  "gradient of parameter " + std::to_string(k));
    }

    Value logits = forward.call(infer_args);
    EXPECT_EQ(forward.status(infer_args).tier, "native");
    ExpectClose(logits.tensor(), interp_.Call(*s, "forward", infer_args).tensor(), "forward");

    Value classes = infer.call(infer_args);
    EXPECT_EQ(infer.status(infer_args).tier, "native");
    EXPECT_TRUE(ValueEqual(classes, interp_.Call(*s, "infer", infer_args)));
    EXPECT_EQ(classes.tensor().shape(), (Shape{static_cast<int64_t>(batch)}));
  }
  EXPECT_EQ(loss.stats().calls_native, 2);
  EXPECT_EQ(infer.stats().calls_native, 2);
  EXPECT_EQ(infer.stats().calls_interpreter, 0);
}

// The f32 model's gradients against central differences of the same model
// in f64 (its text with f32 replaced by f64), on a sample of each parameter.
TEST_F(MlpModel, GradientsMatchFiniteDifferences) {
  Module m64;
  m64.AddSource(std::regex_replace(std::string(mlp::ModelSource()), std::regex("f32"), "f64"), "mlp64.pj");
  Snapshot s32 = module_.snapshot(), s64 = m64.snapshot();
  Rng rng(8);
  Value params = mlp::InitParams(rng);
  // Biases away from zero, so that their gradients are not trivially zero.
  for (int k : {1, 3}) {
    Tensor bias = params.fields()[k].tensor();
    for (int64_t i = 0; i < bias.numel(); ++i) bias.data<float>()[i] = static_cast<float>(rng.NextUniform() - 0.5);
  }
  mlp::Split data = Synthetic(rng, 6);
  mlp::Batch b = mlp::MakeBatch(data, Range(6), 0, 6);
  auto vg = interp_.CallWithGrad(*s32, "loss", {b.images, b.labels, params}, {2});

  std::vector<Value> p64;
  for (const Value& t : params.fields()) p64.emplace_back(CallOp("cast", {t.tensor()}, {{"dtype", DType::kF64}}));
  Value x64(CallOp("cast", {b.images.tensor()}, {{"dtype", DType::kF64}}));
  auto loss64 = [&] { return interp_.Call(*s64, "loss", {x64, b.labels, Value::Tuple(p64)}).tensor().item(); };
  const double h = 1e-6;
  for (size_t k = 0; k < p64.size(); ++k) {
    Tensor param = p64[k].tensor();
    const Tensor& grad = vg.grads[0].fields()[k].tensor();
    double largest = 0;
    for (int sample = 0; sample < 40; ++sample) {
      int64_t i = rng.NextInt(0, param.numel());
      double* x = param.data<double>() + i;
      double saved = *x;
      *x = saved + h;
      double up = loss64();
      *x = saved - h;
      double down = loss64();
      *x = saved;
      double numeric = (up - down) / (2 * h);
      largest = std::max(largest, std::abs(numeric));
      EXPECT_NEAR(grad.data<float>()[i], numeric, 1e-4 + 1e-3 * std::abs(numeric))
          << "parameter " << k << " element " << i;
    }
    EXPECT_GT(largest, 1e-4) << "parameter " << k << ": no sampled gradient is away from zero";
  }
}

mlp::RunOptions SmallRun() {
  mlp::RunOptions o;
  o.batch = 16;
  o.optimizer.kind = "sgd";
  o.optimizer.learning_rate = 0.1;
  o.seed = 3;
  return o;
}

// 100 training images in minibatches of 16 end with one of 4, and 30 test
// images with one of 14: under `sync` every call of both entries runs native
// code, the odd ones included, and the run matches the interpreter's step by
// step.
TEST(MlpTrainer, AnOddLastMinibatchIsCompiledAndAgreesWithTheInterpreter) {
  Rng rng(21);
  mlp::Split train = Synthetic(rng, 100), test = Synthetic(rng, 30);
  EngineOptions interpreter_only;
  interpreter_only.policy = Policy::Interpreter();
  mlp::Trainer compiled(SmallRun(), train, test, SyncOptions());
  mlp::Trainer reference(SmallRun(), train, test, interpreter_only);
  ASSERT_EQ(compiled.steps_per_epoch(), 7u);

  for (int epoch = 0; epoch < 2; ++epoch) {
    SCOPED_TRACE("epoch " + std::to_string(epoch));
    mlp::EpochResult c = compiled.TrainEpoch(), r = reference.TrainEpoch();
    EXPECT_EQ(c.images, 100);
    EXPECT_EQ(c.tiers.native, 7);
    EXPECT_EQ(c.tiers.interpreter, 0);
    EXPECT_EQ(r.tiers.interpreter, 7);
    ASSERT_EQ(c.losses.size(), r.losses.size());
    for (size_t i = 0; i < c.losses.size(); ++i) {
      EXPECT_NEAR(c.losses[i], r.losses[i], 1e-4 * std::max(1.0, std::abs(r.losses[i]))) << "step " << i;
    }
    mlp::EvalResult ce = compiled.Evaluate(), re = reference.Evaluate();
    EXPECT_EQ(ce.images, 30);
    EXPECT_EQ(ce.tiers.native, 2);
    EXPECT_EQ(ce.accuracy, re.accuracy);
  }
  for (size_t k = 0; k < 4; ++k) {
    ExpectClose(compiled.params().fields()[k].tensor(), reference.params().fields()[k].tensor(),
                "parameter " + std::to_string(k) + " after two epochs");
  }
  // The two loss signatures (16 and 4 images) and the two of infer (16, 14).
  EXPECT_EQ(compiled.loss().stats().compiled, 2);
  EXPECT_EQ(compiled.infer().stats().compiled, 2);
}

// Under `eager` the odd minibatch's signature and inference's are
// prefetched at the first step: by the second epoch every call finds code
// ready.
TEST(MlpTrainer, EagerPrefetchesTheOtherSignaturesOfTheRun) {
  Rng rng(4);
  mlp::Split train = Synthetic(rng, 50), test = Synthetic(rng, 20);
  EngineOptions eager;
  eager.workers = 1;
  eager.policy = Policy::Eager();
  mlp::Trainer trainer(SmallRun(), train, test, eager);
  trainer.TrainEpoch();
  EXPECT_EQ(trainer.loss().stats().prefetched, 1);   // 2 images
  EXPECT_EQ(trainer.infer().stats().prefetched, 2);  // 16 and 4 images
  const Value& p = trainer.params();
  for (int64_t n : {16, 2}) {
    mlp::Batch b = mlp::MakeBatch(train, Range(50), 0, static_cast<size_t>(n));
    EXPECT_TRUE(trainer.loss().wait_ready({b.images, b.labels, p}).ready()) << n << " images";
  }
  for (int64_t n : {16, 4}) {
    EXPECT_TRUE(trainer.infer().wait_ready({mlp::MakeBatch(test, Range(20), 0, static_cast<size_t>(n)).images, p})
                    .ready()) << n << " images";
  }
  EXPECT_EQ(trainer.TrainEpoch().tiers.native, 4);
  EXPECT_EQ(trainer.Evaluate().tiers.native, 2);
}

// Training does learn: two epochs of SGD separate the synthetic classes.
TEST(MlpTrainer, LearnsToTellSyntheticClassesApart) {
  Rng rng(6);
  mlp::Split train = Synthetic(rng, 400), test = Synthetic(rng, 100);
  EngineOptions interpreter_only;
  interpreter_only.policy = Policy::Interpreter();
  mlp::Trainer trainer(SmallRun(), train, test, interpreter_only);
  double before = trainer.Evaluate().accuracy;
  mlp::EpochResult first = trainer.TrainEpoch(), second = trainer.TrainEpoch();
  EXPECT_LT(second.loss, first.loss);
  EXPECT_LT(before, 0.3);
  EXPECT_GT(trainer.Evaluate().accuracy, 0.9);
}

TEST(MlpTrainer, RefusesAnEmptySplitOrABatchOfNothing) {
  mlp::RunOptions zero = SmallRun();
  zero.batch = 0;
  Rng rng(1);
  mlp::Split some = Synthetic(rng, 4);
  EXPECT_THROW(mlp::Trainer(zero, some, some), std::invalid_argument);
  EXPECT_THROW(mlp::Trainer(SmallRun(), mlp::Split{}, some), std::invalid_argument);
}

}  // namespace
}  // namespace pejit
