// Reference normalizations: BatchNormalization (inference and training statistics),
// InstanceNormalization, LayerNormalization, GroupNormalization, LpNormalization,
// MeanVarianceNormalization and LRN. All compute in double precision.
#include <cmath>

#include "ir/ops/op_params.h"
#include "nn_kernels.h"

namespace pto::reference {
namespace {

// Mean and (population) variance of x[begin + i * stride] for i in [0, count).
struct Moments {
  double mean = 0, var = 0;
};
Moments moments(const double* x, int64_t count, int64_t stride = 1) {
  Moments m;
  if (count == 0) return {NAN, NAN};
  for (int64_t i = 0; i < count; ++i) m.mean += x[i * stride];
  m.mean /= static_cast<double>(count);
  for (int64_t i = 0; i < count; ++i) {
    const double d = x[i * stride] - m.mean;
    m.var += d * d;
  }
  m.var /= static_cast<double>(count);
  return m;
}

// A per-channel parameter (shape [C]) or, for BatchNormalization's old spatial=0 form, one per
// element of a sample (shape X.shape[1:]). Returns the number of parameter "slots".
int64_t param_slots(const Tensor& t, const Tensor& X, bool allow_per_element, const char* name,
                    const std::string& where) {
  const int64_t C = X.dim(1);
  if (t.rank() <= 1 && t.numel() == C) return C;
  if (allow_per_element && t.numel() == (X.dim(0) ? X.numel() / X.dim(0) : 0) && t.numel() > 0)
    return t.numel();
  throw ValueError(
      cat(where, ": ", name, " must have ", C, " elements (one per channel), got ", t.str()));
}

std::vector<Tensor> batch_norm(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  if (X.rank() < 2) throw ValueError(cat(w, ": X must be [N, C, ...], got ", X.str()));
  const int opset = opset_of(c);
  const double eps = c.node.attr_float("epsilon");
  const double momentum = c.node.attr_float("momentum");
  const bool training = opset >= 14 ? c.node.attr_int("training_mode") != 0 : c.num_outputs > 1;
  const int64_t slots = param_slots(c.input(1), X, opset < 9, "scale", w);
  const char* names[] = {"scale", "B", "input_mean", "input_var"};
  std::vector<std::vector<double>> prm;
  for (int i = 1; i <= 4; ++i) {
    if (param_slots(c.input(i), X, opset < 9, names[i - 1], w) != slots)
      throw ValueError(cat(w, ": scale, B, mean and var must have the same size"));
    require_float(c.input(i).dtype(), w);
    prm.push_back(to_doubles(c.input(i), w));
  }
  const std::vector<double> x = to_doubles(X, w);
  const int64_t N = X.dim(0), per_sample = N ? X.numel() / N : 0;
  const int64_t inner = slots ? per_sample / slots : 0;  // elements per slot per sample
  // Element (n, s, j) of the [N, slots, inner] view: loops rather than a division per element
  // (constant folding runs this over the weights of weight-standardized convs, millions).
  auto each = [&](auto f) {
    for (int64_t n = 0, i = 0; n < N; ++n)
      for (int64_t s = 0; s < slots; ++s)
        for (int64_t j = 0; j < inner; ++j, ++i) f(s, i);
  };

  std::vector<double> mean = prm[2], var = prm[3];
  std::vector<double> batch_mean(slots, 0), batch_var(slots, 0);
  if (training) {
    const double count = static_cast<double>(N * inner);
    each([&](int64_t s, int64_t i) { batch_mean[s] += x[i]; });
    for (int64_t s = 0; s < slots; ++s) batch_mean[s] /= count;
    each([&](int64_t s, int64_t i) {
      const double d = x[i] - batch_mean[s];
      batch_var[s] += d * d;
    });
    for (int64_t s = 0; s < slots; ++s) batch_var[s] /= count;
    mean = batch_mean;
    var = batch_var;
  }
  std::vector<double> deviation(slots);
  for (int64_t s = 0; s < slots; ++s) deviation[s] = std::sqrt(var[s] + eps);
  std::vector<double> y(x.size());
  each([&](int64_t s, int64_t i) {
    y[i] = prm[0][s] * (x[i] - mean[s]) / deviation[s] + prm[1][s];
  });
  std::vector<Tensor> out = {from_doubles(X.dtype(), X.shape(), y, w)};
  if (!training) {
    if (c.num_outputs > 1)
      throw UnsupportedError(cat(w, ": statistics outputs need training_mode=1"));
    return out;
  }
  // Running statistics: input * momentum + batch * (1 - momentum).
  std::vector<double> run_mean(slots), run_var(slots);
  for (int64_t s = 0; s < slots; ++s) {
    run_mean[s] = prm[2][s] * momentum + batch_mean[s] * (1 - momentum);
    run_var[s] = prm[3][s] * momentum + batch_var[s] * (1 - momentum);
  }
  const DType sdt = c.input(3).dtype();
  const Dims sshape = c.input(3).shape();
  out.push_back(from_doubles(sdt, sshape, run_mean, w));
  out.push_back(from_doubles(sdt, sshape, run_var, w));
  if (opset < 14) {  // saved_mean, saved_var: the batch's own statistics
    out.push_back(from_doubles(sdt, sshape, batch_mean, w));
    out.push_back(from_doubles(sdt, sshape, batch_var, w));
  }
  out.resize(std::min(out.size(), c.num_outputs));
  return out;
}

std::vector<Tensor> instance_norm(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  if (X.rank() < 2) throw ValueError(cat(w, ": X must be [N, C, ...], got ", X.str()));
  param_slots(c.input(1), X, false, "scale", w);
  param_slots(c.input(2), X, false, "B", w);
  const double eps = c.node.attr_float("epsilon");
  const std::vector<double> x = to_doubles(X, w), scale = to_doubles(c.input(1), w),
                            bias = to_doubles(c.input(2), w);
  if (X.numel() == 0) return {Tensor::empty(X.dtype(), X.shape())};
  const int64_t C = X.dim(1), planes = X.dim(0) * C, size = X.numel() / planes;
  std::vector<double> y(x.size());
  for (int64_t p = 0; p < planes; ++p) {
    const Moments m = moments(x.data() + p * size, size);
    const double inv = 1.0 / std::sqrt(m.var + eps);
    for (int64_t i = 0; i < size; ++i)
      y[p * size + i] = scale[p % C] * (x[p * size + i] - m.mean) * inv + bias[p % C];
  }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

std::vector<Tensor> layer_norm(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  const params::Norm p = params::norm(c.node);
  const int64_t axis = normalize_axis(p.axis, X.rank(), w);
  const double eps = p.epsilon;
  const DType stash = dtype_from_onnx_code(p.stash_type, w);
  require_float(stash, w);
  // Scale and B broadcast against X (in practice they have the normalized shape X.shape[axis:]).
  std::vector<int64_t> soff, boff;
  for (int i : {1, 2}) {
    if (!c.has_input(i)) continue;
    if (broadcast_dims(X.shape(), c.input(i).shape(), w) != X.shape())
      throw ValueError(cat(w, ": ", i == 1 ? "Scale " : "B ", c.input(i).str(),
                           " does not broadcast to X ", X.str()));
    if (X.numel() > 0) (i == 1 ? soff : boff) = broadcast_offsets(c.input(i).shape(), X.shape());
  }
  const std::vector<double> x = to_doubles(X, w), scale = to_doubles(c.input(1), w);
  const std::vector<double> bias =
      c.has_input(2) ? to_doubles(c.input(2), w) : std::vector<double>();
  const int64_t rows = checked_numel(Dims(X.shape().begin(), X.shape().begin() + axis), w.c_str());
  const int64_t inner = checked_numel(Dims(X.shape().begin() + axis, X.shape().end()), w.c_str());
  std::vector<double> y(x.size()), mean(rows), inv_std(rows);
  for (int64_t r = 0; r < rows; ++r) {
    const Moments m = moments(x.data() + r * inner, inner);
    mean[r] = m.mean;
    inv_std[r] = 1.0 / std::sqrt(m.var + eps);
    for (int64_t i = r * inner; i < (r + 1) * inner; ++i) {
      y[i] = (x[i] - m.mean) * inv_std[r] * scale[soff[i]];
      if (!bias.empty()) y[i] += bias[boff[i]];
    }
  }
  std::vector<Tensor> out = {from_doubles(X.dtype(), X.shape(), y, w)};
  Dims sshape = X.shape();
  for (int64_t i = axis; i < X.rank(); ++i) sshape[i] = 1;
  if (c.num_outputs > 1) out.push_back(from_doubles(stash, sshape, mean, w));
  if (c.num_outputs > 2) out.push_back(from_doubles(stash, sshape, inv_std, w));
  return out;
}

std::vector<Tensor> group_norm(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  if (X.rank() < 2) throw ValueError(cat(w, ": X must be [N, C, ...], got ", X.str()));
  const int64_t G = c.attrs().get_int("num_groups");
  const int64_t N = X.dim(0), C = X.dim(1);
  if (G < 1 || C % G != 0)
    throw ValueError(cat(w, ": num_groups ", G, " must be >= 1 and divide ", C, " channels"));
  // Opset 21 made scale and bias per channel; opset 18 had them per group.
  const Tensor &S = c.input(1), &B = c.input(2);
  bool per_group = false;
  if (S.numel() != C || B.numel() != C || S.rank() != 1 || B.rank() != 1) {
    if (opset_of(c) < 21 && S.numel() == G && B.numel() == G && S.rank() == 1 && B.rank() == 1)
      per_group = true;
    else
      throw ValueError(cat(w, ": scale and bias must be 1-D with ", C, " elements, got ", S.str(),
                           " and ", B.str()));
  }
  const double eps = c.node.attr_float("epsilon");
  const std::vector<double> x = to_doubles(X, w), scale = to_doubles(S, w), bias = to_doubles(B, w);
  if (X.numel() == 0) return {Tensor::empty(X.dtype(), X.shape())};
  const int64_t spatial = X.numel() / (N * C);
  const int64_t gsize = C / G * spatial;
  std::vector<double> y(x.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t base = (n * G + g) * gsize;
      const Moments m = moments(x.data() + base, gsize);
      const double inv = 1.0 / std::sqrt(m.var + eps);
      for (int64_t i = 0; i < gsize; ++i) {
        const int64_t ch = g * (C / G) + i / spatial;
        const int64_t p = per_group ? g : ch;
        y[base + i] = scale[p] * (x[base + i] - m.mean) * inv + bias[p];
      }
    }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

// [outer, len, inner] around one axis.
struct AxisSplit {
  int64_t outer = 1, len = 1, inner = 1;
};
AxisSplit split_at(const Dims& shape, int64_t axis) {
  AxisSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i)
    (i < axis ? s.outer : i == axis ? s.len : s.inner) *= shape[i];
  return s;
}

std::vector<Tensor> lp_normalization(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), X.rank(), w);
  const int64_t p = c.node.attr_int("p");
  if (p != 1 && p != 2) throw ValueError(cat(w, ": p must be 1 or 2, got ", p));
  const std::vector<double> x = to_doubles(X, w);
  std::vector<double> y(x.size());
  if (X.numel() == 0) return {Tensor::empty(X.dtype(), X.shape())};
  const AxisSplit s = split_at(X.shape(), axis);
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t in = 0; in < s.inner; ++in) {
      const int64_t base = o * s.len * s.inner + in;
      double norm = 0;
      for (int64_t j = 0; j < s.len; ++j) {
        const double v = x[base + j * s.inner];
        norm += p == 1 ? std::fabs(v) : v * v;
      }
      if (p == 2) norm = std::sqrt(norm);
      for (int64_t j = 0; j < s.len; ++j)  // a zero norm gives zeros, as ONNX's reference does
        y[base + j * s.inner] = norm == 0 ? 0.0 : x[base + j * s.inner] / norm;
    }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

std::vector<Tensor> mean_variance_normalization(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  if (X.numel() == 0) return {Tensor::empty(X.dtype(), X.shape())};
  std::vector<bool> reduced(X.rank(), false);
  for (int64_t a : c.node.attr_ints("axes")) {
    const int64_t ax = normalize_axis(a, X.rank(), w);
    if (reduced[ax]) throw ValueError(cat(w, ": repeated axis ", a));
    reduced[ax] = true;
  }
  // Each element's group: its index over the axes that are kept.
  const int64_t n = X.numel();
  std::vector<int64_t> group(n);
  int64_t groups = 1;
  for (int64_t a = 0; a < X.rank(); ++a)
    if (!reduced[a]) groups *= X.dim(a);
  Dims idx(X.rank());
  for (int64_t i = 0; i < n; ++i) {
    unravel(i, X.shape(), idx);
    int64_t gi = 0;
    for (int64_t a = 0; a < X.rank(); ++a)
      if (!reduced[a]) gi = gi * X.dim(a) + idx[a];
    group[i] = gi;
  }
  const std::vector<double> x = to_doubles(X, w);
  std::vector<double> mean(groups, 0), var(groups, 0);
  std::vector<int64_t> count(groups, 0);
  for (int64_t i = 0; i < n; ++i) {
    mean[group[i]] += x[i];
    ++count[group[i]];
  }
  for (int64_t g = 0; g < groups; ++g) mean[g] /= static_cast<double>(count[g]);
  for (int64_t i = 0; i < n; ++i)
    var[group[i]] += (x[i] - mean[group[i]]) * (x[i] - mean[group[i]]);
  for (int64_t g = 0; g < groups; ++g) var[g] /= static_cast<double>(count[g]);
  std::vector<double> y(n);
  // ONNX's definition: (x - mean) / (sqrt(var) + 1e-9).
  for (int64_t i = 0; i < n; ++i)
    y[i] = (x[i] - mean[group[i]]) / (std::sqrt(var[group[i]]) + 1e-9);
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

std::vector<Tensor> lrn(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& X = c.input(0);
  require_float(X.dtype(), w);
  if (X.rank() < 2) throw ValueError(cat(w, ": X must be [N, C, ...], got ", X.str()));
  const int64_t size = c.attrs().get_int("size");
  if (size < 1) throw ValueError(cat(w, ": size must be >= 1, got ", size));
  const double alpha = c.node.attr_float("alpha"), beta = c.node.attr_float("beta"),
               bias = c.node.attr_float("bias");
  const std::vector<double> x = to_doubles(X, w);
  if (X.numel() == 0) return {Tensor::empty(X.dtype(), X.shape())};
  const AxisSplit s = split_at(X.shape(), 1);
  // Channels [ch - floor((size-1)/2), ch + ceil((size-1)/2)], clipped to the tensor.
  const int64_t before = (size - 1) / 2, after = size - 1 - before;
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t ch = 0; ch < s.len; ++ch) {
      const int64_t lo = std::max<int64_t>(0, ch - before);
      const int64_t hi = after >= s.len - ch ? s.len - 1 : ch + after;
      for (int64_t in = 0; in < s.inner; ++in) {
        double sq = 0;
        for (int64_t k = lo; k <= hi; ++k) {
          const double v = x[(o * s.len + k) * s.inner + in];
          sq += v * v;
        }
        const int64_t i = (o * s.len + ch) * s.inner + in;
        y[i] = x[i] / std::pow(bias + alpha / static_cast<double>(size) * sq, beta);
      }
    }
  return {from_doubles(X.dtype(), X.shape(), y, w)};
}

}  // namespace

void register_norm_kernels(KernelRegistry& r) {
  r.add("BatchNormalization", batch_norm);
  r.add("InstanceNormalization", instance_norm);
  r.add("LayerNormalization", layer_norm);
  r.add("GroupNormalization", group_norm);
  r.add("LpNormalization", lp_normalization);
  r.add("MeanVarianceNormalization", mean_variance_normalization);
  r.add("LRN", lrn);
}

}  // namespace pto::reference
