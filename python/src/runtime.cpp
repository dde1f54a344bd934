// pypto._C.compile and Executable: compile a graph, run it on arrays (no copies either way).
#include <chrono>
#include <tuple>

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "pto/executable.h"
#include "pto/op_registry.h"
#include "pto/parallel.h"
#include "pto/progress.h"
#include "pto/runtime.h"
#include "pto/tuning.h"

namespace pto::python {

namespace {

// A pool's counters (MemoryPoolStats) as a dict.
nb::dict stats_dict(const MemoryPoolStats& s) {
  nb::dict d;
  d["reserved_bytes"] = s.reserved_bytes;
  d["in_use_bytes"] = s.in_use_bytes;
  d["peak_in_use_bytes"] = s.peak_in_use_bytes;
  d["system_allocations"] = s.system_allocations;
  d["pool_hits"] = s.pool_hits;
  return d;
}

// One value per graph input (an array; a list of arrays for a sequence, None for an empty
// optional), named after the input in errors; no copies.
std::vector<Tensor> inputs_from_python(const Executable& exe, const nb::list& args) {
  const Graph& g = exe.graph();
  std::vector<Tensor> inputs;
  inputs.reserve(nb::len(args));
  for (size_t i = 0; i < nb::len(args); ++i) {
    auto what = [&] {
      return i < g.inputs().size() ? cat("input '", g.value(g.inputs()[i]).name, "'")
                                   : cat("input ", i);
    };
    inputs.push_back(value_from_python(args[i], what));
  }
  return inputs;
}

// One value per element of `args` (a list or tuple), named after the graph input in errors; no
// copies. A numpy array is taken as it is; anything else (a torch tensor, a numpy scalar, an array
// of another byte order) goes through `convert(x, what)` first (pypto.runtime._to_c), so a call
// with numpy arrays runs no Python code between the caller and the Executable. Without `convert`
// every element is taken as it is.
std::vector<Tensor> inputs_converting(const Executable& exe, nb::handle args, nb::handle convert) {
  static PyTypeObject* const ndarray = [] {  // a reference kept for the process's lifetime
    nb::object t = nb::module_::import_("numpy").attr("ndarray");
    return reinterpret_cast<PyTypeObject*>(t.release().ptr());
  }();
  nb::object seq = nb::steal(PySequence_Fast(args.ptr(), "inputs must be a list or tuple"));
  if (!seq.is_valid()) throw nb::python_error();
  const size_t n = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.ptr()));
  PyObject** items = PySequence_Fast_ITEMS(seq.ptr());
  const Graph& g = exe.graph();
  std::vector<Tensor> inputs;
  inputs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto what = [&] {
      return i < g.inputs().size() ? cat("input '", g.value(g.inputs()[i]).name, "'")
                                   : cat("input ", i);
    };
    nb::handle x = items[i];
    if (Py_TYPE(x.ptr()) == ndarray) {
      try {
        inputs.push_back(tensor_from_python(x, what));
        continue;
      } catch (const TypeError&) {
        if (convert.is_none()) throw;  // else an array of another byte order: converted below
      }
    }
    // A list (a sequence) or None (an empty optional) too, where the input is one: convert
    // passes them on as such.
    if ((x.is_none() || nb::isinstance<nb::list>(x) || nb::isinstance<nb::tuple>(x)) &&
        i < g.inputs().size() && g.value(g.inputs()[i]).type.is_tensor())
      throw TypeError(cat(what(), " must be a torch.Tensor or numpy.ndarray, got ",
                          nb::inst_name(x).c_str(), " (the input is ",
                          g.value(g.inputs()[i]).type.str(), ", not a sequence or optional)"));
    inputs.push_back(value_from_python(convert.is_none() ? x : convert(x, what()), what));
  }
  return inputs;
}

