// bf16 products on AMX tiles (Intel AMX-BF16: Sapphire Rapids and later): the bf16 GEMM's
// packing of A and its macro-kernel, for the driver in gemm.cpp (gemm_kernel.h says what each
// function promises).
//
// A tile register holds up to 16 rows of 64 bytes. TDPBF16PS C += A B takes A as 16 rows of 16
// bf16 pairs (32 values of K), B as 16 rows of pairs (one row per pair step, 16 columns) and C as
// 16 x 16 floats: 16 x 16 x 32 multiply-adds in one instruction, 16 times VDPBF16PS's work. The
// B panels are the VDPBF16PS kernels' (NR = 64 columns of pairs per step, 256 bytes a step): a B
// tile is 16 steps of 16 of its columns read with a 256-byte stride, so a weight packed once
// serves both kernels. A is packed into panels of kAmxMR = 32 rows whose steps are grouped in
// chunks of 16: chunk c holds the 32 rows' pairs of steps 16c..16c+15 row after row (64 bytes a
// row), so each half of a chunk is one A tile read with a 64-byte stride, and a panel takes
// exactly the space of a 32-row step-major one (slices of K start at the same offsets). The last
// chunk of a K shorter than a whole number of chunks holds its w < 16 steps the same way, w
// pairs a row; the micro-kernel copies it (and B's last steps) into zero-padded tiles.
//
// The micro-kernel keeps a 32 x 32 block of C in four tiles (two A tiles by two B tiles: all
// eight tile registers), so every tile loaded feeds two TDPBF16PS.
//
// int8 products (AMX-INT8, igemm.cpp) the same way with TDPBUSD: unsigned A bytes times signed B
// bytes, four of K a 32-bit lane (VPDPBUSD's quads), 16 x 64 by 64 x 16 into 16 x 16 int32. The
// igemm B panels, 16 columns of [k4][16][4] bytes, are B tiles as they are (64 contiguous bytes a
// quad row); A is packed like the bf16 A above in chunks of 16 quads, the last one zero-padded
// to a whole tile, so the tile rows of B past K meet zeros (pack_i8_b leaves room past its last
// panel for those reads). C is igemm's contiguous int32 block, whose padding rows and columns
// take whole tiles.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/elementwise_ops.h"
#include "backend/cpu/gemm/gemm_kernel.h"
#include "backend/cpu/gemm/igemm_kernel.h"
#include "backend/cpu/isa/amx_tiles.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,amx-int8,avx512bf16")

namespace pto::cpu::avx512 {
namespace {

constexpr int kMR = kAmxMR;               // rows of an A panel: two tiles
constexpr int kNR = 64;                   // columns of a B panel (gemm_impl.h's AVX-512 NR)
constexpr int kChunk = kAmxStepsPerTile;  // pair steps per tile (64 bytes of bf16 pairs)
constexpr int kTile = 16;                 // rows (and fp32 columns) of a tile

using amx::configure_tiles;
using amx::memory_fence;

// One A panel from mr <= 32 rows of A (row r at a + r * lda), k values of K: row r's pairs of
// chunk c at dst + c * 16 * kMR + r * w (w = the chunk's steps, 16 but in the last chunk).
// Rows past mr are zero pairs.
void pack_a_rows(const float* a, int64_t lda, int mr, int64_t k, float* dst) {
  const int64_t k2 = (k + 1) / 2;
  for (int64_t s = 0; s < k2; s += kChunk) {
    const int64_t w = std::min<int64_t>(kChunk, k2 - s);
    const __mmask16 keep = static_cast<__mmask16>((1u << w) - 1);
    float* d = dst + s * kMR;
    const int64_t n = std::min<int64_t>(2 * kChunk, k - 2 * s);  // values of K in this chunk
    const __mmask16 lo = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    const __mmask16 hi = n >= 32   ? __mmask16(0xffff)
                         : n <= 16 ? __mmask16(0)
                                   : __mmask16((1u << (n - 16)) - 1);
    for (int r = 0; r < kMR; ++r) {
      __m512i pairs = _mm512_setzero_si512();
      if (r < mr) {
        const float* x = a + r * lda + 2 * s;
        pairs = reinterpret_cast<__m512i>(
            _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + 16), _mm512_maskz_loadu_ps(lo, x)));
      }
      _mm512_mask_storeu_epi32(d + r * w, keep, pairs);
    }
  }
}

