// The blocked direct convolution's vector code, compiled once per ISA (conv_blocked_{avx512,avx2,
// generic}.cpp). One call computes one output row of a few output channel blocks: the row is cut
// into register blocks of R pixels x OB output blocks (up to four for a general conv, so that a
// weight load and a broadcast each feed several FMAs and the loop is FMA-bound, not load-bound),
// each holding its accumulators for the whole reduction over input channels and taps.
//   general    for each input lane i of each tap: load the weight vector w[.., i, 0:block] and
//              broadcast-FMA x[pixel r, lane i] into accumulator r (a weight load serves R FMAs);
//   pointwise  the same for a 1x1 conv's interior, its reduction a plain run of input lanes;
//   depthwise  each tap is one vector load of the input pixel (its block channels) times the tap's
//              weight vector: block channels per FMA, no broadcast.
// Register blocks whose windows cross the row's ends read zeros there (general and the bf16
// pairs: general_padded, PairKernel::block<.., kPadded>); the depthwise kernel and the NCHW stem
// take a checked one-pixel path for those pixels. The interior has no bounds checks.
#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/isa/simd.h"
#include "backend/cpu/isa/vmath.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kLanes = Vec::kLanes;
// Accumulator registers a register block may use: the rest hold a weight and a broadcast input.
// (AVX-512: 4 blocks x 7 pixels, one accumulator spilled, is 4-5% faster on ResNet-50 and
// MobileNetV2 than 4 x 6 without a spill, and 1.5-2% faster than 4 x 8; measured interleaved.)
// Input block planes ahead whose pixels a register block fetches (general convs).
constexpr int64_t kAheadPlanes = 2;
constexpr int kAccRegs = kLanes == 16 ? 28 : (kLanes == 8 ? 12 : 16);
// The bias of a register block without one: up to four output blocks of 16 channels.
constexpr int kMaxOutputLanes = 4 * 16;
alignas(64) constexpr float kZeroBias[kMaxOutputLanes] = {};

// The interior of an output row: pixels [lo, hi) whose every tap lies inside the input row.
struct Interior {
  int64_t lo, hi;
};
inline Interior interior_of(const BlockedConv& g) {
  const int64_t lo = (g.pw + g.sw - 1) / g.sw < g.ow ? (g.pw + g.sw - 1) / g.sw : g.ow;
  const int64_t last = g.iw - 1 + g.pw - (g.kw - 1) * g.dw;  // the last interior ox * sw
  int64_t hi = last < 0 ? 0 : last / g.sw + 1;
  hi = hi > g.ow ? g.ow : (hi < lo ? lo : hi);
  return {lo, hi};
}

// A padded register block's inputs for tap kx: src[r] is pixel ox0 + r's input in row xrow
// (`pix` elements a pixel), or `zeros` where that pixel's tap reads the padding.
template <class T, int R>
[[gnu::always_inline]] inline void tap_sources(const BlockedConv& g, const T* xrow, int64_t pix,
                                               int64_t ox0, int64_t kx, const T* zeros,
                                               const T* (&src)[R]) {
  for (int r = 0; r < R; ++r) {
    const int64_t ix = (ox0 + r) * g.sw + kx * g.dw - g.pw;
    src[r] = ix < 0 || ix >= g.iw ? zeros : xrow + ix * pix;
  }
}

// kNchw: X is [N, C, H, W] with C <= B (a stem reading the network's input directly, no reorder):
// lane i of a pixel is at channel plane i, pixels are adjacent.
template <int B, int OB, bool kNchw = false>
struct RowKernel {
  static constexpr int kPix = kNchw ? 1 : B;  // floats from one input pixel to the next
  static constexpr int kNV = B / kLanes;      // vectors per channel block
  static constexpr int kAcc = kAccRegs / (kNV * OB);
  static constexpr int kRMax = kAcc < 1 ? 1 : (kAcc > 14 ? 14 : kAcc);
  // A general conv at stride 1 on a blocked X (every 1x1 conv of MobileNetV2 and the project
  // half of DwPwConvBlocked): pixel r of a register block is r * B floats on, a constant, so its
  // broadcasts all address off one register, and a register block may be as wide as the
  // accumulators allow (one output block: 28 pixels, 1 weight load per 28 FMAs, where the
  // general stride kept 14 pixel addresses in registers and spilled them).
  // The same holds at stride 2 (YOLO's and ResNet's downsampling convs, the stems reading NCHW):
  // pixel r is r * 2 * B floats on (2 floats for a stem), as wide a register block as the
  // accumulators allow, where the runtime stride capped it at 14 pixels and spilled addresses.
  static constexpr bool kHasUnit = !kNchw;
  static constexpr int kRUnit = kAcc < 1 ? 1 : (kAcc > 28 ? 28 : kAcc);

