// CPU kernels for the Reduce* family and ArgMax/ArgMin on float32, and ReduceSum / Prod / Max /
// Min on int32 and int64 (the attention masks' sums of Hugging Face models; other dtypes go to
// the reference). A reduction drops size-1 axes, merges neighbouring axes of one kind and folds x
// as [outer, reduce, inner]; reduced axes that are not adjacent are first gathered to the end with
// a copy. Finishing steps (mean's division, L2's sqrt, the logs) run on the folded outputs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/cpu/reduce_kernels.h"
#include "ir/ops/op_params.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// How partial folds of one output combine (the scalar form of the per-ISA merge).
float combine(Fold op, float a, float b) {
  switch (op) {
    case Fold::kProd:
      return a * b;
    case Fold::kMax:
      return std::isnan(a) || std::isnan(b) ? NAN : std::fmax(a, b);
    case Fold::kMin:
      return std::isnan(a) || std::isnan(b) ? NAN : std::fmin(a, b);
    case Fold::kMaxSkipNaN:
    case Fold::kMaxFinite:
      return b > a ? b : a;
    default:
      return a + b;
  }
}

}  // namespace

void fold_all(Fold op, const float* x, int64_t outer, int64_t reduce, int64_t inner,
              const float* shift, float* y) {
  if (outer == 0 || inner == 0) return;
  auto run = [&](const FoldRange& r, float* out) { PTO_ISA_DISPATCH(fold, op, x, r, shift, out); };
  const int64_t per_output = std::max<int64_t>(reduce, 1);
  if (outer >= 16 || reduce == 0 || outer * per_output * inner <= kParallelGrain) {
    const int64_t grain = std::max<int64_t>(1, kParallelGrain / (per_output * inner));
    parallel_for(0, outer, grain, [&](int64_t o0, int64_t o1) {
      run({reduce, inner, o0, o1, 0, reduce, 0, inner}, y);
    });
  } else if (inner >= 64) {  // few rows of long columns: split the columns
    const int64_t block =
        std::min(inner, std::max<int64_t>(64, kParallelGrain / per_output / 64 * 64));
    const int64_t blocks = (inner + block - 1) / block;
    parallel_for(0, outer * blocks, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t o = t / blocks, i0 = t % blocks * block;
        run({reduce, inner, o, o + 1, 0, reduce, i0, std::min(inner, i0 + block)}, y);
      }
    });
  } else {  // few short outputs of a long axis: fold fixed chunks of it, then combine in order
    const int64_t rows = std::max<int64_t>(1, kParallelGrain / inner);
    const int64_t chunks = (reduce + rows - 1) / rows, n = outer * inner;
    std::vector<float> partial(static_cast<size_t>(chunks * n));
    parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        run({reduce, inner, 0, outer, c * rows, std::min(reduce, (c + 1) * rows), 0, inner},
            partial.data() + c * n);
    });
    for (int64_t k = 0; k < n; ++k) {
      float a = partial[k];
      for (int64_t c = 1; c < chunks; ++c) a = combine(op, a, partial[c * n + k]);
      y[k] = a;
    }
  }
}

namespace {

enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kLogSum, kLogSumExp, kSumSquare };

Fold fold_of(Reduce op) {
  switch (op) {
    case Reduce::kMax:
      return Fold::kMax;
    case Reduce::kMin:
      return Fold::kMin;
    case Reduce::kProd:
      return Fold::kProd;
    case Reduce::kL1:
      return Fold::kSumAbs;
    case Reduce::kL2:
    case Reduce::kSumSquare:
      return Fold::kSumSquare;
    case Reduce::kLogSumExp:
      return Fold::kSumExp;
    default:
      return Fold::kSum;
  }
}

// Reduce::reduced, naming the node only for an axis out of range or repeated (the error).
std::vector<bool> reduced_mask(const KernelContext& c, const params::Reduce& p, int64_t rank) {
  if (!p.axes) return p.reduced(rank, c.where());
  std::vector<bool> out(static_cast<size_t>(rank), p.axes->empty() && !p.noop_with_empty_axes);
  for (int64_t a : *p.axes) {
    if (a < -rank || a >= rank || out[static_cast<size_t>(c.axis(a, rank))])
      return p.reduced(rank, c.where());
    out[static_cast<size_t>(c.axis(a, rank))] = true;
  }
  return out;
}

