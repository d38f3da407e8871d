// The JIT: compiled residual programs give the interpreter's answers; fusion,
// memory planning, vectorization and code release do what they promise.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <thread>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ir/printer.h"
#include "ir/visitor.h"
#include "jit/compiler.h"
#include "jit/image.h"
#include "jit/native_executable.h"
#include "jit/plan.h"
#include "jit/simplify.h"
#include "ops/packed_gemm.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

// `line` appears in the printed plan of `r`.
void ExpectPlanHas(const CompileReport& r, const std::string& line) {
  EXPECT_NE(r.plan.find(line), std::string::npos) << "no \"" << line << "\" in\n" << r.plan;
}

// Calls of operator `op` in `f`.
int CountCalls(const Func& f, const std::string& op) {
  int n = 0;
  PostOrderVisit(f->body, [&](const Expr& e) {
    if (auto* call = As<OpCallNode>(e); call && call->op->name == op) ++n;
  });
  return n;
}

class CompilerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() { session_ = JitSession::Create().release(); }
  static void TearDownTestSuite() { delete session_; }

  Snapshot Load(const std::string& text) {
    module_.AddSource(text, "t.pj");
    return module_.snapshot();
  }

  // Compiles the residual of `entry` on `args` and checks it against the interpreter.
  CompileReport CheckCompiled(const Snapshot& s, const std::string& entry, const std::vector<Value>& args,
                              CompileOptions options = {}) {
    options.keep_plan = true;  // for the messages
    Residual r = PartialEvaluate(*s, entry, args);
    CompileReport report;
    ExecutablePtr exe = session_->Compile(r.main, options, &report);
    std::vector<Tensor> got = exe->Run(Flatten(args));
    std::vector<Tensor> want = Flatten({interp_.Call(*s, entry, args)});
    EXPECT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      EXPECT_TRUE(AllClose(got[i], want[i], 1e-4, 1e-6))
          << "result " << i << ": compiled " << got[i].ToString() << " vs interpreted " << want[i].ToString()
          << "\n" << report.plan;
    }
    return report;
  }

  static JitSession* session_;
  Module module_;
  Interpreter interp_;
};
JitSession* CompilerTest::session_ = nullptr;

TEST_F(CompilerTest, ElementwiseBroadcastingAndReductionsMatchTheInterpreter) {
  Snapshot s = Load(R"(
def @f(%x: Tensor[(4, 5), f32], %b: Tensor[(5,), f32], %k: Tensor[(), f32]) {
  let %y = sigmoid(add(mul(%x, %k), %b));
  let %z = where(greater(%y, 0.5), tanh(%y), neg(exp(%y)));
  (sum(%z, axes=[1]), relu(sub(%z, %b)), pow(%y, exponent=3.0))
})");
  Rng rng(1);
  CompileReport r = CheckCompiled(s, "f", {Value(RandomUniform(rng, {4, 5}, -2, 2)), Value(RandomUniform(rng, {5}, -1, 1)),
                                            Value(Tensor::Scalar(0.7f))});
  EXPECT_GE(r.fused_kernels, 2);
}

// Operators run by their kernels in compiled code, with a dynamic key for
// dropout: the compiled mask is the interpreter's.
TEST_F(CompilerTest, LayerNormDropoutFloorDivisionAndCreationMatchTheInterpreter) {
  Snapshot s = Load(R"(
def @f(%x: Tensor[(3, 6), f32], %g: Tensor[(6,), f32], %b: Tensor[(6,), f32], %key: Tensor[(), i64],
       %n: Tensor[(4,), i64]) {
  let %h = dropout(layer_norm(%x, %g, %b), %key, rate=0.4);
  let %m = mod(%n, 3);
  (add(%h, ones(shape=[3, 6])), floor_div(%n, -3), %m, add(zeros(shape=[4], dtype=i64), sum(shape_of(%h))), mod(%x, 0.75f32))
})");
  Rng rng(3);
  CheckCompiled(s, "f", {Value(RandomUniform(rng, {3, 6}, -2, 2)), Value(RandomUniform(rng, {6}, 0.5, 1.5)),
                         Value(RandomUniform(rng, {6}, -1, 1)), Value(Tensor::FromVector<int64_t>({}, {42})),
                         Value(Tensor::FromVector<int64_t>({4}, {-7, -1, 5, 9}))});
}

