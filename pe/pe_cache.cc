#include "pe/pe_cache.h"

namespace pejit {

PeCache::PeCache(PeCacheOptions options) : options_(options) {}

PeCacheStats PeCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void PeCache::Clear() {
  std::list<Entry> dropped;  // freed outside the lock
  std::lock_guard lock(mu_);
  dropped.swap(lru_);
  index_.clear();
  stats_.entries = 0;
  stats_.bindings = 0;
}

PeCache::Ptr PeCache::Find(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++stats_.misses;
    return nullptr;
  }
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

bool PeCache::Insert(const std::string& key, Ptr t, int64_t bindings) {
  std::list<Entry> dropped;  // templates hold IR; freed outside the lock
  std::lock_guard lock(mu_);
  if (bindings > options_.max_bindings || options_.max_entries == 0) return false;  // would crowd out everything
  if (auto it = index_.find(key); it != index_.end()) {
    stats_.bindings -= it->second->bindings;
    dropped.splice(dropped.end(), lru_, it->second);
    index_.erase(it);
  }
  lru_.push_front({key, std::move(t), bindings});
  index_[key] = lru_.begin();
  stats_.bindings += bindings;
  ++stats_.inserted;
  // The newest entry fits alone, so the loop stops before reaching it.
  while (lru_.size() > options_.max_entries || stats_.bindings > options_.max_bindings) {
    stats_.bindings -= lru_.back().bindings;
    index_.erase(lru_.back().key);
    dropped.splice(dropped.end(), lru_, std::prev(lru_.end()));
    ++stats_.evicted;
  }
  stats_.entries = lru_.size();
  return true;
}

}  // namespace pejit
