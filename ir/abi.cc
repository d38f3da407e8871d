#include "ir/abi.h"

#include <stdexcept>
#include <string>

namespace pejit {

namespace {

bool IsStatic(const std::vector<bool>& static_args, size_t i) { return i < static_args.size() && static_args[i]; }

}  // namespace

std::vector<Tensor> Flatten(const std::vector<Value>& args, const std::vector<bool>& static_args,
                            std::vector<size_t>* first) {
  std::vector<Tensor> leaves;
  if (first) first->assign(args.size(), 0);
  for (size_t i = 0; i < args.size(); ++i) {
    if (first) (*first)[i] = leaves.size();
    if (!IsStatic(static_args, i)) AppendTensorLeaves(args[i], leaves);
  }
  return leaves;
}

std::vector<int> FloatWrtLeaves(std::span<const Tensor> leaves, std::span<const size_t> first,
                                std::span<const int> wrt) {
  std::vector<bool> wanted(first.size(), false);
  for (int i : wrt) {
    if (i < 0 || static_cast<size_t>(i) >= first.size()) {
      throw std::invalid_argument("gradient with respect to argument " + std::to_string(i) +
                                  ": there is no such argument (the call has " + std::to_string(first.size()) + ")");
    }
    wanted[i] = true;
  }
  std::vector<int> out;
  for (size_t i = 0; i < first.size(); ++i) {
    if (!wanted[i]) continue;
    size_t end = i + 1 < first.size() ? first[i + 1] : leaves.size();
    for (size_t j = first[i]; j < end; ++j) {
      if (IsFloat(leaves[j].dtype())) out.push_back(static_cast<int>(j));
    }
  }
  return out;
}

std::vector<int> FloatWrtLeaves(const std::vector<Value>& args, std::span<const int> wrt,
                                const std::vector<bool>& static_args) {
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, static_args, &first);
  return FloatWrtLeaves(leaves, first, wrt);
}

bool CompilableWrt(const std::vector<int>& wrt, size_t nargs, const std::vector<bool>& static_args) {
  std::vector<bool> seen(nargs, false);
  for (int i : wrt) {
    if (i < 0 || static_cast<size_t>(i) >= nargs || seen[i] || IsStatic(static_args, i)) return false;
    seen[i] = true;
  }
  return true;
}

std::vector<int> GradientResultOf(size_t leaves, const std::vector<int>& wrt_leaves) {
  std::vector<int> result_of(leaves, -1);
  for (size_t g = 0; g < wrt_leaves.size(); ++g) result_of.at(wrt_leaves[g]) = static_cast<int>(g) + 1;
  return result_of;
}

CallLayout LayoutOf(const Type& ret, const std::vector<Value>& args, const std::vector<bool>& static_args,
                    const std::vector<int>* wrt) {
  CallLayout layout;
  layout.results = CountTensorLeaves(ret);
  if (!wrt) return layout;
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, static_args, &first);
  layout.wrt_leaves = FloatWrtLeaves(leaves, first, *wrt);
  layout.results = 1 + layout.wrt_leaves.size();
  layout.gradient_result = GradientResultOf(leaves.size(), layout.wrt_leaves);
  return layout;
}

ValueAndGrad FromResults(const Type& result_type, const std::vector<Value>& args, const std::vector<int>* wrt,
                         const std::vector<Tensor>& leaves, const std::vector<size_t>& first,
                         const std::vector<int>& gradient_result, const std::vector<Tensor>& results) {
  ValueAndGrad out;
  if (!wrt) {
    size_t pos = 0;
    out.value = ValueFromTensors(result_type, results, pos);
    if (pos != results.size()) {
      throw std::logic_error("the code returned " + std::to_string(results.size()) + " tensors, its result type " +
                             std::to_string(pos));
    }
    return out;
  }
  if (gradient_result.size() != leaves.size()) {
    throw std::logic_error("the code's gradient layout has " + std::to_string(gradient_result.size()) +
                           " leaves, the call " + std::to_string(leaves.size()));
  }
  out.value = Value(results.at(0));
  std::vector<Tensor> leaf_grads(leaves.size());
  for (size_t j = 0; j < leaves.size(); ++j) {
    leaf_grads[j] = gradient_result[j] < 0 ? leaves[j] : results.at(gradient_result[j]);
  }
  out.grads = GradsFromLeaves(args, *wrt, leaves, first, leaf_grads);
  return out;
}

