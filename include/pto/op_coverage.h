// Which backend runs which op: every op of the OpRegistry, whether the reference interpreter has a
// kernel for it (the oracle: every op should) and how the CPU backend takes it. A node the CPU
// backend does not take runs on the reference backend (pto/backend.h). `pto ops` prints this;
// docs/op_coverage.md is its Markdown form, kept up to date by a test.
//
// Fused groups are not listed here: which ops a fused tile program can express is in
// docs/fusion.md and decided per group (`pto compile --dump-tiles`).
#pragma once

#include <string>
#include <vector>

namespace pto {

enum class CpuCoverage {
  kNone,     // no CPU kernel: every node of the op runs on the reference backend
  kAll,      // a CPU kernel that takes every node of the op
  kSome,     // a CPU kernel that declines some nodes at compile time (dtypes, attributes, opsets);
             // those run on the reference backend
  kRunTime,  // a CPU kernel that also hands some inputs, seen only at run time (unusual shapes),
             // to the reference kernel
  kLowered,  // no CPU kernel of its own: a pass rewrites its nodes into ops that have kernels
             // (OpDef::lowered_by says which, and when)
  kSubgraphs,  // control flow: the runtime compiles its subgraphs, whose nodes get their own
               // kernels (src/runtime/control_flow.h)
};

struct OpCoverage {
  std::string op;
  bool reference = false;  // has a reference kernel
  CpuCoverage cpu = CpuCoverage::kNone;
  std::string lowered_by;  // kLowered: OpDef::lowered_by
};

// Every registered op, sorted by name.
std::vector<OpCoverage> op_coverage();

// "kernel", "kernel, declines some nodes", ... : the CPU column of `pto ops`.
const char* cpu_coverage_str(CpuCoverage c);

// docs/op_coverage.md: a header saying how it is made, a table of every op, and totals.
std::string op_coverage_markdown();

// How the CPU backend computes a reduced precision on this machine, now (the active ISA and
// extensions): for `pto info`, pypto.device_info() and precision reports.
struct PrecisionPath {
  std::string precision;  // "bf16", "f16", "int8"
  bool fast = false;      // on instructions made for it (not a fallback)
  std::string how;        // "VDPBF16PS (avx512_bf16)", "fp32 FMA on rounded operands (...)"
};
std::vector<PrecisionPath> precision_paths();

}  // namespace pto
