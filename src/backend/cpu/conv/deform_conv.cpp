// CPU DeformConv (float32, 2-D): a deformable im2col, then the GEMM.
//
// For each image, group and block of output pixels, the columns [Cg kh kw, pixels] are filled
// with the input sampled at each tap's offset position (bilinear, zero outside, times the mask),
// and W's group [Mg, Cg kh kw] multiplies them into the output rows, the bias as the GEMM's
// epilogue. The sampling positions depend on the offset group, tap and pixel, not on the channel:
// they are found once per block as four corner indices and four weights (the mask and the zero
// outside folded into the weights), and every channel of the offset group then takes four loads
// and four multiply-adds per sample. A constant W is packed for the GEMM at compile time.
// Geometry and errors are the reference's (reference::deform_conv_plan).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/kernel.h"
#include "pto/parallel.h"
#include "reference/ops/nn_kernels.h"

namespace pto::cpu {
namespace {

// One sampling position: the four corners' element indices in the plane and their weights.
struct Sample {
  int32_t idx[4];
  float wt[4];
};

Sample sample_at(float y, float x, int64_t h, int64_t w, float mask) {
  Sample s{{0, 0, 0, 0}, {0.0f, 0.0f, 0.0f, 0.0f}};
  if (!(y > -1.0f) || !(x > -1.0f) || !(y < static_cast<float>(h)) || !(x < static_cast<float>(w)))
    return s;
  const float fy = std::floor(y), fx = std::floor(x), ly = y - fy, lx = x - fx;
  const int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
  const int64_t ys[2] = {y0, y0 + 1}, xs[2] = {x0, x0 + 1};
  const float wy[2] = {1.0f - ly, ly}, wx[2] = {1.0f - lx, lx};
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b) {
      const bool in = ys[a] >= 0 && ys[a] < h && xs[b] >= 0 && xs[b] < w;
      s.idx[2 * a + b] = in ? static_cast<int32_t>(ys[a] * w + xs[b]) : 0;
      s.wt[2 * a + b] = in ? wy[a] * wx[b] * mask : 0.0f;
    }
  return s;
}

// W's groups packed for the GEMM once at compile time (a constant W), [Mg, Cg kh kw] each.
struct PackedGroups {
  std::vector<PackedA> groups;
};

std::any prepare(const NodeInfo& n) {
  if (!n.is_constant(1)) return {};
  const Tensor& w = *n.constants[1];
  const int64_t group = n.node.attrs.get_int("group", 1);
  if (w.rank() != 4 || group < 1 || w.dim(0) % group != 0) return {};
  const int64_t mg = w.dim(0) / group, k = w.dim(1) * w.dim(2) * w.dim(3);
  PackedGroups p;
  for (int64_t g = 0; g < group; ++g)
    p.groups.push_back(pack_a(mg, k, w.data<float>() + g * mg * k, k, false));
  return p;
}

bool accepts(const NodeInfo& n) {
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.dtype(i) != DType::kUndefined && n.dtype(i) != DType::kF32) return false;
  const auto& x = n.inputs[0].shape;
  return !x || x->size() == 4;
}