// Which axes are reduced, as the reference reads them: the `axes` input, else the attribute; none
// means all unless noop_with_empty_axes. Prepared once where they are known at compile time.
std::vector<bool> reduced_axes(const KernelContext& c, int64_t rank) {
  if (const auto* p = c.prepared_if<params::Reduce>()) return reduced_mask(c, *p, rank);
  std::optional<std::vector<int64_t>> axes;
  if (c.has_input(1)) {
    const Tensor& a = c.input(1);
    if (a.rank() > 1)
      throw ValueError(cat(c.where(), ": axes must be a 1-D tensor, got ", a.str()));
    axes.emplace(a.data<int64_t>(), a.data<int64_t>() + a.numel());
  }
  return reduced_mask(c, params::reduce(c.node, axes), rank);
}

// The attributes and, where they are known when the kernel is made (the attribute, or a constant
// 1-D axes input), the axes: read once instead of on every run. Nothing for axes known only then.
std::any prepare_reduce(const NodeInfo& n) {
  std::optional<std::vector<int64_t>> axes;
  if (n.is_constant(1)) {
    const Tensor& a = *n.constants[1];
    if (a.rank() > 1 || a.dtype() != DType::kI64) return {};
    axes.emplace(a.data<int64_t>(), a.data<int64_t>() + a.numel());
  } else if (n.node.inputs.size() > 1 && n.node.inputs[1] != kNoValue) {
    return {};
  }
  return params::reduce(n.node, axes);
}

// x as [outer, reduce, inner]; `data` is x's or a copy with the reduced axes moved last.
struct Folded {
  const float* data = nullptr;
  Tensor copy;
  int64_t outer = 1, reduce = 1, inner = 1;
};

// Copies x (merged into `sizes`) with the kept axes first and the reduced ones last.
Tensor move_reduced_last(const Tensor& x, const Dims& sizes, const std::vector<bool>& reduced) {
  const int64_t rank = static_cast<int64_t>(sizes.size());
  Dims strides(rank, 1), order;
  for (int64_t k = rank - 2; k >= 0; --k) strides[k] = strides[k + 1] * sizes[k + 1];
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t k = 0; k < rank; ++k)
      if (reduced[k] == (pass == 1)) order.push_back(k);
  Tensor out = Tensor::empty(DType::kF32, {x.numel()});
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  const int64_t last = order.back(), run = sizes[last], step = strides[last];
  Dims idx(rank, 0);  // odometer over the permuted axes but the last
  for (int64_t o = 0; o < x.numel(); o += run) {
    int64_t off = 0;
    for (int64_t k = 0; k + 1 < rank; ++k) off += idx[k] * strides[order[k]];
    for (int64_t j = 0; j < run; ++j) dst[o + j] = src[off + j * step];
    for (int64_t k = rank - 2; k >= 0 && ++idx[k] == sizes[order[k]]; --k) idx[k] = 0;
  }
  return out;
}

// x's axes with size-1 axes dropped and neighbours of one kind (reduced or kept) merged.
struct MergedAxes {
  Dims sizes;
  std::vector<bool> reduced;
  int runs = 0;  // how many runs of reduced axes
};

MergedAxes merge_axes(const Tensor& x, const std::vector<bool>& reduced) {
  MergedAxes m;
  for (int64_t k = 0; k < x.rank(); ++k) {
    if (x.dim(k) == 1) continue;
    if (!m.reduced.empty() && m.reduced.back() == reduced[k]) {
      m.sizes.back() *= x.dim(k);
    } else {
      m.sizes.push_back(x.dim(k));
      m.reduced.push_back(reduced[k]);
      m.runs += reduced[k];
    }
  }
  return m;
}

// [outer, reduce, inner] of merged axes with at most one run of reduced axes.
void split_at_run(const MergedAxes& m, int64_t& outer, int64_t& reduce, int64_t& inner) {
  outer = reduce = inner = 1;
  if (m.runs == 0) {  // only size-1 axes reduced: each element alone
    for (int64_t d : m.sizes) outer *= d;
    return;
  }
  bool seen = false;
  for (size_t k = 0; k < m.sizes.size(); ++k) {
    int64_t& part = m.reduced[k] ? reduce : seen ? inner : outer;
    part *= m.sizes[k];
    seen = seen || m.reduced[k];
  }
}

Folded fold_view(const Tensor& x, const std::vector<bool>& reduced) {
  Folded f;
  f.data = x.data<float>();
  const MergedAxes m = merge_axes(x, reduced);
  if (m.runs > 1) {
    f.copy = move_reduced_last(x, m.sizes, m.reduced);
    f.data = f.copy.data<float>();
    for (size_t k = 0; k < m.sizes.size(); ++k) (m.reduced[k] ? f.reduce : f.outer) *= m.sizes[k];
    return f;
  }
  split_at_run(m, f.outer, f.reduce, f.inner);
  return f;
}

