// Partial evaluation: the residual program, run on the dynamic leaves, gives
// exactly what the original gives on the arguments; what is static is gone.
#include <gtest/gtest.h>

#include "interp/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/structural.h"
#include "ir/visitor.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
type List[T] { Nil, Cons(T, List[T]) }

def @cell(%x: Tensor[(1, 4), f32], %hs: Tensor[(1, 3), f32], %c_sum: Tensor[(1, 3), f32],
          %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32])) -> (Tensor[(1, 3), f32], Tensor[(1, 3), f32]) {
  let %gates = add(dense(%x, %p.0, %p.2), matmul(%hs, %p.1, transpose_b=true));
  let %i = sigmoid(slice(%gates, axes=[1], begins=[0], ends=[3]));
  let %o = sigmoid(slice(%gates, axes=[1], begins=[3], ends=[6]));
  let %u = tanh(slice(%gates, axes=[1], begins=[6], ends=[9]));
  let %f = sigmoid(slice(%gates, axes=[1], begins=[9], ends=[12]));
  let %c = add(mul(%i, %u), mul(%f, %c_sum));
  (mul(%o, tanh(%c)), %c)
}

def @tree(%t: Tree, %emb: Tensor[(?, 4), f32], %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32]))
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

def @forward(%t: Tree, %emb: Tensor[(?, 4), f32], %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32]))
    -> Tensor[(1, 3), f32] {
  let %root = @tree(%t, %emb, %p);
  %root.0
}

# Uses the same encoding twice: it must be computed once.
def @twice(%t: Tree, %emb: Tensor[(?, 4), f32], %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32])) {
  add(@forward(%t, %emb, %p), @forward(%t, %emb, %p))
}

def @count_down(%n: Tensor[(), i64], %acc: Tensor[(), f32]) -> Tensor[(), f32] {
  if (greater(%n, 0)) { @count_down(sub(%n, 1), mul(%acc, 2f32)) } else { %acc }
}

def @map(%f: fn(Tensor[(2,), f32]) -> Tensor[(2,), f32], %xs: List[Tensor[(2,), f32]]) -> List[Tensor[(2,), f32]] {
  match (%xs) { Nil => Nil, Cons(%x, %rest) => Cons(%f(%x), @map(%f, %rest)) }
}

def @scaled(%xs: List[Tensor[(2,), f32]], %k: Tensor[(2,), f32]) -> List[Tensor[(2,), f32]] {
  @map(fn (%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { mul(%x, %k) }, %xs)
}

def @static_sum(%n: Tensor[(), i64]) -> Tensor[(), i64] {
  if (greater(%n, 0)) { add(%n, @static_sum(sub(%n, 1))) } else { 0 }
}

# Halves %x until its norm is below 0.1, at most %max times: the data decides
# when the loop ends, a literal counts the steps.
def @shrink(%x: Tensor[(2,), f32], %i: Tensor[(), i64], %max: Tensor[(), i64]) -> Tensor[(2,), f32] {
  if (logical_or(less(norm(%x), 0.1f32), greater_equal(%i, %max))) { %x } else { @shrink(mul(%x, 0.5f32), add(%i, 1), %max) }
}
def @shrink_from_zero(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { @shrink(%x, 0, 1000) }

# A recursion over a static list inside a dynamic branch: the list bounds it.
def @gated_sum(%xs: List[Tensor[(2,), f32]], %gate: Tensor[(), f32]) -> Tensor[(2,), f32] {
  match (%xs) {
    Nil => broadcast_to(0f32, shape=[2]),
    Cons(%x, %rest) => if (greater(%gate, 0f32)) { add(%x, @gated_sum(%rest, %gate)) } else { %x },
  }
}
)";

class PartialEvalTest : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(kProgram, "pe.pj"); }
  Snapshot snap() const { return module_.snapshot(); }
  TypeDefPtr tree() const { return snap()->FindType("Tree"); }
  Value Leaf(int64_t w) const { return Value::Adt(tree(), 0, {Value(Tensor::FromVector<int64_t>({}, {w}))}); }
  Value Node(Value l, Value r) const { return Value::Adt(tree(), 1, {std::move(l), std::move(r)}); }

  // A random binary tree with `leaves` leaves and words in [0, vocab).
  Value RandomTree(Rng& rng, int leaves, int vocab) const {
    if (leaves == 1) return Leaf(rng.NextInt(0, vocab));
    int left = static_cast<int>(rng.NextInt(1, leaves));
    return Node(RandomTree(rng, left, vocab), RandomTree(rng, leaves - left, vocab));
  }
  static Value Params(Rng& rng) {
    return Value::Tuple({Value(RandomUniform(rng, {12, 4}, -1, 1)), Value(RandomUniform(rng, {12, 3}, -1, 1)),
                         Value(RandomUniform(rng, {12}, -1, 1))});
  }

  // Partially evaluates `entry` and checks the residual against the original.
  Residual CheckResidual(const std::string& entry, const std::vector<Value>& args,
                         const std::vector<bool>& static_args = {}, const PeOptions& options = {}) {
    Residual r = PartialEvaluate(*snap(), entry, args, static_args, options);
    Snapshot residual = r.ToModule();  // type-checks
    std::vector<Value> leaves;
    for (const Tensor& t : Flatten(args, static_args)) leaves.emplace_back(t);
    Value expected = interp_.Call(*snap(), entry, args);
    Value got = interp_.Call(*residual, "main", leaves);
    EXPECT_TRUE(ValueEqual(got, expected)) << "residual: " << got.ToString() << "\noriginal: " << expected.ToString()
                                           << "\n" << r.ToText();
    return r;
  }

  static int Count(const Residual& r, const std::string& op) {
    int n = 0;
    auto count = [&](const Func& f) {
      PostOrderVisit(f->body, [&](const Expr& e) {
        if (auto* call = As<OpCallNode>(e); call && call->op->name == op) ++n;
      });
    };
    count(r.main);
    for (const auto& [_, f] : r.functions) count(f);
    return n;
  }

  Module module_;
  Interpreter interp_;
};

