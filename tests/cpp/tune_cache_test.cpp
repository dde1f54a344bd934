// The tuning cache file: round trip, corruption and foreign files detected and rebuilt, concurrent
// writers merged, hash collisions missed (src/tune/tune_cache.h).
#include "tune/tune_cache.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "onnx_model_builder.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/log.h"

namespace pto::tune {
namespace {

using testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

DeviceKey test_device(const std::string& isa = "avx512") {
  DeviceKey d;
  d.cpu_name = "Test CPU \"quoted\" @ 3.0GHz";
  d.isa = isa;
  d.extensions = {"avx2", "fma", "avx512f"};
  d.l1d = 48 << 10;
  d.l2 = 2 << 20;
  d.l3 = 4 << 20;
  d.line = 64;
  d.pypto_version = "0.1.0";
  return d;
}

TuneCacheOptions on(const DeviceKey& d) {
  return TuneCacheOptions{d, {}};
}

TuneEntry entry(int64_t seed) {
  TuneEntry e;
  e.knobs["gemm.blocks"] = {256 + seed, 96, 4096};
  e.knobs["tile"] = {-1, seed};
  e.planner_ns = 1000000 + seed;
  e.tuned_ns = 900000 + seed;
  e.timestamp = 1764700000 + seed;
  return e;
}

// Signatures carry quotes, backslashes, a newline and a tab: the writer must escape them.
std::string signature(int i) {
  return "rule=gemm_epilogue;ops=MatMul+Gelu{approximate=\"tanh\"};dtypes=f32\\f32;"
         "shapes=[" +
         std::to_string(i) + "x768]x[768x3072]\n\tconst=1";
}

// Silences the warnings the corruption tests provoke on purpose.
class TuneCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = log_level();
    set_log_level(LogLevel::kOff);
  }
  void TearDown() override { set_log_level(saved_); }

  // A file of three entries written by the cache itself.
  std::string three_entry_file() {
    TuneCache c = TuneCache::open(file_, on(test_device()));
    for (int i = 0; i < 3; ++i) c.store(signature(i), 1 + i, entry(i));
    return read_bytes(file_);
  }

  TempDir dir_;
  std::string file_ = dir_.file("tune.json");
  LogLevel saved_ = LogLevel::kWarn;
};

TEST(TuneCacheHash, Fnv1a64KnownValues) {
  // The reference values of the FNV-1a 64-bit hash (Fowler, Noll, Vo test suite).
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST_F(TuneCacheTest, RoundTrip) {
  three_entry_file();
  const TuneCache c = TuneCache::open(file_, on(test_device()));
  EXPECT_EQ(c.rejected(), "");
  ASSERT_EQ(c.entries().size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const std::optional<TuneEntry> e = c.lookup(signature(i), 1 + i);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(*e, entry(i));
    EXPECT_FALSE(c.lookup(signature(i), 2 + i).has_value()) << "another thread count";
  }
  EXPECT_FALSE(c.lookup(signature(7), 1).has_value());

  // Replacing one entry keeps the others; an unset timestamp is filled in.
  TuneCache w = TuneCache::open(file_, on(test_device()));
  TuneEntry planner;  // no knobs: the planner won
  planner.planner_ns = planner.tuned_ns = 5;
  w.store(signature(1), 2, planner);
  const TuneCache r = TuneCache::open(file_, on(test_device()));
  EXPECT_EQ(r.entries().size(), 3u);
  const std::optional<TuneEntry> got = r.lookup(signature(1), 2);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->knobs.empty());
  EXPECT_GT(got->timestamp, 1700000000);
  EXPECT_EQ(*r.lookup(signature(0), 1), entry(0));
}

TEST_F(TuneCacheTest, MissingFileIsEmptyAndStoreCreatesFolders) {
  const std::string nested = dir_.file("a/b/tune.json");
  TuneCache c = TuneCache::open(nested, on(test_device()));
  EXPECT_TRUE(c.entries().empty());
  EXPECT_EQ(c.rejected(), "");
  c.store(signature(0), 1, entry(0));
  EXPECT_EQ(*TuneCache::open(nested, on(test_device())).lookup(signature(0), 1), entry(0));
}

TEST_F(TuneCacheTest, StoreThrowsWhenItCannotWrite) {
  write_bytes(dir_.file("plain"), "a file, not a folder");
  TuneCache c = TuneCache::open(dir_.file("plain/tune.json"), on(test_device()));
  EXPECT_TRUE(c.entries().empty());
  EXPECT_THROW(c.store(signature(0), 1, entry(0)), Error);
}

