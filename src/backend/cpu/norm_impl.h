// Mean/variance and the normalizing affine maps for one ISA (included by norm_avx512.cpp,
// norm_avx2.cpp, norm_generic.cpp). Statistics are taken of d = x - shift, the shift the mean of
// the row's first vector (row_shift): exact for data clustered far from 0, and the mean is kept as
// that shift plus a small float so (x - shift) - mean loses nothing to the mean's rounding. The
// variance comes from the same pass (the sums of d and d^2, var = E[d^2] - E[d]^2) where that
// cannot cancel much, E[d]^2 <= var; elsewhere (a first vector unlike the rest of the row, NaN,
// inf) a second pass over the centred values takes it, as the reference does.
#pragma once

#include <cmath>
#include <utility>

#include "backend/cpu/elementwise_ops.h"
#include "backend/cpu/isa/vmath.h"
#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/reduce_simd.h"
#include "pto/error.h"

namespace pto::cpu::PTO_ISA_NS {

// Sum of term(x[j]) over j < n: vectors summed in blocks of 4096 elements whose sums are added at
// the end of each block (so the error grows with n / 4096, not n, even with one lane); the lanes
// of the last partial vector past n are masked out.
template <class Term>
float block_sum(const float* x, int64_t n, Term term) {
  constexpr int64_t L = Vec::kLanes, kBlock = 4096;
  Vec total = Vec::zero();
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    Vec s0 = Vec::zero(), s1 = Vec::zero();
    int64_t j = b;
    for (; j + 2 * L <= e; j += 2 * L) {
      s0 = s0 + term(Vec::load(x + j));
      s1 = s1 + term(Vec::load(x + j + L));
    }
    for (; j < e; j += L) {
      const int k = lanes_left(e, j);
      const Vec t = term(Vec::load(x + j, k));
      s1 = s1 + select(first_lanes(k), t, Vec::zero());
    }
    total = total + (s0 + s1);
  }
  return sum_lanes(total);
}

// The sums of d and d^2 over d = x[j] - sh, j < n, in block_sum's order (blocks of 4096
// elements, two accumulators of each, the last partial vector masked), the lanes added as a tree.
// each(j) is called before every pair of whole vectors at j (layer_norm_rows_streamed computes the
// previous row's outputs there; moments nothing), so both take the same sums.
template <class Each>
void block_sums2(const float* x, int64_t n, Vec sh, float* s1, float* s2, Each each) {
  constexpr int64_t L = Vec::kLanes, kBlock = 4096;
  Vec t1 = Vec::zero(), t2 = Vec::zero();
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    Vec a0 = Vec::zero(), a1 = Vec::zero(), q0 = Vec::zero(), q1 = Vec::zero();
    int64_t j = b;
    for (; j + 2 * L <= e; j += 2 * L) {
      each(j);
      const Vec d0 = Vec::load(x + j) - sh, d1 = Vec::load(x + j + L) - sh;
      a0 = a0 + d0;
      a1 = a1 + d1;
      q0 = fma(d0, d0, q0);
      q1 = fma(d1, d1, q1);
    }
    for (; j < e; j += L) {
      const int k = lanes_left(e, j);
      const Vec d = select(first_lanes(k), Vec::load(x + j, k) - sh, Vec::zero());
      a1 = a1 + d;
      q1 = fma(d, d, q1);
    }
    t1 = t1 + (a0 + a1);
    t2 = t2 + (q0 + q1);
  }
  *s1 = reduce_add(t1);  // a tree of halves: a third of sum_lanes' instructions
  *s2 = reduce_add(t2);
}

// The shift of moments' sums: the mean of x's first vector (of its first n elements when shorter),
// near the mean of a row whose elements are alike (within sigma / 4 on 16 lanes, mostly), so that
// the one-pass variance rarely needs its second pass; x[0] where that mean is not finite (an inf
// or NaN among them: the row's statistics are then inf or NaN as the reference's).
// `first`: x's first k = min(n, lanes) elements, zeros past them.
inline float row_shift(Vec first, int k, float x0) {
  const float s = reduce_add(first) / static_cast<float>(k);
  return std::isfinite(s) ? s : x0;
}
inline float row_shift(const float* x, int64_t n) {
  const int k = lanes_left(n, 0);
  return row_shift(load_padded(x, k, 0.0f), k, x[0]);
}

