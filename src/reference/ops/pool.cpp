// Reference pooling: MaxPool (with flat argmax Indices), AveragePool, LpPool and their Global
// forms. Windows are walked in padded coordinates: position q along an axis reads input q - pad
// when that is inside the input; it is "padding" when q < in + pad_begin + pad_end, and beyond
// that (the overhang ceil_mode allows) it is neither read nor counted.
#include <cmath>
#include <limits>
#include <type_traits>

#include "nn_kernels.h"

namespace pto::reference {
namespace {

// Whether v is NaN, for every compute type (integers never are).
template <class CT>
bool is_nan_value(CT v) {
  if constexpr (std::is_floating_point_v<CT>)
    return std::isnan(v);
  else
    return false;
}

enum class PoolKind { kMax, kAverage, kLp };

struct PoolSetup {
  int64_t planes;  // N * C
  Geom3 g;
  Dims yshape;
};

PoolSetup setup_pool(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  if (X.rank() < 3) throw ValueError(cat(w, ": X must be [N, C, spatial...], got ", X.str()));
  if (X.rank() > 5)
    throw UnsupportedError(cat(w, ": more than 3 spatial axes are not supported, got ", X.str()));
  const Dims in_spatial(X.shape().begin() + 2, X.shape().end());
  const Dims kernel = c.attrs().get_ints("kernel_shape");
  if (kernel.size() != in_spatial.size())
    throw ValueError(cat(w, ": kernel_shape ", dims_str(kernel), " does not match ",
                         in_spatial.size(), " spatial axes of X ", X.str()));
  const window::Params p = window::read_params(c.attrs(), kernel, true, w);
  std::vector<window::Axis> axes;
  for (size_t i = 0; i < p.rank(); ++i)
    axes.push_back(window::forward_axis(p, i, in_spatial[i], w));
  PoolSetup s;
  s.g = lift(p, axes, in_spatial);
  s.yshape = {X.dim(0), X.dim(1)};
  for (const window::Axis& a : axes) s.yshape.push_back(a.out);
  // An empty output walks nothing; otherwise N * C and the input plane cannot overflow.
  s.planes = checked_numel(s.yshape, w.c_str()) == 0 ? 0 : X.dim(0) * X.dim(1);
  return s;
}

// Calls f(input_offset_or_-1) for every position of the window at output (o0, o1, o2): the
// input's offset within the plane, or -1 for a padding position that counts.
template <class F>
void for_window(const Geom3& g, int64_t o0, int64_t o1, int64_t o2, F&& f) {
  for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
    const int64_t q0 = o0 * g.s[0] + k0 * g.d[0];
    if (q0 >= g.in[0] + g.pb[0] + g.pe[0]) break;
    const int64_t i0 = q0 - g.pb[0];
    for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
      const int64_t q1 = o1 * g.s[1] + k1 * g.d[1];
      if (q1 >= g.in[1] + g.pb[1] + g.pe[1]) break;
      const int64_t i1 = q1 - g.pb[1];
      for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
        const int64_t q2 = o2 * g.s[2] + k2 * g.d[2];
        if (q2 >= g.in[2] + g.pb[2] + g.pe[2]) break;
        const int64_t i2 = q2 - g.pb[2];
        const bool inside =
            i0 >= 0 && i0 < g.in[0] && i1 >= 0 && i1 < g.in[1] && i2 >= 0 && i2 < g.in[2];
        f(inside ? (i0 * g.in[1] + i1) * g.in[2] + i2 : -1);
      }
    }
  }
}

std::vector<Tensor> max_pool(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const PoolSetup s = setup_pool(c);
  const Geom3& g = s.g;
  const int64_t storage_order = c.node.attr_int("storage_order");
  if (storage_order != 0 && storage_order != 1)
    throw ValueError(cat(w, ": storage_order must be 0 or 1, got ", storage_order));
  // The flat index of input position (i0, i1, i2) of a plane for the Indices output; column-major
  // storage order reverses which spatial axis varies fastest (the leading lifted axes have size 1).
  const size_t rank = static_cast<size_t>(X.rank() - 2);
  auto flat_index = [&](int64_t plane, int64_t off) {
    const int64_t i2 = off % g.in[2], i1 = off / g.in[2] % g.in[1], i0 = off / g.in[2] / g.in[1];
    int64_t spatial = off;
    if (storage_order == 1) {
      const int64_t idx[3] = {i0, i1, i2};
      spatial = 0;
      int64_t stride = 1;
      for (size_t a = 3 - rank; a < 3; ++a) {
        spatial += idx[a] * stride;
        stride *= g.in[a];
      }
    }
    return plane * g.in_size() + spatial;
  };
  Tensor Y = Tensor::empty(X.dtype(), s.yshape);
  Tensor I = Tensor::empty(DType::kI64, s.yshape);
  int64_t* ip = I.data<int64_t>();
  dispatch(X.dtype(), kNumericTypes, w, [&]<class T>() {
    using CT = compute_t<T>;
    const T* xp = X.data<T>();
    T* yp = Y.data<T>();
    int64_t o = 0;
    for (int64_t plane = 0; plane < s.planes; ++plane) {
      const T* x = xp + plane * g.in_size();
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2, ++o) {
            // The first maximum wins, and a NaN over any number: the window's last NaN, as
            // torch's max_pool2d_with_indices takes it (numpy's max is NaN there too).
            int64_t best_off = -1;
            CT best = std::numeric_limits<CT>::lowest();
            for_window(g, o0, o1, o2, [&](int64_t off) {
              if (off < 0) return;
              const CT v = static_cast<CT>(x[off]);
              if (best_off < 0 || v > best || is_nan_value(v)) {
                best = v;
                best_off = off;
              }
            });
            if (best_off < 0) {  // a window entirely in padding
              if constexpr (std::numeric_limits<CT>::has_infinity)
                best = -std::numeric_limits<CT>::infinity();
            }
            yp[o] = static_cast<T>(best);
            ip[o] = best_off < 0 ? -1 : flat_index(plane, best_off);
          }
    }
  });
  if (c.num_outputs > 1) return {Y, I};
  return {Y};
}

