// Type and shape inference: what a definition's type is, and which programs
// are refused, with the message and the file:line:col of the culprit. (A
// variable is reported at the expression using it: its node carries the
// location where it was declared.)
#include <gtest/gtest.h>

#include "ir/module.h"

namespace pejit {
namespace {

// The type of @name after adding `text` to a fresh module.
std::string TypeOf(const std::string& text, const std::string& name) {
  Module m;
  m.AddSource(text, "t.pj");
  return TypeToString(m.snapshot()->Get(name).type);
}

// The error adding `text` gives, or "" when it type-checks.
std::string ErrorOf(const std::string& text) {
  Module m;
  try {
    m.AddSource(text, "t.pj");
  } catch (const IrError& e) {
    return e.what();
  }
  return "";
}

TEST(TypeCheck, ResultTypesAreInferredThroughOperators) {
  EXPECT_EQ(TypeOf("def @f(%x: Tensor[(3, 4), f32], %w: Tensor[(4, 5), f32]) {\n"
                   "  let %y = matmul(%x, %w);\n"
                   "  sum(%y, axes=[1])\n"
                   "}",
                   "f"),
            "fn(Tensor[(3, 4), f32], Tensor[(4, 5), f32]) -> Tensor[(3,), f32]");
}

TEST(TypeCheck, UnknownDimensionsFlowThrough) {
  EXPECT_EQ(TypeOf("def @f(%x: Tensor[(?, 4), f32], %b: Tensor[(4,), f32]) { relu(add(%x, %b)) }", "f"),
            "fn(Tensor[(?, 4), f32], Tensor[(4,), f32]) -> Tensor[(?, 4), f32]");
}

TEST(TypeCheck, AKnownShapeMayBePassedForAnUnknownOne) {
  EXPECT_EQ(TypeOf("def @g(%x: Tensor[(?, 4), f32]) { %x }\n"
                   "def @f(%x: Tensor[(2, 4), f32]) { @g(%x) }",
                   "f"),
            "fn(Tensor[(2, 4), f32]) -> Tensor[(?, 4), f32]");
}

// Issue 23: generic definitions. Each call instantiates the type
// parameters from its arguments' types (and, for one only the result
// mentions, from the type its context declares); the body is checked once,
// with the parameters as types it knows nothing of. List, @map and @fold
// are the prelude's (ir/prelude.cc).
constexpr char kGenericList[] = "def @empty[T]() -> List[T] { Nil }\n";

TEST(TypeCheck, GenericDefinitionsAreInstantiatedByEachCall) {
  std::string text = std::string(kGenericList) + R"(
def @norms(%rows: List[Tensor[(3,), f32]]) {
  @map(fn (%r: Tensor[(3,), f32]) { norm(%r) }, %rows)
}
def @total(%rows: List[Tensor[(3,), f32]]) {
  @fold(fn (%s: Tensor[(), f32], %r: Tensor[(3,), f32]) { add(%s, sum(%r)) }, 0f32, %rows)
}
def @count(%ids: List[Tensor[(), i64]]) {
  @fold(fn (%n: Tensor[(), i64], %i: Tensor[(), i64]) { add(%n, 1) }, 0, %ids)
}
def @none() {
  let %e: List[Tensor[(2,), f32]] = @empty();
  %e
}
)";
  EXPECT_EQ(TypeOf(text, "map"), "fn[A, B](fn(A) -> B, List[A]) -> List[B]");
  EXPECT_EQ(TypeOf(text, "norms"), "fn(List[Tensor[(3,), f32]]) -> List[Tensor[(), f32]]");
  EXPECT_EQ(TypeOf(text, "total"), "fn(List[Tensor[(3,), f32]]) -> Tensor[(), f32]");
  EXPECT_EQ(TypeOf(text, "count"), "fn(List[Tensor[(), i64]]) -> Tensor[(), i64]");
  EXPECT_EQ(TypeOf(text, "none"), "fn() -> List[Tensor[(2,), f32]]");
}

TEST(TypeCheckErrors, GenericDefinitionsSayWhichInstanceAnArgumentMisses) {
  // The first argument binds A to f32 rows; the list then has the wrong element type.
  EXPECT_EQ(ErrorOf(std::string(kGenericList) +
                    "def @f(%xs: List[Tensor[(), i64]]) { @map(fn (%r: Tensor[(3,), f32]) { sum(%r) }, %xs) }"),
            "t.pj:2:38: argument 1 of @map must be List[Tensor[(3,), f32]], got List[Tensor[(), i64]]");
  // Inside the body a type parameter is opaque: no operator takes it.
  EXPECT_EQ(ErrorOf("def @g[A](%x: A) { add(%x, %x) }"), "t.pj:1:20: input 0 of add must be a tensor, got A");
  // A parameter only the result mentions needs the type the caller declares.
  EXPECT_EQ(ErrorOf(std::string(kGenericList) + "def @f() { @empty() }"),
            "t.pj:2:12: cannot tell type parameter T of @empty (fn() -> List[T]) from its arguments; declare the type "
            "of its result where it is bound");
  // Passed as a value, a generic definition needs the type of the instance.
  EXPECT_EQ(ErrorOf(std::string(kGenericList) + "def @f() { let %g = @map; 0 }"),
            "t.pj:2:21: @map is generic (fn[A, B](fn(A) -> B, List[A]) -> List[B]): pass it where its instance's "
            "type is known, as an argument of a declared function type");
}

TEST(TypeCheck, TuplesProjectionsAndClosures) {
  EXPECT_EQ(TypeOf("def @f(%x: Tensor[(2,), f32]) {\n"
                   "  let %double = fn (%y: Tensor[(2,), f32]) { add(%y, %y) };\n"
                   "  let %pair = (%double(%x), 1);\n"
                   "  %pair.1\n"
                   "}",
                   "f"),
            "fn(Tensor[(2,), f32]) -> Tensor[(), i64]");
}

// A record field is the tuple field of that name, found in the type the
// checker knows: a parameter's, a let's, a call's result, a literal's where a
// record is expected.
TEST(TypeCheck, RecordFieldsAreTheirTuplesFieldsByName) {
  const std::string types =
      "type Pair = {small: Tensor[(2,), f32], big: Tensor[(3,), f32]};\n"
      "def @make(%a: Tensor[(2,), f32], %b: Tensor[(3,), f32]) -> Pair { (%a, %b) }\n";
  EXPECT_EQ(TypeOf(types + "def @f(%p: Pair) { %p.big }", "f"),
            "fn({small: Tensor[(2,), f32], big: Tensor[(3,), f32]}) -> Tensor[(3,), f32]");
  EXPECT_EQ(TypeOf(types + "def @f(%a: Tensor[(2,), f32], %b: Tensor[(3,), f32]) { let %p = @make(%a, %b); %p.small }",
                   "f"),
            "fn(Tensor[(2,), f32], Tensor[(3,), f32]) -> Tensor[(2,), f32]");
  EXPECT_EQ(TypeOf(types + "def @f(%a: Tensor[(2,), f32], %b: Tensor[(3,), f32]) { let %p: Pair = (%a, %b); %p.big }",
                   "f"),
            "fn(Tensor[(2,), f32], Tensor[(3,), f32]) -> Tensor[(3,), f32]");
  // A record takes any tuple of its field types: names do not change a match.
  EXPECT_EQ(TypeOf(types + "def @f(%a: Tensor[(2,), f32], %b: Tensor[(3,), f32]) { let %t = (%a, %b); @make(%t.0, %t.1).big }",
                   "f"),
            "fn(Tensor[(2,), f32], Tensor[(3,), f32]) -> Tensor[(3,), f32]");
}

TEST(TypeCheck, RecordFieldErrorsNameTheFieldAndTheType) {
  const std::string types = "type Pair = {small: Tensor[(2,), f32], big: Tensor[(3,), f32]};\n";
  EXPECT_EQ(ErrorOf(types + "def @f(%p: Pair) {\n  %p.large\n}"),
            "t.pj:3:5: record {small: Tensor[(2,), f32], big: Tensor[(3,), f32]} has no field 'large'");
  EXPECT_EQ(ErrorOf("def @f(%t: (Tensor[(2,), f32], Tensor[(3,), f32])) { %t.big }"),
            "t.pj:1:56: .big of a tuple without field names, (Tensor[(2,), f32], Tensor[(3,), f32]) (declare it as a "
            "record, {big: ...}, or write its index)");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,), f32]) { %x.big }"), "t.pj:1:35: .big of a non-tuple Tensor[(2,), f32]");
}

