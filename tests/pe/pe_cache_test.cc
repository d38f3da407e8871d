// The cache of helper specializations (pe/pe_cache.h): a helper unfolded for
// one entry is replayed for another entry on the same static skeleton, and
// the residual is then exactly the one a fresh unfolding gives, byte for
// byte; where a fresh unfolding would differ (the caller's memo, fuel, an
// edited definition), the cache is not used.
#include <gtest/gtest.h>

#include <thread>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "interp/interpreter.h"
#include "ir/module.h"
#include "ops/random.h"
#include "pe/partial_eval.h"
#include "tests/support/random_program.h"

namespace pejit {
namespace {

// Two entries sharing @forward, as a two-entry MLP does; and helpers that
// call each other, to see the memo across the cached boundary.
constexpr char kProgram[] = R"(
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }

def @forward(%x: Tensor[(2, 4), f32], %p: (Tensor[(3, 4), f32], Tensor[(3,), f32], Tensor[(2, 3), f32]))
    -> Tensor[(2, 2), f32] {
  let %h = tanh(dense(%x, %p.0, %p.1));
  matmul(%h, %p.2, transpose_b=true)
}

def @loss(%x: Tensor[(2, 4), f32], %y: Tensor[(2,), i64], %p: (Tensor[(3, 4), f32], Tensor[(3,), f32], Tensor[(2, 3), f32]))
    -> Tensor[(), f32] {
  cross_entropy(@forward(%x, %p), %y)
}

def @infer(%x: Tensor[(2, 4), f32], %p: (Tensor[(3, 4), f32], Tensor[(3,), f32], Tensor[(2, 3), f32]))
    -> Tensor[(2,), i64] {
  argmax(@forward(%x, %p), axis=1)
}

def @leaf(%w: Tensor[(), i64], %emb: Tensor[(?, 4), f32]) -> Tensor[(1, 4), f32] {
  add(take(%emb, reshape(%w, shape=[1])), broadcast_to(0.5f32, shape=[1, 4]))
}

def @tree(%t: Tree, %emb: Tensor[(?, 4), f32]) -> Tensor[(1, 4), f32] {
  match (%t) {
    Leaf(%w) => @leaf(%w, %emb),
    Node(%l, %r) => tanh(add(@tree(%l, %emb), @tree(%r, %emb))),
  }
}

def @encode(%t: Tree, %emb: Tensor[(?, 4), f32]) -> Tensor[(1, 4), f32] { @tree(%t, %emb) }

# @encode's unfolding calls @tree on @encode's own arguments: its memo entry
# stays reachable after the call (the second call here is shared).
def @encode_then_tree(%t: Tree, %emb: Tensor[(?, 4), f32]) -> Tensor[(1, 4), f32] {
  mul(@encode(%t, %emb), @tree(%t, %emb))
}

# The other order: @tree(%t) is answered before @encode unfolds, so inside
# @encode it is shared with the caller's; a template made without that
# caller must not be replayed here.
def @tree_then_encode(%t: Tree, %emb: Tensor[(?, 4), f32]) -> Tensor[(1, 4), f32] {
  mul(@tree(%t, %emb), @encode(%t, %emb))
}

# A dynamic `if` inside the helper; with %w static, a materialized constant.
def @gate(%x: Tensor[(1, 3), f32], %w: Tensor[(3, 3), f32]) -> Tensor[(1, 3), f32] {
  if (greater(sum(%x), 0f32)) { let %y = matmul(%x, %w); sub(%y, 1f32) } else { neg(%x) }
}

def @gate_once(%x: Tensor[(1, 3), f32], %w: Tensor[(3, 3), f32]) -> Tensor[(1, 3), f32] { @gate(%x, %w) }

def @gate_twice(%x: Tensor[(1, 3), f32], %w: Tensor[(3, 3), f32]) -> Tensor[(1, 3), f32] {
  mul(@gate(%x, %w), @gate(neg(%x), %w))
}

# Two trees of the same shape: the second @tree call replays the first's
# template, whose folded constants each replay gets afresh.
def @pair(%a: Tree, %b: Tree, %emb: Tensor[(?, 4), f32]) -> Tensor[(1, 4), f32] {
  add(@tree(%a, %emb), @tree(%b, %emb))
}
)";

