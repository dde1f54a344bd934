#include "backend/cpu/movement/strided_copy.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/transpose.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// A copy's dimensions after simplification, outermost first; strides in elements.
struct Layout {
  Dims shape, dst, src;

  size_t rank() const { return shape.size(); }
  void push(int64_t n, int64_t d, int64_t s) {
    shape.push_back(n);
    dst.push_back(d);
    src.push_back(s);
  }
};

// Drops size-1 dimensions and merges each dimension into its outer neighbour where both views
// step over it as over one longer dimension.
Layout simplify(const Dims& shape, const Dims& dst, const Dims& src) {
  Layout l;
  l.shape.reserve(shape.size());  // one allocation each instead of one per doubling
  l.dst.reserve(shape.size());
  l.src.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (l.rank() > 0 && l.dst.back() == dst[i] * shape[i] && l.src.back() == src[i] * shape[i]) {
      l.shape.back() *= shape[i];
      l.dst.back() = dst[i];
      l.src.back() = src[i];
    } else {
      l.push(shape[i], dst[i], src[i]);
    }
  }
  return l;
}

// Calls f(dst_offset, src_offset) for the flat indices [begin, end) of the dimensions `outer`,
// unravelling `begin` once and then stepping like an odometer.
template <class F>
void walk(const Layout& outer, int64_t begin, int64_t end, F&& f) {
  const size_t r = outer.rank();
  Dims idx(r, 0);
  int64_t d = 0, s = 0;
  int64_t rest = begin;
  for (size_t k = r; k-- > 0;) {
    idx[k] = rest % outer.shape[k];
    rest /= outer.shape[k];
    d += idx[k] * outer.dst[k];
    s += idx[k] * outer.src[k];
  }
  for (int64_t i = begin; i < end; ++i) {
    f(d, s);
    for (size_t k = r; k-- > 0;) {
      d += outer.dst[k];
      s += outer.src[k];
      if (++idx[k] < outer.shape[k]) break;
      d -= outer.dst[k] * outer.shape[k];
      s -= outer.src[k] * outer.shape[k];
      idx[k] = 0;
    }
  }
}

int64_t grain_for(int64_t bytes_per_item) {
  return std::max<int64_t>(1, kCopyGrainBytes / std::max<int64_t>(bytes_per_item, 1));
}

// Element copies of one row: n elements with strides dst_step and src_step.
template <class T>
void copy_row(T* dst, int64_t dst_step, const T* src, int64_t src_step, int64_t n) {
  if (src_step == 0) {
    const T v = *src;
    for (int64_t j = 0; j < n; ++j) dst[j * dst_step] = v;
  } else {
    for (int64_t j = 0; j < n; ++j) dst[j * dst_step] = src[j * src_step];
  }
}

// dst[a * dst_ld + b] = src[a + b * src_ld], blocked so that both sides stay in L1.
template <class T>
void transpose_strip(const T* src, int64_t src_ld, T* dst, int64_t dst_ld, int64_t rows,
                     int64_t cols) {
  if constexpr (sizeof(T) == 4) {
    PTO_ISA_DISPATCH(transpose_strip_4, reinterpret_cast<const uint32_t*>(src), src_ld,
                     reinterpret_cast<uint32_t*>(dst), dst_ld, rows, cols);
  } else {
    constexpr int64_t kBlock = 16;
    for (int64_t b0 = 0; b0 < cols; b0 += kBlock)
      for (int64_t a0 = 0; a0 < rows; a0 += kBlock)
        for (int64_t b = b0; b < std::min(cols, b0 + kBlock); ++b)
          for (int64_t a = a0; a < std::min(rows, a0 + kBlock); ++a)
            dst[a * dst_ld + b] = src[a + b * src_ld];
  }
}

// The innermost dimension is contiguous on both sides: one memcpy per row; a lone long row is
// cut into pieces so that it still spreads over the threads.
void copy_rows(std::byte* dst, const std::byte* src, const Layout& l, size_t item) {
  Layout outer = l;
  const int64_t run = outer.shape.back();
  outer.shape.pop_back();
  outer.dst.pop_back();
  outer.src.pop_back();
  const int64_t rows = checked_numel(outer.shape);
  const auto run_bytes = static_cast<int64_t>(run * item);
  if (rows == 1) {
    const int64_t pieces = (run_bytes + kCopyGrainBytes - 1) / kCopyGrainBytes;
    parallel_for(0, pieces, 1, [&](int64_t begin, int64_t end) {
      const int64_t from = begin * kCopyGrainBytes;
      const int64_t to = std::min(end * kCopyGrainBytes, run_bytes);
      std::memcpy(dst + from, src + from, static_cast<size_t>(to - from));
    });
    return;
  }
  parallel_for(0, rows, grain_for(run_bytes), [&](int64_t begin, int64_t end) {
    walk(outer, begin, end, [&](int64_t d, int64_t s) {
      std::memcpy(dst + d * static_cast<int64_t>(item), src + s * static_cast<int64_t>(item),
                  static_cast<size_t>(run_bytes));
    });
  });
}

