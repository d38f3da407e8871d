// The Module: many entries sharing code, versions, the call graph, and edits
// that are atomic, checked, and visible to readers only as a whole.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "ir/module.h"
#include "ir/printer.h"
#include "ir/structural.h"

namespace pejit {
namespace {

constexpr char kProgram[] = R"(
def @layer(%x: Tensor[(2, 3), f32], %w: Tensor[(4, 3), f32], %b: Tensor[(4,), f32]) {
  relu(dense(%x, %w, %b))
}
def @forward(%x: Tensor[(2, 3), f32], %w: Tensor[(4, 3), f32], %b: Tensor[(4,), f32]) {
  @layer(%x, %w, %b)
}
def @loss(%x: Tensor[(2, 3), f32], %w: Tensor[(4, 3), f32], %b: Tensor[(4,), f32],
          %labels: Tensor[(2,), i64]) {
  cross_entropy(@forward(%x, %w, %b), %labels)
}
def @infer(%x: Tensor[(2, 3), f32], %w: Tensor[(4, 3), f32], %b: Tensor[(4,), f32]) {
  argmax(@forward(%x, %w, %b))
}
def @other(%x: Tensor[(2,), f32]) { exp(%x) }
)";

std::string ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const IrError& e) {
    return e.what();
  }
  return "";
}

TEST(Module, EveryDefinitionIsAnEntryAndEntriesShareCallees) {
  Module m;
  EXPECT_EQ(m.AddSource(kProgram, "mlp.pj"), (std::vector<std::string>{"layer", "forward", "loss", "infer", "other"}));
  Snapshot s = m.snapshot();
  EXPECT_EQ(s->Names(), (std::vector<std::string>{"forward", "infer", "layer", "loss", "other"}));
  EXPECT_EQ(s->Callees("loss"), (std::set<std::string>{"forward", "layer"}));
  EXPECT_EQ(s->Callees("infer"), (std::set<std::string>{"forward", "layer"}));
  EXPECT_EQ(s->Dependents("layer"), (std::set<std::string>{"forward", "infer", "loss"}));
  EXPECT_TRUE(s->Dependents("other").empty());
  EXPECT_EQ(s->Get("loss").callees, (std::vector<std::string>{"forward"}));
}

TEST(Module, VersionsGrowOnEveryChangeOfThatDefinitionOnly) {
  Module m;
  m.AddSource(kProgram, "mlp.pj");
  Snapshot before = m.snapshot();
  uint64_t v = m.Replace("layer", before->Get("layer").func);  // same text, new version
  Snapshot after = m.snapshot();
  EXPECT_GT(v, before->Get("layer").version);
  EXPECT_EQ(after->Get("forward").version, before->Get("forward").version);  // same type: callers untouched
  EXPECT_EQ(after->Get("other").version, before->Get("other").version);
  EXPECT_NE(after->VersionsOf("loss"), before->VersionsOf("loss"));
  EXPECT_EQ(after->VersionsOf("other"), before->VersionsOf("other"));
  EXPECT_EQ(after->generation(), before->generation() + 1);
}

TEST(Module, EditsReportWhatTheyAffect) {
  Module m;
  m.AddSource(kProgram, "mlp.pj");
  std::vector<ModuleEdit> edits;
  m.Subscribe([&](const ModuleEdit& e) { edits.push_back(e); });
  m.AddSource("def @layer(%x: Tensor[(2, 3), f32], %w: Tensor[(4, 3), f32], %b: Tensor[(4,), f32]) {\n"
              "  tanh(dense(%x, %w, %b))\n}",
              "edit.pj", /*replace_existing=*/true);
  ASSERT_EQ(edits.size(), 1u);
  EXPECT_EQ(edits[0].kind, ModuleEdit::Kind::kReplace);
  EXPECT_EQ(edits[0].changed, (std::vector<std::string>{"layer"}));
  EXPECT_EQ(edits[0].affected, (std::set<std::string>{"forward", "infer", "layer", "loss"}));
  EXPECT_EQ(edits[0].after, m.snapshot());
}

