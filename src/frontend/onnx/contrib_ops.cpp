// com.microsoft ops as the standard ops they stand for (contrib_ops.h). Each expansion follows
// onnxruntime's CPU kernels, checked against onnxruntime itself (tests/python/test_contrib_ops.py):
// the masks of its attention ops add mask_filter_value (-10000 by default), not -inf.
#include "contrib_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "emit.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/log.h"
#include "pto/op_registry.h"

namespace pto::onnx {
namespace {

// a + b, or a when b is absent.
ValueId add(Emit& e, ValueId a, ValueId b, ValueId out = kNoValue) {
  if (b == kNoValue) return out == kNoValue ? a : e.op("Identity", {a}, {}, out);
  return e.op("Add", {a, b}, {}, out);
}

// The activation FusedConv and FusedGemm apply (onnxruntime's MLAS activations).
ValueId activation(Emit& e, ValueId x, const std::string& kind, const std::vector<double>& p,
                   ValueId out) {
  auto param = [&](size_t i) {
    if (i >= p.size()) e.unsupported(cat("activation ", kind, " without its parameters"));
    return p[i];
  };
  Attributes a;
  if (kind.empty() || kind == "Identity") return e.op("Identity", {x}, {}, out);
  if (kind == "Relu" || kind == "Tanh" || kind == "Sigmoid" || kind == "HardSwish")
    return e.op(kind, {x}, {}, out);
  if (kind == "LeakyRelu") {
    a.set("alpha", param(0));
    return e.op(kind, {x}, a, out);
  }
  if (kind == "HardSigmoid") {
    a.set("alpha", param(0));
    a.set("beta", param(1));
    return e.op(kind, {x}, a, out);
  }
  if (kind == "Clip")
    return e.op("Clip",
                {x, e.float_scalar(static_cast<float>(param(0))),
                 e.float_scalar(static_cast<float>(param(1)))},
                {}, out);
  e.unsupported(cat("activation '", kind, "'"));
}

// ---- GELU and the biases ----

void gelu(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
          const std::string& approximate) {
  Attributes a;
  a.set("approximate", approximate);
  e.op("Gelu", {add(e, x[0], in(x, 1))}, a, y[0]);
}

// x sigmoid(alpha x)
void quick_gelu(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                const Attributes& attrs) {
  const auto alpha = static_cast<float>(attrs.get_float("alpha", 1.702));
  e.op("Mul", {x[0], e.op("Sigmoid", {e.op("Mul", {x[0], e.float_scalar(alpha)})})}, {}, y[0]);
}

// ---- Normalizations ----

// SkipLayerNormalization(input, skip, gamma, beta?, bias?) -> (output, mean?, inv_std_var?,
// input_skip_bias_sum?), and the RMS form SkipSimplifiedLayerNormalization(input, skip, gamma,
// bias?): LayerNormalization (RMSNormalization) over the last axis of input + skip (+ bias).
void skip_layer_norm(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                     const Attributes& attrs, bool rms) {
  const ValueId bias = in(x, rms ? 3 : 4);
  const ValueId sum_out = in(y, 3);
  ValueId sum = e.op("Add", {x[0], x[1]}, {}, bias == kNoValue ? sum_out : kNoValue);
  if (bias != kNoValue) sum = e.op("Add", {sum, bias}, {}, sum_out);
  Attributes a;
  a.set("axis", int64_t{-1});
  a.set("epsilon", attrs.get_float("epsilon", 1e-12));
  if (rms) {
    if (in(y, 1) != kNoValue || in(y, 2) != kNoValue)
      e.unsupported("the mean and inv_std_var outputs of SkipSimplifiedLayerNormalization");
    e.op("RMSNormalization", {sum, x[2]}, a, y[0]);
    return;
  }
  std::vector<ValueId> ins = {sum, x[2]};
  if (in(x, 3) != kNoValue) ins.push_back(x[3]);
  // Only the outputs read: a norm with just Y joins the Adds' group (Add+LayerNormalization).
  std::vector<ValueId> outs = {y[0], in(y, 1), in(y, 2)};
  while (outs.size() > 1 && outs.back() == kNoValue) outs.pop_back();
  e.node("LayerNormalization", ins, outs, a);
}

// SimplifiedLayerNormalization(X, scale) -> Y: RMSNormalization (onnxruntime's, default domain).
void simplified_layer_norm(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                           const Attributes& attrs) {
  if (in(y, 1) != kNoValue) e.unsupported("the inv_std_var output of SimplifiedLayerNormalization");
  Attributes a;
  a.set("axis", attrs.get_int("axis", -1));
  a.set("epsilon", attrs.get_float("epsilon", 1e-5));
  e.op("RMSNormalization", {x[0], x[1]}, a, y[0]);
}

// EmbedLayerNormalization(input_ids, segment_ids?, word_embedding, position_embedding,
// segment_embedding?, gamma, beta, mask?, position_ids?) -> (output, mask_index,
// embedding_sum?): LayerNormalization of the three embeddings' sum; mask_index (int32, [batch])
// is the number of ones in each row of the mask, 0 without one.
void embed_layer_norm(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                      const Attributes& attrs) {
  const ValueId ids = x[0], segment_ids = in(x, 1), mask = in(x, 7), position_ids = in(x, 8);
  ValueId sum = e.op("Gather", {x[2], ids});
  ValueId pos;
  if (position_ids != kNoValue) {
    pos = e.op("Gather", {x[3], position_ids});
  } else {  // rows 0 .. seq - 1 of the table, broadcast over the batch
    const ValueId seq = e.op("Unsqueeze", {e.dim(ids, 1), e.ints({0})});
    pos = e.op("Slice", {x[3], e.ints({0}), seq, e.ints({0})});
  }
  const bool segments = segment_ids != kNoValue && in(x, 4) != kNoValue;
  sum = e.op("Add", {sum, pos}, {}, segments ? kNoValue : in(y, 2));
  if (segments) sum = e.op("Add", {sum, e.op("Gather", {x[4], segment_ids})}, {}, in(y, 2));
  Attributes a;
  a.set("axis", int64_t{-1});
  a.set("epsilon", attrs.get_float("epsilon", 1e-12));
  e.op("LayerNormalization", {sum, x[5], x[6]}, a, y[0]);
  if (in(y, 1) == kNoValue) return;
  if (attrs.get_int("mask_index_type", 1) != 1)
    e.unsupported("mask_index_type other than 1 with a mask_index output");
  Attributes to_i32;
  to_i32.set("to", static_cast<int64_t>(6));  // INT32
  if (mask == kNoValue) {
    Attributes zero;
    zero.set("value", Tensor::from_vector(std::vector<int32_t>{0}, {1}));
    Attributes first;
    first.set("start", int64_t{0});
    first.set("end", int64_t{1});
    e.op("ConstantOfShape", {e.op("Shape", {ids}, first)}, zero, y[1]);
    return;
  }
  Attributes keep;
  keep.set("keepdims", int64_t{0});
  Attributes to_f;  // counts below 2^24 are exact in float, whose ReduceSum has a CPU kernel
  to_f.set("to", static_cast<int64_t>(1));
  e.op("Cast", {e.op("ReduceSum", {e.op("Cast", {mask}, to_f), e.ints({1})}, keep)}, to_i32, y[1]);
}

// ---- Matrix products ----

// The permutation that swaps the last two of `rank` axes.
std::vector<int64_t> swap_last_two(int64_t rank) {
  std::vector<int64_t> p(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) p[static_cast<size_t>(i)] = i;
  std::swap(p[static_cast<size_t>(rank - 2)], p[static_cast<size_t>(rank - 1)]);
  return p;
}

// FusedMatMul(A, B){alpha, transA, transB}: alpha op(A) op(B).
void fused_mat_mul(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                   const Attributes& attrs) {
  if (attrs.get_int("transBatchA", 0) || attrs.get_int("transBatchB", 0))
    e.unsupported("FusedMatMul with transBatchA or transBatchB");
  std::array<ValueId, 2> ab = {x[0], x[1]};
  const char* names[] = {"transA", "transB"};
  for (size_t i = 0; i < 2; ++i) {
    if (!attrs.get_int(names[i], 0)) continue;
    const int64_t r = e.rank(ab[i], i ? "B" : "A");
    if (r < 2) e.unsupported(cat(names[i], " of a ", r, "-D operand"));
    Attributes perm;
    perm.set("perm", swap_last_two(r));
    ab[i] = e.op("Transpose", {ab[i]}, perm);
  }
  const double alpha = attrs.get_float("alpha", 1.0);
  if (alpha == 1.0) {
    e.op("MatMul", {ab[0], ab[1]}, {}, y[0]);
    return;
  }
  e.op("Mul", {e.op("MatMul", {ab[0], ab[1]}), e.float_scalar(static_cast<float>(alpha))}, {},
       y[0]);
}

// FusedConv(X, W, B?, Z?){conv attributes, activation, activation_params}: act(Conv + Z).
void fused_conv(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                const Attributes& attrs) {
  Attributes conv;
  for (const auto& [k, v] : attrs.all())
    if (k != "activation" && k != "activation_params") conv.set(k, v);
  std::vector<ValueId> ins = {x[0], x[1]};
  if (in(x, 2) != kNoValue) ins.push_back(x[2]);
  const ValueId c = add(e, e.op("Conv", ins, conv), in(x, 3));
  activation(e, c, attrs.get_string("activation", ""), attrs.get_floats("activation_params", {}),
             y[0]);
}

// FusedGemm(A, B, C?){Gemm's attributes, activation, activation_alpha, _beta}: act(Gemm).
void fused_gemm(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                const Attributes& attrs) {
  Attributes gemm;
  std::vector<double> params;
  for (const auto& [k, v] : attrs.all()) {
    if (k == "activation_alpha") params.insert(params.begin(), attrs.get_float(k));
    if (k == "activation_beta") params.push_back(attrs.get_float(k));
    if (!k.starts_with("activation")) gemm.set(k, v);
  }
  if (attrs.has("activation_gamma")) e.unsupported("FusedGemm's activation_gamma");
  std::vector<ValueId> ins = {x[0], x[1]};
  if (in(x, 2) != kNoValue) ins.push_back(x[2]);
  activation(e, e.op("Gemm", ins, gemm), attrs.get_string("activation", ""), params, y[0]);
}

// ---- Attention ----

// The additive mask of ONNX Runtime's attention ops from a key mask: `mask` is [batch, total]
// (1 keeps a key, 0 masks it), [batch, seq, total] (per query) or [batch] (keys at and past
// mask[b] are masked: right padding); `total` is the key length. Masked scores get
// mask_filter_value added, as onnxruntime does. Returns a float mask broadcast to
// [batch, heads, seq, total].
ValueId additive_mask(Emit& e, ValueId mask, ValueId total, float filter, const std::string& what) {
  const int64_t r = e.rank(mask, what);
  Attributes to_f;
  to_f.set("to", static_cast<int64_t>(1));  // FLOAT
  ValueId keep;                             // float, 1 where kept
  if (r == 1) {
    // A [2 batch] mask (end and start positions) reads as [batch] here and would be wrong: the
    // batch is the query's first dimension, which the caller checks against.
    Attributes to_i64;
    to_i64.set("to", static_cast<int64_t>(7));
    const ValueId keys = e.op("Range", {e.int_scalar(0), total, e.int_scalar(1)});
    const ValueId end = e.op("Unsqueeze", {e.op("Cast", {mask}, to_i64), e.ints({1})});
    keep = e.op("Cast", {e.op("Less", {keys, end})}, to_f);  // [batch, total]
  } else if (r == 2 || r == 3) {
    keep = e.op("Cast", {mask}, to_f);
  } else {
    e.unsupported(cat("a ", r, "-D ", what));
  }
  const ValueId bias =
      e.op("Mul", {e.op("Sub", {e.float_scalar(1.0f), keep}), e.float_scalar(filter)});
  return e.op("Unsqueeze",
              {bias, e.ints(r == 3 ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2})});
}

// The batch of a [batch] key mask must be the query's, else the mask is the [2 batch] form (end
// and start positions), which is not read.
void check_end_positions(Emit& e, ValueId mask, ValueId query, const std::string& what) {
  if (e.rank(mask, what) != 1) return;
  const auto& m = e.graph().value(mask).type.shape;
  const auto& q = e.graph().value(query).type.shape;
  if (m && q && !q->empty() && (*m)[0].is_known() && (*q)[0].is_known() &&
      (*m)[0].value != (*q)[0].value)
    e.unsupported(cat("a ", what, " of ", (*m)[0].value, " end and start positions"));
}

// The number of keys: K's sequence length [batch, seq, hidden], plus the past's [batch, heads,
// past, head] when there is one.
ValueId key_length(Emit& e, ValueId k, ValueId past_key) {
  const ValueId n = e.dim(k, 1);
  return past_key == kNoValue ? n : e.op("Add", {n, e.dim(past_key, 2)});
}

float mask_filter(const Attributes& attrs) {
  return static_cast<float>(attrs.get_float("mask_filter_value", -10000.0));
}

// x [batch, seq, heads * head] as [batch, heads, seq, head].
ValueId to_heads(Emit& e, ValueId x, int64_t heads) {
  Attributes perm;
  perm.set("perm", std::vector<int64_t>{0, 2, 1, 3});
  return e.op("Transpose", {e.op("Reshape", {x, e.ints({0, 0, heads, -1})})}, perm);
}

// ONNX's Attention of q, k and v ([batch, seq, heads * head]) into `out`, after the keys and
// values of a past ([batch, heads, past, head]; kNoValue: none), whose concatenations with k
// and v go to present_k and present_v when asked for (kNoValue: not). The attributes are the
// contrib op's: unidirectional, scale, mask_filter_value. With a past the heads are split out
// and the causal mask is written out, aligned to the last key (query i sees keys up to past +
// i), as onnxruntime's contrib ops align it; the CPU Attention kernel takes no KV cache inputs.
void attend(Emit& e, std::array<ValueId, 3> qkv, ValueId pk, ValueId pv, ValueId mask,
            const Attributes& attrs, ValueId out, ValueId present_k, ValueId present_v) {
  const int64_t heads = attrs.get_int("num_heads");
  const bool causal = attrs.get_int("unidirectional", 0) != 0;
  Attributes a;
  if (const double scale = attrs.get_float("scale", 0.0); scale != 0.0) a.set("scale", scale);
  if (pk == kNoValue) {
    a.set("q_num_heads", heads);
    a.set("kv_num_heads", heads);
    if (causal) a.set("is_causal", int64_t{1});
    std::vector<ValueId> ins = {qkv[0], qkv[1], qkv[2]};
    if (mask != kNoValue) ins.push_back(mask);
    e.node("Attention", ins, {out}, a);
    return;
  }
  Attributes seq_axis;
  seq_axis.set("axis", int64_t{2});
  const ValueId q = to_heads(e, qkv[0], heads);
  const ValueId k = e.op("Concat", {pk, to_heads(e, qkv[1], heads)}, seq_axis, present_k);
  const ValueId v = e.op("Concat", {pv, to_heads(e, qkv[2], heads)}, seq_axis, present_v);
  if (causal) {  // key j is masked for query i when j > past + i
    const ValueId seq = e.dim(qkv[0], 1), past = e.dim(pk, 2);
    const ValueId rows =
        e.op("Add", {e.op("Range", {e.int_scalar(0), seq, e.int_scalar(1)}), past});
    const ValueId cols =
        e.op("Range", {e.int_scalar(0), e.op("Add", {past, seq}), e.int_scalar(1)});
    Attributes to_f;
    to_f.set("to", static_cast<int64_t>(1));
    const ValueId later = e.op("Greater", {cols, e.op("Unsqueeze", {rows, e.ints({1})})});
    const ValueId bias =
        e.op("Mul", {e.op("Cast", {later}, to_f), e.float_scalar(mask_filter(attrs))});
    mask = add(e, e.op("Unsqueeze", {bias, e.ints({0, 1})}), mask);
  }
  std::vector<ValueId> ins = {q, k, v};
  if (mask != kNoValue) ins.push_back(mask);
  Attributes perm;
  perm.set("perm", std::vector<int64_t>{0, 2, 1, 3});
  e.op("Reshape", {e.op("Transpose", {e.op("Attention", ins, a)}, perm), e.ints({0, 0, -1})}, {},
       out);
}

// Attention(input, weights, bias?, mask_index?, past?, attention_bias?) -> (output, present?):
// the Q, K and V projections as one MatMul (+ bias) split three ways, then ONNX's Attention.
// past is [2, batch, heads, past, head] (K and V stacked), and so is present.
void attention(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
               const Attributes& attrs) {
  if (attrs.get_int("do_rotary", 0)) e.unsupported("Attention with do_rotary");
  if (attrs.get_int("past_present_share_buffer", 0) || in(x, 6) != kNoValue)
    e.unsupported("Attention with past_present_share_buffer");
  const Tensor* w = e.constant(x[1]);
  std::vector<int64_t> sizes = attrs.get_ints("qkv_hidden_sizes", {});
  if (sizes.empty()) {
    if (!w || w->rank() != 2 || w->dim(1) % 3 != 0)
      e.unsupported("Attention whose weights are not a constant [hidden, 3 hidden]");
    sizes.assign(3, w->dim(1) / 3);
  }
  if (sizes.size() != 3 || sizes[0] != sizes[1])
    throw ValueError(cat(e.where(), ": qkv_hidden_sizes must be 3 sizes, Q's and K's equal"));
  ValueId qkv = add(e, e.op("MatMul", {x[0], x[1]}), in(x, 2));
  Attributes last;
  last.set("axis", int64_t{-1});
  std::array<ValueId, 3> parts;
  for (ValueId& p : parts) p = e.fresh("qkv");
  e.node("Split", {qkv, e.ints(sizes)}, {parts[0], parts[1], parts[2]}, last);

  const ValueId past = in(x, 4);
  ValueId pk = kNoValue, pv = kNoValue;
  if (past != kNoValue) {
    Attributes axis0;
    axis0.set("axis", int64_t{0});
    pk = e.op("Gather", {past, e.int_scalar(0)}, axis0);
    pv = e.op("Gather", {past, e.int_scalar(1)}, axis0);
  }
  ValueId mask = kNoValue;
  if (in(x, 3) != kNoValue) {
    check_end_positions(e, x[3], x[0], "mask_index");
    mask = additive_mask(e, x[3], key_length(e, parts[1], pk), mask_filter(attrs), "mask_index");
  }
  if (in(x, 5) != kNoValue) mask = add(e, x[5], mask);
  const ValueId present = in(y, 1);
  if (present != kNoValue && past == kNoValue)
    e.unsupported("Attention's present output without a past input");
  const bool stack = present != kNoValue;
  const ValueId present_k = stack ? e.fresh("present_key") : kNoValue;
  const ValueId present_v = stack ? e.fresh("present_value") : kNoValue;
  attend(e, parts, pk, pv, mask, attrs, y[0], present_k, present_v);
  if (!stack) return;
  Attributes axis0;
  axis0.set("axis", int64_t{0});
  e.op("Concat",
       {e.op("Unsqueeze", {present_k, e.ints({0})}), e.op("Unsqueeze", {present_v, e.ints({0})})},
       axis0, present);
}

// MultiHeadAttention(query, key, value, bias?, key_padding_mask?, attention_bias?, past_key?,
// past_value?) -> (output, present_key?, present_value?): ONNX's Attention on 3-D Q, K and V
// ([batch, seq, hidden]; bias is Q's, K's and V's side by side) with a past of [batch, heads,
// past, head]. The packed forms (QKV in the query, KV in the key) and 4-D keys are not read.
void multi_head_attention(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                          const Attributes& attrs) {
  if (in(x, 1) == kNoValue || in(x, 2) == kNoValue)
    e.unsupported("MultiHeadAttention with packed QKV or KV (no key or value input)");
  if (in(x, 8) != kNoValue || in(x, 9) != kNoValue)
    e.unsupported("MultiHeadAttention with past_sequence_length or cache_indirection");
  if (e.rank(x[0], "query") != 3 || e.rank(x[1], "key") != 3 || e.rank(x[2], "value") != 3)
    e.unsupported("MultiHeadAttention whose query, key and value are not all 3-D");
  std::array<ValueId, 3> qkv = {x[0], x[1], x[2]};
  if (const ValueId bias = in(x, 3); bias != kNoValue) {
    const auto& q = e.shape(x[0]);
    const auto& v = e.shape(x[2]);
    if (!q || !v || !q->back().is_known() || !v->back().is_known())
      e.unsupported("MultiHeadAttention's bias with query or value widths unknown");
    Attributes axis0;
    axis0.set("axis", int64_t{0});
    std::array<ValueId, 3> b;
    for (ValueId& p : b) p = e.fresh("bias");
    const int64_t d = q->back().value;
    e.node("Split", {bias, e.ints({d, d, v->back().value})}, {b[0], b[1], b[2]}, axis0);
    for (int i = 0; i < 3; ++i) qkv[i] = e.op("Add", {qkv[i], b[i]});
  }
  const ValueId pk = in(x, 6), pv = in(x, 7);
  if ((pk == kNoValue) != (pv == kNoValue))
    throw ValueError(cat(e.where(), ": past_key and past_value must be given together"));
  ValueId mask = kNoValue;
  if (in(x, 4) != kNoValue) {
    if (e.rank(x[4], "key_padding_mask") == 3) e.unsupported("a 3-D key_padding_mask");
    check_end_positions(e, x[4], x[0], "key_padding_mask");
    mask =
        additive_mask(e, x[4], key_length(e, qkv[1], pk), mask_filter(attrs), "key_padding_mask");
  }
  if (in(x, 5) != kNoValue) mask = add(e, x[5], mask);
  if ((in(y, 1) != kNoValue || in(y, 2) != kNoValue) && pk == kNoValue)
    e.unsupported("MultiHeadAttention's present outputs without a past");
  attend(e, qkv, pk, pv, mask, attrs, y[0], in(y, 1), in(y, 2));
}

// GroupQueryAttention(query, key?, value?, past_key?, past_value?, seqlens_k,
// total_sequence_length, cos_cache?, sin_cache?, position_ids?, attention_bias?) -> (output,
// present_key, present_value), as onnxruntime's CPU kernel computes it (onnxruntime-genai's LLM
// exports): always causal; Q, K and V 3-D (or packed in the query); K/V caches [batch,
// kv_heads, past, head] right-padded, batch b holding past_b = seqlens_k[b] + 1 - seq tokens
// (0 on the first prompt, when seq equals total_sequence_length); the new keys and values go at
// past_b, the present caches are max(total_sequence_length, past) long; query i sits at
// position past_b + i and sees keys up to it that are below seqlens_k[b] + 1 (and, with
// local_window_size w, above position - w); with do_rotary, Q and K are rotated at those
// positions (or position_ids) by the caches. Positions past a batch's total are unspecified in
// onnxruntime's present outputs and are left as whatever the gather reads there.
void group_query_attention(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                           const Attributes& attrs) {
  const int64_t heads = attrs.get_int("num_heads"), kv_heads = attrs.get_int("kv_num_heads");
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads)
    throw ValueError(cat(e.where(), ": num_heads ", heads, " must be a positive multiple of ",
                         "kv_num_heads ", kv_heads));
  if (attrs.get_int("smooth_softmax", 0)) e.unsupported("GroupQueryAttention's smooth_softmax");
  if (attrs.get_int("qk_output", 0)) e.unsupported("GroupQueryAttention's qk_output");
  if (in(x, 11) != kNoValue) e.unsupported("GroupQueryAttention's head_sink");
  if ((in(x, 3) == kNoValue) != (in(x, 4) == kNoValue))
    throw ValueError(cat(e.where(), ": past_key and past_value must be given together"));
  if ((in(x, 1) == kNoValue) != (in(x, 2) == kNoValue))
    throw ValueError(cat(e.where(), ": key and value must be given together"));
  if (in(x, 5) == kNoValue || in(x, 6) == kNoValue)
    throw ValueError(cat(e.where(), ": seqlens_k and total_sequence_length are required"));
  std::array<ValueId, 3> qkv = {x[0], in(x, 1), in(x, 2)};
  const auto& qshape = e.shape(x[0]);
  if (!qshape || qshape->size() != 3 || !qshape->back().is_known())
    e.unsupported("GroupQueryAttention whose query is not 3-D with a known width");
  int64_t head = qshape->back().value / heads;
  if (qkv[1] == kNoValue) {  // packed: Q, K and V side by side in the query
    head = qshape->back().value / (heads + 2 * kv_heads);
    Attributes last;
    last.set("axis", int64_t{-1});
    for (ValueId& v : qkv) v = e.fresh("qkv");
    e.node("Split", {x[0], e.ints({heads * head, kv_heads * head, kv_heads * head})},
           {qkv[0], qkv[1], qkv[2]}, last);
  }
  Attributes to_i64;
  to_i64.set("to", static_cast<int64_t>(7));
  Attributes all;
  all.set("keepdims", int64_t{0});
  const ValueId zero = e.int_scalar(0), one = e.int_scalar(1);
  const ValueId seq = e.dim(qkv[0], 1);
  const ValueId total = e.op("ReduceMax", {e.op("Cast", {x[6]}, to_i64)}, all);  // a scalar
  const ValueId lens = e.op("Add", {e.op("Cast", {x[5]}, to_i64), one});         // [batch] totals
  const ValueId first = e.op("Equal", {seq, total});
  const ValueId past_b = e.op("Where", {first, zero, e.op("Sub", {lens, seq})});  // [batch]
  const ValueId steps = e.op("Range", {zero, seq, one});                          // [seq]
  const ValueId pos =  // [batch, seq]: each query's position
      e.op("Add",
           {e.op("Unsqueeze", {past_b, e.ints({1})}), e.op("Unsqueeze", {steps, e.ints({0})})});
  if (attrs.get_int("do_rotary", 0)) {
    if (in(x, 7) == kNoValue || in(x, 8) == kNoValue)
      throw ValueError(cat(e.where(), ": do_rotary needs cos_cache and sin_cache"));
    const auto& cs = e.shape(x[7]);
    if (!cs || cs->size() != 2 || !(*cs)[1].is_known())
      e.unsupported("GroupQueryAttention whose cos_cache is not 2-D with a known width");
    Attributes rot;
    rot.set("interleaved", attrs.get_int("rotary_interleaved", 0));
    rot.set("rotary_embedding_dim", 2 * (*cs)[1].value);
    const ValueId ids = in(x, 9) != kNoValue ? e.op("Cast", {x[9]}, to_i64) : pos;
    for (int i = 0; i < 2; ++i) {
      rot.set("num_heads", i ? kv_heads : heads);
      qkv[i] = e.op("RotaryEmbedding", {qkv[i], x[7], x[8], ids}, rot);
    }
  }
  // The present caches: row j of batch b is past row j below past_b, new row j - past_b up to
  // past_b + seq, read from Concat(past, new) with GatherND (batch_dims 2: one index per row of
  // head_size values, so the indices are a head_size-th of the cache, not its size as a
  // GatherElements' would be).
  Attributes seq_axis;
  seq_axis.set("axis", int64_t{2});
  const ValueId k4 = to_heads(e, qkv[1], kv_heads), v4 = to_heads(e, qkv[2], kv_heads);
  const bool has_past = in(x, 3) != kNoValue;
  const ValueId kc = has_past ? e.op("Concat", {x[3], k4}, seq_axis) : k4;
  const ValueId vc = has_past ? e.op("Concat", {x[4], v4}, seq_axis) : v4;
  const ValueId past_len = has_past ? e.dim(x[3], 2) : zero;
  const ValueId length = e.op("Max", {total, past_len});
  const ValueId rows = e.op("Unsqueeze", {e.op("Range", {zero, length, one}), e.ints({0})});
  const ValueId pb = e.op("Unsqueeze", {past_b, e.ints({1})});
  const ValueId rel = e.op("Sub", {rows, pb});
  const ValueId last_row = e.op("Sub", {e.op("Add", {past_len, seq}), one});
  const ValueId index =
      e.op("Where", {e.op("Less", {rows, pb}), rows,
                     e.op("Where", {e.op("Less", {rel, seq}), e.op("Add", {past_len, rel}),
                                    e.op("Min", {rows, last_row})})});  // [batch, length]
  const ValueId index4 = e.op("Unsqueeze", {index, e.ints({1, 3})});    // [batch, 1, length, 1]
  auto gather = [&](ValueId cache, ValueId out) {
    const ValueId shape = e.op("Concat",
                               {e.op("Slice", {e.op("Shape", {cache}), e.ints({0}), e.ints({2})}),
                                e.op("Unsqueeze", {length, e.ints({0})}), e.ints({1})},
                               [] {
                                 Attributes a;
                                 a.set("axis", int64_t{0});
                                 return a;
                               }());
    Attributes nd;
    nd.set("batch_dims", int64_t{2});
    return e.op("GatherND", {cache, e.op("Expand", {index4, shape})}, nd, out);
  };
  const ValueId pk = gather(kc, in(y, 1)), pv = gather(vc, in(y, 2));
  // The mask [batch, 1, seq, length]: key j visible to query i when j <= pos and j < lens[b]
  // (and j > pos - window).
  const ValueId qpos = e.op("Unsqueeze", {pos, e.ints({2})});   // [batch, seq, 1]
  const ValueId keys = e.op("Unsqueeze", {rows, e.ints({1})});  // [1, 1, length]
  ValueId visible = e.op("And", {e.op("LessOrEqual", {keys, qpos}),
                                 e.op("Less", {keys, e.op("Unsqueeze", {lens, e.ints({1, 2})})})});
  if (const int64_t w = attrs.get_int("local_window_size", -1); w >= 0)
    visible = e.op("And", {visible, e.op("Greater", {keys, e.op("Sub", {qpos, e.int_scalar(w)})})});
  const ValueId mask =
      e.op("Unsqueeze", {e.op("Where", {visible, e.float_scalar(0.0f),
                                        e.float_scalar(std::numeric_limits<float>::lowest())}),
                         e.ints({1})});
  Attributes a;
  if (const double scale = attrs.get_float("scale", 0.0); scale != 0.0) a.set("scale", scale);
  if (const double cap = attrs.get_float("softcap", 0.0); cap != 0.0) a.set("softcap", cap);
  Attributes perm;
  perm.set("perm", std::vector<int64_t>{0, 2, 1, 3});
  const ValueId q4 = to_heads(e, qkv[0], heads);
  const ValueId full_mask = add(e, mask, in(x, 10));
  e.op("Reshape",
       {e.op("Transpose", {e.op("Attention", {q4, pk, pv, full_mask}, a)}, perm),
        e.ints({0, 0, -1})},
       {}, y[0]);
}

