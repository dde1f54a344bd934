// `pto info`: the machine as the tiling planner sees it, and what this build supports.
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli.h"
#include "pto/device_info.h"
#include "pto/onnx.h"
#include "pto/op_coverage.h"
#include "pto/op_registry.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto::cli {
namespace {

std::string bytes_str(size_t n) {
  if (n == 0) return "unknown";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  std::ostringstream os;
  os << std::setprecision(v < 10 && u ? 3 : 4) << v << " " << units[u];
  return os.str();
}

// "avx512: 1 x 512-bit FMA per cycle at 3.6 GHz, 115 GFLOP/s per core (measured)"
std::string fma_str(const FmaCeiling& f) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(0) << f.isa << ": ";
  if (f.fma_units > 0)
    os << f.fma_units << " x " << f.vector_bits << "-bit FMA per cycle at " << std::setprecision(1)
       << f.ghz << " GHz, " << std::setprecision(0);
  os << f.gflops << " GFLOP/s per core (measured)";
  return os.str();
}

const char* kUsage =
    "usage: pto info\n\n"
    "Prints the machine as the tiling planner sees it: the cores this process may use, the CPU's\n"
    "ISA extensions, the kernel ISA chosen (override with PTO_ISA=avx512|avx2|generic), cache\n"
    "sizes, memory and the kernel thread count (set with PTO_NUM_THREADS); then the PyPTO\n"
    "version, the ONNX opsets the importer accepts and the number of ops registered.\n";

int info_main(const std::vector<std::string>& args) {
  ArgReader a(args, "info");
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return 0;
    }
    a.unknown();
  }
  const DeviceInfo& d = device_info();
  auto shared = [](int cpus) {
    return cpus > 1 ? cat(" shared by ", cpus, " cpus") : cpus == 1 ? std::string(" per cpu") : "";
  };
  size_t cpu_kernels = 0;
  for (const OpCoverage& c : op_coverage())
    cpu_kernels += c.cpu != CpuCoverage::kNone && c.cpu != CpuCoverage::kLowered &&
                   c.cpu != CpuCoverage::kSubgraphs;
  const char* env_threads = std::getenv("PTO_NUM_THREADS");
  std::string precisions;  // "bf16:        VDPBF16PS (avx512_bf16)"
  for (const PrecisionPath& p : precision_paths())
    precisions +=
        cat(p.precision, ":",
            std::string(p.precision.size() < 12 ? 12 - p.precision.size() : 1, ' '), p.how, "\n");
  std::string flags;
  for (const auto& [name, on] : extension_flags(d)) flags += cat(" ", on ? "+" : "-", name);
  const CacheModel& c = cache_model();
  for (const std::string& a : c.adjusted) std::cout << "note: cache model: " << a << "\n";
  std::cout << "PyPTO " << kVersion << "\n"
            << "cpu:         " << d.cpu_name << "\n"
            << "cores:       " << d.logical_cores << " logical, " << d.physical_cores
            << " physical (usable by this process)\n"
            << "isa flags:  " << flags << "\n"
            << "isa:         " << d.isa
            << (d.isa_from_env ? " (from PTO_ISA)" : " (best supported)") << "\n"
            << precisions << "caches:      L1d " << bytes_str(d.l1d_bytes)
            << shared(d.l1d_shared_by) << ", L2 " << bytes_str(d.l2_bytes) << shared(d.l2_shared_by)
            << ", L3 " << bytes_str(d.l3_bytes) << shared(d.l3_shared_by) << ", line "
            << d.cacheline << " B\n"
            << "cache model: L1d " << bytes_str(c.l1d) << ", L2 " << bytes_str(c.l2) << ", L3 "
            << bytes_str(c.l3) << " per core (" << c.l3_cores << " cores share the L3)"
            << (c.from_env           ? " (PTO_CACHE_SIZES)"
                : c.adjusted.empty() ? " (as detected)"
                                     : "")
            << "\n"
            << "fma:         " << fma_str(fma_ceiling()) << "\n"
            << "memory:      " << bytes_str(d.memory_bytes) << "\n"
            << "threads:     " << num_threads()
            << (env_threads && *env_threads ? " (from PTO_NUM_THREADS)" : " (default)") << "\n"
            << "onnx opsets: " << onnx::kMinOpset << " to " << onnx::max_opset()
            << " (default domain)\n"
            << "ops:         " << OpRegistry::global().names().size() << " registered, "
            << reference::KernelRegistry::global().names().size() << " reference kernels, "
            << cpu_kernels << " CPU kernels\n"
            << "engines:     cpu (" << d.isa << "), reference\n";
  return 0;
}

}  // namespace

Command info_command() {
  return {"info", "Show the machine as the tiling planner sees it, and what this build supports.",
          kUsage, info_main};
}

}  // namespace pto::cli