TEST(TypeCheck, MatchOverATreeBindsFieldTypes) {
  EXPECT_EQ(TypeOf("type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }\n"
                   "def @size(%t: Tree) -> Tensor[(), i64] {\n"
                   "  match (%t) { Leaf(_) => 1, Node(%l, %r) => add(@size(%l), @size(%r)) }\n"
                   "}",
                   "size"),
            "fn(Tree) -> Tensor[(), i64]");
}

TEST(TypeCheck, TypeParametersAreInferredFromFieldsOrTheExpectedType) {
  const std::string list = "type List[T] { Nil, Cons(T, List[T]) }\n";
  EXPECT_EQ(TypeOf(list + "def @one(%x: Tensor[(2,), f32]) { let %nil: List[Tensor[(2,), f32]] = Nil; Cons(%x, %nil) }",
                   "one"),
            "fn(Tensor[(2,), f32]) -> List[Tensor[(2,), f32]]");
  EXPECT_EQ(TypeOf(list + "def @empty() -> List[Tensor[(), i64]] { Nil }", "empty"), "fn() -> List[Tensor[(), i64]]");
  EXPECT_EQ(ErrorOf(list + "def @bad() { Nil }"),
            "t.pj:2:14: cannot infer type parameter T of List for Nil; annotate it, e.g. let %x: List[...] = ...");
}

