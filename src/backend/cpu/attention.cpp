// The CPU kernel for Attention (4-D, float32): softmax(Q K^T * scale + mask) V computed
// flash-style, so neither the [q, kv] score matrix of a head nor a full row of it ever exists.
//
// A task is (batch, kv head, range of query positions) for all the query heads of that kv head
// (grouped-query attention shares K and V); its rows of Q are gathered once. The keys go in
// chunks: each chunk of K^T and V is packed once into per-thread scratch and, for all the task's
// rows,
//   S = scale * Q Kc^T            (rows x chunk GEMM on the packed K^T)
//   S += mask, causal limit       online softmax: per-row running max m and sum l, S = exp(S - m),
//                                 corr = exp(m_old - m) (attention_impl.h)
//   O = O * corr + S Vc           (rows x Dv GEMM on the packed V, then one pass over O)
// and at the end Y = O / l; a row that saw no key (l = 0) gives zeros (as the reference). Chunks
// no row of the task can see are skipped: past the last query's causal limit (top-left: query i
// sees keys <= i), and outside the span of keys the task's mask rows leave visible (padding).
// Only chunks that cross a row's causal limit apply it. Task and chunk sizes come from
// plan_attention (attention_plan.h); PTO_ATTENTION_TILES="rows,block[,splits]" overrides them
// (tests, A/B measurements). The GEMMs run on the calling thread (sgemm inside a parallel region
// does), the tasks are spread over the pool.
//
// Decode (a task of at most kDecodeRows rows: one or a few queries of a group): no packing, the
// ISA kernel attention_decode_chunk computes the chunk's scores straight from the K rows (each
// read once for all the task's rows), the same softmax step, and O = O * corr + P Vc from the V
// rows. Split-K (plan.splits > 1, few tasks for the threads): each task's keys are cut into
// ranges that run as tasks of their own, each leaving its O, m and l in `partial`; a second
// parallel loop merges the ranges of each row in order (log-sum-exp weights), so the bits depend
// only on the sizes and the thread count.
//
// Q, K, V and Y are 4-D [B, H, S, D] or 3-D [B, S, H*D] (ONNX's packed heads): the kernel reads
// and writes rows of D at strides (HeadRows), so the head-split transposes around it need no
// copies (FoldAttentionHeads). With PyPTO's qkv_split, Q, K and V are the column ranges of one
// [B, S, width] input (a merged Q/K/V projection), read in place.
//
// A mask that is exactly the top-left causal pattern (is_causal_mask) runs as is_causal without it.
//
// precision="bf16" or "f16" (AutoMixedPrecision, as torch.autocast runs SDPA in bf16): both
// products take their operands rounded to that type (Q, K, V, and the chunk's unnormalized
// probabilities exp(S - m)), accumulating in fp32; the softmax, its running sums and the
// rescaling stay fp32. bf16 products run on AMX tiles or VDPBF16PS where the CPU has them (K^T
// and V chunks packed as pairs), f16 ones on rounded floats. The decode kernel (a few rows, bound
// by reading K and V) computes in fp32 whatever the precision: more exact, no slower.
//
// softcap (Gemma-2's c tanh(s / c) on the scaled scores, before the mask) is applied in the
// online softmax's first pass over each chunk of scores.
//
// What the fast path does not cover goes to the reference kernel at run time: a KV cache,
// nonpad_kv_seqlen, windows, extra outputs, a mask whose last axis is not the key
// length, shapes that do not agree (the reference raises).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "backend/cpu/attention_kernels.h"
#include "backend/cpu/attention_plan.h"
#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "ir/ops/op_params.h"
#include "pto/device_info.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool accepts_attention(const NodeInfo& n) {
  const params::Attention a = params::attention(n.node);
  for (size_t i = 0; i < 3; ++i)
    if (n.dtype(i) != DType::kF32) return false;
  for (size_t i = 4; i < n.inputs.size(); ++i)
    if (n.dtype(i) != DType::kUndefined) return false;  // KV cache, nonpad lengths
  if (n.dtype(3) != DType::kUndefined && n.dtype(3) != DType::kF32 && n.dtype(3) != DType::kBool)
    return false;
  return n.node.outputs.size() == 1 && a.qk_matmul_output_mode == 0 && a.left_window_size == -1 &&
         a.right_window_size == -1 && precision_of(n.node).has_value();
}

