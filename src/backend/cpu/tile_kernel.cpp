// TileKernel: runs a TileProgram on the CPU.
//
// The output shape is reduced to rows: dimensions of size 1 are dropped and adjacent dimensions
// merged wherever every input steps through them alike, so each input is, along a row, either
// contiguous or one repeated value. A tile is a contiguous run of the flattened output of at most
// `capacity` values: a piece of one row when rows are long, else a block of whole rows within one
// step of the next-to-last merged dimension (so each input advances by one fixed stride from row
// to row). Tiles run in parallel in fixed chunks; the per-ISA interpreter (tile_exec_impl.h) runs
// the whole program on one tile while its registers are in L1.
#include "backend/cpu/tile_kernel.h"

#include <algorithm>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/tile_exec.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::cpu {

PTO_ISA_DECLARE(void exec_tile(const TileArgs& t);)

namespace {

constexpr int64_t kGrainValues = 32768;  // output values per parallel chunk at least

TileDType tile_dtype(DType d, const std::string& what) {
  if (d == DType::kF32) return TileDType::kF32;
  if (d == DType::kBool) return TileDType::kBool;
  throw ValueError(cat("[TileKernel] ", what, ": dtype ", dtype_name(d), " is not supported"));
}

size_t itemsize(TileDType d) {
  return d == TileDType::kBool ? 1 : 4;
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

int64_t choose_capacity(int num_regs) {
  const size_t l1 = cache_model().l1d;
  // Half of L1 for the registers, the rest for the input and output lines streaming through.
  int64_t per_reg = static_cast<int64_t>(l1 / 2 / sizeof(float)) / (num_regs + 1);
  int64_t cap = 256;
  while (cap * 2 <= per_reg && cap < 4096) cap *= 2;
  return cap;
}

// The output's merged dimensions and each input's strides through them.
struct RowSpace {
  std::vector<int64_t> dims;
  std::vector<std::vector<int64_t>> strides;  // [input][dim]
};

// keep_last: the last axis stays a dimension of its own (the rows a reduction runs over).
RowSpace merge_dims(const Dims& out, const std::vector<Tensor>& inputs, bool keep_last) {
  const size_t rank = out.size();
  std::vector<std::vector<int64_t>> full(inputs.size(), std::vector<int64_t>(rank, 0));
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Dims& s = inputs[k].shape();
    if (s.size() > rank)
      throw ValueError(cat("[TileKernel] input ", k, " ", dims_str(s), " has more dimensions than ",
                           "the output ", dims_str(out)));
    int64_t step = 1;
    for (size_t d = s.size(); d-- > 0;) {
      int64_t o = out[rank - s.size() + d];
      if (s[d] != o && s[d] != 1)
        throw ValueError(cat("[TileKernel] input ", k, " ", dims_str(s),
                             " does not broadcast to the output ", dims_str(out)));
      if (s[d] != 1) full[k][rank - s.size() + d] = step;
      step *= s[d];
    }
  }
  RowSpace r;
  r.strides.resize(inputs.size());
  for (size_t d = 0; d < rank; ++d) {
    const bool last = keep_last && d + 1 == rank;
    if (out[d] == 1 && !last) continue;
    bool merge = !r.dims.empty() && !last;
    for (size_t k = 0; k < inputs.size() && merge; ++k)
      merge = r.strides[k].back() == full[k][d] * out[d];
    if (merge) {
      r.dims.back() *= out[d];
      for (size_t k = 0; k < inputs.size(); ++k) r.strides[k].back() = full[k][d];
    } else {
      r.dims.push_back(out[d]);
      for (size_t k = 0; k < inputs.size(); ++k) r.strides[k].push_back(full[k][d]);
    }
  }
  if (r.dims.empty()) {
    r.dims.push_back(1);
    for (auto& s : r.strides) s.push_back(0);
  }
  return r;
}

thread_local std::vector<float> t_scratch;

float* scratch_for(const TileProgram& p, int64_t capacity) {
  size_t need = static_cast<size_t>(std::max(p.num_regs, 1) * capacity);
  if (t_scratch.size() < need) t_scratch.resize(need);
  return t_scratch.data();
}

}  // namespace