thread_local std::vector<float> t_rows;  // a transposed A's rows, made contiguous

// The B rows a later call reads, brought into L2 while this call's tiles multiply: a B panel
// first met comes from L3 or memory, where tile loads alone wait out the latency of each line.
// `rows` rows from `p` on, `stride` bytes apart, each a line at p and, with `second`, one that many
// bytes on (and with `other` the same lines that many bytes on: bf16x3's tails); `per` rows each
// chunk. bf16: the next 32-column half of a B panel (two lines of each
// 256-byte step); int8: the next block's one or two 16-column panels (64 bytes a quad row).
struct Ahead {
  const char* p = nullptr;
  int64_t stride = 0, second = 0, other = 0;
  int64_t rows = 0, per = 0;
};

inline void fetch_ahead(Ahead& a) {
  const int64_t n = std::min(a.per, a.rows);
  for (int64_t r = 0; r < n; ++r)
    for (const char* q = a.p + r * a.stride;; q += a.other) {
      __builtin_prefetch(q, 0, 2);
      if (a.second) __builtin_prefetch(q + a.second, 0, 2);
      if (!a.other || q != a.p + r * a.stride) break;
    }
  a.p += n * a.stride;
  a.rows -= n;
}

// A share of the rows from `p` on for the i-th of mp calls over k rows in chunks of kChunk.
Ahead ahead_share(const void* p, int64_t stride, int64_t second, int64_t k, int64_t mp, int64_t i,
                  int64_t other = 0) {
  const int64_t share = (k + mp - 1) / mp, chunks = std::max<int64_t>(1, k / kChunk);
  if (!p || i * share >= k) return {};
  return {static_cast<const char*>(p) + i * share * stride,
          stride,
          second,
          other,
          std::min(share, k - i * share),
          (share + chunks - 1) / chunks};
}