  const BlockedConv& g;
  const float* x;     // the image (general) or its channel block (depthwise)
  const float* w;     // the weights of output block ob (OB blocks, wstride apart)
  const float* bias;  // OB * B values, or null
  float* y;           // the output row of block ob (OB blocks, ystride apart)
  int64_t oy, wstride, ystride;
  const RowEpilogue* e;  // applied before the store, or null; e->residual laid out as y

  // Every accumulator of a register block starts at its output block's bias: one unconditional
  // load a vector, zeros where there is no bias. (`bias ? load : zero` per vector made GCC build
  // the accumulators on the stack in both branches, load them into registers for the reduction
  // and store them back after it: 16 -> 96 channels at 112x112, a 1x1 conv with 16 input lanes a
  // register block, spent 14% of its time there.)
  template <int R, int NOB>
  [[gnu::always_inline]] void init(Vec (&acc)[R][NOB][kNV]) const {
    static_assert(NOB * B <= kMaxOutputLanes);
    const float* b = bias ? bias : kZeroBias;
    for (int o = 0; o < NOB; ++o)
      for (int v = 0; v < kNV; ++v) {
        const Vec bv = Vec::load(b + o * B + v * kLanes);
#pragma GCC unroll 32
        for (int r = 0; r < R; ++r) acc[r][o][v] = bv;
      }
  }

