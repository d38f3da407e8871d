#include "ir/json.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string_view>

#include "support/json_integer.h"

namespace pejit {
namespace {

using Json = nlohmann::json;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw std::invalid_argument(path + ": " + message);
}

// A non-finite float as JSON, which has no numbers for them: these strings
// (read back case-insensitively, "infinity" too).
constexpr const char* kNaN = "nan";
constexpr const char* kInf = "inf";
constexpr const char* kMinusInf = "-inf";

std::optional<double> NonFinite(const Json& x) {
  if (!x.is_string()) return std::nullopt;
  std::string s = x.get<std::string>();
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == kNaN || s == "+nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == kInf || s == "+inf" || s == "infinity" || s == "+infinity") return std::numeric_limits<double>::infinity();
  if (s == kMinusInf || s == "-infinity") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

// One element of a tensor's data, exactly or not at all: an integer out of
// i64's range, a float whose magnitude f32 cannot hold (1e300 would become
// inf) or a fraction for an integer type is an error naming `where()`.
template <typename T, typename WhereFn>
T Element(const Json& x, const WhereFn& where) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!x.is_boolean()) Fail(where(), "expected true or false for a bool, got " + x.dump());
    return x.get<bool>();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    if (IsIntegerPastInt64(x)) Fail(where(), x.dump() + " is out of i64's range");
    if (!x.is_number_integer()) {
      Fail(where(), "expected an integer for an i64, got " + (x.is_number() ? x.dump() : std::string(x.type_name())));
    }
    return x.get<int64_t>();
  } else {
    if (std::optional<double> special = NonFinite(x)) return static_cast<T>(*special);
    if (!x.is_number()) {
      Fail(where(), "expected a number (or \"nan\", \"inf\", \"-inf\") for a " +
                        std::string(DTypeName(std::is_same_v<T, float> ? DType::kF32 : DType::kF64)) + ", got " +
                        x.dump());
    }
    const double v = x.get<double>();
    if (std::isinf(v)) Fail(where(), x.dump() + " is out of f64's range");  // an integer past 1.8e308
    if constexpr (std::is_same_v<T, float>) {
      if (std::abs(v) > static_cast<double>(std::numeric_limits<float>::max())) {
        Fail(where(), x.dump() + " is out of f32's range (largest 3.4028235e+38); write \"inf\" for infinity");
      }
    }
    return static_cast<T>(v);
  }
}

// `path()` names the value in an error message (built only then).
template <typename PathFn>
Tensor TensorFromJson(const Json& j, const TensorType& want, const PathFn& path) {
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data")) {
    Fail(path(), "expected a tensor {\"dtype\", \"shape\", \"data\"} of type " + want.ToString());
  }
  std::optional<DType> dtype = j["dtype"].is_string() ? ParseDType(j["dtype"].get<std::string>()) : std::nullopt;
  if (!dtype) Fail(path(), "unknown dtype " + j["dtype"].dump());
  if (*dtype != want.dtype) Fail(path(), "expected " + want.ToString() + ", got dtype " + std::string(DTypeName(*dtype)));
  Shape shape;
  if (!j["shape"].is_array()) Fail(path(), "shape must be an array of sizes");
  for (const Json& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) Fail(path(), "shape must be an array of sizes");
    shape.push_back(d.get<int64_t>());
  }
  bool fits = shape.size() == want.shape.size();
  for (size_t i = 0; fits && i < shape.size(); ++i) fits = want.shape[i] == kUnknownDim || want.shape[i] == shape[i];
  if (!fits) Fail(path(), "expected " + want.ToString() + ", got shape " + ShapeToString(shape));
  int64_t elements = 0;
  try {
    elements = NumElements(shape);
  } catch (const std::invalid_argument& e) {  // a shape whose element or byte count overflows
    Fail(path(), e.what());
  }
  // Before allocating: a shape of 10^17 elements with no data is refused,
  // not allocated (memory follows the input's size).
  const Json& data = j["data"];
  if (!data.is_array() || static_cast<int64_t>(data.size()) != elements) {
    Fail(path(), "data must be a flat array of " + std::to_string(elements) + " numbers");
  }
  Tensor t;
  try {
    t = Tensor::Empty(*dtype, shape);
  } catch (const std::invalid_argument& e) {
    Fail(path(), e.what());
  }
  DispatchDType(*dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (size_t i = 0; i < data.size(); ++i) {
      const Json& x = data[i];
      p[i] = Element<T>(x, [&] { return path() + ": data[" + std::to_string(i) + "]"; });
    }
  });
  return t;
}

