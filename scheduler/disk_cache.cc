#include "scheduler/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cctype>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "ir/printer.h"
#include "support/hash.h"
#include "support/mac.h"

namespace pejit {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'P', 'E', 'J', 'I', 'T', 'C', 'C', '\n'};
constexpr const char* kSuffix = ".pjc";
constexpr const char* kKeyName = "key";
// A temporary file this old belongs to a writer that died.
constexpr int64_t kStaleTemporarySeconds = 600;
// No entry is read whole past this size (a sparse or runaway file).
constexpr uint64_t kMaxEntryBytes = uint64_t{4} << 30;

void Append64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

uint64_t Read64(std::string_view in, size_t at) {
  uint64_t v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

std::string Hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, v);
  return buf;
}

// Writes all of `data` to `fd`; false on an error.
bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

std::string DiskKey::ToString() const {
  std::string s;
  for (std::string_view part : {std::string_view(entry), std::string_view(mode), std::string_view(signature),
                                std::string_view(options), std::string_view(cpu)}) {
    Append64(s, part.size());
    s.append(part);
  }
  Append64(s, definitions);
  return s;
}

uint64_t DiskKey::Hash() const {
  std::string s = ToString();
  return Fnv1a(s.data(), s.size());
}

uint64_t DefinitionsHash(const ModuleSnapshot& module, const std::string& entry) {
  std::string text;
  for (const auto& [name, type] : module.types()) text += PrintTypeDef(*type);
  std::set<std::string> names = module.Callees(entry);
  names.insert(entry);
  for (const std::string& name : names) {
    if (const Definition* d = module.Find(name)) text += PrintFunction(name, d->func);
  }
  return Fnv1a(text.data(), text.size());
}

const char* DiskCache::Version() { return "pejit 0.23"; }

namespace {

bool IsHex(std::string_view s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c) && !std::isupper(c); });
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// An entry's name: 16 hex digits and the suffix.
bool IsEntryName(std::string_view name) {
  return name.size() == 16 + 4 && IsHex(name.substr(0, 16), 16) && name.substr(16) == kSuffix;
}

// A temporary file Store writes: an entry's name, then ".tmp.", the pid, a
// counter and 16 hex digits. Nothing else is ever removed as one.
bool IsTemporaryName(std::string_view name) {
  if (name.size() < 20 + 5 || !IsEntryName(name.substr(0, 20)) || name.substr(20, 5) != ".tmp.") return false;
  std::string_view rest = name.substr(25);
  size_t a = rest.find('.'), b = rest.rfind('.');
  return a != std::string_view::npos && b > a && IsDigits(rest.substr(0, a)) && IsDigits(rest.substr(a + 1, b - a - 1)) &&
         IsHex(rest.substr(b + 1), 16);
}

std::string Mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

// Why a file or directory with `st` is not trusted: it must be the
// effective user's, and no one else may write it ("" when it passes).
std::string Untrusted(const struct stat& st) {
  if (st.st_uid != ::geteuid()) {
    return "it belongs to uid " + std::to_string(st.st_uid) + ", not to you (uid " + std::to_string(::geteuid()) +
           "): its owner could plant code in it that you would run";
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    return "others can write it (mode " + Mode(st.st_mode) + "): they could plant code in it that you would run";
  }
  return "";
}

// Opens `name` in the directory `dir` for reading, if it is a regular file
// that Untrusted passes, of at most `max` bytes; never follows a symbolic
// link nor blocks on a FIFO. -1 otherwise, with why in `*why` (left empty
// when there is no such file).
int OpenTrusted(int dir, const std::string& name, uint64_t max, struct stat* st, std::string* why) {
  int fd = ::openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    *why = errno == ELOOP ? "a symbolic link (never followed)" : std::strerror(errno);
    return -1;
  }
  std::string reason;
  if (::fstat(fd, st) != 0) {
    reason = std::strerror(errno);
  } else if (!S_ISREG(st->st_mode)) {
    reason = KindOf(st->st_mode) + ", not a regular file";
  } else if (std::string u = Untrusted(*st); !u.empty()) {
    reason = u;
  } else if (static_cast<uint64_t>(st->st_size) > max) {
    reason = std::to_string(st->st_size) + " bytes, more than the " + std::to_string(max) + " it may have";
  }
  if (!reason.empty()) {
    ::close(fd);
    *why = reason;
    return -1;
  }
  return fd;
}

