// Mean/variance and the normalizing affine maps for one ISA (included by norm_avx512.cpp,
// norm_avx2.cpp, norm_generic.cpp). Statistics are taken of x - x[0], exact for data clustered
// far from 0, and the mean is kept as that shift plus a small float so (x - shift) - mean loses
// nothing to the mean's rounding; variance takes a second pass over the centred values, as the
// reference does, rather than E[x^2] - E[x]^2, which cancels when the mean is large.
#pragma once

#include <cmath>

#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/reduce_simd.h"

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

void moments(const float* x, int64_t n, float* shift, float* mean, float* var) {
  const float x0 = x[0];
  const Vec sh = Vec::set1(x0);
  const float m = block_sum(x, n, [&](Vec v) { return v - sh; }) / static_cast<float>(n);
  const Vec mv = Vec::set1(m);
  const float q = block_sum(x, n, [&](Vec v) {
    const Vec d = v - sh - mv;
    return d * d;
  });
  *shift = x0;
  *mean = m;
  *var = q / static_cast<float>(n);
}

float mean_square(const float* x, int64_t n) {
  return block_sum(x, n, [](Vec v) { return v * v; }) / static_cast<float>(n);
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

// layer_norm_rows_short for rows of NV vectors (the last one `last` lanes wide).
template <int NV>
void layer_norm_short(const float* x, float* y, int64_t rows, int64_t n, int last, float eps,
                      const float* scale, const float* bias, float* mean, float* inv_std,
                      bool stream) {
  constexpr int64_t L = Vec::kLanes;
  const Mask tail = first_lanes(last);
  auto load = [&](const float* p, int i) {
    return i < NV - 1 ? Vec::load(p + i * L) : Vec::load(p + i * L, last);
  };
  Vec g[NV], b[NV];
#pragma GCC unroll 4
  for (int i = 0; i < NV; ++i) {
    g[i] = load(scale, i);
    b[i] = bias ? load(bias, i) : Vec::zero();
  }
  const auto count = static_cast<float>(n);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    Vec v[NV];
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) v[i] = load(xr, i);
    const Vec sh = Vec::set1(xr[0]);
    Vec s = Vec::zero();
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i)
      s = s + (i < NV - 1 ? v[i] - sh : select(tail, v[i] - sh, Vec::zero()));
    const float m = sum_lanes(s) / count;
    const Vec mv = Vec::set1(m);
    Vec q = Vec::zero();
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) {
      const Vec d = v[i] - sh - mv;
      q = q + (i < NV - 1 ? d * d : select(tail, d * d, Vec::zero()));
    }
    const float inv = 1.0f / std::sqrt(sum_lanes(q) / count + eps);
    mean[r] = xr[0] + m;
    inv_std[r] = inv;
    const Vec iv = Vec::set1(inv);
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) {
      const Vec t = fma((v[i] - sh - mv) * iv, g[i], b[i]);
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

void layer_norm_rows_short(const float* x, float* y, int64_t rows, int64_t n, float eps,
                           const float* scale, const float* bias, float* mean, float* inv_std,
                           bool stream) {
  constexpr int64_t L = Vec::kLanes;
  const int nv = static_cast<int>((n + L - 1) / L), last = static_cast<int>(n - (nv - 1) * L);
  switch (nv) {
    case 1:
      return layer_norm_short<1>(x, y, rows, n, last, eps, scale, bias, mean, inv_std, stream);
    case 2:
      return layer_norm_short<2>(x, y, rows, n, last, eps, scale, bias, mean, inv_std, stream);
    case 3:
      return layer_norm_short<3>(x, y, rows, n, last, eps, scale, bias, mean, inv_std, stream);
    default:
      return layer_norm_short<4>(x, y, rows, n, last, eps, scale, bias, mean, inv_std, stream);
  }
}

// The streamed output vectors of a row drain while the next row's variance computes, instead of
// in a burst of their own (Softmax's softmax_rows_pipelined does the same).
void layer_norm_rows_streamed(const float* x, float* y, int64_t rows, int64_t n, float eps,
                              const float* scale, const float* bias, float* mean_out,
                              float* inv_out, bool prefetch) {
  constexpr int64_t L = Vec::kLanes, kBlock = 4096, kLineFloats = 16;
  // The previous row's shift, mean and 1 / std, and one output vector of it at k.
  Vec psh = Vec::zero(), pm = Vec::zero(), pinv = Vec::zero();
  auto out = [&](const float* xp, float* yp, int64_t k) {
    const Vec t = (Vec::load(xp + k) - psh - pm) * pinv;
    const Vec b = bias ? Vec::load(bias + k) : Vec::zero();
    fma(t, Vec::load(scale + k), b).stream(yp + k);
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    const float* next = prefetch && r + 1 < rows ? xr + n : nullptr;
    const float x0 = xr[0];
    const Vec sh = Vec::set1(x0);
    const float m = block_sum(xr, n, [&](Vec v) { return v - sh; }) / static_cast<float>(n);
    const Vec mv = Vec::set1(m);
    // block_sum of (x - shift - mean)^2 (n a multiple of 2 vectors: no tail), row r - 1 out.
    Vec total = Vec::zero();
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = b + kBlock < n ? b + kBlock : n;
      Vec s0 = Vec::zero(), s1 = Vec::zero();
      for (int64_t j = b; j < e; j += 2 * L) {
        if (next)
          for (int64_t k = 0; k < 2 * L; k += kLineFloats) __builtin_prefetch(next + j + k, 0, 2);
        const Vec d0 = Vec::load(xr + j) - sh - mv, d1 = Vec::load(xr + j + L) - sh - mv;
        s0 = s0 + d0 * d0;
        s1 = s1 + d1 * d1;
        if (r > 0) {
          out(xr - n, y + (r - 1) * n, j);
          out(xr - n, y + (r - 1) * n, j + L);
        }
      }
      total = total + (s0 + s1);
    }
    const float var = sum_lanes(total) / static_cast<float>(n);
    mean_out[r] = x0 + m;
    inv_out[r] = 1.0f / std::sqrt(var + eps);
    psh = sh, pm = mv, pinv = Vec::set1(inv_out[r]);
  }
  if (rows > 0)
    for (int64_t j = 0; j < n; j += L) out(x + (rows - 1) * n, y + (rows - 1) * n, j);
  stream_fence();
}

}  // namespace pto::cpu::PTO_ISA_NS
