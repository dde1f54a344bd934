// Machine detection: values come from the machine (sysfs, affinity), and the ISA choice honours
// PTO_ISA only for ISAs the CPU supports.
#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>

#include "backend/cpu/isa/isa.h"
#include "pto/device_info.h"
#include "pto/error.h"

namespace pto {
namespace {

TEST(DeviceInfo, ReadsTheMachine) {
  DeviceInfo d = detect_device();
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(d.logical_cores, CPU_COUNT(&set));
  EXPECT_GE(d.physical_cores, 1);
  EXPECT_LE(d.physical_cores, d.logical_cores);
  EXPECT_FALSE(d.cpu_name.empty());
  EXPECT_GT(d.memory_bytes, size_t{1} << 26);
  EXPECT_TRUE(d.cacheline == 32 || d.cacheline == 64 || d.cacheline == 128) << d.cacheline;
  // Where sysfs describes the caches, the sizes must be exactly what it says.
  std::ifstream l1("/sys/devices/system/cpu/cpu0/cache/index0/size");
  std::ifstream type("/sys/devices/system/cpu/cpu0/cache/index0/type");
  std::string size, kind;
  if (l1 >> size && type >> kind && kind == "Data" && size.back() == 'K' && CPU_ISSET(0, &set)) {
    EXPECT_EQ(d.l1d_bytes, std::stoull(size) * 1024);
  }
  EXPECT_GT(d.l2_bytes, d.l1d_bytes);
  // Dependent flags never exceed their base.
  if (d.avx512bw || d.avx512vl || d.avx512_vnni || d.avx512_bf16 || d.avx512_fp16) {
    EXPECT_TRUE(d.avx512f);
  }
  EXPECT_TRUE(supports_isa(d, d.isa));
}

// The extension flags against the kernel's own reading of CPUID and XCR0 (/proc/cpuinfo).
TEST(DeviceInfo, ExtensionFlagsMatchProcCpuinfo) {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line on this system";
  const DeviceInfo d = detect_device();
  for (const auto& [name, on] : extension_flags(d))
    EXPECT_EQ(on, flags.find(" " + name + " ") != std::string::npos) << name;
}

// has_ext follows the CPU, the active ISA and ExtScope.
TEST(DeviceInfo, ExtensionsFollowTheIsaAndScopes) {
  const DeviceInfo& d = device_info();
  EXPECT_EQ(cpu::has_ext(cpu::Ext::kAvx512Bf16), d.avx512_bf16 && d.isa == "avx512");
  EXPECT_EQ(cpu::has_ext(cpu::Ext::kAvx512Vnni), d.avx512_vnni && d.isa == "avx512");
  EXPECT_STREQ(cpu::ext_name(cpu::Ext::kAvxVnni), "avx_vnni");
  {
    cpu::ExtScope off(cpu::Ext::kAvx512Bf16);
    EXPECT_FALSE(cpu::has_ext(cpu::Ext::kAvx512Bf16));
    {
      cpu::ExtScope vnni(cpu::Ext::kAvx512Vnni);
      EXPECT_FALSE(cpu::has_ext(cpu::Ext::kAvx512Vnni));
    }
    EXPECT_EQ(cpu::has_ext(cpu::Ext::kAvx512Vnni), d.avx512_vnni && d.isa == "avx512");
  }
  EXPECT_EQ(cpu::has_ext(cpu::Ext::kAvx512Bf16), d.avx512_bf16 && d.isa == "avx512");
  // A scope also turns the extension off for compile-time choices (ext_turned_off), nested
  // scopes of one extension restoring in turn.
  EXPECT_FALSE(ext_turned_off("amx_bf16"));
  {
    cpu::ExtScope outer(cpu::Ext::kAmxBf16);
    EXPECT_TRUE(ext_turned_off("amx_bf16"));
    {
      cpu::ExtScope inner(cpu::Ext::kAmxBf16);
      EXPECT_TRUE(ext_turned_off("amx_bf16"));
    }
    EXPECT_TRUE(ext_turned_off("amx_bf16"));
    EXPECT_FALSE(ext_turned_off("amx_int8"));
  }
  EXPECT_FALSE(ext_turned_off("amx_bf16"));
  if (d.avx512_bf16 && supports_isa(d, "avx2")) {  // the avx2 kernels cannot issue it
    cpu::IsaScope avx2(cpu::Isa::kAvx2);
    EXPECT_FALSE(cpu::has_ext(cpu::Ext::kAvx512Bf16));
  }
}

TEST(DeviceInfo, IsaChoiceAndOverride) {
  DeviceInfo d;
  d.cpu_name = "test cpu";
  EXPECT_EQ(choose_isa(d, nullptr), "generic");
  d.avx2 = d.fma = true;
  EXPECT_EQ(choose_isa(d, ""), "avx2");
  EXPECT_THROW(choose_isa(d, "avx512"), UnsupportedError);  // this CPU lacks it
  d.avx512f = d.avx512bw = d.avx512vl = true;
  EXPECT_EQ(choose_isa(d, nullptr), "avx512");
  EXPECT_EQ(choose_isa(d, "avx2"), "avx2");
  EXPECT_EQ(choose_isa(d, "generic"), "generic");
  EXPECT_THROW(choose_isa(d, "sse4"), ValueError);
  d.avx512bw = false;  // AVX-512F alone is not enough for our kernels
  EXPECT_EQ(choose_isa(d, nullptr), "avx2");
}

TEST(DeviceInfo, CachedInstanceIsConsistent) {
  const DeviceInfo& a = device_info();
  const DeviceInfo& b = device_info();
  EXPECT_EQ(&a, &b);
  EXPECT_TRUE(a.isa == "avx512" || a.isa == "avx2" || a.isa == "generic");
}

// The cache model: plausible detected sizes pass through (L3 shared out per core); a VM's
// missing or absurd sizes are replaced and said so; PTO_CACHE_SIZES overrides, malformed is an
// error.
TEST(CacheModel, SanityChecksAndOverride) {
  DeviceInfo d;
  d.physical_cores = 2;
  d.l1d_bytes = 48 << 10;
  d.l2_bytes = 2 << 20;
  d.l3_bytes = 32 << 20;
  CacheModel m = make_cache_model(d, nullptr);
  EXPECT_EQ(m.l1d, size_t{48} << 10);
  EXPECT_EQ(m.l2, size_t{2} << 20);
  EXPECT_EQ(m.l3, size_t{16} << 20);
  EXPECT_TRUE(m.adjusted.empty());
  EXPECT_FALSE(m.from_env);

  d.l3_bytes = size_t{300} << 20;  // a VM reporting 300 MB
  d.l1d_bytes = 0;                 // and no L1d
  m = make_cache_model(d, nullptr);
  EXPECT_EQ(m.l3, size_t{16} << 20);
  EXPECT_EQ(m.l1d, size_t{32} << 10);
  EXPECT_EQ(m.adjusted.size(), 2u);

  d.l3_bytes = 0;  // no L3: the L2 stands in
  EXPECT_EQ(make_cache_model(d, nullptr).l3, size_t{2} << 20);

  m = make_cache_model(d, "l1d=64K,l3=4M");
  EXPECT_TRUE(m.from_env);
  EXPECT_EQ(m.l1d, size_t{64} << 10);
  EXPECT_EQ(m.l2, size_t{2} << 20);
  EXPECT_EQ(m.l3, size_t{4} << 20);
  EXPECT_EQ(make_cache_model(d, "l2=1048576").l2, size_t{1} << 20);
  for (const char* bad : {"l2=abc", "l4=1M", "l2", "l2=0", "l1d=32K,", "l2=3G"})
    EXPECT_THROW(make_cache_model(d, bad), ValueError) << bad;
}

// The L3 is shared out among the cores its CPU list names (SMT siblings counted once), not among
// the cores this process happens to get: a 2-core slice of a 16-core L3 gets a sixteenth.
TEST(CacheModel, L3ShareFollowsTheCoresSharingIt) {
  DeviceInfo d;
  d.logical_cores = 4;
  d.physical_cores = 2;  // 2 threads per core
  d.l1d_bytes = 32 << 10;
  d.l2_bytes = 1 << 20;
  d.l3_bytes = 32 << 20;
  d.l3_shared_by = 32;  // 16 cores x 2 threads
  CacheModel m = make_cache_model(d, nullptr);
  EXPECT_EQ(m.l3_cores, 16);
  EXPECT_EQ(m.l3, size_t{2} << 20);
  d.l3_shared_by = 0;  // unknown: the process's cores
  m = make_cache_model(d, nullptr);
  EXPECT_EQ(m.l3_cores, 2);
  EXPECT_EQ(m.l3, size_t{16} << 20);
  d.cacheline = 0;  // absurd line size
  EXPECT_EQ(make_cache_model(d, nullptr).line, 64u);
}

// The measured ceiling is plausible: some GFLOP/s, a clock between 0.5 and 7 GHz on x86-64, and
// on a vector ISA between one and four FMA units whose product with the width and the clock is the
// measured rate (the units are rounded, so within a factor of two).
TEST(FmaCeiling, MeasuredValuesArePlausible) {
  const FmaCeiling& f = fma_ceiling();
  EXPECT_EQ(f.isa, device_info().isa);
  EXPECT_GT(f.gflops, 0.1);
#if defined(__x86_64__)
  EXPECT_GT(f.ghz, 0.5);
  EXPECT_LT(f.ghz, 7.0);
  EXPECT_NEAR(f.flops_per_cycle, f.gflops / f.ghz, 1e-9 * f.flops_per_cycle);
#if defined(__SANITIZE_ADDRESS__)
  // Instrumented code does not run the FMA loop at the machine's rate: the units say nothing.
  constexpr bool kMeasurable = false;
#else
  constexpr bool kMeasurable = true;
#endif
  if (kMeasurable && f.vector_bits > 32) {
    EXPECT_GE(f.fma_units, 1);
    EXPECT_LE(f.fma_units, 4);
    const double expected = f.fma_units * 2.0 * f.vector_bits / 32 * f.ghz;
    EXPECT_GT(f.gflops, expected / 2);
    EXPECT_LT(f.gflops, expected * 2);
  }
#endif
}

}  // namespace
}  // namespace pto
