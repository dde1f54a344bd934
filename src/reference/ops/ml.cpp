// The linear models and preprocessing ops of ai.onnx.ml, plainly, in double. Where the spec is
// silent the behaviour is onnxruntime's: a 1-D X is one row, the linear models read X as float,
// a single score gets onnxruntime's two-class rules (tree_finish.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "reference/ops/kernel_util.h"
#include "reference/ops/tree_finish.h"

namespace pto::reference {
namespace {

using trees::PostTransform;

PostTransform post_transform(const Node& n, const std::string& where) {
  return trees::post_from_string(n.attrs.get_string("post_transform", "NONE"), where);
}

// X as rows: [N, F] (a 1-D X is one row), its values in double.
struct Rows {
  int64_t n = 0, f = 0;
  std::vector<double> x;
};

Rows rows_of(const Tensor& X, const std::string& where, bool as_float) {
  if (X.rank() < 1 || X.rank() > 2)
    throw ValueError(cat(where, ": X must be [N, F] or [F], got ", X.str()));
  Rows r{X.rank() == 1 ? 1 : X.dim(0), X.dim(-1), to_doubles(X, where)};
  if (as_float)  // onnxruntime casts X to float first
    for (double& v : r.x) v = static_cast<double>(static_cast<float>(v));
  return r;
}

// A per-feature list of one value or F values, at feature j.
double per_feature(const std::vector<double>& v, int64_t j) {
  return v.size() == 1 ? v[0] : v[static_cast<size_t>(j)];
}

void check_per_feature(size_t size, int64_t f, const std::string& name, const std::string& where,
                       bool allow_empty = false) {
  if ((size == 0 && allow_empty) || size == 1 || size == static_cast<size_t>(f)) return;
  throw ValueError(cat(where, ": ", name, " has ", size, " values; X has ", f,
                       " features (one value, or one per feature)"));
}

// scores [N, targets] = X coefficients^T + intercepts.
std::vector<double> linear(const Rows& r, const std::vector<double>& coef,
                           const std::vector<double>& intercepts, int64_t targets,
                           const std::string& where) {
  if (static_cast<int64_t>(coef.size()) != targets * r.f)
    throw ValueError(cat(where, ": coefficients has ", coef.size(), " values; ", targets,
                         " targets of ", r.f, " features need ", targets * r.f));
  if (!intercepts.empty() && static_cast<int64_t>(intercepts.size()) != targets)
    throw ValueError(
        cat(where, ": intercepts has ", intercepts.size(), " values for ", targets, " targets"));
  std::vector<double> s(static_cast<size_t>(r.n * targets));
  for (int64_t i = 0; i < r.n; ++i)
    for (int64_t t = 0; t < targets; ++t) {
      double acc = intercepts.empty() ? 0.0 : intercepts[t];
      for (int64_t j = 0; j < r.f; ++j) acc += r.x[i * r.f + j] * coef[t * r.f + j];
      s[i * targets + t] = acc;
    }
  return s;
}

std::vector<Tensor> linear_regressor(const KernelContext& c) {
  const std::string w = c.where();
  const Rows r = rows_of(c.input(0), w, true);
  const int64_t targets = c.node.attr_int("targets");
  const PostTransform post = post_transform(c.node, w);
  std::vector<double> y = linear(r, c.node.attrs.get_floats("coefficients", {}),
                                 c.node.attrs.get_floats("intercepts", {}), targets, w);
  for (int64_t i = 0; i < r.n; ++i) {
    if (targets > 1)
      ml::transform(post, y.data() + i * targets, targets);
    else if (post == PostTransform::kProbit)  // onnxruntime: the only transform of one target
      y[i] = ml::probit(y[i]);
  }
  return {from_doubles(DType::kF32, {r.n, targets}, y, w)};
}

std::vector<Tensor> linear_classifier(const KernelContext& c) {
  const std::string w = c.where();
  if (c.node.attrs.has("classlabels_strings"))
    throw UnsupportedError(cat(w,
                               ": string class labels (classlabels_strings): PyPTO has no "
                               "string tensors; fit the model on integer labels"));
  const Rows r = rows_of(c.input(0), w, true);
  const std::vector<double> intercepts = c.node.attrs.get_floats("intercepts", {});
  const std::vector<int64_t> labels = c.node.attrs.get_ints("classlabels_ints", {});
  // onnxruntime: one class per intercept; one score with two labels writes two columns.
  const auto classes = static_cast<int64_t>(intercepts.size());
  if (classes == 0)
    throw ValueError(cat(w,
                         ": intercepts is required (one per class; onnxruntime counts the "
                         "classes by it)"));
  if (classes > 1 && static_cast<int64_t>(labels.size()) != classes)
    throw ValueError(
        cat(w, ": classlabels_ints has ", labels.size(), " labels for ", classes, " classes"));
  const PostTransform post = post_transform(c.node, w);
  const std::vector<double> s =
      linear(r, c.node.attrs.get_floats("coefficients"), intercepts, classes, w);
  const bool second = classes == 1 && labels.size() == 2;
  const int64_t cols = second ? 2 : classes;
  std::vector<double> z(static_cast<size_t>(r.n * cols));
  Tensor label = Tensor::empty(DType::kI64, {r.n});
  for (int64_t i = 0; i < r.n; ++i) {
    const double* row = s.data() + i * classes;
    double* out = z.data() + i * cols;
    if (classes == 1) {
      const bool positive = row[0] > 0;
      label.data<int64_t>()[i] = labels.size() == 2 ? labels[positive ? 1 : 0] : (positive ? 1 : 0);
      if (post == PostTransform::kProbit) {
        out[0] = ml::probit(row[0]);
        if (second) out[1] = 0;  // onnxruntime leaves it unwritten
      } else if (second) {       // onnxruntime: [1 - s, s], s through LOGISTIC (no other transform)
        const double v = post == PostTransform::kLogistic ? ml::logistic(row[0]) : row[0];
        out[0] = 1 - v;
        out[1] = v;
      } else {
        out[0] = row[0];
      }
      continue;
    }
    int64_t best = 0;
    for (int64_t k = 1; k < classes; ++k)
      if (row[k] > row[best]) best = k;
    label.data<int64_t>()[i] = labels[best];
    std::copy(row, row + classes, out);
    ml::transform(post, out, classes);
  }
  return {label, from_doubles(DType::kF32, {r.n, cols}, z, w)};
}

// An elementwise map of X in double, the result in `dtype` with X's shape.
template <class F>
Tensor map_values(const Tensor& X, DType dtype, const std::string& where, F f) {
  std::vector<double> x = to_doubles(X, where);
  const int64_t cols = X.rank() == 0 ? 1 : X.dim(-1);
  for (size_t i = 0; i < x.size(); ++i) x[i] = f(x[i], static_cast<int64_t>(i) % cols);
  if (is_floating(dtype)) return from_doubles(dtype, X.shape(), x, where);
  Tensor y = Tensor::empty(dtype, X.shape());
  dispatch(dtype, kIntTypes, where, [&]<class T>() {
    for (size_t i = 0; i < x.size(); ++i) y.data<T>()[i] = static_cast<T>(x[i]);
  });
  return y;
}

std::vector<Tensor> scaler(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const std::vector<double> offset = c.node.attrs.get_floats("offset", {0.0});
  const std::vector<double> scale = c.node.attrs.get_floats("scale", {1.0});
  const int64_t f = X.rank() == 0 ? 1 : X.dim(-1);
  check_per_feature(offset.size(), f, "offset", w);
  check_per_feature(scale.size(), f, "scale", w);
  return {map_values(X, DType::kF32, w, [&](double v, int64_t j) {
    return (v - per_feature(offset, j)) * per_feature(scale, j);
  })};
}

std::vector<Tensor> normalizer(const KernelContext& c) {
  const std::string w = c.where();
  const std::string norm = c.node.attrs.get_string("norm", "MAX");
  if (norm != "MAX" && norm != "L1" && norm != "L2")
    throw ValueError(cat(w, ": norm '", norm, "' is not one of MAX, L1, L2"));
  Rows r = rows_of(c.input(0), w, true);
  for (int64_t i = 0; i < r.n; ++i) {
    double* row = r.x.data() + i * r.f;
    double d = norm == "MAX" ? -std::numeric_limits<double>::max() : 0.0;
    for (int64_t j = 0; j < r.f; ++j)
      d = norm == "MAX" ? std::max(d, row[j])
                        : d + (norm == "L1" ? std::abs(row[j]) : row[j] * row[j]);
    if (norm == "L2") d = std::sqrt(d);
    if (d == 0) continue;  // a zero row stays as it is
    for (int64_t j = 0; j < r.f; ++j) row[j] /= d;
  }
  return {from_doubles(DType::kF32, c.input(0).shape(), r.x, w)};
}

std::vector<Tensor> binarizer(const KernelContext& c) {
  const double t = c.node.attr_float("threshold");
  const Tensor& X = c.input(0);
  return {map_values(X, X.dtype(), c.where(),
                     [&](double v, int64_t) { return std::isnan(v) ? v : (v > t ? 1.0 : 0.0); })};
}

std::vector<Tensor> imputer(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  const bool floats = is_floating(X.dtype());
  const Attributes& a = c.node.attrs;
  std::vector<double> values;
  double replaced = 0;
  if (floats) {
    values = a.get_floats("imputed_value_floats", {});
    replaced = c.node.attr_float("replaced_value_float");
  } else {
    for (int64_t v : a.get_ints("imputed_value_int64s", {}))
      values.push_back(static_cast<double>(v));
    replaced = static_cast<double>(c.node.attr_int("replaced_value_int64"));
  }
  const char* name = floats ? "imputed_value_floats" : "imputed_value_int64s";
  if (values.empty())
    throw ValueError(cat(w, ": ", name, " is required for a ", dtype_name(X.dtype()), " X"));
  check_per_feature(values.size(), X.rank() == 0 ? 1 : X.dim(-1), name, w);
  const bool nan = std::isnan(replaced);
  return {map_values(X, X.dtype(), w, [&](double v, int64_t j) {
    return (nan ? std::isnan(v) : v == replaced) ? per_feature(values, j) : v;
  })};
}

std::vector<Tensor> array_feature_extractor(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor X = c.input(0).contiguous();
  const std::vector<int64_t> idx = to_int64s(c.input(1).reshape({c.input(1).numel()}), w);
  if (X.rank() < 1) throw ValueError(cat(w, ": X must have a last axis, got ", X.str()));
  const int64_t f = X.dim(-1), outer = X.numel() / std::max<int64_t>(f, 1);
  for (int64_t i : idx)
    if (i < 0 || i >= f)
      throw ValueError(
          cat(w, ": index ", i, " is not a feature of X ", X.str(), " (0 to ", f - 1, ")"));
  Dims shape = X.rank() == 1 ? Dims{1, 0} : X.shape();
  shape.back() = static_cast<int64_t>(idx.size());
  Tensor y = Tensor::empty(X.dtype(), shape);
  const size_t item = dtype_size(X.dtype());
  const auto* src = static_cast<const char*>(X.raw_data());
  auto* dst = static_cast<char*>(y.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    for (size_t k = 0; k < idx.size(); ++k)
      std::memcpy(dst + (o * static_cast<int64_t>(idx.size()) + k) * item,
                  src + (o * f + idx[k]) * item, item);
  return {y};
}

std::vector<Tensor> one_hot_encoder(const KernelContext& c) {
  const std::string w = c.where();
  if (c.node.attrs.has("cats_strings"))
    throw UnsupportedError(cat(w,
                               ": string categories (cats_strings): PyPTO has no string "
                               "tensors; encode the categories as integers"));
  const std::vector<int64_t> cats = c.node.attrs.get_ints("cats_int64s", {});
  if (cats.empty()) throw ValueError(cat(w, ": cats_int64s is required"));
  const bool zeros = c.node.attr_int("zeros") != 0;
  std::map<double, int64_t> where_cat;
  for (size_t k = 0; k < cats.size(); ++k)
    where_cat.emplace(static_cast<double>(cats[k]), static_cast<int64_t>(k));
  const Tensor& X = c.input(0);
  const std::vector<double> x = to_doubles(X, w);
  const auto n = static_cast<int64_t>(cats.size());
  Dims shape = X.shape();
  shape.push_back(n);
  std::vector<double> y(x.size() * cats.size(), 0.0);
  for (size_t i = 0; i < x.size(); ++i) {
    auto it = where_cat.find(x[i]);
    if (it != where_cat.end())
      y[i * cats.size() + static_cast<size_t>(it->second)] = 1.0;
    else if (!zeros)
      throw ValueError(cat(w, ": value ", x[i], " is in no category (zeros=0)"));
  }
  return {from_doubles(DType::kF32, shape, y, w)};
}

// LabelEncoder's keys or values: the int64 list, the float list or the tensor (opset 4).
std::vector<double> encoder_list(const Attributes& a, const std::string& what, DType* dtype,
                                 const std::string& where) {
  if (a.has(what + "_strings"))
    throw UnsupportedError(
        cat(where, ": string ", what, " (", what, "_strings): PyPTO has no string tensors"));
  if (a.has(what + "_int64s")) {
    *dtype = DType::kI64;
    std::vector<double> v;
    for (int64_t i : a.get_ints(what + "_int64s")) v.push_back(static_cast<double>(i));
    return v;
  }
  if (a.has(what + "_floats")) {
    *dtype = DType::kF32;
    return a.get_floats(what + "_floats");
  }
  if (a.has(what + "_tensor")) {
    const Tensor& t = a.get_tensor(what + "_tensor");
    *dtype = t.dtype();
    return to_doubles(t, where);
  }
  throw ValueError(cat(where, ": give ", what, "_int64s, ", what, "_floats or ", what, "_tensor"));
}

std::vector<Tensor> label_encoder(const KernelContext& c) {
  const std::string w = c.where();
  if (c.node.opset == 1)
    throw UnsupportedError(cat(w,
                               ": LabelEncoder of ai.onnx.ml opset 1 maps strings to integers; "
                               "PyPTO has no string tensors"));
  const Attributes& a = c.node.attrs;
  DType kt = DType::kUndefined, vt = DType::kUndefined;
  const std::vector<double> keys = encoder_list(a, "keys", &kt, w);
  const std::vector<double> values = encoder_list(a, "values", &vt, w);
  if (keys.size() != values.size())
    throw ValueError(cat(w, ": ", keys.size(), " keys and ", values.size(), " values"));
  double fallback = vt == DType::kI64 ? static_cast<double>(c.node.attr_int("default_int64"))
                                      : c.node.attr_float("default_float");
  if (a.has("default_tensor")) fallback = a.get_tensor("default_tensor").item_as_double(0);
  const Tensor& X = c.input(0);
  return {map_values(X, vt, w, [&](double v, int64_t) {
    for (size_t k = 0; k < keys.size(); ++k)  // NaN keys match NaN, as onnxruntime's do
      if (keys[k] == v || (std::isnan(keys[k]) && std::isnan(v))) return values[k];
    return fallback;
  })};
}

std::vector<Tensor> feature_vectorizer(const KernelContext& c) {
  const std::string w = c.where();
  const std::vector<int64_t> dims = c.node.attrs.get_ints("inputdimensions", {});
  if (dims.size() != c.inputs.size())
    throw ValueError(
        cat(w, ": inputdimensions has ", dims.size(), " entries for ", c.inputs.size(), " inputs"));
  int64_t total = 0;
  for (int64_t d : dims) total += d;
  std::vector<Rows> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) in.push_back(rows_of(c.input(i), w, false));
  const int64_t n = in[0].n;
  std::vector<double> y(static_cast<size_t>(n * total), 0.0);
  int64_t at = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].n != n)
      throw ValueError(cat(w, ": input ", i, " has ", in[i].n, " rows; input 0 has ", n));
    for (int64_t r = 0; r < n; ++r)  // the first dims[i] columns, zero-padded
      for (int64_t j = 0; j < std::min(dims[i], in[i].f); ++j)
        y[r * total + at + j] = in[i].x[r * in[i].f + j];
    at += dims[i];
  }
  return {from_doubles(DType::kF32, {n, total}, y, w)};
}

