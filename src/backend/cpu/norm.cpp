// CPU kernels for Softmax, LogSoftmax, LayerNormalization, RMSNormalization, BatchNormalization
// (inference), InstanceNormalization and GroupNormalization on float32. Each row, plane or group is
// normalized by one thread (its mean, variance, then one pass writing (x - mean) * a + b); the
// blocked GroupNorm (GroupNormBlocked) by per-lane sums over runs of pixels, then the same.
// Parameter shapes the fast path does not cover (broadcast Scale, BatchNormalization's per-element
// form before opset 9) are left to the reference kernel at run time, which also raises the shape
// errors.
//
// Each also takes the Casts around its node (Kernel::takes_casts): X in bf16 or f16 and Y stored
// in bf16 or f16, computing in float32 between; half rows are converted through per-thread
// scratch while they are in cache, float32 ones used in place.
#include <cmath>
#include <cstring>
#include <optional>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/reduce_kernels.h"
#include "backend/cpu/scratch.h"
#include "ir/ops/op_params.h"
#include "pto/memory_policy.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

int opset_of(const Node& n) {
  return n.opset > 0 ? n.opset : 1 << 30;
}  // 0: the newest

// ---- float32, bf16 or f16 data, computed in float32 ----

// y[i] = float(t[off + i]), i < n.
void load_f32(const Tensor& t, int64_t off, int64_t n, float* y) {
  if (n == 0) return;
  const auto* h = static_cast<const uint16_t*>(t.raw_data()) + off;
  switch (t.dtype()) {
    case DType::kF32:
      std::memcpy(y, t.data<float>() + off, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16:
      bf16_to_f32(h, y, n);
      break;
    default:
      f16_to_f32(h, y, n);
  }
}

// t[off + i] = y[i] rounded to t's type, i < n.
void store_f32(const float* y, const Tensor& t, int64_t off, int64_t n) {
  if (n == 0) return;
  auto* h = static_cast<uint16_t*>(t.raw_data()) + off;
  switch (t.dtype()) {
    case DType::kF32:
      std::memcpy(t.data<float>() + off, y, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16:
      f32_to_bf16(y, h, n);
      break;
    default:
      f32_to_f16(y, h, n);
  }
}

// n values of t from element `off` as float32: in place, or widened into scratch `slot`.
const float* read_f32(const Tensor& t, int64_t off, int64_t n, int slot) {
  if (t.dtype() == DType::kF32) return t.data<float>() + off;
  float* buf = scratch_as<float>(static_cast<size_t>(n), slot);
  load_f32(t, off, n, buf);
  return buf;
}

// Where to compute n float32 values of t from `off`: in place, or scratch `slot`, which
// write_back then rounds into t.
float* out_f32(const Tensor& t, int64_t off, int64_t n, int slot) {
  return t.dtype() == DType::kF32 ? t.data<float>() + off
                                  : scratch_as<float>(static_cast<size_t>(n), slot);
}
void write_back(const float* y, const Tensor& t, int64_t off, int64_t n) {
  if (t.dtype() != DType::kF32) store_f32(y, t, off, n);
}

// Row `r` of n values of float32 t when r < end (the task's rows), to prefetch; else null, and
// null when MemoryPolicy::prefetch_distance is 0 (off; any other value: a row ahead).
const float* next_row(const Tensor& t, int64_t r, int64_t end, int64_t n) {
  const bool on = memory_policy().prefetch_distance != 0;
  return on && r < end && t.dtype() == DType::kF32 ? t.data<float>() + r * n : nullptr;
}

// The output's type: float32, or what the Cast after the node makes (a fused group).
DType out_dtype(const KernelContext& c) {
  return c.epilogue ? c.epilogue->store : DType::kF32;
}

// The reference kernel on the node as the graph has it: input 0 widened back to float32 and the
// output stored as the fused Cast asks (for the forms the fast paths leave to it).
std::vector<Tensor> reference_f32(const KernelContext& c) {
  if (!c.epilogue) return run_reference(c);
  KernelContext f = c;
  f.epilogue = nullptr;
  const Tensor& x = c.input(0);
  f.inputs[0] = Tensor::empty(DType::kF32, x.shape());
  load_f32(x, 0, x.numel(), f.inputs[0].data<float>());
  std::vector<Tensor> out = run_reference(f);
  Tensor y = Tensor::empty(out_dtype(c), out[0].shape());
  store_f32(out[0].data<float>(), y, 0, y.numel());
  out[0] = y;
  return out;
}

// True when every given input is float32 (missing optional inputs are fine).
bool all_f32(const NodeInfo& n) {
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.dtype(i) != DType::kF32 && n.dtype(i) != DType::kUndefined) return false;
  return n.dtype(0) == DType::kF32;
}

// True when t is one value per channel: [C] (or a scalar when C is 1).
bool per_channel(const Tensor& t, int64_t channels) {
  return t.rank() <= 1 && t.numel() == channels;
}

// ---- Softmax, LogSoftmax ----

// Before opset 13 these coerce x to 2-D at `axis` (default 1) and work on whole rows; from 13 on
// they work along one axis (default -1), which is [outer, len, inner].
std::vector<Tensor> run_softmax(const KernelContext& c, bool log) {
  const Tensor& x = c.input(0);
  const bool per_axis = !params::softmax_coerces_2d(c.node);
  const int64_t rank = x.rank();
  int64_t axis = params::softmax_axis(c.node);
  if (per_axis) {
    axis = rank == 0 ? 0 : c.axis(axis, rank);
  } else {
    if (axis < 0) axis += rank;
    if (axis < 0 || axis > rank)
      throw ValueError(
          cat(c.where(), ": axis ", params::softmax_axis(c.node), " out of range for ", x.str()));
  }
  Tensor y = Tensor::empty(out_dtype(c), x.shape());
  if (x.numel() == 0) return one(std::move(y));
  int64_t outer = 1, len = 1, inner = 1;
  for (int64_t k = 0; k < rank; ++k)
    (k < axis ? outer : per_axis && k > axis ? inner : len) *= x.dim(k);
  const bool f32 = x.dtype() == DType::kF32 && y.dtype() == DType::kF32;
  if (inner == 1) {
    // Half rows go through scratch a few at a time, in L1 (all of them at once in place).
    const int64_t piece = f32 ? outer : std::max<int64_t>(1, 4096 / len);
    // Streamed in auto mode (outputs past the L3): at 4x L3 on a Xeon (AVX-512) 1.19x on rows of
    // 1024 and 1.31x on rows of 8192 (1 thread; 1.16x / 1.35x on 2) over ordinary stores. On Zen 5
    // rows of 8192 ran 0.91x, but that was while Softmax was compute-bound (before its exp and row
    // max got cheaper: 13.6 -> 22.6 GB/s in L2), docs/python.md "Memory policy".
    const bool stream = f32 && stream_stores_for(y.nbytes());
    const bool prefetch = memory_policy().prefetch_distance != 0;
    parallel_for(0, outer, std::max<int64_t>(1, kParallelGrain / len), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r += piece) {
        const int64_t off = r * len, n = std::min(piece, r1 - r) * len;
        float* yr = out_f32(y, off, n, 1);
        float* buf = stream ? scratch_as<float>(2 * static_cast<size_t>(len), 2) : nullptr;
        PTO_ISA_DISPATCH(softmax_rows, read_f32(x, off, n, 0), yr, n / len, len, log, buf,
                         prefetch);
        write_back(yr, y, off, n);
      }
    });
    return one(std::move(y));
  }
  const int64_t block = std::min<int64_t>(inner, 64), blocks = (inner + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, kParallelGrain / (len * block));
  parallel_for(0, outer * blocks, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t o = t / blocks, i0 = t % blocks * block, i1 = std::min(inner, i0 + block);
      if (f32) {
        PTO_ISA_DISPATCH(softmax_columns, x.data<float>() + o * len * inner,
                         y.data<float>() + o * len * inner, len, inner, i0, i1, log);
        continue;
      }
      // The len x (i1 - i0) block gathered as float32, normalized there and scattered back.
      const int64_t w = i1 - i0;
      float *xs = scratch_as<float>(static_cast<size_t>(len * w), 0),
            *ys = scratch_as<float>(static_cast<size_t>(len * w), 1);
      for (int64_t l = 0; l < len; ++l) load_f32(x, (o * len + l) * inner + i0, w, xs + l * w);
      PTO_ISA_DISPATCH(softmax_columns, xs, ys, len, w, 0, w, log);
      for (int64_t l = 0; l < len; ++l) store_f32(ys + l * w, y, (o * len + l) * inner + i0, w);
    }
  });
  return one(std::move(y));
}