// C[mi x nj] (=|+=) alpha * A_panel B over k2 steps, with TR A row tiles and TC B column tiles
// (16 rows or columns each; mi <= 16 TR, nj <= 16 TC). `b` points at the block's first column in
// a B panel (kNR pairs a step). A full block with alpha 1 is loaded and stored by the tiles in
// place; any other goes through a 32 x 32 buffer. Each whole chunk also fetches a share of `ahead`.
// kSplit (bf16x3): `at` and `bt` are the tails' panels laid out as a's and b's, and the block is
// alpha (A B + At B + A Bt): each chunk loads A, B, At, A again and Bt for its 12 products.
template <int TR, int TC, bool kSplit>
void micro_amx(int64_t k2, const float* a, const float* b, const float* at, const float* bt,
               float* c, int64_t ldc, int mi, int nj, float alpha, bool accumulate, Ahead ahead) {
  constexpr int64_t kBStride = kNR * 4, kAStride = kChunk * 4;  // bytes between tile rows
  const bool in_place = alpha == 1.0f && mi == kTile * TR && nj == kTile * TC;
  const int64_t ldc_bytes = ldc * 4;
  memory_fence();
  if (in_place && accumulate) {
    _tile_loadd(0, c, ldc_bytes);
    if constexpr (TC == 2) _tile_loadd(1, c + kTile, ldc_bytes);
    if constexpr (TR == 2) _tile_loadd(2, c + kTile * ldc, ldc_bytes);
    if constexpr (TR == 2 && TC == 2) _tile_loadd(3, c + kTile * ldc + kTile, ldc_bytes);
  } else {
    _tile_zero(0);
    if constexpr (TC == 2) _tile_zero(1);
    if constexpr (TR == 2) _tile_zero(2);
    if constexpr (TR == 2 && TC == 2) _tile_zero(3);
  }
  auto load_a = [&](const float* a0, int64_t a_stride) {
    _tile_loadd(4, a0, a_stride);
    if constexpr (TR == 2) _tile_loadd(5, a0 + kTile * a_stride / 4, a_stride);
  };
  auto load_b = [&](const float* b0, int64_t b_stride) {
    _tile_loadd(6, b0, b_stride);
    if constexpr (TC == 2) _tile_loadd(7, b0 + kTile, b_stride);
  };
  auto products = [] {
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (TC == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (TR == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (TR == 2 && TC == 2) _tile_dpbf16ps(3, 5, 7);
  };
  // One chunk: a0, b0 (and the tails' at0, bt0) with rows a_stride and b_stride bytes apart.
  auto step = [&](const float* a0, const float* at0, int64_t a_stride, const float* b0,
                  const float* bt0, int64_t b_stride) {
    load_a(a0, a_stride);
    load_b(b0, b_stride);
    products();
    if constexpr (kSplit) {
      load_a(at0, a_stride);
      products();
      load_a(a0, a_stride);
      load_b(bt0, b_stride);
      products();
    }
  };
  int64_t s = 0;
  for (; s + kChunk <= k2; s += kChunk) {
    if (ahead.rows > 0) fetch_ahead(ahead);
    step(a + s * kMR, kSplit ? at + s * kMR : nullptr, kAStride, b + s * kNR,
         kSplit ? bt + s * kNR : nullptr, kBStride);
  }
  if (s < k2) {  // the last w < 16 steps, zero-padded to a whole tile
    const int64_t w = k2 - s;
    alignas(64) float pa[2][kMR * kChunk] = {}, pb[2][kChunk * 2 * kTile] = {};
    for (int part = 0; part < (kSplit ? 2 : 1); ++part) {
      const float *x = part ? at : a, *y = part ? bt : b;
      for (int r = 0; r < kTile * TR; ++r)
        std::memcpy(pa[part] + r * kChunk, x + s * kMR + r * w, w * 4);
      for (int64_t p = 0; p < w; ++p)
        std::memcpy(pb[part] + p * 2 * kTile, y + (s + p) * kNR, TC * 64);
    }
    memory_fence();
    step(pa[0], pa[1], kAStride, pb[0], pb[1], 2 * kTile * 4);
  }
  if (in_place) {
    _tile_stored(0, c, ldc_bytes);
    if constexpr (TC == 2) _tile_stored(1, c + kTile, ldc_bytes);
    if constexpr (TR == 2) _tile_stored(2, c + kTile * ldc, ldc_bytes);
    if constexpr (TR == 2 && TC == 2) _tile_stored(3, c + kTile * ldc + kTile, ldc_bytes);
    memory_fence();
    return;
  }
  alignas(64) float out[2 * kTile * 2 * kTile];
  constexpr int64_t kOut = 2 * kTile * 4;  // bytes per row of `out`
  _tile_stored(0, out, kOut);
  if constexpr (TC == 2) _tile_stored(1, out + kTile, kOut);
  if constexpr (TR == 2) _tile_stored(2, out + kTile * 2 * kTile, kOut);
  if constexpr (TR == 2 && TC == 2) _tile_stored(3, out + kTile * 2 * kTile + kTile, kOut);
  memory_fence();
  const __m512 va = _mm512_set1_ps(alpha);
  for (int r = 0; r < mi; ++r)
    for (int j = 0; j < nj; j += kTile) {
      const __mmask16 m = nj - j >= kTile ? __mmask16(0xffff) : __mmask16((1u << (nj - j)) - 1);
      __m512 x = _mm512_mul_ps(_mm512_load_ps(out + r * 2 * kTile + j), va);
      if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, c + r * ldc + j));
      _mm512_mask_storeu_ps(c + r * ldc + j, m, x);
    }
}

using MicroAmx = void (*)(int64_t, const float*, const float*, const float*, const float*, float*,
                          int64_t, int, int, float, bool, Ahead);
