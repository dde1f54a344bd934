// Reference kernels for Attention, RMSNormalization and RotaryEmbedding, written as the ONNX spec
// states them, one output element at a time, in double precision.
#include <cmath>
#include <limits>

#include "cast.h"
#include "ir/ops/op_params.h"
#include "kernel_util.h"
#include "nn_kernels.h"

namespace pto::reference {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A [B, H, S, D] view over either a 4-D tensor or a 3-D [B, S, H*D] one; a 3-D one may be
// columns [col, col + H*D) of a wider [B, S, width] tensor (qkv_split).
struct Heads {
  const std::vector<double>* data;
  int64_t B, H, S, D;
  bool packed;  // 3-D [B, S, width]
  int64_t col, width;
  double at(int64_t b, int64_t h, int64_t s, int64_t d) const {
    if (packed) return (*data)[(b * S + s) * width + col + h * D + d];
    return (*data)[((b * H + h) * S + s) * D + d];
  }
};

// `part` = {col, columns} of a 3-D t (qkv_split), or {0, 0}: all of t.
Heads heads_of(const Tensor& t, const std::vector<double>& data, int64_t num_heads,
               const std::string& what, const std::string& where,
               std::pair<int64_t, int64_t> part = {0, 0}) {
  if (t.rank() == 4) return {&data, t.dim(0), t.dim(1), t.dim(2), t.dim(3), false, 0, 0};
  const int64_t columns = part.second ? part.second : t.dim(2);
  if (num_heads <= 0 || columns % num_heads != 0)
    throw ValueError(cat(where, ": 3-D ", what, " of shape ", dims_str(t.shape()),
                         " needs a head count that divides its last dimension (got ", num_heads,
                         ")"));
  return {&data, t.dim(0), num_heads, t.dim(1), columns / num_heads, true, part.first, t.dim(2)};
}

std::vector<Tensor> attention(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor &Q = c.input(0), &K = c.input(1), &V = c.input(2);
  if (Q.rank() != K.rank() || Q.rank() != V.rank() || (Q.rank() != 3 && Q.rank() != 4))
    throw ValueError(cat(w, ": Q, K and V must all be 3-D or all 4-D, got ", Q.str(), ", ", K.str(),
                         ", ", V.str()));
  if (K.dtype() != Q.dtype() || V.dtype() != Q.dtype())
    throw TypeError(cat(w, ": Q, K and V must share a dtype"));
  const auto& a = c.attrs();
  const params::Attention p = params::attention(c.node);
  const int64_t q_heads_attr = p.q_num_heads;
  const int64_t kv_heads_attr = p.kv_num_heads;
  if (Q.rank() == 4 && c.node.opset >= 25 && (a.has("q_num_heads") || a.has("kv_num_heads")))
    throw ValueError(cat(w, ": q_num_heads and kv_num_heads must not be set for 4-D inputs"));
  const bool causal = p.is_causal;
  const int64_t mode = p.qk_matmul_output_mode;
  const double softcap = p.softcap;
  const int64_t left = p.left_window_size;
  const int64_t right = p.right_window_size;
  if (left < -1 || right < -1) throw ValueError(cat(w, ": window sizes must be -1 or >= 0"));
  if (mode < 0 || mode > 3) throw ValueError(cat(w, ": qk_matmul_output_mode must be 0..3"));

  // qkv_split: Q, K and V are the parts of input 0 (inputs 1 and 2 are the same tensor).
  const std::vector<int64_t>& split = p.qkv_split;
  std::pair<int64_t, int64_t> parts[3] = {};
  if (!split.empty()) {
    if (split.size() != 3 || Q.rank() != 3 || split[0] <= 0 || split[1] <= 0 || split[2] <= 0 ||
        split[0] + split[1] + split[2] != Q.dim(2) || K.shape() != Q.shape() ||
        V.shape() != Q.shape())
      throw ValueError(cat(w, ": qkv_split ", dims_str(split), " needs one 3-D input whose ",
                           "last dimension is their sum, got ", Q.str()));
    parts[0] = {0, split[0]};
    parts[1] = {split[0], split[1]};
    parts[2] = {split[0] + split[1], split[2]};
  }
  // Under precision="bf16" / "f16" Q, K, V (and a cache) are rounded as product operands.
  std::vector<double> qd = product_operand(c, Q, w), kd = product_operand(c, K, w),
                      vd = product_operand(c, V, w);
  Heads q = heads_of(Q, qd, q_heads_attr, "Q", w, parts[0]);
  Heads k = heads_of(K, kd, kv_heads_attr, "K", w, parts[1]);
  Heads v = heads_of(V, vd, kv_heads_attr, "V", w, parts[2]);
  const int64_t B = q.B, Hq = q.H, Sq = q.S, Dq = q.D, Hkv = k.H, Dv = v.D;
  if (k.B != B || v.B != B || v.H != Hkv || v.S != k.S || k.D != Dq)
    throw ValueError(cat(w, ": Q ", Q.str(), ", K ", K.str(), " and V ", V.str(),
                         " have inconsistent batch, head, sequence or head sizes"));
  if (Hkv == 0 || Hq % Hkv != 0)
    throw ValueError(cat(w, ": ", Hq, " query heads are not a multiple of ", Hkv, " KV heads"));

  // The KV cache: present = concat(past, new) along the sequence axis.
  const bool has_past = c.has_input(4) || c.has_input(5);
  if (has_past && !(c.has_input(4) && c.has_input(5)))
    throw ValueError(cat(w, ": past_key and past_value must be given together"));
  int64_t P = 0;
  std::vector<double> pk, pv;
  if (has_past) {
    const Tensor &PK = c.input(4), &PV = c.input(5);
    if (PK.rank() != 4 || PV.rank() != 4 || PK.dim(0) != B || PK.dim(1) != Hkv || PK.dim(3) != Dq ||
        PV.dim(0) != B || PV.dim(1) != Hkv || PV.dim(2) != PK.dim(2) || PV.dim(3) != Dv)
      throw ValueError(cat(w, ": past_key ", PK.str(), " / past_value ", PV.str(),
                           " do not match [batch, kv_heads, past, head_size]"));
    P = PK.dim(2);
    pk = product_operand(c, PK, w);
    pv = product_operand(c, PV, w);
  }
  std::vector<int64_t> nonpad;
  if (c.has_input(6)) {
    if (has_past) throw ValueError(cat(w, ": nonpad_kv_seqlen cannot be used with a past cache"));
    nonpad = to_int64s(c.input(6), w);
    if (static_cast<int64_t>(nonpad.size()) != B)
      throw ValueError(cat(w, ": nonpad_kv_seqlen must hold one length per batch"));
  }
  const int64_t L = P + k.S;
  std::vector<double> kk(B * Hkv * L * Dq), vv(B * Hkv * L * Dv);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = 0; j < L; ++j) {
        for (int64_t d = 0; d < Dq; ++d)
          kk[((b * Hkv + h) * L + j) * Dq + d] =
              j < P ? pk[((b * Hkv + h) * P + j) * Dq + d] : k.at(b, h, j - P, d);
        for (int64_t d = 0; d < Dv; ++d)
          vv[((b * Hkv + h) * L + j) * Dv + d] =
              j < P ? pv[((b * Hkv + h) * P + j) * Dv + d] : v.at(b, h, j - P, d);
      }

