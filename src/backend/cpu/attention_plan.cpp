#include "backend/cpu/attention_plan.h"

#include <algorithm>

#include "backend/cpu/attention_kernels.h"
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
// Decode: keys per chunk (the scores of a chunk stay in L1 while its V rows stream by) and the
// fewest keys per split range (a range's fixed cost, its partial O and the merge, stays small).
constexpr int64_t kDecodeBlock = 256;
// Up to this many rows per kv head (queries x group) the decode kernel in tasks of kDecodeRows
// beats the GEMM path, which packs each K and V chunk per task (`pto bench`, one thread, 4096
// keys: 12 heads of 64 at 16 and 32 queries 1.5x and 1.2x, 32 on 8 heads of 128 at 4 and 8
// queries 1.7x and 1.4x; at 64 queries the GEMM path is 10% faster).
constexpr int64_t kDecodeMaxRows = 4 * kDecodeRows;
constexpr int64_t kMinSplitKeys = 512;

}  // namespace

std::string AttentionPlan::str() const {
  return cat("attention", decode ? " (decode)" : "", ": ", tasks, " task(s) of ", task_rows,
             " rows (", rows, " queries per head), keys in chunks of ", block,
             splits > 1 ? cat(" split in ", splits, " ranges") : std::string(), ", ", scratch_bytes,
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

  const int64_t min_tasks = 2 * static_cast<int64_t>(std::max(1, threads));
  int64_t rows = std::clamp<int64_t>(ceil_div(kTaskRows, group), 1, sq);
  if (s.causal) rows = std::max<int64_t>(1, std::min(rows, ceil_div(sq, kCausalRowsDivisor)));
  const bool few_rows = group <= kDecodeRows && group * sq <= kDecodeMaxRows;
  if (few_rows) rows = std::min(sq, kDecodeRows / group);
  while (!few_rows && rows > 1 && tasks_for(rows) < min_tasks) rows = ceil_div(rows, 2);
  int64_t block = std::min(kDecodeBlock, keys);
  for (; !few_rows;) {
    block = kMinBlock;
    for (int64_t b = kMaxBlock; b >= kMinBlock; b /= 2)
      if (working_set(rows, b) <= budget && (b / 2 < keys || b == kMinBlock)) {
        block = b;
        break;
      }
    if (rows == 1 || working_set(rows, block) <= budget) break;
    rows = ceil_div(rows, 2);
  }
  const int64_t tasks = tasks_for(rows);
  int64_t splits = 1;
  if (threads > 1 && tasks < min_tasks)  // one thread gains nothing from splitting
    splits = std::min(ceil_div(min_tasks, tasks), std::max<int64_t>(1, keys / kMinSplitKeys));
  if (override) {
    PTO_CHECK(override->rows >= 0 && override->block >= 0 && override->splits >= 0)
        << "attention tiles: negative rows, block or splits";
    if (override->rows > 0) rows = std::min(override->rows, sq);
    if (override->block > 0) block = std::min(override->block, keys);
    if (override->splits > 0) splits = std::min(override->splits, keys);
  }
  block = std::min(block, keys);
  AttentionPlan p;
  p.rows = rows;
  p.block = block;
  p.splits = splits;
  p.task_rows = group * rows;
  p.tasks = tasks_for(rows);
  p.decode = p.task_rows <= kDecodeRows;
  const int64_t t = p.task_rows;
  const int64_t floats = p.decode ? t * block + t * (s.d + 2 * s.dv) : working_set(rows, block);
  p.scratch_bytes = static_cast<size_t>(floats + 3 * t + 6 * 16) * 4;
  if (splits > 1) p.partial_bytes = static_cast<size_t>(p.tasks * splits * t * (s.dv + 2)) * 4;
  return p;
}

}  // namespace pto::cpu
