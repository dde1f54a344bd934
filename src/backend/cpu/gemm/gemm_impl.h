// The per-ISA half of SGEMM (see gemm_kernel.h for the interface and gemm.cpp for the blocking
// and threading): panel packing and an MR x NR register-blocked micro-kernel written against
// simd.h's Vec. Included once by each of gemm_avx512.cpp, gemm_avx2.cpp and gemm_generic.cpp.
//
// Register blocks (accumulators + B vectors + one broadcast must fit the register file):
//   AVX-512 (32 zmm):  6 x 64 — 24 accumulators, 4 B vectors, 1 broadcast (measured against
//                     14 x 32, 12 x 32 and 8 x 48: fastest on 1024..2048 squares here);
//   AVX2    (16 ymm):  6 x 16 — 12 accumulators, 2 B vectors, 1 broadcast;
//   generic:           4 x 4  — 16 scalar accumulators.
// The micro-kernel is instantiated for every (rows <= MR, vectors <= NR / lanes), so a partial
// tile at the bottom or right edge does only the work it needs; the last vector of a row is stored
// with a masked store.
#include "backend/cpu/gemm/gemm_kernel.h"
#include "backend/cpu/isa/simd.h"
#include "pto/dtype.h"

#include <bit>

namespace pto::cpu::PTO_ISA_NS {
namespace {

#if defined(PTO_ISA_AVX512)
constexpr int kMR = 6, kNV = 4;
#elif defined(PTO_ISA_AVX2)
constexpr int kMR = 6, kNV = 2;
#else
constexpr int kMR = 4, kNV = 4;
#endif
constexpr int kL = Vec::kLanes;
constexpr int kNR = kNV * kL;
constexpr int kRowsAhead = kGemmRowsSlack;
// How far ahead (steps of k) a micro-kernel fetches the B row it reads in place with a stride.
constexpr int kStridedAhead = 16;

// How a micro-kernel reads its B panel: packed (NR floats per k, contiguous: the hardware
// prefetcher follows it), in place with a row stride, or through a row table.
// kPackedF16 / kPackedBf16: packed as IEEE half / bf16 bits, widened as loaded (a weight kept
// in 2 bytes).
enum class BRead { kPacked, kStrided, kRows, kPackedF16, kPackedBf16 };

// kL halves widened to a vector: F16C's VCVTPH2PS (the driver makes f16 panels only where the
// CPU has it) or a zero-extension and shift for bf16; element by element in the generic build.
template <BRead kB>
inline Vec load_half(const uint16_t* h) {
#if defined(PTO_ISA_AVX512)
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h));
  if constexpr (kB == BRead::kPackedF16) return {_mm512_cvtph_ps(x)};
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16))};
#elif defined(PTO_ISA_AVX2)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h));
  if constexpr (kB == BRead::kPackedF16) return {_mm256_cvtph_ps(x)};
  return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16))};
#else
  float f[kL];
  for (int l = 0; l < kL; ++l)
    f[l] = kB == BRead::kPackedF16 ? Float16::to_float(h[l])
                                   : std::bit_cast<float>(static_cast<uint32_t>(h[l]) << 16);
  return Vec::load(f);
#endif
}

constexpr bool is_half(BRead b) {
  return b == BRead::kPackedF16 || b == BRead::kPackedBf16;
}

// The rows of the next B panel a micro-kernel fetches into L2 while it runs: one row (ld floats
// on) every 2^shift steps of k, starting at `b`.
struct NextPanel {
  const float* b = nullptr;
  int64_t ld = 0;
  int shift = 0;
};

using MicroFn = void (*)(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                         const int64_t* rows, float* c, int64_t ldc, int n_last, float alpha,
                         bool accumulate, NextPanel next);