// ---- a norm's input 0 as a sum (FusedSum, fusion/sum_norm.h) ----

const FusedSum* sum_of(const KernelContext& c) {
  return c.epilogue ? c.epilogue->sum : nullptr;
}

// The shape of input 0: the sum's when the group computes it.
const Dims& input_shape(const KernelContext& c) {
  const FusedSum* s = sum_of(c);
  return s ? s->shape : c.input(0).shape();
}

// Rows of float32 input, `piece` rows of n floats at a time, to bound the scratch a sum's rows
// take: 16 KiB (with scale, bias and the output rows, within L1), at least two rows
// (layer_norm_rows_streamed's pass takes two).
constexpr int64_t kSumPieceFloats = 4096;

// Where a FusedSum's rows come from: operand k's row r at data[k] + (r % period[k]) * n (an operand
// of the sum's shape has a period of all the rows; position embeddings of the last axes repeat).
struct SumRows {
  const FusedSum& s;
  int64_t n;
  std::vector<const float*> data;
  std::vector<int64_t> period;
  std::vector<float*> out;  // per Add: its output's data, or null
  // When the Adds are a chain ((t0 + t1) + t2) + ... none of whose partial sums the group
  // writes: the operand of each term in order (sum_moments takes them), else empty.
  std::vector<int> chain;
  static constexpr size_t kMaxTerms = 16;

