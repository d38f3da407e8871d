// One pejit mode of bench/treelstm, in a process of its own (bench.py runs
// it; see README.md): trains the Child-Sum Tree-LSTM of
// examples/treelstm/treelstm.pj on a ListOps file through the tiered engine
// under one policy, then runs `infer` over the same trees (or the plan's dev
// trees), and prints one JSON line: per epoch and inference pass trees/s,
// each pass's latency per tree (its call's: p50, p99; --infer-batch 1 is a
// server's one tree a call), CPU seconds, the share of compiled calls, the compile jobs that ended
// meanwhile and the wall time since the start less data loading; epoch 0's
// step latencies; the background compiler's latencies and code bytes
// (compile_stats.h).
//
// The step is the demo's (examples/treelstm/trainer.cc): value_and_grad of
// `loss` then the optimizer's update, on fixed minibatches of trees of
// similar size (treelstm::MakeBatches), or with --reshuffle on epoch e's
// minibatches of the plan; building the minibatches' values is outside the
// timed loop, as in the demo.
//
//   treelstm_pejit --write-data FILE --size N   writes N generated examples
//       (then --dev-size D more, distinct ones), and FILE.plan.json: the
//       initial parameters (from --seed) and the training and inference
//       minibatches (example numbers, from 0, in the file's order; inference
//       over the dev examples if any, else over the training ones), exactly
//       as a measurement with the same options uses them, so that a PyTorch
//       peer can start from the same numbers; --reshuffle-epochs E adds
//       epochs 0..E-1's random partitions of the training examples
//   treelstm_pejit --data FILE --policy eager   measures one mode (--plan
//       FILE.plan.json: on the plan's minibatches; --reshuffle: epoch e on
//       the plan's epoch-e ones; --eval-each-epoch: the dev accuracy after
//       every epoch, for the time to reach an accuracy)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <limits>
#include <fstream>
#include <memory>

#include "bench/compile_stats.h"
#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "examples/treelstm/trainer.h"
#include "ops/blas.h"
#include "scheduler/engine.h"
#include "scheduler/engine_flags.h"
#include "support/cli_checks.h"
#include "support/cpu_clock.h"
#include "train/optimizer.h"

