// Vectorized loops of the linear quantization kernels (quant_kernels.cpp) and of the integer
// convs' depthwise path and transposes (quant_conv.cpp), compiled once per ISA (quant_impl.h).
// Arithmetic as the reference's (src/reference/ops/quantization.cpp): float32 division, round half
// to even, saturation; dequantization (float(x) - float(zp)) * scale.
#pragma once

#include <cstdint>

#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

// Scale and zero point of each element of a span: params[i * stride] (stride 0: one for all, 1:
// one per element, as along the last axis).
struct QuantParams {
  const float* scale = nullptr;
  const float* zp = nullptr;
  int64_t stride = 0;
};

PTO_ISA_DECLARE(
    // y[i] = saturate(round(x[i] / scale) + zp) into uint8 or int8 (to_signed); a NaN quotient
    // gives nan_r in place of the rounded value (QuantizeLinear: 0; DynamicQuantizeLinear: -zp).
    void quantize_span(const float* x, int64_t n, QuantParams p, float nan_r, bool to_signed,
                       void* y);
    // y[i] = (float(x[i]) - zp) * scale from uint8 or int8 (x_signed).
    void dequantize_span(const void* x, bool x_signed, int64_t n, QuantParams p, float* y);
    // The minimum and maximum of x and 0 (NaNs skipped), as DynamicQuantizeLinear takes them.
    void min_max_span(const float* x, int64_t n, float* mn, float* mx);
    // An int8 depthwise conv's input plane x (uint8 or int8) as the float depthwise kernel reads
    // it (conv_isa.h's depthwise_pad): x - zp, padded with zeros and split by stride phase.
    void depthwise_pad_bytes(const DepthwisePlane& p, const uint8_t* x, bool x_signed, float zp,
                             float* padded);
    // Output row oy of an int8 depthwise conv with one output channel per input channel, in
    // NHWC: y[ox, ch] = sum over the taps inside the input of x[iy, ix, ch] * w[tap, ch], the
    // channels in vector lanes. x: one image [ih, iw, c], x - x_zp widened to float; w:
    // [kh * kw, c] (w - w_zp); y: [ow, c], exact integers while taps * 255^2 < 2^24.
    void depthwise_row_nhwc(const ConvWindow& g, int64_t c, const float* x, const float* w,
                            int64_t oy, float* y);
    // y[i] = int32(x[i]): the float depthwise sums, exact integers, as the epilogue reads them.
    void float_to_s32(const float* x, int64_t n, int32_t* y);
    // y[q * ldy + r] = x[r * ldx + q] for r < rows, q < cols: an int32 block transposed (the
    // integer convs' [pixels, channels] results into NCHW), 8 x 8 tiles in registers.
    void transpose_s32(const int32_t* x, int64_t ldx, int32_t* y, int64_t ldy, int64_t rows,
                       int64_t cols);
    // The same for bytes (the integer convs' inputs to NHWC and uint8/int8 results to NCHW):
    // 16 x 16 tiles in each 128-bit lane of a vector (its lanes 16 rows apart, so that a column
    // is one whole vector), byte-interleaving unpacks; 8 x 8 tiles through 64-bit words in the
    // generic build.
    void transpose_bytes(const uint8_t* x, int64_t ldx, uint8_t* y, int64_t ldy, int64_t rows,
                         int64_t cols);)

}  // namespace pto::cpu