// Runs without the GIL. The caller drops its references to the arrays after the GIL is back,
// so releasing them does not take the GIL once per input.
std::vector<Tensor> run_unlocked(const Executable& exe, const std::vector<Tensor>& inputs,
                                 const reference::NodeObserver& observer = {}) {
  nb::gil_scoped_release unlocked;
  return exe.run(inputs, observer);
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<CompileOptions>(m, "CompileOptions")
      .def(nb::init<>())
      .def_rw("level", &CompileOptions::level)
      .def_rw("memory_optimization", &CompileOptions::memory_optimization)
      .def_rw("auto_mixed_precision", &CompileOptions::auto_mixed_precision)
      .def_prop_rw(
          "mixed_precision",
          [](const CompileOptions& o) { return std::string(dtype_name(o.mixed_precision)); },
          [](CompileOptions& o, const std::string& name) {
            const DType dt = dtype_from_name(name);
            if (dt != DType::kBF16 && dt != DType::kF16)
              throw ValueError(cat("mixed_precision must be 'bf16' or 'f16', got '", name, "'"));
            o.mixed_precision = dt;
          },
          "What auto_mixed_precision rounds the products' operands to: 'bf16' or 'f16'.")
      .def_rw("matmul_precision", &CompileOptions::matmul_precision,
              "Float32 MatMul/Gemm as torch.set_float32_matmul_precision: 'highest' (fp32), "
              "'high' (bf16x3 on AMX tiles) or 'medium' (bf16).")
      .def_rw("conv_precision", &CompileOptions::conv_precision,
              "Float32 Conv (not depthwise) the same, as torch.backends.mkldnn.conv.fp32_precision "
              "('ieee', 'tf32', 'bf16'): 'highest', 'high' or 'medium'.")
      .def_rw("release_packed_weights", &CompileOptions::release_packed_weights)
      .def_rw("concurrent_kernels", &CompileOptions::concurrent_kernels)
      .def_rw("specialize_subgraphs", &CompileOptions::specialize_subgraphs)
      .def_rw("dump_after", &CompileOptions::dump_after)
      .def_rw("use_tune_cache", &CompileOptions::use_tune_cache)
      .def_rw("tune_cache_path", &CompileOptions::tune_cache_path)
      .def_rw("tiles", &CompileOptions::tiles,
              "Pinned tile shapes: kernel name (a node or output of it, or '*') -> [rows, cols] or "
              "[cols]; a ValueError at compile when one cannot fit or names no tile kernel.");

  nb::class_<Executable>(m, "Executable", "A compiled graph; call run() with one array per input.")
      .def(
          "run",
          [](const Executable& exe, nb::handle args, nb::handle convert) {
            const std::vector<Tensor> inputs = inputs_converting(exe, args, convert);
            std::vector<Tensor> outputs = run_unlocked(exe, inputs);
            nb::list out;
            for (Tensor& t : outputs) out.append(tensor_to_python(std::move(t)));
            return out;
          },
          nb::arg("inputs"), nb::arg("convert") = nb::none(),
          "Runs on a list of arrays; returns a list of arrays: numpy arrays, or DLPack-capable "
          "arrays for dtypes numpy lacks (bf16). convert(x, what): called for every input that is "
          "not a numpy array, returns what to take in its place (a DLPack capsule or array).")
      .def(
          "run_traced",
          [](const Executable& exe, const nb::list& args) {
            std::vector<std::tuple<std::string, std::string, std::vector<Tensor>>> trace;
            const std::vector<Tensor> inputs = inputs_from_python(exe, args);
            run_unlocked(exe, inputs, [&](const Node& n, const std::vector<Tensor>& outs) {
              trace.emplace_back(n.name, n.op, outs);
            });
            nb::list out;
            for (auto& [name, op, outs] : trace) {
              nb::list arrays;
              for (const Tensor& t : outs)
                arrays.append(t.defined() ? tensor_to_python(t) : nb::none());
              out.append(nb::make_tuple(name, op, arrays));
            }
            return out;
          },
          nb::arg("inputs"), "Runs and returns (node name, op, outputs) for every node, in order.")
      .def(
          "run_values",
          [](const Executable& exe, const nb::list& args) {
            std::vector<std::tuple<size_t, std::string, Tensor>> seen;
            const Graph& g = exe.graph();
            std::vector<Tensor> inputs = inputs_from_python(exe, args);
            {
              nb::gil_scoped_release unlocked;
              exe.run_observing_values(inputs, [&](ValueId v, const Tensor& t) {
                const int32_t node = g.value(v).producer;
                if (t.defined() && node >= 0)
                  seen.emplace_back(exe.step_of_node(static_cast<size_t>(node)), g.value(v).name,
                                    t);
              });
            }
            inputs.clear();
            nb::list out;
            for (auto& [step, name, t] : seen)
              out.append(nb::make_tuple(step, name, tensor_to_python(t)));
            return out;
          },
          nb::arg("inputs"),
          "Runs and returns (step, value name, array) for every value a kernel wrote, in order.")
      .def(
          "profile",
          [](const Executable& exe, const nb::list& args) {
            // One entry per step: its last node's name, and its fusion rule or its op.
            std::vector<std::tuple<std::string, std::string, double>> times;
            const Node* first = exe.graph().nodes().data();
            auto last = std::chrono::steady_clock::now();
            const std::vector<Tensor> inputs = inputs_from_python(exe, args);
            run_unlocked(exe, inputs, [&](const Node& n, const std::vector<Tensor>&) {
              auto now = std::chrono::steady_clock::now();
              const StepInfo& s = exe.step(exe.step_of_node(&n - first));
              times.emplace_back(n.name, s.rule.empty() ? n.op : s.rule,
                                 std::chrono::duration<double>(now - last).count());
              last = now;
            });
            return times;
          },
          nb::arg("inputs"),
          "Runs once and returns (last node name, fusion rule or op, seconds) for every kernel, in "
          "order.")
      .def_prop_ro(
          "node_backends", [](const Executable& e) { return e.node_backends(); },
          "(op, backend) for each node, in order: 'cpu' (a CPU backend kernel) or 'reference' "
          "(the fallback); a control-flow node is followed by its subgraphs' nodes, named "
          "'node/attribute/op'.")
      .def_prop_ro(
          "memory_stats", [](const Executable& e) { return stats_dict(e.memory_stats()); },
          "The memory pool's counters (bytes held, in use, peak; allocations from the system "
          "and requests served from the pool).")
      .def(
          "stats",
          [](const Executable& e, const std::optional<std::vector<std::vector<int64_t>>>& shapes) {
            ExecutableStats s = shapes ? e.stats(*shapes) : e.stats();
            nb::dict d;
            d["kernels"] = s.kernels;
            d["fused_kernels"] = s.fused_kernels;
            d["nodes"] = s.nodes;
            d["nodes_in"] = s.nodes_in;
            d["peak_bytes"] = s.peak_bytes;
            d["unplanned_peak_bytes"] = s.unplanned_peak_bytes;
            d["live_peak_bytes"] = s.live_peak_bytes;
            d["unplanned_values"] = s.unplanned_values;
            d["memory_planned"] = s.memory_planned;
            d["weight_bytes"] = s.weight_bytes;
            d["packed_weight_bytes"] = s.packed_weight_bytes;
            d["released_weight_bytes"] = s.released_weight_bytes;
            d["stages"] = s.stages;
            d["staged_kernels"] = s.staged_kernels;
            d["tuned_kernels"] = s.tuned_kernels;
            d["subgraph_kernels"] = s.subgraph_kernels;
            d["subgraph_fused_kernels"] = s.subgraph_fused_kernels;
            d["subgraph_peak_bytes"] = s.subgraph_peak_bytes;
            return d;
          },
          nb::arg("input_shapes") = nb::none(),
          "Kernel count and memory: peak_bytes (the planned arena), unplanned_peak_bytes (every "
          "intermediate in its own buffer), for these input shapes or the last run's.")
      .def_prop_ro(
          "steps",
          [](const Executable& e) {
            nb::list out;
            for (size_t i = 0; i < e.num_steps(); ++i) {
              const StepInfo& s = e.step(i);
              nb::list names;
              for (int32_t n : s.nodes) names.append(e.graph().nodes()[n].name);
              nb::dict d;
              d["backend"] = s.backend;
              d["rule"] = s.rule;
              // The core kernel's op: views that joined the step (a head merge's Reshape
              // after an Attention) do not name it.
              const Node* core = &e.graph().nodes()[s.nodes.back()];
              for (auto n = s.nodes.rbegin(); n != s.nodes.rend(); ++n) {
                const Node& node = e.graph().nodes()[*n];
                if (!node.def || !node.def->is_view()) {
                  core = &node;
                  break;
                }
              }
              d["op"] = core->op;
              d["nodes"] = names;
              out.append(d);
            }
            return out;
          },
          "The plan: one dict per kernel (backend, fusion rule, the op of its last node that is "
          "not a view, the names of the nodes it covers).")
      .def("describe_step", &Executable::describe_step, nb::arg("i"),
           "Step i's kernel as its backend describes it (a tile program), or ''.")
      .def_prop_ro(
          "pass_report",
          [](const Executable& e) {
            nb::list out;
            for (const PassReport& r : e.pass_report()) {
              nb::dict d;
              d["name"] = r.name;
              d["seconds"] = r.seconds;
              d["nodes_before"] = r.nodes_before;
              d["nodes_after"] = r.nodes_after;
              nb::dict fired;
              for (const auto& [rule, count] : r.fired) fired[rule.c_str()] = count;
              d["fired"] = fired;
              out.append(d);
            }
            return out;
          },
          "One dict per graph pass that ran: name, seconds, nodes before/after, rewrites fired.")
      .def_prop_ro("graph", &Executable::graph, nb::rv_policy::reference_internal)
      .def("graph_with_weights", &Executable::graph_with_weights,
           "The graph with the weights kernels hold packed rebuilt: complete, to export.")
      .def_prop_ro("level", [](const Executable& e) { return e.options().level; })
      .def_prop_ro(
          "options",
          [](const Executable& e) {
            CompileOptions o = e.options();
            o.on_progress = {};
            return o;
          },
          "A copy of the CompileOptions it was compiled with.");

  m.def(
      "compile",
      [](Graph& g, CompileOptions o, bool consume, const std::optional<std::string>& progress) {
        std::optional<ProgressBar> bar;
        if (progress && ProgressBar::wanted() && !o.on_progress) {
          bar.emplace(*progress);
          o.on_progress = [&bar, label = *progress](const CompileProgress& p) {
            bar->set_label(cat(label, std::string(p.stage) == "pass" ? ": passes" : ": kernels"));
            bar->update(p.done, p.total, p.name);
          };
        }
        if (!consume) return compile(g, o);
        Graph owned = std::move(g);
        g = Graph();  // the caller's object is left empty, not half-moved
        return compile(std::move(owned), o);
      },
      nb::arg("graph"), nb::arg("options") = CompileOptions(), nb::arg("consume") = false,
      nb::arg("progress") = nb::none(),
      "Verifies, types and prepares a graph for execution. consume=True takes the graph's "
      "contents (the object is left empty), so weights that kernels pack are held once even "
      "while it compiles. progress: a label for a progress bar of the passes and kernels, drawn "
      "on stderr when it is a terminal (or PTO_PROGRESS=1).");

  m.def(
      "tune",
      [](const Executable& exe, const nb::list& args, const std::string& level, int64_t trials,
         bool early_stop, const std::string& cache, bool reuse, bool for_load) {
        tune::TuneOptions o;
        o.for_load = for_load;
        o.level = tune::parse_level(level);
        o.num_trials = trials;
        o.early_stop = early_stop;
        o.cache_path = cache;
        o.reuse_cache = reuse;
        std::vector<Tensor> inputs = inputs_from_python(exe, args);
        const Graph g = exe.graph_with_weights();
        tune::TuneReport r;
        {
          nb::gil_scoped_release unlocked;
          r = tune::tune(g, inputs, exe.options(), o);
        }
        nb::list kernels;
        for (const tune::KernelTuning& k : r.kernels) {
          nb::dict d;
          d["step"] = k.step;
          d["name"] = k.name;
          d["signature"] = k.signature;
          d["knobs"] = k.knobs;
          d["planner_seconds"] = k.planner_seconds;
          d["tuned_seconds"] = k.tuned_seconds;
          d["trials"] = k.trials;
          d["from_cache"] = k.from_cache;
          d["capped"] = k.capped;
          d["from_class"] = k.from_class;
          kernels.append(d);
        }
        nb::list classes;
        for (const tune::ClassTuning& c : r.classes) {
          nb::dict d;
          d["name"] = c.name;
          d["knobs"] = c.knobs;
          d["steps"] = c.steps;
          d["ratio"] = c.ratio;
          d["won"] = c.won;
          classes.append(d);
        }
        nb::dict d;
        d["kernels"] = kernels;
        d["classes"] = classes;
        d["pool_speedup"] = r.pool_speedup;
        d["contended"] = r.contended;
        d["model_checks"] = r.model_checks;
        d["model_planner_seconds"] = r.model_planner_seconds;
        d["model_tuned_seconds"] = r.model_tuned_seconds;
        d["kept"] = r.kept;
        d["trials"] = r.trials;
        d["seconds"] = r.seconds;
        d["cache"] = r.cache_path;
        return d;
      },
      nb::arg("executable"), nb::arg("inputs"), nb::arg("level") = "normal",
      nb::arg("num_trials") = 0, nb::arg("early_stop") = true, nb::arg("cache") = "",
      nb::arg("reuse_cache") = true, nb::arg("for_load") = false,
      "Tunes the executable's graph on these inputs (pto/tuning.h) and stores the winners in "
      "the tuning cache; returns the report as a dict.");

  nb::class_<ProgressBar>(m, "ProgressBar",
                          "The progress bar of include/pto/progress.h: drawn on stderr only when "
                          "it is a terminal (PTO_PROGRESS=0/1 overrides), after `delay` seconds.")
      .def(nb::init<std::string, double>(), nb::arg("label"), nb::arg("delay") = 0.25)
      .def("update", &ProgressBar::update, nb::arg("done"), nb::arg("total"), nb::arg("what") = "")
      .def("set_label", &ProgressBar::set_label, nb::arg("label"))
      .def("finish", &ProgressBar::finish)
      .def_prop_ro("enabled", &ProgressBar::enabled)
      .def_static("render", &ProgressBar::render, nb::arg("label"), nb::arg("done"),
                  nb::arg("total"), nb::arg("what"), nb::arg("width"));

  m.def("enable_memory_pool", &enable_memory_pool, nb::arg("enabled") = true,
        "Executables compiled from now on share one process-wide memory pool (false: each its "
        "own, the default).");
  m.def("memory_pool_enabled", &memory_pool_enabled);
  m.def(
      "memory_stats", [] { return stats_dict(memory_stats()); },
      "The counters of every live executable's pool, summed (the shared pool once).");
  m.def(
      "set_memory_policy",
      [](int prefetch_distance, int reuse_distance, int nontemporal) {
        MemoryPolicy p;
        p.prefetch_distance = prefetch_distance;
        p.reuse_distance = reuse_distance;
        p.nontemporal = static_cast<MemoryPolicy::NonTemporal>(nontemporal);
        set_memory_policy(p);
      },
      nb::arg("prefetch_distance"), nb::arg("reuse_distance"), nb::arg("nontemporal"),
      "Sets the process-wide memory policy (nontemporal: 0 auto, 1 never, 2 always).");
  m.def(
      "memory_policy",
      [] {
        MemoryPolicy p = memory_policy();
        return nb::make_tuple(p.prefetch_distance, p.reuse_distance,
                              static_cast<int>(p.nontemporal));
      },
      "(prefetch_distance, reuse_distance, nontemporal) of the process-wide memory policy.");
  m.def("set_num_threads", &set_num_threads, nb::arg("n"),
        "Resizes the kernel thread pool (n >= 1; 0 means the default).");
  m.def("num_threads", &num_threads, "Threads the kernel thread pool runs on.");
  m.def("set_threading", &set_threading, nb::arg("mode"),
        "Where the pool's threads come from: 'auto', 'own' or 'omp' (see pto/parallel.h).");
  m.def("recheck_threading", &recheck_threading,
        "Decides 'auto' again, now that PyTorch (and its libgomp) may be loaded.");
  m.def("threading", &threading, "The threading mode in effect: 'own' or 'omp'.");
}

}  // namespace pto::python