  // Operands shaped otherwise than the kernel reads them (the backend checked the compile-time
  // shapes; these are the run's) are the unfused graph's to compute.
  SumRows(const KernelContext& c, const FusedSum& sum, int64_t rows, int64_t row) : s(sum), n(row) {
    const Dims& shape = sum.shape;
    for (const Tensor& t : sum.operands) {
      auto a = t.shape().begin();
      while (a != t.shape().end() && *a == 1) ++a;
      const auto len = static_cast<size_t>(t.shape().end() - a);
      const int64_t size = t.numel();
      if (t.dtype() != DType::kF32 || len > shape.size() ||
          !std::equal(a, t.shape().end(), shape.end() - static_cast<std::ptrdiff_t>(len)) ||
          size == 0 || n == 0 || size % n != 0 || size / n > rows || rows % (size / n) != 0)
        throw KernelDeclined(cat(c.where(), ": sum operand ", t.str(), " for rows of ", n));
      data.push_back(t.data<float>());
      period.push_back(size / n);
    }
    for (const Tensor& t : sum.outputs) {
      if (t.defined() && t.shape() != shape)
        throw KernelDeclined(cat(c.where(), ": sum output ", t.str(), " for ", dims_str(shape)));
      out.push_back(t.defined() ? t.data<float>() : nullptr);
    }
    const auto& adds = sum.adds;
    bool chained = adds[0].lhs >= 0 && adds[0].rhs >= 0 && adds.size() < kMaxTerms;
    chain = {adds[0].lhs, adds[0].rhs};
    for (size_t i = 1; i < adds.size() && chained; ++i) {
      const int prev = -static_cast<int>(i);  // the previous Add's result
      const int other = adds[i].lhs == prev ? adds[i].rhs : adds[i].lhs;
      chained = (adds[i].lhs == prev || adds[i].rhs == prev) && other >= 0 && !out[i - 1];
      chain.push_back(other);
    }
    if (!chained) chain.clear();
  }

  // The chain's terms at row r.
  void terms(int64_t r, const float** t) const {
    for (size_t i = 0; i < chain.size(); ++i) t[i] = data[chain[i]] + r % period[chain[i]] * n;
  }

  // Row r of the sum into `dst` (n floats), each Add's into its output when the group has it
  // (else into `tmp`, n floats per Add), in the graph's order of additions.
  void row(int64_t r, float* dst, float* tmp) const {
    const size_t last = s.adds.size() - 1;
    auto result = [&](size_t i) {
      return i == last ? dst : out[i] ? out[i] + r * n : tmp + static_cast<int64_t>(i) * n;
    };
    auto term = [&](int t) -> const float* {
      return t >= 0 ? data[t] + r % period[t] * n : result(static_cast<size_t>(-1 - t));
    };
    for (size_t i = 0; i < s.adds.size(); ++i)
      PTO_ISA_DISPATCH(add_rows, term(s.adds[i].lhs), term(s.adds[i].rhs), result(i), n);
    if (out[last] && out[last] + r * n != dst)
      std::memcpy(out[last] + r * n, dst, static_cast<size_t>(n) * sizeof(float));
  }
};

// Calls fn(xs, a, b) for pieces [a, b) of rows [r0, r1) of n floats of input 0, xs the float32
// rows from a on (contiguous), or null where input 0 is not float32 (the caller widens each row):
// x's rows in place, or the sum's, computed a piece at a time while the operands' rows are
// loaded, into scratch (or into the last Add's output when the group writes it, so the norm
// reads them back from the cache).
template <class Fn>
void for_input_rows(const KernelContext& c, const SumRows* sum, int64_t r0, int64_t r1, int64_t n,
                    Fn fn) {
  if (!sum) {
    const Tensor& x = c.input(0);
    fn(x.dtype() == DType::kF32 ? x.data<float>() + r0 * n : nullptr, r0, r1);
    return;
  }
  const int64_t piece = std::max<int64_t>(2, kSumPieceFloats / std::max<int64_t>(n, 1));
  float* last_out = sum->out.back();
  float* buf = last_out ? nullptr : scratch_as<float>(static_cast<size_t>(piece * n), 2);
  float* tmp = scratch_as<float>(static_cast<size_t>(n) * sum->s.adds.size(), 3);
  for (int64_t a = r0; a < r1; a += piece) {
    const int64_t b = std::min(r1, a + piece);
    float* xs = last_out ? last_out + a * n : buf;
    for (int64_t r = a; r < b; ++r) sum->row(r, xs + (r - a) * n, tmp);
    fn(xs, a, b);
  }
}

