// Reference kernels for the image family's layout ops: CenterCropPad, Col2Im and MaxUnpool.
#include <algorithm>
#include <set>

#include "index_math.h"
#include "nn_kernels.h"

namespace pto::reference {
namespace {

// CenterCropPad: each listed axis is cropped (or zero-padded) symmetrically to its new size;
// when the difference is odd the extra element comes off (or goes on) the end.
std::vector<Tensor> center_crop_pad(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const std::vector<int64_t> sizes = index_values(c.input(1), w, "shape");
  if (c.input(1).rank() != 1) throw ValueError(cat(w, ": shape must be 1-D"));
  const int64_t rank = x.rank();
  std::vector<int64_t> axes = c.attrs().get_ints("axes", {});
  if (axes.empty())
    for (int64_t k = 0; k < rank; ++k) axes.push_back(k);
  if (axes.size() != sizes.size())
    throw ValueError(cat(w, ": shape has ", sizes.size(), " entries for ", axes.size(), " axes"));
  Dims out_shape = x.shape();
  Dims shift(rank, 0);  // input index = output index + shift
  std::set<int64_t> seen;
  for (size_t i = 0; i < axes.size(); ++i) {
    const int64_t a = normalize_axis(axes[i], rank, w);
    if (!seen.insert(a).second) throw ValueError(cat(w, ": axis ", a, " is listed twice"));
    if (sizes[i] < 0) throw ValueError(cat(w, ": negative size ", sizes[i]));
    const int64_t dim = x.dim(a);
    out_shape[a] = sizes[i];
    shift[a] = sizes[i] < dim ? (dim - sizes[i]) / 2 : -((sizes[i] - dim) / 2);
  }
  checked_numel(out_shape, "CenterCropPad output");
  Tensor y = Tensor::zeros(x.dtype(), out_shape);
  Dims idx(rank);
  const Dims in_strides = contiguous_strides(x.shape());
  for (int64_t o = 0; o < y.numel(); ++o) {
    unravel(o, out_shape, idx);
    int64_t off = 0;
    bool inside = true;
    for (int64_t k = 0; k < rank && inside; ++k) {
      const int64_t i = idx[k] + shift[k];
      inside = i >= 0 && i < x.dim(k);
      off += i * in_strides[k];
    }
    if (inside) copy_elems(y, o, x, off, 1);
  }
  return {y};
}

// A spatial attribute list (strides, dilations, pads) with its default and checks.
std::vector<int64_t> spatial_attr(const KernelContext& c, const char* name, size_t n,
                                  int64_t fallback, int64_t min) {
  std::vector<int64_t> v = c.attrs().get_ints(name, std::vector<int64_t>(n, fallback));
  if (v.size() != n)
    throw ValueError(cat(c.where(), ": ", name, " must have ", n, " entries, got ", v.size()));
  for (int64_t e : v)
    if (e < min) throw ValueError(cat(c.where(), ": ", name, " entries must be >= ", min));
  return v;
}

// Col2Im: input[n, c * K + k, l] (k a block offset, l a block position) is added to
// output[n, c, l * stride - pad_begin + k * dilation] per spatial axis, where in range.
std::vector<Tensor> col2im(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const Col2ImPlan p = col2im_plan(c);
  const size_t n = p.image.size();
  const Dims &image = p.image, &block = p.block, &blocks = p.blocks, &strides = p.strides,
             &dilations = p.dilations, &pads = p.pads;
  const int64_t N = p.n, K = p.k, L = p.l;
  Tensor y = Tensor::empty(x.dtype(), p.out_shape);
  if (y.numel() == 0) return {y};
  const int64_t plane = checked_numel(image, "Col2Im image");
  const Dims img_strides = contiguous_strides(image);
  dispatch(x.dtype(), kNumericTypes, w, [&]<class T>() {
    constexpr bool kInt =
        std::is_integral_v<T> && !std::is_same_v<T, bool>;  // bool: not dispatched
    using Acc = std::conditional_t<kInt, T, double>;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    std::vector<Acc> acc(static_cast<size_t>(plane));
    Dims kidx(n), lidx(n);
    for (int64_t b = 0; b < N * p.c; ++b) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (int64_t k = 0; k < K; ++k) {
        unravel(k, block, kidx);
        for (int64_t l = 0; l < L; ++l) {
          unravel(l, blocks, lidx);
          int64_t off = 0;
          bool inside = true;
          for (size_t a = 0; a < n && inside; ++a) {
            const int64_t i = lidx[a] * strides[a] - pads[a] + kidx[a] * dilations[a];
            inside = i >= 0 && i < image[a];
            off += i * img_strides[a];
          }
          if (!inside) continue;
          const T v = in[(b * K + k) * L + l];
          if constexpr (kInt)
            acc[off] = wrap_add(acc[off], v);
          else
            acc[off] += static_cast<double>(static_cast<compute_t<T>>(v));
        }
      }
      for (int64_t i = 0; i < plane; ++i)
        out[b * plane + i] = static_cast<T>(static_cast<compute_t<T>>(acc[i]));
    }
  });
  return {y};
}

// MaxUnpool: Y.flat[I.flat[i]] = X.flat[i] in a zero tensor of the shape MaxPool came from,
// (in - 1) * stride - pads + kernel per spatial axis. An output_shape input may only enlarge that
// shape; the unpooled tensor then sits at its origin, the rest zeros (the ONNX reference).
std::vector<Tensor> max_unpool(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  if (x.rank() < 3) throw ValueError(cat(w, ": X must be [N, C, spatial...], got ", x.str()));
  const size_t n = static_cast<size_t>(x.rank() - 2);
  if (c.input(1).shape() != x.shape())
    throw ValueError(cat(w, ": indices ", c.input(1).str(), " must have X's shape ", x.str()));
  const std::vector<int64_t> indices = index_values(c.input(1), w, "I");
  const std::vector<int64_t> kernel = c.attrs().get_ints("kernel_shape");
  if (kernel.size() != n)
    throw ValueError(cat(w, ": kernel_shape must have ", n, " entries, got ", kernel.size()));
  const std::vector<int64_t> strides = spatial_attr(c, "strides", n, 1, 1);
  const std::vector<int64_t> pads = spatial_attr(c, "pads", 2 * n, 0, 0);
  Dims inferred{x.dim(0), x.dim(1)};
  for (size_t k = 0; k < n; ++k) {
    if (kernel[k] < 1) throw ValueError(cat(w, ": kernel_shape entries must be >= 1"));
    const int64_t d = (x.dim(k + 2) - 1) * strides[k] - pads[k] - pads[k + n] + kernel[k];
    if (d < 0) throw ValueError(cat(w, ": the unpooled axis ", k + 2, " would be negative"));
    inferred.push_back(d);
  }
  const int64_t total = checked_numel(inferred, "MaxUnpool output");
  Dims out_shape = inferred;
  if (c.has_input(2)) {
    out_shape = index_values(c.input(2), w, "output_shape");
    if (c.input(2).rank() != 1 || out_shape.size() != inferred.size())
      throw ValueError(cat(w, ": output_shape must be 1-D with ", inferred.size(), " entries"));
    for (size_t k = 0; k < out_shape.size(); ++k)
      if (out_shape[k] < inferred[k])
        throw ValueError(cat(w, ": output_shape ", dims_str(out_shape),
                             " is smaller than the unpooled shape ", dims_str(inferred)));
  }
  checked_numel(out_shape, "MaxUnpool output");
  Tensor unpooled = Tensor::zeros(x.dtype(), inferred);
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (indices[i] < 0 || indices[i] >= total)
      throw ValueError(
          cat(w, ": index ", indices[i], " is outside the unpooled tensor ", dims_str(inferred)));
    copy_elems(unpooled, indices[i], x, i, 1);
  }
  if (out_shape == inferred) return {unpooled};
  Tensor y = Tensor::zeros(x.dtype(), out_shape);
  const Dims out_strides = contiguous_strides(out_shape);
  Dims idx(inferred.size());
  for (int64_t i = 0; i < total; ++i) {
    unravel(i, inferred, idx);
    int64_t off = 0;
    for (size_t k = 0; k < idx.size(); ++k) off += idx[k] * out_strides[k];
    copy_elems(y, off, unpooled, i, 1);
  }
  return {y};
}

}  // namespace

