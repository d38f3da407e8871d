// Autodiff of residual programs: the differentiated program, run in the
// interpreter, gives the loss and gradients the interpreter's tape gives on
// the original entry; it is ordinary IR; what it cannot differentiate it
// refuses, saying what and where.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ir/printer.h"
#include "ir/structural.h"
#include "ir/visitor.h"
#include "jit/autodiff.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
# Unary and binary elementwise operators; `broadcast_to(2f32, ...)` is static,
# so the residual let-binds it as a constant.
def @chain(%x: Tensor[(5,), f32], %y: Tensor[(5,), f32]) -> Tensor[(), f32] {
  let %a = mul(exp(%x), sigmoid(%y));
  let %b = div(tanh(%a), add(mul(%y, %y), 1f32));
  let %c = sub(log(add(mul(%x, %x), 1f32)), neg(relu(%b)));
  let %d = pow(sqrt(add(mul(%a, %a), 2f32)), exponent=1.5);
  let %e = maximum(minimum(%c, %d), mul(%x, 0.25));
  sum(mul(add(%e, %d), broadcast_to(2f32, shape=[5])))
}

# Broadcasting both ways, a scalar parameter, a value used three times.
def @bcast(%a: Tensor[(3, 4), f32], %b: Tensor[(4,), f32], %c: Tensor[(3, 1), f32], %s: Tensor[(), f32])
    -> Tensor[(), f32] {
  let %h = mul(add(%a, %b), %c);
  mean(add(mul(%h, %s), sub(%h, div(%h, add(mul(%c, %c), 1f32)))))
}

def @mlp(%x: Tensor[(2, 5), f32], %w1: Tensor[(4, 5), f32], %b1: Tensor[(4,), f32], %w2: Tensor[(3, 4), f32],
         %v: Tensor[(3, 2), f32]) -> Tensor[(), f32] {
  let %h = tanh(dense(%x, %w1, %b1));
  let %o = matmul(%h, %w2, transpose_b=true);
  add(sum(matmul(%o, %v)), mean(matmul(%x, %h, transpose_a=true)))
}

def @classify(%x: Tensor[(4, 3), f32], %w: Tensor[(5, 3), f32], %b: Tensor[(5,), f32],
              %labels: Tensor[(4,), i64], %t: Tensor[(4, 5), f32]) -> Tensor[(), f32] {
  let %s = dense(%x, %w, %b);
  let %ce = cross_entropy(%s, %labels);
  add(add(%ce, sum(mul(softmax(%s, axis=1), %t))), neg(mean(mul(log_softmax(%s), %t))))
}

# Multi-output operators: the middle chunk and the second split piece are
# never used, so their gradients are zeros the rules must fill in.
def @gates(%x: Tensor[(2, 6), f32], %w: Tensor[(9, 6), f32]) -> Tensor[(), f32] {
  let %g = chunk(matmul(%x, %w, transpose_b=true), chunks=3, axis=1);
  let %p = split(%x, axis=1, sizes=[3, 3]);
  let %c = mul(sigmoid(%g.0), tanh(%g.2));
  add(sum(%c), sum(mul(%p.0, %g.0)))
}

def @reduce(%x: Tensor[(3, 4, 2), f32]) -> Tensor[(), f32] {
  let %a = sum(%x, axes=[1], keepdims=true);
  let %b = mean(%x, axes=[0, 2]);
  let %c = max(%x, axes=[2]);
  add(sum(mul(%a, %a)), add(sum(mul(%b, %b)), max(mul(%c, %b))))
}

def @lookup(%emb: Tensor[(5, 3), f32], %ids: Tensor[(6,), i64], %w: Tensor[(6, 3), f32]) -> Tensor[(), f32] {
  sum(mul(take(%emb, %ids), %w))
}

# Only %x reaches the loss: %k passes through argmax, which has no gradient.
def @partly(%x: Tensor[(3,), f32], %unused: Tensor[(2, 2), f32], %k: Tensor[(3, 4), f32], %s: Tensor[(), f32])
    -> Tensor[(), f32] {
  let %w = cast(argmax(%k, axis=1), dtype=f32);
  sum(mul(mul(%x, %x), %w))
}

