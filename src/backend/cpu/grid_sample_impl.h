// The GridSample fast path for one ISA (grid_sample_{avx512,avx2,generic}.cpp): the taps of a
// block of output points computed on vectors of points (coordinates, floors, weights, padding as
// masks), then each channel's samples as masked gathers of the taps, vectors along the output
// width.
#include <cfloat>

#include "backend/cpu/grid_sample_isa.h"
#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int64_t kChunk = 256;  // points deinterleaved at a time (a stack buffer)

// plane[idx] where idx >= 0, else 0.
inline Vec gather(const float* plane, Vec idx) {
  const Mask valid = idx >= Vec::zero();
#if defined(PTO_ISA_AVX512)
  return {
      _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid.m, _mm512_cvttps_epi32(idx.v), plane, 4)};
#elif defined(PTO_ISA_AVX2)
  return {
      _mm256_mask_i32gather_ps(_mm256_setzero_ps(), plane, _mm256_cvttps_epi32(idx.v), valid.m, 4)};
#else
  return {valid.m ? plane[static_cast<int64_t>(idx.v)] : 0.0f};
#endif
}

// One axis of `size` pixels: the unnormalized coordinate of g, as the reference's single-precision
// path computes it, with nearest rounding and border clamping applied.
inline Vec unnormalize(Vec g, float size, const GridSample2d& s) {
  const Vec one = Vec::set1(1.0f), half = Vec::set1(0.5f), d = Vec::set1(size);
  // rounded(): the reference rounds each product; an fma would move x by an ulp (a bilinear
  // sample by ~1e-6, a nearest one across a .5 tie).
  Vec x = s.align_corners ? rounded((g + one) * half) * (d - one)
                          : (rounded((g + one) * d) - one) * half;
  if (s.nearest) x = round(x);  // half to even, as PyTorch
  if (s.border) {
    const Vec lo = Vec::set1(s.align_corners ? 0.0f : -0.5f);
    const Vec hi = Vec::set1(s.align_corners ? size - 1 : size - 0.5f);
    x = select((x < lo) | (x > hi), min(max(x, Vec::zero()), d - one), x);
  }
  // Past this margin every tap reads zero padding; clamping keeps the conversions defined.
  return min(max(x, Vec::set1(-8.0f)), d + Vec::set1(8.0f));
}

// Pixel i (a whole number) of an axis of `size`: itself when inside, else -1 (zeros) or the
// nearest edge (border).
inline Vec pixel(Vec i, float size, bool border) {
  const Vec last = Vec::set1(size - 1);
  if (border) return min(max(i, Vec::zero()), last);
  return select((i < Vec::zero()) | (i > last), Vec::set1(-1.0f), i);
}

// The offset of (iy, ix), or -1 when either reads zero padding.
inline Vec offset(Vec iy, Vec ix, Vec width) {
  const Vec none = Vec::set1(-1.0f);
  return select((iy < Vec::zero()) | (ix < Vec::zero()), none, fma(iy, width, ix));
}

}  // namespace

void grid_sample_taps(const GridSample2d& s, const float* grid, int64_t len, float* idx, float* w,
                      int64_t stride) {
  constexpr int L = Vec::kLanes;
  float gx[kChunk], gy[kChunk];
  const float fh = static_cast<float>(s.h), fw = static_cast<float>(s.w);
  const Vec width = Vec::set1(fw), one = Vec::set1(1.0f), nan = Vec::set1(NAN);
  const Vec big = Vec::set1(FLT_MAX), none = Vec::set1(-1.0f);
  for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
    const int64_t n = len - c0 < kChunk ? len - c0 : kChunk;
    for (int64_t j = 0; j < n; ++j) {
      gx[j] = grid[2 * (c0 + j)];
      gy[j] = grid[2 * (c0 + j) + 1];
    }
    for (int64_t j = 0; j < n; j += L) {
      const int k = n - j < L ? static_cast<int>(n - j) : L;
      const Vec vx = Vec::load(gx + j, k), vy = Vec::load(gy + j, k);
      // Not finite (NaN fails every comparison, so test |v| > max and NaN apart).
      const Mask bad = is_nan(vx) | is_nan(vy) | (abs(vx) > big) | (abs(vy) > big);
      const Vec x = unnormalize(vx, fw, s), y = unnormalize(vy, fh, s);
      const int64_t o = c0 + j;
      if (s.nearest) {
        select(bad, none, offset(pixel(y, fh, s.border), pixel(x, fw, s.border), width))
            .store(idx + o, k);
        select(bad, nan, one).store(w + o, k);
        continue;
      }
      const Vec fx = floor(x), fy = floor(y), tx = x - fx, ty = y - fy;
      const Vec x0 = pixel(fx, fw, s.border), x1 = pixel(fx + one, fw, s.border);
      const Vec y0 = pixel(fy, fh, s.border), y1 = pixel(fy + one, fh, s.border);
      const Vec wx[2] = {one - tx, tx}, wy[2] = {one - ty, ty};
      const Vec px[2] = {x0, x1}, py[2] = {y0, y1};
      for (int a = 0; a < 2; ++a)
        for (int b = 0; b < 2; ++b) {
          const int64_t t = (a * 2 + b) * stride + o;
          select(bad, none, offset(py[a], px[b], width)).store(idx + t, k);
          select(bad, nan, wy[a] * wx[b]).store(w + t, k);
        }
    }
  }
}

void grid_sample_apply(const float* idx, const float* w, int taps, int64_t stride, int64_t len,
                       const float* plane, float* dst) {
  constexpr int L = Vec::kLanes;
  for (int64_t j = 0; j < len; j += L) {
    const int k = len - j < L ? static_cast<int>(len - j) : L;
    Vec acc = Vec::load(w + j, k) * gather(plane, Vec::load(idx + j, k));
    for (int t = 1; t < taps; ++t)
      acc = fma(Vec::load(w + t * stride + j, k), gather(plane, Vec::load(idx + t * stride + j, k)),
                acc);
    acc.store(dst + j, k);
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
