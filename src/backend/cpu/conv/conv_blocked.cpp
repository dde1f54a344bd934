// The CPU kernels of the blocked-channel layout (src/ir/ops/blocked_layout.cpp): ReorderToBlocked,
// ReorderFromBlocked and ConvBlocked (float32). ConvBlocked is a direct convolution
// (conv_blocked_impl.h), parallel over (image, output channel block, output row) in fixed chunks;
// a fused residual and activation are applied to each output row while it is in L1. A 3x3,
// stride-1 conv where the cost rule says so runs as Winograd F(4x4, 3x3) instead (winograd.h),
// on weights transformed in prepare().
#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/conv/winograd.h"
#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/movement/transpose.h"
#include "backend/cpu/scratch.h"
#include "ir/ops/op_params.h"
#include "ir/ops/window.h"
#include "pto/parallel.h"

namespace pto::cpu {

void to_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t b) {
  const int64_t cb = (c + b - 1) / b;
  if (hw == 1) {  // [N, C, 1, 1] into [N, Cb, 1, 1, b]: each image's channels, then zero lanes
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(y + i * cb * b, x + i * c, c * sizeof(float));
      std::fill(y + i * cb * b + c, y + (i + 1) * cb * b, 0.0f);
    }
    return;
  }
  parallel_for(0, n * cb, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t ch0 = t % cb * b, lanes = std::min(b, c - ch0);
      float* yb = y + t * hw * b;
      if (lanes < b) std::fill(yb, yb + hw * b, 0.0f);
      // yb[p * b + i] = x plane i's pixel p: a transpose of [lanes, hw] into [hw, b]
      PTO_ISA_DISPATCH(transpose_strip_4,
                       reinterpret_cast<const uint32_t*>(x + (t / cb * c + ch0) * hw), hw,
                       reinterpret_cast<uint32_t*>(yb), b, hw, lanes);
    }
  });
}

void from_blocked(const float* x, float* y, int64_t n, int64_t c, int64_t hw, int64_t b) {
  const int64_t cb = (c + b - 1) / b;
  if (hw == 1) {  // [N, Cb, 1, 1, b] is [N, C, 1, 1] with padded lanes at the end of each image
    for (int64_t i = 0; i < n; ++i) std::memcpy(y + i * c, x + i * cb * b, c * sizeof(float));
    return;
  }
  parallel_for(0, n * cb, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t ch0 = t % cb * b, lanes = std::min(b, c - ch0);
      // plane i's pixel p = xb[p * b + i]: [hw, b] (its first lanes) into [lanes, hw]
      PTO_ISA_DISPATCH(transpose_strip_4, reinterpret_cast<const uint32_t*>(x + t * hw * b), b,
                       reinterpret_cast<uint32_t*>(y + (t / cb * c + ch0) * hw), hw, lanes, hw);
    }
  });
}

namespace {

bool is_f32(const NodeInfo& info, size_t i) {
  return info.dtype(i) == DType::kF32;
}

bool rank_is(const NodeInfo& info, size_t i, size_t rank) {
  return info.inputs[i].shape && info.inputs[i].shape->size() == rank;
}

std::vector<Tensor> run_to_blocked(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t b = c.attrs().get_int("block");
  if (x.rank() != 4 || b < 1)
    throw ValueError(cat(c.where(), ": X must be [N, C, H, W] and block >= 1, got ", x.str()));
  const int64_t cb = (x.dim(1) + b - 1) / b;
  Tensor y = Tensor::empty(DType::kF32, {x.dim(0), cb, x.dim(2), x.dim(3), b});
  to_blocked(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3), b);
  return one(std::move(y));
}

std::vector<Tensor> run_from_blocked(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t ch = c.attrs().get_int("channels");
  if (x.rank() != 5 || ch > x.dim(1) * x.dim(4) || ch <= (x.dim(1) - 1) * x.dim(4))
    throw ValueError(
        cat(c.where(), ": X must be [N, Cb, H, W, c] with ", ch, " channels, got ", x.str()));
  Tensor y = Tensor::empty(DType::kF32, {x.dim(0), ch, x.dim(2), x.dim(3)});
  from_blocked(x.data<float>(), y.data<float>(), x.dim(0), ch, x.dim(2) * x.dim(3), x.dim(4));
  return one(std::move(y));
}

// The window of g's kh x kw kernel on its ih x iw input, from the node's strides, pads and
// dilations: the output size, strides, dilations and leading pads.
void set_window(BlockedConv& g, const Attributes& attrs, const std::string& where) {
  const window::Params p = window::read_params(attrs, {g.kh, g.kw}, false, where);
  const window::Axis ay = window::forward_axis(p, 0, g.ih, where);
  const window::Axis ax = window::forward_axis(p, 1, g.iw, where);
  g.oh = ay.out;
  g.ow = ax.out;
  g.sh = p.strides[0];
  g.sw = p.strides[1];
  g.dh = p.dilations[0];
  g.dw = p.dilations[1];
  g.ph = ay.pad_begin;
  g.pw = ax.pad_begin;
}

// The ConvBlocked geometry from X, W, the window attributes and `group`; throws ValueError when
// they disagree.
BlockedConv blocked_geometry(const Tensor& x, const Tensor& w, const Attributes& attrs,
                             int64_t group, const std::string& where) {
  BlockedConv g;
  g.channels = attrs.get_int("channels");
  g.depthwise = w.rank() == 5;
  g.x_nchw = x.rank() == 4;  // [N, C, H, W] with C <= block: a group-1 conv on one input block
  const bool nchw_fits = g.x_nchw && w.rank() == 6 && w.dim(1) == 1 && w.dim(4) == w.dim(5) &&
                         group == 1 && g.channels == x.dim(1) && x.dim(1) <= w.dim(4);
  const bool blocked_fits =
      x.rank() == 5 && (w.rank() == 5 || w.rank() == 6) && x.dim(4) == w.dim(-1) &&
      g.channels <= x.dim(1) * x.dim(4) && g.channels > (x.dim(1) - 1) * x.dim(4) &&
      (g.depthwise
           ? w.dim(0) == x.dim(1) && w.dim(1) == 1 && group == g.channels
           : w.dim(4) == x.dim(4) && group >= 1 && w.dim(1) * group == x.dim(1) &&
                 w.dim(0) % group == 0 && (group == 1 || g.channels == x.dim(1) * x.dim(4)));
  const bool fits = nchw_fits || blocked_fits;
  g.groups = g.depthwise ? 1 : group;
  if (!fits)
    throw ValueError(cat(where, ": X ", x.str(), " and W ", w.str(), " do not fit ", g.channels,
                         " channels in ", group, " groups"));
  g.n = x.dim(0);
  g.icb = g.x_nchw ? 1 : x.dim(1);
  g.ih = x.dim(2);
  g.iw = x.dim(3);
  g.block = g.x_nchw ? w.dim(4) : x.dim(4);
  g.ocb = w.dim(0);
  g.kh = w.dim(2);
  g.kw = w.dim(3);
  set_window(g, attrs, where);
  return g;
}

}  // namespace

bool row_epilogue(const Epilogue& ep, RowEpilogue* e) {
  if (ep.tile || ep.bias_kind != Epilogue::Bias::kNone) return false;
  if (ep.act != Activation::kNone && ep.act != Activation::kRelu && ep.act != Activation::kClip)
    return false;
  e->residual = ep.residual;
  e->scale = ep.residual_scale;
  e->clamp = ep.act != Activation::kNone;
  e->lo = ep.act == Activation::kClip ? ep.lo : 0.0f;
  e->hi = ep.act == Activation::kClip ? ep.hi : std::numeric_limits<float>::infinity();
  return true;
}