def @prod(%x: Tensor[(3,), f32], %y: Tensor[(3,), f32]) -> Tensor[(), f32] {
  sum(mul(%x, %y))
}

def @square(%x: Tensor[(3,), f32]) -> Tensor[(3,), f32] {
  mul(%x, %x)
}

def @sum_of_squares(%x: Tensor[(3,), f32]) -> Tensor[(), f32] {
  sum(@square(%x))
}

def @count_down(%n: Tensor[(), i64], %acc: Tensor[(), f32]) -> Tensor[(), f32] {
  if (greater(%n, 0)) { @count_down(sub(%n, 1), mul(%acc, 2f32)) } else { %acc }
}

# Straight-line, but not in the residuals' normal form: nested calls, a
# tuple, projections of it, and an alias.
def @nested(%x: Tensor[(2, 4), f32]) -> Tensor[(), f32] {
  let %t = chunk(%x, chunks=2, axis=1);
  let %u = (%t, tanh(%x));
  let %a = %u.0;
  let %b = %a;
  add(sum(mul(%b.1, %b.0)), mean(%u.1))
}

def @closure(%x: Tensor[(), f32]) -> Tensor[(), f32] {
  let %f = fn (%y: Tensor[(), f32]) -> Tensor[(), f32] { mul(%y, %x) };
  %f(%x)
}
)";

// The Tree-LSTM of tests/pe/partial_eval_test.cc, with a scalar loss.
constexpr char kTreeProgram[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }

def @cell(%x: Tensor[(1, 4), f32], %hs: Tensor[(1, 3), f32], %c_sum: Tensor[(1, 3), f32],
          %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32]))
    -> (Tensor[(1, 3), f32], Tensor[(1, 3), f32]) {
  let %gates = add(dense(%x, %p.0, %p.2), matmul(%hs, %p.1, transpose_b=true));
  let %i = sigmoid(slice(%gates, axes=[1], begins=[0], ends=[3]));
  let %o = sigmoid(slice(%gates, axes=[1], begins=[3], ends=[6]));
  let %u = tanh(slice(%gates, axes=[1], begins=[6], ends=[9]));
  let %f = sigmoid(slice(%gates, axes=[1], begins=[9], ends=[12]));
  let %c = add(mul(%i, %u), mul(%f, %c_sum));
  (mul(%o, tanh(%c)), %c)
}

def @tree(%t: Tree, %emb: Tensor[(?, 4), f32],
          %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32]))
    -> (Tensor[(1, 3), f32], Tensor[(1, 3), f32]) {
  match (%t) {
    Leaf(%w) => {
      let %zero = broadcast_to(0f32, shape=[1, 3]);
      @cell(take(%emb, reshape(%w, shape=[1])), %zero, %zero, %p)
    },
    Node(%l, %r) => {
      let %a = @tree(%l, %emb, %p);
      let %b = @tree(%r, %emb, %p);
      @cell(broadcast_to(0f32, shape=[1, 4]), add(%a.0, %b.0), add(%a.1, %b.1), %p)
    },
  }
}

def @loss(%t: Tree, %emb: Tensor[(?, 4), f32],
          %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32]), %target: Tensor[(1, 3), f32])
    -> Tensor[(), f32] {
  let %root = @tree(%t, %emb, %p);
  let %d = sub(%root.0, %target);
  mean(mul(%d, %d))
}
)";

// Element-wise relative agreement, to f32's 1e-5.
void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.type(), want.type()) << what;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = got.ElementAsDouble(i), w = want.ElementAsDouble(i);
    EXPECT_LE(std::abs(g - w), 1e-5 * std::abs(w)) << what << " element " << i << ": " << g << " vs " << w;
  }
}

int CountOps(const Func& f, const std::string& op) {
  int n = 0;
  PostOrderVisit(f->body, [&](const Expr& e) {
    if (auto* call = As<OpCallNode>(e); call && call->op->name == op) ++n;
  });
  return n;
}

std::string FailureOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const JitFailure& e) {
    return e.what();
  }
  return "(no JitFailure)";
}

