// The text format: every construct of docs/language.md parses, prints back
// in a readable canonical form, and parse(print(x)) is structurally equal to
// x; programs made with the builder API print to text that parses back to
// them; mistakes are reported as "file:line:col: message".
#include "ir/parser.h"
#include "ir/prelude.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "ir/printer.h"
#include "ir/structural.h"

namespace pejit {
namespace {

constexpr char kTree[] = R"(type Tree {
  Leaf(Tensor[(), i64]),
  Node(Tree, Tree),
}
)";

constexpr char kList[] = R"(type List[T] {
  Nil,
  Cons(T, List[T]),
}
)";

std::string PrintProgram(const ParsedProgram& p) {
  std::string s;
  for (const TypeDefPtr& t : p.types) s += PrintTypeDef(*t) + "\n\n";
  for (const auto& [name, f] : p.defs) s += PrintFunction(name, f) + "\n\n";
  return s;
}

bool SameTypeDef(const TypeDef& a, const TypeDef& b) {
  if (a.name != b.name || a.params != b.params || a.ctors.size() != b.ctors.size()) return false;
  for (size_t i = 0; i < a.ctors.size(); ++i) {
    const CtorDef &x = a.ctors[i], &y = b.ctors[i];
    if (x.name != y.name || x.fields.size() != y.fields.size()) return false;
    for (size_t j = 0; j < x.fields.size(); ++j) {
      if (!TypeEqual(x.fields[j], y.fields[j])) return false;
    }
  }
  return true;
}

// parse(print(p)) is structurally equal to p, and printing it again gives the
// same text (`lookup`: the types p was parsed with from outside its text).
void ExpectProgramRoundTrip(const ParsedProgram& p, const TypeLookup& lookup = nullptr) {
  std::string printed = PrintProgram(p);
  SCOPED_TRACE("printed:\n" + printed);
  ParsedProgram q = ParseProgram(printed, "printed.pj", lookup);
  ASSERT_EQ(p.types.size(), q.types.size());
  for (size_t i = 0; i < p.types.size(); ++i) EXPECT_TRUE(SameTypeDef(*p.types[i], *q.types[i])) << i;
  ASSERT_EQ(p.defs.size(), q.defs.size());
  for (size_t i = 0; i < p.defs.size(); ++i) {
    EXPECT_EQ(p.defs[i].first, q.defs[i].first);
    EXPECT_TRUE(StructuralEqual(p.defs[i].second, q.defs[i].second)) << "@" << p.defs[i].first;
    EXPECT_EQ(StructuralHash(p.defs[i].second), StructuralHash(q.defs[i].second)) << "@" << p.defs[i].first;
  }
  EXPECT_EQ(PrintProgram(q), printed);
}

// Parses `text`, checks the round trip and returns the printed text.
std::string RoundTrip(const std::string& text) {
  SCOPED_TRACE("source:\n" + text);
  ParsedProgram p = ParseProgram(text, "test.pj");
  ExpectProgramRoundTrip(p);
  return PrintProgram(p);
}

// Text already in the printer's canonical form prints back unchanged.
void ExpectCanonical(const std::string& text) { EXPECT_EQ(RoundTrip(text), text + "\n"); }

// A function made with the builder API prints (with `types`) to a text that
// parses back structurally equal.
std::string ExpectBuiltRoundTrip(const Func& f, const std::vector<TypeDefPtr>& types = {}) {
  ParsedProgram p;
  p.types = types;
  p.defs.emplace_back("f", f);
  ExpectProgramRoundTrip(p);
  return PrintFunction("f", f);
}

// The message of the IrError that parsing throws, "" if none.
std::string ErrorOf(const std::string& text, const std::string& filename = "err.pj") {
  try {
    ParseProgram(text, filename);
  } catch (const IrError& e) {
    return e.what();
  }
  return "";
}

std::string ExprErrorOf(const std::string& text, const TypeLookup& lookup = nullptr) {
  try {
    ParseExpr(text, lookup);
  } catch (const IrError& e) {
    return e.what();
  }
  return "";
}

// A one-definition program around `body`, for error tests: the body starts
// on line 2, column 3.
std::string InFunction(const std::string& body) {
  return "def @f(%x: Tensor[(2, 3), f32], %t: Tree) {\n  " + body + "\n}\n" + kTree;
}

const Tensor& ConstantOf(const Expr& e) {
  const ConstantNode* c = As<ConstantNode>(e);
  if (!c) throw std::logic_error("not a constant");
  return c->value;
}

template <typename T>
T Bits(const Tensor& t) {
  T v;
  std::memcpy(&v, t.raw_data(), sizeof v);
  return v;
}

// ---- Round trips, one construct at a time --------------------------------------

TEST(RoundTrip, LetChainsPrintOneBindingPerLine) {
  ExpectCanonical(R"(def @f(%x: Tensor[(2, 3), f32]) -> Tensor[(2, 3), f32] {
  let %y = relu(%x);
  let %z: Tensor[(2, 3), f32] = add(%y, %x);
  %z
}
)");
}

TEST(RoundTrip, ResultTypeMayBeOmitted) {
  ExpectCanonical(R"(def @f(%x: Tensor[(), f32]) {
  %x
}
)");
}

TEST(RoundTrip, LongHeadersWrapUnderTheFirstParameter) {
  ExpectCanonical(
      R"(def @cell(%x: Tensor[(1, 64), f32], %hs: Tensor[(1, 128), f32], %c_sum: Tensor[(1, 128), f32],
          %w_x: Tensor[(512, 64), f32], %w_h: Tensor[(512, 128), f32], %b: Tensor[(512,), f32])
    -> (Tensor[(1, 128), f32], Tensor[(1, 128), f32]) {
  (%hs, %c_sum)
}
)");
}

TEST(RoundTrip, LayoutIsNormalized) {
  EXPECT_EQ(RoundTrip("def @f(%x:Tensor[(2,3),f32])->Tensor[(2,3),f32]{let %y=relu(%x);  # comment\n"
                      "let %z = { let %w = neg(%y); %w }; add(%z,%z)}"),
            R"(def @f(%x: Tensor[(2, 3), f32]) -> Tensor[(2, 3), f32] {
  let %y = relu(%x);
  let %z = {
    let %w = neg(%y);
    %w
  };
  add(%z, %z)
}

)");
}

TEST(RoundTrip, IfWithBlocks) {
  ExpectCanonical(R"(def @f(%c: Tensor[(), bool], %x: Tensor[(), f32]) {
  let %y = if (%c) {
    let %t = neg(%x);
    %t
  } else {
    %x
  };
  if (less(%y, 0f32)) {
    neg(%y)
  } else {
    %y
  }
}
)");
}

TEST(RoundTrip, TuplesOfZeroOneAndManyFieldsAndProjections) {
  ExpectCanonical(R"(def @f(%x: Tensor[(), f32], %p: ((), ((),), ((), Tensor[(), i64]))) {
  let %empty = ();
  let %one = (%x,);
  let %two = (%x, %one);
  let %nested = ((%x,), (), (%empty, %two));
  let %a = %nested.2.1.0;
  let %b = %p.1.0;
  let %c = (%x, %a).1;
  (%a, %b, %c, @g(%x).3)
}
)");
}

TEST(RoundTrip, ParenthesesAroundOneExpressionAreGrouping) {
  std::string printed = RoundTrip("def @f(%x: Tensor[(), f32]) { ((%x)) }");
  EXPECT_NE(printed.find("\n  %x\n"), std::string::npos) << printed;
  EXPECT_EQ(TypeToString(ParseType("((Tensor[(), f32]))")), "Tensor[(), f32]");
  EXPECT_EQ(TypeToString(ParseType("(Tensor[(), f32],)")), "(Tensor[(), f32],)");
  Expr f = ParseExpr("fn (%x: ()) { match (%x) { ((%y)) => %y, (_,) => %x } }");
  const MatchNode* m = As<MatchNode>(As<FuncNode>(f)->body);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->clauses[0].pattern->kind, PatternKind::kVar);
  EXPECT_EQ(m->clauses[1].pattern->kind, PatternKind::kTuple);
}