TEST(Module, ReplacingWithAnotherTypeRechecksAndReversionsCallers) {
  Module m;
  m.AddSource("def @g(%x: Tensor[(2,), f32]) { %x }\n"
              "def @f(%x: Tensor[(2,), f32]) { exp(@g(%x)) }",
              "a.pj");
  uint64_t f_version = m.snapshot()->Get("f").version;
  m.AddSource("def @g(%x: Tensor[(?,), f32]) { %x }", "b.pj", true);
  Snapshot s = m.snapshot();
  EXPECT_GT(s->Get("f").version, f_version);
  EXPECT_EQ(TypeToString(s->Get("f").type), "fn(Tensor[(2,), f32]) -> Tensor[(?,), f32]");
}

TEST(Module, ABadEditLeavesTheModuleUnchanged) {
  Module m;
  m.AddSource(kProgram, "mlp.pj");
  Snapshot before = m.snapshot();
  // Does not type-check.
  EXPECT_EQ(ErrorOf([&] { m.AddSource("def @other(%x: Tensor[(2,), f32]) { matmul(%x, %x) }", "bad.pj", true); }),
            "bad.pj:1:37: matmul: inputs must both be rank 2 or both rank 3: lhs (2,) vs rhs (2,)");
  // Type-checks, but breaks a caller.
  EXPECT_EQ(ErrorOf([&] {
              m.AddSource("def @layer(%x: Tensor[(2, 3), f32], %w: Tensor[(4, 3), f32], %b: Tensor[(4,), f32]) {\n"
                          "  (%x, %w)\n}",
                          "bad.pj", true);
            }),
            "mlp.pj:13:10: this change breaks @infer: input 0 of argmax must be a tensor, got "
            "(Tensor[(2, 3), f32], Tensor[(4, 3), f32])");
  // Removing a definition that is still called.
  EXPECT_EQ(ErrorOf([&] { m.Remove("layer"); }), "cannot remove @layer: still called by @forward, @infer, @loss");
  EXPECT_EQ(ErrorOf([&] { m.Remove("lyer"); }), "unknown definition '@lyer'; did you mean '@layer'?");
  EXPECT_EQ(ErrorOf([&] { m.AddSource("def @other(%x: Tensor[(2,), f32]) { %x }", "dup.pj"); }),
            "dup.pj:1:1: @other is already defined in the module");
  EXPECT_EQ(m.snapshot(), before);
}

TEST(Module, RemoveDropsAnUnusedDefinition) {
  Module m;
  m.AddSource(kProgram, "mlp.pj");
  m.Remove("other");
  EXPECT_EQ(m.snapshot()->Find("other"), nullptr);
  m.Remove("infer");
  EXPECT_EQ(m.snapshot()->Dependents("layer"), (std::set<std::string>{"forward", "loss"}));
}

TEST(Module, ChecksItsOwnCopyOfAFunction) {
  Module m;
  Func f = MakeFunc({MakeVar("x", TensorTy(DType::kF32, {2}))}, nullptr);
  Var x = f->params[0];
  f = MakeFunc({x}, MakeOpCall("exp", {x}));
  m.Add("f", f);
  EXPECT_EQ(f->checked_type, nullptr);  // the caller's nodes are not written
  EXPECT_TRUE(StructuralEqual(m.snapshot()->Get("f").func, f));
  EXPECT_NE(m.snapshot()->Get("f").func, f);
}

TEST(Module, PrintsAsTextThatParsesBack) {
  Module m;
  m.AddSource(kProgram, "mlp.pj");
  Module again;
  again.AddSource(m.snapshot()->Print(), "printed.pj");
  for (const std::string& name : m.snapshot()->Names()) {
    EXPECT_TRUE(StructuralEqual(m.snapshot()->Get(name).func, again.snapshot()->Get(name).func)) << name;
  }
}

