// CPU kernels for ONNX's integer convolutions, ConvInteger (int32 output) and QLinearConv
// (requantized uint8/int8 output), 1-D and 2-D, NCHW, on the int8 GEMM (gemm/igemm.h).
//
// Layout: an implicit GEMM with the output pixels as rows, in NHWC. A is, per group, the im2col
// [N*Ho*Wo, kh*kw*Cg] with K in (ky, kx, channel) order, so each tap of a row is one run of Cg
// contiguous bytes of an NHWC copy of the input (a whole kernel row, kw*C bytes, when there is one
// group, no dilation and the row is inside the input), and padding is filled with x's zero point
// (it contributes (x_zp - x_zp) * w = 0, as the reference's zero padding of x - x_zp does); a 1x1,
// stride-1, unpadded conv's A is its input transposed to NHWC. B is the weights of the group,
// [kh*kw*Cg, Mg] in the same K order, packed once at compile time when W is constant. The GEMM's
// columns are the output channels, so the per-channel parameters (w's zero points, scales and
// QLinearConv's int32 bias) are igemm's per-column ones, and its epilogue requantizes exactly as
// the reference (bias in the sum before rounding). The rows run in chunks of one image's pixels
// sized to L2: a chunk's A is built, multiplied, and its [rows, M] result transposed into the
// NCHW output while both are in cache (a whole-tensor A and result would go to memory and back).
//
// A depthwise conv (one input channel per group) runs a direct kernel per output plane instead (a
// GEMM with one column per group would waste 15/16 of every panel): the float depthwise kernel,
// exact on these integers (see depthwise()), then the same epilogue.
//
// Forms left to the reference at run time: per-channel x zero points or x / y scales, K deeper
// than kMaxExactK for QLinearConv, ranks other than 3 and 4.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/gemm/igemm.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/quant.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/scratch.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// The two ops' inputs: X, W and their zero points; QLinearConv's scales and bias (-1: none).
struct ConvInputs {
  size_t x = 0, x_zp = 2, w = 1, w_zp = 3;
  int x_scale = -1, w_scale = -1, y_scale = -1, y_zp = -1, bias = -1;
};
constexpr ConvInputs kConvInteger{};
constexpr ConvInputs kQLinearConv{0, 2, 3, 5, 1, 4, 6, 7, 8};

// Depthwise: one input channel per group, more than one group.
bool is_depthwise(int64_t cg, int64_t group) {
  return cg == 1 && group > 1;
}

int64_t taps_of(const Dims& w) {
  int64_t t = 1;
  for (size_t i = 2; i < w.size(); ++i) t *= w[i];
  return t;
}

// W [M, Cg, taps...] packed per group as igemm's B: [taps * Cg, Mg], row (t, c) = W[g Mg + j, c,
// t].
std::vector<PackedI8B> pack_conv_weights(const uint8_t* w, const Dims& shape, int64_t group,
                                         bool w_signed) {
  const int64_t mg = shape[0] / group, cg = shape[1], taps = taps_of(shape), k = taps * cg;
  std::vector<PackedI8B> out;
  std::vector<uint8_t> t(static_cast<size_t>(std::max<int64_t>(mg * k, 1)));
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t j = 0; j < mg; ++j)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t p = 0; p < taps; ++p)
          t[j * k + p * cg + c] = w[((g * mg + j) * cg + c) * taps + p];
    out.push_back(pack_i8_b(k, mg, t.data(), k, true, w_signed));
  }
  return out;
}

// A constant W packed at compile time (not for a depthwise conv, which reads W directly).
struct PreparedConvW {
  std::vector<PackedI8B> groups;
  Dims shape;
  size_t input = 0;
};

