// Folds and softmax rows for one ISA (included by reduce_avx512.cpp, reduce_avx2.cpp,
// reduce_generic.cpp). A fold keeps four vector accumulators along a contiguous reduced axis and
// combines them in a fixed order at the end; along a strided axis (inner > 1) each lane folds its
// own column, so the summation order depends only on the shape.
#pragma once

#include <iterator>

#include "backend/cpu/isa/vmath.h"
#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/reduce_simd.h"

namespace pto::cpu::PTO_ISA_NS {

// The accumulator of a fold: `a` is the value; `nan` remembers a NaN seen by kMax / kMin, whose
// vector max and min do not propagate NaN the same way on every ISA.
struct Acc {
  Vec a, nan;
};

template <Fold F>
inline float identity() {
  if constexpr (F == Fold::kProd) return 1.0f;
  if constexpr (F == Fold::kMax || F == Fold::kMaxSkipNaN || F == Fold::kMaxFinite)
    return -INFINITY;
  if constexpr (F == Fold::kMin) return INFINITY;
  return 0.0f;
}

template <Fold F>
inline Acc start() {
  return {Vec::set1(identity<F>()), Vec::zero()};
}

template <Fold F>
inline Acc step(Acc s, Vec x, Vec shift) {
  if constexpr (F == Fold::kSum) return {s.a + x, s.nan};
  if constexpr (F == Fold::kSumSquare) return {fma(x, x, s.a), s.nan};
  if constexpr (F == Fold::kSumAbs) return {s.a + abs(x), s.nan};
  if constexpr (F == Fold::kProd) return {s.a * x, s.nan};
  if constexpr (F == Fold::kMax) return {max(s.a, x), select(is_nan(x), x, s.nan)};
  if constexpr (F == Fold::kMin) return {min(s.a, x), select(is_nan(x), x, s.nan)};
  if constexpr (F == Fold::kMaxSkipNaN) return {select(x > s.a, x, s.a), s.nan};
  if constexpr (F == Fold::kMaxFinite) {
    const Vec inf = Vec::set1(INFINITY);
    return {max(s.a, select(abs(x) < inf, x, -inf)), s.nan};
  }
  if constexpr (F == Fold::kSumExp) return {s.a + exp(x - shift), s.nan};
}

// Merges two accumulators lane by lane.
template <Fold F>
inline Acc merge(Acc s, Acc t) {
  if constexpr (F == Fold::kProd) return {s.a * t.a, s.nan};
  if constexpr (F == Fold::kMax || F == Fold::kMaxFinite)
    return {max(s.a, t.a), select(is_nan(t.nan), t.nan, s.nan)};
  if constexpr (F == Fold::kMin) return {min(s.a, t.a), select(is_nan(t.nan), t.nan, s.nan)};
  if constexpr (F == Fold::kMaxSkipNaN) return {select(t.a > s.a, t.a, s.a), s.nan};
  return {s.a + t.a, s.nan};  // the sums
}

// Each lane's result: NaN when the lane saw one (kMax, kMin).
inline Vec result(Acc s) {
  return select(is_nan(s.nan), s.nan, s.a);
}

// The fold of the lanes of s, as a tree of halves (fixed order); NaN when kMax / kMin saw one.
template <Fold F>
float horizontal(Acc s) {
  float a[Vec::kLanes];
  s.a.store(a);
  for (int w = Vec::kLanes / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) {
      const float b = a[k + w];
      if constexpr (F == Fold::kProd)
        a[k] *= b;
      else if constexpr (F == Fold::kMin)
        a[k] = b < a[k] ? b : a[k];
      else if constexpr (F == Fold::kMax || F == Fold::kMaxSkipNaN || F == Fold::kMaxFinite)
        a[k] = b > a[k] ? b : a[k];
      else
        a[k] += b;
    }
  if constexpr (F == Fold::kMax || F == Fold::kMin) {
    float nan[Vec::kLanes];
    s.nan.store(nan);
    for (int k = 0; k < Vec::kLanes; ++k)
      if (std::isnan(nan[k])) return nan[k];
  }
  return a[0];
}

// Folds x[0, n) (contiguous) to one float.
template <Fold F>
float fold_contiguous(const float* x, int64_t n, float shift) {
  constexpr int64_t L = Vec::kLanes;
  const Vec sh = Vec::set1(shift);
  Acc s0 = start<F>(), s1 = start<F>(), s2 = start<F>(), s3 = start<F>();
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    s0 = step<F>(s0, Vec::load(x + j), sh);
    s1 = step<F>(s1, Vec::load(x + j + L), sh);
    s2 = step<F>(s2, Vec::load(x + j + 2 * L), sh);
    s3 = step<F>(s3, Vec::load(x + j + 3 * L), sh);
  }
  for (; j + L <= n; j += L) s0 = step<F>(s0, Vec::load(x + j), sh);
  // kSumExp pads with -inf: exp(-inf - shift) adds 0 (shift is finite).
  if (j < n)
    s1 = step<F>(s1, load_padded(x + j, n - j, F == Fold::kSumExp ? -INFINITY : identity<F>()), sh);
  return horizontal<F>(merge<F>(merge<F>(s0, s1), merge<F>(s2, s3)));
}

