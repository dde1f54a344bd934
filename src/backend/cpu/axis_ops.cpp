// CPU kernels for the less common normalizations and per-axis ops that real ONNX files still
// carry: MeanVarianceNormalization (speech front ends), LpNormalization (embedding heads), LRN
// (AlexNet/GoogLeNet-era CNNs), Hardmax and Trilu (masks). float32 (Trilu: every dtype); each
// mirrors the reference kernel's formula (src/reference/ops/norm.cpp, softmax.cpp, generate.cpp)
// and leaves what it does not cover (other dtypes, legacy attributes, bad axes: their errors) to
// the reference kernel.
//
//   MVN      (x - mean) / (sqrt(var) + 1e-9) per group of the kept axes (ONNX's function body;
//            onnxruntime 1.32 divides by sqrt(var) alone, so a constant group is NaN there and 0
//            here). The input viewed as [A, G, B] (A and B reduced, G kept): each group's
//            chunks' moments (the LayerNormalization kernels' shifted ones) combined in double,
//            then one normalizing pass; [A, G] (columns) per column in double across the rows;
//            other axis sets are packed to [kept, reduced] first.
//   LpNorm   the p-norm along the axis by the ReduceL1/ReduceSumSquare folds, then x / norm (a
//            zero norm gives zeros, as in onnxruntime).
//   LRN      per channel plane, the window's squares summed in float, then x * s^-beta (beta 0.75:
//            two square roots; else std::pow).
//   Hardmax  one-hot of the first maximum along the axis (the max fold skipping NaN, then a scan
//            for it); a row whose first element is NaN is all zeros and other NaNs are skipped
//            (onnxruntime's result where its running max starts at a NaN and stays there).
//   Trilu    rows copied as bytes, the rest zeroed, rows spread over threads.
//   RotaryEmbedding  each head's pairs rotated by its position's cos/sin row, in float.
//   LpPool   the reference's windows and double sums, without its per-element pow for p = 1, 2.
#include <cmath>
#include <cstring>

#include "backend/cpu/kernel.h"
#include "backend/cpu/movement/strided_copy.h"
#include "backend/cpu/reduce_kernels.h"
#include "ir/ops/op_params.h"
#include "ir/ops/window.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

bool f32_in_out(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32 && n.outputs.size() == 1;
}

// ---- MeanVarianceNormalization ----

// Normalizes groups [g0, g1) of x viewed as [A, G, B] (reduce A and B) into y.
void mvn_groups(const float* x, float* y, int64_t A, int64_t G, int64_t B, int64_t g0, int64_t g1) {
  constexpr float kEps = 1e-9f;  // ONNX's function body: (x - mean) / (sqrt(var) + 1e-9)
  for (int64_t g = g0; g < g1; ++g) {
    float shift = 0, mean = 0, var = 0;
    if (A == 1) {
      PTO_ISA_DISPATCH(moments, x + g * B, B, &shift, &mean, &var);
    } else {
      // Chan's combination of the chunks' population moments (count B each), in double.
      double m = 0, m2 = 0;
      for (int64_t a = 0; a < A; ++a) {
        float s, cm, cv;
        PTO_ISA_DISPATCH(moments, x + (a * G + g) * B, B, &s, &cm, &cv);
        const double chunk_mean = static_cast<double>(s) + cm;
        const double n0 = static_cast<double>(a * B), n = n0 + static_cast<double>(B);
        const double delta = chunk_mean - m;
        m += delta * static_cast<double>(B) / n;
        m2 += static_cast<double>(cv) * static_cast<double>(B) + delta * delta * n0 * B / n;
      }
      shift = static_cast<float>(m);
      mean = static_cast<float>(m - static_cast<double>(shift));
      var = static_cast<float>(m2 / (static_cast<double>(A) * static_cast<double>(B)));
    }
    const float a = 1.0f / (std::sqrt(var) + kEps);
    for (int64_t k = 0; k < A; ++k) {
      const int64_t off = (k * G + g) * B;
      PTO_ISA_DISPATCH(normalize, x + off, y + off, B, shift, mean, a, 0.0f);
    }
  }
}

void mvn_all(const float* x, float* y, int64_t A, int64_t G, int64_t B) {
  parallel_for(0, G, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, A * B)),
               [&](int64_t g0, int64_t g1) { mvn_groups(x, y, A, G, B, g0, g1); });
}

