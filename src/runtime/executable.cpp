// compile() and Executable::run() (level 4 of DESIGN.md).
//
// compile: verify and type the graph, run the passes of the level (src/passes), partition it into
// kernels (level >= 2: src/fusion), give each kernel to the first backend that supports it (a
// fused group no backend takes is split back into single nodes), and analyse liveness. The memory
// plan (src/runtime/memory_plan.h) is made once for static shapes, per input-shape signature
// otherwise.
//
// Stages (src/runtime/stages.h): at level >= 2, independent steps too small to fill the machine are
// brought together (the order may change, within a window and only where the memory plan's peak
// stays within 10%) and run at the same time, one per thread, each kernel cutting its work as it
// would on the whole pool (run_as_on_pool), so the bits do not change.
//
// run: check the inputs at the boundary, then run the stages in order. During a step the runtime's
// allocator hands each output the arena slot the plan gave it; everything else comes from the
// Executable's memory pool. An output that lands in the arena where the plan did not put it (a
// kernel returned a view the op did not declare) is copied out, so the plan can never be wrong.
#include "pto/executable.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "pto/backend.h"
#include "pto/liveness.h"
#include "pto/log.h"
#include "pto/op_registry.h"
#include "pto/parallel.h"
#include "pto/reader_index.h"
#include "runtime/control_flow.h"
#include "runtime/memory_plan.h"
#include "runtime/profiler_hooks.h"
#include "runtime/stages.h"
#include "tile/lower.h"
#include "tile/tile_planner.h"
#include "tune/signature.h"
#include "tune/tune_cache.h"

namespace pto {

struct Executable::Plan {
  // A node run on its own kernel: trailing views of a step, and the unfused form of a group.
  struct NodeRun {
    int32_t node;
    KernelGroup group;  // the node alone
    std::unique_ptr<CompiledKernel> kernel;
  };
  struct Step {
    StepInfo info;
    KernelGroup group;  // everything the step covers
    KernelGroup core;   // what `kernel` computes: the group less its trailing views
    std::unique_ptr<CompiledKernel> kernel;
    std::vector<NodeRun> leading;  // Reshape-like nodes whose outputs the core reads
    std::vector<NodeRun> views;    // Reshape-like nodes applied to the core's one output
    // The group node by node, made on the first KernelDeclined (under `mutex`).
    std::shared_ptr<std::vector<NodeRun>> unfused;
    const ControlFlowKernel* control_flow = nullptr;  // `kernel`, when it is one
  };
  std::vector<Step> steps;
  KernelGraph kernels;
  Liveness live;
  std::vector<bool> in_place;  // per step: may write its output over a dying input
  // Candidate stages chosen at compile time, per step (empty: none). Each shape's plan runs
  // together only the small steps of a candidate (MemoryPlan::stage_begin).
  std::vector<int32_t> stage_of;
  // Initializers released after packing (release_packed_weights): per value, the step whose
  // kernel holds it and the tensor runs read in its place (its shape and dtype, no data).
  struct Released {
    size_t step;
    Tensor meta;
  };
  std::unordered_map<ValueId, Released> released;
  std::unordered_map<ValueId, Tensor> unpacked;  // originals rebuilt for a fallback (under mutex)
  std::vector<size_t> step_of_node;
  std::vector<PassReport> passes;
  KernelPartition partition;  // as fusion formed it, before stages (what a saved model keeps)
  size_t nodes_in = 0;
  bool plan_memory = false;
  // PTO_TEST_PERTURB_VALUE: the value whose kernel output is made wrong on purpose (tests of the
  // debugging tools only), kNoValue normally.
  ValueId perturbed = kNoValue;
  uint64_t id = next_id();   // tells executables apart in a profile
  size_t tuned_kernels = 0;  // steps compiled with knobs from the tuning cache

  static uint64_t next_id() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
  // Its own, or the process-wide one (enable_memory_pool). With its own pool the executable
  // keeps a run's arena for its next run; with the shared one the arena goes back to the pool,
  // where the next run (of this model or another) takes it.
  std::shared_ptr<MemoryPool> pool = executable_memory_pool();
  bool keep_arenas = !memory_pool_enabled();

  // Memory plans by input shapes, and arenas free for the next run (runs may be concurrent).
  std::mutex mutex;
  std::map<std::vector<Dims>, std::shared_ptr<const MemoryPlan>> memory_plans;
  std::shared_ptr<const MemoryPlan> last_plan;
  std::vector<Dims> last_shapes;                          // last_plan's key
  std::vector<std::shared_ptr<std::byte[]>> free_arenas;  // each of arena_size bytes
  // Value tables of finished runs (one empty tensor per graph value), for the next runs: a table
  // is a few KiB, and allocating it costs more than a small graph's kernels. A table keeps its
  // copies of the constants (`constant`) from run to run: a step borrows them (run_taking) instead
  // of copying them, two allocations each.
  std::vector<std::vector<Tensor>> free_envs;
  std::vector<bool> constant;  // per value: an initializer or released weight, not a graph input
  // The storages of the initializers, sorted: an output in one of them (the constant itself, or
  // a view a kernel made of it) goes to the caller as a copy.
  std::vector<const Storage*> constant_storage;
  // Per value: for a graph input that is no graph output, the last step reading it, else -1. Its
  // copy in env (the caller keeps the original) moves to that step instead of being copied again.
  std::vector<int32_t> input_last_read;
  // Per graph output: the step that allocates its buffer (its root's producer), else -1 (an
  // input or a constant), and its static shape if it has one. run_into hands that step the
  // caller's destination when the output is known to fit it.
  std::vector<int32_t> output_step;
  std::vector<std::optional<Dims>> output_dims;
  // Per graph output: the outputs of that step before its root, of the same static size.
  std::vector<int> output_skip;
  size_t arena_size = 0;
};

namespace {

// A test-only fault (PTO_TEST_PERTURB_VALUE=<value name>): a float32 output comes back with 1
// added to every element, as from a broken kernel, so `pto check`, compare_layers and their tests
// can show that the first wrong value is found. Other dtypes are left alone.
Tensor perturbed_copy(const Tensor& t) {
  if (t.dtype() != DType::kF32) return t;
  Tensor c = t.clone();
  float* d = static_cast<float*>(c.raw_data());
  for (int64_t i = 0; i < c.numel(); ++i) d[i] += 1.0f;
  return c;
}

// Every input's symbolic dimensions must lie in the range the frontend declared.
void check_symbol_ranges(const Graph& g, const std::vector<Tensor>& inputs) {
  if (g.symbol_ranges.empty()) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = g.value(g.inputs()[i]);
    if (!v.type.shape || !inputs[i].defined() || !inputs[i].is_tensor()) continue;
    const Shape& s = *v.type.shape;
    if (static_cast<int64_t>(s.size()) != inputs[i].rank()) continue;  // reported by the run
    for (size_t d = 0; d < s.size(); ++d) {
      if (!s[d].is_symbolic()) continue;
      auto it = g.symbol_ranges.find(s[d].symbol);
      if (it == g.symbol_ranges.end()) continue;
      int64_t size = inputs[i].shape()[d];
      const DimRange& r = it->second;
      if (size < r.min || size > r.max)
        throw ValueError(cat("input '", v.name, "': dimension ", d, " ('", s[d].symbol, "') is ",
                             size, ", outside the declared range [", r.min, ", ",
                             r.max == INT64_MAX ? std::string("inf") : std::to_string(r.max), "]"));
    }
  }
}

bool all_static(const Graph& g) {
  for (ValueId v : g.inputs()) {
    const TensorType& t = g.value(v).type;
    if (!t.shape) return false;
    for (const Dim& d : *t.shape)
      if (!d.is_known()) return false;
  }
  return true;
}

// The graph's types for these concrete input shapes. Shape arithmetic is folded on the copy, so
// a Reshape whose target is computed at run time gets its concrete shape too. Value ids are
// those of `g` (folding only adds values).
Graph with_input_shapes(const Graph& g, const std::vector<Dims>& shapes) {
  Graph typed = g;
  for (size_t i = 0; i < shapes.size() && i < g.inputs().size(); ++i)
    if (g.value(g.inputs()[i]).type.is_tensor())  // a sequence's "shape" says nothing
      typed.value(g.inputs()[i]).type.shape = to_shape(shapes[i]);
  // Shape arithmetic only (results <= 4 KiB), folded in the inference's one sweep: a mask or
  // position table that the concrete sizes make constant (sized by the sequence) would be
  // computed at every new length for nothing the plan needs (its shape is inferred the same).
  try {
    infer_types(typed, constant_folder(4096));
  } catch (const Error&) {  // the plan then leaves unknown sizes to the pool
    Graph plain = g;
    for (size_t i = 0; i < shapes.size() && i < g.inputs().size(); ++i)
      if (g.value(g.inputs()[i]).type.is_tensor())
        plain.value(g.inputs()[i]).type.shape = to_shape(shapes[i]);
    infer_types(plain);
    return plain;
  }
  return typed;
}

// Whether a group reads or writes a sequence or an optional (only ops with kNonTensorValues can).
bool has_non_tensor_values(const Graph& g, const KernelGroup& k) {
  for (int32_t n : k.nodes) {
    const Node& node = g.nodes()[n];
    if (!node.def || !node.def->has(kNonTensorValues)) continue;
    for (const auto* ids : {&node.inputs, &node.outputs})
      for (ValueId v : *ids)
        if (v != kNoValue && !g.value(v).type.is_tensor()) return true;
  }
  return false;
}

const Backend* backend_for(const Graph& g, const KernelGroup& k) {
  // Sequences and optionals exist on the reference kernels alone: no other backend is asked
  // (the CPU kernel of Identity, say, would take one for a tensor).
  const bool reference_only = has_non_tensor_values(g, k);
  for (const Backend* b : BackendRegistry::global().backends())
    if ((!reference_only || b->name() == "reference") && b->supports(g, k)) return b;
  return nullptr;
}

// The tuning cache compile() reads, when it reads one (CompileOptions::use_tune_cache).
std::optional<tune::TuneCache> open_tune_cache(const CompileOptions& options) {
  const char* env = std::getenv("PTO_TUNE_CACHE");
  if (!options.use_tune_cache ||
      (options.tune_cache_path.empty() && env && std::string(env) == "off"))
    return std::nullopt;
  return tune::TuneCache::open(options.tune_cache_path);
}

// Step `core`'s kernel from backend `b`, with the knobs the tuning cache holds for it when it
// has no pinned tile or knobs; knobs that no longer compile (a tile that does not fit any more)
// are ignored. Sets `tuned` when the cache's knobs were used.
std::unique_ptr<CompiledKernel> compile_core(const Graph& g, KernelGroup& core, const Backend& b,
                                             const std::optional<tune::TuneCache>& cache,
                                             bool& tuned) {
  tuned = false;
  if (cache && core.tile.empty() && core.knobs.empty()) {
    const std::string sig = tune::kernel_signature(g, core);
    const std::optional<tune::TuneEntry> e =
        sig.empty() ? std::nullopt : cache->lookup(sig, num_threads());
    if (e && !e->knobs.empty()) {
      KernelGroup pinned = core;
      tune::apply_knobs(pinned, e->knobs);
      if (b.supports(g, pinned)) {
        try {
          std::unique_ptr<CompiledKernel> k = b.compile(g, pinned);
          core = std::move(pinned);
          tuned = true;
          return k;
        } catch (const ValueError& err) {
          log(LogLevel::kWarn, cat("tuning cache: stale knobs ", tune::knobs_str(e->knobs),
                                   " ignored: ", err.what()));
        }
      }
    }
  }
  return b.compile(g, core);
}

Executable::Plan::NodeRun compile_node(const Graph& g, int32_t n) {
  Executable::Plan::NodeRun r{n, single_node_group(g, n), nullptr};
  const Backend* b = backend_for(g, r.group);
  if (!b) throw UnsupportedError(cat(g.nodes()[n].where(), ": no kernel for this op"));
  r.kernel = b->compile(g, r.group);
  return r;
}

// The few values a step's extra nodes (views, the group run unfused) read and write, found by a
// linear search: a hash map's nodes cost more than the search, on every call.
class StepValues {
 public:
  Tensor& operator[](ValueId v) {
    for (auto& [id, t] : items_)
      if (id == v) return t;
    return items_.emplace_back(v, Tensor()).second;
  }
  Tensor& at(ValueId v) {
    for (auto& [id, t] : items_)
      if (id == v) return t;
    PTO_CHECK(false) << "a step reads value " << v << ", which it was not given";
    return items_.front().second;
  }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }

