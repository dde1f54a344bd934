// CPU ConvTranspose (float32, NCHW, 1-D and 2-D; 3-D declines to the reference interpreter), and
// Col2Im (F.fold), which is its col2im step alone.
//
// Two forms. The sub-pixel form (kernel a multiple of the stride on both axes, no dilation,
// kernel != stride, and stride 1 or at least half as many output as input channels: the 4x4
// stride 2 pad 1 upsamplers, stride-1 transposed convs; use_subpixel has the measurements): output
// phase (py, px) is an ordinary stride-1 convolution of X with a quarter (1 / (sh * sw)) of the
// taps, reversed; conv2d computes each one (implicit GEMM, the weights of every residue packed
// once) and the phases interleave into Y. Otherwise GEMM then col2im: per image and group,
// cols[Mg*kh*kw, HW] = W_g^T [Mg*kh*kw, Cg] x X_g [Cg, HW] (W_g packed once as the GEMM's
// transposed A operand when W is constant), in column blocks of whole input rows; each column
// (input position) and row (output channel, tap) adds into output position i * stride + k *
// dilation - pad_begin, in parallel over output channels (each task owns its planes: no races).
// When the kernel equals the stride without dilation or padding and every output position is
// covered (DBNet/UNet decoders' 2x2 stride 2), each output is written exactly once: the kw col
// rows of a tap row interleave into the output row with the bias, no zero fill and no adds. A
// fused epilogue (bias, residual, activation: fusion/epilogue_chain.h) runs on each output row
// while it is in cache. The geometry and every error are the reference's
// (reference/ops/conv.cpp conv_transpose_plan).
#include <algorithm>
#include <vector>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "pto/error.h"
#include "pto/parallel.h"
#include "reference/ops/nn_kernels.h"

namespace pto::cpu {
namespace {

using reference::ConvTransposePlan;
using reference::Geom3;
using window::ceil_div;
using window::floor_div;

// The per-thread workspace slot of the GEMM's columns (the GEMM uses the others).
constexpr int kColScratch = 3;
constexpr int64_t kColBlockFloats = 64 * 1024;

// ---- the sub-pixel form ----
// Along an axis with kernel k = t * s (no dilation), output q * s + p reads input q + e - j
// through tap r + s * j (j < t, r = (p + pad) mod s, e = (p + pad) div s): phase p of the output
// is a stride-1 convolution of X with the t taps of residue r reversed and a leading pad of
// t - 1 - e. So a ConvTranspose is sh * sw ordinary convolutions (conv2d: implicit GEMM with
// K = Cg * t_h * t_w, no col2im, no overlapping adds) whose outputs interleave into Y.

// Taps per phase along an axis where the sub-pixel form applies: kernel a multiple of the
// stride, no dilation; 0 where it does not.
int64_t phase_taps(int64_t k, int64_t s, int64_t d) {
  return d == 1 && s >= 1 && k % s == 0 ? k / s : 0;
}

// Whether ConvTranspose takes the sub-pixel form for kernel (kh, kw), strides, dilations and
// channels per group. Measured against GEMM + col2im (bench/conv_transpose.py layers and DBNet-like
// blocks, 1 thread, CPU time of the two compiled side by side in one process, medians of 9):
// stride 1 3x3 1.21x faster; 4x4 stride 2 pad 1 1.08-1.14x with Mg >= Cg / 2 (256->128 @32 and
// @40, 64->32 @128, 128->64 @80), but 0.94x at 256->64 @80: the phases' GEMMs are narrow (M = Mg
// against K = 4 Cg) and their output makes one more pass (separate planes, then the interleave).
// Not when kernel == stride: there one GEMM of Mg * kh * kw rows whose columns are stored once
// (no adds) was 1.3-3.1x faster than the phases as 1x1 convs (their weights packed per call).
bool use_subpixel(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                  int64_t cg, int64_t mg) {
  if (phase_taps(kh, sh, dh) == 0 || phase_taps(kw, sw, dw) == 0 || (kh == sh && kw == sw))
    return false;
  return sh * sw == 1 || 2 * mg >= cg;
}

// One phase of one axis: its residue, the stride-1 conv's leading pad, and its output count.
struct AxisPhase {
  int64_t r = 0, pad = 0, out = 0;
};

// The phases of axis a of g (t taps each); false when one would need a negative leading pad (a
// pad larger than the kernel reaches: the GEMM + col2im form takes those).
bool axis_phases(const Geom3& g, int a, int64_t t, std::vector<AxisPhase>& phases) {
  const int64_t s = g.s[a], pb = g.pb[a];
  phases.clear();
  if (pb < 0) return false;
  for (int64_t p = 0; p < s; ++p) {
    const int64_t e = (p + pb) / s;
    if (e > t - 1) return false;
    phases.push_back({(p + pb) % s, t - 1 - e, g.out[a] > p ? ceil_div(g.out[a] - p, s) : 0});
  }
  return true;
}

// The Conv weights [M, Cg, th, tw] of one residue (ry, rx) of the taps, and their GEMM packing.
struct Residue {
  std::vector<float> w;
  std::vector<PackedA> packed;  // per group; empty for a depthwise conv (conv2d reads w)
};

// A ConvTranspose's W [C, Mg, kh, kw] in `group` groups as the sub-pixel form reads it.
struct SubPixel {
  int64_t c = 0, mg = 0, group = 1, kh = 1, kw = 1, sh = 1, sw = 1;
  int64_t th() const { return kh / sh; }
  int64_t tw() const { return kw / sw; }
  int64_t cg() const { return c / group; }

