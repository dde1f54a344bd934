// MatMulNBits (ir/ops/nbits.h) on the CPU, the weight kept in its blocks of codes.
//
// A constant weight is repacked at compile time into panels of 16 columns (nbits.h; 2-bit codes
// stored as 4-bit ones) and the original released: a 4096 x 4096 layer holds 8 MiB of
// codes and 2.5 MiB of scales and zero points instead of float32's 64 MiB. Rows of A multiply the
// panels directly, eight at a time (nbits_gemv: each code made a float in registers once for
// the eight), so a decoding step streams a quarter of the bytes a float32 weight would, and a
// prompt runs at the FMA rate (bench/nbits.py: 90% of the FMA peak from 8 rows up, above the
// float32 GEMM on blocks dequantized per call). A node whose accuracy_level is 4 takes the int8
// form on a CPU with AVX512_VNNI (nbits_gemv_i8: A quantized per block as onnxruntime does,
// four products an instruction lane). The other forms (operands that are not constants, a g_idx
// whose blocks are not whole) dequantize blocks of columns from the operands as they are, per
// call, for the float32 GEMM.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
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

// Columns of W dequantized at a time for the GEMM (the forms without panels): whole GEMM
// register blocks (64 columns under AVX-512).
constexpr int64_t kChunkCols = 64;
// Rows of A a task multiplies each panel by: their float32 (or int8) values stay in the L2
// while the task walks its panels.
constexpr int64_t kRowBlock = 32;

struct PreparedPanels {
  nbits::Layout layout;
  Dims b_shape;  // B's shape as the file gave it (unpack)
  std::shared_ptr<uint8_t[]> codes, zeros;
  std::shared_ptr<float[]> scales, float_zeros;  // float_zeros: the file's zero points are floats
  int store_bits = 4;  // the panels' codes: 8-bit codes as bytes, 2- and 4-bit ones as nibbles
  // With a g_idx that scatters the blocks over K (GPTQ's act order): the panels' k-th row is the
  // file's row order[k] (k < K), so that each block is contiguous; A's columns are gathered the
  // same way per call. Null: the file's order.
  std::shared_ptr<int32_t[]> order;
  int64_t panels = 0, kp = 0;
  bool int8 = false;  // the int8 form (nbits.h)
  size_t bytes = 0;
  NBitsPanels view() const {
    NBitsPanels w;
    w.int8 = int8;
    w.bits = store_bits;
    w.codes = codes.get();
    w.scales = scales.get();
    w.zeros = zeros.get();
    w.float_zeros = float_zeros.get();
    w.zero = static_cast<float>(layout.mid());
    w.kp = kp;
    w.block = layout.block;
    w.blocks = layout.blocks;
    return w;
  }
  // Where code (k, col) sits among the panels' bytes, and at which bit of that byte.
  size_t at(int64_t k, int64_t col, int* shift) const {
    const int64_t base = col / kNBitsPanel * kp * kNBitsPanel * store_bits / 8;
    const int64_t j = col % kNBitsPanel;
    *shift = 0;
    if (store_bits == 8)
      return static_cast<size_t>(base + (int8 ? k / 4 * 64 + j * 4 + k % 4 : k * kNBitsPanel + j));
    if (!int8) {
      *shift = static_cast<int>(k % 2) * 4;
      return static_cast<size_t>(base + k / 2 * kNBitsPanel + j);
    }
    *shift = static_cast<int>(k % 8 / 4) * 4;
    return static_cast<size_t>(base + k / 8 * 64 + j * 4 + k % 4);
  }
};

// The int8 form where the node allows it, onnxruntime takes it too (not with float zero points,
// 2-bit codes with zero points or a g_idx that reorders K: there it multiplies in float32), and
// the CPU runs it fast; a block's integer dot product must stay an exact float (below 2^24).
bool int8_form(const Node& n, const nbits::Layout& L, bool has_zp, bool float_zp, bool reordered) {
  return n.attr_int("accuracy_level") == 4 && !float_zp && !(L.bits == 2 && has_zp) && !reordered &&
         L.block <= (L.bits == 8 ? 512 : 4096) && active_isa() == Isa::kAvx512 &&
         has_ext(Ext::kAvx512Vnni);
}