// The variance of x[0, n) from its shifted sums s1 = sum(d), s2 = sum(d^2) (block_sums2), with
// m = s1 / n: s2 / n - m^2 where m^2 <= that (the shift within a standard deviation of the mean:
// the difference loses at most about as much as the sums' rounding again); else (a shift far
// from the mean, where the difference cancels, a negative rounding, NaN or inf) a second pass over
// (d - m)^2 as block_sum takes it.
inline float variance(const float* x, int64_t n, Vec sh, float m, float s2) {
  const float v = s2 / static_cast<float>(n) - m * m;
  if (m * m <= v) return v;
  const Vec mv = Vec::set1(m);
  return block_sum(x, n,
                   [&](Vec t) {
                     const Vec d = t - sh - mv;
                     return d * d;
                   }) /
         static_cast<float>(n);
}

void moments(const float* x, int64_t n, float* shift, float* mean, float* var) {
  const float c = row_shift(x, n);
  const Vec sh = Vec::set1(c);
  float s1, s2;
  block_sums2(x, n, sh, &s1, &s2, [](int64_t) {});
  const float m = s1 / static_cast<float>(n);
  *shift = c;
  *mean = m;
  *var = variance(x, n, sh, m, s2);
}

void add_rows(const float* a, const float* b, float* y, int64_t n) {
  constexpr int64_t L = Vec::kLanes;
  int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) {
    (Vec::load(a + j) + Vec::load(b + j)).store(y + j);
    (Vec::load(a + j + L) + Vec::load(b + j + L)).store(y + j + L);
  }
  for (; j < n; j += L) {
    const int k = lanes_left(n, j);
    (Vec::load(a + j, k) + Vec::load(b + j, k)).store(y + j, k);
  }
}

namespace {

// The left-deep sum of the k rows t at j (the lanes past `lanes` zero).
inline Vec sum_at(const float* const* t, int k, int64_t j) {
  Vec v = Vec::load(t[0] + j) + Vec::load(t[1] + j);
  for (int i = 2; i < k; ++i) v = v + Vec::load(t[i] + j);
  return v;
}
inline Vec sum_at(const float* const* t, int k, int64_t j, int lanes) {
  Vec v = Vec::load(t[0] + j, lanes) + Vec::load(t[1] + j, lanes);
  for (int i = 2; i < k; ++i) v = v + Vec::load(t[i] + j, lanes);
  return v;
}

}  // namespace

// moments() on the row as it is summed: row_shift from the first vector, then block_sums2's
// loop with each vector computed from the terms (and stored) instead of loaded. The loop is
// written out again on purpose: block_sums2 taking the vectors from a callback (inlined or
// always_inline) ran Add+Add+LayerNorm rows of 768 at 18.6-19.1 GB/s against 19.9-20.0 (1 thread,
// 4x L3, load 0.8-1.6, separate builds alternated with the tile program).
void sum_moments(const float* const* t, int k, float* y, int64_t n, float* shift, float* mean,
                 float* var) {
  constexpr int64_t L = Vec::kLanes, kBlock = 4096;
  const int first = lanes_left(n, 0);
  const Vec v0 = sum_at(t, k, 0, first);
  v0.store(y, first);
  const float c = row_shift(select(first_lanes(first), v0, Vec::zero()), first, y[0]);
  const Vec sh = Vec::set1(c);
  Vec t1 = Vec::zero(), t2 = Vec::zero();
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    Vec a0 = Vec::zero(), a1 = Vec::zero(), q0 = Vec::zero(), q1 = Vec::zero();
    int64_t j = b;
    for (; j + 2 * L <= e; j += 2 * L) {
      const Vec x0 = sum_at(t, k, j), x1 = sum_at(t, k, j + L);
      x0.store(y + j);
      x1.store(y + j + L);
      const Vec d0 = x0 - sh, d1 = x1 - sh;
      a0 = a0 + d0;
      a1 = a1 + d1;
      q0 = fma(d0, d0, q0);
      q1 = fma(d1, d1, q1);
    }
    for (; j < e; j += L) {
      const int m = lanes_left(e, j);
      const Vec x = sum_at(t, k, j, m);
      x.store(y + j, m);
      const Vec d = select(first_lanes(m), x - sh, Vec::zero());
      a1 = a1 + d;
      q1 = fma(d, d, q1);
    }
    t1 = t1 + (a0 + a1);
    t2 = t2 + (q0 + q1);
  }
  const float s1 = reduce_add(t1), s2 = reduce_add(t2);
  const float m = s1 / static_cast<float>(n);
  *shift = c;
  *mean = m;
  *var = variance(y, n, sh, m, s2);
}