TEST(RoundTrip, ClosuresCapturingVariables) {
  ExpectCanonical(R"(def @f(%x: Tensor[(), f32], %g: fn(Tensor[(), f32]) -> Tensor[(), f32]) {
  let %scale = mul(%x, 2f32);
  let %h = fn (%y: Tensor[(), f32]) -> Tensor[(), f32] {
    let %z = mul(%y, %scale);
    %g(add(%z, %x))
  };
  let %adder = fn (%a: Tensor[(), f32]) {
    fn (%b: Tensor[(), f32]) {
      add(%a, %b)
    }
  };
  let %k = (fn (%y: Tensor[(), f32]) {
    %y
  })(%x);
  %adder(%h(%k))(%x)
}
)");
}

TEST(RoundTrip, FunctionTypes) {
  ExpectCanonical(
      R"(def @apply(%f: fn(Tensor[(?, 4), f32], ()) -> fn() -> (), %x: Tensor[(?, 4), f32]) -> fn() -> () {
  %f(%x, ())
}
)");
}

TEST(RoundTrip, GlobalsAndRecursion) {
  ExpectCanonical(std::string(kTree) + R"(
def @size(%t: Tree) -> Tensor[(), i64] {
  match (%t) {
    Leaf(_) => 1,
    Node(%l, %r) => add(@size(%l), @size(%r)),
  }
}

def @uses_unknown(%x: Tensor[(), f32]) {
  @defined_elsewhere(%x, @size)
}
)");
}

TEST(RoundTrip, AllPatternKindsNested) {
  ExpectCanonical(std::string(kTree) + R"(
def @f(%t: Tree, %p: ((), (Tree,), (Tree, Tensor[(), i64]))) -> Tensor[(), i64] {
  let %a = match (%t) {
    Leaf(%w) => %w,
    Node(Leaf(%w), _) => %w,
    Node(Node(_, Leaf(%v)), %rest) => %v,
    _ => 0,
  };
  match (%p) {
    ((), (Leaf(%w),), (_, %n)) => add(%w, %n),
    (_, (%u,), %pair) => {
      let %k = %pair.1;
      %k
    },
  }
}
)");
}

TEST(RoundTrip, ParametricTypes) {
  ExpectCanonical(std::string(kList) + R"(
def @length(%xs: List[Tensor[(), f32]]) -> Tensor[(), i64] {
  match (%xs) {
    Nil => 0,
    Cons(_, %rest) => add(1, @length(%rest)),
  }
}

def @pairs(%x: Tensor[(), f32]) -> List[(Tensor[(), f32], List[Tensor[(), i64]])] {
  Cons((%x, Cons(1, Nil)), Nil)
}
)");
}

// Issue 23: a definition generic over element types, its parameters named
// after the definition's name and used by its annotations, a literal's and
// a let's included.
TEST(RoundTrip, GenericDefinitions) {
  ExpectCanonical(std::string(kList) + R"(
def @map[A, B](%f: fn(A) -> B, %xs: List[A]) -> List[B] {
  match (%xs) {
    Nil => Nil,
    Cons(%x, %rest) => {
      let %y: B = %f(%x);
      Cons(%y, @map(%f, %rest))
    },
  }
}

def @twice[T](%x: T) -> (T, T) {
  let %pair = fn (%y: T) {
    (%y, %y)
  };
  %pair(%x)
}
)");
}

TEST(Errors, GenericDefinitionsNameEachTypeParameterOnce) {
  try {
    ParseProgram("def @f[A, A](%x: A) -> A { %x }", "t.pj");
    FAIL() << "expected IrError";
  } catch (const IrError& e) {
    EXPECT_STREQ(e.what(), "t.pj:1:11: duplicate type parameter 'A'");
  }
  try {
    ParseProgram("def @f[A](%x: A) -> A { %x }\ndef @g(%x: A) -> A { %x }", "t.pj");
    FAIL() << "expected IrError";
  } catch (const IrError& e) {
    EXPECT_NE(std::string(e.what()).find("t.pj:2:12"), std::string::npos) << e.what();  // A is @f's alone
  }
}

TEST(RoundTrip, TypeParametersAreTypeVariablesInsideTheirType) {
  ParsedProgram p = ParseProgram(std::string(kList) + "type Pair[A, B] { MkPair(A, B, List[B]) }", "t.pj");
  ASSERT_EQ(p.types.size(), 2u);
  const TypeDef& list = *p.types[0];
  EXPECT_EQ(list.params, std::vector<std::string>{"T"});
  ASSERT_EQ(list.ctors.size(), 2u);
  EXPECT_TRUE(list.ctors[0].fields.empty());
  ASSERT_EQ(list.ctors[1].fields.size(), 2u);
  EXPECT_TRUE(TypeEqual(list.ctors[1].fields[0], TypeVarTy("T")));
  EXPECT_TRUE(TypeEqual(list.ctors[1].fields[1], AdtTy("List", {TypeVarTy("T")})));
  EXPECT_TRUE(TypeEqual(p.types[1]->ctors[0].fields[2], AdtTy("List", {TypeVarTy("B")})));
  EXPECT_EQ(PrintTypeDef(*p.types[1]), "type Pair[A, B] {\n  MkPair(A, B, List[B]),\n}");
}

TEST(RoundTrip, TypesMayBeUsedBeforeTheirDeclaration) {
  std::string text = R"(def @leaf() -> Tree {
  Leaf(1)
}

def @wrap(%x: Box) -> Tree {
  match (%x) {
    MkBox(%t) => Node(%t, @leaf()),
  }
}

type Box {
  MkBox(Tree),
}

)" + std::string(kTree);
  ParsedProgram p = ParseProgram(text, "t.pj");
  ASSERT_EQ(p.types.size(), 2u);
  EXPECT_EQ(p.types[0]->name, "Box");
  EXPECT_EQ(p.types[1]->name, "Tree");
  ExpectProgramRoundTrip(p);
}

// An alias is the type it names wherever it is used (with its parameters
// substituted); a module holds no aliases, so it prints its types whole.
TEST(RoundTrip, TypeAliasesAreTheTypesTheyName) {
  ParsedProgram aliased = ParseProgram(R"(
type Cell = (Weights, Vec);  # used before it is declared
type Pair[T] = (T, T);
type Vec = Tensor[(?,), f32];
type Weights = Pair[Tensor[(2, 2), f32]];
type Maybe[T] = Option[T];
type Option[T] { None, Some(T) }
def @f(%c: Cell, %x: Maybe[Vec]) -> Pair[Vec] { (%c.1, %c.1) }
)", "t.pj");
  ParsedProgram plain = ParseProgram(R"(
type Option[T] { None, Some(T) }
def @f(%c: ((Tensor[(2, 2), f32], Tensor[(2, 2), f32]), Tensor[(?,), f32]), %x: Option[Tensor[(?,), f32]])
    -> (Tensor[(?,), f32], Tensor[(?,), f32]) { (%c.1, %c.1) }
)", "t.pj");
  ASSERT_EQ(aliased.types.size(), 1u);  // the ADT only
  ASSERT_EQ(aliased.defs.size(), 1u);
  EXPECT_TRUE(StructuralEqual(aliased.defs[0].second, plain.defs[0].second)) << PrintProgram(aliased);
  EXPECT_EQ(PrintProgram(aliased), PrintProgram(plain));
  ExpectProgramRoundTrip(aliased);
}

