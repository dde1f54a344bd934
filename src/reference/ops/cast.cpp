// Cast and CastLike: every pair of PyPTO dtypes, with the rules stated in cast.h.
#include "cast.h"

#include <cstring>
#include <variant>

#include "tensor_kernels.h"

namespace pto::reference {

Tensor cast(const Tensor& x, DType to, const std::string& where, const StorageCast& mode) {
  if (x.dtype() == to) return x;
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(to, in.shape());
  constexpr uint32_t kAny = kAllTypes | kStorageTypes;
  dispatch_with_storage(in.dtype(), kAny, where, [&]<class From>() {
    dispatch_with_storage(to, kAny, where, [&]<class To>() {
      const From* src = in.data<From>();
      To* dst = out.data<To>();
      for (int64_t i = 0; i < in.numel(); ++i) dst[i] = cast_value<To>(src[i], mode);
    });
  });
  return out;
}

namespace {

// Cast-1 names its target type with a string ("FLOAT"); later versions with an element-type code.
DType cast_target(const KernelContext& c) {
  return c.attrs().get_dtype("to");
}

// `saturate` (opset 19+) and `round_mode` (opset 24+) only concern float8 targets.
StorageCast storage_mode(const KernelContext& c) {
  StorageCast m;
  m.saturate = c.node.attr_int("saturate") != 0;
  std::string r = c.node.attr_string("round_mode");
  if (r == "down")
    m.round = E8M0Rounding::kDown;
  else if (r == "nearest")
    m.round = E8M0Rounding::kNearest;
  else if (r != "up")
    throw ValueError(cat(c.where(), ": round_mode '", r, "' is not up, down or nearest"));
  return m;
}

std::vector<Tensor> cast_kernel(const KernelContext& c) {
  return {cast(c.input(0), cast_target(c), c.where(), storage_mode(c))};
}

std::vector<Tensor> cast_like_kernel(const KernelContext& c) {
  return {cast(c.input(0), c.input(1).dtype(), c.where(), storage_mode(c))};
}

// BitCast: the same bits read as another dtype of the same width (little endian, like this
// machine). The 4- and 2-bit dtypes hold one element per byte, so their bits are masked and a
// signed target sign-extended; a bool may only receive 0 or 1.
std::vector<Tensor> bit_cast_kernel(const KernelContext& c) {
  Tensor in = c.input(0).contiguous();
  DType to = c.attrs().get_dtype("to");
  int bits = packed_bits(in.dtype());
  if (bits != packed_bits(to))
    throw ValueError(cat(c.where(), ": BitCast from ", dtype_name(in.dtype()), " to ",
                         dtype_name(to), ": the widths differ"));
  Tensor out = Tensor::empty(to, in.shape());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  const auto* src = static_cast<const uint8_t*>(in.raw_data());
  size_t n = in.nbytes();
  if (bits < 8) {
    auto mask = static_cast<uint8_t>((1u << bits) - 1);
    bool sign_extend = to == DType::kI4 || to == DType::kI2;
    for (size_t i = 0; i < n; ++i) {
      uint8_t v = src[i] & mask;
      dst[i] = sign_extend && (v >> (bits - 1)) ? static_cast<uint8_t>(v | ~mask) : v;
    }
  } else {
    std::memcpy(dst, src, n);
  }
  if (to == DType::kBool)
    for (size_t i = 0; i < n; ++i)
      if (dst[i] > 1)
        throw ValueError(cat(c.where(), ": BitCast to bool of the byte ", int{dst[i]},
                             " (a bool holds 0 or 1)"));
  return {out};
}

}  // namespace

void register_cast_kernels(KernelRegistry& r) {
  r.add("Cast", cast_kernel);
  r.add("CastLike", cast_like_kernel);
  r.add("BitCast", bit_cast_kernel);
}

}  // namespace pto::reference
