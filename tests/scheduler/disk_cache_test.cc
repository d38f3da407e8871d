// The persistent code cache's files (scheduler/disk_cache.h): what is stored
// loads back byte for byte under the same key only; damaged, stale or
// foreign entries are refused with the reason and removed; several processes
// write one directory at once; a writer killed mid-write leaves no torn
// entry; past the byte budget the least recently used entries go.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "scheduler/disk_cache.h"
#include "support/hash.h"

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
  const uint64_t checksum = Fnv1a(file.data() + 16, file.size() - 16);
  std::memcpy(file.data() + 8, &checksum, 8);
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
// once stale, is removed by the next store.
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
  // The dead writer's temporary file, made old, goes with the next store.
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.path().filename().string().find(".tmp.") == std::string::npos) continue;
    fs::last_write_time(e.path(), fs::file_time_type::clock::now() - std::chrono::hours(1));
  }
  cache.Store(Key("other"), "x");
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

}  // namespace
}  // namespace pejit
