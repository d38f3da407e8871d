// The `pejit` Python module: the engine, its live module, entry handles in
// one mode each, values and the optimizers, over the C++ library. Every call
// that runs or waits releases the GIL; C++ errors become Python exceptions.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "interp/interpreter.h"
#include "ir/prelude.h"
#include "ir/source.h"
#include "ops/blas.h"
#include "ops/op.h"
#include "python/convert.h"
#include "python/dlpack.h"
#include "scheduler/engine.h"
#include "scheduler/policy.h"
#include "support/interrupt.h"
#include "support/refusal.h"
#include "train/lookahead.h"
#include "train/optimizer.h"

namespace pejit::python {
namespace {

// The engine of a Python `Engine`. Calls hold their own reference, so that
// close() (or the last Python reference going) never frees an engine a call
// on another thread is using; entries hold the Python object.
struct PyEngine {
  std::shared_ptr<Engine> engine;

  std::shared_ptr<Engine> Get() const {
    if (!engine) throw std::runtime_error("the engine is closed");
    return engine;
  }
};

struct PyModule {
  py::object owner;  // the PyEngine
  std::shared_ptr<Engine> engine() const { return owner.cast<PyEngine&>().Get(); }
};

// A constructor of an ADT of the module, called as m.Node(...).
struct PyConstructor {
  Snapshot snapshot;
  TypeDefPtr def;
  int tag;
};

struct PyEntry {
  py::object owner;  // the PyEngine
  Entry entry;
  bool single_wrt = false;  // made with wrt=int: one gradient, not a tuple
};

// The arguments converted to `name`'s parameter types, and those types.
std::vector<Value> Arguments(Engine& engine, const std::string& name, const py::args& args,
                             std::vector<Type>* types = nullptr) {
  ReleasePendingReferences();
  Snapshot snapshot = engine.module().snapshot();
  const Definition* def = snapshot->Find(name);
  if (!def) throw EvalError("@" + name + ": no longer defined in the module");
  const auto& params = def->func->params;
  if (args.size() != params.size()) {
    throw ConversionError("@" + name + " takes " + std::to_string(params.size()) + " arguments, got " +
                          std::to_string(args.size()));
  }
  if (types) {
    types->clear();
    for (const auto& p : params) types->push_back(p->annotation);
  }
  std::vector<Value> out;
  out.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (py::isinstance<PyValue>(args[i])) {  // the loop's common case: no conversion, no message built
      const Value& v = args[i].cast<const PyValue&>().value;
      if (v.kind() == Value::Kind::kAdt) {
        if (std::string why = snapshot->ForeignConstructors(*v.adt()); !why.empty()) {
          throw ConversionError("@" + name + " argument " + std::to_string(i) + " (%" + params[i]->name + "): " + why);
        }
      }
      out.push_back(v);
      continue;
    }
    out.push_back(ToValue(args[i], params[i]->annotation, snapshot.get(),
                          "@" + name + " argument " + std::to_string(i) + " (%" + params[i]->name + ")"));
  }
  return out;
}

// An entry call's arguments, converted, and the engine they run on: held,
// so that close() on another thread cannot free it under the call.
struct CallArguments {
  std::shared_ptr<Engine> engine;
  std::vector<Value> values;
  std::vector<Type> types;  // the parameters' declared types
};

CallArguments ArgumentsOf(const PyEntry& e, const py::args& args) {
  std::shared_ptr<Engine> engine = e.owner.cast<PyEngine&>().Get();
  std::vector<Type> types;
  std::vector<Value> values = Arguments(*engine, e.entry.name(), args, &types);
  return {std::move(engine), std::move(values), std::move(types)};
}

// A gradient `grad` (as FromValue made it) shaped as the argument `arg` the
// caller passed for a parameter of `type`: a record passed as a dict gets
// its gradient as a dict with the same keys (at any depth), as JAX returns a
// pytree's; anything else keeps FromValue's shape (tuples in field order).
py::object ShapedLike(py::object grad, py::handle arg, const Type& type) {
  const TupleTypeNode* tuple = type ? AsTuple(type) : nullptr;
  if (!tuple || !py::isinstance<py::tuple>(grad)) return grad;
  py::tuple fields = py::reinterpret_borrow<py::tuple>(grad);
  if (fields.size() != tuple->fields.size()) return grad;
  if (py::isinstance<py::dict>(arg) && !tuple->names.empty()) {
    py::dict out;
    for (auto [key, value] : py::reinterpret_borrow<py::dict>(arg)) {
      const int i = tuple->FieldIndex(std::string(py::str(key)));
      if (i >= 0) out[key] = ShapedLike(fields[static_cast<size_t>(i)], value, tuple->fields[static_cast<size_t>(i)]);
    }
    return out;
  }
  if ((py::isinstance<py::tuple>(arg) || py::isinstance<py::list>(arg)) && py::len(arg) == fields.size()) {
    py::sequence items = py::reinterpret_borrow<py::sequence>(arg);
    py::tuple out(fields.size());
    for (size_t i = 0; i < fields.size(); ++i) out[i] = ShapedLike(fields[i], items[i], tuple->fields[i]);
    return out;
  }
  return grad;
}

Prefetch PrefetchWhen(const std::string& when) {
  if (when == "next") return Prefetch::kNext;
  if (when == "idle") return Prefetch::kWhenIdle;
  throw std::invalid_argument("prefetch: when must be 'next' or 'idle', not '" + when + "'");
}

// The gradients for Python, each shaped like its argument (ShapedLike).
py::object GradsOut(const PyEntry& e, const std::vector<Value>& grads, const py::args& args,
                    const std::vector<Type>& types) {
  const std::vector<int>& wrt = *e.entry.wrt();
  auto one = [&](size_t k) {
    const auto i = static_cast<size_t>(wrt.at(k));
    return ShapedLike(FromValue(grads.at(k)), args[i], types.at(i));
  };
  if (e.single_wrt) return one(0);
  py::tuple out(grads.size());
  for (size_t k = 0; k < grads.size(); ++k) out[k] = one(k);
  return out;
}

// Ctrl-C during a call: while the call runs with the GIL released, its
// loops and waits poll this check (support/interrupt.h), which takes the GIL
// and runs Python's signal handlers. A KeyboardInterrupt (or any exception a
// handler raised) stops the call, and is raised where the call was made.
class PyInterrupt {
 public:
  PyInterrupt()
      : scoped_([this] {
          if (raised_) return true;  // sticky: a tier that fell back asks again
          py::gil_scoped_acquire gil;
          if (PyErr_CheckSignals() == 0) return false;
          PyErr_Fetch(&type_, &value_, &trace_);
          raised_ = true;
          return true;
        }) {}
  // Under the GIL, after the call threw Interrupted.
  [[noreturn]] void Raise() {
    PyErr_Restore(type_, value_, trace_);
    type_ = value_ = trace_ = nullptr;
    throw py::error_already_set();
  }

