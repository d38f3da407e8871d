#include "python/dlpack.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "python/convert.h"

namespace pejit::python {
namespace {

// The DLPack ABI, as its specification lays the structures out.
struct DLDevice {
  int32_t device_type;  // 1: CPU
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: row-major compact
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr int32_t kDLCPU = 1;
constexpr uint8_t kDLInt = 0, kDLFloat = 2, kDLBool = 6;
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";
constexpr const char* kOwnerName = "pejit.dlpack_owner";

std::atomic<int64_t> shared_in{0}, copied_in{0}, copied_in_bytes{0}, exported{0};

std::optional<DType> DTypeOfDl(DLDataType t) {
  if (t.lanes != 1) return std::nullopt;
  if (t.code == kDLFloat && t.bits == 32) return DType::kF32;
  if (t.code == kDLFloat && t.bits == 64) return DType::kF64;
  if (t.code == kDLInt && t.bits == 64) return DType::kI64;
  if (t.code == kDLBool && t.bits == 8) return DType::kBool;
  return std::nullopt;
}

DLDataType DlOf(DType d) {
  switch (d) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF64:
      return {kDLFloat, 64, 1};
    case DType::kI64:
      return {kDLInt, 64, 1};
    case DType::kBool:
      return {kDLBool, 8, 1};
  }
  throw std::logic_error("unknown dtype");
}

std::string DlName(DLDataType t) {
  const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string kind = t.code < 7 ? kinds[t.code] : "code " + std::to_string(t.code);
  std::string out = kind + std::to_string(t.bits);
  if (t.lanes != 1) out += "x" + std::to_string(t.lanes);
  return out;
}

// A pejit tensor handed out: the DLPack view and the reference behind it.
struct Exported {
  DLManagedTensor managed{};
  Tensor tensor;
  std::vector<int64_t> shape;
};

void DeleteExported(DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); }

// An unconsumed capsule owns its tensor; a consumer renames it and calls the
// deleter itself.
void DestroyCapsule(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed && managed->deleter) managed->deleter(managed);
}

// Copies a strided view's elements in row-major order.
void CopyStrided(const char* src, const int64_t* shape, const int64_t* strides, int ndim, size_t elem, char* dst) {
  std::vector<int64_t> index(static_cast<size_t>(ndim), 0);
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  for (int64_t k = 0; k < n; ++k) {
    int64_t offset = 0;
    for (int i = 0; i < ndim; ++i) offset += index[static_cast<size_t>(i)] * strides[i];
    std::memcpy(dst + static_cast<size_t>(k) * elem, src + offset * static_cast<int64_t>(elem), elem);
    for (int i = ndim - 1; i >= 0; --i) {
      if (++index[static_cast<size_t>(i)] < shape[i]) break;
      index[static_cast<size_t>(i)] = 0;
    }
  }
}

}  // namespace

TransferCounts Transfers() {
  return {shared_in.load(), copied_in.load(), copied_in_bytes.load(), exported.load()};
}
void ResetTransfers() { shared_in = copied_in = copied_in_bytes = exported = 0; }
void CountSharedIn() { ++shared_in; }
void CountCopiedIn(int64_t bytes) {
  ++copied_in;
  copied_in_bytes += bytes;
}

bool IsDlpack(py::handle obj) {
  if (PyCapsule_CheckExact(obj.ptr())) return true;
  return !py::isinstance<py::array>(obj) && py::hasattr(obj, "__dlpack__");
}

Tensor FromDlpack(py::handle obj, std::optional<DType> want, const std::string& where) {
  py::object capsule = py::reinterpret_borrow<py::object>(obj);
  if (!PyCapsule_CheckExact(obj.ptr())) {
    try {
      capsule = obj.attr("__dlpack__")();
    } catch (py::error_already_set& e) {
      throw ConversionError(where + ": its __dlpack__ failed: " + std::string(py::str(e.value())));
    }
  }
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName)) {
    throw ConversionError(where + ": expected a DLPack capsule named 'dltensor'" +
                          (PyCapsule_IsValid(capsule.ptr(), kUsedCapsuleName) ? " (this one was already consumed)" : ""));
  }
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU) {
    throw ConversionError(where + ": a DLPack tensor on device type " + std::to_string(dl.device.device_type) +
                          " (pejit runs on the CPU: move it there first)");
  }
  const std::optional<DType> dtype = DTypeOfDl(dl.dtype);
  if (!dtype) throw ConversionError(where + ": a DLPack tensor of " + DlName(dl.dtype) + " has no pejit dtype");
  if (want && *want != *dtype) {
    throw ConversionError(where + ": expected " + std::string(DTypeName(*want)) + ", got a DLPack tensor of " +
                          std::string(DTypeName(*dtype)));
  }
  if (dl.ndim < 0) throw ConversionError(where + ": a DLPack tensor of rank " + std::to_string(dl.ndim));
  Shape shape(dl.shape, dl.shape + dl.ndim);
  bool compact = true;
  if (dl.strides) {
    int64_t expected = 1;
    for (int i = dl.ndim - 1; i >= 0; --i) {
      if (dl.shape[i] != 1 && dl.strides[i] != expected) compact = false;
      expected *= dl.shape[i];
    }
  }
  char* data = static_cast<char*>(dl.data) + dl.byte_offset;
  const size_t elem = SizeOf(*dtype);
  // Consumed, as the protocol says: renamed, so that neither its producer's
  // destructor nor another consumer frees the view; the owner calls the
  // deleter, under the GIL (a torch tensor's deleter may need it), when
  // released (KeepAlive) or at the end of this scope.
  py::capsule owner(managed, kOwnerName, [](PyObject* c) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(c, kOwnerName));
    if (m && m->deleter) m->deleter(m);
  });
  if (PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName) != 0) throw py::error_already_set();
  if (compact && reinterpret_cast<uintptr_t>(data) % 64 == 0) {
    CountSharedIn();
    return Tensor::Wrap(data, *dtype, std::move(shape), KeepAlive(std::move(owner)));
  }
  Tensor t = Tensor::Empty(*dtype, std::move(shape));
  if (t.nbytes() > 0) {
    if (compact) {
      std::memcpy(t.raw_data(), data, t.nbytes());
    } else {
      CopyStrided(data, dl.shape, dl.strides, dl.ndim, elem, static_cast<char*>(t.raw_data()));
    }
  }
  CountCopiedIn(static_cast<int64_t>(t.nbytes()));
  return t;  // `owner` frees the producer's view
}

py::capsule ToDlpack(const Tensor& t) {
  auto* out = new Exported;
  out->tensor = t;
  out->shape.assign(t.shape().begin(), t.shape().end());
  DLTensor& dl = out->managed.dl_tensor;
  dl.data = out->tensor.raw_data();
  dl.device = {kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(out->shape.size());
  dl.dtype = DlOf(t.dtype());
  dl.shape = out->shape.data();
  dl.strides = nullptr;
  dl.byte_offset = 0;
  out->managed.manager_ctx = out;
  out->managed.deleter = DeleteExported;
  ++exported;
  return py::capsule(&out->managed, kCapsuleName, DestroyCapsule);
}

}  // namespace pejit::python
