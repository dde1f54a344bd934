// The depthwise kernel's vector code, compiled once per ISA (conv_depthwise_{avx512,avx2,
// generic}.cpp). Each output row is computed in chunks of kBlock vectors: the accumulators start
// at the bias and take one fused multiply-add per tap, every tap a contiguous load from the padded,
// phase-split plane (conv_depthwise.h), so there is no edge case besides the row's masked tail.
#include <utility>

#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/conv/conv_simd.h"
#include "backend/cpu/isa/vmath.h"

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

// ---- the flat kernel (DepthwiseFlat) ----

// The lanes of p whose bit is set in `bits`, zeros elsewhere; the others are not read (they may
// lie outside the plane: masked loads do not fault).
inline Vec load_lanes(const float* p, uint32_t bits) {
#if defined(PTO_ISA_AVX512)
  return {_mm512_maskz_loadu_ps(static_cast<__mmask16>(bits), p)};
#elif defined(PTO_ISA_AVX2)
  const __m256i sel = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i m =
      _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), sel), sel);
  return {_mm256_maskload_ps(p, m)};
#else
  return {bits & 1u ? *p : 0.0f};
#endif
}

// What one call of depthwise_flat works on.
struct FlatArgs {
  const DepthwiseFlat* p;
  const int64_t* off;  // p->off, or a copy of it
  int64_t taps, hw;
  const float* src;
  int64_t src_plane;
  const float* w;  // [channels][taps]
  const float* bias;
  float* y;
};

// Vectors [v0, v0 + NB) of G consecutive planes from channel c0: G * NB accumulators, one fused
// multiply-add per tap each. With kMasked, the taps whose bit is clear in `plain` (some lane of
// the block reads padding or past the plane) take their lane masks from the table, the others
// load whole vectors (AVX2; under AVX-512 every tap of a masked block takes its mask). wreg holds
// the taps' weights in registers when G == 1 and K > 0. kMode: 0 every tap loads whole vectors; 1
// masked taps load masked; 2 (AVX-512, vectors inside the source) masked taps load whole vectors
// and mask the multiply-add, which keeps the accumulator's lanes the mask clears (whatever those
// lanes loaded).
template <int K, int G, int NB, int kMode>
inline void flat_block(const FlatArgs& a, int64_t c0, int64_t v0, const Vec* wreg, uint64_t plain) {
  constexpr bool kMasked = kMode != 0;
  constexpr int V = Vec::kLanes;
  const int64_t taps = K > 0 ? K : a.taps;
  Vec acc[G][NB];
  for (int c = 0; c < G; ++c) {
    const Vec b = Vec::set1(a.bias ? a.bias[c0 + c] : 0.0f);
    for (int u = 0; u < NB; ++u) acc[c][u] = b;
  }
  const uint32_t* mask = a.p->mask + v0 * taps;
#if defined(PTO_ISA_AVX512)
  // A whole tap's mask has every lane set: under AVX-512 it takes the masked instructions too,
  // at the same cost, and the loop has no branch. With one, GCC kept the accumulators of blocks
  // of 2 and 4 planes in memory, a store after every multiply-add (flat_quad's 1152 @7 5x5, 1
  // thread: 113 us with the branch, 70-80 without).
  constexpr bool kSplitTaps = false;
#else
  constexpr bool kSplitTaps = true;  // (AVX2's masked load costs a mask made per tap)
#endif
  for (int64_t t = 0; t < taps; ++t) {
    const bool whole = !kMasked || (kSplitTaps && t < 64 && (plain >> t & 1u));
    for (int c = 0; c < G; ++c) {
      const Vec wv = (G == 1 && K > 0) ? wreg[t] : Vec::set1(a.w[(c0 + c) * taps + t]);
      const float* s = a.src + (c0 + c) * a.src_plane + a.off[t] + v0 * V;
      if (whole)
        for (int u = 0; u < NB; ++u) acc[c][u] = fma(wv, Vec::load(s + u * V), acc[c][u]);
      else
        for (int u = 0; u < NB; ++u) {
#if defined(PTO_ISA_AVX512)
          if constexpr (kMode == 2) {
            acc[c][u] = {_mm512_mask3_fmadd_ps(wv.v, Vec::load(s + u * V).v, acc[c][u].v,
                                               static_cast<__mmask16>(mask[u * taps + t]))};
            continue;
          }
#endif
          acc[c][u] = fma(wv, load_lanes(s + u * V, mask[u * taps + t]), acc[c][u]);
        }
    }
  }
  const Vec lo = Vec::set1(a.p->lo), hi = Vec::set1(a.p->hi);
  for (int c = 0; c < G; ++c) {
    float* y = a.y + (c0 + c) * a.hw + v0 * V;
    for (int u = 0; u < NB; ++u) {
      Vec r = acc[c][u];
      if (a.p->clamp) r = min_keep_nan(max_keep_nan(r, lo), hi);
      const int64_t left = a.hw - (v0 + u) * V;
      if (!kMasked || left >= V)
        r.store(y + u * V);
      else
        r.store(y + u * V, static_cast<int>(left));
    }
  }
}

