// Int8 GEMM driver: packing of B (once, ISA-independent) and of A (per task, MR rows a panel), the
// zero-point corrections (igemm.h), the task split over threads, and the epilogues to float or
// requantized bytes. The per-ISA micro-kernels are in igemm_impl.h.
//
// Loop nest of one task (a range of rows and columns):
//   for ic over the task's rows, MC at a time      pack A block [MC/MR][k4][MR][4] (L2/4)
//     for jc over the task's columns, NC at a time  int32 C block (MC x NC) stays in L2
//       for pc over K, KC at a time
//         macro-kernel: for each NR panel of B (its KC x NR bytes stay in L1), for each MR panel
//         of A the micro-kernel; the first slice adds the zero-point corrections, later ones
//         accumulate. C is the int32 output, or a scratch block converted (float, requantized)
//         right after the last slice while it is in cache.
#include "backend/cpu/gemm/igemm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/gemm/igemm_kernel.h"
#include "backend/cpu/scratch.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

void register_block(int64_t* mr, int64_t* nr) {
  switch (active_isa()) {
    case Isa::kAvx512:
      return avx512::igemm_block(mr, nr);
    case Isa::kAvx2:
      return avx2::igemm_block(mr, nr);
    default:
      return generic::igemm_block(mr, nr);
  }
}

bool uses_vnni() {
  switch (active_isa()) {
    case Isa::kAvx512:
      return has_ext(Ext::kAvx512Vnni);
    case Isa::kAvx2:
      return has_ext(Ext::kAvxVnni);
    default:
      return false;
  }
}

// Whether a product of m rows runs on AMX tiles: the CPU has AMX-INT8 (and the avx512 kernels
// run), and A fills a tile's 16 rows (fewer would leave most of each TDPBUSD idle).
bool uses_amx(int64_t m) {
  return active_isa() == Isa::kAvx512 && has_ext(Ext::kAmxInt8) && m >= 16;
}

thread_local ScratchBuffer t_pack_a, t_rows, t_acc;

// Rows [0, m) of A (k columns, lda apart) into panels of mr rows, [k4][mr][4] bytes each, as
// a' = a ^ 0x80 for int8 (a + 128, uint8) and zero-padded; rowsum[i] = sum of a' over the K.
void pack_a(const uint8_t* a, int64_t lda, bool a_signed, int64_t m, int64_t k, int64_t mr,
            uint8_t* dst, int32_t* rowsum) {
  const int64_t k4 = ceil_div(k, 4);
  const uint8_t flip = a_signed ? 0x80 : 0;
  for (int64_t i0 = 0; i0 < m; i0 += mr, dst += k4 * mr * 4) {
    for (int64_t r = 0; r < mr; ++r) {
      uint8_t* d = dst + r * 4;
      if (i0 + r >= m) {
        for (int64_t p = 0; p < k4; ++p) std::memset(d + p * mr * 4, 0, 4);
        rowsum[i0 + r] = 0;
        continue;
      }
      const uint8_t* src = a + (i0 + r) * lda;
      int32_t sum = 0;
      int64_t p = 0;
      for (; p < k / 4; ++p) {
        uint32_t x;
        std::memcpy(&x, src + 4 * p, 4);
        x ^= flip * 0x01010101u;
        std::memcpy(d + p * mr * 4, &x, 4);
        sum +=
            static_cast<int32_t>((x & 0xff) + ((x >> 8) & 0xff) + ((x >> 16) & 0xff) + (x >> 24));
      }
      if (p < k4) {
        uint8_t t[4] = {0, 0, 0, 0};
        for (int64_t q = 0; q < k - 4 * p; ++q) {
          t[q] = src[4 * p + q] ^ flip;
          sum += t[q];
        }
        std::memcpy(d + p * mr * 4, t, 4);
      }
      rowsum[i0 + r] = sum;
    }
  }
}

struct Task {
  int64_t i0, i1, j0, j1;
};

// The per-call constants every task reads.
struct Shared {
  const IgemmArgs* g;
  const PackedI8B* b;
  int64_t mr, nr, k4;
  const int32_t* beta;  // per column, padded to a multiple of NR
  const int32_t* cs2;
  bool vnni;
  bool amx;  // AMX tiles (uses_amx): A packed in chunks of 16 quads, K sliced in whole chunks
  bool fill_in_task;  // each task fills its own rows of A (IgemmArgs::fill_a)
};