// A record type prints with its names, and a field is printed as written:
// by name or by index.
TEST(RoundTrip, RecordsKeepTheirFieldNames) {
  ExpectCanonical(R"(def @f(%s: {h: Tensor[(1, 4), f32], c: Tensor[(1, 4), f32]}, %t: (Tensor[(), i64], {x: Tensor[(), f32]})) {
  (%s.c, %s.1, %t.1.x)
}
)");
  std::string printed = RoundTrip("type State = {h: Tensor[(1, ?), f32], c: Tensor[(1, ?), f32],};\n"
                                  "def @c(%s: State) { %s.c }");
  EXPECT_NE(printed.find("%s: {h: Tensor[(1, ?), f32], c: Tensor[(1, ?), f32]}"), std::string::npos) << printed;
  EXPECT_NE(printed.find("%s.c"), std::string::npos) << printed;
}

TEST(Errors, Records) {
  EXPECT_EQ(ErrorOf("def @f(%s: {h: Tensor[(), f32], h: Tensor[(), f32]}) { %s }"), "err.pj:1:33: record field 'h' twice");
  EXPECT_EQ(ErrorOf("def @f(%s: {}) { %s }"), "err.pj:1:13: expected a field name in a record type, got '}'");
  EXPECT_EQ(ErrorOf("def @f(%s: {_: Tensor[(), f32]}) { %s }"),
            "err.pj:1:13: expected a field name in a record type, got '_'");
  EXPECT_EQ(ErrorOf("def @f(%s: {h Tensor[(), f32]}) { %s }"), "err.pj:1:15: expected ':' and the type of field h, got 'Tensor'");
  EXPECT_EQ(ErrorOf("def @f(%s: (Tensor[(), f32],)) { %s._ }"), "err.pj:1:37: expected a field index or name after '.', got '_'");
}

TEST(Errors, TypeAliases) {
  EXPECT_EQ(ErrorOf("type A = (B, B);\ntype B = A;\n"), "err.pj:2:10: type alias 'A' refers to itself");
  EXPECT_EQ(ErrorOf("type V = Tensor[(2,), f32];\ndef @f(%x: V[V]) { %x }"),
            "err.pj:2:12: type alias 'V' takes 0 type arguments, got 1");
  EXPECT_EQ(ErrorOf("type P[T] = (T, T);\ndef @f(%x: P) { %x }"), "err.pj:2:12: type alias 'P' takes 1 type argument, got 0");
  EXPECT_EQ(ErrorOf("type V = Tensor[(2,), f32]\ndef @f(%x: V) { %x }"),
            "err.pj:2:1: expected ';' after the type of alias V, got 'def'");
  EXPECT_EQ(ErrorOf("type V = Tensor[(2,), f32];\ntype V { A }"), "err.pj:2:6: duplicate type 'V'; first defined at err.pj:1:6");
  EXPECT_EQ(ErrorOf("type Tensor = (Tensor[(), f32],);"), "err.pj:1:6: 'Tensor' is reserved");
  EXPECT_EQ(ErrorOf("type V = Vex;"), "err.pj:1:10: unknown type 'Vex'");
}

// Every example model parses (with the prelude's types: the Tree-LSTM's
// List is the prelude's) and prints back to an equal program.
TEST(RoundTrip, TheExamples) {
  Prelude prelude;
  TypeLookup lookup = [&](const std::string& name) { return prelude.FindType(name); };
  for (const char* path : {"examples/treelstm/treelstm.pj", "examples/mlp/mlp.pj", "examples/growing/growing.pj"}) {
    SCOPED_TRACE(path);
    std::ifstream in(path);
    ASSERT_TRUE(in) << path << " is not in the test's runfiles";
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ParsedProgram p = ParseProgram(text, path, lookup);
    EXPECT_FALSE(p.defs.empty());
    ExpectProgramRoundTrip(p, lookup);
  }
}

TEST(RoundTrip, ShadowedVariablesGetSuffixes) {
  // The inner %x is another variable: printing it as %x would make the use
  // of the outer %x in the last line refer to it.
  std::string printed = RoundTrip(R"(def @f(%x: Tensor[(), i64]) {
  let %x = add(%x, 1);
  let %g = fn (%x: Tensor[(), i64]) {
    %x
  };
  match ((%x, %x)) {
    (%x, _) => %g(%x),
  }
})");
  EXPECT_EQ(printed, R"(def @f(%x: Tensor[(), i64]) {
  let %x_1 = add(%x, 1);
  let %g = fn (%x_2: Tensor[(), i64]) {
    %x_2
  };
  match ((%x_1, %x_1)) {
    (%x_2, _) => %g(%x_2),
  }
}

)");
}

TEST(RoundTrip, LongLetChains) {
  // Generated programs are long chains: parsing and printing loop over them.
  std::string text = "def @f(%v0: Tensor[(), f32]) {\n";
  const int n = 5000;
  for (int i = 1; i <= n; ++i) {
    text += "  let %v" + std::to_string(i) + " = add(%v" + std::to_string(i - 1) + ", %v" +
            std::to_string(i / 2) + ");\n";
  }
  text += "  %v" + std::to_string(n) + "\n}\n";
  EXPECT_TRUE(RoundTrip(text) == text + "\n");  // not EXPECT_EQ: no diff of 5000 lines
}

TEST(RoundTrip, ScalarConstantsKeepDtypeAndBits) {
  // Each literal with what it prints as.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0", "0"},
      {"-7", "-7"},
      {"7i64", "7"},
      {"9223372036854775807", "9223372036854775807"},
      {"-9223372036854775808", "-9223372036854775808"},
      {"2.5", "2.5"},
      {"2.0", "2f32"},
      {"0f32", "0f32"},
      {"-0f32", "-0f32"},
      {"-0.0", "-0f32"},
      {"1e-3", "0.001"},
      {"0.1", "0.1"},
      {"3.4028235e38", "3.4028235e+38"},
      {"1e-45", "1e-45"},  // the smallest subnormal f32
      {"0.5f64", "0.5f64"},
      {"0.1f64", "0.1f64"},
      {"-0f64", "-0f64"},
      {"1e300f64", "1e+300f64"},
      {"5e-324f64", "5e-324f64"},
      {"3f64", "3f64"},
      {"true", "true"},
      {"false", "false"},
  };
  for (const auto& [text, printed] : cases) {
    SCOPED_TRACE(text);
    Expr e = ParseExpr(text);
    EXPECT_EQ(ConstantOf(e).rank(), 0);
    EXPECT_EQ(PrintExpr(e), printed);
    EXPECT_TRUE(StructuralEqual(e, ParseExpr(PrintExpr(e))));
  }
  EXPECT_EQ(ConstantOf(ParseExpr("3")).dtype(), DType::kI64);
  EXPECT_EQ(ConstantOf(ParseExpr("2.5")).dtype(), DType::kF32);
  EXPECT_EQ(ConstantOf(ParseExpr("1e-3")).dtype(), DType::kF32);
  EXPECT_EQ(ConstantOf(ParseExpr("3f32")).dtype(), DType::kF32);
  EXPECT_EQ(ConstantOf(ParseExpr("0.5f64")).dtype(), DType::kF64);
  EXPECT_EQ(ConstantOf(ParseExpr("true")).dtype(), DType::kBool);
  EXPECT_EQ(Bits<uint32_t>(ConstantOf(ParseExpr("-0f32"))), 0x80000000u);
  EXPECT_EQ(*ConstantOf(ParseExpr("0.1")).data<float>(), 0.1f);
  EXPECT_EQ(*ConstantOf(ParseExpr("0.1f64")).data<double>(), 0.1);
}

TEST(RoundTrip, EveryFloatPrintsBackExactly) {
  // A sweep of bit patterns, through the printed literal.
  for (uint32_t bits = 1; bits < 0x7f800000u; bits += 0x00f0f0f1u) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    for (float x : {v, -v}) {
      Expr e = MakeConstant(Tensor::FromVector<float>({}, {x}));
      Expr back = ParseExpr(PrintExpr(e));
      EXPECT_TRUE(StructuralEqual(e, back)) << PrintExpr(e);
    }
  }
  for (uint64_t bits = 1; bits < 0x7ff0000000000000ull; bits += 0x00f0f0f0f0f0f0f1ull) {
    double v;
    std::memcpy(&v, &bits, sizeof v);
    Expr e = MakeConstant(Tensor::FromVector<double>({}, {v}));
    EXPECT_TRUE(StructuralEqual(e, ParseExpr(PrintExpr(e)))) << PrintExpr(e);
  }
}

