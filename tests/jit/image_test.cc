// An executable's image (jit/image.h): compiled code saved as bytes and
// loaded into another session links its objects instead of compiling, runs
// with the same results, shares what is already linked, and malformed bytes
// are refused with ImageError, never run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "jit/compiler.h"
#include "jit/image.h"
#include "jit/pipeline.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

// Fused kernels, GEMMs, a copy step (concat), constants and a view.
constexpr char kProgram[] = R"(
def @cell(%x: Tensor[(4, 6), f32], %h: Tensor[(4, 6), f32], %w: Tensor[(12, 6), f32]) -> Tensor[(4, 6), f32] {
  let %z = matmul(concat(%x, %h, axis=1), %w);
  mul(tanh(%z), sigmoid(add(%z, 0.5f32)))
}
def @loss(%x: Tensor[(4, 6), f32], %w: Tensor[(12, 6), f32]) -> Tensor[(), f32] {
  let %h1 = @cell(%x, zeros(shape=[4, 6]), %w);
  let %h2 = @cell(%x, %h1, %w);
  sum(mul(reshape(%h2, shape=[24]), tensor(f32, (24,), [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6])))
}
)";

class ImageTest : public testing::Test {
 protected:
  void SetUp() override {
    module_.AddSource(kProgram, "image.pj");
    Rng rng(3);
    args_ = {Value(RandomUniform(rng, {4, 6}, -1, 1)), Value(RandomUniform(rng, {12, 6}, -0.5f, 0.5f))};
    leaves_ = Flatten(args_, {});
    residual_ = PartialEvaluate(*module_.snapshot(), "loss", args_);
  }

  // The loss and its gradient for the weights, compiled in `session`.
  ExecutablePtr Compile(JitSession& session, CompileReport* report = nullptr) {
    PipelineOptions options;
    options.wrt_leaves = std::vector<int>{1};
    PipelineReport r;
    ExecutablePtr exe = CompileResidual(session, residual_.main, options, &r);
    if (report) *report = r.compile;
    return exe;
  }

  static void ExpectSame(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(AllClose(got[i], want[i], 0, 0)) << i;
  }

  Module module_;
  std::vector<Value> args_;
  std::vector<Tensor> leaves_;
  Residual residual_;
};

TEST_F(ImageTest, ALoadedImageRunsAsTheCompiledCodeDidInAnotherSession) {
  std::string image;
  std::vector<Tensor> want;
  {
    auto session = JitSession::Create();
    ExecutablePtr exe = Compile(*session);
    want = exe->Run(leaves_);
    image = EncodeImage(dynamic_cast<const NativeExecutable&>(*exe));
  }  // the session and its code are gone
  auto other = JitSession::Create();
  JitSession::LoadReport report;
  ExecutablePtr loaded = other->Load(image, &report);
  EXPECT_EQ(report.objects_linked, 1);
  EXPECT_STREQ(loaded->tier(), "native");
  ExpectSame(loaded->Run(leaves_), want);
  Interpreter::ValueAndGrad reference = Interpreter().CallWithGrad(*module_.snapshot(), "loss", args_, {1});
  EXPECT_TRUE(AllClose(want[0], reference.value.tensor(), 1e-5, 1e-6));
  EXPECT_TRUE(AllClose(want[1], reference.grads[0].tensor(), 1e-4, 1e-6));

  // Loaded again while the first is alive: its objects are shared, not linked twice.
  JitSession::LoadReport again;
  ExpectSame(other->Load(image, &again)->Run(leaves_), want);
  EXPECT_EQ(again.objects_linked, 0);
  // A compile in this session reuses the loaded kernels.
  CompileReport compiled;
  ExecutablePtr recompiled = Compile(*other, &compiled);
  EXPECT_EQ(compiled.reused_fused_kernels, compiled.distinct_fused_kernels);
  EXPECT_GT(compiled.distinct_fused_kernels, 0);
  ExpectSame(recompiled->Run(leaves_), want);
}