// C[R x (NV vectors)] (=|+=) alpha * A_panel * B_panel over k. A: a packed panel, kMR floats per
// k (R used), or with kAInPlace R rows of A itself, lda floats apart (one value of each row per
// k, so the panel needs no packing: where each value of A is used once, packing it costs more
// than the strided broadcasts save; docs/backend/gemm.md);
// B: ldb floats per k (NV vectors used; kPackedF16: ldb halves at b's address), or with kRows
// row p at b + rows[p] (an implicit GEMM's shifted input rows). n_last: valid lanes of the last
// vector (1..kL). `next`: a share of the next B panel to fetch into L2 meanwhile (its first call
// would otherwise wait on L3 or memory).
template <BRead kB, bool kAInPlace, int R, int NV>
void micro(int64_t k, const float* a, [[maybe_unused]] int64_t lda, const float* b, int64_t ldb,
           const int64_t* rows, float* c, int64_t ldc, int n_last, float alpha, bool accumulate,
           NextPanel next) {
  // The C tile is read and written only after the k loop; fetching it into L2 now hides the
  // latency of a tile that was evicted to L3 (large C, or row strides that alias in L1).
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) __builtin_prefetch(c + r * ldc + v * kL, 1, 2);
  }
  Vec s[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) s[r][v] = Vec::zero();
#pragma GCC unroll 2
  for (int64_t p = 0; p < k; ++p) {
    Vec bv[NV];
    const float* bp = b;
    if constexpr (kB == BRead::kRows) {
      // The rows are scattered, so the hardware prefetcher does not follow them: fetch the row
      // kRowsAhead steps on (rows[] has that many entries of slack).
      bp = b + rows[p];
      const float* ahead = b + rows[p + kRowsAhead];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) __builtin_prefetch(ahead + v * kL, 0, 3);
    } else if constexpr (kB == BRead::kStrided) {
      // Each row is a new page-distant stream too short for the hardware prefetcher.
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) __builtin_prefetch(b + kStridedAhead * ldb + v * kL, 0, 3);
    }
    if (next.b && (p & ((int64_t{1} << next.shift) - 1)) == 0) {
      const float* nb = next.b + (p >> next.shift) * next.ld;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) __builtin_prefetch(nb + v * kL, 0, 2);
    }
    if constexpr (is_half(kB)) {
      const uint16_t* hp = reinterpret_cast<const uint16_t*>(b) + p * ldb;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = load_half<kB>(hp + v * kL);
    } else {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) bv[v] = Vec::load(bp + v * kL);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const Vec av = Vec::set1(kAInPlace ? a[r * lda] : a[r]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) s[r][v] = fma(av, bv[v], s[r][v]);
    }
    a += kAInPlace ? 1 : kMR;
    if constexpr (!is_half(kB)) b += ldb;
  }
  const Vec va = Vec::set1(alpha);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      Vec x = alpha == 1.0f ? s[r][v] : s[r][v] * va;
      if (v < NV - 1 || n_last == kL) {
        if (accumulate) x = x + Vec::load(row + v * kL);
        x.store(row + v * kL);
      } else {
        if (accumulate) x = x + Vec::load(row + v * kL, n_last);
        x.store(row + v * kL, n_last);
      }
    }
  }
}

// table[R - 1][NV - 1] = micro<kB, kAInPlace, R, NV>
template <BRead kB, bool kAInPlace, int R, int NV>
void fill_table(MicroFn (*table)[kNV]) {
  table[R - 1][NV - 1] = &micro<kB, kAInPlace, R, NV>;
  if constexpr (NV > 1)
    fill_table<kB, kAInPlace, R, NV - 1>(table);
  else if constexpr (R > 1)
    fill_table<kB, kAInPlace, R - 1, kNV>(table);
}

struct MicroTable {
  MicroFn fn[5][kMR][kNV];        // [BRead][R - 1][NV - 1], A packed
  MicroFn in_place[2][kMR][kNV];  // [kPacked, kStrided][R - 1][NV - 1], A read in place
  MicroTable() {
    fill_table<BRead::kPacked, false, kMR, kNV>(fn[0]);
    fill_table<BRead::kStrided, false, kMR, kNV>(fn[1]);
    fill_table<BRead::kRows, false, kMR, kNV>(fn[2]);
    fill_table<BRead::kPackedF16, false, kMR, kNV>(fn[3]);
    fill_table<BRead::kPackedBf16, false, kMR, kNV>(fn[4]);
    fill_table<BRead::kPacked, true, kMR, kNV>(in_place[0]);
    fill_table<BRead::kStrided, true, kMR, kNV>(in_place[1]);
  }
};

}  // namespace

void gemm_block(int64_t* mr, int64_t* nr) {
  *mr = kMR;
  *nr = kNR;
}