// Converts an m x n int32 block (ld `lda` elements) at output rows i0.., columns j0.. as the
// epilogue asks (igemm_epilogue).
void convert(const IgemmArgs& g, const int32_t* acc, int64_t lda, int64_t i0, int64_t m, int64_t j0,
             int64_t n) {
  // acc + bias_s32, exact in int64 (and in double: |sum| < 2^33).
  auto sum = [&](const int32_t* x, int64_t j) {
    return static_cast<int64_t>(x[j]) + (g.bias_s32 ? g.bias_s32[j0 + j] : 0);
  };
  if (g.out == IgemmArgs::Out::kS32) {
    for (int64_t i = 0; i < m; ++i) {
      int32_t* y = static_cast<int32_t*>(g.c) + (i0 + i) * g.ldc + j0;
      const int32_t* x = acc + i * lda;
      if (!g.bias_s32) {
        std::memcpy(y, x, static_cast<size_t>(n) * 4);
        continue;
      }
      for (int64_t j = 0; j < n; ++j)
        y[j] = static_cast<int32_t>(static_cast<uint32_t>(x[j]) +
                                    static_cast<uint32_t>(g.bias_s32[j0 + j]));
    }
    return;
  }
  if (g.out == IgemmArgs::Out::kF32 && g.bias_s32) {
    for (int64_t i = 0; i < m; ++i) {
      float* y = static_cast<float*>(g.c) + (i0 + i) * g.ldc + j0;
      const int32_t* x = acc + i * lda;
      const float sa = g.scale_a_row ? g.scale_a_row[i0 + i] : g.scale_a;
      for (int64_t j = 0; j < n; ++j) {
        const float sb = g.scale_b ? g.scale_b[g.scale_b_per_col ? j0 + j : 0] : 1.0f;
        y[j] = static_cast<float>(sum(x, j)) * (sa * sb) + (g.bias ? g.bias[j0 + j] : 0.0f);
      }
    }
    return;
  }
  if (g.out == IgemmArgs::Out::kF32) {
    // Simple loops per case, which the compiler vectorizes (a scalar loop with the cases inside
    // cost BERT-base's int8 run a fifth of its time).
    for (int64_t i = 0; i < m; ++i) {
      float* y = static_cast<float*>(g.c) + (i0 + i) * g.ldc + j0;
      const int32_t* x = acc + i * lda;
      const float sa = g.scale_a_row ? g.scale_a_row[i0 + i] : g.scale_a;
      const float* bias = g.bias ? g.bias + j0 : nullptr;
      if (g.scale_b && g.scale_b_per_col) {
        const float* sb = g.scale_b + j0;
        if (bias) {
          for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(x[j]) * (sa * sb[j]) + bias[j];
        } else {
          for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(x[j]) * (sa * sb[j]);
        }
      } else {
        const float s = sa * (g.scale_b ? g.scale_b[0] : 1.0f);
        if (bias) {
          for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(x[j]) * s + bias[j];
        } else {
          for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(x[j]) * s;
        }
      }
    }
    return;
  }
  IgemmRequant r;
  r.bias = g.bias_s32 ? g.bias_s32 + j0 : nullptr;
  r.mult = g.mult + (g.mult_per_col ? j0 : 0);
  r.mult_per_col = g.mult_per_col;
  r.y_zp = g.y_zp;
  r.c_signed = g.c_signed;
  PTO_ISA_DISPATCH(igemm_requantize, r, acc, lda, m, n,
                   static_cast<uint8_t*>(g.c) + i0 * g.ldc + j0, g.ldc);
}

constexpr int64_t kNC = 256;  // columns of C per block (int32, stays in L2 across K slices)

// Block sizes from the cache model (docs/backend/gemm.md): a K slice whose 64-column B slice takes
// two thirds of L1 (512 k on a 48 KiB L1), in groups of 4 k; MC rows of packed A in a quarter of
// L2.
int64_t kc4_of_cache() {
  static const int64_t kc4 =
      std::clamp<int64_t>(static_cast<int64_t>(cache_model().l1d) * 2 / 3 / (64 * 4), 32, 256);
  return kc4;
}
int64_t a_block_bytes() {
  static const int64_t bytes = std::max<int64_t>(static_cast<int64_t>(cache_model().l2) / 4, 16384);
  return bytes;
}