namespace {

// The fused residual and activation on floats [at, at + count) of each plane of blocks [o0, o1) of
// image n of a blocked output [N, ocb, OH, OW, c] (`plane` = OH * OW * c floats), while they are
// in L1.
void span_epilogues(const Epilogue& ep, float* y, int64_t n, int64_t ocb, int64_t plane, int64_t at,
                    int64_t count, int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const int64_t off = (n * ocb + o) * plane + at;
    Epilogue e = ep;
    if (ep.residual) e.residual = ep.residual + off;
    e.ldr = count;
    apply_epilogue(e, y + off, count, 0, 1, 0, count);
  }
}

// The same on output row oy (`row` = OW * c floats).
void row_epilogues(const Epilogue& ep, float* y, int64_t n, int64_t ocb, int64_t oh, int64_t oy,
                   int64_t row, int64_t o0, int64_t o1) {
  span_epilogues(ep, y, n, ocb, oh * row, oy * row, row, o0, o1);
}

}  // namespace

// Output pixels up to which a pointwise conv's plane runs as one row (conv_blocked_rows, and the
// project half of DwPwConvBlocked).
constexpr int64_t kFlatPointwisePlane = 16;
// Output rows up to which a padded stride-1 depthwise conv reads a padded copy of its input
// (conv_blocked_rows).
constexpr int64_t kPaddedDepthwiseWidth = 14;
// The same for 7-wide windows (FastViT, ConvNeXt, MNASNet's 7x7 blocks): their 3 pixels a side
// run on the checked single-pixel path otherwise (56x56 planes 1.07x, 28x28 1.2x ONNX Runtime's
// time; 1.0x with the copy, Zen 4).
constexpr int64_t kPaddedDepthwiseWidth7 = 64;
// Output pixels up to which DwPwConvBlocked projects runs of rows as one row (below).
constexpr int64_t kFlatDwPwPlane = 576;

namespace {
// Small planes leave most pixels of a depthwise row to the checked one-pixel path (a 7x7 plane's
// 5x5 window: 4 of 7), which loads each tap's input and weight per multiply-add and branches per
// tap. For a padded stride-1 3x3 or 5x5 depthwise conv with rows of at most
// kPaddedDepthwiseWidth, x is copied into a zero-padded tensor (a per-thread buffer of the
// caller's) and g changed to read it without pads, so every pixel takes the windowed register
// blocks; otherwise x and g stay as they are. EfficientNet-B0, level 3, 1 thread, per-kernel
// minima of 20 calls alternated in one process: 5x5 + SiLU 1152 @7 122-130 -> 90-95 us, 672 @14
// 165 -> 140-145, 480 @14 119 -> 102; 3x3 1152 @7 at par; at stride 2 the copy of the larger
// input cost more than the edges (240 @28 -> 14 3x3 42 -> 77 us), so those keep the checked path.
// padded_geometry: the geometry of that copy, or nullopt where g reads x as it is.
std::optional<BlockedConv> padded_geometry(const BlockedConv& g) {
  if (!(g.depthwise && !g.x_nchw && g.ring == 0 && (g.ph > 0 || g.pw > 0) &&
        (g.kw == 3 || g.kw == 5 || g.kw == 7) && g.dw == 1 && g.sw == 1 &&
        g.ow <= (g.kw == 7 ? kPaddedDepthwiseWidth7 : kPaddedDepthwiseWidth)))
    return std::nullopt;
  BlockedConv p = g;
  p.ih = std::max(g.ih + g.ph, (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1);
  p.iw = std::max(g.iw + g.pw, (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1);
  p.ph = p.pw = 0;
  return p;
}

// One channel block's plane of g (`src`) into the zero-padded plane of p (`dst`).
void pad_plane(const BlockedConv& g, const BlockedConv& p, const float* src, float* dst) {
  const int64_t row_in = g.iw * g.block, row_out = p.iw * g.block;
  std::fill(dst, dst + g.ph * row_out, 0.0f);
  for (int64_t iy = 0; iy < g.ih; ++iy) {
    float* dr = dst + (g.ph + iy) * row_out;
    std::fill(dr, dr + g.pw * g.block, 0.0f);
    std::memcpy(dr + g.pw * g.block, src + iy * row_in, row_in * sizeof(float));
    std::fill(dr + g.pw * g.block + row_in, dr + row_out, 0.0f);
  }
  std::fill(dst + (g.ph + g.ih) * row_out, dst + p.ih * p.iw * g.block, 0.0f);
}

// The copy of every plane of x (a job of its own), g changed to read it; x where none applies.
const float* padded_depthwise_input(BlockedConv& g, const float* x) {
  const std::optional<BlockedConv> p = padded_geometry(g);
  if (!p) return x;
  const int64_t src = g.ih * g.iw * g.block, dst = p->ih * p->iw * g.block;
  static thread_local ScratchBuffer padded;  // the caller's: the workers write into it
  float* xp = padded.get_as<float>(g.n * g.icb * dst);
  parallel_for(0, g.n * g.icb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) pad_plane(g, *p, x + b * src, xp + b * dst);
  });
  g = *p;
  return xp;
}

// PTO_DWPW_FLAT=0 keeps DwPwConvBlocked's small planes row by row (A/B); unset or 1 projects
// them as one row. Anything else is an error.
bool dwpw_flat_enabled() {
  return env_switch("PTO_DWPW_FLAT");
}

// PTO_DWPW_CHANNEL_SPLIT=0 keeps DwPwConvBlocked's small planes whose rows the threads do not
// split evenly in runs of pixels (A/B); unset or 1 splits their two halves apart (below).
bool dwpw_channel_split_enabled() {
  return env_switch("PTO_DWPW_CHANNEL_SPLIT");
}
}  // namespace

