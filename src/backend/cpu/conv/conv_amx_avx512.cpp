// bf16 convolutions on AMX tiles with no packing of B (conv_amx.h): the input is converted once
// into padded planes of channel pairs, in which every B tile of every tap is a plain tile load.
//
// The implicit GEMM (conv.cpp) multiplies the weights [M, C kh kw] by a B of C kh kw rows (each
// a shifted view of an input channel) that it packs into bf16 pairs for every call: nine times
// the input's values for a 3x3 conv, written and read back, a third of a bf16 ResNet-50's conv
// time. Here the input is laid out once as the tiles read B:
//
//   planes[p][r][q] = (x[2p][r - ph][q - pw], x[2p + 1][r - ph][q - pw]) as a bf16 pair,
//                     zero outside the input and for channels past C,
//
// rpp = oh + kh - 1 rows of wp = ow + kw - 1 columns each (the shifted path's geometry, stride
// 1). Output position (oy, ox) is column q = oy wp + ox, and tap (ky, kx) reads it at column
// q + ky wp + kx of every plane, so the 16 x 16 B tile of tap (ky, kx), channel pairs
// [16 c, 16 c + 16) and columns [j, j + 16) is 16 rows of 64 bytes, one per plane, a plane apart:
// one TILELOADD. The weights are packed once with K chunk-major (channels padded to a multiple of
// 32; each chunk of 32 holds every tap, conv.h TapsLayout), so step (c, t) of an A panel meets
// exactly that tile. The wp - ow junk columns of each output row are computed and dropped, as the
// shifted path does. Stems (conv_amx.h, folded) and grouped convs lay K out otherwise, the same
// kernel multiplying it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/conv/conv_amx.h"
#include "backend/cpu/isa/amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512bf16")

namespace pto::cpu::avx512 {
namespace {

constexpr int kTile = 16;
constexpr int kBlock = 32;  // rows and columns of the C block the four tiles hold

using amx::configure_tiles;
using amx::memory_fence;

// v, or with `tail` what bf16 rounding leaves of it: v - bf16(v) (exact in fp32).
inline __m512 part(__m512 v, bool tail) {
  if (!tail) return v;
  const auto head = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  // (The maskz forms: GCC 12 warns that the unmasked ones' undefined vectors are uninitialized.)
  const __m512i widened = _mm512_maskz_cvtepu16_epi32(0xffff, head);
  return _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, widened, 16)));
}

// Lanes x[i] and y[i] as the bf16 pair of word 2i and 2i + 1 (with `tail`, of their tails).
inline __m512i pair_words(__m512 x, __m512 y, bool tail) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(
      _mm512_load_si512(kInterleave),
      reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(part(y, tail), part(x, tail))));
}

// The pairs of two rows of n <= 16 floats (zeros where a row is null), interleaved as bf16 words
// (with `tail`, of their tails).
inline __m512i pairs16(const float* r0, const float* r1, int64_t n, bool tail) {
  const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  const __m512 x = r0 ? _mm512_maskz_loadu_ps(m, r0) : _mm512_setzero_ps();
  const __m512 y = r1 ? _mm512_maskz_loadu_ps(m, r1) : _mm512_setzero_ps();
  return pair_words(x, y, tail);
}