TEST_F(TuneCacheTest, TruncationAtEveryByteIsDetectedAndRebuilt) {
  const std::string whole = three_entry_file();
  ASSERT_GT(whole.size(), 300u);
  for (size_t n = 0; n < whole.size(); ++n) {
    write_bytes(file_, whole.substr(0, n));
    TuneCache c = TuneCache::open(file_, on(test_device()));
    ASSERT_TRUE(c.entries().empty()) << n;
    ASSERT_NE(c.rejected(), "") << n;
    ASSERT_FALSE(std::filesystem::exists(file_)) << n;
    ASSERT_EQ(read_bytes(file_ + ".bad"), whole.substr(0, n)) << n;
    // Rebuilt on the next store (only every few lengths: each store fsyncs).
    if (n % 64 == 0 || n + 1 == whole.size()) {
      c.store(signature(9), 1, entry(9));
      const TuneCache r = TuneCache::open(file_, on(test_device()));
      ASSERT_EQ(r.rejected(), "") << n;
      ASSERT_EQ(r.entries().size(), 1u) << n;
      EXPECT_EQ(*r.lookup(signature(9), 1), entry(9));
    }
  }
}

TEST_F(TuneCacheTest, FlippedByteIsDetected) {
  const std::string whole = three_entry_file();
  const size_t trailer = whole.rfind("\"checksum\"");
  ASSERT_NE(trailer, std::string::npos);
  for (size_t i = 0; i < whole.size(); ++i) {
    std::string bad = whole;
    bad[i] ^= 0x04;
    write_bytes(file_, bad);
    const TuneCache c = TuneCache::open(file_, on(test_device()));
    ASSERT_TRUE(c.entries().empty()) << i;
    // Before the trailer the checksum catches it; in the trailer, the trailer's own checks.
    if (i < trailer) {
      ASSERT_NE(c.rejected().find("checksum mismatch"), std::string::npos) << i;
    }
    ASSERT_NE(c.rejected(), "") << i;
  }
}

TEST_F(TuneCacheTest, ParseErrorUnderAValidChecksumIsDetected) {
  // Bodies that hash correctly but are not a cache: the checksum is not the only check.
  const char* bodies[] = {"{\"format\": \"pypto-tune-cache\",\n ",
                          "{\"format\": \"other\", \"device\": {}, \"entries\": [],\n ",
                          "[1, 2,\n "};
  for (const char* body : bodies) {
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(fnv1a64(body)));
    write_bytes(file_, std::string(body) + "\"checksum\": \"" + sum + "\"}\n");
    const TuneCache c = TuneCache::open(file_, on(test_device()));
    EXPECT_TRUE(c.entries().empty()) << body;
    EXPECT_NE(c.rejected(), "") << body;
    EXPECT_EQ(c.rejected().find("checksum"), std::string::npos) << c.rejected();
    EXPECT_TRUE(std::filesystem::exists(file_ + ".bad"));
  }
}

TEST_F(TuneCacheTest, AnotherDeviceKeyIsNotUsedAndTheFileIsRebuilt) {
  three_entry_file();
  DeviceKey avx2 = test_device("avx2");
  TuneCache c = TuneCache::open(file_, on(avx2));
  EXPECT_TRUE(c.entries().empty());
  EXPECT_FALSE(c.lookup(signature(0), 1).has_value());
  EXPECT_NE(c.rejected().find("another device"), std::string::npos) << c.rejected();
  EXPECT_TRUE(std::filesystem::exists(file_ + ".bad"));
  c.store(signature(5), 1, entry(5));
  EXPECT_EQ(TuneCache::open(file_, on(avx2)).entries().size(), 1u);

  // Each member of the key matters, the format and PyPTO version included.
  std::vector<DeviceKey> others(7, avx2);
  others[0].cpu_name += " v2";
  others[1].extensions.pop_back();
  others[2].l1d /= 2;
  others[3].l3 *= 2;
  others[4].line = 128;
  others[5].pypto_version = "0.2.0";
  others[6].format = kTuneCacheFormat + 1;
  for (const DeviceKey& other : others) {
    c.store(signature(5), 1, entry(5));  // a fresh file under avx2
    EXPECT_NE(TuneCache::default_path(other), TuneCache::default_path(avx2));
    const TuneCache o = TuneCache::open(file_, on(other));
    EXPECT_TRUE(o.entries().empty()) << other.text();
    EXPECT_NE(o.rejected(), "") << other.text();
  }
}

