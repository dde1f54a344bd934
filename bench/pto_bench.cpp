// pto_bench: the machine's ceilings and PyPTO's SGEMM, measured in one run, as JSON on stdout
// (progress on stderr). bench/run.py runs it and sets the numbers beside PyTorch's.
//
//   pto_bench [--threads 1,2] [--only fma,memory,sgemm,igemm,vmath,vmath_large,amx_stores]
//             [--shapes
//   512,128x768x3072]
//             [--quick] [--packed a|b]
//             [--warmup-calls N] [--warmup-time S] [--min-calls N] [--min-time S] [--max-time S]
//             [--cpu-clock]
//
// - fma: the FMA peak of each ISA path the machine runs (backend/cpu/isa/fma_impl.h), GFLOP/s on T
// threads.
// - memory: STREAM-like read (a sum), copy (memcpy), triad (a = b + s * c), and copy / triad
//   with streaming stores (copy_nt, triad_nt) on arrays far larger than the last-level cache;
//   GB/s counting the bytes read and written.
// - sgemm: pto::cpu::sgemm on square and model shapes (C = A B, row-major, A: M x K, B: K x N),
//   checked against a double-precision dot product on sampled entries before it is timed.
//   --packed b times sgemm_packed with B packed ahead (constant weights, as MatMul and Gemm run
//   them), --packed a sgemm_packed_a with A packed ahead (Conv's weights); packing is not timed.
//   --weight-copies N (with --packed b, and for igemm) packs N copies of B and calls take them
//   in turn, so B comes from beyond L2 as a model's weights do, one layer after another (default
//   1: B stays in cache from one call to the next).
//   --precision f32,bf16,f16,bf16x3 times each shape with fp32, bf16, f16 and bf16x3 products
//   (GemmArgs::precision; checked against operands rounded to bf16 or f16, bf16x3 against the
//   exact product); on AVX512_BF16 the
//   fma section then also measures the VDPBF16PS ceiling ("isa": "avx512_bf16").
// - igemm: pto::cpu::igemm (uint8 A x int8 B -> int32, B packed ahead as MatMulInteger packs a
//   constant weight) on the same shapes, GOPS counting a multiply-add as 2 operations, checked
//   exactly on sampled entries; "vnni" says whether VPDPBUSD or the widening fallback ran.
// - vmath (only when asked): exp, sigmoid, silu, tanh, gelu and gelu_tanh
//   (pto::cpu::unary_f32) over a row in L1 on one thread, per ISA, in ns per element and per 16
//   floats.
// - vmath_large (only when asked): every transcendental activation and Softmax on N(0, 1) rows
//   against rows with 5-40% of their lanes beyond +-90 or +-20, interleaved, active ISA only
//   (PTO_ISA picks another), and the slowdown of each.
// - amx_stores (only when asked, AMX-BF16 machines): the AMX tile products with C stored as a
//   short-K GEMM stores it (tdpbf16_stores: 32 x 32 blocks of K = 64..576 on L1-resident A and
//   B), C of 0.5 MiB (in L2) and 8 MiB (beyond it) per thread, stored by the tiles as fp32 or
//   through L1 as bf16: the ceiling of the AMX GEMM where K is short (a conv's 1x1 layers),
//   against the register-only amx_bf16 one of the fma section.
// Every measurement times calls one by one after a warm-up and reports the median, p10, p90, the
// count and the CPU utilisation (CPU seconds / wall seconds) of the timed calls. --cpu-clock times
// each call by the process's CPU seconds over the thread count: on a machine time-shared with other
// work it estimates dedicated cores (spinning counts as work, cache pollution by the neighbours
// does not go away); say so when quoting such numbers.
#include <immintrin.h>  // SSE2 streaming stores (every x86-64 has them)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/gemm/igemm.h"
#include "backend/cpu/isa/ceiling.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/reduce_kernels.h"
#include "pto/device_info.h"
#include "pto/error.h"
#include "pto/parallel.h"

namespace pto::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Timing {
  int warmup_calls = 3;
  double warmup_s = 1.0;
  int min_calls = 10;
  double min_s = 2.0;
  double max_s = 20.0;  // stop measuring past this, with at least one call timed
  // Time each call by the process's CPU time over the thread count instead of the wall clock:
  // on a machine shared with other work (time-sliced cores) it is what the call would take on
  // dedicated cores. Waiting threads that spin count against the call.
  bool cpu_clock = false;
};

struct Sample {
  std::vector<double> seconds;  // sorted
  double cpu_util = 0;
  double median() const { return quantile(0.5); }
  double quantile(double q) const {
    if (seconds.empty()) return 0;
    double pos = q * static_cast<double>(seconds.size() - 1);
    size_t lo = static_cast<size_t>(pos);
    size_t hi = std::min(lo + 1, seconds.size() - 1);
    return seconds[lo] + (seconds[hi] - seconds[lo]) * (pos - static_cast<double>(lo));
  }
};

