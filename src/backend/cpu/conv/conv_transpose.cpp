// CPU ConvTranspose (float32, NCHW, 1-D and 2-D; 3-D declines to the reference interpreter), and
// Col2Im (F.fold), which is its col2im step alone.
//
// Per image and group, the GEMM cols[Mg*kh*kw, HW] = W_g^T [Mg*kh*kw, Cg] x X_g [Cg, HW] (W_g the
// group's [Cg, Mg*kh*kw] rows of W, packed once as the GEMM's transposed A operand when W is
// constant), in column blocks of whole input rows; then col2im: each column (input position) and
// row (output channel, tap) adds into output position i * stride + k * dilation - pad_begin. The
// col2im runs in parallel over output channels (each task owns its planes: no races). When the
// kernel equals the stride without dilation or padding and every output position is covered
// (DBNet/UNet decoders' 2x2 stride 2), each output is written exactly once: the col2im stores
// col + bias, with no zero fill and no read-modify-write. The geometry and every error are the
// reference's (reference/ops/conv.cpp conv_transpose_plan).
#include <algorithm>
#include <vector>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "pto/error.h"
#include "pto/parallel.h"
#include "reference/ops/nn_kernels.h"

namespace pto::cpu {
namespace {

using reference::Geom3;
using window::ceil_div;
using window::floor_div;

// The per-thread workspace slot of the GEMM's columns (the GEMM uses the others).
constexpr int kColScratch = 3;
constexpr int64_t kColBlockFloats = 64 * 1024;

// A constant W [C, M/group, k...] packed per group as the GEMM's A = W_g^T [Mg*kk, Cg].
struct PreparedW {
  std::vector<PackedA> groups;
  Dims shape;
};

std::any prepare(const NodeInfo& info) {
  int64_t group = 1;
  const Tensor* wp = constant_conv_weight(info, &group);
  if (!wp) return {};
  const Tensor& w = *wp;
  const int64_t cg = w.dim(0) / group, mk = w.numel() / std::max<int64_t>(w.dim(0), 1);
  PreparedW p{{}, w.shape()};
  for (int64_t gi = 0; gi < group; ++gi)
    p.groups.push_back(pack_a(mk, cg, w.data<float>() + gi * cg * mk, mk, true));
  return p;
}

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
          if (store && kw == 2) {  // two interleaved rows of col: stores the compiler vectorizes
            for (int64_t ix = 0; ix < iw; ++ix) {
              yrow[2 * ix] = row0[ix] + b;
              yrow[2 * ix + 1] = row0[ncols + ix] + b;
            }
            continue;
          }
          for (int64_t kx = 0; kx < kw; ++kx) {
            const int64_t offx = kx * g.d[2] - g.pb[2];
            const float* crow = row0 + kx * ncols;
            const int64_t lo = std::max<int64_t>(0, ceil_div(-offx, sw));
            const int64_t hi = std::min<int64_t>(iw, floor_div(ow - 1 - offx, sw) + 1);
            float* yo = yrow + offx;
            if (store) {
              for (int64_t ix = lo; ix < hi; ++ix) yo[ix * sw] = crow[ix] + b;
            } else if (sw == 1) {
              for (int64_t ix = lo; ix < hi; ++ix) yo[ix] += crow[ix];
            } else {
              for (int64_t ix = lo; ix < hi; ++ix) yo[ix * sw] += crow[ix];
            }
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
  if (y.numel() == 0) return {y};
  const int64_t cg = plan.c / plan.group, mg = plan.m / plan.group;
  const int64_t ih = g.in[1], iw = g.in[2], hw = ih * iw, out_plane = g.out[1] * g.out[2];
  const Col2Im col2im{g};
  const int64_t mk = mg * col2im.kk();
  const float* bias = c.has_input(2) ? c.input(2).data<float>() : nullptr;
  const float* xp = x.data<float>();
  const PackedA* packed = nullptr;
  if (c.state && c.state->has_value()) {
    const auto& p = c.prepared<PreparedW>();
    PTO_CHECK(static_cast<int64_t>(p.groups.size()) == plan.group)
        << c.where() << ": W was packed for " << p.groups.size() << " groups";
    packed = p.groups.data();
  }
  const float* wp = packed ? nullptr : c.input(1).data<float>();
  const bool store = col2im.exact() && cg > 0;
  if (!store)  // the bias (or zero) first, then every tap adds
    parallel_for(0, plan.n * plan.m, 4, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        std::fill_n(y.data<float>() + r * out_plane, out_plane, bias ? bias[r % plan.m] : 0.0f);
    });
  if (cg == 0) return {y};

  // Column blocks of whole input rows: a col block of about 256 KB (L2), at least one row.
  // Measured on the bench/conv_transpose.py layers, 1 thread: 256 KB 0-30% faster than 1 MB and
  // 4 MB blocks (the col2im then reads the block from L2).
  const int64_t rows = std::clamp<int64_t>(kColBlockFloats / std::max<int64_t>(mk * iw, 1), 1, ih);
  const int64_t blocks = ceil_div(ih, rows);
  // One image and group, its blocks in turn; `inner`: the GEMM and col2im use the pool.
  auto task = [&](int64_t t, bool inner) {
    const int64_t n = t / plan.group, gi = t % plan.group;
    float* yg = y.data<float>() + (n * plan.m + gi * mg) * out_plane;
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
      if (inner)
        parallel_for(0, mg, 1, [&](int64_t m0, int64_t m1) {
          col2im.run(col, ncols, iy0, iy1, yg, bg, m0, m1, store);
        });
      else
        col2im.run(col, ncols, iy0, iy1, yg, bg, 0, mg, store);
    }
  };
  const int64_t tasks = plan.n * plan.group, threads = num_threads();
  if (threads > 1 && (tasks >= 3 * threads || tasks % threads == 0))
    parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) task(t, false);
    });
  else
    for (int64_t t = 0; t < tasks; ++t) task(t, threads > 1);
  return {y};
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
  if (y.numel() == 0) return {y};
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
  return {y};
}

}  // namespace

void register_conv_transpose_kernels(KernelRegistry& r) {
  r.add("ConvTranspose", {accepts_f32_conv, prepare, run});
  r.add("Col2Im", {.accepts = [](const NodeInfo& n) { return n.dtype(0) == DType::kF32; },
                   .run = run_col2im,
                   .reference_at_run_time = true});
}

}  // namespace pto::cpu
