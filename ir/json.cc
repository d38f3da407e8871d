#include "ir/json.h"

#include <stdexcept>

namespace pejit {
namespace {

using Json = nlohmann::json;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw std::invalid_argument(path + ": " + message);
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
  Tensor t;
  try {
    elements = NumElements(shape);
    t = Tensor::Empty(*dtype, shape);
  } catch (const std::invalid_argument& e) {  // a shape whose element or byte count overflows
    Fail(path(), e.what());
  }
  const Json& data = j["data"];
  if (!data.is_array() || static_cast<int64_t>(data.size()) != elements) {
    Fail(path(), "data must be a flat array of " + std::to_string(elements) + " numbers");
  }
  DispatchDType(*dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (size_t i = 0; i < data.size(); ++i) {
      const Json& x = data[i];
      if (std::is_same_v<T, bool> ? !x.is_boolean() : !x.is_number()) {
        Fail(path(), "data[" + std::to_string(i) + "] is not a " + std::string(DTypeName(*dtype)) + " value");
      }
      if constexpr (std::is_same_v<T, int64_t>) {
        if (!x.is_number_integer()) Fail(path(), "data[" + std::to_string(i) + "] is not an integer");
      }
      p[i] = x.get<T>();
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
  std::string Path() const {
    std::string path = root_;
    for (const Frame& f : frames_) {
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

Json TensorToJson(const Tensor& t) {
  Json data = Json::array();
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.ElementAsDouble(i);
    switch (t.dtype()) {
      case DType::kBool: data.push_back(v != 0); break;
      case DType::kI64: data.push_back(static_cast<int64_t>(v)); break;
      case DType::kF32: data.push_back(static_cast<float>(v)); break;
      case DType::kF64: data.push_back(v); break;
    }
  }
  return Json{{"dtype", DTypeName(t.dtype())}, {"shape", t.shape()}, {"data", std::move(data)}};
}

}  // namespace

Value ValueFromJson(const Json& json, const Type& type, const std::function<TypeDefPtr(const std::string&)>& type_def,
                    const std::string& path) {
  return Converter(type_def).Convert(json, type, path);
}

Json ValueToJson(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kTensor: return TensorToJson(value.tensor());
    case Value::Kind::kTuple: {
      Json arr = Json::array();
      for (const Value& f : value.fields()) arr.push_back(ValueToJson(f));
      return arr;
    }
    case Value::Kind::kAdt: {
      Json fields = Json::array();
      for (const Value& f : value.fields()) fields.push_back(ValueToJson(f));
      return Json{{"ctor", value.ctor_name()}, {"fields", std::move(fields)}};
    }
    case Value::Kind::kClosure: return Json{{"function", value.Describe()}};
    case Value::Kind::kNone: return nullptr;
  }
  return nullptr;
}

}  // namespace pejit