TEST_F(PartialEvalTest, RecursionOverAStaticTreeUnrollsToOneCellPerNode) {
  Rng rng(1);
  Value t = Node(Node(Leaf(0), Leaf(2)), Node(Leaf(1), Node(Leaf(2), Leaf(0))));  // 5 leaves, 4 inner nodes
  Residual r = CheckResidual("forward", {t, Value(RandomUniform(rng, {3, 4}, -1, 1)), Params(rng)});
  EXPECT_TRUE(r.functions.empty());               // no calls left: straight-line code
  EXPECT_EQ(Count(r, "dense"), 9);                // one cell per node
  EXPECT_EQ(Count(r, "matmul"), 9);
  EXPECT_EQ(Count(r, "take"), 5);                 // one embedding lookup per leaf
  EXPECT_EQ(Count(r, "broadcast_to"), 0);         // static: folded
  EXPECT_EQ(r.stats.params, 5 + 1 + 3);           // words, embeddings, parameters
  EXPECT_EQ(r.stats.unfoldings, 1 + 9 + 9);       // forward, tree per node, cell per node
}

TEST_F(PartialEvalTest, AValueUsedTwiceIsComputedOnce) {
  Rng rng(2);
  Value t = Node(Leaf(0), Leaf(1));
  Residual r = CheckResidual("twice", {t, Value(RandomUniform(rng, {2, 4}, -1, 1)), Params(rng)});
  EXPECT_EQ(Count(r, "dense"), 3);
  EXPECT_EQ(r.stats.shared_calls, 1);
}

TEST_F(PartialEvalTest, ALoopOnADynamicCounterBecomesAResidualFunction) {
  Residual r = CheckResidual("count_down", {Value(Tensor::FromVector<int64_t>({}, {5})), Value(Tensor::Scalar(1.5f))});
  ASSERT_EQ(r.functions.size(), 1u);
  // The residual function calls itself.
  bool recursive = false;
  PostOrderVisit(r.functions[0].second->body, [&](const Expr& e) {
    if (auto* g = As<GlobalNode>(e); g && g->name == r.functions[0].first) recursive = true;
  });
  EXPECT_TRUE(recursive);
  // And it is right for other counts too (the residual does not depend on 5).
  Snapshot m = r.ToModule();
  Value out = interp_.Call(*m, "main", {Value(Tensor::FromVector<int64_t>({}, {3})), Value(Tensor::Scalar(1.0f))});
  EXPECT_EQ(out.tensor().item(), 8.0);
}