 private:
  std::vector<std::pair<ValueId, Tensor>> items_;
};

// Runs nodes one by one on their own kernels; `values` holds what they read and receives what
// they write.
void run_nodes(const std::vector<Executable::Plan::NodeRun>& runs, StepValues& values) {
  for (const auto& r : runs) {
    std::vector<Tensor> args;  // lent by `values` and given back
    args.reserve(r.group.inputs.size());
    for (ValueId v : r.group.inputs) {
      Tensor& t = values.at(v);
      args.push_back(t.is_contiguous() ? std::move(t) : t.contiguous());
    }
    std::vector<Tensor> outs;
    try {
      outs = r.kernel->run_taking(args);
    } catch (...) {
      for (size_t i = 0; i < args.size(); ++i) values[r.group.inputs[i]] = std::move(args[i]);
      throw;
    }
    for (size_t i = 0; i < args.size(); ++i) values[r.group.inputs[i]] = std::move(args[i]);
    for (size_t o = 0; o < outs.size() && o < r.group.outputs.size(); ++o)
      values[r.group.outputs[o]] = std::move(outs[o]);
  }
}

// Serves a step's outputs from their arena slots and everything else from the pool.
class StepAllocator : public Allocator {
 public:
  StepAllocator(std::byte* arena, size_t arena_bytes, std::shared_ptr<MemoryPool> pool)
      : arena_(arena), end_(arena + arena_bytes), pool_(std::move(pool)) {}

  void set_slots(const std::vector<MemoryPlan::Slot>* slots) {
    slots_ = slots;
    taken_.assign(slots ? slots->size() : 0, 0);
  }
  // The caller's buffer of a graph output this step makes (Executable::run_into): the step's
  // allocation of exactly its size after `skip` others of that size (the step's outputs before
  // it: kernels allocate their outputs in order) gets it, once.
  void add_destination(const Tensor& d, int skip) {
    destinations_.push_back({static_cast<std::byte*>(d.raw_data()), d.nbytes(), skip});
  }
  void clear_destinations() { destinations_.clear(); }
  // Whether p is a destination handed out (the caller's memory, never freed here).
  bool handed_out(const void* p) const {
    return std::find(handed_out_.begin(), handed_out_.end(), p) != handed_out_.end();
  }
  void* allocate(size_t nbytes) override {
    std::byte* given = nullptr;
    for (auto it = destinations_.begin(); it != destinations_.end();) {
      if (it->bytes == nbytes && !given && it->skip == 0) {
        given = it->data;
        it = destinations_.erase(it);
        continue;
      }
      if (it->bytes == nbytes && it->skip > 0) --it->skip;
      ++it;
    }
    if (given) {
      handed_out_.push_back(given);
      return given;
    }
    const size_t rounded = (nbytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
    if (slots_ && nbytes > 0)
      for (size_t i = 0; i < slots_->size(); ++i)
        if (!taken_[i] && (*slots_)[i].bytes == rounded) {
          taken_[i] = 1;
          return arena_ + (*slots_)[i].offset;
        }
    return pool_->allocate(nbytes);
  }
  void deallocate(void* p, size_t nbytes) noexcept override {
    if (!in_arena(p) && (handed_out_.empty() || !handed_out(p))) pool_->deallocate(p, nbytes);
  }
  bool in_arena(const void* p) const {
    auto* b = static_cast<const std::byte*>(p);
    return b >= arena_ && b < end_;
  }

 private:
  std::byte* arena_;
  std::byte* end_;
  std::shared_ptr<MemoryPool> pool_;
  const std::vector<MemoryPlan::Slot>* slots_ = nullptr;
  std::vector<char> taken_;
  struct Destination {
    std::byte* data;
    size_t bytes;
    int skip;
  };
  std::vector<Destination> destinations_;  // this step's, not yet taken
  std::vector<const void*> handed_out_;    // this run's
};

// Level 2: Reshape-like views join a neighbouring kernel, since they only relabel a buffer. A view
// whose input is the one output of the kernel before it, read by nothing else, joins that kernel
// (trailing); a view the kernel before could not take joins the one kernel that reads it
// (leading). Fills, per kernel of the result, the nodes that joined it each way.
void absorb_views(const Graph& g, KernelGraph& kg, std::vector<std::vector<int32_t>>& trailing,
                  std::vector<std::vector<int32_t>>& leading) {
  const ReaderIndex readers(g);
  const size_t n = kg.kernels.size();
  trailing.assign(n, {});
  leading.assign(n, {});
  std::vector<char> gone(n, 0);
  auto view_node = [&](size_t s) -> const Node* {
    const KernelGroup& k = kg.kernels[s];
    if (k.nodes.size() != 1) return nullptr;
    const Node& v = g.nodes()[k.nodes[0]];
    if (!v.def || !v.def->is_view() || v.outputs.size() != 1 || v.outputs[0] == kNoValue ||
        v.inputs.empty() || v.inputs[0] == kNoValue)
      return nullptr;
    return &v;
  };
  std::unordered_map<ValueId, size_t> made_by;  // single-output kernels by their output
  for (size_t s = 0; s < n; ++s) {
    const Node* v = view_node(s);
    auto it = v ? made_by.find(v->inputs[0]) : made_by.end();
    if (v && readers.single_reader(v->inputs[0]) >= 0 && it != made_by.end()) {
      const size_t into = it->second;
      kg.kernels[into].nodes.push_back(kg.kernels[s].nodes[0]);
      trailing[into].push_back(kg.kernels[s].nodes[0]);
      finish_group(g, kg.kernels[into], &readers);
      gone[s] = 1;
      made_by.erase(it);
      made_by[v->outputs[0]] = into;
      continue;
    }
    if (kg.kernels[s].outputs.size() == 1) made_by[kg.kernels[s].outputs[0]] = s;
  }
  std::vector<size_t> group_of(g.nodes().size());
  for (size_t s = 0; s < n; ++s)
    if (!gone[s])
      for (int32_t node : kg.kernels[s].nodes) group_of[node] = s;
  for (size_t s = n; s-- > 0;) {  // last first: a chain of views ends in the kernel at its end
    const Node* v = view_node(s);
    if (gone[s] || !v || !trailing[s].empty()) continue;
    const int32_t reader = readers.single_reader(v->outputs[0]);
    if (reader < 0) continue;
    const size_t into = group_of[reader];
    if (into == s) continue;
    KernelGroup& host = kg.kernels[into];
    host.nodes.push_back(kg.kernels[s].nodes[0]);
    std::sort(host.nodes.begin(), host.nodes.end());
    leading[into].push_back(kg.kernels[s].nodes[0]);
    finish_group(g, host, &readers);
    group_of[kg.kernels[s].nodes[0]] = into;
    gone[s] = 1;
  }
  // Keep the survivors, then order them again: a host runs where its last node now is.
  KernelGraph kept;
  std::unordered_map<int32_t, std::pair<std::vector<int32_t>, std::vector<int32_t>>> joined;
  for (size_t s = 0; s < n; ++s) {
    if (gone[s]) continue;
    std::sort(leading[s].begin(), leading[s].end());
    joined[kg.kernels[s].nodes.back()] = {std::move(leading[s]), std::move(trailing[s])};
    kept.kernels.push_back(std::move(kg.kernels[s]));
  }
  PTO_CHECK(order_kernels(g, kept)) << "views made the kernels depend on each other";
  kg = std::move(kept);
  leading.assign(kg.kernels.size(), {});
  trailing.assign(kg.kernels.size(), {});
  for (size_t s = 0; s < kg.kernels.size(); ++s) {
    auto& [lead, trail] = joined[kg.kernels[s].nodes.back()];
    leading[s] = std::move(lead);
    trailing[s] = std::move(trail);
  }
}

}  // namespace

