// Winograd F(4x4, 3x3) for ConvBlocked (src/backend/cpu/conv/winograd.h) against the reference
// interpreter's Conv: tails on every side (H, W not multiples of 4, 1x1 images, pads 0 and 1),
// channel counts that are not multiples of the block, batches 1 and 3, the fused residual and
// activation, every ISA, 1 and 2 threads. PTO_WINOGRAD=1 puts every 3x3 stride-1 conv on it; the
// step's description says which algorithm ran. The error is relative to the largest output
// magnitude (docs/backend/conv.md, "Winograd F(4x4,3x3)").
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>

#include "backend/cpu/conv/winograd.h"
#include "backend/cpu/isa/isa.h"
#include "passes/assign_layouts.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto {
namespace {

// The stated tolerance: max |y - reference| <= kTolerance * max |reference|.
constexpr double kTolerance = 1e-4;

Tensor random_tensor(const Dims& shape, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = Tensor::empty(DType::kF32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

// max |got - want| / max |want|.
double relative_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  double scale = 1e-30, err = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::fabs(want.item_as_double(i)));
    const double d = std::fabs(got.item_as_double(i) - want.item_as_double(i));
    err = std::isnan(d) ? INFINITY : std::max(err, d);
  }
  return err / scale;
}

// PTO_WINOGRAD for the scope of a test.
class WinogradEnv {
 public:
  explicit WinogradEnv(const char* value) {
    if (const char* old = std::getenv("PTO_WINOGRAD")) saved_ = old, had_ = true;
    setenv("PTO_WINOGRAD", value, 1);
  }
  ~WinogradEnv() {
    if (had_)
      setenv("PTO_WINOGRAD", saved_.c_str(), 1);
    else
      unsetenv("PTO_WINOGRAD");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

struct Case {
  int64_t n, c, h, w, m, pad;
};

std::string describe(const Case& t) {
  return cat("N", t.n, " C", t.c, " ", t.h, "x", t.w, " M", t.m, " pad ", t.pad);
}

// Conv 3x3 stride 1 (with bias), and when `epilogue` a residual Add and a Relu after it.
Graph conv_graph(const Case& t, bool epilogue, std::mt19937& rng) {
  Graph g;
  const ValueId x = g.add_input("x", {DType::kF32, Shape{t.n, t.c, t.h, t.w}});
  const ValueId w = g.add_constant("w", random_tensor({t.m, t.c, 3, 3}, rng));
  const ValueId b = g.add_constant("b", random_tensor({t.m}, rng));
  Attributes a;
  a.set("pads", Dims{t.pad, t.pad, t.pad, t.pad});
  ValueId y = g.add_value("y");
  g.add_node("Conv", {x, w, b}, {y}, a, "conv");
  if (epilogue) {
    infer_types(g);
    const ValueId r = g.add_input("r", {DType::kF32, *g.value(y).type.shape});
    const ValueId s = g.add_value("s"), z = g.add_value("z");
    g.add_node("Add", {y, r}, {s});
    g.add_node("Relu", {s}, {z});
    y = z;
  }
  g.add_output(y);
  infer_types(g);
  return g;
}

std::vector<Tensor> random_inputs(const Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Tensor> in;
  for (ValueId v : g.inputs()) in.push_back(random_tensor(to_dims(*g.value(v).type.shape), rng));
  return in;
}

// The algorithm the ConvBlocked step of `exe` runs, as its kernel describes it.
std::string conv_algorithm(const Executable& exe) {
  for (size_t s = 0; s < exe.num_steps(); ++s)
    if (exe.graph().nodes()[exe.step(s).nodes[0]].op == "ConvBlocked") return exe.describe_step(s);
  return "no ConvBlocked step";
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {1, 16, 5, 7, 24, 1},    // odd sizes, one partial tile row and column
      {3, 20, 9, 10, 17, 0},   // batch 3, no padding, OC not a multiple of the block
      {1, 8, 1, 1, 8, 1},      // 1x1 image: one tile, eight of its nine taps in the padding
      {2, 33, 6, 6, 40, 0},    // 4x4 output: exactly one tile
      {1, 5, 13, 11, 70, 1},   // few input channels, many output blocks
      {3, 9, 3, 3, 9, 0},      // 1x1 output
      {2, 32, 30, 30, 32, 1},  // 128 tiles: several blocks of tiles
      {0, 16, 6, 6, 16, 1},    // an empty batch
  };
  return all;
}

// Every case, with and without the residual + Relu epilogue (fused at level 2), blocks of 8 and
// 16, on every ISA with 1 and 2 threads, runs Winograd and matches the reference Conv.
TEST(Winograd, MatchesReferenceConvWithTailsAndEpilogues) {
  WinogradEnv on("1");
  const int saved = num_threads();
  std::mt19937 rng(7);
  for (const Case& t : cases())
    for (bool epilogue : {false, true}) {
      const Graph g = conv_graph(t, epilogue, rng);
      const std::vector<Tensor> in = random_inputs(g, 9);
      const Tensor want = reference::run(g, in)[0];
      for (int block : {8, 16}) {
        PassContext ctx;
        Graph b = passes::assign_layouts(g, ctx, block, false);
        infer_types(b);
        for (cpu::Isa isa : cpu::supported_isas()) {
          cpu::IsaScope scope(isa);
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            const std::string what =
                cat(describe(t), epilogue ? " +residual+relu" : "", ", block ", block, ", ",
                    cpu::isa_name(isa), ", ", threads, " thread(s)");
            Executable exe = compile(b, {.level = epilogue ? 2 : 0});
            // Fewer channels than a block: the conv reads the NCHW input itself (AssignLayouts'
            // stem rule), which only the direct kernel does; the cost rule would not choose
            // Winograd for so few channels anyway.
            EXPECT_EQ(conv_algorithm(exe), t.c < block ? "direct" : "winograd F(4x4,3x3)") << what;
            if (epilogue) {
              bool fused = false;
              for (size_t s = 0; s < exe.num_steps(); ++s)
                fused = fused || exe.step(s).rule == "ConvBlocked+Add+Relu";
              EXPECT_TRUE(fused) << what;
            }
            EXPECT_LE(relative_error(exe.run(in)[0], want), kTolerance) << what;
          }
        }
      }
    }
  set_num_threads(saved);
}