class AutodiffTest : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(kProgram, "ad.pj"); }
  Snapshot snap() const { return module_.snapshot(); }

  // The residual of `entry` on `args`, differentiated with respect to the
  // float leaves of arguments `wrt_args`, run in the interpreter and checked
  // against the tape on the original entry. Returns the gradient program.
  Func CheckAgainstTape(const ModuleSnapshot& module, const std::string& entry,
                        const std::vector<Value>& args, const std::vector<int>& wrt_args) {
    Residual r = PartialEvaluate(module, entry, args);
    // Residual parameters are the arguments' leaves, argument after argument.
    std::vector<size_t> first_leaf;
    size_t leaves_so_far = 0;
    for (const Value& a : args) {
      first_leaf.push_back(leaves_so_far);
      leaves_so_far += Flatten({a}).size();
    }
    std::vector<int> wrt;
    for (int k : wrt_args) {
      std::vector<Tensor> leaves = Flatten({args[k]});
      for (size_t j = 0; j < leaves.size(); ++j) {
        if (IsFloat(leaves[j].dtype())) wrt.push_back(static_cast<int>(first_leaf[k] + j));
      }
    }
    Func grad = Differentiate(r.main, wrt);
    Value got = RunGradient(grad, args);

    Interpreter::ValueAndGrad want = interp_.CallWithGrad(module, entry, args, wrt_args);
    EXPECT_EQ(got.fields().size(), 1 + wrt.size());
    ExpectClose(got.fields()[0].tensor(), want.value.tensor(), "loss");
    size_t field = 1;
    for (size_t k = 0; k < wrt_args.size(); ++k) {
      std::vector<Tensor> arg_leaves = Flatten({args[wrt_args[k]]});
      std::vector<Tensor> grad_leaves = Flatten({want.grads[k]});
      for (size_t j = 0; j < arg_leaves.size(); ++j) {
        if (!IsFloat(arg_leaves[j].dtype())) continue;
        ExpectClose(got.fields().at(field++).tensor(), grad_leaves[j],
                    "gradient of argument " + std::to_string(wrt_args[k]) + " leaf " + std::to_string(j));
      }
    }
    return grad;
  }

  Func CheckAgainstTape(const std::string& entry, const std::vector<Value>& args,
                        const std::vector<int>& wrt_args) {
    return CheckAgainstTape(*snap(), entry, args, wrt_args);
  }

  // Runs a gradient program (in a module: it type-checks) on the dynamic leaves of `args`.
  Value RunGradient(const Func& grad, const std::vector<Value>& args) {
    Module m;
    m.AddAll({{"grad", grad}});
    std::vector<Value> leaves;
    for (const Tensor& t : Flatten(args)) leaves.emplace_back(t);
    return interp_.Call(*m.snapshot(), "grad", leaves);
  }

  Module module_;
  Interpreter interp_;
};

Value F32(Rng& rng, Shape shape) { return Value(RandomUniform(rng, std::move(shape), -1, 1)); }

TEST_F(AutodiffTest, ElementwiseChainsAgreeWithTheTape) {
  Rng rng(1);
  Func grad = CheckAgainstTape("chain", {F32(rng, {5}), F32(rng, {5})}, {0, 1});
  EXPECT_GT(CountOps(grad, "where"), 0);  // relu, maximum, minimum
}

TEST_F(AutodiffTest, BroadcastingSumsGradientsBackToEachShape) {
  Rng rng(2);
  CheckAgainstTape("bcast", {F32(rng, {3, 4}), F32(rng, {4}), F32(rng, {3, 1}), F32(rng, {})}, {0, 1, 2, 3});
  CheckAgainstTape("bcast", {F32(rng, {3, 4}), F32(rng, {4}), F32(rng, {3, 1}), F32(rng, {})}, {3, 1});
}

TEST_F(AutodiffTest, MatmulAndDenseAgreeWithTheTape) {
  Rng rng(3);
  CheckAgainstTape("mlp",
                   {F32(rng, {2, 5}), F32(rng, {4, 5}), F32(rng, {4}), F32(rng, {3, 4}), F32(rng, {3, 2})},
                   {0, 1, 2, 3, 4});
}