// RotaryEmbedding(input, position_ids, cos_cache, sin_cache): ONNX's RotaryEmbedding(input,
// cos_cache, sin_cache, position_ids). A position_ids of one element is the position of the first
// token (the rest follow it); ONNX's takes [batch, seq] positions.
void rotary_embedding(Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
                      const Attributes& attrs) {
  if (attrs.get_int("is_packed_batching", 0)) e.unsupported("RotaryEmbedding's is_packed_batching");
  if (attrs.get_float("scale", 1.0) != 1.0)
    e.unsupported("RotaryEmbedding with a scale other than 1");
  Attributes a;
  a.set("interleaved", attrs.get_int("interleaved", 0));
  if (attrs.has("num_heads")) a.set("num_heads", attrs.get_int("num_heads"));
  a.set("rotary_embedding_dim", attrs.get_int("rotary_embedding_dim", 0));
  ValueId pos = x[1];
  if (e.rank(pos, "position_ids") == 1) {
    const int64_t r = e.rank(x[0], "input");
    Attributes to_i64;
    to_i64.set("to", static_cast<int64_t>(7));
    const ValueId seq = e.dim(x[0], r == 4 ? 2 : 1);
    const ValueId first = e.op("Squeeze", {e.op("Cast", {pos}, to_i64), e.ints({0})});
    const ValueId row =
        e.op("Range", {first, e.op("Add", {first, seq}), e.int_scalar(1)});  // [seq]
    const ValueId shape = e.op(
        "Concat",
        {e.op("Unsqueeze", {e.dim(x[0], 0), e.ints({0})}), e.op("Unsqueeze", {seq, e.ints({0})})},
        [] {
          Attributes c;
          c.set("axis", int64_t{0});
          return c;
        }());
    pos = e.op("Expand", {e.op("Unsqueeze", {row, e.ints({0})}), shape});
  }
  e.op("RotaryEmbedding", {x[0], x[2], x[3], pos}, a, y[0]);
}

