// The tuning cache file: format, checks and atomic replacement (tune_cache.h, docs/tuning.md).
#include "tune/tune_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/json.h"
#include "pto/log.h"

#ifndef PTO_VERSION
#define PTO_VERSION "unknown"
#endif

namespace pto::tune {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMagic = "pypto-tune-cache";
// The last member of the top-level object; the checksum covers every byte before it.
constexpr std::string_view kTrailerHead = "\"checksum\": \"";
constexpr std::string_view kTrailerTail = "\"}\n";
constexpr size_t kTrailerBytes = kTrailerHead.size() + 16 + kTrailerTail.size();

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::optional<uint64_t> parse_hex16(std::string_view s) {
  uint64_t v = 0;
  if (s.size() != 16) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

template <class T, class F>
std::string json_array(const std::vector<T>& items, F&& item) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += cat(i ? ", " : "", item(items[i]));
  return out + "]";
}

// A strict reader of the subset of JSON the writer produces: objects, arrays, strings (escapes
// only for '"', '\\' and control characters) and integers. Throws ValueError with the offset.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  template <class F>
  void object(F&& member) {
    expect('{');
    if (consume('}')) return;
    do {
      const std::string name = str();
      expect(':');
      member(name);
    } while (consume(','));
    expect('}');
  }

  template <class F>
  void array(F&& item) {
    expect('[');
    if (consume(']')) return;
    do item();
    while (consume(','));
    expect(']');
  }

  std::string str() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      const unsigned char c = s_[i_++];
      if (c < 0x20) fail("a control character in a string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) break;
      const char e = s_[i_++];
      if (e == '"' || e == '\\' || e == '/') {
        out += e;
      } else if (e == 'u' && i_ + 4 <= s_.size()) {
        unsigned code = 0;
        auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + i_ + 4, code, 16);
        if (ec != std::errc() || end != s_.data() + i_ + 4 || code >= 0x80)
          fail("a bad \\u escape");
        out += static_cast<char>(code);
        i_ += 4;
      } else {
        fail("a bad escape");
      }
    }
    expect('"');
    return out;
  }

  int64_t integer() {
    ws();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s_.data() + i_, s_.data() + s_.size(), v);
    if (ec != std::errc()) fail("expected an integer");
    i_ = end - s_.data();
    return v;
  }

  void end() {
    ws();
    if (i_ != s_.size()) fail("bytes after the end");
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw ValueError(cat(what, " at byte ", i_));
  }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool consume(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(cat("expected '", c, "'"));
  }

  std::string_view s_;
  size_t i_ = 0;
};

std::string device_json(const DeviceKey& d) {
  return cat("{\"cpu\": ", json_string(d.cpu_name), ", \"isa\": ", json_string(d.isa),
             ", \"extensions\": ", json_array(d.extensions, json_string), ", \"l1d\": ", d.l1d,
             ", \"l2\": ", d.l2, ", \"l3\": ", d.l3, ", \"line\": ", d.line,
             ", \"pypto\": ", json_string(d.pypto_version), ", \"format\": ", d.format, "}");
}

DeviceKey read_device(Reader& r) {
  DeviceKey d;
  d.format = 0;  // a key without the member never matches
  auto size = [&r] {
    const int64_t v = r.integer();
    if (v < 0) r.fail("a negative cache size");
    return static_cast<size_t>(v);
  };
  r.object([&](const std::string& name) {
    if (name == "cpu")
      d.cpu_name = r.str();
    else if (name == "isa")
      d.isa = r.str();
    else if (name == "extensions")
      r.array([&] { d.extensions.push_back(r.str()); });
    else if (name == "l1d")
      d.l1d = size();
    else if (name == "l2")
      d.l2 = size();
    else if (name == "l3")
      d.l3 = size();
    else if (name == "line")
      d.line = size();
    else if (name == "pypto")
      d.pypto_version = r.str();
    else if (name == "format")
      d.format = static_cast<int>(r.integer());
    else
      r.fail(cat("an unknown device member '", name, "'"));
  });
  return d;
}

std::string record_json(const TuneCache::Record& rec) {
  std::string knobs = "{";
  for (const auto& [name, values] : rec.entry.knobs)
    knobs += cat(knobs.size() > 1 ? ", " : "", json_string(name), ": ",
                 json_array(values, [](int64_t v) { return std::to_string(v); }));
  knobs += "}";
  return cat("{\"hash\": \"", hex16(rec.hash), "\", \"threads\": ", rec.threads,
             ", \"signature\": ", json_string(rec.signature), ", \"knobs\": ", knobs,
             ", \"planner_ns\": ", rec.entry.planner_ns, ", \"tuned_ns\": ", rec.entry.tuned_ns,
             ", \"timestamp\": ", rec.entry.timestamp, "}");
}

