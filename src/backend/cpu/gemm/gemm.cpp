// SGEMM driver: cache blocking, the 2-D task decomposition over threads, and B handling (packed
// per block, pre-packed, or read in place). The per-ISA packing and micro-kernels are in
// gemm_impl.h; docs/backend/gemm.md explains the choices and the measured numbers.
//
// Loop nest of one task (a range of rows and columns of one GEMM of the batch), after Goto/BLIS:
//   for jc over the task's columns, NC at a time        B block (KC x NC) lives in L3
//     for pc over K, KC at a time                        pack B block once
//       for ic over the task's rows, MC at a time        A block (MC x KC) lives in L2
//         pack A block; macro-kernel: for each NR panel of B (stays in L1), for each MR panel of A
//         the micro-kernel; on the last pc the epilogue runs on each micro-tile just stored.
#include "backend/cpu/gemm/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm/gemm_kernel.h"
#include "backend/cpu/scratch.h"
#include "pto/device_info.h"
#include "pto/dtype.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// The register block (MR rows x NR columns) of `isa`. The kernels of every ISA are linked in;
// they only run on machines that support them, but asking their shape is safe anywhere.
void register_block(Isa isa, int64_t* mr, int64_t* nr) {
  switch (isa) {
    case Isa::kAvx512:
      return avx512::gemm_block(mr, nr);
    case Isa::kAvx2:
      return avx2::gemm_block(mr, nr);
    default:
      return generic::gemm_block(mr, nr);
  }
}

int64_t nr_of(Isa isa) {
  int64_t mr = 0, nr = 0;
  register_block(isa, &mr, &nr);
  return nr;
}

int64_t mr_of(Isa isa) {
  int64_t mr = 0, nr = 0;
  register_block(isa, &mr, &nr);
  return mr;
}

struct Blocking {
  int64_t mr, nr, kc, mc, nc;
};

int64_t round_down(int64_t x, int64_t to) {
  return std::max(to, x / to * to);
}
int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The block size that splits `total` into the fewest parts of at most `block` (a multiple of
// `unit`), all about the same size in whole units: a short last K slice loads and stores its C
// tiles as often as a full one for less work (K = 576 runs as 2 x 288, not 384 + 192).
int64_t even_block(int64_t total, int64_t block, int64_t unit) {
  const int64_t parts = std::max<int64_t>(1, ceil_div(total, block));
  return std::min(block, ceil_div(ceil_div(total, parts), unit) * unit);
}

// Block sizes from the cache sizes of this machine (docs/backend/gemm.md has the measurements):
//   KC: the B micro-panel (KC x NR) is four times L1, clamped to [128, 512]. It then streams
//       from L2 (the next panel is fetched ahead) while the micro-kernel runs; keeping it in L1
//       costs more in C tile loads and stores (once per KC) than it saves (AVX-512 on a 48 KiB
//       L1: KC 512 beats 384 by 2-5% on 1024..2048 squares, and 384 beats 256 and 192);
//   MC: the packed A block (MC x KC) takes half of L2, the other half streams B panels and C;
//   NC: the packed B block (KC x NC) takes half of this core's share of L3 (L2 when none).
Blocking blocking_for(Isa isa) {
  const CacheModel& c = cache_model();
  Blocking b{};
  register_block(isa, &b.mr, &b.nr);
  const auto l1 = static_cast<int64_t>(c.l1d), l2 = static_cast<int64_t>(c.l2),
             l3 = static_cast<int64_t>(c.l3);
  const int64_t f = sizeof(float);
  b.kc = std::clamp<int64_t>(round_down(4 * l1 / (f * b.nr), 8), 128, 512);
  b.mc = round_down(l2 / 2 / (f * b.kc), b.mr);
  b.nc = round_down(std::max(l3, l2) / 2 / (f * b.kc), b.nr);
  return b;
}

const Blocking& blocking() {
  static const Blocking per_isa[3] = {blocking_for(Isa::kGeneric), blocking_for(Isa::kAvx2),
                                      blocking_for(Isa::kAvx512)};
  return per_isa[static_cast<int>(active_isa())];
}

// The AMX kernel's blocking (gemm_amx_avx512.cpp): A panels of kAmxMR rows, the VDPBF16PS B
// panels, KC in whole tiles of steps. MC: 4 A panels, whose block (MC x KC) every 32 columns of
// B meet in turn; KC: that block in a quarter of L2, at most 768 steps (1536 values of K). Tile
// products outrun the loads, so fewer, longer K slices (fewer C tile loads and stores) beat
// blocks that keep B's half panel in L1. One thread of a Xeon with AMX (2 MiB L2, B packed
// ahead, GFLOP/s for 1024^3 / 128x768x3072 / 512x3072x768): KC 192, MC 1344 (the fp32
// rule): 462 / 781 / 735; KC 512, MC 128: 827 / 823 / 793; KC 768, MC 128: 816-840 / 854-865 /
// 837-840; KC 128, A panel held and B streamed (loops swapped): 845 / 603 / 897. NC from L2
// instead of L3 (B's slice held in L2 across the row blocks) lost: NC 320 721-722 / 742-765 /
// 694-707, NC 192 636-639 / 696-699 / 638-657 against 837-845 / 820-862 / 834-847.
Blocking amx_blocking() {
  const CacheModel& c = cache_model();
  Blocking b{avx512::kAmxMR, 64, 0, 4 * avx512::kAmxMR, 0};
  const auto l2 = static_cast<int64_t>(c.l2), l3 = static_cast<int64_t>(c.l3);
  const int64_t f = sizeof(float);
  b.kc = std::clamp<int64_t>(round_down(l2 / 4 / (f * b.mc), avx512::kAmxStepsPerTile), 128, 768);
  b.nc = round_down(std::max(l3, l2) / 2 / (f * b.kc), b.nr);
  return b;
}

thread_local ScratchBuffer t_pack_a, t_pack_b, t_pack_edge;  // packed panels
thread_local ScratchBuffer t_widen_a;  // a half A block as floats; a bf16x3 A block's tails

// ---- bf16x3 (Precision::kBF16x3): Ah Bh + Al Bh + Ah Bl ----
// Each operand is packed twice, as bf16 pairs of its values (the heads: packing rounds them) and
// of its tails x - bf16(x) (exact in fp32: x and its rounding share an exponent but for the last
// binade); the macro-kernels multiply the three pairs of parts (MacroBlock::a_tail, b_tail).

// v[i] -= bf16(v[i]): each value's tail, before its own rounding to bf16.
void keep_tail(float* v, int64_t n) {
  constexpr int64_t kRun = 256;
  alignas(64) float head[kRun];
  for (int64_t i = 0; i < n; i += kRun) {
    const int64_t w = std::min(kRun, n - i);
    std::memcpy(head, v + i, w * sizeof(float));
    round_to_bf16(head, w);
    for (int64_t j = 0; j < w; ++j) v[i + j] -= head[j];
  }
}

// The tails of a rows x cols matrix (row stride ld) into dst, contiguous.
void tails_of(const float* x, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * cols, x + r * ld, cols * sizeof(float));
    keep_tail(dst + r * cols, cols);
  }
}