// [bf16x3][two row tiles][two column tiles]
constexpr MicroAmx kMicro[2][2][2] = {{{&micro_amx<1, 1, false>, &micro_amx<1, 2, false>},
                                       {&micro_amx<2, 1, false>, &micro_amx<2, 2, false>}},
                                      {{&micro_amx<1, 1, true>, &micro_amx<1, 2, true>},
                                       {&micro_amx<2, 1, true>, &micro_amx<2, 2, true>}}};

}  // namespace

void gemm_pack_a_amx(const float* a, int64_t lda, bool trans, int64_t m, int64_t k, float* dst) {
  const int64_t k2 = (k + 1) / 2;
  for (int64_t i0 = 0; i0 < m; i0 += kMR, dst += k2 * kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMR, m - i0));
    if (!trans) {
      pack_a_rows(a + i0 * lda, lda, mr, k, dst);
      continue;
    }
    // A is K x M: its mr columns from i0 copied out as rows first.
    t_rows.resize(static_cast<size_t>(mr * k));
    for (int64_t q = 0; q < k; ++q)
      for (int r = 0; r < mr; ++r) t_rows[r * k + q] = a[q * lda + i0 + r];
    pack_a_rows(t_rows.data(), k, mr, k, dst);
  }
}

void gemm_pack_a_amx_bf16(const uint16_t* a, int64_t lda, int64_t m, int64_t k, float* dst) {
  const int64_t k2 = (k + 1) / 2;
  for (int64_t i0 = 0; i0 < m; i0 += kMR, dst += k2 * kMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMR, m - i0));
    for (int64_t s = 0; s < k2; s += kChunk) {
      const int64_t w = std::min<int64_t>(kChunk, k2 - s);
      const int64_t n = std::min<int64_t>(2 * kChunk, k - 2 * s);  // values of K in this chunk
      const __mmask32 keep = static_cast<__mmask32>((uint64_t{1} << (2 * w)) - 1);
      const __mmask32 have = static_cast<__mmask32>((uint64_t{1} << n) - 1);
      auto* d = reinterpret_cast<uint16_t*>(dst + s * kMR);
      for (int r = 0; r < kMR; ++r) {
        const __m512i x = r < mr ? _mm512_maskz_loadu_epi16(have, a + (i0 + r) * lda + 2 * s)
                                 : _mm512_setzero_si512();
        _mm512_mask_storeu_epi16(d + r * 2 * w, keep, x);  // an odd K's last pair ends in 0
      }
    }
  }
}

