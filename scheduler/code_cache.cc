#include "scheduler/code_cache.h"

#include <mutex>

namespace pejit {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

}  // namespace

const char* SlotStateName(SlotState s) {
  switch (s) {
    case SlotState::kCold: return "cold";
    case SlotState::kPending: return "pending";
    case SlotState::kReady: return "ready";
    case SlotState::kFailed: return "failed";
  }
  return "?";
}

std::shared_ptr<const DefinitionVersions> DefinitionVersions::Of(const ModuleSnapshot& snapshot,
                                                                 const std::string& entry) {
  auto v = std::make_shared<DefinitionVersions>();
  v->versions = snapshot.VersionsOf(entry);
  for (const auto& [name, version] : v->versions) {
    v->key += name;
    v->key += '=';
    v->key += std::to_string(version);
    v->key += ';';
  }
  v->hash = std::hash<std::string>{}(v->key);
  return v;
}

bool DefinitionVersions::CurrentIn(const ModuleSnapshot& snapshot) const {
  for (const auto& [name, version] : versions) {
    const Definition* d = snapshot.Find(name);
    if (!d || d->version != version) return false;
  }
  return true;
}

size_t SlotKey::Hash() const {
  uint64_t h = Mix(std::hash<const void*>{}(static_cast<const void*>(entry)), signature.hash);
  h = Mix(h, std::hash<std::string>{}(mode));
  return static_cast<size_t>(Mix(h, versions ? versions->hash : 0));
}

bool operator==(const SlotKey& a, const SlotKey& b) {
  if (a.entry != b.entry || !(a.signature == b.signature) || a.mode != b.mode) return false;
  if (a.versions == b.versions) return true;
  return a.versions && b.versions && a.versions->hash == b.versions->hash &&
         a.versions->key == b.versions->key;
}

SlotPtr CodeCache::Find(const SlotKey& key, bool touch) const {
  SlotPtr slot;
  {
    std::shared_lock lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    slot = it->second;
  }
  if (touch) slot->last_used.store(Tick(), std::memory_order_relaxed);
  return slot;
}

SlotPtr CodeCache::FindOrInsert(const SlotKey& key, const std::string& entry_name, SlotState initial,
                                uint64_t generation, const Module& module, bool* inserted,
                                std::vector<Eviction>* evicted) {
  *inserted = false;
  if (SlotPtr found = Find(key)) return found;
  std::unique_lock lock(mu_);
  auto it = map_.find(key);
  if (it != map_.end()) {
    it->second->last_used.store(Tick(), std::memory_order_relaxed);
    return it->second;
  }
  // Guarantee (d): an edit newer than the caller's snapshot was already
  // processed, so nothing would drop a stale slot inserted now.
  if (generation < last_edit_generation_ && !key.versions->CurrentIn(*module.snapshot())) return nullptr;
  auto slot = std::make_shared<Slot>(key, entry_name, initial);
  slot->last_used.store(Tick(), std::memory_order_relaxed);
  map_.emplace(key, slot);
  per_entry_[key.entry].slots++;
  *inserted = true;
  EvictTrackedLocked(key.entry, slot.get(), evicted);
  return slot;
}

void CodeCache::EvictTrackedLocked(const EntryState* entry, const Slot* keep,
                                   std::vector<Eviction>* evicted) {
  const PerEntry& pe = per_entry_[entry];
  int excess = pe.slots - pe.ready - limits_.max_tracked_per_entry;
  for (; excess > 0; --excess) {
    SlotPtr victim = LruLocked(entry, /*ready=*/false, keep);
    if (!victim) break;
    UnlinkLocked(*victim, SlotDrop::kEvicted);
    if (evicted) evicted->push_back({victim, "tracked-max"});
  }
}

SlotPtr CodeCache::LruLocked(const EntryState* entry, bool ready, const Slot* keep) const {
  SlotPtr best;
  uint64_t best_used = UINT64_MAX;
  for (const auto& [key, slot] : map_) {
    if (slot.get() == keep || (entry && key.entry != entry)) continue;
    SlotState s = slot->Load();
    bool eligible = ready ? s == SlotState::kReady : (s == SlotState::kCold || s == SlotState::kFailed);
    if (!eligible) continue;
    uint64_t used = slot->last_used.load(std::memory_order_relaxed);
    if (used < best_used) {
      best_used = used;
      best = slot;
    }
  }
  return best;
}

void CodeCache::UnlinkLocked(Slot& slot, SlotDrop why) {
  if (!slot.in_cache_) return;
  slot.in_cache_ = false;
  slot.dropped.store(why, std::memory_order_release);
  PerEntry& pe = per_entry_[slot.key.entry];
  pe.slots--;
  if (slot.Load() == SlotState::kReady) {
    pe.ready--;
    bytes_ -= slot.bytes;
  }
  map_.erase(slot.key);
}

