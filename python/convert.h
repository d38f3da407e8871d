// \file Python objects to program values and back, for the `pejit` module.
//
// In: a pejit.Value is passed as it is (no conversion, and the engine's
// signature cache sees the same value again); anything else is converted,
// directed by the type the entry's parameter or the constructor's field
// declares: numpy arrays and Python numbers to tensors of the declared dtype,
// tuples and lists to tuples, dicts to records by field name, lists to
// `List` values. An array is shared, not copied, when it already is what a
// tensor needs (C-contiguous, the declared dtype, 64-byte aligned, or a
// result pejit returned); otherwise its data are copied. A DLPack tensor (a
// torch tensor) likewise, without numpy (dlpack.h); its dtype must be the
// declared one.
//
// Out: tensors become read-only numpy arrays viewing the result's memory
// (0-d ones numpy scalars), tuples Python tuples, ADT values pejit.Value.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <utility>
#include <vector>

#include "ir/module.h"
#include "ir/value.h"

namespace pejit::python {

namespace py = pybind11;

// pejit.Value: a program value held for Python, and the type it was
// converted to when one was declared (entry.convert: the parameter's), which
// gives a record's field names (Optimizer.step takes gradients by name
// against it). Null when none was.
struct PyValue {
  Value value;
  Type type;
};

// Thrown for a Python object that cannot become the value a type declares;
// the module raises it as TypeError. what() names where ("@loss argument 2
// (%params) field w_iou: ...").
class ConversionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `obj` as a value of `type` (null: whatever `obj` is), with `module`'s
// type definitions (null: no ADT conversions). `where` leads messages.
Value ToValue(py::handle obj, const Type& type, const ModuleSnapshot* module, const std::string& where);

// Throws ConversionError when `v`, a pejit.Value, is a structure made by
// another module's constructors of its type that are not `module`'s (another
// engine's, listing them in another order): its clauses would be taken by
// the wrong index (ForeignConstructors). O(1): each constructor checks its
// fields when called, so the top node stands for the value.
void CheckMadeHere(const Value& v, const ModuleSnapshot* module, const std::string& where);

// The tensor `a` views when it is one whole array pejit returned.
std::optional<Tensor> ReturnedTensor(const py::array& a);

// `v` for Python (see above).
py::object FromValue(const Value& v);

// Optimizer.step's parameters and gradients given as Python structures
// (dicts by key, tuples, lists; float32 numpy arrays, or pejit.Values, at
// the leaves): two values of one layout, a dict's fields in sorted key order
// (the optimizer's state follows leaf positions) and the gradients' matched
// to them by key. A parameter array pejit cannot share (not 64-byte
// aligned, not C-contiguous) is copied in; WriteBack() copies it out after
// the step, so that the caller's arrays are updated in place either way.
// Throws ConversionError naming the place ("grads['w']: ...").
struct StepValues {
  Value params, grads;
  std::vector<std::pair<py::array, Tensor>> copied;  // (the caller's array, the tensor the step updated)
  void WriteBack() const;
};
StepValues PairForStep(py::handle params, py::handle grads);

// The gradients `grads` for parameters `params` (a pejit.Value): a
// pejit.Value as it is; holding a dict, converted to the type `params` was
// converted to (entry.convert's), which gives a record's fields by name
// (ConversionError when `params` has none); otherwise as they are (the
// optimizer checks the structure).
Value GradsFor(const PyValue& params, py::handle grads);

// Holds `obj` for a tensor sharing its memory; the reference is released
// by ReleasePendingReferences (no GIL is needed where the tensor dies).
std::shared_ptr<void> KeepAlive(py::object obj);

// Python objects whose last reference a tensor dropped on a thread without
// the GIL (an engine worker freeing a job's arguments): they are released
// here, by the next binding call that holds the GIL. Never blocks on the GIL.
void ReleasePendingReferences();

}  // namespace pejit::python
