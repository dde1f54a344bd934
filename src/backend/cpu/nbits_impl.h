// The per-ISA loops of nbits.h, written once against simd.h's Vec. Included once by each of
// nbits_avx512.cpp, nbits_avx2.cpp and nbits_generic.cpp.
#include <algorithm>
#include <cstring>
#include <utility>

#include "backend/cpu/isa/simd.h"
#include "backend/cpu/nbits.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kL = Vec::kLanes;
// Software prefetch this far ahead in a panel's stream of codes (and of scales): the panels
// stream from memory once a call, and the hardware prefetcher alone left a decoding step at
// 4096 x 4096 0.84 ms (float32 form) / 0.52 ms (int8 form) on one thread, 0.69 / 0.48 with it
// (bench/nbits.py, Zen 4; 2048 bytes: 0.69 / 0.49).
constexpr int64_t kPrefetchBytes = 4096;

// The lines kPrefetchBytes past a block's `bytes` of codes at s, and past its scales.
inline void prefetch_ahead(const uint8_t* s, int64_t bytes, const float* scales) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(s + kPrefetchBytes + off);
  __builtin_prefetch(scales + kPrefetchBytes / 4);
}
constexpr int kV = kNBitsPanel / kL;  // vectors across a panel
// Rows of A a panel's codes are decoded once for: the accumulators of that many rows stay in
// registers (AVX2 has 16 of them).
#if defined(PTO_ISA_AVX2)
constexpr int kMaxRows = 2;
#else
constexpr int kMaxRows = 8;
#endif

// Codes and zero points to floats.
struct Decoder {
#if defined(PTO_ISA_AVX512)
  // 0..15: VPERMPS reads the low 4 bits of each index, so a code needs no masking.
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif

  // A pair of k's codes for the 16 columns, lo = k's, hi = k + 1's: 16 bytes of two 4-bit codes
  // (low nibble k), or 32 bytes of 8-bit codes (k's 16, then k + 1's).
  template <int Bits>
  void pair(const uint8_t* s, Vec* lo, Vec* hi) const {
#if defined(PTO_ISA_AVX512)
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    if constexpr (Bits == 4) {
      lo[0] = {_mm512_permutexvar_ps(v, table)};
      hi[0] = {_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table)};
    } else {
      lo[0] = {_mm512_cvtepi32_ps(v)};
      hi[0] = {_mm512_cvtepi32_ps(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16))))};
    }
#elif defined(PTO_ISA_AVX2)
    for (int h = 0; h < 2; ++h) {
      if constexpr (Bits == 4) {
        const __m256i v =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8 * h)));
        lo[h] = {_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)))};
        hi[h] = {_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4))};
      } else {
        lo[h] = {_mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8 * h))))};
        hi[h] = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 16 + 8 * h))))};
      }
    }
#else
    for (int j = 0; j < kV; ++j) {
      lo[j] = {static_cast<float>(Bits == 4 ? s[j] & 15 : s[j])};
      hi[j] = {static_cast<float>(Bits == 4 ? s[j] >> 4 : s[16 + j])};
    }
#endif
  }

  // Block b's 16 zero points of panel p as floats: bytes, or the file's floats.
  void zero_points(const NBitsPanels& w, int64_t p, int64_t b, Vec* z) const {
    const int64_t at = (p * w.blocks + b) * kNBitsPanel;
    if (w.float_zeros) {
      for (int v = 0; v < kV; ++v) z[v] = Vec::load(w.float_zeros + at + v * kL);
      return;
    }
    if (!w.zeros) {
      for (int v = 0; v < kV; ++v) z[v] = Vec::set1(w.zero);
      return;
    }
    bytes(w.zeros + at, z);
  }

  // 16 zero points (bytes) as floats.
  void bytes(const uint8_t* s, Vec* z) const {
#if defined(PTO_ISA_AVX512)
    z[0] = {_mm512_cvtepi32_ps(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))))};
#elif defined(PTO_ISA_AVX2)
    for (int h = 0; h < 2; ++h)
      z[h] = {_mm256_cvtepi32_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8 * h))))};
#else
    for (int j = 0; j < kV; ++j) z[j] = {static_cast<float>(s[j])};
