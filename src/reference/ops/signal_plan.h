// What DFT and STFT compute, apart from the transform itself: the axis, lengths and output shape
// read and checked from the node and its inputs. The reference kernels (signal.cpp) and the CPU
// kernels (backend/cpu/dft.cpp) both take them from here, so they agree on every shape and error.
#pragma once

#include "pto/reference.h"

namespace pto::reference {

// DFT of a real [..., n, ..., 1] or complex [..., n, ..., 2] input along `axis`, viewed as
// [outer, n, inner, cin]; the output is [outer, out_len, inner, cout].
struct DftPlan {
  int64_t axis = 0, n = 0;  // the axis and its size in the input
  int64_t length = 0;       // the transform's length (dft_length, or the default below)
  int64_t out_len = 0;      // bins written: length, or length / 2 + 1 when onesided forward
  int64_t used = 0;         // input points read per line; the rest of the length is zeros
  int64_t outer = 1, inner = 1, cin = 1, cout = 2;
  bool inverse = false, onesided = false;
  bool real_out = false;  // inverse and onesided: reads bins [0, length / 2], writes a real signal
  Dims out_shape;
};

// The transform length without a dft_length input: n, or 2 (n - 1) for an inverse one-sided
// transform (n bins of a real signal, numpy's irfft).
inline int64_t dft_default_length(int64_t n, bool inverse, bool onesided) {
  return inverse && onesided ? 2 * (n - 1) : n;
}

DftPlan dft_plan(const KernelContext& c);

// STFT of a [batch, length, cin] signal: `frames` frames of `frame` samples, `step` apart, each
// multiplied by the window (when given) and transformed; the output is [batch, frames, bins, 2].
struct StftPlan {
  int64_t batch = 0, length = 0, cin = 1;
  int64_t step = 1, frame = 0, frames = 0, bins = 0;
  bool onesided = true, has_window = false;
  Dims out_shape;
};

StftPlan stft_plan(const KernelContext& c);

}  // namespace pto::reference
