// The configuration TensorFlow Fold published its dynamic batching benchmark
// on (Looks et al., 2017; issue 54's point 3): a binary Tree-LSTM
// (bench/fold_treelstm.pj) over random binary trees, vector size 1024, one
// minibatch size after another. Every call is a minibatch of trees never seen
// before, so the structure-generic tier serves them, as it serves a
// reshuffled training run or a server. Per minibatch size: trees/s of
// inference (`infer`: each tree's class scores) and of training steps
// (value_and_grad of `loss`, the summed cross-entropy at the roots), the
// first --warmup calls untimed (they compile the size's variants), the next
// --calls timed. Prints one JSON line.
//
//   fold --write-trees FILE   also writes every timed minibatch's trees (a
//       JSON line each: a leaf is its word, a node [left, right]) for the
//       PyTorch peer (bench/fold_peer.py), which runs the same trees.
//   fold --check              also runs the first timed minibatch of each
//       size in the interpreter, and stops with an error if the values or
//       gradients differ.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/compile_stats.h"
#include "ops/random.h"
#include "scheduler/engine.h"
#include "scheduler/engine_flags.h"
#include "support/cli_checks.h"

namespace pejit {
extern const char kFoldTreeLstmSource[];  // fold_treelstm_source.cc, generated from fold_treelstm.pj

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

struct Config {
  int hidden = 1024, embed = 1024, leaves = 64, vocabulary = 1000, classes = 5;
  std::vector<int> sizes = {1, 8, 32, 128};
  int warmup = 2, calls = 4;
  uint64_t seed = 1;
  bool infer = true, train = true, check = false;
  std::string write_trees;
  EngineFlags engine;
};

// A random binary tree over `leaves` words: the left subtree takes 1 to
// leaves - 1 of them, uniformly (as bench/dynamic_models.py's trees).
struct TreeShape {
  int word = -1;  // a leaf's
  std::vector<TreeShape> children;
};

TreeShape RandomTree(std::mt19937_64& rng, int leaves, int vocabulary) {
  TreeShape s;
  if (leaves == 1) {
    s.word = std::uniform_int_distribution<int>(0, vocabulary - 1)(rng);
    return s;
  }
  const int left = std::uniform_int_distribution<int>(1, leaves - 1)(rng);
  s.children.push_back(RandomTree(rng, left, vocabulary));
  s.children.push_back(RandomTree(rng, leaves - left, vocabulary));
  return s;
}

nlohmann::json ToJson(const TreeShape& s) {
  if (s.word >= 0) return s.word;
  return nlohmann::json::array({ToJson(s.children[0]), ToJson(s.children[1])});
}

Value Scalar(int64_t v) { return Value(Tensor::FromVector<int64_t>({}, {v})); }

Value TreeValue(const TreeShape& s, const TypeDefPtr& tree) {
  if (s.word >= 0) return Value::Adt(tree, tree->FindCtor("Leaf"), {Scalar(s.word)});
  return Value::Adt(tree, tree->FindCtor("Node"), {TreeValue(s.children[0], tree), TreeValue(s.children[1], tree)});
}

Value ListOf(const std::vector<Value>& items, const TypeDefPtr& list) {
  Value v = Value::Adt(list, list->FindCtor("Nil"), {});
  const int cons = list->FindCtor("Cons");
  for (auto it = items.rbegin(); it != items.rend(); ++it) v = Value::Adt(list, cons, {*it, v});
  return v;
}

Value InitParams(const Config& c) {
  Rng rng(c.seed);
  const int64_t e = c.embed, h = c.hidden;
  return Value::Tuple({
      Value(RandomNormal(rng, {c.vocabulary, e}, 0, 0.1)),
      Value(XavierUniform(rng, {3 * h, e})),
      Value(Tensor::Zeros(DType::kF32, {3 * h})),
      Value(XavierUniform(rng, {5 * h, h})),
      Value(XavierUniform(rng, {5 * h, h})),
      Value(Tensor::Zeros(DType::kF32, {5 * h})),
      Value(XavierUniform(rng, {c.classes, h})),
      Value(Tensor::Zeros(DType::kF32, {c.classes})),
  });
}

// One minibatch: `infer`'s and `loss`'s first arguments.
struct Minibatch {
  std::vector<TreeShape> shapes;
  Value trees, examples;
};

Minibatch MakeMinibatch(std::mt19937_64& rng, int size, const Config& c, const ModuleSnapshot& module) {
  const TypeDefPtr tree = module.FindType("Tree"), list = module.FindType("List");
  Minibatch m;
  std::vector<Value> trees, examples;
  for (int i = 0; i < size; ++i) {
    m.shapes.push_back(RandomTree(rng, c.leaves, c.vocabulary));
    trees.push_back(TreeValue(m.shapes.back(), tree));
    const int64_t label = std::uniform_int_distribution<int64_t>(0, c.classes - 1)(rng);
    examples.push_back(Value::Tuple({trees.back(), Scalar(label)}));
  }
  m.trees = ListOf(trees, list);
  m.examples = ListOf(examples, list);
  return m;
}

int Run(const Config& c) {
  EngineOptions options;
  ApplyEngineFlags(c.engine, options);
  Engine engine(std::move(options));
  engine.module().AddSource(kFoldTreeLstmSource, "fold_treelstm.pj");
  const Snapshot module = engine.module().snapshot();
  Entry infer = engine.entry("infer"), loss = engine.entry("loss").with_grad({1});
  std::unique_ptr<Engine> reference;
  if (c.check) {
    EngineOptions o;
    o.policy = Policy::Interpreter();
    reference = std::make_unique<Engine>(std::move(o));
    reference->module().AddSource(kFoldTreeLstmSource, "fold_treelstm.pj");
  }
  const Value params = InitParams(c);
  std::ofstream trees_out;
  if (!c.write_trees.empty()) {
    trees_out.open(c.write_trees);
    if (!trees_out) throw std::runtime_error("cannot write " + c.write_trees);
  }
  std::mt19937_64 rng(c.seed);
  nlohmann::json sizes = nlohmann::json::array();
  const auto start = Clock::now();
  for (int size : c.sizes) {
    nlohmann::json row = {{"trees_a_call", size}};
    std::vector<Minibatch> batches;
    for (int i = 0; i < c.warmup + c.calls; ++i) batches.push_back(MakeMinibatch(rng, size, c, *module));
    for (int i = c.warmup; i < c.warmup + c.calls && trees_out; ++i) {
      nlohmann::json line = nlohmann::json::array();
      for (const TreeShape& s : batches[i].shapes) line.push_back(ToJson(s));
      trees_out << line.dump() << "\n";
    }
    if (c.check) {
      const Minibatch& m = batches[c.warmup];
      Entry ref_infer = reference->entry("infer"), ref_loss = reference->entry("loss").with_grad({1});
      if (!ValueAllClose(infer.call({m.trees, params}), ref_infer.call({m.trees, params}), 1e-3, 1e-5)) {
        throw std::runtime_error("infer: compiled and interpreted values differ at " + std::to_string(size) + " trees");
      }
      const ValueAndGrad got = loss.value_and_grad({m.examples, params}),
                         want = ref_loss.value_and_grad({m.examples, params});
      if (!ValueAllClose(got.value, want.value, 1e-3, 1e-5) || !ValueAllClose(got.grads[0], want.grads[0], 1e-3, 1e-5)) {
        throw std::runtime_error("loss: compiled and interpreted values or gradients differ at " + std::to_string(size) +
                                 " trees");
      }
      row["checked"] = true;
    }
    // Each timed call's share of native runs: a compiled call ran native
    // code only (EntryStats::calls_compiled).
    auto measure = [&](const Entry& entry, auto&& call) {
      for (int i = 0; i < c.warmup; ++i) call(batches[i]);
      engine.drain();  // the size's variants compiled: the steady state
      const EntryStats before = entry.stats();
      const auto t0 = Clock::now();
      for (int i = c.warmup; i < c.warmup + c.calls; ++i) call(batches[i]);
      const double seconds = Seconds(t0);
      const EntryStats after = entry.stats();
      return nlohmann::json{{"trees_per_s", size * c.calls / seconds},
                            {"compiled_share", static_cast<double>(after.calls_compiled() - before.calls_compiled()) /
                                                   static_cast<double>(c.calls)}};
    };
    if (c.infer) row["infer"] = measure(infer, [&](const Minibatch& m) { infer.call({m.trees, params}); });
    if (c.train) row["train"] = measure(loss, [&](const Minibatch& m) { loss.value_and_grad({m.examples, params}); });
    std::fprintf(stderr, "fold: %d trees a call: infer %.1f, train %.1f trees/s\n", size,
                 c.infer ? row["infer"]["trees_per_s"].get<double>() : 0.0,
                 c.train ? row["train"]["trees_per_s"].get<double>() : 0.0);
    sizes.push_back(row);
  }
  nlohmann::json out = {{"impl", "pejit"}, {"hidden", c.hidden}, {"embed", c.embed}, {"leaves", c.leaves},
                        {"nodes_a_tree", 2 * c.leaves - 1}, {"warmup", c.warmup}, {"calls", c.calls},
                        {"sizes", sizes}, {"seconds", Seconds(start)}};
  out["max_rss_mb"] = bench::MaxRssMb();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  pejit::Config c;
  CLI::App app{"TensorFlow Fold's Tree-LSTM benchmark configuration (bench/README.md): a binary Tree-LSTM over "
               "random binary trees never seen before, trees/s of inference and training per minibatch size; "
               "prints one JSON line"};
  app.add_option("--hidden", c.hidden)->capture_default_str()->check(pejit::WholeNumber(1, 1 << 16));
  app.add_option("--embed", c.embed)->capture_default_str()->check(pejit::WholeNumber(1, 1 << 16));
  app.add_option("--leaves", c.leaves, "words a tree (it has 2 leaves - 1 nodes)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(1, 1 << 16));
  app.add_option("--sizes", c.sizes, "trees a call, one size after another (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(pejit::WholeNumber(1, 1 << 20));
  app.add_option("--warmup", c.warmup, "untimed calls a size, before its timed ones")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, 1 << 20));
  app.add_option("--calls", c.calls, "timed calls a size")->capture_default_str()->check(pejit::WholeNumber(1, 1 << 20));
  app.add_option("--seed", c.seed, "trees and parameters")->capture_default_str();
  bool no_infer = false, no_train = false;
  app.add_flag("--no-infer", no_infer, "time training steps only");
  app.add_flag("--no-train", no_train, "time inference only");
  app.add_flag("--check", c.check, "compare each size's first timed call with the interpreter's, values and gradients");
  app.add_option("--write-trees", c.write_trees, "write the timed minibatches' trees here, for bench/fold_peer.py");
  pejit::AddEngineFlags(app, c.engine);
  CLI11_PARSE(app, argc, argv);
  c.infer = !no_infer;
  c.train = !no_train;
  try {
    return pejit::Run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fold: %s\n", e.what());
    return 1;
  }
}
