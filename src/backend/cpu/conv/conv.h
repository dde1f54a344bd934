// CPU convolution (ONNX Conv, float32, NCHW, 1-D and 2-D).
//
// Two paths, chosen per call from the geometry:
//   depthwise  — group == C with one input channel per group: a direct vectorized kernel per
//                output plane (conv_depthwise_impl.h), rows padded and split by stride phase so
//                every tap is a contiguous vector load;
//   general    — implicit GEMM per image and group, C[Mg, Ho*Wo] = W[Mg, Cg*kh*kw] x
//                col[Cg*kh*kw, Ho*Wo], with col built (im2col) in column blocks that fit the cache,
//                and no col at all for a 1x1, stride-1, unpadded conv (the input is the B matrix).
// With bf16 products (precision="bf16", AutoMixedPrecision) a conv that is not depthwise takes
// the implicit GEMM (general or shifted path) on the GEMM's bf16 products (GemmArgs::precision:
// X and W rounded to bf16, fp32 accumulation; VDPBF16PS where the CPU has AVX512_BF16), its
// weights packed once as bf16 pairs, never the fp32 small-plane blocked kernel (at level 3,
// ConvBlocked has bf16 products of its own: conv_blocked.cpp); a depthwise conv stays fp32
// (memory bound: bf16 products would not speed it up). bf16x3 products (precision="bf16x3",
// ConvPrecision: X's and W's heads and tails) take the same implicit GEMM; a depthwise conv has
// no bf16x3 form (conv2d rejects it; the Conv kernel declines it to the reference).
// Bias, residual and activation are applied by the GEMM's epilogue (or, for depthwise, while the
// output plane is still in cache); any other elementwise chain, as a tile program (Epilogue::tile),
// on whole rows of each finished GEMM block, per channel row (shifted) or per plane (depthwise).
// docs/backend/conv.md argues the layout choice.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/env_switch.h"
#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/tile_kernel.h"
#include "pto/graph.h"

namespace pto::cpu {

// One 2-D convolution's sizes; a 1-D conv is the case ih = kh = 1.
struct ConvGeometry : ConvWindow {
  int64_t n = 0, c = 0, m = 0, group = 1;  // batch, input and output channels, groups
  // Output columns per GEMM of the implicit-GEMM path (the "conv.cols" knob); 0: the planner's
  // (conv_column_block).
  int64_t cols = 0;