  // The mask broadcasts to [B, Hq, Sq, L]; a shorter last axis is padded with "masked".
  std::vector<double> mask;
  Dims mdims(4, 1);
  bool mask_bool = false;
  if (c.has_input(3)) {
    const Tensor& M = c.input(3);
    if (M.rank() > 4 || M.rank() < 1) throw ValueError(cat(w, ": attn_mask rank must be 1..4"));
    for (int64_t i = 0; i < M.rank(); ++i) mdims[4 - M.rank() + i] = M.dim(i);
    const int64_t full[3] = {B, Hq, Sq};
    for (int i = 0; i < 3; ++i)
      if (mdims[i] != 1 && mdims[i] != full[i])
        throw ValueError(cat(w, ": attn_mask ", M.str(), " does not broadcast to [", B, ", ", Hq,
                             ", ", Sq, ", ", L, "]"));
    if (mdims[3] > L)
      throw ValueError(cat(w, ": attn_mask's last dimension ", mdims[3], " exceeds ", L));
    if (p.mask_broadcast && mdims[3] != L && mdims[3] != 1)
      throw ValueError(cat(w, ": attn_mask ", M.str(), " does not broadcast to the scores [", B,
                           ", ", Hq, ", ", Sq, ", ", L, "] (mask_broadcast)"));
    mask_bool = M.dtype() == DType::kBool;
    mask = to_doubles(M, w);
  }
  auto mask_at = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    if (mask.empty()) return 0.0;
    if (p.mask_broadcast && mdims[3] == 1) j = 0;  // the same for every key
    if (j >= mdims[3]) return kNegInf;
    int64_t idx = (((mdims[0] == 1 ? 0 : b) * mdims[1] + (mdims[1] == 1 ? 0 : h)) * mdims[2] +
                   (mdims[2] == 1 ? 0 : i)) *
                      mdims[3] +
                  j;
    double m = mask[idx];
    return mask_bool ? (m != 0 ? 0.0 : kNegInf) : m;
  };

  const double scale = p.scale_for(Dq);
  const int64_t group = Hq / Hkv;
  const std::optional<DType> precision = params::product_precision(c.node);  // known: above
  std::vector<double> y(B * Hq * Sq * Dv), qk_out(B * Hq * Sq * L);
  std::vector<double> raw(L), biased(L), prob(L), weight(L);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t offset = has_past ? P : (nonpad.empty() ? 0 : nonpad[b] - Sq);
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < Sq; ++i) {
        double bias_max = kNegInf;
        for (int64_t j = 0; j < L; ++j) {
          double bias = mask_at(b, h, i, j);
          const int64_t diff = i + offset - j;
          if (causal && diff < 0) bias += kNegInf;
          if ((left >= 0 && diff > left) || (right >= 0 && -diff > right)) bias += kNegInf;
          if (!nonpad.empty() && j >= nonpad[b]) bias += kNegInf;
          double s = 0;
          for (int64_t d = 0; d < Dq; ++d)
            s += q.at(b, h, i, d) * kk[((b * Hkv + hk) * L + j) * Dq + d];
          s *= scale;
          if (softcap > 0) s = softcap * std::tanh(s / softcap);
          raw[j] = s;
          biased[j] = s + bias;
          bias_max = std::max(bias_max, bias);
        }
        // Softmax; a row with no attendable key gives all zeros.
        double m = kNegInf;
        for (double x : biased) m = std::max(m, x);
        double sum = 0;
        for (int64_t j = 0; j < L; ++j)
          sum += prob[j] = std::isinf(m) && m < 0 ? 0.0 : std::exp(biased[j] - m);
        // Under a precision, P V takes the unnormalized exp(s - max) rounded (the sum is not).
        weight = prob;
        if (*precision != DType::kF32)
          dispatch(*precision, kFloatTypes, w, [&]<class H>() {
            for (double& x : weight) x = static_cast<float>(cast_value<H>(x));
          });
        for (int64_t j = 0; j < L; ++j) {
          const bool none = bias_max == kNegInf || sum == 0;
          prob[j] = none ? 0.0 : prob[j] / sum;
          weight[j] = none ? 0.0 : weight[j] / sum;
        }
        for (int64_t j = 0; j < L; ++j) {
          double o = mode == 3 ? prob[j] : mode == 2 ? biased[j] : raw[j];
          qk_out[((b * Hq + h) * Sq + i) * L + j] = o;
        }
        for (int64_t d = 0; d < Dv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < L; ++j) acc += weight[j] * vv[((b * Hkv + hk) * L + j) * Dv + d];
          if (Q.rank() == 4)
            y[((b * Hq + h) * Sq + i) * Dv + d] = acc;
          else
            y[((b * Sq + i) * Hq + h) * Dv + d] = acc;
        }
      }
    }
  }
  Dims yshape = Q.rank() == 4 ? Dims{B, Hq, Sq, Dv} : Dims{B, Sq, Hq * Dv};
  std::vector<Tensor> out = {from_doubles(Q.dtype(), yshape, y, w)};
  if (c.num_outputs > 1) out.push_back(from_doubles(Q.dtype(), {B, Hkv, L, Dq}, kk, w));
  if (c.num_outputs > 2) out.push_back(from_doubles(Q.dtype(), {B, Hkv, L, Dv}, vv, w));
  if (c.num_outputs > 3) out.push_back(from_doubles(Q.dtype(), {B, Hq, Sq, L}, qk_out, w));
  return out;
}

