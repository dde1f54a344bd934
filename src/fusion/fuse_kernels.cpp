// FuseKernels: the partition of a Tensor Graph into kernels (level 2 of DESIGN.md).
//
// Three rules, in this order, each claiming only nodes no earlier group took:
//  1. epilogue: a Conv, Gemm or MatMul takes the bias add, residual add and activation that
//     follow it along single-use values (fusion/epilogue_chain.h); it may instead take the whole
//     elementwise group that grows from its output, run as a tile-program epilogue, when that
//     takes more nodes (rules MatMul+Elementwise, Gemm+Elementwise, Conv+Elementwise);
//  2. elementwise: starting from the first unclaimed fusible elementwise node, the group grows
//     forward by the readers of its values that are fusible, have the group's output shape, and
//     keep the group convex (no path leaves the group and comes back into it), and backward by
//     such producers whose results only the group reads;
//     A group that is just Adds summing a LayerNormalization's or RMSNormalization's input
//     (fusion/sum_norm.h) is named "Add+LayerNormalization" when a backend runs it so (the norm
//     kernel computing the sum as it loads each row), else it stays "Elementwise";
//  3. casts: a norm or softmax with the Casts that widen its input from and narrow its output to
//     bf16/f16 (fusion/node_casts.h), when a backend's kernel for it takes them: what is left of
//     them after rule 2, and a group of rule 2 that is just those (the norm kernel, not a tile
//     program; rules Cast+LayerNormalization+Cast, Softmax+Cast, ...).
// Every remaining node is a kernel of its own. Kernels are ordered topologically (order_kernels),
// earliest last node first.
#include <algorithm>
#include <map>
#include <optional>

#include "fusion/epilogue_chain.h"
#include "fusion/node_casts.h"
#include "fusion/sum_norm.h"
#include "pto/kernel_graph.h"
#include "pto/log.h"
#include "pto/op_registry.h"

