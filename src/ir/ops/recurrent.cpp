// Recurrent layers: RNN, GRU and LSTM (ONNX semantics: gate order, layouts, directions,
// sequence_lens, peepholes, configurable activations), and the stateful sequence ops of linear
// attention and state-space LLMs (Gated DeltaNet, Mamba): LinearAttention and
// CausalConvWithState (opset 27).
#include "infer_util.h"

namespace pto {
namespace {

// Y is [seq, dirs, batch, hidden] (layout 0) or [batch, seq, dirs, hidden] (layout 1); Y_h and
// Y_c are [dirs, batch, hidden] or [batch, dirs, hidden].
void infer_recurrent(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  const int64_t hidden = c.attrs().get_int("hidden_size", -1);
  const int64_t dirs = c.node.attr_string("direction") == "bidirectional" ? 2 : 1;
  const bool batch_first = c.node.attr_int("layout") == 1;
  std::optional<Shape> y, state;
  if (x.shape && x.shape->size() == 3 && hidden > 0) {
    Dim seq = (*x.shape)[batch_first ? 1 : 0], batch = (*x.shape)[batch_first ? 0 : 1];
    y = batch_first ? Shape{batch, seq, dirs, hidden} : Shape{seq, dirs, batch, hidden};
    state = batch_first ? Shape{batch, dirs, hidden} : Shape{dirs, batch, hidden};
  }
  infer::set(c, 0, x.dtype, y);
  for (size_t i = 1; i < c.outputs.size(); ++i) infer::set(c, i, x.dtype, state);
}

void add(OpRegistry& r, const char* name, int max_inputs, int max_outputs,
         std::initializer_list<AttrDef> more) {
  const AttrSchema common = {
      optional_attr("activation_alpha", AttrKind::kFloats),
      optional_attr("activation_beta", AttrKind::kFloats),
      optional_attr("activations", AttrKind::kStrings, "absent: the op's defaults"),
      optional_attr("clip", AttrKind::kFloat, "absent: no clipping"),
      {"direction", "forward", "forward, reverse or bidirectional"},
      optional_attr("hidden_size", AttrKind::kInt, "absent: from the weights"),
      {"layout", int64_t{0}, "opset 14+: 1 for batch-major"},
      optional_attr("output_sequence", AttrKind::kInt, "opset 1 only")};
  r.add({.name = name,
         .min_inputs = 3,
         .max_inputs = max_inputs,
         .min_outputs = 0,
         .max_outputs = max_outputs,
         .properties = kOpaque,
         .attrs = common.with(more),
         .infer = infer_recurrent});
}

// LinearAttention(query [B, T, Hq dk], key [B, T, Hkv dk], value [B, T, Hkv dv], past_state?,
// decay?, beta?): output [B, T, Hq dv] in the query's type, present_state [B, Hkv, dk, dv] in
// past_state's type (the query's without one).
void infer_linear_attention(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& q = c.inputs[0];
  const int64_t hq = c.attrs().get_int("q_num_heads", 0),
                hkv = c.attrs().get_int("kv_num_heads", 0);
  std::optional<Shape> y, state;
  if (hq > 0 && hkv > 0 && q.shape && q.shape->size() == 3 && c.has_input(2) && c.inputs[2].shape &&
      c.inputs[2].shape->size() == 3) {
    const Dim& qw = (*q.shape)[2];
    const Dim& vw = (*c.inputs[2].shape)[2];
    const Dim dv = vw.is_known() ? Dim(vw.value / hkv) : Dim::unknown();
    y = Shape{(*q.shape)[0], (*q.shape)[1], vw.is_known() ? Dim(dv.value * hq) : Dim::unknown()};
    state = Shape{(*q.shape)[0], hkv, qw.is_known() ? Dim(qw.value / hq) : Dim::unknown(), dv};
  }
  infer::set(c, 0, q.dtype, y);
  if (c.outputs.size() > 1) infer::set(c, 1, c.has_input(3) ? c.inputs[3].dtype : q.dtype, state);
}

// CausalConvWithState(input [B, C, L], weight [C, 1, k], bias?, past_state?): output like the
// input, present_state [B, C, k - 1].
void infer_causal_conv(InferContext& c) {
  if (!c.has_input(0)) return;
  const TensorType& x = c.inputs[0];
  std::optional<Shape> state;
  if (x.shape && x.shape->size() == 3 && c.has_input(1) && c.inputs[1].shape &&
      c.inputs[1].shape->size() == 3) {
    const Dim& k = (*c.inputs[1].shape)[2];
    state = Shape{(*x.shape)[0], (*x.shape)[1], k.is_known() ? Dim(k.value - 1) : Dim::unknown()};
  }
  infer::set(c, 0, x.dtype, x.shape);
  if (c.outputs.size() > 1) infer::set(c, 1, x.dtype, state);
}

}  // namespace

void register_recurrent_ops(OpRegistry& r) {
  add(r, "RNN", 6, 2, {});
  add(r, "GRU", 6, 2, {bool_attr("linear_before_reset", false)});
  add(r, "LSTM", 8, 3, {bool_attr("input_forget", false)});
  r.add(
      {.name = "LinearAttention",
       .min_inputs = 3,
       .max_inputs = 6,
       .min_outputs = 1,
       .max_outputs = 2,
       .properties = kOpaque,
       .attrs = {optional_attr("chunk_size", AttrKind::kInt,
                               "a chunk-parallel prefill hint; the result does not depend on it"),
                 required_attr("kv_num_heads", AttrKind::kInt),
                 required_attr("q_num_heads", AttrKind::kInt),
                 {"scale", 0.0, "0: 1 / sqrt(dk)"},
                 {"update_rule", std::string("gated_delta"), "linear, gated, delta, gated_delta"}},
       .infer = infer_linear_attention,
       .doc = "the recurrent state S (dk x dv per KV head) of linear attention, decayed by "
              "exp(decay), updated by k (x) v (delta rule: beta k (x) (v - S^T k)), read by q"});
  r.add({.name = "CausalConvWithState",
         .min_inputs = 2,
         .max_inputs = 4,
         .min_outputs = 1,
         .max_outputs = 2,
         .properties = kOpaque,
         .attrs = {{"activation", std::string("none"), "none, silu, swish"}},
         .infer = infer_causal_conv,
         .doc = "a causal depthwise 1-D convolution over [past_state, input], with the last k - 1 "
                "positions as the next state"});
}

}  // namespace pto
