// The runtime: the thread pool behind parallel_for (fixed chunks, errors, nesting, sizing), the
// caching memory pool (size classes, flags, stats), streams and events, and an Executable that
// allocates nothing from the system once warm.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "pto/runtime.h"
#include "runtime/team_guard.h"

namespace pto {
namespace {

using namespace std::chrono_literals;

// Restores the default thread count when a test ends.
struct ThreadsGuard {
  ~ThreadsGuard() { set_num_threads(0); }
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

// ---- thread pool ----

TEST(ThreadPool, ChunksAreFixedAndCoverTheRange) {
  ThreadsGuard restore;
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    for (int64_t n : {1, 2, 7, 16, 17, 100, 1000003}) {
      for (int64_t grain : {1, 3, 16, 5000}) {
        auto chunks_of = [&] {
          std::mutex m;
          std::vector<std::pair<int64_t, int64_t>> chunks;
          parallel_for(10, 10 + n, grain, [&](int64_t b, int64_t e) {
            std::lock_guard lock(m);
            chunks.emplace_back(b, e);
          });
          std::sort(chunks.begin(), chunks.end());
          return chunks;
        };
        auto chunks = chunks_of();
        SCOPED_TRACE(testing::Message()
                     << "threads " << threads << " n " << n << " grain " << grain);
        // As documented: four chunks per thread at most (one on one thread), none shorter than
        // the grain.
        int64_t want =
            threads == 1 ? 1 : std::max<int64_t>(1, std::min<int64_t>(n / grain, 4 * threads));
        ASSERT_EQ(static_cast<int64_t>(chunks.size()), want);
        int64_t at = 10;
        for (auto [b, e] : chunks) {
          EXPECT_EQ(b, at);
          EXPECT_GE(e - b, std::min(grain, n));
          at = e;
        }
        EXPECT_EQ(at, 10 + n);
        for (int rep = 0; rep < 3; ++rep) EXPECT_EQ(chunks_of(), chunks);
      }
    }
  }
}

TEST(ThreadPool, ReductionsAreBitwiseRepeatable) {
  ThreadsGuard restore;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(100003);
  for (float& v : x) v = u(rng);
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    auto sum = [&] {
      std::mutex m;
      std::vector<std::pair<int64_t, float>> parts;
      parallel_for(0, static_cast<int64_t>(x.size()), 1000, [&](int64_t b, int64_t e) {
        float s = 0;
        for (int64_t i = b; i < e; ++i) s += x[i];
        std::lock_guard lock(m);
        parts.emplace_back(b, s);
      });
      std::sort(parts.begin(), parts.end());
      float total = 0;
      for (auto [b, s] : parts) total += s;
      return total;
    };
    float first = sum();
    for (int rep = 0; rep < 20; ++rep) {
      float again = sum();
      EXPECT_EQ(std::memcmp(&again, &first, sizeof(float)), 0) << "threads " << threads;
    }
  }
}

// Two tasks that each wait for the other to start: both ran at once, on two threads.
void expect_two_threads_meet() {
  std::atomic<int> arrived{0};
  std::atomic<int> met{0};
  parallel_tasks(2, [&](int64_t) {
    arrived.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + 5s;
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    if (arrived.load() == 2) met.fetch_add(1);
  });
  EXPECT_EQ(met.load(), 2);  // each task saw the other one start: two threads ran them
}

// Every task runs; the lowest failing one's error is rethrown, not the first in time.
void expect_lowest_failure_rethrown(int threads) {
  std::atomic<int> ran{0};
  // Task 5 fails at once; task 1 fails later in time but has the lower index.
  std::string what = message_of([&] {
    parallel_tasks(8, [&](int64_t t) {
      ran.fetch_add(1);
      if (t == 1) {
        std::this_thread::sleep_for(20ms);
        throw ValueError("task 1");
      }
      if (t == 5) throw ValueError("task 5");
    });
  });
  EXPECT_EQ(what, "task 1") << "threads " << threads;
  EXPECT_EQ(ran.load(), 8) << "threads " << threads;
  // parallel_for: the chunk holding the lowest failing element.
  what = message_of([&] {
    parallel_for(0, 400, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        if (i % 97 == 96) throw ValueError(cat("element ", i));
    });
  });
  EXPECT_EQ(what, "element 96") << "threads " << threads;
}

