// pypto._C.device_info: the machine as the tiling planner sees it.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "pto/device_info.h"
#include "pto/op_coverage.h"

namespace pto::python {

void bind_device(nb::module_& m) {
  m.def(
      "device_info",
      [] {
        const DeviceInfo& d = device_info();
        nb::dict out;
        out["cpu_name"] = d.cpu_name;
        out["logical_cores"] = d.logical_cores;
        out["physical_cores"] = d.physical_cores;
        out["isa"] = d.isa;
        out["isa_from_env"] = d.isa_from_env;
        nb::dict ext;
        for (const auto& [name, on] : extension_flags(d)) ext[name.c_str()] = on;
        out["extensions"] = ext;
        nb::dict precision;  // how each reduced precision runs here, now
        for (const PrecisionPath& p : precision_paths()) {
          nb::dict one;
          one["fast"] = p.fast;
          one["how"] = p.how;
          precision[p.precision.c_str()] = one;
        }
        out["precision"] = precision;
        out["l1d_bytes"] = d.l1d_bytes;
        out["l2_bytes"] = d.l2_bytes;
        out["l3_bytes"] = d.l3_bytes;
        out["cacheline_bytes"] = d.cacheline;
        out["l1d_shared_by"] = d.l1d_shared_by;  // logical CPUs sharing it, 0 if unknown
        out["l2_shared_by"] = d.l2_shared_by;
        out["l3_shared_by"] = d.l3_shared_by;
        const FmaCeiling& f = fma_ceiling();  // measured on first use
        nb::dict fma;
        fma["isa"] = f.isa;
        fma["vector_bits"] = f.vector_bits;
        fma["gflops_per_core"] = f.gflops;
        fma["ghz"] = f.ghz;
        fma["flops_per_cycle"] = f.flops_per_cycle;
        fma["fma_units"] = f.fma_units;
        out["fma"] = fma;
        out["memory_bytes"] = d.memory_bytes;
        const CacheModel& c = cache_model();  // what kernels size their blocks from
        nb::dict model;
        model["l1d_bytes"] = c.l1d;
        model["l2_bytes"] = c.l2;
        model["l3_bytes_per_core"] = c.l3;
        model["l3_cores"] = c.l3_cores;
        model["line_bytes"] = c.line;
        model["from_env"] = c.from_env;
        model["adjusted"] = c.adjusted;
        out["cache_model"] = model;
        return out;
      },
      "The machine as the tiling planner sees it (cores, ISA, cache sizes, memory).");
}

}  // namespace pto::python
