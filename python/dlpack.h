// \file Tensors across the DLPack protocol (dmlc/dlpack, the ABI of v0.8
// that torch.utils.dlpack and numpy's __dlpack__ speak): torch tensors in and
// out of pejit without copies.
//
// In: a "dltensor" capsule (or an object with __dlpack__) becomes a tensor
// viewing the producer's memory when it is what compiled code needs (CPU,
// row-major compact, 64-byte aligned, a pejit dtype); otherwise its
// elements are copied, in row-major order, into a buffer of pejit's own.
// The capsule is consumed (renamed "used_dltensor", as the protocol says);
// the producer's deleter runs when the tensor dies, under the GIL
// (ReleasePendingReferences), whatever thread dropped the tensor.
//
// Out: a tensor as a "dltensor" capsule whose deleter drops pejit's
// reference; any thread may call it. The consumer sees pejit's memory:
// writing it in place writes what pejit may also hold (a constant of
// compiled code, an argument returned as it was).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ops/tensor.h"

namespace pejit::python {

namespace py = pybind11;

// Process-wide counts of tensors crossing into and out of Python (numpy and
// DLPack alike), for tests and benchmarks that must show no copies.
struct TransferCounts {
  int64_t shared_in = 0;     // arrays viewed, not copied
  int64_t copied_in = 0;     // arrays whose elements were copied
  int64_t copied_in_bytes = 0;
  int64_t exported = 0;      // tensors handed out through DLPack
};
TransferCounts Transfers();
void ResetTransfers();
void CountSharedIn();
void CountCopiedIn(int64_t bytes);

// True for what FromDlpack takes: a capsule named "dltensor", or an object
// with __dlpack__ that is not a numpy array (numpy arrays take the numpy path).
bool IsDlpack(py::handle obj);

// `obj` as a tensor; `want` (none: the producer's dtype) must be its dtype,
// or a ConversionError names `where` and both dtypes.
Tensor FromDlpack(py::handle obj, std::optional<DType> want, const std::string& where);

// `t` as a "dltensor" capsule.
py::capsule ToDlpack(const Tensor& t);

}  // namespace pejit::python