// Normalizes columns [g0, g1) of x viewed as [A, G] (reduce A): the sums and the squared
// deviations accumulated per column in double, row by row (vectorized across the columns).
void mvn_columns(const float* x, float* y, int64_t A, int64_t G, int64_t g0, int64_t g1) {
  const size_t w = static_cast<size_t>(g1 - g0);
  std::vector<double> sum(w, 0.0), dev(w, 0.0);
  std::vector<float> mean(w), a(w);
  for (int64_t r = 0; r < A; ++r) {
    const float* xr = x + r * G + g0;
    for (size_t i = 0; i < w; ++i) sum[i] += xr[i];
  }
  for (size_t i = 0; i < w; ++i) mean[i] = static_cast<float>(sum[i] / static_cast<double>(A));
  for (int64_t r = 0; r < A; ++r) {
    const float* xr = x + r * G + g0;
    for (size_t i = 0; i < w; ++i) {
      const double d = static_cast<double>(xr[i]) - mean[i];
      dev[i] += d * d;
    }
  }
  for (size_t i = 0; i < w; ++i)
    a[i] = 1.0f / (std::sqrt(static_cast<float>(dev[i] / static_cast<double>(A))) + 1e-9f);
  for (int64_t r = 0; r < A; ++r) {
    const float* xr = x + r * G + g0;
    float* yr = y + r * G + g0;
    for (size_t i = 0; i < w; ++i) yr[i] = (xr[i] - mean[i]) * a[i];
  }
}

bool accepts_mvn(const NodeInfo& n) {
  // The opset 1 attributes (across_channels, normalize_variance) are the reference's to judge.
  return f32_in_out(n) && !n.node.attrs.has("across_channels") &&
         !n.node.attrs.has("normalize_variance");
}

std::vector<Tensor> run_mvn(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t rank = x.rank();
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t a : c.node.attr_ints("axes")) {
    if (a < -rank || a >= rank) return run_reference(c);  // its error
    const int64_t ax = a < 0 ? a + rank : a;
    if (reduced[ax]) return run_reference(c);
    reduced[ax] = true;
  }
  Tensor y = Tensor::empty(DType::kF32, x.shape());
  if (x.numel() == 0) return one(std::move(y));
  // Runs of adjacent axes that are all reduced or all kept (size-1 axes join either).
  std::vector<std::pair<int64_t, bool>> runs;  // size, reduced
  for (int64_t a = 0; a < rank; ++a) {
    if (x.dim(a) == 1) continue;
    if (!runs.empty() && runs.back().second == reduced[a])
      runs.back().first *= x.dim(a);
    else
      runs.push_back({x.dim(a), reduced[a]});
  }
  // [A, G, B]: at most a reduced run, a kept run and a reduced run, in that order.
  int64_t A = 1, G = 1, B = 1;
  size_t i = 0;
  if (i < runs.size() && runs[i].second) A = runs[i++].first;
  if (i < runs.size() && !runs[i].second) G = runs[i++].first;
  if (i < runs.size() && runs[i].second) B = runs[i++].first;
  // Chunks of B contiguous elements; columns ([A, G]: B == 1); short chunks (or a kept run
  // inside) are packed first.
  if (i == runs.size() && (A == 1 || B >= 16)) {
    mvn_all(x.data<float>(), y.data<float>(), A, G, B);
    return one(std::move(y));
  }
  if (i == runs.size() && B == 1) {
    const float* in = x.data<float>();
    float* out = y.data<float>();
    // Column ranges of whole cache lines per task.
    const int64_t grain = std::max<int64_t>(16, (kParallelGrain / A + 15) / 16 * 16);
    parallel_for(0, G, grain, [&](int64_t g0, int64_t g1) { mvn_columns(in, out, A, G, g0, g1); });
    return one(std::move(y));
  }
  // The kept axes first, then the reduced ones: rows of the reduced elements.
  Dims perm;
  for (int64_t a = 0; a < rank; ++a)
    if (!reduced[a]) perm.push_back(a);
  int64_t rows = 1;
  for (int64_t a : perm) rows *= x.dim(a);
  for (int64_t a = 0; a < rank; ++a)
    if (reduced[a]) perm.push_back(a);
  Dims shape, strides;
  for (int64_t a : perm) {
    shape.push_back(x.dim(a));
    strides.push_back(x.strides()[a]);
  }
  Tensor packed = pack(x.view(shape, strides, 0));
  mvn_all(packed.data<float>(), packed.data<float>(), 1, rows, x.numel() / rows);
  unpack_into(y.view(shape, strides, 0), packed);
  return one(std::move(y));
}

