#include "kernel_util.h"

namespace pto::reference {

std::vector<int64_t> broadcast_offsets(const Dims& in, const Dims& out) {
  PTO_CHECK(in.size() <= out.size())
      << "broadcast_offsets: rank " << in.size() << " > " << out.size();
  size_t lead = out.size() - in.size();
  Dims in_strides = contiguous_strides(in);
  int64_t n = checked_numel(out);
  std::vector<int64_t> offsets(n);
  Dims idx(out.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    unravel(i, out, idx);
    int64_t off = 0;
    for (size_t k = 0; k < in.size(); ++k)
      if (in[k] != 1) off += idx[lead + k] * in_strides[k];
    offsets[i] = off;
  }
  return offsets;
}

Dims broadcast_all(const std::vector<Dims>& shapes, const std::string& where,
                   std::vector<std::vector<int64_t>>* offsets) {
  Dims out;
  for (const Dims& s : shapes) out = broadcast_dims(out, s, where);
  if (offsets) {
    offsets->clear();
    for (const Dims& s : shapes) offsets->push_back(broadcast_offsets(s, out));
  }
  return out;
}

std::vector<int64_t> to_int64s(const Tensor& t, const std::string& where) {
  if (t.rank() > 1)
    throw ValueError(cat(where, ": expected a 0-D or 1-D integer tensor, got ", t.str()));
  Tensor c = t.contiguous();
  return dispatch(t.dtype(), kIntTypes, where, [&]<class T>() {
    const T* p = c.data<T>();
    std::vector<int64_t> v;
    for (int64_t i = 0; i < c.numel(); ++i) v.push_back(static_cast<int64_t>(p[i]));
    return v;
  });
}

std::vector<double> to_doubles(const Tensor& t, const std::string& where) {
  Tensor c = t.contiguous();
  return dispatch_with_storage(t.dtype(), kAllTypes | kStorageTypes, where, [&]<class T>() {
    const T* p = c.data<T>();
    std::vector<double> v(c.numel());
    for (int64_t i = 0; i < c.numel(); ++i)
      v[i] = static_cast<double>(static_cast<compute_t<T>>(p[i]));
    return v;
  });
}

Tensor from_doubles(DType dtype, Dims shape, const std::vector<double>& v,
                    const std::string& where) {
  Tensor out = Tensor::empty(dtype, std::move(shape));
  PTO_CHECK(static_cast<size_t>(out.numel()) == v.size()) << where << ": from_doubles size";
  dispatch(dtype, kFloatTypes, where, [&]<class T>() {
    T* p = out.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(static_cast<compute_t<T>>(v[i]));
  });
  return out;
}

}  // namespace pto::reference
