// The per-ISA loops of quant.h, written once against simd.h's Vec. Included once by each of
// quant_avx512.cpp, quant_avx2.cpp and quant_generic.cpp.
#include "backend/cpu/conv/conv_simd.h"
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

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
// The 2 kL bytes at s as kL 16-bit pairs, each zero-extended to a 32-bit lane (the first n bytes
// only, zeros after: AVX-512).
inline VecI load_pairs(const uint8_t* s) {
#if defined(PTO_ISA_AVX512)
  return {_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)))};
#else
  return {_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)))};
#endif
}
#if defined(PTO_ISA_AVX512)
inline VecI load_pairs(const uint8_t* s, int n) {
  return {_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi8(static_cast<__mmask32>((1u << n) - 1), s))};
}
#endif

// Byte kB (0: low, 1: high) of each pair as an int32, sign-extended for int8.
template <int kB>
inline VecI byte_of_pairs(VecI pairs, bool is_signed) {
  if (is_signed) return shift_right_arith<24>(shift_left<24 - 8 * kB>(pairs));
  return kB ? shift_right<8>(pairs) : pairs & set1_int(0xff);
}
#endif

// d[i] = float(s[i * stride]) - zp for i in [0, n), s uint8 or int8.
inline void widen_strided(float* d, const uint8_t* s, int64_t n, int64_t stride, bool is_signed,
                          float zp) {
  const Vec z = Vec::set1(zp);
  int64_t i = 0;
  if (stride == 1) {
    for (; i < n; i += kL) {
      const int w = static_cast<int>(n - i < kL ? n - i : kL);
      const Vec v = load_bytes(s + i, is_signed, w) - z;
      if (w == kL)
        v.store(d + i);
      else
        v.store(d + i, w);
    }
    return;
  }
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
  // The even bytes of 2 * kL (byte_of_pairs). The load's last byte belongs to element i + kL, so
  // one must follow; on AVX-512 the last (at most kL) elements too, through a masked load of their
  // 2 w - 1 bytes.
  for (; stride == 2 && i < n; i += kL) {
    const int w = static_cast<int>(n - i < kL ? n - i : kL);
#if defined(PTO_ISA_AVX512)
    const VecI pairs =
        w == kL && i + kL < n ? load_pairs(s + 2 * i) : load_pairs(s + 2 * i, 2 * w - 1);
#else
    if (i + kL >= n) break;
    const VecI pairs = load_pairs(s + 2 * i);
#endif
    const Vec v = to_float(byte_of_pairs<0>(pairs, is_signed)) - z;
    w == kL ? v.store(d + i) : v.store(d + i, w);
  }
#endif
  for (; i < n; ++i) {
    const uint8_t v = s[i * stride];
    d[i] = (is_signed ? static_cast<float>(static_cast<int8_t>(v)) : static_cast<float>(v)) - zp;
  }
}

// ---- byte transposes ----

// Transposes the 8 x 8 bytes held in w (word k = row k, byte q = column q, little-endian): word q
// becomes column q. Three rounds of swapping half-blocks between words 4, 2 and 1 apart.
inline void transpose8x8(uint64_t w[8]) {
  auto swap = [&](int a, int b, int shift, uint64_t mask) {
    const uint64_t t = ((w[a] >> shift) ^ w[b]) & mask;
    w[b] ^= t;
    w[a] ^= t << shift;
  };
  for (int k = 0; k < 4; ++k) swap(k, k + 4, 32, 0x00000000FFFFFFFFull);
  for (int k : {0, 1, 4, 5}) swap(k, k + 2, 16, 0x0000FFFF0000FFFFull);
  for (int k : {0, 2, 4, 6}) swap(k, k + 1, 8, 0x00FF00FF00FF00FFull);
}