Col2ImPlan col2im_plan(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  Col2ImPlan p;
  p.image = index_values(c.input(1), w, "image_shape");
  p.block = index_values(c.input(2), w, "block_shape");
  const size_t n = p.image.size();
  if (x.rank() != 3) throw ValueError(cat(w, ": input must be [N, C * prod(block), L]"));
  if (n == 0 || p.block.size() != n || c.input(1).rank() != 1 || c.input(2).rank() != 1)
    throw ValueError(cat(w, ": image_shape and block_shape must be 1-D of equal, nonzero length"));
  p.strides = spatial_attr(c, "strides", n, 1, 1);
  p.dilations = spatial_attr(c, "dilations", n, 1, 1);
  p.pads = spatial_attr(c, "pads", 2 * n, 0, 0);
  for (size_t k = 0; k < n; ++k)
    if (p.image[k] < 0 || p.block[k] < 1)
      throw ValueError(cat(w, ": image_shape must be >= 0 and block_shape >= 1"));
  p.k = checked_numel(p.block, "Col2Im block");
  if (x.dim(1) % p.k != 0)
    throw ValueError(
        cat(w, ": input dim 1 (", x.dim(1), ") is not a multiple of the block size ", p.k));
  p.blocks.resize(n);
  for (size_t k = 0; k < n; ++k) {
    const int64_t span =
        p.image[k] + p.pads[k] + p.pads[k + n] - p.dilations[k] * (p.block[k] - 1) - 1;
    if (span < 0) throw ValueError(cat(w, ": the block does not fit the padded image"));
    p.blocks[k] = span / p.strides[k] + 1;
  }
  p.l = checked_numel(p.blocks, "Col2Im blocks");
  if (x.dim(2) != p.l)
    throw ValueError(cat(w, ": input has ", x.dim(2), " blocks, the image holds ", p.l));
  p.n = x.dim(0);
  p.c = x.dim(1) / p.k;
  p.out_shape = {p.n, p.c};
  p.out_shape.insert(p.out_shape.end(), p.image.begin(), p.image.end());
  return p;
}

void register_image_layout_kernels(KernelRegistry& r) {
  r.add("CenterCropPad", center_crop_pad);
  r.add("Col2Im", col2im);
  r.add("MaxUnpool", max_unpool);
}

}  // namespace pto::reference