// ---- onnxruntime's NCHWc layout (com.microsoft.nchwc) ----

// Whether a NCHWc Conv's filter is in OIHWBo order (a depthwise conv, or a conv reading an NCHW
// input of fewer channels than the block) rather than OIHWBiBo, as onnxruntime's transformer
// chose: the same rule its kernel reads the input format by.
bool nchwc_filter_oihwbo(const NchwcConvShape& c, int64_t block) {
  if (c.group > 1) return c.in == 1 && c.group == c.out;
  return c.in < block;
}

bool nchwc_fits(const NchwcConvShape& c, int64_t block) {
  if (c.group < 1 || c.out % block != 0) return false;
  if (nchwc_filter_oihwbo(c, block)) return true;
  return c.in % block == 0 && c.out % c.group == 0 && (c.out / c.group) % block == 0;
}

// Filter `w` (dims O, I, KH, KW) from onnxruntime's order to OIHW: OIHWBo is
// [O/b][I][KH][KW][b], OIHWBiBo [O/b][I/b][KH][KW][b_in][b_out].
Tensor nchwc_unblock_filter(const Tensor& w, int64_t b, bool oihwbo) {
  const Tensor src = w.contiguous();
  const int64_t outs = w.dim(0), ins = w.dim(1), taps = w.dim(2) * w.dim(3);
  const int64_t bi = oihwbo ? 1 : b, in_blocks = ins / bi;
  Tensor out = Tensor::empty(DType::kF32, w.shape());
  const float* s = src.data<float>();
  float* d = out.data<float>();
  for (int64_t o = 0; o < outs; ++o)
    for (int64_t i = 0; i < ins; ++i)
      for (int64_t t = 0; t < taps; ++t)
        d[(o * ins + i) * taps + t] =
            s[((((o / b) * in_blocks + i / bi) * taps + t) * bi + i % bi) * b + o % b];
  return out;
}

