// Conv geometry, im2col in column blocks, the implicit-GEMM path and the depthwise driver
// (the vector code of the depthwise kernel is in conv_depthwise_impl.h).
#include "backend/cpu/conv/conv.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "backend/cpu/conv/conv_amx.h"
#include "backend/cpu/gemm/gemm_kernel.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/tile_exec.h"
#include "backend/cpu/tile_kernel.h"
#include "ir/ops/window.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

using window::ceil_div;

// The per-thread workspace slot of conv's im2col columns and padded depthwise planes (the GEMM
// uses the others).
constexpr int kConvScratch = 3;
// The calling thread's slot for the shifted path's padded input, which every task reads.
constexpr int kShiftedInputScratch = 2;

float* workspace(int64_t n) {
  return scratch_as<float>(static_cast<size_t>(std::max<int64_t>(n, 1)), kConvScratch);
}

// ---- general path: implicit GEMM ----

// The 1x1, stride-1, unpadded conv: the input plane is already the GEMM's B matrix.
bool is_pointwise(const ConvGeometry& g) {
  return g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 &&
         g.oh == g.ih && g.ow == g.iw;
}

// Columns per block (the planner's): enough that the weights, re-read once per block, are
// amortised over at least 256 columns, and otherwise a block of col of at most about 512 KB (a
// share of L2). The block is also the unit of work on several threads (conv_gemm: one task per
// block, when there are at least 3 per thread or a multiple of the threads), so there the plane is
// cut into blocks of equal size, a multiple of the threads: blocks of the target size and a
// remainder made two tasks of 8192 and 4352 columns on MobileNetV2's 112x112 planes, one thread
// idle a third of the time, and its stem's three blocks ran one after another (2.1x slower); 7
// blocks left one thread 4 and the other 3 (now 8).
int64_t column_block(const ConvGeometry& g, int64_t k) {
  const int64_t plane = g.out_plane(), threads = num_threads();
  if (g.cols > 0) return std::min(plane, g.cols);
  const int64_t target = std::max<int64_t>(256, (int64_t{128} << 10) / std::max<int64_t>(k, 1));
  const int64_t full = (target + 15) / 16 * 16;
  if (threads == 1) return std::min(plane, full);
  int64_t blocks = ceil_div(plane, full);
  if (blocks > 1) blocks = ceil_div(blocks, threads) * threads;
  return std::min(plane, (ceil_div(plane, blocks) + 15) / 16 * 16);
}

void conv_gemm(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* y,
               const Epilogue& ep, const PackedA* packed_w, Precision precision) {
  const int64_t K = g.cg() * g.kh * g.kw, Mg = g.mg(), HW = g.out_plane();
  const bool direct = is_pointwise(g);
  const int64_t nb = column_block(g, K), blocks = ceil_div(HW, nb);
  const int64_t tasks = g.n * g.group * blocks;

  // One GEMM for column block `b` of image `n`, group `gi`; `col` holds K x nb floats. With
  // `split_im2col`, the im2col is spread over the pool (the GEMM then parallelises itself).
  auto task = [&](int64_t t, float* col, bool split_im2col) {
    const int64_t b = t % blocks, gi = (t / blocks) % g.group, n = t / (blocks * g.group);
    const int64_t j0 = b * nb, j1 = std::min(HW, j0 + nb);
    const float* xg = x + (n * g.c + gi * g.cg()) * g.in_plane();
    const int64_t yoff = (n * g.m + gi * Mg) * HW;
    GemmArgs a;
    a.m = Mg;
    a.n = j1 - j0;
    a.k = K;
    a.a = packed_w ? nullptr : w + gi * Mg * K;  // W may be released when packed
    a.lda = K;
    a.precision = precision;  // packed_w: the packing's
    if (direct) {
      a.b = xg + j0;
      a.ldb = g.in_plane();
    } else {
      if (split_im2col)
        parallel_for(0, K, 16, [&](int64_t k0, int64_t k1) {
          PTO_ISA_DISPATCH(im2col, g, xg, j0, j1, k0, k1, col);
        });
      else
        PTO_ISA_DISPATCH(im2col, g, xg, j0, j1, 0, K, col);
      a.b = col;
      a.ldb = j1 - j0;
    }
    a.c = y + yoff + j0;
    a.ldc = HW;
    a.epilogue = ep;
    a.epilogue.bias_kind = bias ? Epilogue::Bias::kPerRow : Epilogue::Bias::kNone;
    a.epilogue.bias = bias ? bias + gi * Mg : nullptr;
    if (ep.residual) {
      a.epilogue.residual = ep.residual + yoff + j0;
      a.epilogue.ldr = HW;
    }
    // A tile program runs after the GEMM, on whole rows of the block (cache-resident): there a
    // per-channel operand is one value per tile and C's rows are contiguous runs, which the
    // GEMM's micro-tiles (a few columns of many rows) would have to gather.
    EpilogueOperand operands[kTileMaxRegs];
    Epilogue tile = epilogue_at(ep, n, gi * Mg, j0, operands);
    a.epilogue.tile = nullptr;
    if (K == 0) {  // no input channels: the output is the epilogue of zero
      for (int64_t i = 0; i < a.m; ++i) std::fill(a.c + i * HW, a.c + i * HW + a.n, 0.0f);
      apply_epilogue(a.epilogue, a.c, a.ldc, 0, a.m, 0, a.n);
    } else if (packed_w) {
      sgemm_packed_a(a, packed_w[gi]);
    } else {
      sgemm(a);
    }
    if (!tile.tile) return;
    if (split_im2col)  // the GEMM ran on the whole pool: so does its epilogue
      parallel_for(0, Mg, 1, [&](int64_t i0, int64_t i1) {
        apply_epilogue(tile, a.c + i0 * HW, HW, i0, i1 - i0, 0, a.n);
      });
    else
      apply_epilogue(tile, a.c, HW, 0, Mg, 0, a.n);
  };

  const int64_t threads = num_threads();
  const int64_t col_size = direct ? 0 : K * nb;
  if (threads > 1 && (tasks >= 3 * threads || tasks % threads == 0)) {
    // Enough independent GEMMs: one per task, each serial, with a col buffer per chunk.
    parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
      float* col = workspace(col_size);
      for (int64_t t = t0; t < t1; ++t) task(t, col, false);
    });
  } else {
    float* col = workspace(col_size);
    for (int64_t t = 0; t < tasks; ++t) task(t, col, threads > 1);
  }
}

// ---- shifted path: implicit GEMM on a padded, phase-split copy of the input ----

ShiftedPlane shifted_plane_of(const ConvGeometry& g) {
  ShiftedPlane p;
  static_cast<ConvWindow&>(p) = g;
  p.rpp = g.oh + (g.kh - 1) * g.dh / g.sh;
  p.wp = g.ow + (g.kw - 1) * g.dw / g.sw;
  return p;
}

// The shifted path computes wp - ow junk columns per output row but builds no col; it wins while
// they are few (measured: 56 and 28 wide outputs; a 14 wide one does 14% more work and loses).
bool use_shifted(const ConvGeometry& g) {
  if (g.kh * g.kw == 1 || g.cg() == 0) return false;  // a 1x1 conv's col is a cheap copy
  const ShiftedPlane p = shifted_plane_of(g);
  return g.sh == 1 && g.sw == 1 && p.wp * 8 <= g.ow * 9 && g.oh * p.wp >= 256;
}

// The padded, phase-split copy of every input plane (in the calling thread's scratch, which every
// task reads) and the row table of B: row k = (c, ky, kx) is channel c's phase plane of the tap,
// shifted by the tap's offset. `slack` zeros follow the last plane (what reads past it may see).
struct ShiftedInput {
  ShiftedPlane p;
  int64_t chan = 0;  // floats per input channel: sh * sw phase planes
  const float* padded = nullptr;
  std::vector<int64_t> rows;  // K + kGemmRowsSlack entries
};