// Converts with an explicit stack of frames, one per value being built, so
// that neither nesting (a 10,000-element list is 10,000 nested Cons values)
// nor the path of an error (built from the frames only when one is thrown)
// costs more than linear time or native stack.
class Converter {
 public:
  explicit Converter(const std::function<TypeDefPtr(const std::string&)>& type_def) : type_def_(type_def) {}

  Value Convert(const Json& json, const Type& type, const std::string& root) {
    root_ = root;
    Push(json, type);
    while (!frames_.empty()) {
      Frame& f = frames_.back();
      if (f.next < f.field_types.size()) {
        const size_t i = f.next++;
        const Json& child = f.is_adt ? (*f.fields)[i] : (*f.json)[i];
        Type child_type = f.field_types[i];
        Push(child, child_type);  // may grow frames_: `f` is not used after
        continue;
      }
      Value v = f.is_adt ? Value::Adt(std::move(f.def), f.tag, std::move(f.values)) : Value::Tuple(std::move(f.values));
      frames_.pop_back();
      Deliver(std::move(v));
    }
    return std::move(done_);
  }

 private:
  struct Frame {
    const Json* json = nullptr;
    bool is_adt = false;
    const Json* fields = nullptr;  // an ADT value's "fields" array
    TypeDefPtr def;
    int tag = -1;
    std::vector<Type> field_types;
    std::vector<Value> values;
    size_t next = 0;  // the field being converted: the error path's last step
  };

  // Starts converting `j`: a tensor at once, else a frame for its fields.
  void Push(const Json& j, const Type& type) {
    if (frames_.size() >= kMaxDepth) Fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    switch (type->kind) {
      case TypeKind::kTensor: {
        Deliver(TensorFromJson(j, AsTensor(type)->type, [this] { return Path(); }));
        return;
      }
      case TypeKind::kTuple: {
        const auto& fields = AsTuple(type)->fields;
        if (!j.is_array() || j.size() != fields.size()) {
          Fail("expected a tuple " + TypeToString(type) + " as an array of " + std::to_string(fields.size()));
        }
        Frame f;
        f.json = &j;
        f.field_types = fields;
        f.values.reserve(fields.size());
        Open(std::move(f));
        return;
      }
      case TypeKind::kAdt: {
        const AdtTypeNode* adt = AsAdt(type);
        TypeDefPtr def = type_def_(adt->name);
        if (!def) Fail("unknown type " + adt->name);
        if (!j.is_object() || !j.contains("ctor") || !j["ctor"].is_string()) {
          Fail("expected a " + adt->name + " value {\"ctor\": ..., \"fields\": [...]}");
        }
        const std::string& ctor = j["ctor"].get_ref<const std::string&>();
        const int tag = def->FindCtor(ctor);
        if (tag < 0) Fail("type " + adt->name + " has no constructor '" + ctor + "'");
        const auto& field_types = def->ctors[tag].fields;
        auto it = j.find("fields");
        static const Json kNoFields = Json::array();
        const Json& fields = it == j.end() ? kNoFields : *it;
        if (!fields.is_array() || fields.size() != field_types.size()) {
          Fail(ctor + " takes " + std::to_string(field_types.size()) + " fields");
        }
        Frame f;
        f.json = &j;
        f.is_adt = true;
        f.fields = &fields;
        f.tag = tag;
        if (def->params.empty()) {
          f.field_types = field_types;
        } else {
          std::map<std::string, Type> bindings;
          for (size_t i = 0; i < def->params.size() && i < adt->args.size(); ++i) bindings[def->params[i]] = adt->args[i];
          for (const Type& t : field_types) f.field_types.push_back(SubstituteTypeVars(t, bindings));
        }
        f.def = std::move(def);
        f.values.reserve(field_types.size());
        Open(std::move(f));
        return;
      }
      case TypeKind::kFunc: Fail("functions cannot be given as JSON");
      case TypeKind::kVar: Fail("type parameter " + TypeToString(type) + " is not instantiated");
    }
    Fail("unsupported type");
  }

  void Open(Frame f) { frames_.push_back(std::move(f)); }