std::any prepare_w(const NodeInfo& n, size_t w) {
  if (!n.is_constant(w)) return {};
  const Tensor& t = *n.constants[w];
  const int64_t group = n.node.attr_int("group");
  if ((t.rank() != 3 && t.rank() != 4) || group < 1 || t.dim(0) % group != 0 ||
      is_depthwise(t.dim(1), group))
    return {};
  return PreparedConvW{pack_conv_weights(static_cast<const uint8_t*>(t.raw_data()), t.shape(),
                                         group, t.dtype() == DType::kI8),
                       t.shape(), w};
}

bool has_prepared(const KernelContext& c) {
  return c.state && c.state->has_value();
}

Tensor unpack_w(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const PreparedConvW&>(state);
  PTO_CHECK(input == p.input) << "ConvInteger/QLinearConv: only W is packed";
  const int64_t group = static_cast<int64_t>(p.groups.size()), mg = p.shape[0] / group;
  const int64_t cg = p.shape[1], taps = taps_of(p.shape);
  Tensor t = Tensor::empty(p.groups[0].is_signed() ? DType::kI8 : DType::kU8, p.shape);
  auto* w = static_cast<uint8_t*>(t.raw_data());
  for (int64_t g = 0; g < group; ++g)
    for (int64_t j = 0; j < mg; ++j)
      for (int64_t c = 0; c < cg; ++c)
        for (int64_t q = 0; q < taps; ++q)
          w[((g * mg + j) * cg + c) * taps + q] = p.groups[g].original(q * cg + c, j);
  return t;
}

// The reference kernel, with W rebuilt when the runtime released the original.
std::vector<Tensor> reference_with_w(const KernelContext& c) {
  if (!has_prepared(c)) return run_reference(c);
  KernelContext inner = c;
  const auto& p = c.prepared<PreparedConvW>();
  inner.inputs.at(p.input) = unpack_w(*c.state, p.input);
  return run_reference(inner);
}

// y[q * ldy + r] = x[r * ldx + q] for r < rows, q < cols bytes (quant.h's transpose_bytes).
void transpose(const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy, int64_t rows, int64_t cols) {
  PTO_ISA_DISPATCH(transpose_bytes, x, ldx, y, ldy, rows, cols);
}

// x [n, rows, cols] -> y [n, cols, rows] bytes, in parallel over 64 x 64 blocks: the input to
// NHWC.
void transpose_planes(const uint8_t* x, uint8_t* y, int64_t n, int64_t rows, int64_t cols) {
  constexpr int64_t kB = 64;
  const int64_t rb = (rows + kB - 1) / kB, cb = (cols + kB - 1) / kB;
  parallel_for(0, n * rb * cb, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t img = t / (rb * cb), r0 = t / cb % rb * kB, q0 = t % cb * kB;
      const int64_t off = img * rows * cols;
      transpose(x + off + r0 * cols + q0, cols, y + off + q0 * rows + r0, rows,
                std::min(kB, rows - r0), std::min(kB, cols - q0));
    }
  });
}

// memcpy of n bytes, inline for the short runs of a conv with few channels (a kernel row of
// 3x3x3 is 9 bytes): two overlapping 8- or 4-byte copies instead of a call.
inline void copy_run(uint8_t* d, const uint8_t* s, int64_t n) {
  if (n >= 8 && n <= 16) {
    std::memcpy(d, s, 8);
    std::memcpy(d + n - 8, s + n - 8, 8);
  } else if (n >= 4 && n < 8) {
    std::memcpy(d, s, 4);
    std::memcpy(d + n - 4, s + n - 4, 4);
  } else {
    std::memcpy(d, s, static_cast<size_t>(n));
  }
}