// Unfolding would nest one residual `if` per step, 1000 deep, until a budget
// ran out; the counter is generalized instead and one residual loop remains.
TEST_F(PartialEvalTest, ALoopTheDataEndsCountedByALiteralBecomesOneResidualLoop) {
  auto vec = [](float a, float b) { return Value(Tensor::FromVector<float>({2}, {a, b})); };
  Residual r = CheckResidual("shrink_from_zero", {vec(3, 4)});
  EXPECT_EQ(r.functions.size(), 1u);
  EXPECT_EQ(r.stats.generalized_calls, 1);
  EXPECT_LT(r.stats.residual_ops, 20);
  Snapshot m = r.ToModule();
  for (Value x : {vec(300, 400), vec(0.01f, 0), vec(-1e30f, 1e30f)}) {  // 13 steps, none, the counter's 1000
    EXPECT_TRUE(ValueEqual(interp_.Call(*m, "main", {x}), interp_.Call(*snap(), "shrink_from_zero", {x})));
  }
  // With the bound static too: it becomes a parameter of the loop, and the
  // counter still ends it.
  Value five(Tensor::FromVector<int64_t>({}, {5})), zero(Tensor::FromVector<int64_t>({}, {0}));
  Residual bounded = CheckResidual("shrink", {vec(300, 400), zero, five}, {false, true, true});
  EXPECT_EQ(bounded.functions.size(), 1u);
  Value got = interp_.Call(*bounded.ToModule(), "main", {vec(64, 0)});
  EXPECT_EQ(got.tensor().data<float>()[0], 2.0f);  // 64 / 2^5
}

TEST_F(PartialEvalTest, ARecursionOverStaticStructureUnderADynamicIfStillUnfolds) {
  TypeDefPtr list = snap()->FindType("List");
  Value xs = Value::Adt(list, 0, {});
  for (float v : {1.0f, 2.0f, 3.0f, 4.0f}) xs = Value::Adt(list, 1, {Value(Tensor::FromVector<float>({2}, {v, -v})), xs});
  for (float gate : {1.0f, -1.0f}) {
    Residual r = CheckResidual("gated_sum", {xs, Value(Tensor::Scalar(gate))});
    EXPECT_TRUE(r.functions.empty()) << r.ToText();
    EXPECT_EQ(r.stats.generalized_calls, 0);
  }
}

TEST_F(PartialEvalTest, AllStaticInputsFoldToAConstant) {
  Residual r = CheckResidual("static_sum", {Value(Tensor::FromVector<int64_t>({}, {10}))}, {true});
  EXPECT_EQ(r.stats.residual_ops, 0);
  EXPECT_EQ(r.stats.params, 0);
  ASSERT_EQ(r.main->body->kind, ExprKind::kConstant);
  EXPECT_EQ(As<ConstantNode>(r.main->body)->value.item(), 55);
}

TEST_F(PartialEvalTest, HigherOrderFunctionsAndClosuresAreAppliedAway) {
  TypeDefPtr list = snap()->FindType("List");
  Rng rng(3);
  Value xs = Value::Adt(list, 0, {});
  for (int i = 0; i < 4; ++i) xs = Value::Adt(list, 1, {Value(RandomUniform(rng, {2}, -1, 1)), xs});
  Residual r = CheckResidual("scaled", {xs, Value(RandomUniform(rng, {2}, -1, 1))});
  EXPECT_EQ(Count(r, "mul"), 4);
  EXPECT_TRUE(r.functions.empty());
}

TEST_F(PartialEvalTest, TheResidualIsOrdinaryIrThatPrintsAndParsesBack) {
  Rng rng(4);
  Residual r = PartialEvaluate(*snap(), "forward", {Node(Leaf(0), Leaf(1)), Value(RandomUniform(rng, {2, 4}, -1, 1)), Params(rng)});
  std::string text = r.ToText();
  Module m;
  m.AddSource(text, "residual.pj");
  EXPECT_TRUE(StructuralEqual(m.snapshot()->Get("main").func, r.main)) << text;
}

TEST_F(PartialEvalTest, FuelRunningOutLeavesCallsToResidualFunctions) {
  Rng rng(5);
  Value t = Node(Node(Leaf(0), Leaf(1)), Node(Leaf(1), Leaf(0)));
  PeOptions little;
  little.fuel = 3;
  Residual r = CheckResidual("forward", {t, Value(RandomUniform(rng, {2, 4}, -1, 1)), Params(rng)}, {}, little);
  EXPECT_FALSE(r.functions.empty());
  EXPECT_EQ(r.stats.unfoldings, 3);
}