Executable::Executable(std::shared_ptr<const Graph> g, CompileOptions options,
                       std::shared_ptr<Plan> plan)
    : graph_(std::move(g)), options_(std::move(options)), plan_(std::move(plan)) {}

Executable::~Executable() = default;

const std::string& Executable::node_backend(size_t i) const {
  PTO_CHECK(i < plan_->step_of_node.size()) << "node_backend: node " << i << " out of range";
  return plan_->steps[plan_->step_of_node[i]].info.backend;
}

std::vector<std::pair<std::string, const Executable*>> Executable::subgraphs(size_t i) const {
  PTO_CHECK(i < plan_->step_of_node.size()) << "subgraphs: node " << i << " out of range";
  std::vector<std::pair<std::string, const Executable*>> out;
  const Plan::Step& step = plan_->steps[plan_->step_of_node[i]];
  if (step.control_flow && step.core.nodes[0] == static_cast<int32_t>(i))
    return step.control_flow->subgraphs();
  return out;
}

std::vector<std::pair<std::string, std::string>> Executable::node_backends() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < graph_->nodes().size(); ++i) {
    const Node& n = graph_->nodes()[i];
    out.emplace_back(n.op, node_backend(i));
    for (const auto& [attr, exe] : subgraphs(i))
      for (auto& [op, backend] : exe->node_backends())
        out.emplace_back(cat(n.name.empty() ? n.op : n.name, "/", attr, "/", op), backend);
  }
  return out;
}

size_t Executable::step_of_node(size_t i) const {
  PTO_CHECK(i < plan_->step_of_node.size()) << "step_of_node: node " << i << " out of range";
  return plan_->step_of_node[i];
}

size_t Executable::num_steps() const {
  return plan_->steps.size();
}

const StepInfo& Executable::step(size_t i) const {
  PTO_CHECK(i < plan_->steps.size()) << "step " << i << " out of range";
  return plan_->steps[i].info;
}

std::string Executable::describe_step(size_t i) const {
  PTO_CHECK(i < plan_->steps.size()) << "step " << i << " out of range";
  return plan_->steps[i].kernel->describe();
}

const KernelGroup& Executable::step_group(size_t i) const {
  PTO_CHECK(i < plan_->steps.size()) << "step " << i << " out of range";
  return plan_->steps[i].core;
}

const KernelPartition& Executable::partition() const {
  return plan_->partition;
}

const std::vector<PassReport>& Executable::pass_report() const {
  return plan_->passes;
}

MemoryPoolStats Executable::memory_stats() const {
  return plan_->pool->stats();
}

namespace {

// The stages of these shapes: within each candidate stage, the runs of consecutive steps that
// are small for them (any subset of a stage is independent too).
std::vector<int32_t> active_stages(const Executable::Plan& p, const Graph& g, const Graph& types) {
  if (p.stage_of.empty()) return {};
  std::vector<int32_t> stage_of;
  std::vector<double> run;  // estimated times of the current run of small steps
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const KernelCost c = kernel_cost(g, p.kernels.kernels[s], &types);
    const bool small = is_small(c, num_threads());
    bool join = small && !run.empty() && p.stage_of[s] == p.stage_of[s - 1];
    if (join) {
      run.push_back(estimated_ns(c));
      join =
          stage_gain(run, num_threads()) > stage_gain({run.begin(), run.end() - 1}, num_threads());
      run.pop_back();
    }
    if (!join) run.clear();
    if (small) run.push_back(estimated_ns(c));
    stage_of.push_back(s == 0 ? 0 : stage_of.back() + (join ? 0 : 1));
  }
  return stage_of;
}

std::shared_ptr<const MemoryPlan> memory_plan_for(Executable::Plan& p, const Graph& g,
                                                  const std::vector<Dims>& shapes) {
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.memory_plans.find(shapes);
  p.last_shapes = shapes;
  if (it != p.memory_plans.end()) return p.last_plan = it->second;
  const Graph typed = all_static(g) ? Graph() : with_input_shapes(g, shapes);
  const Graph& types = all_static(g) ? g : typed;
  auto plan = std::make_shared<const MemoryPlan>(
      plan_memory(types, p.kernels, p.live, p.in_place, active_stages(p, g, types)));
  if (p.memory_plans.size() >= 64) p.memory_plans.erase(p.memory_plans.begin());
  p.memory_plans.emplace(shapes, plan);
  if (plan->arena_bytes > p.arena_size) {  // older arenas are too small for this plan
    p.arena_size = plan->arena_bytes;
    p.free_arenas.clear();
  }
  return p.last_plan = plan;
}

// memory_plan_for the inputs' shapes; a run with the shapes of the last one builds no key.
std::shared_ptr<const MemoryPlan> memory_plan_of(Executable::Plan& p, const Graph& g,
                                                 const std::vector<Tensor>& inputs) {
  if (all_static(g)) return memory_plan_for(p, g, {});
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    bool same = p.last_plan && p.last_shapes.size() == inputs.size();
    for (size_t i = 0; same && i < inputs.size(); ++i) same = p.last_shapes[i] == inputs[i].shape();
    if (same) return p.last_plan;
  }
  std::vector<Dims> shapes;
  for (const Tensor& t : inputs) shapes.push_back(t.shape());
  return memory_plan_for(p, g, shapes);
}