void gemm_macro_amx(const MacroBlock& blk) {
  configure_tiles();
  const int64_t np = (blk.n + kNR - 1) / kNR, mp = (blk.m + kMR - 1) / kMR;
  const int64_t as = blk.a_panel_stride ? blk.a_panel_stride : blk.k * kMR;
  // While a 32-column half of a B panel meets the mp A panels, the next half comes into L2, a
  // share of its steps in each of the mp calls. bf16x3 (a_tail, b_tail): the half of the heads'
  // panel meets each A panel's heads and tails, then the half of the tails' panel its heads, while
  // both halves are in cache (the tails' next half is fetched beside the heads').
  const int64_t tails = blk.b_tail ? blk.b_tail - blk.b : 0;  // floats from a head to its tail
  // The epilogue on each finished block while it is in L1, where K is long enough (128 or more)
  // that its call per block is small beside the block's products; else on each column panel of
  // the mp blocks. bf16 1x1 convs + ReLU, one thread, p50 ms: 256 -> 64 @56 0.34 -> 0.28, 128 ->
  // 512 @28 0.15 -> 0.13, 256 -> 1024 @14 0.14 -> 0.12, but 64 -> 256 @56 (K = 64) 0.30 -> 0.33;
  // ResNet-50 bf16 17.7 -> 17.0 ms on one thread, 10.9 -> 10.3 on two. A block on its way to
  // c_half gets it in the L1 buffer too.
  const bool block_epilogue = blk.epilogue && (blk.k >= 64 || blk.c_half);
  alignas(64) float half_buf[kMR * 2 * kTile];  // a block on its way to c_half
  for (int64_t j = 0; j < np; ++j) {
    const int nj = static_cast<int>(std::min<int64_t>(kNR, blk.n - j * kNR));
    const float* bp = blk.b + j * blk.b_panel_stride;
    // Each 32-column half of the panel against every A panel of the block.
    for (int h = 0; h < nj; h += 2 * kTile) {
      const int nh = std::min(2 * kTile, nj - h);
      const float* next = h + 2 * kTile < nj ? bp + h + 2 * kTile
                          : j + 1 < np       ? bp + blk.b_panel_stride
                                             : blk.b_after;
      for (int64_t i = 0; i < mp; ++i) {
        const int mi = static_cast<int>(std::min<int64_t>(kMR, blk.m - i * kMR));
        const int64_t at = i * kMR * blk.ldc + j * kNR + h;  // the block's offset in C
        float* c = blk.c_half ? half_buf : blk.c + at;
        const int64_t ldc = blk.c_half ? 2 * kTile : blk.ldc;
        kMicro[tails != 0][mi > kTile][nh > kTile](
            blk.k, blk.a + i * as, bp + h, tails ? blk.a_tail + i * as : nullptr,
            tails ? bp + tails + h : nullptr, c, ldc, mi, nh, blk.alpha, blk.accumulate,
            ahead_share(next, kNR * 4, kTile * 4, blk.k, mp, i, tails * 4));
        if (block_epilogue)
          apply_epilogue(*blk.epilogue, c, ldc, blk.m0 + i * kMR, mi, blk.n0 + j * kNR + h, nh);
        // bf16 rounded here, in registers: a dispatched f32_to_bf16 call a row of 32 cost more
        // than its two vectors' rounding (5% of ConvNeXt-T bf16).
        if (blk.c_half && blk.c_half_type == Precision::kBF16) {
          for (int r = 0; r < mi; ++r)
            for (int j = 0; j < nh; j += kTile) {
              const float* src = half_buf + r * 2 * kTile + j;
              const int k = std::min(kTile, nh - j);
              const Vec v{_mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << k) - 1), src)};
              store_bf16_lanes(v, blk.c_half + at + r * blk.ldc + j, k);
            }
        } else if (blk.c_half) {
          for (int r = 0; r < mi; ++r)
            f32_to_f16(half_buf + r * 2 * kTile, blk.c_half + at + r * blk.ldc, nh);
        }
      }
    }
    if (blk.epilogue && !block_epilogue)
      for (int64_t i = 0; i < mp; ++i) {
        const int64_t mi = std::min<int64_t>(kMR, blk.m - i * kMR);
        apply_epilogue(*blk.epilogue, blk.c + i * kMR * blk.ldc + j * kNR, blk.ldc,
                       blk.m0 + i * kMR, mi, blk.n0 + j * kNR, nj);
      }
  }
  _tile_release();
}

// ---- int8 (AMX-INT8) ----

void igemm_pack_a_amx(const uint8_t* a, int64_t lda, bool a_signed, int64_t m, int64_t k,
                      uint8_t* dst, int32_t* rowsum) {
  const int64_t chunks = (k + 4 * kChunk - 1) / (4 * kChunk);
  const __m512i flip = _mm512_set1_epi8(a_signed ? static_cast<char>(0x80) : 0);
  for (int64_t i0 = 0; i0 < m; i0 += kMR, dst += chunks * kChunk * kMR * 4, rowsum += kMR) {
    for (int r = 0; r < kMR; ++r) {
      const bool row = i0 + r < m;
      __m512i sums = _mm512_setzero_si512();
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t q = c * 64, n = row ? std::min<int64_t>(64, k - q) : 0;
        const __mmask64 keep = n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
        // a' = a ^ 0x80 for int8 (uint8 a + 128), only where there are values: padding stays 0.
        const __m512i x =
            _mm512_xor_si512(_mm512_maskz_loadu_epi8(keep, row ? a + (i0 + r) * lda + q : a),
                             _mm512_maskz_mov_epi8(keep, flip));
        _mm512_storeu_si512(dst + (c * kMR + r) * 4 * kChunk, x);
        sums = _mm512_add_epi64(sums, _mm512_sad_epu8(x, _mm512_setzero_si512()));
      }
      alignas(64) int64_t lanes[8];  // (GCC 12 misreads _mm512_reduce_add_epi64 as uninitialized)
      _mm512_store_si512(lanes, sums);
      int64_t sum = 0;
      for (int64_t x : lanes) sum += x;
      rowsum[r] = static_cast<int32_t>(sum);
    }
  }
}