class PeCacheTest : public testing::Test {
 protected:
  void SetUp() override { module_.AddSource(kProgram, "cache.pj"); }
  Snapshot snap() const { return module_.snapshot(); }
  Value Leaf(int64_t w) const {
    return Value::Adt(snap()->FindType("Tree"), 0, {Value(Tensor::FromVector<int64_t>({}, {w}))});
  }
  Value Node(Value l, Value r) const { return Value::Adt(snap()->FindType("Tree"), 1, {std::move(l), std::move(r)}); }
  static Value Params(Rng& rng) {
    return Value::Tuple({Value(RandomUniform(rng, {3, 4}, -1, 1)), Value(RandomUniform(rng, {3}, -1, 1)),
                         Value(RandomUniform(rng, {2, 3}, -1, 1))});
  }

  // PE of `entry` with the cache, checked against PE without it (the same
  // text) and against the interpreter (the same value).
  Residual Specialize(const ModuleSnapshot& m, const std::string& entry, const std::vector<Value>& args,
                      const PeOptions& options = {}, const std::vector<bool>& static_args = {}) {
    Residual warm = PartialEvaluate(m, entry, args, static_args, options, &cache_);
    Residual cold = PartialEvaluate(m, entry, args, static_args, options);
    EXPECT_EQ(warm.ToText(), cold.ToText()) << "@" << entry << " with the cache differs";
    EXPECT_EQ(warm.stats.residual_ops, cold.stats.residual_ops);
    EXPECT_EQ(warm.stats.unfoldings, cold.stats.unfoldings);
    EXPECT_EQ(warm.stats.shared_calls, cold.stats.shared_calls);
    EXPECT_EQ(warm.stats.folded_ops, cold.stats.folded_ops);
    Snapshot residual = warm.ToModule();
    std::vector<Value> leaves;
    for (const Tensor& t : Flatten(args, static_args)) leaves.emplace_back(t);
    EXPECT_TRUE(ValueEqual(interp_.Call(*residual, "main", leaves), interp_.Call(m, entry, args)));
    return warm;
  }

  Module module_;
  PeCache cache_;
  Interpreter interp_;
};

TEST_F(PeCacheTest, InferReusesTheForwardThatLossSpecialized) {
  Rng rng(1);
  Value x(RandomUniform(rng, {2, 4}, -1, 1));
  Value y(Tensor::FromVector<int64_t>({2}, {0, 1}));
  Value p = Params(rng);
  Residual loss = Specialize(*snap(), "loss", {x, y, p});
  EXPECT_EQ(loss.stats.cached_specializations, 1);  // @forward, kept
  EXPECT_EQ(loss.stats.reused_specializations, 0);
  Residual infer = Specialize(*snap(), "infer", {x, p});
  EXPECT_EQ(infer.stats.reused_specializations, 1);
  EXPECT_EQ(infer.stats.reused, std::vector<std::string>{"forward"});
  EXPECT_EQ(infer.stats.cached_specializations, 0);
  // Other contents, same shapes: the same skeleton, so reused again.
  Residual again = Specialize(*snap(), "infer", {Value(RandomUniform(rng, {2, 4}, -1, 1)), Params(rng)});
  EXPECT_EQ(again.stats.reused_specializations, 1);
  EXPECT_EQ(cache_.stats().entries, 1u);
  EXPECT_EQ(cache_.stats().hits, 2);
}