ExecutableStats stats_of(const Executable::Plan& p, const Graph& g, const MemoryPlan* mp) {
  ExecutableStats s;
  s.nodes_in = p.nodes_in;
  s.nodes = g.nodes().size();
  s.kernels = p.steps.size();
  s.tuned_kernels = p.tuned_kernels;
  for (const auto& step : p.steps) {
    s.fused_kernels += step.info.nodes.size() > 1;
    s.packed_weight_bytes += step.kernel->prepared_bytes();
    if (step.control_flow) step.control_flow->add_stats(s);
  }
  for (const auto& [v, t] : g.initializers()) s.weight_bytes += t.nbytes();
  for (const auto& [v, r] : p.released) s.released_weight_bytes += r.meta.nbytes();
  if (mp) {
    s.memory_planned = p.plan_memory;
    s.peak_bytes = p.plan_memory ? mp->arena_bytes : mp->unplanned_bytes;
    s.unplanned_peak_bytes = mp->unplanned_bytes;
    s.live_peak_bytes = mp->live_peak_bytes;
    s.unplanned_values = mp->unplanned_values;
    s.stages = mp->concurrent_stages;
    s.staged_kernels = mp->concurrent_steps;
  }
  return s;
}

}  // namespace

ExecutableStats Executable::stats() const {
  std::shared_ptr<const MemoryPlan> mp;
  {
    std::lock_guard<std::mutex> lock(plan_->mutex);
    mp = plan_->last_plan;
  }
  if (!mp && all_static(*graph_)) mp = memory_plan_for(*plan_, *graph_, {});
  return stats_of(*plan_, *graph_, mp.get());
}

ExecutableStats Executable::stats(const std::vector<Dims>& input_shapes) const {
  auto mp =
      memory_plan_for(*plan_, *graph_, all_static(*graph_) ? std::vector<Dims>{} : input_shapes);
  return stats_of(*plan_, *graph_, mp.get());
}

namespace {

// A released weight rebuilt from its kernel's packed copy, once, for the kernels that read the
// original (a group run node by node).
Tensor unpacked_weight(Executable::Plan& p, ValueId v) {
  std::lock_guard<std::mutex> lock(p.mutex);
  Tensor& t = p.unpacked[v];
  if (!t.defined()) t = p.steps[p.released.at(v).step].kernel->unpack_constant(v);
  return t;
}

// One step: the core kernel on the step's inputs, then its trailing views. A core that declines
// these shapes runs node by node instead. `args` are lent to the kernel and the views
// (CompiledKernel::run_taking) and given back.
std::vector<Tensor> run_step(Executable::Plan& p, const Graph& g,
                             const Executable::Plan::Step& step, std::vector<Tensor>& args) {
  auto value_map = [&] {
    StepValues values;
    for (size_t i = 0; i < args.size(); ++i) values[step.group.inputs[i]] = args[i];
    return values;
  };
  // The kernel's inputs: the step's as they are (the usual case), else moved out of them (and
  // back after), else what the leading views made.
  const bool as_given = step.leading.empty() && step.core.inputs == step.group.inputs;
  std::vector<Tensor> core_args;
  std::vector<size_t> core_from;  // per core input, its index in args when moved from there
  if (as_given) {
  } else if (step.leading.empty()) {
    for (ValueId v : step.core.inputs) {
      auto it = std::find(step.group.inputs.begin(), step.group.inputs.end(), v);
      core_from.push_back(static_cast<size_t>(it - step.group.inputs.begin()));
      core_args.push_back(std::move(args[core_from.back()]));
    }
  } else {
    StepValues leading = value_map();
    run_nodes(step.leading, leading);
    for (ValueId v : step.core.inputs) core_args.push_back(leading.at(v).contiguous());
  }
  auto give_back = [&] {
    for (size_t k = 0; k < core_from.size(); ++k) args[core_from[k]] = std::move(core_args[k]);
  };
  std::vector<Tensor> outs;
  try {
    outs = step.kernel->run_taking(as_given ? args : core_args);
  } catch (const KernelDeclined& e) {
    give_back();
    std::shared_ptr<std::vector<Executable::Plan::NodeRun>> unfused;
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      if (!step.unfused) {
        auto runs = std::make_shared<std::vector<Executable::Plan::NodeRun>>();
        for (int32_t n : step.group.nodes) runs->push_back(compile_node(g, n));
        const_cast<Executable::Plan::Step&>(step).unfused = runs;
        log(LogLevel::kInfo, cat(g.nodes()[step.group.last_node()].where(), ": ", step.info.rule,
                                 " declined these shapes (", e.what(), "); running it unfused"));
      }
      unfused = step.unfused;
    }
    StepValues all = value_map();
    for (auto& [v, t] : all)
      if (p.released.count(v)) t = unpacked_weight(p, v);
    run_nodes(*unfused, all);
    for (ValueId v : step.group.outputs) outs.push_back(all[v]);
    return outs;
  }
  give_back();
  if (step.views.empty()) {
    if (step.core.outputs == step.group.outputs) return outs;
    // A lone node's kernel makes every output it defines; a step whose leading views joined it
    // lists only those read (Silero VAD's LSTM, whose Y_c nothing reads).
    std::vector<Tensor> read;
    for (ValueId v : step.group.outputs) {
      const auto it = std::find(step.core.outputs.begin(), step.core.outputs.end(), v);
      PTO_CHECK(it != step.core.outputs.end()) << "step output not made by its core";
      read.push_back(std::move(outs.at(static_cast<size_t>(it - step.core.outputs.begin()))));
    }
    return read;
  }
  // The trailing views, on the core's outputs and the step's inputs (a Reshape's shape): lent to
  // them and given back.
  StepValues values;
  for (size_t i = 0; i < args.size(); ++i) values[step.group.inputs[i]] = std::move(args[i]);
  for (size_t o = 0; o < outs.size(); ++o) values[step.core.outputs[o]] = std::move(outs[o]);
  run_nodes(step.views, values);
  for (size_t i = 0; i < args.size(); ++i) args[i] = std::move(values.at(step.group.inputs[i]));
  outs.clear();
  for (ValueId v : step.group.outputs) outs.push_back(std::move(values.at(v)));
  return outs;
}

// What a profile says of this model for these input shapes (include/pto/profiler.h).
profiler::ModelInfo model_info(Executable::Plan& p, const Graph& g, const std::vector<Dims>& shapes,
                               const profiler::Options& o) {
  const Graph typed = all_static(g) ? Graph() : with_input_shapes(g, shapes);
  const Graph& types = all_static(g) ? g : typed;
  profiler::ModelInfo m;
  m.name = g.name;
  auto dims_of = [&](ValueId v) {
    Dims d;
    const auto& shape = types.value(v).type.shape;
    if (shape)
      for (const Dim& x : *shape) d.push_back(x.is_known() ? x.value : -1);
    return d;
  };
  for (size_t s = 0; s < p.steps.size(); ++s) {
    const Executable::Plan::Step& step = p.steps[s];
    profiler::KernelInfo k;
    k.name = kernel_label(g, step.group);
    for (int32_t n : step.info.nodes) k.sources.push_back(g.nodes()[n].name);
    k.backend = step.info.backend;
    std::vector<Dims> input_dims;
    for (ValueId v : step.group.inputs) input_dims.push_back(v == kNoValue ? Dims{} : dims_of(v));
    k.algorithm = step.kernel->algorithm(input_dims);
    const KernelCost c = kernel_cost(g, step.group, &types);
    k.flops = c.flops;
    k.flops_known = c.known;
    if (o.record_shapes) {
      for (ValueId v : step.group.inputs) k.input_shapes.push_back(dims_of(v));
      for (ValueId v : step.group.outputs) k.output_shapes.push_back(dims_of(v));
    }
    for (ValueId v : step.group.inputs) {
      const int32_t producer = v == kNoValue ? -1 : g.value(v).producer;
      if (producer < 0) continue;
      std::vector<int32_t>& to = m.kernels.at(p.step_of_node[producer]).consumers;
      if (p.step_of_node[producer] != s &&
          std::find(to.begin(), to.end(), static_cast<int32_t>(s)) == to.end())
        to.push_back(static_cast<int32_t>(s));
    }
    m.kernels.push_back(std::move(k));
  }
  if (o.profile_memory) {
    const std::shared_ptr<const MemoryPlan> mp = memory_plan_for(p, g, shapes);
    m.memory_planned = p.plan_memory;
    m.peak_bytes = p.plan_memory ? mp->arena_bytes : mp->unplanned_bytes;
    m.live_peak_bytes = mp->live_peak_bytes;
    for (size_t stage = 0; stage + 1 < mp->stage_begin.size(); ++stage)
      for (size_t s = mp->stage_begin[stage]; s < mp->stage_begin[stage + 1]; ++s) {
        profiler::KernelInfo& k = m.kernels[s];
        for (const MemoryPlan::Slot& slot : mp->step_slots[s]) k.alloc_bytes += slot.bytes;
        k.live_bytes = mp->stage_live_bytes[stage];
        k.arena_top = p.plan_memory ? mp->stage_arena_top[stage] : 0;
      }
  }
  return m;
}

}  // namespace

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs) const {
  return run(inputs, {});
}

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs,
                                    const reference::NodeObserver& observer) const {
  return run_impl(inputs, observer, {});
}