ShiftedInput shifted_input(const ConvGeometry& g, const float* x, int64_t slack) {
  ShiftedInput in;
  in.p = shifted_plane_of(g);
  const ShiftedPlane& p = in.p;
  const int64_t phase = p.rpp * p.wp, planes = g.n * g.c, K = g.cg() * g.kh * g.kw;
  in.chan = g.sh * g.sw * phase;
  const int64_t chan = in.chan;
  float* padded =
      scratch_as<float>(static_cast<size_t>(planes * chan + slack), kShiftedInputScratch);
  std::fill(padded + planes * chan, padded + planes * chan + slack, 0.0f);
  parallel_for(0, planes, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      PTO_ISA_DISPATCH(shifted_pad, p, x + t * g.in_plane(), padded + t * chan);
  });
  in.padded = padded;
  in.rows.resize(static_cast<size_t>(K + kGemmRowsSlack));
  for (int64_t k = 0; k < K; ++k) {
    const int64_t kx = k % g.kw, ky = k / g.kw % g.kh, ci = k / (g.kw * g.kh);
    in.rows[static_cast<size_t>(k)] = ci * chan + shifted_tap_offset(p, ky, kx);
  }
  return in;
}

void conv_shifted(const ConvGeometry& g, const float* x, const float* w, const float* bias,
                  float* y, const Epilogue& ep, const PackedA* packed_w, Precision precision) {
  const int64_t K = g.cg() * g.kh * g.kw, Mg = g.mg(), HW = g.out_plane();
  // The last tap's junk columns read up to (kw - 1) dw / sw floats past the last channel.
  const ShiftedInput in = shifted_input(g, x, (g.kw - 1) * g.dw / g.sw + 16);
  const ShiftedPlane& p = in.p;
  const int64_t chan = in.chan;
  const float* padded = in.padded;
  const std::vector<int64_t>& rows = in.rows;
  // Column blocks of whole output rows, a C block of about 256 KB (at least 512 columns).
  const int64_t target = std::max<int64_t>(512, (int64_t{64} << 10) / Mg);
  const int64_t threads = num_threads();
  int64_t rb = std::clamp<int64_t>(target / p.wp, 1, g.oh), blocks = ceil_div(g.oh, rb);
  // As many rows for each thread: 56 rows in blocks of 17 ran 34 rows on one thread and 22 on
  // the other (bf16 64 -> 64 @56 3x3 on 2 threads, p50 0.43-0.45 -> 0.33-0.36 ms as 4 x 14).
  if (blocks > 1 && threads > 1) {
    rb = ceil_div(g.oh, ceil_div(blocks, threads) * threads);
    blocks = ceil_div(g.oh, rb);
  }
  const int64_t tasks = g.n * g.group * blocks;
  Epilogue rest = ep;
  rest.bias_kind = bias ? Epilogue::Bias::kPerRow : Epilogue::Bias::kNone;
  rest.ldr = HW;

  auto task = [&](int64_t t) {
    const int64_t b = t % blocks, gi = (t / blocks) % g.group, n = t / (blocks * g.group);
    const int64_t oy0 = b * rb, oy1 = std::min(g.oh, oy0 + rb), cols = (oy1 - oy0) * p.wp;
    float* cbuf = workspace(Mg * cols);
    GemmArgs a;
    a.m = Mg;
    a.n = cols;
    a.k = K;
    a.a = packed_w ? nullptr : w + gi * Mg * K;  // W may be released when packed
    a.lda = K;
    a.b = padded + (n * g.c + gi * g.cg()) * chan + oy0 * p.wp;
    a.b_rows = rows.data();
    a.precision = precision;  // packed_w: the packing's
    a.c = cbuf;
    a.ldc = cols;
    if (packed_w)
      sgemm_packed_a(a, packed_w[gi]);
    else
      sgemm(a);
    // Drop the junk columns, then the epilogue on each channel's rows while they are in cache.
    const int64_t yoff = (n * g.m + gi * Mg) * HW;
    EpilogueOperand operands[kTileMaxRegs];
    Epilogue e = epilogue_at(rest, n, gi * Mg, 0, operands);
    if (bias) e.bias = bias + gi * Mg;
    if (ep.residual) e.residual = ep.residual + yoff;
    for (int64_t m = 0; m < Mg; ++m) {
      float* yrow = y + yoff + m * HW + oy0 * g.ow;
      for (int64_t oy = oy0; oy < oy1; ++oy)
        std::memcpy(yrow + (oy - oy0) * g.ow, cbuf + m * cols + (oy - oy0) * p.wp,
                    static_cast<size_t>(g.ow) * sizeof(float));
      apply_epilogue(e, yrow, HW, m, 1, oy0 * g.ow, (oy1 - oy0) * g.ow);
    }
  };

  if (threads > 1 && (tasks >= 3 * threads || tasks % threads == 0))
    parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) task(t);
    });
  else
    for (int64_t t = 0; t < tasks; ++t) task(t);
}

// ---- taps path: bf16 products on AMX tiles, B read from pair planes (conv_amx_avx512.cpp) ----

TapsGeometry taps_geometry(const ConvGeometry& g) {
  const TapsLayout l = taps_layout(g.c, g.m, g.group, g.kh, g.kw);
  TapsGeometry t;
  static_cast<ShiftedPlane&>(t) = shifted_plane_of(g);
  t.c = g.c;
  t.fold = l.fold;
  t.taps = l.taps;
  t.chunks = l.chunks;
  t.panel_chunks = l.panel_chunks;
  if (t.fold == 0) {
    t.phases = g.sh * g.sw;
  } else {  // phases split the rows only; a tap is `fold` kernel rows
    if (t.chunks == 1) t.k_pairs = ceil_div(t.fold * g.c * g.kw, 2);
    t.rpp = g.oh + (t.taps - 1) * t.fold * g.dh / g.sh;
    t.wp = g.ow;
    t.phases = t.taps > 1 ? g.sh : 1;
  }
  t.plane = t.phases * t.rpp * t.wp;
  return t;
}

// Where tap `tap` of t reads output position 0 in a pair plane.
int64_t taps_offset(const TapsGeometry& t, int64_t tap) {
  if (t.fold == 0) return shifted_tap_offset(t, tap / t.kw, tap % t.kw);
  const int64_t row = tap * t.fold * t.dh;
  return row % t.sh * t.rpp * t.wp + row / t.sh * t.wp;
}

}  // namespace

TapsLayout taps_layout(int64_t c, int64_t m, int64_t group, int64_t kh, int64_t kw) {
  TapsLayout l{c, m, group, kh, kw};
  if (group == 1 && c < kTapsChunk)  // folded: as many kernel rows as fit a chunk, at least one
    l.fold = std::clamp<int64_t>(kTapsChunk / (c * kw), 1, kh);
  if (l.fold > 0) {
    l.taps = ceil_div(kh, l.fold);
    l.chunks = l.panel_chunks = ceil_div(l.fold * c * kw, kTapsChunk);
    return l;
  }
  l.taps = kh * kw;
  l.chunks = l.panel_chunks = ceil_div(c, kTapsChunk);
  if (group == 1) return l;
  // Grouped: the most chunks any panel's groups' channels span.
  const int64_t cg = c / group, mg = m / group;
  l.panel_chunks = 0;
  for (int64_t o0 = 0; o0 < m; o0 += kTapsChunk) {
    const int64_t first = o0 / mg * cg / kTapsChunk;
    const int64_t last = ((std::min(m, o0 + kTapsChunk) - 1) / mg + 1) * cg - 1;
    l.panel_chunks = std::max(l.panel_chunks, last / kTapsChunk - first + 1);
  }
  return l;
}