  // A finished value goes to the frame below, or is the result.
  void Deliver(Value v) {
    if (frames_.empty()) {
      done_ = std::move(v);
      return;
    }
    frames_.back().values.push_back(std::move(v));
  }

  // "root.fields[1].fields[0][2]": the steps from the root to the value being converted.
  // A deep value's path keeps its first and last steps: a million-deep list
  // would otherwise make a message of megabytes.
  std::string Path() const {
    constexpr size_t kHead = 4, kTail = 8;
    std::string path = root_;
    for (size_t i = 0; i < frames_.size(); ++i) {
      if (i == kHead && frames_.size() > kHead + kTail + 1) {
        const size_t skipped = frames_.size() - kHead - kTail;
        path += "...(" + std::to_string(skipped) + " levels)";
        i += skipped - 1;
        continue;
      }
      const Frame& f = frames_[i];
      const std::string index = "[" + std::to_string(f.next - 1) + "]";
      path += f.is_adt ? ".fields" + index : index;
    }
    return path;
  }

  [[noreturn]] void Fail(const std::string& message) const { pejit::Fail(Path(), message); }

  static constexpr size_t kMaxDepth = 1'000'000;
  const std::function<TypeDefPtr(const std::string&)>& type_def_;
  std::string root_;
  std::vector<Frame> frames_;
  Value done_;
};

// A float in the shortest digits that read back to the same value, with a
// ".0" where they would read as an integer; non-finite ones as strings.
template <typename T>
void AppendFloat(T v, std::string& out) {
  if (std::isnan(v)) {
    out += std::string("\"") + kNaN + "\"";
    return;
  }
  if (std::isinf(v)) {
    out += std::string("\"") + (v > 0 ? kInf : kMinusInf) + "\"";
    return;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string_view digits(buf, static_cast<size_t>(end - buf));
  out += digits;
  if (digits.find_first_of(".e") == std::string_view::npos) out += ".0";
}

void AppendTensor(const Tensor& t, std::string& out) {
  out += "{\"dtype\":\"";
  out += DTypeName(t.dtype());
  out += "\",\"shape\":[";
  for (size_t d = 0; d < t.shape().size(); ++d) {
    if (d) out += ',';
    out += std::to_string(t.shape()[d]);
  }
  out += "],\"data\":[";
  DispatchDType(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if (i) out += ',';
      if constexpr (std::is_same_v<T, bool>) {
        out += p[i] ? "true" : "false";
      } else if constexpr (std::is_same_v<T, int64_t>) {
        out += std::to_string(p[i]);  // exactly: never through a double
      } else {
        AppendFloat(p[i], out);
      }
    }
  });
  out += "]}";
}

}  // namespace

Value ValueFromJson(const Json& json, const Type& type, const std::function<TypeDefPtr(const std::string&)>& type_def,
                    const std::string& path) {
  return Converter(type_def).Convert(json, type, path);
}

std::string ValueToJsonText(const Value& value) {
  std::string out;
  // An explicit stack (value, next field), so that a 100,000-element list,
  // 100,000 nested Cons values, prints without native stack.
  std::vector<std::pair<const Value*, size_t>> stack;
  auto open = [&](const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kTensor: AppendTensor(v.tensor(), out); return;
      case Value::Kind::kTuple:
        out += '[';
        stack.emplace_back(&v, 0);
        return;
      case Value::Kind::kAdt:
        out += "{\"ctor\":" + Json(v.ctor_name()).dump() + ",\"fields\":[";
        stack.emplace_back(&v, 0);
        return;
      case Value::Kind::kClosure: out += "{\"function\":" + Json(v.Describe()).dump() + "}"; return;
      case Value::Kind::kNone: out += "null"; return;
    }
  };
  open(value);
  while (!stack.empty()) {
    auto& [v, next] = stack.back();
    const std::vector<Value>& fields = v->fields();
    if (next < fields.size()) {
      if (next) out += ',';
      const Value& field = fields[next++];
      open(field);  // may grow the stack: `v` and `next` are not used after
      continue;
    }
    out += v->kind() == Value::Kind::kAdt ? "]}" : "]";
    stack.pop_back();
  }
  return out;
}

Json ValueToJson(const Value& value) { return Json::parse(ValueToJsonText(value)); }

}  // namespace pejit
