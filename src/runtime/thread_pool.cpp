// The persistent thread pool behind pto::parallel_for.
//
// A job is a number of tasks and a function; every thread, the caller included, takes the next task
// index from an atomic counter until none are left. Task boundaries are fixed before the job
// starts, so results never depend on which thread ran which task. run_as_on_pool keeps those
// boundaries but runs the pieces in order on its thread (a kernel of an Executable stage, beside
// others on the other threads, gives the bits it gives on the whole pool). parallel_for cuts a few
// chunks per thread so that the others finish the work of a thread the OS has descheduled. Idle
// workers spin for PTO_SPIN_US (kernels in a graph follow each other within microseconds) and then
// sleep on a condition variable.
//
// PTO_THREADING=omp runs the same jobs on the OpenMP team of the libgomp the process has already
// loaded (PyTorch's) instead of on threads of its own. The tasks and their boundaries are the same
// in both modes, so are the bits. On a loaded machine a libgomp team with its default (active)
// wait policy made a PyPTO call right after a torch op 100x slower (the region's end barrier waits
// for every member, descheduled or not), while own threads that spin only PTO_SPIN_US removed most
// of the slowdown (bench/coexist.py). `auto`, the default, runs on the team and watches that
// barrier: a region that ends long after its last task sends the jobs to own threads for a while
// (team_guard.h); without libgomp in the process it is own.
#include <dirent.h>
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pto/error.h"
#include "pto/log.h"
#include "pto/parallel.h"
#include "runtime/profiler_hooks.h"
#include "runtime/team_guard.h"

