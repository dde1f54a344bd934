// ai.onnx.preview ops as standard ops (preview_ops.h), following the ONNX reference
// implementation (onnx/reference/ops/aionnx_preview): checked against the ONNX node tests.
#include "preview_ops.h"

#include <cmath>

#include "emit.h"
#include "pto/error.h"

namespace pto::onnx {
namespace {

// Appends subgraph `sub` (one input besides its captures, one output) to e's graph with its
// input bound to `in`; its captures are the enclosing graph's values of the same names, its
// initializers become constants. Returns the value of its output.
ValueId splice(Emit& e, const Graph& sub, ValueId in, const std::string& what) {
  Graph& g = e.graph();
  const size_t own = sub.inputs().size() - static_cast<size_t>(sub.num_captures);
  if (own != 1 || sub.outputs().size() != 1)
    throw ValueError(cat(e.where(), ": ", what,
                         " must have one input (besides the outer values "
                         "it reads) and one output; it has ",
                         own, " and ", sub.outputs().size()));
  std::vector<ValueId> inputs = {in};
  for (size_t i = 1; i < sub.inputs().size(); ++i) {
    const std::string& outer = sub.value(sub.inputs()[i]).name;
    const auto v = g.find_value(outer);
    if (!v) throw ValueError(cat(e.where(), ": ", what, " reads '", outer, "', not defined"));
    inputs.push_back(*v);
  }
  return inline_subgraph(g, g.nodes().size(), sub, inputs, cat(e.name(), "/", what))[0];
}

// K or V [B, Hkv, S, D] with each head repeated `group` times in place: [B, Hkv * group, S, D].
ValueId repeat_heads(Emit& e, ValueId x, int64_t group, int64_t heads, int64_t d) {
  if (group == 1) return x;
  const ValueId x5 = e.op("Unsqueeze", {x, e.ints({2})});
  const ValueId wide = e.op("Expand", {x5, e.ints({1, 1, group, 1, 1})});
  return e.op("Reshape", {wide, e.ints({0, heads, -1, d})});
}

ValueId cast(Emit& e, ValueId x, DType from, DType to, ValueId out = kNoValue) {
  if (from == to) return out == kNoValue ? x : e.op("Identity", {x}, {}, out);
  Attributes a;
  a.set("to", static_cast<int64_t>(onnx_code(to)));
  return e.op("Cast", {x}, a, out);
}

// FlexAttention(Q [B, Hq, L, E], K [B, Hkv, S, E], V [B, Hkv, S, Ev]){scale, score_mod,
// prob_mod, softmax_precision}: (Q sqrt(scale)) (K sqrt(scale))^T in Q's type, cast to the
// softmax type, score_mod, Softmax, prob_mod, times V in the softmax type, cast to V's type.
void flex_attention(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                    const Attributes& attrs) {
  const ValueId q = x[0], k = x[1], v = x[2];
  Dims dims[3];
  const char* names[3] = {"Q", "K", "V"};
  for (int i = 0; i < 3; ++i) {
    const auto& s = e.shape(x[static_cast<size_t>(i)]);
    if (!s || s->size() != 4)
      throw ValueError(cat(e.where(), ": ", names[i], " must be a 4-D tensor"));
    for (size_t a = 1; a < 4; a += 2)  // heads and head size must be known
      if (!(*s)[a].is_known())
        e.unsupported(cat(names[i], " with an unknown ", a == 1 ? "head count" : "head size"));
    dims[i] = {0, (*s)[1].value, 0, (*s)[3].value};
  }
  const int64_t hq = dims[0][1], hkv = dims[1][1], head = dims[0][3], vhead = dims[2][3];
  if (dims[2][1] != hkv || dims[1][3] != head || hkv <= 0 || hq % hkv != 0)
    throw ValueError(cat(e.where(), ": Q, K and V heads (", hq, ", ", hkv, ", ", dims[2][1],
                         ") and sizes must match, Q's heads a multiple of K's"));
  const DType qd = e.graph().value(q).type.dtype, vd = e.graph().value(v).type.dtype;
  DType sd = qd == DType::kF64 ? DType::kF64 : DType::kF32;
  if (attrs.has("softmax_precision"))
    sd = dtype_from_onnx_code(attrs.get_int("softmax_precision"), e.where());
  const double scale =
      attrs.has("scale") ? attrs.get_float("scale") : 1.0 / std::sqrt(static_cast<double>(head));
  // The ONNX reference scales Q and K by sqrt(scale), rounded to float, then to Q's type.
  const ValueId root =
      cast(e, e.float_scalar(std::sqrt(static_cast<float>(scale))), DType::kF32, qd);
  const ValueId kk = repeat_heads(e, k, hq / hkv, hq, head);
  const ValueId vv = repeat_heads(e, v, hq / hkv, hq, vhead);
  Attributes t;
  t.set("perm", std::vector<int64_t>{0, 1, 3, 2});
  // K's scale after the transpose, where RecognizeAttention folds it into the scale.
  ValueId scores =
      e.op("MatMul", {e.op("Mul", {q, root}), e.op("Mul", {e.op("Transpose", {kk}, t), root})});
  scores = cast(e, scores, qd, sd);
  if (attrs.has("score_mod")) scores = splice(e, attrs.get_graph("score_mod"), scores, "score_mod");
  Attributes axis;
  axis.set("axis", int64_t{-1});
  ValueId probs = e.op("Softmax", {scores}, axis);
  if (attrs.has("prob_mod")) probs = splice(e, attrs.get_graph("prob_mod"), probs, "prob_mod");
  cast(e, e.op("MatMul", {probs, cast(e, vv, vd, sd)}), sd, vd, y[0]);
}

}  // namespace

bool is_preview_op(const std::string& domain, const std::string& op) {
  return domain == "ai.onnx.preview" && op == "FlexAttention";
}

void expand_preview_op(Graph& g, const std::string& op, const std::vector<ValueId>& inputs,
                       const std::vector<ValueId>& outputs, const Attributes& attrs,
                       const std::string& name, const std::string& where) {
  PTO_CHECK(op == "FlexAttention") << op << " is not an expanded preview op";
  for (size_t i = 0; i < 3; ++i)
    if (in(inputs, i) == kNoValue) throw ValueError(cat(where, ": input ", i, " is required"));
  if (outputs.empty() || outputs[0] == kNoValue)
    throw ValueError(cat(where, ": the first output is required"));
  Emit e(g, name, where);
  flex_attention(e, inputs, outputs, attrs);
}

}  // namespace pto::onnx
