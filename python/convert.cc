#include "python/convert.h"

#include <cstring>
#include <mutex>
#include <vector>

#include "python/dlpack.h"

namespace pejit::python {
namespace {

// The name of the capsules that own the tensors behind returned arrays: an
// array whose base is one is a pejit result, passed back without a copy.
constexpr const char* kTensorCapsule = "pejit.Tensor";

// Never freed: a tensor may drop its array after Python's finalization
// began, or during static destruction.
std::mutex& PendingMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<PyObject*>& Pending() {
  static auto* pending = new std::vector<PyObject*>;
  return *pending;
}

}  // namespace

std::shared_ptr<void> KeepAlive(py::object obj) {
  return std::shared_ptr<void>(obj.release().ptr(), [](void* p) {
    std::lock_guard<std::mutex> lock(PendingMutex());
    Pending().push_back(static_cast<PyObject*>(p));
  });
}

namespace {

py::dtype NumpyDType(DType d) {
  switch (d) {
    case DType::kF32:
      return py::dtype::of<float>();
    case DType::kF64:
      return py::dtype::of<double>();
    case DType::kI64:
      return py::dtype::of<int64_t>();
    case DType::kBool:
      return py::dtype::of<bool>();
  }
  throw std::logic_error("unknown dtype");
}

// The dtype a numpy array converts to when no type is declared: its own
// where pejit has it, int64 for other integers, float32 for other floats.
std::optional<DType> NaturalDType(const py::dtype& d) {
  const char kind = d.kind();
  if (kind == 'b') return DType::kBool;
  if (kind == 'i' || kind == 'u') return DType::kI64;
  if (kind == 'f') return d.itemsize() == 8 ? DType::kF64 : DType::kF32;
  return std::nullopt;
}

std::string ShapeOf(const py::array& a) {
  Shape shape(a.shape(), a.shape() + a.ndim());
  return ShapeToString(shape);
}

}  // namespace

std::optional<Tensor> ReturnedTensor(const py::array& a) {
  PyObject* base = py::detail::array_proxy(a.ptr())->base;
  if (!base || !PyCapsule_IsValid(base, kTensorCapsule)) return std::nullopt;
  const auto* t = static_cast<const Tensor*>(PyCapsule_GetPointer(base, kTensorCapsule));
  if (t->raw_data() != a.data() || static_cast<size_t>(a.ndim()) != t->shape().size()) return std::nullopt;
  for (int i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) != t->shape()[static_cast<size_t>(i)]) return std::nullopt;
  }
  if (!a.dtype().is(NumpyDType(t->dtype()))) return std::nullopt;
  return *t;
}

namespace {

// A Python int as a scalar of `dtype`: every digit kept (through a double,
// an i64 past 2^53 would change), and one past 64 bits refused with the range.
Tensor IntScalar(py::handle obj, DType dtype, const std::string& where) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
  if (!overflow && v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    overflow = 1;
  }
  if (overflow && IsFloat(dtype)) {
    const double d = PyLong_AsDouble(obj.ptr());
    if (!(d == -1.0 && PyErr_Occurred())) return Tensor::ScalarOf(dtype, d);
    PyErr_Clear();
  }
  if (overflow) {
    // Not its digits: Python refuses to print ints past 4,300 of them.
    const int64_t bits = obj.attr("bit_length")().cast<int64_t>();
    const std::string digits = bits <= 64 ? std::string(py::str(obj)) : "an int of " + std::to_string(bits) + " bits";
    throw ConversionError(where + ": " + digits + " does not fit in " + std::string(DTypeName(dtype)) +
                          (IsFloat(dtype) ? "" : " (-2^63 to 2^63-1)"));
  }
  if (dtype == DType::kI64) return Tensor::FromVector<int64_t>({}, {static_cast<int64_t>(v)});
  return Tensor::ScalarOf(dtype, static_cast<double>(v));
}