TEST_F(CompilerTest, TreeLstmLossOnListOpsMinibatches) {
  Snapshot s = Load(std::string(treelstm::ModelSource()));
  constexpr int kTrees = 8;
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(5, kTrees, *s);
  Rng rng(2);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 16, 12, 10});
  CompileReport r = CheckCompiled(s, "loss", {b.trees, b.labels, params});
  CheckCompiled(s, "infer", {b.trees, params});
  // Fused kernels: two per cell (its gates, then its state; see
  // ATreeLstmCellFusesIntoTwoKernels), one per child for its forget gate
  // times its memory, and a few per tree for the classifier and the loss
  // (measured: 449 for 139 nodes in 8 trees, 2 * 139 + 131 + 5 * 8).
  constexpr int kPerTree = 6;
  int children = b.nodes - kTrees;
  EXPECT_LE(r.fused_kernels, 2 * b.nodes + children + kPerTree * kTrees) << r.plan;
  EXPECT_LT(r.arena_bytes, r.buffer_bytes);
}

TEST_F(CompilerTest, ATreeLstmCellFusesIntoTwoKernels) {
  Snapshot s = Load(R"(
def @cell(%iou: Tensor[(1, 12), f32], %fc: Tensor[(1, 4), f32]) {
  let %g = chunk(%iou, chunks=3, axis=1);
  let %c = add(mul(sigmoid(%g.0), tanh(%g.2)), %fc);
  (mul(sigmoid(%g.1), tanh(%c)), %c)
})");
  Rng rng(3);
  CompileReport r = CheckCompiled(s, "cell", {Value(RandomUniform(rng, {1, 12}, -1, 1)), Value(RandomUniform(rng, {1, 4}, -1, 1))});
  EXPECT_EQ(r.fused_kernels, 2) << r.plan;
  EXPECT_EQ(r.kernels, 3) << r.plan;  // chunk, then the two fused kernels
}

// A vector-Jacobian product's seed is ones broadcast to the rows' shape:
// folding leaves such an expanding constant to the kernels that read it (a
// scalar, not a tensor of code-owned bytes as large as the rows), and a
// product with ones is the other factor itself.
TEST_F(CompilerTest, FoldingExpandsNoConstantAndMultipliesByNoOnes) {
  Snapshot s = Load(R"(
def @f(%x: Tensor[(64, 128), f32]) -> (Tensor[(64, 128), f32], Tensor[(64, 128), f32]) {
  let %one: Tensor[(1, 1), f32] = reshape(1f32, shape=[1, 1]);
  let %ones: Tensor[(64, 128), f32] = broadcast_to(%one, shape=[64, 128]);
  let %twos: Tensor[(64, 128), f32] = broadcast_to(2f32, shape=[64, 128]);
  let %a: Tensor[(64, 128), f32] = mul(%ones, %x);
  let %b: Tensor[(64, 128), f32] = add(%x, %twos);
  (%a, %b)
}
)");
  Func folded = FoldConstants(s->Get("f").func);
  EXPECT_EQ(CountCalls(folded, "mul"), 0) << PrintFunction("f", folded);
  PostOrderVisit(folded->body, [&](const Expr& e) {
    if (auto* c = As<ConstantNode>(e)) {
      EXPECT_LE(c->value.numel(), 64) << PrintFunction("f", folded);
    }
  });
  std::vector<float> x(64 * 128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) - 8.0f;
  x[5] = -0.0f;
  Tensor input = Tensor::FromVector<float>({64, 128}, x);
  CompileReport report;
  ExecutablePtr exe = session_->Compile(s->Get("f").func, {}, &report);
  EXPECT_LT(report.code_bytes, 64 * 128 * 4) << "a constant as large as the rows";
  std::vector<Tensor> got = exe->Run(std::vector<Tensor>{input});
  std::vector<Tensor> want = Flatten({interp_.Call(*s, "f", {Value(input)})});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(Equal(got[0], want[0]));  // x itself, -0 included
  EXPECT_TRUE(Equal(got[1], want[1]));
}

// A store kept in memory, as the engine's persistent cache keeps images on
// disk: code kept as its image, loaded by linking it again.
class ImageStore final : public CodeStore {
 public:
  explicit ImageStore(JitSession& session) : session_(session) {}
  ExecutablePtr Load(const std::string& key, const CompileOptions&) override {
    ++asked;
    auto it = images.find(key);
    return it == images.end() ? nullptr : session_.Load(it->second);
  }
  void Keep(const std::string& key, const Executable& exec, const CompileOptions&) override {
    images[key] = EncodeImage(dynamic_cast<const NativeExecutable&>(exec));
  }
  std::map<std::string, std::string> images;
  int asked = 0;

 private:
  JitSession& session_;
};