// Rows [r0, r1) (output pixels of all images) of group g's im2col [N*Ho*Wo, taps*Cg] from the
// NHWC copy xh, padding = x_zp, into col (row r0 first).
void im2col_nhwc(const ConvGeometry& g, const uint8_t* xh, int64_t grp, uint8_t zp, int64_t r0,
                 int64_t r1, uint8_t* col) {
  const int64_t cg = g.cg(), k = g.kh * g.kw * cg, ow = g.ow;
  // One run of kw * C bytes per kernel row when the taps of a row are adjacent channels-last.
  const bool whole_rows = g.group == 1 && g.dw == 1;
  // Row r's image and output pixel, stepped along rather than divided out per row (three 64-bit
  // divisions a row were most of the 3 -> 32 stem's im2col).
  int64_t img = r0 / g.out_plane(), oy = r0 % g.out_plane() / ow, ox = r0 % ow;
  for (int64_t r = r0; r < r1; ++r, ++ox) {
    if (ox == ow) {
      ox = 0;
      if (++oy == g.oh) oy = 0, ++img;
    }
    uint8_t* d = col + (r - r0) * k;
    const uint8_t* xi = xh + img * g.in_plane() * g.c + grp * cg;
    const int64_t x0 = ox * g.sw - g.pw;
    for (int64_t ky = 0; ky < g.kh; ++ky, d += g.kw * cg) {
      const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
      if (iy < 0 || iy >= g.ih) {
        std::memset(d, zp, static_cast<size_t>(g.kw * cg));
        continue;
      }
      const uint8_t* row = xi + iy * g.iw * g.c;
      if (whole_rows && x0 >= 0 && x0 + g.kw <= g.iw) {
        copy_run(d, row + x0 * g.c, g.kw * cg);
        continue;
      }
      for (int64_t kx = 0; kx < g.kw; ++kx) {
        const int64_t ix = x0 + kx * g.dw;
        if (ix < 0 || ix >= g.iw)
          std::memset(d + kx * cg, zp, static_cast<size_t>(cg));
        else
          copy_run(d + kx * cg, row + ix * g.c, cg);
      }
    }
  }
}

// Byte i of v as uint8 or int8 (is_signed).
int32_t byte_at(const uint8_t* v, int64_t i, bool is_signed) {
  return is_signed ? static_cast<int32_t>(static_cast<int8_t>(v[i])) : static_cast<int32_t>(v[i]);
}

// Output channel m's weight zero point: none, one for all, or one per channel.
int32_t w_zp_of(const std::vector<int32_t>& w_zp, int64_t m) {
  return w_zp.empty() ? 0 : w_zp[w_zp.size() == 1 ? 0 : static_cast<size_t>(m)];
}

// One depthwise output plane from the widened input plane xv (x - x_zp) and weights wv (w - w_zp),
// taps outside the input skipped (they would add (x_zp - x_zp) * w = 0); sums wrap as the GEMM's.
void depthwise_scalar(const ConvGeometry& g, const int32_t* xv, const int32_t* wv, int32_t* acc) {
  for (int64_t oy = 0; oy < g.oh; ++oy)
    for (int64_t ox = 0; ox < g.ow; ++ox) {
      uint32_t s = 0;
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh - g.ph + ky * g.dh;
        if (iy < 0 || iy >= g.ih) continue;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t ix = ox * g.sw - g.pw + kx * g.dw;
          if (ix >= 0 && ix < g.iw)
            s += static_cast<uint32_t>(xv[iy * g.iw + ix] * wv[ky * g.kw + kx]);
        }
      }
      acc[oy * g.ow + ox] = static_cast<int32_t>(s);
    }
}

// Depthwise: y plane (img, m) = epilogue(sum over taps (x - x_zp) * (w[m] - w_zp[m])). `args`
// holds the per-column parameters of all M channels; its c and ldc are set here per plane.
//
// The sum runs on the float depthwise kernel (conv_isa.h, vectorized per ISA): every product is
// an integer of magnitude at most 255 * 255 and every partial sum at most taps * 255 * 255, so in
// float32 all of them are exact while that is below 2^24 (kMaxExactDepthwiseTaps taps: kernels up
// to 16x16), and the float sum converts to the same int32 as the integer one. Each input plane is
// widened to x - x_zp as it is padded with zeros (= x_zp - x_zp, what the reference's padding adds)
// and split by stride phase the way the float kernel reads it (quant.h's depthwise_pad_bytes).
// Deeper kernels take the integer loop.
constexpr int64_t kMaxExactDepthwiseTaps = (int64_t{1} << 24) / (255 * 255);