namespace pto {
namespace {

// Whether the node set `in` (flags by node index, spanning [lo, hi]) is convex: no node outside
// it both depends on the set and feeds it.
bool convex(const Graph& g, const std::vector<char>& in, int32_t lo, int32_t hi) {
  const auto& nodes = g.nodes();
  std::vector<char> tainted(g.values().size(), 0);  // values depending on the set from outside
  for (int32_t i = lo; i <= hi; ++i) {
    const Node& n = nodes[i];
    bool depends = false;  // reads a value that left the set and came back through outside nodes
    for (ValueId v : n.inputs) depends = depends || (v != kNoValue && tainted[v] == 1);
    if (in[i]) {
      if (depends) return false;
      for (ValueId o : n.outputs)
        if (o != kNoValue) tainted[o] = 2;  // produced inside: taints readers outside
      continue;
    }
    bool reads_set = false;
    for (ValueId v : n.inputs) reads_set = reads_set || (v != kNoValue && tainted[v]);
    if (reads_set)
      for (ValueId o : n.outputs)
        if (o != kNoValue) tainted[o] = 1;
  }
  return true;
}

bool same_output_shape(const Graph& g, const Node& n, const Shape& shape) {
  if (n.outputs.size() != 1 || n.outputs[0] == kNoValue) return false;
  const TensorType& t = g.value(n.outputs[0]).type;
  return t.shape && may_equal(*t.shape, shape);  // the kernel checks concrete shapes
}

// Whether `n` widens its input (DequantizeLinear of bytes, a Cast from a narrower type): its
// result is better recomputed from the narrow input inside each reading group than stored wide.
bool widens(const Graph& g, const Node& n) {
  if (n.op == "DequantizeLinear") return true;
  if (n.op != "Cast" || n.inputs.empty() || n.outputs.size() != 1) return false;
  const DType from = g.value(n.inputs[0]).type.dtype, to = g.value(n.outputs[0]).type.dtype;
  return from != DType::kBool && dtype_size(from) < dtype_size(to);
}

// A norm or softmax over the last axis: in a tile program it is several passes over each tile of
// rows, slower than its own kernel plus the elementwise ops around it as kernels of their own
// (one thread, rows x width, level 2 against level 1 before this rule: LayerNormalization then
// Relu 3136 x 96 382 against 166 us, 128 x 768 127 against 29; two LayerNormalizations in a row
// 707 against 279 and 255 against 39; Mul, Add, Softmax 1536 x 128 192 against 129).
bool row_op(const Node& n) {
  return n.domain.empty() && (n.op == "LayerNormalization" || n.op == "RMSNormalization" ||
                              n.op == "Softmax" || n.op == "LogSoftmax");
}

// Grows an elementwise group from `seed`; returns its nodes (sorted), or just the seed. Readers
// join forward, except widening ones (left to their readers' groups); a widening node whose one
// reader joins comes along backward, so the group reads the narrow value. A row op (above) joins
// only a group of Adds, as the end of their sum (rule "Add+LayerNormalization", the norm's own
// kernel), and then only Adds join it, backward, and a Cast of its output to bf16 or f16, which
// the norm's kernel stores (rule "Add+LayerNormalization+Cast"); a row op seeds no group.
std::vector<int32_t> grow_elementwise(const Graph& g, int32_t seed, const ReaderIndex& readers,
                                      const std::vector<int32_t>& owner,
                                      const FusionOptions& options) {
  const auto& nodes = g.nodes();
  if (row_op(nodes[seed])) return {seed};
  const Shape shape = *g.value(nodes[seed].outputs[0]).type.shape;
  std::vector<char> in(nodes.size(), 0);
  in[seed] = 1;
  int32_t hi = seed;
  std::vector<int32_t> members = {seed};
  bool only_adds = nodes[seed].op == "Add", has_row_op = false;
  int32_t lo = seed;
  // Whether r joins without the walk of convex(): a reader past the group whose inputs come from
  // the group or from before it (no path from the group reaches it through another node, and it
  // reaches no member), or a producer before the group read only by members. A chain of 32k
  // Relus walked its whole span at every join (quadratic: 11 s to compile).
  auto plainly_convex = [&](int32_t r) {
    if (r > hi) {
      for (ValueId v : nodes[r].inputs) {
        const int32_t p = v == kNoValue ? -1 : g.value(v).producer;
        if (p >= lo && !in[p]) return false;
      }
      return true;
    }
    if (r < lo) {
      for (ValueId o : nodes[r].outputs)
        if (o != kNoValue)
          for (int32_t x : readers.readers(o))
            if (!in[x]) return false;
      return true;
    }
    return false;
  };
  // Joins node r when it keeps the group convex.
  auto join = [&](int32_t r) {
    const bool plain = plainly_convex(r);
    in[r] = 1;
    if (!plain && !convex(g, in, std::min(lo, r), std::max(hi, r))) {
      in[r] = 0;
      return;
    }
    lo = std::min(lo, r);
    hi = std::max(hi, r);
    members.push_back(r);
    has_row_op = has_row_op || row_op(nodes[r]);
    only_adds = only_adds && nodes[r].op == "Add";
  };
  // After a row op: the Cast that narrows its output, that output's only reader.
  auto narrows_row_op = [&](int32_t r) {
    if (!fusion::narrows_to_half(g, nodes[r])) return false;
    const ValueId y = nodes[r].inputs[0];
    const int32_t p = g.value(y).producer;
    return p >= 0 && in[p] && row_op(nodes[p]) && !g.is_output(y) && readers.readers(y).size() == 1;
  };
  // `backward`: r produces a value the group reads (else it reads one).
  auto joinable = [&](int32_t r, bool backward) {
    if (row_op(nodes[r]) ? backward || has_row_op || !only_adds
        : has_row_op     ? (backward ? nodes[r].op != "Add" : !narrows_row_op(r))
                         : false)
      return false;
    return !in[r] && owner[r] < 0 && options.elementwise_fusible(g, r) &&
           same_output_shape(g, nodes[r], shape);
  };
  for (size_t k = 0; k < members.size(); ++k) {
    const Node& m = nodes[members[k]];
    for (ValueId v : m.inputs) {  // a widening producer read only here
      if (v == kNoValue) continue;
      const int32_t p = g.value(v).producer;
      if (p >= 0 && joinable(p, true) && widens(g, nodes[p]) && g.value(v).type.shape &&
          readers.readers(v).size() == 1 && !g.is_output(v))
        join(p);
    }
    for (ValueId o : m.outputs) {
      if (o == kNoValue) continue;
      for (int32_t r : readers.readers(o))
        if (joinable(r, false) && !widens(g, nodes[r])) join(r);
    }
    // Backward: a producer of the group's shape whose every result is read inside the group
    // only (a sibling branch of the seed: an LSTM's other gate, a mask's Mul) joins, so its
    // result never leaves the kernel; a later seed would otherwise find its readers taken and
    // stay a kernel of its own.
    if (k + 1 == members.size())
      for (size_t b = 0; b < members.size(); ++b)
        for (ValueId v : nodes[members[b]].inputs) {
          const int32_t p = v == kNoValue ? -1 : g.value(v).producer;
          if (p < 0 || !joinable(p, true) || widens(g, nodes[p])) continue;
          bool inside = true;
          for (ValueId o : nodes[p].outputs)
            if (o != kNoValue) {
              inside = inside && !g.is_output(o);
              for (int32_t r : readers.readers(o)) inside = inside && in[r];
            }
          if (inside) join(p);
        }
  }
  std::sort(members.begin(), members.end());
  return members;
}

// A MatMul, Gemm or Conv (float32, 1-D or 2-D) with the elementwise group that grows from its
// output's one reader, when that group has one output of the product's shape and the product is
// read nowhere else: the chain becomes the GEMM's or conv's epilogue (a tile program).
std::optional<KernelGroup> tile_epilogue(const Graph& g, int32_t anchor, const ReaderIndex& readers,
                                         const std::vector<int32_t>& owner,
                                         const FusionOptions& options) {
  const Node& a = g.nodes()[anchor];
  const bool conv = a.op == "Conv";
  if (!options.epilogue_fusible || !options.elementwise_fusible ||
      (a.op != "MatMul" && a.op != "Gemm" && a.op != "DynamicQuantizeMatMul" && !conv) ||
      (conv && !a.domain.empty()) || a.outputs.size() != 1)
    return std::nullopt;
  const ValueId product = a.outputs[0];
  const TensorType& t = g.value(product).type;
  if (!t.shape || t.shape->size() < 2) return std::nullopt;
  if (conv && (t.dtype != DType::kF32 || (t.shape->size() != 3 && t.shape->size() != 4)))
    return std::nullopt;
  const int32_t reader = readers.single_reader(product);
  if (reader < 0 || owner[reader] >= 0 || !options.elementwise_fusible(g, reader) ||
      !same_output_shape(g, g.nodes()[reader], *t.shape))
    return std::nullopt;
  KernelGroup k;
  k.nodes = grow_elementwise(g, reader, readers, owner, options);
  k.nodes.insert(k.nodes.begin(), anchor);
  k.anchor = anchor;
  k.rule = a.op + "+Elementwise";
  finish_group(g, k, &readers);
  if (k.outputs.size() != 1 || !options.epilogue_fusible(g, k)) return std::nullopt;
  return k;
}

// Node `n` with the Casts around it as one group (rule 3), when a backend runs it and every node
// of it is free or, when `only` is given, the group is exactly `only`.
std::optional<KernelGroup> casts_group(const Graph& g, int32_t n, const ReaderIndex& readers,
                                       const std::vector<int32_t>& owner,
                                       const FusionOptions& options,
                                       const std::vector<int32_t>* only = nullptr) {
  if (!options.epilogue_fusible) return std::nullopt;
  auto casts = fusion::match_casts(g, n, readers);
  if (!casts) return std::nullopt;
  KernelGroup k;
  k.nodes = casts->nodes();
  if (only ? k.nodes != *only
           : std::any_of(k.nodes.begin(), k.nodes.end(), [&](int32_t m) { return owner[m] >= 0; }))
    return std::nullopt;
  k.anchor = n;
  k.rule = casts->rule(g);
  finish_group(g, k, &readers);
  if (!options.epilogue_fusible(g, k)) return std::nullopt;
  return k;
}

}  // namespace

KernelGraph fuse_kernels(const Graph& g, const FusionOptions& options) {
  const auto& nodes = g.nodes();
  const ReaderIndex readers(g);
  std::vector<int32_t> owner(nodes.size(), -1);
  std::vector<KernelGroup> groups;
  std::map<std::string, int> fired;

  for (size_t i = 0; i < nodes.size(); ++i) {
    if (owner[i] >= 0) continue;
    auto chain = fusion::match_epilogue(g, static_cast<int32_t>(i), readers);
    std::optional<KernelGroup> tile =
        tile_epilogue(g, static_cast<int32_t>(i), readers, owner, options);
    if (!chain && !tile) continue;
    // The bias/residual/activation epilogue is the faster one; the general one when it takes more.
    if (tile && (!chain || tile->nodes.size() > chain->nodes.size())) {
      for (int32_t n : tile->nodes) owner[n] = static_cast<int32_t>(groups.size());
      ++fired[tile->rule];
      groups.push_back(std::move(*tile));
      continue;
    }
    bool free = true;
    for (int32_t n : chain->nodes) free = free && owner[n] < 0;
    if (!free) continue;
    KernelGroup k;
    k.nodes = chain->nodes;
    std::sort(k.nodes.begin(), k.nodes.end());
    k.rule = chain->rule(g);
    k.anchor = static_cast<int32_t>(i);
    for (int32_t n : k.nodes) owner[n] = static_cast<int32_t>(groups.size());
    ++fired[k.rule];
    groups.push_back(std::move(k));
  }

  if (options.elementwise_fusible) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const auto seed = static_cast<int32_t>(i);
      if (owner[i] >= 0 || !options.elementwise_fusible(g, seed)) continue;
      const Node& n = nodes[i];
      if (n.outputs.size() != 1 || n.outputs[0] == kNoValue || !g.value(n.outputs[0]).type.shape)
        continue;
      std::vector<int32_t> members = grow_elementwise(g, seed, readers, owner, options);
      if (members.size() < 2) continue;
      std::optional<KernelGroup> casts;
      for (int32_t m : members)
        if (!casts) casts = casts_group(g, m, readers, owner, options, &members);
      KernelGroup k;
      if (casts) {
        k = std::move(*casts);
      } else {
        k.nodes = std::move(members);
        k.rule = "Elementwise";
        if (auto sum =
                options.epilogue_fusible ? fusion::sum_norm_of_group(g, k.nodes) : std::nullopt) {
          KernelGroup named = k;
          named.rule = sum->rule(g);
          finish_group(g, named, &readers);
          if (options.epilogue_fusible(g, named)) k.rule = named.rule;
        }
      }
      for (int32_t m : k.nodes) owner[m] = static_cast<int32_t>(groups.size());
      ++fired[k.rule];
      groups.push_back(std::move(k));
    }
  }

  for (size_t i = 0; i < nodes.size(); ++i) {
    if (owner[i] >= 0) continue;
    auto k = casts_group(g, static_cast<int32_t>(i), readers, owner, options);
    if (!k) continue;
    for (int32_t m : k->nodes) owner[m] = static_cast<int32_t>(groups.size());
    ++fired[k->rule];
    groups.push_back(std::move(*k));
  }

  for (size_t i = 0; i < nodes.size(); ++i) {
    if (owner[i] >= 0) continue;
    owner[i] = static_cast<int32_t>(groups.size());
    groups.push_back(single_node_group(g, static_cast<int32_t>(i)));
  }
  KernelGraph kg;
  for (KernelGroup& k : groups) {
    if (k.nodes.size() > 1) finish_group(g, k, &readers);
    kg.kernels.push_back(std::move(k));
  }
  // Convex groups can still depend on each other in a cycle (through a third group); then the
  // elementwise groups go back to single nodes, which always orders.
  if (!order_kernels(g, kg)) {
    KernelGraph split;
    for (KernelGroup& k : kg.kernels) {
      if (k.rule != "Elementwise" && !fusion::is_sum_norm_rule(k.rule)) {
        split.kernels.push_back(std::move(k));
        continue;
      }
      --fired[k.rule];
      for (int32_t n : k.nodes) split.kernels.push_back(single_node_group(g, n));
    }
    kg = std::move(split);
    PTO_CHECK(order_kernels(g, kg)) << "FuseKernels: epilogue groups depend on each other";
  }
  if (log_enabled(LogLevel::kInfo)) {
    std::string s;
    for (const auto& [rule, count] : fired) s += cat(" ", rule, " x", count);
    log(LogLevel::kInfo, cat("FuseKernels: ", nodes.size(), " nodes -> ", kg.kernels.size(),
                             " kernels", s.empty() ? "" : ";", s));
  }
  return kg;
}

}  // namespace pto
