// RotaryEmbedding (ONNX opset 23) on float32: each head's first rotary_embedding_dim values
// rotated by the cos/sin of its position, as pairs (x[k], x[k + half]) or, interleaved,
// (x[2k], x[2k + 1]); the rest of the head copied. Input [B, H, S, D], or [B, S, H * D] with
// num_heads; caches [positions, half] read at position_ids [B, S], or [B, S, half] without them.
// Anything else (other dtypes, bad shapes, positions outside the cache) goes to the reference
// kernel, which raises the error. Rows (b, s) run in parallel; the inner loops over k are plain
// float arithmetic the compiler vectorizes (the split form: contiguous halves).
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernel.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

constexpr int64_t kGrainValues = 16384;

std::vector<Tensor> run_rotary(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const Tensor& cos = c.input(1);
  const Tensor& sin = c.input(2);
  const bool has_pos = c.has_input(3);
  if (x.dtype() != DType::kF32 || cos.dtype() != DType::kF32 || sin.dtype() != DType::kF32 ||
      cos.shape() != sin.shape() || (x.rank() != 3 && x.rank() != 4))
    return run_reference(c);
  const int64_t heads = x.rank() == 4 ? x.dim(1) : c.node.attrs.get_int("num_heads", 0);
  if (heads <= 0 || (x.rank() == 3 && x.dim(2) % heads != 0)) return run_reference(c);
  const bool packed = x.rank() == 3;
  const int64_t B = x.dim(0), S = packed ? x.dim(1) : x.dim(2);
  const int64_t D = packed ? x.dim(2) / heads : x.dim(3);
  const int64_t rot =
      c.node.attr_int("rotary_embedding_dim") ? c.node.attr_int("rotary_embedding_dim") : D;
  if (rot <= 0 || rot > D || rot % 2) return run_reference(c);
  const int64_t half = rot / 2;
  if (cos.dim(-1) != half) return run_reference(c);
  std::vector<int64_t> rows(static_cast<size_t>(B * S));
  if (has_pos) {
    const Tensor& p = c.input(3);
    if (cos.rank() != 2 || p.rank() != 2 || p.dim(0) != B || p.dim(1) != S ||
        (p.dtype() != DType::kI64 && p.dtype() != DType::kI32))
      return run_reference(c);
    for (int64_t i = 0; i < B * S; ++i) {
      const int64_t r = p.dtype() == DType::kI64 ? p.data<int64_t>()[i] : p.data<int32_t>()[i];
      if (r < 0 || r >= cos.dim(0)) return run_reference(c);
      rows[static_cast<size_t>(i)] = r;
    }
  } else {
    if (cos.rank() != 3 || cos.dim(0) != B || cos.dim(1) != S) return run_reference(c);
    for (int64_t i = 0; i < B * S; ++i) rows[static_cast<size_t>(i)] = i;
  }
  const Tensor xc = x.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  Tensor y = Tensor::empty(DType::kF32, x.shape());
  const float* px = xc.data<float>();
  const float* pc = cc.data<float>();
  const float* ps = sc.data<float>();
  float* py = y.data<float>();
  const bool interleaved = c.node.attr_int("interleaved") != 0;
  const int64_t grain = std::max<int64_t>(1, kGrainValues / std::max<int64_t>(1, heads * D));
  parallel_for(0, B * S, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t b = r / S, s = r % S;
      const float* co = pc + rows[static_cast<size_t>(r)] * half;
      const float* si = ps + rows[static_cast<size_t>(r)] * half;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t at = packed ? (r * heads + h) * D : ((b * heads + h) * S + s) * D;
        const float* in = px + at;
        float* out = py + at;
        if (interleaved) {
          for (int64_t k = 0; k < half; ++k) {
            const float x1 = in[2 * k], x2 = in[2 * k + 1];
            out[2 * k] = co[k] * x1 - si[k] * x2;
            out[2 * k + 1] = si[k] * x1 + co[k] * x2;
          }
        } else {
          for (int64_t k = 0; k < half; ++k) {
            const float x1 = in[k], x2 = in[k + half];
            out[k] = co[k] * x1 - si[k] * x2;
            out[k + half] = si[k] * x1 + co[k] * x2;
          }
        }
        if (rot < D) std::memcpy(out + rot, in + rot, static_cast<size_t>(D - rot) * sizeof(float));
      }
    }
  });
  return {y};
}

bool accepts_rotary(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32 || n.dtype(0) == DType::kUndefined;
}

}  // namespace

void register_rotary_kernels(KernelRegistry& r) {
  r.add("RotaryEmbedding",
        {.accepts = accepts_rotary, .run = run_rotary, .reference_at_run_time = true});
}

}  // namespace pto::cpu
