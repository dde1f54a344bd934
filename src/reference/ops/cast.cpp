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
  const auto& attrs = c.attrs().all();
  auto it = attrs.find("to");
  if (it == attrs.end()) throw ValueError(cat(c.where(), ": attribute 'to' is required"));
  if (const auto* s = std::get_if<std::string>(&it->second)) {
    static const std::pair<const char*, int> kNames[] = {
        {"FLOAT", 1},   {"UINT8", 2},   {"INT8", 3},     {"UINT16", 4},   {"INT16", 5},
        {"INT32", 6},   {"INT64", 7},   {"BOOL", 9},     {"FLOAT16", 10}, {"DOUBLE", 11},
        {"UINT32", 12}, {"UINT64", 13}, {"BFLOAT16", 16}};
    for (const auto& [name, code] : kNames)
      if (*s == name) return dtype_from_onnx_code(code, c.where());
    throw UnsupportedError(cat(c.where(), ": cast to '", *s, "' is not supported"));
  }
  return dtype_from_onnx_code(c.attrs().get_int("to"), c.where());
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
