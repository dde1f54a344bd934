// The depthwise kernel's vector code, compiled once per ISA (conv_depthwise_{avx512,avx2,
// generic}.cpp). Each output row is computed in chunks of kBlock vectors: the accumulators start
// at the bias and take one fused multiply-add per tap, every tap a contiguous load from the padded,
// phase-split plane (conv_depthwise.h), so there is no edge case besides the row's masked tail.
#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/conv/conv_simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kBlock = 4;  // accumulators per chunk: enough to hide the FMA latency

// KH, KW > 0 fix the kernel size at compile time (weights held in registers); 0 reads it from p.
template <int KH, int KW>
void plane(const DepthwisePlane& p, const float* padded, const float* w, float bias, float* y) {
  constexpr int V = Vec::kLanes;
  const int64_t kh = KH ? KH : p.kh, kw = KW ? KW : p.kw;
  // Where tap kx starts within a padded row: its phase, then its shift inside the phase.
  auto tap_of = [&](int64_t kx) {
    const int64_t off = kx * p.dw;
    return off % p.sw * p.phase_len + off / p.sw;
  };
  int64_t tfix[KW > 0 ? KW : 1];
  if constexpr (KW > 0)
    for (int kx = 0; kx < KW; ++kx) tfix[kx] = tap_of(kx);
  auto tap = [&](int64_t kx) {
    if constexpr (KW > 0)
      return tfix[kx];
    else
      return tap_of(kx);
  };
  Vec wfix[KH * KW > 0 ? KH * KW : 1];
  if constexpr (KH * KW > 0)
    for (int i = 0; i < KH * KW; ++i) wfix[i] = Vec::set1(w[i]);
  auto weight = [&](int64_t i) {
    if constexpr (KH * KW > 0)
      return wfix[i];
    else
      return Vec::set1(w[i]);
  };
  const Vec b = Vec::set1(bias);
  for (int64_t oy = 0; oy < p.oh; ++oy) {
    const float* in = padded + oy * p.sh * p.row_len;
    float* yr = y + oy * p.ow;
    int64_t j = 0;
    for (; j + kBlock * V <= p.ow; j += kBlock * V) {
      Vec acc[kBlock];
      for (int u = 0; u < kBlock; ++u) acc[u] = b;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const float* r = in + ky * p.dh * p.row_len + j;
        for (int64_t kx = 0; kx < kw; ++kx) {
          const float* s = r + tap(kx);
          const Vec wv = weight(ky * kw + kx);
          for (int u = 0; u < kBlock; ++u) acc[u] = fma(wv, Vec::load(s + u * V), acc[u]);
        }
      }
      for (int u = 0; u < kBlock; ++u) acc[u].store(yr + j + u * V);
    }
    for (; j < p.ow; j += V) {
      const int n = static_cast<int>(p.ow - j < V ? p.ow - j : V);
      Vec acc = b;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const float* r = in + ky * p.dh * p.row_len + j;
        for (int64_t kx = 0; kx < kw; ++kx)
          acc = fma(weight(ky * kw + kx), Vec::load(r + tap(kx), n), acc);
      }
      acc.store(yr + j, n);
    }
  }
}

}  // namespace

void depthwise_pad(const DepthwisePlane& p, const float* x, float* padded) {
  // Each phase's span of columns that read the input is the same on every row: found once (two
  // divisions a phase) rather than per row and phase (they were a fifth of a small plane's copy).
  constexpr int64_t kPhases = 8;
  int64_t span[kPhases][2];
  const bool hoisted = p.sw <= kPhases;
  if (hoisted)
    for (int64_t q = 0; q < p.sw; ++q)
      valid_span(0, p.phase_len, p.iw, p.sw, q - p.pw, &span[q][0], &span[q][1]);
  for (int64_t r = 0; r < p.rows; ++r) {
    float* dst = padded + r * p.row_len;
    const int64_t iy = r - p.ph;
    if (iy < 0 || iy >= p.ih) {
      fill_zero(dst, p.row_len);
      continue;
    }
    const float* xr = x + iy * p.iw - p.pw;  // xr[c] is padded column c
    for (int64_t q = 0; q < p.sw; ++q) {
      float* d = dst + q * p.phase_len;
      int64_t lo, hi;
      if (hoisted)
        lo = span[q][0], hi = span[q][1];
      else
        valid_span(0, p.phase_len, p.iw, p.sw, q - p.pw, &lo, &hi);
      fill_zero(d, lo);
      copy_strided(d + lo, xr + q + lo * p.sw, hi - lo, p.sw);
      fill_zero(d + hi, p.phase_len - hi);
    }
  }
}

void depthwise_plane(const DepthwisePlane& p, const float* padded, const float* w, float bias,
                     float* y) {
  if (p.kh == 3 && p.kw == 3)
    plane<3, 3>(p, padded, w, bias, y);
  else if (p.kh == 5 && p.kw == 5)
    plane<5, 5>(p, padded, w, bias, y);
  else
    plane<0, 0>(p, padded, w, bias, y);
}

}  // namespace pto::cpu::PTO_ISA_NS
