// FFT plans (fft.h): the factorization of the length into radices and every table the transform
// reads, computed in double from cos and sin of exact fractions of a turn and rounded to float
// once, so no twiddle carries more than half an ulp of error.
#include <cmath>
#include <complex>
#include <numbers>
#include <utility>

#include "backend/cpu/fft.h"
#include "pto/error.h"
#include "pto/tensor.h"

namespace pto::cpu {
namespace {

using Complex = std::complex<double>;

// exp(-2 pi i j / n), j < n.
Complex root(int64_t j, int64_t n) {
  const double phase = -2.0 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
  return {std::cos(phase), std::sin(phase)};
}

void push(std::vector<float>& v, Complex z) {
  v.push_back(static_cast<float>(z.real()));
  v.push_back(static_cast<float>(z.imag()));
}

// The radices of n, largest power of 4 first, or an empty list when a prime factor is above
// kMaxRadix.
std::vector<int> radices(int64_t n) {
  std::vector<int> out;
  for (int p : {4, 2, 3, 5, 7, 11, 13})
    while (n % p == 0) {
      out.push_back(p);
      n /= p;
    }
  return n == 1 ? out : std::vector<int>{};
}

// The forward DFT of a power-of-two length in double (iterative radix 2), for Bluestein's kernel.
void fft_double(std::vector<Complex>& a) {
  const auto m = static_cast<int64_t>(a.size());
  for (int64_t i = 1, j = 0; i < m; ++i) {
    int64_t bit = m >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  std::vector<Complex> w(static_cast<size_t>(m / 2));
  for (int64_t j = 0; j < m / 2; ++j) w[j] = root(j, m);
  for (int64_t len = 2; len <= m; len *= 2)
    for (int64_t i = 0; i < m; i += len)
      for (int64_t j = 0; j < len / 2; ++j) {
        const Complex u = a[i + j], v = a[i + j + len / 2] * w[j * (m / len)];
        a[i + j] = u + v;
        a[i + j + len / 2] = u - v;
      }
}

}  // namespace

std::shared_ptr<const FftPlan> make_fft_plan(int64_t n) {
  // The tables (Bluestein's: a few complex values per point of the power of two past 2n) must
  // fit where a tensor would: a dft_length of 2^31 was a bad_alloc at compile time.
  if (n > static_cast<int64_t>(max_tensor_bytes() / 32))
    throw ValueError(cat("a DFT of ", n, " points needs tables larger than a tensor may be (",
                         max_tensor_bytes(), " bytes)"));
  auto plan = std::make_shared<FftPlan>();
  plan->n = n;
  std::vector<float>& tables = plan->tables;
  const std::vector<int> rs = radices(n);
  if (n == 1 || !rs.empty()) {
    // Each stage's tables as offsets while `tables` grows, pointers once it is whole.
    std::vector<std::pair<size_t, size_t>> offsets;
    int64_t l = 1;
    for (int p : rs) {
      FftStage s;
      s.radix = p;
      s.l = l;
      s.m = n / (l * p);
      const size_t twiddles = tables.size();
      for (int64_t k = 0; k < l; ++k)
        for (int v = 1; v < p; ++v) push(tables, root(v * k, l * p));
      const size_t roots = tables.size();
      for (int j = 0; j < p; ++j) push(tables, root(j, p));
      offsets.emplace_back(twiddles, roots);
      plan->stage_list.push_back(s);
      l *= p;
    }
    for (size_t i = 0; i < offsets.size(); ++i) {
      plan->stage_list[i].twiddles = tables.data() + offsets[i].first;
      plan->stage_list[i].roots = tables.data() + offsets[i].second;
    }
    plan->stages = plan->stage_list.data();
    plan->num_stages = static_cast<int64_t>(plan->stage_list.size());
    return plan;
  }
  // Bluestein. t^2 mod 2n by differences: (t + 1)^2 = t^2 + 2 t + 1.
  int64_t m = 1;
  while (m < 2 * n - 1) m *= 2;
  plan->m = m;
  std::vector<Complex> chirp(static_cast<size_t>(n));
  for (int64_t t = 0, sq = 0; t < n; ++t) {
    chirp[t] = root(sq, 2 * n);  // exp(-pi i t^2 / n)
    push(tables, chirp[t]);
    sq = (sq + 2 * t + 1) % (2 * n);
  }
  std::vector<Complex> b(static_cast<size_t>(m));
  for (int64_t j = 0; j < n; ++j) b[j] = std::conj(chirp[j]);
  for (int64_t j = 1; j < n; ++j) b[m - j] = std::conj(chirp[j]);
  fft_double(b);
  for (const Complex& z : b) push(tables, z / static_cast<double>(m));
  plan->chirp = tables.data();
  plan->kernel = tables.data() + 2 * n;
  plan->sub_plan = make_fft_plan(m);
  plan->sub = plan->sub_plan.get();
  return plan;
}

FftKernel fft_kernel(const FftPlan& plan) {
  const int64_t bytes_per_lane = 3 * plan.work_points() * 2 * int64_t{sizeof(float)};
  Isa isa = active_isa();
  if (isa == Isa::kAvx512 && bytes_per_lane * avx512::fft_vector_lanes() > kMaxLaneBytes)
    isa = Isa::kGeneric;
  if (isa == Isa::kAvx2 && bytes_per_lane * avx2::fft_vector_lanes() > kMaxLaneBytes)
    isa = Isa::kGeneric;
  switch (isa) {
    case Isa::kAvx512:
      return {avx512::fft_run, avx512::fft_vector_lanes()};
    case Isa::kAvx2:
      return {avx2::fft_run, avx2::fft_vector_lanes()};
    default:
      return {generic::fft_run, generic::fft_vector_lanes()};
  }
}

}  // namespace pto::cpu
