// The tiling planner (see tile_planner.h for the model).
#include "tile/tile_planner.h"

#include <algorithm>

#include "pto/error.h"
#include "tile/lower.h"

namespace pto {
namespace {

int64_t round16(int64_t n) {
  return (n + 15) / 16 * 16;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

std::string bytes_str(size_t b) {
  if (b >= 1024 * 1024 && b % (1024 * 1024) == 0) return cat(b / (1024 * 1024), " MiB");
  if (b >= 1024 && b % 1024 == 0) return cat(b / 1024, " KiB");
  return cat(b, " B");
}

size_t level_size(const CacheModel& cache, CacheLevel level) {
  switch (level) {
    case CacheLevel::kL1:
      return cache.l1d;
    case CacheLevel::kL2:
      return cache.l2;
    case CacheLevel::kL3:
      return cache.l3;
    case CacheLevel::kMemory:
      return 0;
  }
  return 0;
}

// The smallest level whose budget holds `bytes`.
CacheLevel level_for(const CacheModel& cache, size_t bytes) {
  for (CacheLevel l : {CacheLevel::kL1, CacheLevel::kL2, CacheLevel::kL3})
    if (bytes <= level_budget(cache, l)) return l;
  return CacheLevel::kMemory;
}

}  // namespace

std::string TileShape::str() const {
  return cat(rows, "x", cols);
}

size_t TileFacts::bytes_per_value() const {
  size_t b = 0;
  for (const Buffer& buf : buffers) b += buf.itemsize;
  return b;
}

TileFacts TileFacts::of(const TileProgram& p, std::string kernel) {
  TileFacts f;
  f.kernel = std::move(kernel);
  f.row_reduction = p.has_row_reduction();
  for (int r = 0; r < std::max(p.num_regs, 1); ++r) f.buffers.push_back({cat("register r", r), 4});
  for (size_t k = 0; k < p.inputs.size(); ++k)
    f.buffers.push_back(
        {cat("input %", k, " '", p.inputs[k].name, "'"), tile_itemsize(p.inputs[k].dtype)});
  for (size_t k = 0; k < p.outputs.size(); ++k)
    f.buffers.push_back(
        {cat("output %", k, " '", p.outputs[k].name, "'"), tile_itemsize(p.outputs[k].dtype)});
  return f;
}

const char* cache_level_name(CacheLevel level) {
  switch (level) {
    case CacheLevel::kL1:
      return "L1";
    case CacheLevel::kL2:
      return "L2";
    case CacheLevel::kL3:
      return "L3";
    case CacheLevel::kMemory:
      return "memory";
  }
  return "?";
}

size_t level_budget(const CacheModel& cache, CacheLevel level) {
  return level_size(cache, level) / kBudgetShare;
}

int64_t planned_capacity(const TileFacts& facts, const CacheModel& cache) {
  const size_t budget = level_budget(cache, CacheLevel::kL1);
  const size_t per_value = facts.bytes_per_value();
  int64_t cap = kMinCapacity;
  while (cap < kMaxCapacity && static_cast<size_t>(cap * 2) * per_value <= budget) cap *= 2;
  return cap;
}

TileShape check_pinned_tile(const TileFacts& facts, const std::vector<int64_t>& dims,
                            const CacheModel& cache) {
  const std::string where = cat("[tile] ", facts.kernel, ": pinned tile ");
  if (dims.empty() || dims.size() > 2)
    throw ValueError(cat(where, "has ", dims.size(), " dimensions; expected (rows, cols) or (cols)",
                         " of the output merged to rows x cols"));
  for (int64_t d : dims)
    if (d <= 0)
      throw ValueError(
          cat(where, dims_str(Dims(dims.begin(), dims.end())), ": every size must be positive"));
  const TileShape tile = dims.size() == 1 ? TileShape{1, dims[0]} : TileShape{dims[0], dims[1]};
  const size_t budget = level_budget(cache, CacheLevel::kL1);
  const std::string avail =
      cat(" bytes available to a tile (", kBudgetShare == 1 ? "" : cat("1/", kBudgetShare, " of "),
          "the ", bytes_str(cache.l1d), " L1d)");
  constexpr int64_t kHuge = int64_t{1} << 24;  // no L1 holds a buffer this long: no overflow below
  if (tile.rows > kHuge || tile.cols > kHuge)
    throw ValueError(cat(where, tile.str(), " does not fit L1: ", facts.buffers[0].name,
                         " alone needs more than ", kHuge * 4, " bytes, of ", budget, avail));
  const size_t values = static_cast<size_t>(round16(tile.rows * tile.cols));
  size_t used = 0;
  for (const TileFacts::Buffer& b : facts.buffers) {
    used += values * b.itemsize;
    if (used <= budget) continue;
    size_t total = values * facts.bytes_per_value();
    size_t fits = budget / facts.bytes_per_value() / 16 * 16;
    throw ValueError(cat(where, tile.str(), " does not fit L1: ", b.name, " (", values * b.itemsize,
                         " bytes) brings the working set to ", used, " bytes, of ", budget, avail,
                         "; the whole tile needs ", total, " bytes (", facts.buffers.size(),
                         " buffers of ", values, " values); at most ", fits,
                         " values per tile fit"));
  }
  return tile;
}

void check_pinned_rows(const TileFacts& facts, const TileShape& tile, int64_t cols) {
  if (facts.row_reduction && tile.cols < cols)
    throw ValueError(cat("[tile] ", facts.kernel, ": pinned tile ", tile.str(), " cuts rows of ",
                         cols, " values, but the kernel reduces rows: a tile must hold whole rows ",
                         "(cols >= ", cols, ")"));
}

TilePlan plan_tiles(const TileFacts& facts, const TileSpace& space, const CacheModel& cache,
                    int threads, const std::optional<TileShape>& pinned) {
  PTO_CHECK(space.rows >= 1 && space.cols >= 1 && space.row_group >= 1 &&
            space.rows % space.row_group == 0)
      << "plan_tiles: bad space " << space.rows << "x" << space.cols << " / " << space.row_group;
  TilePlan p;
  p.space = space;
  const int64_t n = space.cols, group = space.row_group;
  if (pinned) {
    check_pinned_rows(facts, *pinned, n);
    p.tile = *pinned;
    p.pinned = true;
  } else {
    int64_t cap = planned_capacity(facts, cache);
    if (facts.row_reduction) {
      cap = std::max(cap, round16(n));  // whole rows, however long
      p.tile = {std::min(cap / n, group), n};
    } else if (n < cap / 2 && group > 1) {
      p.tile = {std::min(cap / n, group), n};  // blocks of whole short rows
    } else {
      p.tile = {1, std::min(cap, n)};  // pieces of long rows
    }
  }
  p.capacity = round16(p.tile.rows * p.tile.cols);
  const int64_t blocks_per_group = ceil_div(group, p.tile.rows);
  p.row_tiles = space.rows / group * blocks_per_group;
  p.col_tiles = ceil_div(n, p.tile.cols);
  p.tiles = p.row_tiles * p.col_tiles;
  p.tail = {group - (blocks_per_group - 1) * p.tile.rows, n - (p.col_tiles - 1) * p.tile.cols};
  p.working_set = static_cast<size_t>(p.capacity) * facts.bytes_per_value();
  p.level = level_for(cache, p.working_set);
  p.budget = level_budget(cache, p.level);
  // At most one task per thread, each of at least kGrainValues values, none of less than a tile.
  const int64_t values = space.rows * n;
  p.tasks = std::max<int64_t>(
      1, std::min({values / kGrainValues, p.tiles, static_cast<int64_t>(std::max(threads, 1))}));
  p.whole = p.tasks == 1;
  return p;
}

std::string TilePlan::str() const {
  std::string s = cat("tiles ", tiles, " of ", tile.str(), pinned ? " (pinned)" : "");
  if (tail != tile && tiles > 1) s += cat(", tail ", tail.str());
  if (tiles == 1 && (tail.rows < tile.rows || tail.cols < tile.cols))
    s += cat(", valid ", tail.str());
  s += cat(", working set ", bytes_str(working_set));
  if (level == CacheLevel::kMemory)
    s += " (larger than every cache level: memory)";
  else
    s += cat(" of ", bytes_str(budget), " (", cache_level_name(level), ")");
  s += whole ? ", runs whole" : cat(", ", tasks, " tasks");
  return s;
}

std::string describe_tile_rule(const TileFacts& facts, const CacheModel& cache,
                               const std::optional<TileShape>& pinned) {
  const size_t budget = level_budget(cache, CacheLevel::kL1);
  if (pinned)
    return cat("tiles of ", pinned->str(), " (pinned), working set ",
               bytes_str(static_cast<size_t>(round16(pinned->rows * pinned->cols)) *
                         facts.bytes_per_value()),
               " of ", bytes_str(budget), " (L1); planned per run");
  const int64_t cap = planned_capacity(facts, cache);
  return cat("tiles of up to ", cap, " values", facts.row_reduction ? " (whole rows)" : "",
             ", working set ", bytes_str(static_cast<size_t>(cap) * facts.bytes_per_value()),
             " of ", bytes_str(budget), " (L1); planned per run from the actual shape");
}

// ---- pinning ----

bool is_tile_group(const Graph& g, const KernelGroup& group) {
  if (group.rule == "Elementwise") return true;
  return group.nodes.size() == 1 && lower_elementwise(g, group).has_value();
}

void pin_tiles(const std::map<std::string, std::vector<int64_t>>& tiles, const Graph& g,
               KernelGraph& kernels) {
  if (tiles.empty()) return;
  std::vector<std::string> names;  // the tile kernels, for the message
  std::map<std::string, bool> used;
  for (const auto& [name, dims] : tiles) {
    used[name] = false;
    if (dims.empty() || dims.size() > 2 ||
        std::any_of(dims.begin(), dims.end(), [](int64_t d) { return d <= 0; }))
      throw ValueError(cat("[tile] pinned tile for '", name,
                           "': ", dims_str(Dims(dims.begin(), dims.end())),
                           " is not (rows, cols) or (cols) of positive sizes"));
  }
  for (KernelGroup& k : kernels.kernels) {
    if (!is_tile_group(g, k)) continue;
    const std::vector<int64_t>* pin = nullptr;
    auto take = [&](const std::string& name) {
      auto it = tiles.find(name);
      if (it == tiles.end()) return;
      used[name] = true;
      if (!pin || name != "*") pin = &it->second;
    };
    take("*");
    for (int32_t n : k.nodes) take(g.nodes()[n].name);
    if (!k.outputs.empty()) take(g.value(k.outputs[0]).name);
    names.push_back(k.outputs.empty() ? g.nodes()[k.nodes[0]].name : g.value(k.outputs[0]).name);
    if (pin) k.tile = *pin;
  }
  for (const auto& [name, hit] : used) {
    if (hit) continue;
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "'" : ", '") + n + "'";
    throw ValueError(cat("[tile] pinned tile for '", name, "': ",
                         name == "*" ? "the graph has no tile kernel"
                                     : "no tile kernel has a node or output of that name",
                         known.empty() ? std::string(" (tile kernels: none)")
                                       : cat(" (tile kernels, by output: ", known, ")")));
  }
}

}  // namespace pto
