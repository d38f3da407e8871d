// The Tree-LSTM demo's command line (README command 1): trains the
// Child-Sum Tree-LSTM of treelstm.pj on ListOps (generated, or files) or SST
// trees through the tiered engine. Every step runs at once (interpreter)
// while the engine's workers specialize and compile each minibatch's
// structure; from the second epoch on, the same minibatches run compiled code.
//
// Prints a progress bar per epoch (stderr), a line per epoch and a final JSON
// line (stdout); examples/README.md explains them.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

#include "dist/communicator.h"
#include "examples/treelstm/trainer.h"
#include "scheduler/engine.h"
#include "scheduler/engine_flags.h"
#include "support/cli_checks.h"
#include "support/input_file.h"
#include "support/progress.h"
#include "train/checkpoint.h"

namespace pejit {
namespace {

struct Config {
  treelstm::RunOptions run;
  int epochs = 10;
  EngineFlags engine;
  int worker_nice = EngineOptions{}.worker_nice;
  std::string save, resume;
  double allreduce_deadline = 300;  // dist::Communicator::deadline_seconds
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }
double Between(Clock::time_point from, Clock::time_point to) { return std::chrono::duration<double>(to - from).count(); }

// The process's start as this program sees it: its static initialization,
// after the dynamic loader (which `startup`'s figures therefore leave out).
const Clock::time_point kProcessStart = Clock::now();

// Nearest-rank percentile of unsorted values.
double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank > 0 ? rank - 1 : 0)];
}

// What the progress bar shows after the counts.
std::string Status(const treelstm::EpochResult& r) {
  char text[96];
  std::snprintf(text, sizeof text, "loss %.3f  %.0f trees/s  compiled %3.0f%%", r.loss,
                static_cast<double>(r.trees) / std::max(1e-9, r.seconds),
                100.0 * static_cast<double>(r.compiled_steps) / static_cast<double>(std::max<int64_t>(1, r.steps)));
  return text;
}

// What shapes the run, which every rank must share (RequireSameSettings).
std::vector<std::pair<std::string, std::string>> Settings(const Config& c, const treelstm::Dataset& d) {
  const treelstm::RunOptions& r = c.run;
  auto text = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  return {
      {"--data", r.data},
      {"the training set's size", std::to_string(d.train.size())},
      {"the dev set's size", std::to_string(d.dev.size())},
      {"the vocabulary's size", std::to_string(d.vocabulary)},
      {"--epochs", std::to_string(c.epochs)},
      {"--batch", std::to_string(r.batch)},
      {"--embed", std::to_string(r.embed)},
      {"--hidden", std::to_string(r.hidden)},
      {"--optimizer", r.optimizer.kind},
      {"--lr", text(r.optimizer.learning_rate)},
      {"--clip", text(r.optimizer.clip_norm)},
      {"--weight-decay", text(r.optimizer.weight_decay)},
      {"--seed", std::to_string(r.seed)},
      {"--reshuffle", r.reshuffle ? "on" : "off"},
      {"--resume", c.resume},
  };
}

