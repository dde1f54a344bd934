// Reference Softmax, LogSoftmax, Hardmax and Dropout (inference).
#include <cmath>

#include "ir/ops/op_params.h"
#include "nn_kernels.h"

namespace pto::reference {
namespace {

enum class MaxKind { kSoftmax, kLogSoftmax, kHardmax };

// Before opset 13 these ops coerce the input to 2-D at `axis` (default 1) and work on whole rows;
// from 13 on they work along one axis (default -1).
struct Rows {
  int64_t outer = 1, len = 1, inner = 1;
};
Rows rows_of(const KernelContext& c, const Tensor& X) {
  const bool per_axis = !params::softmax_coerces_2d(c.node);
  const int64_t rank = X.rank();
  int64_t axis = params::softmax_axis(c.node);
  if (per_axis) {
    axis = rank == 0 ? 0 : normalize_axis(axis, rank, c.where());  // 0-D: one row of one element
  } else {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis > rank)
      throw ValueError(
          cat(c.where(), ": axis ", params::softmax_axis(c.node), " out of range for ", X.str()));
  }
  Rows r;
  if (X.numel() == 0) return r;  // the caller returns early; huge empty dims must not overflow
  for (int64_t i = 0; i < rank; ++i) {
    int64_t& part = i < axis ? r.outer : (per_axis && i > axis) ? r.inner : r.len;
    part *= X.dim(i);
  }
  return r;
}

std::vector<Tensor> softmax_like(const KernelContext& c, MaxKind kind) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  const Rows r = rows_of(c, X);  // validates axis even for an empty X
  if (X.numel() == 0) return {Tensor::empty(X.dtype(), X.shape())};
  const std::vector<double> x = to_doubles(X, w);
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < r.outer; ++o)
    for (int64_t in = 0; in < r.inner; ++in) {
      const int64_t base = o * r.len * r.inner + in;
      auto at = [&](int64_t j) { return base + j * r.inner; };
      // The first maximum: Hardmax's one-hot position, and the shift that keeps exp finite.
      double mx = r.len > 0 ? x[at(0)] : 0.0;
      int64_t arg = 0;
      for (int64_t j = 1; j < r.len; ++j)
        if (x[at(j)] > mx) {
          mx = x[at(j)];
          arg = j;
        }
      if (kind == MaxKind::kHardmax) {
        // A row whose first element is NaN has no maximum: all zeros (onnxruntime's rule; its
        // running maximum stays NaN and no element equals it). Later NaNs are skipped.
        if (r.len > 0 && std::isnan(x[at(0)])) arg = -1;
        for (int64_t j = 0; j < r.len; ++j) y[at(j)] = j == arg ? 1.0 : 0.0;
        continue;
      }
      double sum = 0;
      for (int64_t j = 0; j < r.len; ++j) sum += std::exp(x[at(j)] - mx);
      for (int64_t j = 0; j < r.len; ++j)
        y[at(j)] = kind == MaxKind::kSoftmax ? std::exp(x[at(j)] - mx) / sum
                                             : x[at(j)] - mx - std::log(sum);
    }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

// Scalar value of an optional input, as double.
double scalar_input(const KernelContext& c, size_t i, const char* name) {
  const Tensor& t = c.input(i);
  if (t.numel() != 1)
    throw ValueError(cat(c.where(), ": ", name, " must be a scalar, got ", t.str()));
  return to_doubles(t, c.where())[0];
}

std::vector<Tensor> dropout(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const int opset = opset_of(c);
  // Inference is the identity. Training (opset 12+, training_mode input true) is random unless
  // the ratio is 0; we have no seeded generator that matches anyone else's, so it is unsupported.
  if (opset >= 12 && c.has_input(2) && scalar_input(c, 2, "training_mode") != 0) {
    const double ratio = c.has_input(1) ? scalar_input(c, 1, "ratio") : 0.5;
    if (ratio != 0)
      throw UnsupportedError(cat(w, ": random dropout in training mode (ratio ", ratio, ")"));
  }
  std::vector<Tensor> out = {X.clone()};
  if (c.num_outputs > 1) {
    const DType mdt = opset < 10 ? X.dtype() : DType::kBool;
    Tensor mask = Tensor::empty(mdt, X.shape());
    dispatch(mdt, kAllTypes, w, [&]<class T>() {
      T* p = mask.data<T>();
      for (int64_t i = 0; i < mask.numel(); ++i) p[i] = static_cast<T>(1);
    });
    out.push_back(mask);
  }
  return out;
}

}  // namespace

void register_softmax_kernels(KernelRegistry& r) {
  r.add("Softmax", [](const KernelContext& c) { return softmax_like(c, MaxKind::kSoftmax); });
  r.add("LogSoftmax", [](const KernelContext& c) { return softmax_like(c, MaxKind::kLogSoftmax); });
  r.add("Hardmax", [](const KernelContext& c) { return softmax_like(c, MaxKind::kHardmax); });
  r.add("Dropout", dropout);
}

}  // namespace pto::reference