// The 16 values row[(q + l) step + off], zero where that column is outside [0, iw) (masked lanes
// are not read) or row is null; lanes with q + l >= n are zero, or with step 2 any value.
inline __m512 strided16(const float* row, int64_t q, int64_t n, int64_t step, int64_t off,
                        int64_t iw) {
  if (!row) return _mm512_setzero_ps();
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i col = _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(q))),
                         _mm512_set1_epi32(static_cast<int>(step))),
      _mm512_set1_epi32(static_cast<int>(off)));
  __mmask16 m = n - q >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - q)) - 1);
  m &= _mm512_cmpge_epi32_mask(col, _mm512_setzero_si512()) &
       _mm512_cmplt_epi32_mask(col, _mm512_set1_epi32(static_cast<int>(iw)));
  if (step == 1) return _mm512_maskz_loadu_ps(m, row + q + off);
  if (step == 2) {  // the even ones of the 32 floats from column 2q + off: two loads, a permute
    const int64_t c0 = 2 * q + off;
    const __m512i lo = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(c0)));
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(16));
    const __m512i limit = _mm512_set1_epi32(static_cast<int>(iw));
    auto valid = [&](__m512i c) {  // even lanes whose column is in [0, iw) (past n: not stored)
      return __mmask16(0x5555) & _mm512_cmpge_epi32_mask(c, _mm512_setzero_si512()) &
             _mm512_cmplt_epi32_mask(c, limit);
    };
    alignas(64) static constexpr int32_t kEven[16] = {0,  2,  4,  6,  8,  10, 12, 14,
                                                      16, 18, 20, 22, 24, 26, 28, 30};
    return _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(valid(lo), row + c0),
                                  _mm512_load_si512(kEven),
                                  _mm512_maskz_loadu_ps(valid(hi), row + c0 + 16));
  }
  return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, col, row, 4);
}

// taps_planes for a folded geometry: pair p holds values 2p and 2p + 1 of (f, ci, kx).
void folded_planes(const TapsGeometry& t, const float* x, int64_t pair0, int64_t pair1, bool tails,
                   uint32_t* planes) {
  const int64_t phase = t.rpp * t.wp, row_values = t.c * t.kw, values = t.fold * row_values;
  for (int64_t p = pair0; p < pair1; ++p) {
    // Value v = (f, ci, kx): channel ci's plane, rows f dh and columns kx dw - pw on.
    const float* plane[2] = {nullptr, nullptr};
    int64_t down[2] = {0, 0}, off[2] = {0, 0};
    for (int h = 0; h < 2; ++h)
      if (const int64_t v = 2 * p + h; v < values) {
        plane[h] = x + v % row_values / t.kw * t.ih * t.iw;
        down[h] = v / row_values * t.dh;
        off[h] = v % t.kw * t.dw - t.pw;
      }
    for (int64_t py = 0; py < t.phases; ++py)
      for (int64_t i = 0; i < t.rpp; ++i) {
        uint32_t* row = planes + p * t.plane + py * phase + i * t.wp;
        const float* r[2] = {nullptr, nullptr};
        for (int h = 0; h < 2; ++h)
          if (const int64_t iy = i * t.sh + py - t.ph + down[h]; plane[h] && iy >= 0 && iy < t.ih)
            r[h] = plane[h] + iy * t.iw;
        if (!r[0] && !r[1]) {
          std::memset(row, 0, static_cast<size_t>(t.wp) * 4);
          continue;
        }
        for (int64_t q = 0; q < t.wp; q += kTile) {
          const int64_t n = std::min<int64_t>(kTile, t.wp - q);
          const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
          _mm512_mask_storeu_epi32(row + q, m,
                                   pair_words(strided16(r[0], q, t.wp, t.sw, off[0], t.iw),
                                              strided16(r[1], q, t.wp, t.sw, off[1], t.iw), tails));
        }
      }
  }
}

