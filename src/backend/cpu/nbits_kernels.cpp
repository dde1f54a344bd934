// MatMulNBits (ir/ops/nbits.h) on the CPU, the weight kept in its blocks of codes.
//
// A constant 4-bit weight with uint8 zero points (or none) is repacked at compile time into
// panels of 16 columns (nbits.h) and the original released: a 4096 x 4096 layer holds 8 MiB of
// codes and 2.5 MiB of scales and zero points instead of float32's 64 MiB. A few rows of A (a
// decoding step) multiply the panels directly (nbits4_gemv: each code read once and made a float
// in registers, all rows at once), so the call streams a quarter of the bytes a float32 weight
// would; more rows multiply blocks of columns dequantized into float32 on the fly by the fp32
// GEMM, whose arithmetic then dominates. Other forms (2- and 8-bit codes, float zero points,
// g_idx, weights that are not constants) take the second path, dequantizing from the operands
// as they are.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/nbits.h"
#include "backend/cpu/scratch.h"
#include "ir/ops/nbits.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// Up to this many rows of A multiply the 4-bit panels directly; more go through float32 blocks
// and the GEMM (bench/nbits.py measures both sides of it).
constexpr int64_t kGemvRows = 8;
// Columns of W dequantized at a time for the GEMM: whole 16-column panels and whole GEMM
// register blocks (64 columns under AVX-512).
constexpr int64_t kChunkCols = 64;

struct Prepared4 {
  nbits::Layout layout;
  Dims b_shape;  // B's shape as the file gave it (unpack)
  std::shared_ptr<uint8_t[]> codes, zeros;
  std::shared_ptr<float[]> scales;
  int64_t panels = 0, kp = 0;
  size_t bytes = 0;
  NBitsPanels view() const {
    return {codes.get(), scales.get(), zeros.get(), kp, layout.block, layout.blocks};
  }
};

// The panels of a 4-bit B with uint8 zero points or none, no g_idx (nbits.h's layout).
std::any prepare(const NodeInfo& n) {
  const bool has_zp = n.dtype(3) != DType::kUndefined;
  if (!n.is_constant(1) || !n.is_constant(2) || (has_zp && !n.is_constant(3))) return {};
  if (n.dtype(4) != DType::kUndefined || (has_zp && n.dtype(3) != DType::kU8)) return {};
  const std::string where = n.node.where();
  Prepared4 p;
  p.layout = nbits::layout(n.node, where);
  const nbits::Layout& L = p.layout;
  if (L.bits != 4) return {};
  const Tensor& B = *n.constants[1];
  const Tensor* zp = has_zp ? n.constants[3] : nullptr;
  nbits::check_operands(L, B, *n.constants[2], zp, nullptr, where);
  p.b_shape = B.shape();
  p.kp = L.blocks * L.block;
  p.panels = (L.n + kNBitsPanel - 1) / kNBitsPanel;
  const size_t code_bytes = static_cast<size_t>(p.panels * p.kp / 2 * kNBitsPanel);
  const size_t params = static_cast<size_t>(p.panels * L.blocks * kNBitsPanel);
  p.codes.reset(new uint8_t[code_bytes]());
  p.zeros.reset(new uint8_t[params]());
  p.scales.reset(new float[params]());
  p.bytes = code_bytes + params * (1 + sizeof(float));
  const Tensor bc = B.contiguous(), sc = n.constants[2]->contiguous();
  const Tensor zc = zp ? zp->contiguous() : Tensor();
  const uint8_t* codes = bc.data<uint8_t>();
  for (int64_t col = 0; col < L.n; ++col) {
    const int64_t panel = col / kNBitsPanel, j = col % kNBitsPanel;
    const uint8_t* row = codes + col * L.blocks * L.blob;  // kp codes, two a byte, low first
    uint8_t* dst = p.codes.get() + panel * p.kp / 2 * kNBitsPanel + j;
    for (int64_t q = 0; q < p.kp / 2; ++q) dst[q * kNBitsPanel] = row[q];
    for (int64_t b = 0; b < L.blocks; ++b) {
      const int64_t at = (panel * L.blocks + b) * kNBitsPanel + j;
      p.scales[at] = static_cast<float>(sc.item_as_double(col * L.blocks + b));
      p.zeros[at] = static_cast<uint8_t>(
          zp ? nbits::code(zc.data<uint8_t>() + col * L.zp_row, b, 4, 15) : 8);
    }
  }
  return p;
}