namespace {

#if defined(PTO_ISA_AVX512)
// Where the 6 x 16 transpose below takes each output lane from (see pack_a_6x16).
struct PackA6x16 {
  alignas(64) int64_t from01[3][8] = {};  // lane of pairs 0 (< 8) or 1 (8 + lane)
  alignas(64) int64_t from2[3][8] = {};   // lane of pairs 2
  __mmask8 take2[3] = {};                 // output lanes taken from pairs 2
  constexpr PackA6x16() {
    for (int j = 0; j < 3; ++j)
      for (int t = 0; t < 8; ++t) {
        const int q = 8 * j + t, step = q / 3, src = q % 3;
        from01[j][t] = src == 1 ? 8 + step : step;
        from2[j][t] = step;
        if (src == 2) take2[j] = static_cast<__mmask8>(take2[j] | (1 << t));
      }
  }
};

// Steps p..p+15 of the six rows of one A panel into the panel (6 consecutive floats per step): a
// 6 x 16 transpose in 18 permutes. Rows 2i and 2i+1 interleave into (x, y) pairs, one 64-bit
// lane per step, eight steps a vector (pairs i); each output vector then takes its eight lanes
// from the three pair vectors of its eight steps (lane q of the 24 is step q / 3, pairs q % 3).
// transpose_6x16 takes the six rows as vectors (16 32-bit values each: floats, or bf16 pairs).
void transpose_6x16(const __m512 row[6], float* dst) {
  static constexpr PackA6x16 kT{};
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
  __m512d pair[2][3];  // [steps 0-7 or 8-15][rows 0-1, 2-3, 4-5]
  for (int i = 0; i < 3; ++i) {
    const __m512 x = row[2 * i], y = row[2 * i + 1];
    pair[0][i] = _mm512_castps_pd(_mm512_permutex2var_ps(x, lo, y));
    pair[1][i] = _mm512_castps_pd(_mm512_permutex2var_ps(x, hi, y));
  }
  for (int j = 0; j < 3; ++j) {
    const __m512i i01 = _mm512_load_si512(kT.from01[j]), i2 = _mm512_load_si512(kT.from2[j]);
    for (int h = 0; h < 2; ++h) {
      __m512d v = _mm512_permutex2var_pd(pair[h][0], i01, pair[h][1]);
      v = _mm512_mask_permutexvar_pd(v, kT.take2[j], i2, pair[h][2]);
      _mm512_storeu_pd(reinterpret_cast<double*>(dst + 48 * h + 16 * j), v);
    }
  }
}

void pack_a_6x16(const float* const rows[6], int64_t p, float* dst) {
  __m512 row[6];
  for (int r = 0; r < 6; ++r) row[r] = _mm512_loadu_ps(rows[r] + p);
  transpose_6x16(row, dst);
}
#endif

}  // namespace

void gemm_pack_a(const float* a, int64_t lda, bool trans, int64_t m, int64_t k, float* dst) {
  for (int64_t i0 = 0; i0 < m; i0 += kMR, dst += k * kMR) {
    const int mr = static_cast<int>(m - i0 < kMR ? m - i0 : kMR);
    if (trans) {  // A is K x M: each k contributes mr contiguous values
      const float* src = a + i0;
      for (int64_t p = 0; p < k; ++p) {
        float* d = dst + p * kMR;
        for (int r = 0; r < mr; ++r) d[r] = src[p * lda + r];
        for (int r = mr; r < kMR; ++r) d[r] = 0.0f;
      }
      continue;
    }
    const float* rows[kMR];
    for (int r = 0; r < kMR; ++r) rows[r] = a + (i0 + (r < mr ? r : 0)) * lda;
    if (mr == kMR) {
      int64_t p = 0;
#if defined(PTO_ISA_AVX512)
      for (; p + 16 <= k; p += 16) pack_a_6x16(rows, p, dst + p * kMR);
#endif
      for (; p < k; ++p)
#pragma GCC unroll 16
        for (int r = 0; r < kMR; ++r) dst[p * kMR + r] = rows[r][p];
    } else {
      for (int64_t p = 0; p < k; ++p)
        for (int r = 0; r < kMR; ++r) dst[p * kMR + r] = r < mr ? rows[r][p] : 0.0f;
    }
  }
}

