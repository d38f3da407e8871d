// \file The static skeleton of a call's arguments, and their dynamic leaves.
//
// The skeleton is what a specialization depends on: ADT constructor tags,
// tuple arity, tensor dtypes and shapes, and the whole value of arguments the
// caller marks static. Two minibatches of trees with the same shapes (other
// words, other labels) have equal signatures.
//
// The dynamic leaves are the tensors the skeleton leaves out, in the order
// of the calling convention (ir/abi.h's Flatten): the residual program's
// parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/abi.h"
#include "ir/value.h"

namespace pejit {

struct Signature {
  std::string key;   // the skeleton, serialized; equality is key equality
  uint64_t hash = 0;
  // The ADT definitions the walk met (each once; a SignatureCache gives
  // those of the arguments it knew), with the argument each was in: a
  // caller checks they are its program's (ForeignConstructors, ir/value.h),
  // which the key, naming types only, cannot say.
  std::vector<std::pair<const TypeDef*, int>> adts;

  std::string ShortHash() const;  // 8 hex digits, for logs: "3f2a91c0"
  friend bool operator==(const Signature& a, const Signature& b) { return a.hash == b.hash && a.key == b.key; }
};

struct SignatureHash {
  size_t operator()(const Signature& s) const { return static_cast<size_t>(s.hash); }
};

// `static_args[i]` marks argument i static (missing entries: dynamic).
// Throws std::invalid_argument for a function value among dynamic arguments.
Signature ComputeSignature(const std::vector<Value>& args, const std::vector<bool>& static_args = {});

// ComputeSignature and Flatten, remembering for every tuple or ADT argument
// that is not static, by the argument's identity, its part of the key and
// where its leaves are: values are immutable, so a value passed again (a
// training loop passes each minibatch's trees every epoch) has the skeleton
// it had, and walking its nodes again costs a cache miss per node, hundreds
// of microseconds for a minibatch of trees. Entries hold their values weakly;
// past `capacity` arguments, those whose values died go (all of them, when
// none has: a loop over more minibatches than that walks them as before). Static arguments
// are always walked (their tensors' contents may be written in place).
// Thread safe.
class SignatureCache {
 public:
  explicit SignatureCache(size_t capacity = 1024) : capacity_(capacity) {}
  Signature Compute(const std::vector<Value>& args, const std::vector<bool>& static_args = {});
  // Flatten's leaves; `first[i]` is where argument i's begin. Arguments
  // Compute has seen are not walked.
  std::vector<Tensor> Flatten(const std::vector<Value>& args, const std::vector<bool>& static_args,
                              std::vector<size_t>* first);
  size_t size() const;

 private:
  struct Entry {
    std::weak_ptr<const std::vector<Value>> value;
    std::string key;  // the argument's part of the signature's key
    uint64_t hash = 0;
    std::vector<const Tensor*> leaves;  // inside the value's fields
    std::vector<const TypeDef*> adts;   // Signature::adts of the argument
  };
  // The live entry of `arg`, whose fields `identity` holds, or null; under mu_.
  const Entry* Find(const Value& arg, const std::shared_ptr<const std::vector<Value>>& identity, size_t i) const;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<const void*, Entry> entries_;
};

// A specialization's mode as logs and keys spell it: "value" (no `wrt`), or
// "grad:" and the argument indices, "grad:0,2".
std::string ModeName(const std::vector<int>* wrt);

}  // namespace pejit