// The mask broadcast to [B, H, Sq, L]: additive float values (a boolean mask as 0 / -inf), the
// element strides of its first three axes (0 where broadcast; the key axis is contiguous), and
// for each of its rows the span of keys not at -inf: [first, end), empty (first = L, end = 0)
// when the row sees no key.
struct MaskView {
  const float* raw = nullptr;    // a float mask's own data
  std::vector<float> converted;  // a boolean mask's additive form
  std::vector<int64_t> first_visible, end_visible;
  int64_t stride[3] = {0, 0, 0};
  const float* values() const { return raw ? raw : converted.data(); }
};

std::optional<MaskView> mask_view(const Tensor& m, const int64_t full[4]) {
  if (m.rank() < 1 || m.rank() > 4) return std::nullopt;
  int64_t dims[4] = {1, 1, 1, 1};
  for (int64_t i = 0; i < m.rank(); ++i) dims[4 - m.rank() + i] = m.dim(i);
  if (dims[3] != full[3]) return std::nullopt;  // a shorter key axis pads as masked: reference
  for (int i = 0; i < 3; ++i)
    if (dims[i] != 1 && dims[i] != full[i]) return std::nullopt;  // the reference raises
  MaskView v;
  int64_t stride = dims[3];
  for (int i = 2; i >= 0; --i) {
    v.stride[i] = dims[i] == 1 ? 0 : stride;
    stride *= dims[i];
  }
  if (m.dtype() == DType::kBool) {
    const bool* p = m.data<bool>();
    v.converted.resize(static_cast<size_t>(m.numel()));
    for (int64_t i = 0; i < m.numel(); ++i) v.converted[i] = p[i] ? 0.0f : kNegInf;
  } else {
    v.raw = m.data<float>();
  }
  const int64_t L = dims[3];
  const size_t rows = static_cast<size_t>(L ? m.numel() / L : 0);
  v.first_visible.resize(rows);
  v.end_visible.resize(rows);
  for (size_t row = 0; row < rows; ++row) {
    const float* x = v.values() + row * L;
    int64_t j = 0, e = L;
    while (j < L && x[j] == kNegInf) ++j;
    while (e > j && x[e - 1] == kNegInf) --e;
    v.first_visible[row] = j;
    v.end_visible[row] = j < L ? e : 0;
  }
  return v;
}

// Where the rows of one operand lie: position s of head h in batch b starts at
// base + col + b * sb + h * sh + s * ss, its D values contiguous.
template <typename T>
struct HeadRows {
  T* base = nullptr;
  int64_t sb = 0, sh = 0, ss = 0, col = 0;
  T* row(int64_t b, int64_t h, int64_t s) const { return base + col + b * sb + h * sh + s * ss; }
};

// The sizes of a call and where its operands' rows lie (offsets from each input's data): 4-D
// [B, H, S, D], or 3-D [B, S, width] with head h at columns col + h * D.
struct Operands {
  int64_t B = 0, H = 0, Hkv = 0, Sq = 0, L = 0, D = 0, Dv = 0;
  bool packed = false;  // 3-D: Y is [B, Sq, H * Dv]
  HeadRows<const float> q, k, v;
};

HeadRows<const float> rows_4d(const Dims& t) {
  return {nullptr, t[1] * t[2] * t[3], t[2] * t[3], t[3], 0};
}

HeadRows<const float> rows_3d(const Dims& t, int64_t col, int64_t head) {
  return {nullptr, t[1] * t[2], head, t[2], col};
}