void gemm_pack_b(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst,
                 int64_t panel_stride) {
  for (int64_t j0 = 0; j0 < n; j0 += kNR, dst += panel_stride) {
    const int nr = static_cast<int>(n - j0 < kNR ? n - j0 : kNR);
    if (!trans) {  // B is K x N: each k contributes nr contiguous values
      const float* src = b + j0;
      for (int64_t p = 0; p < k; ++p) {
#pragma GCC unroll 4
        for (int v = 0; v < kNV; ++v) {
          const int left = nr - v * kL;
          const Vec x = left >= kL
                            ? Vec::load(src + p * ldb + v * kL)
                            : (left > 0 ? Vec::load(src + p * ldb + v * kL, left) : Vec::zero());
          x.store(dst + p * kNR + v * kL);
        }
      }
      continue;
    }
    // B is N x K: column j of op(B) is row j of B.
    for (int64_t p = 0; p < k; ++p) {
      float* d = dst + p * kNR;
      for (int c = 0; c < nr; ++c) d[c] = b[(j0 + c) * ldb + p];
      for (int c = nr; c < kNR; ++c) d[c] = 0.0f;
    }
  }
}

void gemm_macro(const MacroBlock& blk) {
  static const MicroTable table;
  const int64_t np = (blk.n + kNR - 1) / kNR, mp = (blk.m + kMR - 1) / kMR;
  const int64_t as = blk.a_row_stride     ? blk.a_row_stride * kMR
                     : blk.a_panel_stride ? blk.a_panel_stride
                                          : blk.k * kMR;
  const float* res =
      blk.epilogue && !blk.epilogue->tile ? blk.epilogue->residual : nullptr;  // null: none
  // Panels of halves are addressed in halves (their micro-kernel reads them so).
  const int64_t esize = blk.b_half != Precision::kF32 ? 2 : 4;
  auto panel = [&](int64_t j) {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(blk.b) +
                                          j * blk.b_panel_stride * esize);
  };
  for (int64_t j = 0; j < np; ++j) {
    const int nj = static_cast<int>(blk.n - j * kNR < kNR ? blk.n - j * kNR : kNR);
    const float* bp = panel(j);
    int64_t bs = blk.b_row_stride;
    const int64_t* rows = blk.b_rows;
    if (nj < kNR && blk.b_edge) {
      bp = blk.b_edge;
      bs = kNR;
      rows = nullptr;
    }
    const BRead read = blk.b_half == Precision::kF16    ? BRead::kPackedF16
                       : blk.b_half == Precision::kBF16 ? BRead::kPackedBf16
                       : rows                           ? BRead::kRows
                       : bs == kNR                      ? BRead::kPacked
                                                        : BRead::kStrided;
    const auto& fn = blk.a_row_stride ? table.in_place[static_cast<int>(read)]
                                      : table.fn[static_cast<int>(read)];
    const int nv = (nj + kL - 1) / kL;
    const int n_last = nj - (nv - 1) * kL;
    // While panel j runs against the mp panels of A, the next panel of B (packed or read in
    // place, not the edge panel or a row table's) comes into L2 a share at a time: a row every
    // 2^shift steps, call i from row i * (k >> shift) on, so the first 2^shift calls cover it.
    NextPanel next;
    const bool next_plain = j + 2 < np || (j + 2 == np && !(blk.b_edge && blk.n % kNR));
    if (!blk.b_rows && (next_plain || (j + 1 == np && blk.b_after))) {
      next.b = next_plain ? panel(j + 1) : blk.b_after;
      next.ld = blk.b_row_stride * esize / 4;  // in floats
      while (next.shift < 4 && (int64_t{2} << next.shift) <= mp) ++next.shift;
    }
    const int64_t share = blk.k >> next.shift;
    for (int64_t i = 0; i < mp; ++i) {
      const int mi = static_cast<int>(blk.m - i * kMR < kMR ? blk.m - i * kMR : kMR);
      float* c = blk.c + i * kMR * blk.ldc + j * kNR;
      NextPanel nx = next;
      if (i * share >= blk.k) nx.b = nullptr;
      if (nx.b) nx.b += i * share * nx.ld;
      if (res) {  // the epilogue's residual tile, read right after the k loop: fetch it meanwhile
        const float* r = res + (blk.m0 + i * kMR) * blk.epilogue->ldr + blk.n0 + j * kNR;
        for (int rr = 0; rr < mi; ++rr)
          for (int v = 0; v < nv; ++v)
            __builtin_prefetch(r + rr * blk.epilogue->ldr + v * kL, 0, 3);
      }
      fn[mi - 1][nv - 1](blk.k, blk.a + i * as, blk.a_row_stride, bp, bs, rows, c, blk.ldc, n_last,
                         blk.alpha, blk.accumulate, nx);
      if (blk.epilogue)
        apply_epilogue(*blk.epilogue, c, blk.ldc, blk.m0 + i * kMR, mi, blk.n0 + j * kNR, nj);
    }
  }
}

