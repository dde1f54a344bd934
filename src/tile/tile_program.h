// A Tile Program (level 3 of DESIGN.md): one kernel as a loop over output tiles running a short
// straight-line program of tile instructions (tile_isa.h) on virtual registers. The output index
// space is one shape; every input operand broadcasts to it numpy-style (stride 0 on its broadcast
// dimensions), scalar constants are immediates in the instructions, and every output has the
// index space's shape. The executor (src/backend/cpu/tile_kernel.h) chooses the tile size.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pto/graph.h"
#include "tile/tile_isa.h"

namespace pto {

struct TileOperand {
  ValueId value = kNoValue;  // the graph value it stands for
  std::string name;          // the value's name, for printing
  TileDType dtype = TileDType::kF32;
  std::optional<Shape> shape;  // its (possibly symbolic) shape, broadcast to the index space
};

struct TileProgram {
  std::vector<TileOperand> inputs;   // the tensors a run is given, in this order
  std::vector<TileOperand> outputs;  // the tensors a run writes, in this order
  std::optional<Shape> shape;        // the output index space
  int num_regs = 0;
  std::vector<TileInstr> code;

  // Whether some instruction reduces rows (the executor then tiles whole rows).
  bool has_row_reduction() const;

  // Appends an instruction and returns its index; grows num_regs to cover its registers.
  size_t emit(const TileInstr& in);

  // A readable listing, e.g.
  //   tile program [1048576]  in: %0 r f32[1048576]  out: %0 e f32[1048576]  regs: 2
  //     r0 = load in0
  //     r1 = div.imm 3.4, r0
  std::string str() const;
};

// The graph dtype a tile operand stands for and back (nullopt: no tile form), its bytes per
// element, and its printed name ("f32", "bf16", ...).
DType graph_dtype(TileDType d);
std::optional<TileDType> tile_dtype_of(DType d);
size_t tile_itemsize(TileDType d);
const char* tile_dtype_name(TileDType d);

const char* tile_unary_name(TileUnary op);
const char* tile_binary_name(TileBinary op);
const char* tile_compare_name(TileCompare op);
const char* tile_reduce_name(TileReduce op);

}  // namespace pto
