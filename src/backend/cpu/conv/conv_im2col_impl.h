// im2col for the implicit-GEMM path and the padded, phase-split input of the shifted path,
// compiled once per ISA (conv_im2col_{avx512,avx2,generic}.cpp).
// A column block spans a few output rows; per col row (c, ky, kx) the valid input columns are
// found once and each output row costs one bounds check, a vector copy and the zero fills.
#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/conv/conv_simd.h"
#include "backend/cpu/movement/transpose.h"

namespace pto::cpu::PTO_ISA_NS {

namespace {

#if defined(PTO_ISA_AVX512)
// Stride-1 rows of at most 16 outputs over whole output rows (small planes: grouped convs at
// 14x14 and 7x7): per col row one lane mask of the valid columns, then per output row one
// masked load (zeros where the tap reads padding; masked lanes never fault) and one masked
// store. The general loop below spends its bounds checks and three partial-vector calls on every
// 14-wide row: ResNeXt's 512 @14 3x3 in 32 groups was 49% im2col.
void im2col_short_rows(const ConvWindow& g, const float* x, int64_t j0, int64_t j1, int64_t k0,
                       int64_t k1, float* col) {
  const int64_t cols = j1 - j0, oy0 = j0 / g.ow, rows = cols / g.ow;
  const __mmask16 row_mask = static_cast<__mmask16>((1u << g.ow) - 1);
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t kx = k % g.kw, ky = (k / g.kw) % g.kh, ci = k / (g.kw * g.kh);
    const float* xc = x + ci * g.ih * g.iw;
    const int64_t xoff = kx * g.dw - g.pw;
    int64_t lo, hi;  // output columns whose tap kx lands inside the input row
    valid_span(0, g.ow, g.iw, 1, xoff, &lo, &hi);
    const __mmask16 valid = static_cast<__mmask16>(((1u << hi) - 1) & ~((1u << lo) - 1));
    float* dst = col + k * cols;
    for (int64_t r = 0; r < rows; ++r, dst += g.ow) {
      const int64_t iy = (oy0 + r) * g.sh - g.ph + ky * g.dh;
      const __m512 v = iy < 0 || iy >= g.ih ? _mm512_setzero_ps()
                                            : _mm512_maskz_loadu_ps(valid, xc + iy * g.iw + xoff);
      _mm512_mask_storeu_ps(dst, row_mask, v);
    }
  }
}
#endif

// A patch embedding's columns (window = stride, no pads or dilation: ViT's 16x16/16, DINOv2's
// 14x14/14) over whole output rows and whole kernel rows: per (channel, ky, output row) the ow
// patches of an input row, kw floats each, transposed into that kernel row's kw col rows. Each
// tap kx was a strided copy reading one float in kw (scalar beyond copy_strided's permutes, which
// stop at stride 8): DeiT-tiny's 3 -> 192 16x16/16 spent 16% of its time in im2col.
bool im2col_patches(const ConvWindow& g, const float* x, int64_t j0, int64_t j1, int64_t k0,
                    int64_t k1, float* col) {
  const int64_t cols = j1 - j0;
  if (!(g.kw == g.sw && g.kh == g.sh && g.kw > 8 && g.pw == 0 && g.ph == 0 && g.dw == 1 &&
        g.dh == 1 && j0 % g.ow == 0 && cols % g.ow == 0 && k0 % g.kw == 0 && k1 % g.kw == 0))
    return false;
  const int64_t oy0 = j0 / g.ow, rows = cols / g.ow;
  for (int64_t q = k0 / g.kw; q < k1 / g.kw; ++q) {  // q = channel * kh + ky: col rows q * kw on
    const int64_t ky = q % g.kh, ci = q / g.kh;
    const float* xc = x + ci * g.ih * g.iw;
    float* dst = col + q * g.kw * cols;
    for (int64_t r = 0; r < rows; ++r)
      transpose_strip_4(reinterpret_cast<const uint32_t*>(xc + ((oy0 + r) * g.sh + ky) * g.iw),
                        g.kw, reinterpret_cast<uint32_t*>(dst + r * g.ow), cols, g.kw, g.ow);
  }
  return true;
}

}  // namespace

void im2col(const ConvWindow& g, const float* x, int64_t j0, int64_t j1, int64_t k0, int64_t k1,
            float* col) {
  const int64_t cols = j1 - j0, oy0 = j0 / g.ow, ox_first = j0 % g.ow;
  if (cols <= 0) return;
  if (im2col_patches(g, x, j0, j1, k0, k1, col)) return;
#if defined(PTO_ISA_AVX512)
  if (g.sw == 1 && g.ow <= 16 && ox_first == 0 && cols % g.ow == 0)
    return im2col_short_rows(g, x, j0, j1, k0, k1, col);
#endif
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t kx = k % g.kw, ky = (k / g.kw) % g.kh, ci = k / (g.kw * g.kh);
    const float* xc = x + ci * g.ih * g.iw;
    const int64_t xoff = kx * g.dw - g.pw;
    int64_t row_lo, row_hi;  // output columns whose tap kx lands inside the input row
    valid_span(0, g.ow, g.iw, g.sw, xoff, &row_lo, &row_hi);
    float* dst = col + k * cols;
    for (int64_t oy = oy0; oy * g.ow < j1; ++oy) {
      const int64_t base = oy * g.ow - j0;  // dst[base + ox] is output (oy, ox)
      const int64_t ox0 = oy == oy0 ? ox_first : 0;
      const int64_t ox1 = j1 - oy * g.ow < g.ow ? j1 - oy * g.ow : g.ow;
      const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
      if (iy < 0 || iy >= g.ih) {
        fill_zero(dst + base + ox0, ox1 - ox0);
        continue;
      }
      const int64_t lo = row_lo < ox0 ? ox0 : (row_lo > ox1 ? ox1 : row_lo);
      const int64_t hi = row_hi < lo ? lo : (row_hi > ox1 ? ox1 : row_hi);
      fill_zero(dst + base + ox0, lo - ox0);
      copy_strided(dst + base + lo, xc + iy * g.iw + xoff + lo * g.sw, hi - lo, g.sw);
      fill_zero(dst + base + hi, ox1 - hi);
    }
  }
}

void shifted_pad(const ShiftedPlane& p, const float* x, float* dst) {
  for (int64_t py = 0; py < p.sh; ++py)
    for (int64_t px = 0; px < p.sw; ++px) {
      float* plane = dst + (py * p.sw + px) * p.rpp * p.wp;
      int64_t lo, hi;  // columns q whose input column q * sw + px - pw exists
      valid_span(0, p.wp, p.iw, p.sw, px - p.pw, &lo, &hi);
      for (int64_t i = 0; i < p.rpp; ++i) {
        float* row = plane + i * p.wp;
        const int64_t iy = i * p.sh + py - p.ph;
        if (iy < 0 || iy >= p.ih) {
          fill_zero(row, p.wp);
          continue;
        }
        fill_zero(row, lo);
        copy_strided(row + lo, x + iy * p.iw + lo * p.sw + px - p.pw, hi - lo, p.sw);
        fill_zero(row + hi, p.wp - hi);
      }
    }
}

}  // namespace pto::cpu::PTO_ISA_NS