 private:
  bool raised_ = false;
  PyObject *type_ = nullptr, *value_ = nullptr, *trace_ = nullptr;
  ScopedInterruptCheck scoped_;
};

// Runs `call` with the GIL released, stoppable by Ctrl-C (PyInterrupt).
template <typename F>
auto Interruptible(F&& call) {
  PyInterrupt interrupt;
  try {
    py::gil_scoped_release release;
    return call();
  } catch (const Interrupted&) {
    interrupt.Raise();
  }
}

py::tuple ValueAndGradOf(const PyEntry& e, const py::args& args) {
  if (!e.entry.wrt()) {
    throw py::type_error("@" + e.entry.name() + ": value_and_grad on an entry made without wrt; use engine.entry(\"" +
                         e.entry.name() + "\", wrt=...)");
  }
  CallArguments call = ArgumentsOf(e, args);
  ValueAndGrad r = Interruptible([&] { return e.entry.value_and_grad(call.values); });
  return py::make_tuple(FromValue(r.value), GradsOut(e, r.grads, args, call.types));
}

// A cotangent from Python shaped like `like`, a pullback's value: its
// tuples as tuples or lists, its tensors as anything a tensor argument takes
// (None: zeros, or the value's own tensor where it is not a float), other
// values as a pejit.Value.
Value CotangentFor(py::handle obj, const Value& like, const std::string& where) {
  if (py::isinstance<PyValue>(obj)) return obj.cast<const PyValue&>().value;
  if (like.is_tensor()) {
    const Tensor& t = like.tensor();
    if (obj.is_none()) return IsFloat(t.dtype()) ? Value(Tensor::Zeros(t.dtype(), t.shape())) : like;
    return ToValue(obj, TensorTy(t.type()), nullptr, where);
  }
  if (like.kind() == Value::Kind::kTuple) {
    const size_t n = like.fields().size();
    if (!(py::isinstance<py::tuple>(obj) || py::isinstance<py::list>(obj)) || py::len(obj) != n) {
      throw ConversionError(where + ": expected a tuple of " + std::to_string(n) + " like the result, got " +
                            std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
    py::sequence items = py::reinterpret_borrow<py::sequence>(obj);
    std::vector<Value> fields;
    for (size_t i = 0; i < n; ++i) fields.push_back(CotangentFor(items[i], like.fields()[i], where + "." + std::to_string(i)));
    return Value::Tuple(std::move(fields));
  }
  throw ConversionError(where + ": the result holds a structure value here; pass its cotangent as a pejit.Value");
}

// What Entry.value_and_pullback returns beside the value: the engine's
// pullback, and what shapes its answers for Python.
struct PyPullback {
  PyEntry entry;
  std::shared_ptr<Engine> engine;  // held: close() on another thread cannot free it under the pullback
  std::function<std::vector<Value>(const Value&)> pullback;
  Value value;
  py::args args;
  std::vector<Type> types;
  std::string tier;
};

py::tuple ValueAndPullbackOf(const PyEntry& e, const py::args& args) {
  if (!e.entry.wrt()) {
    throw py::type_error("@" + e.entry.name() +
                         ": value_and_pullback on an entry made without wrt; use engine.entry(\"" + e.entry.name() +
                         "\", wrt=...)");
  }
  CallArguments call = ArgumentsOf(e, args);
  ValueAndPullback r = Interruptible([&] { return e.entry.value_and_pullback(call.values); });
  py::object value = FromValue(r.value);
  PyPullback p{e, call.engine, std::move(r.pullback), std::move(r.value), args, std::move(call.types), r.tier};
  return py::make_tuple(value, std::move(p));
}

py::dict StatsDict(const EntryStats& s) {
  py::dict d;
  d["calls"] = s.calls();
  d["calls_interpreter"] = s.calls_interpreter;
  d["calls_residual_interpreter"] = s.calls_residual_interpreter;
  d["calls_native"] = s.calls_native;
  d["calls_baseline"] = s.calls_baseline;
  d["calls_generic"] = s.calls_generic;
  d["calls_generic_native"] = s.calls_generic_native;
  d["calls_generic_interpreted"] = s.calls_generic_interpreted();
  d["calls_compiled"] = s.calls_compiled();
  d["generic_runs"] = s.generic_runs;
  d["generic_native_runs"] = s.generic_native_runs;
  d["hits"] = s.hits;
  d["misses"] = s.misses;
  d["compiled"] = s.compiled;
  d["refused"] = s.refused;
  d["failed"] = s.failed;
  d["evicted"] = s.evicted;
  d["invalidated"] = s.invalidated;
  d["cancelled"] = s.cancelled;
  d["prefetched"] = s.prefetched;
  d["loaded"] = s.loaded;
  return d;
}

std::optional<std::vector<int>> WrtFrom(const py::object& wrt, bool* single) {
  *single = false;
  if (wrt.is_none()) return std::nullopt;
  if (py::isinstance<py::int_>(wrt)) {
    *single = true;
    return std::vector<int>{wrt.cast<int>()};
  }
  return wrt.cast<std::vector<int>>();
}

std::string ValueRepr(const Value& v) {
  std::string text = v.ToString();
  if (text.size() > 400) text = text.substr(0, 400) + "...";
  return "pejit.Value(" + text + ")";
}

}  // namespace

// pejit._pejit; the package's __init__.py presents it as `pejit`.
PYBIND11_MODULE(_pejit, m) {
  m.doc() = "pejit: a tiered JIT for dynamic deep-learning programs (docs/python.md)";

  // Errors: the C++ messages, as exceptions of the module (all pejit.Error).
  // Never freed: a static's destructor would run after Python's finalization.
  static auto* error = new py::exception<std::runtime_error>(m, "Error", PyExc_RuntimeError);
  static auto* ir_error = new py::exception<IrError>(m, "IrError", error->ptr());
  static auto* eval_error = new py::exception<EvalError>(m, "EvalError", error->ptr());
  static auto* op_error = new py::exception<OpError>(m, "OpError", error->ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const IrError& e) {
      (*ir_error)(e.what());
    } catch (const EvalError& e) {
      (*eval_error)(e.what());
    } catch (const OpError& e) {
      (*op_error)(e.what());
    } catch (const ConversionError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const Refusal& e) {
      (*error)(e.what());
    }
  });

