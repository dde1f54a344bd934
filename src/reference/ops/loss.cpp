// Reference kernels for NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.
#include <cmath>

#include "kernel_util.h"

namespace pto::reference {
namespace {

// loss over log-probabilities `logp` laid out [N, C, D] (D = product of the trailing dims).
// `weighted` selects the reference's weighted mean (sum(w*l) / sum(w)) over the plain mean.
Tensor nll(const std::vector<double>& logp, const Dims& in_shape, const KernelContext& c,
           bool weighted_by_default) {
  const std::string w = c.where();
  const Tensor& T = c.input(1);
  if (in_shape.size() < 2) throw ValueError(cat(w, ": input must be [N, C, ...]"));
  const int64_t N = in_shape[0], C = in_shape[1];
  Dims expect = {N};
  expect.insert(expect.end(), in_shape.begin() + 2, in_shape.end());
  if (T.shape() != expect)
    throw ValueError(cat(w, ": target ", T.str(), " should have shape ", dims_str(expect)));
  const int64_t D = N ? checked_numel(expect) / N : 0;
  std::vector<int64_t> target = to_int64s(T.reshape({T.numel()}), w);
  std::vector<double> weight;
  if (c.has_input(2)) {
    const Tensor& W = c.input(2);
    if (W.rank() != 1 || W.dim(0) != C) throw ValueError(cat(w, ": weight must be [", C, "]"));
    weight = to_doubles(W, w);
  }
  const bool has_ignore = c.attrs().has("ignore_index");
  const int64_t ignore = c.attrs().get_int("ignore_index", 0);
  const std::string reduction = c.node.attr_string("reduction");
  if (reduction != "mean" && reduction != "sum" && reduction != "none")
    throw ValueError(cat(w, ": reduction must be mean, sum or none, got '", reduction, "'"));
  const bool weighted = !weight.empty() || weighted_by_default;
  std::vector<double> loss(N * D), wt(N * D, 1.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      const int64_t i = n * D + d, t = target[i];
      if (has_ignore && t == ignore) {
        loss[i] = 0;
        wt[i] = 0;
        continue;
      }
      if (t < 0 || t >= C) throw ValueError(cat(w, ": target ", t, " is outside [0, ", C, ")"));
      if (!weight.empty()) wt[i] = weight[t];
      loss[i] = -logp[(n * C + t) * D + d] * (weighted ? wt[i] : 1.0);
    }
  DType dt = c.input(0).dtype();
  if (reduction == "none") return from_doubles(dt, expect, loss, w);
  double sum = 0, wsum = 0;
  for (size_t i = 0; i < loss.size(); ++i) sum += loss[i], wsum += wt[i];
  double value = reduction == "sum" ? sum : weighted ? sum / wsum : sum / double(loss.size());
  return from_doubles(dt, {}, {value}, w);
}

std::vector<Tensor> nll_loss(const KernelContext& c) {
  const Tensor& X = c.input(0);
  // The ONNX reference divides by the count of all elements only when there is no weight and
  // ignore_index is -1; otherwise by the sum of the (ignore-masked) weights.
  bool weighted = !(c.attrs().get_int("ignore_index", 0) == -1 && c.attrs().has("ignore_index"));
  return {nll(to_doubles(X, c.where()), X.shape(), c, weighted)};
}

std::vector<Tensor> softmax_cross_entropy(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  if (X.rank() < 2) throw ValueError(cat(w, ": scores must be [N, C, ...]"));
  const int64_t N = X.dim(0), C = X.dim(1), D = N && C ? X.numel() / (N * C) : 0;
  std::vector<double> x = to_doubles(X, w), logp(x.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      double m = -INFINITY, s = 0;
      for (int64_t k = 0; k < C; ++k) m = std::max(m, x[(n * C + k) * D + d]);
      for (int64_t k = 0; k < C; ++k) s += std::exp(x[(n * C + k) * D + d] - m);
      for (int64_t k = 0; k < C; ++k)
        logp[(n * C + k) * D + d] = x[(n * C + k) * D + d] - m - std::log(s);
    }
  std::vector<Tensor> out = {nll(logp, X.shape(), c, c.attrs().has("ignore_index"))};
  if (c.num_outputs > 1) out.push_back(from_doubles(X.dtype(), X.shape(), logp, w));
  return out;
}

}  // namespace

void register_loss_kernels(KernelRegistry& r) {
  r.add("NegativeLogLikelihoodLoss", nll_loss);
  r.add("SoftmaxCrossEntropyLoss", softmax_cross_entropy);
}

}  // namespace pto::reference
