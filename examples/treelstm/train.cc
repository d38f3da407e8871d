// Trains the Child-Sum Tree-LSTM of treelstm.pj on ListOps through the tiered
// engine: every step runs at once (interpreter), while the engine's workers
// specialize and compile each minibatch's structure; from the second epoch on,
// the same minibatches run compiled code.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/model.h"
#include "ops/blas.h"
#include "scheduler/engine.h"
#include "train/optimizer.h"

namespace pejit {
namespace {

struct Config {
  std::string data = "listops";
  std::string train_file, dev_file;
  bool strict = false;
  int train_size = 2000, dev_size = 500;
  int epochs = 8, batch = 25, embed = 64, hidden = 128;
  OptimizerOptions optimizer;
  uint64_t seed = 1;
  int workers = 0;
  std::string policy = "eager";
  bool reshuffle = false;
  std::string log_level, trace_file;  // empty: PEJIT_LOG, PEJIT_TRACE (docs/tracing.md)
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Minibatches of examples of similar size (bucketed by node count), fixed
// for the whole run unless reshuffled, in a shuffled order.
std::vector<std::vector<const listops::Example*>> MakeBatches(const std::vector<listops::Example>& examples, int size,
                                                              Rng& rng) {
  std::vector<const listops::Example*> sorted;
  for (const auto& e : examples) sorted.push_back(&e);
  // Shuffle first, then sort stably by size: equal sizes end up in random order.
  for (size_t i = sorted.size(); i > 1; --i) std::swap(sorted[i - 1], sorted[rng.NextInt(0, static_cast<int64_t>(i))]);
  std::stable_sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) {
    return listops::CountNodes(a->expr) < listops::CountNodes(b->expr);
  });
  std::vector<std::vector<const listops::Example*>> batches;
  for (size_t i = 0; i < sorted.size(); i += size) {
    batches.emplace_back(sorted.begin() + i, sorted.begin() + std::min(sorted.size(), i + size));
  }
  for (size_t i = batches.size(); i > 1; --i) std::swap(batches[i - 1], batches[rng.NextInt(0, static_cast<int64_t>(i))]);
  return batches;
}

class Progress {
 public:
  Progress(int epoch, size_t total) : epoch_(epoch), total_(total), tty_(isatty(2)) {}
  void Update(size_t done, double loss, double trees_per_s, double compiled_share) {
    bool quarter = total_ >= 4 && done % (total_ / 4) == 0;
    if (!tty_ && !quarter && done != total_) return;
    int width = 24, filled = static_cast<int>(width * done / std::max<size_t>(1, total_));
    std::fprintf(stderr, "%s  epoch %d [%s%s] %zu/%zu steps  loss %.3f  %.0f trees/s  compiled %3.0f%%%s",
                 tty_ ? "\r" : "", epoch_, std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                 done, total_, loss, trees_per_s, 100 * compiled_share, tty_ ? "" : "\n");
    if (tty_ && done == total_) std::fprintf(stderr, "\n");
  }

