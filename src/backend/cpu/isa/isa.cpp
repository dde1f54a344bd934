#include "backend/cpu/isa/isa.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "pto/device_info.h"
#include "pto/error.h"

namespace pto::cpu {
namespace {

// The override is global rather than thread-local so that pool workers running tiles of a kernel
// see the same ISA as the thread that started it. -1: none.
std::atomic<int> g_override{-1};

// Extensions turned off by ExtScope (bit i: Ext i); global for the same reason.
std::atomic<unsigned> g_ext_off{0};

// PTO_DISABLE_EXT as a mask; an unknown name is an error (a typo must not test nothing).
unsigned env_ext_off() {
  unsigned mask = 0;
  for (const std::string& name : exts_disabled_by_env()) {
    bool known = false;
    for (int i = 0; i < kNumExts; ++i)
      if (name == ext_name(static_cast<Ext>(i))) {
        mask |= 1u << i;
        known = true;
      }
    if (!known) {
      std::string names;
      for (int i = 0; i < kNumExts; ++i) names += cat(i ? ", " : "", ext_name(static_cast<Ext>(i)));
      throw ValueError(cat("PTO_DISABLE_EXT: unknown extension '", name, "' (known: ", names, ")"));
    }
  }
  return mask;
}

Isa from_name(const std::string& name) {
  if (name == "avx512") return Isa::kAvx512;
  if (name == "avx2") return Isa::kAvx2;
  return Isa::kGeneric;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "generic";
  }
}

Isa active_isa() {
  int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return static_cast<Isa>(o);
  static const Isa chosen = from_name(device_info().isa);
  return chosen;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  const DeviceInfo& d = device_info();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kGeneric})
    if (supports_isa(d, isa_name(isa))) out.push_back(isa);
  return out;
}

const char* ext_name(Ext e) {
  switch (e) {
    case Ext::kAvx512Bf16:
      return "avx512_bf16";
    case Ext::kAvx512Vnni:
      return "avx512_vnni";
    case Ext::kAvxVnni:
      return "avx_vnni";
    case Ext::kAmxBf16:
      return "amx_bf16";
    case Ext::kAmxInt8:
      return "amx_int8";
    case Ext::kF16c:
      return "f16c";
  }
  return "?";
}

bool has_ext(Ext e) {
  static const unsigned env_off = env_ext_off();
  const unsigned bit = 1u << static_cast<int>(e);
  if ((env_off | g_ext_off.load(std::memory_order_relaxed)) & bit) return false;
  const DeviceInfo& d = device_info();
  const Isa isa = active_isa();
  switch (e) {
    case Ext::kAvx512Bf16:
      return isa == Isa::kAvx512 && d.avx512_bf16;
    case Ext::kAvx512Vnni:
      return isa == Isa::kAvx512 && d.avx512_vnni;
    case Ext::kAvxVnni:
      return isa != Isa::kGeneric && d.avx_vnni;
    case Ext::kAmxBf16:
      return isa == Isa::kAvx512 && d.amx_bf16;
    case Ext::kAmxInt8:
      return isa == Isa::kAvx512 && d.amx_int8;
    case Ext::kF16c:
      return isa != Isa::kGeneric && d.f16c;
  }
  return false;
}

ExtScope::ExtScope(Ext e) : ext_(e), saved_(g_ext_off.fetch_or(1u << static_cast<int>(e))) {
  set_ext_turned_off(ext_name(e), true);  // for compile-time choices (pto/device_info.h)
}

ExtScope::~ExtScope() {
  g_ext_off.store(saved_);
  set_ext_turned_off(ext_name(ext_), (saved_ >> static_cast<int>(ext_)) & 1u);
}

IsaScope::IsaScope(Isa isa) {
  if (!supports_isa(device_info(), isa_name(isa)))
    throw UnsupportedError(cat("this CPU cannot run the ", isa_name(isa), " kernels"));
  saved_ = g_override.exchange(static_cast<int>(isa));
}

IsaScope::~IsaScope() {
  g_override.store(saved_);
}

}  // namespace pto::cpu