// ---- LayerNormalization ----

// Scale (or B) fits the fast path when it is the normalized shape X.shape[axis:], leading 1s aside.
bool is_normalized_shape(const Tensor& t, const Dims& x, int64_t axis) {
  if (t.rank() > static_cast<int64_t>(x.size())) return false;
  auto a = t.shape().begin(), b = x.begin() + axis;
  while (a != t.shape().end() && *a == 1) ++a;
  while (b != x.end() && *b == 1) ++b;
  return std::equal(a, t.shape().end(), b, x.end());
}

// The norms' attributes, read once when the kernel is made (the attribute lookups cost more than
// a small row's arithmetic); a context without them (no prepare) reads the node.
params::Norm norm_params(const KernelContext& c) {
  const auto* p = c.prepared_if<params::Norm>();
  return p ? *p : params::norm(c.node);
}
std::any prepare_norm(const NodeInfo& n) {
  return params::norm(n.node);
}

std::vector<Tensor> run_layer_norm(const KernelContext& c) {
  const FusedSum* fused = sum_of(c);
  const Dims& shape = input_shape(c);
  const auto rank = static_cast<int64_t>(shape.size());
  const params::Norm p = norm_params(c);
  const int64_t axis = c.axis(p.axis, rank);
  if (!is_normalized_shape(c.input(1), shape, axis) ||
      (c.has_input(2) && !is_normalized_shape(c.input(2), shape, axis))) {
    if (fused)  // the backend checked the compile-time shapes; the run's differ
      throw KernelDeclined(cat(c.where(), ": Scale or B not of the normalized shape"));
    return reference_f32(c);
  }
  const auto eps = static_cast<float>(p.epsilon);
  int64_t rows = 1, n = 1;
  for (int64_t k = 0; k < rank; ++k) (k < axis ? rows : n) *= shape[k];
  const DType x_dtype = fused ? DType::kF32 : c.input(0).dtype();
  std::optional<SumRows> sum;
  if (fused && rows > 0) sum.emplace(c, *fused, rows, n);  // rows of nothing: declined
  Tensor y = Tensor::empty(out_dtype(c), shape);
  // Mean and InvStdDev only when the node has them (usually only Y is read).
  Tensor mean, inv_std;
  std::vector<float> stats;
  float *mp, *ip;
  if (c.num_outputs > 1) {
    Dims stat_shape = shape;
    for (int64_t k = axis; k < rank; ++k) stat_shape[k] = 1;
    mean = Tensor::empty(DType::kF32, stat_shape);
    inv_std = Tensor::empty(DType::kF32, stat_shape);
    mp = mean.data<float>(), ip = inv_std.data<float>();
  } else {
    stats.resize(2 * static_cast<size_t>(rows));
    mp = stats.data(), ip = stats.data() + rows;
  }
  const float* scale = c.input(1).data<float>();
  const float* bias = c.has_input(2) ? c.input(2).data<float>() : nullptr;
  const bool stream = y.dtype() == DType::kF32 && stream_stores_for(y.nbytes());
  // Streamed float32 rows of whole 64-byte lines, 4096 floats or more: two rows' outputs stream
  // out during the next two rows' pass of sums (layer_norm_rows_streamed). At 4x L3 on Zen 4
  // (AVX-512, 1 thread, alternated with row by row twice), a row a pass then: rows of 4096 1.07x
  // (23.8, 22.7 against 21.9, 21.3 GB/s), but rows of 768 0.65x (20 against 31 GB/s), so short
  // rows stay row by row; two rows a pass over one: 1.15x (rows of 4096), 1.21x (8192).
  const bool pipelined = stream && x_dtype == DType::kF32 && n >= 4096 && n % 32 == 0 &&
                         reinterpret_cast<uintptr_t>(y.raw_data()) % 64 == 0;
  // A sum's rows are in the cache already (computed a piece at a time): nothing to prefetch.
  const bool prefetch = memory_policy().prefetch_distance != 0 && !fused;
  // Rows of at most short_norm_vectors() vectors, float32 in, float32 or (AVX-512) bf16 out: one
  // call per task, each row in registers. Row by row, a row's two dispatched calls and their
  // loops' set-up cost more than its arithmetic: [3136, 16] 137 -> 65 us, [3136, 64] 167 -> 106
  // us (1 thread, Zen 4; onnxruntime 82 and 130); [3136, 96] (ConvNeXt-T's stage 1, 6 vectors,
  // inside the model) 157 -> 92 us, with its bf16 Cast 240 -> 160 (1 thread, Xeon; alone 72 us,
  // onnxruntime 177). Streamed or not, so that the memory policy never changes the bits.
  const Isa isa = active_isa();
  const int64_t lanes = isa == Isa::kAvx512 ? 16 : isa == Isa::kAvx2 ? 8 : 1;
  const bool bf16_out = y.dtype() == DType::kBF16 && isa == Isa::kAvx512;
  const bool short_rows = n > 0 && n <= PTO_ISA_DISPATCH(short_norm_vectors) * lanes &&
                          x_dtype == DType::kF32 && (y.dtype() == DType::kF32 || bf16_out);
  auto norm_rows = [&](const float* xs, int64_t r0, int64_t r1, int64_t end) {
    if (short_rows) {
      auto* out = static_cast<std::byte*>(y.raw_data()) + r0 * n * dtype_size(y.dtype());
      PTO_ISA_DISPATCH(layer_norm_rows_short, xs, out, bf16_out, r1 - r0, n, eps, scale, bias,
                       mp + r0, ip + r0, stream);
      return;
    }
    if (pipelined) {
      PTO_ISA_DISPATCH(layer_norm_rows_streamed, xs, y.data<float>() + r0 * n, r1 - r0, n, eps,
                       scale, bias, mp + r0, ip + r0, prefetch);
      return;
    }
    for (int64_t r = r0; r < r1; ++r) {
      if (n == 0) {  // the reference's moments of nothing
        mp[r] = ip[r] = NAN;
        continue;
      }
      float shift, m, var;
      const float* xr = xs ? xs + (r - r0) * n : read_f32(c.input(0), r * n, n, 0);
      float* yr = out_f32(y, r * n, n, 1);
      PTO_ISA_DISPATCH(moments, xr, n, &shift, &m, &var);
      mp[r] = shift + m;
      ip[r] = 1.0f / std::sqrt(var + eps);
      PTO_ISA_DISPATCH(normalize_affine, xr, yr, n, shift, m, ip[r], scale, bias, stream,
                       r + 1 == end, fused ? nullptr : next_row(c.input(0), r + 1, end, n));
      write_back(yr, y, r * n, n);
    }
  };
  if (sum && !sum->chain.empty()) {
    // A chain of Adds: each row summed and its statistics taken in one pass over the operands
    // (sum_moments), the row kept in L1 (or in the sum's output) for the normalizing pass.
    float* last_out = sum->out.back();
    const int k = static_cast<int>(sum->chain.size());
    parallel_for(0, rows, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t r0, int64_t r1) {
      float* buf = last_out ? nullptr : scratch_as<float>(static_cast<size_t>(n), 2);
      const float* t[SumRows::kMaxTerms];
      for (int64_t r = r0; r < r1; ++r) {
        float* xr = last_out ? last_out + r * n : buf;
        sum->terms(r, t);
        float shift, m, var;
        PTO_ISA_DISPATCH(sum_moments, t, k, xr, n, &shift, &m, &var);
        mp[r] = shift + m;
        ip[r] = 1.0f / std::sqrt(var + eps);
        float* yr = out_f32(y, r * n, n, 1);  // bf16/f16 (a fused Cast): converted on the way
        PTO_ISA_DISPATCH(normalize_affine, xr, yr, n, shift, m, ip[r], scale, bias, stream,
                         r + 1 == r1, nullptr);
        write_back(yr, y, r * n, n);
      }
    });
  } else {
    parallel_for(0, rows, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(n, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for_input_rows(
                       c, sum ? &*sum : nullptr, r0, r1, n,
                       [&](const float* xs, int64_t a, int64_t b) { norm_rows(xs, a, b, r1); });
                 });
  }
  std::vector<Tensor> out;  // moved in: a copy of a tensor is two allocations
  out.push_back(std::move(y));
  if (c.num_outputs > 1) out.push_back(std::move(mean));
  if (c.num_outputs > 2) out.push_back(std::move(inv_std));
  return out;
}