#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
// unpack<S>(a, b, hi): the low or high halves of each 128-bit lane of a and b interleaved in units
// of 2^S bytes, for each vector width.
#define PTO_BYTE_UNPACK(V, P)                                                              \
  template <int S>                                                                         \
  inline V unpack(V a, V b, bool hi) {                                                     \
    if constexpr (S == 0) return hi ? P##_unpackhi_epi8(a, b) : P##_unpacklo_epi8(a, b);   \
    if constexpr (S == 1) return hi ? P##_unpackhi_epi16(a, b) : P##_unpacklo_epi16(a, b); \
    if constexpr (S == 2) return hi ? P##_unpackhi_epi32(a, b) : P##_unpacklo_epi32(a, b); \
    if constexpr (S == 3) return hi ? P##_unpackhi_epi64(a, b) : P##_unpacklo_epi64(a, b); \
  }
PTO_BYTE_UNPACK(__m128i, _mm)
PTO_BYTE_UNPACK(__m256i, _mm256)
#if defined(PTO_ISA_AVX512)
PTO_BYTE_UNPACK(__m512i, _mm512)
#endif
#undef PTO_BYTE_UNPACK

// Register v[r] row r of a 16 x 16 byte tile in each 128-bit lane. Round S interleaves the
// registers 2^S apart in units of 2^S bytes; after the four, column c of the tile (as a row) is in
// register kRev[c] (c's four bits reversed), in the same lane.
constexpr int kRev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

template <int S, class V>
inline void unpack_round(V v[16]) {
  for (int i = 0; i < 16; ++i)
    if (!((i >> S) & 1)) {
      const V lo = unpack<S>(v[i], v[i | 1 << S], false);
      v[i | 1 << S] = unpack<S>(v[i], v[i | 1 << S], true);
      v[i] = lo;
    }
}

template <class V>
inline void transpose16_lanes(V v[16]) {
  unpack_round<0>(v);
  unpack_round<1>(v);
  unpack_round<2>(v);
  unpack_round<3>(v);
}

// Lane l of the result: the 16 bytes at p + l * s (rows 16 apart), and whole-vector stores.
inline __m128i load_lanes(__m128i, const uint8_t* p, int64_t) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m256i load_lanes(__m256i, const uint8_t* p, int64_t s) {
  return _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + s),
                             reinterpret_cast<const __m128i*>(p));
}
inline void store_vec(uint8_t* p, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}
inline void store_vec(uint8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
#if defined(PTO_ISA_AVX512)
inline __m512i load_lanes(__m512i, const uint8_t* p, int64_t s) {
  const __m512i lo = _mm512_castsi256_si512(load_lanes(__m256i{}, p, s));
  return _mm512_inserti64x4(lo, load_lanes(__m256i{}, p + 2 * s, s), 1);
}
inline void store_vec(uint8_t* p, __m512i v) {
  _mm512_storeu_si512(p, v);
}
#endif

// 16 * lanes rows by 16 columns from x to y transposed: lane l of register k holds row
// 16 l + k, so after the in-lane 16 x 16 transposes each column is one register, stored whole
// (64 consecutive bytes of a y row on AVX-512: one cache line, one store).
template <class V>
inline void transpose_block16(const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy) {
  V v[16];
  for (int k = 0; k < 16; ++k) v[k] = load_lanes(V{}, x + k * ldx, 16 * ldx);
  transpose16_lanes(v);
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) store_vec(y + c * ldy, v[kRev[c]]);
}

// nr (< 16) rows of nc (<= 16) bytes, or 16 rows of nc < 16: one 16 x 16 tile, missing rows read
// as zeros and missing columns not written (masked on AVX-512, through a buffer on AVX2).
inline void transpose_edge16(const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy, int nr,
                             int nc) {
  __m128i v[16];
  for (int r = 0; r < 16; ++r) {
    if (r >= nr) {
      v[r] = _mm_setzero_si128();
      continue;
    }
#if defined(PTO_ISA_AVX512)
    v[r] = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << nc) - 1), x + r * ldx);
#else
    uint8_t t[16] = {};
    std::memcpy(t, x + r * ldx, static_cast<size_t>(nc));
    v[r] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t));
#endif
  }
  transpose16_lanes(v);
  for (int c = 0; c < nc; ++c) {
#if defined(PTO_ISA_AVX512)
    _mm_mask_storeu_epi8(y + c * ldy, static_cast<__mmask16>((1u << nr) - 1), v[kRev[c]]);
#else
    uint8_t t[16];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(t), v[kRev[c]]);
    std::memcpy(y + c * ldy, t, static_cast<size_t>(nr));
