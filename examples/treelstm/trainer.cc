#include "examples/treelstm/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include <unistd.h>

#include "examples/treelstm/listops.h"
#include "examples/treelstm/sst.h"
#include "support/cpu_clock.h"
#include "support/hash.h"
#include "train/checkpoint.h"

namespace pejit::treelstm {
namespace {

using Clock = std::chrono::steady_clock;

// Independent random streams of one seed: parameters, fixed minibatches
// (and epoch e's reshuffled ones), evaluation sets.
constexpr uint64_t kBatchStream = 0x9E3779B97F4A7C15ull, kEvalStream = 0xBF58476D1CE4E5B9ull;

void Shuffle(std::vector<const Example*>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.NextInt(0, static_cast<int64_t>(i))]);
}

void AddWarnings(Dataset& d, const std::vector<std::string>& errors) {
  d.warnings.insert(d.warnings.end(), errors.begin(), errors.end());
}

// The training examples' labels and trees (pre-order tokens and child
// counts), hashed: another file, or the same one edited, differs.
std::string DataFingerprint(const std::vector<Example>& examples) {
  uint64_t h = kFnv1aStart;
  std::vector<const TokenTree*> stack;
  for (const Example& e : examples) {
    h = Fnv1a(&e.label, sizeof e.label, h);
    stack.push_back(&e.tree);
    while (!stack.empty()) {
      const TokenTree* t = stack.back();
      stack.pop_back();
      const int64_t node[2] = {t->token, static_cast<int64_t>(t->children.size())};
      h = Fnv1a(node, sizeof node, h);
      for (auto it = t->children.rbegin(); it != t->children.rend(); ++it) stack.push_back(&*it);
    }
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
  return text;
}

// What a checkpoint must share with the run that resumes it: the data, the
// model's sizes, the batching and every optimizer setting, so that resuming
// carries the saved run on rather than starting another from its weights.
nlohmann::json RunShape(const RunOptions& o, const Dataset& d, const std::string& train_fingerprint) {
  const OptimizerOptions& opt = o.optimizer;
  return {{"data", d.name},
          {"train_trees", d.train.size()},
          {"train_data", train_fingerprint},
          {"vocabulary", d.vocabulary},
          {"classes", d.classes},
          {"embed", o.embed},
          {"hidden", o.hidden},
          {"batch", o.batch},
          {"seed", o.seed},
          {"reshuffle", o.reshuffle},
          {"optimizer", opt.kind},
          {"learning_rate", opt.learning_rate},
          {"weight_decay", opt.weight_decay},
          {"clip_norm", opt.clip_norm},
          {"beta1", opt.beta1},
          {"beta2", opt.beta2},
          {"epsilon", opt.epsilon}};
}

}  // namespace

Lookahead BatchLookahead(Entry loss, const std::vector<Batch>& batches, const Value& params, int ahead, bool wraps) {
  auto args_of = [&batches, &params, wraps](size_t step) -> std::optional<std::vector<Value>> {
    if (batches.empty() || (step >= batches.size() && !wraps)) return std::nullopt;
    const Batch& b = batches[step % batches.size()];
    if (b.nodes == 0) return std::nullopt;  // a rank's empty share of a minibatch
    return std::vector<Value>{b.trees, b.labels, params};
  };
  return Lookahead(std::move(loss), args_of, ahead);
}

std::vector<std::vector<const Example*>> MakeBatches(const std::vector<Example>& examples, int size, Rng& rng) {
  if (size < 1) throw std::invalid_argument("minibatch size must be at least 1");
  std::vector<const Example*> sorted;
  for (const Example& e : examples) sorted.push_back(&e);
  // Shuffle, then sort stably by size: trees of equal size end up in random order.
  Shuffle(sorted, rng);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Example* a, const Example* b) { return CountNodes(a->tree) < CountNodes(b->tree); });
  std::vector<std::vector<const Example*>> batches;
  for (size_t i = 0; i < sorted.size(); i += static_cast<size_t>(size)) {
    batches.emplace_back(sorted.begin() + i, sorted.begin() + std::min(sorted.size(), i + size));
  }
  for (size_t i = batches.size(); i > 1; --i) std::swap(batches[i - 1], batches[rng.NextInt(0, static_cast<int64_t>(i))]);
  return batches;
}

