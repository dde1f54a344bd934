// Helpers of `pto run`.
#include "run_util.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>

#include "pto/npy.h"

namespace pto::cli {

std::string summarize(const Tensor& t, int64_t max_values) {
  if (t.kind() == ValueKind::kNone) return "none (an empty optional)";
  if (t.kind() == ValueKind::kSequence) {
    std::string s = cat("a sequence of ", t.items().size());
    for (size_t i = 0; i < t.items().size(); ++i)
      s += cat("\n  [", i, "] ", summarize(t.items()[i], max_values));
    return s;
  }
  std::ostringstream os;
  os << std::setprecision(6) << t.str();
  if (t.numel() == 0) {
    os << "  (empty)";
    return os.str();
  }
  double mn = INFINITY, mx = -INFINITY, sum = 0, sum_sq = 0;
  int64_t finite = 0, nans = 0, infs = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    double v = t.item_as_double(i);
    if (std::isnan(v)) {
      ++nans;
    } else if (std::isinf(v)) {
      ++infs;
    } else {
      mn = std::min(mn, v);
      mx = std::max(mx, v);
      sum += v;
      ++finite;
    }
  }
  if (finite) {
    double mean = sum / static_cast<double>(finite);
    for (int64_t i = 0; i < t.numel(); ++i) {
      double v = t.item_as_double(i);
      if (std::isfinite(v)) sum_sq += (v - mean) * (v - mean);
    }
    os << "  min " << mn << "  max " << mx << "  mean " << mean << "  std "
       << std::sqrt(sum_sq / static_cast<double>(finite));
  }
  if (nans) os << "  nan " << nans;
  if (infs) os << "  inf " << infs;
  os << "  values [";
  int64_t n = std::min(t.numel(), max_values);
  for (int64_t i = 0; i < n; ++i) os << (i ? ", " : "") << t.item_as_double(i);
  os << (t.numel() > n ? ", ...]" : "]");
  return os.str();
}

std::string sanitize_file_name(const std::string& name, size_t index) {
  std::string out = name;
  for (char& c : out) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    if (!ok) c = '_';
  }
  if (out.find_first_not_of('.') == std::string::npos) return cat("output_", index);
  return out;
}

Tensor bf16_to_f32(const Tensor& t) {
  Tensor src = t.contiguous();
  Tensor out = Tensor::empty(DType::kF32, src.shape());
  const BFloat16* in = src.data<BFloat16>();
  float* p = out.data<float>();
  for (int64_t i = 0; i < src.numel(); ++i) p[i] = static_cast<float>(in[i]);
  return out;
}

std::string format_ms(double ms) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(ms < 10 ? 3 : 1) << ms << " ms";
  return os.str();
}

}  // namespace pto::cli
