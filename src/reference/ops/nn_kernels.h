// Shared pieces of the NN reference kernels (conv.cpp, pool.cpp, norm.cpp, softmax.cpp,
// matmul.cpp, einsum.cpp), all registered from register_nn_kernels in nn.cpp.
#pragma once

#include <cmath>

#include <algorithm>
#include <functional>
#include <type_traits>

#include "ir/ops/window.h"
#include "kernel_util.h"

namespace pto::reference {

void register_conv_kernels(KernelRegistry& r);
void register_pool_kernels(KernelRegistry& r);
void register_norm_kernels(KernelRegistry& r);
void register_softmax_kernels(KernelRegistry& r);
void register_matmul_kernels(KernelRegistry& r);
void register_einsum_kernels(KernelRegistry& r);
void register_blocked_layout_kernels(
    KernelRegistry& r);  // blocked_layout.cpp: the blocked-layout ops

// A product operand's float values (MatMul, Gemm: A and B; Conv: X and W) as the node's
// `precision` attribute has the products see them (AutoMixedPrecision): "bf16" ("f16") rounds
// each to bf16 (IEEE half) as Cast does (matmul.cpp).
std::vector<double> product_operand(const KernelContext& c, const Tensor& t,
                                    const std::string& where);

// A bf16x3 product (params::split_bf16_products) as the sum of its three: with each operand's
// head h = bf16(x) and tail l = bf16(x - h), product(Ah, Bh) + product(Al, Bh) + product(Ah, Bl)
// (matmul.cpp).
using Product =
    std::function<std::vector<double>(const std::vector<double>&, const std::vector<double>&)>;
std::vector<double> split_products(const std::vector<double>& a, const std::vector<double>& b,
                                   const Product& product);

// The opset a node was written for; 0 (a graph not from ONNX) means the newest.
inline int opset_of(const KernelContext& c) {
  return c.node.opset > 0 ? c.node.opset : 1 << 30;
}

// Throws UnsupportedError unless dt is a floating type (the float-only NN ops).
inline void require_float(DType dt, const std::string& where) {
  if (!is_floating(dt)) throw_unsupported_dtype(dt, where);
}

// A window op's geometry lifted to exactly three spatial axes (leading axes of size 1 with unit
// kernel, stride and dilation), so that one loop nest serves 1-D, 2-D and 3-D.
struct Geom3 {
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t k[3] = {1, 1, 1};
  int64_t s[3] = {1, 1, 1};
  int64_t d[3] = {1, 1, 1};
  int64_t pb[3] = {0, 0, 0};
  int64_t pe[3] = {0, 0, 0};

  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};

inline Geom3 lift(const window::Params& p, const std::vector<window::Axis>& axes,
                  const Dims& in_spatial) {
  Geom3 g;
  const size_t lead = 3 - p.rank();
  for (size_t i = 0; i < p.rank(); ++i) {
    g.in[lead + i] = in_spatial[i];
    g.out[lead + i] = axes[i].out;
    g.k[lead + i] = p.kernel[i];
    g.s[lead + i] = p.strides[i];
    g.d[lead + i] = p.dilations[i];
    g.pb[lead + i] = axes[i].pad_begin;
    g.pe[lead + i] = axes[i].pad_end;
  }
  return g;
}

// The indices i in [0, count) for which i * stride + offset lies in [0, limit), as [lo, hi).
struct Range {
  int64_t lo, hi;
};
inline Range valid_range(int64_t count, int64_t limit, int64_t stride, int64_t offset) {
  int64_t lo = std::max<int64_t>(0, window::ceil_div(-offset, stride));
  int64_t hi = std::min<int64_t>(count, window::floor_div(limit - 1 - offset, stride) + 1);
  return {lo, std::max(lo, hi)};
}

// ConvTranspose's inputs checked and its geometry resolved (output_padding, output_shape,
// auto_pad), as the reference kernel (conv.cpp) and the CPU kernel (backend/cpu/conv) read them.
struct ConvTransposePlan {
  int64_t n = 0, c = 0, m = 0, group = 1;  // batch, input and output channels, groups
  Geom3 g;
  Dims y_shape;
};
ConvTransposePlan conv_transpose_plan(const KernelContext& c);

// Col2Im's inputs and attributes checked (image_layout.cpp), for the reference kernel and the CPU
// kernel (backend/cpu/conv/conv_transpose.cpp): input [n, c * k, l] holds, for each channel and
// offset inside the block (k of them), the values of the l block positions (`blocks` per axis).
struct Col2ImPlan {
  int64_t n = 0, c = 0, k = 0, l = 0;
  Dims image, block, blocks, strides, dilations, pads;  // pads: begins then ends
  Dims out_shape;                                       // [n, c, image...]
};
Col2ImPlan col2im_plan(const KernelContext& c);

// DeformConv's inputs and attributes checked (conv.cpp), for the reference kernel and the CPU
// kernel (backend/cpu/conv/deform_conv.cpp); 2-D images only. Output pixel (i, j), tap (ky, kx)
// of channel c samples X[c] at (i stride_h - pad_top + ky dil_h + dy, j stride_w - pad_left +
// kx dil_w + dx), bilinearly with zeros outside, times the mask, where (dy, dx) are offset
// channels 2 t and 2 t + 1 and the mask channel t of c's offset group, t = (group_off kh + ky) kw
// + kx.
struct DeformConvPlan {
  int64_t n = 0, c = 0, h = 0, w = 0;  // input
  int64_t m = 0, group = 1, offset_group = 1;
  int64_t kh = 0, kw = 0, oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1, pad_top = 0, pad_left = 0;
  bool bias = false, mask = false;
};
DeformConvPlan deform_conv_plan(const KernelContext& c);

// Bilinear sample of plane p (h x w) at (y, x), corners outside the plane taken as zero.
template <class T>
inline T bilinear_zero_outside(const T* p, int64_t h, int64_t w, T y, T x) {
  if (!(y > T(-1)) || !(x > T(-1)) || !(y < T(h)) || !(x < T(w))) return T(0);
  const T fy = std::floor(y), fx = std::floor(x);
  const int64_t y0 = static_cast<int64_t>(fy), x0 = static_cast<int64_t>(fx);
  const T ly = y - fy, lx = x - fx;
  auto at = [&](int64_t yy, int64_t xx) {
    return yy >= 0 && yy < h && xx >= 0 && xx < w ? p[yy * w + xx] : T(0);
  };
  return (T(1) - ly) * ((T(1) - lx) * at(y0, x0) + lx * at(y0, x0 + 1)) +
         ly * ((T(1) - lx) * at(y0 + 1, x0) + lx * at(y0 + 1, x0 + 1));
}

// Values of a numeric tensor in the accumulation type V: double for floats, uint64 for integers.
template <class V>
std::vector<V> values_as(const Tensor& t, const std::string& where) {
  if constexpr (std::is_same_v<V, double>) {
    return to_doubles(t, where);
  } else {
    return dispatch(t.dtype(), kIntTypes, where, [&]<class T>() {
      const T* p = t.data<T>();
      std::vector<V> v(static_cast<size_t>(t.numel()));
      for (size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<uint64_t>(
            static_cast<std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>(p[i]));
      return v;
    });
  }
}

template <class V>
Tensor tensor_from(DType dt, Dims shape, const std::vector<V>& v, const std::string& where) {
  if constexpr (std::is_same_v<V, double>) {
    return from_doubles(dt, std::move(shape), v, where);
  } else {
    Tensor out = Tensor::empty(dt, std::move(shape));
    dispatch(dt, kIntTypes, where, [&]<class T>() {
      T* p = out.data<T>();
      for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(v[i]);  // modular
    });
    return out;
  }
}

}  // namespace pto::reference
