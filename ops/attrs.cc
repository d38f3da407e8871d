#include "ops/attrs.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <stdexcept>

namespace pejit {

AttrKind KindOf(const AttrValue& value) { return static_cast<AttrKind>(value.index()); }

std::string_view AttrKindName(AttrKind kind) {
  switch (kind) {
    case AttrKind::kBool: return "bool";
    case AttrKind::kInt: return "int";
    case AttrKind::kFloat: return "float";
    case AttrKind::kInts: return "int list";
    case AttrKind::kDType: return "dtype";
  }
  return "?";
}

std::string AttrValueToString(const AttrValue& value) {
  struct Printer {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", d);
      std::string s = buf;
      // Keep floats recognizable as floats when printed and parsed back.
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
    std::string operator()(DType d) const { return std::string(DTypeName(d)); }
  };
  return std::visit(Printer{}, value);
}

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [name, value] : items) Set(name, value);
}

const Attrs::Items& Attrs::items() const {
  static const Items kNone;
  return items_ ? *items_ : kNone;
}

void Attrs::Set(std::string name, AttrValue value) {
  auto items = std::make_shared<Items>(this->items());
  auto it = std::lower_bound(items->begin(), items->end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  if (it != items->end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items->insert(it, {std::move(name), std::move(value)});
  }
  items_ = std::move(items);
}

const AttrValue* Attrs::Find(std::string_view name) const {
  for (const auto& [n, v] : items()) {
    if (n == name) return &v;
  }
  return nullptr;
}

namespace {

template <typename T>
const T& Get(const Attrs& attrs, std::string_view name) {
  const AttrValue* v = attrs.Find(name);
  if (!v) throw std::logic_error("missing attribute '" + std::string(name) + "'");
  const T* typed = std::get_if<T>(v);
  if (!typed) throw std::logic_error("attribute '" + std::string(name) + "' has another kind");
  return *typed;
}

}  // namespace

bool Attrs::GetBool(std::string_view name) const { return Get<bool>(*this, name); }
int64_t Attrs::GetInt(std::string_view name) const { return Get<int64_t>(*this, name); }
double Attrs::GetFloat(std::string_view name) const { return Get<double>(*this, name); }
const std::vector<int64_t>& Attrs::GetInts(std::string_view name) const {
  return Get<std::vector<int64_t>>(*this, name);
}
DType Attrs::GetDType(std::string_view name) const { return Get<DType>(*this, name); }

size_t Attrs::Hash() const {
  size_t h = 0x51ed27;
  auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (const auto& [name, value] : items()) {
    mix(std::hash<std::string>{}(name));
    mix(value.index());
    mix(std::hash<std::string>{}(AttrValueToString(value)));
  }
  return h;
}

std::string Attrs::ToString() const {
  std::string s;
  for (const auto& [name, value] : items()) {
    if (!s.empty()) s += ", ";
    s += name + "=" + AttrValueToString(value);
  }
  return s;
}

}  // namespace pejit
