#include "examples/growing/growing.h"

#include <stdexcept>

#include "ir/module.h"

namespace pejit {
extern const char kGrowingSource[];  // growing_source.cc, generated from growing.pj
}

namespace pejit::growing {
namespace {

constexpr char kBranch1[] = R"(
# A branch beside the linear head: one ReLU layer on the trunk's features.
def @branch1(%h: Tensor[(?, ?), f32], %w: Tensor[(?, ?), f32], %b: Tensor[(?,), f32]) -> Tensor[(?, ?), f32] {
  relu(dense(%h, %w, %b))
}
)";

constexpr char kGrownHead[] = R"(
# The linear head plus the branch's own classifier: Dense(w, b), then the
# branch's layer, then its output layer.
def @head(%h: Tensor[(?, ?), f32], %p: Layers) -> Tensor[(?, ?), f32] {
  match (%p) {
    Dense(%w, %b, Dense(%w1, %b1, Dense(%v, %c, _))) => add(dense(%h, %w, %b), dense(@branch1(%h, %w1, %b1), %v, %c)),
  }
}
)";

constexpr char kBranch2[] = R"(
# The branch one layer deeper: two ReLU layers.
def @branch2(%h: Tensor[(?, ?), f32], %w1: Tensor[(?, ?), f32], %b1: Tensor[(?,), f32],
             %w2: Tensor[(?, ?), f32], %b2: Tensor[(?,), f32]) -> Tensor[(?, ?), f32] {
  relu(dense(relu(dense(%h, %w1, %b1)), %w2, %b2))
}
)";

constexpr char kDeepHead[] = R"(
def @head(%h: Tensor[(?, ?), f32], %p: Layers) -> Tensor[(?, ?), f32] {
  match (%p) {
    Dense(%w, %b, Dense(%w1, %b1, Dense(%w2, %b2, Dense(%v, %c, _)))) =>
      add(dense(%h, %w, %b), dense(@branch2(%h, %w1, %b1, %w2, %b2), %v, %c)),
  }
}
)";

// A head whose result is a vector: it type-checks alone, but @loss and
// @infer need a matrix of scores.
constexpr char kHeadBreakingCallers[] = R"(
def @head(%h: Tensor[(?, ?), f32], %p: Layers) -> Tensor[(?,), f32] {
  match (%p) { Dense(%w, %b, _) => sum(dense(%h, %w, %b), axes=[1]) }
}
)";

// A head that does not type-check: it adds the parameter list to a tensor.
constexpr char kHeadIllTyped[] = R"(
def @head(%h: Tensor[(?, ?), f32], %p: Layers) -> Tensor[(?, ?), f32] {
  match (%p) { Dense(%w, %b, _) => add(dense(%h, %w, %b), %p) }
}
)";

Value Dense(TypeDefPtr layers, Tensor w, Tensor b, Value rest) {
  return Value::Adt(std::move(layers), 1, {Value(std::move(w)), Value(std::move(b)), std::move(rest)});
}

Value End(TypeDefPtr layers) { return Value::Adt(std::move(layers), 0, {}); }

// The (w, b) tensors of a Layers value, in order.
std::vector<std::pair<Tensor, Tensor>> LayersOf(const Value& head) {
  std::vector<std::pair<Tensor, Tensor>> out;
  for (const Value* v = &head; v->tag() == 1; v = &v->fields()[2]) {
    out.emplace_back(v->fields()[0].tensor(), v->fields()[1].tensor());
  }
  return out;
}

Value FromLayers(TypeDefPtr layers, const std::vector<std::pair<Tensor, Tensor>>& list) {
  Value v = End(layers);
  for (auto it = list.rbegin(); it != list.rend(); ++it) v = Dense(layers, it->first, it->second, v);
  return v;
}

}  // namespace

std::string_view ModelSource() { return kGrowingSource; }
std::string_view Branch1Source() { return kBranch1; }
std::string_view GrownHeadSource() { return kGrownHead; }
std::string_view Branch2Source() { return kBranch2; }
std::string_view DeepHeadSource() { return kDeepHead; }

mlp::Split SyntheticSplit(Rng& rng, int64_t n, double separation, double noise, uint64_t prototypes_seed) {
  Rng proto_rng(prototypes_seed);
  Tensor base = RandomUniform(proto_rng, {mlp::kPixels}, 0.25, 0.75);
  Tensor patterns = RandomUniform(proto_rng, {mlp::kClasses, mlp::kPixels}, -separation, separation);
  Tensor labels = RandomInt(rng, {n}, 0, mlp::kClasses);
  Tensor jitter = RandomUniform(rng, {n, mlp::kPixels}, -noise / 2, noise / 2);
  Tensor images = Tensor::Empty(DType::kF32, {n, mlp::kPixels});
  const float* b = base.data<float>();
  const float* p = patterns.data<float>();
  const float* j = jitter.data<float>();
  float* out = images.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* pattern = p + labels.data<int64_t>()[i] * mlp::kPixels;
    for (int64_t k = 0; k < mlp::kPixels; ++k) {
      float v = b[k] + pattern[k] + j[i * mlp::kPixels + k];
      out[i * mlp::kPixels + k] = v < 0 ? 0 : v > 1 ? 1 : v;
    }
  }
  return {images, labels};
}