template <int K, int G, int NB>
inline void flat_block_any(const FlatArgs& a, int64_t c0, int64_t v0, const Vec* wreg) {
  uint64_t plain = ~uint64_t{0};
  for (int u = 0; u < NB; ++u) plain &= a.p->full[v0 + u];
  const int64_t taps = K > 0 ? K : a.taps;
  const uint64_t all = taps >= 64 ? ~uint64_t{0} : (uint64_t{1} << taps) - 1;
  if (taps <= 64 && (plain & all) == all) {
    flat_block<K, G, NB, 0>(a, c0, v0, wreg, plain);
    return;
  }
#if defined(PTO_ISA_AVX512)
  if constexpr (G == 1) {  // (on tiny planes, several channels a block, no vector is inside)
    bool inside = true;
    for (int u = 0; u < NB; ++u) inside = inside && a.p->inside[v0 + u];
    if (inside) {
      flat_block<K, G, NB, 2>(a, c0, v0, wreg, plain);
      return;
    }
  }
#endif
  flat_block<K, G, NB, 1>(a, c0, v0, wreg, plain);
}

// Vectors [v0, v0 + n) of G planes from c0, n < 4, as one block.
template <int K, int G>
inline void flat_tail(const FlatArgs& a, int64_t c0, int64_t v0, int64_t n, const Vec* wreg) {
  if (n == 1)
    flat_block_any<K, G, 1>(a, c0, v0, wreg);
  else if (n == 2)
    flat_block_any<K, G, 2>(a, c0, v0, wreg);
  else if (n == 3)
    flat_block_any<K, G, 3>(a, c0, v0, wreg);
}

constexpr int kFlatBlock = 4;  // vectors of one plane per block: enough to hide the FMA latency
// Under AVX-512 (32 registers) larger planes go first in blocks of kFlatWide vectors: 12
// accumulators and 9 weights still fit, and the FMA chains have room around the loads and masks
// (1 thread, Conv 3x3 + Clip alone, min of 1000 calls, 4 -> 12: 144 @56 s1 208 -> 177 us, 192 @28
// s1 74 -> 66, 32 @48 s1 34.4 -> 28.7, 96 @48 s2 42.5 -> 39.8, 96 @112 s2 232 -> 215; 8 and 16
// were slower than 12).
constexpr int kFlatWide = Vec::kLanes == 16 ? 12 : kFlatBlock;

// Vectors [0, end) of one plane (channel c): the weights in registers, blocks of kFlatWide, then
// kFlatBlock vectors, then the tail.
// Not inlined: inside flat_channels its blocks of 12 made GCC stop inlining the tiny planes'
// blocks there (576 @6 12.8 -> 19.7 us).
template <int K>
[[gnu::noinline]] void flat_plane(const FlatArgs& a, int64_t c, int64_t end) {
  Vec wreg[K > 0 ? K : 1];
  if constexpr (K > 0)
    for (int t = 0; t < K; ++t) wreg[t] = Vec::set1(a.w[c * K + t]);
  int64_t v = 0;
  if constexpr (kFlatWide != kFlatBlock)
    for (; v + kFlatWide <= end; v += kFlatWide) flat_block_any<K, 1, kFlatWide>(a, c, v, wreg);
  for (; v + kFlatBlock <= end; v += kFlatBlock) flat_block_any<K, 1, kFlatBlock>(a, c, v, wreg);
  flat_tail<K, 1>(a, c, v, end - v, wreg);
}

