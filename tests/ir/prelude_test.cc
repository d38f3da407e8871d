// The prelude (ir/prelude.h): a source gets the prelude's types and
// definitions it names and does not define, with what they need, and nothing
// else; a name it defines itself stays its own.
#include "ir/prelude.h"

#include <gtest/gtest.h>

#include "interp/interpreter.h"
#include "ir/module.h"

namespace pejit {
namespace {

// A list of f32 scalars of the module's List.
Value ListOf(const ModuleSnapshot& m, const std::vector<float>& xs) {
  TypeDefPtr list = m.FindType("List");
  Value v = Value::Adt(list, list->FindCtor("Nil"), {});
  for (size_t i = xs.size(); i-- > 0;) v = Value::Adt(list, list->FindCtor("Cons"), {Value(Tensor::Scalar(xs[i])), v});
  return v;
}

std::vector<float> Floats(const Value& list) {
  std::vector<float> out;
  for (const Value* v = &list; v->ctor_name() == "Cons"; v = &v->fields()[1]) out.push_back(v->fields()[0].tensor().data<float>()[0]);
  return out;
}

TEST(Prelude, ASourceGetsWhatItNamesAndWhatThatNeedsOnly) {
  Module m;
  std::vector<std::string> added = m.AddSource(
      "def @backwards(%xs: List[Tensor[(), f32]]) -> List[Tensor[(), f32]] { @reverse(%xs) }", "user.pj");
  EXPECT_EQ(added, (std::vector<std::string>{"backwards", "reverse", "reverse_onto"}));
  Snapshot s = m.snapshot();
  ASSERT_TRUE(s->FindType("List"));
  EXPECT_EQ(*s->FindType("List")->loc.file, "prelude.pj");
  EXPECT_FALSE(s->FindType("Option"));  // not named, not taken
  EXPECT_FALSE(s->Find("map"));
  Value got = Interpreter().Call(*s, "backwards", {ListOf(*s, {1, 2, 3})});
  EXPECT_EQ(Floats(got), (std::vector<float>{3, 2, 1}));
}

TEST(Prelude, EveryDefinitionComputesWhatItsNameSays) {
  Module m;
  m.AddSource(R"(
def @all(%xs: List[Tensor[(), f32]], %ys: List[Tensor[(), f32]]) {
  let %doubled: List[Tensor[(), f32]] = @map(fn (%x: Tensor[(), f32]) { mul(%x, 2) }, %xs);
  let %both: List[Tensor[(), f32]] = @append(%doubled, %ys);
  let %pairs: List[(Tensor[(), f32], Tensor[(), f32])] = @zip(%xs, %ys);
  let %dot = @fold(fn (%s: Tensor[(), f32], %p: (Tensor[(), f32], Tensor[(), f32])) { add(%s, mul(%p.0, %p.1)) }, 0f32, %pairs);
  let %first: Option[Tensor[(), f32]] = match (%xs) { Cons(%x, _) => Some(%x), Nil => None };
  (%both, %dot, @length(%both), match (%first) { Some(%x) => %x, None => -1f32 })
})",
              "user.pj");
  Snapshot s = m.snapshot();
  Value out = Interpreter().Call(*s, "all", {ListOf(*s, {1, 2, 3}), ListOf(*s, {10, 20})});
  EXPECT_EQ(Floats(out.fields()[0]), (std::vector<float>{2, 4, 6, 10, 20}));
  EXPECT_EQ(out.fields()[1].tensor().data<float>()[0], 1 * 10 + 2 * 20);  // zip stops at the shorter list
  EXPECT_EQ(out.fields()[2].tensor().data<int64_t>()[0], 5);
  EXPECT_EQ(out.fields()[3].tensor().data<float>()[0], 1);
}

// Programs written before the prelude keep their meaning: their own List
// (its constructors included) is theirs, and the prelude's @map, which is
// over the prelude's List, is not pulled next to it.
TEST(Prelude, ANameTheProgramDefinesStaysItsOwn) {
  Module m;
  m.AddSource("type List[T] { Empty, Link(T, List[T]) }\n"
              "def @length(%xs: List[Tensor[(), f32]]) -> Tensor[(), f32] { 7f32 }",
              "user.pj");
  Snapshot s = m.snapshot();
  EXPECT_EQ(*s->FindType("List")->loc.file, "user.pj");
  EXPECT_EQ(s->Names(), (std::vector<std::string>{"length"}));
  try {
    m.AddSource("def @f(%xs: List[Tensor[(), f32]]) { @map(fn (%x: Tensor[(), f32]) { %x }, %xs) }", "more.pj");
    FAIL() << "expected IrError";
  } catch (const IrError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("more.pj:1:38: unknown definition '@map'", 0), 0u) << e.what();
  }
}

// A constructor means one thing: a prelude type whose constructor a type of
// the program's already has is refused, at that type.
TEST(Prelude, APreludeTypeIsNotTakenBesideAConstructorOfTheSameName) {
  Module m;
  try {
    m.AddSource("type Maybe { None, Just(Tensor[(), f32]) }\ndef @f(%x: Tensor[(), f32]) { Some(%x) }", "clash.pj");
    FAIL() << "expected IrError";
  } catch (const IrError& e) {
    EXPECT_STREQ(e.what(), "clash.pj:1:6: constructor None of type Maybe is also one of the prelude's Option, which "
                           "clash.pj names: rename one, or define Option in the program");
  }
  EXPECT_TRUE(m.snapshot()->Names().empty());  // nothing was added
}

// A later source finds the prelude's List in the module, where an earlier
// one put it, and takes more of the prelude over it.
TEST(Prelude, LaterSourcesShareWhatEarlierOnesTook) {
  Module m;
  m.AddSource("def @n(%xs: List[Tensor[(), f32]]) { @length(%xs) }", "a.pj");
  std::vector<std::string> added =
      m.AddSource("def @total(%xs: List[Tensor[(), f32]]) { @fold(fn (%s: Tensor[(), f32], %x: Tensor[(), f32]) { add(%s, %x) }, 0f32, %xs) }",
                  "b.pj");
  EXPECT_EQ(added, (std::vector<std::string>{"total", "fold"}));
  Snapshot s = m.snapshot();
  EXPECT_EQ(Interpreter().Call(*s, "total", {ListOf(*s, {1, 2, 3.5f})}).tensor().data<float>()[0], 6.5f);
  EXPECT_EQ(Interpreter().Call(*s, "n", {ListOf(*s, {1, 2, 3.5f})}).tensor().data<int64_t>()[0], 3);
}

TEST(Prelude, ItsTextTypeChecksWhole) {
  Module m;
  EXPECT_NO_THROW(m.AddSource(PreludeSource(), "prelude.pj"));
  EXPECT_EQ(m.snapshot()->Names(), (std::vector<std::string>{"append", "fold", "length", "map", "reverse", "reverse_onto", "zip"}));
}

}  // namespace
}  // namespace pejit