// An SVM's kernel: kernel_type and kernel_params [gamma, coef0, degree] (degree truncated, as
// the ONNX reference reads it).
struct SvmKernel {
  std::string type = "LINEAR";
  double gamma = 0, coef0 = 0, degree = 0;

  SvmKernel(const Attributes& a, bool linear, const std::string& where) {
    const std::vector<double> p = a.get_floats("kernel_params", {0.0, 0.0, 0.0});
    if (p.size() != 3)
      throw ValueError(
          cat(where, ": kernel_params has ", p.size(), " values; it is [gamma, coef0, degree]"));
    gamma = p[0], coef0 = p[1], degree = std::trunc(p[2]);
    type = linear ? "LINEAR" : a.get_string("kernel_type", "LINEAR");
    if (type != "LINEAR" && type != "POLY" && type != "RBF" && type != "SIGMOID")
      throw ValueError(
          cat(where, ": kernel_type '", type, "' is not LINEAR, POLY, RBF or SIGMOID"));
  }
  double operator()(const double* x, const double* v, int64_t f) const {
    double dot = 0, dist = 0;
    for (int64_t j = 0; j < f; ++j) {
      dot += x[j] * v[j];
      dist += (x[j] - v[j]) * (x[j] - v[j]);
    }
    if (type == "POLY") return std::pow(gamma * dot + coef0, degree);
    if (type == "RBF") return std::exp(-gamma * dist);
    if (type == "SIGMOID") return std::tanh(gamma * dot + coef0);
    return dot;
  }
};