double now_s() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

double cpu_s() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double process_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Sample measure(const Timing& t, const std::function<void()>& fn) {
  double start = now_s();
  for (int i = 0; i < t.warmup_calls || now_s() - start < t.warmup_s; ++i) {
    fn();
    if (now_s() - start > t.max_s) break;
  }
  Sample s;
  double wall0 = now_s(), cpu0 = cpu_s();
  for (;;) {
    const double t0 = now_s(), c0 = t.cpu_clock ? process_cpu_s() : 0;
    fn();
    const double t1 = now_s();
    s.seconds.push_back(t.cpu_clock ? (process_cpu_s() - c0) / num_threads() : t1 - t0);
    bool enough = static_cast<int>(s.seconds.size()) >= t.min_calls && t1 - wall0 >= t.min_s;
    if (enough || t1 - wall0 >= t.max_s) break;
  }
  double wall = now_s() - wall0;
  s.cpu_util = wall > 0 ? (cpu_s() - cpu0) / wall : 0;
  std::sort(s.seconds.begin(), s.seconds.end());
  return s;
}

// A tiny JSON writer: objects and arrays of numbers, strings and booleans.
class Json {
 public:
  Json& open(char c) {
    sep();
    os_ << c;
    first_ = true;
    return *this;
  }
  Json& close(char c) {
    os_ << c;
    first_ = false;
    return *this;
  }
  Json& key(const std::string& k) {
    sep();
    os_ << '"' << k << "\":";
    first_ = true;
    return *this;
  }
  Json& str(const std::string& v) {
    sep();
    os_ << '"';
    for (char c : v) {
      if (c == '"' || c == '\\') os_ << '\\';
      os_ << c;
    }
    os_ << '"';
    return *this;
  }
  Json& num(double v) {
    sep();
    if (std::isfinite(v))
      os_ << v;
    else
      os_ << "null";
    return *this;
  }
  Json& boolean(bool v) {
    sep();
    os_ << (v ? "true" : "false");
    return *this;
  }
  Json& sample(const Sample& s, double work, const char* unit) {
    // Seconds per call, and the rate `work / seconds` in `unit` (higher is better: p10 of the
    // rate is the p90 of the time).
    key("seconds").open('{');
    key("median").num(s.median()).key("p10").num(s.quantile(0.1));
    key("p90").num(s.quantile(0.9)).key("count").num(static_cast<double>(s.seconds.size()));
    close('}');
    key(unit).num(work / s.median());
    key(std::string(unit) + "_p10").num(work / s.quantile(0.9));
    key(std::string(unit) + "_p90").num(work / s.quantile(0.1));
    key("cpu_util").num(s.cpu_util);
    return *this;
  }
  std::string text() const { return os_.str(); }

 private:
  void sep() {
    if (!first_) os_ << ',';
    first_ = false;
  }
  std::ostringstream os_;
  bool first_ = true;
};

// ---- Vector math over a row in L1 ----

// pto::cpu::unary_f32 on a row of 1024 floats in [-10, 10) (4 KiB in, 4 KiB out: L1), 4096
// times a call, on one thread, for each ISA: the cost of exp and the functions built on it
// without the memory's, in ns per element and per 16 floats (an AVX-512 vector).
void bench_vmath(Json& j, const Timing& timing) {
  constexpr int64_t kRow = 1024, kReps = 4096;
  std::vector<float> x(kRow), y(kRow);
  for (int64_t i = 0; i < kRow; ++i) x[i] = -10.0f + 20.0f * static_cast<float>(i) / kRow;
  const std::pair<const char*, cpu::UnaryOp> ops[] = {
      {"exp", cpu::UnaryOp::kExp},   {"sigmoid", cpu::UnaryOp::kSigmoid},
      {"silu", cpu::UnaryOp::kSilu}, {"tanh", cpu::UnaryOp::kTanh},
      {"gelu", cpu::UnaryOp::kGelu}, {"gelu_tanh", cpu::UnaryOp::kGeluTanh}};
  set_num_threads(1);
  j.key("vmath").open('[');
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (const auto& [name, op] : ops) {
      std::cerr << "vmath " << name << " " << cpu::isa_name(isa) << "\n";
      Sample s = measure(timing, [&] {
        for (int64_t r = 0; r < kReps; ++r) cpu::unary_f32(op, {}, x.data(), y.data(), kRow);
      });
      const double ns = s.median() * 1e9 / static_cast<double>(kRow * kReps);
      j.open('{').key("op").str(name).key("isa").str(cpu::isa_name(isa));
      j.key("ns_per_element").num(ns).key("ns_per_16").num(16 * ns);
      j.sample(s, static_cast<double>(kRow * kReps) / 1e9, "gelements_per_s").close('}');
    }
  }
  j.close(']');
}