TEST_F(TuneCacheTest, HashCollisionIsAMiss) {
  TuneCacheOptions collide{test_device(), [](std::string_view) { return uint64_t{42}; }};
  TuneCache c = TuneCache::open(file_, collide);
  c.store(signature(0), 1, entry(0));
  EXPECT_FALSE(c.lookup(signature(1), 1).has_value());
  EXPECT_EQ(*c.lookup(signature(0), 1), entry(0));
  c.store(signature(1), 1, entry(1));  // the same slot: replaces the other signature
  EXPECT_FALSE(c.lookup(signature(0), 1).has_value());
  const TuneCache r = TuneCache::open(file_, collide);
  ASSERT_EQ(r.entries().size(), 1u);
  EXPECT_EQ(r.entries()[0].hash, 42u);
  EXPECT_EQ(*r.lookup(signature(1), 1), entry(1));
  EXPECT_FALSE(r.lookup(signature(0), 1).has_value());
}

TEST_F(TuneCacheTest, ConcurrentWritersLoseNothing) {
  constexpr int kProcs = 4, kStores = 50;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        TuneCache c = TuneCache::open(file_, on(test_device()));
        for (int i = 0; i < kStores; ++i)
          c.store(signature(p * kStores + i), 1, entry(p * kStores + i));
      } catch (...) {
        rc = 1;
      }
      _exit(rc);
    }
    children.push_back(pid);
  }
  // Readers take no lock, yet never see a partial file while the writers run.
  int reads = 0, running = kProcs, failed = 0;
  while (running > 0) {
    const TuneCache r = TuneCache::open(file_, on(test_device()));
    EXPECT_EQ(r.rejected(), "");
    ++reads;
    int status = 0;
    const pid_t done = waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      --running;
      failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
  }
  EXPECT_EQ(failed, 0);
  const TuneCache c = TuneCache::open(file_, on(test_device()));
  EXPECT_EQ(c.rejected(), "");
  ASSERT_EQ(c.entries().size(), size_t{kProcs * kStores}) << "after " << reads << " reads";
  for (int i = 0; i < kProcs * kStores; ++i) EXPECT_EQ(*c.lookup(signature(i), 1), entry(i)) << i;
}

TEST_F(TuneCacheTest, ClearEmptiesTheFile) {
  three_entry_file();
  TuneCache c = TuneCache::open(file_, on(test_device()));
  c.clear();
  EXPECT_TRUE(c.entries().empty());
  const TuneCache r = TuneCache::open(file_, on(test_device()));
  EXPECT_EQ(r.rejected(), "");
  EXPECT_TRUE(r.entries().empty());
}

TEST(TuneCacheDevice, CurrentKeyAndDefaultPath) {
  const DeviceKey k = current_device_key();
  EXPECT_EQ(k.cpu_name, device_info().cpu_name);
  EXPECT_EQ(k.isa, device_info().isa);
  EXPECT_EQ(k.l1d, cache_model().l1d);
  EXPECT_EQ(k.l2, cache_model().l2);
  EXPECT_EQ(k.format, kTuneCacheFormat);
  EXPECT_NE(k.pypto_version, "unknown");
  for (const auto& [name, has] : extension_flags(device_info()))
    EXPECT_EQ(std::find(k.extensions.begin(), k.extensions.end(), name) != k.extensions.end(), has)
        << name;

  // PTO_TUNE_CACHE wins; else XDG_CACHE_HOME, else ~/.cache; the file is named by the key's hash.
  // Checked in a child, whose environment changes do not leak into the other tests.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(k.text())));
    unsetenv("PTO_TUNE_CACHE");
    setenv("XDG_CACHE_HOME", "/x/cache", 1);
    bool ok = TuneCache::default_path(k) == std::string("/x/cache/pypto/tune/") + hash + ".json";
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", "/home/u", 1);
    ok = ok &&
         TuneCache::default_path(k) == std::string("/home/u/.cache/pypto/tune/") + hash + ".json";
    setenv("PTO_TUNE_CACHE", "/elsewhere/t.json", 1);
    ok = ok && TuneCache::default_path(k) == "/elsewhere/t.json";
    // PTO_DISABLE_EXT takes an extension out of the key.
    setenv("PTO_DISABLE_EXT", "f16c", 1);
    const DeviceKey off = current_device_key();
    ok = ok &&
         std::find(off.extensions.begin(), off.extensions.end(), "f16c") == off.extensions.end();
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace pto::tune