template <Fold F>
void fold_impl(const float* x, const FoldRange& g, const float* shift, float* y) {
  constexpr int64_t L = Vec::kLanes;
  if (g.inner == 1) {
    for (int64_t o = g.o0; o < g.o1; ++o)
      y[o] = fold_contiguous<F>(x + o * g.reduce + g.r0, g.r1 - g.r0,
                                F == Fold::kSumExp ? shift[o] : 0.0f);
    return;
  }
  const Vec zero = Vec::zero();
  for (int64_t o = g.o0; o < g.o1; ++o) {
    const float* xo = x + o * g.reduce * g.inner;
    float* yo = y + o * g.inner;
    const float* so = F == Fold::kSumExp ? shift + o * g.inner : nullptr;
    int64_t i = g.i0;
    for (; i + 2 * L <= g.i1; i += 2 * L) {  // two columns of vectors per pass
      const Vec sh0 = so ? Vec::load(so + i) : zero, sh1 = so ? Vec::load(so + i + L) : zero;
      Acc s0 = start<F>(), s1 = start<F>();
      for (int64_t r = g.r0; r < g.r1; ++r) {
        s0 = step<F>(s0, Vec::load(xo + r * g.inner + i), sh0);
        s1 = step<F>(s1, Vec::load(xo + r * g.inner + i + L), sh1);
      }
      result(s0).store(yo + i);
      result(s1).store(yo + i + L);
    }
    for (; i < g.i1; i += L) {  // lanes past the end fold garbage that is never stored
      const int n = lanes_left(g.i1, i);
      const Vec sh = so ? Vec::load(so + i, n) : zero;
      Acc s = start<F>();
      for (int64_t r = g.r0; r < g.r1; ++r) s = step<F>(s, Vec::load(xo + r * g.inner + i, n), sh);
      result(s).store(yo + i, n);
    }
  }
}

void fold(Fold op, const float* x, const FoldRange& r, const float* shift, float* y) {
  using Fn = void (*)(const float*, const FoldRange&, const float*, float*);
  static constexpr Fn kFolds[] = {
      // in the order of enum Fold
      fold_impl<Fold::kSum>,        fold_impl<Fold::kSumSquare>, fold_impl<Fold::kSumAbs>,
      fold_impl<Fold::kProd>,       fold_impl<Fold::kMax>,       fold_impl<Fold::kMin>,
      fold_impl<Fold::kMaxSkipNaN>, fold_impl<Fold::kMaxFinite>, fold_impl<Fold::kSumExp>};
  static_assert(std::size(kFolds) == static_cast<size_t>(Fold::kSumExp) + 1);
  kFolds[static_cast<int>(op)](x, r, shift, y);
}

// ---- Softmax ----