TEST(TypeCheck, MutualRecursionNeedsDeclaredResultTypes) {
  EXPECT_EQ(TypeOf("def @even(%n: Tensor[(), i64]) -> Tensor[(), bool] {\n"
                   "  if (equal(%n, 0)) { true } else { @odd(sub(%n, 1)) }\n"
                   "}\n"
                   "def @odd(%n: Tensor[(), i64]) -> Tensor[(), bool] {\n"
                   "  if (equal(%n, 0)) { false } else { @even(sub(%n, 1)) }\n"
                   "}",
                   "odd"),
            "fn(Tensor[(), i64]) -> Tensor[(), bool]");
  EXPECT_EQ(ErrorOf("def @loop(%n: Tensor[(), i64]) { @loop(%n) }"),
            "t.pj:1:34: @loop is recursive; declare its result type: def @loop(...) -> T { ... }");
}

TEST(TypeCheckErrors, OperatorShapeErrorsPointAtTheCall) {
  EXPECT_EQ(ErrorOf("def @f(%a: Tensor[(3, 4), f32], %b: Tensor[(5, 2), f32]) {\n"
                    "  matmul(%a, %b)\n"
                    "}"),
            "t.pj:2:3: matmul: inner dimensions differ: lhs (3, 4) vs rhs (5, 2)");
}

TEST(TypeCheckErrors, OperatorInputsMustBeTensors) {
  EXPECT_EQ(ErrorOf("def @f(%a: Tensor[(3,), f32]) { exp((%a, %a)) }"),
            "t.pj:1:37: input 0 of exp must be a tensor, got (Tensor[(3,), f32], Tensor[(3,), f32])");
}

TEST(TypeCheckErrors, IfNeedsABoolScalarAndMatchingBranches) {
  EXPECT_EQ(ErrorOf("def @f(%a: Tensor[(3,), f32]) { if (%a) { 1 } else { 2 } }"),
            "t.pj:1:33: condition of if must be Tensor[(), bool], got Tensor[(3,), f32]");
  EXPECT_EQ(ErrorOf("def @f(%c: Tensor[(), bool]) { if (%c) { 1 } else { 2.0 } }"),
            "t.pj:1:32: branches of if differ: Tensor[(), i64] vs Tensor[(), f32]");
}

TEST(TypeCheckErrors, CallsCheckArityAndArgumentTypes) {
  const std::string g = "def @g(%x: Tensor[(2,), f32]) { %x }\n";
  EXPECT_EQ(ErrorOf(g + "def @f(%x: Tensor[(2,), f32]) { @g(%x, %x) }"),
            "t.pj:2:33: @g takes 1 argument, got 2");
  EXPECT_EQ(ErrorOf(g + "def @f(%x: Tensor[(3,), f32]) { @g(%x) }"),
            "t.pj:2:33: argument 0 of @g must be Tensor[(2,), f32], got Tensor[(3,), f32]");
}

TEST(TypeCheckErrors, UnknownDefinitionsSuggestTheClosest) {
  EXPECT_EQ(ErrorOf("def @loss(%x: Tensor[(), f32]) { %x }\n"
                    "def @f(%x: Tensor[(), f32]) { @lsos(%x) }"),
            "t.pj:2:31: unknown definition '@lsos'; did you mean '@loss'?");
}