 private:
  int epoch_;
  size_t total_;
  bool tty_;
};

int Run(const Config& c) {
  auto start = Clock::now();
  SetBlasThreads(1);  // small GEMMs, inside the engine's own parallelism
  listops::Splits data;
  if (!c.train_file.empty()) {
    for (auto [path, split] : {std::pair{c.train_file, &data.train}, std::pair{c.dev_file, &data.dev}}) {
      if (path.empty()) continue;
      listops::FileReport r = listops::ReadFile(path, c.strict);
      for (const std::string& e : r.errors) std::fprintf(stderr, "warning: skipped %s\n", e.c_str());
      *split = std::move(r.examples);
    }
  } else {
    data = listops::GenerateSplits(c.seed, c.train_size, c.dev_size, 0);
  }
  if (data.train.empty()) throw std::runtime_error("no training examples");

  EngineOptions options;
  options.workers = c.workers;
  options.policy = Policy::Parse(c.policy);
  options.log_level = c.log_level;
  options.trace_file = c.trace_file;
  Engine engine(options);
  engine.module().AddSource(treelstm::ModelSource(), "treelstm.pj");
  Entry loss = engine.entry("loss"), infer = engine.entry("infer");
  Snapshot s = engine.module().snapshot();

  Rng rng(c.seed);
  Value params = treelstm::InitParams(rng, {listops::kVocabularySize, c.embed, c.hidden, listops::kClasses});
  std::unique_ptr<Optimizer> opt = Optimizer::Create(c.optimizer);
  auto batches = MakeBatches(data.train, c.batch, rng);
  auto dev_batches = MakeBatches(data.dev, c.batch, rng);
  std::vector<treelstm::Batch> dev_values;
  for (auto& b : dev_batches) dev_values.push_back(treelstm::MakeBatch(b, *s));

  std::fprintf(stderr, "pejit Tree-LSTM on ListOps: %zu train / %zu dev trees, batch %d, embed %d, hidden %d, %s, "
               "policy %s, %d workers\n", data.train.size(), data.dev.size(), c.batch, c.embed, c.hidden,
               c.optimizer.kind.c_str(), c.policy.c_str(), engine.stats().workers);

  auto accuracy = [&](const std::vector<treelstm::Batch>& set) {
    int64_t right = 0, total = 0;
    for (const treelstm::Batch& b : set) {
      Tensor predicted = infer.call({b.trees, params}).tensor();
      const int64_t* p = predicted.data<int64_t>();
      const int64_t* y = b.labels.tensor().data<int64_t>();
      for (int64_t i = 0; i < predicted.numel(); ++i) right += p[i] == y[i];
      total += predicted.numel();
    }
    return total ? static_cast<double>(right) / total : 0.0;
  };

  nlohmann::json epochs = nlohmann::json::array();
  double final_loss = 0, train_seconds = 0;
  int64_t trees_trained = 0, steps_after_first = 0, compiled_after_first = 0;
  for (int epoch = 0; epoch < c.epochs; ++epoch) {
    if (c.reshuffle && epoch > 0) batches = MakeBatches(data.train, c.batch, rng);
    std::vector<treelstm::Batch> values;
    for (auto& b : batches) values.push_back(treelstm::MakeBatch(b, *s));
    Progress progress(epoch, values.size());
    auto epoch_start = Clock::now();
    double loss_sum = 0;
    int64_t trees = 0, compiled = 0;
    std::vector<double> step_ms;  // loss, gradients and the optimizer's update
    for (size_t i = 0; i < values.size(); ++i) {
      auto step_start = Clock::now();
      int64_t before = loss.stats().calls_compiled();
      ValueAndGrad r = loss.value_and_grad({values[i].trees, values[i].labels, params}, {2});
      compiled += loss.stats().calls_compiled() - before;
      opt->Step(params, r.grads[0]);
      step_ms.push_back(1e3 * Seconds(step_start));
      loss_sum += r.value.tensor().item() * static_cast<double>(batches[i].size());
      trees += static_cast<int64_t>(batches[i].size());
      progress.Update(i + 1, loss_sum / trees, trees / Seconds(epoch_start),
                      static_cast<double>(compiled) / static_cast<double>(i + 1));
    }
    double seconds = Seconds(epoch_start);
    train_seconds += seconds;
    trees_trained += trees;
    if (epoch > 0) {
      steps_after_first += static_cast<int64_t>(values.size());
      compiled_after_first += compiled;
    }
    final_loss = loss_sum / trees;
    for (const treelstm::Batch& b : dev_values) infer.prefetch({b.trees, params});
    double dev_acc = accuracy(dev_values);
    std::sort(step_ms.begin(), step_ms.end());
    auto percentile = [&](double q) {
      return step_ms.empty() ? 0.0 : step_ms[std::min(step_ms.size() - 1, static_cast<size_t>(q * step_ms.size()))];
    };
    std::printf("epoch %d: loss %.4f, dev acc %.1f%%, %.0f trees/s, %.0f%% of steps compiled, step p50 %.1f ms "
                "p99 %.1f ms, %.1f s\n", epoch, final_loss, 100 * dev_acc, trees / seconds,
                100.0 * compiled / values.size(), percentile(0.5), percentile(0.99), seconds);
    std::fflush(stdout);
    epochs.push_back({{"epoch", epoch}, {"loss", final_loss}, {"dev_acc", dev_acc}, {"trees_per_s", trees / seconds},
                      {"compiled_share", static_cast<double>(compiled) / values.size()},
                      {"step_ms_p50", percentile(0.5)}, {"step_ms_p99", percentile(0.99)},
                      {"step_ms_max", step_ms.empty() ? 0.0 : step_ms.back()}});
  }
  std::vector<treelstm::Batch> train_values;
  for (auto& b : batches) train_values.push_back(treelstm::MakeBatch(b, *s));
  nlohmann::json out = {
      {"dev_acc", epochs.empty() ? 0.0 : epochs.back()["dev_acc"].get<double>()},
      {"train_acc", accuracy(train_values)},
      {"final_loss", final_loss},
      {"trees_per_s", train_seconds > 0 ? trees_trained / train_seconds : 0.0},
      {"compiled_share_after_epoch0",
       steps_after_first ? static_cast<double>(compiled_after_first) / steps_after_first : 0.0},
      {"policy", c.policy},
      {"epochs", epochs},
      {"seconds", Seconds(start)},
  };
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  pejit::Config c;
  CLI::App app{"Train a Child-Sum Tree-LSTM on ListOps through pejit's tiered JIT engine"};
  app.add_option("--data", c.data, "data set")->check(CLI::IsMember({"listops"}))->capture_default_str();
  app.add_option("--train", c.train_file, "ListOps file (label<TAB>expression); default: generated");
  app.add_option("--dev", c.dev_file, "ListOps file for evaluation");
  app.add_flag("--strict", c.strict, "stop at the first malformed line instead of skipping it");
  app.add_option("--listops-train-size", c.train_size, "generated training expressions")->capture_default_str();
  app.add_option("--listops-dev-size", c.dev_size, "generated dev expressions")->capture_default_str();
  app.add_option("--epochs", c.epochs)->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--batch", c.batch, "trees per minibatch")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--embed", c.embed)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--hidden", c.hidden)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", c.optimizer.learning_rate)->capture_default_str();
  app.add_option("--optimizer", c.optimizer.kind)->check(CLI::IsMember({"adagrad", "sgd", "adam"}))->capture_default_str();
  app.add_option("--clip", c.optimizer.clip_norm, "clip gradients to this global norm (0: off)")->capture_default_str();
  app.add_option("--weight-decay", c.optimizer.weight_decay)->capture_default_str();
  app.add_option("--seed", c.seed)->capture_default_str();
  app.add_option("--workers", c.workers, "background compile workers (0: cores - 1)")->capture_default_str();
  app.add_option("--policy", c.policy, "eager, hot:N, interpreter or sync")->capture_default_str();
  app.add_flag("--reshuffle", c.reshuffle, "new minibatches every epoch (new signatures to compile)");
  app.add_option("--log", c.log_level, "the JIT's log on stderr: off, info, debug or trace (default: PEJIT_LOG)");
  app.add_option("--trace", c.trace_file, "write the JIT's events to this JSON-lines file (default: PEJIT_TRACE)");
  CLI11_PARSE(app, argc, argv);
  try {
    return pejit::Run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