template <class T>
void copy_typed(T* dst, const T* src, const Layout& l) {
  const size_t r = l.rank();
  // The transpose loop: b is the destination's innermost dimension, a one that is contiguous in
  // the source (the innermost such). Broadcast rows (source step 0) are cheaper as element fills.
  int64_t a = -1;
  if (l.src[r - 1] != 0)
    for (size_t k = r - 1; k-- > 0;)
      if (l.src[k] == 1) {
        a = static_cast<int64_t>(k);
        break;
      }
  Layout outer;
  for (size_t k = 0; k + 1 < r; ++k)
    if (static_cast<int64_t>(k) != a) outer.push(l.shape[k], l.dst[k], l.src[k]);
  const int64_t rows = checked_numel(outer.shape);
  const int64_t nb = l.shape[r - 1], b_dst = l.dst[r - 1], b_src = l.src[r - 1];
  if (a < 0 || b_dst != 1) {
    parallel_for(
        0, rows, grain_for(nb * static_cast<int64_t>(sizeof(T))), [&](int64_t begin, int64_t end) {
          walk(outer, begin, end,
               [&](int64_t d, int64_t s) { copy_row(dst + d, b_dst, src + s, b_src, nb); });
        });
    return;
  }
  // Strips of kStrip destination rows (along a): each reads kStrip contiguous source elements
  // from each of nb source rows and writes kStrip destination rows.
  constexpr int64_t kStrip = 32;
  const int64_t na = l.shape[a], a_dst = l.dst[a];
  const int64_t strips = (na + kStrip - 1) / kStrip;
  const int64_t task_bytes = std::min(na, kStrip) * nb * static_cast<int64_t>(sizeof(T));
  parallel_for(0, rows * strips, grain_for(task_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end;) {
      // The tasks of one outer row are consecutive: walk that row once, do its strips.
      const int64_t row = t / strips, first = t % strips;
      const int64_t last = std::min(strips, first + (end - t));
      walk(outer, row, row + 1, [&](int64_t d, int64_t s) {
        for (int64_t i = first; i < last; ++i) {
          const int64_t a0 = i * kStrip, n = std::min(kStrip, na - a0);
          transpose_strip(src + s + a0, b_src, dst + d + a0 * a_dst, a_dst, n, nb);
        }
      });
      t += last - first;
    }
  });
}

}  // namespace

void copy_strided(std::byte* dst, const Dims& dst_strides, const std::byte* src,
                  const Dims& src_strides, const Dims& shape, size_t itemsize) {
  PTO_CHECK(dst_strides.size() == shape.size() && src_strides.size() == shape.size())
      << "copy_strided: rank mismatch";
  for (int64_t n : shape)
    if (n == 0) return;
  Layout l = simplify(shape, dst_strides, src_strides);
  if (l.rank() == 0) {
    std::memcpy(dst, src, itemsize);
    return;
  }
  // A small copy of at most two dimensions (a Slice or Split of a few rows, per iteration of a
  // recurrent Loop body) on this thread, row by row: no task split, no odometer, no layouts of
  // the outer dimensions (each an allocation, together most of such a copy's cost).
  if (l.rank() <= 2 && checked_numel(l.shape) * static_cast<int64_t>(itemsize) <= kSmallCopyBytes) {
    const int64_t rows = l.rank() == 2 ? l.shape[0] : 1, n = l.shape.back();
    const int64_t row_dst = l.rank() == 2 ? l.dst[0] : 0, row_src = l.rank() == 2 ? l.src[0] : 0;
    const int64_t step_dst = l.dst.back(), step_src = l.src.back();
    const auto item = static_cast<int64_t>(itemsize);
    if (step_dst == 1 && step_src == 1) {
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * row_dst * item, src + r * row_src * item,
                    static_cast<size_t>(n * item));
      return;
    }
    with_element_size(itemsize, [&]<class U>() {
      for (int64_t r = 0; r < rows; ++r)
        copy_row(reinterpret_cast<U*>(dst) + r * row_dst, step_dst,
                 reinterpret_cast<const U*>(src) + r * row_src, step_src, n);
    });
    return;
  }
  if (l.dst.back() == 1 && l.src.back() == 1 &&
      l.shape.back() * static_cast<int64_t>(itemsize) >= 64) {
    copy_rows(dst, src, l, itemsize);
    return;
  }
  with_element_size(itemsize, [&]<class U>() {
    copy_typed(reinterpret_cast<U*>(dst), reinterpret_cast<const U*>(src), l);
  });
}

Tensor pack(const Tensor& view) {
  Tensor out = Tensor::empty(view.dtype(), view.shape());
  copy_strided(static_cast<std::byte*>(out.raw_data()), out.strides(),
               static_cast<const std::byte*>(view.raw_data()), view.strides(), view.shape(),
               view.itemsize());
  return out;
}

void unpack_into(const Tensor& region, const Tensor& src) {
  PTO_CHECK(region.shape() == src.shape() && src.is_contiguous()) << "unpack_into: shape mismatch";
  copy_strided(static_cast<std::byte*>(region.raw_data()), region.strides(),
               static_cast<const std::byte*>(src.raw_data()), src.strides(), src.shape(),
               src.itemsize());
}

}  // namespace pto::cpu