void conv_blocked_rows(const BlockedConv& g, const float* x, const float* w, const float* bias,
                       float* y, const Epilogue& ep, const PairOperands* pairs) {
  // A 1x1 conv (stride 1, no pads) on a plane of at most kFlatPointwisePlane pixels runs as
  // one row of all its pixels, which lie that way in memory: a 3x3 plane's three 3-pixel rows
  // each read the weights of a set of output blocks and filled 3 of the register block's 7
  // pixels. MobileNetV2 at 96x96, level 3, 1 thread (200 calls, load 2.9): 160 -> 960 @3x3
  // 45.8 -> 36.8-39.2 us, 320 -> 1280 @3x3 107.5 -> 85.8; the model 1.65-1.69 -> 1.60-1.68 ms
  // (4 alternated rounds). On 6x6 planes at par, with 12x12 ones slower: kept to the smallest.
  if (!g.depthwise && !g.x_nchw && g.ring == 0 && g.kh == 1 && g.kw == 1 && g.sh == 1 &&
      g.sw == 1 && g.ph == 0 && g.pw == 0 && g.oh == g.ih && g.ow == g.iw && g.oh > 1 &&
      g.oh * g.ow <= kFlatPointwisePlane) {
    BlockedConv f = g;
    f.iw = f.ow = g.ih * g.iw;
    f.ih = f.oh = 1;
    return conv_blocked_rows(f, x, w, bias, y, ep, pairs);
  }
  const int64_t row = g.ow * g.block;
  RowEpilogue fused;
  const bool in_regs = row_epilogue(ep, &fused);
  const bool has_rest = !in_regs && (ep.residual || ep.act != Activation::kNone);
  const RowEpilogue* e = in_regs ? &fused : nullptr;
  // A padded small depthwise conv (padded_geometry) reads zero-padded planes. With enough planes
  // for the threads, each task copies its plane into a buffer of its thread's and computes every
  // row from it while it is in L1 (a copy job before the rows, into one shared buffer, cost 3-6x
  // more a plane on 2 threads than on 1: DwPwConvBlocked's halves); else the copy job.
  if (const std::optional<BlockedConv> p = pairs ? std::nullopt : padded_geometry(g)) {
    if (g.n * g.ocb < 4 * num_threads()) {
      BlockedConv padded = g;
      return conv_blocked_rows(padded, padded_depthwise_input(padded, x), w, bias, y, ep);
    }
    BlockedConv one_plane = *p;
    one_plane.n = one_plane.icb = one_plane.ocb = 1;
    const int64_t in_plane = g.ih * g.iw * g.block, out_plane = g.oh * row;
    const int64_t taps = g.kh * g.kw * g.block;
    parallel_for(0, g.n * g.ocb, 1, [&](int64_t t0, int64_t t1) {
      float* xp = scratch_as<float>(static_cast<size_t>(p->ih * p->iw * g.block));
      for (int64_t t = t0; t < t1; ++t) {  // t: image t / ocb, channel block t % ocb
        const int64_t o = t % g.ocb;
        pad_plane(g, *p, x + t * in_plane, xp);
        RowEpilogue eo = fused;
        if (eo.residual) eo.residual += t * out_plane;
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          if (!PTO_ISA_DISPATCH(conv_blocked_row, one_plane, xp, w + o * taps,
                                bias ? bias + o * g.block : nullptr, y + t * out_plane, 0, 0, 1, oy,
                                e ? &eo : nullptr))
            generic::conv_blocked_row(one_plane, xp, w + o * taps,
                                      bias ? bias + o * g.block : nullptr, y + t * out_plane, 0, 0,
                                      1, oy, e ? &eo : nullptr);
          if (has_rest) row_epilogues(ep, y, t / g.ocb, g.ocb, g.oh, oy, row, o, o + 1);
        }
      }
    });
    return;
  }
  // Tasks: (image, set of output blocks, output row), rows fastest so that consecutive tasks
  // of a chunk reuse the set's weights. A general conv computes four blocks per task (the
  // kernel's register block); a depthwise one, one.
  const int64_t per = g.depthwise ? 1 : 4, sets = (g.ocb + per - 1) / per;
  parallel_for(0, g.n * sets * g.oh, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t oy = t % g.oh, ob = t / g.oh % sets * per, n = t / (g.oh * sets);
      const int64_t obs = std::min(per, g.ocb - ob);
      if (pairs) {
        const int64_t off = ((n * g.ocb + ob) * g.oh + oy) * row;
        RowEpilogue eo = e ? *e : RowEpilogue{};
        if (eo.residual) eo.residual += off;
        avx512::conv_blocked_row_pairs(g, *pairs, bias, y + off, g.oh * row, n, ob, obs, oy,
                                       e ? &eo : nullptr);
      } else if (!PTO_ISA_DISPATCH(conv_blocked_row, g, x, w, bias, y, n, ob, obs, oy, e)) {
        generic::conv_blocked_row(g, x, w, bias, y, n, ob, obs, oy, e);
      }
      if (has_rest) row_epilogues(ep, y, n, g.ocb, g.oh, oy, row, ob, ob + obs);
    }
  });
}

namespace {

BlockedConv blocked_geometry(const KernelContext& c) {
  return blocked_geometry(c.input(0), c.input(1), c.attrs(), c.attrs().get_int("group", 1),
                          c.where());
}

// What prepare() makes once for a ConvBlocked with constant weights: Winograd's U where the cost
// rule may choose it, and for precision="bf16" (not depthwise) the weights rounded to bf16.
struct ConvBlockedState {
  std::optional<WinogradWeights> winograd;
  // W as pair words (PairOperands, `words` a pixel) where the compiling machine runs bf16 pairs;
  // else W rounded to bf16 and kept as floats (words 0): the fp32 kernel on rounded operands
  // computes the same products.
  std::shared_ptr<uint8_t[]> bf16;
  size_t bf16_bytes = 0;
  int64_t words = 0;
  Dims w_shape;  // W's: with bf16, run() never reads W itself (packed_inputs), unpack() rebuilds it

  size_t bytes() const { return (winograd ? winograd->bytes() : 0) + bf16_bytes; }
  // The direct kernel's name (the profiler's tag is the first word: [direct/bf16]).
  std::string direct() const {
    return !bf16 ? "direct" : words > 0 ? "direct/bf16 pairs" : "direct/bf16-rounded";
  }
  std::string describe() const {
    if (!winograd) return direct();
    const std::string w = winograd->describe();  // "..., else direct" where both run
    return bf16 && w.ends_with("direct") ? w.substr(0, w.size() - 6) + direct() : w;
  }
};

// Whether bf16 pairs run here: block 16 on the avx512 kernels with AVX512_BF16.
bool pairs_run(int64_t block) {
  return block == 16 && has_ext(Ext::kAvx512Bf16);
}

// Whether a call of geometry g runs Winograd: U prepared, and the cost rule takes it (against the
// pairs where those run, which are faster than the fp32 direct kernel).
bool takes_winograd(const ConvBlockedState* st, const BlockedConv& g) {
  return st && st->winograd &&
         (st->winograd->always || winograd_pays(g, st->words > 0 && pairs_run(g.block)));
}

// Pair words of blocked weights w [ocb, icb, kh, kw, 16, 16] (input lanes past `channels` zero;
// an NCHW stem's W has icb 1 and `words` = ceil(C / 2)): [ocb, icb, kh, kw, words, 16].
void pack_weight_pairs(const Tensor& w, int64_t channels, int64_t groups, int64_t words,
                       uint32_t* dst) {
  const int64_t icb = w.dim(1), taps = w.dim(2) * w.dim(3), rows = w.dim(0) * icb * taps;
  const float* src = w.data<float>();
  auto bits = [](float v) { return static_cast<uint32_t>(BFloat16::from_float(v)); };
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t ib = r / taps % icb;
    // Grouped convs have whole blocks; a group-1 conv's last block may hold fewer lanes.
    const int64_t lanes = groups > 1 ? 16 : std::clamp<int64_t>(channels - ib * 16, 0, 16);
    const float* t = src + r * 256;
    for (int64_t p = 0; p < words; ++p)
      for (int64_t j = 0; j < 16; ++j) {
        const uint32_t lo = 2 * p < lanes ? bits(t[2 * p * 16 + j]) : 0;
        const uint32_t hi = 2 * p + 1 < lanes ? bits(t[(2 * p + 1) * 16 + j]) : 0;
        dst[(r * words + p) * 16 + j] = lo | hi << 16;
      }
  }
}

// The inverse of pack_weight_pairs: `rows` tap rows of `words` pair words into blocked floats
// [rows, 16, 16] (lanes past 2 * words zero). Exact on bf16 values: rounded W as the node's
// precision reads it.
void widen_weight_pairs(const uint32_t* src, int64_t rows, int64_t words, float* dst) {
  std::fill(dst, dst + rows * 256, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t p = 0; p < words; ++p)
      for (int64_t j = 0; j < 16; ++j) {
        const uint32_t word = src[(r * words + p) * 16 + j];
        dst[r * 256 + 2 * p * 16 + j] = std::bit_cast<float>(word << 16);
        if (2 * p + 1 < 16)
          dst[r * 256 + (2 * p + 1) * 16 + j] = std::bit_cast<float>(word & 0xffff0000u);
      }
}