// Four planes from c: each one's blocks of kFlatWide alone (12 chains of multiply-adds), then the
// rest of the four together. A plane's blocks of kFlatBlock (4 chains) and its tail (1-3) alone
// would wait on the FMA latency, tap after tap: two planes a block of 4 (8 chains), four a tail
// of 1 or 2, two a tail of 3 (Conv alone, 1 thread, pto bench medians, one plane at a time ->
// this: 1152 @7 3x3 43.0 -> 28.7-32.8 us, 5x5 107 -> 70-80; 672 @14 5x5 and 240 @28 5x5, whose
// tails are a small part, 1-2%).
template <int K>
[[gnu::noinline]] void flat_quad(const FlatArgs& a, int64_t c, int64_t n) {
  const int64_t body = kFlatWide != kFlatBlock ? n / kFlatWide * kFlatWide : 0;
  if (body > 0)
    for (int i = 0; i < 4; ++i) flat_plane<K>(a, c + i, body);
  int64_t v = body;
  for (; v + kFlatBlock <= n; v += kFlatBlock) {
    flat_block_any<K, 2, kFlatBlock>(a, c, v, nullptr);
    flat_block_any<K, 2, kFlatBlock>(a, c + 2, v, nullptr);
  }
  if (n - v == 1) {
    flat_block_any<K, 4, 1>(a, c, v, nullptr);
  } else if (n - v == 2) {
    flat_block_any<K, 4, 2>(a, c, v, nullptr);
  } else if (n - v == 3) {
    flat_block_any<K, 2, 3>(a, c, v, nullptr);
    flat_block_any<K, 2, 3>(a, c + 2, v, nullptr);
  }
}

template <int K>
void flat_channels(const FlatArgs& a, int64_t channels) {
  // Planes of 1-3 vectors (3x3 to 6x6 under AVX-512) would leave each tap's multiply-adds one
  // dependent chain: several planes go through one block instead (their weights broadcast).
  const int64_t n = a.p->vectors;
  int64_t c = 0;
  if constexpr (K > 0) {
    if (n <= 3) {
      constexpr int G = 4;
      const int64_t g = n == 3 ? 2 : G;
      for (; c + g <= channels; c += g) {
        if (n == 3)
          flat_block_any<K, 2, 3>(a, c, 0, nullptr);
        else if (n == 2)
          flat_block_any<K, G, 2>(a, c, 0, nullptr);
        else
          flat_block_any<K, G, 1>(a, c, 0, nullptr);
      }
    } else if (n % kFlatWide != 0 || kFlatWide == kFlatBlock) {
      for (; c + 4 <= channels; c += 4) flat_quad<K>(a, c, n);
    }
  }
  for (; c < channels; ++c) flat_plane<K>(a, c, n);
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

int depthwise_flat_lanes() {
  return Vec::kLanes;
}

void depthwise_flat_split(const DepthwiseFlat& p, const float* x, float* dst) {
#if defined(PTO_ISA_AVX512)
  if (p.sw == 2) {
    // Each input row once: 2V floats at a time (the last masked), their even and odd lanes
    // gathered by one two-source permute each into the row of phase 0 and of phase 1.
    constexpr int V = Vec::kLanes;
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd =
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const int64_t n0 = (p.iw + 1) / 2, n1 = p.iw / 2;
    for (int64_t iy = 0, py = 0, r = 0; iy < p.ih; ++iy) {  // py = iy % sh, r = iy / sh
      float* d0 = dst + (py * 2) * p.phase_stride + r * p.ow;
      float* d1 = d0 + p.phase_stride;
      const float* s = x + iy * p.iw;
      for (int64_t j = 0; j < n0; j += V) {
        const int64_t left = p.iw - 2 * j;  // input floats from 2j on
        const __m512 lo =
            left >= V ? _mm512_loadu_ps(s + 2 * j)
                      : _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << left) - 1), s + 2 * j);
        const int64_t lh = left - V;
        const __m512 hi =
            lh >= V  ? _mm512_loadu_ps(s + 2 * j + V)
            : lh > 0 ? _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << lh) - 1), s + 2 * j + V)
                     : _mm512_setzero_ps();
        // Whole vectors, no masked stores (the 96 @48 stride-2 conv 65.6 -> 60.8 us): past a
        // row's end they write into the next row, written after it, or the vector's room after
        // the phase plane.
        _mm512_storeu_ps(d0 + j, _mm512_permutex2var_ps(lo, even, hi));
        if (j < n1) _mm512_storeu_ps(d1 + j, _mm512_permutex2var_ps(lo, odd, hi));
      }
      if (++py == p.sh) py = 0, ++r;
    }
    return;
  }