// A program compiled with a CodeStore in its options is looked for there
// first and kept there after (every path that compiles persists: the store
// is under Compile, not beside its callers). The key is the program: the
// same text with other constants (which the printer abbreviates) is another.
TEST_F(CompilerTest, ACodeStoreIsAskedFirstAndKeepsWhatWasCompiledByProgram) {
  auto program = [](float fill) {
    Var x = MakeVar("x", TensorTy(DType::kF32, {64}));
    Var y = MakeVar("y", TensorTy(DType::kF32, {64}));
    std::vector<float> c(64);
    for (size_t i = 0; i < c.size(); ++i) c[i] = fill * static_cast<float>(i);
    return MakeFunc({x}, MakeLet(y, MakeOpCall("add", {x, MakeConstant(Tensor::FromVector<float>({64}, c))}), y));
  };
  auto store = std::make_shared<ImageStore>(*session_);
  CompileOptions options;
  options.store = store;
  const Tensor x = Tensor::FromVector<float>({64}, std::vector<float>(64, 1.0f));
  ExecutablePtr first = session_->Compile(program(0.5f), options);
  EXPECT_EQ(store->asked, 1);
  ASSERT_EQ(store->images.size(), 1u);
  ExecutablePtr again = session_->Compile(program(0.5f), options);  // linked from the store
  EXPECT_EQ(store->asked, 2);
  EXPECT_EQ(store->images.size(), 1u);
  EXPECT_TRUE(Equal(again->Run(std::vector<Tensor>{x})[0], first->Run(std::vector<Tensor>{x})[0]));
  ExecutablePtr other = session_->Compile(program(2.0f), options);
  EXPECT_EQ(store->images.size(), 2u) << "other constants, another program";
  EXPECT_FLOAT_EQ(other->Run(std::vector<Tensor>{x})[0].data<float>()[3], 7.0f);
  options.optimize_machine_code = true;
  session_->Compile(program(0.5f), options);
  EXPECT_EQ(store->images.size(), 3u) << "another code generator, another key";
}

TEST_F(CompilerTest, PoisoningDeadBuffersChangesNothing) {
  Snapshot s = Load(std::string(treelstm::ModelSource()));
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(9, 5, *s);
  Rng rng(4);
  CompileOptions poison;
  poison.poison_dead_buffers = true;
  CheckCompiled(s, "loss", {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, 8, 6, 10})},
                poison);
}

TEST_F(CompilerTest, ElementwiseLoopsAreVectorized) {
  Snapshot s = Load("def @f(%x: Tensor[(1024,), f32], %y: Tensor[(1024,), f32]) { add(mul(%x, %y), %y) }");
  Rng rng(5);
  CompileOptions keep;
  keep.keep_ir = true;
  CompileReport r = CheckCompiled(s, "f", {Value(RandomUniform(rng, {1024}, -1, 1)), Value(RandomUniform(rng, {1024}, -1, 1))},
                                  keep);
  EXPECT_NE(r.llvm_ir.find(" x float>"), std::string::npos) << r.llvm_ir;
}

// opt_level 1, the loop pipeline a variant's quick code gets: its loops
// still vectorize, and with no fast-math flags no pass may reorder float
// arithmetic, so the Tree-LSTM's loss and gradients come out in the same
// bits as at LLVM's O3.
TEST_F(CompilerTest, TheLoopPipelineVectorizesAndGivesO3sBits) {
  Snapshot s = Load(std::string(treelstm::ModelSource()));
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(11, 6, *s);
  Rng rng(6);
  std::vector<Value> args = {b.trees, b.labels, treelstm::InitParams(rng, {listops::kVocabularySize, 16, 12, 10})};
  CompileOptions loop;
  loop.opt_level = 1;
  loop.keep_ir = true;
  CompileReport r = CheckCompiled(s, "loss", args, loop);
  EXPECT_NE(r.llvm_ir.find(" x float>"), std::string::npos) << "no vector code at opt_level 1";
  Residual residual = PartialEvaluate(*s, "loss", args);
  std::vector<Tensor> got = session_->Compile(residual.main, loop)->Run(Flatten(args));
  std::vector<Tensor> want = session_->Compile(residual.main, CompileOptions{})->Run(Flatten(args));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(Equal(got[i], want[i])) << "result " << i;
}

// A thread's first compile sets LLVM up for it; WarmUp does so ahead, once.
TEST_F(CompilerTest, WarmUpSetsUpAThreadThatNeverCompiledAndOnlyThat) {
  bool first = false, second = true;
  std::thread fresh([&] {
    first = session_->WarmUp();
    second = session_->WarmUp();
  });
  fresh.join();
  EXPECT_TRUE(first) << "a thread that never compiled";
  EXPECT_FALSE(second) << "a thread whose share of LLVM is set up";
}