TEST(ThreadPool, TwoThreadsRunConcurrently) {
  ThreadsGuard restore;
  set_num_threads(2);
  expect_two_threads_meet();
}

TEST(ThreadPool, TheLowestFailingChunkIsRethrownAfterAllRan) {
  ThreadsGuard restore;
  for (int threads = 1; threads <= 4; ++threads) {
    set_num_threads(threads);
    expect_lowest_failure_rethrown(threads);
  }
}

TEST(ThreadPool, NestedParallelForRunsSerially) {
  ThreadsGuard restore;
  set_num_threads(2);
  EXPECT_FALSE(in_parallel_region());
  std::atomic<int> inner_calls{0};
  std::atomic<int> mismatched{0};
  parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    EXPECT_TRUE(in_parallel_region());
    auto outer = std::this_thread::get_id();
    parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) {
      inner_calls.fetch_add(1);
      if (std::this_thread::get_id() != outer || b != 0 || e != 1000) mismatched.fetch_add(1);
    });
    parallel_tasks(3, [&](int64_t) {
      if (std::this_thread::get_id() != outer) mismatched.fetch_add(1);
    });
  });
  EXPECT_EQ(inner_calls.load(), 2);  // one whole-range call per outer chunk
  EXPECT_EQ(mismatched.load(), 0);
  EXPECT_FALSE(in_parallel_region());
}

TEST(ThreadPool, SetNumThreads) {
  ThreadsGuard restore;
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_THROW(set_num_threads(-1), ValueError);
  EXPECT_THROW(set_num_threads(5000), ValueError);
  EXPECT_EQ(num_threads(), 1);
  set_num_threads(2);
  EXPECT_THROW(parallel_for(0, 2, 1, [](int64_t, int64_t) { set_num_threads(1); }), ValueError);
  EXPECT_EQ(num_threads(), 2);
}

TEST(ThreadPool, EnvironmentVariableIsParsedStrictly) {
  ThreadsGuard restore;
  const char* saved = std::getenv("PTO_NUM_THREADS");
  std::string saved_value = saved ? saved : "";
  setenv("PTO_NUM_THREADS", "3", 1);
  set_num_threads(0);  // the default: from the variable
  EXPECT_EQ(num_threads(), 3);
  for (const char* bad : {"0", "-2", "two", "2x", "99999"}) {
    setenv("PTO_NUM_THREADS", bad, 1);
    EXPECT_EQ(message_of([] { set_num_threads(0); }),
              cat("PTO_NUM_THREADS must be a positive integer, got '", bad, "'"));
    EXPECT_EQ(num_threads(), 3);  // the pool is unchanged
  }
  if (saved)
    setenv("PTO_NUM_THREADS", saved_value.c_str(), 1);
  else
    unsetenv("PTO_NUM_THREADS");
}

TEST(ThreadPool, SpinTimeIsParsedStrictly) {
  ThreadsGuard restore;
  set_num_threads(2);
  for (const char* bad : {"-1", "1e3", "fast", "1000001"}) {
    setenv("PTO_SPIN_US", bad, 1);
    EXPECT_EQ(message_of([] { set_num_threads(3); }),
              cat("PTO_SPIN_US must be an integer in [0, 1000000], got '", bad, "'"));
    EXPECT_EQ(num_threads(), 2);  // the pool is unchanged
  }
  for (const char* good : {"0", "7"}) {  // no spinning, or a little: the same results
    setenv("PTO_SPIN_US", good, 1);
    set_num_threads(good[0] == '0' ? 3 : 2);
    std::atomic<int64_t> sum{0};
    for (int rep = 0; rep < 50; ++rep) parallel_tasks(9, [&](int64_t t) { sum += t; });
    EXPECT_EQ(sum.load(), 50 * 36);
  }
  unsetenv("PTO_SPIN_US");
}