// W as the fp32 kernel reads it from bf16 weights prepared as pair words (`words` > 0, into `b`)
// or rounded floats.
const float* bf16_weights_as_floats(const std::shared_ptr<uint8_t[]>& w, int64_t words,
                                    int64_t numel, ScratchBuffer& b) {
  if (words == 0) return reinterpret_cast<const float*>(w.get());
  float* dst = b.get_as<float>(static_cast<size_t>(numel));
  widen_weight_pairs(reinterpret_cast<const uint32_t*>(w.get()), numel / 256, words, dst);
  return dst;
}

// Blocked W as the bf16 kernels hold it: `words` pair words a tap row (pack_weight_pairs) where
// the pairs run, else (words 0) rounded to bf16 and kept as floats; its bytes added to `bytes`.
std::shared_ptr<uint8_t[]> bf16_weights(const Tensor& w, int64_t channels, int64_t groups,
                                        int64_t words, size_t& bytes) {
  const size_t n = static_cast<size_t>(words > 0 ? w.numel() / 256 * words * 16 * 4
                                                 : w.numel() * static_cast<int64_t>(sizeof(float)));
  std::shared_ptr<uint8_t[]> m = panel_memory(n);
  if (words > 0) {
    pack_weight_pairs(w, channels, groups, words, reinterpret_cast<uint32_t*>(m.get()));
  } else {
    std::memcpy(m.get(), w.data<float>(), n);
    round_to_bf16(reinterpret_cast<float*>(m.get()), w.numel());
  }
  bytes += n;
  return m;
}

// The weights bf16_weights() made, back as a tensor of `shape` (the kernels' unpack()): exact,
// since the rounded W is what a bf16 node reads.
Tensor bf16_weights_tensor(const std::shared_ptr<uint8_t[]>& m, const Dims& shape, int64_t words) {
  Tensor w = Tensor::empty(DType::kF32, shape);
  if (words > 0)
    widen_weight_pairs(reinterpret_cast<const uint32_t*>(m.get()), w.numel() / 256, words,
                       w.data<float>());
  else
    std::memcpy(w.data<float>(), m.get(), w.nbytes());
  return w;
}

// X as pair words (conv_isa.h PairOperands), in a buffer of the caller's thread.
const uint32_t* input_pairs(const BlockedConv& g, const float* x, int64_t words) {
  static thread_local ScratchBuffer buffer;  // the caller's: the workers write into it
  const int64_t hw = g.ih * g.iw;
  uint32_t* dst = buffer.get_as<uint32_t>(static_cast<size_t>(g.n * g.icb * hw * words));
  if (g.x_nchw) {  // [N, C, H, W]: image by image, in runs of rows
    const int64_t runs = std::max<int64_t>(1, std::min<int64_t>(g.ih, 4 * num_threads()));
    parallel_for(0, g.n * runs, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = t / runs, r = t % runs;
        const int64_t p0 = r * g.ih / runs * g.iw, p1 = (r + 1) * g.ih / runs * g.iw;
        avx512::planes_to_pairs(x + n * g.channels * hw + p0, g.channels, p1 - p0, hw,
                                dst + (n * hw + p0) * words);
      }
    });
    return dst;
  }
  parallel_for(0, g.n * g.icb, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t lanes = std::clamp<int64_t>(g.channels - t % g.icb * 16, 0, 16);
      avx512::blocked_to_pairs(x + t * hw * 16, hw, lanes, dst + t * hw * words);
    }
  });
  return dst;
}

// A copy of n floats rounded to bf16, in buffer `b` (the fp32 kernel on bf16 operands).
const float* rounded_copy(ScratchBuffer& b, const float* v, int64_t n) {
  float* r = b.get_as<float>(static_cast<size_t>(n));
  parallel_for(0, n, 1 << 16, [&](int64_t i0, int64_t i1) {
    std::memcpy(r + i0, v + i0, (i1 - i0) * sizeof(float));
    round_to_bf16(r + i0, i1 - i0);
  });
  return r;
}

std::vector<Tensor> run_conv_blocked(const KernelContext& c) {
  const BlockedConv g = blocked_geometry(c);
  const float* bias = nullptr;
  if (c.has_input(2)) {
    if (c.input(2).numel() != g.ocb * g.block)
      throw ValueError(
          cat(c.where(), ": B must have ", g.ocb * g.block, " elements, got ", c.input(2).str()));
    bias = c.input(2).data<float>();
  }
  const Dims yshape = {g.n, g.ocb, g.oh, g.ow, g.block};
  if (c.epilogue && c.epilogue->bias.defined())
    throw KernelDeclined(cat(c.where(), ": a fused bias is not supported on blocked tensors"));
  const Epilogue ep = conv_epilogue(c.epilogue, yshape, c.where());
  Tensor y = Tensor::empty(DType::kF32, yshape);
  const float *x = c.input(0).data<float>(), *w = c.input(1).data<float>();
  float* yp = y.data<float>();
  const ConvBlockedState* st =
      c.state && c.state->has_value() ? &c.prepared<ConvBlockedState>() : nullptr;
  // precision="bf16" (prepared with a constant W; the attribute read only without one): products
  // of X and W rounded to bf16, whichever kernel computes them.
  const bool bf16 =
      st ? st->bf16 != nullptr : !g.depthwise && params::product_precision(c.node) == DType::kBF16;
  static thread_local ScratchBuffer xr, wr;  // the caller's: the workers write into them
  if (takes_winograd(st, g)) {
    const WinogradWeights& u = *st->winograd;  // of the rounded W under bf16
    PTO_CHECK(winograd_applies(g) && u.channels == g.channels && u.out == g.ocb * g.block)
        << c.where() << ": Winograd weights prepared for another geometry";
    winograd_conv(g, u, bf16 ? rounded_copy(xr, x, c.input(0).numel()) : x, bias, yp, ep);
    return one(std::move(y));
  }
  if (!bf16) {
    conv_blocked_rows(g, x, w, bias, yp, ep);
    return one(std::move(y));
  }
  if (st && st->words > 0 && pairs_run(g.block)) {
    const PairOperands op{input_pairs(g, x, st->words),
                          reinterpret_cast<const uint32_t*>(st->bf16.get()), st->words};
    conv_blocked_rows(g, x, w, bias, yp, ep, &op);
    return one(std::move(y));
  }
  // The fp32 kernel on operands rounded to bf16: W as prepared (widened from pair words prepared
  // for a machine with AVX512_BF16 running without it), or rounded now without a state.
  const float* wb = st ? bf16_weights_as_floats(st->bf16, st->words, c.input(1).numel(), wr)
                       : rounded_copy(wr, w, c.input(1).numel());
  conv_blocked_rows(g, rounded_copy(xr, x, c.input(0).numel()), wb, bias, yp, ep);
  return one(std::move(y));
}

// An activation attribute pair ("", "Relu" or "Clip" with bounds `min`/`max`) as a register clamp
// (false: none).
bool clamp_attrs(const KernelContext& c, const std::string& name, const char* min, const char* max,
                 RowEpilogue& e) {
  const std::string act = c.attrs().get_string(name, "");
  if (!act.empty() && act != "Relu" && act != "Clip")
    throw ValueError(cat(c.where(), ": ", name, " must be \"\", Relu or Clip, got ", act));
  e.clamp = true;
  e.lo = act == "Clip" ? static_cast<float>(c.attrs().get_float(min)) : 0.0f;
  e.hi = act == "Clip" ? static_cast<float>(c.attrs().get_float(max))
                       : std::numeric_limits<float>::infinity();
  return !act.empty();
}