GrowingModel::GrowingModel(Engine& engine, Sizes sizes, uint64_t seed)
    : engine_(engine),
      sizes_(sizes),
      rng_(seed),
      loss_((engine.module().AddSource(ModelSource(), "growing.pj"), engine.entry("loss").with_grad(LossWrt()))),
      infer_(engine.entry("infer")),
      activity_(engine.entry("activity")) {
  const int64_t h = sizes_.hidden;
  trunk_ = Value::Tuple({Value(XavierUniform(rng_, {h, mlp::kPixels})), Value(Tensor::Zeros(DType::kF32, {h}))});
  TypeDefPtr layers = engine_.module().snapshot()->FindType("Layers");
  head_ = FromLayers(layers, {{XavierUniform(rng_, {mlp::kClasses, h}), Tensor::Zeros(DType::kF32, {mlp::kClasses})}});
}

ChangeReport GrowingModel::Next() {
  switch (stage_) {
    case 0: return Grow();
    case 1: return Deepen();
    case 2: return Prune();
    default: throw std::logic_error("the schedule has three changes; all of them ran");
  }
}

ChangeReport GrowingModel::Grow() {
  if (stage_ != 0) throw std::logic_error("Grow is the first change");
  ChangeReport r{"grow", {}, engine_.module().snapshot()->generation(), 0};
  engine_.module().AddSource(kBranch1, "branch1.pj");
  r.edits.push_back("add @branch1");
  // The branch's layer, then its classifier at zero: the grown head
  // computes what the linear one did until training moves it.
  const int64_t h = sizes_.hidden, k = sizes_.branch;
  auto list = LayersOf(head_);
  list.push_back({XavierUniform(rng_, {k, h}), Tensor::Zeros(DType::kF32, {k})});
  list.push_back({Tensor::Zeros(DType::kF32, {mlp::kClasses, k}), Tensor::Zeros(DType::kF32, {mlp::kClasses})});
  Value grown = FromLayers(engine_.module().snapshot()->FindType("Layers"), list);
  engine_.module().AddSource(kGrownHead, "head.pj", /*replace_existing=*/true);
  head_ = grown;
  r.edits.push_back("replace @head");
  r.generation_after = engine_.module().snapshot()->generation();
  stage_ = 1;
  return r;
}

ChangeReport GrowingModel::Deepen() {
  if (stage_ != 1) throw std::logic_error("Deepen follows Grow");
  ChangeReport r{"deepen", {}, engine_.module().snapshot()->generation(), 0};
  engine_.module().AddSource(kBranch2, "branch2.pj");
  r.edits.push_back("add @branch2");
  auto list = LayersOf(head_);  // (w, b), (w1, b1), (v, c)
  const int64_t k = sizes_.branch;
  Tensor eye = Tensor::Zeros(DType::kF32, {k, k});
  for (int64_t i = 0; i < k; ++i) eye.data<float>()[i * k + i] = 1;
  list.insert(list.begin() + 2, {eye, Tensor::Zeros(DType::kF32, {k})});
  Value deep = FromLayers(engine_.module().snapshot()->FindType("Layers"), list);
  engine_.module().AddSource(kDeepHead, "head.pj", /*replace_existing=*/true);
  head_ = deep;
  r.edits.push_back("replace @head");
  r.generation_after = engine_.module().snapshot()->generation();
  stage_ = 2;
  return r;
}

ChangeReport GrowingModel::Prune() {
  if (stage_ != 2) throw std::logic_error("Prune follows Deepen");
  ChangeReport r{"prune", {}, engine_.module().snapshot()->generation(), 0};
  engine_.module().Remove("branch1");
  r.edits.push_back("remove @branch1");
  r.generation_after = engine_.module().snapshot()->generation();
  stage_ = 3;
  return r;
}

std::vector<std::string> GrowingModel::BadEdits() {
  std::vector<std::string> errors;
  auto expect_rejected = [&](const char* what, const std::function<void()>& edit) {
    try {
      edit();
    } catch (const IrError& e) {
      errors.push_back(e.what());
      return;
    }
    throw std::logic_error(std::string("the module accepted ") + what);
  };
  expect_rejected("a @head whose result breaks @loss and @infer",
                  [&] { engine_.module().AddSource(kHeadBreakingCallers, "bad_head.pj", true); });
  expect_rejected("a @head that does not type-check",
                  [&] { engine_.module().AddSource(kHeadIllTyped, "ill_typed_head.pj", true); });
  expect_rejected("removing @trunk", [&] { engine_.module().Remove("trunk"); });
  return errors;
}

}  // namespace pejit::growing