#endif
  for (int64_t py = 0; py < p.sh; ++py)
    for (int64_t px = 0; px < p.sw; ++px) {
      float* d = dst + (py * p.sw + px) * p.phase_stride;
      const int64_t rows = (p.ih - py + p.sh - 1) / p.sh, cols = (p.iw - px + p.sw - 1) / p.sw;
      for (int64_t r = 0; r < rows; ++r)
        copy_strided(d + r * p.ow, x + (r * p.sh + py) * p.iw + px, cols, p.sw);
    }
}

#if defined(PTO_ISA_AVX512)
// What depthwise_rows works with: per tap column its permute indices and lane mask.
struct RowsArgs {
  const DepthwiseFlat* p;
  const __m512i* idx;
  const __mmask16* mk;
  __mmask16 lo_mask, hi_mask, out_mask;
  const float* x;
  int64_t x_plane;
  const float* w;
  const float* bias;
  float* y;
};

// G planes from c0 at once: their output rows are G independent chains of multiply-adds (a
// plane of 3 or 6 rows alone is one chain a row, latency-bound).
template <int G>
inline void rows_planes(const RowsArgs& a, int64_t c0) {
  const DepthwiseFlat& p = *a.p;
  const int64_t taps = p.kh * p.kw, hw = p.oh * p.ow;
  const __m512 vlo = _mm512_set1_ps(p.lo), vhi = _mm512_set1_ps(p.hi);
  for (int64_t oy = 0; oy < p.oh; ++oy) {
    __m512 acc[G];
    for (int g = 0; g < G; ++g) acc[g] = _mm512_set1_ps(a.bias ? a.bias[c0 + g] : 0.0f);
    for (int64_t ky = 0; ky < p.kh; ++ky) {
      const int64_t iy = oy * p.sh + ky * p.dh - p.ph;
      if (iy < 0 || iy >= p.ih) continue;
      __m512 lo[G], hi[G];
      for (int g = 0; g < G; ++g) {
        const float* r = a.x + (c0 + g) * a.x_plane + iy * p.iw;
        lo[g] = _mm512_maskz_loadu_ps(a.lo_mask, r);
        hi[g] = _mm512_maskz_loadu_ps(a.hi_mask, r + 16);
      }
      for (int64_t kx = 0; kx < p.kw; ++kx)
        for (int g = 0; g < G; ++g)
          acc[g] = _mm512_fmadd_ps(_mm512_maskz_permutex2var_ps(a.mk[kx], lo[g], a.idx[kx], hi[g]),
                                   _mm512_set1_ps(a.w[(c0 + g) * taps + ky * p.kw + kx]), acc[g]);
    }
    for (int g = 0; g < G; ++g) {
      __m512 r = acc[g];
      if (p.clamp) r = _mm512_min_ps(vhi, _mm512_max_ps(vlo, r));  // a NaN stays
      _mm512_mask_storeu_ps(a.y + (c0 + g) * hw + oy * p.ow, a.out_mask, r);
    }
  }
}
#endif

#if defined(PTO_ISA_AVX512)
// Output rows wider than a vector (conv.h depthwise_rows_applies): each row in chunks of cw
// outputs, chunk j reading the 32 input columns from base[j] (masked to the row, so padding
// reads zero), tap column kx of lane l at column l sw + kx dw of that window.
constexpr int kMaxRowChunks = 8;

struct ChunkArgs {
  const DepthwiseFlat* p;
  const __m512i* idx;  // [kw]
  int64_t chunks, cw;
  const int64_t* base;        // [chunks]
  const __mmask16* lo_mask;   // [chunks]
  const __mmask16* hi_mask;   // [chunks]
  const __mmask16* out_mask;  // [chunks]
  const float* x;
  int64_t x_plane;
  const float* w;
  const float* bias;
  float* y;
};