// PTO_WINOGRAD=0 keeps the direct kernel; strided, dilated and non-3x3 convs never take Winograd.
TEST(Winograd, OnlyWhereItApplies) {
  std::mt19937 rng(8);
  const Graph g = conv_graph({1, 32, 8, 8, 32, 1}, false, rng);
  PassContext ctx;
  Graph b = passes::assign_layouts(g, ctx, 16, false);
  infer_types(b);
  {
    WinogradEnv off("0");
    EXPECT_EQ(conv_algorithm(compile(b, {.level = 0})), "direct");
  }
  WinogradEnv on("1");
  EXPECT_EQ(conv_algorithm(compile(b, {.level = 0})), "winograd F(4x4,3x3)");
  for (const char* attrs : {"strides=[2, 2]", "dilations=[2, 2]"}) {
    Graph s = parse_graph(cat("graph g (opset 18)\n  input %x: f32[1, 32, 9, 9]\n",
                              "  const %w: f32[32, 32, 3, 3]\n  %y = Conv(%x, %w) {", attrs,
                              "}\n  return %y\n"));
    PassContext c2;
    Graph sb = passes::assign_layouts(s, c2, 16, false);
    infer_types(sb);
    EXPECT_EQ(conv_algorithm(compile(sb, {.level = 0})), "direct") << attrs;
  }
}

