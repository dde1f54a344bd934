// CPU kernels for ONNX's integer ops: MatMulInteger and QLinearMatMul on the int8 GEMM
// (gemm/igemm.h), QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear on quant.h's vector
// loops. The forms they handle: uint8/int8 data, float32 scales, per-tensor or per-axis
// parameters, a B of rank 2 (packed once when constant), zero points of A per tensor (or per row
// of a 2-D A for MatMulInteger) and of B per tensor or per column. Others are declined at compile
// time (accepts) or, when only the run-time shapes show them, run on the reference kernel.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/gemm/igemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {

bool per_column(const Tensor& t, int64_t n, bool* per_col) {
  *per_col = false;
  if (t.numel() == 1) return true;
  if (t.numel() != n || (t.rank() != 1 && !(t.rank() == 2 && t.dim(0) == 1))) return false;
  *per_col = true;
  return true;
}

std::vector<int32_t> byte_values(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = byte_value(t, i);
  return v;
}

std::vector<double> requant_multipliers(const Tensor& a_scale, const Tensor& b_scale,
                                        const Tensor& y_scale) {
  const float sa = a_scale.data<float>()[0], sy = y_scale.data<float>()[0];
  std::vector<double> mult(static_cast<size_t>(b_scale.numel()));
  for (size_t j = 0; j < mult.size(); ++j) {
    const float prod = sa * b_scale.data<float>()[j];
    mult[j] = static_cast<double>(prod / sy);
  }
  return mult;
}

