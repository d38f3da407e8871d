#include "ir/json.h"

#include <stdexcept>

namespace pejit {
namespace {

// JSON from files is parsed recursively; deeper input is refused, not crashed on.
constexpr int kMaxDepth = 2000;

using Json = nlohmann::json;

[[noreturn]] void Fail(const std::string& path, const std::string& message) {
  throw std::invalid_argument(path + ": " + message);
}

Tensor TensorFromJson(const Json& j, const TensorType& want, const std::string& path) {
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data")) {
    Fail(path, "expected a tensor {\"dtype\", \"shape\", \"data\"} of type " + want.ToString());
  }
  std::optional<DType> dtype = j["dtype"].is_string() ? ParseDType(j["dtype"].get<std::string>()) : std::nullopt;
  if (!dtype) Fail(path, "unknown dtype " + j["dtype"].dump());
  if (*dtype != want.dtype) Fail(path, "expected " + want.ToString() + ", got dtype " + std::string(DTypeName(*dtype)));
  Shape shape;
  if (!j["shape"].is_array()) Fail(path, "shape must be an array of sizes");
  for (const Json& d : j["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) Fail(path, "shape must be an array of sizes");
    shape.push_back(d.get<int64_t>());
  }
  bool fits = shape.size() == want.shape.size();
  for (size_t i = 0; fits && i < shape.size(); ++i) fits = want.shape[i] == kUnknownDim || want.shape[i] == shape[i];
  if (!fits) Fail(path, "expected " + want.ToString() + ", got shape " + ShapeToString(shape));
  const Json& data = j["data"];
  if (!data.is_array() || static_cast<int64_t>(data.size()) != NumElements(shape)) {
    Fail(path, "data must be a flat array of " + std::to_string(NumElements(shape)) + " numbers");
  }
  Tensor t = Tensor::Empty(*dtype, shape);
  DispatchDType(*dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (size_t i = 0; i < data.size(); ++i) {
      const Json& x = data[i];
      if (std::is_same_v<T, bool> ? !x.is_boolean() : !x.is_number()) {
        Fail(path, "data[" + std::to_string(i) + "] is not a " + std::string(DTypeName(*dtype)) + " value");
      }
      if constexpr (std::is_same_v<T, int64_t>) {
        if (!x.is_number_integer()) Fail(path, "data[" + std::to_string(i) + "] is not an integer");
      }
      p[i] = x.get<T>();
    }
  });
  return t;
}

Value FromJson(const Json& j, const Type& type, const std::function<TypeDefPtr(const std::string&)>& type_def,
               const std::string& path, int depth) {
  if (depth > kMaxDepth) Fail(path, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
  switch (type->kind) {
    case TypeKind::kTensor: return TensorFromJson(j, AsTensor(type)->type, path);
    case TypeKind::kTuple: {
      const auto& fields = AsTuple(type)->fields;
      if (!j.is_array() || j.size() != fields.size()) {
        Fail(path, "expected a tuple " + TypeToString(type) + " as an array of " + std::to_string(fields.size()));
      }
      std::vector<Value> values;
      for (size_t i = 0; i < fields.size(); ++i) {
        values.push_back(FromJson(j[i], fields[i], type_def, path + "[" + std::to_string(i) + "]", depth + 1));
      }
      return Value::Tuple(std::move(values));
    }
    case TypeKind::kAdt: {
      const AdtTypeNode* adt = AsAdt(type);
      TypeDefPtr def = type_def(adt->name);
      if (!def) Fail(path, "unknown type " + adt->name);
      if (!j.is_object() || !j.contains("ctor") || !j["ctor"].is_string()) {
        Fail(path, "expected a " + adt->name + " value {\"ctor\": ..., \"fields\": [...]}");
      }
      std::string ctor = j["ctor"].get<std::string>();
      int tag = def->FindCtor(ctor);
      if (tag < 0) Fail(path, "type " + adt->name + " has no constructor '" + ctor + "'");
      std::map<std::string, Type> bindings;
      for (size_t i = 0; i < def->params.size() && i < adt->args.size(); ++i) bindings[def->params[i]] = adt->args[i];
      const auto& field_types = def->ctors[tag].fields;
      Json fields = j.value("fields", Json::array());
      if (!fields.is_array() || fields.size() != field_types.size()) {
        Fail(path, ctor + " takes " + std::to_string(field_types.size()) + " fields");
      }
      std::vector<Value> values;
      for (size_t i = 0; i < field_types.size(); ++i) {
        values.push_back(FromJson(fields[i], SubstituteTypeVars(field_types[i], bindings), type_def,
                                  path + ".fields[" + std::to_string(i) + "]", depth + 1));
      }
      return Value::Adt(def, tag, std::move(values));
    }
    case TypeKind::kFunc: Fail(path, "functions cannot be given as JSON");
    case TypeKind::kVar: Fail(path, "type parameter " + TypeToString(type) + " is not instantiated");
  }
  Fail(path, "unsupported type");
}

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
  return FromJson(json, type, type_def, path, 0);
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
