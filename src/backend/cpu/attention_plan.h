// How the CPU Attention kernel (attention.cpp) cuts its work, as a pure function of the sizes, the
// thread count and the cache model, so that tests (and a tuner) can ask for it and override it.
//
// A task is (batch, kv head, range of `rows` query positions) for all `group` = H / Hkv query
// heads sharing that kv head: group * rows rows of Q against the same K and V. Inside a task the
// keys go in chunks of `block`: the chunk's K^T and V are packed once and every row of the task
// multiplies against them (scores S = task rows x block), with an online softmax across chunks.
// A task of at most kDecodeRows rows (decode: one or a few query positions) runs the decode
// kernel instead: no packing, each K and V row read once for all the task's rows. With fewer
// tasks than two per thread the keys are also split into `splits` ranges (flash-decoding): each
// (task, range) pair computes a partial (m, l, O), merged afterwards by the log-sum-exp rule.
#pragma once

#include <cstdint>
#include <string>

#include "pto/device_info.h"
#include "pto/tensor.h"

namespace pto::cpu {

struct AttentionTiles {
  int64_t rows = 0;    // query positions per task (per head of the group), >= 1
  int64_t block = 0;   // keys per chunk, >= 1
  int64_t splits = 0;  // key ranges per task, >= 1
};

struct AttentionPlan {
  int64_t rows = 0, block = 0, splits = 1;  // as AttentionTiles, clamped to the problem
  int64_t task_rows = 0;                    // group * rows: rows of Q in one task
  int64_t tasks = 0;                        // B * Hkv * ceil(Sq / rows) (each in `splits` parts)
  bool decode = false;                      // task_rows <= kDecodeRows: the decode kernel
  size_t scratch_bytes = 0;  // per thread: S, packed K^T and V chunks (not in decode), Q, O, P V
  size_t partial_bytes = 0;  // with splits > 1: every part's m, l and O rows, merged at the end
  std::string str() const;
};

struct AttentionShape {
  int64_t batch = 1, heads = 1, kv_heads = 1, queries = 1, keys = 1, d = 1, dv = 1;
  bool causal = false;
};

// The plan for `s` on `threads` threads, with GEMM register panels `nr` columns wide (packed
// chunks are whole panels). Without `override`: task rows about 256 (each packed K and V value
// then feeds >= 512 flops), causal at most a quarter of the queries per head (a task computes its
// diagonal chunks whole), fewer when that leaves under two tasks per thread; the chunk the
// largest power of two in [64, 1024] (and not beyond the keys) whose working set (scores, packed
// K and V chunks, the task's Q, O and P V rows) fits in L2, the rows halved while even 64 keys do
// not fit. When the group's heads times the queries are at most 4 * kDecodeRows (and the group
// at most kDecodeRows), tasks of at most kDecodeRows rows run the decode kernel (all the queries
// in one task when they fit) and the chunk is 256 keys. Splits: on several threads with
// fewer than two tasks per thread, enough key ranges for two per thread, each at least 512 keys (so
// the split depends only on the sizes and the thread count). An override's nonzero fields replace
// the choice (clamped to [1, Sq], [1, L] and [1, L]).
AttentionPlan plan_attention(const AttentionShape& s, int threads, const CacheModel& cache,
                             int64_t nr, const AttentionTiles* override = nullptr);

// Whether mask `m` (broadcast to full = {B, H, Sq, L}, one row per query) is exactly the top-left
// causal pattern: query i sees keys [0, i] and no other (boolean true / false, or additive 0 /
// -inf). The kernel then runs such a mask as is_causal without it (attention.cpp).
bool is_causal_mask(const Tensor& m, const int64_t full[4]);

}  // namespace pto::cpu