int64_t TapsLayout::first_chunk(int64_t panel) const {
  if (group == 1) return 0;
  const int64_t cg = c / group, mg = m / group;
  return std::min(panel * kTapsChunk / mg * cg / kTapsChunk, chunks - panel_chunks);
}

int64_t TapsLayout::column(int64_t o, int64_t ci, int64_t ky, int64_t kx) const {
  if (fold > 0) {
    const int64_t v = ((ky % fold) * c + ci) * kw + kx;
    return (v / kTapsChunk * taps + ky / fold) * kTapsChunk + v % kTapsChunk;
  }
  const int64_t channel = o / (m / group) * (c / group) + ci;
  const int64_t chunk = channel / kTapsChunk - first_chunk(o / kTapsChunk);
  return (chunk * taps + ky * kw + kx) * kTapsChunk + channel % kTapsChunk;
}

// The junk columns (wp - ow per output row) cost tile products but no packing: up to 30% of the
// output (a 7x7 plane's 2 of 9) the tiles still win (bf16 512 -> 512 @7 3x3, one thread: 0.47 ->
// 0.41 ms), where the shifted path stops at 12.5%.
// Grouped convs: a panel's chunks hold up to 8 times its groups' channels (ResNeXt's 4 a group:
// 8 times the products, and still 5x faster than the GEMM per group, whose A has 4 rows).
bool taps_conv_applies(const ConvGeometry& g) {
  if (active_isa() != Isa::kAvx512 || !has_ext(Ext::kAmxBf16) || g.kh * g.kw == 1 || g.dh != 1 ||
      g.dw != 1 || g.c == 0 || g.group < 1 || g.depthwise())
    return false;
  const TapsLayout l = taps_layout(g.c, g.m, g.group, g.kh, g.kw);
  bool fits = l.fold > 0 ? g.c * g.kw <= 2 * kTapsChunk && g.sh <= 4 && g.sw <= 4
                         : g.c >= kTapsChunk && g.sh <= 2 && g.sw <= 2 &&
                               (g.ow + (g.kw - 1) / g.sw) * 10 <= g.ow * 13;
  if (g.group > 1) fits = fits && l.panel_chunks * kTapsChunk <= 8 * g.cg();
  return fits && env_switch("PTO_CONV_TAPS");
}

PackedA pack_taps_weights(const float* w, const ConvGeometry& g, Precision precision) {
  PTO_CHECK(precision == Precision::kBF16 || precision == Precision::kBF16x3)
      << "pack_taps_weights: bf16 or bf16x3 products, not " << precision_name(precision);
  const TapsLayout l = taps_layout(g.c, g.m, g.group, g.kh, g.kw);
  const int64_t k = l.k(), taps = g.kh * g.kw, cg = g.cg();
  std::vector<float> t(static_cast<size_t>(g.m * k), 0.0f);
  for (int64_t m = 0; m < g.m; ++m)
    for (int64_t c = 0; c < cg; ++c)
      for (int64_t q = 0; q < taps; ++q)
        t[m * k + l.column(m, c, q / g.kw, q % g.kw)] = w[(m * cg + c) * taps + q];
  PackedA packed = pack_a(g.m, k, t.data(), k, false, precision);
  if (packed.chunk_steps() != avx512::kAmxStepsPerTile || packed.width() != avx512::kAmxMR)
    return PackedA();  // not packed for the tiles (AMX off, too few rows): not this path
  return packed;
}

void conv_taps(const ConvGeometry& g, const float* x, const PackedA& w, const float* bias, float* y,
               const Epilogue& ep) {
  TapsGeometry t = taps_geometry(g);
  std::vector<int64_t> offsets(static_cast<size_t>(t.taps));
  for (int64_t tap = 0; tap < t.taps; ++tap) offsets[tap] = taps_offset(t, tap);
  t.tap_offset = offsets.data();
  // Every image's pair planes (bf16x3: then the planes of their tails), then what the last
  // block's tile loads read past them (junk columns only), zeroed.
  const bool split = w.precision() == Precision::kBF16x3;
  const int64_t pairs = t.chunks == 1 ? t.k_pairs : t.chunks * kTapsChunk / 2;
  const int64_t image = pairs * t.plane;
  const int64_t slack = 2 * kTapsChunk + g.kw, all = (split ? 2 : 1) * g.n * image;
  auto* planes = scratch_as<uint32_t>(static_cast<size_t>(all + slack), kShiftedInputScratch);
  uint32_t* tails = split ? planes + g.n * image : nullptr;
  std::fill(planes + all, planes + all + slack, 0u);
  parallel_for(0, (split ? 2 : 1) * g.n * pairs, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1;) {  // p: part (heads, tails), image, pair
      const int64_t q = p % (g.n * pairs), n = q / pairs, e = std::min(p1, p - q % pairs + pairs);
      const bool tail = p >= g.n * pairs;
      avx512::taps_planes(t, x + n * g.c * g.in_plane(), q % pairs, q % pairs + (e - p), tail,
                          (tail ? tails : planes) + n * image);
      p = e;
    }
  });
  // Tasks: blocks of output positions (whole rows where there are enough: about 2048 columns
  // each) by parts of the output channels, as many for every thread. Every position block reads
  // all the weights and every part all the planes, so the threads split what is larger: the
  // positions where the planes are (56x56, 64 channels: 0.43 MB of planes, 0.07 MB of weights),
  // the channels where the weights are (7x7, 512 channels: 4.7 MB of weights read by both threads
  // made the conv 1.7x slower on two). A 1-D conv's one row is split by its positions.
  const int64_t threads = num_threads(), HW = g.out_plane();
  const int64_t panels = ceil_div(g.m, avx512::kAmxMR);
  const bool split_m = threads > 1 && g.m * w.k() > t.chunks * kTapsChunk * t.plane;
  int64_t blocks = std::max<int64_t>(1, ceil_div(g.oh * t.wp, 2048));
  if (threads > 1 && !split_m) blocks = ceil_div(blocks, threads) * threads;
  blocks = std::clamp<int64_t>(blocks, 1, ceil_div(HW, 32));
  const bool by_rows = g.oh >= blocks;
  const int64_t parts = split_m ? std::min<int64_t>(panels, threads) : 1;
  Epilogue rest = ep;
  rest.bias_kind = bias ? Epilogue::Bias::kPerRow : Epilogue::Bias::kNone;
  rest.ldr = HW;
  const int64_t panel_floats = w.k() / 2 * avx512::kAmxMR;  // one A panel: 32 rows of K pairs
  const TapsLayout layout = taps_layout(g.c, g.m, g.group, g.kh, g.kw);
  std::vector<int64_t> first_chunk(static_cast<size_t>(panels));
  for (int64_t i = 0; i < panels; ++i) first_chunk[i] = layout.first_chunk(i);
  auto column = [&](int64_t p) { return p / g.ow * t.wp + p % g.ow; };  // of output position p
  // A residual and ReLU or Clip are applied as the outputs are written; others after, per block.
  Epilogue plain = ep;
  plain.bias_kind = Epilogue::Bias::kNone;
  RowEpilogue in_regs;
  const bool fused = row_epilogue(plain, &in_regs);
  parallel_for(0, g.n * blocks * parts, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t part = task % parts, b = task / parts % blocks, n = task / parts / blocks;
      const int64_t p0 = by_rows ? b * g.oh / blocks * g.ow : b * HW / blocks;
      const int64_t p1 = by_rows ? (b + 1) * g.oh / blocks * g.ow : (b + 1) * HW / blocks;
      if (p0 == p1) continue;
      const int64_t m0 = part * panels / parts * avx512::kAmxMR;
      const int64_t m1 = std::min(g.m, (part + 1) * panels / parts * avx512::kAmxMR);
      float* yn = y + n * g.m * HW;
      const float* a = w.data() + m0 / avx512::kAmxMR * panel_floats;
      RowEpilogue e_n = in_regs;
      if (in_regs.residual) e_n.residual += (n * g.m + m0) * HW;
      TapsGeometry tn = t;
      tn.first_chunk = first_chunk.data() + m0 / avx512::kAmxMR;
      avx512::taps_rows(tn, a, split ? a + w.part_size() : nullptr, m1 - m0, planes + n * image,
                        split ? tails + n * image : nullptr, column(p0), column(p1 - 1) + 1,
                        yn + m0 * HW, bias ? bias + m0 : nullptr, fused ? &e_n : nullptr);
      if (fused) continue;
      EpilogueOperand operands[kTileMaxRegs];
      Epilogue e = epilogue_at(rest, n, 0, 0, operands);
      if (bias) e.bias = bias;
      if (ep.residual) e.residual = ep.residual + n * g.m * HW;
      for (int64_t m = m0; m < m1; ++m) apply_epilogue(e, yn + m * HW + p0, HW, m, 1, p0, p1 - p0);
    }
  });
}