TEST_F(PartialEvalTest, ResidualSizeBudgetIsEnforced) {
  Rng rng(6);
  Value t = Node(Node(Leaf(0), Leaf(1)), Leaf(0));
  PeOptions small;
  small.max_residual_ops = 20;
  try {
    PartialEvaluate(*snap(), "forward", {t, Value(RandomUniform(rng, {2, 4}, -1, 1)), Params(rng)}, {}, small);
    FAIL() << "expected PeFailure";
  } catch (const PeFailure& e) {
    EXPECT_STREQ(e.what(), "residual over 20 operators (PeOptions::max_residual_ops)");
  }
}

// Depths past the evaluator's first stack segment (the calling thread's
// share). ThreadSanitizer's cost grows with the depth of the stack at each
// access, so its build goes less deep (still past its larger first segment).
// Its memory grows with that depth times the number of accesses too (a
// stack trace kept per access): at 4,000 levels of recursion or 8 MB of
// frames a test took 6-8 GB, and two such tests side by side exhausted the
// machine. The budget test, too, stops just past the first segment there.
#if defined(__SANITIZE_THREAD__)
constexpr int kDeepTree = 1000, kDeepRecursion = 2000;
constexpr int64_t kBudgetPastFirstSegment = int64_t{4} << 20;  // its first segment: 3 MB
#else
constexpr int kDeepTree = 2000, kDeepRecursion = 20000;
constexpr int64_t kBudgetPastFirstSegment = int64_t{8} << 20;
#endif

// The evaluator recurses with the tree; past the calling thread's share of
// stack it continues on stack segments of its own (support/stack_segments.h):
// a tree far deeper than one thread's stack specializes, and agrees with the
// interpreter.
TEST_F(PartialEvalTest, ATreeDeeperThanAThreadsStackSpecializesAndAgreesWithTheInterpreter) {
  Value t = Leaf(0);
  for (int i = 0; i < kDeepTree; ++i) t = Node(Leaf(i % 2), t);
  Rng rng(7);
  Residual r = CheckResidual("forward", {t, Value(RandomUniform(rng, {2, 4}, -1, 1)), Params(rng)});
  EXPECT_EQ(Count(r, "dense"), 2 * kDeepTree + 1);  // one cell per node
}

TEST_F(PartialEvalTest, ARecursionOfTheProgramDeeperThanAThreadsStackFoldsToItsValue) {
  Residual r = CheckResidual("static_sum", {Value(Tensor::FromVector<int64_t>({}, {kDeepRecursion}))}, {true});
  EXPECT_EQ(Count(r, "add"), 0);  // all static: folded
}

// The stack budget (over all segments) still stops a recursion, cleanly.
TEST_F(PartialEvalTest, AVeryDeepTreeStopsAtTheStackBudgetInsteadOfCrashing) {
  Value t = Leaf(0);
  for (int i = 0; i < 100000; ++i) t = Node(Leaf(0), t);
  Rng rng(7);
  PeOptions budget;
  budget.max_stack_bytes = kBudgetPastFirstSegment;  // the depth is summed across segments
  try {
    PartialEvaluate(*snap(), "forward", {t, Value(RandomUniform(rng, {1, 4}, -1, 1)), Params(rng)}, {}, budget);
    FAIL() << "expected PeFailure";
  } catch (const PeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("PeOptions::max_stack_bytes"), std::string::npos) << e.what();
  }
}