// Conv(X, W, B?, Sum?){conv attributes, activation, activation_params}: act(Conv + Sum), as
// FusedConv, on the filter put back in OIHW order (once per filter).
void nchwc_conv(Emit& e, NchwcState& st, const std::vector<ValueId>& x,
                const std::vector<ValueId>& y, const Attributes& attrs) {
  const Tensor* w = e.constant(x[1]);
  if (!w || w->dtype() != DType::kF32 || w->rank() != 4)
    e.unsupported("a filter that is not a 4-D float32 initializer");
  const NchwcConvShape c{w->dim(0), w->dim(1), attrs.get_int("group", 1)};
  if (!nchwc_fits(c, st.block))
    throw ValueError(cat(e.where(), ": the filter [", c.out, ", ", c.in, ", ...] of group ",
                         c.group, " is not in onnxruntime's NCHWc order for block ", st.block));
  auto [it, fresh] = st.filters.try_emplace(x[1], kNoValue);
  if (fresh)
    it->second = e.weight(nchwc_unblock_filter(*w, st.block, nchwc_filter_oihwbo(c, st.block)));
  std::vector<ValueId> conv_in = x;
  conv_in[1] = it->second;
  fused_conv(e, conv_in, y, attrs);
}

// The channel count of 4-D `v`, which must be known.
int64_t nchwc_channels(Emit& e, ValueId v) {
  const auto& s = e.shape(v);
  if (!s || s->size() != 4 || !(*s)[1].is_known())
    e.unsupported("an input whose channel count is not known");
  return (*s)[1].value;
}