// What prepare() makes once for a DwPwConvBlocked with precision="bf16" (its 1x1 convs': the
// depthwise conv stays fp32): the projection's and the expansion's weights as pair words where
// bf16 pairs run, else rounded to bf16 as floats (see ConvBlockedState).
struct DwPwState {
  std::shared_ptr<uint8_t[]> wp, we;  // we: with an expansion
  Dims wp_shape, we_shape;            // run() reads these copies only (packed_inputs)
  size_t bytes = 0;
  bool pairs = false;
};

std::any prepare_dw_pw_conv_blocked(const NodeInfo& info) {
  if (params::product_precision(info.node) != DType::kBF16 || !info.is_constant(3)) return {};
  const bool expand = info.inputs.size() > 5;
  if (expand && !info.is_constant(5)) return {};
  const Tensor& wp = *info.constants[3];
  if (wp.rank() != 6 || wp.dim(4) != wp.dim(5)) return {};  // run() reports it
  DwPwState st;
  st.pairs = pairs_run(wp.dim(4));
  st.wp_shape = wp.shape();
  st.wp = bf16_weights(wp, info.node.attrs.get_int("channels"), 1, st.pairs ? 8 : 0, st.bytes);
  if (expand) {
    const Tensor& we = *info.constants[5];
    if (we.rank() != 6 || we.dim(4) != wp.dim(4)) return {};
    st.we_shape = we.shape();
    st.we =
        bf16_weights(we, info.node.attrs.get_int("expand_channels"), 1, st.pairs ? 8 : 0, st.bytes);
  }
  return st;
}

// `blocks` consecutive block planes of `pixels` pixels (of `channels` real lanes from the first)
// as bf16 pair words, or rounded to bf16 in place where the pairs do not run (`dst` null).
void mid_to_bf16(float* mid, int64_t blocks, int64_t pixels, int64_t channels, uint32_t* dst) {
  for (int64_t b = 0; b < blocks; ++b) {
    if (dst)
      avx512::blocked_to_pairs(mid + b * pixels * 16, pixels,
                               std::clamp<int64_t>(channels - b * 16, 0, 16), dst + b * pixels * 8);
    else
      round_to_bf16(mid + b * pixels * 16, pixels * 16);
  }
}

