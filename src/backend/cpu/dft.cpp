// DFT and STFT on float32 (ONNX opsets 17 and 20): the shapes, lengths and every error are the
// reference's (reference/ops/signal_plan.h); the transform is the FFT of fft.h, in float, whose
// plan (radices and twiddles) is built at compile time when the length is known then. The
// transforms of a node are lines: DFT's run along its axis, each point `inner` complex values
// after the last (no transpose), STFT's are the frames. A group of as many lines as the vector
// has lanes is gathered into one buffer (zero-padded to the length, conjugated for an inverse,
// Hermitian-extended for a one-sided inverse, windowed for STFT), transformed at once, and its
// bins scattered to the output (conjugated and scaled by 1 / n for an inverse); groups run in
// parallel.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cpu/fft.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/scratch.h"
#include "pto/parallel.h"
#include "reference/ops/signal_plan.h"

namespace pto::cpu {
namespace {

constexpr int64_t kGrainFlops = 1 << 16;  // butterfly operations per parallel chunk, at least
constexpr int64_t kMaxLines = 32;         // lines a group: two for each of AVX-512's 16 lanes
constexpr int64_t kBlock = 16;            // bins of a line stored together

// What every line of a node shares; line g starts at in_offset(g) in x and out_offset(g) in y.
struct Lines {
  const float* x = nullptr;
  float* y = nullptr;
  int64_t count = 0;             // lines
  int64_t used = 0;              // input points read per line (the rest of the length is zero)
  int64_t in_step = 0, cin = 1;  // floats between input points; 1 real, 2 complex
  int64_t out_len = 0, out_step = 0, cout = 2;
  bool inverse = false;           // conjugate in and out, scale by 1 / length
  bool hermitian = false;         // the input is bins [0, length / 2] of a real signal's spectrum
  const float* window = nullptr;  // STFT: multiplies input point t
};

// Sets points [used, length) of the buffer from the Hermitian symmetry X[n - k] = conj(X[k]).
// The imaginary parts of bin 0 and (even length) bin n / 2, which the reference zeros, only reach
// the imaginary parts of the output, which a one-sided inverse drops.
void hermitian_extend(float* a, int64_t length, int64_t used, int64_t w) {
  const int64_t point = 2 * w;
  for (int64_t k = 1; k < used; ++k) {
    if (length - k == k) continue;
    float* dst = a + (length - k) * point;
    const float* src = a + k * point;
    for (int64_t l = 0; l < w; ++l) {
      dst[l] = src[l];
      dst[w + l] = -src[w + l];
    }
  }
}

// True when the first `count` floats are all finite: no exponent of all ones (an integer OR
// the compiler vectorizes; a float sum would be one serial chain of adds).
bool all_finite(const float* a, int64_t count) {
  uint32_t special = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    std::memcpy(&bits, a + i, sizeof bits);
    special |= (bits & 0x7f800000u) == 0x7f800000u;
  }
  return special == 0;
}

// A real input (not a one-sided inverse's bins) takes two lines a lane: line 2 j as the real
// parts and 2 j + 1 as the imaginary ones, one complex FFT for both; the two spectra are then
// X[k] = (Z[k] + conj(Z[n - k])) / 2 and Y[k] = (Z[k] - conj(Z[n - k])) / 2i. A pair with a NaN
// or an infinity would pass it to its partner, so such a group runs again a line a lane.
template <class InOffset, class OutOffset>
void transform_lines(const FftPlan& plan, const Lines& s, InOffset in_offset,
                     OutOffset out_offset) {
  const FftKernel kernel = fft_kernel(plan);
  const int64_t w = kernel.lanes, point = 2 * w, length = plan.n, work = plan.work_points();
  const float scale = s.inverse ? static_cast<float>(1.0 / static_cast<double>(length)) : 1.0f;
  const float sign = s.inverse ? -1.0f : 1.0f;
  const bool paired = s.cin == 1 && !s.hermitian;
  const int64_t per_group = paired ? 2 * w : w;
  PTO_CHECK(per_group <= kMaxLines) << "DFT: " << per_group << " lines a group";
  const int64_t groups = (s.count + per_group - 1) / per_group;
  int64_t log_work = 1;
  while ((int64_t{1} << log_work) < work) ++log_work;
  const int64_t grain = std::max<int64_t>(1, kGrainFlops / (work * w * log_work));
  parallel_for(0, groups, grain, [&](int64_t g0, int64_t g1) {
    float* a = scratch_as<float>(static_cast<size_t>(3 * work * point));
    float* b = a + work * point;
    float* c = b + work * point;
    // Lines [first, first + count), two a lane when `pair`; false (nothing written) when a pair
    // meets a value that is not finite.
    auto run_group = [&](int64_t first, int64_t count, bool pair) {
      // Line j's lane and part: (j, real) or, paired, (j / 2, real for even j, else imaginary).
      // Point by point across the lines: the buffer is written, and read back, a point at a time.
      int64_t part[kMaxLines];
      const float* src[kMaxLines];
      for (int64_t j = 0; j < count; ++j) {
        part[j] = pair ? j / 2 + (j % 2) * w : j;
        src[j] = s.x + in_offset(first + j);
      }
      // Complex lines side by side (a non-last axis): a point of every line is one run of
      // (re, im) pairs, deinterleaved in a loop the compiler vectorizes.
      bool side_by_side = s.cin == 2;
      for (int64_t j = 1; j < count && side_by_side; ++j) side_by_side = src[j] == src[0] + 2 * j;
      std::fill_n(a, length * point, 0.0f);
      for (int64_t t = 0; t < s.used; ++t) {
        float* pt = a + t * point;
        const float f = s.window ? s.window[t] : 1.0f;
        const int64_t at = t * s.in_step;
        if (side_by_side) {
          const float* v = src[0] + at;
          const float fi = sign * f;
          for (int64_t j = 0; j < count; ++j) {
            pt[j] = v[2 * j] * f;
            pt[w + j] = v[2 * j + 1] * fi;
          }
          continue;
        }
        for (int64_t j = 0; j < count; ++j) pt[part[j]] = src[j][at] * f;
        if (s.cin == 2)
          for (int64_t j = 0; j < count; ++j) pt[w + j] = sign * src[j][at + 1] * f;
      }
      if (pair && !all_finite(a, length * point)) return false;
      if (s.hermitian) hermitian_extend(a, length, s.used, w);
      const float* res = kernel.run(plan, a, b, c);
      float* dst[kMaxLines];
      for (int64_t j = 0; j < count; ++j) dst[j] = s.y + out_offset(first + j);
      // Bin k of every line into bins[k % kBlock] (line j's (re, im) at 2 j, scaled and
      // conjugated for an inverse), in branch-free loops across the lanes; then stored a bin of
      // every line at a time when the lines interleave (a non-last axis: the lines' values are
      // neighbours), else a block of kBlock bins of one line at a time (a line's bins are
      // contiguous: whole cache lines written in order, not 2 * w output streams at once).
      float bins[kBlock][2 * kMaxLines];
      const float re_scale = scale, im_scale = sign * scale * (pair ? 0.5f : 1.0f);
      const float pair_scale = 0.5f * scale;
      const int64_t lanes = pair ? (count + 1) / 2 : count;
      const bool by_line = s.out_step == s.cout;
      bool out_side_by_side = s.cout == 2;  // a bin of every line: one run of (re, im) pairs
      for (int64_t j = 1; j < count && out_side_by_side; ++j)
        out_side_by_side = dst[j] == dst[0] + 2 * j;
      for (int64_t k0 = 0; k0 < s.out_len; k0 += kBlock) {
        const int64_t kb = std::min(kBlock, s.out_len - k0);
        for (int64_t kk = 0; kk < kb; ++kk) {
          const int64_t k = k0 + kk;
          const float* z = res + k * point;
          const float* zm = res + (k == 0 ? 0 : length - k) * point;  // Z[n - k]
          float* out = bins[kk];
          if (pair) {
            for (int64_t l = 0; l < lanes; ++l) {
              out[4 * l] = pair_scale * (z[l] + zm[l]);
              out[4 * l + 1] = im_scale * (z[w + l] - zm[w + l]);
              out[4 * l + 2] = pair_scale * (z[w + l] + zm[w + l]);
              out[4 * l + 3] = im_scale * (zm[l] - z[l]);
            }
          } else {
            for (int64_t l = 0; l < lanes; ++l) {
              out[2 * l] = re_scale * z[l];
              out[2 * l + 1] = im_scale * z[w + l];
            }
          }
          if (by_line) continue;
          const int64_t at = k * s.out_step;
          if (out_side_by_side) {
            std::copy_n(out, 2 * count, dst[0] + at);
            continue;
          }
          for (int64_t j = 0; j < count; ++j) {
            dst[j][at] = out[2 * j];
            if (s.cout == 2) dst[j][at + 1] = out[2 * j + 1];
          }
        }
        if (!by_line) continue;
        for (int64_t j = 0; j < count; ++j) {
          float* d = dst[j] + k0 * s.cout;
          if (s.cout == 2) {
            for (int64_t kk = 0; kk < kb; ++kk) {
              d[2 * kk] = bins[kk][2 * j];
              d[2 * kk + 1] = bins[kk][2 * j + 1];
            }
          } else {
            for (int64_t kk = 0; kk < kb; ++kk) d[kk] = bins[kk][2 * j];
          }
        }
      }
      return true;
    };
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t first = g * per_group, count = std::min(per_group, s.count - first);
      if (run_group(first, count, paired)) continue;
      for (int64_t f = first; f < first + count; f += w)
        run_group(f, std::min(w, first + count - f), false);
    }
  });
}