void depthwise(const ConvGeometry& g, const uint8_t* x, bool x_signed, int32_t x_zp,
               const uint8_t* w, bool w_signed, const std::vector<int32_t>& w_zp,
               const IgemmArgs& args, void* y, size_t out_size) {
  const int64_t mg = g.mg(), taps = g.kh * g.kw, plane = g.out_plane();
  const bool exact_in_float = taps <= kMaxExactDepthwiseTaps;
  // As the float conv lays out a padded plane (conv.cpp's depthwise_plane_of).
  DepthwisePlane p;
  static_cast<ConvWindow&>(p) = g;
  p.rows = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  p.phase_len = ((g.ow - 1) * g.sw + (g.kw - 1) * g.dw + g.sw) / g.sw;
  p.row_len = g.sw * p.phase_len;
  const float zp = static_cast<float>(x_zp);
  // Without bias or requantization the epilogue is the identity: the sums go straight to y.
  const bool direct_out = args.out == IgemmArgs::Out::kS32 && !args.bias_s32;
  parallel_for(0, g.n * g.m, 1, [&](int64_t b, int64_t e) {
    auto* acc = scratch_as<int32_t>(static_cast<size_t>(plane));
    auto* padded = scratch_as<float>(static_cast<size_t>(p.rows * p.row_len), 2);
    auto* sum = scratch_as<float>(static_cast<size_t>(plane), 3);
    std::vector<int32_t> wv(static_cast<size_t>(taps)), xv;
    std::vector<float> wf(static_cast<size_t>(taps));
    int64_t widened = -1;  // the input plane padded / xv hold
    for (int64_t t = b; t < e; ++t) {
      const int64_t img = t / g.m, m = t % g.m, in_plane = img * g.c + m / mg;
      const int32_t zw = w_zp_of(w_zp, m);
      for (int64_t q = 0; q < taps; ++q) {
        wv[q] = byte_at(w, m * taps + q, w_signed) - zw;
        wf[q] = static_cast<float>(wv[q]);
      }
      const uint8_t* xp = x + in_plane * g.in_plane();
      int32_t* out = direct_out ? static_cast<int32_t*>(y) + t * plane : acc;
      // Channel m's bias starts the float sums where they stay exact with it (below 2^24).
      const int32_t b = args.bias_s32 ? args.bias_s32[m] : 0;
      const bool bias_in_float =
          exact_in_float && std::abs(int64_t{b}) + taps * 255 * 255 < (int64_t{1} << 24);
      if (exact_in_float) {
        if (in_plane != widened) {
          PTO_ISA_DISPATCH(depthwise_pad_bytes, p, xp, x_signed, zp, padded);
        }
        PTO_ISA_DISPATCH(depthwise_plane, p, padded, wf.data(),
                         bias_in_float ? static_cast<float>(b) : 0.0f, sum);
        PTO_ISA_DISPATCH(float_to_s32, sum, plane, out);
      } else {
        if (in_plane != widened) {
          xv.resize(static_cast<size_t>(g.in_plane()));
          for (int64_t i = 0; i < g.in_plane(); ++i) xv[i] = byte_at(xp, i, x_signed) - x_zp;
        }
        depthwise_scalar(g, xv.data(), wv.data(), out);
      }
      widened = in_plane;
      if (direct_out) continue;
      IgemmArgs a = args;
      a.c = static_cast<uint8_t*>(y) + static_cast<size_t>(t * plane) * out_size;
      if (a.mult_per_col) a.mult += m;
      if (a.bias_s32) a.bias_s32 += m;
      // The plane as one row of `plane` columns with channel m's parameters for all of them (the
      // epilogue's vector loop): the bias goes into the sums first (in float above, or here),
      // exact in int32 while the float path's bound on them (2^24) leaves room. Otherwise as one
      // column (ldc 1).
      if (exact_in_float && b > INT32_MIN + (1 << 24) && b < INT32_MAX - (1 << 24)) {
        if (b != 0 && !bias_in_float)
          for (int64_t i = 0; i < plane; ++i) acc[i] += b;
        a.bias_s32 = nullptr;
        a.mult_per_col = false;
        a.ldc = plane;
        igemm_epilogue(a, acc, plane, 0, 1, 0, plane);
      } else {
        a.ldc = 1;
        igemm_epilogue(a, acc, 1, 0, plane, 0, 1);
      }
    }
  });
}