// The call's sizes and strides from the shapes of Q, K and V; nullopt when they do not agree.
std::optional<Operands> operands_of(const Dims& Q, const Dims& K, const Dims& V,
                                    const params::Attention& a) {
  Operands o;
  if (Q.size() == 4 && K.size() == 4 && V.size() == 4 && a.qkv_split.empty()) {
    o.B = Q[0], o.H = Q[1], o.Sq = Q[2], o.D = Q[3], o.Hkv = K[1], o.L = K[2], o.Dv = V[3];
    if (K[0] != o.B || V[0] != o.B || V[1] != o.Hkv || V[2] != o.L || K[3] != o.D)
      return std::nullopt;
    o.q = rows_4d(Q), o.k = rows_4d(K), o.v = rows_4d(V);
  } else if (Q.size() == 3 && K.size() == 3 && V.size() == 3) {
    o.packed = true;
    o.B = Q[0], o.H = a.q_num_heads, o.Hkv = a.kv_num_heads, o.Sq = Q[1], o.L = K[1];
    int64_t wq = Q[2], wk = K[2], wv = V[2], kcol = 0, vcol = 0;
    if (!a.qkv_split.empty()) {
      const std::vector<int64_t>& s = a.qkv_split;
      if (s.size() != 3 || s[0] <= 0 || s[1] <= 0 || s[2] <= 0 || s[0] + s[1] + s[2] != wq ||
          K != Q || V != Q)
        return std::nullopt;
      wq = s[0], wk = s[1], wv = s[2], kcol = s[0], vcol = s[0] + s[1];
    }
    if (o.H <= 0 || o.Hkv <= 0 || wq % o.H || wk % o.Hkv || wv % o.Hkv || K[0] != o.B ||
        V[0] != o.B || V[1] != o.L || wk / o.Hkv != wq / o.H)
      return std::nullopt;
    o.D = wq / o.H, o.Dv = wv / o.Hkv;
    o.q = rows_3d(Q, 0, o.D), o.k = rows_3d(K, kcol, o.D), o.v = rows_3d(V, vcol, o.Dv);
  } else {
    return std::nullopt;
  }
  if (o.Hkv == 0 || o.H % o.Hkv != 0) return std::nullopt;
  return o;
}

// PTO_ATTENTION_TILES="rows,block[,splits]": the plan's tiles replaced (0 keeps the planner's
// choice).
std::optional<AttentionTiles> tiles_from_env() {
  const char* e = std::getenv("PTO_ATTENTION_TILES");
  if (!e || !*e) return std::nullopt;
  AttentionTiles t;
  char* end = nullptr;
  const auto bad = [&] {
    return cat("PTO_ATTENTION_TILES: expected \"rows,block[,splits]\", got \"", e, "\"");
  };
  t.rows = std::strtoll(e, &end, 10);
  PTO_CHECK(*end == ',') << bad();
  t.block = std::strtoll(end + 1, &end, 10);
  if (*end == ',') t.splits = std::strtoll(end + 1, &end, 10);
  PTO_CHECK(*end == 0 && t.rows >= 0 && t.block >= 0 && t.splits >= 0) << bad();
  return t;
}

// The "attn.tiles" knob ({rows, block}; docs/tuning.md) when the group has it, else the env.
std::optional<AttentionTiles> tiles_of(const Knobs* knobs) {
  if (knobs)
    if (auto it = knobs->find("attn.tiles"); it != knobs->end())
      return AttentionTiles{it->second[0], it->second[1]};
  return tiles_from_env();
}

std::string check_attention_knob(const NodeInfo&, const std::string& knob,
                                 const std::vector<int64_t>& v, const std::string& where) {
  if (knob != "attn.tiles" || v.size() != 2 || v[0] < 1 || v[1] < 1 || v[0] > (1 << 20) ||
      v[1] > (1 << 20))
    throw ValueError(cat(where, ": takes the knob attn.tiles = {rows, block} (each in [1, 2^20]), ",
                         "got ", knob, "=", dims_str(v)));
  return cat("knob attn.tiles: ", v[0], " query rows per task, chunks of ", v[1], " keys");
}