// Issue 24: where the recursion of the program (not of the argument) runs out
// of stack, the message names the expression it was evaluating.
TEST_F(PartialEvalTest, ARecursionTooDeepForTheStackBudgetNamesWhereItWas) {
  PeOptions budget;
  budget.max_stack_bytes = int64_t{4} << 20;
  try {
    PartialEvaluate(*snap(), "static_sum", {Value(Tensor::FromVector<int64_t>({}, {200000}))}, {true}, budget);
    FAIL() << "expected PeFailure";
  } catch (const PeFailure& e) {
    EXPECT_EQ(std::string(e.what()).rfind("pe.pj:", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("partial evaluation nests deeper than"), std::string::npos) << e.what();
  }
}

// Issue 23: a generic definition unfolds like any other (tests/jit's
// pipeline_test compiles @map and @fold). A residual it leaves is typed as
// its instance: a loop the data ends, in a generic @until, becomes a
// residual function over Tensor[(3,), f32], not over S, and computes what
// the interpreter does.
TEST(PartialEvalGeneric, AGenericDefinitionsResidualLoopTakesItsInstancesTypes) {
  Module m;
  m.AddSource(R"(def @until[S](%step: fn(S) -> S, %done: fn(S) -> Tensor[(), bool], %s: S, %n: Tensor[(), i64]) -> S {
  if (%done(%s)) { %s } else { if (greater(%n, 0)) { @until(%step, %done, %step(%s), sub(%n, 1)) } else { %s } }
}
def @main(%x: Tensor[(3,), f32]) -> Tensor[(3,), f32] {
  @until(fn (%v: Tensor[(3,), f32]) { mul(%v, 0.5) }, fn (%v: Tensor[(3,), f32]) { less(norm(%v), 0.1) }, %x, 100)
})",
              "until.pj");
  Value x(Tensor::FromVector<float>({3}, {1, 2, 3}));
  Residual r = PartialEvaluate(*m.snapshot(), "main", {x});
  ASSERT_EQ(r.functions.size(), 1u) << r.ToText();
  EXPECT_EQ(TypeToString(r.functions[0].second->ret_type), "Tensor[(3,), f32]") << r.ToText();
  Snapshot residual = r.ToModule();  // type-checks the residual program
  Value halved = Interpreter().Call(*m.snapshot(), "main", {x});  // 3.74 / 2^6 < 0.1
  EXPECT_TRUE(AllClose(halved.tensor(), Tensor::FromVector<float>({3}, {1 / 64.0f, 2 / 64.0f, 3 / 64.0f}), 1e-6, 0));
  Value specialized = Interpreter().Call(*residual, "main", {x});
  EXPECT_TRUE(AllClose(specialized.tensor(), halved.tensor(), 0, 0));
}

// Issue 23: a match no clause fits is reported with the value, in the
// interpreter's words.
TEST(PartialEvalErrors, AMatchNoClauseFitsShowsTheValueAsTheInterpreterDoes) {
  Module m;
  m.AddSource("type T { A, B(Tensor[(), f32]) }\n"
              "def @f(%t: T) -> Tensor[(), f32] { match (%t) { A => 0f32 } }\n",
              "m.pj");
  Value b = Value::Adt(m.snapshot()->FindType("T"), 1, {Value(Tensor::Scalar(1.0f))});
  std::string interpreted, specialized;
  try {
    Interpreter().Call(*m.snapshot(), "f", {b});
  } catch (const EvalError& e) {
    interpreted = e.what();
  }
  try {
    PartialEvaluate(*m.snapshot(), "f", {b});
  } catch (const PeFailure& e) {
    specialized = e.what();
  }
  EXPECT_EQ(specialized, "m.pj:2:36: no clause of match fits B(Tensor[(), f32])");
  EXPECT_EQ(interpreted, "@f: " + specialized);
}

// The interpreter stops a program whose values break their declared types
// where static checking cannot tell (a `?` dimension); PE refuses it, so that
// no compiled code answers where the interpreter gives an error.
TEST(PartialEvalDeclaredTypes, AResultOrLetOrFieldThatBreaksItsDeclaredTypeIsRefused) {
  Module m;
  m.AddSource(R"(type Box { B(Tensor[(3, 2), f32]) }
def @f(%x: Tensor[(?, 2), f32]) -> Tensor[(3, 2), f32] { %x }
def @g(%x: Tensor[(?, 2), f32]) -> Tensor[(), f32] { sum(@f(%x)) }
def @h(%x: Tensor[(?, 2), f32]) -> Tensor[(), f32] { let %y: Tensor[(3, 2), f32] = %x; sum(%y) }
def @box(%x: Tensor[(?, 2), f32]) -> Box { B(%x) }
)", "m.pj");
  auto error = [&](const char* entry, int64_t rows) {
    try {
      PartialEvaluate(*m.snapshot(), entry, {Value(Tensor::Zeros(DType::kF32, {rows, 2}))});
    } catch (const PeFailure& e) {
      return std::string(e.what());
    }
    return std::string("specialized");
  };
  EXPECT_EQ(error("g", 4), "m.pj:2:1: the result of @f is Tensor[(4, 2), f32], not its declared Tensor[(3, 2), f32]");
  EXPECT_EQ(error("h", 4), "m.pj:4:54: %y is Tensor[(4, 2), f32], not its annotated Tensor[(3, 2), f32]");
  EXPECT_EQ(error("box", 4), "m.pj:5:44: field 0 of B is Tensor[(4, 2), f32], not its declared Tensor[(3, 2), f32]");
  for (const char* entry : {"g", "h", "box"}) EXPECT_EQ(error(entry, 3), "specialized") << entry;
}