// n half values (kBF16 or kF16 bits) <-> floats.
void widen_half(Precision type, const uint16_t* x, float* y, int64_t n) {
  type == Precision::kBF16 ? bf16_to_f32(x, y, n) : f16_to_f32(x, y, n);
}
void narrow_half(Precision type, const float* x, uint16_t* y, int64_t n) {
  type == Precision::kBF16 ? f32_to_bf16(x, y, n) : f32_to_f16(x, y, n);
}

// The rows x cols block of a half A at a_half + offset (row stride lda) as floats, cols apart.
const float* widen_a_block(const GemmArgs& g, int64_t offset, int64_t rows, int64_t cols) {
  float* w = t_widen_a.get_as<float>(rows * cols);
  for (int64_t r = 0; r < rows; ++r)
    widen_half(g.a_half_type, g.a_half + offset + r * g.lda, w + r * cols, cols);
  return w;
}

// How the panels of one call are packed and multiplied: the ISA's fp32 kernels; the same on
// values rounded to bf16 (kBF16 without VDPBF16PS); or the avx512 bf16 pair kernels, whose
// panels hold two values of K per step (gemm_kernel.h). The driver below blocks and splits K in
// steps; the packing functions take the real K of a slice.
struct PanelOps {
  Precision precision = Precision::kF32;
  bool split = false;  // kBF16x3: bf16 products of heads and tails (precision kBF16)
  bool pairs = false;
  bool amx = false;     // the pairs multiplied on AMX tiles (A in kAmxMR-row chunked panels)
  int unit = 1;         // values of K per step
  int64_t kc_unit = 8;  // KC is a multiple of this many steps
};

// Rows from which a bf16 product runs on AMX tiles: a tile holds 16 rows of A, and fewer (a
// decode step's) leave most of each TDPBF16PS idle where VDPBF16PS's 6-row block wastes less.
// bf16x3 runs on the tiles at any row count: the fused micro-kernel reads each B panel once for
// its three products, where VDPBF16PS's macro-kernel runs three passes (one thread, weights from
// memory, GFLOP/s tiles / three passes: 8 x 768 x 768 79-84 / 28-30, 4 x 768 x 2304 22-23 /
// 18-19, 1 x 768 x 3072 5.7-5.8 / 5.3-5.5; fp32 102, 30, 7.7: a decode step still costs more).
constexpr int64_t kAmxMinRows = 16;

// The panels for products in `p` of `m` rows of A (m only matters for AMX).
PanelOps panel_ops(Precision p, int64_t m) {
  PanelOps o;
  o.split = p == Precision::kBF16x3;
  if (o.split) p = Precision::kBF16;
  o.precision = p;
  o.pairs = p == Precision::kBF16 && active_isa() == Isa::kAvx512 && has_ext(Ext::kAvx512Bf16);
  o.amx = o.pairs && (m >= kAmxMinRows || o.split) && has_ext(Ext::kAmxBf16);
  o.unit = o.pairs ? 2 : 1;
  o.kc_unit = o.amx ? avx512::kAmxStepsPerTile : 8;
  return o;
}

// The register block's rows (an A panel's) for `o`.
int64_t a_panel_rows(const PanelOps& o) {
  return o.amx ? avx512::kAmxMR : mr_of(active_isa());
}

// The blocking of one call: the machine's, with GemmArgs' block sizes where set.
Blocking blocking_of(const GemmArgs& g, const PanelOps& o) {
  Blocking b = o.amx ? amx_blocking() : blocking();
  if (g.block_kc > 0) b.kc = round_down(g.block_kc, o.kc_unit);
  if (g.block_mc > 0) b.mc = round_down(g.block_mc, b.mr);
  if (g.block_nc > 0) b.nc = round_down(g.block_nc, b.nr);
  return b;
}

// Whether B panels of `p` halves (kF16, kBF16) are made and read here: on a vector ISA (the
// generic kernels would widen element by element), f16 with F16C, bf16 where VDPBF16PS does not
// run (its pairs are the better form).
bool half_panels_run(Precision p) {
  if (p == Precision::kBF16x3) p = Precision::kBF16;
  if (active_isa() == Isa::kGeneric || p == Precision::kF32) return false;
  return p == Precision::kF16 ? has_ext(Ext::kF16c) : !panel_ops(p, 0).pairs;
}

// gemm_pack_a for `o`: rows [0, m) x the real k values at `a`.
void pack_a_for(const PanelOps& o, const float* a, int64_t lda, bool trans, int64_t m, int64_t k,
                float* dst) {
  if (o.amx) return avx512::gemm_pack_a_amx(a, lda, trans, m, k, dst);
  if (o.pairs) return avx512::gemm_pack_a_bf16(a, lda, trans, m, k, dst);
  PTO_ISA_DISPATCH(gemm_pack_a, a, lda, trans, m, k, dst);
  const int64_t mr = mr_of(active_isa());
  round_to_precision(o.precision, dst, ceil_div(m, mr) * mr * k);
}

// gemm_pack_b for `o`: the real k values by columns [0, n); with `rows` (not trans), row q of B
// at b + rows[q] (the bf16 products of an implicit-GEMM conv's shifted rows); with `tails`
// (bf16x3), the values' tails x - bf16(x) instead of the values.
void pack_b_for(const PanelOps& o, const float* b, int64_t ldb, bool trans, int64_t k, int64_t n,
                float* dst, int64_t panel_stride, const int64_t* rows = nullptr,
                bool tails = false) {
  if (o.pairs) return avx512::gemm_pack_b_bf16(b, ldb, trans, k, n, dst, panel_stride, rows, tails);
  if (rows) {  // one row of K at a time: row q is step q of every panel
    for (int64_t q = 0; q < k; ++q)
      PTO_ISA_DISPATCH(gemm_pack_b, b + rows[q], ldb, false, 1, n, dst + q * nr_of(active_isa()),
                       panel_stride);
  } else {
    PTO_ISA_DISPATCH(gemm_pack_b, b, ldb, trans, k, n, dst, panel_stride);
  }
  if (o.precision != Precision::kF32) {
    const int64_t nr = nr_of(active_isa());
    for (int64_t j = 0; j < ceil_div(n, nr); ++j) {
      if (tails) keep_tail(dst + j * panel_stride, k * nr);
      round_to_precision(o.precision, dst + j * panel_stride, k * nr);
    }
  }
}

