// match_epilogue walks forward from a Conv/ConvTranspose/Gemm/MatMul/DynamicQuantizeMatMul along
// single-use values, taking at most one bias, one residual and one activation, in the order the
// epilogue applies them, then a Gemm's or MatMul's Cast to bf16/f16.
#include "fusion/epilogue_chain.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pto/op_registry.h"

namespace pto::fusion {
namespace {

bool is_f32(const Graph& g, ValueId v) {
  return v != kNoValue && g.value(v).type.dtype == DType::kF32;
}

// A constant whose shape broadcasts onto `out` along `axis` only (all other dims 1), with
// out[axis] elements: a per-channel (Conv, axis 1) or per-column (MatMul, axis -1) bias.
bool is_bias_for(const Graph& g, ValueId b, const Shape& out, int64_t axis) {
  const Tensor* t = g.initializer(b);
  if (!t || t->dtype() != DType::kF32 || t->rank() > static_cast<int64_t>(out.size())) return false;
  const auto rank = static_cast<int64_t>(out.size());
  if (axis < 0) axis += rank;
  if (!out[axis].is_known() || t->numel() != out[axis].value) return false;
  for (int64_t d = 0; d < t->rank(); ++d) {
    const int64_t od = d + rank - t->rank();  // right-aligned
    if (od != axis && t->dim(d) != 1) return false;
  }
  return true;
}

// Whether a and b can have the same shape at run time (an unknown dimension may be anything):
// the kernels check the concrete shapes and decline the rest (KernelDeclined).
bool same_shape(const TensorType& a, const TensorType& b) {
  return a.shape && b.shape && may_equal(*a.shape, *b.shape) && a.dtype == b.dtype;
}

// Reads Clip bounds from constant inputs (opset >= 11) or attributes; false when not constant.
bool clip_bounds(const Graph& g, const Node& n, double& lo, double& hi) {
  lo = -std::numeric_limits<double>::infinity();
  hi = std::numeric_limits<double>::infinity();
  lo = n.attrs.get_float("min", lo);
  hi = n.attrs.get_float("max", hi);
  for (size_t i = 1; i < n.inputs.size() && i < 3; ++i) {
    if (n.inputs[i] == kNoValue) continue;
    const Tensor* t = g.initializer(n.inputs[i]);
    if (!t || t->numel() != 1) return false;
    (i == 1 ? lo : hi) = t->item_as_double();
  }
  return true;
}

// The activation a node applies to `v`, if it is one the epilogue knows.
bool activation_of(const Graph& g, const Node& n, ValueId v, EpilogueChain& c) {
  if (n.inputs.empty() || n.inputs[0] != v || n.outputs.size() != 1) return false;
  if (n.op == "Relu" || n.op == "Sigmoid" || n.op == "Tanh" || n.op == "HardSwish") {
    c.activation = n.op;
    return true;
  }
  if (n.op == "LeakyRelu") {
    c.activation = n.op;
    c.lo = n.attrs.get_float("alpha", 0.01);
    return true;
  }
  if (n.op == "Gelu") {
    c.activation = n.attrs.get_string("approximate", "none") == "tanh" ? "GeluTanh" : "Gelu";
    return true;
  }
  if (n.op == "Clip" && clip_bounds(g, n, c.lo, c.hi)) {
    c.activation = n.op;
    return true;
  }
  return false;
}

}  // namespace

std::string EpilogueChain::rule(const Graph& g) const {
  std::string r = g.nodes()[anchor].op;
  if (bias != kNoValue) r += "+Bias";
  if (residual != kNoValue) r += "+Add";
  if (!activation.empty()) r += "+" + activation;
  if (store != DType::kF32) r += "+Cast";
  return r;
}

namespace {

// The ops whose kernels run an epilogue: Conv, Gemm, MatMul, ConvTranspose, the blocked convs
// and DynamicQuantizeMatMul.
bool epilogue_anchor(const Node& a) {
  if (a.op == "Conv" || a.op == "Gemm" || a.op == "MatMul" || a.op == "ConvBlocked" ||
      a.op == "DwPwConvBlocked")
    return true;
  return (a.op == "DynamicQuantizeMatMul" || a.op == "ConvTranspose") && a.domain.empty();
}

}  // namespace

std::optional<EpilogueChain> match_epilogue(const Graph& g, int32_t anchor,
                                            const ReaderIndex& readers) {
  const Node& a = g.nodes()[anchor];
  // ConvBlocked and DwPwConvBlocked (the level-3 blocked layout) take a residual and an
  // activation, not a bias.
  const bool blocked = a.op == "ConvBlocked" || a.op == "DwPwConvBlocked";
  // DynamicQuantizeMatMul (A quantized on the fly, B one 8-bit matrix) takes them as a MatMul
  // whose B is one matrix; its own bias is input 4.
  const bool dqmm = a.op == "DynamicQuantizeMatMul" && a.domain.empty();
  // ConvTranspose takes them as a Conv does (its output is NCHW, the channel on axis 1).
  const bool transpose = a.op == "ConvTranspose" && a.domain.empty();
  if (!epilogue_anchor(a)) return std::nullopt;
  if (a.outputs.size() != 1 || !is_f32(g, a.outputs[0])) return std::nullopt;
  const TensorType& out = g.value(a.outputs[0]).type;
  if (!out.shape || out.shape->size() < 2) return std::nullopt;
  const bool conv = a.op == "Conv" || transpose || blocked;
  const size_t bias_input = dqmm ? 4 : 2;
  const bool has_own_bias = a.inputs.size() > bias_input && a.inputs[bias_input] != kNoValue;
  // Gemm's C takes the epilogue's bias when it is a row of N (or a scalar), its residual when it
  // is a full matrix: a fused residual is possible only in the first case.
  bool c_is_row = false;
  if (a.op == "Gemm" && has_own_bias) {
    const TensorType& ct = g.value(a.inputs[2]).type;
    if (ct.shape && (ct.shape->size() <= 1 || (ct.shape->size() == 2 && (*ct.shape)[0] == Dim(1))))
      c_is_row = true;
  }
  // MatMul applies a bias or residual only when B is one matrix (the batch folds into M rows).
  const bool matmul_flat = a.op != "MatMul" || (g.value(a.inputs[1]).type.shape &&
                                                g.value(a.inputs[1]).type.shape->size() <= 2);

  EpilogueChain c;
  c.anchor = anchor;
  c.nodes = {anchor};
  ValueId cur = a.outputs[0];
  TensorType cur_type = out;  // the shape the chain sees now (views change it)
  const Dim n_cols = out.shape->back();
  while (c.activation.empty()) {
    const int32_t u = readers.single_reader(cur);
    if (u < 0) break;
    const Node& n = g.nodes()[u];
    // A view that keeps rows of N: the epilogue still applies in the product's layout.
    if (!conv && n.def && n.def->is_view() && n.outputs.size() == 1 && n.inputs[0] == cur &&
        n_cols.is_known()) {
      const TensorType& t = g.value(n.outputs[0]).type;
      if (!t.shape || t.shape->empty() || !(t.shape->back() == n_cols)) break;
      c.nodes.push_back(u);
      c.views.push_back(u);
      cur = n.outputs[0];
      cur_type = t;
      continue;
    }
    if (n.op == "Add" && n.inputs.size() == 2 && n.outputs.size() == 1 &&
        same_shape(g.value(n.outputs[0]).type, cur_type)) {
      const ValueId other = n.inputs[0] == cur ? n.inputs[1] : n.inputs[0];
      if (other == cur || !is_f32(g, other)) break;
      if (c.bias == kNoValue && c.residual == kNoValue && !has_own_bias && matmul_flat &&
          a.op != "Gemm" && !blocked && is_bias_for(g, other, *cur_type.shape, conv ? 1 : -1)) {
        c.bias = other;
      } else if (c.residual == kNoValue && matmul_flat &&
                 !(a.op == "Gemm" && has_own_bias && !c_is_row) &&
                 same_shape(g.value(other).type, cur_type)) {
        c.residual = other;
      } else {
        break;
      }
      c.nodes.push_back(u);
      cur = n.outputs[0];
      continue;
    }
    if (activation_of(g, n, cur, c)) {
      c.nodes.push_back(u);
      cur = n.outputs[0];
      break;
    }
    // SiLU spelled x * Sigmoid(x): `cur` read by a Sigmoid and the Mul that takes both.
    break;
  }
  // x * sigmoid(x): cur has two readers, a Sigmoid and a Mul of (cur, sigmoid).
  if (c.activation.empty() && readers.uses(cur) == 2 && !readers.is_output(cur)) {
    int32_t sig = -1, mul = -1;
    for (int32_t i : readers.readers(cur)) {
      const Node& n = g.nodes()[i];
      if (n.op == "Sigmoid" && n.inputs.size() == 1 && n.inputs[0] == cur) sig = i;
    }
    if (sig >= 0) {
      const ValueId s = g.nodes()[sig].outputs[0];
      mul = readers.single_reader(s);
      if (mul >= 0) {
        const Node& m = g.nodes()[mul];
        const bool pair =
            m.op == "Mul" && m.inputs.size() == 2 &&
            ((m.inputs[0] == cur && m.inputs[1] == s) || (m.inputs[1] == cur && m.inputs[0] == s));
        if (pair) {
          c.activation = "Silu";
          c.nodes.push_back(sig);
          c.nodes.push_back(mul);
          cur = m.outputs[0];
        }
      }
    }
  }
  // A Cast of the float result to bf16 or f16: the GEMM stores its blocks rounded.
  if (!conv) {
    const int32_t u = readers.single_reader(cur);
    if (u >= 0 && g.nodes()[u].op == "Cast" && g.nodes()[u].domain.empty() &&
        g.nodes()[u].outputs.size() == 1) {
      const DType to = g.value(g.nodes()[u].outputs[0]).type.dtype;
      if (to == DType::kBF16 || to == DType::kF16) {
        c.store = to;
        c.nodes.push_back(u);
        cur = g.nodes()[u].outputs[0];
      }
    }
  }
  // Trailing views with nothing after them belong to no epilogue: leave them out.
  while (!c.views.empty() && c.nodes.back() == c.views.back()) {
    c.nodes.pop_back();
    c.views.pop_back();
    cur = g.nodes()[c.nodes.back()].outputs.back();
  }
  if (c.nodes.size() == 1) return std::nullopt;
  c.result = cur;
  return c;
}

std::optional<EpilogueChain> epilogue_of_group(const Graph& g, const std::vector<int32_t>& nodes) {
  // (The anchor first: the index of readers costs the graph's size, a group's other kernels
  // asked it of every group of a graph.)
  if (nodes.size() < 2 || !epilogue_anchor(g.nodes()[nodes[0]])) return std::nullopt;
  auto c = match_epilogue(g, nodes[0], ReaderIndex(g));
  if (!c) return std::nullopt;
  std::vector<int32_t> sorted = c->nodes;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != nodes) return std::nullopt;
  return c;
}

}  // namespace pto::fusion
