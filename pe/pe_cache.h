// \file Specializations of helpers, kept across partial-evaluation runs.
//
// When PE of one entry (say `loss`) unfolds a helper (`@forward`) on some
// static skeleton of arguments, the residual code that unfolding emitted is
// kept here as a *template*: a residual function of the helper's dynamic
// argument leaves. When PE of another entry (`infer`), or of the same entry
// in another mode, reaches the same helper on the same skeleton, it emits the
// template's code with its own argument atoms instead of unfolding the helper
// again. partial_eval.cc (step 7 of its essay) says which calls are kept, what
// the key holds, and why a replayed call gives exactly the residual a fresh
// unfolding gives.
//
// The key holds the helper's name, the versions of the helper and of every
// definition it calls (ModuleSnapshot::VersionsOf), and the skeleton of the
// arguments; so an edit of the module is never answered by a stale template:
// the old key simply stops matching, and LRU eviction drops it in time.
//
// Thread safe: engine workers specialize concurrently and share one cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "pe/pe_template.h"

namespace pejit {

struct PeCacheOptions {
  // Templates kept; the least recently used go first beyond either bound.
  size_t max_entries = 64;
  // Let-bindings of all templates together. A template costs about 50 bytes
  // per binding (the Tree-LSTM's @logits for 25 trees: 6,700 bindings).
  int64_t max_bindings = 200'000;
};

struct PeCacheStats {
  size_t entries = 0;
  int64_t bindings = 0;   // held now
  int64_t hits = 0;       // lookups answered
  int64_t misses = 0;     // lookups not answered
  int64_t inserted = 0;   // templates added
  int64_t evicted = 0;    // templates dropped for the bounds
};

class PeCache {
 public:
  explicit PeCache(PeCacheOptions options = {});
  PeCache(const PeCache&) = delete;
  PeCache& operator=(const PeCache&) = delete;

  PeCacheStats stats() const;
  void Clear();

  // The partial evaluator's side, by the keys partial_eval.cc makes.
  using Ptr = std::shared_ptr<const PeTemplate>;
  // Null when absent; a hit becomes the most recently used.
  Ptr Find(const std::string& key);
  // Keeps `t` under `key` (replacing an entry of that key), then evicts;
  // false when `t` alone is over the bounds (not kept).
  bool Insert(const std::string& key, Ptr t, int64_t bindings);
  // Whether anything can be kept at all (bounds above zero).
  bool enabled() const { return options_.max_entries > 0 && options_.max_bindings > 0; }

 private:
  struct Entry {
    std::string key;
    Ptr value;
    int64_t bindings;
  };
  const PeCacheOptions options_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  PeCacheStats stats_;
};

}  // namespace pejit