// ---- LpNormalization ----

bool accepts_lp_norm(const NodeInfo& n) {
  const int64_t p = n.node.attr_int("p");
  return f32_in_out(n) && (p == 1 || p == 2);
}

std::vector<Tensor> run_lp_norm(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t axis_attr = c.node.attr_int("axis");
  if (x.rank() == 0 || axis_attr < -x.rank() || axis_attr >= x.rank()) return run_reference(c);
  const int64_t axis = c.axis(axis_attr, x.rank());
  Tensor y = Tensor::empty(DType::kF32, x.shape());
  if (x.numel() == 0) return one(std::move(y));
  int64_t outer = 1, inner = 1;
  for (int64_t a = 0; a < axis; ++a) outer *= x.dim(a);
  for (int64_t a = axis + 1; a < x.rank(); ++a) inner *= x.dim(a);
  const int64_t len = x.dim(axis);
  const bool l2 = c.node.attr_int("p") == 2;
  std::vector<float> norm(static_cast<size_t>(outer * inner));
  fold_all(l2 ? Fold::kSumSquare : Fold::kSumAbs, x.data<float>(), outer, len, inner, nullptr,
           norm.data());
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_for(0, outer, std::max<int64_t>(1, kParallelGrain / (len * inner)),
               [&](int64_t o0, int64_t o1) {
                 for (int64_t o = o0; o < o1; ++o) {
                   float* nr = norm.data() + o * inner;
                   if (l2)
                     for (int64_t i = 0; i < inner; ++i) nr[i] = std::sqrt(nr[i]);
                   for (int64_t j = 0; j < len; ++j) {
                     const float* xr = in + (o * len + j) * inner;
                     float* yr = out + (o * len + j) * inner;
                     for (int64_t i = 0; i < inner; ++i)  // a zero norm gives zeros
                       yr[i] = nr[i] == 0.0f ? 0.0f : xr[i] / nr[i];
                   }
                 }
               });
  return one(std::move(y));
}

// ---- LRN ----

std::vector<Tensor> run_lrn(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t size = c.attrs().get_int("size");
  if (x.rank() < 2 || size < 1) return run_reference(c);  // its errors
  Tensor y = Tensor::empty(DType::kF32, x.shape());
  if (x.numel() == 0) return one(std::move(y));
  const float alpha = static_cast<float>(c.node.attr_float("alpha"));
  const float beta = static_cast<float>(c.node.attr_float("beta"));
  const float bias = static_cast<float>(c.node.attr_float("bias"));
  const float scale = alpha / static_cast<float>(size);
  const int64_t channels = x.dim(1), planes = x.dim(0) * channels;
  const int64_t hw = x.numel() / planes;
  // Channels [ch - floor((size-1)/2), ch + ceil((size-1)/2)], clipped to the tensor.
  const int64_t before = (size - 1) / 2, after = size - 1 - before;
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_for(0, planes, std::max<int64_t>(1, kParallelGrain / (hw * std::min(size, channels))),
               [&](int64_t p0, int64_t p1) {
                 std::vector<float> acc(static_cast<size_t>(hw));
                 for (int64_t p = p0; p < p1; ++p) {
                   const int64_t n = p / channels, ch = p % channels;
                   const int64_t lo = std::max<int64_t>(0, ch - before);
                   const int64_t hi = std::min(channels - 1, ch + std::min(after, channels));
                   std::fill(acc.begin(), acc.end(), 0.0f);
                   for (int64_t k = lo; k <= hi; ++k) {
                     const float* xk = in + (n * channels + k) * hw;
                     for (int64_t i = 0; i < hw; ++i) acc[i] += xk[i] * xk[i];
                   }
                   const float* xp = in + p * hw;
                   float* yp = out + p * hw;
                   if (beta == 0.75f) {
                     for (int64_t i = 0; i < hw; ++i) {
                       const float s = bias + scale * acc[i];
                       const float r = std::sqrt(s);
                       yp[i] = xp[i] / (r * std::sqrt(r));
                     }
                   } else {
                     for (int64_t i = 0; i < hw; ++i)
                       yp[i] = xp[i] / std::pow(bias + scale * acc[i], beta);
                   }
                 }
               });
  return one(std::move(y));
}

// ---- Hardmax ----