TuneCache::Record read_record(Reader& r) {
  TuneCache::Record rec;
  std::set<std::string> seen;
  r.object([&](const std::string& name) {
    seen.insert(name);
    if (name == "hash") {
      const auto h = parse_hex16(r.str());
      if (!h) r.fail("a hash that is not 16 hex digits");
      rec.hash = *h;
    } else if (name == "threads") {
      const int64_t t = r.integer();
      if (t < 1 || t > (1 << 20)) r.fail(cat("a thread count of ", t));
      rec.threads = static_cast<int>(t);
    } else if (name == "signature") {
      rec.signature = r.str();
    } else if (name == "knobs") {
      r.object([&](const std::string& knob) {
        auto& values = rec.entry.knobs[knob];
        r.array([&] { values.push_back(r.integer()); });
      });
    } else if (name == "planner_ns") {
      rec.entry.planner_ns = r.integer();
    } else if (name == "tuned_ns") {
      rec.entry.tuned_ns = r.integer();
    } else if (name == "timestamp") {
      rec.entry.timestamp = r.integer();
    } else {
      r.fail(cat("an unknown entry member '", name, "'"));
    }
  });
  if (!seen.contains("hash") || !seen.contains("threads") || !seen.contains("signature"))
    r.fail("an entry without hash, threads or signature");
  return rec;
}

using Records = std::map<std::pair<uint64_t, int>, TuneCache::Record>;

std::string file_text(const DeviceKey& device, const Records& records) {
  std::string body = cat("{\"format\": ", json_string(kMagic),
                         ",\n \"device\": ", device_json(device), ",\n \"entries\": [");
  bool first = true;
  for (const auto& [key, rec] : records) {
    body += cat(first ? "\n  " : ",\n  ", record_json(rec));
    first = false;
  }
  body += "],\n ";
  return cat(body, kTrailerHead, hex16(fnv1a64(body)), kTrailerTail);
}

// The entries of `text`, or a ValueError saying why the file cannot be trusted.
Records parse_file(std::string_view text, const DeviceKey& expected) {
  if (text.size() < kTrailerBytes || !text.ends_with(kTrailerTail) ||
      text.substr(text.size() - kTrailerBytes, kTrailerHead.size()) != kTrailerHead)
    throw ValueError("no checksum trailer (truncated, or not a tuning cache)");
  const std::string_view body = text.substr(0, text.size() - kTrailerBytes);
  const auto sum = parse_hex16(text.substr(body.size() + kTrailerHead.size(), 16));
  if (!sum) throw ValueError("a malformed checksum");
  if (*sum != fnv1a64(body))
    throw ValueError(cat("checksum mismatch (the file says ", hex16(*sum),
                         ", its contents hash to ", hex16(fnv1a64(body)), ")"));
  Reader r(text);
  std::optional<DeviceKey> device;
  Records records;
  bool magic = false, has_entries = false;
  r.object([&](const std::string& name) {
    if (name == "format") {
      magic = r.str() == kMagic;
    } else if (name == "device") {
      device = read_device(r);
    } else if (name == "entries") {
      has_entries = true;
      r.array([&] {
        TuneCache::Record rec = read_record(r);
        const std::pair key{rec.hash, rec.threads};
        if (!records.emplace(key, std::move(rec)).second) r.fail("a duplicate entry");
      });
    } else if (name == "checksum") {
      r.str();  // checked above
    } else {
      r.fail(cat("an unknown member '", name, "'"));
    }
  });
  r.end();
  if (!magic || !device || !has_entries) throw ValueError("not a tuning cache");
  if (*device != expected)
    throw ValueError(cat("written for another device or PyPTO (", device->text(), "; this is ",
                         expected.text(), ")"));
  return records;
}

// nullopt when the file does not exist; throws Error when it exists but cannot be read.
std::optional<std::string> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    if (!fs::exists(path, ec) && !ec) return std::nullopt;
    throw Error(cat("[tune cache] cannot read ", path));
  }
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) throw Error(cat("[tune cache] cannot read ", path));
  return os.str();
}

// flock(LOCK_EX) on `<path>.lock` while alive.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    const std::string lock = path + ".lock";
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(cat("[tune cache] cannot open ", lock, ": ", std::strerror(errno)));
    int rc;
    while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (rc != 0) {
      const int err = errno;
      ::close(fd_);
      throw Error(cat("[tune cache] cannot lock ", lock, ": ", std::strerror(err)));
    }
  }
  ~FileLock() { ::close(fd_); }  // closing releases the lock
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes `text` to `<path>.tmp.<pid>`, fsyncs it and renames it over `path`.
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = cat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(cat("[tune cache] cannot write ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const bool written = done == text.size() && ::fsync(fd) == 0;
  int err = errno;  // why writing failed, when it did
  ::close(fd);
  if (written) {
    if (std::rename(tmp.c_str(), path.c_str()) == 0) return;
    err = errno;
  }
  std::remove(tmp.c_str());
  throw Error(cat("[tune cache] cannot write ", path, ": ", std::strerror(err)));
}

std::string home_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') return xdg;
  if (const char* home = std::getenv("HOME"); home && *home) return cat(home, "/.cache");
  return fs::temp_directory_path().string();  // no home: still a per-machine place
}

}  // namespace

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string DeviceKey::text() const {
  std::string ext;
  for (const std::string& e : extensions) ext += cat(ext.empty() ? "" : ",", e);
  return cat("cpu=", cpu_name, ";isa=", isa, ";ext=", ext, ";l1d=", l1d, ";l2=", l2, ";l3=", l3,
             ";line=", line, ";pypto=", pypto_version, ";format=", format);
}