// The cost rule on the run's sizes, and what compile time prepares when the batch is unknown.
TEST(Winograd, CostRule) {
  auto conv = [](int64_t n, int64_t c, int64_t hw, int64_t m) {
    cpu::BlockedConv g;
    g.n = n;
    g.channels = c;
    g.block = 16;
    g.icb = (c + 15) / 16;
    g.ocb = (m + 15) / 16;
    g.ih = g.iw = g.oh = g.ow = hw;
    g.kh = g.kw = 3;
    g.ph = g.pw = 1;
    return g;
  };
  EXPECT_TRUE(cpu::winograd_pays(conv(1, 64, 56, 64)));
  EXPECT_TRUE(cpu::winograd_pays(conv(1, 512, 7, 512)));   // 49 pixels, tiles 77% filled
  EXPECT_FALSE(cpu::winograd_pays(conv(8, 512, 2, 512)));  // tiles a quarter filled
  EXPECT_FALSE(cpu::winograd_pays(conv(1, 256, 5, 256)));  // 25 of 64 tile pixels
  EXPECT_FALSE(cpu::winograd_pays(conv(1, 256, 4, 256)));  // 16 pixels: U costs more
  EXPECT_TRUE(cpu::winograd_pays(conv(4, 256, 4, 256)));
  EXPECT_FALSE(cpu::winograd_pays(conv(1, 8, 56, 64)));  // too few input channels
  cpu::BlockedConv few_out = conv(1, 64, 56, 8);  // too few output channels (with blocks of 8)
  few_out.block = 8;
  few_out.icb = 8;
  few_out.ocb = 1;
  EXPECT_FALSE(cpu::winograd_pays(few_out));
  cpu::WinogradWeights u;
  ASSERT_TRUE(cpu::winograd_prepares(conv(0, 256, 4, 256), true, u));
  EXPECT_EQ(u.min_batch, 4);
  EXPECT_EQ(u.describe(), "winograd F(4x4,3x3) from batch 4, else direct");
  cpu::WinogradWeights fixed;  // a batch fixed at 2 never reaches 4
  EXPECT_FALSE(cpu::winograd_prepares(conv(2, 256, 4, 256), true, fixed));
  EXPECT_TRUE(cpu::winograd_prepares(conv(4, 256, 4, 256), true, fixed));
  cpu::WinogradWeights v;
  EXPECT_FALSE(cpu::winograd_prepares(conv(0, 256, 2, 256), true, v));
  EXPECT_TRUE(cpu::winograd_prepares(conv(0, 256, 0, 256), false, v));  // plane unknown
  EXPECT_EQ(v.describe(), "winograd F(4x4,3x3) where it pays, else direct");
}

// The rounding on the ResNet 3x3 stride-1 layer shapes (batch 1, pad 1, inputs and weights
// uniform in [-1, 1]): printed, and within the stated tolerance.
TEST(Winograd, ErrorOnResNetLayers) {
  WinogradEnv on("1");
  std::mt19937 rng(11);
  for (const Case& t : {Case{1, 64, 56, 56, 64, 1}, Case{1, 128, 28, 28, 128, 1},
                        Case{1, 256, 14, 14, 256, 1}, Case{1, 512, 7, 7, 512, 1}}) {
    const Graph g = conv_graph(t, false, rng);
    const std::vector<Tensor> in = random_inputs(g, 12);
    const Tensor want = reference::run(g, in)[0];
    PassContext ctx;
    Graph b = passes::assign_layouts(g, ctx, std::max(passes::machine_channel_block(), 8), false);
    infer_types(b);
    Executable exe = compile(b, {.level = 0});
    ASSERT_EQ(conv_algorithm(exe), "winograd F(4x4,3x3)");
    const double err = relative_error(exe.run(in)[0], want);
    std::cout << "[ winograd ] " << describe(t) << ": max error / max |y| = " << err << "\n";
    EXPECT_LE(err, kTolerance) << describe(t);
  }
}

