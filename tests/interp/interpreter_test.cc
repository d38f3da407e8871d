// The interpreter runs any program of the language and gives the reference
// answer; value_and_grad agrees with finite differences.
#include <gtest/gtest.h>

#include <atomic>
#include <regex>
#include <thread>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "ops/eager.h"
#include "ops/random.h"

namespace pejit {
namespace {

constexpr char kTrees[] = R"(
type Tree {
  Leaf(Tensor[(), i64]),
  Node(Tree, Tree),
}
type List[T] { Nil, Cons(T, List[T]) }

def @size(%t: Tree) -> Tensor[(), i64] {
  match (%t) {
    Leaf(_) => 1,
    Node(%l, %r) => add(@size(%l), @size(%r)),
  }
}

# Sum of the leaves' embedding rows, each scaled by 2^(depth).
def @weigh(%t: Tree, %emb: Tensor[(?, 3), f32]) -> Tensor[(1, 3), f32] {
  match (%t) {
    Leaf(%w) => take(%emb, reshape(%w, shape=[1])),
    Node(%l, %r) => mul(add(@weigh(%l, %emb), @weigh(%r, %emb)), 2f32),
  }
}

def @map(%f: fn(Tensor[(), i64]) -> Tensor[(), i64], %xs: List[Tensor[(), i64]]) -> List[Tensor[(), i64]] {
  match (%xs) {
    Nil => Nil,
    Cons(%x, %rest) => Cons(%f(%x), @map(%f, %rest)),
  }
}

def @sum_list(%xs: List[Tensor[(), i64]]) -> Tensor[(), i64] {
  match (%xs) { Nil => 0, Cons(%x, %rest) => add(%x, @sum_list(%rest)) }
}

# Adds %k to each element with a closure, then sums.
def @shifted_sum(%xs: List[Tensor[(), i64]], %k: Tensor[(), i64]) -> Tensor[(), i64] {
  let %shift = fn (%x: Tensor[(), i64]) -> Tensor[(), i64] { add(%x, %k) };
  @sum_list(@map(%shift, %xs))
}

def @count_down(%n: Tensor[(), i64]) -> Tensor[(), i64] {
  if (greater(%n, 0)) { @count_down(sub(%n, 1)) } else { %n }
}

def @forever(%n: Tensor[(), i64]) -> Tensor[(), i64] { add(@forever(%n), 1) }
)";

class InterpreterTest : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(kTrees, "trees.pj"); }
  Snapshot snap() const { return module_.snapshot(); }
  Value Leaf(int64_t w) const { return Value::Adt(snap()->FindType("Tree"), 0, {Value(Tensor::FromVector<int64_t>({}, {w}))}); }
  Value Node(Value l, Value r) const { return Value::Adt(snap()->FindType("Tree"), 1, {std::move(l), std::move(r)}); }
  Value List(std::vector<int64_t> xs) const {
    TypeDefPtr list = snap()->FindType("List");
    Value v = Value::Adt(list, 0, {});
    for (auto it = xs.rbegin(); it != xs.rend(); ++it) v = Value::Adt(list, 1, {Value(Tensor::FromVector<int64_t>({}, {*it})), v});
    return v;
  }
  static Value I(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

  Module module_;
  Interpreter interp_;
};

TEST_F(InterpreterTest, RecursionOverTreesAndMatch) {
  Value t = Node(Node(Leaf(1), Leaf(2)), Leaf(3));
  EXPECT_EQ(interp_.Call(*snap(), "size", {t}).tensor().item(), 3);
}

TEST_F(InterpreterTest, HigherOrderFunctionsAndClosures) {
  EXPECT_EQ(interp_.Call(*snap(), "shifted_sum", {List({1, 2, 3}), I(10)}).tensor().item(), 36);
  EXPECT_EQ(interp_.Call(*snap(), "shifted_sum", {List({}), I(10)}).tensor().item(), 0);
}