namespace {

// ---- stem path: the shifted path's micro-kernels writing Y's rows directly ----

// A conv on few input channels (a network's first conv on the image: 1-4 channels) has a short K
// (3 x 3 x 3 = 27 to 3 x 7 x 7 = 147) and a large output plane, so what the other paths cost
// besides the multiply-adds dominates it: im2col writes and re-reads a col of K rows by the
// whole plane, and the shifted path's GEMM computes junk columns into a buffer that is then
// copied to Y and passed over again by the epilogue. Here each output row is one GEMM
// macro-block of Mg x ow: B's rows are the tap rows of the phase-split input (as in the shifted
// path, read in place through a row table), C is Y's row itself (row stride HW), and the epilogue
// runs per micro-tile, in L1. Conv + ReLU alone, 1 thread, min of 40 calls, AMD Zen 4 (load 3),
// im2col (shifted at stride 1) -> this path, us, ONNX Runtime in brackets: 3 -> 32 3x3/2 @224
// (MobileNetV2) 313 -> 287 (269), 3 -> 16 3x3/2 @320 (YOLOv8n) 374 -> 321 (275), 3 -> 64 3x3/2
// 558 -> 524 (534), 3 -> 48 428 -> 400 (386), ResNet's 3 -> 64 7x7/2 2460 -> 2172 (2170),
// SegFormer's 3 -> 16 7x7/4 282 -> 213 (149), 3 -> 64 7x7/4 676 -> 667 (545), 4 -> 32 5x5/2
// 978 -> 808 (786), 3 -> 24 3x3/1 845 -> 803 (1157), 1 -> 32 3x3/1 @128 200 -> 184 (198). Not
// patchify convs (window = stride: ConvNeXt's 4x4/4), whose taps each read their own phase plane:
// 3 -> 64, 96, 128 4x4/4 253, 346, 444 -> 278, 384, 497 (im2col is a plain permutation there);
// nor grouped convs of 4 channels a group (ResNeXt's 128 @56 in 32 groups: 434 -> 445, shifted);
// nor more than 64 output channels, where the GEMM's blocking wins back its col: 3 -> 256 3x3/2
// 2007 -> 2177. 1-D convs gain too: 1 -> 64 k3 on 16000 samples 265 -> 191 (189), 2 -> 32 k7 on
// 8000 120 -> 103 (119).
constexpr int64_t kStemMaxChannels = 4, kStemMaxOutputs = 64, kStemMinWidth = 16;

// PTO_CONV_STEM=0 keeps stems on the shifted / im2col paths (A/B and tests); unset or 1 lets them
// take the stem path. Anything else is an error.
bool stem_enabled() {
  return env_switch("PTO_CONV_STEM");
}

bool use_stem(const ConvGeometry& g) {
  return g.group == 1 && g.c <= kStemMaxChannels && g.m <= kStemMaxOutputs &&
         g.ow >= kStemMinWidth && g.kh * g.kw > 1 && !(g.kh == g.sh && g.kw == g.sw) &&
         stem_enabled();
}

// The stem path runs on the weights packed for this ISA's fp32 micro-kernel (conv2d packs them
// for the other cases).
bool stem_weights_fit(const PackedA* packed_w, Precision precision) {
  return packed_w && precision == Precision::kF32 && packed_w[0].precision() == Precision::kF32 &&
         packed_w[0].isa() == static_cast<int>(active_isa());
}

void conv_stem(const ConvGeometry& g, const float* x, const float* bias, float* y,
               const Epilogue& ep, const PackedA* packed_w) {
  const int64_t K = g.cg() * g.kh * g.kw, Mg = g.mg(), HW = g.out_plane();
  // The last vector of an output row reads up to a vector past it (at most 15 junk floats into
  // the next row, past the last channel at the end), and the micro-kernel fetches rows ahead.
  const ShiftedInput in = shifted_input(g, x, (g.kw - 1) * g.dw / g.sw + 64);
  const ShiftedPlane& p = in.p;
  const int64_t chan = in.chan;
  const float* padded = in.padded;
  int64_t mr = 0, nr = 0;
  PTO_ISA_DISPATCH(gemm_block, &mr, &nr);
  Epilogue rest = ep;
  rest.bias_kind = bias ? Epilogue::Bias::kPerRow : Epilogue::Bias::kNone;
  rest.ldr = HW;
  // Tasks of whole output rows of one image and group: about 64 K of multiply-adds at least.
  const int64_t per_row = Mg * g.ow * K;
  const int64_t rb =
      std::clamp<int64_t>((int64_t{1} << 16) / std::max<int64_t>(per_row, 1), 1, g.oh);
  const int64_t blocks = ceil_div(g.oh, rb), tasks = g.n * g.group * blocks;
  auto run = [&](int64_t t0, int64_t t1) {
    EpilogueOperand operands[kTileMaxRegs];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t % blocks, gi = t / blocks % g.group, n = t / (blocks * g.group);
      const int64_t yoff = (n * g.m + gi * Mg) * HW;
      Epilogue e = epilogue_at(rest, n, gi * Mg, 0, operands);
      if (bias) e.bias = bias + gi * Mg;
      if (ep.residual) e.residual = ep.residual + yoff;
      MacroBlock blk;
      blk.m = Mg;
      blk.n = g.ow;
      blk.k = K;
      blk.a = packed_w[gi].data();
      blk.b_panel_stride = nr;
      blk.b_rows = in.rows.data();
      blk.ldc = HW;
      blk.epilogue = &e;
      for (int64_t oy = b * rb; oy < std::min(g.oh, (b + 1) * rb); ++oy) {
        blk.b = padded + (n * g.c + gi * g.cg()) * chan + oy * p.wp;
        blk.c = y + yoff + oy * g.ow;
        blk.n0 = oy * g.ow;
        PTO_ISA_DISPATCH(gemm_macro, blk);
      }
    }
  };
  if (tasks > 1 && num_threads() > 1)
    parallel_for(0, tasks, 1, run);
  else
    run(0, tasks);
}

// ---- depthwise path ----

DepthwisePlane depthwise_plane_of(const ConvGeometry& g) {
  DepthwisePlane p;
  static_cast<ConvWindow&>(p) = g;
  p.rows = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  const int64_t cols = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;  // padded row length read
  p.phase_len = ceil_div(cols, g.sw);
  p.row_len = g.sw * p.phase_len;
  return p;
}

// The flat kernel reads the input plane itself (no copy) when it already has the output's rows.
bool depthwise_flat_copies(const ConvGeometry& g) {
  return !(g.sh == 1 && g.sw == 1 && g.iw == g.ow);
}

// DepthwiseFlat's offsets and lane masks for a geometry and vector width, made once (per thread)
// and kept: a model's depthwise convs have a handful of geometries.
struct FlatTables {
  std::vector<int64_t> off;
  std::vector<uint32_t> mask;
  std::vector<uint64_t> full;
  std::vector<uint8_t> inside;
  int64_t vectors = 0, phase_rows = 0, phase_stride = 0;
};