// exp, tanh and sigmoid of f32 are inline arithmetic in compiled code (so
// that loops of them vectorize), not libm: within a few units in the last
// place of the correctly rounded result over the whole range, with libm's
// answers at the edges (infinities, NaN, signed zero, overflow, underflow).
TEST_F(CompilerTest, CompiledExpTanhAndSigmoidAreAccurateToAFewUlp) {
  std::vector<float> xs = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, -1e-8f, 0.6249f, -0.6249f, 0.625f, -0.625f,
                           88.3f, 88.37f, -87.3f, -87.33f, -87.34f, -88.5f, -103.0f, 89.0f, 200.0f, -200.0f,
                           std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  for (int i = -200000; i <= 200000; ++i) xs.push_back(static_cast<float>(i) * 5e-4f);  // [-100, 100]
  for (int i = -1000; i <= 1000; ++i) xs.push_back(std::ldexp(1.0f, i / 40) * (i < 0 ? -1.0f : 1.0f));
  const int n = static_cast<int>(xs.size());
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  Snapshot s = Load("def @f(%x: Tensor[(" + std::to_string(xs.size()) +
                    ",), f32]) { (exp(%x), tanh(%x), sigmoid(%x)) }");
  std::vector<Tensor> input = {Tensor::FromVector<float>({static_cast<int64_t>(xs.size())}, xs)};
  Residual r = PartialEvaluate(*s, "f", {Value(input[0])});
  CompileOptions keep;
  keep.keep_ir = true;
  CompileReport report;
  ExecutablePtr exe = session_->Compile(r.main, keep, &report);
  EXPECT_EQ(report.llvm_ir.find("call float @tanhf"), std::string::npos) << "tanh still calls libm";
  EXPECT_EQ(report.llvm_ir.find("expf"), std::string::npos) << "exp still calls libm";
  std::vector<Tensor> got = exe->Run(input);
  ASSERT_EQ(got.size(), 3u);

  // Error in units in the last place of the double-precision reference
  // rounded to f32; below the smallest normal f32, in absolute terms.
  auto ulps = [](float g, double want) {
    float w = static_cast<float>(want);
    if (std::isinf(w) || std::isinf(g)) return g == w ? 0.0 : 1e9;
    if (std::abs(w) < std::numeric_limits<float>::min()) {
      return std::abs(g - want) <= std::numeric_limits<float>::min() ? 0.0 : 1e9;
    }
    double ulp = std::nextafter(std::abs(w), std::numeric_limits<float>::infinity()) - std::abs(w);
    return std::abs(static_cast<double>(g) - want) / ulp;
  };
  struct Function {
    const char* name;
    std::function<double(double)> reference;
    double max_ulps;
  };
  std::vector<Function> functions = {
      {"exp", [](double x) { return std::exp(x); }, 2},
      {"tanh", [](double x) { return std::tanh(x); }, 3},
      {"sigmoid", [](double x) { return 1 / (1 + std::exp(-x)); }, 3},
  };
  for (size_t f = 0; f < functions.size(); ++f) {
    const float* y = got[f].data<float>();
    double worst = 0;
    float worst_x = 0;
    for (int i = 0; i < n; ++i) {
      double e = ulps(y[i], functions[f].reference(xs[i]));
      if (e > worst) worst = e, worst_x = xs[i];
    }
    EXPECT_LE(worst, functions[f].max_ulps) << functions[f].name << " at x = " << worst_x;
    EXPECT_TRUE(std::isnan(y[n])) << functions[f].name << "(NaN) = " << y[n];
  }
  const int negative_zero = 1, infinity = 20, negative_infinity = 21;  // positions in xs
  EXPECT_TRUE(std::signbit(got[1].data<float>()[negative_zero])) << "tanh(-0) is -0";
  EXPECT_EQ(got[0].data<float>()[infinity], std::numeric_limits<float>::infinity()) << "exp(inf)";
  EXPECT_EQ(got[0].data<float>()[negative_infinity], 0.0f) << "exp(-inf)";
  EXPECT_EQ(got[1].data<float>()[infinity], 1.0f) << "tanh(inf)";
  EXPECT_EQ(got[1].data<float>()[negative_infinity], -1.0f) << "tanh(-inf)";
  EXPECT_EQ(got[2].data<float>()[infinity], 1.0f) << "sigmoid(inf)";
  EXPECT_EQ(got[2].data<float>()[negative_infinity], 0.0f) << "sigmoid(-inf)";
}