std::vector<Tensor> avg_or_lp_pool(const KernelContext& c, PoolKind kind) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  const PoolSetup s = setup_pool(c);
  const Geom3& g = s.g;
  const bool include_pad = kind == PoolKind::kAverage && c.node.attr_int("count_include_pad");
  const double p = kind == PoolKind::kLp ? c.node.attr_float("p") : 1.0;
  if (!(p > 0) || !std::isfinite(p)) throw ValueError(cat(w, ": p must be positive, got ", p));
  const std::vector<double> x = to_doubles(X, w);
  std::vector<double> y(static_cast<size_t>(checked_numel(s.yshape)));
  int64_t o = 0;
  for (int64_t plane = 0; plane < s.planes; ++plane) {
    const double* xp = x.data() + plane * g.in_size();
    for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < g.out[2]; ++o2, ++o) {
          double sum = 0;
          int64_t count = 0;
          for_window(g, o0, o1, o2, [&](int64_t off) {
            if (off >= 0) {
              sum += kind == PoolKind::kLp ? std::pow(std::fabs(xp[off]), p) : xp[off];
              ++count;
            } else if (include_pad) {
              ++count;
            }
          });
          y[o] = kind == PoolKind::kLp ? std::pow(sum, 1.0 / p) : sum / static_cast<double>(count);
        }
  }
  return {from_doubles(X.dtype(), s.yshape, y, w)};
}

std::vector<Tensor> global_pool(const KernelContext& c, PoolKind kind) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  if (X.rank() < 2) throw ValueError(cat(w, ": X must be [N, C, spatial...], got ", X.str()));
  Dims yshape = X.shape();
  for (size_t i = 2; i < yshape.size(); ++i) yshape[i] = 1;
  const int64_t planes = checked_numel(yshape, w.c_str());
  const int64_t size = planes ? X.numel() / planes : 0;
  if (kind == PoolKind::kMax) {
    Tensor Y = Tensor::empty(X.dtype(), yshape);
    dispatch(X.dtype(), kNumericTypes, w, [&]<class T>() {
      using CT = compute_t<T>;
      const T* xp = X.data<T>();
      for (int64_t pl = 0; pl < planes; ++pl) {
        // A NaN anywhere makes the max NaN (torch's amax, numpy's max).
        CT best = size > 0 ? static_cast<CT>(xp[pl * size]) : std::numeric_limits<CT>::lowest();
        for (int64_t i = 1; i < size && !is_nan_value(best); ++i) {
          const CT v = static_cast<CT>(xp[pl * size + i]);
          if (v > best || is_nan_value(v)) best = v;
        }
        Y.data<T>()[pl] = static_cast<T>(best);
      }
    });
    return {Y};
  }
  require_float(X.dtype(), w);
  const double p = kind == PoolKind::kLp ? c.node.attr_float("p") : 1.0;
  if (!(p > 0) || !std::isfinite(p)) throw ValueError(cat(w, ": p must be positive, got ", p));
  const std::vector<double> x = to_doubles(X, w);
  std::vector<double> y(static_cast<size_t>(planes));
  for (int64_t pl = 0; pl < planes; ++pl) {
    double sum = 0;
    for (int64_t i = 0; i < size; ++i) {
      const double v = x[pl * size + i];
      sum += kind == PoolKind::kLp ? std::pow(std::fabs(v), p) : v;
    }
    y[pl] = kind == PoolKind::kLp ? std::pow(sum, 1.0 / p) : sum / static_cast<double>(size);
  }
  return {from_doubles(X.dtype(), yshape, y, w)};
}

}  // namespace

void register_pool_kernels(KernelRegistry& r) {
  r.add("MaxPool", max_pool);
  r.add("AveragePool",
        [](const KernelContext& c) { return avg_or_lp_pool(c, PoolKind::kAverage); });
  r.add("LpPool", [](const KernelContext& c) { return avg_or_lp_pool(c, PoolKind::kLp); });
  r.add("GlobalMaxPool", [](const KernelContext& c) { return global_pool(c, PoolKind::kMax); });
  r.add("GlobalAveragePool",
        [](const KernelContext& c) { return global_pool(c, PoolKind::kAverage); });
  r.add("GlobalLpPool", [](const KernelContext& c) { return global_pool(c, PoolKind::kLp); });
}

}  // namespace pto::reference