  m.def("set_blas_threads", &SetBlasThreads, py::arg("threads"),
        "OpenBLAS's thread count (1 for the small GEMMs of models whose parallelism is the engine's own).");

  m.def(
      "prelude_names",
      [] {
        const Prelude& prelude = Prelude::Shared();
        py::dict d;
        d["functions"] = prelude.DefinitionNames();
        d["constructors"] = prelude.ConstructorNames();
        return d;
      },
      "The names every module has on use (ir/prelude.h): the prelude's definitions and constructors.");
  m.def(
      "to_dlpack",
      [](py::handle obj) {
        if (py::isinstance<py::array>(obj)) {  // a result: no conversion, not counted as an input
          if (std::optional<Tensor> t = ReturnedTensor(py::reinterpret_borrow<py::array>(obj))) return ToDlpack(*t);
        }
        Value v = ToValue(obj, nullptr, nullptr, "to_dlpack");
        if (v.kind() != Value::Kind::kTensor) throw ConversionError("to_dlpack: expected a tensor, got " + v.ToString());
        return ToDlpack(v.tensor());
      },
      py::arg("tensor"),
      "A tensor (an array pejit returned, a pejit.Value, a numpy array) as a DLPack capsule viewing its memory, for "
      "torch.utils.dlpack.from_dlpack. Do not write the consumer's tensor in place: pejit may hold the same memory.");
  m.def(
      "from_dlpack",
      [](py::handle obj) {
        ReleasePendingReferences();
        return PyValue{FromDlpack(obj, std::nullopt, "from_dlpack"), nullptr};
      },
      py::arg("tensor"),
      "A DLPack capsule, or an object with __dlpack__ (a detached torch tensor), as a pejit.Value viewing its memory "
      "(copied when not row-major compact and 64-byte aligned).");
  m.def(
      "transfers",
      [] {
        TransferCounts t = Transfers();
        py::dict d;
        d["shared_in"] = t.shared_in;
        d["copied_in"] = t.copied_in;
        d["copied_in_bytes"] = t.copied_in_bytes;
        d["exported"] = t.exported;
        return d;
      },
      "Counts of arrays and DLPack tensors passed in shared or copied, and of tensors exported through DLPack, since "
      "the process started or reset_transfers().");
  m.def("reset_transfers", &ResetTransfers);

