// The residual programs of a fixed set of cases, printed, against a golden
// file: a change to the partial evaluator that is meant to be invisible (a
// faster data structure, a cache) must leave every residual byte for byte as
// it was, names, order and counts included.
//
// When a change of the residual is intended, regenerate the file and review
// its diff:
//   PEJIT_UPDATE_GOLDEN=1 bazel run //tests/pe:residual_golden_test
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "ir/module.h"
#include "ops/random.h"
#include "pe/partial_eval.h"

namespace pejit {
namespace {

constexpr char kGoldenPath[] = "tests/pe/testdata/residual_golden.txt";

// Every construct the evaluator treats differently: static folding and
// materialized constants, sharing, a dynamic `if`, a loop on a dynamic
// counter, closures, and fuel.
constexpr char kProgram[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
type List[T] { Nil, Cons(T, List[T]) }

def @cell(%x: Tensor[(1, 4), f32], %h: Tensor[(1, 3), f32], %w: Tensor[(3, 4), f32], %u: Tensor[(3, 3), f32])
    -> Tensor[(1, 3), f32] {
  tanh(add(matmul(%x, %w, transpose_b=true), matmul(%h, %u, transpose_b=true)))
}

def @tree(%t: Tree, %emb: Tensor[(?, 4), f32], %w: Tensor[(3, 4), f32], %u: Tensor[(3, 3), f32])
    -> Tensor[(1, 3), f32] {
  match (%t) {
    Leaf(%i) => @cell(take(%emb, reshape(%i, shape=[1])), broadcast_to(0f32, shape=[1, 3]), %w, %u),
    Node(%l, %r) => @cell(broadcast_to(1f32, shape=[1, 4]), add(@tree(%l, %emb, %w, %u), @tree(%r, %emb, %w, %u)), %w, %u),
  }
}

def @twice(%t: Tree, %emb: Tensor[(?, 4), f32], %w: Tensor[(3, 4), f32], %u: Tensor[(3, 3), f32])
    -> Tensor[(1, 3), f32] {
  mul(@tree(%t, %emb, %w, %u), @tree(%t, %emb, %w, %u))
}

def @clip(%x: Tensor[(1, 3), f32]) -> Tensor[(1, 3), f32] {
  if (greater(sum(%x), 0f32)) { let %y = mul(%x, 0.5f32); sub(%y, 1f32) } else { neg(%x) }
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
)";

std::string Describe(const std::string& name, const Residual& r) {
  const PeStats& s = r.stats;
  std::ostringstream out;
  out << "## " << name << ": residual_ops=" << s.residual_ops << " params=" << s.params
      << " unfoldings=" << s.unfoldings << " folded_ops=" << s.folded_ops << " shared_calls=" << s.shared_calls
      << " residual_functions=" << s.residual_functions << "\n"
      << r.ToText() << "\n";
  return out.str();
}

// All cases, printed one after the other; with `cache`, helpers may come
// from it (pe/pe_cache.h), which must not change a byte.
std::string AllResiduals(PeCache* cache = nullptr) {
  std::string out;
  {
    Module m;
    m.AddSource(kProgram, "golden.pj");
    Snapshot s = m.snapshot();
    TypeDefPtr tree = s->FindType("Tree");
    auto leaf = [&](int64_t w) { return Value::Adt(tree, 0, {Value(Tensor::FromVector<int64_t>({}, {w}))}); };
    auto node = [&](Value l, Value r) { return Value::Adt(tree, 1, {std::move(l), std::move(r)}); };
    Rng rng(11);
    Value t = node(node(leaf(0), leaf(2)), node(leaf(1), node(leaf(2), leaf(0))));
    Value emb(RandomUniform(rng, {3, 4}, -1, 1));
    Value w(RandomUniform(rng, {3, 4}, -1, 1));
    Value u(RandomUniform(rng, {3, 3}, -1, 1));
    out += Describe("tree", PartialEvaluate(*s, "tree", {t, emb, w, u}, {}, {}, cache));
    out += Describe("twice", PartialEvaluate(*s, "twice", {node(leaf(0), leaf(1)), emb, w, u}, {}, {}, cache));
    out += Describe("tree, static embeddings", PartialEvaluate(*s, "tree", {node(leaf(0), leaf(1)), emb, w, u},
                                                                {false, true}, {}, cache));
    PeOptions little;
    little.fuel = 4;
    out += Describe("tree, fuel 4", PartialEvaluate(*s, "tree", {t, emb, w, u}, {}, little, cache));
    out += Describe("clip", PartialEvaluate(*s, "clip", {Value(RandomUniform(rng, {1, 3}, -1, 1))}, {}, {}, cache));
    out += Describe("count_down", PartialEvaluate(*s, "count_down", {Value(Tensor::FromVector<int64_t>({}, {5})),
                                                                     Value(Tensor::Scalar(1.5f))},
                                                  {}, {}, cache));
    TypeDefPtr list = s->FindType("List");
    Value xs = Value::Adt(list, 0, {});
    for (int i = 0; i < 3; ++i) xs = Value::Adt(list, 1, {Value(RandomUniform(rng, {2}, -1, 1)), xs});
    out += Describe("scaled", PartialEvaluate(*s, "scaled", {xs, Value(RandomUniform(rng, {2}, -1, 1))}, {}, {}, cache));
    out += Describe("static_sum", PartialEvaluate(*s, "static_sum", {Value(Tensor::FromVector<int64_t>({}, {4}))},
                                                  {true}, {}, cache));
  }
  {
    Module m;
    m.AddSource(treelstm::ModelSource(), "treelstm.pj");
    Snapshot s = m.snapshot();
    std::vector<listops::Example> examples = {{listops::Parse("[MAX 2 9 [MIN 4 7 ] 1 ]"), 9},
                                              {listops::Parse("[SM 3 [MED 1 5 8 ] ]"), 8}};
    std::vector<const listops::Example*> batch = {&examples[0], &examples[1]};
    treelstm::Batch b = treelstm::MakeBatch(batch, *s);
    Rng rng(12);
    Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 4, 3, listops::kClasses});
    out += Describe("treelstm loss", PartialEvaluate(*s, "loss", {b.trees, b.labels, params}, {}, {}, cache));
    out += Describe("treelstm infer", PartialEvaluate(*s, "infer", {b.trees, params}, {}, {}, cache));
  }
  return out;
}

TEST(ResidualGoldenTest, ResidualsAreExactlyTheRecordedOnes) {
  std::string got = AllResiduals();
  const char* update = std::getenv("PEJIT_UPDATE_GOLDEN");
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");  // set by `bazel run`
  if (update && *update && workspace) {
    std::ofstream out(std::string(workspace) + "/" + kGoldenPath);
    out << got;
    ASSERT_TRUE(out.good()) << "could not write " << kGoldenPath;
    GTEST_SKIP() << "wrote " << kGoldenPath;
  }
  std::ifstream in(kGoldenPath);
  ASSERT_TRUE(in.good()) << kGoldenPath << " is missing";
  std::stringstream want;
  want << in.rdbuf();
  if (got == want.str()) return;
  // Point at the first difference: the whole text is long.
  std::istringstream g(got), w(want.str());
  std::string gl, wl;
  for (int line = 1;; ++line) {
    bool more_g = static_cast<bool>(std::getline(g, gl));
    bool more_w = static_cast<bool>(std::getline(w, wl));
    if (!more_g && !more_w) break;
    if (gl != wl || more_g != more_w) {
      FAIL() << kGoldenPath << ":" << line << " differs\n  want: " << (more_w ? wl : "<end>")
             << "\n  got:  " << (more_g ? gl : "<end>")
             << "\n(if intended: PEJIT_UPDATE_GOLDEN=1 bazel run //tests/pe:residual_golden_test)";
    }
  }
  FAIL() << "residuals differ";
}

// The same cases twice over one cache: the second time, the helpers the first
// time kept are replayed (Tree-LSTM `infer` reuses `loss`'s @logits already
// the first time), and every residual is still the golden one.
TEST(ResidualGoldenTest, AWarmCacheChangesNoResidual) {
  std::ifstream in(kGoldenPath);
  ASSERT_TRUE(in.good()) << kGoldenPath << " is missing";
  std::stringstream want;
  want << in.rdbuf();
  PeCache cache;
  EXPECT_EQ(AllResiduals(&cache), want.str());
  int64_t hits = cache.stats().hits;
  EXPECT_GE(hits, 1);
  EXPECT_EQ(AllResiduals(&cache), want.str());
  EXPECT_GT(cache.stats().hits, hits);
}

}  // namespace
}  // namespace pejit
