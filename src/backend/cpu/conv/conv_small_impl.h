// The small-output conv's micro-kernel (conv.h conv_small), compiled once per ISA
// (conv_small_{avx512,avx2,generic}.cpp). A conv with a few output positions per image (Silero
// VAD's STFT and encoder convs have 1 to 4) is a GEMM with 1-8 columns: the implicit GEMM's
// micro-tiles, whose vectors run along the positions, stay mostly empty. Here the vectors run along
// the output channels instead: per k, NB weight vectors (channels m0 .. m0 + NB * V) times
// P broadcast inputs x[koff[k] + qoff[q]] into P x NB accumulators that stay in registers for the
// whole K.
#include <utility>

#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/conv/conv_simd.h"
#include "backend/cpu/isa/vmath.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int V = Vec::kLanes;
// Vector registers: 32 with AVX-512, 16 with AVX2 (and the scalar generic build's xmm file).
constexpr int kRegs = V == 16 ? 32 : 16;

// Weight vectors per block for P positions: P * NB accumulators, NB weights and a broadcast fit
// the registers; at most 8.
constexpr int nb_for(int p) {
  const int nb = (kRegs - 1) / (p + 1);
  return nb > 8 ? 8 : (nb < 1 ? 1 : nb);
}

// Channels [m0, m0 + NB * V) (the last vector holding `tail` valid lanes, V when full) of all P
// positions.
template <int P, int NB>
void block(const SmallConvBlock& b, int64_t m0, int tail) {
  Vec acc[P][NB];
  for (int j = 0; j < NB; ++j) {
    const int n = j == NB - 1 ? tail : V;
    const Vec bias = b.bias ? Vec::load(b.bias + m0 + j * V, n) : Vec::zero();
    for (int q = 0; q < P; ++q) acc[q][j] = bias;
  }
  const float* w[NB];  // vector j's weights: 16-channel panel (m0 + j V) / 16, at its lane offset
  for (int j = 0; j < NB; ++j) {
    const int64_t m = m0 + j * V;
    w[j] = b.w + m / 16 * b.k * 16 + m % 16;
  }
  int64_t qoff[P];
  for (int q = 0; q < P; ++q) qoff[q] = b.qoff[q];
  for (int64_t k = 0; k < b.k; ++k) {
    Vec wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = Vec::load(w[j] + k * 16);
    const float* xk = b.x + b.koff[k];
    for (int q = 0; q < P; ++q) {
      const Vec x = Vec::set1(xk[qoff[q]]);
      for (int j = 0; j < NB; ++j) acc[q][j] = fma(wv[j], x, acc[q][j]);
    }
  }
  if (b.clamp) {
    const Vec lo = Vec::set1(b.lo), hi = Vec::set1(b.hi);
    for (int q = 0; q < P; ++q)
      for (int j = 0; j < NB; ++j) acc[q][j] = min_keep_nan(max_keep_nan(acc[q][j], lo), hi);
  }
  if (b.ldy == 1 && P == 1) {  // one position per image: the channels are contiguous in y
    for (int j = 0; j < NB; ++j) acc[0][j].store(b.y + m0 + j * V, j == NB - 1 ? tail : V);
    return;
  }
  // y[m][q]: channel m's P positions are contiguous; the lanes are transposed through the stack.
  float buf[P][V];
  for (int j = 0; j < NB; ++j) {
    for (int q = 0; q < P; ++q) acc[q][j].store(buf[q]);
    const int n = j == NB - 1 ? tail : V;
    float* y = b.y + (m0 + j * V) * b.ldy;
    for (int l = 0; l < n; ++l, y += b.ldy)
      for (int q = 0; q < P; ++q) y[q] = buf[q][l];
  }
}

// Blocks of NB vectors over channels [b.m0, b.m1), then the rest in one smaller block.
template <int P, int NB>
void blocks(const SmallConvBlock& b, int64_t m0, int64_t vectors, int tail) {
  for (; vectors >= NB; vectors -= NB, m0 += NB * V) block<P, NB>(b, m0, vectors == NB ? tail : V);
  if constexpr (NB > 1)
    if (vectors > 0) {
      // One instantiation per smaller width: the remaining vectors, one block.
      [&]<int... I>(std::integer_sequence<int, I...>) {
        ((vectors == I + 1 ? (block<P, I + 1>(b, m0, tail), 0) : 0), ...);
      }
      (std::make_integer_sequence<int, NB - 1>{});
    }
}

template <int P>
void positions(const SmallConvBlock& b) {
  const int64_t m = b.m1 - b.m0, vectors = (m + V - 1) / V;
  const int tail = static_cast<int>(m - (vectors - 1) * V);
  blocks<P, nb_for(P)>(b, b.m0, vectors, tail);
}

}  // namespace

void small_pad(const ConvWindow& g, int64_t rows, int64_t cols, const float* x, int64_t planes,
               int64_t in_plane, float* dst) {
  int64_t lo, hi;  // the padded columns that hold input columns
  valid_span(0, cols, g.iw, 1, -g.pw, &lo, &hi);
  if (rows == 1 && g.ih == 1 && g.ph == 0 && cols <= V) {
    // 1-D rows that fit a vector (Silero VAD's: 3 columns padded to 5): one load and one store
    // a plane; the store's zero lanes are the plane's trailing pads and the next plane's leading
    // ones (the caller leaves V floats of slack after the last plane).
    fill_zero(dst, lo);
    const int n = static_cast<int>(hi - lo);
    for (int64_t t = 0; t < planes; ++t, x += in_plane, dst += cols)
      Vec::load(x + lo - g.pw, n).store(dst + lo);
    return;
  }
  for (int64_t t = 0; t < planes; ++t, x += in_plane)
    for (int64_t r = 0; r < rows; ++r, dst += cols) {
      const int64_t iy = r - g.ph;
      if (iy < 0 || iy >= g.ih) {
        fill_zero(dst, cols);
        continue;
      }
      fill_zero(dst, lo);
      copy_strided(dst + lo, x + iy * g.iw + lo - g.pw, hi - lo, 1);
      fill_zero(dst + hi, cols - hi);
    }
}

void conv_small_block(const SmallConvBlock& b) {
  if (b.m1 <= b.m0) return;
  switch (b.p) {
    case 1:
      return positions<1>(b);
    case 2:
      return positions<2>(b);
    case 3:
      return positions<3>(b);
    case 4:
      return positions<4>(b);
    case 5:
      return positions<5>(b);
    case 6:
      return positions<6>(b);
    case 7:
      return positions<7>(b);
    default:
      return positions<8>(b);
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
