#include "scheduler/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <vector>

#include "ir/printer.h"
#include "support/hash.h"

namespace pejit {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'P', 'E', 'J', 'I', 'T', 'C', 'C', '\n'};
constexpr const char* kSuffix = ".pjc";
// A temporary file this old belongs to a writer that died.
constexpr auto kStaleTemporary = std::chrono::minutes(10);

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

DiskCache::DiskCache(std::string dir, uint64_t max_bytes) : dir_(std::move(dir)), max_bytes_(max_bytes) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) {
    throw std::runtime_error("code cache: cannot use directory " + dir_ + (ec ? ": " + ec.message() : ""));
  }
}

std::string DiskCache::PathOf(const DiskKey& key) const { return dir_ + "/" + Hex(key.Hash()) + kSuffix; }

bool DiskCache::Has(const DiskKey& key) const { return ::access(PathOf(key).c_str(), F_OK) == 0; }

// An entry: magic, then the checksum of all that follows, then the header
// (format, version, key) and the image, each length-prefixed.
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
  Append64(file, Fnv1a(body.data(), body.size()));
  file += body;

  static std::atomic<uint64_t> counter{0};
  const std::string path = PathOf(key);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1)) +
                          "." + Hex(std::random_device()());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("code cache: cannot create " + tmp + ": " + std::strerror(errno));
  // No fsync: a crash (or power loss) that leaves a short or empty file is
  // caught by the checksum, and a sync per entry cost more than the compile.
  bool ok = WriteAll(fd, file);
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw std::runtime_error("code cache: cannot write " + path + ": " + why);
  }
  Stored stored;
  stored.bytes = file.size();
  stored.evicted = EvictPast(max_bytes_);
  return stored;
}

namespace {

// An entry file's header and image, or why it fails the checks.
struct Parsed {
  std::string header, image, why;
};

Parsed Parse(const std::string& file) {
  Parsed p;
  auto refuse = [&](const std::string& why) {
    p.why = why;
    return p;
  };
  if (file.size() < sizeof kMagic + 8 || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
    return refuse("not a pejit code cache entry");
  }
  std::string_view body = std::string_view(file).substr(sizeof kMagic + 8);
  if (Read64(file, sizeof kMagic) != Fnv1a(body.data(), body.size())) return refuse("checksum mismatch (corrupted or truncated)");
  // The checksum holds: the lengths below are the writer's.
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

std::string ReadAll(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  return *ok ? std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()) : std::string();
}

}  // namespace

std::optional<DiskCache::Loaded> DiskCache::Load(const DiskKey& key, std::string* refused) const {
  const std::string path = PathOf(key);
  bool ok = false;
  std::string file = ReadAll(path, &ok);
  if (!ok) return std::nullopt;
  Parsed p = Parse(file);
  if (p.why.empty() && p.header != key.ToString()) p.why = "another key with the same hash, or another CPU";
  if (!p.why.empty()) {
    if (refused) *refused = path + ": " + p.why;
    ::unlink(path.c_str());
    return std::nullopt;
  }
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // recently used
  Loaded loaded;
  loaded.image = std::move(p.image);
  loaded.bytes = file.size();
  return loaded;
}

std::vector<std::pair<DiskKey, std::string>> DiskCache::List() const {
  std::vector<std::pair<DiskKey, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() < 4 || name.compare(name.size() - 4, 4, kSuffix) != 0) continue;
    bool ok = false;
    std::string file = ReadAll(e.path().string(), &ok);
    if (!ok) continue;
    Parsed p = Parse(file);
    DiskKey key;
    if (!p.why.empty() || !ParseKey(p.header, &key)) continue;
    out.emplace_back(std::move(key), std::move(p.image));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first.ToString() < b.first.ToString(); });
  return out;
}

int DiskCache::EvictPast(uint64_t max_bytes) const {
  struct Entry {
    fs::path path;
    fs::file_time_type time;
    uint64_t bytes;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
    std::error_code stat_ec;
    const std::string name = e.path().filename().string();
    auto time = e.last_write_time(stat_ec);
    if (stat_ec) continue;
    if (name.find(".tmp.") != std::string::npos) {
      if (now - time > kStaleTemporary) fs::remove(e.path(), stat_ec);  // its writer died
      continue;
    }
    if (name.size() < 4 || name.compare(name.size() - 4, 4, kSuffix) != 0) continue;
    uint64_t bytes = e.file_size(stat_ec);
    if (stat_ec) continue;
    entries.push_back({e.path(), time, bytes});
    total += bytes;
  }
  if (total <= max_bytes) return 0;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  int evicted = 0;
  for (const Entry& e : entries) {
    if (total <= max_bytes) break;
    std::error_code rm;
    if (fs::remove(e.path, rm)) {
      total -= e.bytes;
      ++evicted;
    }
  }
  return evicted;
}

}  // namespace pejit