// A depthwise conv with a small output plane (at most kNhwcDepthwisePlane pixels) and one output
// channel per input channel runs channels-last instead, as the fp32 conv's blocked kernel does on
// such planes (conv_kernels.cpp): per plane, a 7x7 row fills 7 of 16 lanes and the per-plane setup
// outweighs the sums. The input is transposed to NHWC (bytes) and widened to x - x_zp in float
// once, each output row's pixels take their channels in vector lanes (quant.h's
// depthwise_row_nhwc, exact in float as above), and the [pixels, C] sums go through the epilogue
// (as a GEMM's rows and columns) and back to NCHW.
constexpr int64_t kNhwcDepthwisePlane = 14 * 14;

void depthwise_nhwc(const ConvGeometry& g, const uint8_t* x, bool x_signed, int32_t x_zp,
                    const uint8_t* w, bool w_signed, const std::vector<int32_t>& w_zp,
                    const IgemmArgs& args, void* y, size_t out_size) {
  const int64_t c = g.c, taps = g.kh * g.kw, plane = g.out_plane(), in = g.in_plane() * c;
  std::vector<float> wf(static_cast<size_t>(taps * c));  // [tap, channel]: w - w_zp
  for (int64_t m = 0; m < c; ++m) {
    const int32_t zw = w_zp_of(w_zp, m);
    for (int64_t q = 0; q < taps; ++q)
      wf[q * c + m] = static_cast<float>(byte_at(w, m * taps + q, w_signed) - zw);
  }
  auto* xh = scratch_as<uint8_t>(static_cast<size_t>(g.n * in), 0);
  transpose_planes(x, xh, g.n, c, g.in_plane());
  // x - x_zp in float once, not once per tap.
  auto* xf = scratch_as<float>(static_cast<size_t>(g.n * in), 3);
  const float zp = static_cast<float>(x_zp), one = 1.0f;
  parallel_for(0, g.n * in, 1 << 14, [&](int64_t b, int64_t e) {
    PTO_ISA_DISPATCH(dequantize_span, xh + b, x_signed, e - b, QuantParams{&one, &zp, 0}, xf + b);
  });
  auto* acc = scratch_as<int32_t>(static_cast<size_t>(g.n * plane * c), 1);  // [n, plane, C]
  parallel_for(0, g.n * g.oh, 1, [&](int64_t b, int64_t e) {
    auto* row = scratch_as<float>(static_cast<size_t>(g.ow * c), 2);
    for (int64_t t = b; t < e; ++t) {
      const int64_t img = t / g.oh, oy = t % g.oh;
      PTO_ISA_DISPATCH(depthwise_row_nhwc, g, c, xf + img * in, wf.data(), oy, row);
      int32_t* a = acc + (img * plane + oy * g.ow) * c;
      PTO_ISA_DISPATCH(float_to_s32, row, g.ow * c, a);
    }
  });
  // Without bias or requantization the epilogue is the identity: the sums are transposed to y.
  const bool direct_out = args.out == IgemmArgs::Out::kS32 && !args.bias_s32;
  parallel_for(0, g.n, 1, [&](int64_t b, int64_t e) {
    for (int64_t img = b; img < e; ++img) {
      const int32_t* ai = acc + img * plane * c;
      auto* yi = static_cast<uint8_t*>(y) + static_cast<size_t>(img * c * plane) * out_size;
      const void* src = ai;
      if (!direct_out) {
        IgemmArgs a = args;
        a.c = scratch_as<uint8_t>(static_cast<size_t>(plane * c) * out_size, 2);
        a.ldc = c;
        igemm_epilogue(a, ai, c, 0, plane, 0, c);
        src = a.c;
      }
      if (out_size == 4)
        PTO_ISA_DISPATCH(transpose_s32, static_cast<const int32_t*>(src), c,
                         reinterpret_cast<int32_t*>(yi), plane, plane, c);
      else
        transpose(static_cast<const uint8_t*>(src), c, yi, plane, plane, c);
    }
  });
}