const FlatTables& flat_tables(const ConvGeometry& g, int lanes) {
  using Key = std::array<int64_t, 13>;
  thread_local std::map<Key, FlatTables> cache;
  const Key key{g.ih, g.iw, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.ph, g.pw, lanes};
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  FlatTables t;
  const int64_t K = g.kh * g.kw, hw = g.oh * g.ow;
  t.vectors = ceil_div(hw, lanes);
  t.phase_rows = ceil_div(g.ih, g.sh);
  t.phase_stride = t.phase_rows * g.ow + lanes;  // a vector's room after each phase plane
  t.off.resize(static_cast<size_t>(K));
  t.mask.assign(static_cast<size_t>(t.vectors * K), 0u);
  t.full.assign(static_cast<size_t>(t.vectors), 0);
  auto floor_div = [](int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); };
  // Tap (ky, kx) reads input row oy sh + ky dh - ph: phase py = that mod sh, row oy + da of the
  // phase plane, which has ceil((ih - py) / sh) rows (likewise columns, in rows of ow).
  std::vector<int64_t> da(K), db(K), rows(K), cols(K);
  for (int64_t ky = 0; ky < g.kh; ++ky)
    for (int64_t kx = 0; kx < g.kw; ++kx) {
      const int64_t k = ky * g.kw + kx, ty = ky * g.dh - g.ph, tx = kx * g.dw - g.pw;
      da[k] = floor_div(ty, g.sh);
      db[k] = floor_div(tx, g.sw);
      const int64_t py = ty - da[k] * g.sh, px = tx - db[k] * g.sw;
      rows[k] = ceil_div(g.ih - py, g.sh);
      cols[k] = ceil_div(g.iw - px, g.sw);
      t.off[k] = (py * g.sw + px) * t.phase_stride + da[k] * g.ow + db[k];
    }
  for (int64_t oy = 0, f = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox, ++f)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t a = oy + da[k], b = ox + db[k];
        if (a >= 0 && a < rows[k] && b >= 0 && b < cols[k])
          t.mask[f / lanes * K + k] |= uint32_t{1} << (f % lanes);
      }
  const uint32_t all = lanes >= 32 ? ~uint32_t{0} : (uint32_t{1} << lanes) - 1;
  for (int64_t v = 0; v < t.vectors; ++v) {
    uint64_t full = 0;
    for (int64_t k = 0; k < K && k < 64; ++k)
      if (t.mask[v * K + k] == all) full |= uint64_t{1} << k;
    t.full[v] = full;
  }
  // Vectors whose every tap's whole vector lies inside the source (the input plane, or the split
  // copy): their masked taps may load whole vectors and mask the multiply-add instead.
  const int64_t src_len = depthwise_flat_copies(g) ? g.sh * g.sw * t.phase_stride : g.ih * g.iw;
  t.inside.assign(static_cast<size_t>(t.vectors), 0);
  for (int64_t v = 0; v < t.vectors; ++v) {
    bool in = true;
    for (int64_t k = 0; k < K; ++k)
      in = in && v * lanes + t.off[k] >= 0 && v * lanes + t.off[k] + lanes <= src_len;
    t.inside[v] = in;
  }
  return cache.emplace(key, std::move(t)).first->second;
}

// DepthwiseGapped's layout for a geometry that depthwise_gapped_applies to.
DepthwiseGapped gapped_layout(const ConvGeometry& g) {
  DepthwiseGapped d;
  const int64_t right = (g.kw - 1) - g.pw;
  d.stride = g.iw + std::max(g.pw, right);
  d.lead = g.ph * d.stride + g.pw;
  // The last tap of the last row's last vector (columns past ow are computed, not stored).
  d.len = (g.oh + g.kh - 2) * d.stride + ceil_div(g.ow, 16) * 16 + g.kw - 1;
  return d;
}

// The depthwise conv by the flat kernel: no padded plane; a stride > 1 (or an input narrower
// than the output) splits the input into phase planes with the output's row length first.
void conv_depthwise_flat(const ConvGeometry& g, const float* x, const float* w, const float* bias,
                         float* y, const Epilogue& ep) {
  const int lanes = PTO_ISA_DISPATCH(depthwise_flat_lanes);
  const FlatTables& tb = flat_tables(g, lanes);
  DepthwiseFlat p;
  static_cast<ConvWindow&>(p) = g;
  p.lanes = lanes;
  p.vectors = tb.vectors;
  p.phase_rows = tb.phase_rows;
  p.phase_stride = tb.phase_stride;
  p.off = tb.off.data();
  p.mask = tb.mask.data();
  p.full = tb.full.data();
  p.inside = tb.inside.data();
  p.clamp =
      !ep.tile && !ep.residual && (ep.act == Activation::kRelu || ep.act == Activation::kClip);
  p.lo = ep.act == Activation::kRelu ? 0.0f : ep.lo;
  p.hi = ep.act == Activation::kRelu ? std::numeric_limits<float>::infinity() : ep.hi;
  // Strided rows that fit a vector take the rows kernel, which reads the input as it is.
  const bool rows = depthwise_rows_applies(g);
  const bool copies = !rows && depthwise_flat_copies(g);
  const bool use_gapped = depthwise_gapped_applies(g);
  const DepthwiseGapped gl = use_gapped ? gapped_layout(g) : DepthwiseGapped{};
  const DepthwiseGapped* gapped = use_gapped ? &gl : nullptr;
  // The split copy: sh * sw phase planes, and a vector's room past the last (masked reads).
  const int64_t split_plane = g.sh * g.sw * p.phase_stride;
  const int64_t mult = g.m / g.c, HW = g.out_plane(), K = g.kh * g.kw;
  // Planes per call: the kernel's channel blocks on tiny planes (at most 3 vectors); larger ones
  // one at a time, so that a split copy stays in L1 while the kernel reads it.
  constexpr int64_t kGroup = 4;
  const int64_t group = p.vectors <= 3 ? kGroup : 1;
  Epilogue rest = ep;  // what is not clamped in registers, per plane while in cache
  rest.bias_kind = Epilogue::Bias::kNone;
  rest.ldr = HW;
  const bool has_rest = ep.tile || ep.residual || (ep.act != Activation::kNone && !p.clamp);
  // With an epilogue pass, planes go through it in runs of about 16 KB (in L1 after the kernel).
  const int64_t rest_run = std::max<int64_t>(group, 4096 / std::max<int64_t>(HW, 1));
  parallel_for(0, g.n * g.m, 1, [&](int64_t t0, int64_t t1) {
    float* buf = copies ? workspace(group * split_plane) : nullptr;
    if (gapped) {  // zeros once: each plane's copy writes only its input rows
      buf = workspace(gapped->len);
      std::fill(buf, buf + gapped->len, 0.0f);
    }
    int64_t split_of = -1;  // which input plane buf holds (one plane, depth multiplier > 1)
    EpilogueOperand operands[kTileMaxRegs];
    for (int64_t t = t0; t < t1;) {
      const int64_t n = t / g.m, m = t % g.m, plane = n * g.c + m / mult;
      // Without a copy or an epilogue pass, a whole run of planes in one call (the kernel
      // blocks them itself): no dispatch and divisions per few tiny planes.
      const int64_t run = copies ? group : has_rest ? rest_run : g.m;
      const int64_t cnt = mult == 1 ? std::min({run, t1 - t, g.m - m}) : 1;
      const float* src = x + plane * g.in_plane();
      int64_t src_plane = g.in_plane();
      if (copies) {
        if (cnt > 1 || plane != split_of)
          for (int64_t i = 0; i < cnt; ++i)
            PTO_ISA_DISPATCH(depthwise_flat_split, p, src + i * g.in_plane(),
                             buf + i * split_plane);
        split_of = cnt > 1 ? -1 : plane;
        src = buf;
        src_plane = split_plane;
      }
      const float* wm = w + m * K;
      const float* bm = bias ? bias + m : nullptr;
      if (!(gapped && PTO_ISA_DISPATCH(depthwise_gapped, p, *gapped, src, src_plane, wm, bm,
                                       y + t * HW, cnt, buf)) &&
          !(rows && PTO_ISA_DISPATCH(depthwise_rows, p, src, src_plane, wm, bm, y + t * HW, cnt)))
        PTO_ISA_DISPATCH(depthwise_flat, p, src, src_plane, wm, bm, y + t * HW, cnt);
      if (has_rest) {  // the cnt planes as rows of HW: one call (per plane, tiny planes paid
                       // the epilogue's set-up 1152 times: EfficientNet-B0's SiLU convs 4x slower)
        float* yp = y + t * HW;
        if (ep.tile) {
          apply_epilogue(epilogue_at(rest, n, m, 0, operands), yp, HW, 0, cnt, 0, HW);
        } else {  // no per-channel operand left: the cnt planes as one row, which leaves one
                  // masked vector a run, not a plane (SiLU on 1152 planes of 7x7: 37 -> 29 us)
          Epilogue e = rest;
          if (ep.residual) e.residual = ep.residual + t * HW;
          e.ldr = cnt * HW;
          apply_epilogue(e, yp, cnt * HW, 0, 1, 0, cnt * HW);
        }
      }
      t += cnt;
    }
  });
}