  // One input lane into a register block: OB weight vectors from wp (wstride apart) and, for
  // pixel r, the broadcast of xp[r * xstep], R x OB multiply-adds.
  template <int R>
  [[gnu::always_inline]] void fma_lane(Vec (&acc)[R][OB][kNV], const float* wp, const float* xp,
                                       int64_t xstep) const {
    Vec wv[OB][kNV];
    for (int o = 0; o < OB; ++o)
      for (int v = 0; v < kNV; ++v) wv[o][v] = Vec::load(wp + o * wstride + v * kLanes);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const Vec xv = Vec::set1(xp[r * xstep]);
      for (int o = 0; o < OB; ++o)
        for (int v = 0; v < kNV; ++v) acc[r][o][v] = fma(xv, wv[o][v], acc[r][o][v]);
    }
  }

  // fma_lane with pixel r's lane i at src[r][i]: a padded register block's pixels each read
  // their own input pixel or zeros.
  template <int R>
  [[gnu::always_inline]] void fma_lane_from(Vec (&acc)[R][OB][kNV], const float* wp,
                                            const float* const (&src)[R], int64_t i) const {
    Vec wv[OB][kNV];
    for (int o = 0; o < OB; ++o)
      for (int v = 0; v < kNV; ++v) wv[o][v] = Vec::load(wp + o * wstride + v * kLanes);
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r) {
      const Vec xv = Vec::set1(src[r][i]);
      for (int o = 0; o < OB; ++o)
        for (int v = 0; v < kNV; ++v) acc[r][o][v] = fma(xv, wv[o][v], acc[r][o][v]);
    }
  }

  // Stores the accumulators of a register block (pixel r, block o, vector v at output offset
  // o * ystride + (ox0 + r) * B + v * kLanes), adding e's scaled residual and clamping first.
  // e is copied to locals: the stores may alias it as far as the compiler knows.
  template <int R, int NOB>
  [[gnu::always_inline]] void store(const Vec (&acc)[R][NOB][kNV], int64_t ox0) const {
    // Plain loops, no lambda: a lambda GCC does not inline (R = 14) takes acc's address, and
    // then every FMA of the reduction loads and stores its accumulator on the stack (perf:
    // MobileNetV2's depthwise rows and checked edge pixels).
    float* const yb = y;
    const int64_t ys = ystride;
    if (!e) {
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r)
        for (int o = 0; o < NOB; ++o)
          for (int v = 0; v < kNV; ++v)
            acc[r][o][v].store(yb + o * ys + (ox0 + r) * B + v * kLanes);
      return;
    }
    const float* res = e->residual;
    const Vec scale = Vec::set1(e->scale), lo = Vec::set1(e->lo), hi = Vec::set1(e->hi);
    const bool clamp = e->clamp;
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < NOB; ++o)
        for (int v = 0; v < kNV; ++v) {
          const int64_t at = o * ys + (ox0 + r) * B + v * kLanes;
          Vec a = acc[r][o][v];
          if (res) a = fma(scale, Vec::load(res + at), a);
          if (clamp) a = min_keep_nan(max_keep_nan(a, lo), hi);
          a.store(yb + at);
        }
  }

  // Output pixels [ox0, ox0 + R) of OB output blocks; with kChecked, taps outside the row are
  // skipped (R == 1). Per input lane: OB weight loads and R broadcasts feed OB x R FMAs. kS: the
  // stride as a constant (1 or 2), 0: g.sw at run time.
  template <int R, bool kChecked, int kS = 0>
  void general(int64_t ox0) const {
    Vec acc[R][OB][kNV];
    init(acc);
    const int64_t xstep = kS ? kS * kPix : g.sw * kPix;
    const int64_t xlane = kNchw ? g.ih * g.iw : 1;  // floats from one lane to the next
    // Each input block plane contributes a short run of pixels per register block, a stream
    // too short for the hardware prefetcher: fetch the run kAheadPlanes planes on meanwhile
    // (ResNet-50's 1x1 convs on 56x56 and 28x28 planes, whose input comes from L3: 5-17%).
    const int64_t p0 = ox0 * g.sw - g.pw < 0 ? 0 : ox0 * g.sw - g.pw;
    int64_t p1 = (ox0 + R - 1) * g.sw - g.pw + (g.kw - 1) * g.dw + 1;
    p1 = p1 > g.iw ? g.iw : p1;
    for (int64_t ib = 0; ib < g.icb; ++ib) {
      const int64_t lanes = g.channels - ib * B < B ? g.channels - ib * B : B;
      if (!kNchw && ib + kAheadPlanes < g.icb)
        for (int64_t ky = 0; ky < g.kh; ++ky) {
          const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
          if (iy < 0 || iy >= g.ih) continue;
          const float* xrow = x + ((ib + kAheadPlanes) * g.ih + iy) * g.iw * kPix;
          for (int64_t px = p0; px < p1; ++px) __builtin_prefetch(xrow + px * kPix, 0, 3);
        }
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
        if (iy < 0 || iy >= g.ih) continue;
        const float* xrow = x + (ib * g.ih + iy) * g.iw * kPix;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t ix = ox0 * g.sw + kx * g.dw - g.pw;
          if (kChecked && (ix < 0 || ix >= g.iw)) continue;
          const float* xp = xrow + ix * kPix;
          const float* wp = w + ((ib * g.kh + ky) * g.kw + kx) * B * B;
          auto lane = [&](int64_t i) { fma_lane(acc, wp + i * B, xp + i * xlane, xstep); };
          if (lanes == B)
            for (int i = 0; i < B; ++i) lane(i);  // a loop still: unrolled, it ran slower
          else
            for (int64_t i = 0; i < lanes; ++i) lane(i);
        }
      }
    }
    store<R, OB>(acc, ox0);
  }

  // Output pixels [ox0, ox0 + R) of a general conv on a blocked X, of which some read past the
  // row's ends: a tap outside the row reads zeros (kZeroBias), whose products leave the sums as
  // the checked path's skipping leaves them, so the R pixels share each weight load where the
  // checked path loads every weight once a pixel.
  template <int R>
  void general_padded(int64_t ox0) const {
    Vec acc[R][OB][kNV];
    init(acc);
    const float* src[R];
    for (int64_t ib = 0; ib < g.icb; ++ib) {
      const int64_t lanes = g.channels - ib * B < B ? g.channels - ib * B : B;
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
        if (iy < 0 || iy >= g.ih) continue;
        const float* xrow = x + (ib * g.ih + iy) * g.iw * B;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          tap_sources(g, xrow, B, ox0, kx, kZeroBias, src);
          const float* wp = w + ((ib * g.kh + ky) * g.kw + kx) * B * B;
          for (int64_t i = 0; i < lanes; ++i) fma_lane_from(acc, wp + i * B, src, i);
        }
      }
    }
    store<R, OB>(acc, ox0);
  }

  // A 1x1 conv's interior at constant stride kS on a blocked X: the reduction is one run of
  // input lanes, block plane after block plane, with no tap loops. Apart from general so that the
  // accumulators stay in registers from the bias to the store: general's tap loops and its two
  // lane loops (whole and partial blocks) make GCC keep them in memory across loop boundaries, a
  // store and a load of every accumulator before and after the reduction, which for a 1x1 conv
  // costs as much as a few input blocks of FMAs. With init() (above), 1 thread, Zen 4, against
  // ONNX Runtime's NCHWc node in the same process: 96 -> 384 at 14x14 143 -> 131 us (ORT 128),
  // 48 -> 144 at 56x56 463 -> 393 (381), 16 -> 96 at 112x112 520 -> 373 (354). A row's interior
  // is one call over its register blocks (1-2% on the last two).
  // No prefetch of the output lines (for writing) or of the residual at a block's start: measured
  // 3-6% slower on those shapes, and no gain on ResNet-18's 3x3 convs.
  // Whether this row takes pointwise: a 1x1 conv whose input row oy * sh - ph exists.
  bool pointwise_row() const {
    const int64_t iy = oy * g.sh - g.ph;
    return g.kh == 1 && g.kw == 1 && iy >= 0 && iy < g.ih;
  }

  template <int R, int kS>
  void pointwise(int64_t ox0, int64_t blocks) const {
    const int64_t plane = g.ih * g.iw * B;
    const int64_t whole = g.channels / B;  // input blocks of B real lanes
    const int rest = static_cast<int>(g.channels - whole * B);
    const bool ahead = kAheadPlanes < g.icb;
    const float* xb = x + ((oy * g.sh - g.ph) * g.iw + ox0 * kS - g.pw) * B;
    for (int64_t blk = 0; blk < blocks; ++blk, ox0 += R, xb += R * kS * B) {
      Vec acc[R][OB][kNV];
      init(acc);
      const float* xp = xb;
      const float* wp = w;
      auto lane = [&](int i) { fma_lane(acc, wp + i * B, xp + i, kS * B); };
      for (int64_t ib = 0; ib < whole; ++ib, xp += plane, wp += B * B) {
        // The run of R pixels kAheadPlanes planes on (see general).
        if (ahead && ib + kAheadPlanes < g.icb)
          for (int r = 0; r < R * kS; ++r)
            __builtin_prefetch(xp + kAheadPlanes * plane + r * B, 0, 3);
        for (int i = 0; i < B; ++i) lane(i);
      }
      for (int i = 0; i < rest; ++i) lane(i);
      store<R, OB>(acc, ox0);
    }
  }

  // A stem's interior: an NCHW image of kC channels (3: RGB) under a kKW-wide window, at constant
  // stride kS. The kx and lane loops are unrolled (kC x kKW = 9 lanes a kernel row); in general
  // each tap ran a 3-trip lane loop, and the loop overhead was about a fifth of a register block.
  template <int R, int kS, int kC, int kKW>
  void stem(int64_t ox0) const {
    Vec acc[R][OB][kNV];
    init(acc);
    const int64_t plane = g.ih * g.iw;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
      if (iy < 0 || iy >= g.ih) continue;
      const float* xrow = x + iy * g.iw + ox0 * kS - g.pw;
      const float* wrow = w + ky * kKW * B * B;
#pragma GCC unroll 8
      for (int kx = 0; kx < kKW; ++kx)
#pragma GCC unroll 4
        for (int i = 0; i < kC; ++i)
          fma_lane(acc, wrow + kx * B * B + i * B, xrow + kx * g.dw + i * plane, kS);
    }
    store<R, OB>(acc, ox0);
  }

  template <int R, bool kChecked>
  void depthwise(int64_t ox0) const {
    Vec acc[R][1][kNV];
    init(acc);
    const int64_t xstep = g.sw * B;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
      if (iy < 0 || iy >= g.ih) continue;
      const float* xrow = x + (g.ring ? iy % g.ring : iy) * g.iw * B;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t ix = ox0 * g.sw + kx * g.dw - g.pw;
        if (kChecked && (ix < 0 || ix >= g.iw)) continue;
        const float* xp = xrow + ix * B;
        const float* wp = w + (ky * g.kw + kx) * B;
        for (int v = 0; v < kNV; ++v) {
          const Vec wv = Vec::load(wp + v * kLanes);
#pragma GCC unroll 32
          for (int r = 0; r < R; ++r)
            acc[r][0][v] = fma(Vec::load(xp + r * xstep + v * kLanes), wv, acc[r][0][v]);
        }
      }
    }
    store<R, 1>(acc, ox0);
  }

  // The interior of a depthwise row with a KW-wide window (3 or 5, or 7 at stride 1; dilation 1)
  // and stride SW:
  // each input pixel is loaded once per kernel row and feeds every output of the block whose
  // window holds it (KW FMAs a load at stride 1, where the general loop loads once per FMA, and
  // the row's KW weights once). The FMAs reach each accumulator in the same (ky, kx) order, so
  // the result is the general loop's bit for bit.
  template <int R, int SW, int KW>
  void depthwise_window(int64_t ox0) const {
    Vec acc[R][1][kNV];
    init(acc);
    constexpr int kJ = (R - 1) * SW + KW;  // input pixels a kernel row reads
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
      if (iy < 0 || iy >= g.ih) continue;
      const float* xp = x + ((g.ring ? iy % g.ring : iy) * g.iw + ox0 * SW - g.pw) * B;
      Vec wv[KW][kNV];
      for (int kx = 0; kx < KW; ++kx)
        for (int v = 0; v < kNV; ++v) wv[kx][v] = Vec::load(w + (ky * KW + kx) * B + v * kLanes);
#pragma GCC unroll 64
      for (int j = 0; j < kJ; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < kNV; ++v) {
          const Vec xv = Vec::load(xp + j * B + v * kLanes);
#pragma GCC unroll 7
          for (int kx = 0; kx < KW; ++kx) {
            const int d = j - kx;
            if (d >= 0 && d % SW == 0 && d / SW < R)
              acc[d / SW][0][v] = fma(xv, wv[kx][v], acc[d / SW][0][v]);
          }
        }
    }
    store<R, 1>(acc, ox0);
  }

  template <int R, bool kChecked, int kS = 0>
  void block(int64_t ox0) const {
    if constexpr (OB == 1 && !kNchw)
      if (g.depthwise) {
        if constexpr (!kChecked) {
          if (g.kw == 3 && g.dw == 1 && (g.sw == 1 || g.sw == 2))
            return g.sw == 1 ? depthwise_window<R, 1, 3>(ox0) : depthwise_window<R, 2, 3>(ox0);
          if (g.kw == 5 && g.dw == 1 && (g.sw == 1 || g.sw == 2))
            return g.sw == 1 ? depthwise_window<R, 1, 5>(ox0) : depthwise_window<R, 2, 5>(ox0);
          if (g.kw == 7 && g.dw == 1 && g.sw == 1) return depthwise_window<R, 1, 7>(ox0);
        }
        return depthwise<R, kChecked>(ox0);
      }
    if constexpr (!kChecked && kS != 0 && kNchw)
      if (g.channels == 3 && g.kw == 3) return stem<R, kS, 3, 3>(ox0);
    if constexpr (!kChecked && kS != 0 && !kNchw)
      if (pointwise_row()) return pointwise<R, kS>(ox0, 1);
    general<R, kChecked, kS>(ox0);
  }

  // The last `r` (<= R) interior pixels from ox0, as one register block of r (kPadded:
  // general_padded's).
  template <int R, int kS = 0, bool kPadded = false>
  void tail(int r, int64_t ox0) const {
    if constexpr (R >= 1) {
      if (r == R) {
        if constexpr (kPadded)
          return general_padded<R>(ox0);
        else
          return block<R, false, kS>(ox0);
      }
      tail<R - 1, kS, kPadded>(r, ox0);
    }
  }

  // A general conv's row on a blocked X whose ends are padded, in register blocks of kR pixels
  // (the last one shorter), those reaching into the padding general_padded. A 7x7 plane's row
  // (3x3, pad 1) is one pass over the weights instead of three (an edge pixel, 5 pixels, an edge
  // pixel), a 14x14 one two instead of four.
  template <int kS>
  void padded_row(int64_t lo, int64_t hi) const {
    constexpr int kR = kS ? kRUnit : kRMax;
    for (int64_t ox = 0; ox < g.ow; ox += kR) {
      const int r = static_cast<int>(g.ow - ox < kR ? g.ow - ox : kR);
      if (ox < lo || ox + r > hi)
        tail<kR, kS, true>(r, ox);
      else
        tail<kR, kS>(r, ox);
    }
  }

  // The interior [ox, hi) in register blocks of kRUnit pixels at constant stride kS, then the
  // checked pixels past it.
  template <int kS>
  void interior(int64_t ox, int64_t hi) const {
    if constexpr (!kNchw)
      if (pointwise_row()) {
        const int64_t blocks = (hi - ox) / kRUnit;
        pointwise<kRUnit, kS>(ox, blocks);
        ox += blocks * kRUnit;
      }
    for (; ox + kRUnit <= hi; ox += kRUnit) block<kRUnit, false, kS>(ox);
    if (ox < hi) tail<kRUnit - 1, kS>(static_cast<int>(hi - ox), ox);
    for (ox = hi; ox < g.ow; ++ox) block<1, true>(ox);
  }

  void run() const {
    const auto [lo, hi] = interior_of(g);
    if constexpr (!kNchw)
      if (!g.depthwise && (lo > 0 || hi < g.ow)) {
        if (g.sw == 1) return padded_row<1>(lo, hi);
        if (g.sw == 2) return padded_row<2>(lo, hi);
        return padded_row<0>(lo, hi);
      }
    for (int64_t ox = 0; ox < lo; ++ox) block<1, true>(ox);
    int64_t ox = lo;
    if constexpr (kHasUnit)
      if (g.sw == 1 && !g.depthwise) return interior<1>(ox, hi);
    if (g.sw == 2 && !g.depthwise) return interior<2>(ox, hi);
    for (; ox + kRMax <= hi; ox += kRMax) block<kRMax, false>(ox);
    if (ox < hi) tail<kRMax - 1>(static_cast<int>(hi - ox), ox);
    for (ox = hi; ox < g.ow; ++ox) block<1, true>(ox);
  }
};