  int64_t cg() const { return c / group; }  // input channels per group
  int64_t mg() const { return m / group; }  // output channels per group
  int64_t in_plane() const { return ih * iw; }
  int64_t out_plane() const { return oh * ow; }
  bool depthwise() const { return group == c && group > 1 && m % group == 0; }
};

// Reads a Conv node's attributes for X and W of the given shapes (rank 3 or 4), resolving
// auto_pad; throws ValueError naming `where` when they do not fit together.
ConvGeometry conv_geometry(const Attributes& attrs, const Dims& x, const Dims& w,
                           const std::string& where);

// The output columns (positions of one image) each GEMM of the implicit-GEMM path computes: g.cols
// when set (clamped to the plane), else the planner's choice. 0 when the conv does not run on that
// path (depthwise, or the shifted path of a stride-1 conv with few junk columns).
int64_t conv_column_block(const ConvGeometry& g);

// Whether the depthwise conv g runs on the flat kernel (conv.cpp, conv_depthwise_impl.h: no padded
// plane, vectors across the rows of the flattened output): its pads give every input column an
// output column (ceil(iw / sw) <= ow), and PTO_DEPTHWISE_FLAT is not 0 (then the padded-plane
// kernel runs every depthwise conv, and the blocked kernel its small planes; ValueError for a
// value other than 0 or 1).
bool depthwise_flat_enabled();
bool depthwise_flat_applies(const ConvGeometry& g);
// Whether the flat path of g runs the strided rows kernel instead (conv_isa.h depthwise_rows:
// AVX-512, stride >= 2, input rows of at most 32 floats, output rows of at most 16), and
// PTO_DEPTHWISE_ROWS is not 0 (ValueError for a value other than 0 or 1).
bool depthwise_rows_applies(const ConvGeometry& g);
bool depthwise_rows_enabled();
// Whether the flat path of g copies each plane into rows with zero gaps and runs the gapped
// kernel (conv_isa.h DepthwiseGapped: stride 1, "same" sizes, AVX-512), and PTO_DEPTHWISE_GAPPED
// is not 0 (ValueError for a value other than 0 or 1).
bool depthwise_gapped_applies(const ConvGeometry& g);
// The share of (output position, tap) pairs that read the input rather than padding.
double valid_tap_share(const ConvGeometry& g);

// y = act(conv(x, w) + bias[m] + residual_scale * residual) for NCHW x [n, c, ih, iw], w
// [m, c/group, kh, kw], y and residual [n, m, oh, ow]. `bias` (m values) may be null; of `ep` only
// residual (the start of the residual tensor), residual_scale, act, lo and hi are used, so a fused
// Conv + Add + ReLU passes them here. Parallel over the pool; deterministic per thread count.
// `packed_w`, when set, holds each group's weights as pack_weights packed them (the GEMM path then
// does not read `w`, and computes in the packing's precision). `precision`: the products' (a
// depthwise conv computes on X and W rounded to it, in fp32; not kBF16x3).
void conv2d(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* y,
            const Epilogue& ep = {}, const PackedA* packed_w = nullptr,
            Precision precision = Precision::kF32);

// The weights w [m, cg, kh, kw] of a conv in `group` groups, packed per group as the GEMM's A
// operand [m/group, cg*kh*kw] for products in `precision`; empty for a depthwise conv (which does
// not use a GEMM).
std::vector<PackedA> pack_weights(const float* w, int64_t m, int64_t cg, int64_t kh, int64_t kw,
                                  int64_t group, Precision precision = Precision::kF32);

// ---- bf16 convs on AMX tiles with B read in place (conv_amx_avx512.cpp) ----
// An undilated conv (kernel larger than 1x1) whose products are bf16 or bf16x3, on a CPU with
// AMX-BF16: the input is converted once into padded planes of channel pairs, from which the
// tiles load every tap's B directly (no per-call packing of B), against weights packed with K
// chunk-major (TapsLayout). Either 32+ input channels, strides up to 2 and few junk columns (in
// groups too, not depthwise, where a panel's chunks are at most 8 times its groups' channels),
// or (folded: the kernel's columns, and rows as fit, folded into the channels) one group of
// fewer than 32 channels, at most 64 values c kw per kernel row and strides up to 4: a stem.
// PTO_CONV_TAPS=0 turns it off (the implicit GEMM then runs it).
bool taps_conv_applies(const ConvGeometry& g);
// The weights w [m, c / group, kh, kw] for conv_taps: [m, K] (TapsLayout) packed for the tiles
// for `precision` (kBF16 or kBF16x3: heads and tails); an empty PackedA (m() == 0) where the
// packing is not the AMX one (the tiles turned off).
PackedA pack_taps_weights(const float* w, const ConvGeometry& g, Precision precision);
inline constexpr int64_t kTapsChunk = 32;  // input channels per A chunk (16 pairs: one tile's K)

// How the taps kernel lays out K for a conv of c input channels, m output channels in `group`
// groups and a kh x kw kernel: each panel of 32 output channels reads `panel_chunks` chunks of 32
// input channels from first_chunk(panel) on, every tap of a chunk in turn (so a chunk's B tiles,
// shifted per tap, stay in L1). One group: every chunk; grouped: the chunks that hold the
// panel's groups' channels (the weights zero for the others in them: ResNeXt's 32 groups of 4
// channels make one chunk per panel, a quarter of it its own group's). Folded (one group, fewer
// than 32 channels): the channels are the values (ky % fold, ci, kx) and the taps the groups of
// `fold` kernel rows: as many as fit one chunk of 32 values c kw, at least one.
struct TapsLayout {
  int64_t c = 0, m = 0, group = 1, kh = 1, kw = 1;
  int64_t fold = 0, taps = 0, chunks = 0, panel_chunks = 0;
  int64_t k() const { return panel_chunks * taps * kTapsChunk; }
  int64_t first_chunk(int64_t panel) const;
  // The column of K that weight (o, ci, ky, kx) takes (ci within o's group).
  int64_t column(int64_t o, int64_t ci, int64_t ky, int64_t kx) const;
};
TapsLayout taps_layout(int64_t c, int64_t m, int64_t group, int64_t kh, int64_t kw);
// y = the conv with bf16 (or, weights packed for kBF16x3, bf16x3) products as conv2d computes
// it (the same epilogue), on the tiles.
void conv_taps(const ConvGeometry& g, const float* x, const PackedA& w, const float* bias, float* y,
               const Epilogue& ep = {});

// ---- small-output convs (conv_small) ----
// A conv whose output plane has few positions (Silero VAD's: 1 to 4) is a GEMM with that many
// columns, which the implicit GEMM's micro-tiles (vectors along the positions) mostly waste. The
// small-output kernel puts the output channels along the vector lanes instead: weights packed
// once per group as panels of 16 output channels, [ldw / 16][cg*kh*kw][16] (ldw =
// small_conv_ldw(m/group), zero padded), the input read in place or from a padded copy through
// tap and position offsets (no im2col), and P x NB accumulator vectors for blocks of at most
// kSmallConvMaxPositions positions held over the whole K (conv_small_impl.h). Any plane is
// computed (in blocks of positions), but it pays only on small ones (small_output_wins).
//
// The planner's rule (measured, docs/backend/conv.md): a conv with one output row and a kernel
// one row high (1-D) of at most kSmallConvRow positions, against the implicit GEMM (whose 16
// columns wide panels fill from 16 positions on; at 32 the two are at par); another (2-D) of at
// most kSmallConvPlane positions, but where the blocked direct kernel is the alternative
// (`blocked`: group 1, a channel block of inputs or more), only with at least
// kSmallConvBlockedWeights weights: a 2-D window on a tiny plane reads mostly padding, which the
// blocked kernel skips and this one multiplies (64 -> 64 channels 3x3 on 2x2 and 4x4 planes: 12%
// and 10% slower than blocked; 256 -> 256 on 2x2 to 5x5: 11-34% faster, its weights streamed once).
inline constexpr int64_t kSmallConvRow = 24, kSmallConvPlane = 12,
                         kSmallConvBlockedWeights = int64_t{1} << 16;
// Planes the tuner offers the small-output kernel (conv.algo {3}) on.
inline constexpr int64_t kSmallConvTunePlane = 64;
bool small_output_wins(const ConvGeometry& g, bool blocked);
int64_t small_conv_ldw(int64_t mg);
Tensor pack_small_weights(const float* w, int64_t m, int64_t cg, int64_t kh, int64_t kw,
                          int64_t group);
// The inverse: w [m, cg, kh, kw] from pack_small_weights' layout.
void unpack_small_weights(const float* packed, int64_t m, int64_t cg, int64_t kh, int64_t kw,
                          int64_t group, float* w);
// y = act(conv(x, w) + bias + residual) as conv2d computes it (fp32; not depthwise, which has its
// own kernel), with w packed by pack_small_weights. ReLU and Clip are applied in registers, the
// rest of `ep` (residual, other activations, a tile program) on each finished block.
void conv_small(const ConvGeometry& g, const float* x, const float* packed, const float* bias,
                float* y, const Epilogue& ep);

class KernelRegistry;
struct FusedEpilogue;
struct NodeInfo;

// Whether a Conv or ConvTranspose node has float32 X, W (and B) and X of known rank 3 or 4 (1-D
// or 2-D).
bool accepts_f32_conv(const NodeInfo& info);
// For prepare(): the node's W when it is a constant float32 tensor of rank 3 or 4 whose dim 0 the
// node's group count (set through `group`) divides; nullptr otherwise (run() reports errors).
const Tensor* constant_conv_weight(const NodeInfo& info, int64_t* group);

// The register-level form of a fused epilogue (conv_isa.h's RowEpilogue) when it has one: a
// scaled residual and ReLU or Clip, no bias and no general tile program.
bool row_epilogue(const Epilogue& ep, RowEpilogue* e);

// The residual and activation of a fused group (null: none) as the conv kernels' Epilogue; throws
// KernelDeclined when the residual's shape is not the output's `yshape`. The bias is the caller's.
Epilogue conv_epilogue(const FusedEpilogue* f, const Dims& yshape, const std::string& where);

// How a tile-epilogue operand of shape `t` is read on conv output `y` ([n, m, oh, ow] or
// [n, m, ow]): rows are output channels, columns the flattened output positions, one C per image
// (EpilogueOperand, data left null). Nullopt when t does not broadcast to y, or steps through the
// positions other than all together or not at all ([oh, 1] per output row).
std::optional<EpilogueOperand> conv_operand_strides(const Dims& t, const Dims& y);

// NCHW x [n, c, hw] <-> channel-blocked [n, ceil(c/b), hw, b] (padded lanes zero), in parallel.
void to_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t b);
void from_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t b);

// The blocked direct convolution of `g` (conv_isa.h) into y [n, ocb, oh, ow, block], over the pool:
// bias (ocb * block values, or null) in the accumulators; of `ep`, a residual (laid out as y) and
// ReLU/Clip in registers, other activations per finished row. With `pairs` (not depthwise, block
// 16, cpu::has_ext(kAvx512Bf16)), the products are bf16 ones on pairs->x and pairs->w instead of
// fp32 ones on x and w.
void conv_blocked_rows(const BlockedConv& g, const float* x, const float* w, const float* bias,
                       float* y, const Epilogue& ep, const PairOperands* pairs = nullptr);

// ReorderToBlocked, ReorderFromBlocked and ConvBlocked (conv_blocked.cpp), registered from
// register_conv_kernels.
void register_blocked_conv_kernels(KernelRegistry& r);
// ConvTranspose and Col2Im (conv_transpose.cpp), registered from register_conv_kernels.
void register_conv_transpose_kernels(KernelRegistry& r);
// DeformConv (deform_conv.cpp), registered from register_conv_kernels.
void register_deform_conv_kernel(KernelRegistry& r);

}  // namespace pto::cpu