TEST_F(PeCacheTest, TreeLstmInferAfterLossReusesLogits) {
  Module m;
  m.AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot s = m.snapshot();
  treelstm::Batch b = treelstm::GeneratedListOpsBatch(3, 6, *s);
  Rng rng(2);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, 8, 6, listops::kClasses});
  Residual loss = Specialize(*s, "loss", {b.trees, b.labels, params});
  EXPECT_EQ(loss.stats.cached_specializations, 1);
  Residual infer = Specialize(*s, "infer", {b.trees, params});
  EXPECT_EQ(infer.stats.reused, std::vector<std::string>{"logits"});
  EXPECT_EQ(infer.stats.residual_ops, loss.stats.residual_ops);  // argmax where loss has cross_entropy
}

TEST_F(PeCacheTest, CallsAnsweredInsideStayAnsweredForTheCaller) {
  Rng rng(3);
  Value t = Node(Node(Leaf(0), Leaf(1)), Leaf(2));
  Value emb(RandomUniform(rng, {3, 4}, -1, 1));
  Residual first = Specialize(*snap(), "encode_then_tree", {t, emb});
  EXPECT_EQ(first.stats.cached_specializations, 1);  // @encode; the @tree call after it is shared
  Residual r = Specialize(*snap(), "encode_then_tree", {t, emb});
  EXPECT_EQ(r.stats.reused, std::vector<std::string>{"encode"});
  EXPECT_EQ(r.stats.shared_calls, 1);  // @tree(%t) after the replayed @encode is still the one inside
}

TEST_F(PeCacheTest, AHelperTheCallersMemoWouldAnswerIntoIsUnfoldedAfresh) {
  Rng rng(4);
  Value t = Node(Leaf(0), Node(Leaf(1), Leaf(2)));
  Value emb(RandomUniform(rng, {3, 4}, -1, 1));
  Specialize(*snap(), "encode_then_tree", {t, emb});  // @encode's template, made without a caller's memo
  Residual r = Specialize(*snap(), "tree_then_encode", {t, emb});
  // @tree is new to the cache; @encode's template is refused: unfolded here,
  // its @tree(%t) is the caller's.
  EXPECT_EQ(r.stats.reused_specializations, 0);
  EXPECT_EQ(r.stats.shared_calls, 1);
}

TEST_F(PeCacheTest, ReplayedFoldedConstantsAreEachReplaysOwn) {
  Rng rng(5);
  Value emb(RandomUniform(rng, {4, 4}, -1, 1));
  Residual r = Specialize(*snap(), "pair", {Node(Leaf(0), Leaf(1)), Node(Leaf(2), Leaf(3)), emb});
  EXPECT_EQ(r.stats.cached_specializations, 1);
  EXPECT_EQ(r.stats.reused, std::vector<std::string>{"tree"});
}

TEST_F(PeCacheTest, DynamicIfsAndStaticArgumentsReplayExactly) {
  Rng rng(10);
  Value w(RandomUniform(rng, {3, 3}, -1, 1));
  for (bool static_w : {false, true}) {
    SCOPED_TRACE(static_w ? "static %w" : "dynamic %w");
    cache_.Clear();
    Value x(RandomUniform(rng, {1, 3}, -1, 1));
    Residual once = Specialize(*snap(), "gate_once", {x, w}, {}, {false, static_w});
    EXPECT_EQ(once.stats.cached_specializations, 1);
    Residual twice = Specialize(*snap(), "gate_twice", {x, w}, {}, {false, static_w});
    EXPECT_EQ(twice.stats.reused, (std::vector<std::string>{"gate", "gate"}));
  }
}

TEST_F(PeCacheTest, AnEditedHelperIsNeverAnsweredByItsOldTemplate) {
  Rng rng(6);
  Value x(RandomUniform(rng, {2, 4}, -1, 1));
  Value y(Tensor::FromVector<int64_t>({2}, {1, 0}));
  Value p = Params(rng);
  Specialize(*snap(), "loss", {x, y, p});
  module_.AddSource(R"(
def @forward(%x: Tensor[(2, 4), f32], %p: (Tensor[(3, 4), f32], Tensor[(3,), f32], Tensor[(2, 3), f32]))
    -> Tensor[(2, 2), f32] {
  let %h = sigmoid(dense(%x, %p.0, %p.1));
  matmul(%h, %p.2, transpose_b=true)
}
)",
                    "edit.pj", /*replace_existing=*/true);
  Residual infer = Specialize(*snap(), "infer", {x, p});
  EXPECT_EQ(infer.stats.reused_specializations, 0);
  EXPECT_NE(infer.ToText().find("sigmoid"), std::string::npos);
}

