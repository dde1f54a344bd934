// TileKernel: runs a TileProgram on the CPU.
//
// The output shape is reduced to rows: dimensions of size 1 are dropped and adjacent dimensions
// merged wherever every input steps through them alike, so each input is, along a row, either
// contiguous or one repeated value. The tiling planner (tile/tile_planner.h) cuts that space into
// tiles of tile.rows x tile.cols values on every run: a block of rows never crosses a step of the
// next-to-last merged dimension (the row group), so each input advances by one fixed stride from
// row to row inside a tile. Tiles run in parallel in fixed chunks; the per-ISA interpreter
// (tile_exec_impl.h) runs the whole program on one tile while its registers are in cache.
#include "backend/cpu/tile_kernel.h"

#include <algorithm>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/tile_exec.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/memory_policy.h"
#include "pto/parallel.h"

namespace pto::cpu {

PTO_ISA_DECLARE(void exec_tile(const TileArgs& t);)

namespace {

TileDType tile_dtype(DType d, const std::string& what) {
  if (std::optional<TileDType> t = tile_dtype_of(d)) return *t;
  throw ValueError(cat("[TileKernel] ", what, ": dtype ", dtype_name(d), " is not supported"));
}

// Which instructions may write their result straight into an output: the last definition of a
// register before the store of it to an f32 output (one per output).
std::vector<int8_t> direct_writes(const TileProgram& p) {
  std::vector<int8_t> direct(p.code.size(), -1);
  for (size_t s = 0; s < p.code.size(); ++s) {
    const TileInstr& st = p.code[s];
    if (st.op != TileOpcode::kStore || p.outputs[st.operand].dtype != TileDType::kF32 ||
        st.operand > 127)
      continue;
    for (size_t d = s; d-- > 0;) {
      const TileInstr& def = p.code[d];
      if (def.op == TileOpcode::kStore || def.dst != st.a) continue;
      if (def.op != TileOpcode::kLoad && def.op != TileOpcode::kConst && direct[d] < 0)
        direct[d] = static_cast<int8_t>(st.operand);
      break;
    }
  }
  return direct;
}

// Per instruction that direct_writes marks: whether nothing but its store reads the register it
// defines (before the register is defined again), so that with streaming stores it may write the
// output itself and leave its store nothing to do. Otherwise a later read would load the value
// back from the streamed-to output (from memory), so the register stays in scratch and the store
// streams it.
std::vector<uint8_t> direct_streams(const TileProgram& p, const std::vector<int8_t>& direct) {
  std::vector<uint8_t> ok(p.code.size(), 0);
  for (size_t d = 0; d < p.code.size(); ++d) {
    if (direct[d] < 0) continue;
    const int16_t r = p.code[d].dst;
    bool only_store = true, stored = false;
    for (size_t k = d + 1; k < p.code.size() && only_store; ++k) {
      const TileInstr& in = p.code[k];
      const bool reads = in.op != TileOpcode::kLoad && in.op != TileOpcode::kConst &&
                         (in.a == r || in.b == r || in.c == r);
      if (in.op == TileOpcode::kStore) {
        if (!reads) continue;
        if (stored || in.operand != direct[d]) only_store = false;
        stored = true;
        continue;
      }
      if (reads)
        only_store = false;
      else if (in.dst == r)
        break;  // defined again: later reads see the new value
    }
    ok[d] = only_store && stored ? 1 : 0;
  }
  return ok;
}

// A GEMM/conv epilogue block's capacity. The GEMM's blocking decides the block, so this keeps the
// rule it was tuned with: half of L1 for the registers, the rest for the lines streaming through.
int64_t epilogue_capacity(int num_regs) {
  const size_t l1 = cache_model().l1d;
  int64_t per_reg = static_cast<int64_t>(l1 / 2 / sizeof(float)) / (num_regs + 1);
  int64_t cap = 256;
  while (cap * 2 <= per_reg && cap < 4096) cap *= 2;
  return cap;
}

// Up to N values in place, more on the heap: the arrays a run builds (merged dimensions, operand
// views), which at the usual ranks and operand counts then allocate nothing. On a tiny tensor
// (a Scan body's step) malloc and free were most of a run.
template <class T, size_t N>
class InlineVec {
 public:
  explicit InlineVec(size_t n = 0, const T& v = T()) {
    for (size_t i = 0; i < n; ++i) push_back(v);
  }
  void push_back(const T& v) {
    if (heap_.empty() && size_ < N) {
      local_[size_++] = v;
      return;
    }
    if (heap_.empty()) heap_.assign(local_, local_ + size_);
    heap_.push_back(v);
    ++size_;
  }
  T* data() { return heap_.empty() ? local_ : heap_.data(); }
  const T* data() const { return heap_.empty() ? local_ : heap_.data(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  T local_[N] = {};
  std::vector<T> heap_;  // all values, once there are more than N
  size_t size_ = 0;
};

// The output's merged dimensions and each input's strides through them.
struct RowSpace {
  InlineVec<int64_t, 8> dims;
  InlineVec<int64_t, 32> strides;  // [dim][input]
  size_t num_inputs = 0;
  int64_t stride(size_t k, size_t d) const { return strides[d * num_inputs + k]; }
};

// keep_last: the last axis stays a dimension of its own (the rows a reduction runs over).
RowSpace merge_dims(const Dims& out, const InlineVec<const Dims*, 8>& inputs, bool keep_last) {
  const size_t rank = out.size(), ni = inputs.size();
  InlineVec<int64_t, 32> full(ni * rank, 0);  // [input][dim]
  for (size_t k = 0; k < ni; ++k) {
    const Dims& s = *inputs[k];
    if (s.size() > rank)
      throw ValueError(cat("[TileKernel] input ", k, " ", dims_str(s), " has more dimensions than ",
                           "the output ", dims_str(out)));
    int64_t step = 1;
    for (size_t d = s.size(); d-- > 0;) {
      int64_t o = out[rank - s.size() + d];
      if (s[d] != o && s[d] != 1)
        throw ValueError(cat("[TileKernel] input ", k, " ", dims_str(s),
                             " does not broadcast to the output ", dims_str(out)));
      if (s[d] != 1) full[k * rank + rank - s.size() + d] = step;
      step *= s[d];
    }
  }
  RowSpace r;
  r.num_inputs = ni;
  for (size_t d = 0; d < rank; ++d) {
    const bool last = keep_last && d + 1 == rank;
    if (out[d] == 1 && !last) continue;
    const size_t prev = (r.dims.size() - 1) * ni;  // the last merged dimension's strides
    bool merge = !r.dims.empty() && !last;
    for (size_t k = 0; k < ni && merge; ++k)
      merge = r.strides[prev + k] == full[k * rank + d] * out[d];
    if (merge) {
      r.dims.back() *= out[d];
      for (size_t k = 0; k < ni; ++k) r.strides[prev + k] = full[k * rank + d];
    } else {
      r.dims.push_back(out[d]);
      for (size_t k = 0; k < ni; ++k) r.strides.push_back(full[k * rank + d]);
    }
  }
  if (r.dims.empty()) {
    r.dims.push_back(1);
    for (size_t k = 0; k < ni; ++k) r.strides.push_back(0);
  }
  return r;
}

TileSpace space_of(const RowSpace& rs) {
  const size_t nd = rs.dims.size();
  TileSpace s;
  s.cols = rs.dims.back();
  s.row_group = nd >= 2 ? rs.dims[nd - 2] : 1;
  for (size_t d = 0; d + 1 < nd; ++d) s.rows *= rs.dims[d];
  return s;
}

std::string kernel_name(const TileProgram& p, const std::string& name) {
  if (!name.empty()) return name;
  return p.outputs.empty() ? std::string("tile kernel") : cat("kernel '", p.outputs[0].name, "'");
}

thread_local std::vector<float> t_scratch;

constexpr int64_t kStripValues = 512;

float* scratch_for(const TileProgram& p, int64_t capacity) {
  size_t need = static_cast<size_t>(std::max(p.num_regs, 1) * capacity);
  if (t_scratch.size() < need) t_scratch.resize(need);
  return t_scratch.data();
}

}  // namespace

TileKernel::TileKernel(TileProgram program, std::string name, const std::vector<int64_t>& pinned)
    : program_(std::move(program)) {
  if (program_.num_regs > kTileMaxRegs)
    throw ValueError(cat("[TileKernel] ", program_.num_regs, " registers, at most ", kTileMaxRegs));
  if (program_.outputs.empty()) throw ValueError("[TileKernel] a program without outputs");
  facts_ = TileFacts::of(program_, kernel_name(program_, name));
  if (!pinned.empty()) {
    pinned_ = check_pinned_tile(facts_, pinned, cache_model());
    if (program_.shape && !program_.shape->empty() && program_.shape->back().is_known())
      check_pinned_rows(facts_, *pinned_, program_.shape->back().value);
  }
  direct_ = direct_writes(program_);
  direct_stream_ = direct_streams(program_, direct_);
  capacity_ = epilogue_capacity(program_.num_regs);
}

TilePlan TileKernel::plan(const Dims& out, const std::vector<Dims>& in) const {
  InlineVec<const Dims*, 8> ins;
  for (const Dims& d : in) ins.push_back(&d);
  const RowSpace rs = merge_dims(out, ins, program_.has_row_reduction());
  return plan_tiles(facts_, space_of(rs), cache_model(), num_threads(), pinned_);
}

std::string TileKernel::describe() const {
  std::string s = program_.str();
  if (!s.empty() && s.back() != '\n') s += "\n";
  auto known = [](const std::optional<Shape>& shape, Dims& dims) {
    if (!shape) return false;
    for (const Dim& d : *shape) {
      if (!d.is_known()) return false;
      dims.push_back(d.value);
    }
    return true;
  };
  Dims out;
  std::vector<Dims> in(program_.inputs.size());
  bool is_static = known(program_.shape, out);
  for (size_t k = 0; k < in.size() && is_static; ++k)
    is_static = known(program_.inputs[k].shape, in[k]);
  if (is_static && checked_numel(out) > 0) return s + "  plan: " + plan(out, in).str() + "\n";
  return s + "  plan: " + describe_tile_rule(facts_, cache_model(), pinned_) + "\n";
}

void TileKernel::run(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) const {
  const TileProgram& p = program_;
  if (inputs.size() != p.inputs.size() || outputs.size() != p.outputs.size())
    throw ValueError(cat("[TileKernel] expected ", p.inputs.size(), " inputs and ",
                         p.outputs.size(), " outputs, got ", inputs.size(), " and ",
                         outputs.size()));
  const Dims& shape = outputs[0].shape();
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (outputs[k].shape() != shape || !outputs[k].is_contiguous() ||
        tile_dtype(outputs[k].dtype(), "output") != p.outputs[k].dtype)
      throw ValueError(cat("[TileKernel] output ", k, " ", outputs[k].str(),
                           ": expected a contiguous tensor of shape ", dims_str(shape)));
  }
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!inputs[k].is_contiguous() || tile_dtype(inputs[k].dtype(), "input") != p.inputs[k].dtype)
      throw ValueError(cat("[TileKernel] input ", k, " ", inputs[k].str(),
                           ": expected a contiguous tensor of the program's dtype"));
  if (outputs[0].numel() == 0) return;

