#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "ops/defs/defs.h"
#include "ops/op.h"
#include "support/spelling.h"

namespace pejit {

class Registry {
 public:
  Registry() {
    RegisterElementwiseOps(*this);
    RegisterGemmOps(*this);
    RegisterShapeOps(*this);
    RegisterReduceOps(*this);
    RegisterNnOps(*this);
  }
  std::map<std::string, OpDef, std::less<>> ops;
};

namespace {

const Registry& Global() {
  static const Registry registry;
  return registry;
}

}  // namespace

OpDef& AddOp(Registry& registry, OpDef op) {
  std::string name = op.name;
  if (!op.infer || !op.kernel) throw std::logic_error("op " + name + " needs a type rule and a kernel");
  bool elementwise = op.fusion == FusionKind::kElementwise || op.fusion == FusionKind::kBroadcast;
  if (op.batch == BatchRule::kNone && elementwise && op.scalar != ScalarOp::kNone) op.batch = BatchRule::kElementwise;
  auto [it, inserted] = registry.ops.emplace(name, std::move(op));
  if (!inserted) throw std::logic_error("op " + name + " registered twice");
  return it->second;
}

KernelSplit RowWiseSplit(Kernel kernel, std::function<bool(std::span<const TensorType>, const Attrs&)> applies) {
  KernelSplit split;
  split.max_parts = [applies](std::span<const TensorType> in, std::span<const TensorType> out, const Attrs& attrs) -> int64_t {
    if (in.empty() || out.empty() || in[0].rank() == 0 || !applies(in, attrs)) return 1;
    const int64_t rows = in[0].shape[0];
    for (const auto* side : {&in, &out}) {
      for (const TensorType& t : *side) {
        if (t.rank() == 0 || t.shape[0] != rows) return 1;
      }
    }
    return std::max<int64_t>(1, rows);
  };
  split.kernel = [kernel](std::span<const Tensor> in, std::span<Tensor> out, const Attrs& attrs, int64_t part,
                          int64_t parts) {
    const auto range = PartOf(in[0].shape()[0], 1, part, parts);  // not bound: clang 14 captures no bindings
    const int64_t first = range.first, last = range.second;
    if (first == last) return;
    auto rows = [&](const Tensor& t) {
      Shape shape = t.shape();
      const int64_t row_bytes = t.nbytes() / shape[0];
      shape[0] = last - first;
      return Tensor::Wrap(static_cast<char*>(const_cast<void*>(t.raw_data())) + first * row_bytes, t.dtype(),
                          std::move(shape), nullptr);
    };
    std::vector<Tensor> ins, outs;
    for (const Tensor& t : in) ins.push_back(rows(t));
    for (const Tensor& t : out) outs.push_back(rows(t));
    kernel(ins, outs, attrs);
  };
  return split;
}

const OpDef* FindOp(std::string_view name) {
  const auto& ops = Global().ops;
  auto it = ops.find(name);
  return it == ops.end() ? nullptr : &it->second;
}

const OpDef& LookupOp(std::string_view name) {
  if (const OpDef* op = FindOp(name)) return *op;
  std::vector<std::string> names;
  for (const auto& [n, _] : Global().ops) names.push_back(n);
  throw OpError(name, "unknown operator '" + std::string(name) + "'" + DidYouMean(name, names));
}

std::vector<const OpDef*> AllOps() {
  std::vector<const OpDef*> all;
  for (const auto& [_, op] : Global().ops) all.push_back(&op);
  return all;
}

Attrs NormalizeAttrs(const OpDef& op, const Attrs& attrs) {
  Attrs out;
  std::vector<std::string> known;
  for (const auto& spec : op.attrs) known.push_back(spec.name);
  for (const auto& [name, value] : attrs.items()) {
    auto spec = std::find_if(op.attrs.begin(), op.attrs.end(), [&name = name](const auto& s) { return s.name == name; });
    if (spec == op.attrs.end()) {
      throw OpError(op.name, "unknown attribute '" + name + "'" + DidYouMean(name, known));
    }
    AttrValue v = value;
    if (spec->kind == AttrKind::kFloat && KindOf(v) == AttrKind::kInt) {
      v = static_cast<double>(std::get<int64_t>(v));
    }
    if (KindOf(v) != spec->kind) {
      throw OpError(op.name, "attribute '" + name + "' must be " + std::string(AttrKindName(spec->kind)) +
                                 ", got " + std::string(AttrKindName(KindOf(v))) + " " +
                                 AttrValueToString(v));
    }
    out.Set(name, std::move(v));
  }
  for (const auto& spec : op.attrs) {
    if (out.Find(spec.name)) continue;
    if (!spec.default_value) throw OpError(op.name, "missing attribute '" + spec.name + "'");
    out.Set(spec.name, *spec.default_value);
  }
  return out;
}

std::vector<TensorType> InferTypes(const OpDef& op, std::span<const TensorType> inputs,
                                   const Attrs& normalized_attrs) {
  if (op.variadic()) {
    if (inputs.empty()) throw OpError(op.name, "needs at least one input");
  } else if (inputs.size() != op.input_names.size()) {
    throw OpError(op.name, "takes " + std::to_string(op.input_names.size()) + " input" +
                               (op.input_names.size() == 1 ? "" : "s") + ", got " +
                               std::to_string(inputs.size()));
  }
  std::vector<TensorType> out;
  try {
    out = op.infer(inputs, normalized_attrs);
  } catch (const std::invalid_argument& e) {  // a shape too large (NumElements): the op's error
    throw OpError(op.name, e.what());
  }
  // Every result must fit in memory's arithmetic: a product of dimensions
  // that wraps would pass for a small tensor (broadcast_to, reshape, one_hot
  // attributes; issue 24).
  for (const TensorType& t : out) {
    if (!t.IsFullyKnown()) continue;
    try {
      NumBytes(t);
    } catch (const std::invalid_argument& e) {
      throw OpError(op.name, std::string("the result: ") + e.what());
    }
  }
  return out;
}

GradValue GradBuilder::Emit(std::string_view name, std::initializer_list<GradValue> inputs,
                            const Attrs& attrs) {
  const OpDef& op = LookupOp(name);
  auto outputs = EmitOp(op, std::span<const GradValue>(inputs.begin(), inputs.size()),
                        NormalizeAttrs(op, attrs));
  if (outputs.size() != 1) throw std::logic_error("GradBuilder::Emit of multi-output op " + op.name);
  return outputs[0];
}

GradValue GradBuilder::Zeros(const TensorType& type) {
  return BroadcastTo(ScalarConstant(0, type.dtype), type.shape);
}

GradValue GradBuilder::SumTo(GradValue grad, const Shape& shape) {
  if (TypeOf(grad).shape == shape) return grad;
  return Emit("sum_to", {grad}, {{"shape", shape}});
}

GradValue GradBuilder::BroadcastTo(GradValue value, const Shape& shape) {
  if (TypeOf(value).shape == shape) return value;
  return Emit("broadcast_to", {value}, {{"shape", shape}});
}

}  // namespace pejit