// Up to `n` bytes of `fd`, from its start; false on a read error.
bool ReadFd(int fd, uint64_t n, std::string* out) {
  out->resize(n);
  uint64_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, out->data() + got, n - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  out->resize(got);
  return true;
}

// The names in directory `dir` (its fd, which stays open).
std::vector<std::string> Names(int dir) {
  std::vector<std::string> names;
  int copy = ::dup(dir);
  if (copy < 0) return names;
  DIR* d = ::fdopendir(copy);
  if (!d) {
    ::close(copy);
    return names;
  }
  ::rewinddir(d);
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

std::string LoadOrMakeKey(int dir, const std::string& dir_name) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    struct stat st;
    std::string why;
    int fd = OpenTrusted(dir, kKeyName, kMacKeyBytes, &st, &why);
    if (fd >= 0) {
      std::string key;
      const bool read = ReadFd(fd, kMacKeyBytes, &key);
      ::close(fd);
      if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        why = "others can read it (mode " + Mode(st.st_mode) + "): chmod 600 it, or remove it (the entries go with it)";
      } else if (!read || key.size() != kMacKeyBytes) {
        why = "not a key of " + std::to_string(kMacKeyBytes) + " bytes";
      } else {
        return key;
      }
    }
    if (!why.empty()) throw std::runtime_error("code cache: refusing " + dir_name + "/" + kKeyName + ": " + why);
    // None yet: written whole under a name of its own, then linked into
    // place, where the first of several processes doing so wins.
    const std::string tmp = std::string(kKeyName) + ".tmp." + std::to_string(::getpid()) + "." + Hex(std::random_device()());
    fd = ::openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("code cache: cannot create a key in " + dir_name + ": " + std::strerror(errno));
    const bool ok = WriteAll(fd, RandomBytes(kMacKeyBytes));
    ::close(fd);
    const int linked = ok ? ::linkat(dir, tmp.c_str(), dir, kKeyName, 0) : -1;
    const int error = errno;
    ::unlinkat(dir, tmp.c_str(), 0);
    if (!ok || (linked != 0 && error != EEXIST)) {
      throw std::runtime_error("code cache: cannot write a key in " + dir_name + ": " + std::strerror(error));
    }
  }
  throw std::runtime_error("code cache: the key in " + dir_name + " keeps changing");
}

}  // namespace

DiskCache::DiskCache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  const fs::path parent = fs::path(dir_).parent_path();
  std::error_code ec;
  if (!parent.empty()) fs::create_directories(parent, ec);
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) {
    throw std::runtime_error("code cache: cannot create directory " + dir_ + ": " + std::strerror(errno));
  }
  // Every file is opened relative to this descriptor: the directory checked
  // here is the one used, whatever happens to its path later.
  dir_fd_ = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir_fd_ < 0) {
    const std::string why = errno == ELOOP || errno == ENOTDIR ? "a symbolic link or not a directory" : std::strerror(errno);
    throw std::runtime_error("code cache: cannot use " + dir_ + ": " + why);
  }
  struct stat st;
  std::string why = ::fstat(dir_fd_, &st) != 0 ? std::strerror(errno) : Untrusted(st);
  if (!why.empty()) {
    ::close(dir_fd_);
    throw std::runtime_error("code cache: refusing directory " + dir_ + ": " + why +
                             ". Use a directory of your own that only you can write (mkdir -m 700 DIR); "
                             "docs/cache.md says how to share compiled code between users");
  }
  try {
    key_ = LoadOrMakeKey(dir_fd_, dir_);
  } catch (...) {
    ::close(dir_fd_);
    throw;
  }
}

DiskCache::~DiskCache() { ::close(dir_fd_); }

std::string DiskCache::NameOf(const DiskKey& key) { return Hex(key.Hash()) + kSuffix; }

std::string DiskCache::PathOf(const DiskKey& key) const { return dir_ + "/" + NameOf(key); }