// ---- Vector math on large arguments ----

// Each transcendental activation on a row of 1024 floats (in L1, one thread, the active ISA) drawn
// from N(0, 1), and on the same row with a share of its lanes (5%, 20%, 40%, at random positions)
// replaced by +-U(90, 120) ("big": past exp's normal range, where e^-|x| is subnormal or 0 and
// e^|x| overflows) or by +-U(20, 40) ("mid": where the tanh-based forms saturate). The
// distributions are timed interleaved, call by call (41 rounds of 256 rows each; the median), so a
// slow spell of the shared machine hits them alike. Softmax runs on rows of 1024 (softmax_rows).
// "ratio" is each distribution's time over N(0, 1)'s: how much a function slows on such inputs
// (a microcode assist for a subnormal operand or result, or a rarely taken path).
void bench_vmath_large(Json& j) {
  constexpr int64_t kRow = 1024, kReps = 256, kRounds = 41;
  struct Dist {
    const char* name;
    double share, lo, hi;
  };
  const Dist dists[] = {{"normal", 0, 0, 0},     {"big5", 0.05, 90, 120}, {"big20", 0.2, 90, 120},
                        {"big40", 0.4, 90, 120}, {"mid5", 0.05, 20, 40},  {"mid20", 0.2, 20, 40},
                        {"mid40", 0.4, 20, 40}};
  constexpr int kDists = sizeof(dists) / sizeof(dists[0]);
  std::vector<std::vector<float>> xs;
  for (const Dist& d : dists) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<double> u01;
    std::vector<float> x(kRow);
    for (float& v : x) {
      v = normal(rng);
      if (u01(rng) < d.share) {
        const double m = d.lo + (d.hi - d.lo) * u01(rng);
        v = static_cast<float>(u01(rng) < 0.5 ? -m : m);
      }
    }
    xs.push_back(std::move(x));
  }
  // name, op (or none for Softmax), parameters (Elu/Celu alpha 1; Selu's alpha and gamma)
  struct Fn {
    const char* name;
    int op;
    cpu::UnaryParams p;
  };
  using U = cpu::UnaryOp;
  const Fn fns[] = {{"exp", static_cast<int>(U::kExp), {}},
                    {"expm1", static_cast<int>(U::kExpm1), {}},
                    {"sigmoid", static_cast<int>(U::kSigmoid), {}},
                    {"silu", static_cast<int>(U::kSilu), {}},
                    {"swish", static_cast<int>(U::kSwish), {1.702f, 0}},
                    {"tanh", static_cast<int>(U::kTanh), {}},
                    {"gelu_tanh", static_cast<int>(U::kGeluTanh), {}},
                    {"gelu_erf", static_cast<int>(U::kGelu), {}},
                    {"erf", static_cast<int>(U::kErf), {}},
                    {"softplus", static_cast<int>(U::kSoftplus), {}},
                    {"mish", static_cast<int>(U::kMish), {}},
                    {"elu", static_cast<int>(U::kElu), {1.0f, 0}},
                    {"selu", static_cast<int>(U::kSelu), {1.67326324f, 1.05070098f}},
                    {"celu", static_cast<int>(U::kCelu), {1.0f, 0}},
                    {"softmax", -1, {}}};
  set_num_threads(1);
  std::vector<float> y(kRow * kReps), buf(2 * kRow);
  std::vector<float> rows(kRow * kReps);
  j.key("vmath_large").open('[');
  for (const Fn& f : fns) {
    std::vector<std::vector<double>> t(kDists);
    for (int64_t round = -2; round < kRounds; ++round) {  // two warm-up rounds
      for (int d = 0; d < kDists; ++d) {
        const float* x = xs[d].data();
        double t0 = 0;
        if (f.op < 0) {
          for (int64_t r = 0; r < kReps; ++r)
            std::memcpy(rows.data() + r * kRow, x, kRow * sizeof(float));
          t0 = now_s();
          PTO_ISA_DISPATCH(softmax_rows, rows.data(), y.data(), kReps, kRow, false, nullptr, false);
        } else {
          t0 = now_s();
          for (int64_t r = 0; r < kReps; ++r)
            cpu::unary_f32(static_cast<U>(f.op), f.p, x, y.data() + (r % 4) * kRow, kRow);
        }
        if (round >= 0) t[d].push_back(now_s() - t0);
      }
    }
    std::cerr << "vmath_large " << f.name << " " << cpu::isa_name(cpu::active_isa()) << ":";
    double base = 0;
    for (int d = 0; d < kDists; ++d) {
      std::sort(t[d].begin(), t[d].end());
      const double ns = t[d][t[d].size() / 2] * 1e9 / static_cast<double>(kRow * kReps);
      if (d == 0) base = ns;
      std::cerr << " " << dists[d].name << " " << ns * 16 << " ns/16 (x" << ns / base << ")";
      j.open('{').key("op").str(f.name).key("isa").str(cpu::isa_name(cpu::active_isa()));
      j.key("inputs").str(dists[d].name).key("ns_per_16").num(16 * ns).key("ratio").num(ns / base);
      j.close('}');
    }
    std::cerr << "\n";
  }
  j.close(']');
}