namespace pto {
namespace {

// Chunks a parallel_for cuts per pool thread (see parallel_for).
constexpr int64_t kChunksPerThread = 4;

thread_local bool t_in_region = false;
// Inside run_as_on_pool: top-level regions are cut as on the pool but run on this thread.
thread_local bool t_as_on_pool = false;

struct RegionGuard {
  bool saved = t_in_region;
  RegionGuard() { t_in_region = true; }
  ~RegionGuard() { t_in_region = saved; }
};

// An integer environment variable in [lo, hi], or `fallback` when unset or empty.
long env_int(const char* name, long lo, long hi, long fallback, const char* what) {
  const char* env = std::getenv(name);
  if (!env || !*env) return fallback;
  char* end = nullptr;
  long n = std::strtol(env, &end, 10);
  if (*end != '\0' || n < lo || n > hi)
    throw ValueError(cat(name, " must be ", what, ", got '", env, "'"));
  return n;
}

// How long an idle worker spins before it sleeps. Beside another runtime's threads a worker that
// spins takes the core from them; one that sleeps costs ~5-10 us to wake.
std::chrono::microseconds spin_time() {
  return std::chrono::microseconds(
      env_int("PTO_SPIN_US", 0, 1000000, 50, "an integer in [0, 1000000]"));
}

// Wait loops: pauses between looks at whether another pool thread shares this core, and the
// pauses after which a waiting caller yields at every step.
constexpr int kYieldEvery = 64;
constexpr int kSpinSteps = 4096;

// GOMP_parallel of a libgomp already in the process, or null.
struct Gomp {
  void (*parallel)(void (*)(void*), void*, unsigned, unsigned) = nullptr;
};

Gomp loaded_gomp() {
  // RTLD_NOLOAD: only a copy the process has (PyTorch ships one named libgomp.so.1); never a new
  // one.
  void* lib = dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_LAZY);
  if (!lib) return {};
  Gomp g;
  g.parallel = reinterpret_cast<decltype(g.parallel)>(dlsym(lib, "GOMP_parallel"));
  dlclose(lib);  // the process still holds it: the handle from NOLOAD took one more reference
  return g;
}

enum class Threading { kAuto, kOwn, kOmp };

Threading parse_threading(std::string_view mode, const char* where) {
  if (mode == "auto") return Threading::kAuto;
  if (mode == "own") return Threading::kOwn;
  if (mode == "omp") return Threading::kOmp;
  throw ValueError(cat(where, " must be one of auto, own, omp; got '", mode, "'"));
}

Threading requested_default() {
  const char* env = std::getenv("PTO_THREADING");
  return env && *env ? parse_threading(env, "PTO_THREADING") : Threading::kAuto;
}

int default_threads() {
  if (long n = env_int("PTO_NUM_THREADS", 1, 4096, 0, "a positive integer"); n > 0)
    return static_cast<int>(n);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// Runs every task on this thread; as in a parallel run, all tasks run and the lowest failing one's
// exception is rethrown, so side effects do not depend on the thread count.
// Tasks of a region nested in a task are part of that task for the profiler.
void run_serial(int64_t tasks, const std::function<void(int64_t)>& fn) {
  const profiler::detail::TaskContext profile =
      t_in_region ? profiler::detail::TaskContext{} : profiler::detail::t_context;
  RegionGuard guard;
  std::exception_ptr error;
  for (int64_t t = 0; t < tasks; ++t) {
    try {
      profiler::run_task(profile, t, [&] { fn(t); });
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

// The CPU a pool thread runs on: -1 while it has no job (set by the thread itself, read by the
// others to see whether they share a core; a hint, as the OS may move a thread at any time).
thread_local std::atomic<int>* t_cpu_slot = nullptr;

struct Job {
  const std::function<void(int64_t)>* fn;
  profiler::detail::TaskContext profile;  // the kernel step that started the job, when recording
  int64_t tasks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex error_mutex;
  int64_t error_task = -1;
  std::exception_ptr error;
  // With stamp_end, when the last task ended (written by the thread that ended it).
  bool stamp_end = false;
  detail::TeamGuard::Clock::time_point last_done{};

  // Runs tasks until none are left.
  void work() {
    RegionGuard guard;
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < tasks;) {
      if (t_cpu_slot) t_cpu_slot->store(sched_getcpu(), std::memory_order_relaxed);
      try {
        profiler::run_task(profile, t, [&] { (*fn)(t); });
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (error_task < 0 || t < error_task) {
          error_task = t;
          error = std::current_exception();
        }
      }
      if (done.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks && stamp_end)
        last_done = detail::TeamGuard::Clock::now();
    }
  }
};

class ThreadPool {
 public:
  // With gomp.parallel the jobs run on that OpenMP team and the pool starts no thread, unless
  // `guarded`: then a team that stalls hands the jobs to threads of the pool's own for a while.
  ThreadPool(int threads, Gomp gomp, bool guarded, std::chrono::microseconds spin)
      : threads_(threads),
        gomp_(gomp),
        guarded_(guarded && gomp.parallel),
        spin_(spin),
        cpu_(new std::atomic<int>[threads]) {
    for (int i = 0; i < threads; ++i) cpu_[i].store(-1);
    if (gomp_.parallel && !guarded_) return;
    for (int i = 1; i < threads; ++i)
      workers_.emplace_back([this, i] {
        profiler::set_thread_name(cat("pto worker ", i));
        worker_loop(i);
      });
  }

  ~ThreadPool() {
    {
      std::lock_guard lock(wake_mutex_);
      stop_.store(true);
      generation_.fetch_add(1);
    }
    wake_cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return threads_; }
  // "own", "omp", or "auto" (the team, guarded).
  static const char* mode_name(bool team, bool guarded) {
    return !team ? "own" : guarded ? "auto" : "omp";
  }
  const char* mode() const { return mode_name(gomp_.parallel != nullptr, guarded_); }

  void run(int64_t tasks, const std::function<void(int64_t)>& fn) {
    // One job at a time; a second caller (another thread running a graph) works alone.
    std::unique_lock busy(job_mutex_, std::try_to_lock);
    if (!busy.owns_lock() || tasks == 1 || threads_ == 1) {
      run_serial(tasks, fn);
      return;
    }
    cpu_[0].store(sched_getcpu(), std::memory_order_relaxed);
    Job job;
    job.fn = &fn;
    job.profile = profiler::detail::t_context;
    job.tasks = tasks;
    if (gomp_.parallel && (!guarded_ || guard_.use_team(detail::TeamGuard::Clock::now(),
                                                        [&] { return crowded(); }))) {
      // Every member of the team (the caller is its master) works until no task is left; the
      // team may be smaller than asked (a nested region gets one thread), which only takes longer.
      job.stamp_end = guarded_;
      gomp_.parallel([](void* j) { static_cast<Job*>(j)->work(); }, &job,
                     static_cast<unsigned>(std::min<int64_t>(threads_, tasks)), 0);
      if (guarded_) judge_team(job);
    } else {
      run_on_workers(job);
    }
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  void judge_team(const Job& job) {
    const auto now = detail::TeamGuard::Clock::now();
    const auto stall = now - job.last_done;
    if (guard_.judge(now, stall) && log_enabled(LogLevel::kInfo))
      log(LogLevel::kInfo,
          cat("threading auto: a region on the OpenMP team ended ",
              std::chrono::duration_cast<std::chrono::microseconds>(stall).count(),
              " us after its last task (a member was descheduled); own threads for the next ",
              guard_.backoff().count(), " ms"));
  }

  // Whether the cores cannot hold this pool's threads beside the threads other processes have
  // runnable now (/proc/loadavg's count of runnable threads, less this process's own in
  // /proc/self/task; ~10-50 us, asked once per backoff).
  bool crowded() const {
    long running = 0;  // "0.52 0.58 0.59 3/213 ...": the fourth field's first number
    if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%*f %*f %*f %ld/", &running) != 1) running = 0;
      std::fclose(f);
    }
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (running <= 0 || cores <= 0) return false;
    return running - running_threads_of_this_process() + threads_ > cores;
  }

  // Threads of this process the OS has runnable now (state R in /proc/self/task/*/stat).
  static long running_threads_of_this_process() {
    DIR* dir = opendir("/proc/self/task");
    if (!dir) return 1;
    long running = 0;
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      char path[320], stat[512];
      std::snprintf(path, sizeof(path), "/proc/self/task/%s/stat", entry->d_name);
      std::FILE* f = std::fopen(path, "r");
      if (!f) continue;
      const size_t n = std::fread(stat, 1, sizeof(stat) - 1, f);
      std::fclose(f);
      stat[n] = '\0';
      // "tid (name) S ...": the state follows the last ')' (a name may hold one)
      const char* close = std::strrchr(stat, ')');
      if (close && close[1] == ' ' && close[2] == 'R') ++running;
    }
    closedir(dir);
    return std::max(running, 1L);  // this caller is running
  }

  void run_on_workers(Job& job) {
    job_.store(&job);
    {
      std::lock_guard lock(wake_mutex_);
      generation_.fetch_add(1);
    }
    if (sleepers_.load() > 0) wake_cv_.notify_all();
    job.work();
    wait_for([&] { return job.done.load(std::memory_order_acquire) >= job.tasks; });
    job_.store(nullptr);
    wait_for([&] { return active_.load() == 0; });  // a worker may still hold &job
  }

  // Whether a worker with a job last ran a task on `cpu`.
  bool worker_on(int cpu) const {
    for (int i = 1; i < threads_; ++i)
      if (cpu_[i].load(std::memory_order_relaxed) == cpu) return true;
    return false;
  }

  // The caller's wait for the workers: pauses, and every kYieldEvery of them its core to a pool
  // thread the OS has put on the same core (where other processes hold the other cores, the
  // scheduler puts the caller and a worker together: pausing alone, the caller kept the core for
  // the rest of its time slice while the task it waited for could not run); after kSpinSteps, the
  // core to anyone at each step (a worker descheduled in mid-task).
  template <class Done>
  void wait_for(Done done) {
    for (int spins = 1; !done(); ++spins) {
      if (spins >= kSpinSteps || (spins % kYieldEvery == 0 && worker_on(sched_getcpu())))
        std::this_thread::yield();
      else
        _mm_pause();
    }
  }

  void worker_loop(int index) {
    using Clock = std::chrono::steady_clock;
    uint64_t seen = 0;
    std::atomic<int>& slot = cpu_[index];
    t_cpu_slot = &slot;
    for (;;) {
      // Spin for PTO_SPIN_US, reading the clock every kYieldEvery pauses, and then giving the core
      // to the caller if it shares it (between jobs the caller runs the graph's serial parts).
      const auto until = Clock::now() + spin_;
      for (int spins = 1; generation_.load() == seen; ++spins) {
        _mm_pause();
        if (spins % kYieldEvery != 0) continue;
        if (Clock::now() >= until) break;
        if (cpu_[0].load(std::memory_order_relaxed) == sched_getcpu()) std::this_thread::yield();
      }
      if (generation_.load() == seen) {
        std::unique_lock lock(wake_mutex_);
        sleepers_.fetch_add(1);
        wake_cv_.wait(lock, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
      }
      seen = generation_.load();
      if (stop_.load()) return;
      slot.store(sched_getcpu(), std::memory_order_relaxed);
      active_.fetch_add(1);
      if (Job* job = job_.load()) job->work();
      active_.fetch_sub(1);
      slot.store(-1, std::memory_order_relaxed);
    }
  }

  int threads_;
  Gomp gomp_;
  bool guarded_;
  detail::TeamGuard guard_;  // under job_mutex_
  std::chrono::microseconds spin_;
  // Per pool thread (0: the caller of the last job), the CPU it last ran a task on, or -1.
  std::unique_ptr<std::atomic<int>[]> cpu_;
  std::vector<std::thread> workers_;
  std::mutex job_mutex_;
  std::atomic<Job*> job_{nullptr};
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex wake_mutex_;
  std::condition_variable wake_cv_;
};

std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;
std::optional<Threading> g_requested;  // set_threading's mode, else PTO_THREADING's, else auto

// In a child made by fork() only the forking thread exists: the parent's pool threads are gone,
// and libgomp's team, if the parent ran a region on it, waits in the child for threads that never
// come (the child's first region hangs; PyTorch's own ops hang there too). The child drops the
// parent's pool without joining its threads, starts threads of its own, and never uses the team.
std::atomic<bool> g_forked{false};
bool g_in_forked_child = false;  // under g_pool_mutex

void watch_for_fork() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { g_forked.store(true); }); });
}

