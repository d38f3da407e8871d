// One pejit mode of bench/treelstm, in a process of its own (bench.py runs
// it; see README.md): trains the Child-Sum Tree-LSTM of
// examples/treelstm/treelstm.pj on a ListOps file through the tiered engine
// under one policy, then runs `infer` over the same trees, and prints one
// JSON line: per epoch and inference pass trees/s, CPU seconds, the share
// of compiled calls and the compile jobs that ended meanwhile; epoch 0's step latencies; the background compiler's
// latencies and code bytes (compile_stats.h).
//
// The step is the demo's (examples/treelstm/trainer.cc): value_and_grad of
// `loss` then the optimizer's update, on fixed minibatches of trees of
// similar size (treelstm::MakeBatches); building the minibatches' values is
// outside the timed loop, as in the demo.
//
//   treelstm_pejit --write-data FILE --size N   writes N generated examples,
//       and FILE.plan.json: the initial parameters (from --seed) and the
//       training and inference minibatches (example numbers, from 0, in the
//       file's order), exactly as a measurement with the same options uses
//       them, so that a PyTorch peer can start from the same numbers
//   treelstm_pejit --data FILE --policy eager   measures one mode
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "bench/compile_stats.h"
#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "examples/treelstm/trainer.h"
#include "ops/blas.h"
#include "scheduler/engine.h"
#include "support/cpu_clock.h"
#include "train/optimizer.h"

namespace pejit {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Minibatch orders for training and for inference: independent streams of the seed.
constexpr uint64_t kTrainBatches = 0x9E3779B97F4A7C15ull, kInferBatches = 0xBF58476D1CE4E5B9ull;

struct Config {
  std::string data, write_data;
  int size = 6000;
  uint64_t seed = 1;
  int batch = 25, embed = 64, hidden = 128;
  double lr = 0.05;
  std::string optimizer = "adagrad";
  int epochs = 3, infer_passes = 2, workers = 0;
  int worker_nice = -1;  // < 0: the engine's default (EngineOptions::worker_nice)
  int idle_blas_threads = 0;  // EngineOptions::idle_blas_threads
  int lookahead = 8;          // as the demo's trainer: minibatches prefetched (Prefetch::kNext) ahead of the step
  // Policies eager and hot:N: carry on (up to these caps) until an epoch, a
  // pass, ran compiled code in every step: the steady state.
  bool until_compiled = false;
  int steady_epochs = 1, max_epochs = 12, max_infer_passes = 12;
  std::string policy = "eager";
};

Value InitialParams(const Config& c) {
  Rng init(c.seed);
  return treelstm::InitParams(init, {listops::kVocabularySize, c.embed, c.hidden, listops::kClasses});
}

// The fixed minibatches of one stream, as example pointers into `examples`.
std::vector<std::vector<const treelstm::Example*>> Minibatches(const Config& c, const std::vector<treelstm::Example>& examples,
                                                              uint64_t stream) {
  Rng rng(c.seed ^ stream);
  return treelstm::MakeBatches(examples, c.batch, rng);
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + path);
}

