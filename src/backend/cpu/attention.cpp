// The CPU kernel for Attention (4-D, float32): softmax(Q K^T * scale + mask) V computed one block
// of query rows at a time, so the [q, kv] score matrix of a head never exists whole in memory.
//
// For each (batch, head, block of R query rows), on one thread:
//   S = scale * Q[rows] K^T           an R x L GEMM into a per-thread scratch block (L2-sized)
//   S += mask; S = -inf where causal  row by row, the mask broadcast as ONNX states it
//   P = softmax(S) per row            a row with no visible key becomes zeros (as the reference)
//   Y[rows] = P V                     an R x Dv GEMM straight into the output
// R is chosen so that the score block stays in L2 (at least 8 rows, at most 64). The GEMMs run
// on the calling thread (sgemm inside a parallel region does), the (b, h, block) tasks are spread
// over the pool.
//
// What the fast path does not cover goes to the reference kernel at run time: 3-D (packed-head)
// inputs, a KV cache, nonpad_kv_seqlen, softcap, windows, extra outputs, a mask whose last axis
// is not the key length.
#include <cmath>
#include <limits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/reduce_kernels.h"
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
  return n.node.outputs.size() == 1 && a.softcap == 0.0 && a.qk_matmul_output_mode == 0 &&
         a.left_window_size == -1 && a.right_window_size == -1;
}

// The mask broadcast to [B, H, Sq, L]: additive float values (a boolean mask as 0 / -inf), the
// element strides of its first three axes (0 where broadcast; the key axis is contiguous), and
// for each of its rows the first key not at -inf (L when none: the row sees no key).
struct MaskView {
  const float* raw = nullptr;    // a float mask's own data
  std::vector<float> converted;  // a boolean mask's additive form
  std::vector<int64_t> first_visible;
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
  v.first_visible.resize(static_cast<size_t>(L ? m.numel() / L : 0));
  for (size_t row = 0; row < v.first_visible.size(); ++row) {
    int64_t j = 0;
    while (j < L && v.values()[row * L + j] == kNegInf) ++j;
    v.first_visible[row] = j;
  }
  return v;
}

std::vector<Tensor> run_attention(const KernelContext& c) {
  for (size_t i = 4; i < c.inputs.size(); ++i)
    if (c.has_input(i)) return run_reference(c);
  if (c.num_outputs != 1) return run_reference(c);
  const Tensor &Q = c.input(0), &K = c.input(1), &V = c.input(2);
  if (Q.rank() != 4 || K.rank() != 4 || V.rank() != 4) return run_reference(c);
  const int64_t B = Q.dim(0), H = Q.dim(1), Sq = Q.dim(2), D = Q.dim(3);
  const int64_t Hkv = K.dim(1), L = K.dim(2), Dv = V.dim(3);
  if (K.dim(0) != B || V.dim(0) != B || V.dim(1) != Hkv || V.dim(2) != L || K.dim(3) != D ||
      Hkv == 0 || H % Hkv != 0)
    return run_reference(c);  // it raises the error
  const int64_t full[4] = {B, H, Sq, L};
  std::optional<MaskView> mask;
  if (c.has_input(3)) {
    mask = mask_view(c.input(3), full);
    if (!mask) return run_reference(c);
  }
  const params::Attention a = params::attention(c.node);
  const auto scale = static_cast<float>(a.scale_for(D));
  const bool causal = a.is_causal;
  const int64_t group = H / Hkv;

  Tensor y = Tensor::empty(DType::kF32, {B, H, Sq, Dv});
  if (y.numel() == 0) return {y};
  if (L == 0) {
    std::fill_n(y.data<float>(), y.numel(), 0.0f);
    return {y};
  }
  // Rows per block: the R x L score block within half of L2.
  const auto l2 = static_cast<int64_t>(cache_model().l2);
  const int64_t rows = std::clamp<int64_t>(l2 / 2 / (L * 4), 8, 256);
  const int64_t blocks = (Sq + rows - 1) / rows;
  const float *qp = Q.data<float>(), *kp = K.data<float>(), *vp = V.data<float>();
  float* yp = y.data<float>();
  const int64_t work_per_task = rows * L * (D + Dv);
  parallel_for(0, B * H * blocks, std::max<int64_t>(1, kParallelGrain / work_per_task),
               [&](int64_t t0, int64_t t1) {
                 float* s = scratch_as<float>(static_cast<size_t>(rows * L + rows), 3);
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t bh = t / blocks, i0 = t % blocks * rows;
                   const int64_t b = bh / H, h = bh % H, hk = h / group;
                   const int64_t r = std::min(rows, Sq - i0);
                   const float* q = qp + (bh * Sq + i0) * D;
                   const float* k = kp + (b * Hkv + hk) * L * D;
                   const float* v = vp + (b * Hkv + hk) * L * Dv;
                   GemmArgs qk{.m = r,
                               .n = L,
                               .k = D,
                               .a = q,
                               .lda = D,
                               .b = k,
                               .ldb = D,
                               .trans_b = true,
                               .c = s,
                               .ldc = L,
                               .alpha = scale};
                   sgemm(qk);
                   // Mask and causal limit per row; then one softmax over the block's rows,
                   // and rows with no visible key set to zeros (as the reference defines them).
                   bool* hidden = reinterpret_cast<bool*>(s + rows * L);
                   for (int64_t i = 0; i < r; ++i) {
                     float* row = s + i * L;
                     const int64_t qi = i0 + i;
                     const int64_t limit = causal ? std::min(qi + 1, L) : L;
                     int64_t first_visible = 0;
                     if (mask) {
                       const int64_t off =
                           b * mask->stride[0] + h * mask->stride[1] + qi * mask->stride[2];
                       const float* m = mask->values() + off;
                       for (int64_t j = 0; j < L; ++j) row[j] += m[j];
                       first_visible = mask->first_visible[off / L];
                     }
                     std::fill(row + limit, row + L, kNegInf);
                     hidden[i] = first_visible >= limit;
                   }
                   PTO_ISA_DISPATCH(softmax_rows, s, s, r, L, false);
                   for (int64_t i = 0; i < r; ++i)
                     if (hidden[i]) std::fill_n(s + i * L, L, 0.0f);
                   GemmArgs pv{.m = r,
                               .n = Dv,
                               .k = L,
                               .a = s,
                               .lda = L,
                               .b = v,
                               .ldb = Dv,
                               .c = yp + (bh * Sq + i0) * Dv,
                               .ldc = Dv};
                   sgemm(pv);
                 }
               });
  return {y};
}

}  // namespace

void register_attention_kernels(KernelRegistry& r) {
  r.add("Attention",
        {.accepts = accepts_attention, .run = run_attention, .reference_at_run_time = true});
}

}  // namespace pto::cpu
