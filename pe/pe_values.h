// \file Internal to pe/: partially static values and the tables of one PE run.
//
// What partial_eval.cc computes with (PVal: a value whose skeleton is known
// and whose tensors may be dynamic atoms of the residual) and the flat tables
// it indexes them by, shared with pe_template.cc, which turns a recorded
// helper call into a PeTemplate. Nothing outside pe/ includes this.
#pragma once

#include <bit>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ir/expr.h"
#include "ir/type.h"
#include "ops/tensor.h"

namespace pejit::pe_detail {

inline uint64_t Mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }
inline uint64_t HashPtr(const void* p) { return std::hash<const void*>{}(p); }

inline uint64_t HashBytes(const void* data, size_t n) {
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(data), n));
}

inline uint64_t HashTensorType(const TensorType& t) {
  uint64_t h = Mix(17, static_cast<uint64_t>(t.dtype));
  for (int64_t d : t.shape) h = Mix(h, static_cast<uint64_t>(d));
  return h;
}

// The node behind `e`, whose kind the caller has checked (As<> would
// dynamic_cast on every step of the walk).
template <typename Node>
const Node& NodeOf(const Expr& e) {
  return *static_cast<const Node*>(e.get());
}

// ---- Flat tables --------------------------------------------------------------

// Open addressing from a 64-bit key (a hash, or an address) to an index; the
// tables below chain entries with equal keys through their `next` index.
class IndexTable {
 public:
  IndexTable() { Rehash(64); }

  int32_t Get(uint64_t key) const {
    key = Fix(key);
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == 0) return -1;
    }
  }

  // Room for `n` keys without rehashing.
  void Reserve(size_t n) {
    size_t size = keys_.size();
    while (size < 2 * n + 2) size *= 2;
    if (size != keys_.size()) Rehash(size);
  }

  // The value of `key`, inserted as -1 when absent. Valid until the next call.
  int32_t& At(uint64_t key) {
    key = Fix(key);
    if (2 * (used_ + 1) > keys_.size()) Rehash(2 * keys_.size());
    for (size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (keys_[i] == key) return values_[i];
      if (keys_[i] == 0) {
        keys_[i] = key;
        values_[i] = -1;
        ++used_;
        return values_[i];
      }
    }
  }

 private:
  static uint64_t Fix(uint64_t key) { return key ? key : 0x51ed27ull; }  // 0 marks a free slot
  size_t Slot(uint64_t key) const { return static_cast<size_t>((key * 0x9e3779b97f4a7c15ull) >> shift_); }

  void Rehash(size_t size) {
    std::vector<uint64_t> keys = std::move(keys_);
    std::vector<int32_t> values = std::move(values_);
    keys_.assign(size, 0);
    values_.assign(size, -1);
    mask_ = size - 1;
    shift_ = 64 - std::countr_zero(size);
    used_ = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (keys[i]) At(keys[i]) = values[i];
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<int32_t> values_;
  size_t used_ = 0, mask_ = 0;
  int shift_ = 0;
};

