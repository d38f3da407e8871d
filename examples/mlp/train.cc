// Trains the MLP of mlp.pj on Fashion-MNIST through the tiered engine. Two
// entries share the network's `forward`: `loss` (value and gradient, for
// SGD) and `infer` (argmax, for test accuracy). Every call runs at once, in
// the interpreter while the workers specialize and compile that signature,
// in compiled code once it is ready; the run prints a progress bar, a line
// per epoch (loss, test accuracy, images/s, tier shares) and a final JSON line.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>

#include "dist/communicator.h"
#include "examples/mlp/fashion_mnist.h"
#include "examples/mlp/trainer.h"
#include "scheduler/engine.h"
#include "scheduler/engine_flags.h"
#include "support/cli_checks.h"
#include "support/input_file.h"
#include "support/progress.h"

namespace pejit {
namespace {

struct Config {
  std::string data = mlp::kFashionMnistDir;
  int64_t limit = 0;
  int epochs = 1;
  mlp::RunOptions run;
  EngineFlags engine;
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// The first `n` examples of a split (n <= 0 or past its end: all of it).
mlp::Split Head(const mlp::Split& s, int64_t n) {
  if (n <= 0 || n >= s.size()) return s;
  mlp::Split head{Tensor::Empty(DType::kF32, {n, mlp::kPixels}), Tensor::Empty(DType::kI64, {n})};
  std::copy_n(s.images.data<float>(), n * mlp::kPixels, head.images.data<float>());
  std::copy_n(s.labels.data<int64_t>(), n, head.labels.data<int64_t>());
  return head;
}

nlohmann::json TiersJson(const mlp::TierCounts& t) {
  return {{"interpreter", t.interpreter}, {"residual_interpreter", t.residual_interpreter}, {"native", t.native}};
}

// "native 98.9%, interpreter 1.1%": the tiers that served calls.
std::string TiersText(const mlp::TierCounts& t) {
  std::string out;
  for (auto [name, n] : {std::pair{"native", t.native}, std::pair{"residual-interpreter", t.residual_interpreter},
                         std::pair{"interpreter", t.interpreter}}) {
    if (n == 0) continue;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.1f%%", out.empty() ? "" : ", ", name,
                  100.0 * static_cast<double>(n) / static_cast<double>(t.total()));
    out += buf;
  }
  return out.empty() ? "no calls" : out;
}

// `group`: this process's ranks (several under mpirun: data-parallel; rank
// 0 alone prints, evaluates and reports).
int Run(const Config& c, dist::Communicator& group) {
  auto start = Clock::now();
  const bool lead = group.rank() == 0;
  mlp::FashionMnist data = mlp::LoadFashionMnist(UserPath(c.data));
  mlp::Split train = Head(data.train, c.limit), test = Head(data.test, c.limit);

  char rate[32], decay[32];
  std::snprintf(rate, sizeof rate, "%.17g", c.run.optimizer.learning_rate);
  std::snprintf(decay, sizeof decay, "%.17g", c.run.optimizer.weight_decay);
  group.RequireSameSettings({{"the training set's size", std::to_string(train.size())},
                             {"the test set's size", std::to_string(test.size())},
                             {"--epochs", std::to_string(c.epochs)},
                             {"--batch", std::to_string(c.run.batch)},
                             {"--optimizer", c.run.optimizer.kind},
                             {"--lr", rate},
                             {"--weight-decay", decay},
                             {"--seed", std::to_string(c.run.seed)}});
  EngineOptions options;
  ApplyEngineFlags(c.engine, options);
  mlp::Trainer trainer(c.run, train, test, options, &group);

  if (lead) std::fprintf(stderr, "pejit MLP 784-256-10 on Fashion-MNIST: %lld train / %lld test images, batch %d, %s lr %g, "
               "policy %s, %d workers (data read in %.1f s)\n", static_cast<long long>(train.size()),
               static_cast<long long>(test.size()), c.run.batch, c.run.optimizer.kind.c_str(),
               c.run.optimizer.learning_rate, c.engine.policy.c_str(), trainer.engine().stats().workers, Seconds(start));

  nlohmann::json epochs = nlohmann::json::array();
  mlp::TierCounts loss_tiers, infer_tiers;
  double train_seconds = 0, infer_seconds = 0;
  int64_t images_trained = 0, images_inferred = 0;
  mlp::EpochResult last;
  mlp::EvalResult eval;
  for (int epoch = 0; epoch < c.epochs; ++epoch) {
    std::optional<ProgressBar> progress;
    if (lead) progress.emplace("epoch " + std::to_string(epoch), "steps", trainer.steps_per_epoch(), 10);
    last = trainer.TrainEpoch([&](size_t done, const mlp::EpochResult& r) {
      if (!progress) return;
      char status[96];
      std::snprintf(status, sizeof status, "loss %.3f  %.0f images/s  compiled %3.0f%%", r.loss,
                    static_cast<double>(r.images) / r.seconds, 100 * r.tiers.compiled_share());
      progress->Update(done, status);
    });
    if (!lead) continue;  // the other ranks go on to the next epoch's first all-reduce
    eval = trainer.Evaluate();
    loss_tiers += last.tiers;
    infer_tiers += eval.tiers;
    train_seconds += last.seconds;
    infer_seconds += eval.seconds;
    images_trained += last.images;
    images_inferred += eval.images;
    double train_rate = static_cast<double>(last.images) / last.seconds;
    double infer_rate = eval.seconds > 0 ? static_cast<double>(eval.images) / eval.seconds : 0.0;
    std::printf("epoch %d: loss %.4f, test acc %.2f%%, train %.0f images/s, infer %.0f images/s, %.1f s\n"
                "  tiers: loss %s; infer %s\n",
                epoch, last.loss, 100 * eval.accuracy, train_rate, infer_rate, last.seconds + eval.seconds,
                TiersText(last.tiers).c_str(), TiersText(eval.tiers).c_str());
    std::fflush(stdout);
    epochs.push_back({{"epoch", epoch}, {"loss", last.loss}, {"test_acc", eval.accuracy},
                      {"train_images_per_s", train_rate}, {"infer_images_per_s", infer_rate},
                      {"loss_tiers", TiersJson(last.tiers)}, {"infer_tiers", TiersJson(eval.tiers)}});
  }
  const double finishing_seconds = FinishCompilesIntoCache(trainer.engine());
  if (!lead) return 0;
  if (c.epochs == 0) {  // the initial parameters' accuracy
    eval = trainer.Evaluate();
    infer_tiers += eval.tiers;
    infer_seconds += eval.seconds;
    images_inferred += eval.images;
  }
  nlohmann::json out = {
      {"test_acc", eval.accuracy},
      {"final_loss", last.loss},
      {"train_images_per_s", train_seconds > 0 ? static_cast<double>(images_trained) / train_seconds : 0.0},
      {"infer_images_per_s", infer_seconds > 0 ? static_cast<double>(images_inferred) / infer_seconds : 0.0},
      {"loss_tiers", TiersJson(loss_tiers)},
      {"infer_tiers", TiersJson(infer_tiers)},
      {"policy", c.engine.policy},
      {"batch", c.run.batch},
      {"epochs", epochs},
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
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  pejit::Config c;
  c.run.optimizer.kind = "sgd";
  c.run.optimizer.learning_rate = 0.1;
  CLI::App app{"Train a 784-256-10 MLP on Fashion-MNIST through pejit's tiered JIT engine: two entries, `loss` "
               "and `infer`, sharing `forward`"};
  app.add_option("--data", c.data, "folder of the IDX files (plain or .gz)")->capture_default_str();
  app.add_option("--limit", c.limit, "use only the first N training and test images (0: all)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, std::numeric_limits<int64_t>::max()));
  app.add_option("--epochs", c.epochs)->capture_default_str()->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--batch", c.run.batch, "images per minibatch (training and inference)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--lr", c.run.optimizer.learning_rate)->capture_default_str()->check(pejit::PositiveReal());
  app.add_option("--optimizer", c.run.optimizer.kind)
      ->check(CLI::IsMember({"sgd", "adagrad", "adam"}))
      ->capture_default_str();
  app.add_option("--weight-decay", c.run.optimizer.weight_decay)->capture_default_str()->check(pejit::NonNegativeReal());
  app.add_option("--seed", c.run.seed)->capture_default_str();
  pejit::AddEngineFlags(app, c.engine);
  CLI11_PARSE(app, argc, argv);
  pejit::dist::Communicator* group = nullptr;
  try {
    group = &pejit::dist::Communicator::World();
    return pejit::Run(c, *group);
  } catch (const std::exception& e) {
    // Under mpirun, one rank's failure ends every rank, naming it.
    if (group && group->distributed()) group->Abort(std::string("train: ") + e.what());
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
}