TEST_F(CompilerTest, ProfilingTimesStepsAndCountsGemmFlops) {
  Snapshot s = Load(R"(
def @f(%x: Tensor[(4, 5), f32], %w: Tensor[(3, 5), f32], %b: Tensor[(3,), f32]) {
  tanh(add(matmul(%x, %w, transpose_b=true), dense(%x, %w, %b)))
})");
  Rng rng(3);
  std::vector<Value> args = {Value(RandomUniform(rng, {4, 5}, -1, 1)), Value(RandomUniform(rng, {3, 5}, -1, 1)),
                             Value(RandomUniform(rng, {3}, -1, 1))};
  CompileOptions options;
  options.lower.pack_gemm = false;  // OpenBLAS's matmul and dense (packed products: below)
  ExecutablePtr plain = session_->Compile(PartialEvaluate(*s, "f", args).main, options);
  EXPECT_TRUE(plain->profile().empty());
  options.profile = true;
  ExecutablePtr exe = session_->Compile(PartialEvaluate(*s, "f", args).main, options);
  for (int i = 0; i < 3; ++i) exe->Run(Flatten(args));
  EXPECT_EQ(exe->profiled_runs(), 3);
  std::map<std::string, ProfileLine> lines;
  for (const ProfileLine& line : exe->profile()) lines[line.step] = line;
  ASSERT_EQ(lines.size(), 3u);  // matmul, dense, and one fused add+tanh
  EXPECT_EQ(lines["matmul"].flops, 2.0 * 4 * 3 * 5);
  EXPECT_EQ(lines["dense"].flops, 2.0 * 4 * 3 * 5);
  EXPECT_EQ(lines["fused"].flops, 0);
  EXPECT_EQ(lines["fused"].steps, 1);
  for (const auto& [kind, line] : lines) EXPECT_GT(line.seconds, 0) << kind;

  if (!PackedGemmFast()) return;
  options.lower.pack_gemm = true;
  ExecutablePtr packed = session_->Compile(PartialEvaluate(*s, "f", args).main, options);
  packed->Run(Flatten(args));
  lines.clear();
  for (const ProfileLine& line : packed->profile()) lines[line.step] = line;
  ASSERT_EQ(lines.size(), 4u);  // one gemm_pack of %w, the two products, the fused add+tanh
  EXPECT_EQ(lines["gemm_pack"].steps, 1);
  EXPECT_EQ(lines["gemm_pack"].flops, 0);
  EXPECT_EQ(lines["packed_matmul"].flops, 2.0 * 4 * 3 * 5);
  EXPECT_EQ(lines["packed_dense"].flops, 2.0 * 4 * 3 * 5);
}

TEST_F(CompilerTest, ProductsAgainstOneWeightPackItOncePerOrientation) {
  // A weight read by two levels forward (x·Wᵀ) and two backward (g·W):
  // packed once for each orientation. A product alone with its operand (%u),
  // the transposed-lhs one (a weight gradient) and the f64 one stay
  // OpenBLAS's.
  Snapshot s = Load(R"(
def @f(%x1: Tensor[(7, 20), f32], %x2: Tensor[(2, 20), f32], %g1: Tensor[(5, 18), f32], %g2: Tensor[(1, 18), f32],
       %w: Tensor[(18, 20), f32], %b: Tensor[(18,), f32], %u: Tensor[(20, 3), f32], %d: Tensor[(3, 2), f64],
       %v: Tensor[(2, 2), f64]) {
  let %h1 = tanh(matmul(%x1, %w, transpose_b=true));
  let %h2 = tanh(dense(%x2, %w, %b));
  let %back1 = matmul(%g1, %w);
  let %back2 = matmul(%g2, %w);
  let %grad = matmul(%x1, %h1, transpose_a=true);
  (%h1, %h2, %back1, %back2, %grad, matmul(%x2, %u), matmul(%d, %v))
})");
  Rng rng(8);
  std::vector<Value> args;
  for (Shape shape : {Shape{7, 20}, {2, 20}, {5, 18}, {1, 18}, {18, 20}, {18}, {20, 3}}) {
    args.emplace_back(RandomUniform(rng, shape, -1, 1));
  }
  for (Shape shape : {Shape{3, 2}, {2, 2}}) args.emplace_back(RandomUniform(rng, shape, -1, 1, DType::kF64));
  Func packed = EliminateCommonSubexpressions(PackGemmOperands(PartialEvaluate(*s, "f", args).main));
  EXPECT_EQ(CountCalls(packed, "gemm_pack"), 2) << PrintFunction("packed", packed);
  EXPECT_EQ(CountCalls(packed, "packed_matmul"), 3) << PrintFunction("packed", packed);
  EXPECT_EQ(CountCalls(packed, "packed_dense"), 1) << PrintFunction("packed", packed);
  EXPECT_EQ(CountCalls(packed, "matmul"), 3) << PrintFunction("packed", packed);
  CompileReport r = CheckCompiled(s, "f", args);
  if (PackedGemmFast()) {  // %w is the residual's parameter %p4
    ExpectPlanHas(r, "= gemm_pack(%p4#4; transpose_b=true)");
    ExpectPlanHas(r, "= gemm_pack(%p4#4; transpose_b=false)");
  }
}