// ---- RMSNormalization ----

// y = x / sqrt(mean(x^2) + epsilon) * scale over the rows of the normalized axes (the reference
// sums in double; here block sums of float squares, within the norms' tolerance).
std::vector<Tensor> run_rms_norm(const KernelContext& c) {
  const FusedSum* fused = sum_of(c);
  const Dims& shape = input_shape(c);
  const auto rank = static_cast<int64_t>(shape.size());
  const params::Norm p = norm_params(c);
  const int64_t axis = c.axis(p.axis, rank);
  if (!is_normalized_shape(c.input(1), shape, axis)) {
    if (fused) throw KernelDeclined(cat(c.where(), ": Scale not of the normalized shape"));
    return reference_f32(c);
  }
  const auto eps = static_cast<float>(p.epsilon);
  int64_t rows = 1, n = 1;
  for (int64_t k = 0; k < rank; ++k) (k < axis ? rows : n) *= shape[k];
  Tensor y = Tensor::empty(out_dtype(c), shape);
  if (n == 0 || rows == 0) return one(std::move(y));
  std::optional<SumRows> sum;
  if (fused) sum.emplace(c, *fused, rows, n);
  const float* scale = c.input(1).data<float>();
  const bool stream = y.dtype() == DType::kF32 && stream_stores_for(y.nbytes());
  parallel_for(0, rows, std::max<int64_t>(1, kParallelGrain / n), [&](int64_t r0, int64_t r1) {
    for_input_rows(c, sum ? &*sum : nullptr, r0, r1, n, [&](const float* xs, int64_t a, int64_t b) {
      for (int64_t r = a; r < b; ++r) {
        const float* xr = xs ? xs + (r - a) * n : read_f32(c.input(0), r * n, n, 0);
        float* yr = out_f32(y, r * n, n, 1);
        const float inv = 1.0f / std::sqrt(PTO_ISA_DISPATCH(mean_square, xr, n) + eps);
        PTO_ISA_DISPATCH(normalize_affine, xr, yr, n, 0.0f, 0.0f, inv, scale, nullptr, stream,
                         r + 1 == r1, fused ? nullptr : next_row(c.input(0), r + 1, r1, n));
        write_back(yr, y, r * n, n);
      }
    });
  });
  return one(std::move(y));
}