  InlineVec<const Dims*, 8> in_shapes;
  for (const Tensor& t : inputs) in_shapes.push_back(&t.shape());
  const RowSpace rs = merge_dims(shape, in_shapes, p.has_row_reduction());
  const size_t nd = rs.dims.size();
  const TilePlan plan = plan_tiles(facts_, space_of(rs), cache_model(),
                                   in_parallel_region() ? 1 : num_threads(), pinned_);
  const int64_t n = plan.space.cols, group = plan.space.row_group;
  const int64_t blocks_per_group = plan.row_tiles / (plan.space.rows / group);
  const TileShape tile = plan.tile;
  size_t out_bytes = 0;
  for (const Tensor& t : outputs) out_bytes += t.nbytes();
  const bool stream = stream_stores_for(out_bytes);
  // Operands far larger than the last-level cache: tiles run in strips (TileArgs::strip), so
  // each tile's reads from memory and its stores overlap. Strips of 512 values measured 1.15-1.3x
  // on elementwise chains at 4x L3 (1 thread, Zen 5; tiles of 1024 values); on operands that fit
  // the caches the extra instruction dispatch per strip cost up to 30%, so they run whole tiles.
  size_t in_bytes = 0;
  for (const Tensor& t : inputs) in_bytes += t.nbytes();
  const int64_t strip = p.has_row_reduction()                           ? 0
                        : forced_strip_ > 0                             ? forced_strip_
                        : in_bytes + out_bytes > device_info().l3_bytes ? kStripValues
                                                                        : 0;
  // The built-in prefetch (-1): with strips, the next strip's lines (the hardware prefetchers
  // alone leave a strip's reads waiting while the one before computes): relu(2x + 1) 1.32x on 1
  // thread and 1.30x on 2 at 4x L3 on a Xeon (AVX-512) against 0 in the same run, sigmoid(a) b + 1
  // 1.00x / 1.03x; spread over the strip's instructions (TileArgs::prefetch_spread) rather than
  // all as it starts, where perf put 62% of the tile interpreter's time on the stalled prefetch
  // loop (1.02-1.37x over prefetch_distance 32 in 13 of 14 alternated pairs on the chains, 1
  // thread, Xeon, docs/python.md). Only where one input streams from memory: with two, the
  // prefetches cost more than they bring (AMD Zen 4, 1 thread, 128 MiB operands, no prefetch
  // against the built-in one, best of 4 alternated rounds: a b + 1 1.07-1.12x, sigmoid(a) b + 1
  // 1.21-1.26x, a b + a / b 1.11-1.13x; relu(2x + 1) 0.86-0.93x and sigmoid(a) 2 + 1 1.00x keep
  // it; halving the lines per input or prefetching a strip further lost too). Whole tiles: none.
  // A distance the policy sets is prefetched as each tile (strip) starts.
  int streamed = 0;  // inputs larger than the L2: the ones read from memory, not from a cache
  for (const Tensor& t : inputs) streamed += t.nbytes() > device_info().l2_bytes;
  const int policy_prefetch = memory_policy().prefetch_distance;
  const int prefetch = policy_prefetch >= 0         ? policy_prefetch
                       : strip > 0 && streamed <= 1 ? static_cast<int>(strip * 4 / 64)
                                                    : 0;
  const bool spread = policy_prefetch < 0 && prefetch > 0;

