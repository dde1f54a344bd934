// compile() and Executable::run(). For now the plan is trivial: the verified, typed graph runs on
// the reference kernels, op by op. Issue 4's CPU backend replaces the body of run(), and graph
// passes (levels 1..3) slot in before it; the checks at the boundary stay as they are.
#include "pto/executable.h"

#include <unordered_map>

#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {

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

}  // namespace

Executable::Executable(std::shared_ptr<const Graph> g, CompileOptions options)
    : graph_(std::move(g)), options_(options) {}

Executable::~Executable() = default;

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs) const {
  return run(inputs, {});
}

std::vector<Tensor> Executable::run(const std::vector<Tensor>& inputs,
                                    const reference::NodeObserver& observer) const {
  const Graph& g = *graph_;
  if (inputs.size() != g.inputs().size())
    throw ValueError(
        cat("graph '", g.name, "' takes ", g.inputs().size(), " input(s), got ", inputs.size()));
  check_symbol_ranges(g, inputs);
  return reference::run(g, inputs, observer);
}

Executable compile(Graph g, const CompileOptions& options) {
  if (options.level < 0 || options.level > 3)
    throw ValueError(cat("compile: optimization level must be 0..3, got ", options.level));
  if (options.auto_mixed_precision)
    throw UnsupportedError("compile: auto_mixed_precision is not implemented yet");
  verify(g);
  for (const Node& n : g.nodes())
    if (reference::KernelRegistry::global().find(n.op) == nullptr)
      throw UnsupportedError(cat(n.where(), ": no kernel for this op"));
  infer_types(g);
  for (const auto& [symbol, r] : g.symbol_ranges)
    if (r.min < 0 || r.min > r.max)
      throw ValueError(
          cat("compile: symbol '", symbol, "' has an empty range [", r.min, ", ", r.max, "]"));
  return Executable(std::make_shared<const Graph>(std::move(g)), options);
}

}  // namespace pto
