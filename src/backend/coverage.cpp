// The op x backend coverage table (pto/op_coverage.h), read from the registries themselves: the
// OpRegistry, the reference KernelRegistry and the CPU KernelRegistry with each kernel's accepts()
// and reference_at_run_time. It lives with the backend registry because it knows every backend.
#include <algorithm>
#include <sstream>

#include "backend/cpu/gemm/igemm.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/kernel.h"
#include "pto/device_info.h"
#include "pto/op_coverage.h"
#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {

std::vector<PrecisionPath> precision_paths() {
  const bool dp = cpu::has_ext(cpu::Ext::kAvx512Bf16);
  const bool amx = dp && cpu::has_ext(cpu::Ext::kAmxBf16);
  return {
      {"bf16", dp,
       amx  ? "AMX tiles (amx_bf16) for products of 16 rows or more, VDPBF16PS (avx512_bf16) below"
       : dp ? "VDPBF16PS (avx512_bf16)"
            : cat("fp32 FMA on rounded operands (",
                  device_info().avx512_bf16 ? "avx512_bf16 turned off or another ISA chosen"
                                            : "no avx512_bf16",
                  ")")},
      // bf16x3 (torch's float32 matmul precision "high"): fast only where AMX multiplies the three
      // bf16 products; elsewhere they cost three times one bf16 product, more than fp32's one.
      {"bf16x3", amx,
       amx  ? "AMX tiles: three bf16 products of heads and tails, C held in the tiles"
       : dp ? "VDPBF16PS, three products: slower than fp32 (no amx_bf16; \"high\" keeps fp32)"
            : "fp32 FMA on rounded heads and tails, three products (\"high\" keeps fp32)"},
      // No fp16 kernel: x86's fp16 arithmetic (AVX512_FP16, AMX-FP16) is not used, so f16 is
      // never fast; it gives fp16 results (operands rounded), not fp16 speed.
      {"f16", false,
       cat("fp32 FMA on operands rounded to fp16 (",
           cpu::has_ext(cpu::Ext::kF16c)
               ? "F16C conversions; weights stored as fp16, widened in registers"
               : "scalar conversions: no f16c in use; weights in fp32 slots",
           device_info().avx512_fp16 ? "; avx512_fp16 is not used" : "; no avx512_fp16 or amx_fp16",
           "): fp32 speed")},
      {"int8", cpu::igemm_uses_vnni(),
       cpu::igemm_uses_vnni() && cpu::igemm_uses_amx()
           ? "AMX tiles (amx_int8) for products of 16 rows or more, VPDPBUSD (avx512_vnni) below"
       : cpu::igemm_uses_vnni() ? (cpu::active_isa() == cpu::Isa::kAvx512 ? "VPDPBUSD (avx512_vnni)"
                                                                          : "VPDPBUSD (avx_vnni)")
                                : "int16 widening, VPMADDWD (no VNNI in use)"}};
}

std::vector<OpCoverage> op_coverage() {
  std::vector<OpCoverage> out;
  for (const std::string& op : OpRegistry::global().names()) {
    OpCoverage c{op};
    c.reference = reference::KernelRegistry::global().find(op) != nullptr;
    if (const cpu::Kernel* k = cpu::KernelRegistry::global().find(op)) {
      c.cpu = k->reference_at_run_time ? CpuCoverage::kRunTime
              : k->accepts             ? CpuCoverage::kSome
                                       : CpuCoverage::kAll;
    } else if (const OpDef* def = OpRegistry::global().find(op); !def->lowered_by.empty()) {
      c.cpu = CpuCoverage::kLowered;
      c.lowered_by = def->lowered_by;
    } else if (std::any_of(def->attrs.defs().begin(), def->attrs.defs().end(),
                           [](const AttrDef& a) { return a.kind == AttrKind::kGraph; })) {
      c.cpu = CpuCoverage::kSubgraphs;
    }
    out.push_back(std::move(c));
  }
  return out;
}

