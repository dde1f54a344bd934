// What conv.cpp calls in the per-ISA files (conv_depthwise_*.cpp, conv_im2col_*.cpp): plain
// structs and declarations only, so those files include no inline code of ours (isa.h).
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// One 2-D sliding window (a 1-D conv is the case ih = kh = 1).
struct ConvWindow {
  int64_t ih = 1, iw = 1, oh = 1, ow = 1;  // input and output spatial sizes
  int64_t kh = 1, kw = 1;                  // kernel
  int64_t sh = 1, sw = 1, dh = 1, dw = 1;  // strides and dilations
  int64_t ph = 0, pw = 0;                  // leading (top, left) pads; trailing ones are implied
};

// Rows [k0, k1) of col[Cg * kh * kw, j1 - j0] for the input planes x (one per channel of a
// group): row (c, ky, kx) holds, for each position j in [j0, j1) of the flattened output plane,
// the input value that position reads through tap (ky, kx), zero where it reads padding.
PTO_ISA_DECLARE(void im2col(const ConvWindow& g, const float* x, int64_t j0, int64_t j1, int64_t k0,
                            int64_t k1, float* col);)

// The input of a shifted implicit GEMM: each channel padded and split by stride phase into
// sh * sw planes of rpp rows by wp columns, so that tap (ky, kx) reads output position
// (oy, ox) at one fixed offset plus oy * wp + ox, and every row of the GEMM's B is a shifted view
// of this copy (wp - ow junk columns per output row are computed and dropped).
struct ShiftedPlane : ConvWindow {
  int64_t rpp = 0;  // rows per phase plane: oh + (kh - 1) * dh / sh
  int64_t wp = 0;   // columns per phase plane: ow + (kw - 1) * dw / sw
};

// Where tap (ky, kx) reads output position 0 in a channel's sh * sw phase planes: its phase
// plane, then its row and column offset in it (output (oy, ox) is oy wp + ox further on).
inline int64_t shifted_tap_offset(const ShiftedPlane& p, int64_t ky, int64_t kx) {
  const int64_t py = ky * p.dh % p.sh, px = kx * p.dw % p.sw;
  return (py * p.sw + px) * p.rpp * p.wp + ky * p.dh / p.sh * p.wp + kx * p.dw / p.sw;
}

// Copies input plane x into dst as ShiftedPlane describes: phase plane (py, px), at
// dst + (py * sw + px) * rpp * wp, row i column q holds input (i sh + py - ph, q sw + px - pw),
// zero outside the input.
PTO_ISA_DECLARE(void shifted_pad(const ShiftedPlane& p, const float* x, float* dst);)

// One block of the small-output conv (conv.h conv_small): output channels [m0, m1) of p <= 8
// output positions, with output channels along the vector lanes. Input value k of position q is
// x[koff[k] + qoff[q]] (x padded so that every read is inside it); w holds the weights in panels
// of 16 output channels, [ldw / 16][k][16] (ldw a multiple of 16, the padding zero), so weight
// (k, m) is w[(m / 16 * k + k) * 16 + m % 16] and each panel is one sequential stream;
// y[m * ldy + q] = bias[m] (or 0) + sum over k of w(k, m) * x[koff[k] + qoff[q]], then clamped to
// [lo, hi] when `clamp`.
struct SmallConvBlock {
  const float* x = nullptr;
  const int64_t* koff = nullptr;
  const int64_t* qoff = nullptr;
  int64_t k = 0, p = 0;
  const float* w = nullptr;
  int64_t ldw = 0;
  const float* bias = nullptr;  // indexed by m, or null
  int64_t m0 = 0, m1 = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  bool clamp = false;
  float lo = 0.0f, hi = 0.0f;
};
inline constexpr int64_t kSmallConvMaxPositions = 8;