std::vector<Tensor> run_hardmax(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t rank = x.rank();
  int64_t axis = params::softmax_axis(c.node);
  const bool per_axis = !params::softmax_coerces_2d(c.node);
  // Before opset 13: rows of everything from `axis` on; from 13: along `axis`.
  if (rank == 0 || axis < -rank || axis >= (per_axis ? rank : rank + 1)) return run_reference(c);
  if (axis < 0) axis += rank;
  Tensor y = Tensor::zeros(DType::kF32, x.shape());
  if (x.numel() == 0) return one(std::move(y));
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t a = 0; a < rank; ++a)
    (a < axis ? outer : (per_axis && a > axis) ? inner : len) *= x.dim(a);
  // The largest non-NaN element of each row (the vector max fold), then the first position
  // holding it: the first strict maximum, NaNs skipped. A row starting with NaN stays zeros.
  std::vector<float> best(static_cast<size_t>(outer * inner));
  fold_all(Fold::kMaxSkipNaN, x.data<float>(), outer, len, inner, nullptr, best.data());
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_for(0, outer, std::max<int64_t>(1, kParallelGrain / (len * inner)),
               [&](int64_t o0, int64_t o1) {
                 std::vector<uint8_t> found(static_cast<size_t>(inner));
                 for (int64_t o = o0; o < o1; ++o) {
                   const float* xo = in + o * len * inner;
                   float* yo = out + o * len * inner;
                   const float* bo = best.data() + o * inner;
                   if (inner == 1) {
                     if (std::isnan(xo[0])) continue;
                     int64_t j = 0;
                     while (xo[j] != bo[0]) ++j;  // bo[0] is one of the row's elements
                     yo[j] = 1.0f;
                     continue;
                   }
                   for (int64_t i = 0; i < inner; ++i) found[i] = std::isnan(xo[i]);
                   for (int64_t j = 0; j < len; ++j)
                     for (int64_t i = 0; i < inner; ++i)
                       if (!found[i] && xo[j * inner + i] == bo[i]) {
                         found[i] = 1;
                         yo[j * inner + i] = 1.0f;
                       }
                 }
               });
  return one(std::move(y));
}

// ---- Trilu ----

// Whole-byte element types (the sub-byte and 8-bit float ones stay on the reference).
bool accepts_trilu(const NodeInfo& n) {
  using enum DType;
  for (DType t : {kF32, kF64, kF16, kBF16, kI8, kI16, kI32, kI64, kU8, kU16, kU32, kU64, kBool})
    if (n.dtype(0) == t) return true;
  return false;
}

std::vector<Tensor> run_trilu(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() < 2) return run_reference(c);
  int64_t k = 0;
  if (c.has_input(1)) {
    const Tensor& kt = c.input(1);
    if (kt.numel() != 1 || kt.dtype() != DType::kI64) return run_reference(c);
    k = kt.data<int64_t>()[0];
  }
  const bool upper = c.node.attr_int("upper") != 0;
  const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
  k = std::clamp<int64_t>(k, -rows - 1, cols + 1);  // beyond this every k acts the same
  Tensor y = Tensor::empty(x.dtype(), x.shape());
  if (x.numel() == 0) return one(std::move(y));
  const size_t item = x.itemsize();
  const auto* src = static_cast<const std::byte*>(x.raw_data());
  auto* dst = static_cast<std::byte*>(y.raw_data());
  const int64_t all_rows = x.numel() / cols;
  parallel_for(0, all_rows, std::max<int64_t>(1, kParallelGrain / cols),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   const int64_t i = r % rows;
                   const int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
                   const int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
                   std::byte* d = dst + static_cast<size_t>(r * cols) * item;
                   const std::byte* s = src + static_cast<size_t>(r * cols) * item;
                   const size_t row = static_cast<size_t>(cols) * item;
                   if (hi <= lo) {
                     std::memset(d, 0, row);
                     continue;
                   }
                   std::memset(d, 0, static_cast<size_t>(lo) * item);
                   std::memcpy(d + lo * item, s + lo * item, static_cast<size_t>(hi - lo) * item);
                   std::memset(d + hi * item, 0, static_cast<size_t>(cols - hi) * item);
                 }
               });
  return one(std::move(y));
}

// ---- RotaryEmbedding ----

bool accepts_rotary(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32 && n.dtype(1) == DType::kF32 && n.dtype(2) == DType::kF32 &&
         (n.inputs.size() < 4 || n.dtype(3) == DType::kUndefined || n.dtype(3) == DType::kI64) &&
         n.outputs.size() == 1;
}