// `obj` (an array, a numpy scalar, a Python number) as a tensor of dtype
// `want` (none: the array's own, NaturalDType).
Tensor ToTensor(py::handle obj, std::optional<DType> want, const std::string& where) {
  // A Python int beyond 64 bits has no numpy array to become.
  if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) {
    int overflow = 0;
    PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow) return IntScalar(obj, want.value_or(DType::kI64), where);
  }
  if (IsDlpack(obj)) return FromDlpack(obj, want, where);
  const bool is_array = py::isinstance<py::array>(obj);
  py::array a = py::array::ensure(obj);
  if (!a) {
    PyErr_Clear();
    throw ConversionError(where + ": expected a tensor (a numpy array or a number), got " +
                          std::string(py::str(py::type::of(obj).attr("__name__"))));
  }
  if (a.dtype().kind() == 'O' || a.dtype().kind() == 'U' || a.dtype().kind() == 'S') {
    throw ConversionError(where + ": expected a tensor, got an array of " + std::string(py::str(a.dtype())) +
                          " (a nested list of unequal lengths, or not numbers?)");
  }
  if (!want) {
    want = NaturalDType(a.dtype());
    if (!want)
      throw ConversionError(where + ": numpy dtype " + std::string(py::str(a.dtype())) + " has no pejit dtype");
  }
  if (std::optional<Tensor> returned = ReturnedTensor(a); returned && returned->dtype() == *want) {
    CountSharedIn();
    return *returned;
  }
  py::dtype target = NumpyDType(*want);
  if (!a.dtype().is(target)) {
    // Same kind or safer (f64 -> f32, i64 -> f32), never float -> integer.
    static auto* can_cast = new py::object(py::module_::import("numpy").attr("can_cast"));  // never freed, as above
    if (!(*can_cast)(a.dtype(), target, py::arg("casting") = "same_kind").cast<bool>()) {
      throw ConversionError(where + ": expected " + std::string(DTypeName(*want)) + ", got an array of " +
                            std::string(py::str(a.dtype())) + " " + ShapeOf(a));
    }
  }
  Shape shape(a.shape(), a.shape() + a.ndim());
  const bool shareable = a.dtype().is(target) && (a.flags() & py::array::c_style) && a.writeable() &&
                         reinterpret_cast<uintptr_t>(a.data()) % 64 == 0;
  if (shareable) {
    void* data = a.mutable_data();
    CountSharedIn();
    return Tensor::Wrap(data, *want, std::move(shape), KeepAlive(py::reinterpret_borrow<py::object>(a)));
  }
  // A copy: contiguous, in the target dtype, into a buffer of pejit's own.
  py::array converted =
      py::array::ensure(a.attr("astype")(target, py::arg("order") = "C", py::arg("copy") = false), py::array::c_style);
  Tensor t = Tensor::Empty(*want, std::move(shape));
  if (t.nbytes() > 0) std::memcpy(t.raw_data(), converted.data(), t.nbytes());
  if (is_array) CountCopiedIn(static_cast<int64_t>(t.nbytes()));  // not a number's conversion
  return t;
}

bool IsPyValue(py::handle obj) { return py::isinstance<PyValue>(obj); }

}  // namespace

void CheckMadeHere(const Value& v, const ModuleSnapshot* module, const std::string& where) {
  if (!module || v.kind() != Value::Kind::kAdt) return;
  if (std::string why = module->ForeignConstructors(*v.adt()); !why.empty()) throw ConversionError(where + ": " + why);
}

namespace {

// Python containers nest no deeper than this in one conversion (the C++
// recursion's bound; a tree deeper than that is built by constructors).
constexpr int kMaxNesting = 1000;

Value Convert(py::handle obj, const Type& type, const ModuleSnapshot* module, const std::string& where, int depth);

Value ListValue(py::handle obj, const Type& element, const ModuleSnapshot* module, const std::string& where,
                int depth) {
  TypeDefPtr list = module ? module->FindType("List") : nullptr;
  if (!list) throw ConversionError(where + ": the module defines no List type");
  const int nil = list->FindCtor("Nil"), cons = list->FindCtor("Cons");
  py::sequence items = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<Value> converted;
  converted.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    converted.push_back(Convert(items[i], element, module, where + " element " + std::to_string(i), depth + 1));
  }
  Value out = Value::Adt(list, nil, {});
  for (auto it = converted.rbegin(); it != converted.rend(); ++it) out = Value::Adt(list, cons, {std::move(*it), out});
  return out;
}