// How the general path cuts each image's output pixels into row chunks: into enough that a chunk's
// A (lda bytes a row) and C (M outputs a row) take at most about half of L2, and, when the plane
// has the rows (16 a chunk), into 4 per thread, run as parallel tasks (`spread`). A smaller plane
// (ResNet's 7x7 stage at batch 1) runs its chunks in turn, each GEMM spread over the pool by igemm.
struct Chunking {
  int64_t per_image = 1;
  bool spread = false;
};

Chunking chunking(const ConvGeometry& g, int64_t lda, size_t out_size) {
  const int64_t plane = g.out_plane();
  const auto row_bytes = static_cast<int64_t>(static_cast<size_t>(lda) + g.m * out_size);
  const int64_t budget = static_cast<int64_t>(cache_model().l2 / 2);
  const int64_t by_cache = std::max<int64_t>(1, (plane * row_bytes + budget - 1) / budget);
  const int64_t want = (4 * num_threads() + g.n - 1) / g.n;
  if (plane / 16 >= want) return {std::max(by_cache, want), true};
  return {by_cache, false};
}

std::vector<Tensor> conv_int8(const KernelContext& c, const ConvInputs& in) {
  const Tensor &X = c.input(in.x), &W = c.input(in.w);
  if ((X.rank() != 3 && X.rank() != 4) || W.rank() != X.rank()) return reference_with_w(c);
  const ConvGeometry g = conv_geometry(c.attrs(), X.shape(), W.shape(), c.where());
  const bool qlinear = in.y_scale >= 0;
  const int64_t k = g.kh * g.kw * g.cg();
  // Zero points: x one value; w one value or one per output channel.
  int32_t x_zp = 0;
  std::vector<int32_t> w_zp;
  IgemmArgs a;
  if (c.has_input(in.x_zp)) {
    if (c.input(in.x_zp).numel() != 1) return reference_with_w(c);
    x_zp = byte_value(c.input(in.x_zp), 0);
  }
  if (c.has_input(in.w_zp)) {
    if (!per_column(c.input(in.w_zp), g.m, &a.b_zp_per_col)) return reference_with_w(c);
    w_zp = byte_values(c.input(in.w_zp));
  }
  std::vector<double> mult;
  std::vector<int32_t> bias;
  DType out = DType::kI32;
  if (qlinear) {
    const Tensor &xs = c.input(in.x_scale), &ws = c.input(in.w_scale);
    const Tensor &ys = c.input(in.y_scale), &yz = c.input(in.y_zp);
    if (xs.numel() != 1 || ys.numel() != 1 || yz.numel() != 1 ||
        !per_column(ws, g.m, &a.mult_per_col) || k > kMaxExactK)
      return reference_with_w(c);
    if (c.has_input(in.bias)) {
      const Tensor& B = c.input(in.bias);
      if (B.numel() != g.m) return reference_with_w(c);
      bias.assign(B.data<int32_t>(), B.data<int32_t>() + g.m);
    }
    mult = requant_multipliers(xs, ws, ys);
    out = yz.dtype();
    a.out = IgemmArgs::Out::kQuantized;
    a.mult = mult.data();
    a.y_zp = byte_value(yz, 0);
    a.c_signed = out == DType::kI8;
  }
  Dims yshape = {g.n, g.m};
  if (X.rank() == 4) yshape.push_back(g.oh);
  yshape.push_back(g.ow);
  Tensor Y = Tensor::empty(out, yshape);
  if (Y.numel() == 0) return one(std::move(Y));
  const size_t out_size = out == DType::kI32 ? 4 : 1;
  const bool x_signed = X.dtype() == DType::kI8;
  a.a_signed = x_signed;
  a.a_zp = &x_zp;
  a.b_zp = w_zp.empty() ? nullptr : w_zp.data();
  a.bias_s32 = bias.empty() ? nullptr : bias.data();
  const auto* x = static_cast<const uint8_t*>(X.raw_data());

  if (is_depthwise(g.cg(), g.group)) {
    const bool nhwc =
        g.m == g.c && g.out_plane() <= kNhwcDepthwisePlane && g.kh * g.kw <= kMaxExactDepthwiseTaps;
    (nhwc ? depthwise_nhwc : depthwise)(g, x, x_signed, x_zp,
                                        static_cast<const uint8_t*>(W.raw_data()),
                                        W.dtype() == DType::kI8, w_zp, a, Y.raw_data(), out_size);
    return one(std::move(Y));
  }

  std::vector<PackedI8B> packed;
  const std::vector<PackedI8B>& groups =
      has_prepared(c) ? c.prepared<PreparedConvW>().groups
                      : (packed = pack_conv_weights(static_cast<const uint8_t*>(W.raw_data()),
                                                    W.shape(), g.group, W.dtype() == DType::kI8));
  const bool direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 &&
                      g.oh == g.ih && g.ow == g.iw;
  // The im2col reads neighbouring pixels: it needs the whole input in NHWC first (bytes, once, in
  // this thread's slot 0, which every task reads). A direct conv transposes its own rows.
  uint8_t* xh = nullptr;
  if (!direct) {
    xh = scratch_as<uint8_t>(static_cast<size_t>(g.n * g.in_plane() * g.c), 0);
    transpose_planes(x, xh, g.n, g.c, g.in_plane());
  }
  const int64_t plane = g.out_plane(), mg = g.mg(), lda = direct ? g.c : k;
  const Chunking ch = chunking(g, lda, out_size);
  const int64_t chunks = ch.per_image, rows_per = (plane + chunks - 1) / chunks;
  a.k = k;
  a.n = mg;
  a.ldc = g.m;
  // Chunk t: rows [p0, p0 + rows) of image img through A, every group's GEMM into C [rows, M], and
  // C transposed into the NCHW output, all in this thread's scratch.
  auto run_chunk = [&](int64_t t) {
    const int64_t img = t / chunks, p0 = t % chunks * rows_per;
    const int64_t rows = std::min(plane, p0 + rows_per) - p0;
    if (rows <= 0) return;
    auto* at = scratch_as<uint8_t>(static_cast<size_t>(rows * lda), 1);
    auto* ct = scratch_as<uint8_t>(static_cast<size_t>(rows * g.m) * out_size, 2);
    if (direct) transpose(x + img * g.c * plane + p0, plane, at, g.c, g.c, rows);
    for (int64_t grp = 0; grp < g.group; ++grp) {
      IgemmArgs ga = a;
      ga.m = rows;
      if (direct) {
        ga.a = at + grp * g.cg();
      } else {
        im2col_nhwc(g, xh, grp, static_cast<uint8_t>(x_zp), img * plane + p0,
                    img * plane + p0 + rows, at);
        ga.a = at;
      }
      ga.lda = lda;
      // This group's columns of the per-channel parameters and of C.
      const int64_t j0 = grp * mg;
      if (ga.b_zp && ga.b_zp_per_col) ga.b_zp += j0;
      if (ga.mult && ga.mult_per_col) ga.mult += j0;
      if (ga.bias_s32) ga.bias_s32 += j0;
      ga.c = ct + static_cast<size_t>(j0) * out_size;
      igemm(ga, groups[static_cast<size_t>(grp)]);
    }
    const size_t y0 = static_cast<size_t>(img * g.m * plane + p0);
    if (out_size == 4)
      PTO_ISA_DISPATCH(transpose_s32, reinterpret_cast<const int32_t*>(ct), g.m,
                       Y.data<int32_t>() + y0, plane, rows, g.m);
    else
      transpose(ct, g.m, static_cast<uint8_t*>(Y.raw_data()) + y0, plane, rows, g.m);
  };
  if (ch.spread)
    parallel_for(0, g.n * chunks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) run_chunk(t);
    });
  else
    for (int64_t t = 0; t < g.n * chunks; ++t) run_chunk(t);
  return one(std::move(Y));
}