std::vector<Tensor> Executable::run_observing_values(const std::vector<Tensor>& inputs,
                                                     const ValueObserver& observer) const {
  return run_impl(inputs, {}, observer);
}

std::vector<Tensor> Executable::run_into(const std::vector<Tensor>& inputs,
                                         const std::vector<Tensor>& outputs) const {
  return run_impl(inputs, {}, {}, outputs);
}

namespace {

// The bytes of a value of this type, 0 when its shape is not static.
size_t static_bytes(const TensorType& t) {
  if (!t.shape || !is_static(*t.shape)) return 0;
  return static_cast<size_t>(checked_numel(to_dims(*t.shape))) * dtype_size(t.dtype);
}

// Whether t can be written into d as it is: same dtype and shape, d a contiguous tensor.
bool fits(const Tensor& t, const Tensor& d) {
  return d.defined() && d.is_tensor() && t.is_tensor() && d.is_contiguous() &&
         t.dtype() == d.dtype() && t.shape() == d.shape();
}

// The run's outputs with their destinations (run_into): an output its kernel wrote into its
// destination becomes the caller's tensor itself, one that fits is copied in, the rest stay as
// they are. An output that merely lies in a destination (a view, or the buffer another output's
// kernel took) is the destination where it matches it exactly, else a copy: the memory is the
// caller's, and the tensor the kernel made does not keep it alive.
void settle_destinations(std::vector<Tensor>& out, const std::vector<Tensor>& dests) {
  auto in_dest = [&](const Tensor& t) -> const Tensor* {
    if (!t.is_tensor() || !t.defined()) return nullptr;
    const auto* data = static_cast<const std::byte*>(t.raw_data());
    for (const Tensor& d : dests)
      if (d.defined() && d.is_tensor() && d.nbytes() > 0 &&
          data >= static_cast<const std::byte*>(d.raw_data()) &&
          data < static_cast<const std::byte*>(d.raw_data()) + d.nbytes())
        return &d;
    return nullptr;
  };
  for (Tensor& t : out)
    if (const Tensor* d = in_dest(t))
      t = t.raw_data() == d->raw_data() && fits(t, *d) && t.is_contiguous() ? *d : t.clone();
  for (size_t k = 0; k < dests.size(); ++k) {
    const Tensor& d = dests[k];
    if (!fits(out[k], d) || out[k].raw_data() == d.raw_data()) continue;
    for (Tensor& other : out)  // another output that is d: it keeps the value it has
      if (&other != &out[k] && other.defined() && other.is_tensor() &&
          other.raw_data() == d.raw_data())
        other = other.clone();
    const Tensor c = out[k].contiguous();
    std::memcpy(d.raw_data(), c.raw_data(), d.nbytes());
    out[k] = d;
  }
}

}  // namespace

std::vector<Tensor> Executable::run_impl(const std::vector<Tensor>& inputs,
                                         const reference::NodeObserver& observer,
                                         const ValueObserver& value_observer,
                                         const std::vector<Tensor>& destinations) const {
  if (graph_->source.empty()) return run_steps(inputs, observer, value_observer, destinations);
  try {
    return run_steps(inputs, observer, value_observer, destinations);
  } catch (const Error&) {
    rethrow_with(graph_->source + ": ");
  }
}