// SVMRegressor: sum_j coefficients[j] K(x, support_vectors[j]) + rho, or with no support
// vectors the linear form coefficients . x + rho; one_class gives the sign (1 or -1).
std::vector<Tensor> svm_regressor(const KernelContext& c) {
  const std::string w = c.where();
  const Attributes& a = c.node.attrs;
  const std::string post = a.get_string("post_transform", "NONE");
  if (post != "NONE")
    throw UnsupportedError(cat(w, ": post_transform '", post,
                               "' (an SVM regressor's score is used as it is; NONE is read)"));
  const Rows r = rows_of(c.input(0), w, true);
  const int64_t n_sv = c.node.attr_int("n_supports");
  const std::vector<double> coef = a.get_floats("coefficients", {});
  const std::vector<double> rho = a.get_floats("rho", {0.0});
  const std::vector<double> sv = a.get_floats("support_vectors", {});
  const SvmKernel k(a, n_sv == 0, w);
  if (rho.empty()) throw ValueError(cat(w, ": rho is empty"));
  if (n_sv > 0 ? static_cast<int64_t>(sv.size()) != n_sv * r.f ||
                     static_cast<int64_t>(coef.size()) != n_sv
               : static_cast<int64_t>(coef.size()) != r.f)
    throw ValueError(cat(w, ": ", n_sv, " support vectors (", sv.size(), " values) and ",
                         coef.size(), " coefficients do not fit X's ", r.f, " features"));
  const bool one_class = c.node.attr_int("one_class") != 0;
  std::vector<double> y(static_cast<size_t>(r.n));
  for (int64_t i = 0; i < r.n; ++i) {
    const double* x = r.x.data() + i * r.f;
    double s = rho[0];
    if (n_sv > 0)
      for (int64_t j = 0; j < n_sv; ++j) s += coef[j] * k(x, sv.data() + j * r.f, r.f);
    else
      s += k(x, coef.data(), r.f);
    y[i] = one_class ? (s > 0 ? 1.0 : -1.0) : s;
  }
  return {from_doubles(DType::kF32, {r.n, 1}, y, w)};
}