  auto run_range = [&](int64_t begin, int64_t end) {
    float* scratch = scratch_for(p, plan.capacity);
    InlineVec<TileOperandView, 8> in(inputs.size()), out(outputs.size());
    InlineVec<int64_t, 8> idx(nd);
    for (int64_t t = begin; t < end; ++t) {
      // Tile t: row tile t / col_tiles (block b of row group g), column tile t % col_tiles.
      const int64_t rt = t / plan.col_tiles, b = rt % blocks_per_group;
      const int64_t row = rt / blocks_per_group * group + b * tile.rows;
      const int64_t nrows = std::min(tile.rows, group - b * tile.rows);
      const int64_t col0 = t % plan.col_tiles * tile.cols;
      const int64_t width = std::min(tile.cols, n - col0);
      for (size_t d = nd - 1, r = static_cast<size_t>(row); d-- > 0;) {
        idx[d] = static_cast<int64_t>(r % static_cast<size_t>(rs.dims[d]));
        r /= static_cast<size_t>(rs.dims[d]);
      }
      for (size_t k = 0; k < inputs.size(); ++k) {
        int64_t off = col0 * rs.stride(k, nd - 1);
        for (size_t d = 0; d + 1 < nd; ++d) off += idx[d] * rs.stride(k, d);
        in[k] = {
            static_cast<const char*>(inputs[k].raw_data()) + off * tile_itemsize(p.inputs[k].dtype),
            nd >= 2 ? rs.stride(k, nd - 2) : 0, rs.stride(k, nd - 1), p.inputs[k].dtype};
      }
      for (size_t k = 0; k < outputs.size(); ++k)
        out[k] = {static_cast<char*>(outputs[k].raw_data()) +
                      (row * n + col0) * static_cast<int64_t>(tile_itemsize(p.outputs[k].dtype)),
                  n, 1, p.outputs[k].dtype};
      TileArgs args{.code = p.code.data(),
                    .num_code = static_cast<int>(p.code.size()),
                    .direct = direct_.data(),
                    .direct_stream = direct_stream_.data(),
                    .rows = nrows,
                    .width = width,
                    .inputs = in.data(),
                    .outputs = out.data(),
                    .scratch = scratch,
                    .capacity = plan.capacity,
                    .stream = stream,
                    .fence = t + 1 == end,
                    .prefetch_lines = prefetch,
                    .prefetch_spread = spread,
                    .strip = strip};
      PTO_ISA_DISPATCH(exec_tile, args);
    }
  };
  if (plan.whole) {
    run_range(0, plan.tiles);
    return;
  }
  // plan.tasks chunks of consecutive tiles, the first tiles % tasks one longer: fixed by the
  // plan, so the result does not depend on which thread runs which.
  const int64_t base = plan.tiles / plan.tasks, extra = plan.tiles % plan.tasks;
  parallel_for(0, plan.tasks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * base + std::min(c, extra);
      run_range(b, b + base + (c < extra ? 1 : 0));
    }
  });
}

