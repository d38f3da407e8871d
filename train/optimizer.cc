#include "train/optimizer.h"

#include <cmath>
#include <iterator>
#include <string>
#include <stdexcept>

#include "train/finite.h"

namespace pejit {
namespace {

// One buffer per parameter: zeros on the first step, or restored ones that
// must fit the parameters.
void PrepareBuffers(std::vector<std::vector<float>>& buffers, const std::vector<int64_t>& sizes, const char* what) {
  if (buffers.empty()) {
    for (int64_t n : sizes) buffers.emplace_back(static_cast<size_t>(n), 0.0f);
    return;
  }
  if (buffers.size() != sizes.size()) {
    throw std::invalid_argument(std::string("optimizer state: ") + std::to_string(buffers.size()) + " " + what +
                                " buffers for " + std::to_string(sizes.size()) + " parameters");
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (static_cast<int64_t>(buffers[i].size()) != sizes[i]) {
      throw std::invalid_argument(std::string("optimizer state: ") + what + " buffer " + std::to_string(i) + " has " +
                                  std::to_string(buffers[i].size()) + " values, its parameter " +
                                  std::to_string(sizes[i]));
    }
  }
}

class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void Prepare(const std::vector<int64_t>&) override {}
  void Update(size_t, float* p, const float* g, int64_t n) override {
    const float lr = static_cast<float>(options_.learning_rate);
    for (int64_t j = 0; j < n; ++j) p[j] -= lr * g[j];
  }
  std::vector<std::vector<float>> buffers() const override { return {}; }
  void set_buffers(std::vector<std::vector<float>> b) override {
    if (!b.empty()) throw std::invalid_argument("optimizer state: sgd keeps no buffers");
  }
};

class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void Prepare(const std::vector<int64_t>& sizes) override { PrepareBuffers(sum_, sizes, "adagrad"); }
  std::vector<std::vector<float>> buffers() const override { return sum_; }
  void set_buffers(std::vector<std::vector<float>> b) override { sum_ = std::move(b); }
  void Update(size_t i, float* p, const float* g, int64_t n) override {
    const float lr = static_cast<float>(options_.learning_rate), eps = static_cast<float>(options_.epsilon);
    float* __restrict s = sum_[i].data();
    float* __restrict out = p;
    const float* __restrict grad = g;
    for (int64_t j = 0; j < n; ++j) {
      s[j] += grad[j] * grad[j];
      out[j] -= lr * grad[j] / (std::sqrt(s[j]) + eps);
    }
  }

 private:
  std::vector<std::vector<float>> sum_;
};

class Adam final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void Prepare(const std::vector<int64_t>& sizes) override {
    PrepareBuffers(m_, sizes, "adam first-moment");
    PrepareBuffers(v_, sizes, "adam second-moment");
  }
  // The first moments, then the second.
  std::vector<std::vector<float>> buffers() const override {
    std::vector<std::vector<float>> b = m_;
    b.insert(b.end(), v_.begin(), v_.end());
    return b;
  }
  void set_buffers(std::vector<std::vector<float>> b) override {
    if (b.size() % 2) throw std::invalid_argument("optimizer state: adam needs as many second moments as first");
    size_t half = b.size() / 2;
    m_.assign(std::make_move_iterator(b.begin()), std::make_move_iterator(b.begin() + half));
    v_.assign(std::make_move_iterator(b.begin() + half), std::make_move_iterator(b.end()));
  }
  void Update(size_t i, float* p, const float* g, int64_t n) override {
    const double t = static_cast<double>(steps_);
    const float b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
    const float lr = static_cast<float>(options_.learning_rate * std::sqrt(1 - std::pow(options_.beta2, t)) /
                                        (1 - std::pow(options_.beta1, t)));
    const float eps = static_cast<float>(options_.epsilon);
    float* __restrict m = m_[i].data();
    float* __restrict v = v_[i].data();
    float* __restrict out = p;
    const float* __restrict grad = g;
    for (int64_t j = 0; j < n; ++j) {
      m[j] = b1 * m[j] + (1 - b1) * grad[j];
      v[j] = b2 * v[j] + (1 - b2) * grad[j] * grad[j];
      out[j] -= lr * m[j] / (std::sqrt(v[j]) + eps);
    }
  }

 private:
  std::vector<std::vector<float>> m_, v_;
};

// A gradient that is NaN or infinite somewhere (its square sum overflowed,
// or a value is): say which, before anything is updated.
[[noreturn]] void ThrowNonFinite(const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const float* d = grads[i].data<float>();
    if (int64_t j = FirstNonFinite(d, grads[i].numel()); j >= 0) {
      throw std::domain_error("gradient " + std::to_string(i) + " holds " + std::to_string(d[j]) + " at index " +
                              std::to_string(j) + "; the step is not taken");
    }
  }
  throw std::domain_error("the gradients' global norm overflows; the step is not taken");
}

}  // namespace