#endif
  }
}
#endif

// The two stride phases of a stride-2 row from one pass over its bytes: de[i] = float(s[2 i]) - zp
// for i < ne and do_[i] = float(s[2 i + 1]) - zp for i < no, each 32 (AVX-512; 16 on AVX2) bytes
// loaded once for both (each phase apart loads every byte twice); the rest as widen_strided.
inline void widen_pairs(float* de, float* do_, const uint8_t* s, int64_t ne, int64_t no,
                        bool is_signed, float zp) {
  int64_t i = 0;
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
  const Vec z = Vec::set1(zp);
  for (; i + kL <= ne && i + kL <= no; i += kL) {
    const VecI pairs = load_pairs(s + 2 * i);
    (to_float(byte_of_pairs<0>(pairs, is_signed)) - z).store(de + i);
    (to_float(byte_of_pairs<1>(pairs, is_signed)) - z).store(do_ + i);
  }
#endif
  widen_strided(de + i, s + 2 * i, ne - i, 2, is_signed, zp);
  widen_strided(do_ + i, s + 2 * i + 1, no - i, 2, is_signed, zp);
}

}  // namespace

void depthwise_pad_bytes(const DepthwisePlane& p, const uint8_t* x, bool x_signed, float zp,
                         float* padded) {
  // Padded rows [top, bottom) hold input rows, the others zeros; each input row reads the same
  // span [lo, hi) of each stride phase, zeros around it.
  const int64_t top = p.ph < p.rows ? p.ph : p.rows;
  const int64_t bottom = p.ph + p.ih < p.rows ? p.ph + p.ih : p.rows;
  fill_zero(padded, top * p.row_len);
  fill_zero(padded + bottom * p.row_len, (p.rows - bottom) * p.row_len);
  // Stride 2: phase q's span starts at input column 2 lo[q] + q - pw, and those of the two phases
  // are always one byte apart (lo[1] = lo[0] or lo[0] - 1), so one pass over the row fills both.
  int64_t lo[2] = {0, 0}, hi[2] = {0, 0}, start[2] = {0, 0};
  for (int64_t q = 0; q < p.sw && p.sw == 2; ++q) {
    valid_span(0, p.phase_len, p.iw, p.sw, q - p.pw, &lo[q], &hi[q]);
    start[q] = lo[q] * 2 + q - p.pw;
  }
  const int first = start[1] < start[0] ? 1 : 0;  // the phase whose span starts first
  const bool paired =
      p.sw == 2 && start[1 - first] == start[first] + 1 && hi[0] > lo[0] && hi[1] > lo[1];
  for (int64_t q = 0; q < p.sw; ++q) {
    int64_t l, h;
    valid_span(0, p.phase_len, p.iw, p.sw, q - p.pw, &l, &h);
    const uint8_t* src = x + l * p.sw + q - p.pw;
    for (int64_t r = top; r < bottom; ++r) {
      float* d = padded + r * p.row_len + q * p.phase_len;
      fill_zero(d, l);
      if (!paired) widen_strided(d + l, src + (r - p.ph) * p.iw, h - l, p.sw, x_signed, zp);
      fill_zero(d + h, p.phase_len - h);
    }
  }
  if (!paired) return;
  const int second = 1 - first;
  for (int64_t r = top; r < bottom; ++r) {
    float* d = padded + r * p.row_len;
    widen_pairs(d + first * p.phase_len + lo[first], d + second * p.phase_len + lo[second],
                x + (r - p.ph) * p.iw + start[first], hi[first] - lo[first],
                hi[second] - lo[second], x_signed, zp);
  }
}