std::vector<Eviction> CodeCache::Publish(Slot& slot, ExecutablePtr exec, std::vector<int> gradient_result) {
  std::vector<Eviction> evicted;
  std::unique_lock lock(mu_);
  // (J5) The swap. The lock only keeps the byte count in step with the map;
  // readers never take it to see the new state.
  slot.tier = exec->tier();
  slot.bytes = exec->code_bytes();
  slot.exec = std::move(exec);
  slot.gradient_result = std::move(gradient_result);
  slot.state.store(SlotState::kReady, std::memory_order_release);
  if (!slot.in_cache_) return evicted;
  PerEntry& pe = per_entry_[slot.key.entry];
  pe.ready++;
  bytes_ += slot.bytes;
  // (J6) Evict: first this entry's oldest past its maximum, then anyone's
  // oldest past the byte budget; never the slot just published.
  while (pe.ready > limits_.max_specializations_per_entry) {
    SlotPtr victim = LruLocked(slot.key.entry, /*ready=*/true, &slot);
    if (!victim) break;
    UnlinkLocked(*victim, SlotDrop::kEvicted);
    evicted.push_back({victim, "entry-max"});
  }
  EvictPastBudgetLocked(slot, evicted);
  return evicted;
}

void CodeCache::EvictPastBudgetLocked(const Slot& keep, std::vector<Eviction>& evicted) {
  while (bytes_ > limits_.code_bytes) {
    SlotPtr victim = LruLocked(nullptr, /*ready=*/true, &keep);
    if (!victim) break;
    UnlinkLocked(*victim, SlotDrop::kEvicted);
    evicted.push_back({victim, "budget"});
  }
}

std::vector<Eviction> CodeCache::Recount(Slot& slot) {
  std::vector<Eviction> evicted;
  std::unique_lock lock(mu_);
  if (!slot.in_cache_ || slot.Load() != SlotState::kReady || slot.run_failed.load()) return evicted;
  bytes_ -= slot.bytes;
  slot.bytes = slot.exec->code_bytes();
  bytes_ += slot.bytes;
  EvictPastBudgetLocked(slot, evicted);
  return evicted;
}

std::vector<Eviction> CodeCache::Fail(Slot& slot, std::string reason) {
  std::vector<Eviction> evicted;
  std::unique_lock lock(mu_);
  slot.reason = std::move(reason);
  slot.state.store(SlotState::kFailed, std::memory_order_release);
  if (slot.in_cache_) EvictTrackedLocked(slot.key.entry, &slot, &evicted);
  return evicted;
}

bool CodeCache::FailReady(Slot& slot, std::string reason) {
  bool expected = false;
  if (!slot.run_failed.compare_exchange_strong(expected, true)) return false;
  std::unique_lock lock(mu_);
  if (slot.in_cache_) {
    PerEntry& pe = per_entry_[slot.key.entry];
    pe.ready--;
    bytes_ -= slot.bytes;
  }
  slot.reason = std::move(reason);
  slot.state.store(SlotState::kFailed, std::memory_order_release);
  // Kept in the map as a failed slot: the signature is not compiled again
  // until the module changes.
  return true;
}

std::vector<SlotPtr> CodeCache::Invalidate(const ModuleEdit& edit) {
  std::vector<SlotPtr> dropped;
  std::unique_lock lock(mu_);
  last_edit_generation_ = std::max(last_edit_generation_, edit.after->generation());
  for (const auto& [key, slot] : map_) {
    for (const auto& [name, version] : key.versions->versions) {
      if (!edit.affected.count(name)) continue;
      const Definition* now = edit.after->Find(name);
      if (!now || now->version != version) {
        dropped.push_back(slot);
        break;
      }
    }
  }
  for (const SlotPtr& slot : dropped) UnlinkLocked(*slot, SlotDrop::kInvalidated);
  return dropped;
}

std::vector<SlotPtr> CodeCache::Clear() {
  std::vector<SlotPtr> all;
  std::unique_lock lock(mu_);
  for (const auto& [_, slot] : map_) all.push_back(slot);
  for (const SlotPtr& slot : all) UnlinkLocked(*slot, SlotDrop::kShutdown);
  return all;
}

size_t CodeCache::bytes() const {
  std::shared_lock lock(mu_);
  return bytes_;
}

size_t CodeCache::size() const {
  std::shared_lock lock(mu_);
  return map_.size();
}

int64_t CodeCache::Retain(const std::vector<SlotPtr>& dropped) {
  if (limits_.retained_code_bytes == 0) return 0;
  std::deque<ExecutablePtr> released;  // freed after the lock
  std::lock_guard<std::mutex> lock(retained_mu_);
  int64_t kept = 0;
  for (const SlotPtr& slot : dropped) {
    if (slot->Load() != SlotState::kReady || !slot->exec) continue;
    retained_bytes_ += slot->bytes;
    retained_.push_back(slot->exec);
    ++kept;
  }
  while (retained_bytes_ > limits_.retained_code_bytes && !retained_.empty()) {
    retained_bytes_ -= retained_.front()->code_bytes();
    released.push_back(std::move(retained_.front()));
    retained_.pop_front();
  }
  return kept;
}

size_t CodeCache::retained_bytes() const {
  std::lock_guard<std::mutex> lock(retained_mu_);
  return retained_bytes_;
}

}  // namespace pejit