#endif
  }
};

// R rows of A times panel p of `Bits`-bit codes. One row alone gets two sets of accumulators (four
// FMA chains), so that the FMA latency does not bound it.
template <int R, int Bits>
void gemv_rows(const NBitsPanels& w, int64_t p, const float* a, int64_t lda, const float* asum,
               const float* bias, float* y, int64_t ldy, int cols) {
  constexpr int C = R == 1 ? 2 : 1;
  constexpr int64_t kPair = 2 * kNBitsPanel * Bits / 8;  // bytes of a pair of k
  const Decoder d;
  const uint8_t* codes = w.codes + p * w.kp * kNBitsPanel * Bits / 8;
  const float* scales = w.scales + p * w.blocks * kNBitsPanel;
  Vec out[R][kV];
  for (int v = 0; v < kV; ++v) {
    const int n = std::clamp(cols - v * kL, 0, kL);
    const Vec b0 = bias ? Vec::load(bias + v * kL, n) : Vec::zero();
    for (int r = 0; r < R; ++r) out[r][v] = b0;
  }
  const int64_t pairs = w.block / 2;  // a multiple of 8
  for (int64_t b = 0; b < w.blocks; ++b) {
    Vec acc[R][C][2][kV];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        for (int v = 0; v < kV; ++v) acc[r][c][0][v] = acc[r][c][1][v] = Vec::zero();
    const uint8_t* s = codes + b * pairs * kPair;
    prefetch_ahead(s, pairs * kPair, scales + b * kNBitsPanel);
    const float* ak = a + b * w.block;
    for (int64_t q = 0; q < pairs; q += C) {
      for (int c = 0; c < C; ++c) {
        Vec lo[kV], hi[kV];
        d.pair<Bits>(s + (q + c) * kPair, lo, hi);
        for (int r = 0; r < R; ++r) {
          const Vec a0 = Vec::set1(ak[r * lda + 2 * (q + c)]);
          const Vec a1 = Vec::set1(ak[r * lda + 2 * (q + c) + 1]);
          for (int v = 0; v < kV; ++v) {
            acc[r][c][0][v] = fma(a0, lo[v], acc[r][c][0][v]);
            acc[r][c][1][v] = fma(a1, hi[v], acc[r][c][1][v]);
          }
        }
      }
    }
    Vec z[kV], sc[kV];
    d.zero_points(w, p, b, z);
    for (int v = 0; v < kV; ++v) sc[v] = Vec::load(scales + b * kNBitsPanel + v * kL);
    for (int r = 0; r < R; ++r) {
      const Vec sum_a = Vec::set1(asum[r * w.blocks + b]);
      for (int v = 0; v < kV; ++v) {
        Vec dot = acc[r][0][0][v] + acc[r][0][1][v];
        if constexpr (C == 2) dot = dot + (acc[r][1][0][v] + acc[r][1][1][v]);
        out[r][v] = fma(sc[v], fnma(z[v], sum_a, dot), out[r][v]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) {
      const int n = std::clamp(cols - v * kL, 0, kL);
      if (n == kL)
        out[r][v].store(y + r * ldy + v * kL);
      else if (n > 0)
        out[r][v].store(y + r * ldy + v * kL, n);
    }
}

template <int Bits, int... Rs>
void gemv_dispatch(std::integer_sequence<int, Rs...>, int rows, const NBitsPanels& w, int64_t p,
                   const float* a, int64_t lda, const float* asum, const float* bias, float* y,
                   int64_t ldy, int cols) {
  ((rows == Rs + 1 ? gemv_rows<Rs + 1, Bits>(w, p, a, lda, asum, bias, y, ldy, cols) : void()),
   ...);
}

#if defined(PTO_ISA_AVX512)
// acc + the sums of four products of u8's unsigned bytes and s8's signed ones, per 32-bit lane
// (AVX512_VNNI: the caller checked the CPU has it).
inline __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
  asm("vpdpbusd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(u8), [b] "v"(s8));
  return acc;
}

int32_t four_bytes(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// R quantized rows of A times panel p, in the int8 form's layout of `Bits`-bit codes.
template <int R, int Bits>
void gemv_i8_rows(const NBitsPanels& w, int64_t p, const int8_t* aq, int64_t ldq,
                  const float* a_scale, const float* qsum, const float* bias, float* y, int64_t ldy,
                  int cols) {
  constexpr int C = R == 1 ? 2 : 1;                       // one row alone: two sets of accumulators
  constexpr int64_t kGroup = 8 * kNBitsPanel * Bits / 8;  // bytes of a group of 8 k
  const Decoder d;
  const uint8_t* codes = w.codes + p * w.kp * kNBitsPanel * Bits / 8;
  const float* scales = w.scales + p * w.blocks * kNBitsPanel;
  const __m512i nibble = _mm512_set1_epi8(0x0f);
  const __mmask16 tail = static_cast<__mmask16>((1u << cols) - 1);
  Vec out[R];
  const Vec b0 = bias ? Vec{_mm512_maskz_loadu_ps(tail, bias)} : Vec::zero();
  for (int r = 0; r < R; ++r) out[r] = b0;
  const int64_t groups = w.block / 8;  // of 8 k: a power of 2, at least 2
  for (int64_t b = 0; b < w.blocks; ++b) {
    __m512i acc[R][C][2];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_si512();
    const uint8_t* s = codes + b * groups * kGroup;
    prefetch_ahead(s, groups * kGroup, scales + b * kNBitsPanel);
    const int8_t* ab = aq + b * w.block;
    for (int64_t g = 0; g < groups; g += C) {
      for (int c = 0; c < C; ++c) {
        // The bytes of k..k+3 (lo) and k+4..k+7 (hi), four to a column's lane: two nibbles of
        // one byte (4-bit), or two vectors (8-bit).
        __m512i lo, hi;
        if constexpr (Bits == 4) {
          const __m512i v = _mm512_loadu_si512(s + (g + c) * kGroup);
          lo = _mm512_and_si512(v, nibble);
          hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
        } else {
          lo = _mm512_loadu_si512(s + (g + c) * kGroup);
          hi = _mm512_loadu_si512(s + (g + c) * kGroup + 64);
        }
        for (int r = 0; r < R; ++r) {
          const int8_t* a8 = ab + r * ldq + 8 * (g + c);
          acc[r][c][0] = dpbusd(acc[r][c][0], lo, _mm512_set1_epi32(four_bytes(a8)));
          acc[r][c][1] = dpbusd(acc[r][c][1], hi, _mm512_set1_epi32(four_bytes(a8 + 4)));
        }
      }
    }
    Vec z[1];
    d.zero_points(w, p, b, z);
    const Vec sc = Vec::load(scales + b * kNBitsPanel);
    for (int r = 0; r < R; ++r) {
      __m512i dot = _mm512_add_epi32(acc[r][0][0], acc[r][0][1]);
      if constexpr (C == 2)
        dot = _mm512_add_epi32(dot, _mm512_add_epi32(acc[r][1][0], acc[r][1][1]));
      // Integers below 2^24 (|dot| <= 15 * 127 * block_size for block_size <= 4096, 255 * 127 *
      // block_size for 512): exact floats.
      const Vec t = fnma(z[0], Vec::set1(qsum[r * w.blocks + b]), Vec{_mm512_cvtepi32_ps(dot)});
      out[r] = fma(sc * Vec::set1(a_scale[r * w.blocks + b]), t, out[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r].store(y + r * ldy, cols);
}

template <int Bits, int... Rs>
void gemv_i8_dispatch(std::integer_sequence<int, Rs...>, int rows, const NBitsPanels& w, int64_t p,
                      const int8_t* aq, int64_t ldq, const float* a_scale, const float* qsum,
                      const float* bias, float* y, int64_t ldy, int cols) {
  ((rows == Rs + 1 ? gemv_i8_rows<Rs + 1, Bits>(w, p, aq, ldq, a_scale, qsum, bias, y, ldy, cols)
                   : void()),
   ...);
}
#endif

}  // namespace

void nbits_gemv(const NBitsPanels& w, int64_t p, const float* a, int64_t lda, const float* asum,
                int64_t rows, const float* bias, float* y, int64_t ldy, int cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int r = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
    if (w.bits == 4)
      gemv_dispatch<4>(std::make_integer_sequence<int, kMaxRows>{}, r, w, p, a + r0 * lda, lda,
                       asum + r0 * w.blocks, bias, y + r0 * ldy, ldy, cols);
    else
      gemv_dispatch<8>(std::make_integer_sequence<int, kMaxRows>{}, r, w, p, a + r0 * lda, lda,
                       asum + r0 * w.blocks, bias, y + r0 * ldy, ldy, cols);
  }
}

void nbits_quantize_row(const float* a, int64_t k, int64_t block, int64_t blocks, int8_t* q,
                        float* a_scale, float* qsum) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* x = a + b * block;
    const int64_t n = std::clamp<int64_t>(k - b * block, 0, block);
    Vec m = Vec::zero();
    int64_t i = 0;
    for (; i + kL <= n; i += kL) m = max(m, abs(Vec::load(x + i)));
    float amax = reduce_max(m);
    for (; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    // onnxruntime's form: scale max|a| / 127, the values multiplied by its inverse.
    const float inv = amax != 0.0f ? 127.0f / amax : 0.0f;
    a_scale[b] = amax / 127.0f;
    const Vec vinv = Vec::set1(inv);
    Vec sum = Vec::zero();
    i = 0;
#if defined(PTO_ISA_AVX512)
    for (; i + kL <= n; i += kL) {
      const Vec r = round(Vec::load(x + i) * vinv);
      sum = sum + r;
      _mm512_mask_cvtepi32_storeu_epi8(q + b * block + i, 0xffff, to_int(r).v);
    }
#endif
    float tail = 0.0f;
    for (; i < n; ++i) {
      const float r = std::nearbyint(x[i] * inv);
      tail += r;
      q[b * block + i] = static_cast<int8_t>(r);
    }
    std::fill(q + b * block + n, q + (b + 1) * block, int8_t{0});
    qsum[b] = reduce_add(sum) + tail;  // integers: exact
    (void)vinv;
  }
}

void nbits_gemv_i8(const NBitsPanels& w, int64_t p, const int8_t* aq, int64_t ldq,
                   const float* a_scale, const float* qsum, int64_t rows, const float* bias,
                   float* y, int64_t ldy, int cols) {
#if defined(PTO_ISA_AVX512)
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int r = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
    const auto rows_seq = std::make_integer_sequence<int, kMaxRows>{};
    if (w.bits == 4)
      gemv_i8_dispatch<4>(rows_seq, r, w, p, aq + r0 * ldq, ldq, a_scale + r0 * w.blocks,
                          qsum + r0 * w.blocks, bias, y + r0 * ldy, ldy, cols);
    else
      gemv_i8_dispatch<8>(rows_seq, r, w, p, aq + r0 * ldq, ldq, a_scale + r0 * w.blocks,
                          qsum + r0 * w.blocks, bias, y + r0 * ldy, ldy, cols);
  }
#else
  // The same integer dot products one at a time (a machine without VNNI in the AVX-512 kernels
  // takes the float32 form; this runs only when the ISA was switched after compiling).
  const uint8_t* codes = w.codes + p * w.kp * kNBitsPanel * w.bits / 8;
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) {
      float out = bias ? bias[j] : 0.0f;
      for (int64_t b = 0; b < w.blocks; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * w.block; k < (b + 1) * w.block; ++k) {
          const int32_t code = w.bits == 4
                                   ? (codes[k / 8 * 64 + j * 4 + k % 4] >> (k % 8 / 4 * 4)) & 15
                                   : codes[k / 4 * 64 + j * 4 + k % 4];
          dot += code * aq[r * ldq + k];
        }
        const int64_t at = (p * w.blocks + b) * kNBitsPanel + j;
        const float t =
            static_cast<float>(dot) -
            (w.zeros ? static_cast<float>(w.zeros[at]) : w.zero) * qsum[r * w.blocks + b];
        out += w.scales[at] * a_scale[r * w.blocks + b] * t;
      }
      y[r * ldy + j] = out;
    }
#endif
}

}  // namespace pto::cpu::PTO_ISA_NS
