// \file Runtime values of programs: tensors, tuples, ADT values, closures.
//
// Values are immutable handles, cheap to copy. They are what entries take and
// return, what the interpreter computes with, and what the partial evaluator
// splits into a static skeleton and dynamic tensor leaves.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"
#include "ops/tensor.h"

namespace pejit {

class Value;

// A function value: a function literal with the variables it captured, or a
// module definition referred to by name (resolved when called).
struct Closure {
  Func func;                                              // null for a global
  std::string global;                                     // set for a global
  std::vector<std::pair<const VarNode*, Value>> captured; // free variables of func
};

class Value {
 public:
  enum class Kind : uint8_t { kNone, kTensor, kTuple, kAdt, kClosure };

  Value() = default;
  Value(Tensor t);  // NOLINT: a tensor is a value
  Value(const Value&) = default;
  Value(Value&&) = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) = default;
  // Tears nested values down with a loop: a 100,000-deep tree must not
  // overflow the native stack when it is freed.
  ~Value();
  static Value Tuple(std::vector<Value> fields);
  static Value Adt(TypeDefPtr adt, int tag, std::vector<Value> fields);
  static Value Function(std::shared_ptr<const Closure> closure);

  Kind kind() const { return kind_; }
  bool is_tensor() const { return kind_ == Kind::kTensor; }
  // Inline: the inspector and the interpreter read them per node.
  const Tensor& tensor() const {  // throws std::logic_error for other kinds
    if (kind_ != Kind::kTensor) WrongKind("a tensor");
    return tensor_;
  }
  const std::vector<Value>& fields() const {  // tuple or ADT fields
    if (kind_ != Kind::kTuple && kind_ != Kind::kAdt) WrongKind("a tuple or ADT");
    return *fields_;
  }
  // The fields of a tuple or ADT value, shared by every copy of it (null for
  // other kinds): caches keyed by a value's identity hold it weakly, so that
  // an entry dies with its value (pe/signature.h's SignatureCache).
  std::weak_ptr<const std::vector<Value>> fields_identity() const { return fields_; }
  // The fields of a tuple or ADT value, null for other kinds: for walks that
  // fetch ahead (ForEachNode), which must not pay for fields()'s check.
  const std::vector<Value>* fields_or_null() const { return fields_.get(); }
  const TypeDefPtr& adt() const { return adt_; }
  int tag() const { return tag_; }
  const std::string& ctor_name() const { return adt_->ctors[tag_].name; }
  const Closure& closure() const;

  // The slot of this tensor on an autodiff tape (interp/tape.h), or -1 when
  // no gradient can flow through it. Carried by the value so that the same
  // buffer passed twice is still two leaves.
  int64_t tape_id() const { return tape_id_; }
  Value WithTapeId(int64_t id) const {
    Value v = *this;
    v.tape_id_ = id;
    return v;
  }

  // "Tensor[(2,), f32]", "(..., ...)", "Node(...)", "<closure>": for messages.
  std::string Describe() const;
  // Numbers included, for tests and the command line.
  std::string ToString() const;

 private:
  [[noreturn]] void WrongKind(const char* expected) const;

  // What a walk over a structure reads (kind, tag, fields, type) first, in
  // one cache line: the inspector's walk is bound by memory latency.
  Kind kind_ = Kind::kNone;
  int tag_ = -1;
  std::shared_ptr<const std::vector<Value>> fields_;
  TypeDefPtr adt_;
  Tensor tensor_;
  std::shared_ptr<const Closure> closure_;
  int64_t tape_id_ = -1;
};

// ---- Tensor leaves: the contract between the tiers --------------------------
//
// A value's tensor leaves are its tensors, depth first, fields left to right.
// Compiled code takes a call's arguments as their leaves (ir/abi.h) and
// gives gradients back as leaves, which ReplaceTensorLeaves shapes like the
// argument again; the interpreter's tape watches the same leaves. The walks
// keep an explicit stack: a structure nests as deep as its data (a
// 100,000-element list is 100,000 nested Cons values).