float mean_square(const float* x, int64_t n) {
  return block_sum(x, n, [](Vec v) { return v * v; }) / static_cast<float>(n);
}

// c lanes as kV vectors (c == kV * kLanes), or lane by lane where c is not a whole number of
// vectors (one call per block: the loops over the pixels dominate).
template <int kV>
void lane_sums_v(const float* x, int64_t pixels, const float* shift, double* s1, double* s2) {
  constexpr int L = Vec::kLanes, kRun = 256;
  Vec sh[kV];
  for (int v = 0; v < kV; ++v) sh[v] = Vec::load(shift + v * L);
  for (int64_t p0 = 0; p0 < pixels; p0 += kRun) {
    const int64_t p1 = p0 + kRun < pixels ? p0 + kRun : pixels;
    Vec a[kV], q[kV];
    for (int v = 0; v < kV; ++v) a[v] = q[v] = Vec::zero();
    for (int64_t p = p0; p < p1; ++p)
      for (int v = 0; v < kV; ++v) {
        const Vec d = Vec::load(x + p * kV * L + v * L) - sh[v];
        a[v] = a[v] + d;
        q[v] = fma(d, d, q[v]);
      }
    float fa[kV * L], fq[kV * L];
    for (int v = 0; v < kV; ++v) a[v].store(fa + v * L), q[v].store(fq + v * L);
    for (int l = 0; l < kV * L; ++l) s1[l] += fa[l], s2[l] += fq[l];
  }
}

void lane_sums(const float* x, int64_t pixels, int c, const float* shift, double* s1, double* s2) {
  constexpr int L = Vec::kLanes;
  if (c == L) return lane_sums_v<1>(x, pixels, shift, s1, s2);
  if (c == 2 * L) return lane_sums_v<2>(x, pixels, shift, s1, s2);
  if (c == 4 * L) return lane_sums_v<4>(x, pixels, shift, s1, s2);
  for (int64_t p = 0; p < pixels; ++p)
    for (int l = 0; l < c; ++l) {
      const double d = static_cast<double>(x[p * c + l] - shift[l]);
      s1[l] += d, s2[l] += d * d;
    }
}

template <int kV>
void lane_affine_v(const float* x, float* y, int64_t pixels, const float* shift, const float* a,
                   const float* b, LaneAct act) {
  constexpr int L = Vec::kLanes;
  Vec sh[kV], av[kV], bv[kV];
  for (int v = 0; v < kV; ++v)
    sh[v] = Vec::load(shift + v * L), av[v] = Vec::load(a + v * L), bv[v] = Vec::load(b + v * L);
  auto run = [&]<LaneAct kAct>() {
    for (int64_t p = 0; p < pixels; ++p)
      for (int v = 0; v < kV; ++v) {
        const int64_t at = p * kV * L + v * L;
        Vec t = fma(Vec::load(x + at) - sh[v], av[v], bv[v]);
        if constexpr (kAct == LaneAct::kRelu) t = max_keep_nan(t, Vec::zero());
        if constexpr (kAct == LaneAct::kSilu) t = times_sigmoid(t, t);
        t.store(y + at);
      }
  };
  switch (act) {
    case LaneAct::kNone:
      return run.template operator()<LaneAct::kNone>();
    case LaneAct::kRelu:
      return run.template operator()<LaneAct::kRelu>();
    case LaneAct::kSilu:
      return run.template operator()<LaneAct::kSilu>();
  }
}

void lane_affine(const float* x, float* y, int64_t pixels, int c, const float* shift,
                 const float* a, const float* b, LaneAct act) {
  constexpr int L = Vec::kLanes;
  if (c == L) return lane_affine_v<1>(x, y, pixels, shift, a, b, act);
  if (c == 2 * L) return lane_affine_v<2>(x, y, pixels, shift, a, b, act);
  if (c == 4 * L) return lane_affine_v<4>(x, y, pixels, shift, a, b, act);
  for (int64_t p = 0; p < pixels; ++p)
    for (int l = 0; l < c; ++l) {
      float v = (x[p * c + l] - shift[l]) * a[l] + b[l];
      if (act == LaneAct::kRelu && v < 0.0f) v = 0.0f;  // NaN stays NaN, as Relu's
      if (act == LaneAct::kSilu) v = v / (1.0f + std::exp(-v));
      y[p * c + l] = v;
    }
}