// ReorderInput(X){channels_last}: X (NHWC when channels_last) as NCHW with the channels padded
// with zeros to a multiple of the block.
void nchwc_reorder_input(Emit& e, NchwcState& st, const std::vector<ValueId>& x,
                         const std::vector<ValueId>& y, const Attributes& attrs) {
  ValueId v = x[0];
  if (attrs.get_int("channels_last", 0) != 0) {
    Attributes t;
    t.set("perm", std::vector<int64_t>{0, 3, 1, 2});
    v = e.op("Transpose", {v}, t);
  }
  const int64_t c = nchwc_channels(e, v), padded = (c + st.block - 1) / st.block * st.block;
  if (padded == c) {
    e.op("Identity", {v}, {}, y[0]);
    return;
  }
  e.op("Pad", {v, e.ints({0, 0, 0, 0, 0, padded - c, 0, 0})}, {}, y[0]);
}

// ReorderOutput(X){channels, channels_last}: the first `channels` channels (then NHWC).
void nchwc_reorder_output(Emit& e, NchwcState&, const std::vector<ValueId>& x,
                          const std::vector<ValueId>& y, const Attributes& attrs) {
  const int64_t channels = attrs.get_int("channels");
  const bool last = attrs.get_int("channels_last", 0) != 0;
  if (channels < 1) throw ValueError(cat(e.where(), ": channels must be positive"));
  ValueId v = x[0];
  if (nchwc_channels(e, v) < channels)
    throw ValueError(cat(e.where(), ": channels ", channels, " exceeds the input's"));
  if (nchwc_channels(e, v) > channels)
    v = e.op("Slice", {v, e.ints({0}), e.ints({channels}), e.ints({1})}, {},
             last ? kNoValue : y[0]);
  Attributes t;
  t.set("perm", std::vector<int64_t>{0, 2, 3, 1});
  if (last)
    e.op("Transpose", {v}, t, y[0]);
  else if (v == x[0])
    e.op("Identity", {v}, {}, y[0]);
}