std::vector<Tensor> rms_normalization(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const Tensor& S = c.input(1);
  const params::Norm p = params::norm(c.node);
  const int64_t axis = normalize_axis(p.axis, X.rank(), w);
  const double eps = p.epsilon;
  if (broadcast_dims(X.shape(), S.shape(), w) != X.shape())
    throw ValueError(cat(w, ": scale ", S.str(), " does not broadcast to X ", X.str()));
  std::vector<double> x = to_doubles(X, w), s = to_doubles(S, w);
  std::vector<int64_t> soff = broadcast_offsets(S.shape(), X.shape());
  int64_t inner = 1;
  for (int64_t i = axis; i < X.rank(); ++i) inner *= X.dim(i);
  std::vector<double> y(x.size());
  for (int64_t row = 0; inner > 0 && row < X.numel() / inner; ++row) {
    double ss = 0;
    for (int64_t k = 0; k < inner; ++k) ss += x[row * inner + k] * x[row * inner + k];
    const double inv = 1.0 / std::sqrt(ss / inner + eps);
    for (int64_t k = 0; k < inner; ++k) {
      int64_t i = row * inner + k;
      y[i] = x[i] * inv * s[soff[i]];
    }
  }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

std::vector<Tensor> rotary_embedding(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const Tensor& Cos = c.input(1);
  const Tensor& Sin = c.input(2);
  const auto& a = c.attrs();
  std::vector<double> x = to_doubles(X, w);
  Heads in = heads_of(X, x, a.get_int("num_heads", 0), "input", w);
  const int64_t B = in.B, H = in.H, S = in.S, D = in.D;
  const int64_t rot =
      c.node.attr_int("rotary_embedding_dim") ? a.get_int("rotary_embedding_dim") : D;
  if (rot <= 0 || rot > D || rot % 2)
    throw ValueError(cat(w, ": rotary_embedding_dim ", rot, " must be even and at most ", D));
  const int64_t half = rot / 2;
  const bool interleaved = c.node.attr_int("interleaved") != 0;
  if (Cos.shape() != Sin.shape() || Cos.rank() < 2 || Cos.dim(-1) != half)
    throw ValueError(cat(w, ": cos/sin caches ", Cos.str(), ", ", Sin.str(),
                         " must match and end in rotary_embedding_dim/2 = ", half));
  std::vector<double> cs = to_doubles(Cos, w), sn = to_doubles(Sin, w);
  std::vector<int64_t> pos;
  if (c.has_input(3)) {
    const Tensor& Pid = c.input(3);
    if (Pid.rank() != 2 || Pid.dim(0) != B || Pid.dim(1) != S || Cos.rank() != 2)
      throw ValueError(
          cat(w, ": position_ids ", Pid.str(), " must be [", B, ", ", S, "] with 2-D caches"));
    Tensor flat = Pid.reshape({Pid.numel()});
    pos = to_int64s(flat, w);
    for (int64_t p : pos)
      if (p < 0 || p >= Cos.dim(0))
        throw ValueError(cat(w, ": position id ", p, " is outside the cache of ", Cos.dim(0)));
  } else if (Cos.rank() != 3 || Cos.dim(0) != B || Cos.dim(1) != S) {
    throw ValueError(cat(w, ": without position_ids the caches must be [", B, ", ", S, ", ", half,
                         "], got ", Cos.str()));
  }
  std::vector<double> y(x.size());
  auto out_index = [&](int64_t b, int64_t h, int64_t s, int64_t d) {
    return in.packed ? ((b * S + s) * H + h) * D + d : ((b * H + h) * S + s) * D + d;
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t row = pos.empty() ? b * S + s : pos[b * S + s];
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = rot; d < D; ++d) y[out_index(b, h, s, d)] = in.at(b, h, s, d);
        for (int64_t k = 0; k < half; ++k) {
          const double co = cs[row * half + k], si = sn[row * half + k];
          const int64_t d1 = interleaved ? 2 * k : k, d2 = interleaved ? 2 * k + 1 : k + half;
          const double x1 = in.at(b, h, s, d1), x2 = in.at(b, h, s, d2);
          y[out_index(b, h, s, d1)] = co * x1 - si * x2;
          y[out_index(b, h, s, d2)] = si * x1 + co * x2;
        }
      }
    }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

}  // namespace

void register_attention_kernels(KernelRegistry& r) {
  r.add("Attention", attention);
  r.add("RMSNormalization", rms_normalization);
  r.add("RotaryEmbedding", rotary_embedding);
}

}  // namespace pto::reference
