// Machine detection: CPUID for the ISA (checked against the OS-enabled XSAVE state), sysfs for
// caches and core topology (sysconf as the fallback), sched_getaffinity for the usable cores.
#include "pto/device_info.h"

#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "pto/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define PTO_X86 1
#endif

namespace pto {
namespace {

std::optional<std::string> read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  while (!line.empty() && (line.back() == ' ' || line.back() == '\n' || line.back() == '\r'))
    line.pop_back();
  return line;
}

std::optional<long long> read_number(const std::string& path) {
  auto s = read_line(path);
  if (!s || s->empty()) return std::nullopt;
  char* end = nullptr;
  long long v = std::strtoll(s->c_str(), &end, 10);
  if (end == s->c_str()) return std::nullopt;
  return v;
}

// "48K", "2048K", "32M", "1G" or a plain byte count.
size_t parse_size(const std::string& s) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  switch (*end) {
    case 'K':
    case 'k':
      return v << 10;
    case 'M':
    case 'm':
      return v << 20;
    case 'G':
    case 'g':
      return v << 30;
    default:
      return v;
  }
}

// CPUs this process may run on, in increasing order.
std::vector<int> allowed_cpus() {
  long configured = sysconf(_SC_NPROCESSORS_CONF);
  int n = static_cast<int>(std::max<long>(configured, 1024));
  cpu_set_t* set = CPU_ALLOC(n);
  std::vector<int> out;
  if (set) {
    size_t size = CPU_ALLOC_SIZE(n);
    CPU_ZERO_S(size, set);
    if (sched_getaffinity(0, size, set) == 0)
      for (int i = 0; i < n; ++i)
        if (CPU_ISSET_S(i, size, set)) out.push_back(i);
    CPU_FREE(set);
  }
  if (out.empty()) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    for (long i = 0; i < std::max<long>(online, 1); ++i) out.push_back(static_cast<int>(i));
  }
  return out;
}

int count_physical_cores(const std::vector<int>& cpus) {
  std::set<std::pair<long long, long long>> cores;
  for (int c : cpus) {
    std::string dir = cat("/sys/devices/system/cpu/cpu", c, "/topology/");
    auto pkg = read_number(dir + "physical_package_id");
    auto core = read_number(dir + "core_id");
    if (!pkg || !core) return static_cast<int>(cpus.size());  // no topology: assume no SMT
    cores.emplace(*pkg, *core);
  }
  return static_cast<int>(cores.size());
}

// "0-3,8-11" -> 8; 0 when malformed.
int count_cpu_list(const std::string& list) {
  int n = 0;
  for (size_t start = 0; start < list.size();) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    const std::string item = list.substr(start, end - start);
    try {
      const size_t dash = item.find('-');
      const int lo = std::stoi(item.substr(0, dash));
      const int hi = dash == std::string::npos ? lo : std::stoi(item.substr(dash + 1));
      if (hi < lo) return 0;
      n += hi - lo + 1;
    } catch (const std::exception&) {
      return 0;
    }
    start = end + 1;
  }
  return n;
}

void read_caches(int cpu, DeviceInfo& d) {
  for (int i = 0; i < 16; ++i) {
    std::string dir = cat("/sys/devices/system/cpu/cpu", cpu, "/cache/index", i, "/");
    auto level = read_number(dir + "level");
    auto type = read_line(dir + "type");
    auto size = read_line(dir + "size");
    if (!level || !type) break;
    if (!size || *type == "Instruction") continue;
    size_t bytes = parse_size(*size);
    const auto list = read_line(dir + "shared_cpu_list");
    const int shared_by = list ? count_cpu_list(*list) : 0;
    if (*level == 1) {
      d.l1d_bytes = bytes;
      d.l1d_shared_by = shared_by;
      if (auto line = read_number(dir + "coherency_line_size"); line && *line > 0)
        d.cacheline = static_cast<size_t>(*line);
    } else if (*level == 2) {
      d.l2_bytes = bytes;
      d.l2_shared_by = shared_by;
    } else if (*level == 3) {
      d.l3_bytes = bytes;
      d.l3_shared_by = shared_by;
    }
  }
  auto from_sysconf = [](size_t& field, int name) {
    if (field) return;
    long v = sysconf(name);
    if (v > 0) field = static_cast<size_t>(v);
  };
  from_sysconf(d.l1d_bytes, _SC_LEVEL1_DCACHE_SIZE);
  from_sysconf(d.l2_bytes, _SC_LEVEL2_CACHE_SIZE);
  from_sysconf(d.l3_bytes, _SC_LEVEL3_CACHE_SIZE);
  if (!read_number(cat("/sys/devices/system/cpu/cpu", cpu, "/cache/index0/coherency_line_size"))) {
    long line = sysconf(_SC_LEVEL1_DCACHE_LINESIZE);
    if (line > 0) d.cacheline = static_cast<size_t>(line);
  }
}

