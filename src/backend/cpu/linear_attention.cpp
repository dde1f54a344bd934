// CPU LinearAttention and CausalConvWithState (float32): the stateful sequence ops of linear
// attention and state-space LLMs (Gated DeltaNet, Mamba).
//
// LinearAttention runs the recurrence token by token, as the ONNX definition states it, with one
// task per batch row and KV head (the heads' states are independent). The state [dk, dv] lives in
// the present_state output (or a scratch buffer) and is swept once per token in strips of one
// vector of its dv columns, each strip decayed, updated and read by every query head of the group
// while it is in L1 (recurrent_impl.h, linear_attention_token). CausalConvWithState convolves each
// channel's row [past_state, input] with its k taps, vectors along the row, one task per row
// range. Shapes and attributes the reference would reject go to it for its error.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/cpu/recurrent_kernels.h"
#include "backend/cpu/reduce_kernels.h"  // kParallelGrain
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

bool all_f32(const NodeInfo& n) {
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.dtype(i) != DType::kUndefined && n.dtype(i) != DType::kF32) return false;
  for (const TensorType& t : n.outputs)
    if (t.dtype != DType::kUndefined && t.dtype != DType::kF32) return false;
  return true;
}

std::vector<Tensor> run_linear_attention(const KernelContext& c) {
  const Tensor &q = c.input(0), &k = c.input(1), &v = c.input(2);
  const auto& a = c.attrs();
  const int64_t hq = a.get_int("q_num_heads", 0), hkv = a.get_int("kv_num_heads", 0);
  const std::string rule = a.get_string("update_rule", "gated_delta");
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  if ((rule != "linear" && !gated && !delta) || hq <= 0 || hkv <= 0 || hq % hkv != 0 ||
      gated != c.has_input(4) || delta != c.has_input(5) || q.rank() != 3 || v.rank() != 3 ||
      q.dim(2) % hq != 0 || v.dim(2) % hkv != 0)
    return run_reference(c);
  const int64_t B = q.dim(0), T = q.dim(1), dk = q.dim(2) / hq, dv = v.dim(2) / hkv;
  const int64_t group = hq / hkv;
  if (k.shape() != Dims{B, T, hkv * dk} || v.dim(0) != B || v.dim(1) != T) return run_reference(c);
  const float *g = nullptr, *beta = nullptr;
  int64_t g_width = 0, beta_width = 0;
  if (gated) {
    const Tensor& t = c.input(4);
    g_width = t.rank() == 3 ? t.dim(2) : 0;
    if (t.rank() != 3 || t.dim(0) != B || t.dim(1) != T || (g_width != hkv && g_width != hkv * dk))
      return run_reference(c);
    g = t.data<float>();
  }
  if (delta) {
    const Tensor& t = c.input(5);
    beta_width = t.rank() == 3 ? t.dim(2) : 0;
    if (t.rank() != 3 || t.dim(0) != B || t.dim(1) != T || (beta_width != hkv && beta_width != 1))
      return run_reference(c);
    beta = t.data<float>();
  }
  if (c.has_input(3) && c.input(3).shape() != Dims{B, hkv, dk, dv}) return run_reference(c);
  const double scale_attr = a.get_float("scale", 0.0);
  const float scale =
      static_cast<float>(scale_attr == 0.0 ? 1.0 / std::sqrt(static_cast<double>(dk)) : scale_attr);

  std::vector<Tensor> out;
  out.push_back(Tensor::empty(DType::kF32, {B, T, hq * dv}));
  Tensor state = Tensor::empty(DType::kF32, {B, hkv, dk, dv});
  float* s = state.data<float>();
  if (c.has_input(3))
    std::memcpy(s, c.input(3).data<float>(), state.nbytes());
  else
    std::fill(s, s + state.numel(), 0.0f);
  const float *pq = q.data<float>(), *pk = k.data<float>(), *pv = v.data<float>();
  float* po = out[0].data<float>();
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, T * dk * dv));
  parallel_for(0, B * hkv, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> decay(gated ? dk : 0);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / hkv, h = r % hkv;
      LinearAttentionToken tok;
      tok.s = s + r * dk * dv;
      tok.delta = delta;
      tok.scale = scale;
      tok.dk = dk, tok.dv = dv, tok.group = group;
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bt = b * T + t;
        tok.k = pk + (bt * hkv + h) * dk;
        tok.v = pv + (bt * hkv + h) * dv;
        tok.q = pq + (bt * hq + h * group) * dk;
        tok.out = po + (bt * hq + h * group) * dv;
        if (gated) {
          const float* gt = g + bt * g_width;
          if (g_width == hkv)
            std::fill(decay.begin(), decay.end(), std::exp(gt[h]));
          else
            for (int64_t d = 0; d < dk; ++d) decay[d] = std::exp(gt[h * dk + d]);
          tok.decay = decay.data();
        }
        if (delta) tok.beta = beta[bt * beta_width + (beta_width == 1 ? 0 : h)];
        PTO_ISA_DISPATCH(linear_attention_token, tok);
      }
    }
  });
  if (c.num_outputs > 1) out.push_back(std::move(state));
  return out;
}

std::vector<Tensor> run_causal_conv(const KernelContext& c) {
  const Tensor &x = c.input(0), &w = c.input(1);
  const std::string act = c.attrs().get_string("activation", "none");
  if ((act != "none" && act != "silu" && act != "swish") || x.rank() != 3 || w.rank() != 3 ||
      w.dim(0) != x.dim(1) || w.dim(1) != 1 || w.dim(2) < 1)
    return run_reference(c);
  const int64_t B = x.dim(0), C = x.dim(1), L = x.dim(2), k = w.dim(2), P = k - 1;
  if ((c.has_input(2) && c.input(2).shape() != Dims{C}) ||
      (c.has_input(3) && c.input(3).shape() != Dims{B, C, P}))
    return run_reference(c);
  std::vector<Tensor> out;
  out.push_back(Tensor::empty(DType::kF32, x.shape()));
  Tensor state = Tensor::empty(DType::kF32, {B, C, P});
  const float *px = x.data<float>(), *pw = w.data<float>();
  const float* bias = c.has_input(2) ? c.input(2).data<float>() : nullptr;
  const float* past = c.has_input(3) ? c.input(3).data<float>() : nullptr;
  float *py = out[0].data<float>(), *ps = state.data<float>();
  const bool silu = act != "none";
  parallel_for(0, B * C, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, L * k)),
               [&](int64_t r0, int64_t r1) {
                 std::vector<float> row(static_cast<size_t>(P + L));
                 for (int64_t r = r0; r < r1; ++r) {
                   const int64_t ch = r % C;
                   if (past)
                     std::memcpy(row.data(), past + r * P, P * sizeof(float));
                   else
                     std::fill(row.begin(), row.begin() + P, 0.0f);
                   std::memcpy(row.data() + P, px + r * L, L * sizeof(float));
                   PTO_ISA_DISPATCH(causal_conv_row, row.data(), L, pw + ch * k, k,
                                    bias ? bias[ch] : 0.0f, silu, py + r * L);
                   std::memcpy(ps + r * P, row.data() + L, P * sizeof(float));
                 }
               });
  if (c.num_outputs > 1) out.push_back(std::move(state));
  return out;
}

}  // namespace

void register_linear_attention_kernels(KernelRegistry& r) {
  r.add("LinearAttention",
        {.accepts = all_f32, .run = run_linear_attention, .reference_at_run_time = true});
  r.add("CausalConvWithState",
        {.accepts = all_f32, .run = run_causal_conv, .reference_at_run_time = true});
}

}  // namespace pto::cpu