// Sum, product (both wrapping modulo 2^bits, as the reference and numpy do), max and min of an
// integer x as [outer, reduce, inner], row by row so that x streams.
template <class T>
void fold_integers(Reduce op, const T* x, int64_t outer, int64_t reduce, int64_t inner, T* y) {
  using U = std::make_unsigned_t<T>;
  const T start = op == Reduce::kProd  ? T{1}
                  : op == Reduce::kMax ? std::numeric_limits<T>::lowest()
                  : op == Reduce::kMin ? std::numeric_limits<T>::max()
                                       : T{0};
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, reduce * inner));
  parallel_for(0, outer, grain, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      T* yo = y + o * inner;
      std::fill(yo, yo + inner, start);
      for (int64_t r = 0; r < reduce; ++r) {
        const T* xr = x + (o * reduce + r) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          switch (op) {
            case Reduce::kSum:
              yo[i] = static_cast<T>(static_cast<U>(yo[i]) + static_cast<U>(xr[i]));
              break;
            case Reduce::kProd:
              yo[i] = static_cast<T>(static_cast<U>(yo[i]) * static_cast<U>(xr[i]));
              break;
            case Reduce::kMax:
              yo[i] = std::max(yo[i], xr[i]);
              break;
            default:
              yo[i] = std::min(yo[i], xr[i]);
          }
        }
      }
    }
  });
}

bool integer_fold(Reduce op) {
  return op == Reduce::kSum || op == Reduce::kProd || op == Reduce::kMax || op == Reduce::kMin;
}

std::vector<Tensor> run_reduce(const KernelContext& c, Reduce op) {
  const Tensor& x = c.input(0);
  const std::vector<bool> reduced = reduced_axes(c, x.rank());
  const auto* p = c.prepared_if<params::Reduce>();
  const bool keepdims = p ? p->keepdims : params::reduce(c.node, {}).keepdims;
  Dims out_shape;
  out_shape.reserve(static_cast<size_t>(x.rank()));
  int64_t out_numel = 1;
  for (int64_t k = 0; k < x.rank(); ++k) {
    if (!reduced[k]) out_numel *= x.dim(k);
    if (!reduced[k] || keepdims) out_shape.push_back(reduced[k] ? 1 : x.dim(k));
  }
  if (x.dtype() != DType::kF32) {  // int32 / int64 sums, products, max and min
    Tensor y = Tensor::empty(x.dtype(), std::move(out_shape));
    if (out_numel == 0) return one(std::move(y));
    const MergedAxes m = merge_axes(x, reduced);
    if (m.runs > 1) return run_reference(c);  // reduced axes apart: rare for integers
    int64_t outer, reduce, inner;
    split_at_run(m, outer, reduce, inner);
    if (x.numel() == 0) outer = out_numel, reduce = 0, inner = 1;
    const Tensor xc = x.contiguous();
    dispatch(x.dtype(), kIntTypes, c.where(), [&]<class T>() {
      if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>)
        fold_integers(op, xc.data<T>(), outer, reduce, inner, y.data<T>());
    });
    return one(std::move(y));
  }
  Tensor y = Tensor::empty(DType::kF32, std::move(out_shape));
  if (out_numel == 0) return one(std::move(y));
  Folded f;
  if (x.numel() == 0) {  // an empty reduced axis: every output is the identity
    f.outer = out_numel;
    f.reduce = 0;
  } else {
    f = fold_view(x, reduced);
  }
  float* out = y.data<float>();
  Tensor shift;
  if (op == Reduce::kLogSumExp) {  // subtract the largest finite element, 0 when there is none
    shift = Tensor::empty(DType::kF32, {out_numel});
    float* s = shift.data<float>();
    fold_all(Fold::kMaxFinite, f.data, f.outer, f.reduce, f.inner, nullptr, s);
    for (int64_t k = 0; k < out_numel; ++k)
      if (!std::isfinite(s[k])) s[k] = 0;
  }
  fold_all(fold_of(op), f.data, f.outer, f.reduce, f.inner,
           shift.defined() ? shift.data<float>() : nullptr, out);
  const float count = static_cast<float>(f.reduce);
  for (int64_t k = 0; k < out_numel; ++k) {
    switch (op) {
      case Reduce::kMean:
        out[k] /= count;
        break;
      case Reduce::kL2:
        out[k] = std::sqrt(out[k]);
        break;
      case Reduce::kLogSum:
        out[k] = std::log(out[k]);
        break;
      case Reduce::kLogSumExp:
        out[k] = std::log(out[k]) + shift.data<float>()[k];
        break;
      default:
        break;
    }
  }
  return one(std::move(y));
}

