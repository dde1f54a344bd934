// The blocked direct convolution's vector code, compiled once per ISA (conv_blocked_{avx512,avx2,
// generic}.cpp). One call computes one output row of one output channel block: the row is cut into
// register blocks of R pixels, each holding R x (block / lanes) accumulators for the whole
// reduction over input channels and taps, so every output is stored once.
//   general    for each input lane i of each tap: load the weight vector w[.., i, 0:block] and
//              broadcast-FMA x[pixel r, lane i] into accumulator r (a weight load serves R FMAs);
//   depthwise  each tap is one vector load of the input pixel (its block channels) times the tap's
//              weight vector: block channels per FMA, no broadcast.
// Pixels whose window crosses the image edge (the first and last few of a row) take a checked
// one-pixel path; the interior has no bounds checks.
#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kLanes = Vec::kLanes;
// Accumulator registers a register block may use: the rest hold a weight and a broadcast input.
constexpr int kAccRegs = kLanes == 16 ? 28 : (kLanes == 8 ? 12 : 16);

template <int B>
struct RowKernel {
  static constexpr int kNV = B / kLanes;  // vectors per channel block
  static constexpr int kRMax = kAccRegs / kNV < 1 ? 1 : (kAccRegs / kNV > 14 ? 14 : kAccRegs / kNV);

  const BlockedConv& g;
  const float* x;     // the image (general) or its channel block (depthwise)
  const float* w;     // the weights of output block ob
  const float* bias;  // B values, or null
  float* y;           // the output row
  int64_t oy;

  // Output pixels [ox0, ox0 + R); with kChecked, taps outside the row are skipped (R == 1).
  template <int R, bool kChecked>
  void general(int64_t ox0) const {
    Vec acc[R][kNV];
    for (int v = 0; v < kNV; ++v) {
      const Vec b = bias ? Vec::load(bias + v * kLanes) : Vec::zero();
      for (int r = 0; r < R; ++r) acc[r][v] = b;
    }
    const int64_t xstep = g.sw * B;
    for (int64_t ib = 0; ib < g.icb; ++ib) {
      const int64_t lanes = g.channels - ib * B < B ? g.channels - ib * B : B;
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
        if (iy < 0 || iy >= g.ih) continue;
        const float* xrow = x + (ib * g.ih + iy) * g.iw * B;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t ix = ox0 * g.sw + kx * g.dw - g.pw;
          if (kChecked && (ix < 0 || ix >= g.iw)) continue;
          const float* xp = xrow + ix * B;
          const float* wp = w + ((ib * g.kh + ky) * g.kw + kx) * B * B;
          for (int64_t i = 0; i < lanes; ++i) {
            Vec wv[kNV];
            for (int v = 0; v < kNV; ++v) wv[v] = Vec::load(wp + i * B + v * kLanes);
            for (int r = 0; r < R; ++r) {
              const Vec xv = Vec::set1(xp[r * xstep + i]);
              for (int v = 0; v < kNV; ++v) acc[r][v] = fma(xv, wv[v], acc[r][v]);
            }
          }
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kNV; ++v) acc[r][v].store(y + (ox0 + r) * B + v * kLanes);
  }

  template <int R, bool kChecked>
  void depthwise(int64_t ox0) const {
    Vec acc[R][kNV];
    for (int v = 0; v < kNV; ++v) {
      const Vec b = bias ? Vec::load(bias + v * kLanes) : Vec::zero();
      for (int r = 0; r < R; ++r) acc[r][v] = b;
    }
    const int64_t xstep = g.sw * B;
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      const int64_t iy = oy * g.sh + ky * g.dh - g.ph;
      if (iy < 0 || iy >= g.ih) continue;
      const float* xrow = x + iy * g.iw * B;
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t ix = ox0 * g.sw + kx * g.dw - g.pw;
        if (kChecked && (ix < 0 || ix >= g.iw)) continue;
        const float* xp = xrow + ix * B;
        const float* wp = w + (ky * g.kw + kx) * B;
        for (int v = 0; v < kNV; ++v) {
          const Vec wv = Vec::load(wp + v * kLanes);
          for (int r = 0; r < R; ++r)
            acc[r][v] = fma(Vec::load(xp + r * xstep + v * kLanes), wv, acc[r][v]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < kNV; ++v) acc[r][v].store(y + (ox0 + r) * B + v * kLanes);
  }

  template <int R, bool kChecked>
  void block(int64_t ox0) const {
    if (g.depthwise)
      depthwise<R, kChecked>(ox0);
    else
      general<R, kChecked>(ox0);
  }

  // The last `r` (< kRMax) interior pixels from ox0, as one register block of r.
  template <int R>
  void tail(int r, int64_t ox0) const {
    if constexpr (R >= 1) {
      if (r == R) return block<R, false>(ox0);
      tail<R - 1>(r, ox0);
    }
  }

  void run() const {
    // Interior pixels [lo, hi): every tap of the window lies inside the row.
    const int64_t lo = (g.pw + g.sw - 1) / g.sw < g.ow ? (g.pw + g.sw - 1) / g.sw : g.ow;
    const int64_t last = g.iw - 1 + g.pw - (g.kw - 1) * g.dw;  // the last interior ox * sw
    int64_t hi = last < 0 ? 0 : last / g.sw + 1;
    hi = hi > g.ow ? g.ow : (hi < lo ? lo : hi);
    for (int64_t ox = 0; ox < lo; ++ox) block<1, true>(ox);
    int64_t ox = lo;
    for (; ox + kRMax <= hi; ox += kRMax) block<kRMax, false>(ox);
    if (ox < hi) tail<kRMax - 1>(static_cast<int>(hi - ox), ox);
    for (ox = hi; ox < g.ow; ++ox) block<1, true>(ox);
  }
};

template <int B>
void row(const BlockedConv& g, const float* x, const float* w, const float* bias, float* y,
         int64_t n, int64_t ob, int64_t oy) {
  const int64_t plane = g.ih * g.iw * B;
  const float* xs = g.depthwise ? x + (n * g.icb + ob) * plane : x + n * g.icb * plane;
  const float* ws = w + ob * (g.depthwise ? 1 : g.icb * B) * g.kh * g.kw * B;
  float* yr = y + ((n * g.ocb + ob) * g.oh + oy) * g.ow * B;
  RowKernel<B>{g, xs, ws, bias ? bias + ob * B : nullptr, yr, oy}.run();
}

}  // namespace

bool conv_blocked_row(const BlockedConv& g, const float* x, const float* w, const float* bias,
                      float* y, int64_t n, int64_t ob, int64_t oy) {
  if (g.block == 8) {
    if constexpr (8 % kLanes == 0) {
      row<8>(g, x, w, bias, y, n, ob, oy);
      return true;
    }
  } else if (g.block == 16) {
    row<16>(g, x, w, bias, y, n, ob, oy);
    return true;
  }
  return false;
}

}  // namespace pto::cpu::PTO_ISA_NS