std::vector<Tensor> Executable::run_steps(const std::vector<Tensor>& inputs,
                                          const reference::NodeObserver& observer,
                                          const ValueObserver& value_observer,
                                          const std::vector<Tensor>& destinations) const {
  const Graph& g = *graph_;
  Plan& p = *plan_;
  if (inputs.size() != g.inputs().size())
    throw ValueError(
        cat("graph '", g.name, "' takes ", g.inputs().size(), " input(s), got ", inputs.size()));
  if (!destinations.empty() && destinations.size() != g.outputs().size())
    throw ValueError(cat("graph '", g.name, "' has ", g.outputs().size(), " output(s), got ",
                         destinations.size(), " destination(s)"));
  reference::check_inputs(g, inputs);
  check_symbol_ranges(g, inputs);

  // The memory plan of these shapes and an arena for it. An observer may keep any value, so a
  // run with one allocates every value on its own.
  // The plan also says which steps run at the same time; without memory_optimization only that.
  std::shared_ptr<const MemoryPlan> mp;
  std::shared_ptr<std::byte[]> arena;
  auto input_shapes = [&] {  // the key of the memory plan: none for static shapes
    std::vector<Dims> shapes;
    if (!all_static(g))
      for (const Tensor& t : inputs) shapes.push_back(t.shape());
    return shapes;
  };
  if (!observer && !value_observer && (p.plan_memory || !p.stage_of.empty()))
    mp = memory_plan_of(p, g, inputs);
  profiler::CallRecorder profile;  // records only while a profiler session is on
  if (profiler::Session* session = profiler::active()) [[unlikely]] {
    const std::vector<Dims> shapes = input_shapes();
    profile.begin(session, p.id, shapes,
                  [&](const profiler::Options& o) { return model_info(p, g, shapes, o); });
  }
  std::vector<Tensor> env;
  // The size of this run's arena, read with it: another thread's larger plan may grow
  // p.arena_size while this run holds a smaller one.
  size_t arena_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    if (mp && p.plan_memory) {
      if (!p.free_arenas.empty()) {
        arena = std::move(p.free_arenas.back());
        p.free_arenas.pop_back();
      } else if (p.arena_size > 0) {
        arena = std::shared_ptr<std::byte[]>(
            static_cast<std::byte*>(p.pool->allocate(p.arena_size)),
            [pool = p.pool, n = p.arena_size](std::byte* b) { pool->deallocate(b, n); });
      }
      if (arena) arena_bytes = p.arena_size;  // every free arena is of the current size
    }
    if (!p.free_envs.empty()) {
      env = std::move(p.free_envs.back());
      p.free_envs.pop_back();
    }
    if (p.constant.empty()) {
      p.constant.resize(g.values().size());
      for (size_t v = 0; v < g.values().size(); ++v)
        p.constant[v] =
            g.initializer(static_cast<ValueId>(v)) || p.released.count(static_cast<ValueId>(v));
      for (ValueId v : g.inputs()) p.constant[v] = false;
      for (size_t v = 0; v < g.values().size(); ++v)
        if (const Tensor* t = p.constant[v] ? g.initializer(static_cast<ValueId>(v)) : nullptr;
            t && t->storage())
          p.constant_storage.push_back(t->storage().get());
      std::sort(p.constant_storage.begin(), p.constant_storage.end());
      p.input_last_read.assign(g.values().size(), -1);
      for (ValueId v : g.inputs()) p.input_last_read[v] = p.live.last_use[v];
      for (ValueId v : g.outputs()) p.input_last_read[v] = -1;
      for (ValueId v : g.outputs()) {
        const int32_t producer = g.value(p.live.root[v]).producer;
        p.output_step.push_back(producer < 0 ? -1 : static_cast<int32_t>(p.step_of_node[producer]));
        const TensorType& t = g.value(v).type;
        p.output_dims.push_back(
            t.shape && is_static(*t.shape) ? std::optional<Dims>(to_dims(*t.shape)) : std::nullopt);
        p.output_skip.push_back(0);
        if (p.output_step.back() < 0 || !p.output_dims.back()) continue;
        const size_t bytes = static_bytes(t);
        for (ValueId u : p.steps[static_cast<size_t>(p.output_step.back())].group.outputs) {
          if (u == p.live.root[v]) break;
          p.output_skip.back() += static_bytes(g.value(u).type) == bytes;
        }
      }
    }
  }
  const std::vector<bool>& constant = p.constant;
  const std::vector<int32_t>& input_last_read = p.input_last_read;
  env.resize(g.values().size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs()[i]] = inputs[i];
  // A value: computed in this run or passed in (a graph input with a default keeps the caller's
  // value), else a released weight's stand-in or the graph's constant. Constants are read where
  // they are, not copied into env on every run.
  auto value_of = [&](ValueId v) -> const Tensor& {
    if (env[v].defined()) return env[v];
    if (!p.released.empty())
      if (auto it = p.released.find(v); it != p.released.end()) return it->second.meta;
    const Tensor* c = g.initializer(v);
    return c ? *c : env[v];
  };

  // Step s on this thread, its outputs from the arena slots the plan gave them. Steps of a stage
  // run at once: each reads values of earlier stages only and writes its own entries of env, and
  // has its own allocator and arguments; steps run one after another share one of each.
  std::shared_ptr<StepAllocator> serial_alloc;
  std::vector<Tensor> serial_args;
  auto run_one = [&](size_t s, bool concurrently) {
    const profiler::KernelScope profile_step(profile, s);
    const Plan::Step& step = p.steps[s];
    const Node& last = g.nodes()[step.group.last_node()];
    auto new_alloc = [&] {
      return std::make_shared<StepAllocator>(arena.get(), arena_bytes, p.pool);
    };
    if (!concurrently && !serial_alloc) serial_alloc = new_alloc();
    const std::shared_ptr<StepAllocator> alloc = concurrently ? new_alloc() : serial_alloc;
    AllocatorScope scope(alloc);
    std::vector<Tensor> own_args;
    std::vector<Tensor>& args = concurrently ? own_args : serial_args;
    args.reserve(step.group.inputs.size());
    const std::vector<ValueId>& dying = p.live.release_after[s];
    for (ValueId v : step.group.inputs) {
      // A value read last by this step, once, moves from env instead of being copied (env drops
      // it after the step anyway; a graph input's entry is a copy of the caller's), and so does
      // a constant env holds (it goes back after the step). Steps that run at once may share a
      // value: they copy.
      if (!concurrently && env[v].defined() && env[v].is_contiguous() &&
          (constant[v] ||
           ((input_last_read[v] == static_cast<int32_t>(s) ||
             std::find(dying.begin(), dying.end(), v) != dying.end()) &&
            std::count(step.group.inputs.begin(), step.group.inputs.end(), v) == 1))) {
        args.push_back(std::move(env[v]));
        continue;
      }
      const Tensor& t = value_of(v);
      if (!t.defined())
        throw ValueError(cat(last.where(), ": input '", g.value(v).name, "' has no value"));
      args.push_back(t.contiguous());
    }
    std::vector<Tensor> outs;
    alloc->set_slots(arena ? &mp->step_slots[s] : nullptr);
    for (size_t o = 0; o < destinations.size(); ++o)
      if (const Tensor& d = destinations[o];
          p.output_step[o] == static_cast<int32_t>(s) && d.defined() && d.is_tensor() &&
          d.is_contiguous() && d.nbytes() > 0 && p.output_dims[o] &&
          *p.output_dims[o] == d.shape() && g.value(g.outputs()[o]).type.dtype == d.dtype())
        alloc->add_destination(d, p.output_skip[o]);
    try {
      outs = run_step(p, g, step, args);
    } catch (const std::bad_alloc&) {
      throw ValueError(cat(last.where(), ": out of memory"));
    } catch (const std::length_error& e) {
      throw ValueError(cat(last.where(), ": size too large (", e.what(), ")"));
    }
    alloc->set_slots(nullptr);
    alloc->clear_destinations();
    // The constants back into env for the next steps and runs (the first run copies them there).
    if (!concurrently)
      for (size_t i = 0; i < args.size(); ++i)
        if (constant[step.group.inputs[i]] && args[i].defined())
          env[step.group.inputs[i]] = std::move(args[i]);
    args.clear();
    PTO_CHECK(outs.size() == step.group.outputs.size())
        << last.where() << ": kernel returned " << outs.size() << " outputs, expected "
        << step.group.outputs.size();
    for (size_t o = 0; o < outs.size(); ++o) {
      const ValueId v = step.group.outputs[o];
      if (!outs[o].defined())
        throw UnsupportedError(
            cat(last.where(), ": output '", g.value(v).name, "' is not produced"));
      // In the arena but not where the plan put this value or its root: an undeclared view.
      if (arena && p.live.root[v] == v && alloc->in_arena(outs[o].raw_data())) {
        const auto* data = static_cast<const std::byte*>(outs[o].raw_data());
        bool in_own_step = false;
        for (const auto& slot : mp->step_slots[s])
          in_own_step = in_own_step || (data >= arena.get() + slot.offset &&
                                        data < arena.get() + slot.offset + slot.bytes);
        if (!in_own_step) outs[o] = outs[o].clone();
      }
      // A sequence may hold tensors of the arena (the inputs of a SequenceConstruct), whose
      // slots the plan reuses once those values die: it keeps copies instead.
      if (arena && outs[o].kind() == ValueKind::kSequence) {
        std::vector<Tensor> items = outs[o].items();
        bool copied = false;
        for (Tensor& t : items)
          if (alloc->in_arena(t.raw_data())) t = t.clone(), copied = true;
        if (copied) outs[o] = Tensor::sequence(std::move(items));
      }
      if (v == p.perturbed) outs[o] = perturbed_copy(outs[o]);
      env[v] = std::move(outs[o]);
    }
  };

  // An observer sees the nodes in plan order; one thread has nothing to share.
  const bool concurrent = mp && mp->concurrent_stages > 0 && num_threads() > 1;
  std::vector<size_t> one_by_one;
  if (!concurrent)
    for (size_t s = 0; s <= p.steps.size(); ++s) one_by_one.push_back(s);
  const std::vector<size_t>& stage_begin = concurrent ? mp->stage_begin : one_by_one;
  for (size_t i = 0; i + 1 < stage_begin.size(); ++i) {
    const size_t begin = stage_begin[i], end = stage_begin[i + 1];
    if (concurrent && end - begin > 1) {
      parallel_tasks(static_cast<int64_t>(end - begin), [&](int64_t t) {
        run_as_on_pool([&] { run_one(begin + static_cast<size_t>(t), true); });
      });
      for (size_t s = begin; s < end; ++s)
        for (ValueId v : p.live.release_after[s])
          if (!constant[v]) env[v] = Tensor();
      continue;
    }
    for (size_t s = begin; s < end; ++s) {
      run_one(s, false);
      if (observer) {
        const Node& last = g.nodes()[p.steps[s].group.last_node()];
        std::vector<Tensor> seen;
        for (ValueId v : last.outputs) seen.push_back(v == kNoValue ? Tensor() : env[v]);
        observer(last, seen);
      }
      if (value_observer)
        for (ValueId v : p.steps[s].group.outputs) value_observer(v, env[v]);
      for (ValueId v : p.live.release_after[s])
        if (!constant[v]) env[v] = Tensor();
    }
  }
  std::vector<Tensor> out;
  out.reserve(g.outputs().size());
  const std::vector<ValueId>& outputs = g.outputs();
  for (size_t o = 0; o < outputs.size(); ++o) {
    const ValueId v = outputs[o];
    const Tensor& t = value_of(v);
    if (!t.defined())
      throw ValueError(cat("graph output '", g.value(v).name, "' was never computed"));
    // env drops its values below anyway: an output moves out of it (a tensor's copy allocates
    // its shape and strides, per iteration of a Loop or Scan body), unless env keeps it (a
    // constant) or a later output is the same value. A constant, or a view of one (an Identity
    // or Reshape of an initializer), goes out as a copy: callers write into their outputs
    // (torchvision's paste_masks_in_image fills the zeros a torch.compile piece returned), and
    // the next call must not see that in the graph's constant.
    if (constant[v] ||
        (t.storage() && std::binary_search(p.constant_storage.begin(), p.constant_storage.end(),
                                           t.storage().get())))
      out.push_back(t.clone());
    else if (&t == &env[v] && std::find(outputs.begin() + static_cast<std::ptrdiff_t>(o) + 1,
                                        outputs.end(), v) == outputs.end())
      out.push_back(std::move(env[v]));
    else
      out.push_back(t);
  }
  for (size_t v = 0; v < env.size(); ++v)  // before the arena goes back
    if (!constant[v]) env[v] = Tensor();
  {
    std::lock_guard<std::mutex> lock(p.mutex);
    // Kept only at the current size (free arenas are all of p.arena_size): one taken before a
    // larger plan grew it would overflow in the next run.
    if (arena && p.keep_arenas && arena_bytes == p.arena_size &&
        (p.arena_size <= (mp ? mp->arena_bytes : 0) || p.free_arenas.size() < 4))
      p.free_arenas.push_back(std::move(arena));
    if (p.free_envs.size() < 4) p.free_envs.push_back(std::move(env));
  }
  if (!destinations.empty()) settle_destinations(out, destinations);
  return out;
}