// f32 values from a normal distribution seeded with `seed`.
Tensor random_input(const Dims& shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> xs(static_cast<size_t>(n));
  for (float& v : xs) v = nd(rng);
  return Tensor::from_vector(xs, shape);
}

// y = last(x @ w + b) for x: f32[rows, k], w: [k, n], with weights from `seed` times `scale`.
Graph matmul_add(const std::string& name, Shape x_shape, int64_t n, const std::string& last,
                 unsigned seed, float scale = 1.0f) {
  Graph g;
  g.name = name;
  const int64_t k = x_shape.back().value;
  ValueId x = g.add_input("x", {DType::kF32, std::move(x_shape)});
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<size_t>(k * n)), b(static_cast<size_t>(n));
  for (float& v : w) v = nd(rng) * scale;
  for (float& v : b) v = nd(rng);
  ValueId wv = g.add_value("w"), bv = g.add_value("b");
  g.set_initializer(wv, Tensor::from_vector(w, {k, n}));
  g.set_initializer(bv, Tensor::from_vector(b, {n}));
  ValueId mm = g.add_value("mm"), add = g.add_value("add"), y = g.add_value("y");
  g.add_node("MatMul", {x, wv}, {mm}, {}, "matmul");
  g.add_node("Add", {mm, bv}, {add}, {}, "add");
  g.add_node(last, {add}, {y}, {}, "last");
  g.add_output(y);
  return g;
}

// PTO_THREADING=omp: the jobs run on the team of the libgomp in the process (here the system's,
// loaded as PyTorch loads its own): the same bits as on the pool's own threads, both threads at
// work, errors as on the pool; unknown modes and omp without libgomp are errors.
TEST(ThreadPool, OmpTeamGivesTheBitsOfTheOwnThreads) {
  ThreadsGuard restore;
  struct ModeGuard {
    ~ModeGuard() { set_threading("own"); }  // the later tests as before libgomp was loaded
  } restore_mode;
  EXPECT_EQ(message_of([] { set_threading("openmp"); }),
            "set_threading: the mode must be one of auto, own, omp; got 'openmp'");
  if (!dlopen("libgomp.so.1", RTLD_NOLOAD | RTLD_LAZY)) {
    EXPECT_EQ(message_of([] { set_threading("omp"); }),
              "threading 'omp' needs the process to have loaded libgomp.so.1 (import torch "
              "first); use 'own' or 'auto'");
    set_threading("auto");
    EXPECT_EQ(threading(), "own");
  }
  ASSERT_NE(dlopen("libgomp.so.1", RTLD_NOW | RTLD_GLOBAL), nullptr) << dlerror();

  // big enough to be cut into many chunks on two threads
  Graph g = matmul_add("gemm_softmax", Shape{96, 200}, 300, "Softmax", 7, 0.1f);
  Tensor x = random_input({96, 200}, 8);
  Tensor want = reference::run(g, {x})[0];
  for (int threads = 1; threads <= 3; ++threads) {
    set_num_threads(threads);
    set_threading("own");
    EXPECT_EQ(threading(), "own");
    Tensor own = compile(g).run({x})[0];
    set_threading("omp");
    EXPECT_EQ(threading(), "omp");
    EXPECT_EQ(num_threads(), threads);
    Executable exe = compile(g);
    for (int rep = 0; rep < 3; ++rep) {
      Tensor omp = exe.run({x})[0];
      ASSERT_EQ(omp.shape(), own.shape());
      EXPECT_EQ(std::memcmp(omp.raw_data(), own.raw_data(), omp.nbytes()), 0)
          << "threads " << threads;
    }
    for (int64_t i = 0; i < own.numel(); ++i)
      ASSERT_NEAR(own.item_as_double(i), want.item_as_double(i), 1e-5) << i;
  }
  set_num_threads(2);
  expect_two_threads_meet();
  expect_lowest_failure_rethrown(2);

  // auto: the team, guarded; the same bits, both threads at work, errors as on the pool
  set_threading("auto");  // libgomp is loaded now
  EXPECT_EQ(threading(), "auto");
  Executable exe = compile(g);
  Tensor own = [&] {
    set_threading("own");
    return compile(g).run({x})[0];
  }();
  set_threading("auto");
  for (int rep = 0; rep < 3; ++rep) {
    Tensor got = exe.run({x})[0];
    EXPECT_EQ(std::memcmp(got.raw_data(), own.raw_data(), own.nbytes()), 0);
  }
  expect_two_threads_meet();
  expect_lowest_failure_rethrown(2);
}