std::vector<Value> GradsFromLeaves(const std::vector<Value>& args, const std::vector<int>& wrt,
                                   const std::vector<Tensor>& leaves, const std::vector<size_t>& first,
                                   const std::vector<Tensor>& leaf_grads) {
  std::vector<Value> out;
  for (int i : wrt) {
    size_t end = static_cast<size_t>(i) + 1 < first.size() ? first.at(i + 1) : leaves.size();
    std::vector<Value> replaced;
    for (size_t j = first.at(i); j < end; ++j) {
      const Tensor& g = leaf_grads.at(j);
      if (g.defined()) {
        replaced.emplace_back(g);
      } else {
        replaced.emplace_back(IsFloat(leaves[j].dtype()) ? Tensor::Zeros(leaves[j].dtype(), leaves[j].shape())
                                                         : leaves[j]);
      }
    }
    out.push_back(ReplaceTensorLeaves(args.at(i), replaced));
  }
  return out;
}

}  // namespace pejit

namespace pejit {

std::vector<Tensor> CotangentLeaves(const Value& value, const Value& cotangent, const std::string& where) {
  // Both walked together, a node before its fields, fields left to right
  // (TensorLeaves' order), with an explicit stack: a result may be a list
  // as long as its data.
  struct Node {
    const Value* value;
    const Value* cotangent;
    int parent, field;
  };
  std::vector<Node> nodes = {{&value, &cotangent, -1, -1}};
  std::vector<size_t> stack = {0};
  std::vector<Tensor> out;
  auto what_is = [](const Value& v) -> std::string {
    switch (v.kind()) {
      case Value::Kind::kTensor: return v.tensor().type().ToString();
      case Value::Kind::kTuple: return "a tuple of " + std::to_string(v.fields().size());
      case Value::Kind::kAdt: return "a " + v.ctor_name() + " value";
      case Value::Kind::kClosure: return "a function";
      case Value::Kind::kNone: break;
    }
    return "no value";
  };
  auto fail = [&](size_t n, const std::string& what) {
    std::string path;
    for (int k = static_cast<int>(n); nodes[k].parent >= 0; k = nodes[k].parent) {
      path = "." + std::to_string(nodes[k].field) + path;
    }
    throw std::invalid_argument(where + ": the cotangent" + (path.empty() ? "" : " at result" + path) + " " + what);
  };
  while (!stack.empty()) {
    const size_t n = stack.back();
    stack.pop_back();
    const Value& v = *nodes[n].value;
    const Value& c = *nodes[n].cotangent;
    if (v.kind() != c.kind()) fail(n, "is " + what_is(c) + " where the result is " + what_is(v));
    if (v.is_tensor()) {
      const Tensor& t = v.tensor();
      if (!IsFloat(t.dtype())) {
        out.emplace_back();
        continue;
      }
      if (c.tensor().dtype() != t.dtype() || c.tensor().shape() != t.shape()) {
        fail(n, "is " + c.tensor().type().ToString() + " where the result is " + t.type().ToString());
      }
      out.push_back(c.tensor());
      continue;
    }
    if (v.kind() != Value::Kind::kTuple && v.kind() != Value::Kind::kAdt) continue;  // closures: no leaves
    if (v.kind() == Value::Kind::kAdt && v.ctor_name() != c.ctor_name()) {
      fail(n, "is a " + c.ctor_name() + " where the result is a " + v.ctor_name());
    }
    if (v.fields().size() != c.fields().size()) {
      fail(n, "has " + std::to_string(c.fields().size()) + " fields where the result has " +
                  std::to_string(v.fields().size()));
    }
    const size_t first = nodes.size();
    for (size_t k = 0; k < v.fields().size(); ++k) {
      nodes.push_back({&v.fields()[k], &c.fields()[k], static_cast<int>(n), static_cast<int>(k)});
    }
    for (size_t k = v.fields().size(); k-- > 0;) stack.push_back(first + k);
  }
  return out;
}

}  // namespace pejit