void run_task(const Shared& s, const Task& t) {
  const IgemmArgs& g = *s.g;
  const int64_t k4 = s.k4, mr = s.mr;
  const int64_t unit = s.amx ? avx512::kAmxQuadsPerTile : 1;  // K slices start at whole units
  const int64_t k4p = ceil_div(k4, unit) * unit;              // A panels' quads (padded)
  const int64_t mc =
      std::max<int64_t>(mr, a_block_bytes() / std::max<int64_t>(k4p * 4, 1) / mr * mr);
  const int64_t rows_cap = ceil_div(std::min(mc, t.i1 - t.i0), mr) * mr;
  auto* ap = static_cast<uint8_t*>(t_pack_a.get(static_cast<size_t>(rows_cap * k4p * 4)));
  auto* rows = static_cast<int32_t*>(t_rows.get(static_cast<size_t>(rows_cap * 2) * 4));
  int32_t* rowsum = rows;
  int32_t* alpha = rows + rows_cap;
  // C is computed in a contiguous scratch block, not in place: rows of a wide C are a multiple of
  // 4 KiB apart and would share a few cache sets (1024 x 1024 ran at 60% of 512 x 512 in place).
  auto* acc = static_cast<int32_t*>(t_acc.get(static_cast<size_t>(rows_cap * kNC) * 4));
  const int32_t offset_a = g.a_signed ? -128 : 0;
  // K slices depend on K alone (the sums wrap, so any split gives the same bits anyway).
  int64_t slices = std::max<int64_t>(1, ceil_div(k4, kc4_of_cache()));
  const int64_t kc4 = std::max<int64_t>(unit, ceil_div(ceil_div(k4, slices), unit) * unit);
  slices = std::max<int64_t>(1, ceil_div(k4, kc4));
  for (int64_t ic = t.i0; ic < t.i1; ic += mc) {
    const int64_t m = std::min(mc, t.i1 - ic);
    if (s.fill_in_task) g.fill_a(ic, ic + m);
    const uint8_t* a = static_cast<const uint8_t*>(g.a) + ic * g.lda;
    if (s.amx)
      avx512::igemm_pack_a_amx(a, g.lda, g.a_signed, m, g.k, ap, rowsum);
    else
      pack_a(a, g.lda, g.a_signed, m, g.k, mr, ap, rowsum);
    for (int64_t i = 0; i < ceil_div(m, mr) * mr; ++i) {
      const int32_t za = g.a_zp ? g.a_zp[g.a_zp_per_row ? std::min(ic + i, g.m - 1) : 0] : 0;
      alpha[i] = offset_a - za;
    }
    for (int64_t jc = t.j0; jc < t.j1; jc += kNC) {
      const int64_t n = std::min(kNC, t.j1 - jc);
      IgemmBlock blk;
      blk.m = m;
      blk.n = n;
      blk.a_panel_stride = k4p * mr * 4;
      blk.b_stride = i8_panel_stride(g.k);
      blk.vnni = s.vnni;
      blk.c = acc;
      blk.ldc = kNC;
      blk.next_cols = std::min(kNC, t.j1 - jc - n);
      for (int64_t sl = 0; sl < slices; ++sl) {
        const int64_t p0 = sl * kc4;
        blk.k4 = std::max<int64_t>(0, std::min(kc4, k4 - p0));
        blk.a = ap + p0 * mr * 4;
        blk.b = s.b->data() + (jc / 16) * blk.b_stride + p0 * 64;
        blk.accumulate = sl > 0;
        blk.rowsum = sl ? nullptr : rowsum;
        blk.alpha = sl ? nullptr : alpha;
        blk.beta = sl ? nullptr : s.beta + jc;
        blk.cs2 = sl ? nullptr : s.cs2 + jc;
        if (s.amx)
          avx512::igemm_macro_amx(blk);
        else
          PTO_ISA_DISPATCH(igemm_macro, blk);
      }
      convert(g, acc, kNC, ic, m, jc, n);
      if (g.out == IgemmArgs::Out::kF32 && g.epilogue)
        apply_epilogue(*g.epilogue, static_cast<float*>(g.c) + ic * g.ldc + jc, g.ldc, ic, m, jc,
                       n);
    }
  }
}

}  // namespace

void igemm_epilogue(const IgemmArgs& g, const int32_t* acc, int64_t lda, int64_t i0, int64_t m,
                    int64_t j0, int64_t n) {
  convert(g, acc, lda, i0, m, j0, n);
}

bool igemm_uses_vnni() {
  return uses_vnni();
}

bool igemm_uses_amx() {
  return uses_amx(16);
}