// Any inner dimension packs: a product through a wide gate matrix
// (a hidden-1024 LSTM's 3072 x 1024 U_iou, here 1500 x 24), read by two
// products in the backward's orientation, gives the interpreter's values.
TEST_F(CompilerTest, ProductsWithALongInnerDimensionArePackedToo) {
  Snapshot s = Load(R"(
def @f(%g1: Tensor[(5, 1500), f32], %g2: Tensor[(2, 1500), f32], %u: Tensor[(1500, 24), f32]) {
  (matmul(%g1, %u), matmul(%g2, %u))
})");
  Rng rng(9);
  std::vector<Value> args;
  // Positive terms: no sum cancels to near zero, where two summation orders
  // would differ by more than the relative tolerance.
  for (Shape shape : {Shape{5, 1500}, {2, 1500}, {1500, 24}}) args.emplace_back(RandomUniform(rng, shape, 0, 1));
  Func packed = EliminateCommonSubexpressions(PackGemmOperands(PartialEvaluate(*s, "f", args).main));
  EXPECT_EQ(CountCalls(packed, "gemm_pack"), 1) << PrintFunction("packed", packed);
  EXPECT_EQ(CountCalls(packed, "packed_matmul"), 2) << PrintFunction("packed", packed);
  EXPECT_EQ(CountCalls(packed, "matmul"), 0) << PrintFunction("packed", packed);
  CheckCompiled(s, "f", args);
}

TEST_F(CompilerTest, SumsOfScattersIntoTheSameRowsBecomeOneScatter) {
  Snapshot s = Load(R"(
def @f(%a: Tensor[(2, 3), f32], %b: Tensor[(3,), f32], %c: Tensor[(3, 3), f32], %d: Tensor[(4, 3), f32]) {
  let %ga = scatter_add(%a, tensor(i64, (2,), [0, 3]), rows=4);
  let %gb = scatter_add(%b, tensor(i64, (), [1]), rows=4);
  let %gc = scatter_add(%c, tensor(i64, (3,), [3, 2, 0]), rows=4);
  add(add(%ga, %d), add(%gb, %gc))
})");
  Rng rng(4);
  std::vector<Value> args;
  for (Shape shape : {Shape{2, 3}, {3}, {3, 3}, {4, 3}}) args.emplace_back(RandomUniform(rng, shape, -1, 1));
  Func residual = PartialEvaluate(*s, "f", args).main;
  Func combined = CombineSums(FoldConstants(residual));  // indices must be literal constants
  EXPECT_EQ(CountCalls(combined, "scatter_add"), 1) << PrintFunction("combined", combined);
  CheckCompiled(s, "f", args);
}

TEST_F(CompilerTest, BlocksOfConsecutiveRowsAreViewedNotCopied) {
  Snapshot s = Load(R"(
def @f(%x: Tensor[(6, 4), f32]) {
  let %y = exp(%x);
  let %rows = take(%y, tensor(i64, (3,), [1, 2, 3]));
  let %row = take(%y, tensor(i64, (), [4]));
  let %cut = slice(%y, axes=[0], begins=[2], ends=[5]);
  let %scattered = take(%y, tensor(i64, (2,), [0, 2]));
  let %across = slice(%y, axes=[1], begins=[1], ends=[3]);
  (mul(%rows, 2f32), neg(%row), add(%cut, %rows), tanh(%scattered), sigmoid(%across))
})");
  Rng rng(5);
  CompileReport r = CheckCompiled(s, "f", {Value(RandomUniform(rng, {6, 4}, -1, 1))});
  // Rows [1, 4) at byte 16, row 4 at 64, rows [2, 5) at 32: views of %y.
  ExpectPlanHas(r, "view   %rows#2 = %y#1 + 16 bytes  Tensor[(3, 4), f32]");
  ExpectPlanHas(r, "view   %row#4 = %y#1 + 64 bytes  Tensor[(4,), f32]");
  ExpectPlanHas(r, "view   %cut#6 = %y#1 + 32 bytes  Tensor[(3, 4), f32]");
  // Rows 0 and 2, and columns 1 and 2 of every row, are not contiguous:
  // copied, a block per row.
  ExpectPlanHas(r, "= take(%y#1, %const#8)  2 blocks, 32 bytes");
  ExpectPlanHas(r, "= slice(%y#1)  6 blocks, 48 bytes");
}

