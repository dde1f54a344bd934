// Tensors across the boundary, both ways through DLPack and with no copy: a torch or numpy array
// becomes a pto::Tensor that holds a reference to it; a pto::Tensor becomes an array that holds
// its storage. Strides travel with the data, so a non-contiguous view is never misread.
#include <functional>
#include <memory>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "pto/dtype.h"
#include "pto/error.h"

namespace pto::python {

namespace {

using nb::dlpack::dtype_code;
using ArrayRO = nb::ndarray<nb::ro>;

DType dtype_from_dlpack(nb::dlpack::dtype t, const std::function<std::string()>& what) {
  if (t.lanes == 1) {
    switch (static_cast<dtype_code>(t.code)) {
      case dtype_code::Float:
        if (t.bits == 32) return DType::kF32;
        if (t.bits == 64) return DType::kF64;
        if (t.bits == 16) return DType::kF16;
        break;
      case dtype_code::Bfloat:
        if (t.bits == 16) return DType::kBF16;
        break;
      case dtype_code::Int:
        if (t.bits == 8) return DType::kI8;
        if (t.bits == 16) return DType::kI16;
        if (t.bits == 32) return DType::kI32;
        if (t.bits == 64) return DType::kI64;
        break;
      case dtype_code::UInt:
        if (t.bits == 8) return DType::kU8;
        if (t.bits == 16) return DType::kU16;
        if (t.bits == 32) return DType::kU32;
        if (t.bits == 64) return DType::kU64;
        break;
      case dtype_code::Bool:
        if (t.bits == 8) return DType::kBool;
        break;
      default:
        break;
    }
  }
  throw TypeError(cat(what(), ": unsupported element type (DLPack code ", int(t.code), ", ",
                      int(t.bits), " bits, ", int(t.lanes), " lanes)"));
}

nb::dlpack::dtype dtype_to_dlpack(DType dt) {
  auto make = [](dtype_code code, int bits) {
    return nb::dlpack::dtype{static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1};
  };
  switch (dt) {
    case DType::kF32:
      return make(dtype_code::Float, 32);
    case DType::kF64:
      return make(dtype_code::Float, 64);
    case DType::kF16:
      return make(dtype_code::Float, 16);
    case DType::kBF16:
      return make(dtype_code::Bfloat, 16);
    case DType::kI8:
      return make(dtype_code::Int, 8);
    case DType::kI16:
      return make(dtype_code::Int, 16);
    case DType::kI32:
      return make(dtype_code::Int, 32);
    case DType::kI64:
      return make(dtype_code::Int, 64);
    case DType::kU8:
      return make(dtype_code::UInt, 8);
    case DType::kU16:
      return make(dtype_code::UInt, 16);
    case DType::kU32:
      return make(dtype_code::UInt, 32);
    case DType::kU64:
      return make(dtype_code::UInt, 64);
    case DType::kBool:
      return make(dtype_code::Bool, 8);
    default:
      break;
  }
  throw TypeError(
      cat("cannot export a tensor of dtype ", dtype_name(dt),
          is_storage_only(dt) ? " (a storage dtype: Cast it to float32 in the model)" : ""));
}

}  // namespace

Tensor tensor_from_python(nb::handle array, const std::string& what) {
  return tensor_from_python(array, [&] { return what; });
}

Tensor tensor_from_python(nb::handle array, const std::function<std::string()>& what) {
  ArrayRO a;
  if (!nb::try_cast(array, a))
    throw TypeError(cat(what(), ": expected a tensor or array (DLPack-capable), got ",
                        nb::inst_name(array).c_str()));
  if (a.device_type() != nb::device::cpu::value)
    throw ValueError(cat(what(), ": the tensor is on a non-CPU device (DLPack device type ",
                         a.device_type(), "); move it to the CPU first"));
  const DType dt = dtype_from_dlpack(a.dtype(), what);
  Dims shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = static_cast<int64_t>(a.shape(i));
    strides[i] = a.stride(i);
  }
  // The release hook may run on any thread, with or without the GIL: take it to drop the array.
  auto* keep = new ArrayRO(std::move(a));
  return Tensor::wrap(const_cast<void*>(keep->data()), dt, std::move(shape), std::move(strides),
                      [keep] {
                        nb::gil_scoped_acquire gil;
                        delete keep;
                      });
}

Tensor value_from_python(nb::handle x, const std::function<std::string()>& what) {
  if (x.is_none()) return Tensor::none();
  if (nb::isinstance<nb::list>(x) || nb::isinstance<nb::tuple>(x)) {
    std::vector<Tensor> items;
    size_t i = 0;
    for (nb::handle e : x) {
      items.push_back(tensor_from_python(e, [&] { return cat(what(), " element ", i); }));
      ++i;
    }
    return Tensor::sequence(std::move(items));
  }
  return tensor_from_python(x, what);
}

nb::object tensor_to_python(const Tensor& t) {
  return tensor_to_python(Tensor(t));
}

nb::object tensor_to_python(Tensor&& t) {
  PTO_CHECK(t.defined()) << "tensor_to_python on an undefined tensor";
  if (t.kind() == ValueKind::kNone) return nb::none();
  if (t.kind() == ValueKind::kSequence) {
    nb::list items;
    for (const Tensor& e : t.items()) items.append(tensor_to_python(e));
    return items;
  }
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  auto* keep = new Tensor(std::move(t));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  auto as = [&]<typename Framework>(Framework) {
    return nb::cast(nb::ndarray<Framework>(keep->raw_data(), shape.size(), shape.data(), owner,
                                           keep->strides().data(), dtype_to_dlpack(keep->dtype()),
                                           nb::device::cpu::value));
  };
  // A numpy array is made through the buffer protocol, which is cheaper to import on the other
  // side (torch.from_numpy, numpy itself) than a DLPack capsule; numpy has no bf16.
  return keep->dtype() == DType::kBF16 ? as(nb::array_api()) : as(nb::numpy());
}

void bind_tensor(nb::module_& m) {
  m.def(
      "roundtrip",
      [](nb::handle array) { return tensor_to_python(tensor_from_python(array, "array")); },
      nb::arg("array"),
      "Wraps an array as a PyPTO tensor and back, with no copy (for tests of the boundary).");
  m.def(
      "tensor_info",
      [](nb::handle array) {
        Tensor t = tensor_from_python(array, "array");
        return nb::make_tuple(std::string(dtype_name(t.dtype())), t.shape(), t.strides(),
                              reinterpret_cast<uintptr_t>(t.raw_data()));
      },
      nb::arg("array"), "(dtype, shape, strides, data pointer) as PyPTO sees an array.");
}

}  // namespace pto::python