// The plan prepare() built when it is for `length`, else a new one.
std::shared_ptr<const FftPlan> plan_for(const KernelContext& c, int64_t length) {
  const auto* prepared = c.prepared_if<std::shared_ptr<const FftPlan>>();
  if (prepared && *prepared && (*prepared)->n == length) return *prepared;
  return make_fft_plan(length);
}

// The integer of a constant one-element integer input, when it is one.
std::optional<int64_t> constant_int(const NodeInfo& n, size_t i) {
  if (!n.is_constant(i)) return std::nullopt;
  const Tensor& t = *n.constants[i];
  if (t.numel() != 1 || !is_integral(t.dtype()) || t.rank() > 1) return std::nullopt;
  return static_cast<int64_t>(t.item_as_double(0));
}

// The known size of axis `axis` of input i (negative: from the end).
std::optional<int64_t> known_dim(const NodeInfo& n, size_t i, int64_t axis) {
  if (i >= n.inputs.size() || !n.inputs[i].shape) return std::nullopt;
  const Shape& s = *n.inputs[i].shape;
  const auto rank = static_cast<int64_t>(s.size());
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || !s[axis].is_known()) return std::nullopt;
  return s[axis].value;
}

// A plan when the length is known at compile time (an empty std::any otherwise; run() plans).
std::any plan_if_known(std::optional<int64_t> length) {
  if (!length || *length < 1) return {};
  return make_fft_plan(*length);
}