TEST_F(InterpreterTest, TensorsAndEmbeddings) {
  Tensor emb = Tensor::FromVector<float>({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Value out = interp_.Call(*snap(), "weigh", {Node(Leaf(0), Node(Leaf(2), Leaf(1))), Value(emb)});
  // 2*(row0 + 2*(row2 + row1)) = 2*row0 + 4*row1 + 4*row2
  EXPECT_TRUE(Equal(out.tensor(), Tensor::FromVector<float>({1, 3}, {2 + 16 + 28, 4 + 20 + 32, 6 + 24 + 36})));
}

// `.name` reads the same field as its index, whatever the order of the names.
TEST(InterpreterRecords, AFieldByNameIsTheFieldAtItsIndex) {
  Module m;
  m.AddSource(R"(
type Params = {w: Tensor[(2,), f32], b: Tensor[(2,), f32], scale: Tensor[(), f32]};
def @by_name(%p: Params, %x: Tensor[(2,), f32]) { mul(add(mul(%x, %p.w), %p.b), %p.scale) }
def @by_index(%p: Params, %x: Tensor[(2,), f32]) { mul(add(mul(%x, %p.0), %p.1), %p.2) }
)",
              "records.pj");
  Value params = Value::Tuple({Value(Tensor::FromVector<float>({2}, {2, 3})), Value(Tensor::FromVector<float>({2}, {1, -1})),
                               Value(Tensor::FromVector<float>({}, {10}))});
  Value x(Tensor::FromVector<float>({2}, {5, 7}));
  Interpreter interp;
  Value got = interp.Call(*m.snapshot(), "by_name", {params, x});
  EXPECT_TRUE(Equal(got.tensor(), Tensor::FromVector<float>({2}, {110, 200})));
  EXPECT_TRUE(Equal(got.tensor(), interp.Call(*m.snapshot(), "by_index", {params, x}).tensor()));
}

TEST_F(InterpreterTest, TailRecursionRunsInConstantSpace) {
  InterpreterOptions small;
  small.max_frames = 64;
  Interpreter tight(small);
  EXPECT_EQ(tight.Call(*snap(), "count_down", {I(100000)}).tensor().item(), 0);
}

TEST_F(InterpreterTest, AHundredThousandDeepTreeEvaluates) {
  Value t = Leaf(0);
  for (int i = 0; i < 100000; ++i) t = Node(Leaf(1), t);
  EXPECT_EQ(interp_.Call(*snap(), "size", {t}).tensor().item(), 100001);
}

// Gradients for a structure argument nested 100,000 deep (float leaves in
// every node): the leaves are collected and the gradient rebuilt without
// native recursion.
TEST(InterpreterGradients, AStructureArgumentAHundredThousandDeepGetsItsGradient) {
  Module m;
  m.AddSource(R"(type L { E, C(Tensor[(), f32], L) }
def @sum(%l: L, %acc: Tensor[(), f32]) -> Tensor[(), f32] {
  match (%l) { E => %acc, C(%x, %rest) => @sum(%rest, add(%acc, mul(%x, %x))) }
}
def @loss(%l: L) -> Tensor[(), f32] { @sum(%l, 0f32) })", "l.pj");
  TypeDefPtr l = m.snapshot()->FindType("L");
  const int n = 100000;
  Value list = Value::Adt(l, 0, {});
  for (int i = 0; i < n; ++i) list = Value::Adt(l, 1, {Value(Tensor::Scalar(static_cast<float>(i % 7))), list});
  Interpreter interp;
  Interpreter::ValueAndGrad vg = interp.CallWithGrad(*m.snapshot(), "loss", {list}, {0});
  int64_t at = 0;
  for (const Value* v = &vg.grads[0]; v->tag() == 1; v = &v->fields()[1], ++at) {
    // The list was built from its end: element `at` holds (n - 1 - at) % 7; d(x^2)/dx = 2x.
    ASSERT_EQ(v->fields()[0].tensor().item(), 2.0 * ((n - 1 - at) % 7)) << at;
  }
  EXPECT_EQ(at, n);
}

TEST_F(InterpreterTest, RunawayRecursionStopsAtTheFrameLimit) {
  InterpreterOptions small;
  small.max_frames = 10000;
  Interpreter tight(small);
  try {
    tight.Call(*snap(), "forever", {I(1)});
    FAIL() << "expected an error";
  } catch (const EvalError& e) {
    EXPECT_STREQ(e.what(),
                 "@forever: trees.pj:44:56: recursion too deep: more than 10000 interpreter frames "
                 "(InterpreterOptions::max_frames)");
  }
}

// ---- Errors name the entry, the argument or the location ---------------------

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const EvalError& e) {
    return e.what();
  }
  return "";
}