std::string Describe(py::handle obj) { return std::string(py::str(py::type::of(obj).attr("__name__"))); }

Value Convert(py::handle obj, const Type& type, const ModuleSnapshot* module, const std::string& where, int depth) {
  if (IsPyValue(obj)) {
    const Value& v = obj.cast<const PyValue&>().value;
    CheckMadeHere(v, module, where);
    return v;
  }
  if (depth > kMaxNesting) {
    throw ConversionError(where + ": nested deeper than " + std::to_string(kMaxNesting) +
                          " containers (build deep trees with the module's constructors)");
  }
  if (!type || type->kind == TypeKind::kVar) {  // untyped: what the object is
    if (py::isinstance<py::dict>(obj)) {
      throw ConversionError(where + ": a dict is a record by field name, whose field order only its type gives: pass "
                            "it to an entry as it is, or convert it with entry.convert(...)");
    }
    if (py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) {
      std::vector<Value> fields;
      size_t i = 0;
      for (py::handle item : obj)
        fields.push_back(Convert(item, nullptr, module, where + " field " + std::to_string(i++), depth + 1));
      return Value::Tuple(std::move(fields));
    }
    if (py::isinstance<py::bool_>(obj)) return Tensor::ScalarOf(DType::kBool, obj.cast<bool>());
    if (py::isinstance<py::int_>(obj)) return IntScalar(obj, DType::kI64, where);
    if (py::isinstance<py::float_>(obj)) return Tensor::Scalar(obj.cast<float>());
    return ToTensor(obj, std::nullopt, where);
  }
  switch (type->kind) {
    case TypeKind::kTensor: {
      const TensorType& t = AsTensor(type)->type;
      // A Python number for a scalar: no numpy array on the way.
      if (t.shape.empty() && (PyFloat_CheckExact(obj.ptr()) || PyLong_CheckExact(obj.ptr()))) {
        if (PyFloat_CheckExact(obj.ptr()) && !IsFloat(t.dtype)) {
          throw ConversionError(where + ": expected " + std::string(DTypeName(t.dtype)) + ", got a float");
        }
        if (PyLong_CheckExact(obj.ptr())) return IntScalar(obj, t.dtype, where);
        return Tensor::ScalarOf(t.dtype, PyFloat_AsDouble(obj.ptr()));
      }
      return ToTensor(obj, t.dtype, where);
    }
    case TypeKind::kTuple: {
      const TupleTypeNode& tuple = *AsTuple(type);
      const size_t n = tuple.fields.size();
      auto field_where = [&](size_t i) {
        return where + " field " + (tuple.names.empty() ? std::to_string(i) : tuple.names[i]);
      };
      std::vector<Value> fields;
      if (py::isinstance<py::dict>(obj) && !tuple.names.empty()) {
        py::dict d = py::reinterpret_borrow<py::dict>(obj);
        for (size_t i = 0; i < n; ++i) {
          if (!d.contains(tuple.names[i]))
            throw ConversionError(where + ": the dict has no field '" + tuple.names[i] + "'");
          fields.push_back(Convert(d[py::str(tuple.names[i])], tuple.fields[i], module, field_where(i), depth + 1));
        }
        if (d.size() != n) {
          for (auto [key, _] : d) {
            std::string name = py::str(key);
            if (tuple.FieldIndex(name) < 0) throw ConversionError(where + ": the record has no field '" + name + "'");
          }
        }
        return Value::Tuple(std::move(fields));
      }
      if (!py::isinstance<py::tuple>(obj) && !py::isinstance<py::list>(obj)) {
        throw ConversionError(where + ": expected a tuple of " + std::to_string(n) +
                              (tuple.names.empty() ? "" : " (or a dict)") + ", got " + Describe(obj));
      }
      py::sequence items = py::reinterpret_borrow<py::sequence>(obj);
      if (items.size() != n) {
        throw ConversionError(where + ": expected a tuple of " + std::to_string(n) + ", got " +
                              std::to_string(items.size()) + " items");
      }
      for (size_t i = 0; i < n; ++i)
        fields.push_back(Convert(items[i], tuple.fields[i], module, field_where(i), depth + 1));
      return Value::Tuple(std::move(fields));
    }
    case TypeKind::kAdt: {
      const AdtTypeNode& adt = *AsAdt(type);
      if (adt.name == "List" && adt.args.size() == 1 &&
          (py::isinstance<py::list>(obj) || py::isinstance<py::tuple>(obj))) {
        return ListValue(obj, adt.args[0], module, where, depth);
      }
      throw ConversionError(where + ": expected a " + adt.name +
                            " value (a pejit.Value made by one of its constructors" +
                            (adt.name == "List" ? ", or a Python list" : "") + "), got " + Describe(obj));
    }
    default:
      throw ConversionError(where + ": a function value is passed as a pejit.Value only");
  }
}

}  // namespace