TEST_F(CompilerTest, CopiesOfCopiesReadWhereTheBytesCameFrom) {
  // A gather of rows from two batches, concatenated, then permuted (what
  // batching emits for a tree level's children): one copy step, its blocks
  // read from %a and %b, and no buffer in between.
  Snapshot s = Load(R"(
def @f(%x: Tensor[(4, 3), f32], %z: Tensor[(5, 3), f32]) {
  let %a = exp(%x);
  let %b = tanh(%z);
  let %rows = concat(take(%a, tensor(i64, (2,), [3, 0])), take(%b, tensor(i64, (3,), [1, 2, 4])), axis=0);
  let %permuted = take(%rows, tensor(i64, (5,), [4, 0, 2, 3, 1]));
  let %stacked = stack(%permuted, %b, axis=1);
  neg(%stacked)
})");
  Rng rng(6);
  CompileReport r = CheckCompiled(s, "f", {Value(RandomUniform(rng, {4, 3}, -1, 1)), Value(RandomUniform(rng, {5, 3}, -1, 1))});
  // Rows of the result: (b4, b0), (a3, b1), (b1, b2), (b2, b3), (a0, b4); the
  // (b1, b2) and (b2, b3) pairs lie in %b as one block each: 8 blocks.
  EXPECT_EQ(r.kernels, 4) << r.plan;  // exp, tanh, one copy, neg
  ExpectPlanHas(r, "copy   %stacked#11 [arena+128] = stack(%b#3, %a#2)  8 blocks, 120 bytes");
}

TEST_F(CompilerTest, ProductsOverRowsSummedBecomeOneGemm) {
  // A weight's gradient over three tree levels: sum of (dy_l)^T x_l.
  Snapshot s = Load(R"(
def @f(%d1: Tensor[(2, 3), f32], %x1: Tensor[(2, 4), f32], %d2: Tensor[(5, 3), f32], %x2: Tensor[(5, 4), f32],
       %d3: Tensor[(1, 3), f32], %x3: Tensor[(1, 4), f32], %e: Tensor[(3, 4), f32]) {
  let %g1 = matmul(%d1, %x1, transpose_a=true);
  let %g2 = matmul(%d2, %x2, transpose_a=true);
  let %g3 = matmul(%d3, %x3, transpose_a=true);
  add(add(%g1, %e), add(%g2, %g3))
})");
  Rng rng(7);
  std::vector<Value> args;
  for (Shape shape : {Shape{2, 3}, {2, 4}, {5, 3}, {5, 4}, {1, 3}, {1, 4}, {3, 4}}) {
    args.emplace_back(RandomUniform(rng, shape, -1, 1));
  }
  Func combined = CombineSums(PartialEvaluate(*s, "f", args).main);
  EXPECT_EQ(CountCalls(combined, "matmul"), 1) << PrintFunction("combined", combined);
  CheckCompiled(s, "f", args);
}

TEST_F(CompilerTest, ValuesConcatenatedWholeAreComputedInPlace) {
  // %a and %b are computed where the concatenation puts them and the
  // parameter %z is copied in; %c, concatenated twice, is computed in the
  // first place and copied to the second.
  Snapshot s = Load(R"(
def @f(%x: Tensor[(2, 3), f32], %y: Tensor[(4, 3), f32], %z: Tensor[(1, 3), f32]) {
  let %a = exp(%x);
  let %b = tanh(%y);
  let %c = neg(%x);
  (sigmoid(concat(%a, %z, %b, axis=0)), concat(%c, %c, axis=0))
})");
  Rng rng(8);
  CompileReport r = CheckCompiled(s, "f", {Value(RandomUniform(rng, {2, 3}, -1, 1)), Value(RandomUniform(rng, {4, 3}, -1, 1)),
                                            Value(RandomUniform(rng, {1, 3}, -1, 1))});
  ExpectPlanHas(r, "view   %a#3 = %t#6  ");
  ExpectPlanHas(r, "view   %b#4 = %t#6 + 36 bytes  ");
  ExpectPlanHas(r, "= concat(%p2#2)  1 blocks, 12 bytes");
  ExpectPlanHas(r, "view   %c#5 = %t#8  ");
  ExpectPlanHas(r, "= concat(%c#5)  1 blocks, 24 bytes");
}

TEST_F(CompilerTest, KernelErrorsAtRunTimeAreReported) {
  Snapshot s = Load("def @f(%t: Tensor[(3, 2), f32], %i: Tensor[(2,), i64]) { take(%t, %i) }");
  Residual r = PartialEvaluate(*s, "f", {Value(Tensor::Zeros(DType::kF32, {3, 2})), Value(Tensor::FromVector<int64_t>({2}, {0, 1}))});
  ExecutablePtr exe = session_->Compile(r.main);
  try {
    exe->Run(std::vector<Tensor>{Tensor::Zeros(DType::kF32, {3, 2}), Tensor::FromVector<int64_t>({2}, {0, 7})});
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "take: index 7 is out of range for table rows of size 3");
  }
  EXPECT_THROW(exe->Run(std::vector<Tensor>{Tensor::Zeros(DType::kF32, {3, 2})}), std::invalid_argument);
}

