// Reference kernel for Pad: constant, reflect, edge and wrap modes, pads as attribute (opsets
// 1-10) or input (11+), optional axes (18+). Negative pads crop first; the padding modes then see
// the cropped input. Any dtype: elements are copied as bytes.
#include <cstring>

#include "cast.h"
#include "layout_params.h"
#include "tensor_kernels.h"

namespace pto::reference {
namespace {

// The input index an output index o along one axis reads, or -1 for the constant.
int64_t source_index(int64_t i, int64_t d, const std::string& mode) {
  if (i >= 0 && i < d) return i;
  if (mode == "constant") return -1;
  if (mode == "edge") return i < 0 ? 0 : d - 1;
  if (mode == "wrap") return ((i % d) + d) % d;
  // reflect: the pattern 0 1 .. d-1 d-2 .. 1 repeats with period 2(d-1), as numpy does
  if (d == 1) return 0;
  int64_t period = 2 * (d - 1);
  int64_t m = ((i % period) + period) % period;
  return m < d ? m : period - m;
}

}  // namespace

PadPlan pad_plan(const KernelContext& c) {
  const Tensor& x = c.input(0);
  int64_t rank = x.rank();
  std::string mode = c.node.attr_string("mode");
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    throw ValueError(cat(c.where(), ": unknown mode '", mode, "'"));

  std::vector<int64_t> pads;
  if (c.has_input(1))
    pads = to_int64s(c.input(1), c.where());
  else if (c.attrs().has("pads"))
    pads = c.attrs().get_ints("pads");
  else if (c.attrs().has("paddings"))  // Pad-1
    pads = c.attrs().get_ints("paddings");
  else
    throw ValueError(cat(c.where(), ": pads are required"));

  std::vector<int64_t> axes;
  if (c.has_input(3)) {
    std::vector<bool> seen(rank, false);
    for (int64_t a : to_int64s(c.input(3), c.where())) {
      int64_t n = normalize_axis(a, rank, c.where());
      if (seen[n]) throw ValueError(cat(c.where(), ": axis ", a, " is repeated"));
      seen[n] = true;
      axes.push_back(n);
    }
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  if (pads.size() != 2 * axes.size())
    throw ValueError(cat(c.where(), ": expected ", 2 * axes.size(), " pads, got ", pads.size()));
  std::vector<int64_t> begin(rank, 0), end(rank, 0);
  for (size_t i = 0; i < axes.size(); ++i) {
    begin[axes[i]] = pads[i];
    end[axes[i]] = pads[axes.size() + i];
  }

  // The constant, as one element of x's dtype.
  Tensor value = Tensor::zeros(x.dtype(), {});
  if (c.has_input(2) && c.input(2).numel() > 0) {
    if (c.input(2).numel() != 1)
      throw ValueError(cat(c.where(), ": constant_value must be a scalar"));
    value = cast(c.input(2), x.dtype(), c.where());
  } else if (c.attrs().has("value")) {
    value = cast(Tensor::scalar(c.attrs().get_float("value")), x.dtype(), c.where());
  }

  // Per axis: crop (negative pads), then map each output index to a source index or -1.
  PadPlan plan;
  plan.value = value;
  Dims& out_shape = plan.out_shape;
  out_shape.resize(rank);
  const int64_t kLimit = int64_t{1} << 62;
  for (int64_t a = 0; a < rank; ++a) {
    int64_t d = x.shape()[a];
    if (begin[a] < -kLimit || begin[a] > kLimit || end[a] < -kLimit || end[a] > kLimit)
      throw ValueError(cat(c.where(), ": pad ", begin[a], ", ", end[a], " is too large"));
    int64_t crop_b = std::max<int64_t>(-begin[a], 0), crop_e = std::max<int64_t>(-end[a], 0);
    int64_t kept = d - crop_b - crop_e;
    if (kept < 0)
      throw ValueError(
          cat(c.where(), ": negative pads remove more than axis ", a, " of ", x.str(), " holds"));
    int64_t pb = std::max<int64_t>(begin[a], 0), pe = std::max<int64_t>(end[a], 0);
    if (__builtin_add_overflow(kept, pb, &out_shape[a]) ||
        __builtin_add_overflow(out_shape[a], pe, &out_shape[a]))
      throw ValueError(cat(c.where(), ": padded axis ", a, " is too large"));
    if (kept == 0 && out_shape[a] > 0 && mode != "constant")
      throw ValueError(cat(c.where(), ": cannot ", mode, "-pad an empty axis ", a));
  }
  // The maps are built only for a non-empty output, which keeps them small, and one a tensor
  // may hold: a pad of 2^40 made the maps (an index per output position of an axis) a bad_alloc
  // at compile time.
  const int64_t count = check_output_dims(out_shape, c.where());
  if (count == 0) return plan;
  if (static_cast<uint64_t>(count) > max_tensor_bytes() / x.itemsize())
    throw ValueError(cat(c.where(), ": the padded output ", dims_str(out_shape), " would hold ",
                         count, " elements, more than a tensor may (", max_tensor_bytes(),
                         " bytes)"));
  std::vector<std::vector<int64_t>>& src = plan.source;
  src.resize(rank);
  for (int64_t a = 0; a < rank; ++a) {
    int64_t crop_b = std::max<int64_t>(-begin[a], 0), pb = std::max<int64_t>(begin[a], 0);
    int64_t kept = x.shape()[a] - crop_b - std::max<int64_t>(-end[a], 0);
    src[a].resize(out_shape[a]);
    for (int64_t o = 0; o < out_shape[a]; ++o) {
      int64_t i = source_index(o - pb, kept, mode);
      src[a][o] = i < 0 ? -1 : i + crop_b;
    }
  }
  return plan;
}

namespace {

std::vector<Tensor> pad_kernel(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t rank = x.rank();
  PadPlan plan = pad_plan(c);
  const Dims& out_shape = plan.out_shape;
  const auto& src = plan.source;
  const Tensor& value = plan.value;
  Tensor y = Tensor::empty(x.dtype(), out_shape);
  if (y.numel() == 0) return {y};

  size_t item = x.itemsize();
  const auto* in = static_cast<const std::byte*>(x.raw_data());
  auto* out = static_cast<std::byte*>(y.raw_data());
  Dims idx(rank, 0);
  for (int64_t n = 0; n < y.numel(); ++n) {
    int64_t off = 0;
    bool inside = true;
    for (int64_t a = 0; a < rank && inside; ++a) {
      int64_t i = src[a][idx[a]];
      inside = i >= 0;
      off += i * x.strides()[a];
    }
    std::memcpy(out + n * item, inside ? in + off * item : value.raw_data(), item);
    for (int64_t a = rank - 1; a >= 0; --a) {
      if (++idx[a] < out_shape[a]) break;
      idx[a] = 0;
    }
  }
  return {y};
}

}  // namespace

void register_pad_kernels(KernelRegistry& r) {
  r.add("Pad", pad_kernel);
}

}  // namespace pto::reference