TEST_F(AutodiffTest, SoftmaxAndCrossEntropyAgreeWithTheTape) {
  Rng rng(4);
  Value labels(Tensor::FromVector<int64_t>({4}, {0, 4, 2, 4}));
  CheckAgainstTape("classify", {F32(rng, {4, 3}), F32(rng, {5, 3}), F32(rng, {5}), labels, F32(rng, {4, 5})},
                   {0, 1, 2, 4});
}

TEST_F(AutodiffTest, MultiOutputOperatorsGetOneGradientPerOutput) {
  Rng rng(5);
  CheckAgainstTape("gates", {F32(rng, {2, 6}), F32(rng, {9, 6})}, {0, 1});
}

TEST_F(AutodiffTest, ReductionsAgreeWithTheTape) {
  Rng rng(6);
  CheckAgainstTape("reduce", {F32(rng, {3, 4, 2})}, {0});
}

TEST_F(AutodiffTest, TakeWithRepeatedIndicesSumsTheRowsGradients) {
  Rng rng(7);
  Value ids(Tensor::FromVector<int64_t>({6}, {1, 3, 1, 1, 0, 3}));
  Value emb = F32(rng, {5, 3}), w = F32(rng, {6, 3});
  CheckAgainstTape("lookup", {emb, ids, w}, {0, 2});
  // Row 1 is looked up three times: its gradient is the sum of w's rows 0, 2 and 3.
  Residual r = PartialEvaluate(*snap(), "lookup", {emb, ids, w});
  Value got = RunGradient(Differentiate(r.main, {0}), {emb, ids, w});
  const Tensor& d_emb = got.fields()[1].tensor();
  const Tensor& wt = w.tensor();
  for (int64_t col = 0; col < 3; ++col) {
    const float* row = wt.data<float>();
    float want = row[0 * 3 + col] + row[2 * 3 + col] + row[3 * 3 + col];
    EXPECT_NEAR(d_emb.data<float>()[1 * 3 + col], want, 1e-6);
    EXPECT_EQ(d_emb.data<float>()[2 * 3 + col], 0.0f);  // row 2 is never looked up
  }
}

TEST_F(AutodiffTest, TreeLstmLossOnAListOpsMinibatchAgreesWithTheTape) {
  Module m;
  m.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot s = m.snapshot();
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(11, 4, *s);
  Rng rng(8);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 4, 3, listops::kClasses});
  Func grad = CheckAgainstTape(*s, "loss", {b.trees, b.labels, params}, {2});
  EXPECT_GT(CountOps(grad, "scatter_add"), 0);  // the embeddings' gradient
}

class TreeLstmFromPeTest : public AutodiffTest {
 protected:
  void SetUp() override { trees_.AddSource(kTreeProgram, "tree.pj"); }
  TypeDefPtr tree() const { return trees_.snapshot()->FindType("Tree"); }
  Value Leaf(int64_t w) const { return Value::Adt(tree(), 0, {Value(Tensor::FromVector<int64_t>({}, {w}))}); }
  Value Node(Value l, Value r) const { return Value::Adt(tree(), 1, {std::move(l), std::move(r)}); }
  Value RandomTree(Rng& rng, int leaves) const {
    if (leaves == 1) return Leaf(rng.NextInt(0, 5));
    int left = static_cast<int>(rng.NextInt(1, leaves));
    return Node(RandomTree(rng, left), RandomTree(rng, leaves - left));
  }
  std::vector<Value> Args(Rng& rng, Value t) const {
    return {std::move(t), F32(rng, {5, 4}),
            Value::Tuple({F32(rng, {12, 4}), F32(rng, {12, 3}), F32(rng, {12})}), F32(rng, {1, 3})};
  }
  Module trees_;
};

TEST_F(TreeLstmFromPeTest, RandomTreesAgreeWithTheTape) {
  Rng rng(9);
  for (int trial = 0; trial < 8; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    CheckAgainstTape(*trees_.snapshot(), "loss", Args(rng, RandomTree(rng, 1 + trial)), {1, 2});
  }
}