// Under g_pool_mutex.
void leave_parent_pool_after_fork() {
  if (!g_forked.exchange(false)) return;
  g_in_forked_child = true;
  (void)g_pool.release();  // its threads do not exist here: nothing to join, nothing to free
}

// The team the requested mode gives now: libgomp's for omp (an error without one), libgomp's for
// auto when the process has loaded it (guarded), else none (own threads).
Gomp resolve(Threading mode) {
  if (mode == Threading::kOwn) return {};
  if (g_in_forked_child) {
    if (mode == Threading::kOmp)
      log(LogLevel::kWarn,
          "threading 'omp': this process was made by fork() after its parent's OpenMP team ran, "
          "and that team cannot run here; using PyPTO's own threads");
    return {};
  }
  Gomp g = loaded_gomp();
  if (mode == Threading::kOmp && !g.parallel)
    throw ValueError(
        "threading 'omp' needs the process to have loaded libgomp.so.1 (import torch first); "
        "use 'own' or 'auto'");
  return g;
}

// Under g_pool_mutex: a pool of `threads` threads in the requested mode, replacing the current
// one if it differs.
void make_pool(int threads) {
  watch_for_fork();
  leave_parent_pool_after_fork();
  if (!g_requested) g_requested = requested_default();
  Gomp gomp = resolve(*g_requested);
  const bool guarded = *g_requested == Threading::kAuto;
  const std::string_view mode = ThreadPool::mode_name(gomp.parallel != nullptr, guarded);
  if (g_pool && g_pool->threads() == threads && g_pool->mode() == mode) return;
  const auto spin = spin_time();  // checked before the pool goes
  g_pool.reset();
  g_pool = std::make_unique<ThreadPool>(threads, gomp, guarded, spin);
}