  py::class_<PyValue>(m, "Value",
                      "A program value held by pejit: passed again to an entry, it is not converted, and the engine "
                      "recognizes a structure it has seen.")
      .def(py::init([](py::handle obj) { return PyValue{ToValue(obj, nullptr, nullptr, "pejit.Value"), nullptr}; }),
           py::arg("obj"), "Converts a numpy array, a number or a (nested) tuple of them, copying what must be copied.")
      .def_property_readonly("kind",
                             [](const PyValue& v) {
                               switch (v.value.kind()) {
                                 case Value::Kind::kTensor:
                                   return "tensor";
                                 case Value::Kind::kTuple:
                                   return "tuple";
                                 case Value::Kind::kAdt:
                                   return "adt";
                                 case Value::Kind::kClosure:
                                   return "function";
                                 default:
                                   return "none";
                               }
                             })
      .def_property_readonly("ctor",
                             [](const PyValue& v) -> py::object {
                               if (v.value.kind() != Value::Kind::kAdt) return py::none();
                               return py::str(v.value.ctor_name());
                             })
      .def_property_readonly("fields",
                             [](const PyValue& v) {
                               py::tuple out(v.value.fields().size());
                               for (size_t i = 0; i < out.size(); ++i) out[i] = FromValue(v.value.fields()[i]);
                               return out;
                             })
      .def(
          "numpy", [](const PyValue& v) { return FromValue(v.value); },
          "Tensors as read-only numpy arrays, tuples as tuples.")
      .def("__repr__", [](const PyValue& v) { return ValueRepr(v.value); });