bool accepts_layer_norm(const NodeInfo& n) {
  if (!all_f32(n) || params::norm(n.node).stash_type != 1) return false;
  for (const TensorType& t : n.outputs)
    if (t.dtype != DType::kF32 && t.dtype != DType::kUndefined) return false;
  return true;
}

// ---- BatchNormalization (inference), InstanceNormalization, GroupNormalization ----

// y = (x - mean[c]) * a[c] + b[c] over N * C planes of `size` elements.
void normalize_planes(const Tensor& x, const Tensor& y, int64_t planes, int64_t channels,
                      int64_t size, const float* mean, const float* a, const float* b) {
  parallel_for(0, planes, std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(size, 1)),
               [&](int64_t p0, int64_t p1) {
                 for (int64_t p = p0; p < p1; ++p) {
                   const int64_t ch = p % channels;
                   float* yp = out_f32(y, p * size, size, 1);
                   PTO_ISA_DISPATCH(normalize, read_f32(x, p * size, size, 0), yp, size, mean[ch],
                                    0.0f, a[ch], b[ch]);
                   write_back(yp, y, p * size, size);
                 }
               });
}

std::vector<Tensor> run_batch_norm(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() < 2) return reference_f32(c);
  const int64_t channels = x.dim(1);
  for (size_t i = 1; i <= 4; ++i)
    if (!per_channel(c.input(i), channels)) return reference_f32(c);
  const double eps = c.node.attr_float("epsilon");
  const float *scale = c.input(1).data<float>(), *var = c.input(4).data<float>();
  std::vector<float> a(static_cast<size_t>(channels));
  for (int64_t k = 0; k < channels; ++k)
    a[k] = static_cast<float>(scale[k] / std::sqrt(static_cast<double>(var[k]) + eps));
  Tensor y = Tensor::empty(out_dtype(c), x.shape());
  if (x.numel() == 0) return one(std::move(y));
  const int64_t planes = x.dim(0) * channels, size = x.numel() / planes;
  const float *mean = c.input(3).data<float>(), *bias = c.input(2).data<float>();
  if (size < 16 && x.dtype() == DType::kF32 && y.dtype() == DType::kF32) {
    // Planes of a few elements (BatchNorm1d on [tokens, channels], LeViT's): each batch row is
    // one run of channels * size values with the per-channel factors spread along it, instead
    // of a call per tiny plane (18x onnxruntime's time on LeViT-128S's).
    const int64_t row = channels * size;
    std::vector<float> m(static_cast<size_t>(row)), mul(m.size()), add(m.size());
    for (int64_t k = 0; k < row; ++k) {
      const int64_t ch = k / size;
      m[k] = mean[ch], mul[k] = a[ch], add[k] = bias[ch];
    }
    const float* xs = x.data<float>();
    float* ys = y.data<float>();
    parallel_for(0, x.dim(0), std::max<int64_t>(1, kParallelGrain / row),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r)
                     for (int64_t k = 0; k < row; ++k)
                       ys[r * row + k] = (xs[r * row + k] - m[k]) * mul[k] + add[k];
                 });
    return one(std::move(y));
  }
  normalize_planes(x, y, planes, channels, size, mean, a.data(), bias);
  return one(std::move(y));
}