namespace {

// Releases the weights every step that reads them holds packed (GEMM panels), so that they are
// not held twice: steps then read tensors without data in their place, and the original is
// rebuilt from the packing only if a group has to run node by node. Only where releasing frees
// memory: a weight PyPTO allocated that nothing but this graph holds (an ONNX model handed to
// compile, a weight BatchNorm folding made), never a torch parameter shared through DLPack or a
// tensor the caller's graph still holds. A weight also read elsewhere (a view beside the
// kernel, another op, a graph output, a graph input's default) stays. Called after each step
// is compiled, so a weight goes as soon as its last reader has packed it: compiling a model the
// caller handed over never holds all weights twice.
class WeightReleaser {
 public:
  WeightReleaser(const Graph& g, const KernelGraph& kg) {
    for (const KernelGroup& k : kg.kernels)
      for (ValueId v : k.inputs)
        if (g.initializer(v)) ++readers_left_[v];
    for (ValueId v : g.inputs()) readers_left_.erase(v);
    for (ValueId v : g.outputs()) readers_left_.erase(v);
  }

  void after_step(Graph& g, Executable::Plan& p, size_t s) {
    const Executable::Plan::Step& step = p.steps[s];
    const std::vector<ValueId> packed = step.kernel->packed_constants();
    for (ValueId v : step.group.inputs) {
      auto it = readers_left_.find(v);
      if (it == readers_left_.end()) continue;
      // The packing node must be its only reader in the group (an epilogue reading the same
      // weight would get the tensor without data).
      int nodes_reading = 0;
      for (int32_t n : step.group.nodes) {
        const auto& in = g.nodes()[n].inputs;
        nodes_reading += std::find(in.begin(), in.end(), v) != in.end();
      }
      const bool holds = std::find(packed.begin(), packed.end(), v) != packed.end() &&
                         nodes_reading == 1 && !reads(step.leading, v) && !reads(step.views, v);
      if (holds && --it->second > 0) continue;  // more steps to read it
      readers_left_.erase(it);
      const Tensor& t = *g.initializer(v);
      if (!holds || t.storage().use_count() != 1 || t.storage()->external()) continue;
      p.released[v] = {s, Tensor::wrap(nullptr, t.dtype(), t.shape(), {}, [] {})};
      g.release_initializer(v);
    }
  }

 private:
  static bool reads(const std::vector<Executable::Plan::NodeRun>& runs, ValueId v) {
    for (const auto& r : runs)
      if (std::find(r.group.inputs.begin(), r.group.inputs.end(), v) != r.group.inputs.end())
        return true;
    return false;
  }
  // Per weight still in question: the steps not yet compiled that read it.
  std::unordered_map<ValueId, int> readers_left_;
};

// The graph typed for the smallest inputs it takes: each symbolic dimension at the low end of its
// declared range (at least 1). None when an input's rank is not known.
std::optional<Graph> representative_types(const Graph& g) {
  if (all_static(g)) return g;
  std::vector<Dims> shapes;
  for (ValueId v : g.inputs()) {
    const TensorType& t = g.value(v).type;
    if (!t.shape) return std::nullopt;
    Dims dims;
    for (const Dim& d : *t.shape) {
      int64_t n = 1;
      if (d.is_known()) {
        n = d.value;
      } else if (d.is_symbolic()) {
        auto it = g.symbol_ranges.find(d.symbol);
        if (it != g.symbol_ranges.end()) n = std::max<int64_t>(1, it->second.min);
      }
      dims.push_back(n);
    }
    shapes.push_back(std::move(dims));
  }
  try {
    return with_input_shapes(g, shapes);
  } catch (const Error&) {  // a graph that does not take these shapes: no stages
    return std::nullopt;
  }
}

// Candidate stages for the pool's thread count, from the widest window (kStageWindows) whose
// memory plan peaks at most 10% (or 64 KiB) above the plan without stages; none when every
// window's does. Costs and the memory check use `types` (the smallest inputs); each shape's plan
// then runs together only the steps small for it (active_stages).
constexpr size_t kStageWindows[] = {16, 4, 1};
constexpr double kStageMemorySlack = 1.10;
constexpr double kStageMemoryAllowance = 64 * 1024;  // a few KiB more is never "much"

Stages choose_stages(const Graph& g, const KernelGraph& kg, const std::optional<Graph>& types) {
  std::vector<double> ns;  // estimated time of each small step, -1 for the others
  bool any = false;
  for (const KernelGroup& k : kg.kernels) {
    const KernelCost c = types ? kernel_cost(g, k, &*types) : KernelCost{0, 0, false};
    ns.push_back(is_small(c, num_threads()) ? estimated_ns(c) : -1);
    any = any || ns.back() >= 0;
  }
  if (!any) return plan_stages(g, kg, ns, 0, num_threads());
  auto arena_bytes = [&](const KernelGraph& order, const std::vector<int32_t>& stage_of) {
    std::vector<bool> in_place;
    for (const KernelGroup& k : order.kernels) in_place.push_back(may_run_in_place(g, k));
    return plan_memory(*types, order, analyze_liveness(g, order), in_place, stage_of).arena_bytes;
  };
  const auto base = static_cast<double>(arena_bytes(kg, {}));
  const double limit = std::max(kStageMemorySlack * base, base + kStageMemoryAllowance);
  for (size_t window : kStageWindows) {
    Stages st = plan_stages(g, kg, ns, window, num_threads());
    if (st.concurrent_stages == 0) break;
    KernelGraph ordered;
    for (size_t old : st.order) ordered.kernels.push_back(kg.kernels[old]);
    const size_t bytes = arena_bytes(ordered, st.stage_of);
    if (static_cast<double>(bytes) <= limit) return st;
    log(LogLevel::kInfo, cat("stages: window ", window, " raises the memory peak to ", bytes,
                             " bytes, over ", limit, "; trying a narrower one"));
  }
  return plan_stages(g, kg, ns, 0, num_threads());
}

}  // namespace

Graph Executable::graph_with_weights() const {
  if (plan_->released.empty()) return *graph_;
  Graph g = *graph_;
  for (const auto& [v, r] : plan_->released) g.set_initializer(v, unpacked_weight(*plan_, v));
  return g;
}

namespace {

void check_level(const CompileOptions& options) {
  if (options.level < 0 || options.level > 3)
    throw ValueError(cat("compile: optimization level must be 0..3, got ", options.level));
}

// A partition given to compile_partitioned (read from a file) must cover every node of `g` once,
// name only values of `g`, and list kernels so that each reads only what earlier ones made.
void check_partition(const Graph& g, const KernelPartition& p) {
  const size_t nk = p.kernels.kernels.size();
  auto bad = [](const std::string& why) {
    throw ValueError(cat("compile: the kernel partition does not fit the graph: ", why));
  };
  if (p.leading.size() != nk || p.trailing.size() != nk) bad("view lists for another kernel count");
  const auto nv = static_cast<ValueId>(g.values().size());
  const auto nn = static_cast<int32_t>(g.nodes().size());
  std::vector<char> covered(nn, 0), defined(nv, 0);
  const ReaderIndex readers(g);
  for (ValueId v : g.inputs()) defined[v] = 1;
  for (const auto& [v, t] : g.initializers()) defined[v] = 1;
  for (size_t k = 0; k < nk; ++k) {
    const KernelGroup& group = p.kernels.kernels[k];
    if (group.nodes.empty()) bad(cat("kernel ", k, " has no nodes"));
    for (int32_t n : group.nodes) {
      if (n < 0 || n >= nn || covered[n]) bad(cat("kernel ", k, ": node ", n, " out of place"));
      covered[n] = 1;
    }
    if (group.anchor != -1 &&
        std::find(group.nodes.begin(), group.nodes.end(), group.anchor) == group.nodes.end())
      bad(cat("kernel ", k, ": its anchor is not one of its nodes"));
    for (const auto* views : {&p.leading[k], &p.trailing[k]})
      for (int32_t n : *views) {
        if (std::find(group.nodes.begin(), group.nodes.end(), n) == group.nodes.end())
          bad(cat("kernel ", k, ": view node ", n, " is not one of its nodes"));
        if (!g.nodes()[n].def || !g.nodes()[n].def->is_view())
          bad(cat("kernel ", k, ": node ", n, " joined it as a view but is none"));
      }
    // Its inputs and outputs are what its nodes make them (what liveness and the plan read).
    KernelGroup expect = group;
    finish_group(g, expect, &readers);
    KernelGroup single = group.nodes.size() == 1 ? single_node_group(g, group.nodes[0]) : expect;
    if ((group.inputs != expect.inputs || group.outputs != expect.outputs) &&
        (group.inputs != single.inputs || group.outputs != single.outputs))
      bad(cat("kernel ", k, ": its inputs or outputs are not its nodes'"));
    // Run in the order a step runs: leading views, the core, trailing views; each node may read
    // only what is defined by then.
    auto run = [&](int32_t n) {
      for (ValueId v : g.nodes()[n].inputs)
        if (v != kNoValue && !defined[v])
          bad(cat("kernel ", k, ": node ", n, " reads a value made later"));
      for (ValueId v : g.nodes()[n].outputs)
        if (v != kNoValue) defined[v] = 1;
    };
    auto in = [](const std::vector<int32_t>& list, int32_t n) {
      return std::find(list.begin(), list.end(), n) != list.end();
    };
    for (int32_t n : p.leading[k]) run(n);
    for (int32_t n : group.nodes)
      if (!in(p.leading[k], n) && !in(p.trailing[k], n)) run(n);
    for (int32_t n : p.trailing[k]) run(n);
  }
  for (int32_t n = 0; n < nn; ++n)
    if (!covered[n]) bad(cat("node ", n, " is in no kernel"));
}

}  // namespace