// ---- FMA peak ----

void bench_fma(Json& j, const std::vector<int>& threads, const Timing& timing) {
  j.key("fma").open('[');
  volatile float mul = 0.9999f, add = 1e-4f;  // opaque to the optimizer
  for (cpu::Isa isa : cpu::supported_isas()) {
    // Iterations for about 20 ms per thread per call.
    int64_t probe = 100000;
    double t0 = now_s();
    volatile float sink = cpu::run_fma_chains(isa, probe, mul, add);
    double dt = std::max(now_s() - t0, 1e-6);
    int64_t iterations = std::max<int64_t>(1000, static_cast<int64_t>(probe * 0.02 / dt));
    for (int t : threads) {
      set_num_threads(t);
      std::cerr << "fma " << cpu::isa_name(isa) << " threads " << t << "\n";
      std::vector<float> sums(static_cast<size_t>(t));  // one per task: no shared writes
      Sample s = measure(timing, [&] {
        parallel_tasks(
            t, [&](int64_t i) { sums[i] = cpu::run_fma_chains(isa, iterations, mul, add); });
      });
      for (float x : sums) sink = sink + x;
      double gflop = static_cast<double>(cpu::fma_flops_per_iteration(isa)) *
                     static_cast<double>(iterations) * t / 1e9;
      j.open('{').key("isa").str(cpu::isa_name(isa)).key("threads").num(t);
      j.key("flops_per_iteration").num(static_cast<double>(cpu::fma_flops_per_iteration(isa)));
      j.sample(s, gflop, "gflops").close('}');
    }
    (void)sink;
  }
  // The extensions' ceilings, counted as a GEMM of their precision counts: `chains(iterations)`
  // on every thread, `per` FLOPs an iteration, reported as `name` beside the ISAs'.
  auto ext_ceiling = [&](const char* name, int64_t iterations, int64_t per, auto chains) {
    volatile float sink = 0;
    for (int t : threads) {
      set_num_threads(t);
      std::cerr << name << " threads " << t << "\n";
      std::vector<float> sums(static_cast<size_t>(t));
      Sample s = measure(
          timing, [&] { parallel_tasks(t, [&](int64_t i) { sums[i] = chains(iterations); }); });
      for (float x : sums) sink = sink + x;
      j.open('{').key("isa").str(name).key("threads").num(t);
      j.key("flops_per_iteration").num(static_cast<double>(per));
      j.sample(s, static_cast<double>(per * iterations) * t / 1e9, "gflops").close('}');
    }
    (void)sink;
  };
  if (cpu::has_ext(cpu::Ext::kAvx512Bf16))
    ext_ceiling("avx512_bf16", 200000, cpu::avx512::dpbf16_flops_per_iteration(),
                [&](int64_t n) { return cpu::avx512::dpbf16_chains(n, mul); });
  if (cpu::has_ext(cpu::Ext::kAmxBf16))
    ext_ceiling("amx_bf16", 20000, cpu::avx512::tdpbf16_flops_per_iteration(),
                [](int64_t n) { return cpu::avx512::tdpbf16_chains(n); });
  j.close(']');
}

// Operands on 64-byte lines, as the runtime allocates tensors (kTensorAlignment): a std::vector
// of megabytes starts 16 bytes into a page, so every row of C straddled two lines and each
// AMX tile store paid two reads-for-ownership per row (512 x 64 x 800 bf16: 300 GFLOP/s, not
// the model's speed).
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const LineAligned&) const { return true; }
};
template <class T>
using Operand = std::vector<T, LineAligned<T>>;