bool same_or_absent(const NodeInfo& n, size_t i, DType d) {
  return n.dtype(i) == DType::kUndefined || n.dtype(i) == d;
}

// Byte X and W, zero points of their dtypes, X of rank 3 or 4 (or not known yet).
bool conv_accepts(const NodeInfo& n, const ConvInputs& in) {
  if (n.inputs.size() <= in.w || !is_byte(n.dtype(in.x)) || !is_byte(n.dtype(in.w))) return false;
  if (!same_or_absent(n, in.x_zp, n.dtype(in.x)) || !same_or_absent(n, in.w_zp, n.dtype(in.w)))
    return false;
  const int64_t r = rank_of(n.inputs[in.x]);
  if (r >= 0 && r != 3 && r != 4) return false;
  if (in.y_scale < 0) return n.outputs.size() == 1 && n.outputs[0].dtype == DType::kI32;
  if (n.inputs.size() < 8 || !is_byte(n.dtype(in.y_zp))) return false;
  for (int s : {in.x_scale, in.w_scale, in.y_scale})
    if (n.dtype(s) != DType::kF32) return false;
  if (!same_or_absent(n, in.bias, DType::kI32)) return false;
  return n.outputs.size() == 1 && n.outputs[0].dtype == n.dtype(in.y_zp);
}

