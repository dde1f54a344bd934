// Reference kernels for the signal family's generators: the Hann, Hamming and Blackman windows
// and MelWeightMatrix. Values are computed in double and cast to output_datatype (default f32).
#include <cmath>
#include <functional>
#include <numbers>

#include "index_math.h"
#include "output_buffer.h"

namespace pto::reference {
namespace {

DType output_dtype(const KernelContext& c) {
  return dtype_from_onnx_code(c.node.attr_int("output_datatype"), c.where());
}

Tensor cast_doubles(DType dt, Dims shape, const std::vector<double>& v, const std::string& w) {
  Tensor t = Tensor::empty(dt, std::move(shape));
  dispatch(dt, kNumericTypes, w, [&]<class T>() {
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = saturate_cast<T>(v[i]);
  });
  return t;
}

// A window of `size` points: f(n, N) with N = size (periodic, the default) or size - 1
// (symmetric). A one-point symmetric window is [1], as in scipy and PyTorch.
Kernel window_kernel(std::function<double(double n, double N)> f) {
  return [f](const KernelContext& c) {
    const std::string w = c.where();
    const int64_t size = scalar_int(c.input(0), w, "size");
    if (size < 0) throw ValueError(cat(w, ": size must be >= 0, got ", size));
    const bool periodic = c.node.attr_int("periodic") != 0;
    const double N = static_cast<double>(periodic ? size : size - 1);
    std::vector<double> v = output_buffer({size}, w);
    for (int64_t n = 0; n < size; ++n) v[n] = N == 0 ? 1.0 : f(static_cast<double>(n), N);
    return std::vector<Tensor>{cast_doubles(output_dtype(c), {size}, v, w)};
  };
}

// Python's float floor division a // b (numpy's npy_floor_divide), which MelWeightMatrix's
// reference uses; it can differ from floor(a / b) when a / b rounds up to an integer.
double floor_divide(double a, double b) {
  double mod = std::fmod(a, b);
  double div = (a - mod) / b;
  if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double floor_div = std::floor(div);
  if (div - floor_div > 0.5) floor_div += 1.0;
  return floor_div;
}

// MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins] triangular filters. num_mel_bins + 2 edge
// frequencies are spaced evenly in mel between the edges (the step divides by num_mel_bins + 2,
// as the ONNX reference does) and mapped to spectrogram bins; filter i rises from edge i to edge
// i + 1 and falls to edge i + 2. Bins past the spectrogram are dropped.
std::vector<Tensor> mel_weight_matrix(const KernelContext& c) {
  const std::string w = c.where();
  const int64_t mels = scalar_int(c.input(0), w, "num_mel_bins");
  const int64_t dft_length = scalar_int(c.input(1), w, "dft_length");
  const int64_t rate = scalar_int(c.input(2), w, "sample_rate");
  if (mels < 0 || dft_length < 1 || rate < 1)
    throw ValueError(cat(w, ": need num_mel_bins >= 0, dft_length >= 1 and sample_rate >= 1"));
  for (size_t i : {3, 4})
    if (!is_floating(c.input(i).dtype()) || c.input(i).numel() != 1)
      throw TypeError(cat(w, ": the edge frequencies must be float scalars"));
  // log1p in the edges' precision, as the reference computes it.
  auto to_mel = [&](size_t i) {
    return dispatch(c.input(i).dtype(), kFloatTypes, w, [&]<class T>() {
      using F = compute_t<T>;
      const F hz = static_cast<F>(c.input(i).data<T>()[0]);
      return 2595.0 * static_cast<double>(std::log1p(hz / F(700))) / std::log(10.0);
    });
  };
  const double low = to_mel(3), high = to_mel(4);
  const int64_t bins = dft_length / 2 + 1;
  const Dims shape{bins, mels};
  std::vector<double> out = output_buffer(shape, w);
  const double step = (high - low) / static_cast<double>(mels + 2);
  std::vector<int64_t> edge = bounded_buffer<int64_t>(mels + 2, w, "num_mel_bins");
  for (int64_t i = 0; i < mels + 2; ++i) {
    const double mel = static_cast<double>(i) * step + low;
    const double hz = 700 * std::expm1(mel / 2595 * std::log(10.0));
    const double b =
        floor_divide(static_cast<double>(dft_length + 1) * hz, static_cast<double>(rate));
    if (!(std::abs(b) < 1e15)) throw ValueError(cat(w, ": the edge frequencies are out of range"));
    edge[i] = static_cast<int64_t>(b);
  }
  auto set = [&](int64_t j, int64_t i, double v) {
    if (j >= 0 && j < bins) out[j * mels + i] = v;
  };
  // Loops run over the bins that exist only; the slopes still use the unclipped edges.
  auto first = [&](int64_t j) { return std::max<int64_t>(j, 0); };
  auto last = [&](int64_t j) { return std::min<int64_t>(j, bins); };  // exclusive
  for (int64_t i = 0; i < mels; ++i) {
    const int64_t lo = edge[i], mid = edge[i + 1], hi = edge[i + 2];
    if (mid == lo)
      set(mid, i, 1.0);
    else
      for (int64_t j = first(lo); j < last(mid + 1); ++j)
        set(j, i, static_cast<double>(j - lo) / static_cast<double>(mid - lo));
    if (hi > mid)
      for (int64_t j = first(mid); j < last(hi); ++j)
        set(j, i, static_cast<double>(hi - j) / static_cast<double>(hi - mid));
  }
  return {cast_doubles(output_dtype(c), shape, out, w)};
}

}  // namespace

void register_signal_window_kernels(KernelRegistry& r) {
  constexpr double pi = std::numbers::pi;
  r.add("HannWindow", window_kernel([](double n, double N) {
          const double s = std::sin(pi * n / N);
          return s * s;
        }));
  r.add("HammingWindow", window_kernel([](double n, double N) {
          return 25.0 / 46.0 - 21.0 / 46.0 * std::cos(2 * pi * n / N);
        }));
  r.add("BlackmanWindow", window_kernel([](double n, double N) {
          // Summed in the reference's order, so integer outputs truncate the same 1.0.
          return -0.5 * std::cos(2 * pi * n / N) + 0.08 * std::cos(4 * pi * n / N) + 0.42;
        }));
  r.add("MelWeightMatrix", mel_weight_matrix);
}

}  // namespace pto::reference