namespace {

// The int32 C block at c (ldc apart) (=|+=) the A panel's 32 rows by TC 16-column B panels (bs
// bytes apart) over k4 quads (in whole chunks: A is padded), then the zero-point corrections
// where `rowsum` is set (the first K slice): rowsum[r] * beta[j] + alpha[r] * cs2[j], wrapping.
// Each chunk also fetches a share of `ahead`.

template <int TC>
void imicro_amx(int64_t k4, const uint8_t* a, const int8_t* b, int64_t bs, int32_t* c, int64_t ldc,
                bool accumulate, const int32_t* rowsum, const int32_t* alpha, const int32_t* beta,
                const int32_t* cs2, Ahead ahead) {
  const int64_t ldc_bytes = ldc * 4;
  memory_fence();
  if (accumulate) {
    _tile_loadd(0, c, ldc_bytes);
    if constexpr (TC == 2) _tile_loadd(1, c + kTile, ldc_bytes);
    _tile_loadd(2, c + kTile * ldc, ldc_bytes);
    if constexpr (TC == 2) _tile_loadd(3, c + kTile * ldc + kTile, ldc_bytes);
  } else {
    _tile_zero(0);
    if constexpr (TC == 2) _tile_zero(1);
    _tile_zero(2);
    if constexpr (TC == 2) _tile_zero(3);
  }
  for (int64_t s = 0; s < k4; s += kChunk) {
    if (ahead.rows > 0) fetch_ahead(ahead);
    const uint8_t* a0 = a + s * kMR * 4;
    _tile_loadd(4, a0, 64);
    _tile_loadd(5, a0 + kTile * 64, 64);
    _tile_loadd(6, b + s * 64, 64);
    if constexpr (TC == 2) _tile_loadd(7, b + bs + s * 64, 64);
    _tile_dpbusd(0, 4, 6);
    if constexpr (TC == 2) _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    if constexpr (TC == 2) _tile_dpbusd(3, 5, 7);
  }
  _tile_stored(0, c, ldc_bytes);
  if constexpr (TC == 2) _tile_stored(1, c + kTile, ldc_bytes);
  _tile_stored(2, c + kTile * ldc, ldc_bytes);
  if constexpr (TC == 2) _tile_stored(3, c + kTile * ldc + kTile, ldc_bytes);
  memory_fence();
  if (!rowsum) return;
  for (int r = 0; r < kMR; ++r) {
    const __m512i rs = _mm512_set1_epi32(rowsum[r]), al = _mm512_set1_epi32(alpha[r]);
    for (int v = 0; v < TC; ++v) {
      int32_t* row = c + r * ldc + v * kTile;
      const __m512i x = _mm512_add_epi32(
          _mm512_loadu_si512(row),
          _mm512_add_epi32(_mm512_mullo_epi32(rs, _mm512_loadu_si512(beta + v * kTile)),
                           _mm512_mullo_epi32(al, _mm512_loadu_si512(cs2 + v * kTile))));
      _mm512_storeu_si512(row, x);
    }
  }
}

}  // namespace

