// The CPU executor of tile programs (level 3 of DESIGN.md, src/tile): a TileKernel runs one
// program over concrete tensors, in parallel over output tiles, writing outputs it is given.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/gemm/gemm.h"
#include "pto/tensor.h"
#include "tile/tile_planner.h"
#include "tile/tile_program.h"

namespace pto::cpu {

// An operand of a GEMM/conv epilogue program: element (i, j) of C (global row i, column j) is
// data[i * row_stride + j * col_stride], col_stride 0 or 1. Per-row (conv bias): {b, 1, 0};
// per-column (GEMM bias): {b, 0, 1}; full (residual): {r, ldr, 1}; scalar: {s, 0, 0}. A conv
// runs one C per image (rows: output channels, columns: output positions); image_stride moves
// the operand from one image to the next (epilogue_at).
struct EpilogueOperand {
  const float* data = nullptr;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  int64_t image_stride = 0;
};

class TileKernel {
 public:
  // `name` says which kernel in messages ("kernel 'y'"). `pinned`: a tile shape ({rows, cols} of
  // the output merged to 2-D, or {cols}) used instead of the planner's on every run; checked here
  // against the program (ValueError naming the buffer that does not fit).
  explicit TileKernel(TileProgram program, std::string name = "",
                      const std::vector<int64_t>& pinned = {});

  const TileProgram& program() const { return program_; }
  const TileFacts& facts() const { return facts_; }
  const std::optional<TileShape>& pinned() const { return pinned_; }
  // Floats per register of a GEMM/conv epilogue block (run_block), from the L1 size.
  int64_t capacity() const { return capacity_; }

  // The plan run() follows for outputs of shape `out` and inputs of shapes `in` (broadcastable
  // to it): the tiling planner (tile/tile_planner.h) on the output merged to rows, with the
  // machine's cache model and thread count. ValueError on shapes that do not broadcast.
  TilePlan plan(const Dims& out, const std::vector<Dims>& in) const;
  // The program, then its plan when its shapes are static, else the planner's rule.
  std::string describe() const;

  // Runs the program over the shape of outputs[0]. `inputs` in program().inputs order, each
  // contiguous, of the declared dtype, its shape broadcastable to the output shape; `outputs`
  // allocated, contiguous, all of that shape and of the declared dtypes, overlapping no input.
  // Tiles as plan() says, in parallel (pto::parallel_for) unless called inside a parallel region
  // or the plan runs whole; the result does not depend on the thread count. Throws ValueError on
  // mismatched tensors.
  void run(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) const;

  // Tiles run in strips of `values` (TileArgs::strip) whatever the operands' size; 0: run() decides
  // from the size (strips only for operands larger than the last-level cache). For tests.
  void force_strip(int64_t values) { forced_strip_ = values; }

  // The epilogue form, on the calling thread: program input 0 is the accumulator block
  // c[i * ldc + j] (i < m, j < n; global row m0 + i, column n0 + j), updated in place with
  // output 0; program input k >= 1 is operands[k - 1]. A single f32 output.
  void run_block(const EpilogueOperand* operands, float* c, int64_t ldc, int64_t m0, int64_t m,
                 int64_t n0, int64_t n) const;

 private:
  TileProgram program_;
  TileFacts facts_;
  std::optional<TileShape> pinned_;
  std::vector<int8_t> direct_;          // per instruction: the output it writes in place, or -1
  std::vector<uint8_t> direct_stream_;  // per instruction: it may stream there (TileArgs)
  int64_t capacity_ = 0;
  int64_t forced_strip_ = 0;
};

// `ep` for a block of a convolution's output that starts at image `image`, output channel `row0`
// and output position `col0`: its tile operands (if any) moved there, into `buf`, which must hold
// program().inputs.size() - 1 operands (kTileMaxRegs always does) and outlive the result. The
// block's own rows and columns then count from 0. Other fields are left as they are.
Epilogue epilogue_at(const Epilogue& ep, int64_t image, int64_t row0, int64_t col0,
                     EpilogueOperand* buf);

// TileKernel(program).run(inputs, outputs), for one-off runs.
void run_tile_program(const TileProgram& program, const std::vector<Tensor>& inputs,
                      std::vector<Tensor>& outputs);

}  // namespace pto::cpu
