// An executable's image (jit/image.h): compiled code saved as bytes and
// loaded into another session links its objects instead of compiling, runs
// with the same results, shares what is already linked, and malformed bytes
// are refused with ImageError, never run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

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