void conv_depthwise(const ConvGeometry& g, const float* x, const float* w, const float* bias,
                    float* y, const Epilogue& ep) {
  if (depthwise_flat_enabled() && depthwise_flat_applies(g))
    return conv_depthwise_flat(g, x, w, bias, y, ep);
  const DepthwisePlane p = depthwise_plane_of(g);
  const int64_t mult = g.m / g.c, HW = g.out_plane(), K = g.kh * g.kw;
  Epilogue rest = ep;  // residual and activation, applied per plane while it is in cache
  rest.bias_kind = Epilogue::Bias::kNone;
  rest.ldr = g.ow;
  const bool has_rest = ep.residual || ep.act != Activation::kNone;
  parallel_for(0, g.n * g.m, 1, [&](int64_t t0, int64_t t1) {
    float* padded = workspace(p.rows * p.row_len);
    int64_t padded_plane = -1;  // which input plane `padded` holds
    EpilogueOperand operands[kTileMaxRegs];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / g.m, m = t % g.m, plane = n * g.c + m / mult;
      if (plane != padded_plane) {
        PTO_ISA_DISPATCH(depthwise_pad, p, x + plane * g.in_plane(), padded);
        padded_plane = plane;
      }
      float* yp = y + t * HW;
      PTO_ISA_DISPATCH(depthwise_plane, p, padded, w + m * K, bias ? bias[m] : 0.0f, yp);
      if (ep.tile) {  // the plane as one row of C: channel m of image n
        apply_epilogue(epilogue_at(rest, n, m, 0, operands), yp, HW, 0, 1, 0, HW);
      } else if (has_rest) {
        Epilogue e = rest;
        if (ep.residual) e.residual = ep.residual + t * HW;
        apply_epilogue(e, yp, g.ow, 0, g.oh, 0, g.ow);
      }
    }
  });
}

// ---- small-output path ----

// Above this many multiply-adds a small conv is split over the pool by output channels: below,
// the hand-off costs more than a second thread saves (DISABLED_Crossover on 2 threads, loaded
// 2-core machine: 128 -> 128 channels at 3-4 positions, 150-200K multiply-adds, 4.5 us on one
// thread, 5.2-5.6 us split in two).
constexpr int64_t kSmallConvParallelMacs = int64_t{1} << 20;

// The input as the small-output kernel reads it: each channel plane padded so that every tap of
// every position reads inside it (rows x cols, zeros around the input), or X itself when no read
// leaves the input (no padding: Silero VAD's STFT).
struct SmallInput {
  int64_t rows = 0, cols = 0;  // of a padded plane
  bool copy = false;
};

SmallInput small_input_of(const ConvGeometry& g) {
  SmallInput s;
  s.rows = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  s.cols = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  s.copy = g.ph > 0 || g.pw > 0 || s.rows > g.ih || s.cols > g.iw;
  if (!s.copy) {
    s.rows = g.ih;
    s.cols = g.iw;
  }
  return s;
}

}  // namespace

// PTO_DEPTHWISE_FLAT=0 keeps every depthwise conv on the padded-plane kernel (A/B and tests);
// unset or 1, the flat kernel takes the convs it applies to. Anything else is an error.
bool depthwise_flat_enabled() {
  return env_switch("PTO_DEPTHWISE_FLAT");
}

// The flat kernel (DepthwiseFlat) applies when every input column a tap reads has an output
// column in the same row of the flattened plane: ceil(iw / sw) <= ow (the "same" pads of any
// stride; not a conv whose pads are smaller than that, which ignores input columns), on output
// planes up to kFlatMaxPlane positions: its mask table (4 bytes a tap per vector, kept per
// geometry) stays under 0.5 MB, and larger planes gain little from it (rows of 256 and more).
constexpr int64_t kFlatMaxPlane = int64_t{1} << 16;

bool depthwise_flat_applies(const ConvGeometry& g) {
  return ceil_div(g.iw, g.sw) <= g.ow && g.oh * g.ow <= kFlatMaxPlane;
}

// Output rows narrower than these (3-wide kernels, wider ones) leave the rows kernel's vectors
// mostly empty: Conv + Clip alone, 1 thread, minimum of 2000 calls, blocked (the rule before) ->
// rows kernel, us: 576 @6 s2 (3 wide) 11.0 -> 12.4, 5x5 672 @14 s2 (7 wide) 63.5 -> 67.6; but
// 576 @14 s2 (7 wide) 38.5 -> 29.4, 192 @12 s2 (6 wide) 9.7 -> 9.0, 144 @24 s2 23.0 -> 12.9,
// 192 @28 s2 43.2 -> 20.4, 5x5 240 @28 s2 (14 wide) 77 -> 51.
constexpr int64_t kRowsMinWidth3 = 6, kRowsMinWidth = 12;

// Wider rows go in chunks of as many outputs as read one 32-column window ((cw - 1) sw +
// (kw - 1) dw < 32, at most 16; up to 8 chunks), from 28 outputs on: Conv + Clip alone, 1
// thread, minimum of 1000 calls, flat kernel -> chunked rows, us: 96 @112 s2 (56 wide) 216 ->
// 181, 144 @56 s2 80 -> 72.5, 5x5 144 @56 s2 149 -> 138, but 96 @48 s2 (24 wide) 39.5 -> 40.
// (Rows of at most 16 keep the one-window path: through the chunks, whose window starts at
// -pw, 144 @24 s2 took 16.0 us instead of 12.9.)
constexpr int64_t kRowsMinChunked = 28;

int64_t rows_max_width(const ConvGeometry& g) {
  const int64_t span = (g.kw - 1) * g.dw;
  if (span > 31) return 0;
  const int64_t cw = std::min<int64_t>(16, (31 - span) / g.sw + 1);
  return cw < 8 ? 0 : 8 * cw;
}

// PTO_DEPTHWISE_ROWS=0 keeps strided small-row depthwise convs off the rows kernel (A/B and
// tests); unset or 1 lets them take it. Anything else is an error.
bool depthwise_rows_enabled() {
  return env_switch("PTO_DEPTHWISE_ROWS");
}