// B in the file's layout again, from the panels (a node the runtime moves to the reference).
Tensor unpack(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const Prepared4&>(state);
  PTO_CHECK(input == 1) << "MatMulNBits: only B is packed";
  const nbits::Layout& L = p.layout;
  Tensor t = Tensor::empty(DType::kU8, p.b_shape);
  auto* out = t.data<uint8_t>();
  for (int64_t col = 0; col < L.n; ++col) {
    const uint8_t* src =
        p.codes.get() + col / kNBitsPanel * p.kp / 2 * kNBitsPanel + col % kNBitsPanel;
    for (int64_t q = 0; q < p.kp / 2; ++q) out[col * p.kp / 2 + q] = src[q * kNBitsPanel];
  }
  return t;
}

std::vector<Tensor> reference_with_b(const KernelContext& c) {
  if (!c.prepared_if<Prepared4>()) return run_reference(c);
  KernelContext inner = c;
  inner.inputs.at(1) = unpack(*c.state, 1);
  return run_reference(inner);
}

// Y [M, N] = A [M, K] W + bias through the fp32 GEMM, W dequantized kChunkCols columns at a time
// by `dequantize(c0, c1, buf, ld)` into each task's scratch; tasks over column blocks, and over
// row blocks too when there are too few column blocks for the threads.
template <class Dequantize>
void gemm_by_chunks(int64_t M, int64_t N, int64_t K, const float* a, const float* bias, float* y,
                    const Dequantize& dequantize) {
  const int64_t col_tasks = (N + kChunkCols - 1) / kChunkCols;
  const int64_t row_tasks = std::clamp<int64_t>((2 * num_threads() + col_tasks - 1) / col_tasks,
                                                1, std::max<int64_t>(1, M / 64));
  const int64_t rows = (M + row_tasks - 1) / row_tasks;
  parallel_tasks(col_tasks * row_tasks, [&](int64_t t) {
    const int64_t c0 = t / row_tasks * kChunkCols, cols = std::min(kChunkCols, N - c0);
    const int64_t r0 = t % row_tasks * rows, m = std::min(rows, M - r0);
    if (m <= 0) return;
    float* buf = scratch_as<float>(static_cast<size_t>(K * kChunkCols), 0);
    dequantize(c0, c0 + cols, buf, kChunkCols);
    GemmArgs g;
    g.m = m;
    g.n = cols;
    g.k = K;
    g.a = a + r0 * K;
    g.lda = K;
    g.b = buf;
    g.ldb = kChunkCols;
    g.c = y + r0 * N + c0;
    g.ldc = N;
    if (bias) {
      g.epilogue.bias_kind = Epilogue::Bias::kPerCol;
      g.epilogue.bias = bias + c0;
    }
    sgemm(g);  // inside the task: on this thread
  });
}

// A few rows times the 4-bit panels: A zero-padded to whole blocks and its block sums first.
void gemv_panels(const Prepared4& p, int64_t M, const float* a, const float* bias, float* y) {
  const nbits::Layout& L = p.layout;
  const float* ap = a;
  if (p.kp != L.k) {
    float* pad = scratch_as<float>(static_cast<size_t>(M * p.kp), 1);
    for (int64_t r = 0; r < M; ++r) {
      std::memcpy(pad + r * p.kp, a + r * L.k, static_cast<size_t>(L.k) * sizeof(float));
      std::fill(pad + r * p.kp + L.k, pad + (r + 1) * p.kp, 0.0f);
    }
    ap = pad;
  }
  float* asum = scratch_as<float>(static_cast<size_t>(M * L.blocks), 2);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < L.blocks; ++b) {
      const float* s = ap + r * p.kp + b * L.block;
      float t = 0.0f;
      for (int64_t i = 0; i < L.block; ++i) t += s[i];
      asum[r * L.blocks + b] = t;
    }
  const NBitsPanels w = p.view();
  // At least ~256K multiply-adds a chunk: a thread's share is then worth waking it for.
  const int64_t grain = std::max<int64_t>(1, (1 << 18) / (M * p.kp * kNBitsPanel));
  parallel_for(0, p.panels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t i = p0; i < p1; ++i) {
      const int cols = static_cast<int>(std::min<int64_t>(kNBitsPanel, L.n - i * kNBitsPanel));
      PTO_ISA_DISPATCH(nbits4_gemv, w, i, ap, p.kp, asum, M, bias ? bias + i * kNBitsPanel : nullptr,
                       y + i * kNBitsPanel, L.n, cols);
    }
  });
}