// Blocks [ob, ob + obs) of row oy of image n: four at a time where a general conv has four (then
// two, then one). Four blocks x 7 pixels (AVX-512) read 4 weight vectors and 7 broadcasts per 28
// FMAs, and each input row once per four blocks: 2-7% faster than two blocks x 14 pixels on
// ResNet-18/50 and MobileNetV2 (measured in one process, interleaved).
// A grouped conv runs each group as a group-1 conv on its own input blocks (`gg`: icb and
// channels of one group), with register blocks that never cross a group's last output block.
template <int B, bool kNchw>
void row(const BlockedConv& g, const float* x, const float* w, const float* bias, float* yrow,
         int64_t ystride, int64_t n, int64_t ob, int64_t obs, int64_t oy, const RowEpilogue* e) {
  // One image's block (NCHW: all of it; a ring: its rows).
  const int64_t plane = (g.ring ? g.ring : g.ih) * g.iw * (kNchw ? g.channels : B);
  BlockedConv gg = g;
  gg.icb = g.icb / g.groups;
  if (g.groups > 1) gg.channels = gg.icb * B;
  const int64_t ocb_g = g.ocb / g.groups;
  const int64_t wstride = (g.depthwise ? 1 : gg.icb * B) * g.kh * g.kw * B;
  for (int64_t o = ob; o < ob + obs;) {
    const float* xs =
        g.depthwise ? x + (n * g.icb + o) * plane : x + (n * g.icb + o / ocb_g * gg.icb) * plane;
    const float* bs = bias ? bias + o * B : nullptr;
    float* yr = yrow + (o - ob) * ystride;
    RowEpilogue eo = e ? *e : RowEpilogue{};
    if (eo.residual) eo.residual += (o - ob) * ystride;
    const RowEpilogue* ep = e ? &eo : nullptr;
    const int64_t group_end = (o / ocb_g + 1) * ocb_g;
    const int64_t end = g.depthwise || ob + obs < group_end ? ob + obs : group_end;
    if (!g.depthwise && o + 4 <= end) {
      RowKernel<B, 4, kNchw>{gg, xs, w + o * wstride, bs, yr, oy, wstride, ystride, ep}.run();
      o += 4;
    } else if (!g.depthwise && o + 2 <= end) {
      RowKernel<B, 2, kNchw>{gg, xs, w + o * wstride, bs, yr, oy, wstride, ystride, ep}.run();
      o += 2;
    } else {
      RowKernel<B, 1, kNchw>{gg, xs, w + o * wstride, bs, yr, oy, wstride, ystride, ep}.run();
      o += 1;
    }
  }
}

}  // namespace

