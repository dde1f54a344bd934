// The tree ensembles of ai.onnx.ml, plainly: each row walks each tree from its root, comparing one
// feature per node, and adds the leaf's weights to its targets; then the aggregate, the base
// values and the post transform (tree_finish.h). Sums are in double.
#include <cmath>
#include <limits>
#include <vector>

#include "reference/ops/kernel_util.h"
#include "reference/ops/tree_finish.h"

namespace pto::reference {
namespace ml {

double probit(double p) {
  const double x = 2 * p - 1;
  const double sgn = x < 0 ? -1.0 : 1.0;
  const double w = (1 - x) * (1 + x);
  // p = 0 or 1: -inf or inf, as onnxruntime gives (the ONNX reference returns 0)
  const double log = std::log(w);
  const double a = 0.147;
  const double v = 2 / (M_PI * a) + 0.5 * log;
  return M_SQRT2 * sgn * std::sqrt(-v + std::sqrt(v * v - log / a));
}

double logistic(double v) {
  const double e = 1 / (1 + std::exp(-std::abs(v)));
  return v < 0 ? 1 - e : e;
}

void transform(trees::PostTransform post, double* v, int64_t n) {
  using P = trees::PostTransform;
  if (post == P::kProbit || post == P::kLogistic) {
    for (int64_t i = 0; i < n; ++i) v[i] = post == P::kProbit ? probit(v[i]) : logistic(v[i]);
    return;
  }
  if (post != P::kSoftmax && post != P::kSoftmaxZero) return;
  double top = -std::numeric_limits<double>::max();
  for (int64_t i = 0; i < n; ++i) top = std::max(top, v[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    // SOFTMAX_ZERO: a score of 0 (within 1e-7) stays (about) 0 instead of counting exp(0).
    if (post == P::kSoftmaxZero && std::abs(v[i]) <= 1e-7) {
      v[i] *= std::exp(-top);
    } else {
      v[i] = std::exp(v[i] - top);
      sum += v[i];
    }
  }
  for (int64_t i = 0; i < n; ++i) v[i] /= sum;
}

namespace {

using trees::Aggregate;
using trees::Forest;
using trees::PostTransform;

// onnxruntime's label for two classes (_set_score_binary): `mode` says how a single score
// becomes two (the cases of write_single below).
int64_t binary_label(const Forest& f, double pos, int& mode) {
  if (f.binary_case) {
    const bool positive = f.weights_all_positive ? pos > 0.5 : pos > 0;
    mode = f.weights_all_positive ? (positive ? 0 : 1) : (positive ? 2 : 3);
    return f.labels[positive ? 1 : 0];
  }
  return pos > 0 ? 1 : 0;  // onnxruntime's fixed labels outside the binary case
}

// One score for two classes (onnxruntime's write_scores on one value).
void write_single(PostTransform post, int mode, double s, double* out) {
  if (post == PostTransform::kProbit) {
    out[0] = probit(s);
    out[1] = 0;  // onnxruntime leaves it unwritten
  } else if (mode == 0 || mode == 1) {
    out[0] = 1 - s;
    out[1] = s;
  } else if (mode == 2 || mode == 3) {
    out[0] = post == PostTransform::kLogistic ? logistic(-s) : -s;
    out[1] = post == PostTransform::kLogistic ? logistic(s) : s;
  } else {
    out[0] = s;
    out[1] = 0;  // onnxruntime leaves it unwritten
  }
}

void finish_classifier(const Forest& f, double* score, const uint8_t* has_in, double* out,
                       int64_t* label) {
  const int64_t n = f.n_targets;
  const std::vector<double>& base = f.base_values;  // none, one per class, or one of two
  std::vector<uint8_t> has(has_in, has_in + n);
  // onnxruntime writes a class no leaf reached (and no base value set) as 0.
  auto value = [&](int64_t k) { return has[k] ? score[k] : 0.0; };
  if (n > 2) {
    for (size_t k = 0; k < base.size(); ++k) {
      score[k] = has[k] ? score[k] + base[k] : base[k];
      has[k] = 1;
    }
    int64_t best = -1;
    for (int64_t k = 0; k < n; ++k)
      if (has[k] && (best < 0 || score[k] > score[best])) best = k;
    *label = f.labels[best < 0 ? 0 : best];
    for (int64_t k = 0; k < n; ++k) out[k] = value(k);
    transform(f.post, out, n);
    return;
  }
  int mode = -1;
  if (base.size() == 1) {  // skl2onnx's binary gradient boosting: one base value, for class 0
    score[0] += base[0];
  } else if (base.size() == 2) {
    if (has[1]) {  // onnxruntime: base_values[0] unused, class 1 from class 0's sum
      score[1] = base[1] + score[0];
      score[0] = -score[1];
    } else {
      score[1] += base[1];
      score[0] += base[0];
    }
  } else {
    mode = 3;
  }
  const bool two = base.size() == 2 || has[1];  // else one score, made two by write_single
  const double pos = two && has[1] ? score[1] : value(0);
  *label = binary_label(f, pos, mode);
  if (two) {
    out[0] = value(0);
    out[1] = value(1);
    transform(f.post, out, 2);
  } else {
    write_single(f.post, mode, value(0), out);
  }
}

}  // namespace

void finish_row(const Forest& f, double* score, const uint8_t* has, double* out, int64_t* label) {
  if (f.classifier) return finish_classifier(f, score, has, out, label);
  const int64_t n = f.n_targets;
  const auto trees = static_cast<double>(f.num_trees());
  for (int64_t k = 0; k < n; ++k) {
    // onnxruntime: of several targets, one no leaf reached is 0, its base value not added (the
    // ONNX reference would add it); a single target always gets it.
    if (n > 1 && !has[k]) {
      out[k] = 0;
      continue;
    }
    double v = has[k] ? score[k] : 0;
    if (f.aggregate == Aggregate::kAverage) v /= trees;
    if (f.base_values.size() == static_cast<size_t>(n)) v += f.base_values[k];
    out[k] = v;
  }
  if (n > 1)
    transform(f.post, out, n);
  else if (f.post == PostTransform::kProbit)  // onnxruntime: the only transform of one target
    out[0] = probit(out[0]);
}

}  // namespace ml

namespace {

using trees::Aggregate;
using trees::Forest;

std::vector<Tensor> tree_ensemble(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  if (X.rank() < 1 || X.rank() > 2)
    throw ValueError(cat(w, ": X must be [N, F] or [F], got ", X.str()));
  const Forest f = trees::decode(c.node, X.dtype(), w);
  const int64_t rows = X.rank() == 1 ? 1 : X.dim(0);
  const int64_t cols = X.dim(-1);
  if (f.num_features() > cols)
    throw ValueError(
        cat(w, ": the trees read feature ", f.num_features() - 1, "; X ", X.str(), " has ", cols));
  std::vector<double> x = to_doubles(X, w);
  if (!f.in_double)  // compared in float: onnxruntime's threshold type for a non-double input
    for (double& v : x) v = static_cast<double>(static_cast<float>(v));
  const int64_t T = f.n_targets;
  std::vector<double> out(static_cast<size_t>(rows * T)), score(static_cast<size_t>(T));
  std::vector<uint8_t> has(static_cast<size_t>(T));
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = x.data() + r * cols;
    std::fill(score.begin(), score.end(), 0.0);
    std::fill(has.begin(), has.end(), 0);
    for (int32_t node : f.roots) {
      while (!trees::is_leaf(node)) {
        const auto i = static_cast<size_t>(node);
        node =
            ml::goes_true(f, i, row[f.feature[i]], f.split[i]) ? f.true_child[i] : f.false_child[i];
      }
      const auto leaf = static_cast<size_t>(trees::leaf_index(node));
      for (int64_t k = f.leaf_begin[leaf]; k < f.leaf_begin[leaf + 1]; ++k) {
        const auto t = static_cast<size_t>(f.targets[k]);
        const double v = f.weights[k];
        if (f.aggregate == Aggregate::kMin)
          score[t] = has[t] ? std::min(score[t], v) : v;
        else if (f.aggregate == Aggregate::kMax)
          score[t] = has[t] ? std::max(score[t], v) : v;
        else
          score[t] += v;
        has[t] = 1;
      }
    }
    ml::finish_row(f, score.data(), has.data(), out.data() + r * T, &labels[r]);
  }
  const DType out_type = c.node.op == "TreeEnsemble" ? X.dtype() : DType::kF32;
  Tensor y = from_doubles(out_type, {rows, T}, out, w);
  if (!f.classifier) return {y};
  Tensor label = Tensor::empty(DType::kI64, {rows});
  std::copy(labels.begin(), labels.end(), label.data<int64_t>());
  return {label, y};
}

}  // namespace

void register_ml_tree_kernels(KernelRegistry& r) {
  r.add("TreeEnsemble", tree_ensemble);
  r.add("TreeEnsembleRegressor", tree_ensemble);
  r.add("TreeEnsembleClassifier", tree_ensemble);
}

}  // namespace pto::reference