// Readers on other threads see each definition whole: either every part of
// the old version or every part of the new one, never a mix.
TEST(ModuleConcurrency, ReadersSeeWholeDefinitionsDuringReplace) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(2,), f32]) { exp(%x) }\ndef @g(%x: Tensor[(2,), f32]) { @f(%x) }", "a.pj");
  std::atomic<bool> stop{false};
  std::atomic<int> reads{0};
  auto reader = [&] {
    do {
      Snapshot s = m.snapshot();
      const Definition& f = s->Get("f");
      const std::string& op = As<OpCallNode>(f.func->body)->op->name;
      // The version and the body always belong together.
      bool exp_version = f.version % 2 == 1;
      EXPECT_EQ(op, exp_version ? "exp" : "tanh");
      EXPECT_LE(s->Get("g").version, s->generation() + 1);
      reads.fetch_add(1);
    } while (!stop.load());
  };
  std::thread r1(reader), r2(reader);
  while (reads.load() < 2) std::this_thread::yield();  // both reading before the first edit
  // Versions: @f=1, @g=2 at first; each replacement of @f takes the next one,
  // so odd versions are exp and even ones tanh.
  for (int i = 0; i < 200; ++i) {
    bool odd_next = (3 + i) % 2 == 1;
    m.AddSource(std::string("def @f(%x: Tensor[(2,), f32]) { ") + (odd_next ? "exp" : "tanh") + "(%x) }", "edit.pj",
                true);
  }
  stop.store(true);
  r1.join();
  r2.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(m.snapshot()->Get("f").version, 202u);
}

// What a gradient can be taken for: types that can hold a float tensor.
TEST(Module, CanHoldFloatLooksThroughTuplesConstructorsAndTypeArguments) {
  Module m;
  m.AddSource(R"(type List[T] { Nil, Cons(T, List[T]) }
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
type Rose { Tip(Tensor[(), i64]), Branch(Tensor[(2,), f32], List[Rose]) }
def @f(%a: Tree, %b: List[Tensor[(), i64]], %c: List[Tensor[(2,), f32]], %d: (Tensor[(), i64], (Tensor[(), f64],)),
       %e: Rose, %g: Tensor[(), bool]) -> Tensor[(), i64] { 0i64 })", "m.pj");
  Snapshot s = m.snapshot();
  std::vector<bool> holds;
  for (const Var& p : s->Get("f").func->params) holds.push_back(s->CanHoldFloat(p->annotation));
  EXPECT_EQ(holds, (std::vector<bool>{false, false, true, true, true, false}));
}

// Definitions may call ones defined later; checking follows the calls with
// an explicit stack, so a chain of 20,000 forward references (2,500 used to
// overflow the native stack) checks, with and without declared result types.
TEST(Module, LongChainsOfForwardReferencesCheckWithoutRecursion) {
  for (bool declared : {false, true}) {
    const int n = 20000;
    std::string text;
    const std::string result = declared ? " -> Tensor[(2,), f32]" : "";
    for (int i = 0; i < n - 1; ++i) {
      text += "def @f" + std::to_string(i) + "(%x: Tensor[(2,), f32])" + result + " { @f" + std::to_string(i + 1) + "(%x) }\n";
    }
    text += "def @f" + std::to_string(n - 1) + "(%x: Tensor[(2,), f32])" + result + " { exp(%x) }\n";
    Module m;
    m.AddSource(text, "chain.pj");
    EXPECT_EQ(TypeToString(m.snapshot()->Get("f0").type), "fn(Tensor[(2,), f32]) -> Tensor[(2,), f32]") << declared;
    // One edit at the end of the chain affects all of it: found in one pass.
    ModuleEdit seen;
    m.Subscribe([&](const ModuleEdit& e) { seen = e; });
    m.AddSource("def @f" + std::to_string(n - 1) + "(%x: Tensor[(2,), f32])" + result + " { tanh(%x) }", "edit.pj", true);
    EXPECT_EQ(seen.affected.size(), static_cast<size_t>(n));
  }
}

TEST(Module, ALaterDefinitionsErrorAndAnUndeclaredRecursionAreStillFound) {
  Module m;
  EXPECT_THROW(m.AddSource("def @a(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { @b(%x) }\n"
                           "def @b(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { sum(%x) }",
                           "m.pj"),
               IrError);
  try {
    m.AddSource("def @c(%x: Tensor[(2,), f32]) { @d(%x) }\ndef @d(%x: Tensor[(2,), f32]) { @c(%x) }", "m.pj");
    FAIL() << "an undeclared mutual recursion was accepted";
  } catch (const IrError& e) {
    EXPECT_NE(std::string(e.what()).find("is recursive; declare its result type"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pejit