#if defined(PTO_ISA_AVX512)
// ---- bf16 (AVX512_BF16) ----

namespace {

#define PTO_BF16 __attribute__((target("avx512bf16")))

// With Tail (bf16x3), each loaded value v stands for its tail v - bf16(v) (keep_tail).
template <bool Tail>
PTO_BF16 __m512 part_of(__m512 v) {
  if constexpr (Tail) {
    const auto head = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    return _mm512_sub_ps(v,
                         _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(head), 16)));
  } else {
    return v;
  }
}

// Pairs (x[2i], x[2i + 1]) of n <= 32 floats of a contiguous row as 16 words, to bf16.
template <bool Tail = false>
PTO_BF16 __m512i pairs_of_row(const float* x, int64_t n) {
  const __mmask16 lo = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  const __mmask16 hi = n >= 32   ? __mmask16(0xffff)
                       : n <= 16 ? __mmask16(0)
                                 : __mmask16((1u << (n - 16)) - 1);
  const __m512 a = part_of<Tail>(_mm512_maskz_loadu_ps(lo, x)),
               b = part_of<Tail>(_mm512_maskz_loadu_ps(hi, x + 16));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
}

// Pairs (r0[j], r1[j]) of two rows at n <= 16 columns as 16 words, to bf16.
template <bool Tail = false>
PTO_BF16 __m512i pairs_of_rows(const float* r0, const float* r1, int64_t n) {
  const __mmask16 m = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
  const __m256i x =
      reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(part_of<Tail>(_mm512_maskz_loadu_ps(m, r0))));
  const __m256i y = r1 ? reinterpret_cast<__m256i>(
                             _mm512_cvtneps_pbh(part_of<Tail>(_mm512_maskz_loadu_ps(m, r1))))
                       : _mm256_setzero_si256();
  return _mm512_or_si512(_mm512_cvtepu16_epi32(x), _mm512_slli_epi32(_mm512_cvtepu16_epi32(y), 16));
}

// 16 pair words scattered down a panel: word i to dst[i * stride].
void scatter_words(__m512i v, int64_t count, float* dst, int64_t stride) {
  alignas(64) uint32_t w[16];
  _mm512_store_si512(w, v);
  for (int64_t i = 0; i < count; ++i) __builtin_memcpy(dst + i * stride, &w[i], 4);
}

// One A panel from mr <= 6 rows of A (lda apart), 32 values of K (16 steps) at a time: each row's
// pairs converted in one vector, then a 6 x 16 transpose of the words (as gemm_pack_a's).
// Rows past M read as zero pairs.
PTO_BF16 void pack_a_bf16_rows(const float* a, int64_t lda, int mr, int64_t k, float* dst) {
  static_assert(kMR == 6, "the bf16 A panels transpose 6 rows at a time");
  for (int64_t q = 0; q < k; q += 32) {
    const int64_t n = k - q < 32 ? k - q : 32, steps = (n + 1) / 2;
    __m512 row[kMR];
    for (int r = 0; r < kMR; ++r)
      row[r] =
          r < mr ? reinterpret_cast<__m512>(pairs_of_row(a + r * lda + q, n)) : _mm512_setzero_ps();
    float* d = dst + (q / 2) * kMR;
    if (steps == 16) {
      transpose_6x16(row, d);
    } else {  // the last steps: only as many as the panel holds
      alignas(64) float t[16 * kMR];
      transpose_6x16(row, t);
      __builtin_memcpy(d, t, static_cast<size_t>(steps * kMR) * sizeof(float));
    }
  }
}

