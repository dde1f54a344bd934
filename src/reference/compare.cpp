// Element-wise comparison with a tolerance (pto/compare.h). Lives with the reference interpreter
// because it is what every check against the oracle reports with.
#include "pto/compare.h"

#include <cmath>
#include <sstream>
#include <type_traits>

#include "pto/error.h"

namespace pto {

namespace {

template <class T>
double as_double(T x) {
  if constexpr (std::is_arithmetic_v<T>)
    return static_cast<double>(x);
  else
    return static_cast<double>(static_cast<float>(x));  // Float16, BFloat16
}

}  // namespace

TensorDiff compare(const Tensor& got, const Tensor& want, double rtol, double atol,
                   const std::string& what) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape())
    throw ValueError(cat(what, ": cannot compare ", got.str(), " with ", want.str(),
                         " (dtypes and shapes must match)"));
  TensorDiff d;
  d.numel = got.numel();
  const Tensor a = got.contiguous(), b = want.contiguous();
  double worst_score = -1;  // a disagreement scores infinity, else the absolute error
  dispatch(a.dtype(), kAllTypes, what, [&]<class T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    for (int64_t i = 0; i < d.numel; ++i) {
      const double x = as_double(pa[i]), y = as_double(pb[i]);
      double score;
      if (std::isnan(x) || std::isnan(y)) {
        if (std::isnan(x) && std::isnan(y)) continue;
        ++d.nan_mismatches;
        ++d.mismatches;
        score = INFINITY;
      } else if (std::isinf(x) || std::isinf(y)) {
        if (x == y) continue;
        ++d.inf_mismatches;
        ++d.mismatches;
        score = INFINITY;
      } else {
        const double err = std::fabs(x - y);
        score = err;
        d.max_abs = std::max(d.max_abs, err);
        if (y != 0) d.max_rel = std::max(d.max_rel, err / std::fabs(y));
        if (err > atol + rtol * std::fabs(y)) ++d.mismatches;
      }
      if (score > worst_score) {
        worst_score = score;
        d.worst = i;
        d.worst_got = x;
        d.worst_want = y;
      }
    }
  });
  if (worst_score <= 0) d.worst = -1;  // identical
  return d;
}

std::string index_string(const Dims& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] > 0 ? flat % shape[k] : 0;
    flat = shape[k] > 0 ? flat / shape[k] : 0;
  }
  std::ostringstream os;
  os << "[";
  for (size_t k = 0; k < idx.size(); ++k) os << (k ? ", " : "") << idx[k];
  os << "]";
  return os.str();
}

std::string describe(const TensorDiff& d, const Dims& shape) {
  std::ostringstream os;
  os.precision(4);
  os << "max abs error " << d.max_abs << ", max rel error " << d.max_rel << ", " << d.mismatches
     << " of " << d.numel << " elements beyond tolerance";
  if (d.nan_mismatches) os << " (" << d.nan_mismatches << " NaN disagreements)";
  if (d.inf_mismatches) os << " (" << d.inf_mismatches << " Inf disagreements)";
  if (d.worst >= 0) {
    os.precision(7);
    os << ", worst at " << index_string(shape, d.worst) << ": " << d.worst_got << " vs "
       << d.worst_want;
  }
  return os.str();
}

}  // namespace pto