TEST(RoundTrip, TensorConstantsOfEachDtype) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"tensor(f32, (2, 2), [1, 2.5, -3, 1e-3])", "tensor(f32, (2, 2), [1, 2.5, -3, 0.001])"},
      {"tensor(f64, (3), [0.1, 1e300, -0])", "tensor(f64, (3,), [0.1, 1e+300, -0])"},
      {"tensor(i64, (2, 1, 2), [1, -2, 3, 9223372036854775807])",
       "tensor(i64, (2, 1, 2), [1, -2, 3, 9223372036854775807])"},
      {"tensor(bool, (3,), [true, false, 1])", "tensor(bool, (3,), [true, false, true])"},
      {"tensor(f32, (0,), [])", "tensor(f32, (0,), [])"},
      {"tensor(i64, (2, 0), [])", "tensor(i64, (2, 0), [])"},
      {"tensor(f32, (1,), [2f32])", "tensor(f32, (1,), [2])"},
      // Scalars written as tensors print as literals when one exists.
      {"tensor(i64, (), [5])", "5"},
      {"tensor(f64, (), [2])", "2f64"},
      // Special floats have no literal of their own.
      {"tensor(f32, (4,), [inf, -inf, nan, -nan])", "tensor(f32, (4,), [inf, -inf, nan, -nan])"},
      {"tensor(f64, (), [-inf])", "tensor(f64, (), [-inf])"},
      {"tensor(f32, (), [nan])", "tensor(f32, (), [nan])"},
  };
  for (const auto& [text, printed] : cases) {
    SCOPED_TRACE(text);
    Expr e = ParseExpr(text);
    EXPECT_EQ(PrintExpr(e), printed);
    EXPECT_TRUE(StructuralEqual(e, ParseExpr(PrintExpr(e))));
  }
  Expr e = ParseExpr("tensor(f32, (2, 2), [1, 2, 3, 4])");
  const Tensor& t = ConstantOf(e);
  EXPECT_EQ(t.shape(), (Shape{2, 2}));
  EXPECT_EQ(t.data<float>()[3], 4.0f);
  Expr specials = ParseExpr("tensor(f32, (3,), [-inf, nan, -nan])");
  const Tensor& special = ConstantOf(specials);
  EXPECT_EQ(special.data<float>()[0], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(special.data<float>()[1]) && !std::signbit(special.data<float>()[1]));
  EXPECT_TRUE(std::isnan(special.data<float>()[2]) && std::signbit(special.data<float>()[2]));
}

TEST(RoundTrip, ConstantsInPrograms) {
  ExpectCanonical(R"(def @f(%x: Tensor[(2, 2), f32]) {
  let %a = add(%x, tensor(f32, (2, 2), [1, 2, 3, 4]));
  let %b = mul(%a, -0.5);
  let %c = where(tensor(bool, (2, 2), [true, false, false, true]), %b, tensor(f32, (), [inf]));
  (%c, 7, 1e-05f64, true, (-1).0)
}
)");
}

TEST(RoundTrip, OperatorAttributesOfEachKind) {
  ExpectCanonical(R"(def @f(%x: Tensor[(4, 8), f32], %w: Tensor[(8, 8), f32], %i: Tensor[(4,), i64]) {
  let %bool = matmul(%x, %w, transpose_b=true);
  let %int = softmax(%bool, axis=0);
  let %float = pow(%int, exponent=2.5);
  let %ints = sum(%float, axes=[0, -1], keepdims=true);
  let %dtype = cast(%ints, dtype=f64);
  let %several = one_hot(%i, depth=10, dtype=i64);
  let %variadic = concat(%x, %x, %x, axis=1);
  let %empty_list = reshape(%ints, shape=[]);
  (%dtype, %several, %variadic, %empty_list)
}
)");
}

TEST(RoundTrip, DefaultAttributesAreLeftOut) {
  std::string printed = RoundTrip(R"(def @f(%x: Tensor[(4, 8), f32]) {
  let %a = softmax(%x, axis=-1);
  let %b = matmul(%a, %x, transpose_a=false, transpose_b=true);
  let %c = pow(%b, exponent=2);
  sum(%c, keepdims=false)
})");
  EXPECT_EQ(printed, R"(def @f(%x: Tensor[(4, 8), f32]) {
  let %a = softmax(%x);
  let %b = matmul(%a, %x, transpose_b=true);
  let %c = pow(%b, exponent=2.0);
  sum(%c)
}

)");
  // ... and the parser puts them back.
  Expr e = ParseExpr("softmax(tensor(f32, (2,), [1, 2]))");
  EXPECT_EQ(As<OpCallNode>(e)->attrs, (Attrs{{"axis", int64_t{-1}}}));
}