TEST_F(PartialEvalTest, SignaturesDependOnStructureNotOnDynamicContents) {
  Rng rng(8);
  Value emb = Value(RandomUniform(rng, {3, 4}, -1, 1));
  Value p = Params(rng);
  Signature a = ComputeSignature({Node(Leaf(0), Leaf(1)), emb, p});
  Signature b = ComputeSignature({Node(Leaf(2), Leaf(2)), Value(RandomUniform(rng, {3, 4}, -1, 1)), Params(rng)});
  Signature c = ComputeSignature({Node(Leaf(0), Node(Leaf(1), Leaf(2))), emb, p});
  Signature d = ComputeSignature({Node(Leaf(0), Leaf(1)), Value(RandomUniform(rng, {4, 4}, -1, 1)), p});
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  EXPECT_EQ(a.ShortHash().size(), 8u);
  // A static argument's value is part of the signature.
  EXPECT_NE(ComputeSignature({Value(Tensor::Scalar(1.0f))}, {true}), ComputeSignature({Value(Tensor::Scalar(2.0f))}, {true}));
  EXPECT_EQ(ComputeSignature({Value(Tensor::Scalar(1.0f))}), ComputeSignature({Value(Tensor::Scalar(2.0f))}));
}

TEST_F(PartialEvalTest, FlattenGivesTheDynamicLeavesInOrder) {
  Tensor e = Tensor::Zeros(DType::kF32, {3, 4});
  std::vector<Tensor> leaves = Flatten({Node(Leaf(7), Leaf(9)), Value(e)});
  ASSERT_EQ(leaves.size(), 3u);
  EXPECT_EQ(leaves[0].item(), 7);
  EXPECT_EQ(leaves[1].item(), 9);
  EXPECT_EQ(leaves[2].raw_data(), e.raw_data());
  EXPECT_EQ(Flatten({Value(e), Value(e)}, {true, false}).size(), 1u);
}

TEST_F(PartialEvalTest, RandomTreesAgreeWithTheInterpreter) {
  Rng rng(2024);
  for (int trial = 0; trial < 20; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    Value t = RandomTree(rng, static_cast<int>(rng.NextInt(1, 12)), 6);
    Residual r = CheckResidual("forward", {t, Value(RandomUniform(rng, {6, 4}, -1, 1)), Params(rng)});
    EXPECT_TRUE(r.functions.empty());
  }
}

// A tuple pattern on the pair a dynamic `if` returns (a residual tuple)
// takes it apart with projections, nested tuples and wildcards included;
// it used to be refused as "match on a dynamic value" (found by
// tests/jit:differential_test).
TEST(PartialEvalTuplePatternTest, ATuplePatternOnADynamicTupleProjectsItsFields) {
  Module m;
  m.AddSource(R"(
def @pick(%x: Tensor[(3,), f32], %y: Tensor[(), f32]) -> Tensor[(3,), f32] {
  match (if (greater(%y, 0f32)) { ((tanh(%x), %y), %x) } else { ((%x, neg(%y)), sigmoid(%x)) }) {
    ((%a, %b), _) => mul(%a, %b),
  }
})", "t.pj");
  Snapshot s = m.snapshot();
  Interpreter interp;
  for (float y : {0.5f, -0.25f}) {
    std::vector<Value> args = {Value(Tensor::FromVector<float>({3}, {0.1f, -0.2f, 0.3f})), Value(Tensor::Scalar(y))};
    Residual r = PartialEvaluate(*s, "pick", args);
    Value got = interp.Call(*r.ToModule(), "main", {args[0], args[1]});
    EXPECT_TRUE(ValueEqual(got, interp.Call(*s, "pick", args))) << r.ToText();
    int ifs = 0, projections = 0;
    PostOrderVisit(r.main->body, [&](const Expr& e) {
      ifs += e->kind == ExprKind::kIf;
      projections += e->kind == ExprKind::kProj;
    });
    EXPECT_EQ(ifs, 1) << r.ToText();
    EXPECT_EQ(projections, 3) << r.ToText();  // .0 of the pair, then .0 and .1 of it; not the wildcard
  }
}

// Issue 23: a dynamic `if` that returns a function. The residual program
// cannot hold a function, so the `if` returns what the functions captured
// (each branch the other's as zeros) and each use of the value runs under a
// residual `if` of the same condition: values and gradients agree with the
// interpreter on both sides of the condition.
constexpr char kChoices[] = R"(
type Opt { None, Some(Tensor[(3,), f32]) }