Value ToValue(py::handle obj, const Type& type, const ModuleSnapshot* module, const std::string& where) {
  return Convert(obj, type, module, where, 0);
}

namespace {

bool ContainsDict(py::handle obj, int depth = 0) {
  if (depth > kMaxNesting) return false;
  if (py::isinstance<py::dict>(obj)) return true;
  if (py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) {
    for (py::handle item : obj) {
      if (ContainsDict(item, depth + 1)) return true;
    }
  }
  return false;
}

Value PairLeaves(py::handle params, py::handle grads, const std::string& at, int depth, StepValues& out,
                 Value* grad_out) {
  if (depth > kMaxNesting) throw ConversionError("params" + at + ": nested deeper than " + std::to_string(kMaxNesting));
  if (IsPyValue(params)) {  // updated in place as it is; its gradient converted to its type
    const PyValue& p = params.cast<const PyValue&>();
    *grad_out = IsPyValue(grads) ? grads.cast<const PyValue&>().value : ToValue(grads, p.type, nullptr, "grads" + at);
    return p.value;
  }
  if (py::isinstance<py::dict>(params)) {
    if (!py::isinstance<py::dict>(grads)) {
      throw ConversionError("grads" + at + ": a dict by field name, as params" + at + " is, expected; got " +
                            Describe(grads) + " (value_and_grad returns a dict argument's gradients as a dict)");
    }
    py::dict p = py::reinterpret_borrow<py::dict>(params), g = py::reinterpret_borrow<py::dict>(grads);
    for (auto [key, _] : g) {
      if (!p.contains(key)) {
        throw ConversionError("grads" + at + ": has '" + std::string(py::str(key)) + "', which params" + at +
                              " has not");
      }
    }
    // In sorted key order, not insertion order: the optimizer keeps its
    // state by leaf position, and a dict rebuilt in another order must
    // still reach the same state.
    std::vector<Value> pf, gf;
    for (py::handle key : py::module_::import("builtins").attr("sorted")(p)) {
      const std::string here = at + "['" + std::string(py::str(key)) + "']";
      if (!g.contains(key)) throw ConversionError("grads" + at + ": has no '" + std::string(py::str(key)) + "'");
      Value gv;
      pf.push_back(PairLeaves(p[key], g[key], here, depth + 1, out, &gv));
      gf.push_back(std::move(gv));
    }
    *grad_out = Value::Tuple(std::move(gf));
    return Value::Tuple(std::move(pf));
  }
  if (py::isinstance<py::tuple>(params) || py::isinstance<py::list>(params)) {
    if (!(py::isinstance<py::tuple>(grads) || py::isinstance<py::list>(grads)) || py::len(grads) != py::len(params)) {
      throw ConversionError("grads" + at + ": a tuple of " + std::to_string(py::len(params)) + ", as params" + at +
                            " is, expected; got " + Describe(grads));
    }
    py::sequence p = py::reinterpret_borrow<py::sequence>(params), g = py::reinterpret_borrow<py::sequence>(grads);
    std::vector<Value> pf, gf;
    for (size_t i = 0; i < p.size(); ++i) {
      Value gv;
      pf.push_back(PairLeaves(p[i], g[i], at + "[" + std::to_string(i) + "]", depth + 1, out, &gv));
      gf.push_back(std::move(gv));
    }
    *grad_out = Value::Tuple(std::move(gf));
    return Value::Tuple(std::move(pf));
  }
  if (!py::isinstance<py::array>(params)) {
    throw ConversionError("params" + at + ": a writeable float32 numpy array (updated in place) expected, got " +
                          Describe(params));
  }
  py::array a = py::reinterpret_borrow<py::array>(params);
  if (!a.dtype().is(py::dtype::of<float>()) || !a.writeable()) {
    throw ConversionError("params" + at + ": a writeable float32 numpy array (updated in place) expected, got " +
                          (a.writeable() ? "an array of " + std::string(py::str(a.dtype())) : "a read-only array"));
  }
  Tensor t = ToTensor(a, DType::kF32, "params" + at);
  if (t.raw_data() != a.data()) out.copied.emplace_back(a, t);
  Tensor g = ToTensor(grads, DType::kF32, "grads" + at);
  if (g.shape() != t.shape()) {
    throw ConversionError("grads" + at + ": " + g.type().ToString() + " for a parameter of " + t.type().ToString());
  }
  *grad_out = Value(std::move(g));
  return Value(std::move(t));
}

}  // namespace