void macro_for(const PanelOps& o, const MacroBlock& blk) {
  if (o.amx) return avx512::gemm_macro_amx(blk);  // the tails too, each B panel while in cache
  if (blk.a_tail) {  // Ah Bh, Al Bh, Ah Bl in turn, the epilogue after the last
    MacroBlock part = blk;
    part.a_tail = part.b_tail = nullptr;
    part.epilogue = nullptr;
    macro_for(o, part);
    part.accumulate = true;
    part.a = blk.a_tail;
    macro_for(o, part);
    part.a = blk.a;
    part.b = blk.b_tail;
    part.epilogue = blk.epilogue;
    return macro_for(o, part);
  }
  if (o.pairs) return avx512::gemm_macro_bf16(blk);
  PTO_ISA_DISPATCH(gemm_macro, blk);
}

bool has_epilogue(const Epilogue& ep) {
  return ep.bias_kind != Epilogue::Bias::kNone || ep.residual != nullptr ||
         ep.act != Activation::kNone || ep.tile != nullptr;
}

// When a task reads a non-transposed B in place (row stride ldb) instead of packing it: always
// for a few A panels (packing B would cost more than the strided reads save), and for any M when
// B's row stride is not a multiple of 4 KiB (rows that far apart share L1/L2 sets and evict each
// other; measured here: in place wins on 256..768-wide B, packing wins on 1024 and 3072; a 1x1
// conv's input planes read in place: ResNet-50 at level 2 is 3.6% slower when they are packed).
constexpr int64_t kDirectBPanels = 4;

// Whether a task of `rows` rows packs B (not packed ahead) rather than reading it in place.
bool packs_b(const GemmArgs& g, int64_t rows, const Blocking& bl) {
  if (g.precision != Precision::kF32) return true;
  return g.trans_b || (!g.b_rows && rows > kDirectBPanels * bl.mr &&
                       (g.ldb * static_cast<int64_t>(sizeof(float))) % 4096 == 0);
}

// Where packing reads B from for K from k0 and columns from j: with b_rows, b + j (the rows'
// offsets are added per row).
const float* b_source(const GemmArgs& g, int64_t k0, int64_t j) {
  if (g.b_rows) return g.b + j;
  return g.trans_b ? g.b + j * g.ldb + k0 : g.b + k0 * g.ldb + j;
}

// Operands packed ahead of the call (pack_a, pack_b), or null: A as panels of MR x K, B as
// panels of K x NR.
struct Prepacked {
  const float* a = nullptr;
  const float* b = nullptr;
  Precision b_half = Precision::kF32;  // b holds these half bits (PackedPanels::half_panels)
  // bf16x3: where the tails' panels are, in elements after a's and b's (PackedPanels::parts);
  // a B not packed ahead has its tails packed from its values (pack_b_for).
  int64_t a_tail = 0, b_tail = 0;
};

// Rows ic..ic+mc of op(A) by its k_real values of K from k0, packed into panels at `ap` (widened
// first when A is held as halves).
// With `tail` (bf16x3) the tails of those values instead.
void pack_a_block(const GemmArgs& g, const PanelOps& o, int64_t ic, int64_t mc, int64_t k0,
                  int64_t k_real, float* ap, bool tail = false) {
  if (tail) {  // mc x k_real (k_real x mc transposed) tails, packed from there
    const int64_t rows = g.trans_a ? k_real : mc, cols = g.trans_a ? mc : k_real;
    float* w = t_widen_a.get_as<float>(rows * cols);
    tails_of(g.trans_a ? g.a + k0 * g.lda + ic : g.a + ic * g.lda + k0, g.lda, rows, cols, w);
    return pack_a_for(o, w, cols, g.trans_a, mc, k_real, ap);
  }
  const int64_t offset = g.trans_a ? k0 * g.lda + ic : ic * g.lda + k0;
  if (g.a_half && o.amx && !g.trans_a && g.a_half_type == Precision::kBF16)  // no widening
    return avx512::gemm_pack_a_amx_bf16(g.a_half + offset, g.lda, mc, k_real, ap);
  if (g.a_half) {  // widened: mc x k_real (k_real x mc transposed), packed from there
    const float* w =
        g.trans_a ? widen_a_block(g, offset, k_real, mc) : widen_a_block(g, offset, mc, k_real);
    pack_a_for(o, w, g.trans_a ? mc : k_real, g.trans_a, mc, k_real, ap);
  } else {
    pack_a_for(o, g.a + offset, g.lda, g.trans_a, mc, k_real, ap);
  }
}

// Whether the blocks of C's columns that `blk` describes read A in place instead of packing it:
// when a block is at most kAInPlaceColumns wide, each value of A meets few micro-kernel calls (2
// on AVX-512, 8 on AVX2), too few to repay a packed copy of A. The micro-kernel then broadcasts
// from MR rows lda apart. Only fp32 products of a float, non-transposed A against B panels of
// floats, read packed or with a row stride (not a row table). One thread, Zen 4 (FMA peak 117
// GFLOP/s), GFLOP/s packed -> in place: [3136, 784] x [784, N] N = 16: 71 -> 112, 32: 86 -> 112,
// 64: 97 -> 112, 128: 97 -> 106; [128, 768] x [768, 64]: 106 -> 116; wider blocks gain nothing
// (N = 256) or lose 2-4% (128 x 768 x 768). On AVX2 (PTO_ISA=avx2): N = 16 54 -> 106, 32: 72 ->
// 106, 64: 90 -> 110; 128 even.
constexpr int64_t kAInPlaceColumns = 128;

bool reads_a_in_place(const GemmArgs& g, const PanelOps& o, const Prepacked& pre, int64_t columns,
                      const Blocking& bl) {
  return !pre.a && !g.a_half && !g.trans_a && !g.b_rows && o.precision == Precision::kF32 &&
         !o.pairs && pre.b_half == Precision::kF32 && columns <= kAInPlaceColumns;
}