std::vector<Tensor> ParameterLeaves(const Value& params) {
  std::vector<Tensor> out = TensorLeaves(params);
  std::erase_if(out, [](const Tensor& t) { return t.dtype() != DType::kF32; });
  return out;
}

std::unique_ptr<Optimizer> Optimizer::Create(const OptimizerOptions& options) {
  // A negative rate ascends, a negative decay or clip inverts what it means:
  // settings that would train wrongly without a word are refused.
  auto require = [](bool ok, const char* name, double value, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("OptimizerOptions::") + name + " is " + std::to_string(value) + "; " + what);
  };
  require(std::isfinite(options.learning_rate) && options.learning_rate > 0, "learning_rate", options.learning_rate,
          "it must be a positive number");
  require(std::isfinite(options.weight_decay) && options.weight_decay >= 0, "weight_decay", options.weight_decay,
          "it must be 0 or more");
  require(std::isfinite(options.clip_norm) && options.clip_norm >= 0, "clip_norm", options.clip_norm,
          "it must be 0 (off) or more");
  require(options.beta1 >= 0 && options.beta1 < 1, "beta1", options.beta1, "it must be in [0, 1)");
  require(options.beta2 >= 0 && options.beta2 < 1, "beta2", options.beta2, "it must be in [0, 1)");
  require(std::isfinite(options.epsilon) && options.epsilon > 0, "epsilon", options.epsilon, "it must be a positive number");
  if (options.kind == "sgd") return std::unique_ptr<Optimizer>(new Sgd(options));
  if (options.kind == "adagrad") return std::unique_ptr<Optimizer>(new Adagrad(options));
  if (options.kind == "adam") return std::unique_ptr<Optimizer>(new Adam(options));
  throw std::invalid_argument("unknown optimizer '" + options.kind + "' (expected adagrad, sgd or adam)");
}

double Optimizer::Step(const Value& params, const Value& grads) {
  std::vector<Tensor> p = ParameterLeaves(params), g = ParameterLeaves(grads);
  if (p.size() != g.size()) throw std::invalid_argument("gradients do not have the parameters' structure");
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].shape() != p[i].shape()) throw std::invalid_argument("gradient " + std::to_string(i) + " has another shape");
    sizes.push_back(p[i].numel());
  }
  // Eight partial sums: one would chain every addition on the last (a
  // latency-bound loop that cost the MLP's step about a fifth of its time).
  double partial[8] = {};
  for (const Tensor& t : g) {
    const float* d = t.data<float>();
    const int64_t n = t.numel();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      for (int k = 0; k < 8; ++k) partial[k] += static_cast<double>(d[j + k]) * d[j + k];
    }
    for (; j < n; ++j) partial[0] += static_cast<double>(d[j]) * d[j];
  }
  double norm2 = 0;
  for (double s : partial) norm2 += s;
  double norm = std::sqrt(norm2);
  if (!std::isfinite(norm)) ThrowNonFinite(g);
  Prepare(sizes);
  ++steps_;
  float scale = options_.clip_norm > 0 && norm > options_.clip_norm ? static_cast<float>(options_.clip_norm / norm) : 1.0f;
  const float decay = static_cast<float>(options_.weight_decay);
  std::vector<float> adjusted;
  int64_t overflowed = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    const float* d = g[i].data<float>();
    float* w = p[i].data<float>();
    int64_t n = p[i].numel();
    if (scale == 1.0f && decay == 0.0f) {  // the gradient as it is: no copy
      Update(i, w, d, n);
    } else {
      adjusted.resize(n);
      for (int64_t j = 0; j < n; ++j) adjusted[j] = scale * d[j] + decay * w[j];
      Update(i, w, adjusted.data(), n);
    }
    // Finite gradients can still overflow a parameter (a rate far too large).
    if (overflowed < 0 && !AllFinite(w, n)) overflowed = static_cast<int64_t>(i);
  }
  if (overflowed >= 0) {
    throw std::overflow_error("the update made parameter " + std::to_string(overflowed) +
                              " NaN or infinite (the learning rate is too large for these gradients)");
  }
  return norm;
}

OptimizerState Optimizer::state() const { return {options_.kind, steps_, buffers()}; }

void Optimizer::set_state(OptimizerState state) {
  if (state.kind != options_.kind) {
    throw std::invalid_argument("optimizer state of " + state.kind + " given to " + options_.kind);
  }
  if (state.steps < 0) throw std::invalid_argument("optimizer state: negative step count");
  set_buffers(std::move(state.buffers));
  steps_ = state.steps;
}

}  // namespace pejit