// One A panel from a transposed A (K x M, a at its first column): the mr <= 6 values of rows
// 2p and 2p + 1 interleave into the pairs of step p, two steps (four rows of A) at a time:
// converted together, one word permute puts each step's 12 halves in order, one masked store.
PTO_BF16 void pack_a_bf16_trans(const float* a, int64_t lda, int mr, int64_t k, float* dst) {
  const __mmask8 cols = static_cast<__mmask8>((1u << mr) - 1);
  // Words of cvtne2ps(y, x): 0-7 row 2p, 8-15 row 2p + 2 (x), 16-23 row 2p + 1, 24-31 row 2p + 3.
  alignas(64) static constexpr uint16_t kOrder[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21,   // step p
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29};  // step p + 1
  const __m512i order = _mm512_load_si512(kOrder);
  auto row = [&](int64_t q) {
    return q < k ? _mm256_maskz_loadu_ps(cols, a + q * lda) : _mm256_setzero_ps();
  };
  const int64_t k2 = (k + 1) / 2;
  for (int64_t p = 0; p < k2; p += 2) {
    const int64_t q = 2 * p;
    const __m512 x = _mm512_insertf32x8(_mm512_castps256_ps512(row(q)), row(q + 2), 1);
    const __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(row(q + 1)), row(q + 3), 1);
    const __m512i w =
        _mm512_permutexvar_epi16(order, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(y, x)));
    const __mmask32 words = p + 1 < k2 ? 0xffffffu : 0xfffu;
    _mm512_mask_storeu_epi16(dst + p * kMR, words, w);
  }
}

// C[R x NV vectors] (=|+=) alpha * A_panel B_panel over k2 pair steps, VDPBF16PS: each step
// adds A[r, 2p] B[2p, j] + A[r, 2p + 1] B[2p + 1, j] to the fp32 accumulators.
template <int R, int NV>
PTO_BF16 void micro_bf16(int64_t k2, const float* a, const float* b, float* c, int64_t ldc,
                         int n_last, float alpha, bool accumulate, NextPanel next) {
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) __builtin_prefetch(c + r * ldc + v * kL, 1, 2);
  }
  __m512 s[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) s[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t p = 0; p < k2; ++p) {
    if (next.b && (p & ((int64_t{1} << next.shift) - 1)) == 0) {
      const float* nb = next.b + (p >> next.shift) * next.ld;
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) __builtin_prefetch(nb + v * kL, 0, 2);
    }
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_ps(b + v * kL));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_ps(a[r]));
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_dpbf16_ps(s[r][v], av, bv[v]);
    }
    a += kMR;
    b += kNR;
  }
  const __m512 va = _mm512_set1_ps(alpha);
  const __mmask16 tail = static_cast<__mmask16>((1u << n_last) - 1);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    float* row = c + r * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      __m512 x = alpha == 1.0f ? s[r][v] : _mm512_mul_ps(s[r][v], va);
      if (v < NV - 1 || n_last == kL) {
        if (accumulate) x = _mm512_add_ps(x, _mm512_loadu_ps(row + v * kL));
        _mm512_storeu_ps(row + v * kL, x);
      } else {
        if (accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(tail, row + v * kL));
        _mm512_mask_storeu_ps(row + v * kL, tail, x);
      }
    }
  }
}

using MicroBf16 = void (*)(int64_t, const float*, const float*, float*, int64_t, int, float, bool,
                           NextPanel);

template <int R, int NV>
void fill_bf16(MicroBf16 (*table)[kNV]) {
  table[R - 1][NV - 1] = &micro_bf16<R, NV>;
  if constexpr (NV > 1)
    fill_bf16<R, NV - 1>(table);
  else if constexpr (R > 1)
    fill_bf16<R - 1, kNV>(table);
}

struct MicroBf16Table {
  MicroBf16 fn[kMR][kNV];
  MicroBf16Table() { fill_bf16<kMR, kNV>(fn); }
};

#undef PTO_BF16

}  // namespace

void gemm_pack_a_bf16(const float* a, int64_t lda, bool trans, int64_t m, int64_t k, float* dst) {
  const int64_t k2 = (k + 1) / 2;
  for (int64_t i0 = 0; i0 < m; i0 += kMR, dst += k2 * kMR) {
    const int mr = static_cast<int>(m - i0 < kMR ? m - i0 : kMR);
    if (trans)
      pack_a_bf16_trans(a + i0, lda, mr, k, dst);
    else
      pack_a_bf16_rows(a + i0 * lda, lda, mr, k, dst);
  }
}

