// The per-ISA loops of nbits.h, written once against simd.h's Vec. Included once by each of
// nbits_avx512.cpp, nbits_avx2.cpp and nbits_generic.cpp.
#include <algorithm>
#include <utility>

#include "backend/cpu/isa/simd.h"
#include "backend/cpu/nbits.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kL = Vec::kLanes;
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

  // The 16 bytes of a pair of k: lo = the codes of k, hi = those of k + 1, for the 16 columns.
  void pair(const uint8_t* s, Vec* lo, Vec* hi) const {
#if defined(PTO_ISA_AVX512)
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
    lo[0] = {_mm512_permutexvar_ps(v, table)};
    hi[0] = {_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table)};
#elif defined(PTO_ISA_AVX2)
    for (int h = 0; h < 2; ++h) {
      const __m256i v =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 8 * h)));
      lo[h] = {_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)))};
      hi[h] = {_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4))};
    }
#else
    for (int j = 0; j < kV; ++j) {
      lo[j] = {static_cast<float>(s[j] & 15)};
      hi[j] = {static_cast<float>(s[j] >> 4)};
    }
#endif
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

// R rows of A times panel p. One row alone gets two sets of accumulators (four FMA chains), so
// that the FMA latency does not bound it.
template <int R>
void gemv_rows(const NBitsPanels& w, int64_t p, const float* a, int64_t lda, const float* asum,
               const float* bias, float* y, int64_t ldy, int cols) {
  constexpr int C = R == 1 ? 2 : 1;
  const Decoder d;
  const uint8_t* codes = w.codes + p * w.kp * (kNBitsPanel / 2);
  const float* scales = w.scales + p * w.blocks * kNBitsPanel;
  const uint8_t* zeros = w.zeros + p * w.blocks * kNBitsPanel;
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
    const uint8_t* s = codes + b * pairs * kNBitsPanel;
    const float* ak = a + b * w.block;
    for (int64_t q = 0; q < pairs; q += C) {
      for (int c = 0; c < C; ++c) {
        Vec lo[kV], hi[kV];
        d.pair(s + (q + c) * kNBitsPanel, lo, hi);
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
    d.bytes(zeros + b * kNBitsPanel, z);
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

template <int... Rs>
void gemv_dispatch(std::integer_sequence<int, Rs...>, int rows, const NBitsPanels& w, int64_t p,
                   const float* a, int64_t lda, const float* asum, const float* bias, float* y,
                   int64_t ldy, int cols) {
  ((rows == Rs + 1 ? gemv_rows<Rs + 1>(w, p, a, lda, asum, bias, y, ldy, cols) : void()), ...);
}

}  // namespace

void nbits4_gemv(const NBitsPanels& w, int64_t p, const float* a, int64_t lda, const float* asum,
                 int64_t rows, const float* bias, float* y, int64_t ldy, int cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
    const int r = static_cast<int>(std::min<int64_t>(kMaxRows, rows - r0));
    gemv_dispatch(std::make_integer_sequence<int, kMaxRows>{}, r, w, p, a + r0 * lda, lda,
                  asum + r0 * w.blocks, bias, y + r0 * ldy, ldy, cols);
  }
}

void nbits4_dequantize(const NBitsPanels& w, int64_t p, int64_t k, float* out, int64_t ldo) {
  const Decoder d;
  const uint8_t* codes = w.codes + p * w.kp * (kNBitsPanel / 2);
  const float* scales = w.scales + p * w.blocks * kNBitsPanel;
  const uint8_t* zeros = w.zeros + p * w.blocks * kNBitsPanel;
  for (int64_t b = 0; b * w.block < k; ++b) {
    Vec z[kV], sc[kV];
    d.bytes(zeros + b * kNBitsPanel, z);
    for (int v = 0; v < kV; ++v) sc[v] = Vec::load(scales + b * kNBitsPanel + v * kL);
    const int64_t end = std::min(k, (b + 1) * w.block);
    for (int64_t q = b * w.block; q < end; q += 2) {
      Vec lo[kV], hi[kV];
      d.pair(codes + q / 2 * kNBitsPanel, lo, hi);
      // (code - zero) * scale, as onnxruntime and the reference dequantize.
      for (int v = 0; v < kV; ++v) {
        ((lo[v] - z[v]) * sc[v]).store(out + q * ldo + v * kL);
        if (q + 1 < end) ((hi[v] - z[v]) * sc[v]).store(out + (q + 1) * ldo + v * kL);
      }
    }
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