// X is [B, H, S, D] (4-D) or [B, S, H * D] (3-D, num_heads); each head's first
// rotary_embedding_dim values rotated in pairs (k, k + half), or (2k, 2k + 1) interleaved, by the
// cos/sin cache row of the position (position_ids into a [positions, half] cache, or a
// [B, S, half] cache); the rest copied. Anything the reference would reject goes to it.
std::vector<Tensor> run_rotary(const KernelContext& c) {
  const Tensor &x = c.input(0), &cs = c.input(1), &sn = c.input(2);
  const auto& a = c.attrs();
  if ((x.rank() != 3 && x.rank() != 4) || cs.shape() != sn.shape() || cs.rank() < 2)
    return run_reference(c);
  const bool packed = x.rank() == 3;
  const int64_t heads = packed ? a.get_int("num_heads", 0) : x.dim(1);
  if (packed && (heads <= 0 || x.dim(2) % heads != 0)) return run_reference(c);
  const int64_t B = x.dim(0), H = heads, S = packed ? x.dim(1) : x.dim(2);
  const int64_t D = packed ? x.dim(2) / heads : x.dim(3);
  const int64_t rot =
      c.node.attr_int("rotary_embedding_dim") ? a.get_int("rotary_embedding_dim") : D;
  if (rot <= 0 || rot > D || rot % 2 || cs.dim(cs.rank() - 1) != rot / 2) return run_reference(c);
  const int64_t half = rot / 2;
  const bool interleaved = c.node.attr_int("interleaved") != 0;
  const int64_t* pos = nullptr;
  if (c.has_input(3)) {
    const Tensor& p = c.input(3);
    if (p.rank() != 2 || p.dim(0) != B || p.dim(1) != S || cs.rank() != 2) return run_reference(c);
    pos = p.data<int64_t>();
    for (int64_t i = 0; i < p.numel(); ++i)
      if (pos[i] < 0 || pos[i] >= cs.dim(0)) return run_reference(c);
  } else if (cs.rank() != 3 || cs.dim(0) != B || cs.dim(1) != S) {
    return run_reference(c);
  }
  Tensor y = Tensor::empty(DType::kF32, x.shape());
  if (x.numel() == 0) return one(std::move(y));
  const float *in = x.data<float>(), *pc = cs.data<float>(), *ps = sn.data<float>();
  float* out = y.data<float>();
  parallel_for(0, B * S, std::max<int64_t>(1, kParallelGrain / (H * D)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   const int64_t b = r / S, s = r % S;
                   const int64_t row = pos ? pos[r] : r;
                   const float *co = pc + row * half, *si = ps + row * half;
                   for (int64_t h = 0; h < H; ++h) {
                     const int64_t off = packed ? (r * H + h) * D : ((b * H + h) * S + s) * D;
                     const float* xi = in + off;
                     float* yo = out + off;
                     if (interleaved) {
                       for (int64_t k = 0; k < half; ++k) {
                         const float x1 = xi[2 * k], x2 = xi[2 * k + 1];
                         yo[2 * k] = co[k] * x1 - si[k] * x2;
                         yo[2 * k + 1] = si[k] * x1 + co[k] * x2;
                       }
                     } else {
                       for (int64_t k = 0; k < half; ++k) {
                         const float x1 = xi[k], x2 = xi[k + half];
                         yo[k] = co[k] * x1 - si[k] * x2;
                         yo[k + half] = si[k] * x1 + co[k] * x2;
                       }
                     }
                     std::copy(xi + rot, xi + D, yo + rot);
                   }
                 }
               });
  return one(std::move(y));
}

// ---- LpPool ----