  // Residue (ry, rx): tap (jy, jx) is W's (ry + sh * (th - 1 - jy), rx + sw * (tw - 1 - jx)).
  std::vector<float> weights(const float* w, int64_t ry, int64_t rx) const {
    const int64_t cg_ = cg(), t_h = th(), t_w = tw();
    std::vector<float> out(static_cast<size_t>(group * mg * cg_ * t_h * t_w));
    float* o = out.data();
    for (int64_t gi = 0; gi < group; ++gi)
      for (int64_t ml = 0; ml < mg; ++ml)
        for (int64_t cl = 0; cl < cg_; ++cl)
          for (int64_t jy = 0; jy < t_h; ++jy)
            for (int64_t jx = 0; jx < t_w; ++jx)
              *o++ = w[(((gi * cg_ + cl) * mg + ml) * kh + ry + sh * (t_h - 1 - jy)) * kw + rx +
                       sw * (t_w - 1 - jx)];
    return out;
  }
  Residue residue(const float* w, int64_t ry, int64_t rx, bool pack) const {
    Residue r{weights(w, ry, rx), {}};
    if (pack) r.packed = pack_weights(r.w.data(), group * mg, cg(), th(), tw(), group);
    return r;
  }
};

// W's shape [C, Mg, k...] (rank 3 or 4) and the strides: the sub-pixel geometry (the height
// axis of a 1-D conv has kernel and stride 1).
SubPixel sub_pixel_of(const Dims& w, int64_t group, const Dims& strides) {
  SubPixel sp;
  sp.c = w[0];
  sp.mg = w[1];
  sp.group = group;
  sp.kw = w.back();
  sp.sw = strides.back();
  if (w.size() == 4) {
    sp.kh = w[2];
    sp.sh = strides[0];
  }
  return sp;
}

// A constant W [C, M/group, k...] packed once: per group as the GEMM's A = W_g^T [Mg*kk, Cg], or,
// for the sub-pixel form, as the Conv weights of each residue (sh * sw of them).
struct PreparedW {
  std::vector<PackedA> groups;
  std::vector<Residue> residues;
};

std::any prepare(const NodeInfo& info) {
  int64_t group = 1;
  const Tensor* wp = constant_conv_weight(info, &group);
  if (!wp) return {};
  const Tensor& w = *wp;
  const size_t rank = static_cast<size_t>(w.rank()) - 2;
  const Dims strides = info.node.attrs.get_ints("strides", Dims(rank, 1));
  const Dims dil = info.node.attrs.get_ints("dilations", Dims(rank, 1));
  if (strides.size() != rank || dil.size() != rank) return {};  // run() reports the error
  PreparedW p;
  const SubPixel sp = sub_pixel_of(w.shape(), group, strides);
  if (use_subpixel(sp.kh, sp.kw, sp.sh, sp.sw, rank == 2 ? dil[0] : 1, dil.back(), sp.cg(),
                   sp.mg)) {
    const bool depthwise = sp.cg() == 1 && group > 1;
    for (int64_t ry = 0; ry < sp.sh; ++ry)
      for (int64_t rx = 0; rx < sp.sw; ++rx)
        p.residues.push_back(sp.residue(w.data<float>(), ry, rx, !depthwise));
    return p;
  }
  const int64_t cg = w.dim(0) / group, mk = w.numel() / std::max<int64_t>(w.dim(0), 1);
  for (int64_t gi = 0; gi < group; ++gi)
    p.groups.push_back(pack_a(mk, cg, w.data<float>() + gi * cg * mk, mk, true));
  return p;
}

// The sub-pixel form into y: each phase's conv (bias and, without a residual, the activation in
// its epilogue) into its own planes, then the phases interleaved row by row (and the residual
// and activation applied to each row while it is in cache). `residues` holds the prepared
// weights, or is empty (then they are built from w). False when a pad rules the form out.
bool run_subpixel(const ConvTransposePlan& plan, const SubPixel& sp,
                  const std::vector<Residue>& prepared, const float* x, const float* w,
                  const float* bias, const Epilogue& ep, float* y) {
  const Geom3& g = plan.g;
  std::vector<AxisPhase> ys, xs;
  if (!axis_phases(g, 1, sp.th(), ys) || !axis_phases(g, 2, sp.tw(), xs)) return false;
  std::vector<Residue> built;
  if (prepared.empty())
    for (int64_t ry = 0; ry < sp.sh; ++ry)
      for (int64_t rx = 0; rx < sp.sw; ++rx) built.push_back(sp.residue(w, ry, rx, false));
  const std::vector<Residue>& res = prepared.empty() ? built : prepared;
  const int64_t oh = g.out[1], ow = g.out[2], nm = plan.n * plan.m, phases = sp.sh * sp.sw;
  const bool single = phases == 1;  // stride 1: the one phase is Y
  Tensor tmp = single ? Tensor() : Tensor::empty(DType::kF32, {nm * oh * ow});
  Epilogue inner = ep;  // the phases' epilogue: the activation too unless a residual comes first
  if (!single && ep.residual) inner = Epilogue{};
  std::vector<int64_t> offset(static_cast<size_t>(phases) + 1, 0);
  for (int64_t py = 0; py < sp.sh; ++py)
    for (int64_t px = 0; px < sp.sw; ++px) {
      const AxisPhase &ay = ys[static_cast<size_t>(py)], &ax = xs[static_cast<size_t>(px)];
      const int64_t i = py * sp.sw + px;
      offset[static_cast<size_t>(i) + 1] = offset[static_cast<size_t>(i)] + nm * ay.out * ax.out;
      ConvGeometry pg;
      pg.n = plan.n;
      pg.c = plan.c;
      pg.m = plan.m;
      pg.group = plan.group;
      pg.ih = g.in[1];
      pg.iw = g.in[2];
      pg.kh = sp.th();
      pg.kw = sp.tw();
      pg.ph = ay.pad;
      pg.pw = ax.pad;
      pg.oh = ay.out;
      pg.ow = ax.out;
      const Residue& r = res[static_cast<size_t>(ay.r * sp.sw + ax.r)];
      float* out = single ? y : tmp.data<float>() + offset[static_cast<size_t>(i)];
      conv2d(pg, x, r.w.data(), bias, out, inner, r.packed.empty() ? nullptr : r.packed.data());
    }
  if (single) return true;
  const bool post = ep.residual != nullptr;
  Epilogue e = ep;
  e.bias_kind = Epilogue::Bias::kNone;
  e.ldr = ow;
  const float* t = tmp.data<float>();
  parallel_for(0, nm * oh, 16, [&](int64_t r0, int64_t r1) {
    std::vector<const float*> src(static_cast<size_t>(sp.sw));
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t plane = r / oh, oy = r % oh, py = oy % sp.sh, q = oy / sp.sh;
      const int64_t qh = ys[static_cast<size_t>(py)].out;
      for (int64_t px = 0; px < sp.sw; ++px) {
        const int64_t qw = xs[static_cast<size_t>(px)].out;
        src[static_cast<size_t>(px)] =
            t + offset[static_cast<size_t>(py * sp.sw + px)] + (plane * qh + q) * qw;
      }
      PTO_ISA_DISPATCH(interleave_phases, src.data(), sp.sw, ow, 0.0f, y + r * ow);
      if (post) {
        Epilogue er = e;
        er.residual = ep.residual + r * ow;
        apply_epilogue(er, y + r * ow, ow, 0, 1, 0, ow);
      }
    }
  });
  return true;
}

// ---- the GEMM + col2im form ----
// Output planes [m0, m1) of one image and group: col2im of the GEMM's column block (input rows
// [iy0, iy1)) into y (planes of oh x ow), which holds the bias already unless `store`.
struct Col2Im {
  const Geom3& g;  // axes 1 (height) and 2 (width)