bool accepts_batch_norm(const NodeInfo& n) {
  const bool training =
      opset_of(n.node) >= 14 ? n.node.attr_int("training_mode") != 0 : n.outputs.size() > 1;
  return all_f32(n) && !training && n.outputs.size() == 1;
}

// Normalizes N * groups groups of `channels / groups` channels each, with per-channel scale and
// bias (or per-group ones when `per_group`).
std::vector<Tensor> normalize_groups(const KernelContext& c, int64_t groups, bool per_group) {
  const Tensor& x = c.input(0);
  const int64_t channels = x.dim(1);
  const float eps = static_cast<float>(c.node.attr_float("epsilon"));
  Tensor y = Tensor::empty(out_dtype(c), x.shape());
  if (x.numel() == 0) return one(std::move(y));
  const int64_t count = x.dim(0) * groups, per = channels / groups;
  const int64_t spatial = x.numel() / (x.dim(0) * channels), size = per * spatial;
  const float *scale = c.input(1).data<float>(), *bias = c.input(2).data<float>();
  parallel_for(0, count, std::max<int64_t>(1, kParallelGrain / size), [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      float shift, mean, var;
      const float* xg = read_f32(x, g * size, size, 0);
      float* yg = out_f32(y, g * size, size, 1);
      PTO_ISA_DISPATCH(moments, xg, size, &shift, &mean, &var);
      const float inv = 1.0f / std::sqrt(var + eps);
      for (int64_t k = 0; k < per; ++k) {
        const int64_t p = per_group ? g % groups : g % groups * per + k;
        PTO_ISA_DISPATCH(normalize, xg + k * spatial, yg + k * spatial, spatial, shift, mean,
                         scale[p] * inv, bias[p]);
      }
      write_back(yg, y, g * size, size);
    }
  });
  return one(std::move(y));
}

std::vector<Tensor> run_instance_norm(const KernelContext& c) {
  const Tensor& x = c.input(0);
  if (x.rank() < 2 || !per_channel(c.input(1), x.dim(1)) || !per_channel(c.input(2), x.dim(1)))
    return reference_f32(c);
  return normalize_groups(c, x.dim(1), false);
}

std::vector<Tensor> run_group_norm(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t groups = c.attrs().get_int("num_groups");
  if (x.rank() < 2 || groups < 1 || x.dim(1) % groups != 0) return reference_f32(c);
  const int64_t channels = x.dim(1);
  if (per_channel(c.input(1), channels) && per_channel(c.input(2), channels) &&
      c.input(1).rank() == 1 && c.input(2).rank() == 1)
    return normalize_groups(c, groups, false);
  const bool per_group = opset_of(c.node) < 21 && c.input(1).rank() == 1 &&
                         c.input(2).rank() == 1 && c.input(1).numel() == groups &&
                         c.input(2).numel() == groups;
  return per_group ? normalize_groups(c, groups, true) : reference_f32(c);
}

