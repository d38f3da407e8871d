#include "pe/signature.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "support/hash.h"

namespace pejit {
namespace {

bool IsStatic(const std::vector<bool>& static_args, size_t i) { return i < static_args.size() && static_args[i]; }

void Put(std::string& key, const void* data, size_t n) { key.append(static_cast<const char*>(data), n); }
template <typename T>
void Put(std::string& key, T v) {
  Put(key, &v, sizeof v);
}

// The signature's hash: of each argument's key's hash in turn, so that a
// cached argument's hash is reused too.
class Hasher {
 public:
  void Add(uint64_t argument_hash) { h_ = Fnv1a(&argument_hash, sizeof argument_hash, h_); }
  uint64_t hash() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ull;
};

// Appends one node of argument `i` (not its fields) to the key.
void AppendNode(std::string& key, const Value& v, bool whole, size_t i) {
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
        throw std::invalid_argument("argument " + std::to_string(i) + " holds a function value; only static arguments may");
      }
      key.push_back('F');
      Put(key, static_cast<const void*>(&v.closure()));
      break;
  }
}

// Appends argument `i`'s part of the key; and, given `leaves`, the addresses
// of its tensors (in the same walk: each node is a cache miss).
void AppendKey(std::string& key, const Value& arg, bool whole, size_t i,
               std::vector<const Tensor*>* leaves = nullptr,
               std::vector<std::pair<const TypeDef*, int>>* adts = nullptr) {
  key.push_back(whole ? 'S' : 'D');
  const TypeDef* last = nullptr;
  ForEachNode(arg, [&](const Value& v) {
    AppendNode(key, v, whole, i);
    if (adts && v.kind() == Value::Kind::kAdt && v.adt().get() != last) {
      last = v.adt().get();  // a program has few types: the list stays short
      if (std::none_of(adts->begin(), adts->end(), [&](const auto& a) { return a.first == last && a.second == static_cast<int>(i); })) {
        adts->emplace_back(last, static_cast<int>(i));
      }
    }
    if (!v.is_tensor()) return;
    const Tensor& t = v.tensor();
    if (whole) Put(key, t.raw_data(), t.nbytes());
    if (leaves) leaves->push_back(&t);
  });
}

// Appends argument `i`'s part of the key and its hash (and, given `leaves`,
// its tensors' addresses); returns where it begins in the key.
size_t AppendArgument(Signature& sig, Hasher& hasher, const Value& arg, bool whole, size_t i, uint64_t* hash,
                      std::vector<const Tensor*>* leaves = nullptr) {
  size_t begin = sig.key.size();
  AppendKey(sig.key, arg, whole, i, leaves, &sig.adts);
  *hash = Fnv1a(sig.key.data() + begin, sig.key.size() - begin);
  hasher.Add(*hash);
  return begin;
}

// The fields of argument `arg` when the cache may keep it: a tuple or ADT
// value that is not static. Null otherwise.
std::shared_ptr<const std::vector<Value>> Identity(const Value& arg, bool whole) {
  if (whole || (arg.kind() != Value::Kind::kTuple && arg.kind() != Value::Kind::kAdt)) return nullptr;
  return arg.fields_identity().lock();
}

}  // namespace

std::string Signature::ShortHash() const {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", static_cast<uint32_t>(hash ^ (hash >> 32)));
  return buf;
}

Signature ComputeSignature(const std::vector<Value>& args, const std::vector<bool>& static_args) {
  Signature sig;
  sig.key.reserve(64 * args.size());
  Hasher hasher;
  uint64_t hash;
  for (size_t i = 0; i < args.size(); ++i) AppendArgument(sig, hasher, args[i], IsStatic(static_args, i), i, &hash);
  sig.hash = hasher.hash();
  return sig;
}

const SignatureCache::Entry* SignatureCache::Find(const Value& arg,
                                                  const std::shared_ptr<const std::vector<Value>>& identity,
                                                  size_t i) const {
  auto it = entries_.find(identity.get());
  // A live entry for this address is this value's: the address cannot have
  // been reused while the value it was taken from lives. The value's own
  // constructor and tag are in its handle, not its fields: checked against
  // the key's first bytes.
  if (it == entries_.end() || it->second.value.lock() != identity) return nullptr;
  std::string head = "D";
  AppendNode(head, arg, /*whole=*/false, i);
  return it->second.key.compare(0, head.size(), head) == 0 ? &it->second : nullptr;
}

Signature SignatureCache::Compute(const std::vector<Value>& args, const std::vector<bool>& static_args) {
  Signature sig;
  Hasher hasher;
  for (size_t i = 0; i < args.size(); ++i) {
    const Value& arg = args[i];
    bool whole = IsStatic(static_args, i);
    uint64_t hash;
    std::shared_ptr<const std::vector<Value>> identity = Identity(arg, whole);
    if (!identity) {
      AppendArgument(sig, hasher, arg, whole, i, &hash);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (const Entry* e = Find(arg, identity, i)) {
        sig.key += e->key;
        hasher.Add(e->hash);
        for (const TypeDef* t : e->adts) sig.adts.emplace_back(t, static_cast<int>(i));
        continue;
      }
    }
    std::vector<const Tensor*> leaves;
    const size_t adts_before = sig.adts.size();
    size_t begin = AppendArgument(sig, hasher, arg, whole, i, &hash, &leaves);
    Entry entry{identity, sig.key.substr(begin), hash, std::move(leaves), {}};
    for (size_t a = adts_before; a < sig.adts.size(); ++a) entry.adts.push_back(sig.adts[a].first);
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= capacity_) {
      std::erase_if(entries_, [](const auto& e) { return e.second.value.expired(); });
      if (entries_.size() >= capacity_) entries_.clear();
    }
    entries_[identity.get()] = std::move(entry);
  }
  sig.hash = hasher.hash();
  return sig;
}

std::vector<Tensor> SignatureCache::Flatten(const std::vector<Value>& args, const std::vector<bool>& static_args,
                                            std::vector<size_t>* first) {
  std::vector<Tensor> leaves;
  first->assign(args.size(), 0);
  for (size_t i = 0; i < args.size(); ++i) {
    (*first)[i] = leaves.size();
    bool whole = IsStatic(static_args, i);
    if (whole) continue;
    if (std::shared_ptr<const std::vector<Value>> identity = Identity(args[i], whole)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (const Entry* e = Find(args[i], identity, i)) {
        for (const Tensor* t : e->leaves) leaves.push_back(*t);
        continue;
      }
    }
    AppendTensorLeaves(args[i], leaves);
  }
  return leaves;
}

size_t SignatureCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::string ModeName(const std::vector<int>* wrt) {
  if (!wrt) return "value";
  std::string mode = "grad:";
  for (size_t k = 0; k < wrt->size(); ++k) mode += (k ? "," : "") + std::to_string((*wrt)[k]);
  return mode;
}

}  // namespace pejit
