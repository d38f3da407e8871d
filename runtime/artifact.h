// \file A model's exported code, run without the compiler.
//
// `pejit export` writes an artifact directory for the specializations a set
// of example arguments needs:
//   model.pj     the module (its types give the arguments' constructors)
//   code.so      every kernel those specializations call, linked by the
//                system linker from the JIT's (position-independent) objects
//   entries.pjx  what the code was made from (the SHA-256 of model.pj's
//                text), then per specialization: entry, mode, skeleton, the
//                entry's type, and its image (jit/image.h) without object
//                bytes; with a checksum
// An Artifact loads one with dlopen: no LLVM optimizer, code generator or
// JIT linker is linked, only the plan walker (jit/native_executable.h), the
// operators' kernels and the IR's parser. It refuses an artifact whose
// model.pj is not the one its code was made from, or whose entries' names
// and types are not model.pj's: the code would compute another program.
// A call whose structure no exported specialization covers is an error
// that says so.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "interp/interpreter.h"
#include "ir/module.h"
#include "jit/executable.h"

namespace pejit {

struct ExportedEntry {
  std::string entry;
  std::string mode;       // "value" or "grad:I,J"
  std::string signature;  // the skeleton (pe/signature.h), verbatim
  std::string type;       // the entry's type when it was exported (TypeToString)
  std::string image;      // EncodeImage(..., objects = false)
};

struct ExportedEntries {
  std::string model_sha256;  // of model.pj's text, as written beside them
  std::vector<ExportedEntry> entries;
};

// entries.pjx. Write throws std::runtime_error; Read too, naming the file,
// for a file that is not an artifact's or fails its checksum.
void WriteExportedEntries(const std::string& path, const ExportedEntries& entries);
ExportedEntries ReadExportedEntries(const std::string& path);

class Artifact {
 public:
  // Throws std::runtime_error (or IrError for model.pj) naming what is wrong.
  explicit Artifact(const std::string& dir);
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;

  const ModuleSnapshot& module() const { return *module_; }
  size_t size() const { return code_.size(); }

  // `entry` on `args` (grad mode with `wrt`): the exported code of their
  // structure, or std::runtime_error when none was exported.
  Interpreter::ValueAndGrad Call(const std::string& entry, const std::vector<Value>& args,
                                 const std::vector<int>* wrt) const;

 private:
  Snapshot module_;
  std::shared_ptr<void> library_;  // the dlopen handle: closed after the last executable
  std::map<std::tuple<std::string, std::string, std::string>, ExecutablePtr> code_;  // (entry, mode, skeleton)
};

}  // namespace pejit