DeviceKey current_device_key() {
  const DeviceInfo& d = device_info();
  const CacheModel& c = cache_model();
  DeviceKey k;
  k.cpu_name = d.cpu_name;
  k.isa = d.isa;
  // PTO_DISABLE_EXT turns extensions off for the kernels (backend/cpu/isa/isa.h), so for the key.
  const char* off = std::getenv("PTO_DISABLE_EXT");
  const std::string disabled = cat(",", off ? off : "", ",");
  for (const auto& [name, on] : extension_flags(d))
    if (on && disabled.find(cat(",", name, ",")) == std::string::npos) k.extensions.push_back(name);
  k.l1d = c.l1d;
  k.l2 = c.l2;
  k.l3 = c.l3;
  k.line = c.line;
  k.pypto_version = PTO_VERSION;
  return k;
}

std::string TuneCache::default_path(const DeviceKey& device) {
  // "off" turns the cache off for compile() (CompileOptions::use_tune_cache), not a file name.
  if (const char* env = std::getenv("PTO_TUNE_CACHE"); env && *env && std::string(env) != "off")
    return env;
  return cat(home_cache_dir(), "/pypto/tune/", hex16(fnv1a64(device.text())), ".json");
}

TuneCache TuneCache::open(const std::string& path, TuneCacheOptions options) {
  DeviceKey device = options.device ? std::move(*options.device) : current_device_key();
  std::string file = path.empty() ? default_path(device) : path;
  if (!options.hash) options.hash = fnv1a64;
  TuneCache cache(std::move(file), std::move(device), std::move(options.hash));
  try {
    const std::optional<std::string> text = read_whole(cache.path_);
    if (!text) return cache;
    try {
      cache.records_ = parse_file(*text, cache.device_);
      return cache;
    } catch (const ValueError&) {
      // Another process may have replaced the file since: decide under the lock.
      FileLock lock(cache.path_);
      cache.records_ = cache.read_locked();
    }
  } catch (const Error& e) {
    log(LogLevel::kWarn, cat(e.what(), "; tuning cache not used"));
    cache.records_.clear();
  }
  return cache;
}

TuneCache::Records TuneCache::read_locked() {
  const std::optional<std::string> text = read_whole(path_);
  if (!text) return {};
  try {
    return parse_file(*text, device_);
  } catch (const ValueError& e) {
    rejected_ = e.what();
  }
  const std::string bad = path_ + ".bad";
  const bool moved = std::rename(path_.c_str(), bad.c_str()) == 0;
  log(LogLevel::kWarn,
      cat("[tune cache] ", path_, ": ", rejected_, "; ",
          moved ? cat("moved to ", bad) : "could not move it aside", ", starting an empty cache"));
  return {};
}

void TuneCache::write_locked(const Records& records) const {
  replace_file(path_, file_text(device_, records));
}

std::optional<TuneEntry> TuneCache::lookup(const std::string& signature, int threads) const {
  auto it = records_.find({hash_(signature), threads});
  if (it == records_.end() || it->second.signature != signature) return std::nullopt;
  return it->second.entry;
}

void TuneCache::store(const std::string& signature, int threads, const TuneEntry& entry) {
  PTO_CHECK(threads >= 1) << "threads=" << threads;
  const fs::path dir = fs::path(path_).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  if (ec) throw Error(cat("[tune cache] cannot create ", dir.string(), ": ", ec.message()));
  FileLock lock(path_);
  Records records = read_locked();  // what other processes stored since open()
  const Key key{hash_(signature), threads};
  Record& rec = records[key] = Record{key.first, threads, signature, entry};
  if (rec.entry.timestamp == 0) rec.entry.timestamp = static_cast<int64_t>(std::time(nullptr));
  write_locked(records);
  records_ = std::move(records);
}

std::vector<TuneCache::Record> TuneCache::entries() const {
  std::vector<Record> out;
  for (const auto& [key, rec] : records_) out.push_back(rec);
  return out;
}

void TuneCache::clear() {
  records_.clear();
  std::error_code ec;
  if (!fs::exists(path_, ec)) return;
  FileLock lock(path_);
  write_locked({});
}

}  // namespace pto::tune