namespace pejit {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Minibatch orders for training, for inference, and epoch e's reshuffled
// training minibatches (the stream times e + 1): independent streams of the seed.
constexpr uint64_t kTrainBatches = 0x9E3779B97F4A7C15ull, kInferBatches = 0xBF58476D1CE4E5B9ull,
                   kReshuffledBatches = 0x94D049BB133111EBull;

struct Config {
  std::string data, write_data, plan;
  int size = 6000, dev_size = 0, reshuffle_epochs = 0;
  bool reshuffle = false;  // epoch e trains on the plan's reshuffled_train_batches[e]
  bool eval_each_epoch = false;  // a pass of `infer` over the inference minibatches after every epoch
  uint64_t seed = 1;
  int batch = 25, embed = 64, hidden = 128;
  double lr = 0.05;
  std::string optimizer = "adagrad";
  int epochs = 3, infer_passes = 2;
  // Trees per inference call: the plan's inference trees in its order, cut
  // into calls of this many (1: one tree a call, as a server answers
  // requests); 0: the plan's inference minibatches as they are.
  int infer_batch = 0;
  EngineFlags engine;
  int worker_nice = -1;  // < 0: the engine's default (EngineOptions::worker_nice)
  int lookahead = 8;          // as the demo's trainer: minibatches prefetched (Prefetch::kNext) ahead of the step
  // Policies eager and hot:N: carry on (up to these caps) until an epoch, a
  // pass, ran compiled code in every step: the steady state.
  bool until_compiled = false;
  int steady_epochs = 1, max_epochs = 12, max_infer_passes = 12;
};

Value InitialParams(const Config& c) {
  Rng init(c.seed);
  return treelstm::InitParams(init, {listops::kVocabularySize, c.embed, c.hidden, listops::kClasses});
}

// Minibatches as example numbers in the data file, from 0.
using Batches = std::vector<std::vector<int64_t>>;

// A run's minibatches: training (the same every epoch), inference, and
// (--reshuffle) epoch e's training ones.
struct Plan {
  Batches train, infer;
  std::vector<Batches> reshuffled;
};

// treelstm::MakeBatches (trees of similar size together) over the examples
// [first, first + count) of `examples`, from one stream of the seed.
Batches SimilarSizeBatches(const Config& c, const std::vector<treelstm::Example>& examples, size_t first, size_t count,
                           uint64_t stream) {
  const std::vector<treelstm::Example> part(examples.begin() + first, examples.begin() + first + count);
  Rng rng(c.seed ^ stream);
  Batches out;
  for (const auto& b : treelstm::MakeBatches(part, c.batch, rng)) {
    out.emplace_back();
    for (const treelstm::Example* e : b) out.back().push_back(static_cast<int64_t>(first) + (e - part.data()));
  }
  return out;
}

// Epoch `epoch`'s reshuffled minibatches: a random partition of the examples
// [0, count) into minibatches of c.batch (the last one the rest), sizes mixed.
Batches RandomPartition(const Config& c, size_t count, int epoch) {
  Rng rng(c.seed ^ (kReshuffledBatches * static_cast<uint64_t>(epoch + 1)));
  std::vector<int64_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = static_cast<int64_t>(i);
  for (size_t i = count; i > 1; --i) std::swap(order[i - 1], order[rng.NextInt(0, static_cast<int64_t>(i))]);
  Batches out;
  for (size_t i = 0; i < count; i += static_cast<size_t>(c.batch)) {
    out.emplace_back(order.begin() + i, order.begin() + std::min(count, i + c.batch));
  }
  return out;
}

// `batches`' examples in their order, cut into minibatches of `size` (the
// last one the rest).
Batches Regroup(const Batches& batches, int size) {
  Batches out;
  for (const auto& b : batches) {
    for (int64_t n : b) {
      if (out.empty() || out.back().size() == static_cast<size_t>(size)) out.emplace_back();
      out.back().push_back(n);
    }
  }
  return out;
}

// The first `train` examples are the training ones, the rest the dev ones
// (inference runs over those, or over the training ones if there are none).
Plan MakePlan(const Config& c, const std::vector<treelstm::Example>& examples, size_t train, int reshuffle_epochs) {
  Plan p;
  p.train = SimilarSizeBatches(c, examples, 0, train, kTrainBatches);
  p.infer = train < examples.size() ? SimilarSizeBatches(c, examples, train, examples.size() - train, kInferBatches)
                                    : SimilarSizeBatches(c, examples, 0, train, kInferBatches);
  for (int e = 0; e < reshuffle_epochs; ++e) p.reshuffled.push_back(RandomPartition(c, train, e));
  return p;
}

// The minibatches of a plan written by --write-data with the same options.
Plan ReadPlan(const Config& c, size_t examples) {
  std::ifstream in(c.plan);
  if (!in) throw std::runtime_error("cannot read " + c.plan);
  const nlohmann::json j = nlohmann::json::parse(in);
  for (auto [key, value] : {std::pair{"seed", static_cast<int64_t>(c.seed)}, std::pair{"batch", int64_t{c.batch}},
                            std::pair{"embed", int64_t{c.embed}}, std::pair{"hidden", int64_t{c.hidden}}}) {
    if (j.at(key).get<int64_t>() != value) {
      throw std::runtime_error(c.plan + ": written for " + key + " " + j.at(key).dump() + ", this run has " +
                               std::to_string(value));
    }
  }
  auto batches = [&](const nlohmann::json& list) {
    Batches b = list.get<Batches>();
    for (const auto& numbers : b) {
      for (int64_t n : numbers) {
        if (n < 0 || static_cast<size_t>(n) >= examples) {
          throw std::runtime_error(c.plan + ": example " + std::to_string(n) + " is not in " + c.data);
        }
      }
    }
    return b;
  };
  Plan p{batches(j.at("train_batches")), batches(j.at("infer_batches")), {}};
  if (j.contains("reshuffled_train_batches")) {
    for (const auto& epoch : j["reshuffled_train_batches"]) p.reshuffled.push_back(batches(epoch));
  }
  return p;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
}

int WriteData(const Config& c) {
  listops::Splits s = listops::GenerateSplits(c.seed, c.size, c.dev_size, 0);
  std::string text;
  for (const auto* split : {&s.train, &s.dev}) {
    for (const listops::Example& e : *split) text += std::to_string(e.label) + '\t' + listops::ToString(e.tree) + '\n';
  }
  WriteFile(c.write_data, text);
  // The plan from the file as read back: what a measurement will see.
  std::vector<treelstm::Example> examples = listops::ReadFile(c.write_data, /*strict=*/true).examples;
  const Plan batches = MakePlan(c, examples, s.train.size(), c.reshuffle_epochs);
  nlohmann::json plan;
  plan["train_batches"] = batches.train;
  plan["infer_batches"] = batches.infer;
  if (c.dev_size > 0) {
    plan["train_examples"] = s.train.size();
    plan["dev_examples"] = s.dev.size();
  }
  if (!batches.reshuffled.empty()) plan["reshuffled_train_batches"] = batches.reshuffled;
  // treelstm.pj's parameter order; the peers name them.
  const char* names[] = {"emb", "w_iou", "u_iou", "b_iou", "w_f", "u_f", "b_f", "w_out", "b_out"};
  std::vector<Tensor> leaves = ParameterLeaves(InitialParams(c));
  for (size_t i = 0; i < leaves.size(); ++i) {
    const float* p = leaves[i].data<float>();
    plan["params"][names[i]] = {{"shape", leaves[i].shape()},
                                {"data", std::vector<float>(p, p + NumElements(leaves[i].shape()))}};
  }
  plan["seed"] = c.seed;
  plan["embed"] = c.embed;
  plan["hidden"] = c.hidden;
  plan["batch"] = c.batch;
  WriteFile(c.write_data + ".plan.json", plan.dump());
  std::fprintf(stderr, "wrote %zu ListOps examples (seed %llu) to %s and the plan to %s.plan.json\n", examples.size(),
               static_cast<unsigned long long>(c.seed), c.write_data.c_str(), c.write_data.c_str());
  return 0;
}

int Measure(const Config& c) {
  const auto start = Clock::now();
  // Data loading (reading the file and the plan, building the minibatches'
  // values): what wall_since_start_s leaves out of the time since `start`.
  double data_seconds = 0;
  auto loading = [&data_seconds](auto build) {
    const auto t = Clock::now();
    auto built = build();
    data_seconds += Seconds(t);
    return built;
  };
  const listops::FileReport file = loading([&] { return listops::ReadFile(c.data, /*strict=*/true); });
  if (file.examples.empty()) throw std::runtime_error(c.data + ": no examples");
  const Plan plan = loading([&] {
    return c.plan.empty() ? MakePlan(c, file.examples, file.examples.size(), 0) : ReadPlan(c, file.examples.size());
  });

  auto compile_stats = std::make_shared<bench::CompileStatsSink>();
  EngineOptions options;
  ApplyEngineFlags(c.engine, options);
  options.events = compile_stats;
  if (c.worker_nice >= 0) options.worker_nice = c.worker_nice;
  const int worker_nice = options.worker_nice;
  Engine engine(std::move(options));
  engine.module().AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot module = engine.module().snapshot();
  Value params = InitialParams(c);
  OptimizerOptions opt;
  opt.kind = c.optimizer;
  opt.learning_rate = c.lr;
  std::unique_ptr<Optimizer> optimizer = Optimizer::Create(opt);

  auto make_values = [&](const Batches& numbers) {
    return loading([&] {
      std::vector<treelstm::Batch> values;
      for (const auto& b : numbers) {
        std::vector<const treelstm::Example*> examples;
        for (int64_t n : b) examples.push_back(&file.examples[static_cast<size_t>(n)]);
        values.push_back(treelstm::MakeBatch(examples, *module));
      }
      return values;
    });
  };
  // Training minibatches of epoch `epoch`: the same every epoch, or reshuffled.
  auto train_batches = [&](int epoch) -> const Batches& {
    if (!c.reshuffle) return plan.train;
    if (static_cast<size_t>(epoch) >= plan.reshuffled.size()) {
      throw std::runtime_error(c.plan + " holds " + std::to_string(plan.reshuffled.size()) +
                               " reshuffled epochs; write it with --reshuffle-epochs " + std::to_string(epoch + 1));
    }
    return plan.reshuffled[static_cast<size_t>(epoch)];
  };
  train_batches(c.epochs - 1);  // fails now rather than after the epochs the plan holds
  Entry loss = engine.entry("loss").with_grad({2}), infer = engine.entry("infer");
  // Accuracy of `infer` over `batches`, and how many trees.
  auto evaluate = [&](const std::vector<treelstm::Batch>& batches, std::vector<double>* latency_ms = nullptr) {
    int64_t trees = 0, right = 0;
    for (const treelstm::Batch& b : batches) {
      const auto call_start = Clock::now();
      Tensor predicted = infer.call({b.trees, params}).tensor();
      if (latency_ms) latency_ms->insert(latency_ms->end(), static_cast<size_t>(predicted.numel()), 1e3 * Seconds(call_start));
      const int64_t* p = predicted.data<int64_t>();
      const int64_t* y = b.labels.tensor().data<int64_t>();
      for (int64_t i = 0; i < predicted.numel(); ++i) right += p[i] == y[i];
      trees += predicted.numel();
    }
    return std::make_pair(right, trees);
  };
  // --eval-each-epoch: the dev set, loaded once as a training loop would.
  const std::vector<treelstm::Batch> eval_batches = c.eval_each_epoch ? make_values(plan.infer) : std::vector<treelstm::Batch>{};

  nlohmann::json epochs = nlohmann::json::array();
  auto more = [&](const nlohmann::json& done, int wanted, int cap) {
    const int n = static_cast<int>(done.size());
    if (n < wanted) return true;
    if (!c.until_compiled || n >= cap) return false;
    // Steady: every step compiled, no compile finishing meanwhile nor still
    // running at the end (a compile on the other core slows the steps down,
    // through the shared cache, and keeps them from borrowing it); the last
    // --steady-epochs of them.
    if (n < c.steady_epochs) return true;
    for (int i = n - c.steady_epochs; i < n; ++i) {
      if (done[i]["compiled_share"].get<double>() < 1.0 || done[i]["jobs_ended"].get<int64_t>() > 0 ||
          done[i]["jobs_in_flight"].get<int64_t>() > 0) {
        return true;
      }
    }
    return false;
  };
  for (int epoch = 0; more(epochs, c.epochs, c.max_epochs); ++epoch) {
    std::vector<treelstm::Batch> batches = make_values(train_batches(epoch));
    const int64_t compiled_before = loss.stats().calls_compiled(), jobs_before = compile_stats->jobs_ended();
    const double cpu_before = ProcessCpuSeconds();
    std::vector<double> step_ms;
    double loss_sum = 0;
    int64_t trees = 0;
    // Where the epoch's time goes: prefetching, the engine's calls, the
    // optimizer's update (the rest is the loop's own).
    double lookahead_s = 0, call_s = 0, update_s = 0;
    // Reshuffled, the next epoch's minibatches are others (as in the demo's trainer).
    Lookahead lookahead = treelstm::BatchLookahead(loss, batches, params, c.lookahead, /*wraps=*/!c.reshuffle);
    const auto epoch_start = Clock::now();
    const double first_step_since_start_s = Seconds(start) - data_seconds;
    double first_compiled_ms = -1;  // from the epoch's start to the start of its first step on native code only
    for (size_t i = 0; i < batches.size(); ++i) {
      const treelstm::Batch& b = batches[i];
      const auto step_start = i == 0 ? epoch_start : Clock::now();
      lookahead.BeforeStep(i);
      const auto call_start = Clock::now();
      const int64_t compiled_calls = loss.stats().calls_compiled();
      ValueAndGrad vg = loss.value_and_grad({b.trees, b.labels, params});
      const auto update_start = Clock::now();
      if (first_compiled_ms < 0 && loss.stats().calls_compiled() > compiled_calls) {
        first_compiled_ms = 1e3 * std::chrono::duration<double>(step_start - epoch_start).count();
      }
      optimizer->Step(params, vg.grads[0]);
      const auto step_end = Clock::now();
      lookahead_s += std::chrono::duration<double>(call_start - step_start).count();
      call_s += std::chrono::duration<double>(update_start - call_start).count();
      update_s += std::chrono::duration<double>(step_end - update_start).count();
      step_ms.push_back(1e3 * std::chrono::duration<double>(step_end - step_start).count());
      const int64_t n = b.labels.tensor().numel();
      loss_sum += vg.value.tensor().item() * static_cast<double>(n);
      trees += n;
    }
    const double seconds = Seconds(epoch_start);
    epochs.push_back({{"epoch", epoch},
                      {"trees", trees},
                      {"seconds", seconds},
                      {"cpu_seconds", ProcessCpuSeconds() - cpu_before},
                      {"lookahead_seconds", lookahead_s},
                      {"call_seconds", call_s},
                      {"update_seconds", update_s},
                      {"trees_per_s", static_cast<double>(trees) / seconds},
                      {"loss", loss_sum / static_cast<double>(trees)},
                      {"compiled_share", static_cast<double>(loss.stats().calls_compiled() - compiled_before) /
                                             static_cast<double>(batches.size())},
                      {"jobs_ended", compile_stats->jobs_ended() - jobs_before},
                      {"jobs_in_flight", compile_stats->jobs_in_flight()},
                      {"step_ms_p50", bench::Percentile(step_ms, 0.5)},
                      {"step_ms_p99", bench::Percentile(step_ms, 0.99)},
                      {"step_ms_max", bench::Percentile(step_ms, 1.0)},
                      {"first_step_since_start_s", first_step_since_start_s},
                      {"first_compiled_step_ms", first_compiled_ms < 0 ? nlohmann::json() : nlohmann::json(first_compiled_ms)},
                      {"wall_since_start_s", Seconds(start) - data_seconds}});
    std::fprintf(stderr, "pejit %s epoch %d: %.0f trees/s, loss %.4f\n", c.engine.policy.c_str(), epoch,
                 epochs.back()["trees_per_s"].get<double>(), epochs.back()["loss"].get<double>());
    if (c.eval_each_epoch) {
      const auto eval_start = Clock::now();
      const auto [right, evaluated] = evaluate(eval_batches);
      nlohmann::json& e = epochs.back();
      e["eval_seconds"] = Seconds(eval_start);
      e["eval_trees_per_s"] = static_cast<double>(evaluated) / e["eval_seconds"].get<double>();
      e["dev_accuracy"] = static_cast<double>(right) / static_cast<double>(evaluated);
      e["wall_after_eval_s"] = Seconds(start) - data_seconds;
      std::fprintf(stderr, "pejit %s epoch %d: dev accuracy %.4f (%.0f trees/s)\n", c.engine.policy.c_str(), epoch,
                   e["dev_accuracy"].get<double>(), e["eval_trees_per_s"].get<double>());
    }
  }

  nlohmann::json passes = nlohmann::json::array();
  const Batches infer_calls = c.infer_batch > 0 ? Regroup(plan.infer, c.infer_batch) : plan.infer;
  for (int pass = 0; more(passes, c.infer_passes, c.max_infer_passes); ++pass) {
    std::vector<treelstm::Batch> batches = make_values(infer_calls);
    const int64_t compiled_before = infer.stats().calls_compiled(), jobs_before = compile_stats->jobs_ended();
    const double cpu_before = ProcessCpuSeconds();
    // Each tree's latency: its call's, as a server answering it waits.
    std::vector<double> latency_ms;
    const auto pass_start = Clock::now();
    const auto [right, trees] = evaluate(batches, &latency_ms);
    const double seconds = Seconds(pass_start);
    passes.push_back({{"pass", pass},
                      {"trees", trees},
                      {"seconds", seconds},
                      {"cpu_seconds", ProcessCpuSeconds() - cpu_before},
                      {"trees_per_s", static_cast<double>(trees) / seconds},
                      {"calls", batches.size()},
                      {"latency_ms_p50", bench::Percentile(latency_ms, 0.5)},
                      {"latency_ms_p99", bench::Percentile(latency_ms, 0.99)},
                      {"accuracy", static_cast<double>(right) / static_cast<double>(trees)},
                      {"compiled_share", static_cast<double>(infer.stats().calls_compiled() - compiled_before) /
                                             static_cast<double>(batches.size())},
                      {"jobs_ended", compile_stats->jobs_ended() - jobs_before},
                      {"jobs_in_flight", compile_stats->jobs_in_flight()},
                      {"wall_since_start_s", Seconds(start) - data_seconds}});
  }

  EngineStats es = engine.stats();
  nlohmann::json out = {
      {"suite", "treelstm"},
      {"impl", "pejit"},
      {"policy", c.engine.policy},
      {"workers", es.workers},
      {"worker_nice", worker_nice},
      {"step_threads", es.step_threads},
      {"lookahead", c.lookahead},
      {"blas", BlasConfig()},
#ifdef NDEBUG
      {"optimized_build", true},
#else
      {"optimized_build", false},
#endif
      {"data", c.data},
      {"plan", c.plan},
      {"reshuffle", c.reshuffle},
      {"examples", file.examples.size()},
      {"infer_trees", passes.empty() ? 0 : passes[0]["trees"].get<int64_t>()},
      {"batch", c.batch},
      {"embed", c.embed},
      {"hidden", c.hidden},
      {"optimizer", c.optimizer},
      {"lr", c.lr},
      {"epochs", epochs},
      {"infer", passes},
      {"compile", compile_stats->Summary()},
      {"code_bytes_in_cache", es.code_bytes},
      // The structure-generic tier's code: shared by every minibatch.
      {"generic", {{"cells", es.generic_cells},
                   {"segments", es.generic_segments},
                   {"variants", es.generic_variants},
                   {"native_variants", es.generic_native_variants},
                   {"code_bytes", es.generic_code_bytes},
                   {"calls", loss.stats().calls_generic + infer.stats().calls_generic}}},
      {"cpu_seconds", ProcessCpuSeconds()},
      {"seconds", Seconds(start)},
      {"data_seconds", data_seconds},
  };
  out["max_rss_mb"] = bench::MaxRssMb();  // issue 54's point 3: beside PyTorch's
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  pejit::Config c;
  CLI::App app{"One pejit mode of the Tree-LSTM benchmark (bench/README.md): train on a ListOps file, then infer; "
               "prints one JSON line"};
  app.add_option("--data", c.data, "ListOps file (label<TAB>expression) to train and infer on");
  app.add_option("--write-data", c.write_data, "instead: write --size generated examples to this file, the plan to FILE.plan.json, and stop");
  app.add_option("--size", c.size, "examples --write-data generates")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--dev-size", c.dev_size,
                 "--write-data: also this many dev examples (distinct), after the training ones; the plan's "
                 "inference minibatches are theirs (0: inference over the training examples)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--reshuffle-epochs", c.reshuffle_epochs,
                 "--write-data: the plan also holds, for epochs 0..N-1, a random partition of the training examples "
                 "into minibatches (reshuffled_train_batches)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--plan", c.plan,
                 "--data: train and infer on the minibatches of this plan (FILE.plan.json, written by --write-data "
                 "with the same --seed, --batch, --embed and --hidden) instead of drawing them from the seed over "
                 "the whole file");
  app.add_flag("--reshuffle", c.reshuffle,
               "epoch e trains on the plan's reshuffled minibatches of epoch e (needs --plan written with "
               "--reshuffle-epochs at least --epochs)");
  app.add_option("--seed", c.seed, "data, initial parameters, minibatch order")->capture_default_str();
  app.add_option("--batch", c.batch)->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--embed", c.embed)->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--hidden", c.hidden)->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--optimizer", c.optimizer)->check(CLI::IsMember({"adagrad", "sgd", "adam"}))->capture_default_str();
  app.add_option("--lr", c.lr)->capture_default_str()->check(pejit::PositiveReal());
  app.add_option("--epochs", c.epochs)->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_flag("--eval-each-epoch", c.eval_each_epoch,
               "after every epoch, a pass of `infer` over the inference minibatches (the plan's dev ones), loaded "
               "once: the epoch's dev_accuracy, eval_seconds and wall_after_eval_s");
  app.add_option("--infer-passes", c.infer_passes, "passes of `infer` over the data after training")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--infer-batch", c.infer_batch,
                 "trees per inference call: the plan's inference trees, in order, cut into calls of this many (1: a "
                 "tree a call, as a server answers); 0: the plan's inference minibatches")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  app.add_flag("--until-compiled", c.until_compiled,
               "after --epochs and --infer-passes, carry on until one (--steady-epochs in a row) ran compiled code in "
               "every step with no compile job ending meanwhile");
  app.add_option("--steady-epochs", c.steady_epochs,
                 "--until-compiled: until this many epochs (inference passes) in a row were steady")
      ->capture_default_str()
      ->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--max-epochs", c.max_epochs, "--until-compiled stops here")->capture_default_str();
  app.add_option("--max-infer-passes", c.max_infer_passes, "--until-compiled stops here")->capture_default_str();
  pejit::AddEngineFlags(app, c.engine);
  app.add_option("--worker-nice", c.worker_nice, "niceness of the compile workers (default: the engine's)");
  app.add_option("--lookahead", c.lookahead, "minibatches prefetched ahead of the step, to compile before it gets there (0: none)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  CLI11_PARSE(app, argc, argv);
  if (c.data.empty() == c.write_data.empty()) {
    std::fprintf(stderr, "treelstm_pejit: give exactly one of --data FILE and --write-data FILE\n");
    return 2;
  }
  if (c.reshuffle && c.plan.empty()) {
    std::fprintf(stderr, "treelstm_pejit: --reshuffle needs --plan FILE.plan.json (written with --reshuffle-epochs)\n");
    return 2;
  }
  try {
    return c.write_data.empty() ? pejit::Measure(c) : pejit::WriteData(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "treelstm_pejit: %s\n", e.what());
    return 1;
  }
}