// A task's buffers in the calling thread's scratch (one slot), 64-byte aligned: the scores, the
// packed K^T and V chunks, the gathered Q rows, the O accumulator and a chunk's P V, the
// per-row m, l and rescale factors, and the per-row mask pointers and causal limits.
struct TaskScratch {
  float *s, *k, *v, *q, *o, *pv, *m, *l, *corr;
  const float** mask;
  int64_t* limit;
  TaskScratch(const AttentionPlan& p, int64_t D, int64_t Dv) {
    const int64_t t = p.task_rows;
    const auto round = [](int64_t n) { return (n + 15) / 16 * 16; };
    const int64_t sizes[] = {t * p.block,
                             p.decode ? 0 : packed_b_floats(D, p.block),
                             p.decode ? 0 : packed_b_floats(p.block, Dv),
                             t * D,
                             t * Dv,
                             t * Dv,
                             t,
                             t,
                             t,
                             2 * t,  // pointers
                             2 * t};
    int64_t total = 0;
    for (const int64_t n : sizes) total += round(n);
    float* base = scratch_as<float>(static_cast<size_t>(total), 3);
    float* at[std::size(sizes)];
    for (size_t i = 0; i < std::size(sizes); ++i) {
      at[i] = base;
      base += round(sizes[i]);
    }
    s = at[0], k = at[1], v = at[2], q = at[3], o = at[4], pv = at[5], m = at[6], l = at[7];
    corr = at[8];
    mask = reinterpret_cast<const float**>(at[9]);
    limit = reinterpret_cast<int64_t*>(at[10]);
  }
};

