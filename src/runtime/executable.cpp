// compile() and Executable::run(). The plan picks a kernel per node: the CPU backend's when it has
// one that accepts the node's types and attributes, else the reference interpreter's. run() checks
// the inputs at the boundary, then executes the nodes in order with every allocation served by the
// Executable's memory pool, releasing each intermediate after its last reader.
#include "pto/executable.h"

#include <any>
#include <unordered_map>

#include "backend/cpu/kernel.h"
#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {

struct Executable::Plan {
  struct Step {
    const cpu::Kernel* cpu = nullptr;              // the backend kernel, or
    const reference::Kernel* reference = nullptr;  // the fallback
    std::any state;                                // what cpu->prepare returned
    std::string backend;                           // "cpu" | "reference"
  };
  std::vector<Step> steps;                       // one per node
  std::vector<std::vector<ValueId>> dead_after;  // values to release after node i
  std::shared_ptr<MemoryPool> pool = std::make_shared<MemoryPool>(kAllocHugeFirst);
};

namespace {

// Every input's symbolic dimensions must lie in the range the frontend declared.
void check_symbol_ranges(const Graph& g, const std::vector<Tensor>& inputs) {
  if (g.symbol_ranges.empty()) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Value& v = g.value(g.inputs()[i]);
    if (!v.type.shape || !inputs[i].defined()) continue;
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

cpu::NodeInfo node_info(const Graph& g, const Node& n) {
  cpu::NodeInfo info{n, {}, {}, {}};
  for (ValueId v : n.inputs) {
    info.inputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
    info.constants.push_back(v == kNoValue ? nullptr : g.initializer(v));
  }
  for (ValueId v : n.outputs)
    info.outputs.push_back(v == kNoValue ? TensorType{} : g.value(v).type);
  return info;
}

std::shared_ptr<Executable::Plan> make_plan(const Graph& g) {
  auto plan = std::make_shared<Executable::Plan>();
  const auto& nodes = g.nodes();
  for (const Node& n : nodes) {
    Executable::Plan::Step step;
    if (const cpu::Kernel* k = cpu::KernelRegistry::global().find(n.op)) {
      cpu::NodeInfo info = node_info(g, n);
      if (!k->accepts || k->accepts(info)) {
        step.cpu = k;
        step.backend = "cpu";
        if (k->prepare) step.state = k->prepare(info);
      }
    }
    if (!step.cpu) {
      step.reference = reference::KernelRegistry::global().find(n.op);
      if (!step.reference) throw UnsupportedError(cat(n.where(), ": no kernel for this op"));
      step.backend = "reference";
    }
    plan->steps.push_back(std::move(step));
  }
  // Release each intermediate after its last reader; graph outputs and initializers never.
  std::vector<int64_t> last_use(g.values().size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (ValueId v : nodes[i].inputs)
      if (v != kNoValue) last_use[v] = static_cast<int64_t>(i);
  for (ValueId v : g.outputs()) last_use[v] = -1;
  for (const auto& [v, t] : g.initializers()) last_use[v] = -1;
  plan->dead_after.resize(nodes.size());
  for (size_t v = 0; v < last_use.size(); ++v)
    if (last_use[v] >= 0) plan->dead_after[last_use[v]].push_back(static_cast<ValueId>(v));
  return plan;
}

}  // namespace

Executable::Executable(std::shared_ptr<const Graph> g, CompileOptions options,
                       std::shared_ptr<Plan> plan)
    : graph_(std::move(g)), options_(options), plan_(std::move(plan)) {}

Executable::~Executable() = default;

const std::string& Executable::node_backend(size_t i) const {
  PTO_CHECK(i < plan_->steps.size()) << "node_backend: node " << i << " out of range";
  return plan_->steps[i].backend;
}

MemoryPoolStats Executable::memory_stats() const {
  return plan_->pool->stats();
}

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs) const {
  return run(inputs, {});
}

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs,
                                    const reference::NodeObserver& observer) const {
  const Graph& g = *graph_;
  if (inputs.size() != g.inputs().size())
    throw ValueError(
        cat("graph '", g.name, "' takes ", g.inputs().size(), " input(s), got ", inputs.size()));
  reference::check_inputs(g, inputs);
  check_symbol_ranges(g, inputs);

  AllocatorScope scope(plan_->pool);
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < inputs.size(); ++i) env[g.inputs()[i]] = inputs[i];
  for (const auto& [v, t] : g.initializers())
    if (!env[v].defined()) env[v] = t;  // a graph input with a default keeps the caller's value

  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    const Plan::Step& step = plan_->steps[i];
    cpu::KernelContext ctx{{n, {}, n.outputs.size()}, &step.state};
    reference::run_node(
        g, ctx, env, [&] { return step.cpu ? step.cpu->run(ctx) : (*step.reference)(ctx); },
        observer);
    for (ValueId v : plan_->dead_after[i]) env[v] = Tensor();
  }
  std::vector<Tensor> out;
  for (ValueId v : g.outputs()) {
    if (!env[v].defined())
      throw ValueError(cat("graph output '", g.value(v).name, "' was never computed"));
    out.push_back(env[v]);
  }
  return out;
}

Executable compile(Graph g, const CompileOptions& options) {
  if (options.level < 0 || options.level > 3)
    throw ValueError(cat("compile: optimization level must be 0..3, got ", options.level));
  if (options.auto_mixed_precision)
    throw UnsupportedError("compile: auto_mixed_precision is not implemented yet");
  verify(g);
  infer_types(g);
  for (const auto& [symbol, r] : g.symbol_ranges)
    if (r.min < 0 || r.min > r.max)
      throw ValueError(
          cat("compile: symbol '", symbol, "' has an empty range [", r.min, ", ", r.max, "]"));
  auto graph = std::make_shared<const Graph>(std::move(g));
  auto plan = make_plan(*graph);
  return Executable(std::move(graph), options, std::move(plan));
}

}  // namespace pto
