// Trains the MLP of growing.pj while changing it through the engine's live
// module (growing.h: grow a branch, deepen it, prune the old one). Training
// never stops: the steps right after a change run in the interpreter while a
// worker specializes the new code. The run prints one line per change (the
// edits, what they invalidated, rejected edits), one when each new code is
// ready (its cost beside the first specialization's), the loss and test
// accuracy per phase, and a final JSON line with the figures.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>

#include "examples/growing/growing.h"
#include "examples/mlp/model.h"
#include "scheduler/engine_flags.h"
#include "support/cli_checks.h"
#include "support/cpu_clock.h"
#include "support/input_file.h"
#include "train/optimizer.h"

namespace pejit {
namespace {

struct Config {
  std::string data = "auto";
  int64_t train = 32000, test = 2000;
  int batch = 64;
  int every = 1000;
  int64_t steps = 0;  // 0: 4 × every (each change, then a phase after the last)
  double lr = 0.1;
  growing::Sizes sizes;
  uint64_t seed = 7;
  EngineFlags engine = [] {
    EngineFlags f;
    f.workers = 1;  // one core compiles, whatever the machine: background CPU per change is comparable
    return f;
  }();
  bool no_reuse = false;
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// CPU time spent off the training thread: the workers and ORC's own
// compile threads (LLJIT materializes on a thread pool, so the worker's
// thread clock alone misses most of LLVM's work).
class BackgroundCpu {
 public:
  BackgroundCpu() { pthread_getcpuclockid(pthread_self(), &training_); }  // constructed on the training thread
  int64_t Now() const { return static_cast<int64_t>((ProcessCpuSeconds() - CpuSeconds(training_)) * 1e6); }

 private:
  clockid_t training_{};
};

// One specialization job of the engine, from its events.
struct Job {
  std::string entry, mode;
  int64_t pe_us = 0, autodiff_us = 0, passes_us = 0, llvm_us = 0, job_us = 0, wait_us = 0;
  // Background CPU (BackgroundCpu) from the compile hook's start to the
  // swap: passes and LLVM, all threads but the training one.
  int64_t compile_cpu_us = -1;
  int64_t kernels = 0, reused_kernels = 0, reused_templates = 0;
  std::string reused;  // helpers replayed from the PE cache

  nlohmann::json Json() const {
    return {{"entry", entry},       {"mode", mode},         {"job_us", job_us},     {"pe_us", pe_us},
            {"autodiff_us", autodiff_us}, {"passes_us", passes_us}, {"llvm_us", llvm_us},
            {"compile_cpu_us", compile_cpu_us}, {"kernels", kernels}, {"reused_kernels", reused_kernels},
            {"reused_pe_templates", reused}};
  }
};

// Collects the events the report needs: edits, invalidations and finished
// jobs (their stage times and what they reused).
class Observer final : public EventSink {
 public:
  bool Wants(EventKind k) const override {
    return k == EventKind::kEdit || k == EventKind::kInvalidate || k == EventKind::kPe || k == EventKind::kCodegen ||
           k == EventKind::kSwap;
  }
  void Emit(const Event& e) override {
    std::lock_guard<std::mutex> lock(mu_);
    switch (e.kind) {
      case EventKind::kEdit: edits_.push_back(e); break;
      case EventKind::kInvalidate: invalidations_.push_back(e); break;
      case EventKind::kPe: {
        Job& j = running_[Int(e, "job")];
        j.reused = e.Text("reused");
        break;
      }
      case EventKind::kCodegen: {
        Job& j = running_[Int(e, "job")];
        j.kernels = Int(e, "distinct_kernels");
        j.reused_kernels = Int(e, "reused_kernels");
        break;
      }
      case EventKind::kSwap: {
        Job j = running_[Int(e, "job")];
        running_.erase(Int(e, "job"));
        j.entry = e.entry;
        j.mode = e.Text("mode");
        j.job_us = e.duration_us;
        j.pe_us = Int(e, "pe_us");
        j.autodiff_us = Int(e, "autodiff_us");
        j.passes_us = Int(e, "passes_us");
        j.llvm_us = Int(e, "llvm_us");
        j.wait_us = Int(e, "wait_us");
        if (compile_start_ >= 0) j.compile_cpu_us = cpu_.Now() - compile_start_;
        done_.push_back(j);
        break;
      }
      default: break;
    }
  }
  // Called by the engine's before_compile hook, on the worker.
  void CompileStarts() { compile_start_ = cpu_.Now(); }