bool depthwise_rows_applies(const ConvGeometry& g) {
  return depthwise_flat_enabled() && depthwise_flat_applies(g) && depthwise_rows_enabled() &&
         PTO_ISA_DISPATCH(depthwise_flat_lanes) == 16 && g.sw >= 2 &&
         ((g.iw <= 32 && g.ow <= 16 && g.ow >= (g.kw <= 3 ? kRowsMinWidth3 : kRowsMinWidth)) ||
          (g.ow >= kRowsMinChunked && g.ow <= rows_max_width(g)));
}

namespace {

// PTO_DEPTHWISE_GAPPED=0 keeps stride-1 depthwise convs on the masked flat kernel (A/B and
// tests); unset or 1, those the gapped kernel applies to take it. Anything else is an error.
bool depthwise_gapped_enabled() {
  return env_switch("PTO_DEPTHWISE_GAPPED");
}

// The gapped kernel takes the flat path's stride-1, undilated 3x3, 5x5 and 7x7 convs of "same"
// output size on AVX-512 (its only kernel) whose rows fill enough of their 16-column vectors: 7/8
// for 3x3 (rows of 14-16, 28-32, 48, 56, 112, ...), 5/8 and 12 columns for 5x5, whose 25 taps
// amortize more junk lanes. Conv alone, 1 thread, min of 25 calls, flat kernel -> gapped, us: 3x3
// 576 @14 63.7 -> 57.4, 144 @56 193 -> 180, 32 @112 169 -> 157, but 256 @12 19.5 -> 21.3, 128
// @17 20.9 -> 27.8; 5x5 672 @14 171 -> 121 (ORT 129), 240 @28 206 -> 143 (ORT 156), 128 @20 62.7
// -> 54.5, 256 @12 45.0 -> 41.8, but 256 @10 35.0 -> 34.1-35.0 and 256 @8 20.1 -> 29.7. 7x7 takes
// every row width: its 49 masked taps a vector cost the flat kernel more than any junk lanes cost
// here (p50 of 400 calls, us: 96 @56 578 -> 277, 192 @28 299 -> 130, 384 @14 182 -> 70, 768 @7, a
// vector 7/16 full, 101 -> 77, 256 @9 51 -> 30, 32 @112 681 -> 373; ORT 397, 201, 95, 51, 29, 550).
bool gapped_fills_rows(const ConvGeometry& g) {
  const int64_t lanes = ceil_div(g.ow, 16) * 16;
  if (g.kh == 7) return true;
  return g.kh == 3 ? 8 * g.ow >= 7 * lanes : 8 * g.ow >= 5 * lanes && g.ow >= 12;
}

}  // namespace

bool depthwise_gapped_applies(const ConvGeometry& g) {
  return depthwise_flat_enabled() && depthwise_flat_applies(g) &&
         PTO_ISA_DISPATCH(depthwise_flat_lanes) == 16 && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
         g.dw == 1 && g.kh == g.kw && (g.kh == 3 || g.kh == 5 || g.kh == 7) && g.ih == g.oh &&
         g.iw == g.ow && g.pw >= 0 && g.pw < g.kw && g.ph >= 0 && g.ph < g.kh &&
         gapped_fills_rows(g) && depthwise_gapped_enabled();
}

int64_t conv_column_block(const ConvGeometry& g) {
  if (g.depthwise() || use_shifted(g) || use_stem(g)) return 0;
  return column_block(g, g.cg() * g.kh * g.kw);
}

ConvGeometry conv_geometry(const Attributes& attrs, const Dims& x, const Dims& w,
                           const std::string& where) {
  if ((x.size() != 3 && x.size() != 4) || w.size() != x.size())
    throw ValueError(cat(where, ": X ", dims_str(x), " and W ", dims_str(w),
                         " must both be [N, C, W] or [N, C, H, W]"));
  ConvGeometry g;
  g.n = x[0];
  g.c = x[1];
  g.m = w[0];
  g.group = attrs.get_int("group", 1);
  if (g.group < 1 || g.group > std::max<int64_t>(g.c, 1) || g.c % g.group != 0)
    throw ValueError(
        cat(where, ": group ", g.group, " must be >= 1 and divide the ", g.c, " input channels"));
  if (w[1] * g.group != g.c || g.m % g.group != 0)
    throw ValueError(cat(where, ": W ", dims_str(w), " does not match ", g.c, " input channels in ",
                         g.group, " groups"));
  const Dims kernel(w.begin() + 2, w.end());
  if (attrs.has("kernel_shape") && attrs.get_ints("kernel_shape") != kernel)
    throw ValueError(cat(where, ": kernel_shape ", dims_str(attrs.get_ints("kernel_shape")),
                         " does not match W ", dims_str(w)));
  const window::Params p = window::read_params(attrs, kernel, false, where);
  const size_t rank = kernel.size(), wi = rank - 1;  // the width axis; height only when 2-D
  const window::Axis ax = window::forward_axis(p, wi, x[2 + wi], where);
  g.iw = x[2 + wi];
  g.ow = ax.out;
  g.kw = kernel[wi];
  g.sw = p.strides[wi];
  g.dw = p.dilations[wi];
  g.pw = ax.pad_begin;
  if (rank == 2) {
    const window::Axis ay = window::forward_axis(p, 0, x[2], where);
    g.ih = x[2];
    g.oh = ay.out;
    g.kh = kernel[0];
    g.sh = p.strides[0];
    g.dh = p.dilations[0];
    g.ph = ay.pad_begin;
  }
  return g;
}

void conv2d(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* y,
            const Epilogue& ep, const PackedA* packed_w, Precision precision) {
  if (g.n * g.m * g.out_plane() == 0) return;
  if (packed_w) precision = packed_w[0].precision();
  PTO_CHECK(!(g.depthwise() && precision == Precision::kBF16x3))
      << "conv2d: a depthwise conv has no bf16x3 products";
  if (g.depthwise() && precision != Precision::kF32) {
    // Not what the passes mark (memory bound: bf16/f16 products would not make it faster), but
    // the attribute's meaning on rounded copies of X and W.
    std::vector<float> xr(x, x + g.n * g.c * g.in_plane()), wr(w, w + g.m * g.kh * g.kw);
    round_to_precision(precision, xr.data(), static_cast<int64_t>(xr.size()));
    round_to_precision(precision, wr.data(), static_cast<int64_t>(wr.size()));
    conv_depthwise(g, xr.data(), wr.data(), bias, y, ep);
  } else if (g.depthwise()) {
    conv_depthwise(g, x, w, bias, y, ep);
  } else if (use_stem(g) && stem_weights_fit(packed_w, precision)) {
    conv_stem(g, x, bias, y, ep, packed_w);
  } else if (use_stem(g) && !packed_w && precision == Precision::kF32) {
    // Weights given at run time: packed here, for this call (a stem's are a few KB).
    const std::vector<PackedA> packed =
        pack_weights(w, g.m, g.cg(), g.kh, g.kw, g.group, Precision::kF32);
    conv_stem(g, x, bias, y, ep, packed.data());
  } else if (use_shifted(g)) {  // bf16: the GEMM packs the shifted rows into pairs
    conv_shifted(g, x, w, bias, y, ep, packed_w, precision);
  } else {
    conv_gemm(g, x, w, bias, y, ep, packed_w, precision);
  }
}

std::vector<PackedA> pack_weights(const float* w, int64_t m, int64_t cg, int64_t kh, int64_t kw,
                                  int64_t group, Precision precision) {
  std::vector<PackedA> packed;
  if (cg == 1 && group > 1) return packed;  // depthwise
  const int64_t mg = m / group, k = cg * kh * kw;
  for (int64_t gi = 0; gi < group; ++gi)
    packed.push_back(pack_a(mg, k, w + gi * mg * k, k, false, precision));
  return packed;
}

}  // namespace pto::cpu