std::vector<Tensor> run_attention(const KernelContext& c) {
  for (size_t i = 4; i < c.inputs.size(); ++i)
    if (c.has_input(i)) return run_reference(c);
  if (c.num_outputs != 1) return run_reference(c);
  const params::Attention a = params::attention(c.node);
  std::optional<Operands> ops =
      operands_of(c.input(0).shape(), c.input(1).shape(), c.input(2).shape(), a);
  if (!ops) return run_reference(c);  // it raises the error
  ops->q.base = c.input(0).data<float>();
  ops->k.base = c.input(1).data<float>();
  ops->v.base = c.input(2).data<float>();
  const int64_t B = ops->B, H = ops->H, Sq = ops->Sq, D = ops->D;
  const int64_t Hkv = ops->Hkv, L = ops->L, Dv = ops->Dv;
  const int64_t full[4] = {B, H, Sq, L};
  bool causal = a.is_causal;
  std::optional<MaskView> mask;
  if (c.has_input(3) && is_causal_mask(c.input(3), full)) {
    causal = true;  // the mask says no more than is_causal does
  } else if (c.has_input(3)) {
    mask = mask_view(c.input(3), full);
    if (!mask) return run_reference(c);
  }
  const auto scale = static_cast<float>(a.scale_for(D));
  const int64_t group = H / Hkv;
  const Precision precision = *precision_of(c.node);  // accepts_attention: one it knows

  Tensor y = Tensor::empty(DType::kF32, ops->packed ? Dims{B, Sq, H * Dv} : Dims{B, H, Sq, Dv});
  if (y.numel() == 0) return one(std::move(y));
  if (L == 0) {
    std::fill_n(y.data<float>(), y.numel(), 0.0f);
    return one(std::move(y));
  }
  const AttentionShape shape{B, H, Hkv, Sq, L, D, Dv, causal};
  const std::optional<AttentionTiles> tiles = tiles_of(c.knobs);
  const int64_t nr = packed_b_floats(1, 1);  // one register panel's width
  const AttentionPlan plan =
      plan_attention(shape, num_threads(), cache_model(), nr, tiles ? &*tiles : nullptr);
  const int64_t blocks = (Sq + plan.rows - 1) / plan.rows;
  const int64_t units = B * Hkv * blocks, parts = plan.splits;
  const int64_t partial_floats = plan.task_rows * (Dv + 2);  // O rows, m, l of one part
  std::vector<float> partial(static_cast<size_t>(parts > 1 ? units * parts * partial_floats : 0));
  const HeadRows<const float>&q_rows = ops->q, &k_rows = ops->k, &v_rows = ops->v;
  const HeadRows<float> y_rows =
      ops->packed ? HeadRows<float>{y.data<float>(), Sq * H * Dv, Dv, H * Dv, 0}
                  : HeadRows<float>{y.data<float>(), H * Sq * Dv, Sq * Dv, Dv, 0};
  // Row g * r + i of a task is head hk * group + g at position i0 + i: its output row.
  const auto y_row = [&](int64_t unit, int64_t g, int64_t i) {
    const int64_t bk = unit / blocks, i0 = unit % blocks * plan.rows;
    return y_rows.row(bk / Hkv, bk % Hkv * group + g, i0 + i);
  };
  parallel_for(0, units * parts, 1, [&](int64_t t0, int64_t t1) {
    const TaskScratch w(plan, D, Dv);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t unit = t / parts, part = t % parts;
      const int64_t bk = unit / blocks, i0 = unit % blocks * plan.rows;
      const int64_t b = bk / Hkv, hk = bk % Hkv;
      const int64_t r = std::min(plan.rows, Sq - i0), rows = group * r;
      // The task's rows: head hk * group + g, position i0 + i at row g * r + i.
      int64_t key_begin = 0, key_end = causal ? std::min(L, i0 + r) : L;
      int64_t mask_begin = L, mask_end = 0;
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t i = 0; i < r; ++i) {
          std::copy_n(q_rows.row(b, hk * group + g, i0 + i), D, w.q + (g * r + i) * D);
          w.limit[g * r + i] = i0 + i + 1;
          if (!mask) continue;
          const int64_t off =
              b * mask->stride[0] + (hk * group + g) * mask->stride[1] + (i0 + i) * mask->stride[2];
          w.mask[g * r + i] = mask->values() + off;
          mask_begin = std::min(mask_begin, mask->first_visible[off / L]);
          mask_end = std::max(mask_end, mask->end_visible[off / L]);
        }
      }
      if (mask) {
        key_begin = mask_begin;
        key_end = std::min(key_end, mask_end);
      }
      // This part's range of the keys (the split depends on the sizes only).
      key_begin = std::max(key_begin, part * L / parts);
      key_end = std::min(key_end, (part + 1) * L / parts);
      std::fill_n(w.o, rows * Dv, 0.0f);
      std::fill_n(w.m, rows, kNegInf);
      std::fill_n(w.l, rows, 0.0f);
      const float* k = k_rows.row(b, hk, 0);
      const float* v = v_rows.row(b, hk, 0);
      const int64_t ldk = k_rows.ss, ldv = v_rows.ss;
      for (int64_t j0 = key_begin; j0 < key_end; j0 += plan.block) {
        const int64_t n = std::min(plan.block, key_end - j0);
        // Only a chunk that reaches past the first query's position crosses a causal limit.
        const bool crosses = causal && j0 + n > i0 + 1;
        const SoftmaxChunk sm{.s = w.s,
                              .ld = plan.block,
                              .rows = rows,
                              .n = n,
                              .key0 = j0,
                              .mask = mask ? w.mask : nullptr,
                              .limit = crosses ? w.limit : nullptr,
                              .m = w.m,
                              .l = w.l,
                              .corr = w.corr,
                              .softcap = static_cast<float>(a.softcap)};
        if (plan.decode) {
          PTO_ISA_DISPATCH(attention_decode_chunk, DecodeChunk{.sm = sm,
                                                               .q = w.q,
                                                               .k = k + j0 * ldk,
                                                               .v = v + j0 * ldv,
                                                               .d = D,
                                                               .dv = Dv,
                                                               .ldk = ldk,
                                                               .ldv = ldv,
                                                               .scale = scale,
                                                               .o = w.o});
          continue;
        }
        pack_b_into(w.k, D, n, k + j0 * ldk, ldk, true, precision);
        pack_b_into(w.v, n, Dv, v + j0 * ldv, ldv, false, precision);
        sgemm_prepacked({.m = rows,
                         .n = n,
                         .k = D,
                         .a = w.q,
                         .lda = D,
                         .c = w.s,
                         .ldc = plan.block,
                         .alpha = scale,
                         .precision = precision},
                        w.k);
        PTO_ISA_DISPATCH(attention_softmax_chunk, sm);
        sgemm_prepacked({.m = rows,
                         .n = Dv,
                         .k = n,
                         .a = w.s,
                         .lda = plan.block,
                         .c = w.pv,
                         .ldc = Dv,
                         .precision = precision},
                        w.v);
        PTO_ISA_DISPATCH(attention_scale_rows, w.o, Dv, w.o, Dv, w.corr, w.pv, Dv, rows, Dv);
      }
      if (parts > 1) {  // the part's O, m and l, merged below
        float* out = partial.data() + t * partial_floats;
        std::copy_n(w.o, rows * Dv, out);
        std::copy_n(w.m, rows, out + plan.task_rows * Dv);
        std::copy_n(w.l, rows, out + plan.task_rows * (Dv + 1));
        continue;
      }
      // l = 0: no visible key, a row of zeros; l NaN (a NaN score): a row of NaN, as softmax's.
      for (int64_t i = 0; i < rows; ++i)
        w.corr[i] = w.l[i] > 0 || std::isnan(w.l[i]) ? 1.0f / w.l[i] : 0.0f;
      for (int64_t g = 0; g < group; ++g)
        PTO_ISA_DISPATCH(attention_scale_rows, y_row(unit, g, 0), y_rows.ss, w.o + g * r * Dv, Dv,
                         w.corr + g * r, nullptr, 0, r, Dv);
    }
  });
  if (parts == 1) return one(std::move(y));
  // Merge the parts of each row: m = max m_p, w_p = exp(m_p - m), Y = sum w_p O_p / sum w_p l_p
  // (parts in order: the same bits for the same thread count); no visible key in any part: 0.
  parallel_for(0, units, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t unit = u0; unit < u1; ++unit) {
      const int64_t r = std::min(plan.rows, Sq - unit % blocks * plan.rows);
      const float* base = partial.data() + unit * parts * partial_floats;
      for (int64_t row = 0; row < group * r; ++row) {
        float* yr = y_row(unit, row / r, row % r);
        float m = kNegInf;
        for (int64_t p = 0; p < parts; ++p)
          m = std::max(m, base[p * partial_floats + plan.task_rows * Dv + row]);
        if (m == kNegInf) {  // no visible key in any part: 0, or NaN where a score was NaN
          bool nan = false;
          for (int64_t p = 0; p < parts; ++p)
            nan = nan || std::isnan(base[p * partial_floats + plan.task_rows * (Dv + 1) + row]);
          std::fill_n(yr, Dv, nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
          continue;
        }
        float l = 0;
        for (int64_t p = 0; p < parts; ++p) {
          const float* part = base + p * partial_floats;
          const float mp = part[plan.task_rows * Dv + row];
          const float wp = mp == kNegInf ? 0.0f : std::exp(mp - m);
          l += wp * part[plan.task_rows * (Dv + 1) + row];
          PTO_ISA_DISPATCH(attention_scale_rows, yr, Dv, part + row * Dv, Dv, &wp, p ? yr : nullptr,
                           Dv, 1, Dv);
        }
        const float inv = 1.0f / l;
        PTO_ISA_DISPATCH(attention_scale_rows, yr, Dv, yr, Dv, &inv, nullptr, 0, 1, Dv);
      }
    }
  });
  return one(std::move(y));
}