// (sum over the window's in-bounds elements of |x|^p)^(1/p) per output position, 1 to 3 spatial
// axes, the reference's geometry (ir/ops/window.h) and arithmetic (double sums in window order;
// |x|^p as x * x for p = 2 and |x| for p = 1, which are what pow gives there), planes in
// parallel. Bad attributes and shapes go to the reference for its errors.
std::vector<Tensor> run_lp_pool(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const double p = c.node.attr_float("p");
  if (x.rank() < 3 || x.rank() > 5 || !(p > 0) || !std::isfinite(p)) return run_reference(c);
  const size_t rank = static_cast<size_t>(x.rank() - 2);
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1},
          d[3] = {1, 1, 1}, pb[3] = {0, 0, 0}, pe[3] = {0, 0, 0};
  try {
    const Dims kernel = c.attrs().get_ints("kernel_shape");
    if (kernel.size() != rank) return run_reference(c);
    const window::Params wp = window::read_params(c.attrs(), kernel, true, c.where());
    const size_t lead = 3 - rank;
    for (size_t i = 0; i < rank; ++i) {
      const window::Axis ax = window::forward_axis(wp, i, x.dim(2 + i), c.where());
      in[lead + i] = x.dim(2 + i), out[lead + i] = ax.out, k[lead + i] = wp.kernel[i];
      s[lead + i] = wp.strides[i], d[lead + i] = wp.dilations[i];
      pb[lead + i] = ax.pad_begin, pe[lead + i] = ax.pad_end;
    }
  } catch (const Error&) {
    return run_reference(c);
  }
  Dims yshape = {x.dim(0), x.dim(1)};
  for (size_t i = 0; i < rank; ++i) yshape.push_back(out[3 - rank + i]);
  Tensor y = Tensor::empty(DType::kF32, yshape);
  if (y.numel() == 0) return one(std::move(y));
  const int64_t planes = x.dim(0) * x.dim(1), in_size = in[0] * in[1] * in[2];
  const int64_t out_size = out[0] * out[1] * out[2], k_size = k[0] * k[1] * k[2];
  const int kind = p == 2 ? 2 : p == 1 ? 1 : 0;
  const double inv_p = 1.0 / p;
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  parallel_for(0, planes, std::max<int64_t>(1, kParallelGrain / (out_size * k_size)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t plane = p0; plane < p1; ++plane) {
                   const float* xp = xs + plane * in_size;
                   float* yp = ys + plane * out_size;
                   int64_t o = 0;
                   for (int64_t o0 = 0; o0 < out[0]; ++o0)
                     for (int64_t o1 = 0; o1 < out[1]; ++o1)
                       for (int64_t o2 = 0; o2 < out[2]; ++o2, ++o) {
                         double sum = 0;
                         for (int64_t k0 = 0; k0 < k[0]; ++k0) {
                           const int64_t i0 = o0 * s[0] + k0 * d[0] - pb[0];
                           if (i0 + pb[0] >= in[0] + pb[0] + pe[0]) break;
                           if (i0 < 0 || i0 >= in[0]) continue;
                           for (int64_t k1 = 0; k1 < k[1]; ++k1) {
                             const int64_t i1 = o1 * s[1] + k1 * d[1] - pb[1];
                             if (i1 + pb[1] >= in[1] + pb[1] + pe[1]) break;
                             if (i1 < 0 || i1 >= in[1]) continue;
                             const float* row = xp + (i0 * in[1] + i1) * in[2];
                             for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                               const int64_t i2 = o2 * s[2] + k2 * d[2] - pb[2];
                               if (i2 + pb[2] >= in[2] + pb[2] + pe[2]) break;
                               if (i2 < 0 || i2 >= in[2]) continue;
                               const double v = row[i2];
                               sum += kind == 2   ? v * v
                                      : kind == 1 ? std::fabs(v)
                                                  : std::pow(std::fabs(v), p);
                             }
                           }
                         }
                         yp[o] = static_cast<float>(std::pow(sum, inv_p));
                       }
                 }
               });
  return one(std::move(y));
}

}  // namespace

void register_axis_kernels(KernelRegistry& r) {
  // Bad axes, attributes and parameter shapes go to the reference at run time for its errors.
  r.add("MeanVarianceNormalization",
        {.accepts = accepts_mvn, .run = run_mvn, .reference_at_run_time = true});
  r.add("LpNormalization",
        {.accepts = accepts_lp_norm, .run = run_lp_norm, .reference_at_run_time = true});
  r.add("LRN", {.accepts = f32_in_out, .run = run_lrn, .reference_at_run_time = true});
  r.add("Hardmax", {.accepts = f32_in_out, .run = run_hardmax, .reference_at_run_time = true});
  r.add("Trilu", {.accepts = accepts_trilu, .run = run_trilu, .reference_at_run_time = true});
  r.add("LpPool", {.accepts = f32_in_out, .run = run_lp_pool, .reference_at_run_time = true});
  r.add("RotaryEmbedding",
        {.accepts = accepts_rotary, .run = run_rotary, .reference_at_run_time = true});
}

}  // namespace pto::cpu
