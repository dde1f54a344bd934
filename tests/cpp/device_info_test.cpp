// Machine detection: values come from the machine (sysfs, affinity), and the ISA choice honours
// PTO_ISA only for ISAs the CPU supports.
#include <gtest/gtest.h>
#include <sched.h>

#include <fstream>

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

}  // namespace
}  // namespace pto
