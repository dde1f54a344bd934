#include "kernel_util.h"

namespace pto::reference {

std::vector<int64_t> broadcast_offsets(const Dims& in, const Dims& out) {
  PTO_CHECK(in.size() <= out.size())
      << "broadcast_offsets: rank " << in.size() << " > " << out.size();
  const size_t rank = out.size(), lead = rank - in.size();
  const Dims in_strides = contiguous_strides(in);
  Dims step(rank, 0);  // the input offset's step along each output axis (0: broadcast)
  for (size_t k = 0; k < in.size(); ++k)
    if (in[k] != 1) step[lead + k] = in_strides[k];
  const int64_t n = checked_numel(out);
  std::vector<int64_t> offsets(static_cast<size_t>(n));
  // An odometer over the output index: no division per element (constant folding runs this over
  // every weight of a model, e.g. a weight-standardized ResNet's 23M).
  Dims idx(rank, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    offsets[static_cast<size_t>(i)] = off;
    for (size_t k = rank; k-- > 0;) {
      off += step[k];
      if (++idx[k] < out[k]) break;
      off -= step[k] * out[k];
      idx[k] = 0;
    }
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