std::vector<Tensor> run(const KernelContext& c) {
  reference::DeformConvPlan p;
  try {
    p = reference::deform_conv_plan(c);
  } catch (const Error&) {
    return run_reference(c);  // for its error
  }
  if (p.h * p.w > (int64_t{1} << 31)) return run_reference(c);
  const int64_t cg = p.c / p.group, mg = p.m / p.group, taps = p.kh * p.kw;
  const int64_t K = cg * taps, plane = p.oh * p.ow, hw = p.h * p.w;
  const int64_t c_per_og = p.c / p.offset_group;
  // Pixels per block: the columns about 4 MiB, in whole vectors (the GEMM packs them by panels).
  const int64_t block = std::min(plane, std::max<int64_t>(64, (int64_t{1} << 20) / K / 16 * 16));
  const PackedGroups* packed = c.prepared_if<PackedGroups>();
  if (packed && static_cast<int64_t>(packed->groups.size()) != p.group) packed = nullptr;
  const float *x = c.input(0).data<float>(), *wt = c.input(1).data<float>();
  const float* off = c.input(2).data<float>();
  const float* bias = p.bias ? c.input(3).data<float>() : nullptr;
  const float* mask = p.mask ? c.input(4).data<float>() : nullptr;
  Tensor y = Tensor::empty(DType::kF32, {p.n, p.m, p.oh, p.ow});
  float* out = y.data<float>();
  std::vector<float> cols(static_cast<size_t>(K * block));
  std::vector<Sample> samples;
  for (int64_t n = 0; n < p.n; ++n)
    for (int64_t g = 0; g < p.group; ++g) {
      // The offset groups this group's channels fall in.
      const int64_t og0 = g * cg / c_per_og, og1 = ((g + 1) * cg - 1) / c_per_og + 1;
      for (int64_t j0 = 0; j0 < plane; j0 += block) {
        const int64_t nj = std::min(block, plane - j0);
        samples.resize(static_cast<size_t>((og1 - og0) * taps * nj));
        parallel_for(0, (og1 - og0) * taps, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t og = og0 + r / taps, tap = r % taps, ky = tap / p.kw, kx = tap % p.kw;
            const int64_t t = og * taps + tap;
            const float* dy = off + ((n * p.offset_group * taps + t) * 2) * plane;
            const float* dx = dy + plane;
            const float* mk = mask ? mask + (n * p.offset_group * taps + t) * plane : nullptr;
            Sample* s = samples.data() + r * nj;
            for (int64_t q = 0; q < nj; ++q) {
              const int64_t pix = j0 + q, i = pix / p.ow, j = pix % p.ow;
              const float yy = static_cast<float>(i * p.stride_h - p.pad_top + ky * p.dil_h);
              const float xx = static_cast<float>(j * p.stride_w - p.pad_left + kx * p.dil_w);
              s[q] = sample_at(yy + dy[pix], xx + dx[pix], p.h, p.w, mk ? mk[pix] : 1.0f);
            }
          }
        });
        parallel_for(0, K, 1, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t ci = r / taps, tap = r % taps, ch = g * cg + ci;
            const float* xp = x + (n * p.c + ch) * hw;
            const Sample* s = samples.data() + ((ch / c_per_og - og0) * taps + tap) * nj;
            float* col = cols.data() + r * nj;
            for (int64_t q = 0; q < nj; ++q)
              col[q] = s[q].wt[0] * xp[s[q].idx[0]] + s[q].wt[1] * xp[s[q].idx[1]] +
                       s[q].wt[2] * xp[s[q].idx[2]] + s[q].wt[3] * xp[s[q].idx[3]];
          }
        });
        GemmArgs a;
        a.m = mg, a.n = nj, a.k = K;
        a.a = wt + g * mg * K, a.lda = K;
        a.b = cols.data(), a.ldb = nj;
        a.c = out + (n * p.m + g * mg) * plane + j0, a.ldc = plane;
        a.epilogue.bias_kind = bias ? Epilogue::Bias::kPerRow : Epilogue::Bias::kNone;
        a.epilogue.bias = bias ? bias + g * mg : nullptr;
        if (K == 0) {
          for (int64_t i = 0; i < mg; ++i)
            std::fill(a.c + i * plane, a.c + i * plane + nj, bias ? bias[g * mg + i] : 0.0f);
        } else if (packed) {
          sgemm_packed_a(a, packed->groups[g]);
        } else {
          sgemm(a);
        }
      }
    }
  return one(std::move(y));
}

}  // namespace

void register_deform_conv_kernel(KernelRegistry& r) {
  r.add("DeformConv",
        {.accepts = accepts, .prepare = prepare, .run = run, .reference_at_run_time = true});
}

}  // namespace pto::cpu
