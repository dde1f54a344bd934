// The autotuner's persistent cache: the knobs that won for a kernel, keyed by the kernel's
// signature and thread count, on one machine (docs/tuning.md "The tuning cache").
//
// One JSON file per device key, ending in an FNV-1a 64 checksum of everything before it. Loading
// checks the checksum, the format and the device key; a file failing any check is moved aside to
// `<file>.bad`, reported at PTO_LOG=warn and treated as empty, so the next store rebuilds it.
// Readers take no lock: writers replace the file whole (write `<file>.tmp.<pid>`, fsync, rename)
// under flock(LOCK_EX) on `<file>.lock`, after re-reading and merging what other processes stored.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pto::tune {

// Bumped whenever the file layout, the meaning of a knob or the candidates the tuner tries change:
// older files then never match (2: conv.algo {2} and gemm.grid, whose steps a format-1 file holds
// as "planner" without having tried them).
inline constexpr int kTuneCacheFormat = 2;

// What a tuned knob depends on besides the kernel: a file written under another key is not used.
struct DeviceKey {
  std::string cpu_name;
  std::string isa;                           // the active kernel ISA (PTO_ISA honoured)
  std::vector<std::string> extensions;       // enabled ISA extensions, by /proc/cpuinfo name
  size_t l1d = 0, l2 = 0, l3 = 0, line = 0;  // the cache model kernels size blocks from
  std::string pypto_version;
  int format = kTuneCacheFormat;

  bool operator==(const DeviceKey&) const = default;
  // A one-line canonical form, for messages and the default file name's hash.
  std::string text() const;
};

// This process's key: device_info() (so PTO_ISA), extension_flags() less PTO_DISABLE_EXT, and
// cache_model() (so PTO_CACHE_SIZES).
DeviceKey current_device_key();

// FNV-1a 64 of `bytes`: the file checksum and the default signature hash.
uint64_t fnv1a64(std::string_view bytes);

// The tuning result of one kernel.
struct TuneEntry {
  std::map<std::string, std::vector<int64_t>> knobs;  // empty: the planner's choice won
  int64_t planner_ns = 0;                             // the planner's knobs, median time
  int64_t tuned_ns = 0;                               // the winner's median time
  int64_t timestamp = 0;  // seconds since the epoch; store() sets it when 0

  bool operator==(const TuneEntry&) const = default;
};

struct TuneCacheOptions {
  std::optional<DeviceKey> device;                 // default: current_device_key()
  std::function<uint64_t(std::string_view)> hash;  // default: fnv1a64 (tests force collisions)
};

class TuneCache {
 public:
  // One stored entry with its key.
  struct Record {
    uint64_t hash = 0;
    int threads = 0;
    std::string signature;
    TuneEntry entry;
  };

  // Reads `path` (empty: default_path()); a missing file is an empty cache, a corrupt, stale or
  // foreign one is moved aside as described above. Never throws for the file's contents.
  static TuneCache open(const std::string& path = "", TuneCacheOptions options = {});

  // $PTO_TUNE_CACHE when set (and not "off"), else $XDG_CACHE_HOME (or
  // ~/.cache)/pypto/tune/<device-hash>.json.
  static std::string default_path(const DeviceKey& device = current_device_key());

  // The entry stored for exactly this signature and thread count; nullopt on a miss, including a
  // hash collision with another signature.
  std::optional<TuneEntry> lookup(const std::string& signature, int threads) const;

  // Adds or replaces the entry (one per hash and thread count) and writes the file, merged with
  // what other processes stored since it was read. Throws pto::Error when it cannot be written.
  void store(const std::string& signature, int threads, const TuneEntry& entry);

  // Every entry, ordered by hash then threads.
  std::vector<Record> entries() const;

  // Removes every entry, in memory and on disk.
  void clear();

  const std::string& path() const { return path_; }
  const DeviceKey& device() const { return device_; }
  // Why the file was moved aside on open (empty when it was not): for tests and `pto tune`.
  const std::string& rejected() const { return rejected_; }

 private:
  using Key = std::pair<uint64_t, int>;  // signature hash, threads
  using Records = std::map<Key, Record>;
  TuneCache(std::string path, DeviceKey device, std::function<uint64_t(std::string_view)> hash)
      : path_(std::move(path)), device_(std::move(device)), hash_(std::move(hash)) {}

  // Under the lock: the file's entries, the file moved aside when it fails a check.
  Records read_locked();
  void write_locked(const Records& records) const;

  std::string path_;
  DeviceKey device_;
  std::function<uint64_t(std::string_view)> hash_;
  Records records_;
  std::string rejected_;
};

}  // namespace pto::tune