size_t memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page = sysconf(_SC_PAGESIZE);
  size_t mem = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  // A container's memory limit is what we may actually use (cgroup v2, then v1).
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    auto limit = read_number(path);  // "max" reads as no number
    if (limit && *limit > 0 && (mem == 0 || static_cast<size_t>(*limit) < mem))
      mem = static_cast<size_t>(*limit);
  }
  return mem;
}

std::string cpu_name_from_proc() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown";
}

#ifdef PTO_X86
uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

void read_cpuid(DeviceInfo& d) {
  unsigned a = 0, b = 0, c = 0, e = 0;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return;
  __cpuid_count(1, 0, a, b, c, e);
  bool osxsave = c & (1u << 27);
  bool has_fma = c & (1u << 12);
  bool has_avx = c & (1u << 28);
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;                 // XMM and YMM state
  bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  d.fma = has_fma && has_avx && os_avx;
  d.f16c = os_avx && (c & (1u << 29));
  const bool os_amx = (xcr0 & (3u << 17)) == (3u << 17);  // XTILECFG and XTILEDATA
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, e);
    unsigned sub_leaves = a;
    d.avx2 = os_avx && (b & (1u << 5));
    d.avx512f = os_avx512 && (b & (1u << 16));
    d.avx512bw = d.avx512f && (b & (1u << 30));
    d.avx512vl = d.avx512f && (b & (1u << 31));
    d.avx512_vnni = d.avx512f && (c & (1u << 11));
    d.avx512_fp16 = d.avx512f && (e & (1u << 23));
    d.amx_bf16 = os_amx && (e & (1u << 22)) && (e & (1u << 24));  // AMX-BF16 and AMX-TILE
    d.amx_int8 = os_amx && (e & (1u << 25)) && (e & (1u << 24));
#if defined(__linux__) && defined(SYS_arch_prctl)
    // Linux hands a process the tiles' 8 KiB of register state only on request (ARCH_REQ_XCOMP_PERM
    // for XTILEDATA, process-wide); until then the first tile instruction faults. Refused (a
    // sigaltstack too small for the larger signal frame): no AMX.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    if ((d.amx_bf16 || d.amx_int8) && syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0)
      d.amx_bf16 = d.amx_int8 = false;
#endif
    if (sub_leaves >= 1) {
      __cpuid_count(7, 1, a, b, c, e);
      d.avx512_bf16 = d.avx512f && (a & (1u << 5));
      d.avx_vnni = d.avx2 && (a & (1u << 4));
    }
  }
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
    unsigned regs[12];
    for (unsigned i = 0; i < 3; ++i)
      __cpuid(0x80000002 + i, regs[4 * i], regs[4 * i + 1], regs[4 * i + 2], regs[4 * i + 3]);
    std::string name(reinterpret_cast<const char*>(regs), sizeof(regs));
    name = name.substr(0, name.find('\0'));
    auto first = name.find_first_not_of(' ');
    auto last = name.find_last_not_of(' ');
    if (first != std::string::npos) d.cpu_name = name.substr(first, last - first + 1);
  }
}
#else
void read_cpuid(DeviceInfo&) {}  // not x86: no SIMD ISA we have kernels for
#endif

}  // namespace

bool supports_isa(const DeviceInfo& d, const std::string& isa) {
  if (isa == "generic") return true;
  if (isa == "avx2") return d.avx2 && d.fma;
  if (isa == "avx512") return d.avx2 && d.fma && d.avx512f && d.avx512bw && d.avx512vl;
  return false;
}

namespace {
std::mutex g_ext_mutex;
std::set<std::string> g_ext_scoped_off;  // set_ext_turned_off's
}  // namespace

const std::vector<std::string>& exts_disabled_by_env() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    const char* v = std::getenv("PTO_DISABLE_EXT");
    const std::string list = v ? v : "";
    for (size_t start = 0; start < list.size();) {
      const size_t end = std::min(list.find(',', start), list.size());
      if (end > start) out.push_back(list.substr(start, end - start));
      start = end + 1;
    }
    return out;
  }();
  return names;
}

bool ext_turned_off(const std::string& name) {
  const std::vector<std::string>& env = exts_disabled_by_env();
  if (std::find(env.begin(), env.end(), name) != env.end()) return true;
  std::lock_guard<std::mutex> lock(g_ext_mutex);
  return g_ext_scoped_off.count(name) > 0;
}

void set_ext_turned_off(const std::string& name, bool off) {
  std::lock_guard<std::mutex> lock(g_ext_mutex);
  if (off)
    g_ext_scoped_off.insert(name);
  else
    g_ext_scoped_off.erase(name);
}