// GroupNormBlocked: GroupNormalization of a blocked X [N, Cb, H, W, c] (src/ir/ops/
// blocked_layout.cpp) in two passes over X. First, per task (a run of pixels of one channel
// block), each lane's sums of d = x - shift and d^2, shift being the lane's first pixel (so data
// clustered far from 0 loses nothing); the tasks' sums are added per channel in double and then
// per group: mean m and, exactly, sum (x - m)^2 = s2 + 2 (shift - m) s1 + count (shift - m)^2.
// Second, y = (x - shift) a + b per lane, a = scale / sqrt(var + eps) and b = bias +
// (shift - m) a, then the Relu or SiLU. The padded lanes get a = b = 0.
std::vector<Tensor> run_group_norm_blocked(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int64_t C = c.attrs().get_int("channels"), G = c.attrs().get_int("num_groups");
  if (x.rank() != 5 || !x.is_contiguous() || x.dtype() != DType::kF32 || c.input(1).numel() < C ||
      c.input(2).numel() < C || C % G != 0 || C > x.dim(1) * x.dim(4))
    return reference_f32(c);
  const int64_t N = x.dim(0), Cb = x.dim(1), HW = x.dim(2) * x.dim(3), lanes = x.dim(4);
  const int block = static_cast<int>(lanes);
  Tensor y = Tensor::empty(DType::kF32, x.shape());
  if (x.numel() == 0) return one(std::move(y));
  const Tensor scale_t = c.input(1).contiguous(), bias_t = c.input(2).contiguous();
  const float *scale = scale_t.data<float>(), *bias = bias_t.data<float>();
  const float* xs = x.data<float>();
  float* ys = y.data<float>();
  const double eps = c.attrs().get_float("epsilon", 1e-5);
  const std::string activation = c.attrs().get_string("activation", "");
  const LaneAct act = activation == "Relu"   ? LaneAct::kRelu
                      : activation == "Silu" ? LaneAct::kSilu
                                             : LaneAct::kNone;
  // Runs of pixels per task: enough tasks to spread a batch-1 tensor of few blocks, each at
  // least kParallelGrain floats.
  const int64_t run = std::max<int64_t>(kParallelGrain / lanes, (HW + 3) / 4);
  const int64_t runs = (HW + run - 1) / run, tasks = N * Cb * runs;
  const size_t width = static_cast<size_t>(lanes);
  std::vector<float> shift(static_cast<size_t>(N * Cb) * width);
  for (int64_t nb = 0; nb < N * Cb; ++nb)
    std::copy_n(xs + nb * HW * lanes, lanes, shift.data() + nb * lanes);
  std::vector<double> s1(static_cast<size_t>(tasks) * width, 0.0), s2(s1.size(), 0.0);
  parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t nb = t / runs, p0 = t % runs * run, p1 = std::min(HW, p0 + run);
      PTO_ISA_DISPATCH(lane_sums, xs + (nb * HW + p0) * lanes, p1 - p0, block,
                       shift.data() + nb * lanes, s1.data() + t * lanes, s2.data() + t * lanes);
    }
  });
  // Per image and group: each channel's sums over its runs, the group's mean and deviation, then
  // each channel's a and b. Channel ch of image n is element n * Cb * lanes + ch of shift, a, b.
  std::vector<float> a(shift.size(), 0.0f), b(shift.size(), 0.0f);
  const int64_t per = C / G;
  const double count = static_cast<double>(per * HW), pixels = static_cast<double>(HW);
  std::vector<double> c1(static_cast<size_t>(per)), c2(c1.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t ch0 = n * Cb * lanes + g * per;  // the group's first channel in shift, a, b
      double total = 0;
      for (int64_t k = 0; k < per; ++k) {
        const int64_t at = ch0 + k, first = (at / lanes * runs) * lanes + at % lanes;
        c1[k] = c2[k] = 0;
        for (int64_t r = 0; r < runs; ++r)
          c1[k] += s1[first + r * lanes], c2[k] += s2[first + r * lanes];
        total += static_cast<double>(shift[at]) * pixels + c1[k];
      }
      const double mean = total / count;
      double m2 = 0;
      for (int64_t k = 0; k < per; ++k) {
        const double d = static_cast<double>(shift[ch0 + k]) - mean;
        m2 += c2[k] + 2 * d * c1[k] + pixels * d * d;
      }
      const double inv = 1 / std::sqrt(std::max(m2, 0.0) / count + eps);
      for (int64_t k = 0; k < per; ++k) {
        const int64_t at = ch0 + k, ch = g * per + k;
        const double ak = scale[ch] * inv;
        a[at] = static_cast<float>(ak);
        b[at] = static_cast<float>(bias[ch] + (static_cast<double>(shift[at]) - mean) * ak);
      }
    }
  parallel_for(0, tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t nb = t / runs, p0 = t % runs * run, p1 = std::min(HW, p0 + run);
      const int64_t at = (nb * HW + p0) * lanes;
      PTO_ISA_DISPATCH(lane_affine, xs + at, ys + at, p1 - p0, block, shift.data() + nb * lanes,
                       a.data() + nb * lanes, b.data() + nb * lanes, act);
    }
  });
  return one(std::move(y));
}

}  // namespace

void register_norm_kernels(KernelRegistry& r) {
  for (bool log : {false, true})
    r.add(log ? "LogSoftmax" : "Softmax",
          {.accepts = [](const NodeInfo& n) { return n.dtype(0) == DType::kF32; },
           .run = [log](const KernelContext& c) { return run_softmax(c, log); },
           .takes_casts = true});
  // The norms: parameter shapes the fast path does not cover go to the reference at run time.
  const std::pair<const char*, Kernel> norms[] = {
      {"LayerNormalization",
       {.accepts = accepts_layer_norm,
        .prepare = prepare_norm,
        .run = run_layer_norm,
        .takes_sums = true}},
      {"RMSNormalization",
       {.accepts = accepts_layer_norm,
        .prepare = prepare_norm,
        .run = run_rms_norm,
        .takes_sums = true}},
      {"BatchNormalization", {.accepts = accepts_batch_norm, .run = run_batch_norm}},
      {"InstanceNormalization", {.accepts = all_f32, .run = run_instance_norm}},
      {"GroupNormalization", {.accepts = all_f32, .run = run_group_norm}}};
  for (auto [op, k] : norms) {
    k.reference_at_run_time = k.takes_casts = true;
    r.add(op, std::move(k));
  }
  Kernel blocked{.accepts = all_f32, .run = run_group_norm_blocked};
  blocked.reference_at_run_time = true;
  r.add("GroupNormBlocked", std::move(blocked));
}

}  // namespace pto::cpu