// auto's guard: a region that ends long after its last task sends the jobs to own threads for a
// backoff that doubles while the stalls go on and goes back to the first after a calm spell; a
// backoff that ends on a crowded machine starts the next without trying the team.
TEST(ThreadPool, TeamGuardBacksOffFromAStallingTeam) {
  using namespace std::chrono_literals;
  using detail::TeamGuard;
  TeamGuard guard(TeamGuard::Limits{200us, 50ms, 400ms, 1000ms});
  int asked = 0;
  bool crowded = false;
  auto ask = [&] {
    ++asked;
    return crowded;
  };
  TeamGuard::Clock::time_point t{};
  t += 1h;
  EXPECT_TRUE(guard.use_team(t, ask));
  EXPECT_FALSE(guard.judge(t, 150us));  // a barrier that waited for a last task's end: fine
  EXPECT_TRUE(guard.use_team(t, ask));
  EXPECT_TRUE(guard.judge(t, 3ms));  // a member descheduled for a time slice
  EXPECT_EQ(guard.backoff(), 50ms);
  EXPECT_FALSE(guard.use_team(t + 49ms, ask));
  EXPECT_EQ(asked, 0);  // the machine is looked at only when a backoff ends
  EXPECT_TRUE(guard.use_team(t + 50ms, ask));
  EXPECT_TRUE(guard.use_team(t + 50ms, ask));
  EXPECT_EQ(asked, 1);
  // back on the team, stalling again at once: twice as long, up to the limit
  std::chrono::milliseconds want[] = {100ms, 200ms, 400ms, 400ms};
  for (auto backoff : want) {
    t += guard.backoff();
    ASSERT_TRUE(guard.use_team(t, ask));
    EXPECT_TRUE(guard.judge(t, 1ms));
    EXPECT_EQ(guard.backoff(), backoff);
    EXPECT_FALSE(guard.use_team(t + backoff - 1ms, ask));
  }
  EXPECT_EQ(guard.stalls(), 5);
  // a second on the team without a stall: the next one backs off for the first time again
  t += guard.backoff();
  EXPECT_TRUE(guard.use_team(t, ask));
  EXPECT_FALSE(guard.judge(t + 999ms, 10us));
  EXPECT_FALSE(guard.judge(t + 1000ms, 10us));
  EXPECT_TRUE(guard.judge(t + 1001ms, 5ms));
  EXPECT_EQ(guard.backoff(), 50ms);
  EXPECT_EQ(guard.stalls(), 6);
  // the backoff ends on a crowded machine: the next one starts at once, longer
  t += 1001ms + 50ms;
  crowded = true;
  const int before = asked;
  EXPECT_FALSE(guard.use_team(t, ask));
  EXPECT_EQ(asked, before + 1);
  EXPECT_EQ(guard.backoff(), 100ms);
  EXPECT_FALSE(guard.use_team(t + 99ms, ask));
  crowded = false;
  EXPECT_TRUE(guard.use_team(t + 100ms, ask));
  EXPECT_EQ(guard.stalls(), 7);
}

// ---- memory pool ----