namespace {

Executable compile_graph(Graph g, const CompileOptions& options);

}  // namespace

Executable compile(Graph g, const CompileOptions& options) {
  if (g.source.empty()) return compile_graph(std::move(g), options);
  const std::string source = g.source;
  try {
    return compile_graph(std::move(g), options);
  } catch (const Error&) {
    rethrow_with(source + ": ");
  }
}

namespace {

Executable compile_graph(Graph g, const CompileOptions& options) {
  check_level(options);
  verify(g);
  infer_types(g);
  for (const auto& [symbol, r] : g.symbol_ranges)
    if (r.min < 0 || r.min > r.max)
      throw ValueError(
          cat("compile: symbol '", symbol, "' has an empty range [", r.min, ", ", r.max, "]"));
  const size_t nodes_in = g.nodes().size();
  PassOptions passes;
  passes.level = options.level;
  passes.auto_mixed_precision = options.auto_mixed_precision;
  passes.mixed_precision = options.mixed_precision;
  passes.matmul_precision = options.matmul_precision;
  passes.conv_precision = options.conv_precision;
  passes.dump_after = options.dump_after;
  if (options.on_progress)
    passes.after_pass = [&](const std::string& name, size_t i, size_t n, const Graph& after) {
      options.on_progress({"pass", name, i, n, &after});
    };
  std::vector<PassReport> report;
  std::string source = g.source;  // for the errors of runs; a pass may build a new graph
  g = run_passes(std::move(g), passes, &report);
  g.source = std::move(source);

  // An elementwise node may join a fused group when the tile ISA can express it.
  FusionOptions fusion;
  fusion.elementwise_fusible = [](const Graph& g, int32_t n) {
    return lower_elementwise(g, single_node_group(g, n)).has_value();
  };
  // A GEMM may take an elementwise chain as its epilogue when a backend runs that group.
  fusion.epilogue_fusible = [](const Graph& g, const KernelGroup& k) {
    return backend_for(g, k) != nullptr;
  };
  KernelGraph proposed = options.level >= 2 ? fuse_kernels(g, fusion) : single_node_kernels(g);
  // Fused groups no backend takes are split back into single nodes, in place.
  KernelPartition part;
  KernelGraph& kg = part.kernels;
  for (KernelGroup& k : proposed.kernels) {
    if (k.nodes.size() == 1 || backend_for(g, k)) {
      kg.kernels.push_back(std::move(k));
      continue;
    }
    log(LogLevel::kInfo, cat("FuseKernels: no backend runs ", k.rule, " at ",
                             g.nodes()[k.last_node()].where(), "; kept unfused"));
    for (int32_t n : k.nodes) kg.kernels.push_back(single_node_group(g, n));
  }
  part.trailing.assign(kg.kernels.size(), {});
  part.leading.assign(kg.kernels.size(), {});
  if (options.level >= 2) absorb_views(g, kg, part.trailing, part.leading);
  return compile_partitioned(std::move(g), std::move(part), options, std::move(report), nodes_in);
}

}  // namespace

Executable compile_partitioned(Graph g, KernelPartition part, const CompileOptions& options,
                               std::vector<PassReport> passes, size_t nodes_in) {
  check_level(options);
  check_partition(g, part);
  auto plan = std::make_shared<Executable::Plan>();
  plan->nodes_in = nodes_in ? nodes_in : g.nodes().size();
  plan->passes = std::move(passes);
  plan->partition = std::move(part);
  auto graph = std::make_shared<Graph>(std::move(g));
  const Graph& gr = *graph;
  KernelGraph& kg = plan->kernels;
  kg = plan->partition.kernels;
  std::vector<std::vector<int32_t>> trailing = plan->partition.trailing;
  std::vector<std::vector<int32_t>> leading = plan->partition.leading;
  pin_tiles(own_tiles(options.tiles, gr), gr, kg);  // CompileOptions::tiles onto KernelGroup::tile
  if (options.level >= 2 && options.concurrent_kernels && num_threads() > 1) {
    const Stages st = choose_stages(gr, kg, representative_types(gr));
    if (st.concurrent_stages > 0) {
      KernelGraph ordered;
      std::vector<std::vector<int32_t>> t2, l2;
      for (size_t old : st.order) {
        ordered.kernels.push_back(std::move(kg.kernels[old]));
        t2.push_back(std::move(trailing[old]));
        l2.push_back(std::move(leading[old]));
      }
      kg = std::move(ordered);
      trailing = std::move(t2);
      leading = std::move(l2);
      plan->stage_of = st.stage_of;
    }
  }

  plan->step_of_node.assign(gr.nodes().size(), 0);
  const ReaderIndex readers(gr);
  std::optional<WeightReleaser> releaser;
  if (options.release_packed_weights) releaser.emplace(gr, kg);
  const std::optional<tune::TuneCache> tune_cache = open_tune_cache(options);
  for (size_t s = 0; s < kg.kernels.size(); ++s) {
    const KernelGroup& k = kg.kernels[s];
    Executable::Plan::Step step;
    step.group = k;
    for (int32_t n : k.nodes)  // the group less its leading and trailing views
      if (std::find(leading[s].begin(), leading[s].end(), n) == leading[s].end() &&
          std::find(trailing[s].begin(), trailing[s].end(), n) == trailing[s].end())
        step.core.nodes.push_back(n);
    step.core.rule = k.rule;
    step.core.anchor = k.anchor;
    finish_group(gr, step.core, &readers);
    if (step.core.nodes.size() == 1) step.core = single_node_group(gr, step.core.nodes[0]);
    step.core.rule = k.rule;
    step.core.tile = k.tile;
    step.core.knobs = k.knobs;
    // A control-flow node runs its compiled subgraphs; "cpu" as their host (their own nodes
    // say where each runs: node_backends()).
    std::unique_ptr<ControlFlowKernel> control_flow =
        ControlFlowKernel::compile(gr, step.core, options);
    const Backend* b = control_flow ? nullptr : backend_for(gr, step.core);
    if (!control_flow && !b)
      throw UnsupportedError(cat(gr.nodes()[k.nodes[0]].where(), ": no kernel for this op"));
    bool tuned = false;
    if (control_flow) {
      step.control_flow = control_flow.get();
      step.kernel = std::move(control_flow);
    } else {
      step.kernel = compile_core(gr, step.core, *b, tune_cache, tuned);
    }
    plan->tuned_kernels += tuned;
    for (int32_t v : leading[s]) step.leading.push_back(compile_node(gr, v));
    for (int32_t v : trailing[s]) step.views.push_back(compile_node(gr, v));
    step.info = {b ? b->name() : "cpu", k.rule, k.nodes, k.inputs, k.outputs};
    for (int32_t n : k.nodes) plan->step_of_node[n] = s;
    plan->steps.push_back(std::move(step));
    if (releaser) releaser->after_step(*graph, *plan, s);
    if (options.on_progress)
      options.on_progress({"kernel", k.rule.empty() ? gr.nodes()[k.nodes[0]].op : k.rule, s + 1,
                           kg.kernels.size(), nullptr});
  }
  plan->live = analyze_liveness(gr, kg);
  for (const KernelGroup& k : kg.kernels) plan->in_place.push_back(may_run_in_place(gr, k));
  plan->plan_memory = options.level >= 2 && options.memory_optimization;
  if (const char* name = std::getenv("PTO_TEST_PERTURB_VALUE"); name && *name) {
    for (size_t v = 0; v < gr.values().size(); ++v)
      if (gr.values()[v].name == name) plan->perturbed = static_cast<ValueId>(v);
    if (plan->perturbed == kNoValue)
      throw ValueError(cat("PTO_TEST_PERTURB_VALUE: the compiled graph has no value '", name, "'"));
    bool written = false;
    for (const auto& step : plan->steps)
      for (ValueId v : step.group.outputs) written = written || v == plan->perturbed;
    if (!written)
      throw ValueError(cat("PTO_TEST_PERTURB_VALUE: value '", name,
                           "' is computed inside a fused kernel, not written by one"));
  }
  return Executable(std::move(graph), options, std::move(plan));
}

}  // namespace pto
