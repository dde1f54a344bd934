// Reference kernels for the signal family's transforms, DFT and STFT, and for Det. The windows
// and MelWeightMatrix are in signal_window.cpp. Transforms run in double.
#include <cmath>
#include <complex>
#include <numbers>

#include "index_math.h"
#include "output_buffer.h"
#include "signal_plan.h"

namespace pto::reference {

void register_signal_window_kernels(KernelRegistry& r);  // signal_window.cpp

namespace {

using Complex = std::complex<double>;

// An n-point DFT, out[k] = sum_t in[t] w^(k t) with w = exp(-+2 pi i / n), by recursive
// decimation in time over the smallest prime factor p of n (p sub-transforms of n / p points,
// combined in n * p steps); a prime length is the plain O(n^2) sum. Twiddles are computed once,
// directly from cos and sin, and indexed by (k t) mod n so no phase is a large product.
class Dft {
 public:
  Dft(int64_t n, const std::string& where)
      : n_(n), tw_(bounded_buffer<Complex>(n, where, "DFT length")) {
    for (int64_t j = 0; j < n; ++j) {
      const double phase =
          -2.0 * std::numbers::pi * static_cast<double>(j) / static_cast<double>(n);
      tw_[j] = Complex(std::cos(phase), std::sin(phase));
    }
  }

  // `in` and `out` hold n points; `inverse` conjugates the twiddles (no 1 / n scaling).
  void run(const std::vector<Complex>& in, bool inverse, std::vector<Complex>& out) const {
    PTO_CHECK(static_cast<int64_t>(in.size()) == n_) << "Dft::run: " << in.size() << " points";
    out.resize(static_cast<size_t>(n_));
    step(in.data(), 1, n_, inverse, out.data());
  }

 private:
  // The n-point transform of x[0], x[stride], ..., into out[0..n).
  void step(const Complex* x, int64_t stride, int64_t n, bool inverse, Complex* out) const {
    const int64_t scale = n_ / n;  // w_n^j = tw_[j * scale]
    auto w = [&](int64_t j) { return inverse ? std::conj(tw_[j * scale]) : tw_[j * scale]; };
    int64_t p = n;
    for (int64_t d = 2; d * d <= n; ++d)
      if (n % d == 0) {
        p = d;
        break;
      }
    if (p == n) {  // prime (or 1): the plain sum
      for (int64_t k = 0; k < n; ++k) {
        Complex acc = 0;
        for (int64_t t = 0, j = 0; t < n; ++t, j = (j + k) % n) acc += x[t * stride] * w(j);
        out[k] = acc;
      }
      return;
    }
    // x[r + p s] for s < m is sub-sequence r; X[k] = sum_r w_n^(r k) DFT_m(sub r)[k mod m].
    const int64_t m = n / p;
    std::vector<Complex> sub(static_cast<size_t>(n));
    for (int64_t r = 0; r < p; ++r)
      step(x + r * stride, stride * p, m, inverse, sub.data() + r * m);
    for (int64_t k = 0; k < n; ++k) {
      Complex acc = 0;
      for (int64_t r = 0, j = 0; r < p; ++r, j = (j + k) % n) acc += w(j) * sub[r * m + k % m];
      out[k] = acc;
    }
  }