// The AMX ceiling with C's stores (tdpbf16_stores), per K, C size and output type.
void bench_amx_stores(Json& j, const std::vector<int>& threads, const Timing& timing) {
  j.key("amx_stores").open('[');
  if (!cpu::has_ext(cpu::Ext::kAmxBf16)) {
    std::cerr << "amx_stores: no AMX-BF16 on this CPU\n";
    j.close(']');
    return;
  }
  struct Size {
    const char* where;
    int64_t m, n;
  };
  const Size sizes[] = {{"l2", 256, 512}, {"memory", 1024, 2048}};
  volatile float sink = 0;
  for (const Size& z : sizes) {
    const int64_t per_thread = z.m * z.n;
    Operand<float> c(static_cast<size_t>(per_thread * 8));
    for (int64_t k : {64, 128, 256, 576})
      for (bool half : {false, true})
        for (int t : threads) {
          set_num_threads(t);
          std::cerr << "amx_stores K " << k << " C " << z.where << (half ? " bf16" : " f32")
                    << " threads " << t << "\n";
          Sample s = measure(timing, [&] {
            parallel_tasks(t, [&](int64_t i) {
              sink = sink +
                     cpu::avx512::tdpbf16_stores(k / 32, c.data() + i * per_thread, z.m, z.n, half);
            });
          });
          const double gflop = 2.0 * static_cast<double>(z.m * z.n * k) * t / 1e9;
          j.open('{').key("k").num(static_cast<double>(k)).key("c").str(z.where);
          j.key("c_kib").num(static_cast<double>(per_thread * (half ? 2 : 4) / 1024));
          j.key("out").str(half ? "bf16" : "f32").key("threads").num(t);
          j.sample(s, gflop, "gflops").close('}');
        }
  }
  j.close(']');
}

// ---- memory bandwidth ----

// y[i] = f(i) for i in [lo, hi), 16-byte groups (f4(i): y[i..i+3]) stored past the cache, so the
// written lines are not read first (no write-allocate).
template <class F, class F4>
void map_nt(float* y, int64_t lo, int64_t hi, F f, F4 f4) {
  int64_t i = lo;
  for (; i < hi && reinterpret_cast<uintptr_t>(y + i) % 16 != 0; ++i) y[i] = f(i);
  for (; i + 4 <= hi; i += 4) _mm_stream_ps(y + i, f4(i));
  _mm_sfence();
  for (; i < hi; ++i) y[i] = f(i);
}

// STREAM-like kernels on arrays of 4x the L3 (64 MiB to 512 MiB each): read (a sum), copy
// (memcpy), triad (a = b + s c), and copy / triad with non-temporal stores. GB/s count the
// bytes each kernel must move: read once per input, written once per output. The best of them
// at a thread count is the ceiling bench/memory_bound.py measures kernels against.
void bench_memory(Json& j, const std::vector<int>& threads, const Timing& timing, bool quick) {
  size_t l3 = device_info().l3_bytes;
  size_t bytes =
      quick ? size_t{32} << 20 : std::clamp<size_t>(4 * l3, size_t{64} << 20, size_t{512} << 20);
  int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      a[i] = 0;
      b[i] = static_cast<float>(i % 7);
      c[i] = static_cast<float>(i % 5);
    }
  });
  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();
  struct Kernel {
    const char* name;
    int arrays;  // arrays moved once each
    std::function<void(int64_t, int64_t)> range;
  };
  const Kernel kernels[] = {
      {"read", 1,
       [&](int64_t lo, int64_t hi) {
         float s[16] = {};
         for (int64_t i = lo; i + 16 <= hi; i += 16)
           for (int k = 0; k < 16; ++k) s[k] += pb[i + k];
         static thread_local volatile float sink;
         for (float x : s) sink = sink + x;
       }},
      {"copy", 2,
       [&](int64_t lo, int64_t hi) {
         std::memcpy(pa + lo, pb + lo, static_cast<size_t>(hi - lo) * sizeof(float));
       }},
      {"triad", 3,
       [&](int64_t lo, int64_t hi) {
         for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
       }},
      {"copy_nt", 2,
       [&](int64_t lo, int64_t hi) {
         map_nt(
             pa, lo, hi, [&](int64_t i) { return pb[i]; },
             [&](int64_t i) { return _mm_loadu_ps(pb + i); });
       }},
      {"triad_nt", 3,
       [&](int64_t lo, int64_t hi) {
         const __m128 three = _mm_set1_ps(3.0f);
         map_nt(
             pa, lo, hi, [&](int64_t i) { return pb[i] + 3.0f * pc[i]; },
             [&](int64_t i) {
               return _mm_add_ps(_mm_loadu_ps(pb + i), _mm_mul_ps(three, _mm_loadu_ps(pc + i)));
             });
       }},
  };
  j.key("memory").open('[');
  for (int t : threads) {
    set_num_threads(t);
    for (const Kernel& k : kernels) {
      std::cerr << "memory " << k.name << " threads " << t << "\n";
      Sample s = measure(timing, [&] { parallel_for(0, n, 1 << 16, k.range); });
      j.open('{').key("kernel").str(k.name).key("threads").num(t).key("array_bytes").num(bytes);
      j.sample(s, k.arrays * static_cast<double>(bytes) / 1e9, "gbps").close('}');
    }
  }
  j.close(']');
}

// ---- SGEMM ----