TileKernel::TileKernel(TileProgram program) : program_(std::move(program)) {
  if (program_.num_regs > kTileMaxRegs)
    throw ValueError(cat("[TileKernel] ", program_.num_regs, " registers, at most ", kTileMaxRegs));
  if (program_.outputs.empty()) throw ValueError("[TileKernel] a program without outputs");
  direct_ = direct_writes(program_);
  capacity_ = choose_capacity(program_.num_regs);
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

  const bool whole_rows = p.has_row_reduction();
  const RowSpace rs = merge_dims(shape, inputs, whole_rows);
  const size_t nd = rs.dims.size();
  const int64_t n = rs.dims.back();
  int64_t rows = 1;
  for (int64_t d : rs.dims) rows *= d;
  rows /= n;
  // Tiles: pieces of one row, or blocks of `block` rows inside one step of dims[nd - 2].
  // A reduction needs whole rows in a tile: the capacity grows to a row if need be.
  const int64_t cap = whole_rows ? std::max(capacity_, (n + 15) / 16 * 16) : capacity_;
  const int64_t inner = nd >= 2 ? rs.dims[nd - 2] : 1;
  const bool row_blocks = whole_rows || (n < cap / 2 && inner > 1);
  const int64_t block = row_blocks ? std::min(cap / n, inner) : 1;
  const int64_t per_row = row_blocks ? 1 : (n + cap - 1) / cap;
  const int64_t blocks_per_inner = (inner + block - 1) / block;
  const int64_t tiles = row_blocks ? rows / inner * blocks_per_inner : rows * per_row;
  const int64_t values_per_tile = row_blocks ? block * n : std::min(n, cap);
  const int64_t grain = std::max<int64_t>(1, kGrainValues / values_per_tile);

  auto run_range = [&](int64_t begin, int64_t end) {
    float* scratch = scratch_for(p, cap);
    std::vector<TileOperandView> in(inputs.size()), out(outputs.size());
    std::vector<int64_t> idx(nd);
    for (int64_t t = begin; t < end; ++t) {
      int64_t row, col0 = 0, nrows = 1, width;
      if (row_blocks) {
        const int64_t b = t % blocks_per_inner;
        row = t / blocks_per_inner * inner + b * block;
        nrows = std::min(block, inner - b * block);
        width = n;
      } else {
        row = t / per_row;
        col0 = t % per_row * cap;
        width = std::min(cap, n - col0);
      }
      for (size_t d = nd - 1, r = static_cast<size_t>(row); d-- > 0;) {
        idx[d] = static_cast<int64_t>(r % static_cast<size_t>(rs.dims[d]));
        r /= static_cast<size_t>(rs.dims[d]);
      }
      for (size_t k = 0; k < inputs.size(); ++k) {
        const std::vector<int64_t>& s = rs.strides[k];
        int64_t off = col0 * s[nd - 1];
        for (size_t d = 0; d + 1 < nd; ++d) off += idx[d] * s[d];
        in[k] = {static_cast<const char*>(inputs[k].raw_data()) + off * itemsize(p.inputs[k].dtype),
                 nd >= 2 ? s[nd - 2] : 0, s[nd - 1], p.inputs[k].dtype};
      }
      for (size_t k = 0; k < outputs.size(); ++k)
        out[k] = {static_cast<char*>(outputs[k].raw_data()) +
                      (row * n + col0) * static_cast<int64_t>(itemsize(p.outputs[k].dtype)),
                  n, 1, p.outputs[k].dtype};
      TileArgs args{.code = p.code.data(),
                    .num_code = static_cast<int>(p.code.size()),
                    .direct = direct_.data(),
                    .rows = nrows,
                    .width = width,
                    .inputs = in.data(),
                    .outputs = out.data(),
                    .scratch = scratch,
                    .capacity = cap};
      PTO_ISA_DISPATCH(exec_tile, args);
    }
  };
  if (in_parallel_region())
    run_range(0, tiles);
  else
    parallel_for(0, tiles, grain, run_range);
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