void depthwise_row_nhwc(const ConvWindow& g, int64_t c, const float* x, const float* w, int64_t oy,
                        float* y) {
  // The kernel rows inside the input, and the output pixels [ox0, ox1) whose every tap is inside
  // it along x: those run kB at a time, each weight loaded once for kB independent sums.
  constexpr int kB = 4;
  int64_t ky0 = 0, ky1 = 0, ox0 = 0, ox1 = 0;
  valid_span(0, g.kh, g.ih, g.dh, oy * g.sh - g.ph, &ky0, &ky1);
  valid_span(0, g.ow, g.iw - (g.kw - 1) * g.dw, g.sw, -g.pw, &ox0, &ox1);
  for (int64_t c0 = 0; c0 < c; c0 += kL) {
    const int n = static_cast<int>(c - c0 < kL ? c - c0 : kL);
    auto ld = [n](const float* p) { return n == kL ? Vec::load(p) : Vec::load(p, n); };
    auto st = [n](Vec v, float* p) { n == kL ? v.store(p) : v.store(p, n); };
    auto pixel = [&](int64_t ox) {
      Vec s = Vec::zero();
      for (int64_t ky = ky0; ky < ky1; ++ky) {
        const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
          if (ix < 0 || ix >= g.iw) continue;
          s = fma(ld(x + (iy * g.iw + ix) * c + c0), ld(w + (ky * g.kw + kx) * c + c0), s);
        }
      }
      st(s, y + ox * c + c0);
    };
    int64_t ox = 0;
    for (; ox < ox0; ++ox) pixel(ox);
    for (; ox + kB <= ox1; ox += kB) {
      Vec s[kB];
      for (int j = 0; j < kB; ++j) s[j] = Vec::zero();
      for (int64_t ky = ky0; ky < ky1; ++ky) {
        const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
        const float* xr = x + (iy * g.iw + ox * g.sw - g.pw) * c + c0;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const Vec wt = ld(w + (ky * g.kw + kx) * c + c0);
          const float* xt = xr + kx * g.dw * c;
#pragma GCC unroll 4
          for (int j = 0; j < kB; ++j) s[j] = fma(ld(xt + j * g.sw * c), wt, s[j]);
        }
      }
      for (int j = 0; j < kB; ++j) st(s[j], y + (ox + j) * c + c0);
    }
    for (; ox < g.ow; ++ox) pixel(ox);
  }
}

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

void float_to_s32(const float* x, int64_t n, int32_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int32_t>(x[i]);  // vectorized by the compiler
}

void transpose_s32(const int32_t* x, int64_t ldx, int32_t* y, int64_t ldy, int64_t rows,
                   int64_t cols) {
  int64_t re = 0, qe = 0;
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
  re = rows / 8 * 8;
  qe = cols / 8 * 8;
  int64_t r16 = 0, q16 = 0;  // the 16 x 16 tiles' part (AVX-512)
#if defined(PTO_ISA_AVX512)
  r16 = rows / 16 * 16;
  q16 = cols / 16 * 16;
  for (int64_t q = 0; q < q16; q += 16)
    for (int64_t r = 0; r < r16; r += 16) {
      __m512i v[16], t[4];
      for (int k = 0; k < 16; ++k) v[k] = _mm512_loadu_si512(x + (r + k) * ldx + q);
      // Each group of 4 rows transposed as 4 x 4 blocks in every 128-bit lane (register 4 g + j
      // then holds, in lane l, column 4 l + j of rows 4 g..4 g + 3), then for each j the lanes of
      // the four groups' registers transposed as a 4 x 4 block of lanes: register l is column
      // 4 l + j, rows r..r + 15 in order.
      for (int g = 0; g < 16; g += 4) {
        t[0] = _mm512_unpacklo_epi32(v[g], v[g + 1]);
        t[1] = _mm512_unpackhi_epi32(v[g], v[g + 1]);
        t[2] = _mm512_unpacklo_epi32(v[g + 2], v[g + 3]);
        t[3] = _mm512_unpackhi_epi32(v[g + 2], v[g + 3]);
        v[g] = _mm512_unpacklo_epi64(t[0], t[2]);
        v[g + 1] = _mm512_unpackhi_epi64(t[0], t[2]);
        v[g + 2] = _mm512_unpacklo_epi64(t[1], t[3]);
        v[g + 3] = _mm512_unpackhi_epi64(t[1], t[3]);
      }
      for (int j = 0; j < 4; ++j) {
        const __m512i p0 = _mm512_shuffle_i32x4(v[j], v[4 + j], 0x44);
        const __m512i p1 = _mm512_shuffle_i32x4(v[j], v[4 + j], 0xee);
        const __m512i p2 = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0x44);
        const __m512i p3 = _mm512_shuffle_i32x4(v[8 + j], v[12 + j], 0xee);
        _mm512_storeu_si512(y + (q + j) * ldy + r, _mm512_shuffle_i32x4(p0, p2, 0x88));
        _mm512_storeu_si512(y + (q + 4 + j) * ldy + r, _mm512_shuffle_i32x4(p0, p2, 0xdd));
        _mm512_storeu_si512(y + (q + 8 + j) * ldy + r, _mm512_shuffle_i32x4(p1, p3, 0x88));
        _mm512_storeu_si512(y + (q + 12 + j) * ldy + r, _mm512_shuffle_i32x4(p1, p3, 0xdd));
      }
    }
