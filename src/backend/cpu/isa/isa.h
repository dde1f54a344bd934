// Which instruction set the CPU kernels run with.
//
// Every kernel with vector code is compiled three times, once per ISA, into namespaces
// pto::cpu::avx512, pto::cpu::avx2 and pto::cpu::generic: a source file named `*_avx512.cpp`,
// `*_avx2.cpp` or `*_generic.cpp` gets that ISA's compiler flags and PTO_ISA_NS set to its
// namespace (CMakeLists.txt). Usually the three files are one line each, including a shared
// `*_impl.h` written against simd.h. The choice is made at run time: active_isa() is the best the
// CPU has (CPUID, see device_info()) unless PTO_ISA forces a lower one; tests and benchmarks switch
// with IsaScope.
//
// Code in a per-ISA file must stay inside its ISA namespace: an inline function or template from a
// shared header instantiated there may be compiled with that ISA's instructions, and the linker
// keeps one copy for the whole program. Per-ISA files therefore use raw pointers and their own
// helpers, not standard containers.
#pragma once

#include <vector>

namespace pto::cpu {

enum class Isa { kGeneric = 0, kAvx2 = 1, kAvx512 = 2 };

const char* isa_name(Isa isa);      // "generic", "avx2", "avx512"
Isa active_isa();                   // the IsaScope override on this thread, else device_info().isa
std::vector<Isa> supported_isas();  // every ISA this machine can run, best first

// Forces `isa` process-wide while alive, so pool workers see it too (tests and benchmarks).
// Throws UnsupportedError if the machine cannot run it.
class IsaScope {
 public:
  explicit IsaScope(Isa isa);
  ~IsaScope();
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;

 private:
  int saved_;
};

// Extensions a kernel may use on top of its ISA level (bf16 dot products, int8 VNNI, AMX),
// chosen at run time like the ISA. has_ext(e) holds when the CPU has it (device_info()), the
// active ISA's kernels can issue it (the AVX-512 extensions need the avx512 kernels, AVX-VNNI the
// avx2 or avx512 ones), and neither PTO_DISABLE_EXT (a comma-separated list of ext_name()s, read
// once) nor an ExtScope turned it off. A kernel that finds an extension off takes its fallback,
// which every kernel has.
enum class Ext { kAvx512Bf16, kAvx512Vnni, kAvxVnni, kAmxBf16, kAmxInt8, kF16c };
inline constexpr int kNumExts = 6;

const char* ext_name(Ext e);  // "avx512_bf16", as /proc/cpuinfo and pto info spell it
bool has_ext(Ext e);

// Turns `e` off process-wide while alive (tests of the fallbacks, benchmarks).
class ExtScope {
 public:
  explicit ExtScope(Ext e);
  ~ExtScope();
  ExtScope(const ExtScope&) = delete;
  ExtScope& operator=(const ExtScope&) = delete;

 private:
  Ext ext_;
  unsigned saved_;
};

}  // namespace pto::cpu

// Calls ns::fn(args...) for the active ISA's namespace ns.
#define PTO_ISA_DISPATCH(fn, ...)                    \
  [&]() -> decltype(auto) {                          \
    switch (::pto::cpu::active_isa()) {              \
      case ::pto::cpu::Isa::kAvx512:                 \
        return ::pto::cpu::avx512::fn(__VA_ARGS__);  \
      case ::pto::cpu::Isa::kAvx2:                   \
        return ::pto::cpu::avx2::fn(__VA_ARGS__);    \
      default:                                       \
        return ::pto::cpu::generic::fn(__VA_ARGS__); \
    }                                                \
  }()

// Declares the same functions in the three ISA namespaces: PTO_ISA_DECLARE(void f(int);)
#define PTO_ISA_DECLARE(...) \
  namespace avx512 {         \
  __VA_ARGS__                \
  }                          \
  namespace avx2 {           \
  __VA_ARGS__                \
  }                          \
  namespace generic {        \
  __VA_ARGS__                \
  }