template <int G>
inline void chunked_planes(const ChunkArgs& a, int64_t c0) {
  const DepthwiseFlat& p = *a.p;
  const int64_t taps = p.kh * p.kw, hw = p.oh * p.ow;
  const __m512 vlo = _mm512_set1_ps(p.lo), vhi = _mm512_set1_ps(p.hi);
  for (int64_t oy = 0; oy < p.oh; ++oy)
    for (int64_t j = 0; j < a.chunks; ++j) {
      __m512 acc[G];
      for (int g = 0; g < G; ++g) acc[g] = _mm512_set1_ps(a.bias ? a.bias[c0 + g] : 0.0f);
      for (int64_t ky = 0; ky < p.kh; ++ky) {
        const int64_t iy = oy * p.sh + ky * p.dh - p.ph;
        if (iy < 0 || iy >= p.ih) continue;
        __m512 lo[G], hi[G];
        for (int g = 0; g < G; ++g) {
          // (masked-off lanes are not read: the window may start before the row)
          const float* r = a.x + (c0 + g) * a.x_plane + iy * p.iw + a.base[j];
          lo[g] = _mm512_maskz_loadu_ps(a.lo_mask[j], r);
          hi[g] = _mm512_maskz_loadu_ps(a.hi_mask[j], r + 16);
        }
        for (int64_t kx = 0; kx < p.kw; ++kx)
          for (int g = 0; g < G; ++g)
            acc[g] = _mm512_fmadd_ps(_mm512_permutex2var_ps(lo[g], a.idx[kx], hi[g]),
                                     _mm512_set1_ps(a.w[(c0 + g) * taps + ky * p.kw + kx]), acc[g]);
      }
      for (int g = 0; g < G; ++g) {
        __m512 r = acc[g];
        if (p.clamp) r = _mm512_min_ps(vhi, _mm512_max_ps(vlo, r));  // a NaN stays
        _mm512_mask_storeu_ps(a.y + (c0 + g) * hw + oy * p.ow + j * a.cw, a.out_mask[j], r);
      }
    }
}

bool depthwise_rows_chunked(const DepthwiseFlat& p, const float* x, int64_t x_plane, const float* w,
                            const float* bias, float* y, int64_t channels) {
  // Chunks of cw outputs whose taps all read a 32-column window: (cw - 1) sw + (kw - 1) dw < 32.
  const int64_t span = (p.kw - 1) * p.dw;
  if (span > 31 || p.kw > 32) return false;
  const int64_t cw = std::min<int64_t>(16, (31 - span) / p.sw + 1);
  const int64_t chunks = (p.ow + cw - 1) / cw;
  if (chunks > kMaxRowChunks) return false;
  __m512i idx[32];
  for (int64_t kx = 0; kx < p.kw; ++kx) {
    alignas(64) int32_t ix[16];
    for (int64_t l = 0; l < 16; ++l)  // lanes past the chunk: any column (not stored)
      ix[l] = static_cast<int32_t>(l < cw ? l * p.sw + kx * p.dw : 0);
    idx[kx] = _mm512_load_si512(ix);
  }
  int64_t base[kMaxRowChunks];
  __mmask16 lo_mask[kMaxRowChunks], hi_mask[kMaxRowChunks], out_mask[kMaxRowChunks];
  for (int64_t j = 0; j < chunks; ++j) {
    base[j] = j * cw * p.sw - p.pw;
    uint32_t lo = 0, hi = 0;
    for (int64_t i = 0; i < 16; ++i) {
      if (base[j] + i >= 0 && base[j] + i < p.iw) lo |= 1u << i;
      if (base[j] + 16 + i >= 0 && base[j] + 16 + i < p.iw) hi |= 1u << i;
    }
    lo_mask[j] = static_cast<__mmask16>(lo);
    hi_mask[j] = static_cast<__mmask16>(hi);
    out_mask[j] = static_cast<__mmask16>((1u << std::min(cw, p.ow - j * cw)) - 1);
  }
  const ChunkArgs a{&p, idx, chunks, cw, base, lo_mask, hi_mask, out_mask, x, x_plane, w, bias, y};
  int64_t c = 0;
  for (; c + 4 <= channels; c += 4) chunked_planes<4>(a, c);
  for (; c < channels; ++c) chunked_planes<1>(a, c);
  return true;
}
#endif

#if defined(PTO_ISA_AVX512)
// ---- the gapped kernel (DepthwiseGapped) ----