  std::vector<Event> edits() const { return Locked(edits_); }
  std::vector<Event> invalidations() const { return Locked(invalidations_); }
  std::vector<Job> done() const { return Locked(done_); }

 private:
  template <class T>
  T Locked(const T& v) const {
    std::lock_guard<std::mutex> lock(mu_);
    return v;
  }
  static int64_t Int(const Event& e, std::string_view key) {
    const FieldValue* f = e.Find(key);
    return f && std::holds_alternative<int64_t>(*f) ? std::get<int64_t>(*f) : 0;
  }
  mutable std::mutex mu_;
  std::vector<Event> edits_, invalidations_;
  std::map<int64_t, Job> running_;
  std::vector<Job> done_;
  BackgroundCpu cpu_;
  static thread_local int64_t compile_start_;  // on the worker running the job
};
thread_local int64_t Observer::compile_start_ = -1;

std::string Ms(int64_t us) { return fmt::format("{:.1f} ms", static_cast<double>(us) / 1e3); }

std::string Describe(const Job& j) {
  return fmt::format("job {} (pe {}, autodiff {}, passes {}, llvm {}; compile CPU {}), kernels {} of which reused {}, "
                     "PE templates replayed: {}",
                     Ms(j.job_us), Ms(j.pe_us), Ms(j.autodiff_us), Ms(j.passes_us), Ms(j.llvm_us),
                     Ms(j.compile_cpu_us), j.kernels, j.reused_kernels, j.reused.empty() ? "none" : j.reused);
}

struct Phase {
  std::string name;
  int64_t first_step = 0, steps = 0, interpreter = 0, compiled = 0;
  int64_t steps_until_compiled = -1;  // steps of this phase before the first compiled one
  double loss_sum = 0;
  double test_accuracy = 0;
};

int Run(const Config& c) {
  auto start = Clock::now();
  // The data: Fashion-MNIST when its package is installed, else synthetic.
  mlp::Split train, test;
  std::string data = c.data;
  struct stat st{};
  if (data == "auto") data = stat(mlp::kFashionMnistDir, &st) == 0 ? mlp::kFashionMnistDir : "synthetic";
  Rng data_rng(c.seed + 1);
  if (data == "synthetic") {
    train = growing::SyntheticSplit(data_rng, c.train);
    test = growing::SyntheticSplit(data_rng, c.test);
  } else {
    mlp::FashionMnist fm = mlp::LoadFashionMnist(UserPath(data));
    auto head = [](const mlp::Split& s, int64_t n) {
      n = std::min(n, s.size());
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
      mlp::Batch b = mlp::MakeBatch(s, order, 0, order.size());
      return mlp::Split{b.images.tensor(), b.labels.tensor()};
    };
    train = head(fm.train, c.train);
    test = head(fm.test, c.test);
  }
  const int64_t batches = train.size() / c.batch;
  if (batches == 0) throw std::invalid_argument("--train must hold at least one minibatch of --batch images");
  std::fprintf(stderr, "data: %s, %lld training images (%lld minibatches of %d), %lld test images\n",
               data == "synthetic" ? "synthetic (no Fashion-MNIST package; tools/setup.sh mlp)" : data.c_str(),
               static_cast<long long>(train.size()), static_cast<long long>(batches), c.batch,
               static_cast<long long>(test.size()));

  auto observer = std::make_shared<Observer>();
  EngineOptions options;
  ApplyEngineFlags(c.engine, options);
  options.events = observer;
  options.before_compile = [observer](const CompileInfo&) { observer->CompileStarts(); };
  if (c.no_reuse) {
    options.retained_code_bytes = 0;
    options.pe_cache.max_entries = 0;
  }
  Engine engine(options);
  growing::GrowingModel model(engine, c.sizes, c.seed);
  std::unique_ptr<Optimizer> sgd = Optimizer::Create({.kind = "sgd", .learning_rate = c.lr});

  std::vector<int64_t> order(static_cast<size_t>(train.size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::vector<int64_t> test_order(static_cast<size_t>(test.size()));
  for (size_t i = 0; i < test_order.size(); ++i) test_order[i] = static_cast<int64_t>(i);
  const int64_t eval_batch = std::min<int64_t>(500, test.size());
  mlp::Batch probe = mlp::MakeBatch(train, order, 0, static_cast<size_t>(c.batch));

  auto accuracy = [&] {
    int64_t right = 0, seen = 0;
    for (int64_t b = 0; b + eval_batch <= test.size(); b += eval_batch) {
      mlp::Batch t = mlp::MakeBatch(test, test_order, static_cast<size_t>(b), static_cast<size_t>(eval_batch));
      Tensor predicted = model.infer().call(model.InferArgs(t.images)).tensor();
      for (int64_t i = 0; i < eval_batch; ++i) {
        right += predicted.data<int64_t>()[i] == t.labels.tensor().data<int64_t>()[i];
      }
      seen += eval_batch;
    }
    return seen ? static_cast<double>(right) / static_cast<double>(seen) : 0.0;
  };
  auto prefetch_infer = [&] {
    mlp::Batch t = mlp::MakeBatch(test, test_order, 0, static_cast<size_t>(eval_batch));
    model.infer().prefetch(model.InferArgs(t.images));
  };

  const int64_t total_steps = c.steps > 0 ? c.steps : int64_t{4} * c.every;
  std::vector<Phase> phases{{"initial"}};
  std::vector<std::string> rejected;
  nlohmann::json changes = nlohmann::json::array();
  size_t jobs_reported = 0;
  const Job* first_loss = nullptr;
  std::vector<Job> jobs;
  int64_t activity_compiled = 0, activity_calls = 0;

  auto report_jobs = [&](int64_t step) {
    jobs = observer->done();
    for (; jobs_reported < jobs.size(); ++jobs_reported) {
      const Job& j = jobs[jobs_reported];
      std::fprintf(stderr, "  step %lld: %s (%s) ready: %s\n", static_cast<long long>(step), j.entry.c_str(),
                   j.mode.c_str(), Describe(j).c_str());
    }
    first_loss = nullptr;
    for (const Job& j : jobs) {
      if (j.entry == "loss") {
        first_loss = &j;
        break;
      }
    }
  };

  for (int64_t step = 0; step < total_steps; ++step) {
    if (step > 0 && step % c.every == 0 && model.stage() < 3) {
      phases.back().test_accuracy = accuracy();
      std::fprintf(stderr, "phase %s: %lld steps (%lld interpreter, %lld compiled), mean loss %.4f, test accuracy %.2f%%\n",
                   phases.back().name.c_str(), static_cast<long long>(phases.back().steps),
                   static_cast<long long>(phases.back().interpreter), static_cast<long long>(phases.back().compiled),
                   phases.back().loss_sum / static_cast<double>(std::max<int64_t>(1, phases.back().steps)),
                   100 * phases.back().test_accuracy);
      mlp::Batch now = mlp::MakeBatch(train, order, 0, static_cast<size_t>(c.batch));
      if (model.stage() == 0) {
        // Edits the module must refuse; compiled code stays as it was.
        uint64_t generation = engine.module().snapshot()->generation();
        CodeStatus loss_before = model.loss().status(model.LossArgs(now.images, now.labels));
        for (const std::string& error : model.BadEdits()) {
          std::fprintf(stderr, "step %lld: rejected edit: %s\n", static_cast<long long>(step), error.c_str());
          rejected.push_back(error);
        }
        CodeStatus loss_after = model.loss().status(model.LossArgs(now.images, now.labels));
        std::fprintf(stderr, "  module generation %llu -> %llu; loss code %s -> %s\n",
                     static_cast<unsigned long long>(generation),
                     static_cast<unsigned long long>(engine.module().snapshot()->generation()),
                     CodeStateName(loss_before.state), CodeStateName(loss_after.state));
      }
      size_t edits_before = observer->edits().size(), inv_before = observer->invalidations().size();
      growing::ChangeReport change = model.Next();
      std::vector<Event> edits = observer->edits(), invs = observer->invalidations();
      nlohmann::json cj = {{"step", step}, {"change", change.name}, {"edits", nlohmann::json::array()}};
      std::fprintf(stderr, "step %lld: %s\n", static_cast<long long>(step), change.name.c_str());
      for (size_t i = edits_before; i < edits.size(); ++i) {
        const Event& e = edits[i];
        std::fprintf(stderr, "  %s %s: affects %s; %s specialization(s) invalidated\n", e.Text("kind").c_str(),
                     e.Text("definitions").c_str(), e.Text("affected").c_str(), e.Text("slots").c_str());
        cj["edits"].push_back({{"kind", e.Text("kind")}, {"definitions", e.Text("definitions")},
                               {"invalidated", std::stoll(e.Text("slots"))}});
      }
      nlohmann::json inv = nlohmann::json::object();
      for (size_t i = inv_before; i < invs.size(); ++i) {
        inv[invs[i].entry] = inv.value(invs[i].entry, int64_t{0}) + std::stoll(invs[i].Text("slots"));
      }
      CodeStatus activity_status = model.activity().status(model.ActivityArgs(probe.images));
      std::fprintf(stderr, "  invalidated by entry: %s; activity keeps its code: %s\n", inv.dump().c_str(),
                   CodeStateName(activity_status.state));
      cj["invalidated"] = inv;
      cj["activity_code"] = CodeStateName(activity_status.state);
      changes.push_back(cj);
      phases.push_back({change.name, step});
    }
    mlp::Batch b = mlp::MakeBatch(train, order, static_cast<size_t>((step % batches) * c.batch),
                                  static_cast<size_t>(c.batch));
    EntryStats before = model.loss().stats();
    ValueAndGrad out = model.loss().value_and_grad(model.LossArgs(b.images, b.labels));
    bool compiled = model.loss().stats().calls_compiled() > before.calls_compiled();
    sgd->Step(Value::Tuple({model.trunk(), model.head()}), Value::Tuple({out.grads[0], out.grads[1]}));
    Phase& p = phases.back();
    if (compiled && p.steps_until_compiled < 0) p.steps_until_compiled = p.steps;
    ++p.steps;
    (compiled ? p.compiled : p.interpreter)++;
    p.loss_sum += out.value.tensor().data<float>()[0];
    // After the training step: an idle worker takes the first job queued,
    // and `loss`'s should be it, so that its figures are its own (a job
    // after another reuses what that one compiled).
    if (p.steps == 1) prefetch_infer();
    if (step % 10 == 0) {
      EntryStats a = model.activity().stats();
      model.activity().call(model.ActivityArgs(probe.images));
      activity_compiled += model.activity().stats().calls_compiled() - a.calls_compiled();
      ++activity_calls;
    }
    report_jobs(step);
    if ((step + 1) % std::max(1, c.every / 2) == 0) {
      std::fprintf(stderr, "step %lld: loss %.4f (%s)\n", static_cast<long long>(step + 1),
                   out.value.tensor().data<float>()[0], compiled ? "compiled" : "interpreter");
    }
  }
  phases.back().test_accuracy = accuracy();
  std::fprintf(stderr, "phase %s: %lld steps (%lld interpreter, %lld compiled), mean loss %.4f, test accuracy %.2f%%\n",
               phases.back().name.c_str(), static_cast<long long>(phases.back().steps),
               static_cast<long long>(phases.back().interpreter), static_cast<long long>(phases.back().compiled),
               phases.back().loss_sum / static_cast<double>(std::max<int64_t>(1, phases.back().steps)),
               100 * phases.back().test_accuracy);
  report_jobs(total_steps);

  // The first specialization of `loss` beside each one after a change.
  nlohmann::json respecs = nlohmann::json::array();
  bool seen_first = false;
  for (const Job& j : jobs) {
    if (j.entry != "loss") continue;
    if (!seen_first) {
      seen_first = true;
      continue;
    }
    respecs.push_back(j.Json());
  }
  int64_t interp = 0, comp = 0;
  nlohmann::json pj = nlohmann::json::array();
  for (const Phase& p : phases) {
    interp += p.interpreter;
    comp += p.compiled;
    pj.push_back({{"phase", p.name},
                  {"first_step", p.first_step},
                  {"steps", p.steps},
                  {"interpreter_steps", p.interpreter},
                  {"compiled_steps", p.compiled},
                  {"steps_until_compiled", p.steps_until_compiled},
                  {"mean_loss", p.loss_sum / static_cast<double>(std::max<int64_t>(1, p.steps))},
                  {"test_accuracy", p.test_accuracy}});
  }
  nlohmann::json result = {
      {"data", data == "synthetic" ? "synthetic" : "fashion-mnist"},
      {"steps", total_steps},
      {"batch", c.batch},
      {"reuse", !c.no_reuse},
      {"changes", changes},
      {"rejected_edits", rejected.size()},
      {"phases", pj},
      {"loss_steps_interpreter", interp},
      {"loss_steps_compiled", comp},
      {"activity_calls", activity_calls},
      {"activity_calls_compiled", activity_compiled},
      {"first_specialization", first_loss ? first_loss->Json() : nlohmann::json()},
      {"respecializations", respecs},
      {"retained_code_bytes", engine.stats().retained_bytes},
      {"seconds", Seconds(start)},
  };
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace pejit

int main(int argc, char** argv) {
  pejit::Config c;
  constexpr int kMaxInt = std::numeric_limits<int>::max();
  CLI::App app{"Train an MLP that changes while it trains: every --every steps the head is rebuilt through the engine's "
               "live module (add a branch, deepen it, remove the old one); the steps after a change run in the "
               "interpreter while the new code is specialized in the background. Prints the edits, what they "
               "invalidated, each job's cost and a final JSON line."};
  app.add_option("--data", c.data,
                 "Fashion-MNIST's folder, `synthetic`, or `auto` (the package's folder when installed)")
      ->capture_default_str();
  app.add_option("--train", c.train, "training images used")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--test", c.test, "test images used")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--batch", c.batch, "images per training minibatch")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--every", c.every, "steps between changes")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--steps", c.steps, "training steps (0: 4 x --every)")->capture_default_str()->check(pejit::WholeNumber(0, std::numeric_limits<int64_t>::max()));
  app.add_option("--lr", c.lr, "SGD learning rate")->capture_default_str()->check(pejit::PositiveReal());
  app.add_option("--hidden", c.sizes.hidden, "trunk features")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--branch", c.sizes.branch, "branch units")->capture_default_str()->check(pejit::WholeNumber(1, kMaxInt));
  app.add_option("--seed", c.seed)->capture_default_str();
  pejit::AddEngineFlags(app, c.engine);
  app.add_flag("--no-reuse", c.no_reuse,
               "keep nothing across edits (no retained code, no PE cache; kernels of code still live, such as "
               "activity's, are still shared): what re-specializing costs without that reuse");
  CLI11_PARSE(app, argc, argv);
  try {
    return pejit::Run(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "growing: %s\n", e.what());
    return 1;
  }
}