// Rows i0..i1 of C's columns blk.n0.. against the (KC x NC) block of B that `blk` describes (its
// B, slice and epilogue set): A packed MC rows at a time (taken from pre.a, or read in place
// where reads_a_in_place), then the macro-kernel on each block.
// K, pc and blk.k count steps of o.unit values of K.
void multiply_rows(const GemmArgs& g, const PanelOps& o, const Prepacked& pre, const Blocking& bl,
                   MacroBlock blk, int64_t jc, int64_t pc, int64_t i0, int64_t i1, int64_t mc_even,
                   bool last_slice) {
  const int64_t K = ceil_div(g.k, o.unit), kc = blk.k;
  const int64_t k0 = pc * o.unit, k_real = std::min(kc * o.unit, g.k - k0);
  blk.ldc = g.ldc;
  blk.alpha = g.alpha;
  blk.n0 = jc;
  const bool in_place = reads_a_in_place(g, o, pre, blk.n, bl);
  for (int64_t ic = i0; ic < i1; ic += mc_even) {
    const int64_t mc = std::min(mc_even, i1 - ic);
    if (pre.a) {  // ic is a whole number of panels
      blk.a = pre.a + ic * K + pc * bl.mr;
      blk.a_panel_stride = K * bl.mr;
      if (o.split) blk.a_tail = blk.a + pre.a_tail;
    } else if (in_place) {
      blk.a = g.a + ic * g.lda + k0;
      blk.a_row_stride = g.lda;
    } else {
      const int64_t size = ceil_div(mc, bl.mr) * bl.mr * kc;  // the tails' panels after the heads'
      float* ap = t_pack_a.get_as<float>((o.split ? 2 : 1) * size);
      pack_a_block(g, o, ic, mc, k0, k_real, ap);
      if (o.split) pack_a_block(g, o, ic, mc, k0, k_real, ap + size, true);
      blk.a = ap;
      blk.a_tail = o.split ? ap + size : nullptr;
      blk.a_panel_stride = 0;
    }
    blk.m = mc;
    blk.c = g.c + ic * g.ldc + jc;
    blk.m0 = ic;
    // One K slice on the tiles: each block rounded into c_half from an L1 buffer, C not written
    // (a short K's fp32 tile stores are its ceiling: gemm.md).
    if (g.c_half && o.amx && pc == 0 && last_slice) {
      blk.c_half = g.c_half + ic * g.ldc + jc;
      blk.c_half_type = g.c_half_type;
      macro_for(o, blk);
      continue;
    }
    macro_for(o, blk);
    if (g.c_half && last_slice)  // the finished block, still in cache, rounded into c_half
      for (int64_t r = ic; r < ic + mc; ++r)
        narrow_half(g.c_half_type, g.c + r * g.ldc + jc, g.c_half + r * g.ldc + jc, blk.n);
  }
}

// C[i0:i1, j0:j1] of one GEMM.
void compute_block(const GemmArgs& g, const PanelOps& o, const Prepacked& pre, const Blocking& bl,
                   int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const float* packed = pre.b;
  const int64_t K = ceil_div(g.k, o.unit), nr = bl.nr;  // K in steps
  const bool direct = packed == nullptr && !packs_b(g, i1 - i0, bl);
  const Epilogue* ep = has_epilogue(g.epilogue) ? &g.epilogue : nullptr;
  // The K slices depend on K alone, so every C element sums the same slices on any thread count.
  const int64_t kc_even = even_block(K, bl.kc, o.kc_unit);
  const int64_t mc_even = even_block(i1 - i0, bl.mc, bl.mr);
  const int64_t slices = K == 0 ? 1 : ceil_div(K, kc_even);
  for (int64_t jc = j0; jc < j1; jc += bl.nc) {
    const int64_t nc = std::min(bl.nc, j1 - jc);
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t pc = s * kc_even, kc = std::min(kc_even, K - pc);
      MacroBlock blk;
      blk.n = nc;
      blk.k = kc;
      if (packed) {  // offsets in elements: floats, or halves (blk.b_half)
        // (`from`: bf16x3's tails, pre.b_tail elements on.)
        auto panel = [&](int64_t j, int64_t p, int64_t from = 0) {
          const int64_t at = from + (j / nr) * K * nr + p * nr;
          return pre.b_half != Precision::kF32 ? reinterpret_cast<const float*>(
                                                     reinterpret_cast<const uint16_t*>(packed) + at)
                                               : packed + at;
        };
        blk.b = panel(jc, pc);
        if (o.split) blk.b_tail = panel(jc, pc, pre.b_tail);
        // What this task reads next: the next slice's first panel, or the next column block's.
        if (s + 1 < slices)
          blk.b_after = panel(jc, pc + kc);
        else if (jc + nc < j1)
          blk.b_after = panel(jc + nc, 0);
        blk.b_half = pre.b_half;
        blk.b_panel_stride = K * nr;
        blk.b_row_stride = nr;
      } else if (g.b_rows && o.precision == Precision::kF32) {  // read in place
        blk.b = g.b + jc;
        blk.b_rows = g.b_rows + pc;
        blk.b_panel_stride = nr;
        if (nc % nr) {  // the partial panel, gathered row by row
          const int64_t e = nc / nr * nr, w = nc - e;
          float* edge = t_pack_edge.get_as<float>(kc * nr);
          for (int64_t p = 0; p < kc; ++p) {
            std::memcpy(edge + p * nr, g.b + g.b_rows[pc + p] + jc + e, w * sizeof(float));
            std::fill(edge + p * nr + w, edge + (p + 1) * nr, 0.0f);
          }
          blk.b_edge = edge;
        }
      } else if (direct) {
        blk.b = g.b + pc * g.ldb + jc;
        blk.b_panel_stride = nr;
        blk.b_row_stride = g.ldb;
        if (nc % nr) {
          const int64_t e = nc / nr * nr;
          float* edge = t_pack_edge.get_as<float>(kc * nr);
          PTO_ISA_DISPATCH(gemm_pack_b, g.b + pc * g.ldb + jc + e, g.ldb, false, kc, nc - e, edge,
                           kc * nr);
          blk.b_edge = edge;
        }
      } else {
        const int64_t size = ceil_div(nc, nr) * kc * nr;  // the tails' panels after the heads'
        float* bp = t_pack_b.get_as<float>((o.split ? 2 : 1) * size);
        const int64_t k0 = pc * o.unit, k_real = std::min(kc * o.unit, g.k - k0);
        pack_b_for(o, b_source(g, k0, jc), g.ldb, g.trans_b, k_real, nc, bp, kc * nr,
                   g.b_rows ? g.b_rows + k0 : nullptr);
        if (o.split)
          pack_b_for(o, b_source(g, k0, jc), g.ldb, g.trans_b, k_real, nc, bp + size, kc * nr,
                     g.b_rows ? g.b_rows + k0 : nullptr, true);
        blk.b = bp;
        blk.b_tail = o.split ? bp + size : nullptr;
        blk.b_panel_stride = kc * nr;
        blk.b_row_stride = nr;
      }
      blk.accumulate = s > 0;
      blk.epilogue = s == slices - 1 ? ep : nullptr;
      multiply_rows(g, o, pre, bl, blk, jc, pc, i0, i1, mc_even, s == slices - 1);
    }
  }
}

