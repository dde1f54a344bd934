// Transformer building blocks as single ops: Attention (opset 23+), RMSNormalization and
// RotaryEmbedding. Graph passes may decompose them; backends may run them fused.
#include "infer_util.h"
#include "op_params.h"

namespace pto {
namespace {

void infer_attention(InferContext& c) {
  if (!c.has_input(0) || !c.has_input(2)) return;
  const TensorType& q = c.inputs[0];
  const TensorType& v = c.inputs[2];
  std::optional<Shape> y;
  if (q.shape && v.shape && q.shape->size() == v.shape->size()) {
    const Shape& qs = *q.shape;
    const Shape& vs = *v.shape;
    if (qs.size() == 4) {
      y = Shape{qs[0], qs[1], qs[2], vs[3]};
    } else if (qs.size() == 3) {
      const params::Attention p = params::attention(c.node);
      const int64_t qh = p.q_num_heads, kvh = p.kv_num_heads;
      Dim hidden = Dim::unknown();
      if (p.qkv_split.size() == 3 && qh > 0 && kvh > 0)
        hidden = Dim(p.qkv_split[2] / kvh * qh);  // V is the last part of the one input
      else if (vs[2].is_known() && qh > 0 && kvh > 0)
        hidden = Dim(vs[2].value / kvh * qh);
      y = Shape{qs[0], qs[1], hidden};
    }
  }
  infer::set(c, 0, q.dtype, y);
  for (size_t i = 1; i < c.outputs.size(); ++i) infer::set(c, i, q.dtype, std::nullopt);
}

}  // namespace

void register_attention_ops(OpRegistry& r) {
  r.add({.name = "Attention",
         .min_inputs = 3,
         .max_inputs = 7,
         .min_outputs = 1,
         .max_outputs = 4,
         .properties = kOpaque,
         .attrs = {bool_attr("is_causal", false),
                   optional_attr("kv_num_heads", AttrKind::kInt, "3-D inputs only"),
                   optional_attr("q_num_heads", AttrKind::kInt, "3-D inputs only"),
                   {"qk_matmul_output_mode", int64_t{0}, "which matrix output 3 holds"},
                   optional_attr("scale", AttrKind::kFloat, "absent: 1 / sqrt(head size)"),
                   {"softcap", 0.0, "0: no soft cap"},
                   optional_attr("softmax_precision", AttrKind::kInt, "ONNX type code"),
                   // Sliding-window masks as ONNX proposes them (-1: unbounded).
                   {"left_window_size", int64_t{-1}},
                   {"right_window_size", int64_t{-1}},
                   optional_attr("qkv_split", AttrKind::kInts,
                                 "PyPTO: inputs 0-2 are one 3-D tensor, Q, K and V side by side "
                                 "on its last axis with these widths"),
                   {"mask_broadcast", int64_t{0},
                    "PyPTO: 1: the mask's last axis broadcasts (1 or the key count), not padded"},
                   params::precision_attr()},
         .infer = infer_attention,
         .doc = "softmax(Q K^T * scale + mask) V with GQA, KV cache, causal and window masks"});
  r.add({.name = "RMSNormalization",
         .min_inputs = 2,
         .max_inputs = 2,
         .properties = kReduction,
         .attrs = params::norm_attrs(),
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
  r.add({.name = "RotaryEmbedding",
         .min_inputs = 3,
         .max_inputs = 4,
         .properties = kOpaque,
         .attrs = {bool_attr("interleaved", false),
                   optional_attr("num_heads", AttrKind::kInt, "3-D input only"),
                   {"rotary_embedding_dim", int64_t{0}, "0: the whole head"}},
         .infer = [](InferContext& c) { infer::same_as_input(c); }});
}

}  // namespace pto
