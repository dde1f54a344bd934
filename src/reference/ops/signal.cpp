// Reference kernels for the signal family's transforms, DFT and STFT, and for Det. The windows
// and MelWeightMatrix are in signal_window.cpp. Transforms are the plain O(n^2) sums in double,
// with twiddles indexed by (k * t) mod n so no phase is computed from a large product.
#include <cmath>
#include <complex>
#include <numbers>

#include "index_math.h"

namespace pto::reference {

void register_signal_window_kernels(KernelRegistry& r);  // signal_window.cpp

namespace {

using Complex = std::complex<double>;

// exp(-2 pi i j / n) for j in [0, n): the forward twiddles of an n-point transform.
std::vector<Complex> twiddles(int64_t n) {
  std::vector<Complex> tw(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    const double phase = -2.0 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
    tw[j] = Complex(std::cos(phase), std::sin(phase));
  }
  return tw;
}

// out[k] = sum_{t < in.size()} in[t] * tw[(k t) mod n] for k < out.size(); conj(tw) when inverse.
void transform(const std::vector<Complex>& in, const std::vector<Complex>& tw, bool inverse,
               std::vector<Complex>& out) {
  const int64_t n = static_cast<int64_t>(tw.size());
  for (size_t k = 0; k < out.size(); ++k) {
    Complex acc = 0;
    int64_t j = 0;  // (k * t) mod n, advanced by k each step
    const int64_t step = static_cast<int64_t>(k) % n;
    for (const Complex& v : in) {
      acc += v * (inverse ? std::conj(tw[j]) : tw[j]);
      j += step;
      if (j >= n) j -= n;
    }
    out[k] = acc;
  }
}

// The single integer of a scalar (or one-element) integer input.
int64_t scalar_input(const KernelContext& c, size_t i, const char* what) {
  return scalar_int(c.input(i), c.where(), what);
}

// DFT along `axis` (an attribute before opset 20, an input from 20 on) of a real [..., 1] or
// complex [..., 2] input. dft_length zero-pads or truncates the axis. onesided keeps the
// n / 2 + 1 non-redundant bins of a forward transform; an inverse one-sided transform reads such
// bins and returns the real signal ([..., 1], numpy's irfft). Inverses are scaled by 1 / n.
std::vector<Tensor> dft(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  if (x.rank() < 2 || (x.dim(-1) != 1 && x.dim(-1) != 2))
    throw ValueError(
        cat(w, ": input must be [..., n, 1] (real) or [..., n, 2] (complex), got ", x.str()));
  const bool inverse = c.attrs().get_int("inverse", 0) != 0;
  const bool onesided = c.attrs().get_int("onesided", 0) != 0;
  int64_t axis;
  if (c.node.opset != 0 && c.node.opset < 20)
    axis = c.attrs().get_int("axis", 1);
  else
    axis = c.has_input(2) ? scalar_input(c, 2, "axis") : -2;
  const int64_t rank = x.rank();
  axis = normalize_axis(axis, rank, w);
  if (axis == rank - 1) throw ValueError(cat(w, ": axis cannot be the last (complex) axis"));
  const int64_t n = x.dim(axis);
  int64_t length = inverse && onesided ? 2 * (n - 1) : n;
  if (c.has_input(1)) length = scalar_input(c, 1, "dft_length");
  if (length < 1) throw ValueError(cat(w, ": dft_length must be >= 1, got ", length));
  const bool real_out = inverse && onesided;
  const int64_t out_len = real_out || inverse || !onesided ? length : length / 2 + 1;
  Dims out_shape = x.shape();
  out_shape[axis] = out_len;
  out_shape.back() = real_out ? 1 : 2;
  const int64_t outer = dims_product(x.shape(), 0, axis);
  const int64_t inner = dims_product(x.shape(), axis + 1, rank - 1);
  const int64_t cin = x.dim(-1), cout = out_shape.back();
  std::vector<double> out(static_cast<size_t>(checked_numel(out_shape, "DFT output")));
  if (out.empty()) return {from_doubles(x.dtype(), out_shape, out, w)};
  if (!is_floating(x.dtype())) throw TypeError(cat(w, ": input must be a float tensor"));
  const std::vector<double> in = to_doubles(x, w);
  const std::vector<Complex> tw = twiddles(length);
  const double scale = inverse ? 1.0 / static_cast<double>(length) : 1.0;
  // The inverse one-sided input: bins [0, length / 2] are used, the rest follow by symmetry.
  const int64_t used = real_out ? std::min(n, length / 2 + 1) : std::min(n, length);
  std::vector<Complex> line, spectrum(static_cast<size_t>(out_len));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t t) { return ((o * n + t) * inner + i) * cin; };
      line.assign(static_cast<size_t>(used), 0);
      for (int64_t t = 0; t < used; ++t)
        line[t] = Complex(in[at(t)], cin == 2 ? in[at(t) + 1] : 0.0);
      if (real_out) {
        // Hermitian extension, ignoring the imaginary parts of bin 0 and (even length) bin n/2.
        std::vector<Complex> full(static_cast<size_t>(length), 0);
        for (int64_t k = 0; k < used; ++k) {
          full[k] = line[k];
          if (k > 0 && length - k != k) full[length - k] = std::conj(line[k]);
        }
        full[0] = full[0].real();
        if (length % 2 == 0 && length / 2 < used) full[length / 2] = full[length / 2].real();
        line.swap(full);
      }
      transform(line, tw, inverse, spectrum);
      for (int64_t k = 0; k < out_len; ++k) {
        const int64_t dst = ((o * out_len + k) * inner + i) * cout;
        out[dst] = spectrum[k].real() * scale;
        if (cout == 2) out[dst + 1] = spectrum[k].imag() * scale;
      }
    }
  return {from_doubles(x.dtype(), out_shape, out, w)};
}

