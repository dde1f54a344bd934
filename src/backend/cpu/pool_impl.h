// 2-D max and average pooling for one ISA (included by pool_avx512.cpp, pool_avx2.cpp,
// pool_generic.cpp). The window is separable: for each output row, the valid input rows of its
// window are folded into one padded row (vectors along the width), then kw taps of that row are
// folded at every column a window can start on (vectors again, for any stride), and a stride > 1
// keeps every sw-th. The vector folds of a max ignore NaN; a row whose windows read one is
// fixed after (mark_nan_windows: a window holding a NaN gives NaN, as torch's max_pool2d and
// numpy's max), so rows without NaN pay only the test for one. A channel-blocked plane (NCHWc,
// [H, W, c]) folds the same windows on vectors of a position's c channels.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/reduce_simd.h"

namespace pto::cpu::PTO_ISA_NS {

namespace {

// The max of acc and v ignoring a NaN v (acc, a max of non-NaN values or -inf, is never NaN):
// VMAXPS returns its second operand when either is NaN, one instruction for a compare and a blend.
inline Vec max_ignoring_nan(Vec acc, Vec v) {
#if defined(PTO_ISA_GENERIC)
  return select(v > acc, v, acc);
#else
  return max(v, acc);
#endif
}

inline Vec take(bool is_max, Vec acc, Vec v) {
  return is_max ? max_ignoring_nan(acc, v) : acc + v;
}

// The rows of output row r's window inside the plane: k0 <= k < k1, the first at row `first`
// (integer divisions only for dilated windows: they cost a row).
struct WindowRows {
  int64_t k0, k1, first;
};
inline WindowRows window_rows(const PoolGeom& g, int64_t r) {
  const int64_t top = r * g.sh - g.ph;
  if (g.dh == 1) {
    const int64_t k0 = top >= 0 ? 0 : -top;
    return {k0, std::min(g.kh, g.h - top), top + k0};
  }
  const int64_t k0 = top >= 0 ? 0 : (-top + g.dh - 1) / g.dh;
  return {k0, std::min(g.kh, top < g.h ? (g.h - 1 - top) / g.dh + 1 : 0), top + k0 * g.dh};
}

// Max's NaN rule on output row r of plane x (lanes c = g.lanes per position): an output whose
// window holds a NaN is that NaN. Called only for rows whose window rows may hold one (the folds'
// tests also fire on infinities, a false alarm this check settles): the NaN of each padded column
// over the window's rows first, then of each output's kw columns, O(span + ow kw) per row and lane.
[[gnu::noinline]] void mark_nan_windows(const PoolGeom& g, const float* x, float* y, int64_t r) {
  const int64_t c = g.lanes;
  const WindowRows w = window_rows(g, r);
  std::vector<float> col(static_cast<size_t>(g.span * c), 0.0f);  // a NaN, or 0: none
  const int64_t lo = std::min(g.pw, g.span), hi = std::min(g.pw + g.w, g.span);
  for (int64_t k = w.k0; k < w.k1; ++k) {
    const float* row = x + (w.first + (k - w.k0) * g.dh) * g.w * c;
    for (int64_t j = lo; j < hi; ++j)  // padded column j reads input column j - pw
      for (int64_t l = 0; l < c; ++l)
        if (std::isnan(row[(j - g.pw) * c + l]) && !std::isnan(col[j * c + l]))
          col[j * c + l] = row[(j - g.pw) * c + l];
  }
  for (int64_t o = 0; o < g.ow; ++o)
    for (int64_t k = 0; k < g.kw; ++k)
      for (int64_t l = 0; l < c; ++l) {
        const float v = col[(o * g.sw + k * g.dw) * c + l];
        if (std::isnan(v) && !std::isnan(y[o * c + l])) y[o * c + l] = v;
      }
}

// mark_nan_windows for each row p * oh + r of `rows` (NCHW planes). The lane-shift folds only
// report a NaN: a call inside their loops cost a 3x3 / 2 pool over [1, 64, 112, 112] 4% (Zen 4),
// its vectors spilled around it.
void mark_nan_rows(const PoolGeom& g, const float* x, float* y, const std::vector<int64_t>& rows) {
  for (int64_t pr : rows) mark_nan_windows(g, x + pr / g.oh * g.h * g.w, y + pr * g.ow, pr % g.oh);
}

// The vertical fold of output row r's window rows over input columns j..j+L of an NCHW plane
// (pool_row_shifted, pool_row_shifted2). For a max, `sum` adds every element read: NaN when one
// was (or when infinities of both signs were, which only costs the exact check of
// mark_nan_windows). One add a load: a compare into a mask and an OR made the 3x3 / 2 pool over
// [1, 64, 112, 112] 168 us, 158 this way (Zen 4, 1 thread).
template <bool is_max>
struct RowFold {
  const PoolGeom& g;
  WindowRows w;
  const float* rows;
  Vec sum = Vec::zero();