TEST(TypeCheckErrors, ConstructorsAndPatternsCheckTheirFields) {
  const std::string tree = "type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }\n";
  EXPECT_EQ(ErrorOf(tree + "def @f(%x: Tensor[(), f32]) { Leaf(%x) }"),
            "t.pj:2:31: field 0 of Leaf must be Tensor[(), i64], got Tensor[(), f32]");
  EXPECT_EQ(ErrorOf(tree + "def @f(%x: Tensor[(), f32]) { match (%x) { Leaf(_) => 1 } }"),
            "t.pj:2:44: constructor Leaf of Tree cannot match Tensor[(), f32]");
  EXPECT_EQ(ErrorOf(tree + "def @f(%t: Tree) { match (%t) { Leaf(_) => 1, Node(_, _) => 2.0 } }"),
            "t.pj:2:61: clauses of match differ: Tensor[(), i64] vs Tensor[(), f32]");
}

TEST(TypeCheck, UnsuffixedNumbersTakeTheDtypeTheirContextNeeds) {
  EXPECT_EQ(TypeOf("def @f(%x: Tensor[(3,), f32]) { mul(add(%x, 1), 0.5) }", "f"),
            "fn(Tensor[(3,), f32]) -> Tensor[(3,), f32]");
  EXPECT_EQ(TypeOf("def @f(%x: Tensor[(3,), f32]) { where(greater(%x, 0), %x, 2) }", "f"),
            "fn(Tensor[(3,), f32]) -> Tensor[(3,), f32]");
  EXPECT_EQ(TypeOf("def @f() { let %k: Tensor[(), f64] = 3; %k }", "f"), "fn() -> Tensor[(), f64]");
  EXPECT_EQ(TypeOf("def @g(%x: Tensor[(), f32]) { %x }\ndef @f() { @g(2) }", "f"), "fn() -> Tensor[(), f32]");
  // A fraction becomes an f64 from its text, not from the f32 it reads as.
  Module m;
  m.AddSource("def @f(%d: Tensor[(), f64]) { mul(%d, 0.1) }", "t.pj");
  const auto* call = As<OpCallNode>(m.snapshot()->Get("f").func->body);
  ASSERT_TRUE(call);
  EXPECT_EQ(As<ConstantNode>(call->args[1])->value.data<double>()[0], 0.1);
  // Alone, or beside another number, a number keeps its own dtype.
  EXPECT_EQ(TypeOf("def @f() { add(1, 2) }", "f"), "fn() -> Tensor[(), i64]");
  EXPECT_EQ(TypeOf("def @f() { 0.5 }", "f"), "fn() -> Tensor[(), f32]");
}

TEST(TypeCheckErrors, ANumberTakesOnlyADtypeThatHoldsItExactly) {
  EXPECT_EQ(ErrorOf("def @f(%n: Tensor[(), i64]) { mul(%n, 0.5) }"),
            "t.pj:1:31: mul: dtypes differ: lhs Tensor[(), i64] vs rhs Tensor[(), f32]");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(), f32]) { mul(%x, 16777217) }"),
            "t.pj:1:31: mul: dtypes differ: lhs Tensor[(), f32] vs rhs Tensor[(), i64]");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(), f32]) { mul(%x, 2i64) }"),  // a suffix is what it says
            "t.pj:1:31: mul: dtypes differ: lhs Tensor[(), f32] vs rhs Tensor[(), i64]");
  EXPECT_EQ(ErrorOf("def @f(%t: Tensor[(4, 2), f32]) { take(%t, 1.0) }"),  // take's inputs do not share a dtype
            "t.pj:1:35: take: indices must be i64, got Tensor[(), f32]");
}

TEST(TypeCheckErrors, DeclaredTypesAreEnforced) {
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,), f32]) -> Tensor[(3,), f32] { %x }"),
            "t.pj:1:1: result of @f is Tensor[(2,), f32], but its declared type is Tensor[(3,), f32]");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,), f32]) { let %y: Tensor[(2,), i64] = %x; %y }"),
            "t.pj:1:33: %y is declared Tensor[(2,), i64] but bound to Tensor[(2,), f32]");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,), f32]) { (%x, %x).2 }"),
            "t.pj:1:41: tuple (Tensor[(2,), f32], Tensor[(2,), f32]) has no field 2");
}

}  // namespace
}  // namespace pejit