TEST(RoundTrip, FloatAttributesKeepTheirBits) {
  for (double v : {0.1, -0.0, 1e300, 5e-324, std::numeric_limits<double>::infinity(),
                   -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    Expr e = MakeOpCall("pow", {MakeConstant(Tensor::Scalar(2))}, {{"exponent", v}});
    SCOPED_TRACE(PrintExpr(e));
    Expr back = ParseExpr(PrintExpr(e));
    EXPECT_EQ(AttrValueToString(As<OpCallNode>(back)->attrs.items()[0].second), AttrValueToString(v));
    EXPECT_EQ(PrintExpr(back), PrintExpr(e));
  }
}

TEST(RoundTrip, EveryOperatorWithNonDefaultAttributes) {
  for (const OpDef* op : AllOps()) {
    SCOPED_TRACE(op->name);
    std::vector<Var> params;
    std::vector<Expr> args;
    size_t inputs = op->variadic() ? 3 : op->input_names.size();
    for (size_t i = 0; i < inputs; ++i) {
      params.push_back(MakeVar("in" + std::to_string(i), TensorTy(DType::kF32, {2, 2})));
      args.push_back(params.back());
    }
    Attrs attrs;
    for (const AttrSpec& spec : op->attrs) {
      switch (spec.kind) {
        case AttrKind::kBool: attrs.Set(spec.name, true); break;
        case AttrKind::kInt: attrs.Set(spec.name, int64_t{3}); break;
        case AttrKind::kFloat: attrs.Set(spec.name, 0.25); break;
        case AttrKind::kInts: attrs.Set(spec.name, std::vector<int64_t>{1, -2}); break;
        case AttrKind::kDType: attrs.Set(spec.name, DType::kF64); break;
      }
    }
    std::string printed = ExpectBuiltRoundTrip(MakeFunc(params, MakeOpCall(op->name, args, attrs)));
    EXPECT_NE(printed.find(op->name + (inputs ? "(%in0" : "(")), std::string::npos) << printed;  // zeros(shape=...)
  }
}

TEST(RoundTrip, TypesPrintAsTheyAreWritten) {
  TypeLookup lookup = [](const std::string& name) -> TypeDefPtr {
    static const TypeDefPtr list = ParseProgram(kList, "list.pj").types[0];
    return name == "List" ? list : nullptr;
  };
  for (const char* text : {"Tensor[(?, 128), f32]", "Tensor[(), bool]", "Tensor[(5,), i64]",
                           "Tensor[(?, ?), f64]", "()", "(Tensor[(), f32],)", "(Tensor[(), f32], ())",
                           "fn() -> ()", "fn(Tensor[(3,), f32], fn(()) -> ()) -> fn() -> Tensor[(), i64]",
                           "List[List[Tensor[(?,), f32]]]", "(fn() -> (), List[()])"}) {
    Type t = ParseType(text, lookup);
    EXPECT_EQ(TypeToString(t), text);
    EXPECT_TRUE(TypeEqual(ParseType(TypeToString(t), lookup), t)) << text;
  }
  EXPECT_EQ(TypeToString(ParseType("Tensor[(5), i64]")), "Tensor[(5,), i64]");
  EXPECT_EQ(TypeToString(ParseType("Tensor[(2, 3,), f32]")), "Tensor[(2, 3), f32]");
  EXPECT_TRUE(TypeEqual(ParseType("Tensor[(?, 4), f32]"), TensorTy(DType::kF32, {kUnknownDim, 4})));
}

TEST(RoundTrip, ExpressionsWithoutADefinition) {
  for (const char* text : {"let %x = 1;\nadd(%x, %x)", "fn (%x: Tensor[(), f32]) {\n  %x\n}", "@f(1, (2,))",
                           "(1, 2.5, true)", "if (true) {\n  1\n} else {\n  2\n}"}) {
    Expr e = ParseExpr(text);
    EXPECT_EQ(PrintExpr(e), text);
  }
}

// ---- Programs built in C++ --------------------------------------------------------

TypeDefPtr TreeDef() {
  auto def = std::make_shared<TypeDef>();
  def->name = "Tree";
  def->ctors = {{"Leaf", {ScalarTy(DType::kI64)}}, {"Node", {AdtTy("Tree"), AdtTy("Tree")}}};
  return def;
}

TEST(Builder, AllExpressionKinds) {
  TypeDefPtr tree = TreeDef();
  Var t = MakeVar("t", AdtTy("Tree"));
  Var x = MakeVar("x", TensorTy(DType::kF32, {kUnknownDim, 3}));
  Var w = MakeVar("w");
  Var l = MakeVar("l");
  Var y = MakeVar("y", ScalarTy(DType::kI64));
  Var pair = MakeVar("pair");
  Func inner = MakeFunc({y}, MakeOpCall("add", {y, w}), ScalarTy(DType::kI64));
  Expr match = MakeMatch(
      t, {{CtorPattern(tree, "Leaf", {VarPattern(w)}),
           MakeCall(inner, {MakeConstant(Tensor::ScalarOf(DType::kI64, 2))})},
          {CtorPattern(tree, "Node", {CtorPattern(tree, "Leaf", {WildcardPattern()}), VarPattern(l)}),
           MakeCall(MakeGlobal("size"), {l})},
          {WildcardPattern(), MakeConstant(Tensor::ScalarOf(DType::kI64, 0))}});
  Expr body = MakeLet(
      pair,
      MakeTuple({x, MakeCtor(tree, "Node",
                             {MakeCtor(tree, "Leaf", {MakeConstant(Tensor::ScalarOf(DType::kI64, 1))}), t})}),
      MakeIf(MakeConstant(Tensor::FromVector<bool>({}, {true})),
             MakeTuple({MakeProj(pair, 0), match, MakeTuple({})}),
             MakeTuple({MakeOpCall("sum", {x}, {{"axes", std::vector<int64_t>{1}}}),
                        MakeConstant(Tensor::ScalarOf(DType::kI64, 3)), MakeTuple({MakeProj(pair, 1)})})));
  ExpectBuiltRoundTrip(MakeFunc({t, x}, body), {tree});
}

TEST(Builder, DifferentVariablesWithOneNameArePrintedApart) {
  Var a = MakeVar("x", ScalarTy(DType::kF32));
  Var b = MakeVar("x");
  Var c = MakeVar("x_1");
  Var d = MakeVar("x");
  Expr body = MakeLet(
      b, MakeOpCall("neg", {a}),
      MakeLet(c, MakeOpCall("neg", {b}), MakeLet(d, MakeOpCall("add", {a, c}), MakeTuple({a, b, c, d}))));
  std::string printed = ExpectBuiltRoundTrip(MakeFunc({a}, body));
  EXPECT_EQ(printed, R"(def @f(%x: Tensor[(), f32]) {
  let %x_1 = neg(%x);
  let %x_1_1 = neg(%x_1);
  let %x_2 = add(%x, %x_1_1);
  (%x, %x_1, %x_1_1, %x_2)
})");
}

TEST(Builder, OneVariableBoundInTwoPlaces) {
  // Passes may reuse a variable in branches that are never in scope together.
  Var p = MakeVar("p", ScalarTy(DType::kBool));
  Var v = MakeVar("v");
  Expr one = MakeConstant(Tensor::ScalarOf(DType::kI64, 1));
  Expr body = MakeIf(p, MakeLet(v, one, MakeOpCall("neg", {v})), MakeLet(v, one, v));
  std::string printed = ExpectBuiltRoundTrip(MakeFunc({p}, body));
  EXPECT_EQ(printed.find("%v_1"), std::string::npos) << printed;
}

TEST(Builder, NamesTheLexerWouldRejectAreFixed) {
  Var a = MakeVar("", ScalarTy(DType::kF32));
  Var b = MakeVar("my var");
  Var c = MakeVar("1st");
  Expr body = MakeLet(b, MakeOpCall("neg", {a}), MakeLet(c, MakeOpCall("neg", {b}), MakeTuple({a, b, c})));
  std::string printed = ExpectBuiltRoundTrip(MakeFunc({a}, body));
  EXPECT_NE(printed.find("%my_var"), std::string::npos) << printed;
  EXPECT_NE(printed.find("%_1st"), std::string::npos) << printed;
}

TEST(Builder, SpecialScalarConstants) {
  for (float v :
       {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max(),
        std::numeric_limits<float>::lowest(), 16777217.0f, 1.0f / 3}) {
    Expr e = MakeConstant(Tensor::FromVector<float>({}, {v}));
    Expr back = ParseExpr(PrintExpr(e));
    EXPECT_TRUE(StructuralEqual(e, back)) << PrintExpr(e);
    EXPECT_EQ(Bits<uint32_t>(ConstantOf(back)), Bits<uint32_t>(ConstantOf(e))) << PrintExpr(e);
  }
  for (double v : {-0.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                   std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max(), 1.0 / 3}) {
    Expr e = MakeConstant(Tensor::FromVector<double>({}, {v}));
    EXPECT_TRUE(StructuralEqual(e, ParseExpr(PrintExpr(e)))) << PrintExpr(e);
  }
  for (int64_t v : {std::numeric_limits<int64_t>::min(), int64_t{0}, std::numeric_limits<int64_t>::max()}) {
    Expr e = MakeConstant(Tensor::FromVector<int64_t>({}, {v}));
    EXPECT_TRUE(StructuralEqual(e, ParseExpr(PrintExpr(e)))) << PrintExpr(e);
  }
}

TEST(Builder, OperandsThatNeedParentheses) {
  Var x = MakeVar("x", ScalarTy(DType::kF32));
  auto y = [] { return MakeVar("y", ScalarTy(DType::kF32)); };
  auto id = [&] {
    Var v = y();
    return MakeFunc({v}, v);
  };
  Var a = y(), b = y(), c = y();
  Expr yes = MakeConstant(Tensor::FromVector<bool>({}, {true}));
  Expr body = MakeTuple({
      MakeCall(id(), {x}),                                          // (fn ...)(%x)
      MakeCall(MakeIf(yes, id(), id()), {x}),                       // (if ...)(%x)
      MakeProj(MakeConstant(Tensor::ScalarOf(DType::kI64, 3)), 0),  // (3).0
      MakeProj(MakeLet(a, x, MakeTuple({a})), 0),                   // { let ... }.0
      MakeOpCall("add", {MakeLet(b, x, b), x}),                     // a let as an argument
      MakeCall(MakeLet(c, id(), c), {x}),                           // { let ... }(%x)
  });
  std::string printed = ExpectBuiltRoundTrip(MakeFunc({x}, body));
  EXPECT_NE(printed.find("(3).0"), std::string::npos) << printed;
}