// Upsample(X){scales (integers), mode, coordinate_transformation_mode}: Resize. Nearest is
// onnxruntime's asymmetric floor form, the only one its transformer writes.
void nchwc_upsample(Emit& e, NchwcState&, const std::vector<ValueId>& x,
                    const std::vector<ValueId>& y, const Attributes& attrs) {
  const std::vector<int64_t> scales = attrs.get_ints("scales");
  if (scales.size() != 4) throw ValueError(cat(e.where(), ": scales must have 4 values"));
  std::vector<float> f;
  for (int64_t s : scales) {
    if (s < 1) throw ValueError(cat(e.where(), ": scales must be positive"));
    f.push_back(static_cast<float>(s));
  }
  const std::string mode = attrs.get_string("mode", "nearest");
  Attributes r;
  r.set("mode", mode);
  if (mode == "nearest") {
    r.set("coordinate_transformation_mode", std::string("asymmetric"));
    r.set("nearest_mode", std::string("floor"));
  } else if (mode == "linear") {
    r.set("coordinate_transformation_mode",
          attrs.get_string("coordinate_transformation_mode", "asymmetric"));
  } else {
    e.unsupported(cat("mode '", mode, "'"));
  }
  e.op("Resize", {x[0], kNoValue, e.weight(Tensor::from_vector(f, {4}))}, r, y[0]);
}

