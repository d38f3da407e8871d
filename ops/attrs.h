// \file Typed operator attributes (axis, keepdims, shape, dtype, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ops/dtype.h"

namespace pejit {

enum class AttrKind : uint8_t { kBool, kInt, kFloat, kInts, kDType };

using AttrValue = std::variant<bool, int64_t, double, std::vector<int64_t>, DType>;

AttrKind KindOf(const AttrValue& value);
std::string_view AttrKindName(AttrKind kind);  // "bool", "int", "float", "int list", "dtype"
std::string AttrValueToString(const AttrValue& value);  // true, 3, 0.5, [0, 1], f32

// A name-sorted list of attributes. Equality and hashing are structural, so
// two calls with the same attributes are recognized as the same computation.
// Copies share one immutable list (copy on write): every emitted operator
// call carries its attributes, and programs have tens of thousands of them.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  void Set(std::string name, AttrValue value);
  const AttrValue* Find(std::string_view name) const;
  using Items = std::vector<std::pair<std::string, AttrValue>>;
  bool empty() const { return !items_ || items_->empty(); }
  const Items& items() const;

  // Typed getters; throw std::logic_error when the attribute is missing or of
  // another kind (the registry has already validated against the op schema).
  bool GetBool(std::string_view name) const;
  int64_t GetInt(std::string_view name) const;
  double GetFloat(std::string_view name) const;
  const std::vector<int64_t>& GetInts(std::string_view name) const;
  DType GetDType(std::string_view name) const;

  size_t Hash() const;
  std::string ToString() const;  // "axis=1, keepdims=true"
  friend bool operator==(const Attrs& a, const Attrs& b) { return a.items_ == b.items_ || a.items() == b.items(); }

 private:
  std::shared_ptr<const Items> items_;
};

// One attribute an operator accepts; without a default it is required.
struct AttrSpec {
  std::string name;
  AttrKind kind;
  std::optional<AttrValue> default_value;
};

}  // namespace pejit