// One GEMM on `threads` threads whose B is packed, so that B is packed once, not once per thread:
// for each (KC x NC) block of B the threads first pack its panels together into one shared
// buffer, then each multiplies its own range of rows (packing only its own A) against all of it.
// Two pool dispatches per block; run_gemm takes this path only when every thread has at least
// one MC block of rows. Each C element sees the same micro-kernel and K slices as on one thread.
void run_shared_b(const GemmArgs& g, const PanelOps& o, const Prepacked& pre, const Blocking& bl,
                  int threads) {
  static thread_local ScratchBuffer shared;  // the caller's: the workers only write into it
  const int64_t K = ceil_div(g.k, o.unit), nr = bl.nr, mp = ceil_div(g.m, bl.mr);
  const Epilogue* ep = has_epilogue(g.epilogue) ? &g.epilogue : nullptr;
  const int64_t kc_even = even_block(K, bl.kc, o.kc_unit);
  const int64_t slices = ceil_div(K, kc_even);
  for (int64_t jc = 0; jc < g.n; jc += bl.nc) {
    const int64_t nc = std::min(bl.nc, g.n - jc), panels = ceil_div(nc, nr);
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t pc = s * kc_even, kc = std::min(kc_even, K - pc);
      const int64_t size = panels * kc * nr;  // bf16x3: the tails' panels after the heads'
      float* bp = shared.get_as<float>((o.split ? 2 : 1) * size);
      parallel_tasks(threads, [&](int64_t t) {
        const int64_t p0 = t * panels / threads, p1 = (t + 1) * panels / threads;
        if (p0 == p1) return;
        const int64_t j = jc + p0 * nr, w = std::min(nc, p1 * nr) - p0 * nr;
        const int64_t k0 = pc * o.unit, k_real = std::min(kc * o.unit, g.k - k0);
        pack_b_for(o, b_source(g, k0, j), g.ldb, g.trans_b, k_real, w, bp + p0 * kc * nr, kc * nr,
                   g.b_rows ? g.b_rows + k0 : nullptr);
        if (o.split)
          pack_b_for(o, b_source(g, k0, j), g.ldb, g.trans_b, k_real, w, bp + size + p0 * kc * nr,
                     kc * nr, g.b_rows ? g.b_rows + k0 : nullptr, true);
      });
      MacroBlock blk;
      blk.n = nc;
      blk.k = kc;
      blk.b = bp;
      blk.b_tail = o.split ? bp + size : nullptr;
      blk.b_panel_stride = kc * nr;
      blk.b_row_stride = nr;
      blk.accumulate = s > 0;
      blk.epilogue = s == slices - 1 ? ep : nullptr;
      parallel_tasks(threads, [&](int64_t t) {
        const int64_t i0 = t * mp / threads * bl.mr;
        const int64_t i1 = std::min(g.m, (t + 1) * mp / threads * bl.mr);
        if (i0 < i1)
          multiply_rows(g, o, pre, bl, blk, jc, pc, i0, i1, even_block(i1 - i0, bl.mc, bl.mr),
                        s == slices - 1);
      });
    }
  }
}

// One GEMM with B packed ahead whose threads split only its columns (few rows): A is packed once,
// the threads packing its panels together into one shared buffer (one pool dispatch), instead of
// once by every column task; then the column tasks (a few per thread, so a thread the OS
// deschedules strands a small share, not half of the work) multiply all of A against their
// columns of B (a second dispatch). Each C element sees the same micro-kernel, panel of A and
// K slices as on one thread.
void run_shared_a(const GemmArgs& g, const PanelOps& o, const Prepacked& pre, const Blocking& bl,
                  const GemmPlan& plan) {
  static thread_local ScratchBuffer shared;  // the caller's: the workers only write into it
  const int64_t K = ceil_div(g.k, o.unit), mp = ceil_div(g.m, bl.mr), np = ceil_div(g.n, bl.nr);
  const int64_t size = mp * bl.mr * K;  // bf16x3: the tails' panels after the heads'
  float* ap = shared.get_as<float>((o.split ? 2 : 1) * size);
  parallel_tasks(plan.threads, [&](int64_t t) {
    const int64_t p0 = t * mp / plan.threads, p1 = (t + 1) * mp / plan.threads;
    const int64_t i0 = p0 * bl.mr, rows = std::min(g.m, p1 * bl.mr) - i0;
    if (rows > 0) pack_a_block(g, o, i0, rows, 0, g.k, ap + i0 * K);
    if (rows > 0 && o.split) pack_a_block(g, o, i0, rows, 0, g.k, ap + size + i0 * K, true);
  });
  Prepacked both = pre;
  both.a = ap;
  both.a_tail = size;
  parallel_tasks(plan.tn, [&](int64_t t) {
    const int64_t j0 = std::min(g.n, t * np / plan.tn * bl.nr);
    const int64_t j1 = std::min(g.n, (t + 1) * np / plan.tn * bl.nr);
    if (j0 < j1) compute_block(g, o, both, bl, 0, g.m, j0, j1);
  });
}

}  // namespace

// Splits each GEMM's rows into tm and columns into tn ranges (whole MR / NR panels) so that
// items * tm * tn tasks keep every thread busy: the estimated time of the slowest wave of tasks,
// counting each task's multiply-adds and its packing of A (rows x K) and B (columns x K).
TaskGrid choose_task_grid(int64_t items, int64_t m, int64_t n, int64_t k, int64_t mr, int64_t nu,
                          int threads, double min_ops, bool split_n) {
  const int64_t mp = ceil_div(m, mr), np = ceil_div(n, nu);
  // Below min_ops of work per thread the pool's wake-up is not worth it.
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) *
                       static_cast<double>(std::max<int64_t>(k, 1)) * static_cast<double>(items);
  threads = static_cast<int>(std::min<double>(threads, std::max(1.0, flops / min_ops)));
  TaskGrid best;
  if (threads <= 1) return best;
  double best_cost = 1e300;
  for (int64_t tm = 1; tm <= std::min<int64_t>(mp, 4 * threads); ++tm)
    for (int64_t tn = 1; tn <= (split_n ? std::min<int64_t>(np, 4 * threads) : 1); ++tn) {
      const int64_t tasks = items * tm * tn;
      if (tasks > 16 * threads && (tm > 1 || tn > 1)) continue;
      const double waves = static_cast<double>(ceil_div(tasks, threads));
      // The largest task's rows and columns as they are, not rounded up to whole panels: a
      // partial edge panel costs what it holds (196 columns split 128 + 68 is not balanced).
      const double mt = static_cast<double>(std::min(m, ceil_div(mp, tm) * mr));
      const double nt = static_cast<double>(std::min(n, ceil_div(np, tn) * nu));
      const double cost = waves * (mt * nt + 32.0 * (mt + nt)) + static_cast<double>(tasks);
      if (cost < best_cost) {
        best_cost = cost;
        best = {tm, tn};
      }
    }
  return best;
}

