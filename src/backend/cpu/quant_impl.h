// The per-ISA loops of quant.h, written once against simd.h's Vec. Included once by each of
// quant_avx512.cpp, quant_avx2.cpp and quant_generic.cpp.
#include "backend/cpu/isa/simd.h"
#include "backend/cpu/quant.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kL = Vec::kLanes;

// The first n (<= kL) lanes of v, integers in [-128, 255], as bytes (two's complement for int8).
inline void store_bytes(VecI v, uint8_t* y, int n) {
#if defined(PTO_ISA_AVX512)
  _mm512_mask_cvtepi32_storeu_epi8(y, static_cast<__mmask16>((1u << n) - 1), v.v);
#elif defined(PTO_ISA_AVX2)
  // The low byte of each 32-bit lane, per 128-bit half, then the two halves' four bytes together.
  const __m256i pick =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i s = _mm256_shuffle_epi8(v.v, pick);
  const __m128i b = _mm_unpacklo_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  if (n == kL) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(y), b);
  } else {
    uint8_t t[16];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t), b);
    std::memcpy(y, t, static_cast<size_t>(n));
  }
#else
  if (n > 0) *y = static_cast<uint8_t>(v.v);
#endif
}

// n (<= kL) bytes from x as floats, zeros after.
inline Vec load_bytes(const uint8_t* x, bool is_signed, int n) {
#if defined(PTO_ISA_AVX512)
  const __m128i b = n == kL ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(x))
                            : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << n) - 1), x);
  return {_mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b))};
#elif defined(PTO_ISA_AVX2)
  int64_t t = 0;
  std::memcpy(&t, x, static_cast<size_t>(n));
  const __m128i b = _mm_cvtsi64_si128(t);
  return {_mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b))};
#else
  if (n <= 0) return Vec::zero();
  return Vec::set1(is_signed ? static_cast<float>(static_cast<int8_t>(*x))
                             : static_cast<float>(*x));
#endif
}

}  // namespace

void quantize_span(const float* x, int64_t n, QuantParams p, float nan_r, bool to_signed, void* y) {
  const Vec lo = Vec::set1(to_signed ? -128.0f : 0.0f), hi = Vec::set1(to_signed ? 127.0f : 255.0f);
  const Vec vn = Vec::set1(nan_r);
  auto* out = static_cast<uint8_t*>(y);
  Vec s = Vec::set1(p.scale[0]), z = Vec::set1(p.zp[0]);
  for (int64_t i = 0; i < n; i += kL) {
    const int w = static_cast<int>(n - i < kL ? n - i : kL);
    if (p.stride) {
      s = w == kL ? Vec::load(p.scale + i) : Vec::load(p.scale + i, w);
      z = w == kL ? Vec::load(p.zp + i) : Vec::load(p.zp + i, w);
    }
    const Vec v = w == kL ? Vec::load(x + i) : Vec::load(x + i, w);
    Vec r = round(v / s);
    r = select(is_nan(r), vn, r);
    r = min(max(r + z, lo), hi);
    store_bytes(to_int(r), out + i, w);
  }
}

void dequantize_span(const void* x, bool x_signed, int64_t n, QuantParams p, float* y) {
  const auto* in = static_cast<const uint8_t*>(x);
  Vec s = Vec::set1(p.scale[0]), z = Vec::set1(p.zp[0]);
  for (int64_t i = 0; i < n; i += kL) {
    const int w = static_cast<int>(n - i < kL ? n - i : kL);
    if (p.stride) {
      s = w == kL ? Vec::load(p.scale + i) : Vec::load(p.scale + i, w);
      z = w == kL ? Vec::load(p.zp + i) : Vec::load(p.zp + i, w);
    }
    const Vec r = (load_bytes(in + i, x_signed, w) - z) * s;
    if (w == kL)
      r.store(y + i);
    else
      r.store(y + i, w);
  }
}

void min_max_span(const float* x, int64_t n, float* mn, float* mx) {
  // Four vectors a step into four pairs of accumulators: one pair's min / max latency chain
  // held the loop to a third of the load rate (the serial range pass of a per-tensor
  // DynamicQuantizeMatMul).
  constexpr int kU = 4;
  Vec lo[kU], hi[kU];
  for (int u = 0; u < kU; ++u) lo[u] = hi[u] = Vec::zero();
  auto add = [&](int u, Vec v) {
    const Mask nan = is_nan(v);
    lo[u] = min(lo[u], select(nan, lo[u], v));
    hi[u] = max(hi[u], select(nan, hi[u], v));
  };
  int64_t i = 0;
  for (; i + kU * kL <= n; i += kU * kL)
    for (int u = 0; u < kU; ++u) add(u, Vec::load(x + i + u * kL));
  for (; i < n; i += kL) {
    const int w = static_cast<int>(n - i < kL ? n - i : kL);
    add(0, w == kL ? Vec::load(x + i) : Vec::load(x + i, w));  // zeros past the end
  }
  for (int u = 1; u < kU; ++u) lo[0] = min(lo[0], lo[u]), hi[0] = max(hi[0], hi[u]);
  *mn = reduce_min(lo[0]);
  *mx = reduce_max(hi[0]);
}

}  // namespace pto::cpu::PTO_ISA_NS