std::vector<std::pair<std::string, bool>> extension_flags(const DeviceInfo& d) {
  return {{"avx2", d.avx2},
          {"fma", d.fma},
          {"f16c", d.f16c},
          {"avx512f", d.avx512f},
          {"avx512bw", d.avx512bw},
          {"avx512vl", d.avx512vl},
          {"avx512_vnni", d.avx512_vnni},
          {"avx512_bf16", d.avx512_bf16},
          {"avx512_fp16", d.avx512_fp16},
          {"avx_vnni", d.avx_vnni},
          {"amx_bf16", d.amx_bf16},
          {"amx_int8", d.amx_int8}};
}

DeviceInfo detect_device() {
  DeviceInfo d;
  std::vector<int> cpus = allowed_cpus();
  d.logical_cores = static_cast<int>(cpus.size());
  d.physical_cores = count_physical_cores(cpus);
  read_cpuid(d);
  if (d.cpu_name.empty()) d.cpu_name = cpu_name_from_proc();
  read_caches(cpus.front(), d);
  d.memory_bytes = memory_bytes();
  d.isa = choose_isa(d, nullptr);
  return d;
}

std::string choose_isa(const DeviceInfo& d, const char* override_value) {
  if (override_value && *override_value) {
    std::string want = override_value;
    if (want != "avx512" && want != "avx2" && want != "generic")
      throw ValueError(cat("PTO_ISA='", want, "' is not an ISA: expected avx512, avx2 or generic"));
    if (!supports_isa(d, want))
      throw UnsupportedError(cat("PTO_ISA='", want, "' is not supported by this CPU (", d.cpu_name,
                                 "); the best it supports is '", choose_isa(d, nullptr), "'"));
    return want;
  }
  for (const char* isa : {"avx512", "avx2"})
    if (supports_isa(d, isa)) return isa;
  return "generic";
}

namespace {

// "48K", "2M", "1048576": bytes; 0 when malformed.
size_t parse_bytes(const std::string& s) {
  size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &pos);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = s.substr(pos);
  if (unit == "K" || unit == "k") return v << 10;
  if (unit == "M" || unit == "m") return v << 20;
  return unit.empty() ? v : 0;
}

}  // namespace

CacheModel make_cache_model(const DeviceInfo& d, const char* override_value) {
  CacheModel m;
  m.l1d = d.l1d_bytes;
  m.l2 = d.l2_bytes;
  m.line = d.cacheline >= 32 && d.cacheline <= 256 ? d.cacheline : 64;
  // Cores sharing the L3: its CPU list over the SMT ratio (2 logical per core -> half as many).
  const int smt = std::max(1, d.logical_cores / std::max(1, d.physical_cores));
  m.l3_cores =
      d.l3_shared_by > 0 ? std::max(1, d.l3_shared_by / smt) : std::max(1, d.physical_cores);
  m.l3 = d.l3_bytes / static_cast<size_t>(m.l3_cores);
  auto check = [&](size_t& v, const char* name, size_t lo, size_t hi, size_t fallback) {
    if (v >= lo && v <= hi) return;
    m.adjusted.push_back(cat(name, " ", v, " B is outside [", lo, ", ", hi, "]: using ", fallback));
    v = fallback;
  };
  check(m.l1d, "L1d", 8 << 10, 1 << 20, 32 << 10);
  check(m.l2, "L2", 128 << 10, 64 << 20, 1 << 20);
  if (m.l3 == 0) m.l3 = m.l2;
  check(m.l3, "L3 per core", 0, 16 << 20, 16 << 20);
  if (override_value && *override_value) {
    std::string spec = override_value;
    for (size_t start = 0; start <= spec.size();) {
      size_t end = spec.find(',', start);
      if (end == std::string::npos) end = spec.size();
      const std::string item = spec.substr(start, end - start);
      const size_t eq = item.find('=');
      const std::string key = item.substr(0, eq);
      const size_t bytes = eq == std::string::npos ? 0 : parse_bytes(item.substr(eq + 1));
      size_t* field = key == "l1d" ? &m.l1d : key == "l2" ? &m.l2 : key == "l3" ? &m.l3 : nullptr;
      if (!field || bytes == 0)
        throw ValueError(cat("PTO_CACHE_SIZES='", spec, "': '", item,
                             "' is not l1d=, l2= or l3= with a size (bytes, or K or M)"));
      *field = bytes;
      m.from_env = true;
      start = end + 1;
    }
  }
  return m;
}

const CacheModel& cache_model() {
  static const CacheModel m = make_cache_model(device_info(), std::getenv("PTO_CACHE_SIZES"));
  return m;
}

const DeviceInfo& device_info() {
  static std::mutex mu;
  static std::optional<DeviceInfo> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (!cached) {
    DeviceInfo d = detect_device();
    const char* env = std::getenv("PTO_ISA");
    d.isa = choose_isa(d, env);
    d.isa_from_env = env && *env;
    cached = std::move(d);
  }
  return *cached;
}

}  // namespace pto