// `group`: this process's ranks (several under mpirun: data-parallel; rank
// 0 alone prints, evaluates and saves).
int Run(Config c, dist::Communicator& group) {
  auto start = Clock::now();
  const bool lead = group.rank() == 0;
  c.run.train_file = UserPath(c.run.train_file);
  c.run.dev_file = UserPath(c.run.dev_file);
  treelstm::Dataset data = treelstm::LoadDataset(c.run);
  const size_t shown = lead ? 10 : 0;
  for (size_t i = 0; i < std::min(shown, data.warnings.size()); ++i) {
    std::fprintf(stderr, "warning: skipped %s\n", data.warnings[i].c_str());
  }
  if (lead && data.warnings.size() > shown) std::fprintf(stderr, "warning: ... and %zu more lines skipped\n", data.warnings.size() - shown);

  group.set_deadline_seconds(c.allreduce_deadline);
  group.RequireSameSettings(Settings(c, data));
  EngineOptions engine;
  ApplyEngineFlags(c.engine, engine);
  engine.worker_nice = c.worker_nice;
  // A save that would fail is known now, not after the first epoch's work.
  if (!c.save.empty()) CheckCheckpointDestination(UserPath(c.save), {c.run.train_file, c.run.dev_file});
  treelstm::Trainer trainer(c.run, std::move(data), engine, &group);
  const treelstm::Dataset& d = trainer.data();
  if (!c.resume.empty()) {
    trainer.Resume(UserPath(c.resume));
    if (lead) std::fprintf(stderr, "resumed %s after epoch %d\n", c.resume.c_str(), trainer.epoch() - 1);
  }
  if (lead) std::fprintf(stderr,
               "pejit Tree-LSTM on %s: %zu train / %zu dev trees, %d classes, vocabulary %d, batch %d, embed %d, "
               "hidden %d, %s lr %g, policy %s, %d workers\n",
               d.name.c_str(), d.train.size(), d.dev.size(), d.classes, d.vocabulary, c.run.batch, c.run.embed,
               c.run.hidden, c.run.optimizer.kind.c_str(), c.run.optimizer.learning_rate, c.engine.policy.c_str(),
               trainer.engine().stats().workers);
  if (lead && group.distributed()) {
    std::fprintf(stderr, "data-parallel over %d ranks: each takes its share of every minibatch of %d trees\n",
                 group.size(), c.run.batch);
  }

  nlohmann::json epochs = nlohmann::json::array();
  const int first_epoch = trainer.epoch();
  double final_loss = 0, train_seconds = 0, dev_acc = 0, train_acc = 0;
  int64_t trees_trained = 0, steps_after_first = 0, compiled_after_first = 0;
  nlohmann::json startup;  // the first epoch run: when training began, left the interpreter, ended the epoch
  while (trainer.epoch() < c.epochs) {
    const int epoch = trainer.epoch();
    std::optional<ProgressBar> progress;
    if (lead) progress.emplace("epoch " + std::to_string(epoch), "steps", trainer.steps_per_epoch());
    treelstm::EpochResult r = trainer.TrainEpoch([&](size_t done, const treelstm::EpochResult& so_far) {
      if (progress) progress->Update(done, Status(so_far));
    });
    train_seconds += r.seconds;
    trees_trained += r.trees;
    if (epoch > first_epoch) {
      steps_after_first += r.steps;
      compiled_after_first += r.compiled_steps;
    }
    final_loss = r.loss;
    // A time that has no value (no step ran compiled) is null.
    auto compiled_at = [&](double offset, double scale) {
      return r.first_compiled_ms < 0 ? nlohmann::json() : nlohmann::json(offset + r.first_compiled_ms * scale);
    };
    if (epoch == first_epoch) {
      const double first_call = Between(kProcessStart, r.started);
      startup = {{"first_step_s", first_call},
                 {"first_compiled_step_s", compiled_at(first_call, 1e-3)},
                 {"first_compiled_step_after_first_ms", compiled_at(0, 1)},
                 {"epoch_end_s", first_call + r.seconds}};
    }
    if (!lead) continue;  // the other ranks go on to the next epoch's first all-reduce
    for (const std::string& w : r.warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
    train_acc = trainer.TrainAccuracy();
    dev_acc = trainer.DevAccuracy();
    double compiled_share = static_cast<double>(r.compiled_steps) / static_cast<double>(std::max<int64_t>(1, r.steps));
    double interpreted_share =
        static_cast<double>(r.generic_interpreted_steps) / static_cast<double>(std::max<int64_t>(1, r.steps));
    double trees_per_s = static_cast<double>(r.trees) / r.seconds;
    double p50 = Percentile(r.step_ms, 0.5), p99 = Percentile(r.step_ms, 0.99);
    std::printf("epoch %d: loss %.4f, train acc %.1f%%, dev acc %.1f%%, %.0f trees/s, %.0f%% of steps compiled "
                "(%.0f%% generic with interpreted runs), step p50 %.1f ms p99 %.1f ms, %.1f s\n",
                epoch, r.loss, 100 * train_acc, 100 * dev_acc, trees_per_s, 100 * compiled_share, 100 * interpreted_share,
                p50, p99, r.seconds);
    std::fflush(stdout);
    epochs.push_back({{"epoch", epoch},
                      {"loss", r.loss},
                      {"train_acc", train_acc},
                      {"dev_acc", dev_acc},
                      {"trees_per_s", trees_per_s},
                      {"compiled_share", compiled_share},
                      {"generic_interpreted_share", interpreted_share},
                      {"step_ms_p50", p50},
                      {"step_ms_p99", p99},
                      {"step_ms_max", Percentile(r.step_ms, 1.0)},
                      {"step_cpu_ms_p50", Percentile(r.step_cpu_ms, 0.5)},
                      {"step_cpu_ms_p99", Percentile(r.step_cpu_ms, 0.99)},
                      {"first_compiled_step_ms", compiled_at(0, 1)},
                      {"seconds", r.seconds}});
    if (!c.save.empty()) trainer.Save(UserPath(c.save));
  }
  const double finishing_seconds = FinishCompilesIntoCache(trainer.engine());
  if (!lead) return 0;
  if (epochs.empty()) {  // nothing left to train (a resumed run): report the parameters as they are
    train_acc = trainer.TrainAccuracy();
    dev_acc = trainer.DevAccuracy();
  }
  nlohmann::json out = {
      {"data", d.name},
      {"dev_acc", trainer.has_dev() ? nlohmann::json(dev_acc) : nlohmann::json()},
      {"train_acc", train_acc},
      {"final_loss", epochs.empty() ? nlohmann::json() : nlohmann::json(final_loss)},
      {"trees_per_s", train_seconds > 0 ? static_cast<double>(trees_trained) / train_seconds : 0.0},
      {"compiled_share_after_epoch0",
       steps_after_first ? nlohmann::json(static_cast<double>(compiled_after_first) / static_cast<double>(steps_after_first))
                         : nlohmann::json()},
      {"policy", c.engine.policy},
      {"first_epoch", first_epoch},
      {"epochs", epochs},
      {"startup", startup},
      {"cache_finish_seconds", finishing_seconds},
      {"ranks", group.size()},
      {"allreduce_seconds", group.stats().seconds},
      {"allreduce_bytes", group.stats().bytes},
      {"seconds", Seconds(start)},
  };
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  // Bounds that fail fast with the option's name rather than after hours of
  // generating, or in an allocation of the vocabulary times a width.
  constexpr int kMaxGenerated = 10'000'000, kMaxBatch = 65'536, kMaxWidth = 16'384;
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  pejit::Config c;
  pejit::treelstm::RunOptions& r = c.run;
  CLI::App app{"Train a Child-Sum Tree-LSTM on ListOps or SST trees through pejit's tiered JIT engine"};
  app.add_option("--data", r.data, "data set: listops (generated unless --train) or sst (needs --train)")
      ->check(CLI::IsMember({"listops", "sst"}))
      ->capture_default_str();
  app.add_option("--train", r.train_file, "training file: ListOps (label<TAB>expression) or SST trees");
  app.add_option("--dev", r.dev_file, "evaluation file, in the training file's format");
  app.add_flag("--strict", r.strict, "stop at the first malformed line instead of skipping it");
  app.add_option("--listops-train-size", r.listops_train, "generated training expressions")->capture_default_str()->check(pejit::WholeNumber(1, kMaxGenerated));
  app.add_option("--listops-dev-size", r.listops_dev, "generated dev expressions")->capture_default_str()->check(pejit::WholeNumber(0, kMaxGenerated));
  app.add_option("--sst-min-count", r.sst_min_count, "SST words seen fewer times in training become <unk>")
      ->capture_default_str()->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--epochs", c.epochs, "train until this many epochs are done")->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--batch", r.batch, "trees per minibatch")->capture_default_str()->check(pejit::WholeNumber(1, kMaxBatch));
  app.add_option("--embed", r.embed)->capture_default_str()->check(pejit::WholeNumber(1, kMaxWidth));
  app.add_option("--hidden", r.hidden)->capture_default_str()->check(pejit::WholeNumber(1, kMaxWidth));
  app.add_option("--lr", r.optimizer.learning_rate)->capture_default_str()->check(pejit::PositiveReal());
  app.add_option("--optimizer", r.optimizer.kind)->check(CLI::IsMember({"adagrad", "sgd", "adam"}))->capture_default_str();
  app.add_option("--clip", r.optimizer.clip_norm, "clip gradients to this global norm (0: off)")->capture_default_str()->check(pejit::NonNegativeReal());
  app.add_option("--weight-decay", r.optimizer.weight_decay)->capture_default_str()->check(pejit::NonNegativeReal());
  app.add_option("--seed", r.seed)->capture_default_str();
  app.add_flag("--reshuffle", r.reshuffle, "new minibatches every epoch (new signatures to compile)");
  app.add_option("--blowup", r.blowup, "warn once when a step's loss is this many times the first steps' (0: never)")
      ->capture_default_str()
      ->check(pejit::NonNegativeReal());
  app.add_flag("--stop-on-blowup", r.stop_on_blowup, "stop the run (as on NaN) where --blowup would warn");
  app.add_option("--allreduce-deadline", c.allreduce_deadline,
                 "under mpirun: seconds a collective waits for the other ranks before the run ends, naming those "
                 "that did not arrive")
      ->capture_default_str()
      ->check(pejit::PositiveReal());
  app.add_option("--lookahead", r.lookahead, "minibatches prefetched ahead of the step, to compile before it gets there (0: none)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, 1024));
  app.add_option("--train-sample", r.train_sample, "training trees the train accuracy is measured on")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  pejit::AddEngineFlags(app, c.engine);
  app.add_option("--worker-nice", c.worker_nice, "niceness the workers compile at, so training keeps its core (0: same as training)")
      ->check(pejit::WholeNumber(0, 19))
      ->capture_default_str();
  app.add_option("--save", c.save, "write a checkpoint here after every epoch (atomically)")->check(pejit::NonEmptyPath());
  app.add_option("--resume", c.resume, "carry on from this checkpoint (same data and options)")->check(pejit::NonEmptyPath());
  CLI11_PARSE(app, argc, argv);
  pejit::dist::Communicator* group = nullptr;
  try {
    group = &pejit::dist::Communicator::World();
    return pejit::Run(c, *group);
  } catch (const std::exception& e) {
    // Under mpirun, one rank's failure ends every rank (none waits forever
    // in an all-reduce), and the message names the rank.
    if (group && group->distributed()) group->Abort(std::string("train: ") + e.what());
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