// Generated expressions take ~1.3 KB each in memory (measured at 200,000:
// 330 MB), batches and the training state more: a request the machine cannot
// hold fails at once, naming the options, not after minutes of generating.
static void RequireRoomToGenerate(int64_t train, int64_t dev) {
  constexpr int64_t kBytesPerExpression = 2048;
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_bytes <= 0) return;  // unknown: nothing to compare with
  const double need = static_cast<double>(train + dev) * kBytesPerExpression;
  const double have = static_cast<double>(pages) * static_cast<double>(page_bytes);
  if (need > have) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "--listops-train-size %lld and --listops-dev-size %lld: generating them takes about %.1f GB, "
                  "more than this machine's %.1f GB of memory",
                  static_cast<long long>(train), static_cast<long long>(dev), need / 1e9, have / 1e9);
    throw std::runtime_error(text);
  }
}

Dataset LoadDataset(const RunOptions& o) {
  Dataset d;
  if (o.data == "listops") {
    d.vocabulary = listops::kVocabularySize;
    d.classes = listops::kClasses;
    if (o.train_file.empty()) {
      if (!o.dev_file.empty()) throw std::runtime_error("--dev needs --train (without files the data is generated)");
      d.name = "listops (generated)";
      RequireRoomToGenerate(o.listops_train, o.listops_dev);
      listops::Splits s = listops::GenerateSplits(o.seed, o.listops_train, o.listops_dev, 0);
      d.train = std::move(s.train);
      d.dev = std::move(s.dev);
    } else {
      d.name = "listops";
      listops::FileReport r = listops::ReadFile(o.train_file, o.strict);
      d.train = std::move(r.examples);
      AddWarnings(d, r.errors);
      if (!o.dev_file.empty()) {
        r = listops::ReadFile(o.dev_file, o.strict);
        d.dev = std::move(r.examples);
        AddWarnings(d, r.errors);
      }
    }
  } else if (o.data == "sst") {
    if (o.train_file.empty()) throw std::runtime_error("--data sst needs --train FILE (SST bracketed trees)");
    d.name = "sst";
    d.classes = sst::kClasses;
    sst::FileReport train = sst::ReadFile(o.train_file, o.strict);
    AddWarnings(d, train.errors);
    sst::Vocabulary vocabulary = sst::Vocabulary::Build(train.trees, o.sst_min_count);
    d.vocabulary = vocabulary.size();
    for (const sst::Tree& t : train.trees) d.train.push_back(sst::ToExample(t, vocabulary));
    if (!o.dev_file.empty()) {
      sst::FileReport dev = sst::ReadFile(o.dev_file, o.strict);
      AddWarnings(d, dev.errors);
      for (const sst::Tree& t : dev.trees) d.dev.push_back(sst::ToExample(t, vocabulary));
    }
  } else {
    throw std::runtime_error("unknown data set '" + o.data + "' (expected listops or sst)");
  }
  if (d.train.empty()) throw std::runtime_error("no training examples");
  return d;
}

Trainer::Trainer(RunOptions options, Dataset data, EngineOptions engine, dist::Communicator* group)
    : options_(std::move(options)),
      data_(std::move(data)),
      train_fingerprint_(DataFingerprint(data_.train)),
      group_(group && group->distributed() ? group : nullptr),
      engine_(std::make_unique<Engine>(std::move(engine))) {
  engine_->module().AddSource(ModelSource(), "treelstm.pj");
  module_ = engine_->module().snapshot();
  Rng init(options_.seed);
  params_ = InitParams(init, {data_.vocabulary, options_.embed, options_.hidden, data_.classes});
  if (group_) {
    std::vector<Tensor> leaves = ParameterLeaves(params_);
    group_->Broadcast(leaves, 0);
  }
  optimizer_ = Optimizer::Create(options_.optimizer);
  Rng batches(options_.seed ^ kBatchStream);
  batches_ = MakeBatches(data_.train, options_.batch, batches);

  Rng eval(options_.seed ^ kEvalStream);
  dev_batches_ = MakeValues(MakeBatches(data_.dev, options_.batch, eval));
  std::vector<const Example*> sample;
  for (const Example& e : data_.train) sample.push_back(&e);
  Shuffle(sample, eval);
  sample.resize(std::min(sample.size(), static_cast<size_t>(std::max(0, options_.train_sample))));
  std::vector<Example> sampled;
  for (const Example* e : sample) sampled.push_back(*e);
  sample_batches_ = MakeValues(MakeBatches(sampled, options_.batch, eval));
  // Evaluation runs after training steps; its code can compile while the workers are otherwise idle.
  Entry infer = engine_->entry("infer");
  for (const auto* set : {&dev_batches_, &sample_batches_}) {
    for (const Batch& b : *set) infer.prefetch({b.trees, params_});
  }
}

