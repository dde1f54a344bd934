// The per-ISA tile interpreter's interface (tile_exec_impl.h): one call runs a whole tile program
// on one tile. Plain data only, since the per-ISA translation units include it.
#pragma once

#include <cstdint>

#include "tile/tile_isa.h"

namespace pto::cpu {

inline constexpr int kTileMaxRegs = 64;

// One input or output as seen from one tile: element (i, j) of the tile (row i < rows, column
// j < width) is at ptr + i * row_step + j * col_stride elements, col_stride 0 or 1.
struct TileOperandView {
  const void* ptr = nullptr;
  int64_t row_step = 0;
  int64_t col_stride = 1;
  TileDType dtype = TileDType::kF32;
};

struct TileArgs {
  const TileInstr* code = nullptr;
  int num_code = 0;
  const int8_t* direct = nullptr;  // per instruction: the output it may write in place, or -1
  // Per instruction with direct >= 0: nothing but that store reads its result, so with `stream`
  // it may write the output itself with streaming stores (no copy of the register to the
  // output); null: never with `stream`.
  const uint8_t* direct_stream = nullptr;
  int64_t rows = 1, width = 0;  // the tile; registers hold rows * width values
  const TileOperandView* inputs = nullptr;
  const TileOperandView* outputs = nullptr;  // col_stride 1; ptr is written through
  float* scratch = nullptr;                  // num_regs * capacity floats
  int64_t capacity = 0;                      // >= rows * width, a multiple of 16
  // Store float32 outputs with streaming stores (past the cache) instead of computing into them
  // directly: for outputs far larger than the last-level cache (MemoryPolicy::nontemporal).
  bool stream = false;
  // With `stream`: order the streamed stores before what follows (sfence) once the tile is done;
  // set on the last tile of a task only.
  bool fence = true;
  // Cache lines of each contiguous input past this tile (the next tile's; with `strip`, past
  // each strip) to prefetch before the tile (strip) runs (MemoryPolicy::prefetch_distance); 0:
  // none. A chain (tile_exec_impl.h exec_chain) prefetches each input this many lines ahead of
  // the four vectors it is at.
  int prefetch_lines = 0;
  // Issue those lines in equal shares before each instruction of the tile (strip) instead of all
  // before its first: a block of prefetches fills the core's line-fill buffers, and the strip's
  // arithmetic waits behind the stalled prefetch instead of running while the lines arrive.
  bool prefetch_spread = false;
  // > 0: run the program on strips of this many values of a one-row tile, every instruction on
  // a strip before the next one, so loads from memory, the arithmetic and the stores of
  // neighbouring strips are in flight together (operands far larger than the caches); 0: each
  // instruction over the whole tile. Programs with a row reduction run whole tiles.
  int64_t strip = 0;
};

}  // namespace pto::cpu