#endif
  // 8 x 8 tiles outside those.
  for (int64_t q = 0; q < qe; q += 8)
    for (int64_t r = (q < q16 ? r16 : 0); r < re; r += 8) {
      __m256i v[8], t[8];
      for (int k = 0; k < 8; ++k)
        v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + (r + k) * ldx + q));
      // Pairs of rows interleaved by 32 bits, then by 64 bits, then the 128-bit halves swapped.
      for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_epi32(v[k], v[k + 1]);
        t[k + 1] = _mm256_unpackhi_epi32(v[k], v[k + 1]);
      }
      for (int k = 0; k < 8; k += 4) {
        v[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);
        v[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);
        v[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);
        v[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);
      }
      for (int k = 0; k < 4; ++k) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (q + k) * ldy + r),
                            _mm256_permute2x128_si256(v[k], v[k + 4], 0x20));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (q + k + 4) * ldy + r),
                            _mm256_permute2x128_si256(v[k], v[k + 4], 0x31));
      }
    }
#endif
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = (r < re ? qe : 0); q < cols; ++q) y[q * ldy + r] = x[r * ldx + q];
}

void transpose_bytes(const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy, int64_t rows,
                     int64_t cols) {
#if defined(PTO_ISA_AVX512) || defined(PTO_ISA_AVX2)
  // Bands of 64, 32, 16 rows (as many as fit, widest first) by 16 columns, then the partial
  // tiles: the last columns (fewer than 16) and the last rows (fewer than 16).
  const int64_t q16 = cols / 16 * 16;
  int64_t r = 0;
  auto band = [&]<class V>() {
    constexpr int64_t kR = sizeof(V);
    for (; r + kR <= rows; r += kR) {
      for (int64_t q = 0; q < q16; q += 16)
        transpose_block16<V>(x + r * ldx + q, ldx, y + q * ldy + r, ldy);
      if (q16 < cols)
        for (int64_t r1 = r; r1 < r + kR; r1 += 16)
          transpose_edge16(x + r1 * ldx + q16, ldx, y + q16 * ldy + r1, ldy, 16,
                           static_cast<int>(cols - q16));
    }
  };
#if defined(PTO_ISA_AVX512)
  band.template operator()<__m512i>();
#endif
  band.template operator()<__m256i>();
  band.template operator()<__m128i>();
  if (r < rows)
    for (int64_t q = 0; q < cols; q += 16)
      transpose_edge16(x + r * ldx + q, ldx, y + q * ldy + r, ldy, static_cast<int>(rows - r),
                       static_cast<int>(cols - q < 16 ? cols - q : 16));
#else
  constexpr int64_t kT = 8;
  const int64_t re = rows / kT * kT, qe = cols / kT * kT;
  uint64_t w[kT];
  for (int64_t r = 0; r < re; r += kT)
    for (int64_t q = 0; q < qe; q += kT) {
      for (int k = 0; k < kT; ++k) std::memcpy(&w[k], x + (r + k) * ldx + q, kT);
      transpose8x8(w);
      for (int k = 0; k < kT; ++k) std::memcpy(y + (q + k) * ldy + r, &w[k], kT);
    }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t q = (r < re ? qe : 0); q < cols; ++q) y[q * ldy + r] = x[r * ldx + q];
#endif
}

}  // namespace pto::cpu::PTO_ISA_NS