  int64_t kk() const { return g.k[1] * g.k[2]; }

  // Whether every output position is written by exactly one (input position, tap).
  bool exact() const {
    for (int a = 1; a < 3; ++a)
      if (g.k[a] != g.s[a] || g.d[a] != 1 || g.pb[a] != 0 || g.out[a] != g.in[a] * g.s[a])
        return false;
    return true;
  }

  void run(const float* col, int64_t ncols, int64_t iy0, int64_t iy1, float* y, const float* bias,
           int64_t m0, int64_t m1, bool store) const {
    const int64_t iw = g.in[2], oh = g.out[1], ow = g.out[2];
    const int64_t kh = g.k[1], kw = g.k[2], sh = g.s[1], sw = g.s[2];
    std::vector<const float*> taps(static_cast<size_t>(kw));
    for (int64_t m = m0; m < m1; ++m) {
      float* plane = y + m * oh * ow;
      const float b = bias ? bias[m] : 0.0f;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const int64_t offy = ky * g.d[1] - g.pb[1];
        for (int64_t iy = iy0; iy < iy1; ++iy) {
          const int64_t oy = iy * sh + offy;
          if (oy < 0 || oy >= oh) continue;
          float* yrow = plane + oy * ow;
          const float* row0 = col + (m * kh + ky) * kw * ncols + (iy - iy0) * iw;
          if (store) {  // exact tiling: the kw col rows interleave into the output row
            for (int64_t kx = 0; kx < kw; ++kx) taps[static_cast<size_t>(kx)] = row0 + kx * ncols;
            PTO_ISA_DISPATCH(interleave_phases, taps.data(), sw, ow, b, yrow);
            continue;
          }
          for (int64_t kx = 0; kx < kw; ++kx) {
            const int64_t offx = kx * g.d[2] - g.pb[2];
            const int64_t lo = std::max<int64_t>(0, ceil_div(-offx, sw));
            const int64_t hi = std::min<int64_t>(iw, floor_div(ow - 1 - offx, sw) + 1);
            PTO_ISA_DISPATCH(col2im_row, row0 + kx * ncols, yrow + offx, lo, hi, sw, false, b);
          }
        }
      }
    }
  }
};