int WriteData(const Config& c) {
  listops::Splits s = listops::GenerateSplits(c.seed, c.size, 0, 0);
  std::string text;
  for (const listops::Example& e : s.train) text += std::to_string(e.label) + '\t' + listops::ToString(e.tree) + '\n';
  WriteFile(c.write_data, text);
  // The plan from the file as read back: what a measurement will see.
  std::vector<treelstm::Example> examples = listops::ReadFile(c.write_data, /*strict=*/true).examples;
  nlohmann::json plan;
  for (auto [key, stream] : {std::pair{"train_batches", kTrainBatches}, std::pair{"infer_batches", kInferBatches}}) {
    nlohmann::json batches = nlohmann::json::array();
    for (const auto& b : Minibatches(c, examples, stream)) {
      nlohmann::json numbers = nlohmann::json::array();
      for (const treelstm::Example* e : b) numbers.push_back(e - examples.data());
      batches.push_back(numbers);
    }
    plan[key] = batches;
  }
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
  SetBlasThreads(1);  // as the demo: small GEMMs, inside the engine's own parallelism
  listops::FileReport file = listops::ReadFile(c.data, /*strict=*/true);
  if (file.examples.empty()) throw std::runtime_error(c.data + ": no examples");

  auto compile_stats = std::make_shared<bench::CompileStatsSink>();
  EngineOptions options;
  options.workers = c.workers;
  options.policy = Policy::Parse(c.policy);
  options.events = compile_stats;
  if (c.worker_nice >= 0) options.worker_nice = c.worker_nice;
  options.idle_blas_threads = c.idle_blas_threads;
  const int worker_nice = options.worker_nice;
  Engine engine(std::move(options));
  engine.module().AddSource(treelstm::ModelSource(), "treelstm.pj");
  Snapshot module = engine.module().snapshot();
  Value params = InitialParams(c);
  OptimizerOptions opt;
  opt.kind = c.optimizer;
  opt.learning_rate = c.lr;
  std::unique_ptr<Optimizer> optimizer = Optimizer::Create(opt);

  auto make_values = [&](uint64_t stream) {
    std::vector<treelstm::Batch> values;
    for (const auto& b : Minibatches(c, file.examples, stream)) values.push_back(treelstm::MakeBatch(b, *module));
    return values;
  };
  Entry loss = engine.entry("loss"), infer = engine.entry("infer");

  nlohmann::json epochs = nlohmann::json::array();
  auto more = [&](const nlohmann::json& done, int wanted, int cap) {
    const int n = static_cast<int>(done.size());
    if (n < wanted) return true;
    if (!c.until_compiled || n >= cap) return false;
    // Steady: every step compiled, and no compile finishing meanwhile (a
    // compile on the other core slows the steps down, through the shared
    // cache); the last --steady-epochs of them.
    if (n < c.steady_epochs) return true;
    for (int i = n - c.steady_epochs; i < n; ++i) {
      if (done[i]["compiled_share"].get<double>() < 1.0 || done[i]["jobs_ended"].get<int64_t>() > 0) return true;
    }
    return false;
  };
  for (int epoch = 0; more(epochs, c.epochs, c.max_epochs); ++epoch) {
    std::vector<treelstm::Batch> batches = make_values(kTrainBatches);  // the same minibatches every epoch
    const int64_t compiled_before = loss.stats().calls_compiled(), jobs_before = compile_stats->jobs_ended();
    const double cpu_before = ProcessCpuSeconds();
    std::vector<double> step_ms;
    double loss_sum = 0;
    int64_t trees = 0;
    treelstm::Lookahead lookahead(loss, batches, params, c.lookahead, /*wraps=*/true);
    const auto epoch_start = Clock::now();
    for (size_t i = 0; i < batches.size(); ++i) {
      const treelstm::Batch& b = batches[i];
      const auto step_start = Clock::now();
      lookahead.BeforeStep(i);
      ValueAndGrad vg = loss.value_and_grad({b.trees, b.labels, params}, {2});
      optimizer->Step(params, vg.grads[0]);
      step_ms.push_back(1e3 * Seconds(step_start));
      const int64_t n = b.labels.tensor().numel();
      loss_sum += vg.value.tensor().item() * static_cast<double>(n);
      trees += n;
    }
    const double seconds = Seconds(epoch_start);
    epochs.push_back({{"epoch", epoch},
                      {"trees", trees},
                      {"seconds", seconds},
                      {"cpu_seconds", ProcessCpuSeconds() - cpu_before},
                      {"trees_per_s", static_cast<double>(trees) / seconds},
                      {"loss", loss_sum / static_cast<double>(trees)},
                      {"compiled_share", static_cast<double>(loss.stats().calls_compiled() - compiled_before) /
                                             static_cast<double>(batches.size())},
                      {"jobs_ended", compile_stats->jobs_ended() - jobs_before},
                      {"step_ms_p50", bench::Percentile(step_ms, 0.5)},
                      {"step_ms_p99", bench::Percentile(step_ms, 0.99)},
                      {"step_ms_max", bench::Percentile(step_ms, 1.0)}});
    std::fprintf(stderr, "pejit %s epoch %d: %.0f trees/s, loss %.4f\n", c.policy.c_str(), epoch,
                 epochs.back()["trees_per_s"].get<double>(), epochs.back()["loss"].get<double>());
  }

  nlohmann::json passes = nlohmann::json::array();
  for (int pass = 0; more(passes, c.infer_passes, c.max_infer_passes); ++pass) {
    std::vector<treelstm::Batch> batches = make_values(kInferBatches);
    const int64_t compiled_before = infer.stats().calls_compiled(), jobs_before = compile_stats->jobs_ended();
    const double cpu_before = ProcessCpuSeconds();
    int64_t trees = 0, right = 0;
    const auto pass_start = Clock::now();
    for (const treelstm::Batch& b : batches) {
      Tensor predicted = infer.call({b.trees, params}).tensor();
      const int64_t* p = predicted.data<int64_t>();
      const int64_t* y = b.labels.tensor().data<int64_t>();
      for (int64_t i = 0; i < predicted.numel(); ++i) right += p[i] == y[i];
      trees += predicted.numel();
    }
    const double seconds = Seconds(pass_start);
    passes.push_back({{"pass", pass},
                      {"trees", trees},
                      {"seconds", seconds},
                      {"cpu_seconds", ProcessCpuSeconds() - cpu_before},
                      {"trees_per_s", static_cast<double>(trees) / seconds},
                      {"accuracy", static_cast<double>(right) / static_cast<double>(trees)},
                      {"compiled_share", static_cast<double>(infer.stats().calls_compiled() - compiled_before) /
                                             static_cast<double>(batches.size())},
                      {"jobs_ended", compile_stats->jobs_ended() - jobs_before}});
  }

  EngineStats es = engine.stats();
  nlohmann::json out = {
      {"suite", "treelstm"},
      {"impl", "pejit"},
      {"policy", c.policy},
      {"workers", es.workers},
      {"worker_nice", worker_nice},
      {"blas_threads", 1},
      {"idle_blas_threads", c.idle_blas_threads},
      {"lookahead", c.lookahead},
      {"blas", BlasConfig()},
#ifdef NDEBUG
      {"optimized_build", true},
#else
      {"optimized_build", false},
#endif
      {"data", c.data},
      {"examples", file.examples.size()},
      {"batch", c.batch},
      {"embed", c.embed},
      {"hidden", c.hidden},
      {"optimizer", c.optimizer},
      {"lr", c.lr},
      {"epochs", epochs},
      {"infer", passes},
      {"compile", compile_stats->Summary()},
      {"code_bytes_in_cache", es.code_bytes},
      {"cpu_seconds", ProcessCpuSeconds()},
      {"seconds", Seconds(start)},
  };
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  pejit::Config c;
  CLI::App app{"One pejit mode of the Tree-LSTM benchmark (bench/README.md): train on a ListOps file, then infer; "
               "prints one JSON line"};
  app.add_option("--data", c.data, "ListOps file (label<TAB>expression) to train and infer on");
  app.add_option("--write-data", c.write_data, "instead: write --size generated examples to this file, the plan to FILE.plan.json, and stop");
  app.add_option("--size", c.size, "examples --write-data generates")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--seed", c.seed, "data, initial parameters, minibatch order")->capture_default_str();
  app.add_option("--batch", c.batch)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--embed", c.embed)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hidden", c.hidden)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--optimizer", c.optimizer)->check(CLI::IsMember({"adagrad", "sgd", "adam"}))->capture_default_str();
  app.add_option("--lr", c.lr)->capture_default_str();
  app.add_option("--epochs", c.epochs)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--infer-passes", c.infer_passes, "passes of `infer` over the data after training")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--until-compiled", c.until_compiled,
               "after --epochs and --infer-passes, carry on until one (--steady-epochs in a row) ran compiled code in "
               "every step with no compile job ending meanwhile");
  app.add_option("--steady-epochs", c.steady_epochs,
                 "--until-compiled: until this many epochs (inference passes) in a row were steady")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-epochs", c.max_epochs, "--until-compiled stops here")->capture_default_str();
  app.add_option("--max-infer-passes", c.max_infer_passes, "--until-compiled stops here")->capture_default_str();
  app.add_option("--workers", c.workers, "background compile workers (0: cores - 1)")->capture_default_str();
  app.add_option("--worker-nice", c.worker_nice, "niceness of the compile workers (default: the engine's)");
  app.add_option("--idle-blas-threads", c.idle_blas_threads,
                 "OpenBLAS threads while no compile job is in flight (EngineOptions::idle_blas_threads; 0: 1 "
                 "throughout)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lookahead", c.lookahead, "minibatches prefetched ahead of the step, to compile before it gets there (0: none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--policy", c.policy, "eager, hot:N, interpreter or sync")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (c.data.empty() == c.write_data.empty()) {
    std::fprintf(stderr, "treelstm_pejit: give exactly one of --data FILE and --write-data FILE\n");
    return 2;
  }
  try {
    return c.write_data.empty() ? pejit::Measure(c) : pejit::WriteData(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "treelstm_pejit: %s\n", e.what());
    return 1;
  }
}