  RowFold(const PoolGeom& geom, const float* x, int64_t r)
      : g(geom), w(window_rows(geom, r)), rows(x + w.first * geom.w) {}
  static Vec idv() { return Vec::set1(is_max ? -INFINITY : 0.0f); }
  bool saw_nan() const { return any(is_nan(sum)); }
  Vec operator()(int64_t j) {
    if (j >= g.w) return idv();
    const int n = lanes_left(g.w, j);
    const int64_t step = g.dh * g.w;
    Vec acc = idv();
    for (int64_t k = w.k0; k < w.k1; ++k) {
      Vec v = Vec::load(rows + (k - w.k0) * step + j, n);  // zeros past n
      if (is_max) {
        sum = sum + v;
        if (n < Vec::kLanes) v = select(first_lanes(n), v, idv());
      }
      acc = take(is_max, acc, v);
    }
    return acc;
  }
};

// Whether pool_row_shifted applies: stride 1 along the row and every column offset of the window
// (k * dw - pw) within a vector of lanes either way.
bool row_shifts_fit(const PoolGeom& g) {
  return g.lanes == 1 && g.sw == 1 && g.pw <= Vec::kLanes &&
         (g.kw - 1) * g.dw - g.pw <= Vec::kLanes;
}

// One output row r of plane x into y, all in registers (row_shifts_fit): the vertical fold of
// each vector of input columns, then the horizontal fold of the outputs q..q+L as lane shifts of
// the folds of the previous, this and the next vector of columns. pool_row's buffer costs a failed
// store-to-load forwarding per row (its horizontal loads straddle the stores just made): a 3x3
// average over [1, 512, 7, 7] took 98.6 us, 34.7 here (Zen 4, 1 thread). shift[k] holds lane + k *
// dw - pw (+ L when negative), the index of column k's value among the two vectors it reads; the
// first `left` columns are left of the output (k * dw < pw).
template <bool is_max>
bool pool_row_shifted(const PoolGeom& g, const PoolIndex& ix, const float* x, float* y, int64_t r,
                      const VecI* shift, int64_t left) {
  constexpr int64_t L = Vec::kLanes;
  const Vec idv = RowFold<is_max>::idv();
  RowFold<is_max> fold_rows(g, x, r);
  const Vec rc = Vec::set1(ix.row_count[r]);
  Vec prev = idv, cur = fold_rows(0);
  for (int64_t q = 0; q < g.ow; q += L) {
    const Vec next = fold_rows(q + L);
    Vec acc = idv;
    int64_t k = 0;
    for (; k < left; ++k) acc = take(is_max, acc, permute2(prev, cur, shift[k]));
    for (; k < g.kw; ++k) acc = take(is_max, acc, permute2(cur, next, shift[k]));
    const int n = lanes_left(g.ow, q);
    if (!is_max) acc = acc / (rc * Vec::load(ix.col_count + q, n));
    acc.store(y + q, n);
    prev = cur;
    cur = next;
  }
  return is_max && fold_rows.saw_nan();
}

// Whether pool_row_shifted2 applies: stride 2 along the row, every column offset s = k * dw - pw of
// the window with floor(s / 2) in [-L, L).
bool row_shifts2_fit(const PoolGeom& g) {
  const int64_t L = Vec::kLanes;
  return g.lanes == 1 && g.sw == 2 && g.pw <= 2 * L && (g.kw - 1) * g.dw - g.pw < 2 * L;
}

// pool_row_shifted at stride 2 (ResNet's and ShuffleNet's 3x3 / 2 max pools on NCHW planes):
// outputs q..q+L read columns 2q + 2i + s for each window offset s. The vertical folds of the
// input columns from 2q, as two vectors, split into their even and odd columns (E and O: lane i
// is column 2q + 2i, 2q + 2i + 1); offset s = 2t + p is then lane i + t of the E (p = 0) or O
// (p = 1) sequence, one permute of the previous and this pair (t < 0) or of this and the next.
// pool_row's buffer, horizontal folds at every start and scalar gather of every second took
// 117 us on [1, 24, 112, 112] (Zen 4, 1 thread). tap[k]: (p, t) of offset k's column.
template <bool is_max>
bool pool_row_shifted2(const PoolGeom& g, const PoolIndex& ix, const float* x, float* y, int64_t r,
                       const VecI* idx, const int* tap) {
  constexpr int64_t L = Vec::kLanes;
  const Vec idv = RowFold<is_max>::idv();
  RowFold<is_max> fold_rows(g, x, r);
  const VecI even = to_int(lane_index() * Vec::set1(2.0f)),
             odd = to_int(lane_index() * Vec::set1(2.0f) + Vec::set1(1.0f));
  // The (E, O) pairs of the columns from 2q - 2L (prev), 2q (cur) and 2q + 2L (next).
  Vec seq[2][3];
  auto split = [&](int64_t j, int at) {
    const Vec a = fold_rows(j), b = fold_rows(j + L);
    seq[0][at] = permute2(a, b, even);
    seq[1][at] = permute2(a, b, odd);
  };
  seq[0][0] = seq[1][0] = idv;
  split(0, 1);
  const Vec rc = Vec::set1(ix.row_count[r]);
  for (int64_t q = 0; q < g.ow; q += L) {
    split(2 * (q + L), 2);
    Vec acc = idv;
    for (int64_t k = 0; k < g.kw; ++k) {
      const int p = tap[2 * k], t = tap[2 * k + 1];
      acc = take(
          is_max, acc,
          t < 0 ? permute2(seq[p][0], seq[p][1], idx[k]) : permute2(seq[p][1], seq[p][2], idx[k]));
    }
    const int n = lanes_left(g.ow, q);
    if (!is_max) acc = acc / (rc * Vec::load(ix.col_count + q, n));
    acc.store(y + q, n);
    for (int e = 0; e < 2; ++e) seq[e][0] = seq[e][1], seq[e][1] = seq[e][2];
  }
  return is_max && fold_rows.saw_nan();
}

// One output row r of plane x into y: buf (g.span) holds the folded rows, hb the horizontal folds.
void pool_row(const PoolGeom& g, const PoolIndex& ix, bool is_max, const float* x, float* y,
              int64_t r, float* buf, float* hb) {
  const float id = is_max ? -INFINITY : 0.0f;
  const Vec idv = Vec::set1(id);
  const int64_t lo = g.pw < g.span ? g.pw : g.span;
  const int64_t hi = g.pw + g.w < g.span ? g.pw + g.w : g.span;
  for (int64_t j = 0; j < lo; ++j) buf[j] = id;
  for (int64_t j = hi; j < g.span; ++j) buf[j] = id;
  Mask nan_seen = is_nan(idv);                      // no lane: whether the window's rows hold a NaN
  for (int64_t j = lo; j < hi; j += Vec::kLanes) {  // column j reads input column j - pw
    const int n = lanes_left(hi, j);
    Vec acc = idv;
    for (int64_t k = 0; k < g.kh; ++k) {
      const int64_t ih = r * g.sh + k * g.dh - g.ph;
      if (ih < 0 || ih >= g.h) continue;
      const Vec v = Vec::load(x + ih * g.w + j - g.pw, n);
      if (is_max) nan_seen = nan_seen | is_nan(v);
      acc = take(is_max, acc, v);
    }
    acc.store(buf + j, n);
  }
  const int64_t starts = (g.ow - 1) * g.sw + 1;
  float* h = g.sw == 1 ? y : hb;
  for (int64_t q = 0; q < starts; q += Vec::kLanes) {
    const int n = lanes_left(starts, q);
    Vec acc = idv;
    for (int64_t k = 0; k < g.kw; ++k) acc = take(is_max, acc, Vec::load(buf + q + k * g.dw, n));
    acc.store(h + q, n);
  }
  if (g.sw != 1)
    for (int64_t o = 0; o < g.ow; ++o) y[o] = hb[o * g.sw];
  if (is_max) {
    if (any(nan_seen)) mark_nan_windows(g, x, y, r);
  } else {
    const Vec rc = Vec::set1(ix.row_count[r]);
    for (int64_t o = 0; o < g.ow; o += Vec::kLanes) {
      const int n = lanes_left(g.ow, o);
      (Vec::load(y + o, n) / (rc * Vec::load(ix.col_count + o, n))).store(y + o, n);
    }
  }
}

// pool_row_blocked for c = kV vectors of lanes: the window's rows inside the plane found once, no
// test per position, the NaN check a vector OR (a NaN's x - x is NaN; so is an infinity's, which
// only sends the row to the exact fixup below).
template <bool kMax, int kV>
void pool_row_blocked_v(const PoolGeom& g, const PoolIndex& ix, const float* x, float* y, int64_t r,
                        float* buf) {
  constexpr int64_t L = Vec::kLanes, c = kV * L;
  const Vec idv = Vec::set1(kMax ? -INFINITY : 0.0f);
  const auto [k0, k1, first_row] = window_rows(g, r);
  const float* rows = x + first_row * g.w * c;
  const int64_t step = g.dh * g.w * c, lo = std::min(g.pw, g.span),
                hi = std::min(g.pw + g.w, g.span);
  Vec nan_acc = Vec::zero();
  for (int64_t j = 0; j < lo; ++j)
    for (int v = 0; v < kV; ++v) idv.store(buf + j * c + v * L);
  for (int64_t j = hi; j < g.span; ++j)
    for (int v = 0; v < kV; ++v) idv.store(buf + j * c + v * L);
  for (int64_t j = lo; j < hi; ++j) {  // padded position j reads input column j - pw
    const float* col = rows + (j - g.pw) * c;
    for (int v = 0; v < kV; ++v) {
      Vec acc = idv;
      for (int64_t k = k0; k < k1; ++k) {
        const Vec t = Vec::load(col + (k - k0) * step + v * L);
        if constexpr (kMax) nan_acc = nan_acc + (t - t);
        acc = take(kMax, acc, t);
      }
      acc.store(buf + j * c + v * L);
    }
  }
  for (int64_t o = 0; o < g.ow; ++o) {
    const float* b = buf + o * g.sw * c;
    for (int v = 0; v < kV; ++v) {
      Vec acc = Vec::load(b + v * L);
      for (int64_t k = 1; k < g.kw; ++k) acc = take(kMax, acc, Vec::load(b + k * g.dw * c + v * L));
      if constexpr (!kMax) acc = acc / Vec::set1(ix.row_count[r] * ix.col_count[o]);
      acc.store(y + o * c + v * L);
    }
  }
  if (kMax && any(is_nan(nan_acc))) mark_nan_windows(g, x, y, r);
}

// One output row r of a channel-blocked plane [H, W, c] (NCHWc): the same window, each position a
// vector of c channels. buf (g.span positions of c) holds the vertical fold of the window's rows.
void pool_row_blocked(const PoolGeom& g, const PoolIndex& ix, bool is_max, const float* x, float* y,
                      int64_t r, float* buf) {
  const int64_t c = g.lanes;
  const Vec idv = Vec::set1(is_max ? -INFINITY : 0.0f);
  Mask nan_seen = is_nan(idv);  // no lane: whether the window's rows hold a NaN (as pool_row)
  for (int64_t j = 0; j < g.span; ++j) {  // padded position j reads input column j - pw
    const int64_t iw = j - g.pw;
    for (int64_t l = 0; l < c; l += Vec::kLanes) {
      const int n = lanes_left(c, l);
      Vec acc = idv;
      if (iw >= 0 && iw < g.w)
        for (int64_t k = 0; k < g.kh; ++k) {
          const int64_t ih = r * g.sh + k * g.dh - g.ph;
          if (ih < 0 || ih >= g.h) continue;
          const Vec v = Vec::load(x + (ih * g.w + iw) * c + l, n);
          if (is_max) nan_seen = nan_seen | is_nan(v);
          acc = take(is_max, acc, v);
        }
      acc.store(buf + j * c + l, n);
    }
  }
  for (int64_t o = 0; o < g.ow; ++o) {
    const Vec div = Vec::set1(ix.row_count[r] * ix.col_count[o]);
    for (int64_t l = 0; l < c; l += Vec::kLanes) {
      const int n = lanes_left(c, l);
      Vec acc = idv;
      for (int64_t k = 0; k < g.kw; ++k)
        acc = take(is_max, acc, Vec::load(buf + (o * g.sw + k * g.dw) * c + l, n));
      if (!is_max) acc = acc / div;
      acc.store(y + o * c + l, n);
    }
  }
  if (any(nan_seen)) mark_nan_windows(g, x, y, r);
}

}  // namespace

void pool_planes(const PoolGeom& g, const PoolIndex& ix, bool is_max, const float* x, float* y,
                 int64_t p0, int64_t p1, float* scratch) {
  const int64_t c = g.lanes;
  std::vector<int64_t> nan_rows;  // p * oh + r of the rows a lane-shift fold saw a NaN in
  if (row_shifts_fit(g)) {
    std::vector<VecI> shift(static_cast<size_t>(g.kw));
    for (int64_t k = 0; k < g.kw; ++k) {
      const int64_t s = k * g.dw - g.pw;
      shift[k] = to_int(lane_index() + Vec::set1(static_cast<float>(s < 0 ? s + Vec::kLanes : s)));
    }
    const int64_t left = std::min(g.kw, (g.pw + g.dw - 1) / g.dw);
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t r = 0; r < g.oh; ++r)
        if (is_max) {
          if (pool_row_shifted<true>(g, ix, x + p * g.h * g.w, y + (p * g.oh + r) * g.ow, r,
                                     shift.data(), left))
            nan_rows.push_back(p * g.oh + r);
        } else {
          pool_row_shifted<false>(g, ix, x + p * g.h * g.w, y + (p * g.oh + r) * g.ow, r,
                                  shift.data(), left);
        }
    mark_nan_rows(g, x, y, nan_rows);
    return;
  }
  if (row_shifts2_fit(g)) {
    std::vector<VecI> idx(static_cast<size_t>(g.kw));
    std::vector<int> tap(static_cast<size_t>(2 * g.kw));
    for (int64_t k = 0; k < g.kw; ++k) {
      const int64_t s = k * g.dw - g.pw, t = s >= 0 ? s / 2 : -((-s + 1) / 2);
      tap[2 * k] = static_cast<int>(s - 2 * t);
      tap[2 * k + 1] = static_cast<int>(t);
      idx[k] = to_int(lane_index() + Vec::set1(static_cast<float>(t < 0 ? t + Vec::kLanes : t)));
    }
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t r = 0; r < g.oh; ++r)
        if (is_max) {
          if (pool_row_shifted2<true>(g, ix, x + p * g.h * g.w, y + (p * g.oh + r) * g.ow, r,
                                      idx.data(), tap.data()))
            nan_rows.push_back(p * g.oh + r);
        } else {
          pool_row_shifted2<false>(g, ix, x + p * g.h * g.w, y + (p * g.oh + r) * g.ow, r,
                                   idx.data(), tap.data());
        }
    mark_nan_rows(g, x, y, nan_rows);
    return;
  }
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t r = 0; r < g.oh; ++r) {
      const float* xp = x + p * g.h * g.w * c;
      float* yp = y + (p * g.oh + r) * g.ow * c;
      if (c == Vec::kLanes && is_max)
        pool_row_blocked_v<true, 1>(g, ix, xp, yp, r, scratch);
      else if (c == Vec::kLanes)
        pool_row_blocked_v<false, 1>(g, ix, xp, yp, r, scratch);
      else if (c == 2 * Vec::kLanes && is_max)
        pool_row_blocked_v<true, 2>(g, ix, xp, yp, r, scratch);
      else if (c == 2 * Vec::kLanes)
        pool_row_blocked_v<false, 2>(g, ix, xp, yp, r, scratch);
      else if (c > 1)
        pool_row_blocked(g, ix, is_max, xp, yp, r, scratch);
      else
        pool_row(g, ix, is_max, xp, yp, r, scratch, scratch + g.span);
    }
}

}  // namespace pto::cpu::PTO_ISA_NS