// Calls visit(const Value&) on every node of `root`, a node before its
// fields, fields left to right.
//
// A structure built node by node lies all over the heap, and a depth-first
// walk is one cache miss after another (a node, its fields' array, a field,
// ...): about 200 ns a node for a minibatch of trees not in cache. So the
// nodes are found first, a level at a time, each level's reads asked for
// together (they come in about as fast as one), then visited in order.
template <typename Visit>
void ForEachNode(const Value& root, Visit&& visit) {
  struct Node {
    const Value* value;
    size_t first_field = 0, fields = 0;  // in `nodes`
  };
  std::vector<Node> nodes = {{&root}};
  for (size_t level = 0; level < nodes.size();) {
    const size_t end = nodes.size();
    for (size_t n = level; n < end; ++n) {  // the fields' vectors
      if (const std::vector<Value>* f = nodes[n].value->fields_or_null()) __builtin_prefetch(f);
    }
    for (size_t n = level; n < end; ++n) {  // their arrays: the next level's nodes
      const std::vector<Value>* f = nodes[n].value->fields_or_null();
      if (!f || f->empty()) continue;
      const char* first = reinterpret_cast<const char*>(f->data());
      for (const char* line = first; line < reinterpret_cast<const char*>(f->data() + f->size()); line += 64) {
        __builtin_prefetch(line);
      }
      nodes[n].first_field = nodes.size();
      nodes[n].fields = f->size();
      for (const Value& field : *f) nodes.push_back({&field});
    }
    level = end;
  }
  std::vector<size_t> stack = {0};
  while (!stack.empty()) {
    const Node& n = nodes[stack.back()];
    stack.pop_back();
    visit(*n.value);
    for (size_t k = n.fields; k-- > 0;) stack.push_back(n.first_field + k);  // the first field on top
  }
}

// Appends the tensor leaves of `v` to `out`.
void AppendTensorLeaves(const Value& v, std::vector<Tensor>& out);
std::vector<Tensor> TensorLeaves(const Value& v);

// `like` with its tensor leaves replaced, in order, by `leaves` (tensors, or
// any values); its other leaves (closures) are kept. Throws
// std::invalid_argument unless `leaves` has exactly one value per tensor leaf.
Value ReplaceTensorLeaves(const Value& like, std::span<const Value> leaves);

// A value of type `t`, tensors nested in tuples (what compiled code
// returns), from `tensors` read depth first from `pos`, which it advances.
Value ValueFromTensors(const Type& t, const std::vector<Tensor>& tensors, size_t& pos);

// Exact equality: same structure, bitwise-equal tensors. Closures compare by identity.
bool ValueEqual(const Value& a, const Value& b);
// Same structure, tensors AllClose.
bool ValueAllClose(const Value& a, const Value& b, double rtol = 1e-5, double atol = 1e-8);

// Why values made with `made`'s constructors cannot be read as `mine`'s
// (another constructor list: order, names, fields), or "" when they can (a
// copy of one definition, as module edits and other engines make): a match
// of `mine` picks clauses by constructor index, so a value of a type whose
// constructors differ would take the wrong clause, or read past its fields.
std::string ForeignConstructors(const TypeDef& made, const TypeDef& mine);

// The program's definition of an ADT by name (a ModuleSnapshot's FindType).
using FindTypeFn = std::function<TypeDefPtr(const std::string&)>;

// Checks that `v` is a value of type `t` (unknown dims match any size);
// throws std::invalid_argument naming the path to the mismatch, e.g.
// "field 1 of Node: expected Tensor[(), i64], got Tensor[(), f32]". Given
// `find_type`, an ADT value must be of the program's definition of its type
// or one with the same constructors (ForeignConstructors).
void CheckValueType(const Value& v, const Type& t, const std::string& what = "value",
                    const FindTypeFn* find_type = nullptr);

}  // namespace pejit