TEST_F(PeCacheTest, ATemplateIsNotReplayedWhereFuelWouldRunOut) {
  Rng rng(7);
  Value t = Node(Node(Leaf(0), Leaf(1)), Node(Leaf(2), Leaf(0)));
  Value emb(RandomUniform(rng, {3, 4}, -1, 1));
  Specialize(*snap(), "encode_then_tree", {t, emb});
  PeOptions little;
  little.fuel = 5;
  Residual r = Specialize(*snap(), "encode_then_tree", {t, emb}, little);
  EXPECT_EQ(r.stats.reused_specializations, 0);
  EXPECT_FALSE(r.functions.empty());
}

TEST_F(PeCacheTest, BoundedByEntriesLeastRecentlyUsedFirst) {
  PeCache small(PeCacheOptions{.max_entries = 1});
  Rng rng(8);
  Value x(RandomUniform(rng, {2, 4}, -1, 1));
  Value emb(RandomUniform(rng, {3, 4}, -1, 1));
  PartialEvaluate(*snap(), "infer", {x, Params(rng)}, {}, {}, &small);
  PartialEvaluate(*snap(), "encode", {Leaf(0), emb}, {}, {}, &small);
  EXPECT_EQ(small.stats().entries, 1u);
  EXPECT_EQ(small.stats().evicted, 1);
  Residual r = PartialEvaluate(*snap(), "infer", {x, Params(rng)}, {}, {}, &small);
  EXPECT_EQ(r.stats.reused_specializations, 0);  // @forward's was evicted
}

TEST_F(PeCacheTest, WorkersShareOneCache) {
  Rng rng(9);
  Value x(RandomUniform(rng, {2, 4}, -1, 1));
  Value p = Params(rng);
  Snapshot s = snap();
  std::string cold = PartialEvaluate(*s, "infer", {x, p}).ToText();
  std::vector<std::string> texts(4);
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      for (int i = 0; i < 20; ++i) texts[w] = PartialEvaluate(*s, "infer", {x, p}, {}, {}, &cache_).ToText();
    });
  }
  for (std::thread& w : workers) w.join();
  for (const std::string& text : texts) EXPECT_EQ(text, cold);
  EXPECT_GE(cache_.stats().hits, 80 - 4);  // each worker's first call may have missed
}

// Random well-typed programs (tests/support: closures, dynamic ifs, static
// arguments, recursion, sharing): over one cache, both entries on several
// minibatches, each twice; every residual (or PeFailure) is the one PE gives
// without a cache.
TEST(PeCacheRandomProgramTest, ResidualsAreTheSameWithACache) {
  int64_t reused = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomProgram program = GenerateRandomProgram(seed);
    Snapshot s = program.Load();
    PeCache cache;
    std::vector<Value> first = program.Arguments(*s, 0);
    for (const std::vector<Value>& args : {first, program.Refill(first, 1), program.Arguments(*s, 2)}) {
      for (const std::string& entry : {program.entry, program.loss}) {
        auto text = [&](PeCache* c) {
          try {
            Residual r = PartialEvaluate(*s, entry, args, program.static_args, {}, c);
            reused += r.stats.reused_specializations;
            return r.ToText();
          } catch (const PeFailure& e) {
            return std::string("PeFailure: ") + e.what();
          }
        };
        std::string cold = text(nullptr);
        EXPECT_EQ(text(&cache), cold) << "@" << entry << "\n" << program.text;
        EXPECT_EQ(text(&cache), cold) << "@" << entry << " again\n" << program.text;
      }
    }
  }
  EXPECT_GT(reused, 100);  // the cache did answer
}

}  // namespace
}  // namespace pejit