inline void products() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// C block (32 rows of an A panel x 32 columns from `b`) over every tap and channel chunk, into
// `out` (32 x 32 floats). kSplit (bf16x3): `at` and `bt` are the tails' panel and planes, laid
// out as a's and b's, and the block is A B + At B + A Bt. K runs chunk by chunk, every tap of a
// chunk in turn, so the chunk's 16 planes stay in L1 while the taps read them shifted (tap-major,
// the planes of all chunks passed through L1 once per tap: 512 -> 512 @7 3x3, 16 chained, one
// thread, 8.5-9.0 -> 6.4-6.7 ms). `stream`: the panel's first block, which meets its A for the
// first time; it fetches A ahead into L2 (amx::prefetch_a_chunk), and the later blocks find it
// there.
template <bool kSplit>
void taps_block(const TapsGeometry& t, const float* a, const float* at, const uint32_t* b,
                const uint32_t* bt, float* out, bool stream) {
  const int64_t plane_bytes = t.plane * 4, tails = kSplit ? at - a : 0;
  const int64_t b_tails = kSplit ? bt - b : 0;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < t.panel_chunks; ++c) {
    const uint32_t* bp = b + c * kTile * t.plane;
    for (int64_t tap = 0; tap < t.taps; ++tap, a += kBlock * kTile) {
      const uint32_t* bc = bp + t.tap_offset[tap];
      if (stream) {
        amx::prefetch_a_chunk(a);
        if constexpr (kSplit) amx::prefetch_a_chunk(a + tails);
      }
      _tile_loadd(4, a, 64);
      _tile_loadd(5, a + kTile * kTile, 64);
      _tile_loadd(6, bc, plane_bytes);
      _tile_loadd(7, bc + kTile, plane_bytes);
      products();
      if constexpr (kSplit) {
        _tile_loadd(4, a + tails, 64);
        _tile_loadd(5, a + tails + kTile * kTile, 64);
        products();
        _tile_loadd(4, a, 64);
        _tile_loadd(5, a + kTile * kTile, 64);
        _tile_loadd(6, bc + b_tails, plane_bytes);
        _tile_loadd(7, bc + b_tails + kTile, plane_bytes);
        products();
      }
    }
  }
  constexpr int64_t kOut = kBlock * 4;
  _tile_stored(0, out, kOut);
  _tile_stored(1, out + kTile, kOut);
  _tile_stored(2, out + kTile * kBlock, kOut);
  _tile_stored(3, out + kTile * kBlock + kTile, kOut);
  memory_fence();
}

}  // namespace

void taps_planes(const TapsGeometry& t, const float* x, int64_t pair0, int64_t pair1, bool tails,
                 uint32_t* planes) {
  if (t.fold > 0) return folded_planes(t, x, pair0, pair1, tails, planes);
  const int64_t in_plane = t.ih * t.iw, phase = t.rpp * t.wp;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t p = pair0; p < pair1; ++p) {
    const float* x0 = 2 * p < t.c ? x + 2 * p * in_plane : nullptr;
    const float* x1 = 2 * p + 1 < t.c ? x + (2 * p + 1) * in_plane : nullptr;
    for (int64_t py = 0; py < t.sh; ++py)
      for (int64_t px = 0; px < t.sw; ++px) {
        uint32_t* d = planes + p * t.plane + (py * t.sw + px) * phase;
        // Columns j of a phase row read input column j sw + px - pw: those in [j0, j1) exist.
        const int64_t j0 = std::min(t.wp, std::max<int64_t>(0, (t.pw - px + t.sw - 1) / t.sw));
        const int64_t j1 = std::clamp<int64_t>((t.iw + t.pw - px + t.sw - 1) / t.sw, j0, t.wp);
        for (int64_t i = 0; i < t.rpp; ++i) {
          uint32_t* row = d + i * t.wp;
          const int64_t iy = i * t.sh + py - t.ph;
          if (iy < 0 || iy >= t.ih || !x0 || j0 == j1) {
            std::memset(row, 0, static_cast<size_t>(t.wp) * 4);
            continue;
          }
          std::memset(row, 0, static_cast<size_t>(j0) * 4);
          const float* r0 = x0 + iy * t.iw;
          const float* r1 = x1 ? x1 + iy * t.iw : nullptr;
          for (int64_t j = j0; j < j1; j += kTile) {
            const int64_t n = std::min<int64_t>(kTile, j1 - j), ix = j * t.sw + px - t.pw;
            const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
            __m512i v;
            if (t.sw == 1) {
              v = pairs16(r0 + ix, r1 ? r1 + ix : nullptr, n, tails);
            } else {  // every sw-th value: gathered
              const __m512i at =
                  _mm512_mullo_epi32(lane, _mm512_set1_epi32(static_cast<int>(t.sw)));
              const __m512 a = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, r0 + ix, 4);
              const __m512 b = r1 ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, r1 + ix, 4)
                                  : _mm512_setzero_ps();
              alignas(64) float ra[16], rb[16];
              _mm512_store_ps(ra, a);
              _mm512_store_ps(rb, b);
              v = pairs16(ra, rb, 16, tails);
            }
            _mm512_mask_storeu_epi32(row + j, m, v);
          }
          if (j1 < t.wp) std::memset(row + j1, 0, static_cast<size_t>(t.wp - j1) * 4);
        }
      }
  }
}

