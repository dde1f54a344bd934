// plan_stages: list scheduling that keeps the plan's order where it can.
//
// Dependencies come from data: step j depends on step i when j reads a value a node of i produces
// (a view a step absorbed is a node of that step, so reading through it is reading the step).
// Values are written once, so there is no other hazard between steps; what two steps of a stage
// could still share is memory, which the memory plan rules out by taking the stage as one point
// in time. The first unplaced step of the old order is always ready (its producers come before
// it); it opens the next stage, and when it is small each later small step within `window` whose
// producers are all placed joins it if that raises the stage's estimated gain (stage_gain: steps
// of very different lengths gain nothing together). No step of a stage reads another's output: a
// joining step's producers are all in earlier stages, and a member never reads a step not yet
// placed.
#include "runtime/stages.h"

#include <algorithm>

#include "pto/op_registry.h"

namespace pto {
namespace {

// Elements of a value, or -1 when its shape is not known.
double elements(const Graph& g, ValueId v) {
  const TensorType& t = g.value(v).type;
  if (!t.shape) return -1;
  double n = 1;
  for (const Dim& d : *t.shape) {
    if (!d.is_known()) return -1;
    n *= static_cast<double>(d.value);
  }
  return n;
}

double dim(const Graph& g, ValueId v, int64_t i) {
  const TensorType& t = g.value(v).type;
  if (!t.shape) return -1;
  const auto rank = static_cast<int64_t>(t.shape->size());
  if (i < 0) i += rank;
  if (i < 0 || i >= rank || !(*t.shape)[i].is_known()) return -1;
  return static_cast<double>((*t.shape)[i].value);
}

// Attention: Q K^T and P V, both counted in full (a causal mask skips about half of the work,
// as the peers' counters also ignore); the softmax's exponentials are not FLOPs here. Q is
// [B, Hq, Sq, D] or [B, Sq, Hq * D] and Y likewise with Dv, so Q and Y's elements times the key
// length, which a cache (past_key, input 4) makes longer, are the two products' multiply-adds.
double attention_flops(const Graph& g, const Node& n) {
  const auto in = [&](size_t i) { return i < n.inputs.size() ? n.inputs[i] : kNoValue; };
  if (in(0) == kNoValue || in(1) == kNoValue || n.outputs.empty() || n.outputs[0] == kNoValue)
    return -1;
  const TensorType& k = g.value(in(1)).type;
  if (!k.shape) return -1;
  const int64_t seq_axis = k.shape->size() == 4 ? 2 : 1;
  double keys = dim(g, in(1), seq_axis);
  if (in(4) != kNoValue) keys += dim(g, in(4), 2);
  const double q = elements(g, in(0)), y = elements(g, n.outputs[0]);
  if (keys < 0 || q < 0 || y < 0) return -1;
  return 2 * (q + y) * keys;
}

// DwPwConvBlocked: the depthwise window over the real channels, then a 1x1 conv over them for
// every output lane (padded lanes included, as ConvBlocked counts its output).
double dw_pw_conv_flops(const Graph& g, const Node& n) {
  if (n.inputs.size() < 5 || n.outputs.empty() || n.outputs[0] == kNoValue) return -1;
  const ValueId y = n.outputs[0];
  const double out = elements(g, y), ocb = dim(g, y, 1), lanes = dim(g, y, 4);
  const auto channels = static_cast<double>(n.attr_int("channels"));
  if (out < 0 || ocb <= 0 || lanes <= 0) return -1;
  double window = 1;
  for (int64_t extent : n.attr_ints("kernel_shape")) window *= static_cast<double>(extent);
  const double pixels = out / (ocb * lanes);
  double expand = 0;  // the 1x1 expansion (inputs We, Be): every expanded lane of every input pixel
  if (n.inputs.size() >= 7 && n.inputs[5] != kNoValue) {
    const double in = elements(g, n.inputs[0]), in_lanes = dim(g, n.inputs[0], 1) * lanes;
    const double out_lanes = dim(g, n.inputs[5], 0) * lanes;
    const auto in_channels = static_cast<double>(n.attr_int("expand_channels"));
    if (in < 0 || in_lanes <= 0 || out_lanes <= 0) return -1;
    expand = 2 * (in / in_lanes) * in_channels * out_lanes;
  }
  return expand + 2 * pixels * channels * window + 2 * out * channels;
}

// FLOPs of one node, 0 for the ops whose cost is their memory traffic, -1 when not known. The
// contractions are named here because a FLOP count is op-specific and OpDef has no hook for it;
// any other kOpaque op but the pools (recurrences, ...) counts as unknown, so it never joins a
// stage.
double node_flops(const Graph& g, const Node& n) {  // g: the value types
  if (!n.def || !n.def->has(kOpaque)) return 0;
  const std::string& op = n.op;
  if (op.find("Pool") != std::string::npos) return 0;
  if (op == "Attention") return attention_flops(g, n);
  if (op == "DwPwConvBlocked") return dw_pw_conv_flops(g, n);
  if (op == "QLinearMatMul" && n.inputs.size() >= 4 && n.inputs[0] != kNoValue &&
      n.inputs[3] != kNoValue && !n.outputs.empty()) {  // (a, a_scale, a_zp, b, ...): int8 ops
    const double out = elements(g, n.outputs[0]), k = dim(g, n.inputs[0], -1);
    return out < 0 || k < 0 ? -1 : 2 * out * k;
  }
  if (n.inputs.size() < 2 || n.outputs.empty() || n.inputs[0] == kNoValue ||
      n.inputs[1] == kNoValue || n.outputs[0] == kNoValue)
    return -1;
  const ValueId a = n.inputs[0], b = n.inputs[1], y = n.outputs[0];
  const double out = elements(g, y), w = elements(g, b);
  double k = -1;
  if (op == "MatMul" || op == "MatMulInteger" || op == "DynamicQuantizeMatMul") {  // int8 too
    k = dim(g, a, -1);
  } else if (op == "Gemm") {
    k = dim(g, a, n.attr_int("transA") ? 0 : 1);
  } else if (op == "Conv" || op == "ConvInteger") {  // weight [M, C/group, kh, kw]: C/group*kh*kw
    k = w / dim(g, b, 0);
  } else if (op == "ConvBlocked") {  // the real input channels, not a block's padded lanes
    k = static_cast<double>(n.attr_int("channels")) / std::max<int64_t>(1, n.attr_int("group"));
    for (int64_t extent : n.attr_ints("kernel_shape")) k *= static_cast<double>(extent);
  } else if (op == "ConvTranspose") {  // each input element meets M/group*kh*kw weights
    const double in = elements(g, a);
    return in < 0 || w < 0 ? -1 : 2 * in * w / dim(g, b, 0);
  }
  if (out < 0 || w < 0 || k < 0) return -1;
  return 2 * out * k;
}

}  // namespace

KernelCost kernel_cost(const Graph& graph, const KernelGroup& k, const Graph* types) {
  const Graph& g = types ? *types : graph;
  KernelCost c;
  for (const auto* values : {&k.inputs, &k.outputs})
    for (ValueId v : *values) {
      if (v == kNoValue) continue;
      const double n = elements(g, v);
      const DType t = g.value(v).type.dtype;
      if (n < 0 || t == DType::kUndefined) {
        c.known = false;
        continue;
      }
      c.bytes += n * static_cast<double>(dtype_size(t));
    }
  for (int32_t i : k.nodes) {
    const double f = node_flops(g, graph.nodes()[i]);
    if (f < 0) c.known = false;
    c.flops += std::max(f, 0.0);
  }
  return c;
}

bool is_small(const KernelCost& c, int threads) {
  return c.known && c.flops < threads * kStageFlopsPerThread &&
         c.bytes < threads * kStageBytesPerThread;
}

double estimated_ns(const KernelCost& c) {
  return c.flops / kStageFlopsPerNs + c.bytes / kStageBytesPerNs;
}

double stage_gain(const std::vector<double>& ns, int threads) {
  if (ns.size() < 2) return 0;
  double sum = 0, longest = 0;
  for (double t : ns) {
    sum += t;
    longest = std::max(longest, t);
  }
  const double apart = sum / threads + static_cast<double>(ns.size()) * kStageRegionNs;
  return apart - (std::max(longest, sum / threads) + kStageRegionNs);
}

Stages plan_stages(const Graph& g, const KernelGraph& kg, const std::vector<double>& ns,
                   size_t window, int threads) {
  auto small = [&](size_t s) { return s < ns.size() && ns[s] >= 0; };
  const size_t n = kg.kernels.size();
  std::vector<size_t> kernel_of(g.nodes().size(), SIZE_MAX);
  for (size_t s = 0; s < n; ++s)
    for (int32_t node : kg.kernels[s].nodes) kernel_of[node] = s;
  std::vector<std::vector<size_t>> producers(n);
  for (size_t s = 0; s < n; ++s)
    for (ValueId v : kg.kernels[s].inputs) {
      if (v == kNoValue || g.value(v).producer < 0) continue;
      const size_t p = kernel_of[g.value(v).producer];
      if (p != SIZE_MAX && p != s) producers[s].push_back(p);
    }

  Stages st;
  std::vector<char> placed(n, 0);  // 1: in an earlier stage; 2: in the stage being formed
  size_t head = 0;
  auto ready = [&](size_t s) {
    for (size_t p : producers[s])
      if (placed[p] != 1) return false;
    return true;
  };
  while (st.order.size() < n) {
    while (placed[head]) ++head;
    const size_t first = st.order.size();
    st.begin.push_back(first);
    st.order.push_back(head);
    placed[head] = 2;
    if (small(head)) {
      std::vector<double> times = {ns[head]};
      for (size_t s = head + 1; s < n && s <= head + window; ++s) {
        if (placed[s] || !small(s) || !ready(s)) continue;
        times.push_back(ns[s]);
        if (stage_gain(times, threads) <= stage_gain({times.begin(), times.end() - 1}, threads)) {
          times.pop_back();  // too unlike the others: it would keep one core busy alone
          continue;
        }
        st.order.push_back(s);
        placed[s] = 2;
      }
    }
    for (size_t i = first; i < st.order.size(); ++i) placed[st.order[i]] = 1;
    const size_t size = st.order.size() - first;
    st.stage_of.insert(st.stage_of.end(), size, static_cast<int32_t>(st.begin.size() - 1));
    if (size > 1) {
      ++st.concurrent_stages;
      st.concurrent_steps += size;
    }
  }
  st.begin.push_back(n);
  return st;
}

}  // namespace pto