struct Shape {
  int64_t m, k, n;
  std::string label;
};

std::vector<Shape> default_shapes(bool quick) {
  if (quick)
    return {{256, 256, 256, "square"},
            {512, 512, 512, "square"},
            {128, 768, 768, "BERT b1 attention proj"},
            {8, 768, 768, "BERT b1 seq 8"},
            {784, 1152, 128, "ResNet-50 layer2 3x3"}};
  return {{256, 256, 256, "square"},
          {512, 512, 512, "square"},
          {1024, 1024, 1024, "square"},
          {2048, 2048, 2048, "square"},
          {4096, 4096, 4096, "square"},
          {128, 768, 768, "BERT b1 attention proj"},
          {128, 768, 3072, "BERT b1 FFN up"},
          {128, 3072, 768, "BERT b1 FFN down"},
          {1024, 768, 3072, "BERT b8 FFN up"},
          {8, 768, 768, "BERT b1 seq 8"},
          {12544, 147, 64, "ResNet-50 conv1 7x7 (im2col)"},
          {3136, 576, 64, "ResNet-50 layer1 3x3"},
          {3136, 64, 256, "ResNet-50 layer1 1x1 expand"},
          {784, 1152, 128, "ResNet-50 layer2 3x3"},
          {196, 2304, 256, "ResNet-50 layer3 3x3"},
          {49, 4608, 512, "ResNet-50 layer4 3x3"}};
}

Shape parse_shape(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, 'x');) {
    char* end = nullptr;
    long long x = std::strtoll(part.c_str(), &end, 10);
    if (part.empty() || *end || x < 1) throw ValueError(cat("bad shape '", s, "'"));
    v.push_back(x);
  }
  if (v.size() == 1) return {v[0], v[0], v[0], "square"};
  if (v.size() == 3) return {v[0], v[1], v[2], "custom"};
  throw ValueError(cat("bad shape '", s, "': expected S or MxKxN"));
}

// x to the nearest bf16 or f16 (ties to even; 8 or 11 significant bits, the operands of the
// benchmark are normal in both), by arithmetic; fp32 keeps it, and so does bf16x3 (its error
// is measured against the exact product: about 1e-5, where fp32's is 1e-7).
double to_precision(double x, cpu::Precision p) {
  if (p == cpu::Precision::kF32 || p == cpu::Precision::kBF16x3 || x == 0 || !std::isfinite(x))
    return x;
  const int bits = p == cpu::Precision::kBF16 ? 8 : 11;
  int e = 0;
  const double m = std::frexp(x, &e);
  return std::ldexp(std::nearbyint(std::ldexp(m, bits)), e - bits);
}

// max |C - C_ref| / max |C_ref| over sampled entries, C_ref in double precision (on operands
// rounded to bf16 or f16 for such products).
double sgemm_error(const Shape& s, const float* a, const float* b, const float* c,
                   cpu::Precision precision) {
  std::mt19937_64 rng(7);
  double max_err = 0, max_ref = 0;
  auto round = [&](double x) { return to_precision(x, precision); };
  for (int e = 0; e < 64; ++e) {
    int64_t i = static_cast<int64_t>(rng() % static_cast<uint64_t>(s.m));
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(s.n));
    double ref = 0;
    for (int64_t p = 0; p < s.k; ++p) ref += round(a[i * s.k + p]) * round(b[p * s.n + j]);
    max_err = std::max(max_err, std::abs(c[i * s.n + j] - ref));
    max_ref = std::max(max_ref, std::abs(ref));
  }
  return max_ref > 0 ? max_err / max_ref : max_err;
}