// DwPwConvBlocked: per output row, the depthwise conv of every channel block into a row buffer
// (one row of a blocked image: [Cb, 1, OW, c]), the activation on it while it is in L1, then the
// 1x1 conv of that row into the output, four output blocks at a time, and the fused residual and
// activation. Tasks are (image, output row).
// With an expansion (inputs We, Be), the depthwise conv reads a per-thread ring of the expanded
// rows it needs ((KH - 1) * DH + 1 rows per channel block): each output row first computes the
// expanded rows (1x1 conv and its activation, four blocks at a time) that the ring lacks, so
// consecutive rows of a task compute each expanded row once and the expanded tensor is never
// written out. Tasks then come in chunks of consecutive rows (at most two per thread), since a
// chunk recomputes the rows it shares with the one before it.
std::vector<Tensor> run_dw_pw_conv_blocked(const KernelContext& c) {
  const std::string where = c.where();
  const Tensor &x = c.input(0), &wd = c.input(1), &bd = c.input(2), &wp = c.input(3),
               &bp = c.input(4);
  const bool expand = c.has_input(5);
  BlockedConv ge;  // the expansion: a 1x1 conv of X into the ring
  BlockedConv gd;
  if (expand) {
    const Tensor &we = c.input(5), &be = c.input(6);
    Attributes ea;
    ea.set("kernel_shape", Dims{1, 1});
    ea.set("channels", c.attrs().get_int("expand_channels"));
    ge = blocked_geometry(x, we, ea, 1, where);
    if (ge.depthwise || ge.x_nchw || we.dim(2) != 1 || we.dim(3) != 1 ||
        be.numel() != ge.ocb * ge.block)
      throw ValueError(
          cat(where, ": the expansion ", we.str(), ", ", be.str(), " does not fit ", x.str()));
    // The depthwise conv's geometry on the expanded tensor [N, ge.ocb, H, W, c].
    gd.channels = c.attrs().get_int("channels");
    gd.depthwise = true;
    gd.n = ge.n;
    gd.icb = gd.ocb = ge.ocb;
    gd.ih = ge.ih;
    gd.iw = ge.iw;
    gd.block = ge.block;
    if (wd.rank() != 5 || wd.dim(0) != ge.ocb || wd.dim(1) != 1 || wd.dim(4) != ge.block ||
        gd.channels > ge.ocb * ge.block || gd.channels <= (ge.ocb - 1) * ge.block)
      throw ValueError(cat(where, ": the depthwise weights ", wd.str(), " do not fit ", gd.channels,
                           " expanded channels"));
    gd.kh = wd.dim(2);
    gd.kw = wd.dim(3);
    set_window(gd, c.attrs(), where);
    gd.ring = (gd.kh - 1) * gd.dh + 1;
  } else {
    gd = blocked_geometry(x, wd, c.attrs(), c.attrs().get_int("channels"), where);
  }
  if (!gd.depthwise || wp.rank() != 6 || wp.dim(1) != gd.ocb || wp.dim(2) != 1 || wp.dim(3) != 1 ||
      wp.dim(4) != gd.block || wp.dim(5) != gd.block || bd.numel() != gd.ocb * gd.block ||
      bp.numel() != wp.dim(0) * gd.block)
    throw ValueError(cat(where, ": the 1x1 weights ", wp.str(), " or the biases ", bd.str(), ", ",
                         bp.str(), " do not fit the depthwise conv of ", x.str()));
  // A small output plane (at most kFlatDwPwPlane pixels) runs flat (below). With fewer images
  // than threads, its work splits per image: runs of equal pixel counts where the plane has two
  // rows a split or more, else parts with as many output blocks each; where runs would not
  // divide the rows, or parts would each compute the whole depthwise conv again, the two halves
  // split apart instead (`halves`).
  const bool flat = !expand && gd.oh > 1 && gd.oh * gd.ow <= kFlatDwPwPlane && dwpw_flat_enabled();
  const int64_t split = std::max<int64_t>(1, (num_threads() + gd.n - 1) / gd.n);
  const int64_t runs = split > 1 && gd.oh >= 2 * split ? split : 1;
  const bool halves =
      flat && split > 1 && (runs == 1 || gd.oh % runs != 0) && dwpw_channel_split_enabled();
  // Without an expansion, small padded planes read a padded copy of X, as ConvBlocked does (the
  // halves pad each plane in the task that reads it).
  const std::optional<BlockedConv> gpad = halves ? padded_geometry(gd) : std::nullopt;
  const float* xp =
      expand || halves ? x.data<float>() : padded_depthwise_input(gd, x.data<float>());
  BlockedConv gp;  // the 1x1 conv on one row buffer
  gp.n = 1;
  gp.icb = gd.ocb;
  gp.ih = gp.oh = 1;
  gp.iw = gp.ow = gd.ow;
  gp.block = gd.block;
  gp.ocb = wp.dim(0);
  gp.kh = gp.kw = gp.sh = gp.sw = gp.dh = gp.dw = 1;
  gp.channels = gd.channels;
  RowEpilogue clamp_mid;  // the depthwise stage's activation, in registers
  const bool act_mid = clamp_attrs(c, "activation", "min", "max", clamp_mid);
  RowEpilogue clamp_e;  // the expansion's
  const bool act_e =
      expand && clamp_attrs(c, "expand_activation", "expand_min", "expand_max", clamp_e);
  const Dims yshape = {gd.n, gp.ocb, gd.oh, gd.ow, gd.block};
  if (c.epilogue && c.epilogue->bias.defined())
    throw KernelDeclined(cat(where, ": a fused bias is not supported on blocked tensors"));
  const Epilogue ep = conv_epilogue(c.epilogue, yshape, where);
  Tensor y = Tensor::empty(DType::kF32, yshape);
  float* yp = y.data<float>();
  const float *wdp = wd.data<float>(), *wpp = wp.data<float>();
  const float* wep = expand ? c.input(5).data<float>() : nullptr;
  const float* bep = expand ? c.input(6).data<float>() : nullptr;
  // precision="bf16": the 1x1 convs' products on bf16 operands (DwPwState; the depthwise conv
  // stays fp32). With pairs, X (the expansion's input) is converted once and each buffer of
  // depthwise rows before its projection; else both are rounded (the rows in place: the buffer
  // is this kernel's) and the weights are the rounded ones.
  const DwPwState* st = c.prepared_if<DwPwState>();
  if (!st && params::product_precision(c.node) == DType::kBF16)
    throw KernelDeclined(cat(where, ": bf16 products need constant 1x1 weights"));
  const bool pairs = st && st->pairs && pairs_run(gd.block), round_mid = st && !pairs;
  const uint32_t *wpw = nullptr, *wew = nullptr, *xw = nullptr;
  static thread_local ScratchBuffer xr, wpr, wer;  // the caller's: the workers write into them
  if (pairs) {
    wpw = reinterpret_cast<const uint32_t*>(st->wp.get());
    wew = reinterpret_cast<const uint32_t*>(st->we.get());
    if (expand) xw = input_pairs(ge, xp, 8);
  } else if (st) {  // the rounded floats (widened from pairs prepared where this run has none)
    wpp = bf16_weights_as_floats(st->wp, st->pairs ? 8 : 0, wp.numel(), wpr);
    if (expand) {
      wep = bf16_weights_as_floats(st->we, st->pairs ? 8 : 0, c.input(5).numel(), wer);
      xp = rounded_copy(xr, xp, x.numel());
    }
  }
  const int64_t row = gd.ow * gd.block, plane = gd.oh * row;
  const int64_t in_row = gd.iw * gd.block, ring_plane = gd.ring * in_row;
  RowEpilogue fused;
  const bool in_regs = row_epilogue(ep, &fused);
  const bool has_rest = !in_regs && (ep.residual || ep.act != Activation::kNone);
  auto conv_row = [](const BlockedConv& g, const float* in, const float* w, const float* b,
                     float* out, int64_t stride, int64_t n, int64_t ob, int64_t obs, int64_t oy,
                     const RowEpilogue* e) {
    if (!PTO_ISA_DISPATCH(conv_blocked_row_at, g, in, w, b, out, stride, n, ob, obs, oy, e))
      generic::conv_blocked_row_at(g, in, w, b, out, stride, n, ob, obs, oy, e);
  };
  // A 1x1 conv's row (the expansion or the projection) on fp32 operands, or on pair words `in_w`
  // and `w_w` where they are set.
  auto pw_row = [&](const BlockedConv& g, const float* in, const uint32_t* in_w, const float* w,
                    const uint32_t* w_w, const float* b, float* out, int64_t stride, int64_t n,
                    int64_t ob, int64_t obs, int64_t oy, const RowEpilogue* e) {
    if (in_w)
      avx512::conv_blocked_row_pairs(g, {in_w, w_w, 8}, b, out, stride, n, ob, obs, oy, e);
    else
      conv_row(g, in, w, b, out, stride, n, ob, obs, oy, e);
  };
  const int64_t sets = (gp.ocb + 3) / 4;
  // A small output plane (at most kFlatDwPwPlane pixels: MobileNetV2's at 96x96 from 24x24 on,
  // at 224x224 from 14x14 on) is computed in runs of pixels: the depthwise conv of the rows the
  // run's pixels lie in, then the 1x1 conv of the run as one row, so one pass over the project
  // weights (0.6-1.2 MB on 3x3 and 7x7 planes, from L3) serves every pixel of the run rather than
  // a 3- or 7-pixel row, and register blocks run across rows. Tasks are (image, run, part): runs
  // split the pixels, parts the output blocks, each part computing the (cheap) depthwise rows of
  // its run again.
  if (flat) {
    // A row shared by two runs has its depthwise conv computed twice (a 7x7 plane's runs of 24 +
    // 25 pixels: 4 depthwise rows and 4 register blocks of 7 pixels each, as 28 pixels had cost,
    // so no faster than a split of rows 3 + 4); parts split sets of four output blocks 4 + 6 of
    // 10 on two threads (MobileNetV2's 3x3 and 6x6 DwPw ran 1.25-1.4x faster on 2 threads).
    const int64_t parts = runs > 1 ? 1 : std::min(split, gp.ocb);
    const int64_t pixels = gd.oh * gd.ow;
    // The halves: the depthwise conv of the whole plane by channel blocks into one buffer, then
    // the projection of the plane as one row by output blocks (a second job: one more wait).
    if (halves) {
      static thread_local ScratchBuffer shared, shared_w;  // the caller's: the workers write
      float* mid = shared.get_as<float>(static_cast<size_t>(gd.n * gd.ocb * plane));
      uint32_t* mid_w =
          pairs ? shared_w.get_as<uint32_t>(static_cast<size_t>(gd.n * gd.ocb * plane / 2))
                : nullptr;
      parallel_for(0, gd.n * gd.ocb, 1, [&](int64_t t0, int64_t t1) {
        // A padded plane is copied by the task that reads it, into a buffer of its thread's.
        BlockedConv one_plane = gpad ? *gpad : gd;
        one_plane.n = one_plane.icb = one_plane.ocb = 1;
        const int64_t in_plane = gd.ih * gd.iw * gd.block, taps = gd.kh * gd.kw * gd.block;
        float* padded =
            gpad ? scratch_as<float>(static_cast<size_t>(gpad->ih * gpad->iw * gd.block)) : nullptr;
        for (int64_t t = t0; t < t1; ++t) {  // t: image t / ocb, channel block t % ocb
          const int64_t o = t % gd.ocb;
          if (gpad) pad_plane(gd, *gpad, xp + t * in_plane, padded);
          for (int64_t oy = 0; oy < gd.oh; ++oy) {
            float* out = mid + t * plane + oy * row;
            const RowEpilogue* act = act_mid ? &clamp_mid : nullptr;
            if (gpad)
              conv_row(one_plane, padded, wdp + o * taps, bd.data<float>() + o * gd.block, out,
                       plane, 0, 0, 1, oy, act);
            else
              conv_row(gd, xp, wdp, bd.data<float>(), out, plane, t / gd.ocb, o, 1, oy, act);
          }
          if (pairs || round_mid)
            mid_to_bf16(mid + t * plane, 1, gd.oh * gd.ow, gd.channels - o * gd.block,
                        pairs ? mid_w + t * plane / 2 : nullptr);
        }
      });
      BlockedConv gf = gp;  // the plane as one row
      gf.iw = gf.ow = pixels;
      const int64_t parts_p = std::min(split, gp.ocb);
      parallel_for(0, gd.n * parts_p, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t n = t / parts_p, part = t % parts_p;
          const int64_t b0 = part * gp.ocb / parts_p, b1 = (part + 1) * gp.ocb / parts_p;
          const int64_t at = n * gp.ocb * plane;  // image n's block 0
          for (int64_t ob = b0; ob < b1; ob += 4) {
            RowEpilogue e = fused;
            if (e.residual) e.residual += at + ob * plane;
            pw_row(gf, mid + n * gd.ocb * plane, pairs ? mid_w + n * gd.ocb * plane / 2 : nullptr,
                   wpp, wpw, bp.data<float>(), yp + at + ob * plane, plane, 0, ob,
                   std::min<int64_t>(4, b1 - ob), 0, in_regs ? &e : nullptr);
          }
          if (has_rest) span_epilogues(ep, yp, n, gp.ocb, plane, 0, plane, b0, b1);
        }
      });
      return one(std::move(y));
    }
    const int64_t run_rows = (pixels + runs - 1) / runs / gd.ow + 2;  // rows a run touches, most
    parallel_for(0, gd.n * runs * parts, 1, [&](int64_t t0, int64_t t1) {
      float* mid = scratch_as<float>(static_cast<size_t>(gd.ocb * run_rows * row));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t part = t % parts, r = t / parts % runs, n = t / parts / runs;
        const int64_t p0 = r * pixels / runs, p1 = (r + 1) * pixels / runs;
        const int64_t y0 = p0 / gd.ow, y1 = (p1 + gd.ow - 1) / gd.ow, span = (y1 - y0) * row;
        for (int64_t o = 0; o < gd.ocb; ++o)
          for (int64_t oy = y0; oy < y1; ++oy)
            conv_row(gd, xp, wdp, bd.data<float>(), mid + o * span + (oy - y0) * row, span, n, o, 1,
                     oy, act_mid ? &clamp_mid : nullptr);
        // The run as one row: its input the rows y0..y1 (blocks span apart), its output the
        // pixels [p0, p1) from the first.
        BlockedConv gf = gp;
        gf.iw = (y1 - y0) * gd.ow;
        gf.ow = p1 - p0;
        const float* in = mid + (p0 - y0 * gd.ow) * gd.block;
        const uint32_t* in_w = nullptr;
        if (pairs || round_mid) {
          uint32_t* w =
              pairs ? scratch_as<uint32_t>(static_cast<size_t>(gd.ocb * span / 2), 1) : nullptr;
          mid_to_bf16(mid, gd.ocb, span / gd.block, gd.channels, w);
          if (w) in_w = w + (p0 - y0 * gd.ow) * gd.block / 2;
        }
        const int64_t at = n * gp.ocb * plane + p0 * gd.block;  // block 0's pixel p0 of image n
        const int64_t b0 = part * gp.ocb / parts, b1 = (part + 1) * gp.ocb / parts;
        for (int64_t ob = b0; ob < b1; ob += 4) {
          RowEpilogue e = fused;
          if (e.residual) e.residual += at + ob * plane;
          pw_row(gf, in, in_w, wpp, wpw, bp.data<float>(), yp + at + ob * plane, plane, 0, ob,
                 std::min<int64_t>(4, b1 - ob), 0, in_regs ? &e : nullptr);
        }
        if (has_rest)
          span_epilogues(ep, yp, n, gp.ocb, plane, p0 * gd.block, (p1 - p0) * gd.block, b0, b1);
      }
    });
    return one(std::move(y));
  }
  // Few rows (a 7x7 plane at batch 1) would leave threads idle: the output blocks of a row are
  // then split into `parts` tasks, each computing the (cheap) depthwise row again.
  const int64_t rows = gd.n * gd.oh;
  const int64_t parts = std::clamp<int64_t>((4 * num_threads() + rows - 1) / rows, 1, sets);
  const int64_t tasks = rows * parts;
  const int64_t grain =
      expand ? std::max<int64_t>(1, (tasks + 2 * num_threads() - 1) / (2 * num_threads())) : 1;
  parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    const size_t mid_floats = static_cast<size_t>(gd.ocb * row);
    float* mid = scratch_as<float>(mid_floats + (expand ? gd.ocb * ring_plane : 0));
    float* ring = mid + mid_floats;
    std::vector<int64_t> held(static_cast<size_t>(gd.ring), -1);  // n * ih + iy of each slot
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t part = t % parts, oy = t / parts % gd.oh, n = t / parts / gd.oh;
      if (expand) {
        for (int64_t ky = 0; ky < gd.kh; ++ky) {
          const int64_t iy = oy * gd.sh + ky * gd.dh - gd.ph;
          if (iy < 0 || iy >= gd.ih) continue;
          const int64_t slot = iy % gd.ring;
          if (held[static_cast<size_t>(slot)] == n * gd.ih + iy) continue;
          for (int64_t ob = 0; ob < ge.ocb; ob += 4)
            pw_row(ge, xp, xw, wep, wew, bep, ring + ob * ring_plane + slot * in_row, ring_plane, n,
                   ob, std::min<int64_t>(4, ge.ocb - ob), iy, act_e ? &clamp_e : nullptr);
          held[static_cast<size_t>(slot)] = n * gd.ih + iy;
        }
      }
      for (int64_t o = 0; o < gd.ocb; ++o)
        conv_row(gd, expand ? ring : xp, wdp, bd.data<float>(), mid + o * row, row, expand ? 0 : n,
                 o, 1, oy, act_mid ? &clamp_mid : nullptr);
      uint32_t* mid_w = pairs ? scratch_as<uint32_t>(mid_floats / 2, 1) : nullptr;
      if (pairs || round_mid) mid_to_bf16(mid, gd.ocb, gd.ow, gd.channels, mid_w);
      const int64_t at = (n * gp.ocb * gd.oh + oy) * row;  // block 0's row oy of image n
      const int64_t b0 = part * sets / parts * 4,
                    b1 = std::min(gp.ocb, (part + 1) * sets / parts * 4);
      for (int64_t ob = b0; ob < b1; ob += 4) {
        RowEpilogue e = fused;
        if (e.residual) e.residual += at + ob * plane;
        pw_row(gp, mid, mid_w, wpp, wpw, bp.data<float>(), yp + at + ob * plane, plane, 0, ob,
               std::min<int64_t>(4, b1 - ob), 0, in_regs ? &e : nullptr);
      }
      if (has_rest) row_epilogues(ep, yp, n, gp.ocb, gd.oh, oy, row, b0, b1);
    }
  });
  return one(std::move(y));
}

