// One pejit mode of bench/mlp, in a process of its own (bench.py runs it;
// see README.md): trains the 784-256-10 MLP of examples/mlp/mlp.pj on
// Fashion-MNIST through the tiered engine under one policy, with `infer`
// over the test split after each epoch, and prints one JSON line: per epoch
// images/s for training and inference, CPU seconds, compiled shares, step
// latencies, and the background compiler's latencies and code bytes.
//
// The loop is the demo's (examples/mlp/trainer.h): each step gathers its
// minibatch, runs value_and_grad of `loss` and the SGD update; inference
// runs `infer` over the test split in minibatches of the same size.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <memory>

#include "bench/compile_stats.h"
#include "examples/mlp/fashion_mnist.h"
#include "examples/mlp/trainer.h"
#include "ops/blas.h"
#include "scheduler/engine.h"
#include "scheduler/engine_flags.h"
#include "support/cli_checks.h"
#include "support/cpu_clock.h"

namespace pejit {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

struct Config {
  std::string data = mlp::kFashionMnistDir;
  int64_t limit = 0;
  int epochs = 2, batch = 64;
  EngineFlags engine;
  int worker_nice = -1;  // < 0: the engine's default (EngineOptions::worker_nice)
  // Policies eager and hot:N: carry on (up to max_epochs) until an epoch ran
  // compiled code in every training and inference call: the steady state.
  bool until_compiled = false;
  int max_epochs = 8;
  double lr = 0.1;
  uint64_t seed = 1;
};

// The first `n` examples of a split (n <= 0 or past its end: all of it).
mlp::Split Head(const mlp::Split& s, int64_t n) {
  if (n <= 0 || n >= s.size()) return s;
  mlp::Split head{Tensor::Empty(DType::kF32, {n, mlp::kPixels}), Tensor::Empty(DType::kI64, {n})};
  std::copy_n(s.images.data<float>(), n * mlp::kPixels, head.images.data<float>());
  std::copy_n(s.labels.data<int64_t>(), n, head.labels.data<int64_t>());
  return head;
}

int Measure(const Config& c) {
  const auto start = Clock::now();
  mlp::FashionMnist data = mlp::LoadFashionMnist(c.data);
  mlp::Split train = Head(data.train, c.limit), test = Head(data.test, c.limit);

  auto compile_stats = std::make_shared<bench::CompileStatsSink>();
  EngineOptions options;
  ApplyEngineFlags(c.engine, options);
  options.events = compile_stats;
  if (c.worker_nice >= 0) options.worker_nice = c.worker_nice;
  const int worker_nice = options.worker_nice;
  mlp::RunOptions run;
  run.batch = c.batch;
  run.seed = c.seed;
  run.optimizer.kind = "sgd";
  run.optimizer.learning_rate = c.lr;
  mlp::Trainer trainer(run, train, test, std::move(options));

  nlohmann::json epochs = nlohmann::json::array();
  auto more = [&] {
    if (static_cast<int>(epochs.size()) < c.epochs) return true;
    if (!c.until_compiled || static_cast<int>(epochs.size()) >= c.max_epochs) return false;
    const nlohmann::json& last = epochs.back();
    return last["compiled_share"].get<double>() < 1.0 || last["infer_compiled_share"].get<double>() < 1.0;
  };
  for (int epoch = 0; more(); ++epoch) {
    std::vector<double> step_ms;
    double last_seconds = 0;
    double cpu_before = ProcessCpuSeconds();
    mlp::EpochResult r = trainer.TrainEpoch([&](size_t, const mlp::EpochResult& so_far) {
      step_ms.push_back(1e3 * (so_far.seconds - last_seconds));
      last_seconds = so_far.seconds;
    });
    double train_cpu = ProcessCpuSeconds() - cpu_before;
    cpu_before = ProcessCpuSeconds();
    mlp::EvalResult e = trainer.Evaluate();
    double infer_cpu = ProcessCpuSeconds() - cpu_before;
    epochs.push_back({{"epoch", epoch},
                      {"images", r.images},
                      {"seconds", r.seconds},
                      {"cpu_seconds", train_cpu},
                      {"images_per_s", static_cast<double>(r.images) / r.seconds},
                      {"loss", r.loss},
                      {"compiled_share", r.tiers.compiled_share()},
                      {"step_ms_p50", bench::Percentile(step_ms, 0.5)},
                      {"step_ms_p99", bench::Percentile(step_ms, 0.99)},
                      {"step_ms_max", bench::Percentile(step_ms, 1.0)},
                      {"infer_images", e.images},
                      {"infer_seconds", e.seconds},
                      {"infer_cpu_seconds", infer_cpu},
                      {"infer_images_per_s", e.seconds > 0 ? static_cast<double>(e.images) / e.seconds : 0.0},
                      {"infer_compiled_share", e.tiers.compiled_share()},
                      {"test_acc", e.accuracy}});
    std::fprintf(stderr, "pejit %s epoch %d: train %.0f images/s, infer %.0f images/s, loss %.4f\n",
                 c.engine.policy.c_str(), epoch, epochs.back()["images_per_s"].get<double>(),
                 epochs.back()["infer_images_per_s"].get<double>(), r.loss);
  }

  EngineStats es = trainer.engine().stats();
  nlohmann::json out = {
      {"suite", "mlp"},
      {"impl", "pejit"},
      {"policy", c.engine.policy},
      {"workers", es.workers},
      {"worker_nice", worker_nice},
      {"step_threads", es.step_threads},
      {"blas", BlasConfig()},
#ifdef NDEBUG
      {"optimized_build", true},
#else
      {"optimized_build", false},
#endif
      {"train_images", train.size()},
      {"test_images", test.size()},
      {"batch", c.batch},
      {"optimizer", "sgd"},
      {"lr", c.lr},
      {"epochs", epochs},
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
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  pejit::Config c;
  CLI::App app{"One pejit mode of the MLP benchmark (bench/README.md): train on Fashion-MNIST, infer on its test "
               "split after each epoch; prints one JSON line"};
  app.add_option("--data", c.data, "folder of the IDX files (plain or .gz)")->capture_default_str();
  app.add_option("--limit", c.limit, "use only the first N training and test images (0: all)")
      ->capture_default_str()
      ->check(pejit::WholeNumber(0, kMaxInt));
  app.add_option("--epochs", c.epochs)->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--batch", c.batch)->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--lr", c.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--seed", c.seed)->capture_default_str();
  app.add_flag("--until-compiled", c.until_compiled,
               "after --epochs, carry on until an epoch ran compiled code in every call");
  app.add_option("--max-epochs", c.max_epochs, "--until-compiled stops here")->capture_default_str();
  pejit::AddEngineFlags(app, c.engine);
  app.add_option("--worker-nice", c.worker_nice, "niceness of the compile workers (default: the engine's)");
  CLI11_PARSE(app, argc, argv);
  try {
    return pejit::Measure(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_pejit: %s\n", e.what());
    return 1;
  }
}
