// \file An executable's image: compiled code as bytes, to load elsewhere.
//
// The image of a NativeExecutable holds its plan (steps, buffers, arena
// layout, constants), the fused kernels its steps call (symbol, and what
// each computes) and the relocatable object files defining them, so that
// another session or process of the same pejit build, on a CPU with the
// same features, rebuilds the executable by linking the objects instead of
// lowering and compiling (JitSession::Load, compiler.h). The persistent code
// cache (scheduler/disk_cache.h) stores images; the format carries no
// checksum or version of its own: the container that stores it does.
//
// DecodeImage checks what it reads (counts against the bytes left, every
// buffer, node, kernel and object index in range, copy blocks and views
// inside their buffers), then verifies every step against the buffers it
// reads and writes (an operator's kernel on buffers of the types it infers,
// a fused kernel being the one compiled for its step's shapes and strides
// and run for its output's rows, every buffer given memory), and throws
// ImageError rather than build a plan that would read or write out of
// bounds. It links no LLVM.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "jit/native_executable.h"
#include "jit/plan.h"

namespace pejit {

class ImageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Image {
  Plan plan;
  std::vector<int> step_kernel;  // per step: index into kernels, -1 when not fused
  std::vector<int64_t> outer;    // per step: the fused kernel's outermost extent
  struct Kernel {
    std::string symbol;
    std::string key;
    int object = -1;
  };
  std::vector<Kernel> kernels;
  struct Object {
    std::string name;
    std::shared_ptr<const std::string> bytes;
  };
  std::vector<Object> objects;
};

// Without `objects`, the object files' bytes are left out (their names
// stay): for a runtime that finds the symbols elsewhere (a shared library).
std::string EncodeImage(const NativeExecutable& exe, bool objects = true);
Image DecodeImage(std::string_view bytes);

}  // namespace pejit
