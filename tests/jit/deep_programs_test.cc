// Issue 23: inputs as long and as deep as real ones (documents, long
// sentences, deep parse trees) specialize and compile, and the compiled loss
// and gradients agree with the interpreter's tape: a recurrent network over
// a 10,000-element list, and a tree model over a 2,000-level tree.
#include <gtest/gtest.h>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "jit/pipeline.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
def @rnn(%xs: List[Tensor[(1, 8), f32]], %h: Tensor[(1, 8), f32], %w: Tensor[(8, 8), f32],
         %u: Tensor[(8, 8), f32]) -> Tensor[(1, 8), f32] {
  match (%xs) {
    Nil => %h,
    Cons(%x, %rest) => @rnn(%rest, tanh(add(matmul(%x, %u), matmul(%h, %w))), %w, %u),
  }
}
def @rnn_loss(%xs: List[Tensor[(1, 8), f32]], %w: Tensor[(8, 8), f32], %u: Tensor[(8, 8), f32]) -> Tensor[(), f32] {
  sum(@rnn(%xs, zeros(shape=[1, 8]), %w, %u))
}

type Tree { Leaf(Tensor[(1, 8), f32]), Node(Tree, Tree) }
def @encode(%t: Tree, %w: Tensor[(16, 8), f32]) -> Tensor[(1, 8), f32] {
  match (%t) {
    Leaf(%x) => %x,
    Node(%l, %r) => tanh(matmul(concat(@encode(%l, %w), @encode(%r, %w), axis=1), %w)),
  }
}
def @tree_loss(%t: Tree, %w: Tensor[(16, 8), f32]) -> Tensor[(), f32] { sum(@encode(%t, %w)) }
)";

// ThreadSanitizer keeps a stack trace per memory access, so its memory grows
// with depth times work: at full depth the list test took 164 s and the tree
// test ran out of 24 GB. Its build checks shallower inputs, still past the
// evaluator's first stack segment.
#if defined(__SANITIZE_THREAD__)
constexpr int kListLength = 2000, kTreeDepth = 1000;
#else
constexpr int kListLength = 10000, kTreeDepth = 2000;
#endif

class DeepProgramsTest : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(kProgram, "deep.pj"); }

  // Partial evaluation, batching, autodiff and LLVM of `entry`'s loss and
  // gradients for the arguments `wrt`, against the interpreter's tape.
  void ExpectCompiledGradientsAgree(const std::string& entry, const std::vector<Value>& args, const std::vector<int>& wrt) {
    Snapshot s = module_.snapshot();
    Residual r = PartialEvaluate(*s, entry, args);
    ASSERT_TRUE(r.functions.empty()) << "the structure is static: PE unrolls it all";
    std::vector<Tensor> leaves = Flatten(args, {});
    std::vector<int> wrt_leaves;
    for (int w : wrt) wrt_leaves.push_back(static_cast<int>(leaves.size()) - static_cast<int>(args.size()) + w);
    auto session = JitSession::Create();
    PipelineOptions options;
    options.wrt_leaves = wrt_leaves;
    std::vector<Tensor> got = CompileResidual(*session, r.main, options)->Run(leaves);
    Interpreter::ValueAndGrad want = Interpreter().CallWithGrad(*s, entry, args, wrt);
    ASSERT_EQ(got.size(), 1 + wrt.size());
    EXPECT_TRUE(AllClose(got[0], want.value.tensor(), 1e-4, 1e-5)) << got[0].ToString() << " vs " << want.value.ToString();
    for (size_t k = 0; k < wrt.size(); ++k) {
      EXPECT_TRUE(AllClose(got[1 + k], want.grads[k].tensor(), 1e-3, 1e-5))
          << "d/d argument " << wrt[k] << ": " << got[1 + k].ToString() << " vs " << want.grads[k].ToString();
    }
  }

  Module module_;
};

TEST_F(DeepProgramsTest, ARecurrentNetworkOverTenThousandElementsCompiles) {
  Snapshot s = module_.snapshot();
  Rng rng(1);
  TypeDefPtr list = s->FindType("List");  // the prelude's
  Value xs = Value::Adt(list, 0, {});        // Nil
  for (int i = 0; i < kListLength; ++i) xs = Value::Adt(list, 1, {Value(RandomUniform(rng, {1, 8}, -1, 1)), xs});
  Value w(RandomUniform(rng, {8, 8}, -0.3f, 0.3f)), u(RandomUniform(rng, {8, 8}, -0.3f, 0.3f));
  ExpectCompiledGradientsAgree("rnn_loss", {xs, w, u}, {1, 2});
}

TEST_F(DeepProgramsTest, ATreeTwoThousandLevelsDeepCompiles) {
  Snapshot s = module_.snapshot();
  Rng rng(2);
  TypeDefPtr tree = s->FindType("Tree");
  auto leaf = [&] { return Value::Adt(tree, 0, {Value(RandomUniform(rng, {1, 8}, -1, 1))}); };
  Value t = leaf();
  for (int i = 0; i < kTreeDepth; ++i) t = Value::Adt(tree, 1, {leaf(), t});
  ExpectCompiledGradientsAgree("tree_loss", {t, Value(RandomUniform(rng, {16, 8}, -0.3f, 0.3f))}, {1});
}

}  // namespace
}  // namespace pejit
