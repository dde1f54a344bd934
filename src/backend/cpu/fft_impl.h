// The FFT of fft.h for one ISA (fft_{avx512,avx2,generic}.cpp): every butterfly works on vectors
// of W lines at once (W = Vec::kLanes), so a batch of transforms is vectorized across the batch
// and each line's arithmetic is the scalar algorithm's.
#include "backend/cpu/fft.h"
#include "backend/cpu/isa/simd.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

constexpr int64_t W = Vec::kLanes;

// Point t of a buffer: W real parts, then W imaginary parts.
struct Cx {
  Vec re, im;
};

inline Cx load(const float* p, int64_t t) {
  return {Vec::load(p + 2 * W * t), Vec::load(p + 2 * W * t + W)};
}
inline void store(float* p, int64_t t, Cx v) {
  v.re.store(p + 2 * W * t);
  v.im.store(p + 2 * W * t + W);
}
inline Cx operator+(Cx a, Cx b) {
  return {a.re + b.re, a.im + b.im};
}
inline Cx operator-(Cx a, Cx b) {
  return {a.re - b.re, a.im - b.im};
}
// a * (wr + i wi), the constant's parts broadcast.
inline Cx mul(Cx a, const float* w) {
  const Vec wr = Vec::set1(w[0]), wi = Vec::set1(w[1]), nwi = Vec::set1(-w[1]);
  return {fma(a.re, wr, a.im * nwi), fma(a.re, wi, a.im * wr)};
}
inline Cx conj(Cx a) {
  return {a.re, Vec::zero() - a.im};
}

// The p points of butterfly (k, r) of a stage, src[(k p + v) m + r] for v < p, times their
// twiddles w_{l p}^(v k) (all ones when k = 0).
inline void load_points(const FftStage& s, const float* src, int64_t k, int64_t r, int p, Cx* a) {
  const float* tw = s.twiddles + k * (p - 1) * 2;
  for (int v = 0; v < p; ++v) {
    a[v] = load(src, (k * p + v) * s.m + r);
    if (v > 0 && k > 0) a[v] = mul(a[v], tw + (v - 1) * 2);
  }
}

// One Stockham stage: for k < l and r < m, the radix points src[(k p + v) m + r] (v < p), times
// w_{l p}^(v k), go through a p-point DFT to dst[(k + l q) m + r] (q < p).
template <int P>
void stage_fixed(const FftStage& s, const float* src, float* dst) {
  const int64_t l = s.l, m = s.m;
  for (int64_t k = 0; k < l; ++k) {
    for (int64_t r = 0; r < m; ++r) {
      Cx a[P];
      load_points(s, src, k, r, P, a);
      Cx b[P];
      if constexpr (P == 2) {
        b[0] = a[0] + a[1];
        b[1] = a[0] - a[1];
      } else if constexpr (P == 3) {
        // w_3 = -1/2 - i sqrt(3)/2: b1,2 = a0 - (a1 + a2) / 2 -+ i sqrt(3)/2 (a1 - a2).
        const Vec half = Vec::set1(0.5f), h = Vec::set1(0.86602540378443864676f);
        const Cx sum = a[1] + a[2], diff = a[1] - a[2];
        b[0] = a[0] + sum;
        const Cx mid{a[0].re - half * sum.re, a[0].im - half * sum.im};
        b[1] = {fma(h, diff.im, mid.re), mid.im - h * diff.re};
        b[2] = {mid.re - h * diff.im, fma(h, diff.re, mid.im)};
      } else {  // P == 4, w_4 = -i
        const Cx t0 = a[0] + a[2], t1 = a[0] - a[2], t2 = a[1] + a[3], t3 = a[1] - a[3];
        b[0] = t0 + t2;
        b[2] = t0 - t2;
        b[1] = {t1.re + t3.im, t1.im - t3.re};
        b[3] = {t1.re - t3.im, t1.im + t3.re};
      }
      for (int q = 0; q < P; ++q) store(dst, (k + l * q) * m + r, b[q]);
    }
  }
}

// The same for a radix up to kMaxRadix (5, 7, 11, 13) by the direct p-point sum.
void stage_direct(const FftStage& s, const float* src, float* dst) {
  const int64_t l = s.l, m = s.m;
  const int p = s.radix;
  for (int64_t k = 0; k < l; ++k) {
    for (int64_t r = 0; r < m; ++r) {
      Cx a[kMaxRadix];
      load_points(s, src, k, r, p, a);
      for (int q = 0; q < p; ++q) {
        Cx acc = a[0];
        for (int v = 1, j = q; v < p; ++v, j = (j + q) % p) acc = acc + mul(a[v], s.roots + j * 2);
        store(dst, (k + l * q) * m + r, acc);
      }
    }
  }
}

float* stockham(const FftPlan& plan, float* a, float* b) {
  for (int64_t i = 0; i < plan.num_stages; ++i) {
    const FftStage& s = plan.stages[i];
    switch (s.radix) {
      case 2:
        stage_fixed<2>(s, a, b);
        break;
      case 3:
        stage_fixed<3>(s, a, b);
        break;
      case 4:
        stage_fixed<4>(s, a, b);
        break;
      default:
        stage_direct(s, a, b);
    }
    float* const done = b;  // the stage wrote b: it is the next stage's input
    b = a;
    a = done;
  }
  return a;
}

// X[k] = chirp[k] sum_t (x[t] chirp[t]) conj(chirp[k - t]): the sum a circular convolution,
// done as conj(FFT(conj(FFT(x chirp) * kernel))) (the kernel holds the 1 / m).
float* bluestein(const FftPlan& plan, float* x, float* p, float* q) {
  const int64_t n = plan.n, m = plan.m;
  for (int64_t t = 0; t < n; ++t) store(p, t, mul(load(x, t), plan.chirp + t * 2));
  for (int64_t t = n; t < m; ++t) store(p, t, {Vec::zero(), Vec::zero()});
  float* r = stockham(*plan.sub, p, q);
  for (int64_t k = 0; k < m; ++k) store(r, k, conj(mul(load(r, k), plan.kernel + k * 2)));
  float* s = stockham(*plan.sub, r, r == p ? q : p);
  for (int64_t k = 0; k < n; ++k) store(x, k, mul(conj(load(s, k)), plan.chirp + k * 2));
  return x;
}

}  // namespace

float* fft_run(const FftPlan& plan, float* a, float* b, float* c) {
  return plan.m > 0 ? bluestein(plan, a, b, c) : stockham(plan, a, b);
}

int fft_vector_lanes() {
  return static_cast<int>(W);
}

}  // namespace pto::cpu::PTO_ISA_NS
