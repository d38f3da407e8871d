// \file The static skeleton of a call's arguments, and their dynamic leaves.
//
// The skeleton is what a specialization depends on: ADT constructor tags,
// tuple arity, tensor dtypes and shapes, and the whole value of arguments the
// caller marks static. Two minibatches of trees with the same shapes (other
// words, other labels) have equal signatures.
//
// The dynamic leaves are the tensors the skeleton leaves out, in this order
// (the residual program's parameters): arguments left to right, each walked
// depth first, tuple and constructor fields left to right; arguments marked
// static contribute none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/value.h"

namespace pejit {

struct Signature {
  std::string key;   // the skeleton, serialized; equality is key equality
  uint64_t hash = 0;

  std::string ShortHash() const;  // 8 hex digits, for logs: "3f2a91c0"
  friend bool operator==(const Signature& a, const Signature& b) { return a.hash == b.hash && a.key == b.key; }
};

struct SignatureHash {
  size_t operator()(const Signature& s) const { return static_cast<size_t>(s.hash); }
};

// `static_args[i]` marks argument i static (missing entries: dynamic).
// Throws std::invalid_argument for a function value among dynamic arguments.
Signature ComputeSignature(const std::vector<Value>& args, const std::vector<bool>& static_args = {});

// The dynamic leaves of `args`, in the order above.
std::vector<Tensor> Flatten(const std::vector<Value>& args, const std::vector<bool>& static_args = {});

}  // namespace pejit
