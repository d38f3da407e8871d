#include "runtime/artifact.h"

#include <dlfcn.h>

#include <charconv>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "ir/abi.h"
#include "ir/parser.h"
#include "jit/image.h"
#include "jit/native_executable.h"
#include "pe/signature.h"
#include "support/hash.h"
#include "support/mac.h"

namespace pejit {
namespace {

constexpr char kMagic[8] = {'P', 'E', 'J', 'I', 'T', 'X', '2', '\n'};  // 2: what it was made from

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

void WriteExportedEntries(const std::string& path, const ExportedEntries& exported) {
  std::string body;
  Put(body, exported.model_sha256);
  Put(body, std::to_string(exported.entries.size()));
  for (const ExportedEntry& e : exported.entries) {
    Put(body, e.entry);
    Put(body, e.mode);
    Put(body, e.signature);
    Put(body, e.type);
    Put(body, e.image);
  }
  std::string file(kMagic, sizeof kMagic);
  uint64_t checksum = Fnv1a(body.data(), body.size());
  file.append(reinterpret_cast<const char*>(&checksum), sizeof checksum);
  file += body;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!(out << file) || !out.flush()) throw std::runtime_error(path + ": cannot be written");
}

ExportedEntries ReadExportedEntries(const std::string& path) {
  const std::string file = ReadWhole(path);
  if (file.size() >= sizeof kMagic && std::memcmp(file.data(), kMagic, 5) == 0 &&
      std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    throw std::runtime_error(path + ": an export of another pejit version (format " + std::string(1, file[6]) +
                             ", not " + kMagic[6] + "): export the model again");
  }
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
  ExportedEntries exported;
  exported.model_sha256 = next();
  const std::string count_text = next();
  size_t count = 0;
  auto [end, error] = std::from_chars(count_text.data(), count_text.data() + count_text.size(), count);
  // Each entry takes at least five length words: a count past that is not the writer's.
  if (error != std::errc() || end != count_text.data() + count_text.size() || count > body.size() / 40) {
    throw std::runtime_error(path + ": the entry count is not a number of entries it could hold");
  }
  for (size_t i = 0; i < count; ++i) {
    ExportedEntry e;
    e.entry = next();
    e.mode = next();
    e.signature = next();
    e.type = next();
    e.image = next();
    exported.entries.push_back(std::move(e));
  }
  if (at != body.size()) throw std::runtime_error(path + ": bytes after its last entry");
  return exported;
}

Artifact::Artifact(const std::string& dir) {
  const std::string model_path = dir + "/model.pj";
  const std::string model = ReadWhole(model_path);
  const ExportedEntries exported = ReadExportedEntries(dir + "/entries.pjx");
  if (Sha256Hex(model) != exported.model_sha256) {
    throw std::runtime_error(model_path + " is not the model its code was exported from (SHA-256 " +
                             Sha256Hex(model).substr(0, 16) + "..., the export recorded " +
                             exported.model_sha256.substr(0, 16) + "...): edited since? export the model again");
  }
  Module module;
  module.AddSource(model, model_path);
  module_ = module.snapshot();
  for (const ExportedEntry& e : exported.entries) {
    const Definition* def = module_->Find(e.entry);
    if (!def) throw std::runtime_error(dir + "/entries.pjx has code for @" + e.entry + ", which model.pj does not define");
    if (TypeToString(def->type) != e.type) {
      throw std::runtime_error("@" + e.entry + " in model.pj has type " + TypeToString(def->type) +
                               "; its exported code was made for " + e.type);
    }
  }
  const std::string so = dir + "/code.so";
  void* handle = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) throw std::runtime_error(so + ": " + ::dlerror());
  library_ = std::shared_ptr<void>(handle, [](void* h) { ::dlclose(h); });
  for (const ExportedEntry& e : exported.entries) {
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
    auto exe = std::make_shared<NativeExecutable>(std::move(image.plan), std::move(image.step_kernel),
                                                  std::move(image.outer), std::move(kernels), std::move(objects), 0,
                                                  false, false);
    // Value mode returns what the entry declares; grad mode, its loss first.
    const Type& declared = AsFunc(module_->Get(e.entry).type)->ret;
    const Type& got = exe->result_type();
    const bool fits = e.mode == "value" ? IsTensorTree(got) && CountTensorLeaves(got) == CountTensorLeaves(declared)
                                        : IsTensorTree(got) && CountTensorLeaves(got) >= 1;
    if (!fits) {
      throw std::runtime_error("the exported code of @" + e.entry + " (" + e.mode + ") returns " + TypeToString(got) +
                               ", not what model.pj declares (" + TypeToString(declared) + ")");
    }
    code_[{e.entry, e.mode, e.signature}] = std::move(exe);
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
  std::vector<int> gradient_result;
  if (wrt) gradient_result = GradientResultOf(leaves.size(), FloatWrtLeaves(leaves, first, *wrt));
  return FromResults(it->second->result_type(), args, wrt, leaves, first, gradient_result, results);
}

}  // namespace pejit
