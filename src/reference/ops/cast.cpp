// Cast and CastLike: every pair of PyPTO dtypes, with the rules stated in cast.h.
#include "cast.h"

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

}  // namespace

void register_cast_kernels(KernelRegistry& r) {
  r.add("Cast", cast_kernel);
  r.add("CastLike", cast_like_kernel);
}

}  // namespace pto::reference