TEST_F(ImageTest, AnImageOfCodeThatSharedKernelsCarriesTheirObjects) {
  auto session = JitSession::Create();
  ExecutablePtr first = Compile(*session);
  CompileReport report;
  ExecutablePtr second = Compile(*session, &report);  // all its kernels are the first's
  EXPECT_EQ(report.reused_fused_kernels, report.distinct_fused_kernels);
  std::string image = EncodeImage(dynamic_cast<const NativeExecutable&>(*second));
  first.reset();
  second.reset();
  auto other = JitSession::Create();
  ExpectSame(other->Load(image)->Run(leaves_), Compile(*other)->Run(leaves_));
}

TEST_F(ImageTest, MalformedBytesAreRefusedNotRun) {
  auto session = JitSession::Create();
  std::string image = EncodeImage(dynamic_cast<const NativeExecutable&>(*Compile(*session)));
  auto other = JitSession::Create();
  EXPECT_THROW(other->Load("not an image"), ImageError);
  // Every proper prefix is refused (they end inside some field or count).
  for (size_t n = 0; n < image.size(); n += std::max<size_t>(1, image.size() / 997)) {
    EXPECT_THROW(DecodeImage(std::string_view(image).substr(0, n)), ImageError) << n;
  }
  EXPECT_THROW(DecodeImage(image + "x"), ImageError);
  // A count made huge: refused before anything is allocated for it.
  std::string huge = image;
  const int64_t big = int64_t{1} << 60;
  std::memcpy(huge.data() + 4, &big, sizeof big);  // the plan's buffer count
  EXPECT_THROW(DecodeImage(huge), ImageError);
}

// The image of `exe` with its plan (or kernel slots) changed by `mutate`:
// what a damaged or forged image whose indices are all in range holds.
std::string Mutated(const NativeExecutable& exe, const std::function<void(Image&)>& mutate) {
  Image image = DecodeImage(EncodeImage(exe));
  mutate(image);
  NativeExecutable forged(std::move(image.plan), std::move(image.step_kernel), std::move(image.outer), exe.kernels(),
                          exe.objects(), 0, false, false);
  return EncodeImage(forged);
}

std::string RefusalOf(const std::string& image) {
  try {
    DecodeImage(image);
  } catch (const ImageError& e) {
    return e.what();
  }
  return "";
}

// Steps whose code would read or write outside their buffers are refused
// before anything links or runs: a kernel given another buffer, a fused
// kernel run for 2^40 rows, one loading a buffer that does not broadcast to
// its output, one calling a kernel compiled for another step.
TEST_F(ImageTest, AStepOnBuffersItsCodeWasNotMadeForIsRefused) {
  auto session = JitSession::Create();
  ExecutablePtr compiled = Compile(*session);
  const auto& exe = dynamic_cast<const NativeExecutable&>(*compiled);
  const Plan& plan = exe.plan();
  int kernel_step = -1, fused = -1, other_fused = -1;
  for (int s = 0; s < static_cast<int>(plan.steps.size()); ++s) {
    const PlanStep& step = plan.steps[s];
    if (step.kind == PlanStep::Kind::kKernel && step.inputs.size() >= 2 && kernel_step < 0) kernel_step = s;
    if (step.kind == PlanStep::Kind::kFused) {
      if (fused < 0) {
        fused = s;
      } else if (other_fused < 0 && exe.step_kernel()[s] != exe.step_kernel()[fused]) {
        other_fused = s;
      }
    }
  }
  ASSERT_GE(kernel_step, 0);
  ASSERT_GE(fused, 0);
  ASSERT_GE(other_fused, 0);
  EXPECT_EQ(RefusalOf(EncodeImage(exe)), "");

  std::string why = RefusalOf(Mutated(exe, [&](Image& i) {
    std::vector<int>& in = i.plan.steps[kernel_step].inputs;
    std::swap(in[0], in[1]);  // its table read from the other operand's buffer
  }));
  EXPECT_NE(why.find("step " + std::to_string(kernel_step) + " (" + plan.steps[kernel_step].op->name + ")"), std::string::npos) << why;

  why = RefusalOf(Mutated(exe, [&](Image& i) { i.outer[fused] = int64_t{1} << 40; }));
  EXPECT_NE(why.find("step " + std::to_string(fused) + "'s kernel runs 1099511627776 rows"), std::string::npos) << why;

  why = RefusalOf(Mutated(exe, [&](Image& i) { i.step_kernel[fused] = i.step_kernel[other_fused]; }));
  EXPECT_NE(why.find("calls a kernel compiled for another computation"), std::string::npos) << why;

  why = RefusalOf(Mutated(exe, [&](Image& i) {
    for (FusedNode& n : i.plan.steps[fused].nodes) {
      if (n.kind != FusedNode::Kind::kLoad) continue;
      for (int b = 0; b < static_cast<int>(i.plan.buffers.size()); ++b) {  // a buffer of another shape, same dtype
        const TensorType& t = i.plan.buffers[b].type;
        if (t.dtype == n.dtype && t.shape != i.plan.buffers[n.buffer].type.shape && NumElements(t.shape) > 1) {
          n.buffer = b;
          return;
        }
      }
    }
  }));
  EXPECT_FALSE(why.empty());
}