TEST(Builder, FreeVariablesPrintByName) {
  Var a = MakeVar("a");
  Var a2 = MakeVar("a");
  Var b = MakeVar("a");
  Expr e = MakeTuple({a, a2, MakeLet(b, a, b)});
  EXPECT_EQ(PrintExpr(e), "(%a, %a_1, {\n  let %a_2 = %a;\n  %a_2\n})");
}

// ---- Names, locations and lookups -------------------------------------------------

TEST(Parse, EveryNodeHasItsLocationInOneSharedFileName) {
  ParsedProgram p = ParseProgram(R"(def @f(%x: Tensor[(), f32]) {
  let %y = neg(%x);
  (%y, @g(%y).0)
})",
                                 "loc.pj");
  const Func& f = p.defs[0].second;
  EXPECT_EQ(f->loc.ToString(), "loc.pj:1:1");
  EXPECT_EQ(f->params[0]->loc.ToString(), "loc.pj:1:8");
  const LetNode* let = As<LetNode>(f->body);
  ASSERT_TRUE(let);
  EXPECT_EQ(let->loc.ToString(), "loc.pj:2:3");
  EXPECT_EQ(let->var->loc.ToString(), "loc.pj:2:7");
  EXPECT_EQ(let->value->loc.ToString(), "loc.pj:2:12");
  EXPECT_EQ(let->value->loc.file, f->loc.file);  // one string for the file, shared
  const TupleNode* tuple = As<TupleNode>(let->body);
  ASSERT_TRUE(tuple);
  EXPECT_EQ(tuple->loc.ToString(), "loc.pj:3:3");
  EXPECT_EQ(tuple->fields[0].get(), let->var.get());  // a use is the variable's node
  const ProjNode* proj = As<ProjNode>(tuple->fields[1]);
  ASSERT_TRUE(proj);
  EXPECT_EQ(proj->loc.ToString(), "loc.pj:3:14");
  EXPECT_EQ(proj->tuple->loc.ToString(), "loc.pj:3:8");                        // the call, at its callee
  EXPECT_EQ(As<CallNode>(proj->tuple)->callee->loc.ToString(), "loc.pj:3:8");  // @g
  EXPECT_EQ(ParseExpr("\n  neg(1f32)")->loc.ToString(), "<input>:2:3");
}

TEST(Parse, ConstructorsResolveToTheirType) {
  ParsedProgram p = ParseProgram(std::string(kTree) + "def @f() { Node(Leaf(1), Leaf(2)) }", "t.pj");
  const CtorNode* node = As<CtorNode>(p.defs[0].second->body);
  ASSERT_TRUE(node);
  EXPECT_EQ(node->adt, p.types[0]);
  EXPECT_EQ(node->tag, 1);
  EXPECT_EQ(node->ctor_name(), "Node");
  EXPECT_EQ(As<CtorNode>(node->args[0])->tag, 0);
}

TEST(Parse, TypesAndConstructorsFromTheLookup) {
  TypeDefPtr tree = ParseProgram(kTree, "tree.pj").types[0];
  // Like a module's: knows types by name only. Constructors are then found
  // through the types the text names, wherever it names them.
  TypeLookup by_type = [&](const std::string& name) { return name == "Tree" ? tree : nullptr; };
  ParsedProgram p = ParseProgram(R"(def @f(%x: Tensor[(), i64]) {
  let %t = Node(Leaf(%x), Leaf(%x));
  let %u: Tree = %t;
  match (%u) {
    Leaf(%w) => %w,
    _ => 0,
  }
})",
                                 "f.pj", by_type);
  EXPECT_TRUE(p.types.empty());
  const LetNode* let = As<LetNode>(p.defs[0].second->body);
  EXPECT_EQ(As<CtorNode>(let->value)->adt, tree);
  // One that also knows constructor names needs no type named in the text.
  TypeLookup by_ctor = [&](const std::string& name) {
    return name == "Tree" || tree->FindCtor(name) >= 0 ? tree : nullptr;
  };
  Expr e = ParseExpr("Node(Leaf(1), Leaf(2))", by_ctor);
  EXPECT_EQ(As<CtorNode>(e)->adt, tree);
  EXPECT_EQ(ExprErrorOf("Leaf(1)", by_type), "<input>:1:1: unknown constructor 'Leaf'");
  // A type of the file hides the lookup's.
  ParsedProgram own = ParseProgram("type Tree { Leaf } def @g() { Leaf }", "g.pj", by_ctor);
  EXPECT_EQ(As<CtorNode>(own.defs[0].second->body)->adt, own.types[0]);
}

TEST(Parse, UnknownGlobalsAreLeftToTheModule) {
  Expr e = ParseExpr("@nowhere(1)");
  EXPECT_EQ(As<GlobalNode>(As<CallNode>(e)->callee)->name, "nowhere");
}

TEST(Parse, CommentsAndWhitespace) {
  ParsedProgram p = ParseProgram(
      "# header\n\ndef @f(%x: Tensor[(), f32]) # trailing\n{ # inside\n %x # use\n}\n# end", "c.pj");
  ASSERT_EQ(p.defs.size(), 1u);
  EXPECT_EQ(p.defs[0].first, "f");
}

TEST(Parse, EmptyFile) {
  ParsedProgram p = ParseProgram("  # nothing\n", "empty.pj");
  EXPECT_TRUE(p.types.empty());
  EXPECT_TRUE(p.defs.empty());
}

// ---- Errors ---------------------------------------------------------------------

std::string Nested(int n, const std::string& open, const std::string& inner, const std::string& close) {
  std::string s;
  for (int i = 0; i < n; ++i) s += open;
  s += inner;
  for (int i = 0; i < n; ++i) s += close;
  return s;
}

// Issue 24: input decides no native stack: nesting past 256 levels is an
// error at the token where it happens, long let chains are not nesting.
TEST(Errors, NestingDeeperThan256LevelsIsAnErrorAtItsPosition) {
  EXPECT_EQ(ErrorOf(InFunction(Nested(10000, "(", "%x", ")"))), "err.pj:2:259: nested deeper than 256 levels");
  EXPECT_EQ(ErrorOf(InFunction(Nested(10000, "neg(", "%x", ")"))), "err.pj:2:1027: nested deeper than 256 levels");
  EXPECT_EQ(ErrorOf("type T { A(" + Nested(5000, "(", "Tensor[(), f32]", ")") + ") }"),
            "err.pj:1:268: nested deeper than 256 levels");
  EXPECT_EQ(ErrorOf(InFunction(Nested(250, "neg(", "%x", ")"))), "");
  std::string lets;
  for (int i = 0; i < 20000; ++i) lets += "let %v" + std::to_string(i) + " = neg(%x); ";
  EXPECT_EQ(ErrorOf(InFunction(lets + "%x")), "");
}