bool conv_blocked_row_at(const BlockedConv& g, const float* x, const float* w, const float* bias,
                         float* yrow, int64_t ystride, int64_t n, int64_t ob, int64_t obs,
                         int64_t oy, const RowEpilogue* e) {
  if (g.block == 8) {
    if constexpr (8 % kLanes == 0) {
      g.x_nchw ? row<8, true>(g, x, w, bias, yrow, ystride, n, ob, obs, oy, e)
               : row<8, false>(g, x, w, bias, yrow, ystride, n, ob, obs, oy, e);
      return true;
    }
  } else if (g.block == 16) {
    g.x_nchw ? row<16, true>(g, x, w, bias, yrow, ystride, n, ob, obs, oy, e)
             : row<16, false>(g, x, w, bias, yrow, ystride, n, ob, obs, oy, e);
    return true;
  }
  return false;
}

bool conv_blocked_row(const BlockedConv& g, const float* x, const float* w, const float* bias,
                      float* y, int64_t n, int64_t ob, int64_t obs, int64_t oy,
                      const RowEpilogue* e) {
  const int64_t off = ((n * g.ocb + ob) * g.oh + oy) * g.ow * g.block;
  RowEpilogue eo = e ? *e : RowEpilogue{};
  if (eo.residual) eo.residual += off;
  return conv_blocked_row_at(g, x, w, bias, y + off, g.oh * g.ow * g.block, n, ob, obs, oy,
                             e ? &eo : nullptr);
}