PackedI8B pack_i8_b(int64_t k, int64_t n, const void* b, int64_t ldb, bool trans, bool b_signed) {
  PackedI8B p;
  p.k_ = k;
  p.n_ = n;
  p.signed_ = b_signed;
  const int64_t panels = ceil_div(n, 16), stride = i8_panel_stride(k);
  // With room past the last panel for the AMX kernel's last tile, whose quad rows past K (met by
  // zeros in A) may read up to 15 rows of 64 bytes beyond it.
  p.bytes_ = static_cast<size_t>(panels * stride + 16 * 64);
  const std::shared_ptr<uint8_t[]> memory = panel_memory(p.bytes_);  // zeroed, huge pages
  p.data_ = std::shared_ptr<int8_t[]>(memory, reinterpret_cast<int8_t*>(memory.get()));
  int8_t* data = p.data_.get();
  p.colsum_.assign(static_cast<size_t>(panels * 16), 0);
  const auto* src = static_cast<const uint8_t*>(b);
  const uint8_t flip = b_signed ? 0 : 0x80;  // uint8 b' = b - 128 = b ^ 0x80 as int8
  for (int64_t j = 0; j < n; ++j) {
    int8_t* col = data + (j / 16) * stride + (j % 16) * 4;
    int32_t sum = 0;
    for (int64_t q = 0; q < k; ++q) {
      const auto v = static_cast<int8_t>(src[trans ? j * ldb + q : q * ldb + j] ^ flip);
      col[(q / 4) * 64 + q % 4] = v;
      sum += v;
    }
    p.colsum_[static_cast<size_t>(j)] = sum;
  }
  return p;
}

void igemm(const IgemmArgs& g, const PackedI8B& b) {
  PTO_CHECK(b.k() == g.k && b.n() == g.n)
      << "igemm: B packed as " << b.k() << " x " << b.n() << ", used as " << g.k << " x " << g.n;
  if (g.m <= 0 || g.n <= 0) return;
  Shared s;
  s.g = &g;
  s.b = &b;
  register_block(&s.mr, &s.nr);
  s.k4 = ceil_div(g.k, 4);
  s.vnni = uses_vnni();
  s.amx = uses_amx(g.m);
  if (s.amx) s.mr = avx512::kAmxRows;
  // Per column: beta = offset_b - zb, cs2 = colsum(b') + K * beta (igemm.h), wrapping.
  const int64_t padded = ceil_div(g.n, s.nr) * s.nr;
  std::vector<int32_t> beta(static_cast<size_t>(padded), 0), cs2(static_cast<size_t>(padded), 0);
  const int32_t offset_b = b.is_signed() ? 0 : 128;
  for (int64_t j = 0; j < g.n; ++j) {
    const int32_t zb = g.b_zp ? g.b_zp[g.b_zp_per_col ? j : 0] : 0;
    const uint32_t be = static_cast<uint32_t>(offset_b - zb);
    beta[j] = static_cast<int32_t>(be);
    cs2[j] = static_cast<int32_t>(static_cast<uint32_t>(b.colsum()[j]) +
                                  static_cast<uint32_t>(g.k) * be);
  }
  s.beta = beta.data();
  s.cs2 = cs2.data();

  // Tasks: rows in whole MR panels, columns in whole NR panels, as sgemm splits them (an int8
  // multiply-add taking about a quarter of a float one's time); every split gives the same bits.
  // Columns are split only where the rows are too few to share (fewer than two row panels a
  // thread): B packed ahead costs a task nothing to pack, and a split of N makes fill_a fill all
  // rows first on this thread (128 x 3072 x 768 on 2 threads split 1 x 2: 1790 -> 1650 GOPS).
  const int threads = in_parallel_region() ? 1 : num_threads();
  const int64_t mp = ceil_div(g.m, s.mr), np = ceil_div(g.n, s.nr);
  const TaskGrid grid =
      choose_task_grid(1, g.m, g.n, g.k, s.mr, s.nr, threads, 4e5, mp < 2 * threads);
  const int64_t tm = grid.tm, tn = grid.tn, tasks = tm * tn;
  s.fill_in_task = g.fill_a && tn == 1;
  if (g.fill_a && !s.fill_in_task) g.fill_a(0, g.m);
  auto task = [&](int64_t t) {
    const int64_t im = t / tn, in = t % tn;
    Task r{std::min(g.m, im * mp / tm * s.mr), std::min(g.m, (im + 1) * mp / tm * s.mr),
           std::min(g.n, in * np / tn * s.nr), std::min(g.n, (in + 1) * np / tn * s.nr)};
    if (r.i0 < r.i1 && r.j0 < r.j1) run_task(s, r);
  };
  if (tasks == 1) {
    task(0);
  } else {
    parallel_tasks(tasks, task);
  }
}

}  // namespace pto::cpu