TEST(Errors, UnexpectedToken) {
  EXPECT_EQ(ErrorOf(InFunction("add(%x, %x;")), "err.pj:2:13: expected ')' after arguments, got ';'");
  EXPECT_EQ(ErrorOf(InFunction("let %y = %x\n  %y")),
            "err.pj:3:3: expected ';' after the value of %y, got '%y'");
  EXPECT_EQ(ErrorOf(InFunction("let %y %x; %y")), "err.pj:2:10: expected '=' after 'let %y', got '%x'");
  EXPECT_EQ(ErrorOf(InFunction("if (true) { %x } { %x }")),
            "err.pj:2:20: expected 'else' after the block of 'if', got '{'");
  EXPECT_EQ(ErrorOf(InFunction("match (%t) { Leaf(%w) %w }")),
            "err.pj:2:25: expected '=>' after the pattern, got '%w'");
  EXPECT_EQ(ErrorOf(InFunction("(%x, %x")), "err.pj:3:1: expected ',' or ')' in a tuple, got '}'");
  EXPECT_EQ(ErrorOf(InFunction("%x.(")), "err.pj:2:6: expected a field index or name after '.', got '('");
  EXPECT_EQ(ErrorOf(InFunction("else")), "err.pj:2:3: expected an expression, got 'else'");
  EXPECT_EQ(ErrorOf(InFunction("match (%t) { }")), "err.pj:2:16: expected a pattern, got '}'");
  EXPECT_EQ(ErrorOf("type Void { }"),
            "err.pj:1:13: expected a constructor name (starting with a capital), got '}'");
  EXPECT_EQ(ErrorOf(InFunction("if (true) { 1 } else if (false) { 2 } else { 3 }")),
            "err.pj:2:24: expected '{' after 'else', got 'if'");
  EXPECT_EQ(ErrorOf(InFunction("relu")), "err.pj:3:1: expected '(' after operator 'relu', got '}'");
  EXPECT_EQ(ErrorOf("def @f() {"), "err.pj:1:11: expected an expression, got end of input");
  EXPECT_EQ(ErrorOf("def @f(%x) { %x }"), "err.pj:1:10: expected ':' and a type after parameter %x, got ')'");
  EXPECT_EQ(ErrorOf("def f() { 1 }"), "err.pj:1:5: expected a name like '@f' after 'def', got 'f'");
  EXPECT_EQ(ErrorOf("let %x = 1;"), "err.pj:1:1: expected 'def' or 'type', got 'let'");
  EXPECT_EQ(ErrorOf("def @f() { 1 } }"), "err.pj:1:16: expected 'def' or 'type', got '}'");
  EXPECT_EQ(ErrorOf(InFunction("sum(axes=[0], %x)")),
            "err.pj:2:17: operator inputs must come before attributes");
  EXPECT_EQ(ErrorOf(InFunction("$")), "err.pj:2:3: unexpected character '$'");
  EXPECT_EQ(ErrorOf(InFunction("% x")), "err.pj:2:3: expected a name after '%'");
  EXPECT_EQ(ExprErrorOf("1 2"), "<input>:1:3: expected end of input after the expression, got '2'");
}

TEST(Errors, UnknownVariable) {
  EXPECT_EQ(ErrorOf(InFunction("%xx")), "err.pj:2:3: unknown variable '%xx'; did you mean '%x'?");
  EXPECT_EQ(ErrorOf(InFunction("add(%x, %somewhere)")), "err.pj:2:11: unknown variable '%somewhere'");
  // A let's variable is not in scope in its own value, nor after its block.
  EXPECT_EQ(ErrorOf(InFunction("let %y = %y; %y")), "err.pj:2:12: unknown variable '%y'; did you mean '%x'?");
  EXPECT_EQ(ErrorOf(InFunction("let %a = { let %inner = %x; %inner }; %inner")),
            "err.pj:2:41: unknown variable '%inner'");
  // Pattern variables are in scope in their clause only.
  EXPECT_EQ(ErrorOf(InFunction("match (%t) { Leaf(%w) => %w, _ => %w }")),
            "err.pj:2:37: unknown variable '%w'; did you mean '%x'?");
  EXPECT_EQ(ExprErrorOf("%free"), "<input>:1:1: unknown variable '%free'");
}

TEST(Errors, UnknownConstructor) {
  std::string text = std::string(kTree) + R"(
# The word at the leftmost leaf.
def @leftmost(%t: Tree) -> Tensor[(), i64] {
  match (%t) {
    Leaf(%w) => %w,
    Node(%l, %r) => {
      let %first = @leftmost(%l);
      match (%r) {
        Node(_, _) => %first,
        Lief(%w) => add(%first, %w),
      }
    },
  }
}
)";
  EXPECT_EQ(ErrorOf(text, "treelstm.pj"),
            "treelstm.pj:14:9: unknown constructor 'Lief'; did you mean 'Leaf'?");
  EXPECT_EQ(ErrorOf(InFunction("Nod(%t, %t)")),
            "err.pj:2:3: unknown constructor 'Nod'; did you mean 'Node'?");
  EXPECT_EQ(ErrorOf(InFunction("Forest")), "err.pj:2:3: unknown constructor 'Forest'");
}

TEST(Errors, UnknownType) {
  EXPECT_EQ(ErrorOf("def @f(%t: Tre) { %t }\n" + std::string(kTree)),
            "err.pj:1:12: unknown type 'Tre'; did you mean 'Tree'?");
  EXPECT_EQ(ErrorOf("def @f(%t: Forest) { %t }"), "err.pj:1:12: unknown type 'Forest'");
  EXPECT_EQ(ErrorOf("def @f(%t: f32) { %t }"),
            "err.pj:1:12: expected a type, got 'f32' (tensor types are written Tensor[(dims), dtype])");
  EXPECT_EQ(ErrorOf("def @f(%t: T) { %t }\n" + std::string(kList)), "err.pj:1:12: unknown type 'T'");
  EXPECT_EQ(ErrorOf("def @f(%t: List) { %t }\n" + std::string(kList)),
            "err.pj:1:12: type 'List' takes 1 type argument, got 0");
  EXPECT_EQ(ErrorOf("type Bad[T] { B(T[T]) }"), "err.pj:1:17: type parameter 'T' takes no type arguments");
  EXPECT_EQ(ErrorOf("type Tensor { T }"), "err.pj:1:6: 'Tensor' is reserved");
}

TEST(Errors, UnknownOperator) {
  EXPECT_EQ(ErrorOf(InFunction("madd(%x, %x)")), "err.pj:2:3: unknown operator 'madd'; did you mean 'add'?");
  EXPECT_EQ(ErrorOf(InFunction("let %y = frobnicate(%x); %y")), "err.pj:2:12: unknown operator 'frobnicate'");
}

TEST(Errors, BadAttributesAreReportedAtTheOperator) {
  EXPECT_EQ(ErrorOf(InFunction("let %s = sum(%x, axis=[1]); %s")),
            "err.pj:2:12: sum: unknown attribute 'axis'; did you mean 'axes'?");
  EXPECT_EQ(ErrorOf(InFunction("sum(%x, keepdims=1)")),
            "err.pj:2:3: sum: attribute 'keepdims' must be bool, got int 1");
  EXPECT_EQ(ErrorOf(InFunction("softmax(%x, axis=1.5)")),
            "err.pj:2:3: softmax: attribute 'axis' must be int, got float 1.5");
  EXPECT_EQ(ErrorOf(InFunction("reshape(%x)")), "err.pj:2:3: reshape: missing attribute 'shape'");
  EXPECT_EQ(ErrorOf(InFunction("sum(%x, axes=[0], axes=[1])")), "err.pj:2:21: duplicate attribute 'axes'");
  EXPECT_EQ(ErrorOf(InFunction("sum(%x, axes=[0.5])")),
            "err.pj:2:17: expected an integer in an attribute list, got '0.5'");
  EXPECT_EQ(
      ErrorOf(InFunction("sum(%x, axes=%x)")),
      "err.pj:2:16: expected an attribute value (a number, true, false, a dtype or [integers]), got '%x'");
  EXPECT_EQ(
      ErrorOf(InFunction("cast(%x, dtype=f16)")),
      "err.pj:2:18: expected an attribute value (a number, true, false, a dtype or [integers]), got 'f16'");
  EXPECT_EQ(ErrorOf(InFunction("pow(%x, exponent=2f32)")),
            "err.pj:2:20: attribute values take no dtype suffix: '2f32'");
}

TEST(Errors, WrongConstructorArity) {
  EXPECT_EQ(ErrorOf(InFunction("Leaf(1, 2)")), "err.pj:2:3: constructor 'Leaf' takes 1 argument, got 2");
  EXPECT_EQ(ErrorOf(InFunction("Node")), "err.pj:2:3: constructor 'Node' takes 2 arguments, got 0");
  EXPECT_EQ(ErrorOf(InFunction("match (%t) { Node(%l) => %l }")),
            "err.pj:2:16: constructor 'Node' takes 2 arguments, got 1");
  EXPECT_EQ(ErrorOf("type Unit { U }\ndef @f() { U(1) }"),
            "err.pj:2:12: constructor 'U' takes 0 arguments, got 1");
}

