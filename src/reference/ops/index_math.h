// Small helpers shared by the reduction and indexing reference kernels: integer arithmetic that
// wraps instead of overflowing (signed overflow is UB in C++), saturating float->int casts, and
// reading and bounds-checking index tensors.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernel_util.h"

namespace pto::reference {

// a + b and a * b modulo 2^bits for integers (two's complement, as numpy computes); plain
// arithmetic in compute_t for floats and bool (bool: + is or, * is and after the cast back).
template <class T>
T wrap_add(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  else
    return static_cast<T>(static_cast<compute_t<T>>(a) + static_cast<compute_t<T>>(b));
}
template <class T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  else
    return static_cast<T>(static_cast<compute_t<T>>(a) * static_cast<compute_t<T>>(b));
}

// double -> T; for integer T, NaN becomes 0 and out-of-range values clamp (a plain cast is UB).
template <class T>
T saturate_cast(double v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v != 0;
  } else if constexpr (std::is_integral_v<T>) {
    if (std::isnan(v)) return 0;
    // double(max) rounds up to 2^bits for 64-bit types: anything >= it is out of range.
    if (v >= static_cast<double>(std::numeric_limits<T>::max()))
      return std::numeric_limits<T>::max();
    if (v <= static_cast<double>(std::numeric_limits<T>::lowest()))
      return std::numeric_limits<T>::lowest();
    return static_cast<T>(v);
  } else {
    return static_cast<T>(static_cast<compute_t<T>>(v));
  }
}

// All elements of an integer tensor as int64 (uint64 values past INT64_MAX saturate, so they
// fail any bounds check), into `v` (resized; its capacity is reused). `what` names the input in
// errors ("indices").
inline void index_values_into(const Tensor& t, const std::string& where, const char* what,
                              std::vector<int64_t>& v) {
  if (!is_integral(t.dtype()))
    throw TypeError(cat(where, ": ", what, " must be an integer tensor, got ", t.str()));
  dispatch(t.dtype(), kIntTypes, where, [&]<class T>() {
    const T* p = t.data<T>();
    v.resize(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, uint64_t>)
        v[i] = p[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                   ? std::numeric_limits<int64_t>::max()
                   : static_cast<int64_t>(p[i]);
      else
        v[i] = static_cast<int64_t>(p[i]);
    }
  });
}
inline std::vector<int64_t> index_values(const Tensor& t, const std::string& where,
                                         const char* what) {
  std::vector<int64_t> v;
  index_values_into(t, where, what, v);
  return v;
}

// Maps an index in [-n, n) to [0, n); anything else is a ValueError naming the node.
inline int64_t fix_index(int64_t i, int64_t n, const std::string& where, int64_t axis) {
  if (i < -n || i >= n)
    throw ValueError(cat(where, ": index ", i, " is out of range [", -n, ", ", n - 1, "] for axis ",
                         axis, " of size ", n));
  return i < 0 ? i + n : i;
}

// The single integer of a 0-D or one-element 1-D tensor (an axis or k input).
inline int64_t scalar_int(const Tensor& t, const std::string& where, const char* what) {
  if (t.rank() > 1 || t.numel() != 1)
    throw ValueError(cat(where, ": ", what, " must hold a single integer, got ", t.str()));
  return index_values(t, where, what)[0];
}

// Product of dims [begin, end).
inline int64_t dims_product(const Dims& d, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t k = begin; k < end && k < d.size(); ++k) p *= d[k];
  return p;
}

// Copies `count` elements (of src's dtype) from src[from] to dst[to], for any dtype.
inline void copy_elems(const Tensor& dst, int64_t to, const Tensor& src, int64_t from,
                       int64_t count) {
  const size_t size = src.itemsize();
  if (count > 0)
    std::memcpy(static_cast<std::byte*>(dst.raw_data()) + to * size,
                static_cast<const std::byte*>(src.raw_data()) + from * size, count * size);
}

// Checks that indices (GatherElements, ScatterElements) have data's rank and fit inside data on
// every axis but `axis`.
inline void check_elements_shape(const Tensor& data, const Tensor& ind, int64_t axis,
                                 const std::string& w) {
  if (ind.rank() != data.rank())
    throw ValueError(cat(w, ": indices ", ind.str(), " must have the rank of data ", data.str()));
  for (int64_t k = 0; k < data.rank(); ++k)
    if (k != axis && ind.dim(k) > data.dim(k))
      throw ValueError(
          cat(w, ": indices ", ind.str(), " exceed data ", data.str(), " on axis ", k));
}

}  // namespace pto::reference