void normalize(const float* x, float* y, int64_t n, float shift, float mean, float a, float b) {
  const Vec sh = Vec::set1(shift), m = Vec::set1(mean), av = Vec::set1(a), bv = Vec::set1(b);
  for (int64_t j = 0; j < n; j += Vec::kLanes) {
    const int k = lanes_left(n, j);
    fma(Vec::load(x + j, k) - sh - m, av, bv).store(y + j, k);
  }
}

void normalize_affine(const float* x, float* y, int64_t n, float shift, float mean, float inv_std,
                      const float* scale, const float* bias, bool stream, bool fence,
                      const float* next) {
  const Vec sh = Vec::set1(shift), m = Vec::set1(mean), inv = Vec::set1(inv_std);
  store_vectors(y, n, stream, [&](int64_t j, int k) {
    if (next) __builtin_prefetch(next + j, 0, 2);  // a line per vector (two under AVX2)
    const Vec t = (Vec::load(x + j, k) - sh - m) * inv;
    const Vec b = bias ? Vec::load(bias + j, k) : Vec::zero();
    return fma(t, Vec::load(scale + j, k), b);
  });
  if (stream && fence) stream_fence();
}

namespace {

// layer_norm_rows_short for rows of NV vectors (the last one `last` lanes wide): the row's
// vectors, scale and bias in registers; y float32, or bf16 (Bf16, AVX-512).
template <int NV, bool Bf16>
void layer_norm_short(const float* x, void* out, int64_t rows, int64_t n, int last, float eps,
                      const float* scale, const float* bias, float* mean, float* inv_std,
                      bool stream) {
  auto* y = static_cast<float*>(out);
  constexpr int64_t L = Vec::kLanes;
  const Mask tail = first_lanes(last);
  const int64_t paired = n / (2 * L) * 2;  // vectors in block_sums2's pairs
  const auto count = static_cast<float>(n);
  auto load = [&](const float* p, int i) {
    return i < NV - 1 ? Vec::load(p + i * L) : Vec::load(p + i * L, last);
  };
  Vec g[NV], b[NV];
#pragma GCC unroll 8
  for (int i = 0; i < NV; ++i) {
    g[i] = load(scale, i);
    b[i] = bias ? load(bias, i) : Vec::zero();
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    Vec v[NV];
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) v[i] = load(xr, i);
    // moments' statistics, its sums taken from the registers in block_sums2's order (pairs of
    // whole vectors into the first accumulators, the rest into the second), so that a row gives
    // the same bits here as row by row (a fused Cast after the node, for one, takes that path).
    const float c = row_shift(NV == 1 ? select(tail, v[0], Vec::zero()) : v[0],
                              static_cast<int>(n < L ? n : L), xr[0]);
    const Vec sh = Vec::set1(c);
    Vec a0 = Vec::zero(), a1 = Vec::zero(), q0 = Vec::zero(), q1 = Vec::zero();
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) {
      const Vec d = i < NV - 1 ? v[i] - sh : select(tail, v[i] - sh, Vec::zero());
      if (i < paired && i % 2 == 0) {
        a0 = a0 + d;
        q0 = fma(d, d, q0);
      } else {
        a1 = a1 + d;
        q1 = fma(d, d, q1);
      }
    }
    const float m = reduce_add(Vec::zero() + (a0 + a1)) / count;
    const float var = variance(xr, n, sh, m, reduce_add(Vec::zero() + (q0 + q1)));
    const float inv = 1.0f / std::sqrt(var + eps);
    mean[r] = c + m;
    inv_std[r] = inv;
    const Vec mv = Vec::set1(m);
    const Vec iv = Vec::set1(inv);
#pragma GCC unroll 8
    for (int i = 0; i < NV; ++i) {
      const Vec t = fma((v[i] - sh - mv) * iv, g[i], b[i]);
#if defined(PTO_ISA_AVX512)
      if constexpr (Bf16) {
        store_bf16_lanes(t, static_cast<uint16_t*>(out) + r * n + i * L, i < NV - 1 ? L : last);
        continue;
      }
#else
      static_assert(!Bf16);
#endif
      float* dst = y + r * n + i * L;
      if (i < NV - 1 || last == L) {
        if (stream && reinterpret_cast<uintptr_t>(dst) % (L * sizeof(float)) == 0)
          t.stream(dst);
        else
          t.store(dst);
      } else {
        t.store(dst, last);
      }
    }
  }
  if (stream) stream_fence();
}

}  // namespace