// Random damage to the plan's bytes (the container's checksum or MAC fixed
// up, as a careless tool or a forger would): each image is refused, or it
// runs (with whatever results) inside its buffers. Under ASan, a step
// outside them is a finding.
TEST_F(ImageTest, RandomlyDamagedPlansAreRefusedOrRunInsideTheirBuffers) {
  auto session = JitSession::Create();
  ExecutablePtr compiled = Compile(*session);
  const auto& exe = dynamic_cast<const NativeExecutable&>(*compiled);
  const std::string image = EncodeImage(exe);
  const Image decoded = DecodeImage(image);
  const size_t kernels_at = image.find(decoded.kernels[0].symbol);  // the plan ends before the kernels' names
  ASSERT_NE(kernels_at, std::string::npos);
  std::mt19937_64 rng(11);
  int refused = 0, ran = 0;
  for (int trial = 0; trial < 700; ++trial) {
    std::string bad = image;
    const size_t at = 4 + rng() % (kernels_at - 4);
    bad[at] = static_cast<char>(rng() % 3 == 0 ? bad[at] ^ (1 << (rng() % 8)) : rng());
    Image mutated;
    try {
      mutated = DecodeImage(bad);
    } catch (const ImageError&) {
      ++refused;
      continue;
    }
    NativeExecutable run(std::move(mutated.plan), std::move(mutated.step_kernel), std::move(mutated.outer),
                         exe.kernels(), exe.objects(), 0, false, false);
    try {
      run.Run(leaves_);
      ++ran;
    } catch (const std::exception&) {  // a parameter of another type, an operator's own check
      ++refused;
    }
  }
  EXPECT_EQ(refused + ran, 700);
  EXPECT_GT(refused, 0);
}

// The image fuzz target's seed decodes and passes the checks: mutations of
// it reach every check, not only the first refusal.
TEST(ImageSeed, TheFuzzSeedIsAValidImage) {
  std::ifstream in("fuzz/corpus/image/trees_loss_grad.img", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(RefusalOf(bytes), "");
}

// Images of older formats are refused by name (their plans have no lanes,
// the first none of a parallel schedule): compiling again is the remedy.
TEST_F(ImageTest, OlderFormatsAreRefusedByName) {
  auto session = JitSession::Create();
  std::string image = EncodeImage(dynamic_cast<const NativeExecutable&>(*Compile(*session)));
  for (const auto& [magic, format] : {std::make_pair("PJIM", "format 1"), std::make_pair("PJM2", "format 2")}) {
    std::string old = image;
    std::memcpy(old.data(), magic, 4);
    try {
      DecodeImage(old);
      ADD_FAILURE() << magic << " was read";
    } catch (const ImageError& e) {
      EXPECT_NE(std::string(e.what()).find(format), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace pejit