PTO_ISA_DECLARE(void conv_small_block(const SmallConvBlock& b);
                // `planes` input planes (x, in_plane floats apart) each padded into dst
                // [rows, cols] (consecutive): padded row r, column q is input (r - ph, q - pw),
                // zero outside. dst has room for 16 floats more (written, zero).
                void small_pad(const ConvWindow& g, int64_t rows, int64_t cols, const float* x,
                               int64_t planes, int64_t in_plane, float* dst);)

// A depthwise plane as the kernel reads it: the window plus the padded, phase-split input layout.
struct DepthwisePlane : ConvWindow {
  int64_t rows = 0;       // padded input rows read: (oh - 1) * sh + (kh - 1) * dh + 1
  int64_t phase_len = 0;  // elements per stride phase of a padded row
  int64_t row_len = 0;    // sw * phase_len: one padded, phase-split row
};

// Copies input plane x into `padded` as depthwise_plane reads it: padded row r is input row r - ph
// (zeros outside); within it, phase q holds padded columns q, q + sw, ... (padded column c is input
// column c - pw, zero outside).
PTO_ISA_DECLARE(void depthwise_pad(const DepthwisePlane& p, const float* x, float* padded);)

// y[oy, ox] = bias + sum over (ky, kx) of w[ky, kx] * padded row (oy sh + ky dh), column
// (ox sw + kx dw): with the rows split into phases, every tap is a contiguous vector load.
PTO_ISA_DECLARE(void depthwise_plane(const DepthwisePlane& p, const float* padded, const float* w,
                                     float bias, float* y);)

// The depthwise conv on the flattened output plane (conv.cpp conv_depthwise_flat): output
// position f = oy * ow + ox of a plane, in vectors of `lanes` positions that run across rows, tap t
// reading src[f + off[t]] where lane mask bit l of mask[v * taps + t] says position v * lanes + l
// reads the input (zero: padding, or past the plane). src is the input plane itself (stride 1,
// iw == ow) or its split copy (depthwise_flat_split), so no padded plane is made.
struct DepthwiseFlat : ConvWindow {
  int64_t lanes = 0;         // Vec::kLanes of the ISA the tables were made for
  int64_t vectors = 0;       // ceil(oh * ow / lanes)
  int64_t phase_rows = 0;    // rows of each phase plane of the split copy: ceil(ih / sh)
  int64_t phase_stride = 0;  // floats from one phase plane to the next: >= phase_rows * ow + lanes
  const int64_t* off = nullptr;     // [kh * kw]
  const uint32_t* mask = nullptr;   // [vectors][kh * kw]
  const uint64_t* full = nullptr;   // [vectors]: bit t set where tap t < 64 reads all lanes
  const uint8_t* inside = nullptr;  // [vectors]: every tap's whole vector lies in the source
  bool clamp = false;  // y = min(max(y, lo), hi) in registers (ReLU, Clip), a NaN y kept
  float lo = 0.0f, hi = 0.0f;
};

// The gapped copy of a stride-1, undilated 3x3, 5x5 or 7x7 depthwise conv with "same" output size
// (conv.cpp conv_depthwise_flat, AVX-512): each input plane copied into rows `stride` floats
// apart (input row r at lead + r * stride), the stride - iw floats between two rows and the rows
// above and below zero, so that output (oy, ox) reads tap (ky, kx) at (oy + ky) * stride + ox + kx
// with no mask: a gap of max(left pad, right pad) columns is the right pad of one row and the left
// pad of the next. Output rows go in vectors of 16 columns (the last masked).
struct DepthwiseGapped {
  int64_t stride = 0;  // iw + max(left pad, right pad)
  int64_t lead = 0;    // ph * stride + pw
  int64_t len = 0;     // floats of the copy: every tap of every output vector reads inside it
};