// ---------------------------------------------------------------- timing (not run by default)

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The ConvBlocked node of AssignLayouts' rewrite of `g` alone, on a blocked input: the kernel
// without the reorders around it.
Graph blocked_only(const Graph& g, int block) {
  PassContext ctx;
  Graph b = passes::assign_layouts(g, ctx, block, false);
  infer_types(b);
  for (const Node& n : b.nodes()) {
    if (n.op != "ConvBlocked") continue;
    Graph out;
    std::vector<ValueId> ins = {out.add_input("xb", b.value(n.inputs[0]).type)};
    for (size_t i = 1; i < n.inputs.size(); ++i)
      ins.push_back(out.add_constant(b.value(n.inputs[i]).name, *b.initializer(n.inputs[i])));
    const ValueId y = out.add_value("yb");
    out.add_node("ConvBlocked", ins, {y}, n.attrs, "conv").domain = "pto";
    out.add_output(y);
    infer_types(out);
    return out;
  }
  return b;
}

// A comma-separated list of integers from the environment, or `fallback`.
std::vector<int64_t> env_list(const char* name, std::vector<int64_t> fallback) {
  const char* e = std::getenv(name);
  if (!e) return fallback;
  std::vector<int64_t> out;
  for (const char* p = e; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
    if (end == p && *p) break;
  }
  return out;
}

// Direct vs Winograd per 3x3 stride-1 layer (C -> C channels on an HxH plane, pad 1): medians
// of interleaved runs in one process (the machine is shared), with the minimum. By default the
// ResNet layers at batch 1 and 8 with 1 and 2 threads; PTO_BENCH_CHANNELS and PTO_BENCH_PLANES
// (the layers are their pairs), PTO_BENCH_BATCHES, PTO_BENCH_THREADS and PTO_BENCH_REPS
// (comma-separated) change that. Run with
//   pto_tests --gtest_also_run_disabled_tests --gtest_filter=Winograd.DISABLED_Timing
TEST(Winograd, DISABLED_Timing) {
  const int saved = num_threads();
  const int block = std::max(passes::machine_channel_block(), 8);
  const int64_t reps = env_list("PTO_BENCH_REPS", {11})[0];
  const std::vector<int64_t> channels = env_list("PTO_BENCH_CHANNELS", {64, 128, 256, 512});
  const std::vector<int64_t> planes = env_list("PTO_BENCH_PLANES", {56, 28, 14, 7});
  std::vector<Case> layers;
  if (std::getenv("PTO_BENCH_CHANNELS") || std::getenv("PTO_BENCH_PLANES")) {
    for (int64_t c : channels)
      for (int64_t h : planes) layers.push_back({1, c, h, h, c, 1});
  } else {
    for (size_t i = 0; i < channels.size(); ++i)
      layers.push_back({1, channels[i], planes[i], planes[i], channels[i], 1});
  }
  std::mt19937 rng(1);
  std::cout << "layer batch threads: direct ms, winograd ms, ratio (medians; min)\n";
  for (const Case& t0 : layers)
    for (int64_t batch : env_list("PTO_BENCH_BATCHES", {1, 8})) {
      Case t = t0;
      t.n = batch;
      const Graph g = blocked_only(conv_graph(t, false, rng), block);
      const std::vector<Tensor> in = random_inputs(g, 2);
      Executable direct = [&] {
        WinogradEnv off("0");
        return compile(g, {.level = 0});
      }();
      Executable wino = [&] {
        WinogradEnv on("1");
        return compile(g, {.level = 0});
      }();
      for (int64_t threads : env_list("PTO_BENCH_THREADS", {1, 2})) {
        set_num_threads(static_cast<int>(threads));
        std::vector<double> a, b;
        for (int r = 0; r < reps + 1; ++r) {
          for (int k = 0; k < 2; ++k) {
            const auto s = std::chrono::steady_clock::now();
            (k == 0 ? direct : wino).run(in);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s)
                    .count();
            if (r > 0) (k == 0 ? a : b).push_back(ms);  // the first run warms the pool
          }
        }
        std::cout << t.c << "@" << t.h << " n" << batch << " t" << threads << ": " << median(a)
                  << ", " << median(b) << ", " << median(b) / median(a) << " (min "
                  << *std::min_element(a.begin(), a.end()) << ", "
                  << *std::min_element(b.begin(), b.end()) << ")\n";
      }
    }
  set_num_threads(saved);
}

}  // namespace
}  // namespace pto