namespace {

constexpr int kColumnTasksPerThread = 3;
constexpr int64_t kColumnUnit = 16;  // columns: an AVX-512 vector (AVX2's and generic NR)
constexpr int64_t kColumnTaskPanels = 2;

// How run_gemm splits and blocks one call: what it executes, and what describe_gemm prints.
GemmPlan make_plan(const GemmArgs& g, const Prepacked& pre, int64_t batch, int threads) {
  const PanelOps o = panel_ops(g.precision, g.m);
  const Blocking bl = blocking_of(g, o);
  const int64_t steps = ceil_div(g.k, o.unit);
  GemmPlan p;
  p.mr = bl.mr;
  p.nr = bl.nr;
  p.k_per_step = o.unit;
  p.amx = o.amx;
  p.precision = g.precision;
  p.kc = steps > 0 ? even_block(steps, bl.kc, o.kc_unit) : 0;
  p.k_slices = steps > 0 ? ceil_div(steps, p.kc) : 1;
  p.mc = bl.mc;
  p.nc = bl.nc;
  p.threads = threads;
  // A pinned grid (gemm.grid) replaces the planner's split, the shared B and the column tasks.
  const bool pinned = g.grid_tm > 0 && g.grid_tn > 0 && threads > 1;
  const bool shared_b = !pinned && batch == 1 && threads > 1 && pre.b == nullptr &&
                        packs_b(g, g.m, bl) && g.m >= threads * bl.mc;
  // With A packed ahead (a conv's weights) too, where each thread has fewer than two MC blocks
  // of rows and the planner would split the rows anyway: each row task packing all of B for
  // itself packed it `threads` times, which few rows do not repay (bf16 on AMX, 2 threads, p50:
  // 256 x 2304 x 196 0.40-0.45 -> 0.34-0.35 ms, 256 x 1024 x 196 0.108-0.116 -> 0.101-0.108;
  // with more rows the per-task packing was the faster, 1024 x 256 x 196 0.086-0.092 against
  // 0.099-0.103 and 512 x 4608 x 49 0.29-0.31 against 0.32).
  const bool shared = shared_b && (pre.a == nullptr ||
                                   (g.m < 2 * threads * bl.mc &&
                                    choose_task_grid(batch, g.m, g.n, g.k, bl.mr,
                                                     std::min<int64_t>(bl.nr, kColumnUnit), threads)
                                            .tn == 1));
  // Column ranges in vectors where each task reads or packs its own columns of B (the
  // micro-kernel's partial panels do only the vectors they hold: 196 columns on 2 threads split
  // 112 + 84, not 128 + 68 as whole 64-column panels; MobileNetV2's 384 -> 64 @14 conv alone,
  // 2 threads, quiet, alternated in one process: 61.5 -> 55.9 us, other 1x1 shapes at par); in
  // panels where B was packed ahead (a range starts at a panel) or the grid is pinned (the
  // gemm.grid knob counts panels).
  p.col_unit = pre.b || pinned ? bl.nr : std::min<int64_t>(bl.nr, kColumnUnit);
  const TaskGrid grid = pinned ? TaskGrid{std::min(g.grid_tm, ceil_div(g.m, bl.mr)),
                                          std::min(g.grid_tn, ceil_div(g.n, bl.nr))}
                        : shared
                            ? TaskGrid{threads, 1}
                            : choose_task_grid(batch, g.m, g.n, g.k, bl.mr, p.col_unit, threads);
  p.tm = grid.tm;
  p.tn = grid.tn;
  const int64_t task_rows = ceil_div(ceil_div(g.m, bl.mr), p.tm) * bl.mr;
  p.b_half = pre.b_half;
  p.b = pre.b                                      ? GemmPlan::B::kPackedAhead
        : shared                                   ? GemmPlan::B::kPackedShared
        : packs_b(g, std::min(g.m, task_rows), bl) ? GemmPlan::B::kPackedPerTask
                                                   : GemmPlan::B::kInPlace;
  p.batch = batch;
  p.a_in_place = reads_a_in_place(
      g, o, pre, std::min(g.n, ceil_div(ceil_div(g.n, p.col_unit), p.tn) * p.col_unit), bl);
  // B packed ahead and only the columns split: A packed once for all the threads (run_shared_a),
  // the columns cut into up to kColumnTasksPerThread tasks per thread of at least
  // kColumnTaskPanels panels (within a task each B panel's successor is fetched ahead).
  if (p.b == GemmPlan::B::kPackedAhead && batch == 1 && p.tm == 1 && p.tn > 1 && pre.a == nullptr) {
    p.a_shared = true;
    p.a_in_place = false;
    if (!pinned)
      p.tn = std::max(p.tn, std::min(ceil_div(g.n, bl.nr) / kColumnTaskPanels,
                                     int64_t{kColumnTasksPerThread} * threads));
  }
  return p;
}

void run_gemm(const GemmArgs& given, const Prepacked& given_pre, int64_t batch, int64_t stride_a,
              int64_t stride_b, int64_t stride_c, int64_t stride_r) {
  if (given.m <= 0 || given.n <= 0 || batch <= 0) return;
  PTO_CHECK(!(given.b_rows && given.trans_b)) << "sgemm: b_rows needs a B that is not transposed";
  GemmArgs args = given;
  Prepacked pre = given_pre;
  // bf16x3: a B not packed ahead is split as it is packed (pack_b_for's tails).
  PTO_CHECK(args.precision != Precision::kBF16x3 || !args.a_half)
      << "sgemm: bf16x3 products take a float A (no a_half)";
  const PanelOps ops = panel_ops(args.precision, args.m);
  const Blocking bl = blocking_of(args, ops);
  const GemmPlan plan = make_plan(args, pre, batch, in_parallel_region() ? 1 : num_threads());
  if (plan.b == GemmPlan::B::kPackedShared) {
    run_shared_b(args, ops, pre, bl, plan.threads);
    return;
  }
  if (plan.a_shared) {
    run_shared_a(args, ops, pre, bl, plan);
    return;
  }
  const int64_t mp = ceil_div(args.m, bl.mr), nu = plan.col_unit, np = ceil_div(args.n, nu);
  const int64_t per_item = plan.tm * plan.tn;
  auto task = [&](int64_t t) {
    const int64_t item = t / per_item, im = t % per_item / plan.tn, in = t % plan.tn;
    GemmArgs g = args;
    if (g.a_half)  // whichever holds A
      g.a_half += item * stride_a;
    else
      g.a += item * stride_a;
    g.b += item * stride_b;
    g.c += item * stride_c;
    if (g.c_half) g.c_half += item * stride_c;
    if (g.epilogue.residual) g.epilogue.residual += item * stride_r;
    const int64_t i0 = std::min(args.m, im * mp / plan.tm * bl.mr);
    const int64_t i1 = std::min(args.m, (im + 1) * mp / plan.tm * bl.mr);
    const int64_t j0 = std::min(args.n, in * np / plan.tn * nu);
    const int64_t j1 = std::min(args.n, (in + 1) * np / plan.tn * nu);
    if (i0 < i1 && j0 < j1) compute_block(g, ops, pre, bl, i0, i1, j0, j1);
  };
  const int64_t tasks = batch * per_item;
  if (tasks == 1 || plan.threads == 1) {
    for (int64_t t = 0; t < tasks; ++t) task(t);
  } else {
    parallel_tasks(tasks, task);
  }
}

}  // namespace