TEST_F(InterpreterTest, BadArgumentsNameTheEntryAndArgument) {
  EXPECT_EQ(ErrorOf([&] { interp_.Call(*snap(), "size", {}); }), "@size takes 1 argument, got 0");
  EXPECT_EQ(ErrorOf([&] { interp_.Call(*snap(), "size", {I(3)}); }),
            "@size: argument 0 (%t): expected Tree, got Tensor[(), i64]");
  Tensor emb = Tensor::Zeros(DType::kF32, {3, 4});
  EXPECT_EQ(ErrorOf([&] { interp_.Call(*snap(), "weigh", {Leaf(0), Value(emb)}); }),
            "@weigh: argument 1 (%emb): expected Tensor[(?, 3), f32], got Tensor[(3, 4), f32]");
  EXPECT_EQ(ErrorOf([&] { interp_.Call(*snap(), "sise", {Leaf(0)}); }),
            "unknown definition '@sise'; did you mean '@size'?");
  Value bad_leaf = Value::Adt(snap()->FindType("Tree"), 0, {Value(Tensor::Scalar(1.0f))});
  EXPECT_EQ(ErrorOf([&] { interp_.Call(*snap(), "size", {Node(Leaf(0), bad_leaf)}); }),
            "@size: field 0 of Leaf of field 1 of Node of argument 0 (%t): expected Tensor[(), i64], got "
            "Tensor[(), f32]");
}

TEST_F(InterpreterTest, RuntimeErrorsNameTheSourceLocation) {
  Tensor emb = Tensor::Zeros(DType::kF32, {2, 3});
  EXPECT_EQ(ErrorOf([&] { interp_.Call(*snap(), "weigh", {Node(Leaf(0), Leaf(5)), Value(emb)}); }),
            "@weigh: trees.pj:18:17: take: index 5 is out of range for table rows of size 2");
}

TEST(InterpreterErrors, NonExhaustiveMatchIsAnErrorWhenItHappens) {
  Module m;
  m.AddSource("type T { A, B }\ndef @f(%t: T) { match (%t) { A => 1 } }", "m.pj");
  Interpreter interp;
  Value b = Value::Adt(m.snapshot()->FindType("T"), 1, {});
  EXPECT_EQ(ErrorOf([&] { interp.Call(*m.snapshot(), "f", {b}); }), "@f: m.pj:2:17: no clause of match fits B");
}

TEST(InterpreterErrors, GradientsNeedAScalarF32Loss) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(2,), f32]) { exp(%x) }", "m.pj");
  Interpreter interp;
  EXPECT_EQ(ErrorOf([&] { interp.CallWithGrad(*m.snapshot(), "f", {Value(Tensor::Zeros(DType::kF32, {2}))}, {0}); }),
            "@f: value_and_grad needs a scalar f32 loss (Tensor[(), f32]), got Tensor[(2,), f32]");
  EXPECT_EQ(ErrorOf([&] { interp.CallWithGrad(*m.snapshot(), "f", {Value(Tensor::Zeros(DType::kF32, {2}))}, {3}); }),
            "@f: wrt index 3 is not an argument (it takes 1)");
}