void igemm_macro_amx(const IgemmBlock& blk) {
  configure_tiles();
  const int64_t mp = (blk.m + kMR - 1) / kMR;
  const int64_t as = blk.a_panel_stride;
  const bool first = !blk.accumulate;
  // While a block of 32 columns meets the mp A panels, the next block's two panels (this call's,
  // or the first of blk.next_cols after it) come into L2, a share of their rows with each.
  const int64_t end = blk.n + blk.next_cols;  // columns whose panels follow blk.b's
  for (int64_t j = 0; j < blk.n; j += 2 * kTile) {
    const int8_t* bp = blk.b + (j / kTile) * blk.b_stride;
    const bool two = j + kTile < blk.n;  // a second 16-column panel in this block
    // The next block's first column, and where its columns end: this call's, or the next's.
    const int64_t jn = std::min(j + 2 * kTile, blk.n), jn_end = jn < blk.n ? blk.n : end;
    const int8_t* next = jn < jn_end ? blk.b + (jn / kTile) * blk.b_stride : nullptr;
    const int64_t second = jn + kTile < jn_end ? blk.b_stride : 0;
    for (int64_t i = 0; i < mp; ++i) {
      const int64_t r = i * kMR;
      (two ? &imicro_amx<2>
           : &imicro_amx<1>)(blk.k4, blk.a + i * as, bp, blk.b_stride, blk.c + r * blk.ldc + j,
                             blk.ldc, blk.accumulate, first ? blk.rowsum + r : nullptr,
                             first ? blk.alpha + r : nullptr, first ? blk.beta + j : nullptr,
                             first ? blk.cs2 + j : nullptr,
                             ahead_share(next, 64, second, blk.k4, mp, i));
    }
  }
  _tile_release();
}

float tdpbf16_chains(int64_t iterations) {
  configure_tiles();
  alignas(64) float ab[kTile * kTile] = {};
  for (int i = 0; i < kTile * kTile; ++i) ab[i] = 1.0f;  // bf16 pairs of small values
  memory_fence();
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {  // four independent accumulator tiles
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[kTile * kTile];
  _tile_stored(0, out, 64);
  memory_fence();
  _tile_release();
  return out[0];
}

int64_t tdpbf16_flops_per_iteration() {
  return 4 * kTile * kTile * 2 * kChunk * 2;  // 4 tiles of 16 x 16 x 32 multiply-adds
}

float tdpbf16_stores(int64_t chunks, float* c, int64_t m, int64_t n, bool half) {
  configure_tiles();
  // A and B: one 32-row A panel chunk (2 KiB) and one 32-column B chunk (4 KiB, 256-byte rows,
  // as the packed panels), per chunk of K up to 8, then again: L1-resident operands.
  alignas(64) static float ab[8 * 1536];
  static const bool filled = [] {
    for (float& x : ab) x = 1.0f;
    return true;
  }();
  (void)filled;
  alignas(64) float out[2 * kTile * 2 * kTile];
  auto* c_half = reinterpret_cast<uint16_t*>(c);
  memory_fence();
  for (int64_t j = 0; j + 2 * kTile <= n; j += 2 * kTile)
    for (int64_t i = 0; i + kMR <= m; i += kMR) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t s = 0; s < chunks; ++s) {
        const float* a = ab + (s % 8) * 1536;
        _tile_loadd(4, a, 64);
        _tile_loadd(5, a + 256, 64);
        _tile_loadd(6, a + 512, 256);
        _tile_loadd(7, a + 512 + kTile, 256);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* ci = c + i * n + j;
      if (!half) {
        _tile_stored(0, ci, n * 4);
        _tile_stored(1, ci + kTile, n * 4);
        _tile_stored(2, ci + kTile * n, n * 4);
        _tile_stored(3, ci + kTile * n + kTile, n * 4);
        continue;
      }
      constexpr int64_t kOut = 2 * kTile * 4;
      _tile_stored(0, out, kOut);
      _tile_stored(1, out + kTile, kOut);
      _tile_stored(2, out + kTile * 2 * kTile, kOut);
      _tile_stored(3, out + kTile * 2 * kTile + kTile, kOut);
      memory_fence();
      for (int r = 0; r < kMR; ++r)
        _mm512_storeu_si512(
            c_half + (i + r) * n + j,
            reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
                _mm512_load_ps(out + r * 2 * kTile + kTile), _mm512_load_ps(out + r * 2 * kTile))));
    }
  memory_fence();
  _tile_release();
  return c[0];
}

}  // namespace pto::cpu::avx512

#pragma GCC pop_options