TEST(MemoryPool, SizeClassesAreReused) {
  auto pool = std::make_shared<MemoryPool>();
  void* a = pool->allocate(100);
  MemoryPoolStats s = pool->stats();
  EXPECT_EQ(s.system_allocations, 1u);
  EXPECT_EQ(s.in_use_bytes, 128u);  // 64-byte steps up to 4 KiB
  pool->deallocate(a, 100);
  EXPECT_EQ(pool->stats().in_use_bytes, 0u);
  EXPECT_EQ(pool->stats().reserved_bytes, 128u);
  void* b = pool->allocate(120);  // same class: the cached block
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool->stats().pool_hits, 1u);
  void* c = pool->allocate(129);  // the next class: from the system
  EXPECT_NE(c, a);
  EXPECT_EQ(pool->stats().system_allocations, 2u);
  pool->deallocate(b, 120);
  pool->deallocate(c, 129);

  // Above 4 KiB: eight classes per power of two, so a block wastes at most 12.5%.
  std::mt19937_64 rng(1);
  for (int i = 0; i < 200; ++i) {
    size_t n = 4097 + rng() % (size_t{1} << 22);
    auto fresh = std::make_shared<MemoryPool>();
    void* p = fresh->allocate(n);
    std::memset(p, 1, n);
    size_t cls = fresh->stats().reserved_bytes;
    EXPECT_GE(cls, n);
    EXPECT_LE(cls, n + n / 8);
    fresh->deallocate(p, n);
    void* q = fresh->allocate(cls);  // the class's own size maps to itself
    EXPECT_EQ(q, p);
    fresh->deallocate(q, cls);
  }
}

TEST(MemoryPool, StatsAndRelease) {
  auto pool = std::make_shared<MemoryPool>();
  void* a = pool->allocate(1000);  // class 1024
  void* b = pool->allocate(64);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kTensorAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kTensorAlignment, 0u);
  pool->deallocate(a, 1000);
  void* c = pool->allocate(64);
  MemoryPoolStats s = pool->stats();
  EXPECT_EQ(s.in_use_bytes, 128u);
  EXPECT_EQ(s.peak_in_use_bytes, 1088u);
  EXPECT_EQ(s.reserved_bytes, 1024u + 128u);
  EXPECT_EQ(s.system_allocations, 3u);
  EXPECT_EQ(s.pool_hits, 0u);
  pool->deallocate(b, 64);
  pool->deallocate(c, 64);
  pool->release_cached();
  s = pool->stats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.peak_in_use_bytes, 1088u);
  EXPECT_THROW(pool->allocate(max_tensor_bytes() + 1), ValueError);
  EXPECT_EQ(pool->stats().system_allocations, 3u);  // a refused request is not counted
}

TEST(MemoryPolicy, SetGetAndRangeChecks) {
  const MemoryPolicy old = memory_policy();
  EXPECT_EQ(old, MemoryPolicy{});  // the defaults: built-in prefetch, best-fit plan, auto
  MemoryPolicy p;
  p.prefetch_distance = 16;
  p.reuse_distance = 2;
  p.nontemporal = MemoryPolicy::NonTemporal::kNever;
  set_memory_policy(p);
  EXPECT_EQ(memory_policy(), p);
  for (auto bad : {MemoryPolicy{.prefetch_distance = -2}, MemoryPolicy{.prefetch_distance = 1025},
                   MemoryPolicy{.reuse_distance = -1}, MemoryPolicy{.reuse_distance = 65},
                   MemoryPolicy{.nontemporal = static_cast<MemoryPolicy::NonTemporal>(7)}})
    EXPECT_THROW(set_memory_policy(bad), ValueError);
  EXPECT_EQ(memory_policy(), p);  // a refused policy changes nothing
  set_memory_policy(old);
}

TEST(MemoryPool, ZeroFlagClearsReusedBlocks) {
  auto pool = std::make_shared<MemoryPool>();
  auto* p = static_cast<unsigned char*>(pool->allocate(1000));
  std::memset(p, 0xff, 1000);
  pool->deallocate(p, 1000);
  auto* q = static_cast<unsigned char*>(pool->allocate(1000, kAllocZero));
  ASSERT_EQ(q, p);
  EXPECT_EQ(std::count(q, q + 1000, 0), 1000);
  pool->deallocate(q, 1000);
  // A pool whose default is zeroing applies it through the plain Allocator interface.
  auto zeroing = std::make_shared<MemoryPool>(kAllocZero);
  auto* r = static_cast<unsigned char*>(zeroing->allocate(3000));
  std::memset(r, 7, 3000);
  zeroing->deallocate(r, 3000);
  r = static_cast<unsigned char*>(zeroing->allocate(3000));
  EXPECT_EQ(std::count(r, r + 3000, 0), 3000);
  zeroing->deallocate(r, 3000);
}

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