TEST(InterpreterErrors, AnIndexNamedTwiceGetsTheSameGradientAndOneThatCannotHoldFloatsIsAnError) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(2,), f32], %k: Tensor[(), i64]) -> Tensor[(), f32] { sum(mul(%x, %x)) }", "m.pj");
  Interpreter interp;
  std::vector<Value> args = {Value(Tensor::FromVector<float>({2}, {1, 3})), Value(Tensor::FromVector<int64_t>({}, {2}))};
  Interpreter::ValueAndGrad r = interp.CallWithGrad(*m.snapshot(), "f", args, {0, 0});
  ASSERT_EQ(r.grads.size(), 2u);
  const Tensor want = Tensor::FromVector<float>({2}, {2, 6});
  EXPECT_TRUE(Equal(r.grads[0].tensor(), want));  // not zeros: the first watch is the one the program reads
  EXPECT_TRUE(Equal(r.grads[1].tensor(), want));
  EXPECT_EQ(ErrorOf([&] { interp.CallWithGrad(*m.snapshot(), "f", args, {1}); }),
            "@f: wrt argument 1 (%k: Tensor[(), i64]) cannot hold a float tensor, so it has no gradient");
}

// What static checking cannot see (a `?` dimension) is checked when the value
// arrives: a function's result, an annotated `let`, a constructor's field.
TEST(InterpreterErrors, DeclaredTypesAreCheckedWhereStaticCheckingCannotTell) {
  Module m;
  m.AddSource(R"(type Box { B(Tensor[(3, 2), f32]) }
def @f(%x: Tensor[(?, 2), f32]) -> Tensor[(3, 2), f32] { %x }
def @g(%x: Tensor[(?, 2), f32]) -> Tensor[(), f32] { sum(@f(%x)) }
def @h(%x: Tensor[(?, 2), f32]) -> Tensor[(), f32] { let %y: Tensor[(3, 2), f32] = %x; sum(%y) }
def @box(%x: Tensor[(?, 2), f32]) -> Box { B(%x) }
)", "m.pj");
  Interpreter interp;
  const std::vector<Value> four = {Value(Tensor::Zeros(DType::kF32, {4, 2}))};
  const std::vector<Value> three = {Value(Tensor::Zeros(DType::kF32, {3, 2}))};
  EXPECT_EQ(ErrorOf([&] { interp.Call(*m.snapshot(), "f", four); }),
            "@f: m.pj:2:1: the result of @f is Tensor[(4, 2), f32], not its declared Tensor[(3, 2), f32]");
  EXPECT_EQ(ErrorOf([&] { interp.Call(*m.snapshot(), "g", four); }),
            "@g: m.pj:2:1: the result of @f is Tensor[(4, 2), f32], not its declared Tensor[(3, 2), f32]");
  EXPECT_EQ(ErrorOf([&] { interp.Call(*m.snapshot(), "h", four); }),
            "@h: m.pj:4:54: %y is Tensor[(4, 2), f32], not its annotated Tensor[(3, 2), f32]");
  EXPECT_EQ(ErrorOf([&] { interp.Call(*m.snapshot(), "box", four); }),
            "@box: m.pj:5:44: field 0 of B is Tensor[(4, 2), f32], not its declared Tensor[(3, 2), f32]");
  for (const char* entry : {"f", "g", "h", "box"}) EXPECT_NO_THROW(interp.Call(*m.snapshot(), entry, three)) << entry;
}

// ---- Gradients against finite differences --------------------------------------
//
// The f32 program's tape gradient is compared with central differences of
// the same program in f64 (its text with f32 replaced by f64), so the
// reference is precise and the tolerance is f32's.

struct GradProgram {
  std::string name;
  std::string text;  // in f32
  std::string entry;
  std::function<std::vector<Value>(const ModuleSnapshot&, DType)> args;
  std::vector<int> wrt;
};

Value Cast(const Value& v, DType dtype) {
  if (v.is_tensor()) {
    return IsFloat(v.tensor().dtype()) ? Value(CallOp("cast", {v.tensor()}, {{"dtype", dtype}})) : v;
  }
  if (v.kind() == Value::Kind::kTuple || v.kind() == Value::Kind::kAdt) {
    std::vector<Value> fields;
    for (const Value& f : v.fields()) fields.push_back(Cast(f, dtype));
    return v.kind() == Value::Kind::kTuple ? Value::Tuple(fields) : Value::Adt(v.adt(), v.tag(), fields);
  }
  return v;
}