  int64_t n_;
  std::vector<Complex> tw_;
};

// The single integer of a scalar (or one-element) integer input.
int64_t scalar_input(const KernelContext& c, size_t i, const char* what) {
  return scalar_int(c.input(i), c.where(), what);
}

// DFT along the plan's axis (signal_plan.h) of a real [..., 1] or complex [..., 2] input.
// dft_length zero-pads or truncates the axis. onesided keeps the n / 2 + 1 non-redundant bins of
// a forward transform; an inverse one-sided transform reads such bins and returns the real signal
// ([..., 1], numpy's irfft). Inverses are scaled by 1 / n.
std::vector<Tensor> dft(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const DftPlan p = dft_plan(c);
  std::vector<double> out = output_buffer(p.out_shape, w);
  if (out.empty()) return {from_doubles(x.dtype(), p.out_shape, out, w)};
  if (!is_floating(x.dtype())) throw TypeError(cat(w, ": input must be a float tensor"));
  const std::vector<double> in = to_doubles(x, w);
  const int64_t n = p.n, length = p.length, out_len = p.out_len, inner = p.inner;
  const int64_t cin = p.cin, cout = p.cout, used = p.used;
  const Dft transform(length, w);
  const double scale = p.inverse ? 1.0 / static_cast<double>(length) : 1.0;
  std::vector<Complex> line, spectrum;
  for (int64_t o = 0; o < p.outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t t) { return ((o * n + t) * inner + i) * cin; };
      line.assign(static_cast<size_t>(length), 0);
      for (int64_t t = 0; t < used; ++t)
        line[t] = Complex(in[at(t)], cin == 2 ? in[at(t) + 1] : 0.0);
      if (p.real_out) {
        // Hermitian extension, ignoring the imaginary parts of bin 0 and (even length) bin n/2.
        for (int64_t k = 1; k < used; ++k)
          if (length - k != k) line[length - k] = std::conj(line[k]);
        line[0] = line[0].real();
        if (length % 2 == 0 && length / 2 < used) line[length / 2] = line[length / 2].real();
      }
      transform.run(line, p.inverse, spectrum);
      for (int64_t k = 0; k < out_len; ++k) {
        const int64_t dst = ((o * out_len + k) * inner + i) * cout;
        out[dst] = spectrum[k].real() * scale;
        if (cout == 2) out[dst + 1] = spectrum[k].imag() * scale;
      }
    }
  return {from_doubles(x.dtype(), p.out_shape, out, w)};
}

// STFT: frame f of the [batch, length, 1 | 2] signal starts at f * frame_step and holds
// frame_length samples, multiplied by the window (all ones when absent), then transformed.
// Output [batch, frames, bins, 2], bins = frame_length / 2 + 1 when onesided (the default).
std::vector<Tensor> stft(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  const StftPlan p = stft_plan(c);
  std::vector<double> out = output_buffer(p.out_shape, w);
  const std::vector<double> in = to_doubles(x, w);
  const int64_t frame = p.frame, frames = p.frames, bins = p.bins, cin = p.cin;
  const std::vector<double> window =
      p.has_window ? to_doubles(c.input(2), w) : std::vector<double>(frame, 1.0);
  const Dft transform(frame, w);
  std::vector<Complex> line(static_cast<size_t>(frame)), spectrum;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t f = 0; f < frames; ++f) {
      for (int64_t t = 0; t < frame; ++t) {
        const int64_t at = (b * p.length + f * p.step + t) * cin;
        line[t] = Complex(in[at], cin == 2 ? in[at + 1] : 0.0) * window[t];
      }
      transform.run(line, false, spectrum);
      for (int64_t k = 0; k < bins; ++k) {
        const int64_t dst = ((b * frames + f) * bins + k) * 2;
        out[dst] = spectrum[k].real();
        out[dst + 1] = spectrum[k].imag();
      }
    }
  return {from_doubles(x.dtype(), p.out_shape, out, w)};
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

DftPlan dft_plan(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  if (x.rank() < 2 || (x.dim(-1) != 1 && x.dim(-1) != 2))
    throw ValueError(
        cat(w, ": input must be [..., n, 1] (real) or [..., n, 2] (complex), got ", x.str()));
  DftPlan p;
  p.inverse = c.node.attr_int("inverse") != 0;
  p.onesided = c.node.attr_int("onesided") != 0;
  int64_t axis;
  if (c.node.opset != 0 && c.node.opset < 20)
    axis = c.node.attr_int("axis");
  else
    axis = c.has_input(2) ? scalar_input(c, 2, "axis") : -2;
  const int64_t rank = x.rank();
  p.axis = normalize_axis(axis, rank, w);
  if (p.axis == rank - 1) throw ValueError(cat(w, ": axis cannot be the last (complex) axis"));
  p.n = x.dim(p.axis);
  p.length = dft_default_length(p.n, p.inverse, p.onesided);
  if (c.has_input(1)) p.length = scalar_input(c, 1, "dft_length");
  if (p.length < 1) throw ValueError(cat(w, ": dft_length must be >= 1, got ", p.length));
  p.real_out = p.inverse && p.onesided;
  p.out_len = p.real_out || p.inverse || !p.onesided ? p.length : p.length / 2 + 1;
  p.out_shape = x.shape();
  p.out_shape[p.axis] = p.out_len;
  p.out_shape.back() = p.real_out ? 1 : 2;
  p.outer = dims_product(x.shape(), 0, p.axis);
  p.inner = dims_product(x.shape(), p.axis + 1, rank - 1);
  p.cin = x.dim(-1);
  p.cout = p.out_shape.back();
  // Input points read: the axis zero-padded or truncated to the length, or for an inverse
  // one-sided transform its bins [0, length / 2], the rest following by symmetry.
  p.used = p.real_out ? std::min(p.n, p.length / 2 + 1) : std::min(p.n, p.length);
  return p;
}

StftPlan stft_plan(const KernelContext& c) {
  const std::string w = c.where();
  const Tensor& x = c.input(0);
  if (x.rank() != 3 || (x.dim(2) != 1 && x.dim(2) != 2))
    throw ValueError(cat(w, ": signal must be [batch, length, 1 | 2], got ", x.str()));
  if (!is_floating(x.dtype())) throw TypeError(cat(w, ": signal must be a float tensor"));
  StftPlan p;
  p.step = scalar_input(c, 1, "frame_step");
  if (p.step < 1) throw ValueError(cat(w, ": frame_step must be >= 1, got ", p.step));
  p.has_window = c.has_input(2);
  if (p.has_window && (c.input(2).rank() != 1 || c.input(2).dtype() != x.dtype()))
    throw ValueError(cat(w, ": window must be 1-D of the signal's dtype, got ", c.input(2).str()));
  p.length = x.dim(1);
  p.frame = p.has_window ? c.input(2).dim(0) : p.length;
  if (c.has_input(3)) {
    p.frame = scalar_input(c, 3, "frame_length");
    if (p.has_window && p.frame != c.input(2).dim(0))
      throw ValueError(cat(w, ": frame_length ", p.frame, " differs from the window's length ",
                           c.input(2).dim(0)));
  }
  if (p.frame < 1 || p.frame > p.length)
    throw ValueError(cat(w, ": frame_length ", p.frame, " must be in [1, ", p.length, "]"));
  p.onesided = c.node.attr_int("onesided") != 0;
  p.frames = 1 + (p.length - p.frame) / p.step;
  p.bins = p.onesided ? p.frame / 2 + 1 : p.frame;
  p.batch = x.dim(0);
  p.cin = x.dim(2);
  p.out_shape = {p.batch, p.frames, p.bins, 2};
  return p;
}

void register_signal_kernels(KernelRegistry& r) {
  r.add("DFT", dft);
  r.add("STFT", stft);
  r.add("Det", det);
  register_signal_window_kernels(r);
}

}  // namespace pto::reference