  py::class_<PyConstructor>(m, "Constructor", "A constructor of one of the module's types, called as m.Node(...).")
      .def("__call__",
           [](const PyConstructor& c, const py::args& args) {
             ReleasePendingReferences();
             const CtorDef& ctor = c.def->ctors[static_cast<size_t>(c.tag)];
             if (args.size() != ctor.fields.size()) {
               throw ConversionError(ctor.name + " takes " + std::to_string(ctor.fields.size()) + " fields, got " +
                                     std::to_string(args.size()));
             }
             std::vector<Value> fields;
             fields.reserve(args.size());
             for (size_t i = 0; i < args.size(); ++i) {
               fields.push_back(
                   ToValue(args[i], ctor.fields[i], c.snapshot.get(), ctor.name + " field " + std::to_string(i)));
             }
             return PyValue{Value::Adt(c.def, c.tag, std::move(fields)), nullptr};
           })
      .def("__repr__", [](const PyConstructor& c) {
        return "<constructor " + c.def->ctors[static_cast<size_t>(c.tag)].name + " of " + c.def->name + ">";
      });

  py::class_<PyModule>(m, "Module", "The engine's live module: definitions added, replaced and removed at any time.")
      .def(
          "add_source",
          [](const PyModule& mod, const std::string& text, const std::string& name) {
            return mod.engine()->module().AddSource(text, name);
          },
          py::arg("text"), py::arg("name") = "<python>",
          "Adds a .pj text's types and definitions; returns their names.")
      .def(
          "replace",
          [](const PyModule& mod, const std::string& text, const std::string& name) {
            return mod.engine()->module().AddSource(text, name, /*replace_existing=*/true);
          },
          py::arg("text"), py::arg("name") = "<python>",
          "Adds or replaces the text's definitions; specializations that used them are invalidated.")
      .def(
          "remove", [](const PyModule& mod, const std::string& name) { mod.engine()->module().Remove(name); },
          py::arg("name"), "Removes a definition; code that used it is invalidated.")
      .def(
          "names", [](const PyModule& mod) { return mod.engine()->module().snapshot()->Names(); },
          "The names of the module's definitions.")
      .def(
          "text", [](const PyModule& mod) { return mod.engine()->module().snapshot()->Print(); },
          "The module printed in the text format (docs/language.md).")
      .def(
          "signature",
          [](const PyModule& mod, const std::string& name) {
            Snapshot snapshot = mod.engine()->module().snapshot();
            const Definition* def = snapshot->Find(name);
            if (!def) throw EvalError("@" + name + ": not defined in the module");
            py::list params;
            for (const auto& p : def->func->params) params.append(py::make_tuple(p->name, TypeToString(p->annotation)));
            py::dict out;
            out["params"] = params;
            out["returns"] = def->func->ret_type ? py::object(py::str(TypeToString(def->func->ret_type))) : py::none();
            out["generic"] = !def->func->type_params.empty();
            return out;
          },
          py::arg("name"),
          "A definition's parameters as (name, type) pairs, its declared result type (None: inferred) and whether it "
          "is generic, the types as the text format writes them.")
      .def("__getattr__", [](const PyModule& mod, const std::string& name) {
        Snapshot snapshot = mod.engine()->module().snapshot();
        for (const auto& [type_name, def] : snapshot->types()) {
          int tag = def->FindCtor(name);
          if (tag >= 0) return PyConstructor{snapshot, def, tag};
        }
        throw py::attribute_error("the module has no constructor '" + name + "'");
      });