PTO_ISA_DECLARE(
    int depthwise_flat_lanes();
    // Input plane x as depthwise_flat reads it when it is not x itself: phase plane (py, px), at
    // dst + (py * sw + px) * phase_stride, row a column b holds input (a sh + py, b sw + px)
    // (columns past the input's, and the room after each plane, hold anything: the masks never
    // read them).
    void depthwise_flat_split(const DepthwiseFlat& p, const float* x, float* dst);
    // `channels` consecutive output planes y (oh * ow floats apart), plane c reading src +
    // c * src_plane with weights w + c * kh * kw and bias bias[c] (bias may be null).
    void depthwise_flat(const DepthwiseFlat& p, const float* src, int64_t src_plane, const float* w,
                        const float* bias, float* y, int64_t channels);
    // The strided rows kernel (conv.cpp depthwise_rows_applies: AVX-512, stride 2 or more, input
    // rows of at most 32 floats, output rows of at most 16): each output row is one vector, tap
    // (ky, kx) one two-source permute of the input row's two vectors (lanes reading padding
    // zeroed by its mask) and one multiply-add: no split copy. Planes as depthwise_flat, read
    // from x + c * x_plane; returns false, having done nothing, where this ISA has no such kernel.
    bool depthwise_rows(const DepthwiseFlat& p, const float* x, int64_t x_plane, const float* w,
                        const float* bias, float* y, int64_t channels);
    // `channels` planes as depthwise_flat, read from x + c * x_plane through the gapped copy
    // `buf` (g.len floats, zero where no input row is copied: the caller zeroes it once, the
    // kernel writes only the input rows); false, having done nothing, where this ISA has no
    // such kernel (only AVX-512 has one).
    bool depthwise_gapped(const DepthwiseFlat& p, const DepthwiseGapped& g, const float* x,
                          int64_t x_plane, const float* w, const float* bias, float* y,
                          int64_t channels, float* buf);)

// A 2-D convolution on channel-blocked tensors (ConvBlocked, src/ir/ops/blocked_layout.cpp): x
// [n, icb, ih, iw, block], y [n, ocb, oh, ow, block], w [ocb, icb, kh, kw, block, block] or, for a
// depthwise conv, [icb, 1, kh, kw, block]. Only the first `channels` input lanes are read.
struct BlockedConv : ConvWindow {
  int64_t n = 0, icb = 0, ocb = 0, block = 0;
  int64_t channels = 0;  // real input channels
  bool depthwise = false;
  // Groups of whole blocks (not depthwise): output block o reads the icb / groups input blocks
  // from (o / (ocb / groups)) * (icb / groups) on.
  int64_t groups = 1;
  // X is [N, C, H, W] with C <= block (icb 1): a first conv reading the network's input as it is.
  bool x_nchw = false;
  // Depthwise only: X holds `ring` rows per block (0: all ih), input row iy at row iy % ring (a
  // ring of rows a fused expansion fills, DwPwConvBlocked); bounds are still checked against ih.
  int64_t ring = 0;
};

// The part of a fused epilogue a blocked conv applies in registers: y = clamp(acc + scale *
// residual) where `residual` is laid out as the output (null: none) and the clamp is to [lo, hi]
// when `clamp` (ReLU: lo 0, hi +inf; Clip). Other epilogues run on each finished row instead.
struct RowEpilogue {
  const float* residual = nullptr;
  float scale = 1.0f;
  bool clamp = false;
  float lo = 0.0f, hi = 0.0f;
};

// Output row oy of image n in output channel blocks [ob, ob + obs): row y + ((n * ocb + o) * oh +
// oy) * ow * block of each block o gets bias (ocb * block values, or zeros when null) plus the
// convolution. Returns false, having written nothing, when this ISA's vectors do not divide
// `block` (the caller then uses generic).
// With `e`, each register block's accumulators get e's scaled residual and clamp before they are
// stored, so the output is written once and the residual is read while the block computes.
PTO_ISA_DECLARE(bool conv_blocked_row(const BlockedConv& g, const float* x, const float* w,
                                      const float* bias, float* y, int64_t n, int64_t ob,
                                      int64_t obs, int64_t oy, const RowEpilogue* e);
                // As conv_blocked_row, with block ob's output row at `yrow` and the next block's
                // `ystride` floats on (a row buffer instead of the output tensor); e->residual,
                // if any, points at block ob's residual row, laid out as `yrow`.
                bool conv_blocked_row_at(const BlockedConv& g, const float* x, const float* w,
                                         const float* bias, float* yrow, int64_t ystride, int64_t n,
                                         int64_t ob, int64_t obs, int64_t oy,
                                         const RowEpilogue* e);)