void round_to_precision(Precision p, float* v, int64_t n) {
  if (p == Precision::kBF16 || p == Precision::kBF16x3)
    round_to_bf16(v, n);
  else if (p == Precision::kF16)
    round_to_f16(v, n);
}

const char* precision_name(Precision p) {
  return p == Precision::kBF16     ? "bf16"
         : p == Precision::kF16    ? "f16"
         : p == Precision::kBF16x3 ? "bf16x3"
                                   : "f32";
}

std::string GemmPlan::str() const {
  const char* how[] = {"read in place", "packed per task", "packed once and shared by the threads",
                       "packed ahead"};
  return cat(
      precision == Precision::kF32      ? ""
      : precision == Precision::kBF16x3 ? cat("bf16x3 (three bf16 products of heads and tails, ",
                                              amx               ? "AMX tiles"
                                              : k_per_step == 2 ? "vdpbf16ps"
                                                                : "rounded, fp32 FMA",
                                              "), ")
      : amx                             ? "bf16 (AMX tiles, K in pairs), "
      : k_per_step == 2
          ? "bf16 (vdpbf16ps, K in pairs), "
          : cat(precision_name(precision),
                b_half != Precision::kF32 ? " (B as halves widened in registers" : " (rounded",
                ", fp32 FMA), "),
      "register block ", mr, "x", nr, ", K in ", k_slices, " slice(s) of ", kc, ", MC ", mc,
      " rows, NC ", nc, " columns; ", batch * tm * tn, " task(s) (", batch, " item(s) x ", tm,
      " row x ", tn, " column ranges) on ", threads, " thread(s); B ", how[static_cast<int>(b)],
      a_shared     ? "; A packed once and shared by the threads"
      : a_in_place ? "; A read in place"
                   : "");
}

GemmPlan plan_gemm(const GemmArgs& args, int64_t batch, bool b_packed_ahead, int threads) {
  static const float kSentinel = 0;
  const Precision half =
      b_packed_ahead && half_panels_run(args.precision) ? args.precision : Precision::kF32;
  return make_plan(args, {nullptr, b_packed_ahead ? &kSentinel : nullptr, half}, batch,
                   threads > 0 ? threads : num_threads());
}

void sgemm(const GemmArgs& args) {
  run_gemm(args, {}, 1, 0, 0, 0, 0);
}

void sgemm_batched(const GemmArgs& args, int64_t batch, int64_t stride_a, int64_t stride_b,
                   int64_t stride_c, int64_t stride_r) {
  run_gemm(args, {}, batch, stride_a, stride_b, stride_c, stride_r);
}

float* PackedPanels::allocate(int64_t len, int64_t k, int64_t width, Precision precision, int unit,
                              Precision half, int parts) {
  k_ = k;
  parts_ = parts;
  len_ = len;
  width_ = width;
  isa_ = static_cast<int>(active_isa());
  precision_ = precision;
  unit_ = unit;
  half_ = half;
  // 64-byte aligned: B panels are steps * NR floats apart, so no vector load of one splits a line.
  part_size_ = ceil_div(len, width) * width * ceil_div(k, unit);
  const size_t values = static_cast<size_t>(parts * part_size_) + 1;
  const size_t bytes = (values * (half != Precision::kF32 ? 2 : sizeof(float)) + 63) / 64 * 64;
  // On huge pages where large (scratch.h panel_memory): weights stream from memory every call
  // (a cold 1 x 1280 x 1000 Gemm, weights evicted between calls: 360 -> 304 us, 4096 x 4096
  // 4.44 -> 3.71 ms, medians of 40 alternated calls, 1 thread, Zen 4).
  const std::shared_ptr<uint8_t[]> m = panel_memory(bytes);
  bytes_ = bytes;
  data_ = std::shared_ptr<float[]>(m, reinterpret_cast<float*>(m.get()));
  return data_.get();
}

std::vector<float> PackedPanels::unpack() const {
  if (parts_ == 2) {  // bf16x3: head + tail of each value
    PackedPanels part = *this;
    part.parts_ = 1;
    part.precision_ = Precision::kBF16;
    const std::vector<float> heads = part.unpack();
    part.data_ = std::shared_ptr<float[]>(
        data_, half_ != Precision::kF32
                   ? reinterpret_cast<float*>(reinterpret_cast<uint16_t*>(data_.get()) + part_size_)
                   : data_.get() + part_size_);
    const std::vector<float> tails = part.unpack();
    std::vector<float> out(heads.size());
    for (size_t i = 0; i < out.size(); ++i) {
      float v = heads[i] + tails[i], rounded = v;
      round_to_bf16(&rounded, 1);
      // A tail of half the head's ulp makes a tie that bf16 may round away from the head: then
      // the value a hair nearer the head (exact in fp32), which splits into the same two again.
      if (rounded != heads[i]) v = heads[i] + tails[i] * (1.0f - 1.0f / 512);
      out[i] = v;
    }
    return out;
  }
  std::vector<float> out(static_cast<size_t>(len_ * k_));
  const int64_t steps = ceil_div(k_, unit_);
  if (half_ != Precision::kF32) {
    const auto* h = reinterpret_cast<const uint16_t*>(data());
    for (int64_t i = 0; i < len_; ++i)
      for (int64_t q = 0; q < k_; ++q)
        widen_half(half_, h + (i / width_) * steps * width_ + q * width_ + i % width_,
                   &out[i * k_ + q], 1);
    return out;
  }
  const float* p = data();
  for (int64_t i = 0; i < len_; ++i)
    for (int64_t q = 0; q < k_; ++q) {
      const int64_t step = q / unit_;
      const float* panel = p + (i / width_) * steps * width_;
      const float* word = panel + step * width_ + i % width_;
      if (chunk_ > 0) {  // the step's chunk holds each row's steps of it in turn
        const int64_t first = step / chunk_ * chunk_, w = std::min<int64_t>(chunk_, steps - first);
        word = panel + first * width_ + (i % width_) * w + (step - first);
      }
      if (unit_ == 1) {
        out[i * k_ + q] = *word;
        continue;
      }
      uint32_t w = 0;  // a bf16 pair: k even in the low half
      std::memcpy(&w, word, 4);
      const uint32_t bits = (q % 2 ? w & 0xffff0000u : w << 16);
      std::memcpy(&out[i * k_ + q], &bits, 4);
    }
  return out;
}