TEST_F(TreeLstmFromPeTest, TheGradientProgramIsOrdinaryIrThatPrintsAndParsesBack) {
  Rng rng(10);
  std::vector<Value> args = Args(rng, Node(Node(Leaf(0), Leaf(3)), Leaf(1)));
  Residual r = PartialEvaluate(*trees_.snapshot(), "loss", args);
  Func grad = Differentiate(r.main, {3, 4, 5, 6});  // emb and the three parameters
  std::string text = PrintFunction("grad", grad);
  Module m;
  m.AddSource(text, "grad.pj");
  EXPECT_TRUE(StructuralEqual(m.snapshot()->Get("grad").func, grad)) << text;
  std::vector<Value> leaves;
  for (const Tensor& t : Flatten(args)) leaves.emplace_back(t);
  EXPECT_TRUE(ValueEqual(interp_.Call(*m.snapshot(), "grad", leaves), RunGradient(grad, args)));
}

TEST_F(TreeLstmFromPeTest, TheForwardHalfIsTheResidualItself) {
  Rng rng(11);
  Residual r = PartialEvaluate(*trees_.snapshot(), "loss", Args(rng, Node(Leaf(0), Leaf(1))));
  Func grad = Differentiate(r.main, {3});
  Expr a = r.main->body, b = grad->body;
  int lets = 0;
  for (; a->kind == ExprKind::kLet; a = As<LetNode>(a)->body, b = As<LetNode>(b)->body, ++lets) {
    ASSERT_EQ(b->kind, ExprKind::kLet);
    EXPECT_EQ(As<LetNode>(a)->var, As<LetNode>(b)->var);
  }
  EXPECT_GT(lets, 20);
}

TEST_F(AutodiffTest, ParametersWithoutAPathToTheLossGetZeros) {
  Rng rng(12);
  std::vector<Value> args = {F32(rng, {3}), F32(rng, {2, 2}), F32(rng, {3, 4}), F32(rng, {})};
  CheckAgainstTape("partly", args, {0, 1, 2, 3});
  Residual r = PartialEvaluate(*snap(), "partly", args);
  Value got = RunGradient(Differentiate(r.main, {1, 2, 3}), args);
  EXPECT_TRUE(ValueEqual(got.fields()[1], Value(Tensor::Zeros(DType::kF32, {2, 2}))));
  EXPECT_TRUE(ValueEqual(got.fields()[2], Value(Tensor::Zeros(DType::kF32, {3, 4}))));
  EXPECT_TRUE(ValueEqual(got.fields()[3], Value(Tensor::Zeros(DType::kF32, {}))));
  // No parameter in wrt reaches the loss: the loss alone, and zeros.
  EXPECT_EQ(CountOps(Differentiate(r.main, {1}), "where"), 0);
}

TEST_F(AutodiffTest, ALossThatIsAParameterHasGradientOne) {
  Var x = MakeVar("x", ScalarTy(DType::kF32));
  Var y = MakeVar("y", TensorTy(DType::kF32, {2}));
  Value got = RunGradient(Differentiate(MakeFunc({x, y}, x), {0, 1}),
                          {Value(Tensor::Scalar(2.5f)), Value(Tensor::Ones(DType::kF32, {2}))});
  EXPECT_TRUE(ValueEqual(got, Value::Tuple({Value(Tensor::Scalar(2.5f)), Value(Tensor::Scalar(1.0f)),
                                            Value(Tensor::Zeros(DType::kF32, {2}))})))
      << got.ToString();
}

TEST_F(AutodiffTest, GradientsNobodyAskedForAreNotComputed) {
  Rng rng(13);
  std::vector<Value> args = {F32(rng, {3}), F32(rng, {3})};
  Func dx = CheckAgainstTape("prod", args, {0});
  EXPECT_EQ(CountOps(dx, "mul"), 2) << PrintFunction("dx", dx);  // x*y, and d x = g*y
  Func both = CheckAgainstTape("prod", args, {0, 1});
  EXPECT_EQ(CountOps(both, "mul"), 3) << PrintFunction("both", both);
}