// K's order with each g_idx block contiguous (k sorted by block, stably): an empty vector when
// g_idx is the plain k / block_size, nullopt when a block does not get the block_size members
// (the last the rest of K) that the panels' blocks have.
std::optional<std::vector<int32_t>> block_order(const Tensor& g_idx, const nbits::Layout& L) {
  const Tensor g = g_idx.contiguous();
  const int32_t* idx = g.data<int32_t>();
  std::vector<int64_t> count(static_cast<size_t>(L.blocks), 0);
  bool plain = true;
  for (int64_t k = 0; k < L.k; ++k) {
    ++count[idx[k]];
    plain &= idx[k] == k / L.block;
  }
  if (plain) return std::vector<int32_t>{};
  for (int64_t b = 0; b < L.blocks; ++b)
    if (count[b] != std::min(L.block, L.k - b * L.block)) return std::nullopt;
  std::vector<int32_t> order(static_cast<size_t>(L.k));
  for (int64_t k = 0; k < L.k; ++k) order[k] = static_cast<int32_t>(k);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t x, int32_t y) { return idx[x] < idx[y]; });
  return order;
}

// The panels of a constant B (nbits.h's layouts): 2-bit codes stored as nibbles, zero points
// uint8, float or none; K reordered for a g_idx whose blocks are whole.
std::any prepare(const NodeInfo& n) {
  const bool has_zp = n.dtype(3) != DType::kUndefined, has_g = n.dtype(4) != DType::kUndefined;
  if (!n.is_constant(1) || !n.is_constant(2) || (has_zp && !n.is_constant(3)) ||
      (has_g && !n.is_constant(4)))
    return {};
  const std::string where = n.node.where();
  PreparedPanels p;
  p.layout = nbits::layout(n.node, where);
  const nbits::Layout& L = p.layout;
  const Tensor& B = *n.constants[1];
  const Tensor* zp = has_zp ? n.constants[3] : nullptr;
  nbits::check_operands(L, B, *n.constants[2], zp, has_g ? n.constants[4] : nullptr, where);
  std::optional<std::vector<int32_t>> order;
  if (has_g && !(order = block_order(*n.constants[4], L))) return {};
  const bool float_zp = zp && zp->dtype() != DType::kU8;
  p.b_shape = B.shape();
  if (order && !order->empty()) {
    p.order.reset(new int32_t[order->size()]);
    std::copy(order->begin(), order->end(), p.order.get());
  }
  p.int8 = int8_form(n.node, L, has_zp, float_zp, p.order != nullptr);
  p.store_bits = L.bits == 8 ? 8 : 4;
  p.kp = L.blocks * L.block;
  p.panels = (L.n + kNBitsPanel - 1) / kNBitsPanel;
  const size_t code_bytes = static_cast<size_t>(p.panels * p.kp * kNBitsPanel * p.store_bits / 8);
  const size_t params = static_cast<size_t>(p.panels * L.blocks * kNBitsPanel);
  // One buffer: the codes, then the scales, float zero points and zero points, 64-byte aligned.
  const auto up = [](size_t n) { return (n + 63) / 64 * 64; };
  const size_t at_scales = up(code_bytes), at_fzeros = at_scales + up(params * sizeof(float));
  const size_t at_zeros = at_fzeros + (float_zp ? up(params * sizeof(float)) : 0);
  // Without the file's zero points none are stored (NBitsPanels::zero).
  const size_t zero_bytes = zp && !float_zp ? params : 0;
  const std::shared_ptr<uint8_t[]> memory = panel_memory(at_zeros + zero_bytes);
  p.codes = memory;
  p.scales = std::shared_ptr<float[]>(memory, reinterpret_cast<float*>(memory.get() + at_scales));
  if (float_zp)
    p.float_zeros =
        std::shared_ptr<float[]>(memory, reinterpret_cast<float*>(memory.get() + at_fzeros));
  if (zero_bytes) p.zeros = std::shared_ptr<uint8_t[]>(memory, memory.get() + at_zeros);
  p.bytes = code_bytes + zero_bytes + params * sizeof(float) * (float_zp ? 2 : 1);
  const Tensor bc = B.contiguous(), sc = n.constants[2]->contiguous();
  const Tensor zc = zp && !float_zp ? zp->contiguous() : Tensor();
  const uint8_t* codes = bc.data<uint8_t>();
  const int32_t mask = L.code_mask();
  // Columns in parallel: each writes bytes of its own (a byte holds two codes of one column).
  parallel_for(0, L.n, kNBitsPanel, [&](int64_t c0, int64_t c1) {
    for (int64_t col = c0; col < c1; ++col) {
      const int64_t panel = col / kNBitsPanel, j = col % kNBitsPanel;
      const uint8_t* row = codes + col * L.blocks * L.blob;  // kp codes, low bits first
      for (int64_t k = 0; k < p.kp; ++k) {
        int shift = 0;
        const size_t at = p.at(k, col, &shift);
        const int64_t from = p.order && k < L.k ? p.order[k] : k;
        p.codes[at] =
            static_cast<uint8_t>(p.codes[at] | nbits::code(row, from, L.bits, mask) << shift);
      }
      for (int64_t b = 0; b < L.blocks; ++b) {
        const int64_t at = (panel * L.blocks + b) * kNBitsPanel + j;
        p.scales[at] = static_cast<float>(sc.item_as_double(col * L.blocks + b));
        if (float_zp)
          p.float_zeros[at] = static_cast<float>(zp->item_as_double(col * L.blocks + b));
        else if (zp)
          p.zeros[at] = static_cast<uint8_t>(
              nbits::code(zc.data<uint8_t>() + col * L.zp_row, b, L.bits, mask));
      }
    }
  });
  return p;
}

