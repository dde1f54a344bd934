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

Tensor random_tensor(DType dtype, const Dims& shape, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(dtype, shape);
  dispatch(dtype, kAllTypes, "random input", [&]<class T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint64_t r = rng();
      if constexpr (std::is_same_v<T, bool>) {
        p[i] = (r >> 63) != 0;
      } else if constexpr (std::is_integral_v<T>) {
        p[i] = static_cast<T>(r % 10);
      } else {
        double u = static_cast<double>(r >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
        if constexpr (std::is_same_v<T, double>)
          p[i] = u;
        else
          p[i] = static_cast<T>(static_cast<float>(u));
      }
    }
  });
  return t;
}

std::string summarize(const Tensor& t, int64_t max_values) {
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

std::vector<Tensor> make_inputs(const Graph& g,
                                const std::vector<std::pair<std::string, std::string>>& given,
                                const std::map<std::string, int64_t>& given_dims, uint64_t seed) {
  std::map<std::string, std::string> files(given.begin(), given.end());
  std::vector<std::string> names;
  for (ValueId v : g.inputs()) names.push_back(g.value(v).name);
  for (const auto& [name, file] : given) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
      throw ValueError(cat("--input ", name, ": the model has no input named '", name,
                           "' (its inputs: ", list.empty() ? "none" : list, ")"));
    }
  }

  // Symbol sizes: --dim first, then whatever the given files say.
  std::map<std::string, int64_t> symbols = given_dims;
  std::vector<Tensor> out(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    auto f = files.find(names[i]);
    if (f == files.end()) continue;
    out[i] = read_npy(f->second);
    const auto& shape = g.value(g.inputs()[i]).type.shape;
    if (shape && shape->size() == static_cast<size_t>(out[i].rank()))
      for (size_t k = 0; k < shape->size(); ++k)
        if ((*shape)[k].is_symbolic()) symbols.emplace((*shape)[k].symbol, out[i].shape()[k]);
    std::cout << "input  " << names[i] << ": " << out[i].str() << " from " << f->second << "\n";
  }

  std::set<std::string> used;
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorType& type = g.value(g.inputs()[i]).type;
    if (type.shape)
      for (const Dim& d : *type.shape)
        if (d.is_symbolic()) used.insert(d.symbol);
    if (out[i].defined()) continue;
    std::string where = cat("input '", names[i], "'");
    if (type.dtype == DType::kUndefined || !type.shape)
      throw ValueError(cat(where, ": the model does not declare its ",
                           type.dtype == DType::kUndefined ? "element type" : "shape",
                           "; give it with --input ", names[i], "=FILE.npy"));
    Dims dims;
    for (size_t k = 0; k < type.shape->size(); ++k) {
      const Dim& d = (*type.shape)[k];
      if (d.is_known()) {
        dims.push_back(d.value);
      } else if (d.is_symbolic() && symbols.count(d.symbol)) {
        dims.push_back(symbols[d.symbol]);
      } else {
        if (d.is_symbolic()) {
          std::cerr << "note: dimension '" << d.symbol << "' set to 1 (use --dim " << d.symbol
                    << "=N)\n";
          symbols[d.symbol] = 1;
        } else {
          std::cerr << "note: dimension " << k << " of " << where
                    << " is unnamed and unknown; using 1 (give the input with --input)\n";
        }
        dims.push_back(1);
      }
    }
    out[i] = random_tensor(type.dtype, dims, rng);
    std::cout << "input  " << names[i] << ": " << out[i].str() << " random (seed " << seed << ")\n";
  }
  for (const auto& [sym, v] : given_dims)
    if (!used.count(sym))
      std::cerr << "note: --dim " << sym << ": no input of the model has this dimension\n";
  return out;
}

}  // namespace pto::cli
