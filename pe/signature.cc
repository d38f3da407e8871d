#include "pe/signature.h"

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

namespace pejit {
namespace {

bool IsStatic(const std::vector<bool>& static_args, size_t i) { return i < static_args.size() && static_args[i]; }

void Put(std::string& key, const void* data, size_t n) { key.append(static_cast<const char*>(data), n); }
template <typename T>
void Put(std::string& key, T v) {
  Put(key, &v, sizeof v);
}

// Walks a value depth first with an explicit stack (trees may be deep),
// calling leaf(tensor) for tensors and node(value) for everything.
template <typename Node, typename Leaf>
void Walk(const Value& root, Node&& node, Leaf&& leaf) {
  std::vector<const Value*> stack = {&root};
  while (!stack.empty()) {
    const Value* v = stack.back();
    stack.pop_back();
    node(*v);
    if (v->is_tensor()) {
      leaf(v->tensor());
    } else if (v->kind() == Value::Kind::kTuple || v->kind() == Value::Kind::kAdt) {
      const auto& fields = v->fields();
      for (auto it = fields.rbegin(); it != fields.rend(); ++it) stack.push_back(&*it);
    }
  }
}

// FNV-1a over the key; stable across runs (logs can be compared).
uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

std::string Signature::ShortHash() const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<uint32_t>(hash ^ (hash >> 32)));
  return buf;
}

Signature ComputeSignature(const std::vector<Value>& args, const std::vector<bool>& static_args) {
  Signature sig;
  std::string& key = sig.key;
  key.reserve(64 * args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    bool whole = IsStatic(static_args, i);
    key.push_back(whole ? 'S' : 'D');
    Walk(
        args[i],
        [&](const Value& v) {
          switch (v.kind()) {
            case Value::Kind::kNone: key.push_back('0'); break;
            case Value::Kind::kTensor: {
              const Tensor& t = v.tensor();
              key.push_back('T');
              key.push_back(static_cast<char>(t.dtype()));
              Put(key, static_cast<uint8_t>(t.rank()));
              for (int64_t d : t.shape()) Put(key, d);
              break;
            }
            case Value::Kind::kTuple:
              key.push_back('(');
              Put(key, static_cast<uint32_t>(v.fields().size()));
              break;
            case Value::Kind::kAdt:
              key.push_back('A');
              key.append(v.adt()->name);
              key.push_back('\0');
              Put(key, static_cast<uint16_t>(v.tag()));
              break;
            case Value::Kind::kClosure:
              if (!whole) {
                throw std::invalid_argument("argument " + std::to_string(i) +
                                            " holds a function value; only static arguments may");
              }
              key.push_back('F');
              Put(key, static_cast<const void*>(&v.closure()));
              break;
          }
        },
        [&](const Tensor& t) {
          if (whole) Put(key, t.raw_data(), t.nbytes());
        });
  }
  sig.hash = Fnv1a(key);
  return sig;
}

std::vector<Tensor> Flatten(const std::vector<Value>& args, const std::vector<bool>& static_args) {
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < args.size(); ++i) {
    if (IsStatic(static_args, i)) continue;
    Walk(args[i], [](const Value&) {}, [&](const Tensor& t) { leaves.push_back(t); });
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
  std::vector<Tensor> leaves;
  std::vector<size_t> first(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    first[i] = leaves.size();
    if (IsStatic(static_args, i)) continue;
    Walk(args[i], [](const Value&) {}, [&](const Tensor& t) { leaves.push_back(t); });
  }
  return FloatWrtLeaves(leaves, first, wrt);
}

}  // namespace pejit