// `packed`: "" (plain sgemm), "b" (B packed once with pack_b, then sgemm_packed: how MatMul and
// Gemm run constant weights) or "a" (A packed once with pack_a, then sgemm_packed_a: Conv).
void bench_sgemm(Json& j, const std::vector<int>& threads, const Timing& timing,
                 const std::vector<Shape>& shapes, const std::string& packed,
                 const std::vector<cpu::Precision>& precisions, int weight_copies) {
  j.key("sgemm").open('[');
  for (const Shape& s : shapes)
    for (cpu::Precision precision : precisions) {
      Operand<float> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n));
      Operand<float> c(static_cast<size_t>(s.m * s.n));
      std::mt19937 rng(0);
      std::uniform_real_distribution<float> u(-1, 1);
      for (float& x : a) x = u(rng);
      for (float& x : b) x = u(rng);
      cpu::GemmArgs g;
      g.m = s.m, g.n = s.n, g.k = s.k;
      g.a = a.data(), g.lda = s.k;
      g.b = b.data(), g.ldb = s.n;
      g.c = c.data(), g.ldc = s.n;
      g.precision = precision;
      std::vector<cpu::PackedB> pbs;
      for (int w = 0; packed == "b" && w < weight_copies; ++w)
        pbs.push_back(cpu::pack_b(s.k, s.n, b.data(), s.n, false, precision));
      size_t calls = 0;
      const cpu::PackedA pa =
          packed == "a" ? cpu::pack_a(s.m, s.k, a.data(), s.k, false, precision) : cpu::PackedA();
      auto run = [&] {
        if (packed == "b")
          cpu::sgemm_packed(g, pbs[calls++ % pbs.size()]);
        else if (packed == "a")
          cpu::sgemm_packed_a(g, pa);
        else
          cpu::sgemm(g);
      };
      for (int t : threads) {
        set_num_threads(t);
        std::cerr << "sgemm " << s.m << "x" << s.k << "x" << s.n << " "
                  << cpu::precision_name(precision) << " threads " << t << "\n";
        std::fill(c.begin(), c.end(), std::nanf(""));
        run();
        double err = sgemm_error(s, a.data(), b.data(), c.data(), precision);
        bool ok = err <= 1e-4;
        j.open('{').key("m").num(s.m).key("k").num(s.k).key("n").num(s.n).key("label").str(s.label);
        j.key("packed").str(packed).key("precision").str(cpu::precision_name(precision));
        if (packed == "b") j.key("weight_copies").num(weight_copies);
        j.key("threads").num(t).key("isa").str(cpu::isa_name(cpu::active_isa()));
        j.key("max_rel_err").num(err).key("ok").boolean(ok);
        j.key("plan").str(packed == "a" ? std::string("A packed ahead")
                                        : cpu::plan_gemm(g, 1, packed == "b", t).str());
        if (ok) {
          Sample sm = measure(timing, run);
          j.sample(sm, 2.0 * s.m * s.n * s.k / 1e9, "gflops");
        }
        j.close('}');
      }
    }
  j.close(']');
}

void bench_igemm(Json& j, const std::vector<int>& threads, const Timing& timing,
                 const std::vector<Shape>& shapes, int weight_copies) {
  j.key("igemm").open('[');
  for (const Shape& s : shapes) {
    Operand<uint8_t> a(static_cast<size_t>(s.m * s.k)), b(static_cast<size_t>(s.k * s.n));
    Operand<int32_t> c(static_cast<size_t>(s.m * s.n));
    std::mt19937 rng(0);
    for (auto& x : a) x = static_cast<uint8_t>(rng());
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    cpu::IgemmArgs g;
    g.m = s.m, g.n = s.n, g.k = s.k;
    g.a = a.data(), g.lda = s.k;
    g.c = c.data(), g.ldc = s.n;
    std::vector<cpu::PackedI8B> pbs;
    for (int w = 0; w < weight_copies; ++w)
      pbs.push_back(cpu::pack_i8_b(s.k, s.n, b.data(), s.n, false, true));
    size_t calls = 0;
    auto run = [&] { cpu::igemm(g, pbs[calls++ % pbs.size()]); };
    for (int t : threads) {
      set_num_threads(t);
      std::cerr << "igemm " << s.m << "x" << s.k << "x" << s.n << " threads " << t << "\n";
      std::fill(c.begin(), c.end(), 0);
      run();
      bool ok = true;
      std::mt19937_64 pick(7);
      for (int e = 0; e < 64; ++e) {
        const auto i = static_cast<int64_t>(pick() % static_cast<uint64_t>(s.m));
        const auto jj = static_cast<int64_t>(pick() % static_cast<uint64_t>(s.n));
        int64_t ref = 0;
        for (int64_t p = 0; p < s.k; ++p)
          ref += int64_t{a[i * s.k + p]} * static_cast<int8_t>(b[p * s.n + jj]);
        ok = ok && c[i * s.n + jj] == static_cast<int32_t>(ref);
      }
      j.open('{').key("m").num(s.m).key("k").num(s.k).key("n").num(s.n).key("label").str(s.label);
      j.key("threads").num(t).key("isa").str(cpu::isa_name(cpu::active_isa()));
      j.key("vnni").boolean(cpu::igemm_uses_vnni()).key("ok").boolean(ok);
      j.key("weight_copies").num(weight_copies);
      if (ok) {
        Sample sm = measure(timing, run);
        j.sample(sm, 2.0 * s.m * s.n * s.k / 1e9, "gops");
      }
      j.close('}');
    }
  }
  j.close(']');
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);)
    if (!part.empty()) out.push_back(part);
  return out;
}

const char* kUsage =
    "usage: pto_bench [--threads 1,2] [--only fma,memory,sgemm,igemm,vmath,vmath_large,"
    "amx_stores] [--shapes "
    "S|MxKxN,...]\n"
    "                 [--quick] [--packed a|b] [--weight-copies N] [--precision "
    "f32,bf16,f16,bf16x3]\n"
    "                 [--warmup-calls N]\n"
    "                 [--warmup-time S] [--min-calls N]\n"
    "                 [--min-time S] [--max-time S] [--cpu-clock]\n";