#if defined(PTO_ISA_AVX512)
// ---- bf16 pairs (AVX512_BF16, conv_isa.h PairOperands) ----
//
// The general register block of RowKernel with two input lanes a step: per pair word, OB weight
// vectors (16 output lanes x 2 input lanes each) and R broadcast words feed R x OB VDPBF16PS,
// each two multiply-adds a lane, so a reduction takes half the instructions of the fp32 kernel
// and reads half the weight bytes.
#define PTO_BF16 __attribute__((target("avx512bf16")))

namespace {

template <int OB>
struct PairKernel {
  // 28 accumulators as the fp32 kernel (one spilled with four blocks: measured there).
  static constexpr int kR = OB == 4 ? 7 : (OB == 2 ? 14 : 28);

  const BlockedConv& g;  // one group's (icb, channels)
  const uint32_t* x;     // the group's first input block plane of the image
  const uint32_t* w;     // output block ob's weights (OB blocks, wstride words apart)
  const float* bias;     // OB * 16 values, or null
  float* y;              // output block ob's row (OB blocks, ystride floats apart)
  int64_t oy, wstride, ystride, words;
  const RowEpilogue* e;

  template <int R>
  PTO_BF16 [[gnu::always_inline]] inline void init(__m512 (&acc)[R][OB]) const {
    for (int o = 0; o < OB; ++o) {
      const __m512 b = bias ? _mm512_loadu_ps(bias + o * 16) : _mm512_setzero_ps();
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r) acc[r][o] = b;
    }
  }