void TileKernel::run_block(const EpilogueOperand* operands, float* c, int64_t ldc, int64_t m0,
                           int64_t m, int64_t n0, int64_t n) const {
  const TileProgram& p = program_;
  if (p.inputs.size() > static_cast<size_t>(kTileMaxRegs) || p.outputs.size() != 1)
    throw ValueError(
        cat("[TileKernel] an epilogue takes at most ", kTileMaxRegs, " inputs and one output"));
  if (m <= 0 || n <= 0) return;
  float* scratch = scratch_for(p, capacity_);
  const int64_t width = std::min(n, capacity_);
  const int64_t block = std::max<int64_t>(1, capacity_ / width);
  TileOperandView in[kTileMaxRegs];
  const size_t num_in = p.inputs.size();
  for (int64_t i0 = 0; i0 < m; i0 += block) {
    const int64_t rows = std::min(block, m - i0);
    for (int64_t j0 = 0; j0 < n; j0 += width) {
      const int64_t w = std::min(width, n - j0);
      float* cb = c + i0 * ldc + j0;
      in[0] = {cb, ldc, 1, TileDType::kF32};
      for (size_t k = 1; k < num_in; ++k) {
        const EpilogueOperand& o = operands[k - 1];
        in[k] = {o.data + (m0 + i0) * o.row_stride + (n0 + j0) * o.col_stride, o.row_stride,
                 o.col_stride, TileDType::kF32};
      }
      TileOperandView out{cb, ldc, 1, TileDType::kF32};
      TileArgs args{.code = p.code.data(),
                    .num_code = static_cast<int>(p.code.size()),
                    .direct = nullptr,  // output 0 is input 0: written only by the store
                    .rows = rows,
                    .width = w,
                    .inputs = in,
                    .outputs = &out,
                    .scratch = scratch,
                    .capacity = capacity_};
      PTO_ISA_DISPATCH(exec_tile, args);
    }
  }
}

void run_tile_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m, int64_t n0,
                       int64_t n) {
  if (ep.bias_kind != Epilogue::Bias::kNone) {  // a conv's own bias is part of the accumulator
    Epilogue bias;
    bias.bias_kind = ep.bias_kind;
    bias.bias = ep.bias;
    apply_epilogue(bias, c, ldc, m0, m, n0, n);
  }
  ep.tile->run_block(ep.tile_operands, c, ldc, m0, m, n0, n);
}

Epilogue epilogue_at(const Epilogue& ep, int64_t image, int64_t row0, int64_t col0,
                     EpilogueOperand* buf) {
  if (!ep.tile) return ep;
  Epilogue moved = ep;
  const size_t count = ep.tile->program().inputs.size() - 1;
  for (size_t k = 0; k < count; ++k) {
    EpilogueOperand o = ep.tile_operands[k];
    o.data += image * o.image_stride + row0 * o.row_stride + col0 * o.col_stride;
    buf[k] = o;
  }
  moved.tile_operands = buf;
  return moved;
}

void run_tile_program(const TileProgram& program, const std::vector<Tensor>& inputs,
                      std::vector<Tensor>& outputs) {
  TileKernel(program).run(inputs, outputs);
}

}  // namespace pto::cpu