namespace {

// ---- MatMulInteger and QLinearMatMul ----

// A constant B packed at compile time; the kernel then reads only the packing (packed_inputs),
// whatever ISA it runs on (the panels are the same for all).
struct PreparedI8B {
  PackedI8B packed;
  size_t input = 0;  // B's input index
};

// Packs a constant rank-2 B (input `b`) at compile time.
std::any prepare_b(const NodeInfo& n, size_t b) {
  if (!n.is_constant(b) || n.constants[b]->rank() != 2) return {};
  const Tensor& t = *n.constants[b];
  return PreparedI8B{
      pack_i8_b(t.dim(0), t.dim(1), t.raw_data(), t.dim(1), false, t.dtype() == DType::kI8), b};
}

bool has_prepared(const KernelContext& c) {
  return c.state && c.state->has_value();
}

// B from prepare(), or packed now.
PackedI8B packed_b(const KernelContext& c, const Tensor& B) {
  if (has_prepared(c)) return c.prepared<PreparedI8B>().packed;
  return pack_i8_b(B.dim(0), B.dim(1), B.raw_data(), B.dim(1), false, B.dtype() == DType::kI8);
}

// The original B rebuilt from its packing.
Tensor unpack_b(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const PreparedI8B&>(state);
  PTO_CHECK(input == p.input) << "MatMulInteger/QLinearMatMul: only B is packed";
  const PackedI8B& b = p.packed;
  const int64_t k = b.k(), n = b.n();
  Tensor t = Tensor::empty(b.is_signed() ? DType::kI8 : DType::kU8, {k, n});
  auto* out = static_cast<uint8_t*>(t.raw_data());
  for (int64_t q = 0; q < k; ++q)
    for (int64_t j = 0; j < n; ++j) out[q * n + j] = b.original(q, j);
  return t;
}

// The reference kernel, with B rebuilt when the runtime released the original.
std::vector<Tensor> reference_with_b(const KernelContext& c) {
  if (!has_prepared(c)) return run_reference(c);
  KernelContext inner = c;
  const auto& p = c.prepared<PreparedI8B>();
  inner.inputs.at(p.input) = unpack_b(*c.state, p.input);
  return run_reference(inner);
}

std::string describe_igemm(const std::any&) {
  return igemm_uses_vnni() ? "int8 GEMM (VNNI)" : "int8 GEMM (widening)";
}

void set_packing(Kernel& k) {
  k.packed_inputs = [](const std::any& s) {
    return s.has_value() ? std::vector<size_t>{std::any_cast<const PreparedI8B&>(s).input}
                         : std::vector<size_t>{};
  };
  k.packed_bytes = [](const std::any& s) {
    return s.has_value() ? std::any_cast<const PreparedI8B&>(s).packed.bytes() : 0;
  };
  k.unpack = unpack_b;
}

// A [..., M, K] (or [K]) against B [K, N]: the output shape and the folded row count, or false.
bool product_shape(const Tensor& A, const Tensor& B, Dims* y, int64_t* rows) {
  if (A.rank() < 1 || B.rank() != 2 || A.dim(-1) != B.dim(0)) return false;
  *y = Dims(A.shape().begin(), A.shape().end() - 1);
  *rows = 1;
  for (int64_t d : *y) *rows *= d;
  y->push_back(B.dim(1));
  return true;
}

std::vector<Tensor> matmul_integer(const KernelContext& c) {
  const Tensor &A = c.input(0), &B = c.input(1);
  Dims yshape;
  int64_t M = 0;
  if (!product_shape(A, B, &yshape, &M)) return reference_with_b(c);
  const int64_t K = B.dim(0), N = B.dim(1);
  IgemmArgs g;
  std::vector<int32_t> za, zb;
  if (c.has_input(2)) {
    const Tensor& Z = c.input(2);
    if (Z.numel() != 1 && !(A.rank() == 2 && Z.rank() == 1 && Z.dim(0) == M))
      return reference_with_b(c);
    za = byte_values(Z);
    g.a_zp = za.data();
    g.a_zp_per_row = Z.numel() != 1;
  }
  if (c.has_input(3)) {
    const Tensor& Z = c.input(3);
    if (!per_column(Z, N, &g.b_zp_per_col)) return reference_with_b(c);
    zb = byte_values(Z);
    g.b_zp = zb.data();
  }
  Tensor Y = Tensor::empty(DType::kI32, yshape);
  if (Y.numel() == 0) return one(std::move(Y));
  g.m = M;
  g.n = N;
  g.k = K;
  g.a = A.raw_data();
  g.lda = K;
  g.a_signed = A.dtype() == DType::kI8;
  g.out = IgemmArgs::Out::kS32;
  g.c = Y.data<int32_t>();
  g.ldc = N;
  igemm(g, packed_b(c, B));
  return one(std::move(Y));
}

std::vector<Tensor> qlinear_matmul(const KernelContext& c) {
  const Tensor &A = c.input(0), &B = c.input(3);
  const Tensor &as = c.input(1), &az = c.input(2), &bs = c.input(4), &bz = c.input(5);
  const Tensor &ys = c.input(6), &yz = c.input(7);
  Dims yshape;
  int64_t M = 0;
  if (!product_shape(A, B, &yshape, &M)) return reference_with_b(c);
  const int64_t K = B.dim(0), N = B.dim(1);
  bool scale_per_col = false, zp_per_col = false;
  if (as.numel() != 1 || az.numel() != 1 || ys.numel() != 1 || yz.numel() != 1 ||
      !per_column(bs, N, &scale_per_col) || !per_column(bz, N, &zp_per_col) || K > kMaxExactK)
    return reference_with_b(c);
  IgemmArgs g;
  const std::vector<int32_t> za = byte_values(az), zb = byte_values(bz);
  g.a_zp = za.data();
  g.b_zp = zb.data();
  g.b_zp_per_col = zp_per_col;
  const std::vector<double> mult = requant_multipliers(as, bs, ys);
  Tensor Y = Tensor::empty(yz.dtype(), yshape);
  if (Y.numel() == 0) return one(std::move(Y));
  g.m = M;
  g.n = N;
  g.k = K;
  g.a = A.raw_data();
  g.lda = K;
  g.a_signed = A.dtype() == DType::kI8;
  g.out = IgemmArgs::Out::kQuantized;
  g.c = Y.raw_data();
  g.ldc = N;
  g.mult = mult.data();
  g.mult_per_col = scale_per_col;
  g.y_zp = byte_value(yz, 0);
  g.c_signed = yz.dtype() == DType::kI8;
  igemm(g, packed_b(c, B));
  return one(std::move(Y));
}

// ---- QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear ----

// Per-tensor or per-axis scale and zero point (as floats) of a [outer, channels, inner] view of
// x along `axis`: channels 1 for one scale.
struct AxisParams {
  std::vector<float> scale, zp;
  int64_t outer = 1, channels = 1, inner = 1;
};

// False for a form the kernels leave to the reference: a blocked or malformed scale.
bool axis_params(const KernelContext& c, const Tensor& x, AxisParams* p) {
  const Tensor& S = c.input(1);
  if (c.node.attr_int("block_size") != 0) return false;
  const int64_t n = S.numel();
  if (n == 0) return false;
  p->scale.assign(S.data<float>(), S.data<float>() + n);
  p->zp.assign(static_cast<size_t>(n), 0.0f);
  if (c.has_input(2)) {
    const Tensor& Z = c.input(2);
    if (Z.shape() != S.shape() && !(Z.numel() == 1 && n == 1)) return false;
    for (int64_t i = 0; i < n; ++i) p->zp[i] = static_cast<float>(byte_value(Z, i));
  }
  p->outer = x.numel();
  if (n == 1) return true;
  int64_t axis = c.node.attr_int("axis");
  if (axis < 0) axis += x.rank();
  if (S.rank() != 1 || axis < 0 || axis >= x.rank() || x.dim(axis) != n) return false;
  p->outer = 1;
  for (int64_t d = 0; d < axis; ++d) p->outer *= x.dim(d);
  p->channels = n;
  p->inner = 1;
  for (int64_t d = axis + 1; d < x.rank(); ++d) p->inner *= x.dim(d);
  return true;
}

// Calls span(offset, count, params) over x's elements, in parallel: one call per channel run of
// `inner` elements, or per row of channels when the axis is the last (inner == 1).
template <class F>
void for_each_span(const AxisParams& p, F span) {
  if (p.channels == 1) {
    parallel_for(0, p.outer, 1 << 14, [&](int64_t b, int64_t e) {
      span(b, e - b, QuantParams{p.scale.data(), p.zp.data(), 0});
    });
    return;
  }
  if (p.inner == 1) {
    parallel_for(0, p.outer, std::max<int64_t>(1, (1 << 14) / p.channels),
                 [&](int64_t b, int64_t e) {
                   for (int64_t o = b; o < e; ++o)
                     span(o * p.channels, p.channels, QuantParams{p.scale.data(), p.zp.data(), 1});
                 });
    return;
  }
  parallel_for(0, p.outer * p.channels, std::max<int64_t>(1, (1 << 14) / p.inner),
               [&](int64_t b, int64_t e) {
                 for (int64_t t = b; t < e; ++t) {
                   const int64_t ch = t % p.channels;
                   span(t * p.inner, p.inner, QuantParams{&p.scale[ch], &p.zp[ch], 0});
                 }
               });
}

// The output dtype of QuantizeLinear: the zero point's, else output_dtype, else uint8.
DType quantize_output(const NodeInfo& n) {
  if (n.dtype(2) != DType::kUndefined) return n.dtype(2);
  return n.outputs.empty() ? DType::kUndefined : n.outputs[0].dtype;
}

std::vector<Tensor> quantize_linear(const KernelContext& c) {
  const Tensor& X = c.input(0);
  AxisParams p;
  if (!axis_params(c, X, &p)) return run_reference(c);
  const DType out = c.has_input(2) ? c.input(2).dtype() : DType::kU8;
  Tensor Y = Tensor::empty(out, X.shape());
  const float* x = X.data<float>();
  auto* y = static_cast<uint8_t*>(Y.raw_data());
  const bool to_signed = out == DType::kI8;
  for_each_span(p, [&](int64_t off, int64_t n, QuantParams q) {
    PTO_ISA_DISPATCH(quantize_span, x + off, n, q, 0.0f, to_signed, y + off);
  });
  return one(std::move(Y));
}

std::vector<Tensor> dequantize_linear(const KernelContext& c) {
  const Tensor& X = c.input(0);
  AxisParams p;
  if (!axis_params(c, X, &p)) return run_reference(c);
  Tensor Y = Tensor::empty(DType::kF32, X.shape());
  const auto* x = static_cast<const uint8_t*>(X.raw_data());
  float* y = Y.data<float>();
  const bool x_signed = X.dtype() == DType::kI8;
  for_each_span(p, [&](int64_t off, int64_t n, QuantParams q) {
    PTO_ISA_DISPATCH(dequantize_span, x + off, x_signed, n, q, y + off);
  });
  return one(std::move(Y));
}

// DynamicQuantizeLinear's scale and zero point for values in [mn, mx] (mn <= 0 <= mx), as the
// reference computes them.
void dynamic_params(float mn, float mx, float* scale, float* zp) {
  *scale = (mx == mn ? 1.0f : mx - mn) / 255.0f;
  *zp = std::nearbyint(std::clamp(0.0f - mn / *scale, 0.0f, 255.0f));
}

// Quantizes x[0..n) to uint8 with its own range, as DynamicQuantizeLinear, on one thread.
void dynamic_quantize_span(const float* x, int64_t n, uint8_t* y, float* scale, float* zp) {
  float mn = 0, mx = 0;
  PTO_ISA_DISPATCH(min_max_span, x, n, &mn, &mx);
  dynamic_params(mn, mx, scale, zp);
  PTO_ISA_DISPATCH(quantize_span, x, n, QuantParams{scale, zp, 0}, -*zp, false, y);
}

// Below this many values a quantization runs on the calling thread: two parallel regions (the
// range, then the rounding) cost more than the work (BERT-base's 128 x 768 activations: 2 x 72
// wake-ups per call at 2 threads, 15% of its int8 run).
constexpr int64_t kSerialQuantize = 1 << 18;

// DynamicQuantizeLinear's scale and zero point for the range of x[0..n), in parallel for a large n
// (per-chunk minima and maxima over fixed chunks: the same answer on any thread count).
void dynamic_range(const float* x, int64_t n, float* scale, float* zp) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = n < kSerialQuantize ? 1 : (n + kChunk - 1) / kChunk;
  const int64_t chunk = n < kSerialQuantize ? n : kChunk;
  std::vector<float> lo(static_cast<size_t>(chunks), 0.0f), hi(static_cast<size_t>(chunks), 0.0f);
  auto range = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t off = i * chunk, len = std::min(chunk, n - off);
      if (len > 0) PTO_ISA_DISPATCH(min_max_span, x + off, len, &lo[i], &hi[i]);
    }
  };
  if (chunks == 1) {
    range(0, 1);
  } else {
    parallel_for(0, chunks, 1, range);
  }
  float mn = 0, mx = 0;
  for (int64_t i = 0; i < chunks; ++i) mn = std::min(mn, lo[i]), mx = std::max(mx, hi[i]);
  dynamic_params(mn, mx, scale, zp);
}

