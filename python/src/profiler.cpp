// pypto._C profiler functions and the Profile they return (include/pto/profiler.h); the Python
// API around them is python/pypto/profiler.py.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "pto/profiler.h"

namespace pto::python {

namespace {

nb::dict average_to_python(const profiler::Average& a) {
  nb::dict d;
  d["kind"] = a.kind;
  d["name"] = a.name;
  d["sources"] = a.sources;
  d["shapes"] = a.shapes;
  d["backend"] = a.backend;
  d["calls"] = a.calls;
  d["self_ns"] = a.self_ns;
  d["total_ns"] = a.total_ns;
  d["flops"] = a.flops;
  d["alloc_bytes"] = a.alloc_bytes;
  d["tasks"] = a.tasks;
  return d;
}

const char* kind_name(profiler::Event::Kind k) {
  switch (k) {
    case profiler::Event::Kind::kCall:
      return "call";
    case profiler::Event::Kind::kKernel:
      return "kernel";
    case profiler::Event::Kind::kTask:
      return "task";
    case profiler::Event::Kind::kRange:
      return "range";
  }
  return "?";
}

}  // namespace

void bind_profiler(nb::module_& m) {
  using profiler::Profile;
  nb::class_<Profile>(m, "Profile", "What a profiler session recorded.")
      .def(
          "key_averages",
          [](const Profile& p, bool group_by_shape) {
            nb::list out;
            for (const auto& a : profiler::key_averages(p, group_by_shape))
              out.append(average_to_python(a));
            return out;
          },
          nb::arg("group_by_shape") = false,
          "One dict per kernel (per model call, per range): kind, name, sources, shapes, calls, "
          "self_ns, total_ns, flops, alloc_bytes, tasks.")
      .def(
          "table",
          [](const Profile& p, bool group_by_shape, const std::string& sort_by, int64_t row_limit,
             double peak_gflops) {
            return profiler::table(p, profiler::key_averages(p, group_by_shape),
                                   {sort_by, row_limit, peak_gflops});
          },
          nb::arg("group_by_shape"), nb::arg("sort_by"), nb::arg("row_limit"),
          nb::arg("peak_gflops"), "The key averages as a table (profiler::table).")
      .def("chrome_trace", &profiler::chrome_trace, "The Trace Event Format JSON text.")
      .def(
          "write_chrome_trace",
          [](const Profile& p, const std::string& path) {
            nb::gil_scoped_release unlocked;
            profiler::write_chrome_trace(p, path);
          },
          nb::arg("path"))
      .def(
          "write_timeline_svg",
          [](const Profile& p, const std::string& path, int width) {
            profiler::write_timeline_svg(p, path, width);
          },
          nb::arg("path"), nb::arg("width") = 1400)
      .def_prop_ro("threads", [](const Profile& p) { return p.threads; })
      .def_prop_ro("pool_threads", [](const Profile& p) { return p.pool_threads; })
      .def_prop_ro("duration_ns", [](const Profile& p) { return p.duration_ns; })
      .def_prop_ro(
          "events",
          [](const Profile& p) {
            nb::list out;
            for (const auto& e : p.events)
              out.append(nb::make_tuple(kind_name(e.kind), e.thread, e.start_ns, e.end_ns, e.call,
                                        e.step, e.task));
            return out;
          },
          "(kind, thread, start_ns, end_ns, call, step, task) per event: kind is call, kernel, "
          "task or range; by thread, then start.")
      .def_prop_ro(
          "calls",
          [](const Profile& p) {
            nb::list out;
            for (const auto& c : p.calls) out.append(nb::make_tuple(c.model, c.stack));
            return out;
          },
          "(model index, caller stack) per call.")
      .def_prop_ro(
          "models",
          [](const Profile& p) {
            nb::list out;
            for (const auto& m : p.models) {
              nb::list kernels;
              for (const auto& k : m.kernels) {
                nb::dict d;
                d["name"] = k.name;
                d["sources"] = k.sources;
                d["backend"] = k.backend;
                d["algorithm"] = k.algorithm;
                d["flops"] = k.flops_known ? nb::cast(k.flops) : nb::none();
                d["consumers"] = k.consumers;
                d["input_shapes"] = k.input_shapes;
                d["output_shapes"] = k.output_shapes;
                d["alloc_bytes"] = k.alloc_bytes;
                d["live_bytes"] = k.live_bytes;
                d["arena_top"] = k.arena_top;
                kernels.append(d);
              }
              nb::dict d;
              d["name"] = m.name;
              d["input_shapes"] = m.input_shapes;
              d["kernels"] = kernels;
              d["memory_planned"] = m.memory_planned;
              d["peak_bytes"] = m.peak_bytes;
              d["live_peak_bytes"] = m.live_peak_bytes;
              out.append(d);
            }
            return out;
          },
          "Per model and input shapes: its kernels (name, sources, flops, consumers, shapes, "
          "memory) and the memory plan's peaks.");

  m.def(
      "profiler_start",
      [](bool record_shapes, bool profile_memory) {
        profiler::start({record_shapes, profile_memory});
      },
      nb::arg("record_shapes") = false, nb::arg("profile_memory") = false);
  m.def("profiler_stop", [] {
    nb::gil_scoped_release unlocked;  // waits for calls in flight on other threads
    return profiler::stop();
  });
  m.def("profiler_recording", &profiler::recording);
  m.def("profiler_begin_range", &profiler::begin_range, nb::arg("name"));
  m.def("profiler_end_range", &profiler::end_range);
  m.def("profiler_set_call_stack", &profiler::set_call_stack, nb::arg("stack"),
        "The next call this thread makes while recording carries this stack.");
  m.def("fma_peak_gflops", &profiler::fma_peak_gflops, nb::arg("threads"),
        "The FMA ceiling of `threads` cores in GFLOP/s (measured once).");
}

}  // namespace pto::python