ThreadPool& pool() {
  std::lock_guard lock(g_pool_mutex);
  if (!g_pool || g_forked.load(std::memory_order_relaxed))
    make_pool(g_pool ? g_pool->threads() : default_threads());
  return *g_pool;
}

void check_not_in_region(const char* what) {
  if (t_in_region || t_as_on_pool)
    throw ValueError(cat(what, ": called from inside a parallel region"));
}

}  // namespace

int num_threads() {
  return pool().threads();
}

void set_num_threads(int n) {
  if (n < 0 || n > 4096) throw ValueError(cat("set_num_threads: expected 1..4096, got ", n));
  check_not_in_region("set_num_threads");
  int want = n == 0 ? default_threads() : n;
  std::lock_guard lock(g_pool_mutex);
  make_pool(want);
}

void set_threading(std::string_view mode) {
  Threading m = parse_threading(mode, "set_threading: the mode");
  check_not_in_region("set_threading");
  std::lock_guard lock(g_pool_mutex);
  std::optional<Threading> before = g_requested;
  g_requested = m;
  try {
    make_pool(g_pool ? g_pool->threads() : default_threads());
  } catch (...) {
    g_requested = before;
    throw;
  }
}

void recheck_threading() {
  std::lock_guard lock(g_pool_mutex);
  if (g_pool) make_pool(g_pool->threads());
}