TEST(MemoryPool, PrefetchTouchesPagesAndHugeFirstAligns) {
  auto pool = std::make_shared<MemoryPool>();
  const size_t n = size_t{16} << 20;  // 4096 small pages
  auto* p = static_cast<char*>(pool->allocate(n, kAllocPrefetch));
  long before = minor_faults();
  for (size_t off = 0; off < n; off += 4096) p[off] = 1;
  EXPECT_LT(minor_faults() - before, 64) << "the pages were not touched at allocation";
  pool->deallocate(p, n);

  // A huge-first request does not take the cached small-page block; it gets a 2 MiB-aligned one,
  // which the next huge-first request of its class reuses.
  void* h = pool->allocate(n, kAllocHugeFirst | kAllocPrefetch);
  EXPECT_NE(h, p);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h) % (size_t{2} << 20), 0u);
  std::memset(h, 0, n);
  pool->deallocate(h, n);
  EXPECT_EQ(pool->allocate(n, kAllocHugeFirst), h);
  EXPECT_EQ(pool->allocate(n), p);  // a plain request takes either kind
  EXPECT_EQ(pool->stats().system_allocations, 2u);
  EXPECT_EQ(pool->stats().pool_hits, 2u);
  pool->deallocate(h, n);
  pool->deallocate(p, n);
}

TEST(MemoryPool, ConcurrentUseKeepsStatsConsistent) {
  auto pool = std::make_shared<MemoryPool>();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 2000; ++i) {
        size_t n = 1 + rng() % 20000;
        void* p = pool->allocate(n);
        static_cast<char*>(p)[n - 1] = 1;
        pool->deallocate(p, n);
      }
    });
  for (auto& th : threads) th.join();
  MemoryPoolStats s = pool->stats();
  EXPECT_EQ(s.in_use_bytes, 0u);
  EXPECT_EQ(s.system_allocations + s.pool_hits, 8000u);
  EXPECT_GT(s.pool_hits, 0u);
}

TEST(MemoryPool, TensorsKeepTheirPoolAlive) {
  auto pool = std::make_shared<MemoryPool>();
  std::weak_ptr<MemoryPool> weak = pool;
  Tensor t;
  {
    AllocatorScope scope(pool);
    t = Tensor::zeros(DType::kF32, {1000});
  }
  EXPECT_EQ(pool->stats().in_use_bytes, 4032u);  // 4000 bytes in 64-byte steps
  pool.reset();
  EXPECT_FALSE(weak.expired());
  t.data<float>()[999] = 1;
  t = Tensor();
  EXPECT_TRUE(weak.expired());
}

// ---- streams and events ----

TEST(Stream, RunsWorkInOrder) {
  Stream s;
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) s.launch([&seen, i] { seen.push_back(i); });
  s.synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_TRUE(s.query());
}

TEST(Stream, WaitOrdersWorkAcrossStreams) {
  for (int rep = 0; rep < 5; ++rep) {
    Stream producer, consumer;
    Event ready;
    std::atomic<int> value{0};
    int seen = -1;
    producer.launch([&] {
      std::this_thread::sleep_for(10ms);
      value.store(42);
    });
    ready.record(producer);
    consumer.wait(ready);
    consumer.launch([&] { seen = value.load(); });
    consumer.synchronize();
    EXPECT_EQ(seen, 42);
    EXPECT_TRUE(ready.query());
  }
}

TEST(Stream, QueryAndEventStateWhileBlocked) {
  Stream s;
  Event e;
  EXPECT_TRUE(e.query());  // never recorded
  std::atomic<bool> release{false};
  s.launch([&] {
    while (!release.load()) std::this_thread::sleep_for(1ms);
  });
  e.record(s);
  EXPECT_FALSE(s.query());
  EXPECT_FALSE(e.query());
  EXPECT_THROW(Event::elapsed_ms(e, e), ValueError);  // not completed
  release.store(true);
  e.synchronize();
  EXPECT_TRUE(e.query());
  s.synchronize();
  EXPECT_TRUE(s.query());
}