  template <int R>
  PTO_BF16 [[gnu::always_inline]] inline void store(__m512 (&acc)[R][OB], int64_t ox0) const {
    float* const yb = y;
    const int64_t ys = ystride;
    if (!e) {
#pragma GCC unroll 32
      for (int r = 0; r < R; ++r)
        for (int o = 0; o < OB; ++o) _mm512_storeu_ps(yb + o * ys + (ox0 + r) * 16, acc[r][o]);
      return;
    }
    const float* res = e->residual;
    const __m512 scale = _mm512_set1_ps(e->scale), lo = _mm512_set1_ps(e->lo),
                 hi = _mm512_set1_ps(e->hi);
    const bool clamp = e->clamp;
#pragma GCC unroll 32
    for (int r = 0; r < R; ++r)
      for (int o = 0; o < OB; ++o) {
        const int64_t at = o * ys + (ox0 + r) * 16;
        __m512 a = acc[r][o];
        if (res) a = _mm512_fmadd_ps(scale, _mm512_loadu_ps(res + at), a);
        if (clamp) a = _mm512_min_ps(hi, _mm512_max_ps(lo, a));  // a NaN stays
        _mm512_storeu_ps(yb + at, a);
      }
  }

  // Output pixels [ox0, ox0 + R) at stride kS (0: g.sw at run time), every tap inside the row;
  // or, kPadded, some reading past the row's ends: a pixel's tap outside the row reads a zero
  // word (its products add +0), so the R pixels share each weight load where pixels one by one
  // each loaded all the weights (a 7x7 plane's row, 3x3 and pad 1, was three passes over the
  // weights: an edge pixel, 5 pixels, an edge pixel; now one).
  template <int R, int kS, bool kPadded = false>
  PTO_BF16 void block(int64_t ox0) const {
    static constexpr uint32_t kZeros[16] = {};  // words <= 16
    __m512 acc[R][OB];
    init(acc);
    const int64_t xstep = (kS ? kS : g.sw) * words;
    const uint32_t* src[R];
    for (int64_t ib = 0; ib < g.icb; ++ib) {
      const int64_t left = g.channels - ib * 2 * words;  // real lanes from this block on
      const int64_t pairs = left >= 2 * words ? words : (left + 1) / 2;
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
        if (iy < 0 || iy >= g.ih) continue;
        const uint32_t* xrow = x + (ib * g.ih + iy) * g.iw * words;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          // (kPadded: no pointer to the row's left of its start is formed.)
          const uint32_t* xp = kPadded ? nullptr : xrow + (ox0 * g.sw + kx * g.dw - g.pw) * words;
          if constexpr (kPadded) tap_sources(g, xrow, words, ox0, kx, kZeros, src);
          const uint32_t* wp = w + ((ib * g.kh + ky) * g.kw + kx) * words * 16;
          for (int64_t p = 0; p < pairs; ++p) {
            __m512bh wv[OB];
            for (int o = 0; o < OB; ++o)
              wv[o] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wp + o * wstride + p * 16));
#pragma GCC unroll 32
            for (int r = 0; r < R; ++r) {
              const uint32_t word = kPadded ? src[r][p] : xp[r * xstep + p];
              const __m512bh xv =
                  reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(word)));
              for (int o = 0; o < OB; ++o) acc[r][o] = _mm512_dpbf16_ps(acc[r][o], xv, wv[o]);
            }
          }
        }
      }
    }
    store(acc, ox0);
  }

  // block<r, kS, kPadded> for r in [1, R].
  template <int R, bool kPadded, int kS>
  PTO_BF16 void tail(int r, int64_t ox0) const {
    if constexpr (R >= 1) {
      if (r == R) return block<R, kS, kPadded>(ox0);
      tail<R - 1, kPadded, kS>(r, ox0);
    }
  }

  // The row in blocks of kR pixels (the last one shorter), those touching a padded edge padded.
  template <int kS>
  PTO_BF16 void row(int64_t lo, int64_t hi) const {
    for (int64_t ox = 0; ox < g.ow; ox += kR) {
      const int r = static_cast<int>(g.ow - ox < kR ? g.ow - ox : kR);
      if (ox < lo || ox + r > hi)
        tail<kR, true, kS>(r, ox);
      else
        tail<kR, false, kS>(r, ox);
    }
  }

  PTO_BF16 void run() const {
    const auto [lo, hi] = interior_of(g);
    if (g.sw == 1)
      row<1>(lo, hi);
    else if (g.sw == 2)
      row<2>(lo, hi);
    else
      row<0>(lo, hi);
  }
};

}  // namespace

