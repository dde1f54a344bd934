// ConvTranspose's row loops, compiled once per ISA (conv_transpose_{avx512,avx2,generic}.cpp):
// the interleave of the sub-pixel form's phase rows (stride 2 with two-source permutes) and the
// col2im's strided adds.
#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/conv/conv_simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

// dst[2x] = a[x] + bias, dst[2x + 1] = b[x] + bias for x in [0, n): returns how many x it did (a
// multiple of the vector width; the caller does the rest).
inline int64_t zip2(const float* a, const float* b, int64_t n, float bias, float* dst) {
  int64_t x = 0;
#if defined(PTO_ISA_AVX512)
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  const __m512 vbias = _mm512_set1_ps(bias);
  for (; x + 16 <= n; x += 16) {
    const __m512 va = _mm512_add_ps(_mm512_loadu_ps(a + x), vbias);
    const __m512 vb = _mm512_add_ps(_mm512_loadu_ps(b + x), vbias);
    _mm512_storeu_ps(dst + 2 * x, _mm512_permutex2var_ps(va, lo, vb));
    _mm512_storeu_ps(dst + 2 * x + 16, _mm512_permutex2var_ps(va, hi, vb));
  }
#elif defined(PTO_ISA_AVX2)
  const __m256 vbias = _mm256_set1_ps(bias);
  for (; x + 8 <= n; x += 8) {
    const __m256 va = _mm256_add_ps(_mm256_loadu_ps(a + x), vbias);
    const __m256 vb = _mm256_add_ps(_mm256_loadu_ps(b + x), vbias);
    const __m256 l = _mm256_unpacklo_ps(va, vb), h = _mm256_unpackhi_ps(va, vb);
    _mm256_storeu_ps(dst + 2 * x, _mm256_permute2f128_ps(l, h, 0x20));
    _mm256_storeu_ps(dst + 2 * x + 8, _mm256_permute2f128_ps(l, h, 0x31));
  }
#else
  (void)a, (void)b, (void)n, (void)bias, (void)dst;
#endif
  return x;
}

}  // namespace

void interleave_phases(const float* const* src, int64_t s, int64_t n, float bias, float* dst) {
  int64_t x = s == 2 ? zip2(src[0], src[1], n / 2, bias, dst) : 0;
  for (; x * s < n; ++x)
    for (int64_t b = 0; b < s && x * s + b < n; ++b) dst[x * s + b] = src[b][x] + bias;
}

void col2im_row(const float* col, float* y, int64_t lo, int64_t hi, int64_t s, bool store,
                float bias) {
  constexpr int V = Vec::kLanes;
  if (store) {
    for (int64_t i = lo; i < hi; ++i) y[i * s] = col[i] + bias;
  } else if (s == 1) {
    int64_t i = lo;
    for (; i + V <= hi; i += V) (Vec::load(y + i) + Vec::load(col + i)).store(y + i);
    if (i < hi) {
      const int k = static_cast<int>(hi - i);
      (Vec::load(y + i, k) + Vec::load(col + i, k)).store(y + i, k);
    }
  } else if (s == 2) {  // a constant stride the compiler vectorises with permutes
    for (int64_t i = lo; i < hi; ++i) y[2 * i] += col[i];
  } else {
    for (int64_t i = lo; i < hi; ++i) y[i * s] += col[i];
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