// libsvm's pairwise coupling (Wu, Lin and Weng 2004, method 2), as onnxruntime and scikit-learn
// run it: class probabilities p[k] from the pairwise ones r[i * k + j].
void multiclass_probability(int64_t k, const std::vector<double>& r, double* p) {
  std::vector<double> Q(static_cast<size_t>(k * k), 0.0), Qp(static_cast<size_t>(k), 0.0);
  const double eps = 0.005 / static_cast<double>(k);
  for (int64_t i = 0; i < k; ++i) {
    p[i] = 1.0 / static_cast<double>(k);
    for (int64_t j = 0; j < i; ++j) {
      Q[i * k + i] += r[j * k + i] * r[j * k + i];
      Q[i * k + j] = Q[j * k + i];
    }
    for (int64_t j = i + 1; j < k; ++j) {
      Q[i * k + i] += r[j * k + i] * r[j * k + i];
      Q[i * k + j] = -r[j * k + i] * r[i * k + j];
    }
  }
  for (int loop = 0; loop < 100; ++loop) {
    double pQp = 0;
    for (int64_t i = 0; i < k; ++i) {
      Qp[i] = 0;
      for (int64_t j = 0; j < k; ++j) Qp[i] += Q[i * k + j] * p[j];
      pQp += p[i] * Qp[i];
    }
    double max_error = 0;
    for (int64_t i = 0; i < k; ++i) max_error = std::max(max_error, std::abs(Qp[i] - pQp));
    if (max_error < eps) break;
    for (int64_t i = 0; i < k; ++i) {
      const double diff = (-Qp[i] + pQp) / Q[i * k + i];
      p[i] += diff;
      pQp = (pQp + diff * (diff * Q[i * k + i] + 2 * Qp[i])) / (1 + diff) / (1 + diff);
      for (int64_t j = 0; j < k; ++j) {
        Qp[j] = (Qp[j] + diff * Q[i * k + j]) / (1 + diff);
        p[j] /= (1 + diff);
      }
    }
  }
}