def @act(%x: Tensor[(3,), f32], %y: Tensor[(), f32], %w: Tensor[(3,), f32]) -> Tensor[(), f32] {
  let %h = tanh(%w);
  let %f = if (greater(%y, 0f32)) {
    let %s = mul(%h, %y);
    fn (%v: Tensor[(3,), f32]) -> Tensor[(3,), f32] { add(%v, %s) }
  } else {
    fn (%v: Tensor[(3,), f32]) -> Tensor[(3,), f32] { sigmoid(mul(%v, %w)) }
  };
  sum(mul(%f(%x), %f(neg(%x))))
}

# A function and a tensor chosen together, taken apart by a tuple pattern.
def @pair(%x: Tensor[(3,), f32], %y: Tensor[(), f32]) -> Tensor[(), f32] {
  match (if (greater(%y, 0f32)) { (fn (%v: Tensor[(3,), f32]) { tanh(%v) }, mul(%x, %y)) }
         else { (fn (%v: Tensor[(3,), f32]) { exp(%v) }, %x) }) {
    (%g, %z) => sum(add(%g(%x), %z)),
  }
}

# The tensor half of a chosen pair, projected: a select of the two.
def @projected(%x: Tensor[(3,), f32], %y: Tensor[(), f32]) -> Tensor[(), f32] {
  let %p = if (greater(%y, 0f32)) { (fn (%v: Tensor[(3,), f32]) { tanh(%v) }, mul(%x, %y)) }
           else { (fn (%v: Tensor[(3,), f32]) { exp(%v) }, %x) };
  sum(mul(%p.1, %p.0(%x)))
}

# A chosen function mapped over a list: one residual `if` per element.
def @mapped(%xs: List[Tensor[(3,), f32]], %y: Tensor[(), f32]) -> Tensor[(), f32] {
  let %f = if (less(%y, 0f32)) { fn (%v: Tensor[(3,), f32]) { mul(%v, %y) } } else { fn (%v: Tensor[(3,), f32]) { %v } };
  sum(@fold(fn (%acc: Tensor[(3,), f32], %v: Tensor[(3,), f32]) { add(%acc, %v) }, zeros(shape=[3], dtype=f32), @map(%f, %xs)))
}

# A chosen function whose result is a constructor, matched on.
def @maybe(%x: Tensor[(3,), f32], %y: Tensor[(), f32]) -> Tensor[(), f32] {
  let %f = if (greater(%y, 0f32)) { fn (%v: Tensor[(3,), f32]) { Some(mul(%v, %y)) } } else { fn (%v: Tensor[(3,), f32]) { None } };
  sum(match (%f(%x)) { None => %x, Some(%z) => exp(%z) })
}

# A chosen step function driving a loop the data ends: the residual loop
# takes the choice's condition and what its functions capture.
def @until[S](%step: fn(S) -> S, %done: fn(S) -> Tensor[(), bool], %s: S, %n: Tensor[(), i64]) -> S {
  if (%done(%s)) { %s } else { if (greater(%n, 0)) { @until(%step, %done, %step(%s), sub(%n, 1)) } else { %s } }
}
def @shrink(%x: Tensor[(3,), f32], %y: Tensor[(), f32]) -> Tensor[(), f32] {
  let %step = if (greater(%y, 0f32)) { fn (%v: Tensor[(3,), f32]) { mul(%v, 0.5) } } else { fn (%v: Tensor[(3,), f32]) { mul(%v, %y) } };
  sum(@until(%step, fn (%v: Tensor[(3,), f32]) { less(norm(%v), 0.1) }, %x, 100))
}

def @leaks(%y: Tensor[(), f32]) -> fn(Tensor[(3,), f32]) -> Tensor[(3,), f32] {
  if (greater(%y, 0f32)) { fn (%v: Tensor[(3,), f32]) { tanh(%v) } } else { fn (%v: Tensor[(3,), f32]) { %v } }
}
)";