namespace {

template <bool Tail>
void pack_b_bf16(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst,
                 int64_t panel_stride, const int64_t* rows) {
  const int64_t k2 = (k + 1) / 2;
  for (int64_t j0 = 0; j0 < n; j0 += kNR, dst += panel_stride) {
    const int64_t nr = n - j0 < kNR ? n - j0 : kNR;
    if (trans) {  // B is N x K: column j of op(B) is row j of B, contiguous in k
      for (int64_t c = 0; c < kNR; ++c) {
        if (c >= nr) {
          for (int64_t p = 0; p < k2; ++p) dst[p * kNR + c] = 0.0f;
          continue;
        }
        const float* row = b + (j0 + c) * ldb;
        for (int64_t q = 0; q < k; q += 32) {
          const int64_t w = k - q < 32 ? k - q : 32;
          scatter_words(pairs_of_row<Tail>(row + q, w), (w + 1) / 2, dst + (q / 2) * kNR + c, kNR);
        }
      }
      continue;
    }
    // B is K x N: rows 2p and 2p + 1 interleave, 16 columns at a time.
    auto row = [&](int64_t q) { return b + (rows ? rows[q] : q * ldb) + j0; };
    for (int64_t p = 0; p < k2; ++p) {
      const float* r0 = row(2 * p);
      const float* r1 = 2 * p + 1 < k ? row(2 * p + 1) : nullptr;
      for (int64_t c = 0; c < kNR; c += kL) {
        const int64_t w = nr - c;
        const __m512i v = w > 0
                              ? pairs_of_rows<Tail>(r0 + c, r1 ? r1 + c : nullptr, w > kL ? kL : w)
                              : _mm512_setzero_si512();
        _mm512_storeu_si512(dst + p * kNR + c, v);
      }
    }
  }
}

}  // namespace

void gemm_pack_b_bf16(const float* b, int64_t ldb, bool trans, int64_t k, int64_t n, float* dst,
                      int64_t panel_stride, const int64_t* rows, bool tails) {
  if (tails)
    pack_b_bf16<true>(b, ldb, trans, k, n, dst, panel_stride, rows);
  else
    pack_b_bf16<false>(b, ldb, trans, k, n, dst, panel_stride, rows);
}

void gemm_macro_bf16(const MacroBlock& blk) {
  static const MicroBf16Table table;
  const int64_t np = (blk.n + kNR - 1) / kNR, mp = (blk.m + kMR - 1) / kMR;
  const int64_t as = blk.a_row_stride     ? blk.a_row_stride * kMR
                     : blk.a_panel_stride ? blk.a_panel_stride
                                          : blk.k * kMR;
  for (int64_t j = 0; j < np; ++j) {
    const int nj = static_cast<int>(blk.n - j * kNR < kNR ? blk.n - j * kNR : kNR);
    const float* bp = blk.b + j * blk.b_panel_stride;
    const int nv = (nj + kL - 1) / kL;
    const int n_last = nj - (nv - 1) * kL;
    NextPanel next;
    if (j + 1 < np || blk.b_after) {
      next.b = j + 1 < np ? bp + blk.b_panel_stride : blk.b_after;
      next.ld = kNR;
      while (next.shift < 4 && (int64_t{2} << next.shift) <= mp) ++next.shift;
    }
    const int64_t share = blk.k >> next.shift;
    for (int64_t i = 0; i < mp; ++i) {
      const int mi = static_cast<int>(blk.m - i * kMR < kMR ? blk.m - i * kMR : kMR);
      float* c = blk.c + i * kMR * blk.ldc + j * kNR;
      NextPanel nx = next;
      if (i * share >= blk.k) nx.b = nullptr;
      if (nx.b) nx.b += i * share * nx.ld;
      table.fn[mi - 1][nv - 1](blk.k, blk.a + i * as, bp, c, blk.ldc, n_last, blk.alpha,
                               blk.accumulate, nx);
      if (blk.epilogue)
        apply_epilogue(*blk.epilogue, c, blk.ldc, blk.m0 + i * kMR, mi, blk.n0 + j * kNR, nj);
    }
  }
}
#endif  // PTO_ISA_AVX512

}  // namespace pto::cpu::PTO_ISA_NS