// SVMClassifier, onnxruntime's way: with support vectors (libsvm's SVC), one-vs-one decisions
// vote for the label, and the scores are the decisions or, with prob_a and prob_b, the coupled
// class probabilities; without (liblinear), one linear score per class.
std::vector<Tensor> svm_classifier(const KernelContext& c) {
  const std::string w = c.where();
  const Attributes& a = c.node.attrs;
  const std::vector<int64_t> labels = a.get_ints("classlabels_ints", {});
  if (labels.empty()) throw ValueError(cat(w, ": classlabels_ints is required"));
  const auto classes = static_cast<int64_t>(labels.size());
  const std::vector<int64_t> per_class = a.get_ints("vectors_per_class", {});
  const std::vector<double> coef = a.get_floats("coefficients");
  const std::vector<double> rho = a.get_floats("rho");
  const std::vector<double> sv = a.get_floats("support_vectors", {});
  const std::vector<double> prob_a = a.get_floats("prob_a", {}),
                            prob_b = a.get_floats("prob_b", {});
  const PostTransform post = post_transform(c.node, w);
  const Rows r = rows_of(c.input(0), w, true);
  int64_t vectors = 0;
  std::vector<int64_t> start;
  for (int64_t v : per_class) {
    start.push_back(vectors);
    vectors += v;
  }
  const bool svc = vectors > 0;
  const SvmKernel k(a, !svc, w);
  const int64_t pairs = classes * (classes - 1) / 2;
  const bool proba = !prob_a.empty();
  if (prob_a.size() != prob_b.size() || (proba && static_cast<int64_t>(prob_a.size()) != pairs))
    throw ValueError(
        cat(w, ": prob_a and prob_b need one value per pair of classes (", pairs, ")"));
  if (svc ? static_cast<int64_t>(per_class.size()) != classes ||
                static_cast<int64_t>(sv.size()) != vectors * r.f ||
                static_cast<int64_t>(coef.size()) != (classes - 1) * vectors ||
                static_cast<int64_t>(rho.size()) < pairs
          : static_cast<int64_t>(coef.size()) != classes * r.f || rho.empty())
    throw ValueError(cat(w,
                         ": vectors_per_class, support_vectors, coefficients and rho do not fit ",
                         classes, " classes of X's ", r.f, " features"));
  const bool all_positive = std::all_of(coef.begin(), coef.end(), [](double v) { return v >= 0; });
  // The scores a row writes: the coupled probabilities, the pairwise decisions (two for two
  // classes), or the linear scores.
  const int64_t cols = !svc || proba ? classes : (classes > 2 ? pairs : 2);
  const int64_t scored = !svc || proba ? classes : pairs;  // before a second column is added
  const int extra = svc && !proba && classes <= 2 ? (post == PostTransform::kNone ? 2 : 0) : -1;
  std::vector<double> z(static_cast<size_t>(r.n * cols), 0.0);
  Tensor label = Tensor::empty(DType::kI64, {r.n});
  std::vector<double> kern(static_cast<size_t>(vectors)), dec(static_cast<size_t>(pairs));
  for (int64_t n = 0; n < r.n; ++n) {
    const double* x = r.x.data() + n * r.f;
    double* out = z.data() + n * cols;
    int64_t best = 0;
    double best_weight = 0;
    if (svc) {
      for (int64_t v = 0; v < vectors; ++v) kern[v] = k(x, sv.data() + v * r.f, r.f);
      std::vector<int64_t> votes(static_cast<size_t>(classes), 0);
      int64_t idx = 0;
      for (int64_t i = 0; i < classes - 1; ++i)
        for (int64_t j = i + 1; j < classes; ++j, ++idx) {
          double sum = rho[idx];
          for (int64_t m = 0; m < per_class[i]; ++m)
            sum += coef[(j - 1) * vectors + start[i] + m] * kern[start[i] + m];
          for (int64_t m = 0; m < per_class[j]; ++m)
            sum += coef[i * vectors + start[j] + m] * kern[start[j] + m];
          dec[idx] = sum;
          ++votes[sum > 0 ? i : j];
        }
      best = std::max_element(votes.begin(), votes.end()) - votes.begin();
      if (proba) {
        std::vector<double> pr(static_cast<size_t>(classes * classes), 0.0);
        idx = 0;
        for (int64_t i = 0; i < classes - 1; ++i)
          for (int64_t j = i + 1; j < classes; ++j, ++idx) {
            const double p =
                std::clamp(1 - ml::logistic(dec[idx] * prob_a[idx] + prob_b[idx]), 1e-7, 1 - 1e-7);
            pr[i * classes + j] = p;
            pr[j * classes + i] = 1 - p;
          }
        multiclass_probability(classes, pr, out);
      } else {
        std::copy(dec.begin(), dec.end(), out);
      }
    } else {
      for (int64_t i = 0; i < classes; ++i) out[i] = k(x, coef.data() + i * r.f, r.f) + rho[0];
      best = std::max_element(out, out + classes) - out;
      best_weight = out[best];
    }
    int64_t lab = labels[best];
    if (pairs == 1 && !proba &&
        ((all_positive && best_weight >= 0.5) || (!all_positive && best_weight > 0)))
      lab = labels[1];
    label.data<int64_t>()[n] = lab;
    if (scored > 1) {
      ml::transform(post, out, scored);
    } else if (post == PostTransform::kProbit) {
      out[0] = ml::probit(out[0]);  // onnxruntime leaves the second column unwritten
    } else if (extra >= 0) {  // one decision, two columns: onnxruntime's [-s, s] or [1 - s, s]
      const double s = out[0];
      out[0] = extra == 2 ? -s : 1 - s;
      out[1] = s;
    }
  }
  return {label, from_doubles(DType::kF32, {r.n, cols}, z, w)};
}

}  // namespace

void register_ml_tree_kernels(KernelRegistry& r);  // ml_trees.cpp

void register_ml_kernels(KernelRegistry& r) {
  register_ml_tree_kernels(r);
  r.add("LinearRegressor", linear_regressor);
  r.add("LinearClassifier", linear_classifier);
  r.add("Scaler", scaler);
  r.add("Normalizer", normalizer);
  r.add("Binarizer", binarizer);
  r.add("Imputer", imputer);
  r.add("ArrayFeatureExtractor", array_feature_extractor);
  r.add("OneHotEncoder", one_hot_encoder);
  r.add("LabelEncoder", label_encoder);
  r.add("FeatureVectorizer", feature_vectorizer);
  r.add("SVMRegressor", svm_regressor);
  r.add("SVMClassifier", svm_classifier);
}

}  // namespace pto::reference