// Float tensors of a value, in order.
void Leaves(const Value& v, std::vector<Tensor>& out) {
  if (v.is_tensor()) {
    if (IsFloat(v.tensor().dtype())) out.push_back(v.tensor());
  } else if (v.kind() == Value::Kind::kTuple || v.kind() == Value::Kind::kAdt) {
    for (const Value& f : v.fields()) Leaves(f, out);
  }
}

void CheckAgainstFiniteDifferences(const GradProgram& p) {
  SCOPED_TRACE(p.name);
  Module m32, m64;
  m32.AddSource(p.text, p.name + ".pj");
  m64.AddSource(std::regex_replace(p.text, std::regex("f32"), "f64"), p.name + "_f64.pj");
  Interpreter interp;
  std::vector<Value> args32 = p.args(*m32.snapshot(), DType::kF32);
  Interpreter::ValueAndGrad vg = interp.CallWithGrad(*m32.snapshot(), p.entry, args32, p.wrt);

  // Same values in f64 (the f32 values, widened), with types from the f64 module.
  std::vector<Value> args64;
  for (const Value& a : args32) args64.push_back(Cast(a, DType::kF64));
  auto loss64 = [&](const std::vector<Value>& args) {
    return interp.Call(*m64.snapshot(), p.entry, args).tensor().item();
  };
  EXPECT_NEAR(vg.value.tensor().item(), loss64(args64), 1e-4 * std::max(1.0, std::abs(loss64(args64))));
  const double h = 1e-6;
  for (size_t k = 0; k < p.wrt.size(); ++k) {
    std::vector<Tensor> analytic, params;
    Leaves(vg.grads[k], analytic);
    Leaves(args64[p.wrt[k]], params);
    ASSERT_EQ(analytic.size(), params.size());
    for (size_t leaf = 0; leaf < params.size(); ++leaf) {
      for (int64_t i = 0; i < params[leaf].numel(); ++i) {
        double* x = params[leaf].data<double>() + i;  // args64 shares these buffers
        double saved = *x;
        *x = saved + h;
        double up = loss64(args64);
        *x = saved - h;
        double down = loss64(args64);
        *x = saved;
        double numeric = (up - down) / (2 * h);
        EXPECT_NEAR(analytic[leaf].ElementAsDouble(i), numeric, 2e-3 * std::max(1.0, std::abs(numeric)))
            << "argument " << p.wrt[k] << " leaf " << leaf << " element " << i;
      }
    }
  }
}

Value RandomTensor(Rng& rng, Shape shape, DType dtype) { return Value(RandomUniform(rng, std::move(shape), -1, 1, dtype)); }

constexpr char kTreeLstm[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }

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

def @loss(%t: Tree, %emb: Tensor[(?, 4), f32], %p: (Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32]),
          %w_out: Tensor[(2, 3), f32], %label: Tensor[(1,), i64]) -> Tensor[(), f32] {
  let %root = @tree(%t, %emb, %p);
  cross_entropy(matmul(%root.0, %w_out, transpose_b=true), %label)
}
)";