TEST(Stream, ElapsedTimeIsMeasuredOnTheStream) {
  Stream s;
  Event start, stop, never;
  start.record(s);
  s.launch([] { std::this_thread::sleep_for(30ms); });
  stop.record(s);
  stop.synchronize();
  double ms = Event::elapsed_ms(start, stop);
  EXPECT_GE(ms, 29.0);
  EXPECT_LT(ms, 2000.0);
  EXPECT_DOUBLE_EQ(Event::elapsed_ms(stop, start), -ms);
  EXPECT_EQ(message_of([&] { Event::elapsed_ms(start, never); }),
            "Event::elapsed_ms: the end event was never recorded");
}

TEST(Stream, TheFirstErrorIsRethrownBySynchronize) {
  Stream s;
  Event after;
  bool skipped_ran = false;
  s.launch([] { throw ValueError("first"); });
  s.launch([] { throw ValueError("second"); });
  s.launch([&] { skipped_ran = true; });  // may depend on the failed work: skipped
  after.record(s);
  after.synchronize();  // markers still complete after an error
  EXPECT_EQ(message_of([&] { s.synchronize(); }), "first");
  EXPECT_FALSE(skipped_ran);
  EXPECT_NO_THROW(s.synchronize());  // reported once
  bool ran = false;
  s.launch([&] { ran = true; });
  s.synchronize();
  EXPECT_TRUE(ran);
  EXPECT_THROW(s.launch(nullptr), ValueError);
}

TEST(Stream, MemcpyAndCopyAreCorrect) {
  Stream s;
  std::vector<float> src(10007), dst(10007, 0.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) * 0.5f;
  s.memcpy_async(dst.data(), src.data(), src.size() * sizeof(float));
  s.synchronize();
  EXPECT_EQ(dst, src);

  // Tensor copies: contiguous, from a strided view, into a strided view.
  Tensor a = Tensor::empty(DType::kF32, {3, 5});
  for (int i = 0; i < 15; ++i) a.data<float>()[i] = static_cast<float>(i);
  Tensor b = Tensor::zeros(DType::kF32, {15});
  s.copy_async(b, a);
  Tensor at = a.view({5, 3}, {1, 5}, 0);  // the transpose
  Tensor c = Tensor::zeros(DType::kF32, {5, 3});
  s.copy_async(c, at);
  Tensor d_storage = Tensor::zeros(DType::kF32, {3, 5});
  Tensor d = d_storage.view({5, 3}, {1, 5}, 0);  // write through a transposed view
  s.copy_async(d, c);
  s.synchronize();
  for (int i = 0; i < 15; ++i) EXPECT_EQ(b.data<float>()[i], i);
  for (int r = 0; r < 5; ++r)
    for (int k = 0; k < 3; ++k) EXPECT_EQ(c.data<float>()[r * 3 + k], k * 5 + r);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(d_storage.data<float>()[i], i);  // transposed back
  EXPECT_THROW(s.copy_async(Tensor::zeros(DType::kF32, {4}), a), ValueError);
  EXPECT_THROW(s.copy_async(Tensor::zeros(DType::kI32, {15}), a), ValueError);
}

TEST(Stream, DestructorDrainsTheQueue) {
  std::atomic<int> done{0};
  {
    Stream s;
    for (int i = 0; i < 3; ++i)
      s.launch([&] {
        std::this_thread::sleep_for(5ms);
        done.fetch_add(1);
      });
  }
  EXPECT_EQ(done.load(), 3);
}

TEST(Stream, RunsParallelKernelsOnTwoStreams) {
  ThreadsGuard restore;
  set_num_threads(2);
  Stream a, b;
  std::vector<int64_t> sums(2, 0);
  for (int i = 0; i < 2; ++i) {
    Stream& s = i ? b : a;
    s.launch([&sums, i] {
      std::mutex m;
      parallel_for(0, 100000, 1000, [&](int64_t lo, int64_t hi) {
        int64_t acc = 0;
        for (int64_t k = lo; k < hi; ++k) acc += k;
        std::lock_guard lock(m);
        sums[i] += acc;
      });
    });
  }
  a.synchronize();
  b.synchronize();
  EXPECT_EQ(sums[0], int64_t{100000} * 99999 / 2);
  EXPECT_EQ(sums[1], sums[0]);
}

