// The machine as the tiling planner sees it: usable cores, ISA extensions, cache sizes, memory.
// Read once from CPUID, /sys and sched_getaffinity; nothing here is a built-in constant.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace pto {

struct DeviceInfo {
  int logical_cores = 1;   // hardware threads this process may run on (sched_getaffinity)
  int physical_cores = 1;  // distinct cores among them (SMT siblings counted once)
  std::string cpu_name;    // CPUID brand string, or /proc/cpuinfo's "model name"
  // ISA extensions the CPU has and the OS has enabled (XSAVE state checked with XGETBV).
  bool avx2 = false, fma = false, avx512f = false, avx512bw = false, avx512vl = false,
       avx512_bf16 = false, avx512_vnni = false, avx512_fp16 = false;
  bool f16c = false;      // fp16 <-> fp32 conversions (VCVTPH2PS / VCVTPS2PH)
  bool avx_vnni = false;  // VEX-encoded VPDPBUSD on 256-bit registers (Alder Lake, Zen 5)
  bool amx_bf16 = false, amx_int8 = false;  // AMX tiles (and their XSAVE state enabled)
  size_t l1d_bytes = 0;                     // per core
  size_t l2_bytes = 0;                      // per core (or per cluster where shared)
  size_t l3_bytes = 0;  // the whole shared last-level cache slice this core sees; 0 if none
  // Logical CPUs sharing each level (sysfs shared_cpu_list, all of them, not only this process's);
  // 0 when the system does not say.
  int l1d_shared_by = 0, l2_shared_by = 0, l3_shared_by = 0;
  size_t cacheline = 64;    // bytes
  size_t memory_bytes = 0;  // physical memory, or the cgroup limit when lower
  // The kernel ISA chosen: "avx512" | "avx2" | "generic". The best the machine supports, unless
  // the environment variable PTO_ISA names another (which must be supported here).
  std::string isa;
  bool isa_from_env = false;  // true when PTO_ISA chose it
};

// Detected on first call; throws ValueError/UnsupportedError if PTO_ISA is invalid or names an
// ISA this machine lacks (and again on the next call: nothing is cached until it succeeds).
const DeviceInfo& device_info();

// Detection without the PTO_ISA override and without caching; `isa` is the best supported.
DeviceInfo detect_device();

// The ISA to use on `d`: `override_value` (from PTO_ISA; null or empty for none) when valid and
// supported, else the best the machine supports. Throws as device_info() describes.
std::string choose_isa(const DeviceInfo& d, const char* override_value);

// Whether `d` can run kernels built for `isa` ("avx512", "avx2", "generic").
bool supports_isa(const DeviceInfo& d, const std::string& isa);

// Every ISA extension flag of `d` by its Linux /proc/cpuinfo name ("avx512_bf16"), in one
// order, for pto info, pypto.device_info() and a saved model's requirements.
std::vector<std::pair<std::string, bool>> extension_flags(const DeviceInfo& d);

// Whether extension `name` (one of those names) is turned off for this process: named in the
// environment variable PTO_DISABLE_EXT (a comma-separated list, read once) or by a live
// cpu::ExtScope (which calls set_ext_turned_off). The kernels check cpu::has_ext, which says the
// same; a compile-time choice that depends on an extension (AssignLayouts keeps bf16 convs on the
// AMX GEMM) reads it here.
bool ext_turned_off(const std::string& name);
void set_ext_turned_off(const std::string& name, bool off);
// The names PTO_DISABLE_EXT lists (read once, empty entries dropped), unchecked: cpu::has_ext
// rejects a name it does not know.
const std::vector<std::string>& exts_disabled_by_env();

// The caches as kernels size their blocks from them: the detected sizes, sanity-checked (a VM may
// report none, or a 300 MB L3), or the environment variable PTO_CACHE_SIZES ("l1d=48K,l2=2M,l3=4M",
// any subset) for experiments. `l3` is one core's share of the last level.
struct CacheModel {
  size_t l1d = 0, l2 = 0, l3 = 0;
  size_t line = 64;                   // bytes (32-256, else 64)
  int l3_cores = 1;                   // physical cores the detected L3 was divided among
  bool from_env = false;              // PTO_CACHE_SIZES set some of them
  std::vector<std::string> adjusted;  // what the sanity checks replaced, and why
};

// From `d` and `override_value` (PTO_CACHE_SIZES; null or empty for none). The L3 share is the L3
// divided among the physical cores sharing it (from l3_shared_by and the SMT ratio, else the
// process's physical cores). Out of range means: L1d outside 8 KiB-1 MiB (then 32 KiB), L2 outside
// 128 KiB-64 MiB (then 1 MiB), an L3 share above 16 MiB per core (then 16 MiB; none: the L2).
// Throws ValueError on a malformed override.
CacheModel make_cache_model(const DeviceInfo& d, const char* override_value);

// make_cache_model(device_info(), PTO_CACHE_SIZES), once.
const CacheModel& cache_model();

// The arithmetic ceiling of one core on the active ISA, measured once on first call (about 50 ms):
// the FMA throughput of register-only chains, and the clock from a chain of dependent integer adds
// (one cycle each), whose ratio gives the FMA units. A VM's neighbours and turbo make both
// estimates; the units are rounded to a whole number.
struct FmaCeiling {
  std::string isa;             // the ISA measured (the active one)
  int vector_bits = 0;         // 512, 256, or 32 for the scalar generic path
  double gflops = 0;           // single precision, one core
  double ghz = 0;              // 0 where the clock cannot be measured (not x86-64)
  double flops_per_cycle = 0;  // gflops / ghz
  int fma_units = 0;           // vector FMAs issued per cycle at vector_bits; 0 when unknown
};
const FmaCeiling& fma_ceiling();

}  // namespace pto