using NchwcExpander = void (*)(Emit&, NchwcState&, const std::vector<ValueId>&,
                               const std::vector<ValueId>&, const Attributes&);

// The NCHWc ops read; a null expander: the standard op of the same name and attributes (the
// pools).
const std::pair<const char*, NchwcExpander> kNchwcOps[] = {
    {"Conv", nchwc_conv},
    {"ReorderInput", nchwc_reorder_input},
    {"ReorderOutput", nchwc_reorder_output},
    {"Upsample", nchwc_upsample},
    {"MaxPool", nullptr},
    {"AveragePool", nullptr},
    {"GlobalMaxPool", nullptr},
    {"GlobalAveragePool", nullptr},
};

const std::pair<const char*, NchwcExpander>* find_nchwc(const std::string& op) {
  for (const auto& entry : kNchwcOps)
    if (op == entry.first) return &entry;
  return nullptr;
}

using Expander = void (*)(Emit&, const std::vector<ValueId>&, const std::vector<ValueId>&,
                          const Attributes&);

struct Entry {
  const char* op;
  uint32_t required;  // bit i: input i must be given
  Expander expand;
};

// The bits of inputs [0, n).
constexpr uint32_t first(int n) {
  return (1u << n) - 1;
}

// The com.microsoft ops read, with the inputs each needs at least.
constexpr Entry kContribOps[] = {
    {"Attention", first(2), attention},
    {"BiasAdd", first(3),
     [](Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y, const Attributes&) {
       e.op("Add", {e.op("Add", {x[0], x[1]}), x[2]}, {}, y[0]);
     }},
    {"BiasGelu", first(2),
     [](Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y, const Attributes&) {
       gelu(e, x, y, "none");
     }},
    {"EmbedLayerNormalization", 0b1101101, embed_layer_norm},
    {"FastGelu", first(1),
     [](Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y, const Attributes&) {
       gelu(e, x, y, "tanh");
     }},
    {"FusedConv", first(2), fused_conv},
    {"FusedGemm", first(2), fused_gemm},
    {"FusedMatMul", first(2), fused_mat_mul},
    {"Gelu", first(1),
     [](Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y, const Attributes&) {
       gelu(e, {x[0]}, y, "none");
     }},
    {"GroupQueryAttention", first(1), group_query_attention},
    {"MultiHeadAttention", first(1), multi_head_attention},
    {"QuickGelu", first(1), quick_gelu},
    {"RotaryEmbedding", first(4), rotary_embedding},
    {"SkipLayerNormalization", first(3),
     [](Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
        const Attributes& a) { skip_layer_norm(e, x, y, a, false); }},
    {"SkipSimplifiedLayerNormalization", first(3),
     [](Emit& e, const std::vector<ValueId>& x, const std::vector<ValueId>& y,
        const Attributes& a) { skip_layer_norm(e, x, y, a, true); }},
};

