// The CPU thread pool and parallel-for every kernel uses.
//
//   pto::parallel_for(0, rows, /*grain=*/16, [&](int64_t begin, int64_t end) { ... });
//
// One persistent pool per process: PTO_NUM_THREADS threads (default: the cores this process may
// run on), the calling thread being one of them. A range is cut into fixed chunks that depend only
// on its size, the grain and the thread count, so a kernel that reduces inside chunks gives the
// same bits on every run with the same thread count. The first exception thrown by a chunk (the
// lowest chunk index, not the first in time) is rethrown on the calling thread after all chunks
// finish. A parallel_for inside another runs serially on the thread that calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace pto {

// Threads the pool runs kernels on (>= 1).
int num_threads();
// Resizes the pool (n >= 1; 0 means the default). Not to be called while kernels run.
void set_num_threads(int n);

// Where the pool's threads come from: "own" (threads of its own, which spin PTO_SPIN_US
// microseconds when idle, default 50, then sleep), "omp" (the OpenMP team of the libgomp.so.1 the
// process has loaded, PyTorch's: no second set of threads fighting the first for the cores) or
// "auto" (that team while it keeps up: a region that ends long after its last task, a member
// descheduled by other processes, sends the jobs to own threads for a while; own threads alone
// without libgomp loaded). Default: PTO_THREADING, else auto (docs/backend/runtime.md). The work
// is cut the same way in all, so results are the same bits. "omp" without libgomp loaded and
// unknown modes are errors. Not to be called while kernels run.
void set_threading(std::string_view mode);
// Decides "auto" again (after a library that brings libgomp, such as PyTorch, was loaded).
void recheck_threading();
// The mode in effect: "own", "omp" or "auto" ("own" where "auto" found no libgomp).
std::string threading();

// Calls fn(begin, end) over [begin, end) in chunks of at least `grain` elements, in parallel.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

// Runs fn(task) for task in [0, tasks) with one task per call, spread over the pool. For work
// that is already cut into pieces of similar cost (GEMM tiles, conv blocks).
void parallel_tasks(int64_t tasks, const std::function<void(int64_t)>& fn);

// True on a pool thread, or on the caller while it runs a parallel region (false at the top of
// run_as_on_pool, which stands for a run that has the pool).
bool in_parallel_region();

// Runs fn() on the calling thread as if it had the whole pool: every parallel_for and
// parallel_tasks inside cuts its work exactly as on num_threads() threads, but runs the pieces in
// order, here. A kernel run this way gives the same bits as when it has the pool, so independent
// kernels may run one per thread (Executable stages) without changing any result.
void run_as_on_pool(const std::function<void()>& fn);

}  // namespace pto
