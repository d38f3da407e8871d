// \file The persistent code cache: compiled specializations on disk.
//
// A process that compiled a specialization writes its image (jit/image.h)
// here; a later process (or another engine) with the same key loads it
// instead of partially evaluating and compiling, and runs it: whoever can
// write an entry chooses native code the user runs. An entry is one file,
// named by a hash of its key, holding a header (format, pejit version, the
// CPU and its features, the whole key), the image and an HMAC-SHA256 of
// both (support/mac.h). What guards it (docs/cache.md, the threat model):
//   - the directory must be the effective user's and writable by no one
//     else (as OpenSSH's StrictModes asks of ~/.ssh), else the constructor
//     refuses it, saying why and what to do; it is created mode 0700, and
//     every file is opened relative to the descriptor of the directory
//     checked, never following a symbolic link;
//   - the MAC's key is 32 random bytes in `key` beside the entries, mode
//     0600: an entry made without it (planted, copied in from another
//     cache) fails, and so does a key file that others can read;
//   - a reader reads only a regular file of the user's that no one else
//     can write, of bounded size (a FIFO, a device, a directory, a link,
//     another user's file are refused and left in place), then checks the
//     magic, MAC, format, version, CPU and key, refusing (and removing its
//     own file) anything else, with the reason;
//   - a writer writes a temporary file of its own and renames it into
//     place: readers see a whole entry or none, however many processes
//     share the directory, and a writer killed mid-write leaves only a
//     temporary file, removed once stale by a later scan (below: only
//     names of the form Store writes, only the user's regular files,
//     nothing else is removed);
//   - past `max_bytes` the least recently used entries (by modification
//     time, which a load renews) are removed. The directory is scanned for
//     that on the first store, then only when the bytes this cache counts
//     (the scan's total, plus what it stored since) pass the budget, or
//     after kRescanEvery stores (other processes' entries): a scan per
//     store cost a millisecond at 900 entries, more than most compiles.
// Thread safe, and safe across processes.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/module.h"

namespace pejit {

// What a compiled specialization depends on; entries of equal keys are
// interchangeable.
struct DiskKey {
  std::string entry;         // the entry's name
  std::string mode;          // "value", "grad:0,2", ...
  std::string signature;     // the skeleton (pe/signature.h), verbatim
  uint64_t definitions = 0;  // a hash of the text of the definitions it was specialized from
  std::string options;       // engine options that change the code (batching, fuel, compile options)
  std::string cpu;           // the host CPU and its features

  std::string ToString() const;  // every field, for the header
  uint64_t Hash() const;
};

// The hash DiskKey::definitions holds: of the text of `entry`'s definition,
// of everything it calls, and of the module's types.
uint64_t DefinitionsHash(const ModuleSnapshot& module, const std::string& entry);

class DiskCache {
 public:
  // Creates `dir` (mode 0700) and its key if needed; throws
  // std::runtime_error when it cannot, or when the directory or its key is
  // not trusted (above), saying why.
  DiskCache(std::string dir, uint64_t max_bytes);
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  struct Loaded {
    std::string image;
    uint64_t bytes = 0;  // of the file
  };
  // The image stored under `key`; nullopt when there is none. An entry that
  // fails a check is refused, saying why in `refused` (and removed if it is
  // a regular file of the user's).
  std::optional<Loaded> Load(const DiskKey& key, std::string* refused) const;

  struct Stored {
    uint64_t bytes = 0;  // of the file written
    int evicted = 0;     // entries removed to stay under max_bytes
  };
  // Writes `image` under `key`, replacing any entry of that key. Throws
  // std::runtime_error when the file cannot be written.
  Stored Store(const DiskKey& key, std::string_view image) const;

  // Whether an entry of `key` is there (unchecked: Load checks it).
  bool Has(const DiskKey& key) const;

  // Every entry that passes the checks, with its key (`pejit export
  // --from-cache`); those that fail are skipped, not removed.
  std::vector<std::pair<DiskKey, std::string>> List() const;

  const std::string& dir() const { return dir_; }
  std::string PathOf(const DiskKey& key) const;  // where its entry is
  static std::string NameOf(const DiskKey& key);  // its entry's file name

  // The format and pejit version written into every header.
  static constexpr uint32_t kFormat = 4;  // 2: images with a parallel schedule; 3: with lanes (jit/image.cc); 4: MAC
  static const char* Version();

 private:
  static constexpr int kRescanEvery = 1024;
  int EvictPast(uint64_t max_bytes) const;  // under budget_mu_

  std::string dir_;
  uint64_t max_bytes_;
  int dir_fd_ = -1;  // the directory checked, every file opened relative to it
  std::string key_;  // the MAC's
  // The budget's count (above), under budget_mu_.
  mutable std::mutex budget_mu_;
  mutable bool scanned_ = false;
  mutable uint64_t counted_bytes_ = 0;
  mutable int stores_since_scan_ = 0;
};

}  // namespace pejit