class PartialEvalChoiceTest : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(kChoices, "choices.pj"); }

  // PE of `entry` on `args` (all dynamic); the residual against the original,
  // values and the gradient with respect to argument 0.
  Residual Check(const std::string& entry, const std::vector<Value>& args) {
    Snapshot s = module_.snapshot();
    Residual r = PartialEvaluate(*s, entry, args);
    Snapshot residual = r.ToModule();  // type-checks
    std::vector<Value> leaves;
    for (const Tensor& t : Flatten(args, {})) leaves.emplace_back(t);
    Interpreter interp;
    Interpreter::ValueAndGrad want = interp.CallWithGrad(*s, entry, args, {0});
    Interpreter::ValueAndGrad got = interp.CallWithGrad(*residual, "main", leaves, {0});
    EXPECT_TRUE(ValueAllClose(got.value, want.value, 1e-6, 1e-7)) << got.value.ToString() << "\n" << r.ToText();
    if (args[0].is_tensor()) {
      EXPECT_TRUE(ValueAllClose(got.grads[0], want.grads[0], 1e-6, 1e-7)) << got.grads[0].ToString() << "\n" << r.ToText();
    }
    return r;
  }
  static int Ifs(const Residual& r) {
    int n = 0;
    PostOrderVisit(r.main->body, [&](const Expr& e) { n += e->kind == ExprKind::kIf; });
    return n;
  }
  static Value Vec(float a, float b, float c) { return Value(Tensor::FromVector<float>({3}, {a, b, c})); }

  Module module_;
};

TEST_F(PartialEvalChoiceTest, AFunctionADynamicIfReturnsIsAppliedUnderTheSameCondition) {
  for (float y : {0.5f, -0.25f}) {
    SCOPED_TRACE("y = " + std::to_string(y));
    Residual r = Check("act", {Vec(0.1f, -0.2f, 0.3f), Value(Tensor::Scalar(y)), Vec(0.7f, -0.1f, 0.2f)});
    // The choice (returning %s, computed in the then-branch), and one `if` per call of %f.
    EXPECT_EQ(Ifs(r), 3) << r.ToText();
  }
}

TEST_F(PartialEvalChoiceTest, ATupleOfAFunctionAndATensorIsTakenApartByItsPattern) {
  for (float y : {2.0f, -1.0f}) {
    Residual r = Check("pair", {Vec(0.1f, -0.2f, 0.3f), Value(Tensor::Scalar(y))});
    // The choice (returning mul(%x, %y)), and the match's clause on each side.
    EXPECT_EQ(Ifs(r), 2) << r.ToText();
  }
}

TEST_F(PartialEvalChoiceTest, ATensorProjectedFromAChoiceIsASelectOfTheTwo) {
  for (float y : {2.0f, -1.0f}) {
    Residual r = Check("projected", {Vec(0.1f, -0.2f, 0.3f), Value(Tensor::Scalar(y))});
    int wheres = 0;
    PostOrderVisit(r.main->body, [&](const Expr& e) {
      if (auto* op = As<OpCallNode>(e); op && op->op->name == "where") ++wheres;
    });
    EXPECT_EQ(wheres, 1) << r.ToText();
  }
}

TEST_F(PartialEvalChoiceTest, AChosenFunctionMapsOverAListElementByElement) {
  Snapshot s = module_.snapshot();
  TypeDefPtr list = s->FindType("List");
  for (float y : {-0.5f, 0.5f}) {
    Value xs = Value::Adt(list, list->FindCtor("Nil"), {});
    for (int i = 0; i < 4; ++i) xs = Value::Adt(list, list->FindCtor("Cons"), {Vec(0.1f * i, -0.2f, 0.3f + i), xs});
    Residual r = Check("mapped", {xs, Value(Tensor::Scalar(y))});
    // One per element; the choice itself needs none: its functions capture
    // only %y, which is there before the `if`.
    EXPECT_EQ(Ifs(r), 4) << r.ToText();
  }
}

TEST_F(PartialEvalChoiceTest, AConstructorAChosenFunctionReturnsIsMatchedOnEachSide) {
  for (float y : {1.5f, -1.5f}) Check("maybe", {Vec(0.1f, -0.2f, 0.3f), Value(Tensor::Scalar(y))});
}

TEST_F(PartialEvalChoiceTest, AChosenFunctionDrivesAResidualLoop) {
  for (float y : {2.0f, -0.5f}) {
    Residual r = Check("shrink", {Vec(1.0f, -2.0f, 3.0f), Value(Tensor::Scalar(y))});
    EXPECT_EQ(r.functions.size(), 1u) << r.ToText();
  }
}

TEST_F(PartialEvalChoiceTest, AChosenFunctionThatReachesTheResultIsRefusedWithItsPlace) {
  try {
    PartialEvaluate(*module_.snapshot(), "leaks", {Value(Tensor::Scalar(1.0f))});
    FAIL() << "a function result specialized";
  } catch (const PeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("choices.pj:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("function"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pejit