std::any prepare_dft(const NodeInfo& n) {
  const bool inverse = n.node.attr_int("inverse") != 0;
  const bool onesided = n.node.attr_int("onesided") != 0;
  std::optional<int64_t> axis;
  if (n.node.opset != 0 && n.node.opset < 20)
    axis = n.node.attr_int("axis");
  else
    axis = n.dtype(2) == DType::kUndefined ? std::optional<int64_t>(-2) : constant_int(n, 2);
  std::optional<int64_t> length = constant_int(n, 1);
  if (!length && n.dtype(1) == DType::kUndefined && axis) {
    const std::optional<int64_t> size = known_dim(n, 0, *axis);
    if (size) length = reference::dft_default_length(*size, inverse, onesided);
  }
  return plan_if_known(length);
}

std::vector<Tensor> run_dft(const KernelContext& c) {
  const reference::DftPlan p = reference::dft_plan(c);
  Tensor y = Tensor::empty(DType::kF32, p.out_shape);
  if (y.numel() == 0) return one(std::move(y));
  const std::shared_ptr<const FftPlan> plan = plan_for(c, p.length);
  Lines s;
  s.x = c.input(0).data<float>();
  s.y = y.data<float>();
  s.count = p.outer * p.inner;
  s.used = p.used;
  s.in_step = p.inner * p.cin;
  s.cin = p.cin;
  s.out_len = p.out_len;
  s.out_step = p.inner * p.cout;
  s.cout = p.cout;
  s.inverse = p.inverse;
  s.hermitian = p.real_out;
  const int64_t n = p.n, inner = p.inner, out_len = p.out_len;
  transform_lines(
      *plan, s, [&](int64_t g) { return ((g / inner) * n * inner + g % inner) * p.cin; },
      [&](int64_t g) { return ((g / inner) * out_len * inner + g % inner) * p.cout; });
  return one(std::move(y));
}

std::any prepare_stft(const NodeInfo& n) {
  std::optional<int64_t> frame = constant_int(n, 3);
  if (!frame && n.dtype(3) == DType::kUndefined)
    frame = n.dtype(2) != DType::kUndefined ? known_dim(n, 2, 0) : known_dim(n, 0, 1);
  return plan_if_known(frame);
}

std::vector<Tensor> run_stft(const KernelContext& c) {
  const reference::StftPlan p = reference::stft_plan(c);
  Tensor y = Tensor::empty(DType::kF32, p.out_shape);
  if (y.numel() == 0) return one(std::move(y));
  const std::shared_ptr<const FftPlan> plan = plan_for(c, p.frame);
  Lines s;
  s.x = c.input(0).data<float>();
  s.y = y.data<float>();
  s.count = p.batch * p.frames;
  s.used = p.frame;
  s.in_step = p.cin;
  s.cin = p.cin;
  s.out_len = p.bins;
  s.out_step = 2;
  s.window = p.has_window ? c.input(2).data<float>() : nullptr;
  const int64_t frames = p.frames;
  transform_lines(
      *plan, s,
      [&](int64_t g) { return ((g / frames) * p.length + (g % frames) * p.step) * p.cin; },
      [&](int64_t g) { return g * p.bins * 2; });
  return one(std::move(y));
}

bool accepts_dft(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32;
}

bool accepts_stft(const NodeInfo& n) {
  return n.dtype(0) == DType::kF32 &&
         (n.dtype(2) == DType::kUndefined || n.dtype(2) == DType::kF32);
}

}  // namespace

void register_dft_kernels(KernelRegistry& r) {
  r.add("DFT", {.accepts = accepts_dft, .prepare = prepare_dft, .run = run_dft});
  r.add("STFT", {.accepts = accepts_stft, .prepare = prepare_stft, .run = run_stft});
}

}  // namespace pto::cpu
