#include "examples/mlp/trainer.h"

#include <chrono>
#include <numeric>
#include <stdexcept>

namespace pejit::mlp {
namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

const std::vector<int> kWrtParams = {2};  // `loss`'s third argument, the parameter tuple

}  // namespace

TierCounts TierCounts::Between(const EntryStats& before, const EntryStats& after) {
  return {after.calls_interpreter - before.calls_interpreter,
          after.calls_residual_interpreter - before.calls_residual_interpreter,
          after.calls_native - before.calls_native};
}

double TierCounts::compiled_share() const {
  return total() ? static_cast<double>(native) / static_cast<double>(total()) : 0.0;
}

TierCounts& TierCounts::operator+=(const TierCounts& o) {
  interpreter += o.interpreter;
  residual_interpreter += o.residual_interpreter;
  native += o.native;
  return *this;
}

Trainer::Trainer(RunOptions options, Split train, Split test, EngineOptions engine, dist::Communicator* group)
    : options_(std::move(options)), train_(std::move(train)), rng_(options_.seed) {
  if (group && group->distributed()) group_ = group;
  if (options_.batch < 1) throw std::invalid_argument("batch size " + std::to_string(options_.batch) + " < 1");
  if (train_.size() == 0) throw std::invalid_argument("no training images");
  engine_ = std::make_unique<Engine>(std::move(engine));
  engine_->module().AddSource(ModelSource(), "mlp.pj");
  params_ = InitParams(rng_);
  if (group_) {
    std::vector<Tensor> leaves = ParameterLeaves(params_);
    group_->Broadcast(leaves, 0);
  }
  optimizer_ = Optimizer::Create(options_.optimizer);
  std::vector<int64_t> in_order(static_cast<size_t>(test.size()));
  std::iota(in_order.begin(), in_order.end(), 0);
  for (size_t i = 0; i < in_order.size(); i += static_cast<size_t>(options_.batch)) {
    test_batches_.push_back(
        MakeBatch(test, in_order, i, std::min(in_order.size() - i, static_cast<size_t>(options_.batch))));
  }
}

Trainer::~Trainer() = default;

Entry Trainer::loss() const { return engine_->entry("loss").with_grad(kWrtParams); }
Entry Trainer::infer() const { return engine_->entry("infer"); }

size_t Trainer::steps_per_epoch() const {
  return (static_cast<size_t>(train_.size()) + options_.batch - 1) / static_cast<size_t>(options_.batch);
}

EpochResult Trainer::TrainEpoch(const StepCallback& after_step) {
  Entry loss = this->loss(), infer = this->infer();
  std::vector<int64_t> order(static_cast<size_t>(train_.size()));
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng_.NextInt(0, static_cast<int64_t>(i))]);

  EpochResult r;
  r.epoch = epoch_++;
  const EntryStats stats_before = loss.stats();
  const auto start = Clock::now();
  double loss_sum = 0;
  const size_t batch = static_cast<size_t>(options_.batch), steps = steps_per_epoch();
  for (size_t step = 0; step < steps; ++step) {
    const size_t first = step * batch, global = std::min(batch, order.size() - first);
    // This rank's contiguous share of the minibatch's images (all of them alone).
    const int ranks = group_ ? group_->size() : 1, rank = group_ ? group_->rank() : 0;
    const size_t lo = global * static_cast<size_t>(rank) / static_cast<size_t>(ranks);
    const size_t hi = global * static_cast<size_t>(rank + 1) / static_cast<size_t>(ranks);
    Batch b;
    if (hi > lo) b = MakeBatch(train_, order, first + lo, hi - lo);
    ValueAndGrad vg;
    if (hi > lo) vg = loss.value_and_grad({b.images, b.labels, params_});
    if (group_) {
      vg = dist::SumShares(*group_, hi > lo ? &vg : nullptr, static_cast<int64_t>(hi - lo),
                           static_cast<int64_t>(global), {params_});
    }
    optimizer_->Step(params_, vg.grads[0]);
    if (step == 0 && r.epoch == 0) {
      // The other signatures of the run, queued behind this one's: the
      // epoch's smaller last minibatch, and inference on the test split.
      size_t last = order.size() - (steps - 1) * batch;
      if (last != batch) {
        Batch odd = MakeBatch(train_, order, 0, last);
        loss.prefetch({odd.images, odd.labels, params_});
      }
      if (!test_batches_.empty()) infer.prefetch({test_batches_.front().images, params_});
      if (test_batches_.size() > 1) infer.prefetch({test_batches_.back().images, params_});
    }
    double value = vg.value.tensor().item();
    r.losses.push_back(value);
    loss_sum += value * static_cast<double>(global);
    r.images += static_cast<int64_t>(global);
    r.steps += 1;
    r.loss = loss_sum / static_cast<double>(r.images);
    r.seconds = Seconds(start);
    r.tiers = TierCounts::Between(stats_before, loss.stats());
    if (after_step) after_step(step + 1, r);
  }
  return r;
}

EvalResult Trainer::Evaluate() const {
  Entry infer = this->infer();
  EvalResult r;
  const EntryStats stats_before = infer.stats();
  const auto start = Clock::now();
  int64_t right = 0;
  for (const Batch& b : test_batches_) {
    Tensor predicted = infer.call({b.images, params_}).tensor();
    const int64_t* p = predicted.data<int64_t>();
    const int64_t* y = b.labels.tensor().data<int64_t>();
    for (int64_t i = 0; i < predicted.numel(); ++i) right += p[i] == y[i];
    r.images += predicted.numel();
  }
  r.seconds = Seconds(start);
  r.tiers = TierCounts::Between(stats_before, infer.stats());
  r.accuracy = r.images ? static_cast<double>(right) / static_cast<double>(r.images) : 0.0;
  return r;
}

}  // namespace pejit::mlp