TEST(Errors, DuplicateDefinitions) {
  EXPECT_EQ(ErrorOf("def @f() { 1 }\ndef @f() { 2 }"),
            "err.pj:2:5: duplicate definition of '@f'; first defined at err.pj:1:5");
  EXPECT_EQ(ErrorOf(std::string(kTree) + "type Tree { Other }"),
            "err.pj:5:6: duplicate type 'Tree'; first defined at err.pj:1:6");
  EXPECT_EQ(ErrorOf(std::string(kTree) + "type Forest { Empty, Leaf }"),
            "err.pj:5:22: duplicate constructor 'Leaf'; first defined at err.pj:2:3");
  EXPECT_EQ(ErrorOf("type Pair[A, A] { P(A) }"), "err.pj:1:14: duplicate type parameter 'A'");
  EXPECT_EQ(ErrorOf("def @f(%x: (), %x: ()) { %x }"), "err.pj:1:16: duplicate parameter '%x'");
  // 100,000 parameters (the duplicate check was a scan per parameter: 83 s),
  // the last one repeating the first.
  std::string wide = "def @f(";
  for (int i = 0; i < 100'000; ++i) wide += "%x" + std::to_string(i) + ": (), ";
  const std::string error = ErrorOf(wide + "%x0: ()) { %x0 }");
  EXPECT_NE(error.find(": duplicate parameter '%x0'"), std::string::npos) << error.substr(0, 200);
  ParseProgram(wide + "%y: ()) { %y }", "wide.pj");
  EXPECT_EQ(ErrorOf(InFunction("match (%t) { Node(%l, %l) => %l }")),
            "err.pj:2:25: variable '%l' is bound twice in one pattern");
}

TEST(Errors, BadDtype) {
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,), f16]) { %x }"),
            "err.pj:1:25: unknown dtype 'f16' (f32, f64, i64 or bool)");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,), f33]) { %x }"),
            "err.pj:1:25: unknown dtype 'f33'; did you mean 'f32'?");
  EXPECT_EQ(ExprErrorOf("tensor(int, (1,), [1])"),
            "<input>:1:8: unknown dtype 'int' (f32, f64, i64 or bool)");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2,)]) { %x }"),
            "err.pj:1:23: expected ',' and a dtype after the dimensions, got ']'");
}

TEST(Errors, BadNumbers) {
  EXPECT_EQ(ExprErrorOf("3f16"), "<input>:1:1: bad number '3f16' (a dtype suffix is f32, f64 or i64)");
  EXPECT_EQ(ExprErrorOf("(1, 1e)"), "<input>:1:5: bad number '1e' (a dtype suffix is f32, f64 or i64)");
  EXPECT_EQ(ExprErrorOf("3.5i64"), "<input>:1:1: an i64 number must be an integer, got '3.5i64'");
  EXPECT_EQ(ExprErrorOf("99999999999999999999"),
            "<input>:1:1: integer '99999999999999999999' is out of range for i64");
  EXPECT_EQ(ExprErrorOf("1e39"), "<input>:1:1: number '1e39' is out of range for f32");
  EXPECT_EQ(ExprErrorOf("1e309f64"), "<input>:1:1: number '1e309f64' is out of range for f64");
  EXPECT_EQ(ExprErrorOf("inf"),
            "<input>:1:1: expected an expression, got 'inf' (write e.g. tensor(f32, (), [inf]))");
  EXPECT_EQ(ExprErrorOf("tensor(f32, (2, 2), [1, 2, 3])"),
            "<input>:1:21: a tensor of shape (2, 2) needs 4 values, got 3");
  EXPECT_EQ(ExprErrorOf("tensor(i64, (2,), [1, 1.5])"),
            "<input>:1:23: an i64 number must be an integer, got '1.5'");
  EXPECT_EQ(ExprErrorOf("tensor(i64, (1,), [nan])"), "<input>:1:20: 'nan' in a i64 tensor");
  EXPECT_EQ(ExprErrorOf("tensor(f32, (1,), [1f64])"), "<input>:1:20: number '1f64' in a f32 tensor");
  EXPECT_EQ(ExprErrorOf("tensor(bool, (1,), [2])"),
            "<input>:1:21: expected true, false, 0 or 1 in a bool tensor, got '2'");
  EXPECT_EQ(ExprErrorOf("tensor(f32, (-1,), [])"),
            "<input>:1:14: bad dimension '-1': expected a non-negative integer");
  EXPECT_EQ(ErrorOf("def @f(%x: Tensor[(2.5,), f32]) { %x }"),
            "err.pj:1:20: bad dimension '2.5': expected a non-negative integer");
  EXPECT_EQ(ExprErrorOf("(1, 2).-1"), "<input>:1:8: bad field index '-1'");
}

// ---- The examples of docs/language.md --------------------------------------------

// The fenced code blocks of the language reference that hold programs (not
// grammar): those with a line starting a `def @` or a `type Name`.
std::vector<std::string> ProgramBlocksOfTheDoc() {
  std::ifstream in("docs/language.md");
  EXPECT_TRUE(in) << "docs/language.md is not in the test's runfiles";
  std::vector<std::string> blocks;
  std::string line, block;
  bool inside = false, program = false;
  while (std::getline(in, line)) {
    if (line.starts_with("```")) {
      if (inside && program) blocks.push_back(block);
      inside = !inside;
      block.clear();
      program = false;
      continue;
    }
    if (!inside) continue;
    block += line + "\n";
    program |=
        line.starts_with("def @") || (line.starts_with("type ") && line.size() > 5 && std::isupper(line[5]));
  }
  return blocks;
}

// A name of megabytes in an error is echoed bounded: its head, its tail and
// how much was left out, never the whole of it.
TEST(Errors, AHugeNameIsEchoedBounded) {
  const std::string name = "Ctor" + std::string(2 << 20, 'x');
  const std::string error = ErrorOf("type T { A(Tensor[(), f32]) }\ndef @f(%x: Tensor[(), f32]) { " + name + "(%x) }");
  EXPECT_LT(error.size(), 2100u) << error.substr(0, 200);
  EXPECT_EQ(error.rfind("err.pj:2:", 0), 0u) << error.substr(0, 200);
  EXPECT_NE(error.find("bytes)..."), std::string::npos) << error.substr(0, 200);
}

TEST(Docs, EveryProgramOfTheLanguageReferenceParses) {
  std::vector<std::string> blocks = ProgramBlocksOfTheDoc();
  ASSERT_GE(blocks.size(), 2u);
  for (size_t i = 0; i < blocks.size(); ++i) {
    SCOPED_TRACE("block " + std::to_string(i) + ":\n" + blocks[i]);
    ParsedProgram p = ParseProgram(blocks[i], "language.md");
    EXPECT_FALSE(p.defs.empty());
    ExpectProgramRoundTrip(p);
  }
}

TEST(Docs, TheTreeLstmParses) {
  std::vector<std::string> blocks = ProgramBlocksOfTheDoc();
  ASSERT_FALSE(blocks.empty());
  ParsedProgram p = ParseProgram(blocks.back(), "treelstm.pj");
  ASSERT_EQ(p.types.size(), 1u);
  EXPECT_EQ(p.types[0]->name, "Tree");
  ASSERT_EQ(p.defs.size(), 2u);
  EXPECT_EQ(p.defs[0].first, "cell");
  EXPECT_EQ(p.defs[1].first, "tree");
  EXPECT_EQ(p.defs[0].second->params.size(), 6u);
  EXPECT_TRUE(TypeEqual(p.defs[1].second->params[1]->annotation, TensorTy(DType::kF32, {kUnknownDim, 64})));
  const MatchNode* match = As<MatchNode>(p.defs[1].second->body);
  ASSERT_TRUE(match);
  EXPECT_EQ(match->clauses.size(), 2u);
  ExpectProgramRoundTrip(p);
}

}  // namespace
}  // namespace pejit