// ---- executables: steady state ----

// y = relu(x @ w + b), x: f32[4, 24]
Graph matmul_add_relu() {
  return matmul_add("mlp", Shape{4, 24}, 40, "Relu", 3);
}

TEST(Executable, SteadyStateRunsAllocateNothingFromTheSystem) {
  ThreadsGuard restore;
  Graph g = matmul_add_relu();
  Tensor x = random_input({4, 24}, 4);
  Tensor want = reference::run(g, {x})[0];
  for (int threads = 1; threads <= 2; ++threads) {
    set_num_threads(threads);
    Executable exe = compile(g, {.level = 0});
    exe.run({x});  // warm: the pool fills
    uint64_t warm = exe.memory_stats().system_allocations;
    EXPECT_GT(warm, 0u);
    for (int rep = 0; rep < 5; ++rep) {
      Tensor y = exe.run({x})[0];
      ASSERT_EQ(y.shape(), want.shape());
      for (int64_t i = 0; i < y.numel(); ++i)
        EXPECT_NEAR(y.item_as_double(i), want.item_as_double(i),
                    1e-4 * (1 + std::abs(want.item_as_double(i))));
    }
    MemoryPoolStats s = exe.memory_stats();
    EXPECT_EQ(s.system_allocations, warm) << "threads " << threads;
    EXPECT_GT(s.pool_hits, 0u);
    EXPECT_EQ(s.in_use_bytes, 0u);  // every output returned
  }
}

// Runs reuse state of earlier runs (value tables, arenas, memory plans by shape): runs that
// alternate input shapes, from two threads at once, each match the reference interpreter.
TEST(Executable, RunsAlternatingShapesOnTwoThreadsMatchTheReference) {
  ThreadsGuard restore;
  set_num_threads(1);
  Graph g;
  g.name = "symbolic";
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("n"), Dim(24)}});
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> w(24 * 16), b(16);
  for (float& v : w) v = nd(rng);
  for (float& v : b) v = nd(rng);
  ValueId wv = g.add_value("w"), bv = g.add_value("b");
  g.set_initializer(wv, Tensor::from_vector(w, {24, 16}));
  g.set_initializer(bv, Tensor::from_vector(b, {16}));
  ValueId mm = g.add_value("mm"), add = g.add_value("add"), r = g.add_value("r");
  ValueId y = g.add_value("y");
  g.add_node("MatMul", {x, wv}, {mm}, {}, "matmul");
  g.add_node("Add", {mm, bv}, {add}, {}, "add");
  g.add_node("Relu", {add}, {r}, {}, "relu");
  g.add_node("Softmax", {r}, {y}, {}, "softmax");  // the last axis
  g.add_output(y);
  const std::vector<int64_t> batches = {1, 3, 1, 5, 3};
  std::vector<Tensor> inputs, wants;
  for (int64_t n : batches) {
    std::vector<float> xs(static_cast<size_t>(n) * 24);
    for (float& v : xs) v = nd(rng);
    inputs.push_back(Tensor::from_vector(xs, {n, 24}));
    wants.push_back(reference::run(g, {inputs.back()})[0]);
  }
  Executable exe = compile(g);
  std::atomic<int> mismatches{0};
  auto worker = [&](size_t first) {
    for (size_t rep = 0; rep < 40; ++rep) {
      const size_t i = (first + rep) % batches.size();
      Tensor out = exe.run({inputs[i]})[0];
      const Tensor& want = wants[i];
      bool same = out.shape() == want.shape();
      for (int64_t e = 0; same && e < out.numel(); ++e)
        same = std::abs(out.item_as_double(e) - want.item_as_double(e)) <= 1e-5;
      mismatches += !same;
    }
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace pto
