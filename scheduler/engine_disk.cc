// The persistent code cache's part of the engine: the key of a specialization or a program,
// loading, linking and storing its code (scheduler/disk_cache.h).
#include "scheduler/engine_impl.h"

namespace pejit {

DiskKey EngineImpl::DiskKeyOf(EntryState& entry, const ModuleSnapshot& snapshot, const SlotKey& key) const {
  DiskKey k;
  k.entry = entry.name;
  k.mode = key.mode;
  k.signature = key.signature.key;
  k.options = disk_options_;
  k.cpu = disk_cpu_;
  // The text of the entry's definitions and of the module's types: an edit
  // of any of them is another key, an edit of nothing they print is not.
  std::lock_guard<std::mutex> lock(entry.definitions_mu);
  if (entry.definitions_versions != key.versions->key) {
    entry.definitions_hash = DefinitionsHash(snapshot, entry.name);
    entry.definitions_versions = key.versions->key;
  }
  k.definitions = entry.definitions_hash;
  return k;
}

void EngineImpl::RefuseCacheEntry(const std::string& entry, const Signature* sig, const std::string& reason) {
  if (!On(EventKind::kCacheRefused)) return;
  Event e = Make(EventKind::kCacheRefused, entry, sig);
  e.fields.push_back({"reason", reason});
  Emit(e);
}

// A signature this engine has no slot for, found on disk: linked and
// published at once, on the calling thread (reading and linking an entry is
// milliseconds; the call then runs compiled instead of waiting for a job).
SlotPtr EngineImpl::LoadFromDisk(Request& r) {
  std::optional<DiskHit> hit = LoadImage(r.entry, *r.snapshot, r.key, r.args, r.static_args, r.wrt, 0);
  if (!hit) return nullptr;
  bool inserted = false;
  SlotPtr slot = Insert(r, SlotState::kPending, &inserted);
  if (!slot || !inserted) return slot;  // another call got there first, or an edit did
  std::vector<Eviction> evicted = cache.Publish(*slot, hit->exec, std::move(hit->gradient_result));
  ReportEvictions(evicted);
  Settle(*slot);
  return slot;
}

// The stored code of `key`, linked and checked against what the entry
// returns for these arguments (`job` 0: on a call's thread).
std::optional<EngineImpl::DiskHit> EngineImpl::LoadImage(EntryState& entry, const ModuleSnapshot& snapshot,
                                                         const SlotKey& key, const std::vector<Value>& args,
                                                         const std::vector<bool>& static_args,
                                                         const std::vector<int>* wrt, int64_t job) {
  DiskHit hit;
  hit.exec = LinkFromDisk(DiskKeyOf(entry, snapshot, key), entry.name, &key.signature, job, [&](const Executable& exec) {
    CallLayout layout = LayoutOf(AsFunc(snapshot.Get(entry.name).type)->ret, args, static_args, wrt);
    if (!IsTensorTree(exec.result_type()) || CountTensorLeaves(exec.result_type()) != layout.results) {
      throw ImageError("the image returns " + TypeToString(exec.result_type()) + ", not " +
                       std::to_string(layout.results) + " tensors");
    }
    hit.gradient_result = std::move(layout.gradient_result);
  });
  if (!hit.exec) return std::nullopt;
  Count(entry.loaded);
  return hit;
}

ExecutablePtr EngineImpl::LinkFromDisk(const DiskKey& key, const std::string& entry, const Signature* sig,
                                       int64_t job, const std::function<void(const Executable&)>& check) {
  const int64_t start = NowMicros();
  std::string refused;
  std::optional<DiskCache::Loaded> file = disk_->Load(key, &refused);
  ExecutablePtr exec;
  JitSession::LoadReport linked;
  if (file) {
    try {
      exec = jit_->Load(file->image, &linked);
      if (check) check(*exec);
    } catch (const std::exception& e) {
      exec.reset();
      refused = disk_->PathOf(key) + ": " + e.what();
      std::remove(disk_->PathOf(key).c_str());
    }
  }
  if (!refused.empty()) RefuseCacheEntry(entry, sig, refused);
  if (exec && On(EventKind::kCacheLoad)) {
    Event e = Make(EventKind::kCacheLoad, entry, sig, start, NowMicros() - start);
    if (job > 0) e.fields.push_back({"job", job});
    e.fields.push_back({"mode", key.mode});
    e.fields.push_back({"bytes", static_cast<int64_t>(file->bytes)});
    e.fields.push_back({"objects_linked", static_cast<int64_t>(linked.objects_linked)});
    e.fields.push_back({"code_bytes", static_cast<int64_t>(exec->code_bytes())});
    Emit(e);
  }
  return exec;
}

void EngineImpl::WriteToDisk(const DiskKey& key, const std::string& entry, const Signature* sig,
                             const Executable& exec, int64_t job) {
  const auto* native = dynamic_cast<const NativeExecutable*>(&exec);
  if (!native) return;  // regions with a driver, the residual interpreter: not stored
  const int64_t start = NowMicros();
  try {
    DiskCache::Stored stored = disk_->Store(key, EncodeImage(*native));
    if (On(EventKind::kCacheStore)) {
      Event e = Make(EventKind::kCacheStore, entry, sig, start, NowMicros() - start);
      e.fields.push_back({"job", job});
      e.fields.push_back({"bytes", static_cast<int64_t>(stored.bytes)});
      e.fields.push_back({"evicted", static_cast<int64_t>(stored.evicted)});
      Emit(e);
    }
  } catch (const std::exception& e) {
    RefuseCacheEntry(entry, sig, e.what());
  }
}

// Native code just published, written for later engines (on the worker).
void EngineImpl::StoreToDisk(const Job& job, const Slot& slot, const ExecutablePtr& exec) {
  EntryState& entry = *slot.key.entry;
  WriteToDisk(DiskKeyOf(entry, *job.snapshot, slot.key), entry.name, &slot.key.signature, *exec, job.id);
}

// The persistent cache under JitSession::Compile: a program's code by its
// text (the store's key), with the engine's options and CPU beside it as
// every key of the cache has them.
class EngineImpl::ProgramStore final : public CodeStore {
 public:
  explicit ProgramStore(EngineImpl& engine) : engine_(engine) {}

  ExecutablePtr Load(const std::string& key, const CompileOptions& options) override {
    return engine_.LinkFromDisk(KeyOf(key), options.origin, nullptr, 0, {});
  }
  void Keep(const std::string& key, const Executable& exec, const CompileOptions& options) override {
    engine_.WriteToDisk(KeyOf(key), options.origin, nullptr, exec, 0);
  }

 private:
  DiskKey KeyOf(const std::string& program) const {
    DiskKey key;
    key.entry = "program";
    key.mode = "program";
    key.signature = program;
    key.options = engine_.disk_options_;
    key.cpu = engine_.disk_cpu_;
    return key;
  }
  EngineImpl& engine_;
};

std::shared_ptr<CodeStore> EngineImpl::MakeProgramStore() { return std::make_shared<ProgramStore>(*this); }

CompileOptions EngineImpl::CompileOptionsFor(const std::string& entry) const {
  CompileOptions o = compile_options_;
  o.origin = entry;
  return o;
}

}  // namespace pejit
