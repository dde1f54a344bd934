// Cast and CastLike: every pair of PyPTO dtypes, with the rules stated in cast.h.
#include "cast.h"

#include <variant>

#include "tensor_kernels.h"

namespace pto::reference {

Tensor cast(const Tensor& x, DType to, const std::string& where) {
  if (x.dtype() == to) return x;
  Tensor in = x.contiguous();
  Tensor out = Tensor::empty(to, in.shape());
  dispatch(in.dtype(), kAllTypes, where, [&]<class From>() {
    dispatch(to, kAllTypes, where, [&]<class To>() {
      const From* src = in.data<From>();
      To* dst = out.data<To>();
      for (int64_t i = 0; i < in.numel(); ++i) dst[i] = cast_value<To>(src[i]);
    });
  });
  return out;
}

namespace {

// Cast-1 names its target type with a string ("FLOAT"); later versions with an element-type code.
DType cast_target(const KernelContext& c) {
  return c.attrs().get_dtype("to");
}

std::vector<Tensor> cast_kernel(const KernelContext& c) {
  // `saturate` only concerns float8 targets, which PyPTO does not have.
  return {cast(c.input(0), cast_target(c), c.where())};
}

std::vector<Tensor> cast_like_kernel(const KernelContext& c) {
  return {cast(c.input(0), c.input(1).dtype(), c.where())};
}

}  // namespace

void register_cast_kernels(KernelRegistry& r) {
  r.add("Cast", cast_kernel);
  r.add("CastLike", cast_like_kernel);
}

}  // namespace pto::reference