TEST_F(AutodiffTest, StraightLineIrOutsideTheNormalFormIsDifferentiatedToo) {
  Rng rng(14);
  Value x = F32(rng, {2, 4});
  Func grad = Differentiate(snap()->Get("nested").func, {0});
  Value got = RunGradient(grad, {x});
  Interpreter::ValueAndGrad want = interp_.CallWithGrad(*snap(), "nested", {x}, {0});
  ExpectClose(got.fields()[0].tensor(), want.value.tensor(), "loss");
  ExpectClose(got.fields()[1].tensor(), want.grads[0].tensor(), "gradient");
}

TEST_F(AutodiffTest, ADynamicIfIsRefusedNamingItsPlace) {
  Residual r = PartialEvaluate(*snap(), "count_down",
                               {Value(Tensor::FromVector<int64_t>({}, {3})), Value(Tensor::Scalar(1.5f))});
  ASSERT_EQ(r.functions.size(), 1u);
  const std::string refusal =
      "autodiff: ad.pj:74:3: in let #2 (%t): a dynamic `if` cannot be differentiated; "
      "only straight-line tensor programs can";
  EXPECT_EQ(FailureOf([&] { Differentiate(r.main, {1}); }), refusal) << r.ToText();
  // The loop's residual function holds the same `if`.
  EXPECT_EQ(FailureOf([&] { Differentiate(r.functions[0].second, {1}); }), refusal);
}

TEST_F(AutodiffTest, CallsToResidualFunctionsAreRefused) {
  Rng rng(17);
  PeOptions no_fuel;
  no_fuel.fuel = 1;
  Residual r = PartialEvaluate(*snap(), "sum_of_squares", {F32(rng, {3})}, {}, no_fuel);
  ASSERT_EQ(r.functions.size(), 1u) << r.ToText();
  EXPECT_EQ(FailureOf([&] { Differentiate(r.main, {0}); }),
            "autodiff: ad.pj:70:7: in let #1 (%t): a call to @" + r.functions[0].first +
                " cannot be differentiated; only straight-line tensor programs can") << r.ToText();
}

TEST_F(AutodiffTest, ANonScalarLossIsRefused) {
  Rng rng(15);
  Residual r = PartialEvaluate(*snap(), "square", {F32(rng, {3})});
  // The residual's result is placed where the source computes it.
  EXPECT_EQ(FailureOf([&] { Differentiate(r.main, {0}); }),
            "autodiff: ad.pj:66:3: the result must be a scalar f32 loss (Tensor[(), f32]), got Tensor[(3,), f32]");
  // In a module's function the result has a location.
  EXPECT_EQ(FailureOf([&] { Differentiate(snap()->Get("square").func, {0}); }),
            "autodiff: ad.pj:66:3: the result must be a scalar f32 loss (Tensor[(), f32]), "
            "got Tensor[(3,), f32]");
}

TEST_F(AutodiffTest, BadWrtIndicesAreRefused) {
  Rng rng(16);
  Value labels(Tensor::FromVector<int64_t>({4}, {0, 1, 2, 3}));
  Residual r = PartialEvaluate(*snap(), "classify",
                               {F32(rng, {4, 3}), F32(rng, {5, 3}), F32(rng, {5}), labels, F32(rng, {4, 5})});
  EXPECT_EQ(FailureOf([&] { Differentiate(r.main, {5}); }),
            "autodiff: wrt index 5 is not a parameter (the program has 5)");
  EXPECT_EQ(FailureOf([&] { Differentiate(r.main, {3}); }),
            "autodiff: wrt parameter 3 (%p3) is Tensor[(4,), i64], not a float tensor");
}

TEST_F(AutodiffTest, ClosuresAreRefusedWithTheirLocation) {
  EXPECT_EQ(FailureOf([&] { Differentiate(snap()->Get("closure").func, {0}); }),
            "autodiff: ad.pj:88:12: in let #1 (%f): a function literal (closure) cannot be differentiated; "
            "only straight-line tensor programs can");
}

}  // namespace
}  // namespace pejit
