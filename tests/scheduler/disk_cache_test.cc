// The persistent code cache's files (scheduler/disk_cache.h): what is stored
// loads back byte for byte under the same key only; damaged, stale or
// foreign entries are refused with the reason and removed; several processes
// write one directory at once; a writer killed mid-write leaves no torn
// entry; past the byte budget the least recently used entries go. And the
// trust boundary: a directory or key others could write or read, an entry
// planted without the key, a file that is not a regular one of the user's
// are refused with the reason, and nothing the cache did not write is
// removed.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "scheduler/disk_cache.h"
#include "support/hash.h"
#include "support/mac.h"

namespace pejit {
namespace {

namespace fs = std::filesystem;

DiskKey Key(const std::string& entry = "loss", uint64_t definitions = 7) {
  DiskKey k;
  k.entry = entry;
  k.mode = "grad:2";
  k.signature = std::string("skeleton\0with bytes", 19);
  k.definitions = definitions;
  k.options = "batch";
  k.cpu = "znver4 +avx512f";
  return k;
}

std::string Image(size_t n, char seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 31);
  return s;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

class DiskCacheTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("disk_cache_" + std::to_string(::getpid()) + "_" +
                                            testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(DiskCacheTest, AnEntryLoadsBackUnderItsKeyOnly) {
  DiskCache cache(dir_.string(), 1 << 20);
  const std::string image = Image(5000, 3);
  DiskCache::Stored stored = cache.Store(Key(), image);
  EXPECT_GT(stored.bytes, image.size());
  std::string refused;
  std::optional<DiskCache::Loaded> got = cache.Load(Key(), &refused);
  ASSERT_TRUE(got) << refused;
  EXPECT_EQ(got->image, image);
  EXPECT_EQ(got->bytes, stored.bytes);
  // Any other key misses: an edited definition, another mode, CPU or skeleton.
  DiskKey other = Key("loss", 8);
  EXPECT_FALSE(cache.Load(other, &refused));
  other = Key();
  other.cpu = "znver3 +avx2";
  EXPECT_FALSE(cache.Load(other, &refused));
  other = Key();
  other.mode = "value";
  EXPECT_FALSE(cache.Load(other, &refused));
  other = Key();
  other.signature += "x";
  EXPECT_FALSE(cache.Load(other, &refused));
  EXPECT_TRUE(refused.empty()) << refused;  // misses, not refusals
  // A second cache on the directory (another process) finds it.
  EXPECT_EQ(DiskCache(dir_.string(), 1 << 20).Load(Key(), nullptr)->image, image);
}

TEST_F(DiskCacheTest, FlippedBytesAndTruncationAreRefusedAndRemoved) {
  DiskCache cache(dir_.string(), 1 << 20);
  const std::string image = Image(3000, 5);
  cache.Store(Key(), image);
  const std::string path = cache.PathOf(Key()), good = ReadFile(path);
  for (size_t at = 0; at < good.size(); at += 97) {
    std::string bad = good;
    bad[at] ^= 0x10;
    WriteFile(path, bad);
    std::string refused;
    EXPECT_FALSE(cache.Load(Key(), &refused)) << "byte " << at;
    EXPECT_NE(refused.find(path), std::string::npos) << refused;
    EXPECT_FALSE(fs::exists(path)) << "a refused entry stays";
  }
  for (size_t n : {size_t{0}, size_t{5}, size_t{16}, good.size() / 2, good.size() - 1}) {
    WriteFile(path, good.substr(0, n));
    std::string refused;
    EXPECT_FALSE(cache.Load(Key(), &refused)) << n;
    EXPECT_FALSE(refused.empty());
  }
}

// An entry of another pejit version, whose checksum holds: refused for its version.
TEST_F(DiskCacheTest, AnEntryOfAnotherVersionIsRefused) {
  DiskCache cache(dir_.string(), 1 << 20);
  cache.Store(Key(), Image(100, 1));
  const std::string path = cache.PathOf(Key());
  std::string file = ReadFile(path);
  const std::string version = DiskCache::Version();
  size_t at = file.find(version);
  ASSERT_NE(at, std::string::npos);
  file[at + version.size() - 1] ^= 1;  // "pejit 0.23" -> "pejit 0.22"
  const std::string mac = Mac(ReadFile((dir_ / "key").string()), std::string_view(file).substr(8 + kMacBytes));
  file.replace(8, kMacBytes, mac);  // as the key's holder would write it
  WriteFile(path, file);
  std::string refused;
  EXPECT_FALSE(cache.Load(Key(), &refused));
  EXPECT_NE(refused.find("written by pejit"), std::string::npos) << refused;
}

// Four processes store the same and different keys at once: every entry
// loads whole, and no temporary file is left.
TEST_F(DiskCacheTest, ProcessesSharingTheDirectoryNeverTearAnEntry) {
  DiskCache cache(dir_.string(), uint64_t{1} << 30);
  std::vector<pid_t> children;
  for (int p = 0; p < 4; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      DiskCache mine(dir_.string(), uint64_t{1} << 30);
      for (int round = 0; round < 20; ++round) {
        mine.Store(Key("shared"), Image(200000, 9));  // the same bytes from every process
        mine.Store(Key("own" + std::to_string(p)), Image(1000 + p, static_cast<char>(p)));
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (int round = 0; round < 50; ++round) {  // meanwhile, readers see a whole entry or none
    std::string refused;
    if (auto got = cache.Load(Key("shared"), &refused)) {
      EXPECT_EQ(got->image, Image(200000, 9));
    }
    EXPECT_TRUE(refused.empty()) << refused;
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(cache.Load(Key("shared"), nullptr)->image, Image(200000, 9));
  for (int p = 0; p < 4; ++p) EXPECT_EQ(cache.Load(Key("own" + std::to_string(p)), nullptr)->image, Image(1000 + p, static_cast<char>(p)));
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

// A writer killed while it writes: the entry is the old one or the new one,
// whole (the kill may land before or after the rename); its temporary file,
// once stale, is removed by the next scan of the directory (a cache's first
// store: the next process's).
TEST_F(DiskCacheTest, AWriterKilledMidWriteLeavesNoTornEntry) {
  DiskCache cache(dir_.string(), uint64_t{1} << 32);
  const std::string old_image = Image(1000, 2), new_image = Image(64 << 20, 4);
  cache.Store(Key(), old_image);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    for (;;) DiskCache(dir_.string(), uint64_t{1} << 32).Store(Key(), new_image);
  }
  // Wait until it is writing a temporary file, then kill it.
  auto writing = [&] {
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    }
    return false;
  };
  while (!writing()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  std::string refused;
  std::optional<DiskCache::Loaded> got = cache.Load(Key(), &refused);
  ASSERT_TRUE(got) << refused;
  EXPECT_TRUE(got->image == old_image || got->image == new_image) << got->image.size() << " bytes";
  // The dead writer's temporary file, made old, goes with the next scan.
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().find(".tmp.") == std::string::npos) continue;
    fs::last_write_time(e.path(), fs::file_time_type::clock::now() - std::chrono::hours(1));
  }
  DiskCache(dir_.string(), uint64_t{1} << 32).Store(Key("other"), "x");
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

// What `pejit export --from-cache` reads: every entry that passes the
// checks, with its whole key; a damaged one is skipped.
TEST_F(DiskCacheTest, ListingGivesEveryWholeEntryWithItsKey) {
  DiskCache cache(dir_.string(), 1 << 20);
  cache.Store(Key("a"), Image(100, 1));
  cache.Store(Key("b", 9), Image(200, 2));
  cache.Store(Key("c"), Image(300, 3));
  std::ofstream(cache.PathOf(Key("c")), std::ios::binary | std::ios::app) << "x";
  std::vector<std::pair<DiskKey, std::string>> listed = cache.List();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].first.ToString(), Key("a").ToString());
  EXPECT_EQ(listed[0].second, Image(100, 1));
  EXPECT_EQ(listed[1].first.ToString(), Key("b", 9).ToString());
  EXPECT_EQ(listed[1].first.definitions, 9u);
  EXPECT_EQ(listed[1].second, Image(200, 2));
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A directory another user could write (a shared /tmp/cache, mode 1777) or
// owns, or a symbolic link in its place, is refused before anything is read
// from it, saying why and what to do.
TEST_F(DiskCacheTest, RefusesADirectoryAnotherUserCouldWriteInto) {
  fs::create_directories(dir_);
  ASSERT_EQ(::chmod(dir_.c_str(), 01777), 0);
  std::string error = ErrorOf([&] { DiskCache(dir_.string(), 1 << 20); });
  EXPECT_NE(error.find("refusing directory " + dir_.string() + ": others can write it (mode 1777)"), std::string::npos) << error;
  EXPECT_NE(error.find("mkdir -m 700"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir_ / "key"));  // nothing written there
  ASSERT_EQ(::chmod(dir_.c_str(), 0750), 0);  // group may read, not write: fine
  DiskCache(dir_.string(), 1 << 20).Store(Key(), "x");

  const fs::path link = dir_.string() + "_link";
  fs::remove(link);
  fs::create_directory_symlink(dir_, link);
  error = ErrorOf([&] { DiskCache(link.string(), 1 << 20); });
  EXPECT_NE(error.find("a symbolic link or not a directory"), std::string::npos) << error;
  fs::remove(link);

  if (::chown(dir_.c_str(), 65534, 65534) != 0) GTEST_SKIP() << "cannot give the directory away here: " << std::strerror(errno);
  error = ErrorOf([&] { DiskCache(dir_.string(), 1 << 20); });
  EXPECT_NE(error.find("it belongs to uid 65534, not to you (uid " + std::to_string(::geteuid()) + ")"), std::string::npos) << error;
}

// An entry planted by someone without the key (its checksum recomputed, or
// copied from another cache with a key of its own) is refused.
TEST_F(DiskCacheTest, AnEntryMadeWithoutTheKeyIsRefused) {
  DiskCache cache(dir_.string(), 1 << 20);
  cache.Store(Key(), Image(500, 1));
  const std::string path = cache.PathOf(Key());
  std::string file = ReadFile(path);
  file[file.size() - 1] ^= 1;  // other code, with the checksums anyone can compute
  const uint64_t fnv = Fnv1a(file.data() + 8 + kMacBytes, file.size() - 8 - kMacBytes);
  std::memcpy(file.data() + 8, &fnv, 8);
  WriteFile(path, file);
  std::string refused;
  EXPECT_FALSE(cache.Load(Key(), &refused));
  EXPECT_NE(refused.find("not authenticated by this cache's key"), std::string::npos) << refused;

  const fs::path other = dir_.string() + "_other";
  fs::remove_all(other);
  DiskCache(other.string(), 1 << 20).Store(Key(), Image(500, 2));
  fs::copy_file(other / DiskCache::NameOf(Key()), path, fs::copy_options::overwrite_existing);
  EXPECT_FALSE(cache.Load(Key(), &refused));
  EXPECT_NE(refused.find("not authenticated"), std::string::npos) << refused;
  EXPECT_TRUE(cache.List().empty());  // what `pejit export --from-cache` would copy
  fs::remove_all(other);
}

// The key is the user's alone: one others can read is refused.
TEST_F(DiskCacheTest, AKeyOthersCanReadIsRefused) {
  DiskCache(dir_.string(), 1 << 20).Store(Key(), "x");
  struct stat st;
  ASSERT_EQ(::stat((dir_ / "key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::chmod((dir_ / "key").c_str(), 0644), 0);
  std::string error = ErrorOf([&] { DiskCache(dir_.string(), 1 << 20); });
  EXPECT_NE(error.find("refusing " + dir_.string() + "/key: others can read it (mode 0644)"), std::string::npos) << error;
}

// Where an entry should be, a directory, a FIFO, a symbolic link to a
// valid entry, a file others can write, one of another user's or one of
// several gigabytes: each refused with what it is, none read whole or
// waited on, none removed.
TEST_F(DiskCacheTest, WhatIsNotARegularFileOfTheUsersIsRefusedAndLeft) {
  DiskCache cache(dir_.string(), 1 << 20);
  cache.Store(Key("good"), Image(100, 1));
  const std::string path = cache.PathOf(Key());
  auto refusal = [&] {
    std::string refused;
    EXPECT_FALSE(cache.Load(Key(), &refused));
    EXPECT_TRUE(fs::exists(fs::symlink_status(path))) << "removed: " << refused;
    return refused;
  };
  fs::create_directory(path);
  EXPECT_NE(refusal().find("a directory, not a regular file (left in place)"), std::string::npos);
  try {  // nor replaced by a store
    cache.Store(Key(), "x");
    ADD_FAILURE() << "stored over a directory";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory, not an entry this cache wrote: left in place"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(path));
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  EXPECT_NE(refusal().find("a FIFO, not a regular file"), std::string::npos);
  fs::remove(path);
  fs::create_symlink(cache.PathOf(Key("good")), path);
  EXPECT_NE(refusal().find("a symbolic link (never followed)"), std::string::npos);
  fs::remove(path);
  cache.Store(Key(), Image(100, 2));
  ASSERT_EQ(::chmod(path.c_str(), 0620), 0);
  EXPECT_NE(refusal().find("others can write it (mode 0620)"), std::string::npos);
  fs::remove(path);
  { std::ofstream(path, std::ios::binary); }
  fs::resize_file(path, uint64_t{5} << 30);  // sparse
  EXPECT_NE(refusal().find("5368709120 bytes, more than the"), std::string::npos);
  fs::remove(path);
  EXPECT_EQ(cache.List().size(), 1u);  // "good" alone
  cache.Store(Key(), Image(100, 3));
  if (::chown(path.c_str(), 65534, 65534) != 0) GTEST_SKIP() << "cannot give the file away here: " << std::strerror(errno);
  EXPECT_NE(refusal().find("it belongs to uid 65534"), std::string::npos);
}

// Eviction and the clean-up of dead writers' temporary files touch only
// names of the forms the cache writes, and only the user's regular files.
TEST_F(DiskCacheTest, NothingTheCacheDidNotWriteIsRemoved) {
  DiskCache cache(dir_.string(), 1);  // every store evicts all it may
  const std::string name = DiskCache::NameOf(Key("x"));
  std::vector<fs::path> others = {dir_ / "notes.tmp.1", dir_ / (name + ".tmp.junk"), dir_ / "README", dir_ / "a.pjc"};
  for (const fs::path& p : others) WriteFile(p.string(), "mine");
  const fs::path dir_like = dir_ / (name + ".tmp.1.2.0123456789abcdef");
  fs::create_directory(dir_like);
  const fs::path link_like = dir_ / DiskCache::NameOf(Key("y"));
  fs::create_symlink(dir_ / "README", link_like);
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(2);
  for (const fs::path& p : others) fs::last_write_time(p, old);
  fs::last_write_time(dir_like, old);
  cache.Store(Key("x"), "x");
  for (const fs::path& p : others) EXPECT_TRUE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(dir_like));
  EXPECT_TRUE(fs::exists(fs::symlink_status(link_like)));
  EXPECT_TRUE(fs::exists(dir_ / "key"));
}

TEST_F(DiskCacheTest, PastTheBudgetTheLeastRecentlyUsedEntriesGo) {
  const std::string image = Image(1000, 1);
  DiskCache probe(dir_.string(), uint64_t{1} << 30);
  const uint64_t entry_bytes = probe.Store(Key("a"), image).bytes;
  DiskCache cache(dir_.string(), 2 * entry_bytes + entry_bytes / 2);  // room for two
  cache.Store(Key("b"), image);
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(cache.PathOf(Key("a")), now - std::chrono::seconds(30));
  fs::last_write_time(cache.PathOf(Key("b")), now - std::chrono::seconds(20));
  ASSERT_TRUE(cache.Load(Key("a"), nullptr));  // used: now the most recent
  DiskCache::Stored stored = cache.Store(Key("c"), image);
  EXPECT_EQ(stored.evicted, 1);
  EXPECT_TRUE(fs::exists(cache.PathOf(Key("a"))));
  EXPECT_FALSE(fs::exists(cache.PathOf(Key("b"))));
  EXPECT_TRUE(fs::exists(cache.PathOf(Key("c"))));
}

// The cache counts what it stores between scans of the directory: the
// budget holds store after store, and an entry stored again replaces its
// bytes rather than adding to them.
TEST_F(DiskCacheTest, TheBudgetHoldsStoreAfterStore) {
  const std::string image = Image(1000, 1);
  DiskCache probe(dir_.string(), uint64_t{1} << 30);
  const uint64_t entry_bytes = probe.Store(Key("probe"), image).bytes;
  fs::remove(probe.PathOf(Key("probe")));
  DiskCache cache(dir_.string(), 3 * entry_bytes + entry_bytes / 2);  // room for three
  auto entries = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_)) n += e.path().extension() == ".pjc";
    return n;
  };
  for (const char* key : {"a", "b", "c"}) EXPECT_EQ(cache.Store(Key(key), image).evicted, 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(cache.Store(Key("a"), image).evicted, 0) << i;
  EXPECT_EQ(entries(), 3);
  int evicted = 0;
  for (int i = 0; i < 10; ++i) {
    evicted += cache.Store(Key("k" + std::to_string(i)), image).evicted;
    EXPECT_LE(entries(), 3) << i;
  }
  EXPECT_EQ(evicted, 10);
  EXPECT_TRUE(fs::exists(cache.PathOf(Key("k9"))));
}

}  // namespace
}  // namespace pejit
