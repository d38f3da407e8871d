#include "train/optimizer.h"

#include <cmath>
#include <stdexcept>

namespace pejit {
namespace {

void Leaves(const Value& v, std::vector<Tensor>& out) {
  if (v.is_tensor()) {
    if (v.tensor().dtype() == DType::kF32) out.push_back(v.tensor());
  } else if (v.kind() == Value::Kind::kTuple || v.kind() == Value::Kind::kAdt) {
    for (const Value& f : v.fields()) Leaves(f, out);
  }
}

class Sgd final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void Update(size_t, float* p, const float* g, int64_t n) override {
    const float lr = static_cast<float>(options_.learning_rate);
    for (int64_t j = 0; j < n; ++j) p[j] -= lr * g[j];
  }
};

class Adagrad final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void Update(size_t i, float* p, const float* g, int64_t n) override {
    if (sum_.size() <= i) sum_.resize(i + 1);
    if (sum_[i].empty()) sum_[i].assign(n, 0.0f);
    const float lr = static_cast<float>(options_.learning_rate), eps = static_cast<float>(options_.epsilon);
    float* s = sum_[i].data();
    for (int64_t j = 0; j < n; ++j) {
      s[j] += g[j] * g[j];
      p[j] -= lr * g[j] / (std::sqrt(s[j]) + eps);
    }
  }

 private:
  std::vector<std::vector<float>> sum_;
};

class Adam final : public Optimizer {
 public:
  using Optimizer::Optimizer;
  void Update(size_t i, float* p, const float* g, int64_t n) override {
    if (m_.size() <= i) {
      m_.resize(i + 1);
      v_.resize(i + 1);
    }
    if (m_[i].empty()) {
      m_[i].assign(n, 0.0f);
      v_[i].assign(n, 0.0f);
    }
    const double t = static_cast<double>(steps_);
    const float b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
    const float lr = static_cast<float>(options_.learning_rate * std::sqrt(1 - std::pow(options_.beta2, t)) /
                                        (1 - std::pow(options_.beta1, t)));
    const float eps = static_cast<float>(options_.epsilon);
    for (int64_t j = 0; j < n; ++j) {
      m_[i][j] = b1 * m_[i][j] + (1 - b1) * g[j];
      v_[i][j] = b2 * v_[i][j] + (1 - b2) * g[j] * g[j];
      p[j] -= lr * m_[i][j] / (std::sqrt(v_[i][j]) + eps);
    }
  }

 private:
  std::vector<std::vector<float>> m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> Optimizer::Create(const OptimizerOptions& options) {
  if (options.kind == "sgd") return std::unique_ptr<Optimizer>(new Sgd(options));
  if (options.kind == "adagrad") return std::unique_ptr<Optimizer>(new Adagrad(options));
  if (options.kind == "adam") return std::unique_ptr<Optimizer>(new Adam(options));
  throw std::invalid_argument("unknown optimizer '" + options.kind + "' (expected adagrad, sgd or adam)");
}

double Optimizer::Step(const Value& params, const Value& grads) {
  std::vector<Tensor> p, g;
  Leaves(params, p);
  Leaves(grads, g);
  if (p.size() != g.size()) throw std::invalid_argument("gradients do not have the parameters' structure");
  ++steps_;
  double norm2 = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].shape() != p[i].shape()) throw std::invalid_argument("gradient " + std::to_string(i) + " has another shape");
    const float* d = g[i].data<float>();
    for (int64_t j = 0; j < g[i].numel(); ++j) norm2 += static_cast<double>(d[j]) * d[j];
  }
  double norm = std::sqrt(norm2);
  float scale = options_.clip_norm > 0 && norm > options_.clip_norm ? static_cast<float>(options_.clip_norm / norm) : 1.0f;
  std::vector<float> adjusted;
  for (size_t i = 0; i < p.size(); ++i) {
    const float* d = g[i].data<float>();
    float* w = p[i].data<float>();
    int64_t n = p[i].numel();
    adjusted.resize(n);
    const float decay = static_cast<float>(options_.weight_decay);
    for (int64_t j = 0; j < n; ++j) adjusted[j] = scale * d[j] + decay * w[j];
    Update(i, w, adjusted.data(), n);
  }
  return norm;
}

}  // namespace pejit
