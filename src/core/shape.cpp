#include "pto/shape.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "pto/error.h"

namespace pto {

std::string Dim::str() const {
  if (is_known()) return std::to_string(value);
  return symbol.empty() ? "?" : symbol;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + s[i].str();
  return out + "]";
}

std::string dims_str(const Dims& d) {
  std::string out = "[";
  for (size_t i = 0; i < d.size(); ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + "]";
}

bool is_static(const Shape& s) {
  return std::all_of(s.begin(), s.end(), [](const Dim& d) { return d.is_known(); });
}

Dims to_dims(const Shape& s) {
  Dims d;
  d.reserve(s.size());
  for (const Dim& x : s) {
    PTO_CHECK(x.is_known()) << "to_dims on non-static shape " << shape_str(s);
    d.push_back(x.value);
  }
  return d;
}

Shape to_shape(const Dims& d) {
  return Shape(d.begin(), d.end());
}

int64_t checked_numel(const Dims& d, const char* where) {
  int64_t n = 1;
  for (int64_t x : d) {
    if (x < 0) throw ValueError(cat(where, ": negative dimension in ", dims_str(d)));
    if (__builtin_mul_overflow(n, x, &n))
      throw ValueError(cat(where, ": element count of ", dims_str(d), " overflows int64"));
  }
  return n;
}

Dims contiguous_strides(const Dims& d) {
  Dims s(d.size());
  int64_t acc = 1;
  for (size_t i = d.size(); i-- > 0;) {
    s[i] = acc;
    // Only an empty tensor with huge other dimensions can overflow here (checked_numel rejects
    // the rest); its strides are never used to address memory, so saturate.
    if (__builtin_mul_overflow(acc, std::max<int64_t>(d[i], 1), &acc))
      acc = std::numeric_limits<int64_t>::max();
  }
  return s;
}

Dims broadcast_dims(const Dims& a, const Dims& b, const std::string& where) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1)
      throw ValueError(cat(where, ": shapes ", dims_str(a), " and ", dims_str(b),
                           " cannot be broadcast (dimension ", i, ": ", x, " vs ", y, ")"));
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const std::string& where) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    Dim x = i < r - a.size() ? Dim(1) : a[i - (r - a.size())];
    Dim y = i < r - b.size() ? Dim(1) : b[i - (r - b.size())];
    if (x.is_known() && y.is_known()) {
      if (x.value != y.value && x.value != 1 && y.value != 1)
        throw ValueError(cat(where, ": shapes ", shape_str(a), " and ", shape_str(b),
                             " cannot be broadcast (dimension ", i, ")"));
      out[i] = x.value == 1 ? y : x;
    } else if (x.is_known() && x.value == 1) {
      out[i] = y;
    } else if (y.is_known() && y.value == 1) {
      out[i] = x;
    } else if (x == y) {
      out[i] = x;
    } else if (x.is_known()) {
      out[i] = x;  // the symbol must be 1 or equal to x
    } else if (y.is_known()) {
      out[i] = y;
    } else {
      out[i] = Dim::unknown();
    }
  }
  return out;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& where) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw ValueError(cat(where, ": axis ", axis, " is out of range for rank ", rank));
  return a;
}

bool may_equal(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool unknown =
        (!a[i].is_known() && !a[i].is_symbolic()) || (!b[i].is_known() && !b[i].is_symbolic());
    if (!unknown && !(a[i] == b[i])) return false;
  }
  return true;
}

}  // namespace pto