int main_impl(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  std::vector<std::string> only = {"fma", "memory", "sgemm"};
  std::vector<Shape> shapes;
  bool quick = false, cpu_clock = false;
  std::string packed;
  int weight_copies = 1;
  std::vector<cpu::Precision> precisions = {cpu::Precision::kF32};
  Timing timing;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ValueError(cat(arg, " needs a value"));
      return argv[++i];
    };
    auto number = [&] {
      std::string v = value();
      char* end = nullptr;
      double x = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || x < 0) throw ValueError(cat(arg, ": bad value '", v, "'"));
      return x;
    };
    if (arg == "--threads") {
      threads.clear();
      for (const auto& t : split(value(), ',')) threads.push_back(std::stoi(t));
    } else if (arg == "--only") {
      only = split(value(), ',');
      for (const auto& o : only)
        if (o != "fma" && o != "memory" && o != "sgemm" && o != "igemm" && o != "vmath" &&
            o != "vmath_large" && o != "amx_stores")
          throw ValueError(
              cat("--only: unknown benchmark '", o,
                  "' (expected fma, memory, sgemm, igemm, vmath, vmath_large, amx_stores)"));
    } else if (arg == "--shapes") {
      for (const auto& s : split(value(), ',')) shapes.push_back(parse_shape(s));
    } else if (arg == "--packed") {
      packed = value();
      if (packed != "a" && packed != "b") throw ValueError(cat("--packed: expected a or b"));
    } else if (arg == "--weight-copies") {
      const double w = number();
      if (w < 1 || w != std::floor(w)) throw ValueError("--weight-copies: expected a count >= 1");
      weight_copies = static_cast<int>(w);
    } else if (arg == "--precision") {
      precisions.clear();
      for (const auto& p : split(value(), ',')) {
        if (p != "f32" && p != "bf16" && p != "f16" && p != "bf16x3")
          throw ValueError(cat("--precision: expected f32, bf16, f16 or bf16x3"));
        precisions.push_back(p == "bf16"     ? cpu::Precision::kBF16
                             : p == "f16"    ? cpu::Precision::kF16
                             : p == "bf16x3" ? cpu::Precision::kBF16x3
                                             : cpu::Precision::kF32);
      }
    } else if (arg == "--cpu-clock") {
      cpu_clock = true;
    } else if (arg == "--quick") {
      quick = true;
      timing = {1, 0.0, 3, 0.1, 3.0};
    } else if (arg == "--warmup-calls") {
      timing.warmup_calls = static_cast<int>(number());
    } else if (arg == "--warmup-time") {
      timing.warmup_s = number();
    } else if (arg == "--min-calls") {
      timing.min_calls = std::max(1, static_cast<int>(number()));
    } else if (arg == "--min-time") {
      timing.min_s = number();
    } else if (arg == "--max-time") {
      timing.max_s = number();
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage;
      return 0;
    } else {
      std::cerr << kUsage;
      return 2;
    }
  }
  if (shapes.empty()) shapes = default_shapes(quick);
  timing.cpu_clock = cpu_clock;
  auto wants = [&](const char* what) { return std::count(only.begin(), only.end(), what) > 0; };
  if (weight_copies != 1 && packed != "b" && !wants("igemm"))
    throw ValueError("--weight-copies: only with --packed b or igemm (copies of the packed B)");

  const DeviceInfo& d = device_info();
  Json j;
  j.open('{');
  j.key("machine").open('{').key("cpu").str(d.cpu_name).key("logical_cores").num(d.logical_cores);
  j.key("physical_cores").num(d.physical_cores).key("isa").str(d.isa);
  j.key("l3_bytes").num(static_cast<double>(d.l3_bytes)).close('}');
  if (wants("fma")) bench_fma(j, threads, timing);
  if (wants("memory")) bench_memory(j, threads, timing, quick);
  if (wants("sgemm")) bench_sgemm(j, threads, timing, shapes, packed, precisions, weight_copies);
  if (wants("igemm")) bench_igemm(j, threads, timing, shapes, weight_copies);
  if (wants("vmath")) bench_vmath(j, timing);
  if (wants("vmath_large")) bench_vmath_large(j);
  if (wants("amx_stores")) bench_amx_stores(j, threads, timing);
  j.close('}');
  std::cout << j.text() << "\n";
  return 0;
}

}  // namespace
}  // namespace pto::bench

int main(int argc, char** argv) {
  try {
    return pto::bench::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "pto_bench: " << e.what() << "\n";
    return 1;
  }
}