namespace pto::cpu {

// The share of (output position, tap) pairs that read the input rather than padding: the
// small-output kernel multiplies every tap, the blocked kernel skips the padding ones.
double valid_tap_share(const ConvGeometry& g) {
  // Per tap, the outputs o with 0 <= o * s + t * d - p < in are one range: counted, not walked
  // (a declared size of 2^40 made the walk a hang at compile time).
  auto valid = [](int64_t out, int64_t in, int64_t k, int64_t s, int64_t d, int64_t p) {
    int64_t n = 0;
    for (int64_t t = 0; t < k; ++t) {
      const int64_t off = t * d - p;  // input index o * s + off
      const int64_t lo = off >= 0 ? 0 : (-off + s - 1) / s;
      const int64_t hi = in - 1 - off < 0 ? -1 : std::min(out - 1, (in - 1 - off) / s);
      n += std::max<int64_t>(0, hi - lo + 1);
    }
    return static_cast<double>(n) / static_cast<double>(std::max<int64_t>(1, out * k));
  };
  return valid(g.oh, g.ih, g.kh, g.sh, g.dh, g.ph) * valid(g.ow, g.iw, g.kw, g.sw, g.dw, g.pw);
}

bool small_output_wins(const ConvGeometry& g, bool blocked) {
  if (g.depthwise() || g.n == 0) return false;
  if (g.oh == 1 && g.kh == 1) return g.ow <= kSmallConvRow;
  // Where the blocked kernel applies and most taps read padding (a 3x3 or 1x3 conv on a 1x1 or
  // 2x2 plane: Inception's last blocks at small inputs), it does less than half the work.
  if (blocked && valid_tap_share(g) < 0.4) return false;
  return g.out_plane() <= kSmallConvPlane &&
         (!blocked || g.m * g.cg() * g.kh * g.kw >= kSmallConvBlockedWeights);
}

int64_t small_conv_ldw(int64_t mg) {
  return (mg + 15) / 16 * 16;
}

Tensor pack_small_weights(const float* w, int64_t m, int64_t cg, int64_t kh, int64_t kw,
                          int64_t group) {
  const int64_t mg = m / group, k = cg * kh * kw, ldw = small_conv_ldw(mg);
  Tensor t = Tensor::empty(DType::kF32, {group, k, ldw});
  float* d = t.data<float>();
  std::fill(d, d + group * k * ldw, 0.0f);
  for (int64_t gi = 0; gi < group; ++gi)
    for (int64_t o = 0; o < mg; ++o)
      for (int64_t i = 0; i < k; ++i)
        d[gi * k * ldw + (o / 16 * k + i) * 16 + o % 16] = w[(gi * mg + o) * k + i];
  return t;
}

void unpack_small_weights(const float* packed, int64_t m, int64_t cg, int64_t kh, int64_t kw,
                          int64_t group, float* w) {
  const int64_t mg = m / group, k = cg * kh * kw, ldw = small_conv_ldw(mg);
  for (int64_t gi = 0; gi < group; ++gi)
    for (int64_t o = 0; o < mg; ++o)
      for (int64_t i = 0; i < k; ++i)
        w[(gi * mg + o) * k + i] = packed[gi * k * ldw + (o / 16 * k + i) * 16 + o % 16];
}

void conv_small(const ConvGeometry& g, const float* x, const float* packed, const float* bias,
                float* y, const Epilogue& ep) {
  const int64_t HW = g.out_plane(), K = g.cg() * g.kh * g.kw, Mg = g.mg(), ldw = small_conv_ldw(Mg);
  if (g.n * g.m * HW == 0) return;
  const SmallInput s = small_input_of(g);
  const int64_t plane = s.rows * s.cols, planes = g.n * g.c;
  // The calling thread's scratch, which every task reads: the tap offsets (K), then the padded
  // input when it is copied (and 16 floats that small_pad may write).
  int64_t* koff =
      scratch_as<int64_t>(static_cast<size_t>(K + (s.copy ? (planes * plane + 16 + 1) / 2 : 0) + 1),
                          kShiftedInputScratch);
  {  // (locals: koff may alias g's fields as far as the compiler knows)
    const int64_t cg = g.cg(), kh = g.kh, kw = g.kw, row = g.dh * s.cols, dw = g.dw;
    int64_t* o = koff;
    for (int64_t c = 0; c < cg; ++c)
      for (int64_t ky = 0, base = c * plane; ky < kh; ++ky, base += row)
        for (int64_t kx = 0, off = base; kx < kw; ++kx, off += dw) *o++ = off;
  }
  const float* xs = x;
  if (s.copy) {
    float* padded = reinterpret_cast<float*>(koff + K);
    PTO_ISA_DISPATCH(small_pad, g, s.rows, s.cols, x, planes, g.in_plane(), padded);
    xs = padded;
  }
  // Blocks of positions of equal size, at most kSmallConvMaxPositions each.
  const int64_t chunks = ceil_div(HW, kSmallConvMaxPositions), P = ceil_div(HW, chunks);
  // On several threads, a large enough conv is also cut by output channels (multiples of 16).
  int64_t mblock = small_conv_ldw(Mg);
  const int64_t items = g.n * g.group * chunks, threads = num_threads();
  const bool parallel = threads > 1 && g.n * g.m * K * HW >= kSmallConvParallelMacs;
  if (parallel && items < threads) mblock = small_conv_ldw(ceil_div(Mg, ceil_div(threads, items)));
  const int64_t mblocks = ceil_div(Mg, mblock), tasks = items * mblocks;
  // ReLU and Clip in registers when nothing comes before them; anything else on each block.
  const bool clamp =
      !ep.tile && !ep.residual && (ep.act == Activation::kRelu || ep.act == Activation::kClip);
  const bool rest = ep.tile || ep.residual || (ep.act != Activation::kNone && !clamp);
  auto run = [&](int64_t t0, int64_t t1) {
    EpilogueOperand operands[kTileMaxRegs];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t item = t / mblocks, mb = t % mblocks;
      const int64_t c = item % chunks, gi = item / chunks % g.group, n = item / (chunks * g.group);
      const int64_t j0 = c * P, p = std::min(P, HW - j0);
      int64_t qoff[kSmallConvMaxPositions];
      for (int64_t q = 0; q < p; ++q)
        qoff[q] = (j0 + q) / g.ow * g.sh * s.cols + (j0 + q) % g.ow * g.sw;
      SmallConvBlock b;
      b.x = xs + (n * g.c + gi * g.cg()) * plane;
      b.koff = koff;
      b.qoff = qoff;
      b.k = K;
      b.p = p;
      b.w = packed + gi * K * ldw;
      b.ldw = ldw;
      b.bias = bias ? bias + gi * Mg : nullptr;
      b.m0 = mb * mblock;
      b.m1 = std::min(Mg, b.m0 + mblock);
      const int64_t row0 = n * g.m + gi * Mg;  // the group's channel 0 in y
      b.y = y + row0 * HW + j0;
      b.ldy = HW;
      b.clamp = clamp;
      b.lo = ep.act == Activation::kRelu ? 0.0f : ep.lo;
      b.hi = ep.act == Activation::kRelu ? std::numeric_limits<float>::infinity() : ep.hi;
      PTO_ISA_DISPATCH(conv_small_block, b);
      if (!rest) continue;
      float* yb = b.y + b.m0 * HW;
      const int64_t rows = b.m1 - b.m0;
      if (ep.tile) {
        apply_epilogue(epilogue_at(ep, n, gi * Mg + b.m0, j0, operands), yb, HW, 0, rows, 0, p);
      } else {
        Epilogue e = ep;
        e.bias_kind = Epilogue::Bias::kNone;
        if (e.residual) e.residual = ep.residual + (row0 + b.m0) * HW + j0;
        e.ldr = HW;
        apply_epilogue(e, yb, HW, 0, rows, 0, p);
      }
    }
  };
  if (tasks > 1 && parallel)
    parallel_for(0, tasks, 1, run);
  else
    run(0, tasks);
}

}  // namespace pto::cpu