// Output rows [y0, y0 + NB) of one plane, columns [16 j, 16 j + 16), from its gapped copy `src`:
// NB chains of multiply-adds, every tap an unmasked load, and each load of an input row used by
// every output row of the block it reaches (up to KH of them): (NB + KH - 1) KW loads for
// NB KH KW multiply-adds, the weights in registers. (One load a multiply-add, each of them
// across two cache lines where the shift kx is not 0, kept the flat kernel at 2.5-2.9 cycles a
// multiply-add; NCHWc loads whole lines.) Up to 5x5 every weight stays in a register (wreg) for
// the plane; a 7x7's 49 do not fit beside 14 accumulators, so each tap column broadcasts its KH
// weights from w as it starts (14 + 7 + the input row: 23 registers). With all 49 held as
// vectors on the stack, GCC interleaved their loads with the FMAs and 96 @56 took 371 us, not 277.

template <int KH, int KW>
constexpr bool kGappedWeightsInRegs = KH* KW <= 25;

template <int KH, int KW, int NB>
inline void gapped_rows(const DepthwiseFlat& p, const DepthwiseGapped& g, const float* src,
                        const __m512* wreg, const float* w, float bias, float* y, int64_t y0,
                        int64_t j) {
  __m512 acc[NB];
#pragma GCC unroll 16
  for (int u = 0; u < NB; ++u) acc[u] = _mm512_set1_ps(bias);
  const float* base = src + y0 * g.stride + j * 16;
#pragma GCC unroll 8
  for (int kx = 0; kx < KW; ++kx) {
    __m512 wc[KH];
#pragma GCC unroll 8
    for (int ky = 0; ky < KH; ++ky)
      wc[ky] = kGappedWeightsInRegs<KH, KW> ? wreg[ky * KW + kx] : _mm512_set1_ps(w[ky * KW + kx]);
#pragma GCC unroll 20
    for (int i = 0; i < NB + KH - 1; ++i) {
      const __m512 in = _mm512_loadu_ps(base + i * g.stride + kx);
#pragma GCC unroll 8
      for (int ky = 0; ky < KH; ++ky)
        if (i - ky >= 0 && i - ky < NB) acc[i - ky] = _mm512_fmadd_ps(wc[ky], in, acc[i - ky]);
    }
  }
  const __m512 lo = _mm512_set1_ps(p.lo), hi = _mm512_set1_ps(p.hi);
  const int64_t left = p.ow - j * 16;
  const auto mask = static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1);
#pragma GCC unroll 16
  for (int u = 0; u < NB; ++u) {
    __m512 r = acc[u];
    if (p.clamp) r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));  // a NaN stays
    _mm512_mask_storeu_ps(y + (y0 + u) * p.ow + j * 16, mask, r);
  }
}

template <int KH, int KW, int... N>
inline void gapped_rows_of(int64_t nb, const DepthwiseFlat& p, const DepthwiseGapped& g,
                           const float* src, const __m512* wreg, const float* w, float bias,
                           float* y, int64_t y0, int64_t j, std::integer_sequence<int, N...>) {
  (void)((nb == N + 1 ? (gapped_rows<KH, KW, N + 1>(p, g, src, wreg, w, bias, y, y0, j), true)
                      : false) ||
         ...);
}

// One plane: its rows in blocks of at most NBMAX, all of about the same size (14 rows of 6 at
// most as 5 + 5 + 4, not 6 + 6 + 2: a block of 2 would wait on the FMA latency), each block
// across the row's vectors.
template <int KH, int KW, int NBMAX>
[[gnu::noinline]] void gapped_plane(const DepthwiseFlat& p, const DepthwiseGapped& g,
                                    const float* src, const float* w, float bias, float* y) {
  constexpr bool kInRegs = kGappedWeightsInRegs<KH, KW>;
  __m512 wbuf[kInRegs ? KH * KW : 1];
  if constexpr (kInRegs)
    for (int t = 0; t < KH * KW; ++t) wbuf[t] = _mm512_set1_ps(w[t]);
  const __m512* wreg = kInRegs ? wbuf : nullptr;
  const int64_t blocks = (p.oh + NBMAX - 1) / NBMAX, vectors = (p.ow + 15) / 16;
  for (int64_t b = 0, y0 = 0; b < blocks; ++b) {
    const int64_t nb = p.oh / blocks + (b < p.oh % blocks ? 1 : 0);
    for (int64_t j = 0; j < vectors; ++j)
      gapped_rows_of<KH, KW>(nb, p, g, src, wreg, w, bias, y, y0, j,
                             std::make_integer_sequence<int, NBMAX>{});
    y0 += nb;
  }
}
#endif

