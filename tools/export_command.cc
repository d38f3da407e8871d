#include "tools/export_command.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "ir/program_files.h"
#include "jit/image.h"
#include "jit/native_executable.h"
#include "jit/pipeline.h"
#include "pe/partial_eval.h"
#include "runtime/artifact.h"
#include "scheduler/disk_cache.h"
#include "support/input_file.h"
#include "support/mac.h"

namespace pejit {
namespace {

namespace fs = std::filesystem;

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

ExportCommand::ExportCommand(CLI::App& app) {
  export_ = app.add_subcommand("export", "Compile an entry for the structures of example arguments and write them "
                                         "as an artifact that pejit-runtime runs without LLVM");
  export_->add_option("file", program_, "the .pj program")->required()->check(CLI::ExistingFile);
  export_->add_option("--entry", entry_, "the definition to export, without '@'")->required();
  export_->add_option("--args", args_files_, "JSON array of arguments; repeat for more structures");
  export_->add_option("--from-cache", from_cache_,
                      "export the entry's code a run stored in this persistent code cache (every mode) instead");
  export_->add_flag("--grad", grad_, "export the loss and its gradients (the result must be a scalar f32)");
  export_->add_option("--wrt", wrt_, "comma-separated argument indices to differentiate (default: every argument "
                                     "whose type can hold a float tensor)");
  export_->add_option("--out", out_, "the artifact directory to write (created; files in it replaced)")->required();
}

bool ExportCommand::parsed() const { return export_->parsed(); }

int ExportCommand::Run() const {
  if (!wrt_.empty() && !grad_) throw std::runtime_error("--wrt names the arguments to differentiate: it needs --grad");
  if (args_files_.empty() == from_cache_.empty()) {
    throw std::runtime_error("give the structures to export: --args files, or --from-cache a code cache directory");
  }
  Snapshot s = LoadProgram(UserPath(program_));
  std::vector<int> wrt;
  if (grad_) wrt = wrt_.empty() ? FloatArguments(*s, entry_) : ParseIndices(wrt_, "--wrt");
  auto session = JitSession::Create();
  std::vector<ExecutablePtr> keep;  // their objects stay captured until written
  std::vector<ExportedEntry> entries;
  const std::string type = TypeToString(s->Get(entry_).type);
  std::map<std::string, std::shared_ptr<const CodeObject>> objects;
  for (const std::string& path : args_files_) {
    std::string text = ReadFile(UserPath(path));
    nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded()) throw std::runtime_error(path + ": not JSON");
    std::vector<Value> args = ArgumentsFromJson(*s, entry_, json, path);
    Residual r = PartialEvaluate(*s, entry_, args);
    PipelineOptions options;
    if (grad_) options.wrt_leaves = FloatWrtLeaves(args, wrt);
    ExecutablePtr exe = CompileResidual(*session, r.main, options);
    const auto* native = dynamic_cast<const NativeExecutable*>(exe.get());
    if (!native) throw std::runtime_error(path + ": @" + entry_ + " does not compile to straight-line native code");
    for (const auto& o : native->objects()) objects[o->name] = o;
    entries.push_back({entry_, ModeName(grad_ ? &wrt : nullptr), ComputeSignature(args).key, type,
                       EncodeImage(*native, /*objects=*/false)});
    keep.push_back(std::move(exe));
  }
  if (!from_cache_.empty()) {
    // What a run stored for the program as it is now, on this CPU.
    const std::string cpu = session->host_cpu() + " " + session->host_features();
    const uint64_t definitions = DefinitionsHash(*s, entry_);
    int stale = 0;
    for (auto& [key, image] : DiskCache(UserPath(from_cache_), UINT64_MAX).List()) {
      if (key.entry != entry_) continue;
      if (key.definitions != definitions || key.cpu != cpu) {
        ++stale;
        continue;
      }
      for (const Image::Object& o : DecodeImage(image).objects) {
        auto object = std::make_shared<CodeObject>();
        object->name = o.name;
        object->object = o.bytes;
        objects.emplace(o.name, std::move(object));
      }
      entries.push_back({entry_, key.mode, key.signature, type, std::move(image)});
    }
    if (entries.empty()) {
      throw std::runtime_error(from_cache_ + " holds no code of @" + entry_ + " for these definitions on this CPU (" +
                               std::to_string(stale) + " entries of other definitions or CPUs)");
    }
  }
  // The kernels' objects, linked into one shared library by the system linker.
  const fs::path out = UserPath(out_);
  fs::create_directories(out / "objects");
  std::string command = "cc -shared -o " + Quote((out / "code.so").string());
  for (const auto& [name, object] : objects) {
    const fs::path o = out / "objects" / (name + ".o");
    std::ofstream(o, std::ios::binary | std::ios::trunc) << *object->object;
    command += " " + Quote(o.string());
  }
  command += " -lm";
  if (objects.empty()) throw std::runtime_error("@" + entry_ + " calls no compiled kernel: nothing to export");
  if (int rc = std::system(command.c_str()); rc != 0) {
    throw std::runtime_error("linking the kernels failed (" + command + ", exit " + std::to_string(rc) + ")");
  }
  fs::remove_all(out / "objects");
  const std::string model = s->Print();
  std::ofstream(out / "model.pj", std::ios::trunc) << model;
  WriteExportedEntries((out / "entries.pjx").string(), {Sha256Hex(model), entries});
  std::printf("# exported %zu specialization(s) of @%s (%zu object files, code.so %.1f KiB) to %s\n", entries.size(),
              entry_.c_str(), objects.size(), fs::file_size(out / "code.so") / 1024.0, out.string().c_str());
  return 0;
}

}  // namespace pejit
