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
  for (int i : *wrt) {
    size_t end = static_cast<size_t>(i) + 1 < first.size() ? first.at(i + 1) : leaves.size();
    std::vector<Value> replaced;
    for (size_t j = first.at(i); j < end; ++j) {
      if (gradient_result[j] < 0) {
        replaced.emplace_back(leaves[j]);
        continue;
      }
      const Tensor& g = results.at(gradient_result[j]);
      replaced.emplace_back(g.defined() ? g : Tensor::Zeros(leaves[j].dtype(), leaves[j].shape()));
    }
    out.grads.push_back(ReplaceTensorLeaves(args.at(i), replaced));
  }
  return out;
}

}  // namespace pejit