// Issue 24: every tensor type is at most kMaxTensorBytes (the type rules
// check), but intermediates alive together may need more: the plan refuses
// such an arena instead of letting its offsets wrap.
TEST_F(CompilerTest, ArenasPastTheByteLimitAreRefused) {
  Snapshot s = Load(R"(
def @f(%x: Tensor[(), f32]) {
  let %a = matmul(broadcast_to(%x, shape=[134217728, 1]), broadcast_to(%x, shape=[1, 134217728]));
  let %b = matmul(broadcast_to(exp(%x), shape=[134217728, 1]), broadcast_to(%x, shape=[1, 134217728]));
  sum(matmul(%a, %b))
})");
  Residual r = PartialEvaluate(*s, "f", {Value(Tensor::Scalar(1.0f))});
  try {
    session_->Compile(r.main);
    FAIL() << "intermediates of 2^56 bytes each were given one arena";
  } catch (const JitFailure& e) {
    EXPECT_NE(std::string(e.what()).find("an arena of more than 2^56 bytes"), std::string::npos) << e.what();
  }
}

TEST_F(CompilerTest, ProgramsWithControlFlowAreRefusedWithAReason) {
  Snapshot s = Load(R"(
def @count(%n: Tensor[(), i64], %x: Tensor[(), f32]) -> Tensor[(), f32] {
  if (greater(%n, 0)) { @count(sub(%n, 1), mul(%x, 2f32)) } else { %x }
})");
  Residual r = PartialEvaluate(*s, "count", {Value(Tensor::FromVector<int64_t>({}, {3})), Value(Tensor::Scalar(1.0f))});
  try {
    session_->Compile(r.main);
    FAIL() << "expected JitFailure";
  } catch (const JitFailure& e) {
    EXPECT_NE(std::string(e.what()).find("cannot compile a dynamic if"), std::string::npos) << e.what();
  }
}

TEST_F(CompilerTest, CodeIsFreedWhenTheLastHolderLetsGo) {
  Snapshot s = Load("def @f(%x: Tensor[(8,), f32]) { exp(%x) }");
  Residual r = PartialEvaluate(*s, "f", {Value(Tensor::Zeros(DType::kF32, {8}))});
  int before = session_->live_modules();
  ExecutablePtr exe = session_->Compile(r.main);
  EXPECT_EQ(session_->live_modules(), before + 1);
  std::atomic<bool> go{false};
  std::thread holder([held = exe, &go] {
    while (!go.load()) std::this_thread::yield();
    // The engine dropped it, but this call still holds it: it must still run.
    EXPECT_EQ(held->Run(std::vector<Tensor>{Tensor::Zeros(DType::kF32, {8})})[0].ElementAsDouble(0), 1.0);
  });
  exe.reset();
  EXPECT_EQ(session_->live_modules(), before + 1);
  go.store(true);
  holder.join();
  EXPECT_EQ(session_->live_modules(), before);
}

TEST_F(CompilerTest, ManyThreadsRunOneExecutable) {
  Snapshot s = Load("def @f(%x: Tensor[(64,), f32]) { sum(tanh(mul(%x, %x))) }");
  Rng rng(6);
  Tensor x = RandomUniform(rng, {64}, -1, 1);
  Residual r = PartialEvaluate(*s, "f", {Value(x)});
  ExecutablePtr exe = session_->Compile(r.main);
  Tensor want = exe->Run(std::vector<Tensor>{x})[0];
  std::vector<std::thread> threads;
  std::atomic<int> agree{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) agree += Equal(exe->Run(std::vector<Tensor>{x})[0], want);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(agree.load(), 400);
}

// Workers compile at once on one session: every module must come out whole.
TEST_F(CompilerTest, ManyThreadsCompileAtOnce) {
  Snapshot s = Load("def @g(%x: Tensor[(16,), f32], %y: Tensor[(16,), f32]) { tanh(add(mul(%x, %y), exp(%y))) }");
  Rng rng(7);
  std::vector<Value> args = {Value(RandomUniform(rng, {16}, -1, 1)), Value(RandomUniform(rng, {16}, -1, 1))};
  Func main = PartialEvaluate(*s, "g", args).main;
  Tensor want = session_->Compile(main)->Run(Flatten(args))[0];
  std::atomic<int> agree{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) agree += Equal(session_->Compile(main)->Run(Flatten(args))[0], want);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(agree.load(), 20);
}

}  // namespace
}  // namespace pejit