std::vector<GradProgram> Programs() {
  std::vector<GradProgram> out;
  out.push_back({"if_both_ways",
                 "def @f(%x: Tensor[(3,), f32], %flip: Tensor[(), bool]) -> Tensor[(), f32] {\n"
                 "  if (%flip) { sum(mul(%x, %x)) } else { sum(exp(%x)) }\n}",
                 "f",
                 [](const ModuleSnapshot&, DType d) {
                   Rng rng(1);
                   return std::vector<Value>{RandomTensor(rng, {3}, d), Value(Tensor::FromVector<bool>({}, {true}))};
                 },
                 {0}});
  out.push_back({"closure_capturing_a_weight",
                 "def @f(%x: Tensor[(2, 3), f32], %w: Tensor[(3,), f32]) -> Tensor[(), f32] {\n"
                 "  let %scale = fn (%v: Tensor[(2, 3), f32]) { tanh(mul(%v, %w)) };\n"
                 "  mean(%scale(%scale(%x)))\n}",
                 "f",
                 [](const ModuleSnapshot&, DType d) {
                   Rng rng(2);
                   return std::vector<Value>{RandomTensor(rng, {2, 3}, d), RandomTensor(rng, {3}, d)};
                 },
                 {0, 1}});
  out.push_back({"tree_lstm_over_a_tree", kTreeLstm, "loss",
                 [](const ModuleSnapshot& m, DType d) {
                   Rng rng(3);
                   TypeDefPtr tree = m.FindType("Tree");
                   auto leaf = [&](int64_t w) { return Value::Adt(tree, 0, {Value(Tensor::FromVector<int64_t>({}, {w}))}); };
                   auto node = [&](Value l, Value r) { return Value::Adt(tree, 1, {l, r}); };
                   Value t = node(node(leaf(0), leaf(2)), node(leaf(1), node(leaf(2), leaf(0))));
                   Value params = Value::Tuple({RandomTensor(rng, {12, 4}, d), RandomTensor(rng, {12, 3}, d),
                                                RandomTensor(rng, {12}, d)});
                   return std::vector<Value>{t, RandomTensor(rng, {3, 4}, d), params, RandomTensor(rng, {2, 3}, d),
                                             Value(Tensor::FromVector<int64_t>({1}, {1}))};
                 },
                 {1, 2, 3}});
  return out;
}

TEST(InterpreterGradients, MatchFiniteDifferences) {
  for (const GradProgram& p : Programs()) CheckAgainstFiniteDifferences(p);
}

TEST(InterpreterGradients, GradientsComeBackInTheArgumentsStructure) {
  GradProgram p = Programs()[2];
  Module m;
  m.AddSource(p.text, "t.pj");
  Interpreter interp;
  std::vector<Value> args = p.args(*m.snapshot(), DType::kF32);
  Interpreter::ValueAndGrad vg = interp.CallWithGrad(*m.snapshot(), "loss", args, {2});
  ASSERT_EQ(vg.grads.size(), 1u);
  EXPECT_EQ(vg.grads[0].Describe(), "(Tensor[(12, 4), f32], Tensor[(12, 3), f32], Tensor[(12,), f32])");
  // The tree has no float leaves: no gradient to give (it used to come back
  // unchanged, an answer that looked like one).
  EXPECT_THROW(interp.CallWithGrad(*m.snapshot(), "loss", args, {2, 0}), EvalError);
}

TEST(InterpreterGradients, TheSameBufferPassedTwiceIsTwoLeaves) {
  Module m;
  m.AddSource("def @f(%a: Tensor[(2,), f32], %b: Tensor[(2,), f32]) -> Tensor[(), f32] { sum(mul(%a, exp(%b))) }",
              "t.pj");
  Interpreter interp;
  Tensor x = Tensor::FromVector<float>({2}, {0.5f, -1.0f});
  auto vg = interp.CallWithGrad(*m.snapshot(), "f", {Value(x), Value(x)}, {0, 1});
  Tensor e = CallOp("exp", {x});
  EXPECT_TRUE(AllClose(vg.grads[0].tensor(), e));                        // d/da = exp(b)
  EXPECT_TRUE(AllClose(vg.grads[1].tensor(), CallOp("mul", {x, e})));    // d/db = a * exp(b)
}

// ---- Concurrency --------------------------------------------------------------------

TEST_F(InterpreterTest, ManyThreadsCallTheSameModule) {
  Tensor emb = Tensor::FromVector<float>({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Value t = Node(Node(Leaf(1), Leaf(2)), Node(Leaf(0), Leaf(2)));
  Value expected = interp_.Call(*snap(), "weigh", {t, Value(emb)});
  std::atomic<int> agree{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        if (ValueEqual(interp_.Call(*snap(), "weigh", {t, Value(emb)}), expected) &&
            interp_.Call(*snap(), "shifted_sum", {List({1, 2}), I(1)}).tensor().item() == 5) {
          agree.fetch_add(1);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(agree.load(), 200);
}

}  // namespace
}  // namespace pejit