Trainer::~Trainer() = default;

Entry Trainer::loss() const { return engine_->entry("loss").with_grad({2}); }

std::vector<Batch> Trainer::MakeValues(const std::vector<std::vector<const Example*>>& batches) const {
  std::vector<Batch> values;
  for (const auto& b : batches) values.push_back(MakeBatch(b, *module_));
  return values;
}

std::vector<Batch> Trainer::MakeShares(const std::vector<std::vector<const Example*>>& batches) const {
  if (!group_) return MakeValues(batches);
  std::vector<Batch> values;
  for (const auto& b : batches) {
    std::vector<int64_t> nodes;
    for (const Example* e : b) nodes.push_back(CountNodes(e->tree));
    std::vector<int> owner = dist::ShardByCost(nodes, group_->size());
    std::vector<const Example*> mine;
    for (size_t k = 0; k < b.size(); ++k) {
      if (owner[k] == group_->rank()) mine.push_back(b[k]);
    }
    values.push_back(mine.empty() ? Batch{} : MakeBatch(mine, *module_));
  }
  return values;
}

ValueAndGrad Trainer::GlobalStep(const Batch& share, size_t global_trees) {
  ValueAndGrad vg;
  if (share.nodes > 0) vg = loss().value_and_grad({share.trees, share.labels, params_});
  if (!group_) return vg;
  const int64_t mine = share.nodes > 0 ? share.labels.tensor().numel() : 0;
  return dist::SumShares(*group_, mine ? &vg : nullptr, mine, static_cast<int64_t>(global_trees), {params_});
}

EpochResult Trainer::TrainEpoch(const StepCallback& after_step) {
  if (options_.reshuffle && epoch_ > 0) {
    Rng rng(options_.seed ^ (kBatchStream * static_cast<uint64_t>(epoch_ + 1)));
    batches_ = MakeBatches(data_.train, options_.batch, rng);
  }
  std::vector<Batch> values = MakeShares(batches_);
  Entry loss = this->loss();
  EpochResult r;
  r.epoch = epoch_;
  double loss_sum = 0;
  // Reshuffled, the next epoch's minibatches are not known yet.
  Lookahead lookahead = BatchLookahead(loss, values, params_, options_.lookahead, /*wraps=*/!options_.reshuffle);
  auto epoch_start = Clock::now();
  r.started = epoch_start;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto step_start = i == 0 ? epoch_start : Clock::now();  // the epoch starts with its first step
    lookahead.BeforeStep(i);
    double cpu_start = ThreadCpuSeconds();
    const EntryStats before = loss.stats();
    ValueAndGrad vg = GlobalStep(values[i], batches_[i].size());
    const EntryStats after = loss.stats();
    r.compiled_steps += after.calls_compiled() - before.calls_compiled();
    if (r.first_compiled_ms < 0 && after.calls_compiled() > before.calls_compiled()) {
      r.first_compiled_ms = std::chrono::duration<double, std::milli>(step_start - epoch_start).count();
    }
    r.generic_interpreted_steps += after.calls_generic_interpreted() - before.calls_generic_interpreted();
    const double step_loss = vg.value.tensor().item();
    // A diverged step stops the run with the parameters before it (and the
    // last checkpoint as it was), rather than training on NaN.
    auto stop = [&](const std::string& why, const char* state) {
      throw std::runtime_error("epoch " + std::to_string(epoch_) + ", step " + std::to_string(i + 1) + " of " +
                               std::to_string(values.size()) + ": " + why + "; training stops " + state +
                               " and the last checkpoint saved is kept (try a smaller --lr, or --clip)");
    };
    const char* unchanged = "with the parameters before this step";
    if (!std::isfinite(step_loss)) stop("the loss is " + std::to_string(step_loss), unchanged);
    constexpr size_t kBaselineSteps = 8;
    if (first_losses_.size() < kBaselineSteps) {
      first_losses_.push_back(std::abs(step_loss));
    } else if (options_.blowup > 0 && !blowup_warned_) {
      std::vector<double> sorted = first_losses_;
      std::nth_element(sorted.begin(), sorted.begin() + kBaselineSteps / 2, sorted.end());
      const double baseline = std::max(sorted[kBaselineSteps / 2], 1e-30);
      if (std::abs(step_loss) > options_.blowup * baseline) {
        char why[160];
        std::snprintf(why, sizeof why, "the loss is %.4g, %.3gx its first steps' (%.4g): the run is diverging", step_loss,
                      std::abs(step_loss) / baseline, baseline);
        if (options_.stop_on_blowup) stop(why, unchanged);
        blowup_warned_ = true;
        r.warnings.push_back("epoch " + std::to_string(epoch_) + ", step " + std::to_string(i + 1) + ": " + why +
                             " (try a smaller --lr, or --clip; --stop-on-blowup stops a run here)");
      }
    }
    try {
      optimizer_->Step(params_, vg.grads[0]);
    } catch (const std::domain_error& e) {
      stop(e.what(), unchanged);
    } catch (const std::overflow_error& e) {
      stop(e.what(), "(the parameters are no longer usable)");
    }
    r.step_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - step_start).count());
    r.step_cpu_ms.push_back((ThreadCpuSeconds() - cpu_start) * 1e3);
    int64_t trees = static_cast<int64_t>(batches_[i].size());
    r.losses.push_back(step_loss);
    loss_sum += step_loss * static_cast<double>(trees);
    r.trees += trees;
    r.steps += 1;
    r.loss = loss_sum / static_cast<double>(r.trees);
    r.seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    if (after_step) after_step(i + 1, r);
  }
  ++epoch_;
  return r;
}