bool accepts_reduce(const NodeInfo& n, Reduce op) {
  const DType x = n.dtype(0), axes = n.dtype(1);
  const bool ints = (x == DType::kI32 || x == DType::kI64) && integer_fold(op);
  return (x == DType::kF32 || ints) && (axes == DType::kUndefined || axes == DType::kI64);
}

// ArgMax / ArgMin along `axis` with the reference's rules: NaN is the extreme (the first one, or
// the last with select_last_index), ties go to the first (or last) index. float32 and the integer
// types (CLIP's pooled output takes the ArgMax of the token ids).
template <class T>
void arg_rows(const T* xp, int64_t* yp, int64_t outer, int64_t n, int64_t inner, bool is_max,
              bool last) {
  auto better = [&](T a, T b) {  // a replaces the current best b
    if constexpr (std::is_floating_point_v<T>) {
      if (std::isnan(b)) return last && std::isnan(a);
      if (std::isnan(a)) return true;
    }
    if (a == b) return last;
    return is_max ? a > b : a < b;
  };
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (n * inner));
  parallel_for(0, outer, grain, [&](int64_t o0, int64_t o1) {
    std::vector<T> best(static_cast<size_t>(inner));
    for (int64_t o = o0; o < o1; ++o) {
      const T* xo = xp + o * n * inner;
      int64_t* yo = yp + o * inner;
      for (int64_t i = 0; i < inner; ++i) {
        best[i] = xo[i];
        yo[i] = 0;
      }
      for (int64_t j = 1; j < n; ++j)  // row by row, so that x streams
        for (int64_t i = 0; i < inner; ++i)
          if (better(xo[j * inner + i], best[i])) {
            best[i] = xo[j * inner + i];
            yo[i] = j;
          }
    }
  });
}

bool accepts_arg(const NodeInfo& n) {
  const DType t = n.dtype(0);
  return t == DType::kF32 || (is_integral(t) && t != DType::kBool);
}

std::vector<Tensor> run_arg(const KernelContext& c, bool is_max) {
  const Tensor& x = c.input(0);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), x.rank(), c.where());
  const bool keepdims = c.node.attr_int("keepdims") != 0;
  const bool last = c.node.attr_int("select_last_index") != 0;
  const int64_t n = x.dim(axis);
  int64_t outer = 1, inner = 1;
  Dims out_shape;
  for (int64_t k = 0; k < x.rank(); ++k) {
    if (k < axis) outer *= x.dim(k);
    if (k > axis) inner *= x.dim(k);
    if (k != axis || keepdims) out_shape.push_back(k == axis ? 1 : x.dim(k));
  }
  Tensor y = Tensor::empty(DType::kI64, out_shape);
  if (y.numel() == 0) return one(std::move(y));
  if (n == 0)
    throw ValueError(cat(c.where(), ": cannot take the arg", is_max ? "max" : "min",
                         " of an empty axis ", axis));
  const Tensor xc = x.contiguous();
  if (xc.dtype() == DType::kF32)
    arg_rows(xc.data<float>(), y.data<int64_t>(), outer, n, inner, is_max, last);
  else
    dispatch(xc.dtype(), kIntTypes, c.where(), [&]<class T>() {
      arg_rows(xc.data<T>(), y.data<int64_t>(), outer, n, inner, is_max, last);
    });
  return one(std::move(y));
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  const std::pair<const char*, Reduce> ops[] = {{"ReduceSum", Reduce::kSum},
                                                {"ReduceMean", Reduce::kMean},
                                                {"ReduceMax", Reduce::kMax},
                                                {"ReduceMin", Reduce::kMin},
                                                {"ReduceProd", Reduce::kProd},
                                                {"ReduceL1", Reduce::kL1},
                                                {"ReduceL2", Reduce::kL2},
                                                {"ReduceLogSum", Reduce::kLogSum},
                                                {"ReduceLogSumExp", Reduce::kLogSumExp},
                                                {"ReduceSumSquare", Reduce::kSumSquare}};
  for (const auto& [name, op] : ops)
    r.add(name, {.accepts = [op](const NodeInfo& n) { return accepts_reduce(n, op); },
                 .prepare = prepare_reduce,
                 .run = [op](const KernelContext& c) { return run_reduce(c, op); },
                 .reference_at_run_time = integer_fold(op)});
  for (bool is_max : {true, false})
    r.add(is_max ? "ArgMax" : "ArgMin",
          {.accepts = accepts_arg,
           .run = [is_max](const KernelContext& c) { return run_arg(c, is_max); }});
  register_norm_kernels(r);
  register_pool_kernels(r);
}

}  // namespace pto::cpu