Kernel conv_kernel(const ConvInputs& in) {
  Kernel k;
  k.accepts = [in](const NodeInfo& n) { return conv_accepts(n, in); };
  k.prepare = [in](const NodeInfo& n) { return prepare_w(n, in.w); };
  k.run = [in](const KernelContext& c) { return conv_int8(c, in); };
  k.reference_at_run_time = true;
  k.packed_inputs = [](const std::any& s) {
    return s.has_value() ? std::vector<size_t>{std::any_cast<const PreparedConvW&>(s).input}
                         : std::vector<size_t>{};
  };
  k.packed_bytes = [](const std::any& s) {
    size_t b = 0;
    if (s.has_value())
      for (const PackedI8B& p : std::any_cast<const PreparedConvW&>(s).groups) b += p.bytes();
    return b;
  };
  k.unpack = unpack_w;
  k.describe = [](const std::any& s) {
    if (!s.has_value()) return std::string("int8 implicit GEMM or depthwise loop");
    return std::string(igemm_uses_vnni() ? "int8 implicit GEMM (VNNI)"
                                         : "int8 implicit GEMM (widening)");
  };
  return k;
}

}  // namespace

void register_quant_conv_kernels(KernelRegistry& r) {
  r.add("ConvInteger", conv_kernel(kConvInteger));
  r.add("QLinearConv", conv_kernel(kQLinearConv));
}

}  // namespace pto::cpu