  py::class_<CodeStatus>(m, "CodeStatus",
                         "Where a signature's code stands: state, the tier that serves it, why it failed or was "
                         "refused (reason), its code's bytes.")
      .def_property_readonly("state", [](const CodeStatus& s) { return std::string(CodeStateName(s.state)); })
      .def_readonly("reason", &CodeStatus::reason)
      .def_readonly("tier", &CodeStatus::tier)
      .def_readonly("code_bytes", &CodeStatus::code_bytes)
      .def_property_readonly("ready", &CodeStatus::ready)
      .def_property_readonly("failed", &CodeStatus::failed)
      .def("__repr__", [](const CodeStatus& s) {
        std::string out = std::string("<CodeStatus ") + CodeStateName(s.state);
        if (!s.tier.empty()) out += " " + s.tier;
        if (!s.reason.empty()) out += ": " + s.reason;
        return out + ">";
      });

  py::class_<PyPullback>(m, "Pullback",
                         "The backward half of Entry.value_and_pullback: call it once with a cotangent shaped like "
                         "the value (None for a leaf: zeros).")
      .def_property_readonly("tier", [](const PyPullback& p) { return p.tier; },
                             "Where the forward ran: 'native' (per-minibatch code), 'generic' or 'interpreter'.")
      .def("__call__",
           [](PyPullback& p, py::object cotangent) -> py::object {
             Value ct = CotangentFor(cotangent, p.value, "@" + p.entry.entry.name() + " cotangent");
             std::vector<Value> grads = Interruptible([&] { return p.pullback(ct); });
             return GradsOut(p.entry, grads, p.args, p.types);
           },
           py::arg("cotangent"), "The gradients of sum(value * cotangent) with respect to the entry's wrt.");

  py::class_<PyEntry>(m, "Entry",
                      "One entry of the module in one mode: value mode (calling it returns the value) or grad mode "
                      "(made with wrt: calling it returns (value, gradients)).")
      .def_property_readonly("name", [](const PyEntry& e) { return e.entry.name(); })
      .def_property_readonly("wrt",
                             [](const PyEntry& e) -> py::object {
                               if (!e.entry.wrt()) return py::none();
                               if (e.single_wrt) return py::int_(e.entry.wrt()->at(0));
                               return py::tuple(py::cast(*e.entry.wrt()));
                             })
      .def("__call__",
           [](const PyEntry& e, const py::args& args) -> py::object {
             if (e.entry.wrt()) return ValueAndGradOf(e, args);
             CallArguments call = ArgumentsOf(e, args);
             return FromValue(Interruptible([&] { return e.entry.call(call.values); }));
           },
           "Runs the entry: its value (value mode) or (value, gradients) (grad mode). Releases the GIL; Ctrl-C "
           "stops it.")
      .def("value_and_grad", &ValueAndGradOf, "(value, gradients) of a grad-mode entry.")
      .def("value_and_pullback", &ValueAndPullbackOf,
           "(value, pullback) of a grad-mode entry whose result may be any tensors and tuples (jax.vjp): "
           "pullback(cotangent) returns the gradients of sum(value * cotangent) with respect to wrt, shaped as "
           "value_and_grad's, without computing the forward pass again. The pullback runs once.")
      .def(
          "prefetch",
          [](const PyEntry& e, const py::args& args, const std::string& when) {
            CallArguments call = ArgumentsOf(e, args);
            Prefetch w = PrefetchWhen(when);
            py::gil_scoped_release release;
            e.entry.prefetch(call.values, w);
          },
          py::kw_only(), py::arg("when") = "idle",
          "Queues the specialization of these arguments' structure in this entry's mode; returns at once.")
      .def(
          "wait_ready",
          [](const PyEntry& e, const py::args& args) {
            CallArguments call = ArgumentsOf(e, args);
            return Interruptible([&] { return e.entry.wait_ready(call.values); });
          },
          "Blocks until the code for these arguments' structure is ready or failed (queueing it); a CodeStatus.")
      .def(
          "status",
          [](const PyEntry& e, const py::args& args) { return e.entry.status(ArgumentsOf(e, args).values); },
          "Where the code for these arguments' structure stands now (a CodeStatus); never blocks.")
      .def(
          "convert",
          [](const PyEntry& e, const py::args& args) {
            CallArguments call = ArgumentsOf(e, args);
            py::tuple out(call.values.size());
            for (size_t i = 0; i < call.values.size(); ++i) {
              out[i] = py::cast(PyValue{std::move(call.values[i]), call.types[i]});
            }
            return out;
          },
          "The arguments as pejit.Values of the parameters' types: convert once, pass many times.")
      .def(
          "stats",
          [](const PyEntry& e) {
            e.owner.cast<PyEngine&>().Get();
            return StatsDict(e.entry.stats());
          },
          "The entry's calls by tier (calls_native, calls_generic_native, calls_interpreter, ...) and its code's "
          "counts (compiled, failed, evicted, ...), both modes.");