#if defined(PTO_ISA_AVX512)
constexpr int kShortNormVectors = 8;
#else
constexpr int kShortNormVectors = 4;
#endif

int short_norm_vectors() {
  return kShortNormVectors;
}

void layer_norm_rows_short(const float* x, void* y, bool bf16, int64_t rows, int64_t n, float eps,
                           const float* scale, const float* bias, float* mean, float* inv_std,
                           bool stream) {
  constexpr int64_t L = Vec::kLanes;
  const int nv = static_cast<int>((n + L - 1) / L), last = static_cast<int>(n - (nv - 1) * L);
  PTO_CHECK(nv >= 1 && nv <= kShortNormVectors)
      << "layer_norm_rows_short: rows of " << n << " floats are not short";
#if !defined(PTO_ISA_AVX512)
  PTO_CHECK(!bf16) << "layer_norm_rows_short: bf16 rows are AVX-512's only";
#endif
  auto run = [&]<int NV>() {
#if defined(PTO_ISA_AVX512)
    if (bf16)
      return layer_norm_short<NV, true>(x, y, rows, n, last, eps, scale, bias, mean, inv_std,
                                        stream);
#endif
    return layer_norm_short<NV, false>(x, y, rows, n, last, eps, scale, bias, mean, inv_std,
                                       stream);
  };
  // The kernel for nv vectors, one instance per count up to kShortNormVectors.
  [&]<int... N>(std::integer_sequence<int, N...>) {
    (void)((nv == N + 1 ? (run.template operator()<N + 1>(), true) : false) || ...);
  }
  (std::make_integer_sequence<int, kShortNormVectors>{});
}

namespace {

// The statistics a row's streamed outputs need: its shift, mean (from the shift) and 1 / std.
struct RowStats {
  Vec sh, m, inv;
};

// One pass of layer_norm_rows_streamed over the C rows at `cur` (consecutive rows of n floats):
// their sums of d and d^2 in block_sums2's order (blocks of 4096, pairs of vectors into two
// accumulators of each; n is a multiple of 2 vectors, so no tail), while the P rows at `prev`
// (consecutive too, normalized by `ps`) are written to `yprev` with streaming stores, scale and
// bias loaded once for all P of them; the C rows at `next` (or null) are prefetched into L2.
template <int C, int P>
void streamed_pass(const float* cur, int64_t n, const Vec* sh, float* s1, float* s2,
                   const float* prev, float* yprev, const RowStats* ps, const float* scale,
                   const float* bias, const float* next) {
  constexpr int64_t L = Vec::kLanes, kLineFloats = 16, kBlock = 4096;
  // Copies in registers: the streamed stores through float pointers may alias Vec memory, so the
  // loop would load these again after each store.
  RowStats st[P > 0 ? P : 1];
  Vec shc[C > 0 ? C : 1];
#pragma GCC unroll 2
  for (int p = 0; p < P; ++p) st[p] = ps[p];
#pragma GCC unroll 2
  for (int i = 0; i < C; ++i) shc[i] = sh[i];
  auto out = [&](int64_t k) {
    const Vec g = Vec::load(scale + k), b = bias ? Vec::load(bias + k) : Vec::zero();
#pragma GCC unroll 2
    for (int p = 0; p < P; ++p) {
      const Vec t = (Vec::load(prev + p * n + k) - st[p].sh - st[p].m) * st[p].inv;
      fma(t, g, b).stream(yprev + p * n + k);
    }
  };
  if constexpr (C == 0) {
    if constexpr (P > 0)
      for (int64_t j = 0; j < n; j += L) out(j);
    return;
  } else {
    Vec t1[C], t2[C];
#pragma GCC unroll 2
    for (int i = 0; i < C; ++i) t1[i] = t2[i] = Vec::zero();
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = b + kBlock < n ? b + kBlock : n;
      Vec a0[C], a1[C], q0[C], q1[C];
#pragma GCC unroll 2
      for (int i = 0; i < C; ++i) a0[i] = a1[i] = q0[i] = q1[i] = Vec::zero();
      for (int64_t j = b; j < e; j += 2 * L) {
        if (next)
#pragma GCC unroll 2
          for (int i = 0; i < C; ++i)
            for (int64_t k = 0; k < 2 * L; k += kLineFloats)
              __builtin_prefetch(next + i * n + j + k, 0, 2);
        if constexpr (P > 0) {
          out(j);
          out(j + L);
        }
#pragma GCC unroll 2
        for (int i = 0; i < C; ++i) {
          const Vec d0 = Vec::load(cur + i * n + j) - shc[i],
                    d1 = Vec::load(cur + i * n + j + L) - shc[i];
          a0[i] = a0[i] + d0;
          a1[i] = a1[i] + d1;
          q0[i] = fma(d0, d0, q0[i]);
          q1[i] = fma(d1, d1, q1[i]);
        }
      }
#pragma GCC unroll 2
      for (int i = 0; i < C; ++i) {
        t1[i] = t1[i] + (a0[i] + a1[i]);
        t2[i] = t2[i] + (q0[i] + q1[i]);
      }
    }
#pragma GCC unroll 2
    for (int i = 0; i < C; ++i) {
      s1[i] = reduce_add(t1[i]);
      s2[i] = reduce_add(t2[i]);
    }
  }
}