// STFT: frame f of the [batch, length, 1 | 2] signal starts at f * frame_step and holds
// frame_length samples, multiplied by the window (all ones when absent), then transformed.
// Output [batch, frames, bins, 2], bins = frame_length / 2 + 1 when onesided (the default).
std::vector<Tensor> stft(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  if (x.rank() != 3 || (x.dim(2) != 1 && x.dim(2) != 2))
    throw ValueError(cat(w, ": signal must be [batch, length, 1 | 2], got ", x.str()));
  if (!is_floating(x.dtype())) throw TypeError(cat(w, ": signal must be a float tensor"));
  const int64_t step = scalar_input(c, 1, "frame_step");
  if (step < 1) throw ValueError(cat(w, ": frame_step must be >= 1, got ", step));
  const bool has_window = c.has_input(2);
  if (has_window && (c.input(2).rank() != 1 || c.input(2).dtype() != x.dtype()))
    throw ValueError(cat(w, ": window must be 1-D of the signal's dtype, got ", c.input(2).str()));
  const int64_t length = x.dim(1);
  int64_t frame = has_window ? c.input(2).dim(0) : length;
  if (c.has_input(3)) {
    frame = scalar_input(c, 3, "frame_length");
    if (has_window && frame != c.input(2).dim(0))
      throw ValueError(cat(w, ": frame_length ", frame, " differs from the window's length ",
                           c.input(2).dim(0)));
  }
  if (frame < 1 || frame > length)
    throw ValueError(cat(w, ": frame_length ", frame, " must be in [1, ", length, "]"));
  const bool onesided = c.attrs().get_int("onesided", 1) != 0;
  const int64_t frames = 1 + (length - frame) / step;
  const int64_t bins = onesided ? frame / 2 + 1 : frame;
  const int64_t B = x.dim(0), cin = x.dim(2);
  const Dims out_shape{B, frames, bins, 2};
  std::vector<double> out(static_cast<size_t>(checked_numel(out_shape, "STFT output")));
  const std::vector<double> in = to_doubles(x, w);
  const std::vector<double> window =
      has_window ? to_doubles(c.input(2), w) : std::vector<double>(frame, 1.0);
  const std::vector<Complex> tw = twiddles(frame);
  std::vector<Complex> line(static_cast<size_t>(frame)), spectrum(static_cast<size_t>(bins));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t t = 0; t < frame; ++t) {
        const int64_t at = (b * length + f * step + t) * cin;
        line[t] = Complex(in[at], cin == 2 ? in[at + 1] : 0.0) * window[t];
      }
      transform(line, tw, false, spectrum);
      for (int64_t k = 0; k < bins; ++k) {
        const int64_t dst = ((b * frames + f) * bins + k) * 2;
        out[dst] = spectrum[k].real();
        out[dst + 1] = spectrum[k].imag();
      }
    }
  return {from_doubles(x.dtype(), out_shape, out, w)};
}

// Det: the determinant of each [M, M] matrix in the last two axes, by Gaussian elimination with
// partial pivoting in double. An empty (0 x 0) matrix has determinant 1.
std::vector<Tensor> det(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  if (x.rank() < 2 || x.dim(-1) != x.dim(-2))
    throw ValueError(cat(w, ": input must be [..., M, M], got ", x.str()));
  if (!is_floating(x.dtype())) throw TypeError(cat(w, ": input must be a float tensor"));
  const int64_t m = x.dim(-1);
  const Dims out_shape(x.shape().begin(), x.shape().end() - 2);
  const int64_t count = checked_numel(out_shape, "Det output");
  const std::vector<double> in = to_doubles(x, w);
  std::vector<double> out(static_cast<size_t>(count));
  std::vector<double> a(static_cast<size_t>(m * m));
  for (int64_t b = 0; b < count; ++b) {
    std::copy(in.begin() + b * m * m, in.begin() + (b + 1) * m * m, a.begin());
    double d = 1;
    for (int64_t col = 0; col < m; ++col) {
      int64_t pivot = col;
      for (int64_t r = col + 1; r < m; ++r)
        if (std::abs(a[r * m + col]) > std::abs(a[pivot * m + col])) pivot = r;
      if (a[pivot * m + col] == 0) {
        d = 0;
        break;
      }
      if (pivot != col) {
        for (int64_t k = 0; k < m; ++k) std::swap(a[pivot * m + k], a[col * m + k]);
        d = -d;
      }
      const double p = a[col * m + col];
      d *= p;
      for (int64_t r = col + 1; r < m; ++r) {
        const double f = a[r * m + col] / p;
        for (int64_t k = col; k < m; ++k) a[r * m + k] -= f * a[col * m + k];
      }
    }
    // A NaN anywhere makes the determinant NaN (a NaN pivot would not otherwise propagate).
    for (int64_t k = 0; k < m * m; ++k)
      if (std::isnan(in[b * m * m + k])) d = std::numeric_limits<double>::quiet_NaN();
    out[b] = d;
  }
  return {from_doubles(x.dtype(), out_shape, out, w)};
}

}  // namespace

void register_signal_kernels(KernelRegistry& r) {
  r.add("DFT", dft);
  r.add("STFT", stft);
  r.add("Det", det);
  register_signal_window_kernels(r);
}

}  // namespace pto::reference