bool DiskCache::Has(const DiskKey& key) const {
  struct stat st;
  return ::fstatat(dir_fd_, NameOf(key).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// An entry: magic, then the MAC of all that follows under the directory's
// key, then the header (format, version, key) and the image, each
// length-prefixed.
DiskCache::Stored DiskCache::Store(const DiskKey& key, std::string_view image) const {
  std::string body;
  Append64(body, kFormat);
  const std::string version = Version(), header = key.ToString();
  Append64(body, version.size());
  body += version;
  Append64(body, header.size());
  body += header;
  Append64(body, image.size());
  body += image;
  std::string file(kMagic, sizeof kMagic);
  file += Mac(key_, body);
  file += body;

  static std::atomic<uint64_t> counter{0};
  const std::string name = NameOf(key);
  const std::string tmp = name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) + "." +
                          Hex((uint64_t{std::random_device()()} << 32) | std::random_device()());
  int fd = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("code cache: cannot create " + dir_ + "/" + tmp + ": " + std::strerror(errno));
  // No fsync: a crash (or power loss) that leaves a short or empty file is
  // caught by the MAC, and a sync per entry cost more than the compile.
  bool ok = WriteAll(fd, file);
  ok = ::close(fd) == 0 && ok;
  // What holds the entry's name now is replaced only if it is an entry of
  // this user's (the cache removes nothing it did not write).
  struct stat there;
  const bool replaces = ::fstatat(dir_fd_, name.c_str(), &there, AT_SYMLINK_NOFOLLOW) == 0;
  if (replaces && (!S_ISREG(there.st_mode) || there.st_uid != ::geteuid())) {
    ::unlinkat(dir_fd_, tmp.c_str(), 0);
    throw std::runtime_error("code cache: " + dir_ + "/" + name + " is " +
                             (S_ISREG(there.st_mode) ? "another user's file" : KindOf(there.st_mode)) +
                             ", not an entry this cache wrote: left in place, the code not stored");
  }
  if (!ok || ::renameat(dir_fd_, tmp.c_str(), dir_fd_, name.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlinkat(dir_fd_, tmp.c_str(), 0);
    throw std::runtime_error("code cache: cannot write " + dir_ + "/" + name + ": " + why);
  }
  Stored stored;
  stored.bytes = file.size();
  std::lock_guard lock(budget_mu_);
  counted_bytes_ += file.size();
  counted_bytes_ -= replaces ? std::min<uint64_t>(counted_bytes_, static_cast<uint64_t>(there.st_size)) : 0;
  if (!scanned_ || counted_bytes_ > max_bytes_ || ++stores_since_scan_ >= kRescanEvery) {
    stored.evicted = EvictPast(max_bytes_);
  }
  return stored;
}

namespace {

// An entry file's header and image, or why it fails the checks.
struct Parsed {
  std::string header, image, why;
};

Parsed Parse(const std::string& file, const std::string& key) {
  Parsed p;
  auto refuse = [&](const std::string& why) {
    p.why = why;
    return p;
  };
  if (file.size() < sizeof kMagic + kMacBytes || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    return refuse("not a pejit code cache entry");
  }
  std::string_view body = std::string_view(file).substr(sizeof kMagic + kMacBytes);
  if (!SameMac(std::string_view(file).substr(sizeof kMagic, kMacBytes), Mac(key, body))) {
    return refuse("not authenticated by this cache's key (written elsewhere, with another key, or damaged)");
  }
  // The MAC holds: the lengths below are the writer's.
  size_t at = 0;
  auto field = [&](std::string_view* out) {
    if (body.size() - at < 8) return false;
    uint64_t n = Read64(body, at);
    at += 8;
    if (n > body.size() - at) return false;
    *out = body.substr(at, n);
    at += n;
    return true;
  };
  if (body.size() < 8) return refuse("truncated");
  const uint64_t format = Read64(body, 0);
  at = 8;
  std::string_view version, header, image;
  if (format != DiskCache::kFormat) {
    return refuse("format " + std::to_string(format) + ", not " + std::to_string(DiskCache::kFormat));
  }
  if (!field(&version) || !field(&header) || !field(&image) || at != body.size()) return refuse("malformed");
  if (version != DiskCache::Version()) return refuse("written by " + std::string(version) + ", not " + DiskCache::Version());
  p.header = std::string(header);
  p.image = std::string(image);
  return p;
}

// DiskKey::ToString() read back; false when `s` is not one.
bool ParseKey(std::string_view s, DiskKey* key) {
  size_t at = 0;
  auto part = [&](std::string* out) {
    if (s.size() - at < 8) return false;
    uint64_t n = Read64(s, at);
    at += 8;
    if (n > s.size() - at) return false;
    *out = std::string(s.substr(at, n));
    at += n;
    return true;
  };
  if (!part(&key->entry) || !part(&key->mode) || !part(&key->signature) || !part(&key->options) || !part(&key->cpu)) {
    return false;
  }
  if (s.size() - at != 8) return false;
  key->definitions = Read64(s, at);
  return true;
}

}  // namespace

// The bytes of entry `name`, opened by OpenTrusted; nullopt with `*why`
// when there is none (empty) or it is refused. `*ours` says whether the
// file is a regular one of the effective user's (which a refusal may remove).
static std::optional<std::string> ReadEntry(int dir, const std::string& name, bool* ours, std::string* why) {
  struct stat st;
  *ours = false;
  int fd = OpenTrusted(dir, name, kMaxEntryBytes, &st, why);
  if (fd < 0) return std::nullopt;
  *ours = true;
  std::string file;
  const bool read = ReadFd(fd, static_cast<uint64_t>(st.st_size), &file);
  ::close(fd);
  if (!read) {
    *why = std::strerror(errno);
    return std::nullopt;
  }
  return file;
}

std::optional<DiskCache::Loaded> DiskCache::Load(const DiskKey& key, std::string* refused) const {
  const std::string name = NameOf(key), path = dir_ + "/" + name;
  bool ours = false;
  std::string why;
  std::optional<std::string> file = ReadEntry(dir_fd_, name, &ours, &why);
  Parsed p;
  if (file) {
    p = Parse(*file, key_);
    if (p.why.empty() && p.header != key.ToString()) p.why = "another key with the same hash, or another CPU";
    why = p.why;
  }
  if (!why.empty()) {
    // Only a file of this user's that the checks read is removed: one that
    // is not (another's, a link, a FIFO, a directory) is left as it is.
    if (refused) *refused = path + ": " + why + (ours ? "" : " (left in place)");
    if (ours) ::unlinkat(dir_fd_, name.c_str(), 0);
    return std::nullopt;
  }
  if (!file) return std::nullopt;  // a miss
  int fd = ::openat(dir_fd_, name.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) {  // recently used
    ::futimens(fd, nullptr);
    ::close(fd);
  }
  Loaded loaded;
  loaded.image = std::move(p.image);
  loaded.bytes = file->size();
  return loaded;
}

std::vector<std::pair<DiskKey, std::string>> DiskCache::List() const {
  std::vector<std::pair<DiskKey, std::string>> out;
  for (const std::string& name : Names(dir_fd_)) {
    if (!IsEntryName(name)) continue;
    bool ours = false;
    std::string why;
    std::optional<std::string> file = ReadEntry(dir_fd_, name, &ours, &why);
    if (!file) continue;
    Parsed p = Parse(*file, key_);
    DiskKey key;
    if (!p.why.empty() || !ParseKey(p.header, &key)) continue;
    out.emplace_back(std::move(key), std::move(p.image));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first.ToString() < b.first.ToString(); });
  return out;
}

// Under budget_mu_: rescans the directory, counts its entries' bytes and
// removes dead writers' temporaries.
int DiskCache::EvictPast(uint64_t max_bytes) const {
  struct Entry {
    std::string name;
    struct timespec time;
    uint64_t bytes;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  for (const std::string& name : Names(dir_fd_)) {
    const bool temporary = IsTemporaryName(name);
    if (!temporary && !IsEntryName(name)) continue;  // not a file this cache writes
    struct stat st;
    if (::fstatat(dir_fd_, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;  // nor one it wrote
    if (temporary) {
      if (now - st.st_mtim.tv_sec > kStaleTemporarySeconds) ::unlinkat(dir_fd_, name.c_str(), 0);  // its writer died
      continue;
    }
    entries.push_back({name, st.st_mtim, static_cast<uint64_t>(st.st_size)});
    total += static_cast<uint64_t>(st.st_size);
  }
  scanned_ = true;
  stores_since_scan_ = 0;
  counted_bytes_ = total;
  if (total <= max_bytes) return 0;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.time.tv_sec != b.time.tv_sec ? a.time.tv_sec < b.time.tv_sec : a.time.tv_nsec < b.time.tv_nsec;
  });
  int evicted = 0;
  for (const Entry& e : entries) {
    if (total <= max_bytes) break;
    if (::unlinkat(dir_fd_, e.name.c_str(), 0) == 0) {
      total -= e.bytes;
      ++evicted;
    }
  }
  counted_bytes_ = total;
  return evicted;
}

}  // namespace pejit