StepValues PairForStep(py::handle params, py::handle grads) {
  StepValues out;
  out.params = PairLeaves(params, grads, "", 0, out, &out.grads);
  return out;
}

void StepValues::WriteBack() const {
  for (const auto& [array, tensor] : copied) {
    // Where ToTensor copied a strided or misaligned array: back, element by element through numpy.
    py::array_t<float> source({tensor.shape().begin(), tensor.shape().end()}, tensor.data<float>());
    array.attr("__setitem__")(py::ellipsis(), source);
  }
}

Value GradsFor(const PyValue& params, py::handle grads) {
  if (IsPyValue(grads)) return grads.cast<const PyValue&>().value;
  if (!ContainsDict(grads)) return ToValue(grads, nullptr, nullptr, "grads");  // the optimizer checks the structure
  if (!params.type) {
    throw ConversionError("grads: gradients by field name need the parameters' record type: make params with "
                          "entry.convert(...), or pass params as a dict too");
  }
  return ToValue(grads, params.type, nullptr, "grads");
}

py::object FromValue(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kTensor: {
      const Tensor& t = v.tensor();
      py::capsule owner(new Tensor(t), kTensorCapsule, [](PyObject* capsule) {
        delete static_cast<Tensor*>(PyCapsule_GetPointer(capsule, kTensorCapsule));
      });
      std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
      py::array a(NumpyDType(t.dtype()), shape, {}, t.raw_data(), owner);
      // Read-only: the memory may be shared with the engine (a result that
      // is an argument, a constant of compiled code).
      py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
      if (t.rank() == 0) return a[py::tuple()];  // a numpy scalar
      return a;
    }
    case Value::Kind::kTuple: {
      const std::vector<Value>& fields = v.fields();
      py::tuple out(fields.size());
      for (size_t i = 0; i < fields.size(); ++i) out[i] = FromValue(fields[i]);
      return out;
    }
    default:
      return py::cast(PyValue{v, nullptr});
  }
}

void ReleasePendingReferences() {
  std::vector<PyObject*> release;
  {
    std::lock_guard<std::mutex> lock(PendingMutex());
    if (Pending().empty()) return;
    release.swap(Pending());
  }
  for (PyObject* p : release) Py_DECREF(p);
}

}  // namespace pejit::python