// Quantizes x[0..n) to uint8 with its own range, as DynamicQuantizeLinear, in parallel.
void dynamic_quantize_all(const float* x, int64_t n, uint8_t* y, float* scale, float* zp) {
  dynamic_range(x, n, scale, zp);
  const float s = *scale, z = *zp;
  parallel_for(0, n, n < kSerialQuantize ? n : 1 << 14, [&](int64_t b, int64_t e) {
    PTO_ISA_DISPATCH(quantize_span, x + b, e - b, QuantParams{&s, &z, 0}, -z, false, y + b);
  });
}

std::vector<Tensor> dynamic_quantize_linear(const KernelContext& c) {
  const Tensor& X = c.input(0);
  Tensor Y = Tensor::empty(DType::kU8, X.shape());
  float scale = 1, zp = 0;
  dynamic_quantize_all(X.data<float>(), X.numel(), Y.data<uint8_t>(), &scale, &zp);
  return {Y, Tensor::scalar<float>(scale), Tensor::scalar<uint8_t>(static_cast<uint8_t>(zp))};
}

// ---- DynamicQuantizeMatMul ----

// A quantized now (per tensor or per row) into a byte buffer, then one igemm with the float
// epilogue: float(acc) * (a_scale[row] * b_scale[n]) + bias[n].
std::vector<Tensor> dynamic_quantize_matmul(const KernelContext& c) {
  const Tensor &A = c.input(0), &B = c.input(1), &S = c.input(2);
  Dims yshape;
  int64_t M = 0;
  if (!product_shape(A, B, &yshape, &M)) return reference_with_b(c);
  const int64_t K = B.dim(0), N = B.dim(1);
  IgemmArgs g;
  if (!per_column(S, N, &g.scale_b_per_col) || K > kMaxExactK) return reference_with_b(c);
  std::vector<int32_t> zb;
  if (c.has_input(3)) {
    if (!per_column(c.input(3), N, &g.b_zp_per_col)) return reference_with_b(c);
    zb = byte_values(c.input(3));
    g.b_zp = zb.data();
  }
  std::vector<float> bias;
  if (c.has_input(4)) {
    const Tensor& t = c.input(4);
    bool per_col = false;
    if (!per_column(t, N, &per_col)) return reference_with_b(c);
    bias.assign(static_cast<size_t>(N), t.data<float>()[0]);
    if (per_col) bias.assign(t.data<float>(), t.data<float>() + N);
    g.bias = bias.data();
  }
  Tensor Y = Tensor::empty(DType::kF32, yshape);
  if (Y.numel() == 0) return one(std::move(Y));
  const bool per_row = c.node.attr_int("per_row") != 0;
  // Not zeroed: every byte is written by fill_a before igemm reads it (a vector's zeroing was a
  // serial pass over A's size).
  const auto q = std::make_unique_for_overwrite<uint8_t[]>(static_cast<size_t>(A.numel()));
  const size_t groups = per_row ? static_cast<size_t>(M) : 1;
  std::vector<float> scale(groups, 1.0f), zp(groups, 0.0f);
  std::vector<int32_t> za(groups, 0);
  const float* a = A.data<float>();
  // A is quantized by igemm's tasks, each block of rows just before it is packed (fill_a); a
  // per-tensor range is taken first.
  if (!per_row) {
    dynamic_range(a, A.numel(), &scale[0], &zp[0]);
    za[0] = static_cast<int32_t>(zp[0]);
  }
  g.fill_a = [&](int64_t i0, int64_t i1) {
    if (!per_row) {
      PTO_ISA_DISPATCH(quantize_span, a + i0 * K, (i1 - i0) * K, QuantParams{&scale[0], &zp[0], 0},
                       -zp[0], false, q.get() + i0 * K);
      return;
    }
    for (int64_t i = i0; i < i1; ++i) {
      dynamic_quantize_span(a + i * K, K, q.get() + i * K, &scale[i], &zp[i]);
      za[i] = static_cast<int32_t>(zp[i]);
    }
  };
  g.m = M;
  g.n = N;
  g.k = K;
  g.a = q.get();
  g.lda = K;
  g.a_zp = za.data();
  g.a_zp_per_row = per_row;
  g.scale_a = scale[0];
  g.scale_a_row = per_row ? scale.data() : nullptr;
  g.scale_b = S.data<float>();
  g.out = IgemmArgs::Out::kF32;
  g.c = Y.data<float>();
  g.ldc = N;
  Epilogue ep;  // a fused elementwise chain, on each block of Y while it is in cache
  if (c.epilogue) {
    apply_fused(*c.epilogue, Y, N, c.where(), ep);
    g.epilogue = &ep;
  }
  igemm(g, packed_b(c, B));
  return one(std::move(Y));
}