// B in the file's layout again, from the panels (a node the runtime moves to the reference).
Tensor unpack(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const PreparedPanels&>(state);
  PTO_CHECK(input == 1) << "MatMulNBits: only B is packed";
  const nbits::Layout& L = p.layout;
  Tensor t = Tensor::empty(DType::kU8, p.b_shape);
  auto* out = t.data<uint8_t>();
  std::memset(out, 0, static_cast<size_t>(t.numel()));
  const int64_t row = p.kp * L.bits / 8;  // bytes of a row of B
  for (int64_t col = 0; col < L.n; ++col)
    for (int64_t k = 0; k < p.kp; ++k) {
      int shift = 0;
      const size_t at = p.at(k, col, &shift);                     // before shift is read
      const int32_t code = p.codes[at] >> shift & L.code_mask();  // a 2-bit code is its nibble
      const int64_t to = p.order && k < L.k ? p.order[k] : k;
      uint8_t& byte = out[col * row + to * L.bits / 8];
      byte = static_cast<uint8_t>(byte | code << (to * L.bits % 8));
    }
  return t;
}

std::vector<Tensor> reference_with_b(const KernelContext& c) {
  if (!c.prepared_if<PreparedPanels>()) return run_reference(c);
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
  const int64_t row_tasks = std::clamp<int64_t>((2 * num_threads() + col_tasks - 1) / col_tasks, 1,
                                                std::max<int64_t>(1, M / 64));
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

// The rows of A times the panels: tasks over blocks of rows and ranges of panels. A is first
// zero-padded to whole blocks with its block sums (float32 form), or quantized (int8 form).
void multiply_panels(const PreparedPanels& p, int64_t M, const float* a, const float* bias,
                     float* y) {
  const nbits::Layout& L = p.layout;
  const int64_t per_row = p.int8 ? p.kp / 4 : p.kp;  // floats a prepared row of A takes
  float* rows = scratch_as<float>(static_cast<size_t>(M * per_row), 1);
  float* sums = scratch_as<float>(static_cast<size_t>(2 * M * L.blocks), 2);  // qsum, a_scale
  auto* q = reinterpret_cast<int8_t*>(rows);
  if (p.order) {  // A's columns in the panels' order of K
    float* gathered = scratch_as<float>(static_cast<size_t>(M * L.k), 3);
    for (int64_t r = 0; r < M; ++r)
      for (int64_t k = 0; k < L.k; ++k) gathered[r * L.k + k] = a[r * L.k + p.order[k]];
    a = gathered;
  }
  const float* ap = a;
  if (p.int8) {
    parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        PTO_ISA_DISPATCH(nbits_quantize_row, a + r * L.k, L.k, L.block, L.blocks, q + r * p.kp,
                         sums + M * L.blocks + r * L.blocks, sums + r * L.blocks);
    });
  } else {
    if (p.kp != L.k) {
      for (int64_t r = 0; r < M; ++r) {
        std::memcpy(rows + r * p.kp, a + r * L.k, static_cast<size_t>(L.k) * sizeof(float));
        std::fill(rows + r * p.kp + L.k, rows + (r + 1) * p.kp, 0.0f);
      }
      ap = rows;
    }
    for (int64_t r = 0; r < M; ++r)
      for (int64_t b = 0; b < L.blocks; ++b) {
        const float* s = ap + r * p.kp + b * L.block;
        float t = 0.0f;
        for (int64_t i = 0; i < L.block; ++i) t += s[i];
        sums[r * L.blocks + b] = t;
      }
  }
  const NBitsPanels w = p.view();
  const int64_t row_blocks = (M + kRowBlock - 1) / kRowBlock;
  // At least ~256K multiply-adds a chunk: a thread's share is then worth waking it for.
  const int64_t grain =
      std::max<int64_t>(1, (1 << 18) / (std::min(M, kRowBlock) * p.kp * kNBitsPanel));
  parallel_for(0, row_blocks * p.panels, grain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r0 = i / p.panels * kRowBlock, m = std::min(kRowBlock, M - r0);
      const int64_t panel = i % p.panels, n0 = panel * kNBitsPanel;
      const int cols = static_cast<int>(std::min<int64_t>(kNBitsPanel, L.n - n0));
      const float* b = bias ? bias + n0 : nullptr;
      float* out = y + r0 * L.n + n0;
      if (p.int8)
        PTO_ISA_DISPATCH(nbits_gemv_i8, w, panel, q + r0 * p.kp, p.kp,
                         sums + M * L.blocks + r0 * L.blocks, sums + r0 * L.blocks, m, b, out, L.n,
                         cols);
      else
        PTO_ISA_DISPATCH(nbits_gemv, w, panel, ap + r0 * p.kp, p.kp, sums + r0 * L.blocks, m, b,
                         out, L.n, cols);
    }
  });
}

std::vector<Tensor> mat_mul_nbits(const KernelContext& c) {
  const PreparedPanels* p = c.prepared_if<PreparedPanels>();
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
    multiply_panels(*p, M, a, bias, y);
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
    return s.has_value() ? std::any_cast<const PreparedPanels&>(s).bytes : 0;
  };
  k.unpack = unpack;
  k.describe = [](const std::any& s) -> std::string {
    if (!s.has_value()) return "float32 GEMM on blocks of W dequantized per call";
    const auto& p = std::any_cast<const PreparedPanels&>(s);
    return cat(p.layout.bits, "-bit panels, ", p.int8 ? "A in int8 (VNNI)" : "float32");
  };
  r.add("MatMulNBits", std::move(k));
}

}  // namespace pto::cpu