const Entry* find(const std::string& domain, const std::string& op) {
  if (domain.empty() || domain == "ai.onnx") {
    static constexpr Entry kSimplified = {"SimplifiedLayerNormalization", first(2),
                                          simplified_layer_norm};
    return op == kSimplified.op ? &kSimplified : nullptr;
  }
  if (domain != "com.microsoft") return nullptr;
  for (const Entry& e : kContribOps)
    if (op == e.op) return &e;
  return nullptr;
}

}  // namespace

bool is_expanded_contrib_op(const std::string& domain, const std::string& op) {
  return find(domain, op) != nullptr;
}

void expand_contrib_op(Graph& g, const std::string& op, const std::vector<ValueId>& inputs,
                       const std::vector<ValueId>& outputs, const Attributes& attrs,
                       const std::string& name, const std::string& where) {
  const Entry* entry = find(op == "SimplifiedLayerNormalization" ? "" : "com.microsoft", op);
  PTO_CHECK(entry) << op << " is not an expanded contrib op";
  for (size_t i = 0; i < 32; ++i)
    if ((entry->required >> i & 1) && in(inputs, i) == kNoValue)
      throw ValueError(cat(where, ": input ", i, " is required"));
  if (outputs.empty() || outputs[0] == kNoValue)
    throw ValueError(cat(where, ": the first output is required"));
  Emit e(g, name, where);
  entry->expand(e, inputs, outputs, attrs);
}

int64_t nchwc_block_size(const std::vector<NchwcConvShape>& convs, const std::string& where) {
  std::vector<int64_t> fit;
  for (int64_t b : {16, 8})
    if (std::all_of(convs.begin(), convs.end(), [&](const auto& c) { return nchwc_fits(c, b); }))
      fit.push_back(b);
  const char* env = std::getenv("PTO_NCHWC_BLOCK");
  if (env && *env) {
    const std::string s = env;
    if (s != "8" && s != "16")
      throw ValueError(cat("PTO_NCHWC_BLOCK=", s,
                           ": must be 8 or 16 (onnxruntime's NCHWc block "
                           "on AVX2 and AVX-512 CPUs)"));
    const int64_t b = std::stoll(s);
    if (std::find(fit.begin(), fit.end(), b) == fit.end())
      throw ValueError(
          cat(where, ": PTO_NCHWC_BLOCK=", b, " does not fit the file's NCHWc filters (",
              fit.empty() ? std::string("neither 8 nor 16 does") : cat(fit[0], " does"), ")"));
    return b;
  }
  if (fit.empty())
    throw UnsupportedError(cat(where,
                               ": the NCHWc filters fit neither onnxruntime's block of 16 "
                               "(AVX-512) nor of 8 (AVX2)"));
  if (fit.size() == 1) return fit[0];
  return detect_device().avx512f ? 16 : 8;  // what onnxruntime would reorder for on this CPU
}

bool is_nchwc_op(const std::string& domain, const std::string& op) {
  return domain == "com.microsoft.nchwc" && find_nchwc(op) != nullptr;
}

void expand_nchwc_op(Graph& g, NchwcState& state, const std::string& op,
                     const std::vector<ValueId>& inputs, const std::vector<ValueId>& outputs,
                     const Attributes& attrs, const std::string& name, const std::string& where) {
  const auto* entry = find_nchwc(op);
  PTO_CHECK(entry && state.block > 0) << op << " is not a read NCHWc op, or no block was chosen";
  const size_t required = op == "Conv" ? 2 : 1;
  for (size_t i = 0; i < required; ++i)
    if (in(inputs, i) == kNoValue) throw ValueError(cat(where, ": input ", i, " is required"));
  if (outputs.empty() || outputs[0] == kNoValue)
    throw ValueError(cat(where, ": the first output is required"));
  Emit e(g, name, where);
  if (entry->second)
    entry->second(e, state, inputs, outputs, attrs);
  else
    e.op(op, {inputs[0]}, attrs, outputs[0]);
}

}  // namespace pto::onnx
