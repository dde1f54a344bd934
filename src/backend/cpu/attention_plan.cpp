#include "backend/cpu/attention_plan.h"

#include <algorithm>

#include "pto/error.h"

namespace pto::cpu {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Rows of Q per task the plan aims for: the packed chunk of K and V (block x (D + Dv) floats)
// then meets 2 * 256 flops per value it holds. Measured on a 1 MiB L2 (PTO_ATTENTION_TILES,
// sequence 2048, 12 heads of 64): 256 rows x 512 keys is 5% faster than 128 x 512 and 64 x 512
// (the packing amortized), 256 x 128 is 7% slower (the chunk loop's overhead); grouped heads
// (32 on 8 of 128): 256 task rows 3-5% faster than 128. The working set may fill L2: the score
// rows stream through it one at a time.
constexpr int64_t kTaskRows = 256;
constexpr int64_t kMinBlock = 64, kMaxBlock = 1024;
constexpr double kL2Share = 1.0;  // of L2 for a task's working set
// Causal: a task computes the chunks on its diagonal whole, so its rows stay at most this part
// of the queries (sequence 512: 128 rows per task 10% faster than 256; 2048: 256 as fast as 128).
constexpr int64_t kCausalRowsDivisor = 4;

}  // namespace

std::string AttentionPlan::str() const {
  return cat("attention: ", tasks, " task(s) of ", task_rows, " rows (", rows,
             " queries per head), keys in chunks of ", block, ", ", scratch_bytes,
             " bytes of scratch per thread");
}

AttentionPlan plan_attention(const AttentionShape& s, int threads, const CacheModel& cache,
                             int64_t nr, const AttentionTiles* override) {
  const int64_t group = std::max<int64_t>(1, s.heads / std::max<int64_t>(1, s.kv_heads));
  const int64_t sq = std::max<int64_t>(1, s.queries), keys = std::max<int64_t>(1, s.keys);
  const auto tasks_for = [&](int64_t rows) { return s.batch * s.kv_heads * ceil_div(sq, rows); };
  // Floats a task touches per chunk pass: scores, the packed K^T and V chunks, Q, O and P V rows.
  const auto working_set = [&](int64_t rows, int64_t block) {
    const int64_t t = group * rows;
    return t * block + ceil_div(block, nr) * nr * s.d + ceil_div(s.dv, nr) * nr * block +
           t * (s.d + 2 * s.dv);
  };
  const auto budget = static_cast<int64_t>(kL2Share * static_cast<double>(cache.l2) / 4);

  int64_t rows = std::clamp<int64_t>(ceil_div(kTaskRows, group), 1, sq);
  if (s.causal) rows = std::max<int64_t>(1, std::min(rows, ceil_div(sq, kCausalRowsDivisor)));
  while (rows > 1 && tasks_for(rows) < 2 * static_cast<int64_t>(threads)) rows = ceil_div(rows, 2);
  int64_t block = kMinBlock;
  for (;;) {
    block = kMinBlock;
    for (int64_t b = kMaxBlock; b >= kMinBlock; b /= 2)
      if (working_set(rows, b) <= budget && (b / 2 < keys || b == kMinBlock)) {
        block = b;
        break;
      }
    if (rows == 1 || working_set(rows, block) <= budget) break;
    rows = ceil_div(rows, 2);
  }
  if (override) {
    PTO_CHECK(override->rows >= 0 && override->block >= 0)
        << "attention tiles: negative rows or block";
    if (override->rows > 0) rows = std::min(override->rows, sq);
    if (override->block > 0) block = std::min(override->block, keys);
  }
  block = std::min(block, keys);
  AttentionPlan p;
  p.rows = rows;
  p.block = block;
  p.task_rows = group * rows;
  p.tasks = tasks_for(rows);
  p.scratch_bytes = static_cast<size_t>(working_set(rows, block) + 3 * p.task_rows + 6 * 16) * 4;
  return p;
}

}  // namespace pto::cpu