// A short list of pointers, on the stack unless it is long: the argument
// lists of calls and operators, built for every node evaluated.
template <typename T, size_t N = 8>
class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  SmallVec(const SmallVec&) = delete;
  SmallVec& operator=(const SmallVec&) = delete;

  void push_back(T v) {
    if (size_ < N) {
      inline_[size_++] = v;
      return;
    }
    if (size_ == N) heap_.assign(inline_, inline_ + N);
    heap_.push_back(v);
    ++size_;
  }
  size_t size() const { return size_; }
  const T* data() const { return size_ <= N ? inline_ : heap_.data(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  const T& operator[](size_t i) const { return data()[i]; }
  const T& back() const { return data()[size_ - 1]; }
  operator std::span<const T>() const { return {data(), size_}; }

 private:
  T inline_[N];
  std::vector<T> heap_;
  size_t size_ = 0;
};

// ---- Partially static values ----------------------------------------------------

// A type as the evaluator keeps it: tensor types interned per run, so that
// equal types are one object and their hash is computed once.
struct TypeInfo {
  Type type;
  const TensorTypeNode* tensor = nullptr;  // null for other kinds
  uint64_t hash = 0;
};

struct ClosureInfo {
  Func func;
  const VarNode* const* vars;  // what it captures, as many as the PVal's fields
};

struct GlobalInfo {
  const std::string* name;
  const FuncNode* func = nullptr;  // resolved at the first call
};

// Small (64 bytes): what is rare lives behind a pointer.
struct PVal {
  // kChoice: the value of a dynamic `if` that holds a function, which the
  // residual program cannot: fields (condition, then-value, else-value), the
  // condition a dynamic bool. A use (call, projection, match) is evaluated
  // on both values under a residual `if` of the condition.
  enum class Kind : uint8_t { kDynamic, kStatic, kTuple, kAdt, kClosure, kGlobal, kChoice };
  Kind kind = Kind::kStatic;
  int tag = -1;                         // kAdt
  uint32_t size = 0;                    // fields (kTuple, kAdt, kChoice) or captured values (kClosure)
  uint64_t skeleton = 0;                // hash of the static skeleton
  const PVal* const* fields = nullptr;  // kTuple, kAdt: fields; kClosure: captured values
  Expr atom;                            // kDynamic
  const TypeInfo* type = nullptr;       // kDynamic
  union {
    const Tensor* value = nullptr;  // kStatic
    const TypeDef* adt;             // kAdt (held by the run's adt table)
    const ClosureInfo* closure;     // kClosure
    GlobalInfo* global;             // kGlobal
  };

  std::span<const PVal* const> Fields() const { return {fields, size}; }
};

// Same static skeleton (what a specialization may depend on).
inline bool SameSkeleton(const PVal* a, const PVal* b) {
  if (a == b) return true;
  if (a->skeleton != b->skeleton || a->kind != b->kind) return false;
  switch (a->kind) {
    case PVal::Kind::kDynamic: return a->type == b->type || TypeEqual(a->type->type, b->type->type);
    case PVal::Kind::kStatic: return Equal(*a->value, *b->value);
    case PVal::Kind::kAdt:
      if (a->tag != b->tag || (a->adt != b->adt && a->adt->name != b->adt->name)) return false;
      [[fallthrough]];
    case PVal::Kind::kTuple:
    case PVal::Kind::kChoice:
      if (a->size != b->size) return false;
      for (size_t i = 0; i < a->size; ++i) {
        if (!SameSkeleton(a->fields[i], b->fields[i])) return false;
      }
      return true;
    case PVal::Kind::kClosure:
      if (a->closure->func != b->closure->func || a->size != b->size) return false;
      for (size_t i = 0; i < a->size; ++i) {
        if (!SameSkeleton(a->fields[i], b->fields[i])) return false;
      }
      return true;
    case PVal::Kind::kGlobal: return *a->global->name == *b->global->name;
  }
  return false;
}

// Where one run's PVals and their field arrays live: allocated in blocks,
// freed together when the run ends.
class PValArena {
 public:
  PVal* New() {
    if (used_ == kBlock) {
      blocks_.push_back(std::make_unique<PVal[]>(kBlock));
      used_ = 0;
    }
    return &blocks_.back()[used_++];
  }

  const Tensor* Keep(Tensor t) { return &tensors_.emplace_back(std::move(t)); }
  const ClosureInfo* Keep(ClosureInfo c) { return &closures_.emplace_back(std::move(c)); }
  GlobalInfo* Keep(GlobalInfo g) { return &globals_.emplace_back(g); }

  template <typename T>
  T* Array(size_t n) {
    static_assert(sizeof(T) == sizeof(void*) && std::is_trivially_copyable_v<T>);
    if (n == 0) return nullptr;
    if (ptr_used_ + n > ptr_cap_) {
      ptr_cap_ = std::max<size_t>(n, 4096);
      ptr_blocks_.push_back(std::make_unique<void*[]>(ptr_cap_));
      ptr_used_ = 0;
    }
    void** p = ptr_blocks_.back().get() + ptr_used_;
    ptr_used_ += n;
    return static_cast<T*>(static_cast<void*>(p));
  }

 private:
  static constexpr size_t kBlock = 256;
  std::vector<std::unique_ptr<PVal[]>> blocks_;
  size_t used_ = kBlock;
  std::vector<std::unique_ptr<void*[]>> ptr_blocks_;
  size_t ptr_used_ = 0, ptr_cap_ = 0;
  std::deque<Tensor> tensors_;
  std::deque<ClosureInfo> closures_;
  std::deque<GlobalInfo> globals_;
};

// A let-list being filled.
struct Scope {
  std::vector<std::pair<Var, Expr>> lets;
  size_t calls_mark = 0;      // the call memo's size when the scope opened
  bool function_root = false;  // the body of a residual function (or main)
  // Function roots: tensors materialized once. The tensor is kept alive with
  // its variable, so that its buffer's address cannot be reused by another.
  std::unordered_map<const void*, std::pair<Tensor, Var>> constants;
  std::vector<std::pair<Var, Expr>> constant_lets;
};

// A residual function specialized on a generalized skeleton.
struct Specialization {
  const FuncNode* func;
  std::vector<const PVal*> args;  // generalized: tensors dynamic parameters
  std::string name;
  Type ret;
};

// A call answered in a scope, by callee and argument identity.
struct CallEntry {
  uint64_t key;
  const FuncNode* func;
  const std::string* global;  // the callee's name, null for a closure
  const PVal* const* ids;  // the arguments, then the closure (if any)
  uint32_t size;
  int32_t scope;
  const PVal* result;
  int32_t next;
};

// A call being unfolded, by callee and argument skeleton.
struct ActiveEntry {
  uint64_t key;
  const FuncNode* func;
  const PVal* closure;  // null for a global
  std::span<const PVal* const> args;
  int32_t next;
  int32_t next_of_func;      // the unfolding of the same function before it, by HashPtr(func)
  int32_t dynamic_branches;  // dynamic `if` branches open when it began
};

// Result types of one operator node for some input types.
struct InferEntry {
  const OpCallNode* node;
  std::vector<const TypeInfo*> inputs;
  std::vector<const TypeInfo*> outputs;
  int32_t next;
};

// (7) A helper call described for the cache, and, while its unfolding runs,
// what the template will need to know about it.
struct Recording {
  std::string key;
  std::string helper;
  std::vector<const PVal*> nodes;  // the argument nodes, in the key's order
  IndexTable node_index;           // a node's address → its index in `nodes`
  IndexTable static_buffer;        // a static node's buffer → the first node holding it

  bool valid = true;  // false: the unfolding depended on its context
  int scope = -1;
  size_t lets_mark = 0, calls_mark = 0;
  int64_t unfoldings = 0, residual_ops = 0, folded_ops = 0, shared_calls = 0;  // before
  int64_t stack_start = 0;    // the evaluator's stack depth at the call
  int64_t stack_deepest = 0;  // and the deepest it reached inside
  std::vector<std::pair<Tensor, Var>> consts;  // tensors materialized, by first use
  IndexTable const_index;                      // a buffer → its index in `consts`
  IndexTable fresh;                            // buffers the helper computed
  // Probes, flattened: per probe its callee's name, then its argument nodes.
  std::vector<std::pair<const std::string*, uint32_t>> probes;  // callee, first
  std::vector<int32_t> probe_args;
  std::vector<uint64_t> unfold_keys;
  std::vector<const std::string*> unfolded;  // globals unfolded inside
  size_t active_base = 0;                    // the helper's own entry in the unfoldings in progress
};

}  // namespace pejit::pe_detail