bool accepts_conv_blocked(const NodeInfo& info) {
  const size_t n = info.inputs.size();
  if (n < 2 || !is_f32(info, 0) || !is_f32(info, 1)) return false;
  if (n > 2 && !is_f32(info, 2) && info.dtype(2) != DType::kUndefined) return false;
  // The block sizes conv_blocked_row is built for: X's last dimension, or W's for an NCHW X.
  const bool nchw = rank_is(info, 0, 4) && rank_is(info, 1, 6);
  if (!nchw && !rank_is(info, 0, 5)) return false;
  const Dim& b = nchw ? (*info.inputs[1].shape)[4] : (*info.inputs[0].shape)[4];
  return b == Dim(8) || b == Dim(16);
}

// For precision="bf16" and a constant W (not depthwise): W as pair words, or rounded to bf16 (see
// ConvBlockedState).
void prepare_bf16(const NodeInfo& info, ConvBlockedState& st) {
  const Tensor& w = *info.constants[1];
  const int64_t channels = info.node.attrs.get_int("channels");
  const int64_t groups = info.node.attrs.get_int("group", 1);
  const bool nchw = rank_is(info, 0, 4);
  st.w_shape = w.shape();
  st.words = pairs_run(w.dim(4)) ? (nchw ? (channels + 1) / 2 : 8) : 0;
  st.bf16 = bf16_weights(w, channels, groups, st.words, st.bf16_bytes);
}