bool depthwise_gapped(const DepthwiseFlat& p, const DepthwiseGapped& g, const float* x,
                      int64_t x_plane, const float* w, const float* bias, float* y,
                      int64_t channels, float* buf) {
#if defined(PTO_ISA_AVX512)
  const int64_t taps = p.kh * p.kw, hw = p.oh * p.ow;
  for (int64_t c = 0; c < channels; ++c) {
    const float* xc = x + c * x_plane;
    for (int64_t r = 0; r < p.ih; ++r) {
      const float* s = xc + r * p.iw;
      float* d = buf + g.lead + r * g.stride;
      int64_t j = 0;
      for (; j + 16 <= p.iw; j += 16) _mm512_storeu_ps(d + j, _mm512_loadu_ps(s + j));
      if (j < p.iw) {
        const auto m = static_cast<__mmask16>((1u << (p.iw - j)) - 1);
        _mm512_mask_storeu_ps(d + j, m, _mm512_maskz_loadu_ps(m, s + j));
      }
    }
    const float* wc = w + c * taps;
    const float b = bias ? bias[c] : 0.0f;
    if (taps == 9)
      gapped_plane<3, 3, 12>(p, g, buf, wc, b, y + c * hw);
    else if (taps == 25)
      gapped_plane<5, 5, 5>(p, g, buf, wc, b, y + c * hw);
    else
      gapped_plane<7, 7, 14>(p, g, buf, wc, b, y + c * hw);
  }
  return true;
#else
  (void)p, (void)g, (void)x, (void)x_plane, (void)w, (void)bias, (void)y, (void)channels, (void)buf;
  return false;
#endif
}

bool depthwise_rows(const DepthwiseFlat& p, const float* x, int64_t x_plane, const float* w,
                    const float* bias, float* y, int64_t channels) {
#if defined(PTO_ISA_AVX512)
  if (p.iw > 32 || p.ow > 16) return depthwise_rows_chunked(p, x, x_plane, w, bias, y, channels);
  if (p.kw > 32) return false;
  // Tap column kx: lane ox reads input column ox sw + kx dw - pw, one of the row's 32 floats
  // (lo: 0-15, hi: 16-31), or padding (its mask bit clear).
  __m512i idx[32];
  __mmask16 mk[32];
  for (int64_t kx = 0; kx < p.kw; ++kx) {
    alignas(64) int32_t ix[16];
    uint32_t bits = 0;
    for (int64_t ox = 0; ox < 16; ++ox) {
      const int64_t c = ox * p.sw + kx * p.dw - p.pw;
      const bool in = ox < p.ow && c >= 0 && c < p.iw;
      ix[ox] = in ? static_cast<int32_t>(c) : 0;
      if (in) bits |= 1u << ox;
    }
    idx[kx] = _mm512_load_si512(ix);
    mk[kx] = static_cast<__mmask16>(bits);
  }
  const RowsArgs a{&p,
                   idx,
                   mk,
                   static_cast<__mmask16>(p.iw >= 16 ? 0xffffu : (1u << p.iw) - 1),
                   static_cast<__mmask16>(p.iw <= 16 ? 0u : (1u << (p.iw - 16)) - 1),
                   static_cast<__mmask16>((1u << p.ow) - 1),
                   x,
                   x_plane,
                   w,
                   bias,
                   y};
  int64_t c = 0;
  for (; c + 4 <= channels; c += 4) rows_planes<4>(a, c);
  for (; c < channels; ++c) rows_planes<1>(a, c);
  return true;
#else
  (void)p, (void)x, (void)x_plane, (void)w, (void)bias, (void)y, (void)channels;
  return false;
#endif
}

void depthwise_flat(const DepthwiseFlat& p, const float* src, int64_t src_plane, const float* w,
                    const float* bias, float* y, int64_t channels) {
  FlatArgs a{&p, p.off, p.kh * p.kw, p.oh * p.ow, src, src_plane, w, bias, y};
  if (a.taps == 9)
    flat_channels<9>(a, channels);
  else if (a.taps == 25)
    flat_channels<25>(a, channels);
  else
    flat_channels<0>(a, channels);
}

}  // namespace pto::cpu::PTO_ISA_NS