// The plan for static 4-D shapes at the current thread count, for describe (the run plans again
// with its own thread count): nothing for other forms.
std::any prepare_attention(const NodeInfo& n) {
  Dims dims[3];
  for (size_t i = 0; i < 3; ++i) {
    if (!n.inputs[i].shape || !is_static(*n.inputs[i].shape)) return {};
    dims[i] = to_dims(*n.inputs[i].shape);
  }
  const params::Attention a = params::attention(n.node);
  const std::optional<Operands> o = operands_of(dims[0], dims[1], dims[2], a);
  if (!o) return {};
  const std::optional<AttentionTiles> tiles = tiles_of(n.knobs);
  return plan_attention({o->B, o->H, o->Hkv, o->Sq, o->L, o->D, o->Dv, a.is_causal}, num_threads(),
                        cache_model(), packed_b_floats(1, 1), tiles ? &*tiles : nullptr);
}

}  // namespace

// attention_plan.h. Whether mask `m` (broadcast to full = {B, H, Sq, L}) is exactly the top-left
// causal pattern, one row per query: query i sees keys [0, i] (every key once i >= L - 1) and no
// other, as boolean true / false or additive 0 / -inf. Decoders exported from transformers pass
// such a mask to SDPA (GPT-2: a [1, 1, S, S] boolean built from LessOrEqual) instead of is_causal.
// Such a mask then runs as is_causal without it: no mask pass per chunk, the chunks past the
// diagonal skipped (3/8 of the products at S = L = 128, towards half at longer ones), causal task
// sizes, and no float copy of a boolean mask made serially before the tasks start. A scan of the
// mask, vectorized, with early exit.
bool is_causal_mask(const Tensor& m, const int64_t full[4]) {
  if (m.rank() < 1 || m.rank() > 4 || (m.dtype() != DType::kBool && m.dtype() != DType::kF32))
    return false;
  int64_t dims[4] = {1, 1, 1, 1};
  for (int64_t i = 0; i < m.rank(); ++i) dims[4 - m.rank() + i] = m.dim(i);
  if (dims[3] != full[3] || dims[2] != full[2] || dims[3] <= 0 || dims[2] <= 0) return false;
  for (int i = 0; i < 2; ++i)
    if (dims[i] != 1 && dims[i] != full[i]) return false;  // mask_view's shapes, else reference
  const int64_t L = dims[3], S = dims[2], rows = m.numel() / L;
  if (m.dtype() == DType::kBool) {
    const auto* p = static_cast<const uint8_t*>(m.raw_data());  // bool: one byte, 0 or 1
    for (int64_t r = 0; r < rows; ++r) {
      const uint8_t* x = p + r * L;
      const int64_t e = std::min(L, r % S + 1);
      uint8_t all = 1, any = 0;
      for (int64_t j = 0; j < e; ++j) all &= x[j];
      for (int64_t j = e; j < L; ++j) any |= x[j];
      if (!all || any) return false;
    }
    return true;
  }
  const float* p = m.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = p + r * L;
    const int64_t e = std::min(L, r % S + 1);
    bool ok = true;
    for (int64_t j = 0; j < e; ++j) ok &= x[j] == 0.0f;
    for (int64_t j = e; j < L; ++j) ok &= x[j] == kNegInf;
    if (!ok) return false;
  }
  return true;
}

void register_attention_kernels(KernelRegistry& r) {
  r.add("Attention", {.accepts = accepts_attention,
                      .prepare = prepare_attention,
                      .run = run_attention,
                      .reference_at_run_time = true,
                      .describe =
                          [](const std::any& state) {
                            const auto* p = std::any_cast<AttentionPlan>(&state);
                            return p ? p->str() : std::string();
                          },
                      .check_knob = check_attention_knob});
}

}  // namespace pto::cpu