// The max of x[0, len), NaN aside: a NaN in the row makes its exp(x - max), so the sum and every
// output, NaN whatever the max is, so one vmaxps a vector does (kMax tracks NaN in three).
inline float row_max(const float* x, int64_t len) {
  constexpr int64_t L = Vec::kLanes;
  Vec m0 = Vec::set1(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
  int64_t j = 0;
  for (; j + 4 * L <= len; j += 4 * L) {
    m0 = max(m0, Vec::load(x + j));
    m1 = max(m1, Vec::load(x + j + L));
    m2 = max(m2, Vec::load(x + j + 2 * L));
    m3 = max(m3, Vec::load(x + j + 3 * L));
  }
  for (; j < len; j += L) m0 = max(m0, load_padded(x + j, lanes_left(len, j), -INFINITY));
  return reduce_max(max(max(m0, m1), max(m2, m3)));
}

// One contiguous row: the max, then exp(x - max) (<= 0 or NaN; stored for Softmax) and its sum,
// then the scale (Softmax) or x - max - log(sum) (LogSoftmax). With `stream` the exps go to `e`
// (len floats, in cache) and y is written once, past the cache; without, e is y. `next` (or
// null), the row to come, is prefetched into L2 a line per vector while the exps are computed:
// the row's passes run on cached data, so without it nothing is read from memory meanwhile.
inline void softmax_row(const float* x, float* y, float* e, int64_t len, bool log, bool stream,
                        const float* next) {
  constexpr int64_t L = Vec::kLanes, kLineFloats = 16;
  const Vec m = Vec::set1(row_max(x, len));
  Vec s0 = Vec::zero(), s1 = Vec::zero();
  int64_t j = 0;
  for (; j + 2 * L <= len; j += 2 * L) {
    if (next)
      for (int64_t k = 0; k < 2 * L; k += kLineFloats) __builtin_prefetch(next + j + k, 0, 2);
    const Vec e0 = exp<false>(Vec::load(x + j) - m), e1 = exp<false>(Vec::load(x + j + L) - m);
    if (!log) {
      e0.store(e + j);
      e1.store(e + j + L);
    }
    s0 = s0 + e0;
    s1 = s1 + e1;
  }
  for (; j < len; j += L) {
    const int n = lanes_left(len, j);
    const Vec ej = exp<false>(load_padded(x + j, n, -INFINITY) - m);
    if (!log) ej.store(e + j, n);
    s0 = s0 + ej;
  }
  const float sum = reduce_add(s0 + s1);
  if (log) {  // (x - max) first: exact near the max, where the outputs are small
    const Vec c = Vec::set1(std::log(sum));
    store_vectors(y, len, stream, [&](int64_t i, int n) { return Vec::load(x + i, n) - m - c; });
  } else {
    const Vec inv = Vec::set1(1.0f / sum);
    store_vectors(y, len, stream, [&](int64_t i, int n) { return Vec::load(e + i, n) * inv; });
  }
}

// Softmax of rows [0, rows) in one pass over each row: the pass over row r computes its exps
// (into e_r) and their sum, writes row r - 1's outputs (e_{r-1} times 1 / its sum) a vector per exp
// vector, and folds row r + 1's max from its loads, while row r + 2 is prefetched into L2 (with
// `prefetch`). Row by row (softmax_row) a row takes three passes: its max (the only reads from
// memory, whose latency nothing hid), its exps, its scaling (a burst of streaming stores that
// stalled on the write-combining buffers). With kStream, e_r is half (r & 1) of buf (2 len floats,
// in L1 or L2) and y is streamed (len a multiple of the vector, y aligned to it); else e_r is y's
// row r, scaled in place a row later. The same arithmetic as softmax_row (exps and sums in the
// same order, the tail of a row summed into the first accumulator): the same bits either way.
// Rows of 1024 at 4x L3 (Zen 4, 1 thread, streamed, in one process alternated with row by row):
// see docs/python.md, "Memory policy".
template <bool kStream>
void softmax_rows_fused(const float* x, float* y, int64_t rows, int64_t len, float* buf,
                        bool prefetch) {
  constexpr int64_t L = Vec::kLanes, kLineFloats = 16;
  const int64_t pairs = len / (2 * L) * (2 * L);
  auto row_e = [&](int64_t r) { return kStream ? buf + (r & 1) * len : y + r * len; };
  auto out = [&](Vec v, float* p, int k) {
    if (k < L)
      v.store(p, k);
    else if (kStream)
      v.stream(p);
    else
      v.store(p);
  };
  Vec inv_prev = Vec::zero();
  float max_next = row_max(x, len);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * len;
    const float* xn = r + 1 < rows ? xr + len : xr;  // the last row folds its own max again
    const float* ahead = prefetch && r + 2 < rows ? xr + 2 * len : nullptr;
    float* e = row_e(r);
    const float* ep = r > 0 ? row_e(r - 1) : nullptr;
    float* yp = r > 0 ? y + (r - 1) * len : y;
    const Vec m = Vec::set1(max_next);
    Vec s0 = Vec::zero(), s1 = Vec::zero();
    Vec n0 = Vec::set1(-INFINITY), n1 = n0;
    int64_t j = 0;
    for (; j < pairs; j += 2 * L) {
      if (ahead)
        for (int64_t k = 0; k < 2 * L; k += kLineFloats) __builtin_prefetch(ahead + j + k, 0, 2);
      n0 = max(n0, Vec::load(xn + j));
      n1 = max(n1, Vec::load(xn + j + L));
      const Vec e0 = exp<false>(Vec::load(xr + j) - m), e1 = exp<false>(Vec::load(xr + j + L) - m);
      e0.store(e + j);
      e1.store(e + j + L);
      if (ep) {
        out(Vec::load(ep + j) * inv_prev, yp + j, L);
        out(Vec::load(ep + j + L) * inv_prev, yp + j + L, L);
      }
      s0 = s0 + e0;
      s1 = s1 + e1;
    }
    for (; j < len; j += L) {  // at most one whole vector and a part one
      const int k = lanes_left(len, j);
      if (ahead) __builtin_prefetch(ahead + j, 0, 2);
      n0 = max(n0, load_padded(xn + j, k, -INFINITY));
      const Vec ej = exp<false>(load_padded(xr + j, k, -INFINITY) - m);
      ej.store(e + j, k);
      if (ep) out(Vec::load(ep + j, k) * inv_prev, yp + j, k);
      s0 = s0 + ej;
    }
    max_next = reduce_max(max(n0, n1));
    inv_prev = Vec::set1(1.0f / reduce_add(s0 + s1));
  }
  const float* ep = row_e(rows - 1);
  float* yp = y + (rows - 1) * len;
  for (int64_t j = 0; j < len; j += L) {
    const int k = lanes_left(len, j);
    out(Vec::load(ep + j, k) * inv_prev, yp + j, k);
  }
}