std::vector<Tensor> run(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const reference::ConvTransposePlan plan = reference::conv_transpose_plan(c);
  const Geom3& g = plan.g;
  Tensor y = Tensor::empty(DType::kF32, plan.y_shape);
  if (y.numel() == 0) return one(std::move(y));
  const Epilogue ep = conv_epilogue(c.epilogue, plan.y_shape, c.where());
  const int64_t cg = plan.c / plan.group, mg = plan.m / plan.group;
  const int64_t ih = g.in[1], iw = g.in[2], hw = ih * iw, out_plane = g.out[1] * g.out[2];
  const float* bias = c.has_input(2) ? c.input(2).data<float>() : nullptr;
  if (c.epilogue && c.epilogue->bias.defined())
    bias = c.epilogue->bias.data<float>();  // the group's bias (ConvTranspose had none)
  const float* xp = x.data<float>();
  const PreparedW* prepared = c.state && c.state->has_value() ? &c.prepared<PreparedW>() : nullptr;
  const Tensor& w = c.input(1);
  if (cg > 0 && use_subpixel(g.k[1], g.k[2], g.s[1], g.s[2], g.d[1], g.d[2], cg, mg)) {
    const Dims strides = {g.s[1], g.s[2]};
    const SubPixel sp = sub_pixel_of({plan.c, mg, g.k[1], g.k[2]}, plan.group, strides);
    static const std::vector<Residue> kNone;
    const bool ok = run_subpixel(plan, sp, prepared ? prepared->residues : kNone, xp,
                                 w.data<float>(), bias, ep, y.data<float>());
    if (ok) return one(std::move(y));
  }
  const PackedA* packed = nullptr;
  if (prepared && !prepared->groups.empty()) {
    PTO_CHECK(static_cast<int64_t>(prepared->groups.size()) == plan.group)
        << c.where() << ": W was packed for " << prepared->groups.size() << " groups";
    packed = prepared->groups.data();
  }
  const Col2Im col2im{g};
  const int64_t mk = mg * col2im.kk();
  const float* wp = packed ? nullptr : w.data<float>();
  const bool store = col2im.exact() && cg > 0;
  if (!store)  // the bias (or zero) first, then every tap adds
    parallel_for(0, plan.n * plan.m, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::fill_n(y.data<float>() + r * out_plane, out_plane, bias ? bias[r % plan.m] : 0.0f);
    });
  // The activation and residual after the bias: per finished block of rows (store) or per plane
  // once every tap has added (otherwise).
  const bool post = ep.act != Activation::kNone || ep.residual;
  Epilogue e = ep;
  e.bias_kind = Epilogue::Bias::kNone;
  e.ldr = g.out[2];
  // Rows [oy0, oy1) of planes [m0, m1) from plane index p0 (image * M + channel) of y on.
  auto finish = [&](int64_t p0, int64_t m0, int64_t m1, int64_t oy0, int64_t oy1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int64_t off = (p0 + m) * out_plane + oy0 * g.out[2];
      Epilogue er = e;
      if (ep.residual) er.residual = ep.residual + off;
      apply_epilogue(er, y.data<float>() + off, g.out[2], 0, oy1 - oy0, 0, g.out[2]);
    }
  };
  if (cg > 0) {
    // Column blocks of whole input rows: a col block of about 256 KB (L2), at least one row.
    // Measured on the bench/conv_transpose.py layers, 1 thread: 256 KB 0-30% faster than 1 MB and
    // 4 MB blocks (the col2im then reads the block from L2).
    const int64_t rows =
        std::clamp<int64_t>(kColBlockFloats / std::max<int64_t>(mk * iw, 1), 1, ih);
    const int64_t blocks = ceil_div(ih, rows);
    // One image and group, its blocks in turn; `inner`: the GEMM and col2im use the pool.
    auto task = [&](int64_t t, bool inner) {
      const int64_t n = t / plan.group, gi = t % plan.group;
      const int64_t p0 = n * plan.m + gi * mg;
      float* yg = y.data<float>() + p0 * out_plane;
      const float* bg = bias ? bias + gi * mg : nullptr;
      float* col = scratch_as<float>(static_cast<size_t>(mk * rows * iw), kColScratch);
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t iy0 = b * rows, iy1 = std::min(ih, iy0 + rows), ncols = (iy1 - iy0) * iw;
        GemmArgs a;
        a.m = mk;
        a.n = ncols;
        a.k = cg;
        a.a = wp ? wp + gi * cg * mk : nullptr;
        a.lda = mk;
        a.trans_a = true;
        a.b = xp + (n * plan.c + gi * cg) * hw + iy0 * iw;
        a.ldb = hw;
        a.c = col;
        a.ldc = ncols;
        if (packed)
          sgemm_packed_a(a, packed[gi]);
        else
          sgemm(a);
        // With `store` the block's output rows are final: the epilogue runs on them in cache.
        auto part = [&](int64_t m0, int64_t m1) {
          col2im.run(col, ncols, iy0, iy1, yg, bg, m0, m1, store);
          if (store && post) finish(p0, m0, m1, iy0 * g.s[1], iy1 * g.s[1]);
        };
        if (inner)
          parallel_for(0, mg, 1, part);
        else
          part(0, mg);
      }
    };
    const int64_t tasks = plan.n * plan.group, threads = num_threads();
    if (threads > 1 && (tasks >= 3 * threads || tasks % threads == 0))
      parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) task(t, false);
      });
    else
      for (int64_t t = 0; t < tasks; ++t) task(t, threads > 1);
  }
  if (post && !store)
    parallel_for(0, plan.n * plan.m, 1,
                 [&](int64_t p0, int64_t p1) { finish(p0, 0, p1 - p0, 0, g.out[1]); });
  return one(std::move(y));
}