void conv_blocked_row_pairs(const BlockedConv& g, const PairOperands& op, const float* bias,
                            float* yrow, int64_t ystride, int64_t n, int64_t ob, int64_t obs,
                            int64_t oy, const RowEpilogue* e) {
  // One group's view, as row() (the pair copy of an NCHW stem is one block of `words`).
  const int64_t icb = g.x_nchw ? 1 : g.icb;
  BlockedConv gg = g;
  gg.icb = icb / g.groups;
  if (g.groups > 1) gg.channels = gg.icb * 16;
  const int64_t plane = g.ih * g.iw * op.words;  // words of one input block plane
  const int64_t ocb_g = g.ocb / g.groups;
  const int64_t wstride = gg.icb * g.kh * g.kw * op.words * 16;
  for (int64_t o = ob; o < ob + obs;) {
    const uint32_t* xs = op.x + (n * icb + o / ocb_g * gg.icb) * plane;
    const float* bs = bias ? bias + o * 16 : nullptr;
    float* yr = yrow + (o - ob) * ystride;
    RowEpilogue eo = e ? *e : RowEpilogue{};
    if (eo.residual) eo.residual += (o - ob) * ystride;
    const RowEpilogue* ep = e ? &eo : nullptr;
    const int64_t group_end = (o / ocb_g + 1) * ocb_g;
    const int64_t end = ob + obs < group_end ? ob + obs : group_end;
    const uint32_t* wo = op.w + o * wstride;
    if (o + 4 <= end) {
      PairKernel<4>{gg, xs, wo, bs, yr, oy, wstride, ystride, op.words, ep}.run();
      o += 4;
    } else if (o + 2 <= end) {
      PairKernel<2>{gg, xs, wo, bs, yr, oy, wstride, ystride, op.words, ep}.run();
      o += 2;
    } else {
      PairKernel<1>{gg, xs, wo, bs, yr, oy, wstride, ystride, op.words, ep}.run();
      o += 1;
    }
  }
}

PTO_BF16 void blocked_to_pairs(const float* x, int64_t pixels, int64_t lanes, uint32_t* dst) {
  const __mmask16 m = lanes >= 16 ? __mmask16(0xffff) : __mmask16((1u << lanes) - 1);
  int64_t i = 0;
  for (; i + 2 <= pixels; i += 2) {  // two pixels a conversion
    const __m512 a = _mm512_maskz_loadu_ps(m, x + i * 16),
                 b = _mm512_maskz_loadu_ps(m, x + i * 16 + 16);
    _mm512_storeu_si512(dst + i * 8, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
  }
  if (i < pixels)
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(dst + i * 8),
        reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i * 16))));
}

PTO_BF16 void planes_to_pairs(const float* x, int64_t c, int64_t hw, int64_t plane_stride,
                              uint32_t* dst) {
  const int64_t words = (c + 1) / 2;
  alignas(64) uint32_t t[8][16];
  for (int64_t q0 = 0; q0 < hw; q0 += 16) {
    const int64_t n = hw - q0 < 16 ? hw - q0 : 16;
    const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    for (int64_t p = 0; p < words; ++p) {  // 16 pixels' word p: lanes 2p and 2p + 1
      const __m256i lo = reinterpret_cast<__m256i>(
          _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + 2 * p * plane_stride + q0)));
      const __m256i hi = 2 * p + 1 < c
                             ? reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(
                                   _mm512_maskz_loadu_ps(m, x + (2 * p + 1) * plane_stride + q0)))
                             : _mm256_setzero_si256();
      _mm512_store_si512(t[p], _mm512_or_si512(_mm512_cvtepu16_epi32(lo),
                                               _mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16)));
    }
    for (int64_t q = 0; q < n; ++q)
      for (int64_t p = 0; p < words; ++p) dst[(q0 + q) * words + p] = t[p][q];
  }
}
#undef PTO_BF16
#endif  // PTO_ISA_AVX512

}  // namespace pto::cpu::PTO_ISA_NS