void softmax_rows(const float* x, float* y, int64_t rows, int64_t len, bool log, float* stream_buf,
                  bool prefetch) {
  if (rows == 0) return;
  const bool stream = stream_buf != nullptr;
  if (!log && !stream) return softmax_rows_fused<false>(x, y, rows, len, nullptr, prefetch);
  if (!log && len % Vec::kLanes == 0 &&
      reinterpret_cast<uintptr_t>(y) % (Vec::kLanes * sizeof(float)) == 0) {
    softmax_rows_fused<true>(x, y, rows, len, stream_buf, prefetch);
    return stream_fence();
  }
  for (int64_t r = 0; r < rows; ++r) {  // LogSoftmax, and streamed rows not of whole vectors
    float* yr = y + r * len;
    softmax_row(x + r * len, yr, stream ? stream_buf : yr, len, log, stream,
                prefetch && r + 1 < rows ? x + (r + 1) * len : nullptr);
  }
  if (stream) stream_fence();
}

void softmax_columns(const float* x, float* y, int64_t len, int64_t inner, int64_t i0, int64_t i1,
                     bool log) {
  constexpr int64_t L = Vec::kLanes;
  for (int64_t i = i0; i < i1; i += L) {  // one vector of columns at a time; tail lanes unused
    const int n = lanes_left(i1, i);
    Vec m = Vec::set1(-INFINITY);
    for (int64_t j = 0; j < len; ++j) m = max(m, Vec::load(x + j * inner + i, n));
    Vec sum = Vec::zero();
    for (int64_t j = 0; j < len; ++j) {
      const Vec e = exp(Vec::load(x + j * inner + i, n) - m);
      if (!log) e.store(y + j * inner + i, n);
      sum = sum + e;
    }
    if (log) {
      float s[L], c[L];
      sum.store(s);
      for (int k = 0; k < L; ++k) c[k] = std::log(s[k]);
      const Vec logsum = Vec::load(c);
      for (int64_t j = 0; j < len; ++j)
        (Vec::load(x + j * inner + i, n) - m - logsum).store(y + j * inner + i, n);
    } else {
      const Vec inv = Vec::set1(1.0f) / sum;
      for (int64_t j = 0; j < len; ++j)
        (Vec::load(y + j * inner + i, n) * inv).store(y + j * inner + i, n);
    }
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