PackedB pack_b(int64_t k, int64_t n, const float* b, int64_t ldb, bool trans_b,
               Precision precision) {
  PackedB p;
  const int64_t nr = nr_of(active_isa());
  const PanelOps o = panel_ops(precision, 0);  // B's panels are the same for AMX
  const int64_t stride = ceil_div(k, o.unit) * nr;
  const int parts = o.split ? 2 : 1;
  std::vector<float> tails;  // bf16x3: B's tails, packed after its values
  const int64_t cols = trans_b ? k : n;
  if (o.split) {
    tails.resize(static_cast<size_t>(k * n));
    tails_of(b, ldb, trans_b ? n : k, cols, tails.data());
  }
  auto source = [&](int part) { return part ? tails.data() : b; };
  auto stride_of = [&](int part) { return part ? cols : ldb; };
  if (half_panels_run(precision)) {      // rounded once, stored as halves
    const Precision half = o.precision;  // bf16 for bf16x3
    auto* dst = reinterpret_cast<uint16_t*>(p.allocate(n, k, nr, precision, 1, half, parts));
    std::vector<float> panel(static_cast<size_t>(stride));
    for (int part = 0; part < parts; ++part)
      for (int64_t j = 0; j < n; j += nr) {
        const int64_t ld = stride_of(part);
        const float* src = trans_b ? source(part) + j * ld : source(part) + j;
        pack_b_for(o, src, ld, trans_b, k, std::min(nr, n - j), panel.data(), stride);
        narrow_half(half, panel.data(), dst + part * p.part_size() + j / nr * stride, stride);
      }
    return p;
  }
  float* dst = p.allocate(n, k, nr, precision, o.unit, Precision::kF32, parts);
  for (int part = 0; part < parts; ++part)
    pack_b_for(o, source(part), stride_of(part), trans_b, k, n, dst + part * p.part_size(), stride);
  return p;
}

void sgemm_packed(const GemmArgs& args, const PackedB& packed) {
  PTO_CHECK(packed.k() == args.k && packed.n() == args.n)
      << "sgemm_packed: B packed as " << packed.k() << " x " << packed.n() << ", used as " << args.k
      << " x " << args.n;
  GemmArgs g = args;
  g.precision = packed.precision();
  if (static_cast<Isa>(packed.isa()) == active_isa() &&
      panel_ops(g.precision, 0).unit == packed.k_per_step() &&
      (packed.half_panels() == Precision::kF32 || half_panels_run(packed.half_panels()))) {
    run_gemm(g, {nullptr, packed.data(), packed.half_panels(), 0, packed.part_size()}, 1, 0, 0, 0,
             0);
    return;
  }
  // Packed for another ISA's panel width, bf16 pairs where VDPBF16PS is now off, or halves where
  // F16C is: unpack to N x K (B transposed) and run the plain path (bf16 and f16 values stay
  // what they are: rounding is idempotent).
  const std::vector<float> b = packed.unpack();
  g.b = b.data();
  g.ldb = args.k;
  g.trans_b = true;
  g.b_rows = nullptr;
  sgemm(g);
}

int64_t packed_b_floats(int64_t k, int64_t n, Precision precision) {
  const int64_t nr = nr_of(active_isa());
  const PanelOps o = panel_ops(precision, 0);
  return (o.split ? 2 : 1) * ceil_div(n, nr) * nr * ceil_div(k, o.unit);  // bf16x3: heads, tails
}

void pack_b_into(float* dst, int64_t k, int64_t n, const float* b, int64_t ldb, bool trans_b,
                 Precision precision) {
  const PanelOps o = panel_ops(precision, 0);  // B's panels are the same for AMX
  const int64_t stride = ceil_div(k, o.unit) * nr_of(active_isa());
  pack_b_for(o, b, ldb, trans_b, k, n, dst, stride);
  if (o.split)  // the tails' panels after the values'
    pack_b_for(o, b, ldb, trans_b, k, n, dst + packed_b_floats(k, n, precision) / 2, stride,
               nullptr, true);
}

void sgemm_prepacked(const GemmArgs& args, const float* packed_b) {
  GemmArgs g = args;
  g.b_rows = nullptr;
  const int64_t tails =
      g.precision == Precision::kBF16x3 ? packed_b_floats(g.k, g.n, g.precision) / 2 : 0;
  run_gemm(g, {nullptr, packed_b, Precision::kF32, 0, tails}, 1, 0, 0, 0, 0);
}

PackedA pack_a(int64_t m, int64_t k, const float* a, int64_t lda, bool trans_a,
               Precision precision) {
  PackedA p;
  const PanelOps o = panel_ops(precision, m);
  float* dst =
      p.allocate(m, k, a_panel_rows(o), precision, o.unit, Precision::kF32, o.split ? 2 : 1);
  if (o.amx) p.chunk_ = avx512::kAmxStepsPerTile;
  pack_a_for(o, a, lda, trans_a, m, k, dst);
  if (o.split) {  // the tails' panels after the values'
    const int64_t rows = trans_a ? k : m, cols = trans_a ? m : k;
    std::vector<float> tails(static_cast<size_t>(rows * cols));
    tails_of(a, lda, rows, cols, tails.data());
    pack_a_for(o, tails.data(), cols, trans_a, m, k, dst + p.part_size());
  }
  return p;
}

void sgemm_packed_a(const GemmArgs& args, const PackedA& packed) {
  PTO_CHECK(packed.m() == args.m && packed.k() == args.k)
      << "sgemm_packed_a: A packed as " << packed.m() << " x " << packed.k() << ", used as "
      << args.m << " x " << args.k;
  GemmArgs g = args;
  g.precision = packed.precision();
  const PanelOps o = panel_ops(g.precision, args.m);
  if (static_cast<Isa>(packed.isa()) == active_isa() && o.unit == packed.k_per_step() &&
      packed.width() == a_panel_rows(o) &&
      packed.chunk_steps() == (o.amx ? avx512::kAmxStepsPerTile : 0)) {
    run_gemm(g, {packed.data(), nullptr, Precision::kF32, packed.part_size(), 0}, 1, 0, 0, 0, 0);
    return;
  }
  // Packed for another ISA's panel height, bf16 pairs where VDPBF16PS is now off, or for or
  // against AMX where it is now off or on: unpack to M x K and run the plain path (bf16 values
  // stay bf16: rounding is idempotent).
  const std::vector<float> a = packed.unpack();
  g.a = a.data();
  g.lda = args.k;
  g.trans_a = false;
  sgemm(g);
}

}  // namespace pto::cpu
