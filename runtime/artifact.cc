#include "runtime/artifact.h"

#include <dlfcn.h>

#include <cstring>
#include <fstream>
#include <stdexcept>

#include "ir/parser.h"
#include "jit/image.h"
#include "jit/native_executable.h"
#include "pe/signature.h"
#include "support/hash.h"

namespace pejit {
namespace {

constexpr char kMagic[8] = {'P', 'E', 'J', 'I', 'T', 'X', '1', '\n'};

void Put(std::string& out, std::string_view s) {
  uint64_t n = s.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(s);
}

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot be read");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

void WriteExportedEntries(const std::string& path, const std::vector<ExportedEntry>& entries) {
  std::string body;
  Put(body, std::to_string(entries.size()));
  for (const ExportedEntry& e : entries) {
    Put(body, e.entry);
    Put(body, e.mode);
    Put(body, e.signature);
    Put(body, e.image);
  }
  std::string file(kMagic, sizeof kMagic);
  uint64_t checksum = Fnv1a(body.data(), body.size());
  file.append(reinterpret_cast<const char*>(&checksum), sizeof checksum);
  file += body;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!(out << file) || !out.flush()) throw std::runtime_error(path + ": cannot be written");
}

std::vector<ExportedEntry> ReadExportedEntries(const std::string& path) {
  const std::string file = ReadWhole(path);
  if (file.size() < sizeof kMagic + 8 || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    throw std::runtime_error(path + ": not a pejit export (entries.pjx)");
  }
  std::string_view body = std::string_view(file).substr(sizeof kMagic + 8);
  uint64_t checksum;
  std::memcpy(&checksum, file.data() + sizeof kMagic, sizeof checksum);
  if (checksum != Fnv1a(body.data(), body.size())) throw std::runtime_error(path + ": checksum mismatch (corrupted)");
  size_t at = 0;
  auto next = [&] {
    uint64_t n;
    if (body.size() - at < sizeof n) throw std::runtime_error(path + ": truncated");
    std::memcpy(&n, body.data() + at, sizeof n);
    at += sizeof n;
    if (n > body.size() - at) throw std::runtime_error(path + ": truncated");
    std::string s(body.substr(at, n));
    at += n;
    return s;
  };
  const size_t count = std::stoul(next());
  std::vector<ExportedEntry> entries;
  for (size_t i = 0; i < count; ++i) {
    ExportedEntry e;
    e.entry = next();
    e.mode = next();
    e.signature = next();
    e.image = next();
    entries.push_back(std::move(e));
  }
  return entries;
}

Artifact::Artifact(const std::string& dir) {
  Module module;
  module.AddSource(ReadWhole(dir + "/model.pj"), dir + "/model.pj");
  module_ = module.snapshot();
  const std::string so = dir + "/code.so";
  void* handle = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw std::runtime_error(so + ": " + ::dlerror());
  library_ = std::shared_ptr<void>(handle, [](void* h) { ::dlclose(h); });
  for (ExportedEntry& e : ReadExportedEntries(dir + "/entries.pjx")) {
    Image image = DecodeImage(e.image);
    std::vector<KernelRef> kernels;
    for (const Image::Kernel& k : image.kernels) {
      void* fn = ::dlsym(handle, k.symbol.c_str());
      if (!fn) throw std::runtime_error(so + " has no kernel " + k.symbol + " (the export is incomplete)");
      kernels.push_back({reinterpret_cast<KernelFn>(fn), k.symbol, k.key, k.object});
    }
    std::vector<std::shared_ptr<const CodeObject>> objects;
    for (const Image::Object& o : image.objects) {
      auto object = std::make_shared<CodeObject>();
      object->name = o.name;
      object->loaded = library_;
      objects.push_back(std::move(object));
    }
    code_[{e.entry, e.mode, e.signature}] = std::make_shared<NativeExecutable>(
        std::move(image.plan), std::move(image.step_kernel), std::move(image.outer), std::move(kernels),
        std::move(objects), 0, false, false);
  }
}

Artifact::~Artifact() = default;

Interpreter::ValueAndGrad Artifact::Call(const std::string& entry, const std::vector<Value>& args,
                                         const std::vector<int>* wrt) const {
  const Signature sig = ComputeSignature(args);
  auto it = code_.find({entry, ModeName(wrt), sig.key});
  if (it == code_.end()) {
    int of_entry = 0;
    for (const auto& [key, exe] : code_) of_entry += std::get<0>(key) == entry;
    throw std::runtime_error("no exported code for @" + entry + " (" + ModeName(wrt) + ") on arguments of structure " +
                             sig.ShortHash() + "; the artifact has " + std::to_string(of_entry) +
                             " specialization(s) of @" + entry + ": export it with these arguments too");
  }
  std::vector<size_t> first;
  std::vector<Tensor> leaves = Flatten(args, {}, &first);
  std::vector<Tensor> results = it->second->Run(leaves);
  if (wrt) {
    std::vector<int> wrt_leaves = FloatWrtLeaves(leaves, first, *wrt);
    return GradientsFromResults(args, *wrt, leaves, first, GradientResultOf(leaves.size(), wrt_leaves), results);
  }
  size_t pos = 0;
  Interpreter::ValueAndGrad out;
  out.value = ValueFromTensors(it->second->result_type(), results, pos);
  return out;
}

}  // namespace pejit
