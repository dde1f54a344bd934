// The per-ISA inner loops of the reduction, normalization and pooling kernels (reduce_impl.h,
// norm_impl.h, pool_impl.h, compiled once per ISA) and the drivers that cut the work into
// parallel pieces (reduce.cpp, norm.cpp, pool.cpp). Everything is float32 and contiguous.
#pragma once

#include <cstdint>

#include "backend/cpu/isa/isa.h"

namespace pto::cpu {

class KernelRegistry;

// What a fold accumulates over the reduced axis. The max/min folds propagate NaN; kMaxSkipNaN
// ignores it (Hardmax's search); kMaxFinite is the largest finite element
// (-inf when none), the shift of LogSumExp; kSumExp adds exp(x - shift) with shift per output.
enum class Fold { kSum, kSumSquare, kSumAbs, kProd, kMax, kMin, kMaxSkipNaN, kMaxFinite, kSumExp };

// x viewed as [outer, reduce, inner]. For o in [o0, o1) and i in [i0, i1):
//   y[o * inner + i] = fold of x[(o * reduce + r) * inner + i] over r in [r0, r1),
// the identity when the range is empty. `shift` is indexed like y (kSumExp only).
struct FoldRange {
  int64_t reduce, inner;
  int64_t o0, o1, r0, r1, i0, i1;
};

// Sliding-window geometry of one 2-D pooling plane (1-D pools have h = 1, kh = 1).
struct PoolGeom {
  int64_t h, w, oh, ow;  // input and output sizes
  int64_t kh, kw, sh, sw, dh, dw;
  int64_t ph, pw;     // leading pads
  int64_t span;       // (ow - 1) * sw + (kw - 1) * dw + 1: padded input columns the windows touch
  int64_t lanes = 1;  // channels per position: 1 for NCHW planes, the block c for NCHWc [H, W, c]
};

// Per output row and column: how many positions its window counts (AveragePool's divisor is
// row_count * col_count).
struct PoolIndex {
  const float *row_count, *col_count;
};

// The activation GroupNormBlocked applies after its affine map.
enum class LaneAct : uint8_t { kNone, kRelu, kSilu };

PTO_ISA_DECLARE(
    void fold(Fold op, const float* x, const FoldRange& r, const float* shift, float* y);

    // Softmax (or LogSoftmax) of `rows` contiguous rows of `len` elements. stream_buf: null, or
    // 2 len floats of scratch, and y is stored past the cache (MemoryPolicy::nontemporal). With
    // `prefetch`, rows ahead are prefetched into L2 (Softmax: two rows ahead, its pass over a
    // row also reading the next one; LogSoftmax: the next row).
    void softmax_rows(const float* x, float* y, int64_t rows, int64_t len, bool log,
                      float* stream_buf, bool prefetch);
    // The same along the middle axis of one [len, inner] slice, for columns [i0, i1).
    void softmax_columns(const float* x, float* y, int64_t len, int64_t inner, int64_t i0,
                         int64_t i1, bool log);

    // Population statistics of x[0, n), n > 0: the mean is shift + mean (shift: the mean of x's
    // first vector, or x[0] where that is not finite); the variance from the one pass of the
    // sums of x - shift and their squares, or a second pass where those cancel (norm_impl.h).
    void moments(const float* x, int64_t n, float* shift, float* mean, float* var);
    // y[j] = a[j] + b[j], j < n: a row of a norm's summed input (FusedSum), rounded as one Add.
    void add_rows(const float* a, const float* b, float* y, int64_t n);
    // y[j] = (((t[0][j] + t[1][j]) + t[2][j]) + ...), k >= 2 rows of n > 0 floats, and moments'
    // statistics of y taken in the same pass (the same bits as moments(y, ...) after it).
    void sum_moments(const float* const* t, int k, float* y, int64_t n, float* shift, float* mean,
                     float* var);
    // Per-lane sums over `pixels` pixels of c lanes each (one channel block of a blocked tensor,
    // GroupNormBlocked): with d = x - shift[l], s1[l] += d and s2[l] += d^2 (in double; floats
    // within runs of 256 pixels).
    void lane_sums(const float* x, int64_t pixels, int c, const float* shift, double* s1,
                   double* s2);
    // y = (x - shift[l]) * a[l] + b[l] over `pixels` pixels of c lanes, then the activation.
    void lane_affine(const float* x, float* y, int64_t pixels, int c, const float* shift,
                     const float* a, const float* b, LaneAct act);
    // The mean of x[j]^2 over j < n, n > 0 (RMSNormalization).
    float mean_square(const float* x, int64_t n);
    // y = (x - shift - mean) * a + b over n elements.
    void normalize(const float* x, float* y, int64_t n, float shift, float mean, float a, float b);
    // y = (x - shift - mean) * inv_std * scale + bias over n elements; bias may be null; with
    // `stream`, y is stored past the cache, and with `fence` too the streamed stores are ordered
    // before what follows (the last row of a task: one sfence per task, not per row). `next`
    // (or null): n floats, the row to come, prefetched into L2 meanwhile, so that memory
    // delivers it while this row, read from the cache, is computed.
    void normalize_affine(const float* x, float* y, int64_t n, float shift, float mean,
                          float inv_std, const float* scale, const float* bias, bool stream,
                          bool fence, const float* next);
    // LayerNormalization of `rows` contiguous rows of n floats, y stored past the cache: the
    // moments and normalize_affine of each row, with rows r and r + 1's normalizing pass folded
    // into rows r + 2 and r + 3's pass of sums (streamed output vectors per vector summed), then
    // a fence. The same arithmetic as those calls row by row. n > 0 a multiple of 32, y 64-byte
    // aligned. Each row's mean to mean[r], 1 / sqrt(var + eps) to inv_std[r]. With `prefetch`, each
    // row but the last prefetches the next one into L2.
    void layer_norm_rows_streamed(const float* x, float* y, int64_t rows, int64_t n, float eps,
                                  const float* scale, const float* bias, float* mean,
                                  float* inv_std, bool prefetch);
    // LayerNormalization of `rows` contiguous rows of 0 < n <= short_norm_vectors() vectors, each
    // row held in registers: its moments (the row read again from L1: the same bits as row by
    // row) and normalize_affine in one pass over memory, scale and bias loaded once for all the
    // rows. Each row's mean to mean[r], 1 / sqrt(var + eps) to inv_std[r]. y holds float32, or
    // (`bf16`, AVX-512 only) bf16 rounded as f32_to_bf16 rounds the float results: the bits of the
    // float path and a Cast. With `stream`, y's whole aligned float32 vectors go past the cache,
    // then a fence (the same values either way).
    void layer_norm_rows_short(const float* x, void* y, bool bf16, int64_t rows, int64_t n,
                               float eps, const float* scale, const float* bias, float* mean,
                               float* inv_std, bool stream);
    // The longest rows, in vectors, layer_norm_rows_short takes: 8 under AVX-512 (its 32
    // registers hold a row, its scale and bias), 4 elsewhere.
    int short_norm_vectors();

    // Max or average pooling of planes [p0, p1); `scratch` has room for 2 * g.span floats.
    void pool_planes(const PoolGeom& g, const PoolIndex& ix, bool is_max, const float* x, float* y,
                     int64_t p0, int64_t p1, float* scratch);)

// Folds all of x ([outer, reduce, inner]) into y ([outer, inner]) in parallel; the result does not
// depend on the thread count. kSumExp reads `shift` (indexed like y).
void fold_all(Fold op, const float* x, int64_t outer, int64_t reduce, int64_t inner,
              const float* shift, float* y);

// Work below this many elements stays on one thread.
inline constexpr int64_t kParallelGrain = 32768;

void register_norm_kernels(KernelRegistry& r);  // norm.cpp: Softmax, LogSoftmax, the norms
void register_pool_kernels(KernelRegistry& r);  // pool.cpp: MaxPool, AveragePool, Global*Pool

}  // namespace pto::cpu