// bf16 products of a blocked conv (ConvBlocked with precision="bf16"): X and W rounded to bf16,
// fp32 accumulation on VDPBF16PS, two input lanes a multiply-add. X is read as "pair words": an
// input pixel holds `words` 32-bit words, word p the bf16 values of its lanes 2p (low half) and
// 2p + 1 (high half), so one broadcast feeds a pair of lanes; a blocked X [n, icb, ih, iw, 16] has
// 8 words a pixel, an NCHW stem's X ([N, C, H, W], C <= 16) is copied as [n, 1, ih, iw,
// ceil(C / 2)]. W is [ocb, icb, kh, kw, words, 16] words: word (p, j) holds the weights of output
// lane j for input lanes 2p and 2p + 1. Lanes past g.channels are zero in both. Block 16 only.
struct PairOperands {
  const uint32_t* x = nullptr;
  const uint32_t* w = nullptr;
  int64_t words = 0;  // words per input pixel (and per weight tap row)
};

// Only the avx512 kernels have these, and they may run only where cpu::has_ext(kAvx512Bf16).
namespace avx512 {
// As conv_blocked_row_at, on pair words: block ob's output row oy of image n at `yrow`, the next
// block's `ystride` floats on, bias and e as there.
void conv_blocked_row_pairs(const BlockedConv& g, const PairOperands& op, const float* bias,
                            float* yrow, int64_t ystride, int64_t n, int64_t ob, int64_t obs,
                            int64_t oy, const RowEpilogue* e);
// `pixels` blocked pixels of 16 floats (lanes [lanes, 16) read as zero) as 8 pair words each.
void blocked_to_pairs(const float* x, int64_t pixels, int64_t lanes, uint32_t* dst);
// `c` <= 16 planes of `hw` floats (plane_stride apart) as hw pixels of ceil(c / 2) words.
void planes_to_pairs(const float* x, int64_t c, int64_t hw, int64_t plane_stride, uint32_t* dst);
}  // namespace avx512

// Winograd F(4x4, 3x3) transforms of a BlockedConv (winograd.h). Tiles of 4x4 output pixels are
// numbered over (image, tile row, tile column); tile t0 + r is row r of each of the 36 matrices
// V[xi] = v + xi * vstride (ldv floats a row): the input transform B^T d B of its 6x6 patch
// (zeros outside the image), c lanes at a time. Returns false, having done nothing, when this
// ISA's vectors do not divide g.block.
PTO_ISA_DECLARE(bool winograd_input(const BlockedConv& g, const float* x, int64_t t0, int64_t t1,
                                    float* v, int64_t ldv, int64_t vstride);)

// Output tile t from its 36 values m + xi * mstride (output block ob's lanes at
// m + ob * block): y = A^T M A + bias (ocb * block values, or null) for every output block, only
// the pixels inside the image stored. Returns false as winograd_input does.
PTO_ISA_DECLARE(bool winograd_output(const BlockedConv& g, const float* m, int64_t mstride,
                                     int64_t t, const float* bias, float* y);)

// ConvTranspose's data movement (conv_transpose_impl.h). Output row dst[x * s + b] = src[b][x] +
// bias for x * s + b < n: s rows interleaved (the sub-pixel form's phases, or the kernel == stride
// col2im's taps).
PTO_ISA_DECLARE(void interleave_phases(const float* const* src, int64_t s, int64_t n, float bias,
                                       float* dst);
                // The col2im of one col row: y[i * s] += col[i] for i in [lo, hi), or, with
                // `store` (each output written once), y[i * s] = col[i] + bias.
                void col2im_row(const float* col, float* y, int64_t lo, int64_t hi, int64_t s,
                                bool store, float bias);)

}  // namespace pto::cpu