  py::class_<PyEngine>(m, "Engine",
                       "The tiered engine: a live module whose entries run at once in the interpreter while their "
                       "code compiles in the background (docs/python.md). policy: eager, hot:N, interpreter or "
                       "sync; workers: compile threads (0: cores - 1); log: off, info, debug or trace; trace: a "
                       "JSON-lines file of the JIT's events; cache_dir: compiled code kept across runs.")
      .def(py::init([](const std::string& policy, int workers, const std::string& log, const std::string& trace,
                       const std::string& cache_dir, bool generic, bool batch, int worker_nice, int step_threads) {
             EngineOptions o;
             o.policy = Policy::Parse(policy);
             o.workers = workers;
             o.log_level = log;
             o.trace_file = trace;
             o.cache_dir = cache_dir;
             o.generic = generic;
             o.batch = batch;
             o.worker_nice = worker_nice;
             o.step_threads = step_threads;
             return PyEngine{std::make_shared<Engine>(std::move(o))};
           }),
           py::kw_only(), py::arg("policy") = "eager", py::arg("workers") = 0, py::arg("log") = "",
           py::arg("trace") = "", py::arg("cache_dir") = "", py::arg("generic") = true, py::arg("batch") = true,
           py::arg("worker_nice") = EngineOptions{}.worker_nice, py::arg("step_threads") = 0)
      .def_property_readonly("module", [](py::object self) { return PyModule{self}; })
      .def_property_readonly(
          "policy", [](const PyEngine& e) { return e.Get()->options().policy.ToString(); },
          "The policy the engine was made with: 'eager', 'hot:N', 'interpreter' or 'sync'.")
      .def(
          "entry",
          [](py::object self, const std::string& name, const std::vector<int>& static_argnums, const py::object& wrt) {
            std::shared_ptr<Engine> engine = self.cast<PyEngine&>().Get();
            EntryOptions o;
            o.static_argnums = static_argnums;
            bool single = false;
            o.wrt = WrtFrom(wrt, &single);
            return PyEntry{self, engine->entry(name, o), single};
          },
          py::arg("name"), py::kw_only(), py::arg("static_argnums") = std::vector<int>{}, py::arg("wrt") = py::none(),
          "The entry `name` in one mode: value mode, or with wrt (an int or a tuple of argument indices) grad mode, "
          "whose calls return (value, gradients). static_argnums: arguments specialized on their values.")
      .def("stats",
           [](const PyEngine& e) {
             EngineStats s = e.Get()->stats();
             py::dict d;
             d["code_bytes"] = s.code_bytes;
             d["slots"] = s.slots;
             d["queued"] = s.queued;
             d["retained_bytes"] = s.retained_bytes;
             d["workers"] = s.workers;
             d["step_threads"] = s.step_threads;
             d["generic_cells"] = s.generic_cells;
             d["generic_segments"] = s.generic_segments;
             d["generic_padded_segments"] = s.generic_padded_segments;
             d["generic_variants"] = s.generic_variants;
             d["generic_native_variants"] = s.generic_native_variants;
             d["generic_code_bytes"] = s.generic_code_bytes;
             d["cache_dir"] = s.cache_dir;
             return d;
           },
           "The engine's statistics: code bytes, slots, queued jobs, workers, the generic tier's cells, segments "
           "and variants.")
      .def(
          "drain",
          [](const PyEngine& e) {
            std::shared_ptr<Engine> engine = e.Get();
            Interruptible([&] {
              engine->drain();
              return 0;
            });
          },
          "Blocks until every queued compile is done (and stored, with a cache_dir).")
      .def("close",
           [](PyEngine& e) {
             std::shared_ptr<Engine> engine = std::move(e.engine);
             py::gil_scoped_release release;
             engine.reset();  // waits for running jobs, unless a call on another thread still holds it
           },
           "Ends the engine (running compiles finish first); later calls raise RuntimeError.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyEngine& e, py::args) {
        std::shared_ptr<Engine> engine = std::move(e.engine);
        py::gil_scoped_release release;
        engine.reset();
      });

  // The window the C++ trainers keep (train/lookahead.h); args_of is called
  // on the loop's thread, with the GIL, from before_step.
  py::class_<Lookahead>(m, "Lookahead",
                        "Keeps the call `ahead` steps in front of a training loop prefetched as next, so that it "
                        "compiles before the loop gets there: args_of(step) gives that step's arguments (a tuple) or "
                        "None; call before_step(step) as each step begins.")
      .def(py::init([](py::object entry, py::function args_of, int ahead) {
             if (ahead < 0) throw std::invalid_argument("Lookahead: ahead must be 0 or more, not " + std::to_string(ahead));
             const PyEntry& e = entry.cast<const PyEntry&>();
             auto args = [entry, args_of](size_t step) -> std::optional<std::vector<Value>> {
               py::object got = args_of(step);
               if (got.is_none()) return std::nullopt;
               return ArgumentsOf(entry.cast<const PyEntry&>(), py::args(py::tuple(got))).values;
             };
             return std::make_unique<Lookahead>(e.entry, std::move(args), ahead);
           }),
           py::arg("entry"), py::arg("args_of"), py::arg("ahead"))
      .def("before_step", &Lookahead::BeforeStep, py::arg("step"));

  py::class_<Optimizer>(m, "Optimizer", "Updates a parameter structure (a pejit.Value) in place from gradients.")
      .def(py::init([](const std::string& kind, double learning_rate, double weight_decay, double clip_norm,
                       double beta1, double beta2, double epsilon) {
             OptimizerOptions o;
             o.kind = kind;
             o.learning_rate = learning_rate;
             o.weight_decay = weight_decay;
             o.clip_norm = clip_norm;
             o.beta1 = beta1;
             o.beta2 = beta2;
             o.epsilon = epsilon;
             return Optimizer::Create(o);
           }),
           py::arg("kind") = "adagrad", py::kw_only(), py::arg("learning_rate") = OptimizerOptions{}.learning_rate,
           py::arg("weight_decay") = 0.0, py::arg("clip_norm") = 0.0, py::arg("beta1") = OptimizerOptions{}.beta1,
           py::arg("beta2") = OptimizerOptions{}.beta2, py::arg("epsilon") = OptimizerOptions{}.epsilon)
      .def(
          "step",
          [](Optimizer& o, py::handle params, py::handle grads) {
            ReleasePendingReferences();
            if (py::isinstance<PyValue>(params)) {
              const PyValue& p = params.cast<const PyValue&>();
              Value g = GradsFor(p, grads);
              py::gil_scoped_release release;
              return o.Step(p.value, g);
            }
            StepValues values = PairForStep(params, grads);
            double norm = 0;
            try {
              py::gil_scoped_release release;
              norm = o.Step(values.params, values.grads);
            } catch (const std::overflow_error&) {  // the update happened: the caller's arrays get it too
              values.WriteBack();
              throw;
            }
            values.WriteBack();
            return norm;
          },
          py::arg("params"), py::arg("grads"),
          "Updates params in place (a pejit.Value, or dicts, tuples and lists of float32 numpy arrays) from grads of "
          "the same structure (dicts matched by key); returns the gradients' global norm before clipping.")
      .def_property_readonly("kind", &Optimizer::kind);
}

}  // namespace pejit::python