const char* cpu_coverage_str(CpuCoverage c) {
  switch (c) {
    case CpuCoverage::kNone:
      return "- (reference backend)";
    case CpuCoverage::kAll:
      return "kernel";
    case CpuCoverage::kSome:
      return "kernel; declines some nodes to the reference";
    case CpuCoverage::kRunTime:
      return "kernel; declines some nodes, and unusual shapes at run time, to the reference";
    case CpuCoverage::kLowered:
      return "lowered by a pass into ops with CPU kernels";
    case CpuCoverage::kSubgraphs:
      return "subgraphs compiled with the model";
  }
  return "?";
}

std::string op_coverage_markdown() {
  std::vector<OpCoverage> ops = op_coverage();
  int reference = 0, counts[6] = {0, 0, 0, 0, 0, 0};
  for (const OpCoverage& c : ops) {
    reference += c.reference;
    ++counts[static_cast<int>(c.cpu)];
  }
  std::ostringstream os;
  os << "# Op coverage\n\n"
        "Which backend runs which op, read from the registries. Generated: do not edit; after\n"
        "adding an op or a kernel run `build/pto ops --markdown > docs/op_coverage.md` (the test\n"
        "`OpCoverage.DocIsUpToDate` fails until then).\n\n"
        "- **reference**: the reference interpreter (`src/reference`) has a kernel. It is the\n"
        "  oracle, so every op has one (`OpCoverage.EveryOpHasAReferenceKernel`).\n"
        "- **cpu**: the CPU backend (`src/backend/cpu`). *kernel*: a CPU kernel runs every node "
        "of\n"
        "  the op. *declines some nodes*: its `accepts` leaves some nodes (other dtypes than\n"
        "  float32, unusual attributes or opsets) to the reference backend, decided at compile\n"
        "  time and reported by the plan. *unusual shapes at run time*: the kernel itself calls\n"
        "  the reference kernel for inputs it sees only at run time. *lowered*: a pass rewrites\n"
        "  the op's nodes into ops with CPU kernels (which pass, and when). *subgraphs\n"
        "  compiled*: control flow; the runtime compiles the node's subgraphs with the model and\n"
        "  their nodes run on their own kernels. *- (reference backend)*: no CPU kernel; every\n"
        "  node of the op runs on the reference backend.\n"
        "- Fused groups (epilogues, tile programs) are decided per group: see "
        "[fusion.md](fusion.md).\n"
        "- **attributes**: the op's attribute schema (`OpDef::attrs`), across the opsets the\n"
        "  importer reads: `name=default`, *(required)*, or *(optional)* where an absent\n"
        "  attribute means something no constant says (derived from inputs or the opset). The\n"
        "  verifier rejects any other attribute, one of the wrong kind, and a missing required\n"
        "  one ([architecture.md](architecture.md)).\n\n"
     << ops.size() << " ops: " << reference << " with a reference kernel; on the CPU "
     << counts[static_cast<int>(CpuCoverage::kAll)] << " with a kernel for every node, "
     << counts[static_cast<int>(CpuCoverage::kSome)] << " declining some nodes, "
     << counts[static_cast<int>(CpuCoverage::kRunTime)] << " also declining at run time, "
     << counts[static_cast<int>(CpuCoverage::kLowered)] << " lowered into ops with kernels, "
     << counts[static_cast<int>(CpuCoverage::kSubgraphs)] << " with compiled subgraphs, "
     << counts[static_cast<int>(CpuCoverage::kNone)] << " on the reference backend only.\n\n"
     << "| op | reference | cpu | attributes |\n|---|---|---|---|\n";
  for (const OpCoverage& c : ops)
    os << "| " << c.op << " | " << (c.reference ? "yes" : "**no**") << " | "
       << cpu_coverage_str(c.cpu) << (c.lowered_by.empty() ? "" : ": " + c.lowered_by) << " | "
       << attr_schema_str(OpRegistry::global().find(c.op)->attrs) << " |\n";
  return os.str();
}

}  // namespace pto