// Linear quantization with float32 data and scales, per tensor or per axis, not blocked.
bool quantize_accepts(const NodeInfo& n, bool quantize) {
  if (n.node.attr_int("block_size") != 0) return false;
  if (n.dtype(1) != DType::kF32) return false;
  if (rank_of(n.inputs[1]) > 1) return false;
  if (quantize) {
    if (n.dtype(0) != DType::kF32 || n.node.attr_int("precision") != 0) return false;
    if (n.node.attr_int("output_dtype") != 0) return false;
    const DType out = n.dtype(2) == DType::kUndefined ? DType::kU8 : quantize_output(n);
    return is_byte(out) && !n.outputs.empty() && n.outputs[0].dtype == out;
  }
  if (!is_byte(n.dtype(0))) return false;
  if (n.dtype(2) != DType::kUndefined && n.dtype(2) != n.dtype(0)) return false;
  return !n.outputs.empty() && n.outputs[0].dtype == DType::kF32;
}

}  // namespace

void register_quant_kernels(KernelRegistry& r) {
  Kernel mmi;
  mmi.accepts = [](const NodeInfo& n) {
    if (!is_byte(n.dtype(0)) || !is_byte(n.dtype(1))) return false;
    if (n.dtype(2) != DType::kUndefined && n.dtype(2) != n.dtype(0)) return false;
    if (n.dtype(3) != DType::kUndefined && n.dtype(3) != n.dtype(1)) return false;
    if (rank_of(n.inputs[1]) >= 0 && rank_of(n.inputs[1]) != 2) return false;
    return n.outputs.size() == 1 && n.outputs[0].dtype == DType::kI32;
  };
  mmi.prepare = [](const NodeInfo& n) { return prepare_b(n, 1); };
  mmi.run = matmul_integer;
  mmi.reference_at_run_time = true;
  set_packing(mmi);
  mmi.describe = describe_igemm;
  r.add("MatMulInteger", std::move(mmi));

  Kernel qmm;
  qmm.accepts = [](const NodeInfo& n) {
    if (n.inputs.size() < 8) return false;
    if (!is_byte(n.dtype(0)) || !is_byte(n.dtype(3)) || !is_byte(n.dtype(7))) return false;
    if (n.dtype(2) != n.dtype(0) || n.dtype(5) != n.dtype(3)) return false;
    for (size_t s : {1, 4, 6})
      if (n.dtype(s) != DType::kF32) return false;
    if (rank_of(n.inputs[3]) >= 0 && rank_of(n.inputs[3]) != 2) return false;
    return n.outputs.size() == 1 && n.outputs[0].dtype == n.dtype(7);
  };
  qmm.prepare = [](const NodeInfo& n) { return prepare_b(n, 3); };
  qmm.run = qlinear_matmul;
  qmm.reference_at_run_time = true;
  set_packing(qmm);
  r.add("QLinearMatMul", std::move(qmm));

  Kernel q;
  q.accepts = [](const NodeInfo& n) { return quantize_accepts(n, true); };
  q.run = quantize_linear;
  q.reference_at_run_time = true;
  r.add("QuantizeLinear", std::move(q));

  Kernel dq;
  dq.accepts = [](const NodeInfo& n) { return quantize_accepts(n, false); };
  dq.run = dequantize_linear;
  dq.reference_at_run_time = true;
  r.add("DequantizeLinear", std::move(dq));

  Kernel dqmm;
  dqmm.accepts = [](const NodeInfo& n) {
    if (n.inputs.size() < 3 || n.dtype(0) != DType::kF32 || !is_byte(n.dtype(1))) return false;
    if (n.dtype(2) != DType::kF32) return false;
    if (n.dtype(3) != DType::kUndefined && n.dtype(3) != n.dtype(1)) return false;
    if (n.dtype(4) != DType::kUndefined && n.dtype(4) != DType::kF32) return false;
    if (rank_of(n.inputs[1]) >= 0 && rank_of(n.inputs[1]) != 2) return false;
    return n.outputs.size() == 1 && n.outputs[0].dtype == DType::kF32;
  };
  dqmm.prepare = [](const NodeInfo& n) { return prepare_b(n, 1); };
  dqmm.run = dynamic_quantize_matmul;
  dqmm.reference_at_run_time = true;
  set_packing(dqmm);
  dqmm.describe = describe_igemm;
  r.add("DynamicQuantizeMatMul", std::move(dqmm));

  Kernel dyn;
  dyn.accepts = [](const NodeInfo& n) {
    return n.dtype(0) == DType::kF32 && n.outputs.size() == 3;
  };
  dyn.run = dynamic_quantize_linear;
  r.add("DynamicQuantizeLinear", std::move(dyn));

  register_quant_conv_kernels(r);
}

}  // namespace pto::cpu