void taps_rows(const TapsGeometry& t, const float* a, const float* a_tails, int64_t m,
               const uint32_t* planes, const uint32_t* tails, int64_t q0, int64_t q1, float* y,
               const float* bias, const RowEpilogue* e) {
  configure_tiles(static_cast<int>(t.k_pairs));
  alignas(64) float out[kBlock * kBlock];
  const int64_t panel = t.taps * t.panel_chunks * kBlock * kTile;
  const int64_t hw = t.oh * t.ow;
  for (int64_t i = 0; i < m; i += kBlock, a += panel, a_tails += a_tails ? panel : 0) {
    const int64_t rows = std::min<int64_t>(kBlock, m - i);
    const int64_t from = t.first_chunk ? t.first_chunk[i / kBlock] * kTile * t.plane : 0;
    for (int64_t j = q0; j < q1; j += kBlock) {
      if (a_tails)
        taps_block<true>(t, a, a_tails, planes + from + j, tails + from + j, out, j == q0);
      else
        taps_block<false>(t, a, nullptr, planes + from + j, nullptr, out, j == q0);
      // Column q of the block is output (q / wp, q % wp): each run of it within one padded row
      // keeps its first ow - q % wp columns.
      for (int64_t q = j; q < std::min(j + kBlock, q1);) {
        const int64_t oy = q / t.wp, ox = q % t.wp;
        const int64_t run = std::min(std::min(j + kBlock, q1) - q, t.wp - ox);
        const int64_t keep = std::clamp<int64_t>(t.ow - ox, 0, run);
        if (keep > 0) {
          const float* src = out + (q - j);
          const int64_t at = i * hw + oy * t.ow + ox;  // output (channel i, position) in y
          for (int64_t r = 0; r < rows; ++r) {
            const __m512 b = _mm512_set1_ps(e && bias ? bias[i + r] : 0.0f);
            for (int64_t v = 0; v < keep; v += kTile) {
              const int64_t n = std::min<int64_t>(kTile, keep - v);
              const __mmask16 mk = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
              __m512 x = _mm512_maskz_loadu_ps(mk, src + r * kBlock + v);
              if (e) {  // as apply_epilogue: bias, then the scaled residual, then the clamp
                x = _mm512_add_ps(x, b);
                if (e->residual)
                  x = _mm512_fmadd_ps(_mm512_set1_ps(e->scale),
                                      _mm512_maskz_loadu_ps(mk, e->residual + at + r * hw + v), x);
                if (e->clamp)  // max(lo, x), min(hi, x): a NaN x is kept (maskz: GCC 12)
                  x = _mm512_maskz_min_ps(0xffff, _mm512_set1_ps(e->hi),
                                          _mm512_maskz_max_ps(0xffff, _mm512_set1_ps(e->lo), x));
              }
              _mm512_mask_storeu_ps(y + at + r * hw + v, mk, x);
            }
          }
        }
        q += run;
      }
    }
  }
  _tile_release();
}

}  // namespace pto::cpu::avx512

#pragma GCC pop_options
