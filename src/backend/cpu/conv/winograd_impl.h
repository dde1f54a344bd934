// The Winograd F(4x4, 3x3) transforms (winograd.h), compiled once per ISA (winograd_{avx512,avx2,
// generic}.cpp). Both work on c-lane vectors of the blocked layout, so every arithmetic operation
// serves `block` channels at once:
//   input   a 6x6 patch d of one input block (zeros outside the image) -> V = B^T d B, its 36
//           values stored as row t of the 36 matrices V[xi];
//   output  the 36 values of one tile and output block from M[xi] -> A^T M A + bias, the 4x4
//           pixels that lie inside the image stored (winograd.cpp applies the epilogue).
#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int kLanes = Vec::kLanes;
constexpr int64_t kTile = 4, kPatch = 6;  // output pixels, input pixels per tile side

// One row (or column) of B^T d: the six outputs from the six inputs.
inline void input_1d(const Vec d[6], Vec o[6]) {
  const Vec four = Vec::set1(4.0f), five = Vec::set1(5.0f), two = Vec::set1(2.0f);
  const Vec s24 = d[4] - d[2], s13 = d[3] - d[1];
  o[0] = fnma(five, d[2], fma(four, d[0], d[4]));  // 4 d0 - 5 d2 + d4
  o[1] = fnma(four, d[1] + d[2], d[3] + d[4]);     // -4 d1 - 4 d2 + d3 + d4
  o[2] = fma(four, d[1] - d[2], d[4] - d[3]);      // 4 d1 - 4 d2 - d3 + d4
  o[3] = fma(two, s13, s24);                       // -2 d1 - d2 + 2 d3 + d4
  o[4] = fnma(two, s13, s24);                      // 2 d1 - d2 - 2 d3 + d4
  o[5] = fnma(five, d[3], fma(four, d[1], d[5]));  // 4 d1 - 5 d3 + d5
}

// One row (or column) of A^T m: four outputs from six inputs.
inline void output_1d(const Vec m[6], Vec o[4]) {
  const Vec two = Vec::set1(2.0f), four = Vec::set1(4.0f), eight = Vec::set1(8.0f);
  const Vec a = m[1] + m[2], b = m[1] - m[2], c = m[3] + m[4], d = m[3] - m[4];
  o[0] = m[0] + a + c;
  o[1] = fma(two, d, b);
  o[2] = fma(four, c, a);
  o[3] = fma(eight, d, b) + m[5];
}

struct Tiles {
  int64_t th, tw;  // tiles per column and row of the output
  explicit Tiles(const BlockedConv& g)
      : th((g.oh + kTile - 1) / kTile), tw((g.ow + kTile - 1) / kTile) {}
};

template <int B>
void input(const BlockedConv& g, const float* x, int64_t t0, int64_t t1, float* v, int64_t ldv,
           int64_t vstride) {
  const Tiles tl(g);
  const int64_t plane = g.ih * g.iw * B;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / (tl.th * tl.tw), ty = t / tl.tw % tl.th, tx = t % tl.tw;
    const int64_t iy0 = ty * kTile - g.ph, ix0 = tx * kTile - g.pw;
    const bool inside = iy0 >= 0 && ix0 >= 0 && iy0 + kPatch <= g.ih && ix0 + kPatch <= g.iw;
    float* vt = v + (t - t0) * ldv;
    for (int64_t ib = 0; ib < g.icb; ++ib) {
      const float* xb = x + (n * g.icb + ib) * plane;
      for (int l = 0; l < B; l += kLanes) {
        Vec d[6][6], r[6][6];
        for (int i = 0; i < 6; ++i) {
          const int64_t iy = iy0 + i;
          for (int j = 0; j < 6; ++j) {
            const int64_t ix = ix0 + j;
            d[i][j] = inside || (iy >= 0 && iy < g.ih && ix >= 0 && ix < g.iw)
                          ? Vec::load(xb + (iy * g.iw + ix) * B + l)
                          : Vec::zero();
          }
        }
        // Columns first (B^T d), then rows ((B^T d) B).
        for (int j = 0; j < 6; ++j) {
          Vec col[6], out[6];
          for (int i = 0; i < 6; ++i) col[i] = d[i][j];
          input_1d(col, out);
          for (int i = 0; i < 6; ++i) r[i][j] = out[i];
        }
        for (int i = 0; i < 6; ++i) {
          Vec out[6];
          input_1d(r[i], out);
          for (int j = 0; j < 6; ++j) out[j].store(vt + (i * 6 + j) * vstride + ib * B + l);
        }
      }
    }
  }
}

template <int B>
void output(const BlockedConv& g, const float* m, int64_t mstride, int64_t t, const float* bias,
            float* y) {
  const Tiles tl(g);
  const int64_t n = t / (tl.th * tl.tw), ty = t / tl.tw % tl.th, tx = t % tl.tw;
  const int64_t oy0 = ty * kTile, ox0 = tx * kTile, row = g.ow * B;
  const int rows = static_cast<int>(g.oh - oy0 < kTile ? g.oh - oy0 : kTile);
  const int cols = static_cast<int>(g.ow - ox0 < kTile ? g.ow - ox0 : kTile);
  for (int64_t ob = 0; ob < g.ocb; ++ob) {
    float* yt = y + (((n * g.ocb + ob) * g.oh + oy0) * g.ow + ox0) * B;
    for (int l = 0; l < B; l += kLanes) {
      const float* ms = m + ob * B + l;
      Vec s[4][6];
      for (int j = 0; j < 6; ++j) {  // columns first (A^T M), then rows ((A^T M) A)
        Vec col[6], out[4];
        for (int i = 0; i < 6; ++i) col[i] = Vec::load(ms + (i * 6 + j) * mstride);
        output_1d(col, out);
        for (int i = 0; i < 4; ++i) s[i][j] = out[i];
      }
      const Vec b = bias ? Vec::load(bias + ob * B + l) : Vec::zero();
      for (int i = 0; i < rows; ++i) {
        Vec out[4];
        output_1d(s[i], out);
        for (int j = 0; j < cols; ++j) (out[j] + b).store(yt + i * row + j * B + l);
      }
    }
  }
}

}  // namespace

bool winograd_input(const BlockedConv& g, const float* x, int64_t t0, int64_t t1, float* v,
                    int64_t ldv, int64_t vstride) {
  if (g.block == 8) {
    if constexpr (8 % kLanes == 0) {
      input<8>(g, x, t0, t1, v, ldv, vstride);
      return true;
    }
  } else if (g.block == 16) {
    input<16>(g, x, t0, t1, v, ldv, vstride);
    return true;
  }
  return false;
}

bool winograd_output(const BlockedConv& g, const float* m, int64_t mstride, int64_t t,
                     const float* bias, float* y) {
  if (g.block == 8) {
    if constexpr (8 % kLanes == 0) {
      output<8>(g, m, mstride, t, bias, y);
      return true;
    }
  } else if (g.block == 16) {
    output<16>(g, m, mstride, t, bias, y);
    return true;
  }
  return false;
}

}  // namespace pto::cpu::PTO_ISA_NS