// streamed_pass<C, P> by [C][P] (<0, 0> does nothing).
using StreamedPass = void (*)(const float*, int64_t, const Vec*, float*, float*, const float*,
                              float*, const RowStats*, const float*, const float*, const float*);
constexpr StreamedPass kStreamedPass[3][3] = {
    {streamed_pass<0, 0>, streamed_pass<0, 1>, streamed_pass<0, 2>},
    {streamed_pass<1, 0>, streamed_pass<1, 1>, streamed_pass<1, 2>},
    {streamed_pass<2, 0>, streamed_pass<2, 1>, streamed_pass<2, 2>}};

}  // namespace

// Each pass sums up to two rows while the two before them stream out (streamed_pass): a row's
// outputs drain while later rows' sums compute, instead of in a burst of their own (Softmax's
// softmax_rows_fused does the same), and scale and bias are loaded once for two output rows.
// With one row a pass each output vector took four line loads (the row summed, the row written,
// scale, bias; with scale and bias two 16 KiB rows overflow the 32 KiB L1, so all four came from
// L2); two a pass take three. Rows of 4096 at 4x L3, 1 thread, Zen 4, the two alternated in one
// process (load 2.6): 25.2 -> 28.9 GB/s (1.15x), rows of 8192 24.4 -> 29.5 (1.21x), the run's
// copy_nt ceiling 30.3.
void layer_norm_rows_streamed(const float* x, float* y, int64_t rows, int64_t n, float eps,
                              const float* scale, const float* bias, float* mean_out,
                              float* inv_out, bool prefetch) {
  constexpr int64_t kPerPass = 2;
  RowStats ps[2];
  int np = 0;  // rows pending output: [r - np, r)
  for (int64_t r = 0; r < rows;) {
    const int nc = static_cast<int>(rows - r < kPerPass ? rows - r : kPerPass);
    const float* cur = x + r * n;
    const int64_t after = r + nc < rows ? rows - r - nc : 0;  // rows after this pass's
    const float* next = prefetch && after >= nc ? cur + nc * n : nullptr;
    Vec sh[2];
    float c[2], s1[2], s2[2];
    for (int i = 0; i < nc; ++i) sh[i] = Vec::set1(c[i] = row_shift(cur + i * n, n));
    const float* prev = cur - np * n;
    float* yprev = y + (r - np) * n;
    kStreamedPass[nc][np](cur, n, sh, s1, s2, prev, yprev, ps, scale, bias, next);
    for (int i = 0; i < nc; ++i) {
      const float m = s1[i] / static_cast<float>(n);
      const float var = variance(cur + i * n, n, sh[i], m, s2[i]);
      mean_out[r + i] = c[i] + m;
      inv_out[r + i] = 1.0f / std::sqrt(var + eps);
      ps[i] = {sh[i], Vec::set1(m), Vec::set1(inv_out[r + i])};
    }
    np = nc;
    r += nc;
  }
  kStreamedPass[0][np](nullptr, n, nullptr, nullptr, nullptr, x + (rows - np) * n,
                       y + (rows - np) * n, ps, scale, bias, nullptr);
  stream_fence();
}

}  // namespace pto::cpu::PTO_ISA_NS