// Winograd weights for a constant W when the conv is one Winograd computes and the cost rule may
// choose it (winograd_prepares: the batch, and perhaps the plane, are known only at run time).
std::optional<WinogradWeights> prepare_winograd_weights(const NodeInfo& info, bool against_pairs) {
  if (!rank_is(info, 0, 5)) return std::nullopt;
  const Tensor& w = *info.constants[1];
  if (info.node.attrs.get_int("group", 1) != 1) return std::nullopt;
  const Shape& xs = *info.inputs[0].shape;
  auto known = [&](size_t d) { return xs[d].is_known() ? xs[d].value : int64_t{0}; };
  BlockedConv g;
  g.n = known(0);
  g.icb = w.dim(1);
  g.ih = known(2);
  g.iw = known(3);
  g.block = w.dim(4);
  g.ocb = w.dim(0);
  g.kh = w.dim(2);
  g.kw = w.dim(3);
  g.channels = info.node.attrs.get_int("channels");
  if (g.block != w.dim(5) || !xs[4].is_known() || xs[4].value != g.block ||
      g.channels > g.icb * g.block || g.channels <= (g.icb - 1) * g.block)
    return std::nullopt;  // run() reports the error
  const bool plane_known = g.ih > 0 && g.iw > 0;
  try {
    const window::Params p =
        window::read_params(info.node.attrs, {g.kh, g.kw}, false, info.node.where());
    g.sh = p.strides[0];
    g.sw = p.strides[1];
    g.dh = p.dilations[0];
    g.dw = p.dilations[1];
    if (plane_known) {
      g.oh = window::forward_axis(p, 0, g.ih, info.node.where()).out;
      g.ow = window::forward_axis(p, 1, g.iw, info.node.where()).out;
    }
  } catch (const ValueError&) {
    return std::nullopt;  // run() reports it
  }
  WinogradWeights u;
  if (!winograd_applies(g) || !winograd_prepares(g, plane_known, u, against_pairs))
    return std::nullopt;
  if (params::product_precision(info.node) == DType::kBF16) {  // U of the rounded W
    std::vector<float> r(w.data<float>(), w.data<float>() + w.numel());
    round_to_bf16(r.data(), w.numel());
    prepare_winograd(r.data(), g.ocb, g.icb, g.block, g.channels, u);
  } else {
    prepare_winograd(w.data<float>(), g.ocb, g.icb, g.block, g.channels, u);
  }
  return u;
}

std::any prepare_conv_blocked(const NodeInfo& info) {
  if (!info.is_constant(1)) return {};
  const Tensor& w = *info.constants[1];
  if (w.rank() != 6 || w.dtype() != DType::kF32 || w.dim(4) != w.dim(5)) return {};
  ConvBlockedState st;
  if (params::product_precision(info.node) == DType::kBF16) prepare_bf16(info, st);  // rank 6
  st.winograd = prepare_winograd_weights(info, st.words > 0);
  if (!st.winograd && !st.bf16) return {};
  return st;
}

}  // namespace

void register_blocked_conv_kernels(KernelRegistry& r) {
  r.add("ReorderToBlocked",
        {[](const NodeInfo& i) { return is_f32(i, 0) && rank_is(i, 0, 4); }, {}, run_to_blocked});
  r.add("ReorderFromBlocked",
        {[](const NodeInfo& i) { return is_f32(i, 0) && rank_is(i, 0, 5); }, {}, run_from_blocked});
  // The blocked W stays (packed_inputs empty): the Winograd U cannot give it back exactly.
  Kernel conv{accepts_conv_blocked, prepare_conv_blocked, run_conv_blocked};
  conv.packed_bytes = [](const std::any& state) {
    return state.has_value() ? std::any_cast<const ConvBlockedState&>(state).bytes() : size_t{0};
  };
  // With bf16 products the state holds W (rounded: what the node's precision reads) and run()
  // reads that copy only; the fp32 W goes. Winograd's U cannot give W back, so it keeps it.
  conv.packed_inputs = [](const std::any& state) {
    return state.has_value() && std::any_cast<const ConvBlockedState&>(state).bf16
               ? std::vector<size_t>{1}
               : std::vector<size_t>{};
  };
  conv.unpack = [](const std::any& state, size_t input) {
    const auto& st = std::any_cast<const ConvBlockedState&>(state);
    PTO_CHECK(input == 1 && st.bf16) << "ConvBlocked: only a bf16 W is packed";
    return bf16_weights_tensor(st.bf16, st.w_shape, st.words);
  };
  conv.describe = [](const std::any& state) {
    return state.has_value() ? std::any_cast<const ConvBlockedState&>(state).describe()
                             : std::string("direct");
  };
  // Where U is prepared, the batch (or the plane) decides per call: say which of the two runs.
  conv.algorithm = [](const Node& node, const std::any& state, const std::vector<Dims>& in) {
    if (!state.has_value()) return std::string("direct");
    const auto* st = &std::any_cast<const ConvBlockedState&>(state);
    auto known_dims = [](const Dims& d) {
      return std::ranges::all_of(d, [](int64_t v) { return v >= 0; });
    };
    const bool known = in.size() >= 2 && known_dims(in[0]) && known_dims(in[1]);
    if (!st->winograd || !known) return st->describe();
    auto shape_only = [](const Dims& d) { return Tensor::wrap(nullptr, DType::kF32, d, {}, {}); };
    try {
      const BlockedConv g = blocked_geometry(shape_only(in[0]), shape_only(in[1]), node.attrs,
                                             node.attrs.get_int("group", 1), node.where());
      return takes_winograd(st, g) ? std::string("winograd F(4x4,3x3)") : st->direct();
    } catch (const ValueError&) {
      return st->describe();  // run() reports it
    }
  };
  r.add("ConvBlocked", std::move(conv));
  Kernel dw_pw{[](const NodeInfo& i) {
                 if ((i.inputs.size() != 5 && i.inputs.size() != 7) || !rank_is(i, 0, 5))
                   return false;
                 for (size_t k = 0; k < i.inputs.size(); ++k)
                   if (!is_f32(i, k)) return false;
                 const Dim& b = (*i.inputs[0].shape)[4];
                 return b == Dim(8) || b == Dim(16);
               },
               prepare_dw_pw_conv_blocked, run_dw_pw_conv_blocked};
  dw_pw.packed_bytes = [](const std::any& state) {
    return state.has_value() ? std::any_cast<const DwPwState&>(state).bytes : size_t{0};
  };
  dw_pw.describe = [](const std::any& state) {  // the profiler's tag is the first word
    if (!state.has_value()) return std::string();
    return std::string(std::any_cast<const DwPwState&>(state).pairs ? "bf16-pairs 1x1 convs"
                                                                    : "bf16-rounded 1x1 convs");
  };
  dw_pw.packed_inputs = [](const std::any& state) {
    if (!state.has_value()) return std::vector<size_t>{};
    return std::any_cast<const DwPwState&>(state).we ? std::vector<size_t>{3, 5}
                                                     : std::vector<size_t>{3};
  };
  dw_pw.unpack = [](const std::any& state, size_t input) {
    const auto& st = std::any_cast<const DwPwState&>(state);
    PTO_CHECK(input == 3 || (input == 5 && st.we)) << "DwPwConvBlocked: only the 1x1 W are packed";
    return input == 3 ? bf16_weights_tensor(st.wp, st.wp_shape, st.pairs ? 8 : 0)
                      : bf16_weights_tensor(st.we, st.we_shape, st.pairs ? 8 : 0);
  };
  r.add("DwPwConvBlocked", std::move(dw_pw));
}

}  // namespace pto::cpu