// Col2Im (F.fold) on float32 with a 1-D or 2-D image: the col2im above with the block positions
// as the input grid (input [n, c * k, l] is its columns, channel by channel), in parallel over
// (image, channel) planes. A 3-D image (seen only at run time: image_shape is an input) runs on
// the reference kernel.
std::vector<Tensor> run_col2im(const KernelContext& c) {
  const reference::Col2ImPlan p = reference::col2im_plan(c);
  const size_t rank = p.image.size();
  if (rank > 2) return run_reference(c);
  Tensor y = Tensor::empty(DType::kF32, p.out_shape);
  if (y.numel() == 0) return one(std::move(y));
  Geom3 g;
  for (size_t i = 0; i < rank; ++i) {
    const size_t a = 3 - rank + i;
    g.in[a] = p.blocks[i];
    g.out[a] = p.image[i];
    g.k[a] = p.block[i];
    g.s[a] = p.strides[i];
    g.d[a] = p.dilations[i];
    g.pb[a] = p.pads[i];
    g.pe[a] = p.pads[i + rank];
  }
  const Col2Im col2im{g};
  const bool store = col2im.exact();
  const int64_t plane = g.out[1] * g.out[2];
  const float* x = c.input(0).data<float>();
  float* out = y.data<float>();
  parallel_for(0, p.n * p.c, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n = t / p.c, m = t % p.c;
      if (!store) std::fill_n(out + t * plane, plane, 0.0f);
      col2im.run(x + n * p.c * p.k * p.l, p.l, 0, g.in[1], out + n * p.c * plane, nullptr, m, m + 1,
                 store);
    }
  });
  return one(std::move(y));
}

}  // namespace

void register_conv_transpose_kernels(KernelRegistry& r) {
  r.add("ConvTranspose", {accepts_f32_conv, prepare, run});
  r.add("Col2Im", {.accepts = [](const NodeInfo& n) { return n.dtype(0) == DType::kF32; },
                   .run = run_col2im,
                   .reference_at_run_time = true});
}

}  // namespace pto::cpu
