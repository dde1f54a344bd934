// The tiling planner (level 3 of DESIGN.md): from what a tile program touches, the output's
// actual size, the cache model and the thread count, the tiles a kernel runs in. A pure function:
// nothing here reads the machine or the environment; callers pass cache_model() and
// num_threads(). The CPU executor (src/backend/cpu/tile_kernel.h) calls it on every run, so a
// kernel compiled for symbolic dimensions gets a plan for each size it meets without recompiling.
//
// The model (docs/backend/tile.md, "The tiling planner"):
//   - The output index space is rows x cols (dimensions merged as the executor walks them), cut
//     into row groups within which every input advances by one fixed stride per row; a tile of
//     several rows never crosses a group boundary.
//   - A tile is tile.rows x tile.cols values. Its working set is every buffer one tile touches:
//     each register (float32) and each input and output tile (its dtype), all at the tile's full
//     capacity (a broadcast input is counted as if it were full: an upper bound).
//   - The budget of a level is 1/kBudgetShare of it: all of it, since the working set already
//     counts every buffer a tile touches (measured: docs/backend/tile.md); the plan targets the
//     smallest level whose budget holds the working set: L1, L2, L3 or memory.
//   - Planned tiles: the largest power-of-two capacity in [kMinCapacity, kMaxCapacity] whose
//     working set fits L1's budget (kMinCapacity when none does); a piece of one row when rows
//     are long, else a block of whole rows. A program that reduces rows takes whole rows per tile,
//     however long they are (its level then says where they live).
//   - Tasks: tiles run in parallel chunks (one per thread at most) of at least kGrainValues
//     output values; a kernel of fewer than 2 * kGrainValues values (or on one thread) runs
//     whole on the calling thread, no task.
//   - The last tile of a row group and of a row may be partial: `tail` is its valid region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pto/device_info.h"
#include "pto/kernel_graph.h"
#include "tile/tile_program.h"

namespace pto {

inline constexpr int64_t kMinCapacity = 256;    // floats per register at least
inline constexpr int64_t kMaxCapacity = 4096;   // and at most, when planned
inline constexpr int64_t kGrainValues = 32768;  // output values per parallel chunk at least
inline constexpr size_t kBudgetShare = 1;       // a tile may use 1/kBudgetShare of a level

// rows x cols of the merged 2-D output space.
struct TileShape {
  int64_t rows = 0, cols = 0;
  bool operator==(const TileShape&) const = default;
  std::string str() const;  // "4x768"
};

// What the planner needs to know of a program: its buffers. Built once per kernel.
struct TileFacts {
  struct Buffer {
    std::string name;  // "register r3", "input %1 'x'", "output %0 'y'"
    size_t itemsize = 4;
  };
  std::string kernel;              // how messages name the kernel, e.g. "kernel 'y'"
  std::vector<Buffer> buffers;     // registers, then inputs, then outputs
  bool row_reduction = false;      // tiles must hold whole rows
  size_t bytes_per_value() const;  // of all buffers together, per value of a tile

  static TileFacts of(const TileProgram& p, std::string kernel);
};

// The output space as the executor walks it: `rows` rows of `cols` values, in groups of
// `row_group` consecutive rows (rows is a multiple of row_group, which is >= 1).
struct TileSpace {
  int64_t rows = 1, cols = 1, row_group = 1;
};

enum class CacheLevel { kL1, kL2, kL3, kMemory };
const char* cache_level_name(CacheLevel level);  // "L1", "L2", "L3", "memory"

struct TilePlan {
  TileSpace space;
  TileShape tile;          // a full tile (its capacity shape)
  int64_t capacity = 0;    // floats per register: tile.rows * tile.cols rounded up to 16
  int64_t row_tiles = 0;   // tiles down the rows (all groups together)
  int64_t col_tiles = 0;   // tiles along a row
  int64_t tiles = 0;       // row_tiles * col_tiles
  TileShape tail;          // valid region of the last tile of a group and of a row
  size_t working_set = 0;  // bytes one tile touches
  size_t budget = 0;       // bytes of `level` one tile may use
  CacheLevel level = CacheLevel::kL1;
  int64_t grain = 1;    // tiles per parallel chunk at least
  int64_t tasks = 1;    // parallel chunks
  bool whole = true;    // tasks == 1: runs on the calling thread, no task
  bool pinned = false;  // the tile shape was given (CompileOptions::tiles)

  // One line, e.g. "tiles 1024 of 1x768 (tail 1x768), working set 12 KiB of 16 KiB (L1), 2 tasks"
  std::string str() const;
};

// The budget of `level` for one tile (0 for memory: unbounded).
size_t level_budget(const CacheModel& cache, CacheLevel level);

// The capacity (floats per register) the planner gives `facts` when rows may be cut anywhere:
// the largest power of two in [kMinCapacity, kMaxCapacity] whose working set fits L1's budget.
int64_t planned_capacity(const TileFacts& facts, const CacheModel& cache);

// Checks a pinned tile shape against the program alone (any output size): one or two positive
// dimensions ({cols} is {1, cols}) whose working set fits L1's budget. Returns the shape; throws
// ValueError naming the kernel, the buffer that overflows, the bytes needed and available.
TileShape check_pinned_tile(const TileFacts& facts, const std::vector<int64_t>& dims,
                            const CacheModel& cache);

// A pinned tile for a program that reduces rows of `cols` values must hold whole rows, else
// ValueError.
void check_pinned_rows(const TileFacts& facts, const TileShape& tile, int64_t cols);

// The plan for one output size. `pinned` (from check_pinned_tile) is honoured exactly; for a
// program that reduces rows it must hold whole rows (cols >= space.cols), else ValueError.
TilePlan plan_tiles(const TileFacts& facts, const TileSpace& space, const CacheModel& cache,
                    int threads, const std::optional<TileShape>& pinned = std::nullopt);

// The rule the planner applies to every size, for a kernel whose output size is not known yet.
std::string describe_tile_rule(const TileFacts& facts, const CacheModel& cache,
                               const std::optional<TileShape>& pinned);

// ---- pinning tiles from CompileOptions::tiles ----

// Whether `group` runs as a tile program (a fused elementwise group, or a single node the tile
// ISA lowers), i.e. whether a pinned tile can apply to it.
bool is_tile_group(const Graph& g, const KernelGroup& group);

// Sets KernelGroup::tile of every tile group that `tiles` names (by one of its nodes' names or
// its first output's name; "*" names every tile group, a more specific name wins). A name that
// matches no tile group, or a shape that is not one or two positive sizes, is a ValueError.
void pin_tiles(const std::map<std::string, std::vector<int64_t>>& tiles, const Graph& g,
               KernelGraph& kernels);

}  // namespace pto