std::vector<Tensor> mat_mul_nbits(const KernelContext& c) {
  const Prepared4* p = c.prepared_if<Prepared4>();
  const nbits::Layout L = p ? p->layout : nbits::layout(c.node, c.where());
  const Tensor& A = c.input(0);
  if (A.rank() < 1 || A.dim(-1) != L.k) return reference_with_b(c);
  const float* bias = nullptr;
  if (c.has_input(5)) {
    if (c.input(5).numel() != L.n) return reference_with_b(c);
    bias = c.input(5).contiguous().data<float>();
  }
  const Tensor Ac = A.contiguous();
  const int64_t M = A.numel() / L.k;
  Dims shape = A.shape();
  shape.back() = L.n;
  Tensor Y = Tensor::empty(DType::kF32, shape);
  if (M == 0) return one(std::move(Y));
  const float* a = Ac.data<float>();
  float* y = Y.data<float>();
  if (p) {
    if (M <= kGemvRows) {
      gemv_panels(*p, M, a, bias, y);
    } else {
      const NBitsPanels w = p->view();
      gemm_by_chunks(M, L.n, L.k, a, bias, y, [&](int64_t c0, int64_t, float* buf, int64_t ld) {
        for (int64_t col = c0; col < std::min(c0 + kChunkCols, L.n); col += kNBitsPanel)
          PTO_ISA_DISPATCH(nbits4_dequantize, w, col / kNBitsPanel, L.k, buf + (col - c0), ld);
      });
    }
    return one(std::move(Y));
  }
  const Tensor *zp = c.has_input(3) ? &c.input(3) : nullptr,
               *g_idx = c.has_input(4) ? &c.input(4) : nullptr;
  nbits::check_operands(L, c.input(1), c.input(2), zp, g_idx, c.where());
  gemm_by_chunks(M, L.n, L.k, a, bias, y, [&](int64_t c0, int64_t c1, float* buf, int64_t ld) {
    nbits::dequantize(L, c.input(1), c.input(2), zp, g_idx, c0, c1, buf, ld);
  });
  return one(std::move(Y));
}

}  // namespace

void register_nbits_kernels(KernelRegistry& r) {
  Kernel k;
  k.accepts = [](const NodeInfo& n) {
    if (n.dtype(0) != DType::kF32 || !is_floating(n.dtype(2))) return false;
    if (n.dtype(5) != DType::kUndefined && n.dtype(5) != DType::kF32) return false;
    return n.outputs.size() == 1 && n.outputs[0].dtype == DType::kF32;
  };
  k.prepare = prepare;
  k.run = mat_mul_nbits;
  k.reference_at_run_time = true;
  k.packed_inputs = [](const std::any& s) {
    return s.has_value() ? std::vector<size_t>{1} : std::vector<size_t>{};
  };
  k.packed_bytes = [](const std::any& s) {
    return s.has_value() ? std::any_cast<const Prepared4&>(s).bytes : 0;
  };
  k.unpack = unpack;
  k.describe = [](const std::any& s) -> std::string {
    return s.has_value() ? "4-bit panels (rows <= 8: direct; more: float32 blocks + GEMM)"
                         : "float32 blocks + GEMM (weight dequantized per call)";
  };
  r.add("MatMulNBits", std::move(k));
}

}  // namespace pto::cpu