double Trainer::Accuracy(const std::vector<Batch>& set) const {
  Entry infer = engine_->entry("infer");
  int64_t right = 0, total = 0;
  for (const Batch& b : set) {
    Tensor predicted = infer.call({b.trees, params_}).tensor();
    const int64_t* p = predicted.data<int64_t>();
    const int64_t* y = b.labels.tensor().data<int64_t>();
    for (int64_t i = 0; i < predicted.numel(); ++i) right += p[i] == y[i];
    total += predicted.numel();
  }
  return total ? static_cast<double>(right) / static_cast<double>(total) : 0.0;
}

double Trainer::DevAccuracy() const { return Accuracy(dev_batches_); }
double Trainer::TrainAccuracy() const { return Accuracy(sample_batches_); }

void Trainer::Save(const std::string& path) const {
  Checkpoint c;
  c.epoch = epoch_;
  c.meta = RunShape(options_, data_, train_fingerprint_);
  c.params = ParameterLeaves(params_);
  c.optimizer = optimizer_->state();
  SaveCheckpoint(path, c);
}

void Trainer::Resume(const std::string& path) {
  Checkpoint c = LoadCheckpoint(path);
  nlohmann::json expected = RunShape(options_, data_, train_fingerprint_);
  for (const auto& [key, value] : expected.items()) {
    if (!c.meta.contains(key) || c.meta[key] != value) {
      throw std::runtime_error(path + ": written by a run with " + key + " " +
                               (c.meta.contains(key) ? c.meta[key].dump() : "unset") + ", this run has " +
                               value.dump() + " (resume with the options of the saved run)");
    }
  }
  if (c.epoch < 0) throw std::runtime_error(path + ": negative epoch count");
  try {
    auto optimizer = Optimizer::Create(options_.optimizer);
    optimizer->set_state(std::move(c.optimizer));
    RestoreParameters(params_, c.params);
    optimizer_ = std::move(optimizer);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(path + ": " + e.what());
  }
  if (group_) {  // every rank read the same file; rank 0's parameters are the run's
    std::vector<Tensor> leaves = ParameterLeaves(params_);
    group_->Broadcast(leaves, 0);
  }
  // With reshuffle, TrainEpoch draws epoch e's minibatches from epoch e's
  // stream: the epoch count is all the batching state there is.
  epoch_ = static_cast<int>(c.epoch);
}

}  // namespace pejit::treelstm