std::string threading() {
  return pool().mode();
}

bool in_parallel_region() {
  return t_in_region;
}

void run_as_on_pool(const std::function<void()>& fn) {
  struct Guard {
    bool region = t_in_region, as_on_pool = t_as_on_pool;
    Guard() {
      t_in_region = false;
      t_as_on_pool = true;
    }
    ~Guard() {
      t_in_region = region;
      t_as_on_pool = as_on_pool;
    }
  } guard;
  fn();
}

void parallel_tasks(int64_t tasks, const std::function<void(int64_t)>& fn) {
  if (tasks <= 0) return;
  if (t_in_region || t_as_on_pool) {
    run_serial(tasks, fn);
    return;
  }
  pool().run(tasks, fn);
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  int64_t n = end - begin;
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // Every chunk at least `grain` long (n / grain rounds down), and kChunksPerThread chunks per
  // thread: a worker the OS deschedules mid-job (another process, another runtime's threads, a
  // VM's steal) strands one small chunk, not half of the job. ResNet-50 on 2 threads beside
  // two nice-19 compilers: 58.8 -> 50.2 ms median, p90 80 -> 66 ms.
  const int threads = num_threads();
  int64_t chunks =
      t_in_region || threads == 1 ? 1 : std::min<int64_t>(n / grain, kChunksPerThread * threads);
  if (chunks <= 1) {
    const profiler::detail::TaskContext profile =
        t_in_region ? profiler::detail::TaskContext{} : profiler::detail::t_context;
    RegionGuard guard;
    profiler::run_task(profile, 0, [&] { fn(begin, end); });
    return;
  }
  // Balanced fixed chunks: the first n % chunks get one more element.
  int64_t base = n / chunks, extra = n % chunks;
  auto chunk = [&](int64_t c) {
    int64_t b = begin + c * base + std::min(c, extra);
    fn(b, b + base + (c < extra ? 1 : 0));
  };
  if (t_as_on_pool) {
    run_serial(chunks, chunk);  // the pool's chunks, in order on this thread
    return;
  }
  pool().run(chunks, chunk);
}

}  // namespace pto
