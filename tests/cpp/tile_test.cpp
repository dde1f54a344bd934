// Tile programs (src/tile) and their CPU executor (src/backend/cpu/tile_kernel.h): small graphs of
// elementwise ops are grouped whole, lowered, run on every ISA with 1 and 2 threads, and compared
// with the reference interpreter on the same graph (random inputs from a fixed seed, odd sizes,
// broadcasting, NaN and Inf).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/isa/isa.h"
#include "backend/cpu/tile_kernel.h"
#include "pto/executable.h"
#include "pto/kernel_graph.h"
#include "pto/memory_policy.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "reference/ops/cast.h"
#include "tile/lower.h"

namespace pto {
namespace {

using cpu::Isa;

Attributes attrs(std::initializer_list<std::pair<const char*, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

KernelGroup whole_group(const Graph& g) {
  KernelGroup group;
  for (size_t n = 0; n < g.nodes().size(); ++n) group.nodes.push_back(static_cast<int32_t>(n));
  finish_group(g, group);
  return group;
}

Tensor random_f32(Dims shape, uint32_t seed, float lo = -4.0f, float hi = 4.0f,
                  bool specials = true) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = dist(rng);
  if (specials) {
    const float kSpecial[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-39f, -88.5f, 90.0f};
    for (int64_t i = 0; i < t.numel() && i < 64; i += 3) p[i] = kSpecial[(i / 3) % 8];
  }
  return t;
}

Tensor random_bool(Dims shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kBool, shape);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = (rng() & 1) != 0;
  return t;
}

// Within `ulps` units in the last place, or `atol`; NaN matches NaN, infinities match exactly.
void expect_near(const Tensor& got, const Tensor& want, int ulps, double atol,
                 const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  if (got.dtype() == DType::kBool || is_integral(got.dtype())) {  // exactly
    const size_t bytes = static_cast<size_t>(got.numel()) * dtype_size(got.dtype());
    for (size_t b = 0; b < bytes; ++b)
      if (static_cast<const char*>(got.raw_data())[b] !=
          static_cast<const char*>(want.raw_data())[b]) {
        ADD_FAILURE() << what << ": element " << b / dtype_size(got.dtype()) << " differs";
        return;
      }
    return;
  }
  const bool half = got.dtype() == DType::kBF16 || got.dtype() == DType::kF16;
  // Half values compare as floats, an ulp being the half type's (the next bit pattern's distance).
  const Tensor gf = half ? reference::cast(got, DType::kF32, what) : got;
  const Tensor wf = half ? reference::cast(want, DType::kF32, what) : want;
  auto ulp_of = [&](int64_t i, float y) -> double {
    if (!half) return std::fabs(std::nextafter(y, INFINITY) - y);
    Tensor next = Tensor::empty(want.dtype(), {1});
    uint16_t bits;
    std::memcpy(&bits, static_cast<const uint16_t*>(want.raw_data()) + i, 2);
    bits = static_cast<uint16_t>(bits + 1);
    std::memcpy(next.raw_data(), &bits, 2);
    return std::fabs(reference::cast(next, DType::kF32, what).data<float>()[0] - y);
  };
  const float *a = gf.data<float>(), *b = wf.data<float>();
  int bad = 0;
  for (int64_t i = 0; i < got.numel() && bad < 5; ++i) {
    float x = a[i], y = b[i];
    if (std::isnan(y) ? std::isnan(x) : x == y) continue;
    double ulp = ulp_of(i, y);
    if (std::isfinite(x) && std::isfinite(y) &&
        (std::fabs(x - y) <= ulps * ulp || std::fabs(x - y) <= atol))
      continue;
    ADD_FAILURE() << what << ": element " << i << " is " << x << ", expected " << y;
    ++bad;
  }
}

struct Case {
  Graph g;
  std::vector<Tensor> feeds;  // graph inputs in order
};

// Lowers the whole graph as one group and checks it against the reference on every ISA and on 1
// and 2 threads. Returns the program.
TileProgram check(Case& c, const std::string& what, int ulps = 4, double atol = 0.0) {
  infer_types(c.g);
  KernelGroup group = whole_group(c.g);
  std::string why;
  std::optional<TileProgram> prog = lower_elementwise(c.g, group, &why);
  if (!prog) {
    ADD_FAILURE() << what << ": did not lower: " << why;
    return {};
  }
  std::vector<Tensor> want = reference::run(c.g, c.feeds);
  std::vector<Tensor> inputs;
  for (const TileOperand& o : prog->inputs) {
    const Tensor* init = c.g.initializer(o.value);
    if (init) {
      inputs.push_back(*init);
      continue;
    }
    for (size_t i = 0; i < c.g.inputs().size(); ++i)
      if (c.g.inputs()[i] == o.value) inputs.push_back(c.feeds[i]);
  }
  EXPECT_EQ(inputs.size(), prog->inputs.size()) << what;
  cpu::TileKernel kernel(*prog);
  const int saved = num_threads();
  // Strips of 16 and 48 values (one and three AVX-512 vectors) run what operands larger than
  // the L3 run; 0 the whole tiles of cached operands. Strips of 48 also with a prefetch distance
  // set (its lines all before each strip, not spread over the strip's instructions). Whole tiles
  // and strips of 48 also with streaming stores (as outputs larger than the L3 get them): the
  // last instruction before a store then streams into the output itself where nothing else
  // reads its result (TileArgs::direct_stream), else the store streams the register.
  const MemoryPolicy saved_policy = memory_policy();
  struct Config {
    int64_t strip;
    int prefetch;
    bool stream;
  };
  for (const Config& cfg : {Config{0, -1, false}, Config{16, -1, false}, Config{48, -1, false},
                            Config{48, 8, false}, Config{0, -1, true}, Config{48, -1, true}})
    for (Isa isa : cpu::supported_isas()) {
      cpu::IsaScope scope(isa);
      set_memory_policy(MemoryPolicy{.prefetch_distance = cfg.prefetch,
                                     .nontemporal = cfg.stream ? MemoryPolicy::NonTemporal::kAlways
                                                               : MemoryPolicy::NonTemporal::kAuto});
      const int64_t strip = cfg.strip;
      kernel.force_strip(strip);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        std::vector<Tensor> outs;
        for (size_t k = 0; k < prog->outputs.size(); ++k) {
          ValueId v = prog->outputs[k].value;
          size_t idx = 0;
          while (c.g.outputs()[idx] != v) ++idx;
          outs.push_back(Tensor::empty(want[idx].dtype(), want[0].shape()));
        }
        kernel.run(inputs, outs);
        for (size_t k = 0; k < outs.size(); ++k) {
          size_t idx = 0;
          while (c.g.outputs()[idx] != prog->outputs[k].value) ++idx;
          expect_near(outs[k], want[idx], ulps, atol,
                      what + " " + cpu::isa_name(isa) + " x" + std::to_string(threads) +
                          (strip ? " strips of " + std::to_string(strip) : "") +
                          (cfg.prefetch > 0 ? ", prefetch 8" : "") +
                          (cfg.stream ? ", streaming stores" : ""));
        }
      }
    }
  set_memory_policy(saved_policy);
  set_num_threads(saved);
  return *prog;
}

ValueId constant(Graph& g, const std::string& name, float v) {
  ValueId c = g.add_value(name);
  g.set_initializer(c, Tensor::scalar(v));
  return c;
}

// e = 4 * 0.1 * (s6 * s6 - s6), s6 = (3.4 / r) ** 6: the Lennard-Jones energy.
Case lennard_jones(int64_t n) {
  Case c;
  Graph& g = c.g;
  ValueId r = g.add_input("r", {DType::kF32, Shape{n}});
  ValueId q = g.add_value("q"), s6 = g.add_value("s6"), sq = g.add_value("sq"),
          d = g.add_value("d"), k = g.add_value("k"), e = g.add_value("e");
  g.add_node("Div", {constant(g, "sigma", 3.4f), r}, {q}, {}, "div");
  g.add_node("Pow", {q, constant(g, "six", 6.0f)}, {s6}, {}, "pow");
  g.add_node("Mul", {s6, s6}, {sq}, {}, "sq");
  g.add_node("Sub", {sq, s6}, {d}, {}, "sub");
  g.add_node("Mul", {constant(g, "four", 4.0f), constant(g, "eps", 0.1f)}, {k}, {}, "k");
  g.add_node("Mul", {k, d}, {e}, {}, "e");
  g.add_output(e);
  c.feeds = {random_f32({n}, 7, 3.0f, 6.0f, false)};
  return c;
}

TEST(TileLower, LennardJonesIsOneReadableProgram) {
  Case c = lennard_jones(1000003);
  TileProgram p = check(c, "lj", 8, 1e-6);
  EXPECT_EQ(p.inputs.size(), 1u);
  EXPECT_EQ(p.outputs.size(), 1u);
  std::string s = p.str();
  EXPECT_NE(s.find("div 3.4, r0"), std::string::npos) << s;
  EXPECT_EQ(s.find("pow"), std::string::npos) << s;  // square-and-multiply
  EXPECT_NE(s.find("in0 r: f32[1000003]"), std::string::npos) << s;
  EXPECT_NE(s.find("store out0"), std::string::npos) << s;
  EXPECT_LE(p.num_regs, 4) << s;
  std::cout << s;
}

TEST(TileExec, LennardJonesTiming) {
  const int64_t n = 1 << 20;
  Case c = lennard_jones(n);
  infer_types(c.g);
  std::optional<TileProgram> p = lower_elementwise(c.g, whole_group(c.g));
  ASSERT_TRUE(p);
  cpu::TileKernel kernel(*p);
  std::vector<Tensor> outs = {Tensor::empty(DType::kF32, {n})};
  kernel.run(c.feeds, outs);
  const int reps = 50;
  double us = 1e30;  // the best run: the machine may be shared
  for (int i = 0; i < reps; ++i) {
    auto t = std::chrono::steady_clock::now();
    kernel.run(c.feeds, outs);
    us = std::min(
        us,
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
  }
  auto t0 = std::chrono::steady_clock::now();
  Executable eager = compile(c.g, {.level = 0});  // one CPU kernel a node
  eager.run(c.feeds);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 5; ++i) eager.run(c.feeds);
  double eager_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 5;
  std::cout << "LJ 1<<20 floats: node by node " << eager_us << " us, tile program " << us
            << " us per run (" << num_threads() << " threads, " << cpu::isa_name(cpu::active_isa())
            << ", tile " << kernel.capacity() << ")\n";
  expect_near(outs[0], reference::run(c.g, c.feeds)[0], 8, 1e-6, "lj timing");
}

struct UnaryCase {
  const char* op;
  Attributes attrs;
  double atol = 0;  // the reference's own cancellation error (see cpu_elementwise_test.cpp)
};

TEST(TileExec, UnaryOpsMatchReference) {
  const UnaryCase cases[] = {
      {"Relu", {}},
      {"Sigmoid", {}},
      {"Tanh", {}},
      {"Exp", {}},
      {"Log", {}},
      {"Erf", {}},
      {"Sqrt", {}},
      {"Abs", {}},
      {"Neg", {}},
      {"Reciprocal", {}},
      {"Floor", {}},
      {"Ceil", {}},
      {"Round", {}},
      {"Sign", {}},
      {"HardSwish", {}},
      {"HardSigmoid", attrs({{"alpha", 0.3}, {"beta", 0.4}})},
      {"LeakyRelu", attrs({{"alpha", 0.2}})},
      {"Elu", {}, 1e-6},
      {"Selu", {}, 1e-6},
      {"Celu", attrs({{"alpha", 2.0}}), 1e-6},
      {"Softplus", {}},
      {"Softsign", {}},
      {"Mish", {}},
      {"Gelu", {}, 1e-6},
      {"Gelu", attrs({{"approximate", std::string("tanh")}}), 1e-6},
      {"ThresholdedRelu", attrs({{"alpha", 0.5}})},
      {"Identity", {}},
      {"Sin", {}},
      {"Cos", {}},
  };
  for (const UnaryCase& u : cases) {
    for (int64_t n : {1, 7, 17, 4099}) {
      Case c;
      ValueId x = c.g.add_input("x", {DType::kF32, Shape{n}});
      ValueId y = c.g.add_value("y");
      c.g.add_node(u.op, {x}, {y}, u.attrs, "op");
      c.g.add_output(y);
      c.feeds = {random_f32({n}, static_cast<uint32_t>(n))};
      check(c, std::string(u.op) + " n=" + std::to_string(n), 8, u.atol);
    }
  }
}

// Rotary position embedding, x * cos(p) + r * sin(p) (r: x with its halves rotated), is one
// program: Sin and Cos lower like the other unary ops.
TEST(TileExec, RotaryEmbeddingIsOneProgram) {
  Case c;
  Graph& g = c.g;
  const Dims dims{4, 64};
  ValueId x = g.add_input("x", {DType::kF32, to_shape(dims)});
  ValueId r = g.add_input("r", {DType::kF32, to_shape(dims)});
  ValueId p = g.add_input("p", {DType::kF32, to_shape(dims)});
  ValueId cs = g.add_value("cos"), sn = g.add_value("sin"), a = g.add_value("a"),
          b = g.add_value("b"), y = g.add_value("y");
  g.add_node("Cos", {p}, {cs}, {}, "cos");
  g.add_node("Sin", {p}, {sn}, {}, "sin");
  g.add_node("Mul", {x, cs}, {a}, {}, "mul_cos");
  g.add_node("Mul", {r, sn}, {b}, {}, "mul_sin");
  g.add_node("Add", {a, b}, {y}, {}, "add");
  g.add_output(y);
  c.feeds = {random_f32(dims, 3, -4.0f, 4.0f, false), random_f32(dims, 4, -4.0f, 4.0f, false),
             random_f32(dims, 5, 0.0f, 4096.0f, false)};
  // a + b cancels: an absolute allowance of a few ulp of the operands' size (4).
  TileProgram prog = check(c, "rotary", 8, 4e-6);
  EXPECT_EQ(prog.outputs.size(), 1u);
}

// a op b with broadcasting, for each binary op.
TEST(TileExec, BinaryBroadcastMatchesReference) {
  const std::vector<std::pair<Dims, Dims>> shapes = {
      {{1}, {1}},          {{7}, {7}},         {{1000003}, {1}}, {{3, 1, 5}, {4, 1}},
      {{7, 17}, {17}},     {{17, 7}, {17, 1}}, {{1000, 3}, {3}}, {{2, 3, 300}, {3, 1}},
      {{5, 1}, {1, 4099}}, {{}, {2, 3}},       {{0, 3}, {3}}};
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"}) {
    for (const auto& [sa, sb] : shapes) {
      Case c;
      ValueId a = c.g.add_input("a", {DType::kF32, to_shape(sa)});
      ValueId b = c.g.add_input("b", {DType::kF32, to_shape(sb)});
      ValueId y = c.g.add_value("y");
      c.g.add_node(op, {a, b}, {y}, {}, "op");
      c.g.add_output(y);
      c.feeds = {random_f32(sa, 1), random_f32(sb, 2)};
      check(c, std::string(op) + " " + dims_str(sa) + " " + dims_str(sb));
    }
  }
}

TEST(TileExec, PowConstantExponents) {
  for (float e : {0.0f, 1.0f, 2.0f, 3.0f, 6.0f, -1.0f, -2.0f, -3.0f, 0.5f, -0.5f, 1.7f}) {
    Case c;
    ValueId x = c.g.add_input("x", {DType::kF32, Shape{1001}});
    ValueId y = c.g.add_value("y");
    c.g.add_node("Pow", {x, constant(c.g, "e", e)}, {y}, {}, "pow");
    c.g.add_output(y);
    c.feeds = {random_f32({1001}, 3, -3.0f, 3.0f)};
    TileProgram p = check(c, "pow " + std::to_string(e), 6);
    if (e == std::nearbyint(e)) {
      EXPECT_EQ(p.str().find("pow"), std::string::npos) << p.str();
    }
  }
  // An integer exponent initializer and a constant base.
  Case c;
  ValueId x = c.g.add_input("x", {DType::kF32, Shape{33}});
  ValueId e = c.g.add_value("e"), y = c.g.add_value("y"), z = c.g.add_value("z");
  c.g.set_initializer(e, Tensor::scalar<int64_t>(3));
  c.g.add_node("Pow", {x, e}, {y}, {}, "pow");
  c.g.add_node("Pow", {constant(c.g, "two", 2.0f), y}, {z}, {}, "pow2");
  c.g.add_output(z);
  c.feeds = {random_f32({33}, 4, -2.0f, 2.0f)};
  check(c, "pow int", 8);
}

TEST(TileExec, WhereCompareClipPRelu) {
  Case c;
  Graph& g = c.g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{2, 3, 7, 5}});
  ValueId s = g.add_input("slope", {DType::kF32, Shape{3, 1, 1}});
  ValueId m = g.add_input("mask", {DType::kBool, Shape{7, 1}});
  ValueId lt = g.add_value("lt"), w = g.add_value("w"), cl = g.add_value("cl"),
          pr = g.add_value("pr"), cl6 = g.add_value("cl6"), sum = g.add_value("sum"),
          gt = g.add_value("gt"), w2 = g.add_value("w2"), mean = g.add_value("mean");
  g.add_node("Less", {x, constant(g, "half", 0.5f)}, {lt}, {}, "lt");
  g.add_node("Where", {lt, x, constant(g, "big", 9.0f)}, {w}, {}, "where");
  g.add_node("Clip", {w, constant(g, "lo", -1.0f), constant(g, "hi", 2.0f)}, {cl}, {}, "clip", 13);
  g.add_node("PRelu", {x, s}, {pr}, {}, "prelu");
  g.add_node("Clip", {pr}, {cl6}, attrs({{"min", -0.5}, {"max", 0.25}}), "clip6", 6);
  g.add_node("Sum", {cl, cl6, x}, {sum}, {}, "sum");
  g.add_node("Greater", {sum, x}, {gt}, {}, "gt");
  g.add_node("Where", {m, sum, x}, {w2}, {}, "where2");
  g.add_node("Mean", {w2, x, s}, {mean}, {}, "mean");
  g.add_output(mean);
  g.add_output(gt);
  c.feeds = {random_f32({2, 3, 7, 5}, 5), random_f32({3, 1, 1}, 6), random_bool({7, 1}, 7)};
  TileProgram p = check(c, "where/clip/prelu", 4, 1e-6);
  ASSERT_EQ(p.outputs.size(), 2u);
  EXPECT_EQ(p.outputs[0].value, gt);  // group outputs in node order
  EXPECT_EQ(p.outputs[0].dtype, TileDType::kBool);
}

// Programs that are one chain (each instruction reads the one before's result only, the other
// operands splats or inputs read in place, the unary functions light ones and at most one of exp,
// sigmoid, tanh, erf, gelu; one float32 store) run as one loop, four vectors at a time through
// every instruction (tile_exec_impl.h exec_chain); the others instruction by instruction. Both
// against the reference, at sizes around the vector widths and the group of four, with NaN,
// infinities, signed zeros and subnormals among the inputs.
TEST(TileExec, ChainsMatchReference) {
  for (int64_t n : {1, 7, 17, 63, 65, 4099, 100003}) {
    const std::string at = " n=" + std::to_string(n);
    {  // relu(2x + 1)
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId t = g.add_value("t"), u = g.add_value("u"), y = g.add_value("y");
      g.add_node("Mul", {x, constant(g, "two", 2.0f)}, {t}, {}, "mul");
      g.add_node("Add", {t, constant(g, "one", 1.0f)}, {u}, {}, "add");
      g.add_node("Relu", {u}, {y}, {}, "relu");
      g.add_output(y);
      c.feeds = {random_f32({n}, 11)};
      check(c, "relu(2x+1)" + at);
    }
    {  // sigmoid(a) * b + 1: a second input read in place
      Case c;
      Graph& g = c.g;
      ValueId a = g.add_input("a", {DType::kF32, Shape{n}});
      ValueId b = g.add_input("b", {DType::kF32, Shape{n}});
      ValueId s = g.add_value("s"), t = g.add_value("t"), y = g.add_value("y");
      g.add_node("Sigmoid", {a}, {s}, {}, "sig");
      g.add_node("Mul", {s, b}, {t}, {}, "mul");
      g.add_node("Add", {t, constant(g, "one", 1.0f)}, {y}, {}, "add");
      g.add_output(y);
      c.feeds = {random_f32({n}, 12), random_f32({n}, 13)};
      check(c, "sigmoid(a)*b+1" + at, 4, 1e-6);  // + 1 cancels
    }
    {  // the chain's value on the right: 1 - x, 3 / that, max(b, .), min(., c) with c a
       // broadcast scalar input, then x * x of the chain's value, clip and neg
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId b = g.add_input("b", {DType::kF32, Shape{n}});
      ValueId k = g.add_input("k", {DType::kF32, Shape{1}});
      ValueId v[8];
      for (int i = 0; i < 8; ++i) v[i] = g.add_value(cat("v", i));
      g.add_node("Sub", {constant(g, "one", 1.0f), x}, {v[0]}, {}, "sub");
      g.add_node("Div", {constant(g, "three", 3.0f), v[0]}, {v[1]}, {}, "div");
      g.add_node("Max", {b, v[1]}, {v[2]}, {}, "max");
      g.add_node("Min", {v[2], k}, {v[3]}, {}, "min");
      g.add_node("Mul", {v[3], v[3]}, {v[4]}, {}, "sq");
      g.add_node("Clip", {v[4], constant(g, "lo", -1.0f), constant(g, "hi", 2.5f)}, {v[5]}, {},
                 "clip", 13);
      g.add_node("Neg", {v[5]}, {v[6]}, {}, "neg");
      g.add_node("Sub", {v[6], b}, {v[7]}, {}, "sub2");
      g.add_output(v[7]);
      c.feeds = {random_f32({n}, 14), random_f32({n}, 15), random_f32({1}, 16, 0.5f, 1.0f, false)};
      check(c, "right-hand chain" + at, 4, 1e-6);  // the last Sub cancels
    }
    // x * x + x, negated, leaky relu, scaled into v[4] and rounded into v[5]: the chain starts
    // from an input on both sides, then reads it again.
    const auto square_prefix = [](Graph& g, ValueId x, ValueId* v) {
      g.add_node("Mul", {x, x}, {v[0]}, {}, "sq");
      g.add_node("Add", {v[0], x}, {v[1]}, {}, "add");
      g.add_node("Neg", {v[1]}, {v[2]}, {}, "neg");
      g.add_node("LeakyRelu", {v[2]}, {v[3]}, attrs({{"alpha", 0.1}}), "leaky");
      g.add_node("Mul", {v[3], constant(g, "k", 0.37f)}, {v[4]}, {}, "scale");
      g.add_node("Round", {v[4]}, {v[5]}, {}, "round");
    };
    {  // the prefix, then the other unary functions a chain takes
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId v[9];
      for (int i = 0; i < 9; ++i) v[i] = g.add_value(cat("v", i));
      square_prefix(g, x, v);
      g.add_node("Sub", {v[5], v[4]}, {v[6]}, {}, "frac");  // not a chain: v4 read again
      g.add_node("Abs", {v[4]}, {v[7]}, {}, "abs");
      g.add_node("Floor", {v[7]}, {v[8]}, {}, "floor");
      g.add_output(v[6]);
      g.add_output(v[8]);
      c.feeds = {random_f32({n}, 17)};
      check(c, "square, two outputs" + at, 4, 1e-6);
    }
    {  // the same as one chain
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId v[8];
      for (int i = 0; i < 8; ++i) v[i] = g.add_value(cat("v", i));
      square_prefix(g, x, v);
      g.add_node("Abs", {v[5]}, {v[6]}, {}, "abs");
      g.add_node("Ceil", {v[6]}, {v[7]}, {}, "ceil");
      g.add_output(v[7]);
      c.feeds = {random_f32({n}, 17)};
      check(c, "square chain" + at);
    }
    {  // exp, gelu (two heavy functions), softplus: the passes
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId v[4];
      for (int i = 0; i < 4; ++i) v[i] = g.add_value("v" + std::to_string(i));
      g.add_node("Neg", {x}, {v[0]}, {}, "neg");
      g.add_node("Exp", {v[0]}, {v[1]}, {}, "exp");
      g.add_node("Gelu", {v[1]}, {v[2]}, {}, "gelu");
      g.add_node("Softplus", {v[2]}, {v[3]}, {}, "softplus");
      g.add_output(v[3]);
      c.feeds = {random_f32({n}, 18)};
      check(c, "exp chain" + at, 8, 1e-6);
    }
    // One heavy function in a chain, light instructions before and after it:
    // relu((f(x / 2 - 1) * b + 0.25)).
    for (const char* f : {"Exp", "Sigmoid", "Tanh", "Erf", "Gelu", "GeluTanh"}) {
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId b = g.add_input("b", {DType::kF32, Shape{n}});
      const ValueId v[5] = {g.add_value("v0"), g.add_value("v1"), g.add_value("v2"),
                            g.add_value("v3"), g.add_value("v4")};
      g.add_node("Mul", {x, constant(g, "half", 0.5f)}, {v[0]}, {}, "half");
      g.add_node("Sub", {v[0], constant(g, "one", 1.0f)}, {v[1]}, {}, "sub");
      const bool tanh_form = std::string(f) == "GeluTanh";
      g.add_node(tanh_form ? "Gelu" : f, {v[1]}, {v[2]},
                 tanh_form ? attrs({{"approximate", std::string("tanh")}}) : Attributes{}, "f");
      g.add_node("Mul", {v[2], b}, {v[3]}, {}, "mul");
      g.add_node("Add", {v[3], constant(g, "q", 0.25f)}, {v[4]}, {}, "add");
      ValueId y = g.add_value("y");
      g.add_node("Relu", {v[4]}, {y}, {}, "relu");
      g.add_output(y);
      c.feeds = {random_f32({n}, 20), random_f32({n}, 21)};
      check(c, std::string(f) + " in a chain" + at, 8, 1e-6);
    }
    {  // not a chain: t is read after the chain has moved on (the passes run it)
      Case c;
      Graph& g = c.g;
      ValueId x = g.add_input("x", {DType::kF32, Shape{n}});
      ValueId t = g.add_value("t"), u = g.add_value("u"), y = g.add_value("y");
      g.add_node("Mul", {x, constant(g, "two", 2.0f)}, {t}, {}, "mul");
      g.add_node("Sigmoid", {t}, {u}, {}, "sig");
      g.add_node("Mul", {u, t}, {y}, {}, "mul2");
      g.add_output(y);
      c.feeds = {random_f32({n}, 18)};
      check(c, "silu(2x)" + at);
    }
  }
  // relu keeps NaN and gives +0 for -0, on every ISA (the reference's x > 0 ? x : 0).
  Case c;
  ValueId x = c.g.add_input("x", {DType::kF32, Shape{40}});
  ValueId y = c.g.add_value("y");
  c.g.add_node("Relu", {x}, {y}, {}, "relu");
  c.g.add_output(y);
  c.feeds = {random_f32({40}, 19)};
  c.feeds[0].data<float>()[39] = -0.0f;
  TileProgram p = check(c, "relu");
  cpu::TileKernel kernel(p);
  for (Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    std::vector<Tensor> outs = {Tensor::empty(DType::kF32, {40})};
    kernel.run(c.feeds, outs);
    const float* o = outs[0].data<float>();
    EXPECT_TRUE(std::isnan(o[0])) << cpu::isa_name(isa);
    EXPECT_FALSE(std::signbit(o[12])) << cpu::isa_name(isa) << ": relu(-0)";  // specials[4]
    EXPECT_FALSE(std::signbit(o[39])) << cpu::isa_name(isa) << ": relu(-0)";
  }
}

// A row that every row of the tile reads (an attention mask over the keys, a bias) in a chain:
// read as a tile of that row repeated, in a buffer of the thread's kept while the same row comes
// back (tile_exec_impl.h repeated_row). Rows of odd widths around the vector sizes and more rows
// than a tile holds; then the row's values change in place (same address): the buffer is built
// again, not read stale.
TEST(TileExec, ChainWithARowEveryRowReads) {
  for (auto [rows, width] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 49}, {5, 49}, {300, 49}, {3, 128}, {64, 17}, {2, 1000}, {700, 24}}) {
    const std::string at = cat(" ", rows, "x", width);
    Case c;
    Graph& g = c.g;
    ValueId x = g.add_input("x", {DType::kF32, Shape{rows, width}});
    ValueId mask = g.add_input("mask", {DType::kF32, Shape{width}});
    ValueId bias = g.add_input("bias", {DType::kF32, Shape{1, width}});
    ValueId t = g.add_value("t"), u = g.add_value("u"), v = g.add_value("v"), y = g.add_value("y");
    g.add_node("Mul", {x, constant(g, "scale", 0.125f)}, {t}, {}, "scale");
    g.add_node("Add", {t, mask}, {u}, {}, "mask");
    g.add_node("Relu", {u}, {v}, {}, "relu");
    g.add_node("Sub", {bias, v}, {y}, {}, "bias");  // the chain's value on the right
    g.add_output(y);
    c.feeds = {random_f32({rows, width}, 21), random_f32({width}, 22), random_f32({1, width}, 23)};
    check(c, "x * 0.125 + mask, relu, bias - ." + at);
    float* m = c.feeds[1].data<float>();
    for (int64_t j = 0; j < width; ++j) m[j] = 2.0f - m[j];
    check(c, "the same with the mask changed in place" + at);
  }
}

TEST(TileExec, SharedIntermediateAndTwoOutputs) {
  Case c;
  ValueId x = c.g.add_input("x", {DType::kF32, Shape{3, 1000}});
  ValueId a = c.g.add_value("a"), b = c.g.add_value("b"), d = c.g.add_value("d");
  c.g.add_node("Exp", {x}, {a}, {}, "exp");
  c.g.add_node("Mul", {a, constant(c.g, "two", 2.0f)}, {b}, {}, "mul");
  c.g.add_node("Add", {a, b}, {d}, {}, "add");
  c.g.add_output(b);
  c.g.add_output(a);
  c.g.add_output(d);
  c.feeds = {random_f32({3, 1000}, 8)};
  check(c, "two outputs");
}

TEST(TileLower, SymbolicShapes) {
  Case c;
  ValueId x = c.g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 3}});
  ValueId b = c.g.add_input("b", {DType::kF32, Shape{3}});
  ValueId y = c.g.add_value("y"), z = c.g.add_value("z");
  c.g.add_node("Add", {x, b}, {y}, {}, "add");
  c.g.add_node("Sigmoid", {y}, {z}, {}, "sig");
  c.g.add_output(z);
  c.feeds = {random_f32({5, 3}, 9), random_f32({3}, 10)};
  TileProgram p = check(c, "symbolic");
  EXPECT_NE(p.str().find("[batch, 3]"), std::string::npos) << p.str();
}

TEST(TileLower, DeclinesWithAReason) {
  {  // outputs of different shapes
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, Shape{3}});
    ValueId w = g.add_input("w", {DType::kF32, Shape{2, 3}});
    ValueId y = g.add_value("y"), z = g.add_value("z");
    g.add_node("Relu", {x}, {y}, {}, "relu");
    g.add_node("Add", {y, w}, {z}, {}, "add");
    g.add_output(y);
    g.add_output(z);
    infer_types(g);
    std::string why;
    EXPECT_FALSE(lower_elementwise(g, whole_group(g), &why));
    EXPECT_NE(why.find("differ in shape"), std::string::npos) << why;
  }
  {  // not elementwise
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, Shape{3, 3}});
    ValueId y = g.add_value("y");
    g.add_node("MatMul", {x, x}, {y}, {}, "mm");
    g.add_output(y);
    infer_types(g);
    std::string why;
    EXPECT_FALSE(lower_elementwise(g, whole_group(g), &why));
    EXPECT_NE(why.find("[MatMul] node 'mm'"), std::string::npos) << why;
  }
  {  // int64 values
    Graph g;
    ValueId x = g.add_input("x", {DType::kI64, Shape{3}});
    ValueId y = g.add_value("y");
    g.add_node("Add", {x, x}, {y}, {}, "add");
    g.add_output(y);
    infer_types(g);
    std::string why;
    EXPECT_FALSE(lower_elementwise(g, whole_group(g), &why));
    EXPECT_NE(why.find("i64"), std::string::npos) << why;
  }
}

TEST(TileExec, SoftmaxAndLayerNormRows) {
  for (const Dims& shape : std::vector<Dims>{{7, 33}, {3, 5, 1000}, {5, 1}, {4099}, {2, 5000}}) {
    Case c;
    Graph& g = c.g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape(shape)});
    ValueId gamma = g.add_input("gamma", {DType::kF32, Shape{shape.back()}});
    ValueId axes = g.add_value("axes");
    g.set_initializer(axes, Tensor::from_vector<int64_t>({-1}, {1}));
    ValueId sm = g.add_value("sm"), lsm = g.add_value("lsm"), mean = g.add_value("mean"),
            d = g.add_value("d"), d2 = g.add_value("d2"), var = g.add_value("var"),
            ve = g.add_value("ve"), sd = g.add_value("sd"), nrm = g.add_value("nrm"),
            y = g.add_value("y"), mx = g.add_value("mx"), z = g.add_value("z");
    g.add_node("Softmax", {x}, {sm}, {}, "softmax");
    g.add_node("LogSoftmax", {x}, {lsm}, {}, "logsoftmax");
    g.add_node("ReduceMean", {x, axes}, {mean}, {}, "mean");
    g.add_node("Sub", {x, mean}, {d}, {}, "center");
    g.add_node("Mul", {d, d}, {d2}, {}, "square");
    g.add_node("ReduceMean", {d2, axes}, {var}, {}, "var");
    g.add_node("Add", {var, constant(g, "eps", 1e-5f)}, {ve}, {}, "eps");
    g.add_node("Sqrt", {ve}, {sd}, {}, "sqrt");
    g.add_node("Div", {d, sd}, {nrm}, {}, "norm");
    g.add_node("Mul", {nrm, gamma}, {y}, {}, "scale");
    g.add_node("ReduceMax", {sm, axes}, {mx}, {}, "max");
    g.add_node("Add", {y, mx}, {z}, {}, "z");
    g.add_output(sm);
    g.add_output(lsm);
    g.add_output(z);
    c.feeds = {random_f32(shape, 21, -5, 5, false), random_f32({shape.back()}, 22, -2, 2, false)};
    TileProgram p = check(c, "rows " + dims_str(shape), 16, 1e-5);
    EXPECT_NE(p.str().find("row_max"), std::string::npos) << p.str();
  }
}

TEST(TileLower, RowReductionNeedsTheLastAxis) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{4, 6}});
  ValueId axes = g.add_value("axes");
  g.set_initializer(axes, Tensor::from_vector<int64_t>({0}, {1}));
  ValueId m = g.add_value("m"), y = g.add_value("y");
  g.add_node("ReduceSum", {x, axes}, {m}, {}, "sum");
  g.add_node("Sub", {x, m}, {y}, {}, "sub");
  g.add_output(y);
  infer_types(g);
  std::string why;
  EXPECT_FALSE(lower_elementwise(g, whole_group(g), &why));
  EXPECT_NE(why.find("last"), std::string::npos) << why;
}

TEST(TileExec, BooleanLogicAndCasts) {
  Case c;
  Graph& g = c.g;
  ValueId a = g.add_input("a", {DType::kF32, Shape{17, 3}});
  ValueId b = g.add_input("b", {DType::kF32, Shape{3}});
  ValueId m = g.add_input("m", {DType::kBool, Shape{17, 3}});
  auto v = [&](const char* name) { return g.add_value(name); };
  ValueId eq = v("eq"), nm = v("nm"), o = v("o"), x = v("x"), nan = v("nan"), inf = v("inf"),
          an = v("an"), ab = v("ab"), f = v("f"), y = v("y"), ge = v("ge"), w = v("w");
  g.add_node("Equal", {a, b}, {eq}, {}, "eq");
  g.add_node("Not", {m}, {nm}, {}, "not");
  g.add_node("Or", {eq, nm}, {o}, {}, "or");
  g.add_node("Xor", {o, m}, {x}, {}, "xor");
  g.add_node("IsNaN", {a}, {nan}, {}, "isnan");
  g.add_node("IsInf", {a}, {inf}, {}, "isinf");
  g.add_node("And", {nan, inf}, {an}, {}, "and");
  g.add_node("Cast", {a}, {ab}, attrs({{"to", int64_t{9}}}), "tobool");
  g.add_node("Cast", {x}, {f}, attrs({{"to", int64_t{1}}}), "tofloat");
  g.add_node("GreaterOrEqual", {a, f}, {ge}, {}, "ge");
  g.add_node("Where", {ge, an, ab}, {w}, {}, "where");
  g.add_node("Add", {f, a}, {y}, {}, "add");
  g.add_output(w);
  g.add_output(y);
  g.add_output(x);
  c.feeds = {random_f32({17, 3}, 31), random_f32({3}, 32), random_bool({17, 3}, 33)};
  // Some equal pairs, so that Equal is not always false.
  for (int i = 0; i < 17; i += 2) c.feeds[0].data<float>()[i * 3 + 1] = c.feeds[1].data<float>()[1];
  check(c, "logic");
}

// bf16 and f16 storage: half inputs widened as they load, half outputs rounded (to nearest even)
// as they store, Casts among f32, bf16, f16 and bool inside the program (no cast kernels), and a
// softmax on bf16 rows computing in f32, against the reference; F16C on and off.
TEST(TileExec, HalfStorageLoadsStoresAndCasts) {
  for (const Dims& shape : std::vector<Dims>{{17, 45}, {3, 1000}, {1, 7}}) {
    Case c;
    Graph& g = c.g;
    const Shape s = to_shape(shape), row{shape.back()};
    ValueId xf = g.add_input("xf", {DType::kF32, s}), xb = g.add_input("xb", {DType::kBF16, s});
    ValueId xh = g.add_input("xh", {DType::kF16, row});
    auto v = [&](const char* name) { return g.add_value(name); };
    ValueId fb = v("fb"), sum = v("sum"), sf = v("sf"), hf = v("hf"), p = v("p"), ph = v("ph"),
            sm = v("sm"), hb = v("hb"), pos = v("pos"), q = v("q");
    auto to = [](DType d) { return attrs({{"to", static_cast<int64_t>(onnx_code(d))}}); };
    g.add_node("Cast", {xf}, {fb}, to(DType::kBF16), "f_to_bf16");
    g.add_node("Add", {fb, xb}, {sum}, {}, "add_bf16");  // rounded to bf16
    g.add_node("Cast", {sum}, {sf}, to(DType::kF32), "bf16_to_f");
    g.add_node("Cast", {xh}, {hf}, to(DType::kF32), "f16_to_f");
    g.add_node("Mul", {sf, hf}, {p}, {}, "mul");
    g.add_node("Cast", {p}, {ph}, to(DType::kF16), "f_to_f16");
    g.add_node("Softmax", {sum}, {sm}, {}, "softmax_bf16");
    g.add_node("Cast", {ph}, {hb}, to(DType::kBF16), "f16_to_bf16");
    g.add_node("Cast", {hb}, {pos}, to(DType::kBool), "bf16_to_bool");
    g.add_node("Where", {pos, sm, hb}, {q}, {}, "where_bf16");
    for (ValueId o : {sum, ph, sm, p, q}) g.add_output(o);
    const Tensor f = random_f32(shape, 91, -300, 300, false);
    c.feeds = {f, reference::cast(random_f32(shape, 92, -8, 8, false), DType::kBF16, "xb"),
               reference::cast(random_f32({shape.back()}, 93, -3, 3, false), DType::kF16, "xh")};
    for (bool f16c : {true, false}) {
      std::optional<cpu::ExtScope> off;
      if (!f16c) off.emplace(cpu::Ext::kF16c);
      TileProgram prog = check(c, "half " + dims_str(shape) + (f16c ? "" : " no f16c"), 1);
      EXPECT_NE(prog.str().find("round_bf16"), std::string::npos) << prog.str();
      EXPECT_NE(prog.str().find("in1 xb: bf16"), std::string::npos) << prog.str();
    }
  }
}

// Quantized tensors: DequantizeLinear of u8, i8 (per tensor and per last-axis channel) and of an
// int32 bias, float ops, QuantizeLinear to u8 and i8 (constant and loaded scales, NaN, ties,
// saturation) in one program, exactly as the reference computes them.
TEST(TileExec, QuantizeAndDequantizeInOneProgram) {
  for (const Dims& shape : std::vector<Dims>{{17, 45}, {2, 3, 300}}) {
    Case c;
    Graph& g = c.g;
    const Shape s = to_shape(shape), row{shape.back()};
    auto v = [&](const char* name) { return g.add_value(name); };
    auto init = [&](const char* name, Tensor t) {
      ValueId id = g.add_value(name);
      g.set_initializer(id, std::move(t));
      return id;
    };
    ValueId xq = g.add_input("xq", {DType::kU8, s}), yq = g.add_input("yq", {DType::kI8, row});
    ValueId bias = g.add_input("bias", {DType::kI32, row}),
            xf = g.add_input("xf", {DType::kF32, s});
    ValueId scale2 = g.add_input("scale2", {DType::kF32, Shape{}});
    const int64_t n = shape.back();
    std::vector<float> ch_scale(static_cast<size_t>(n));
    std::vector<int8_t> ch_zp(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      ch_scale[i] = 0.01f + 0.001f * i, ch_zp[i] = static_cast<int8_t>(i % 7 - 3);
    ValueId a = v("a"), b = v("b"), sum = v("sum"), r = v("r"), q = v("q"), q2 = v("q2"),
            d = v("d"), f = v("f"), q3 = v("q3");
    g.add_node("DequantizeLinear",
               {xq, init("s1", Tensor::scalar(0.05f)),
                init("z1", Tensor::from_vector<uint8_t>({128}, {}))},
               {a}, {}, "dq_u8");
    g.add_node("DequantizeLinear",
               {yq, init("s2", Tensor::from_vector<float>(ch_scale, {n})),
                init("z2", Tensor::from_vector<int8_t>(ch_zp, {n}))},
               {b}, attrs({{"axis", int64_t{-1}}}), "dq_i8_channels");
    g.add_node("Add", {a, b}, {sum}, {}, "add");
    g.add_node("Relu", {sum}, {r}, {}, "relu");
    g.add_node(
        "QuantizeLinear",
        {r, init("s3", Tensor::scalar(0.07f)), init("z3", Tensor::from_vector<uint8_t>({3}, {}))},
        {q}, {}, "q_u8");
    g.add_node("QuantizeLinear", {sum, scale2, init("z4", Tensor::from_vector<int8_t>({-5}, {}))},
               {q2}, {}, "q_i8_loaded_scale");
    g.add_node("DequantizeLinear", {bias, init("s5", Tensor::scalar(0.002f))}, {d}, {}, "dq_bias");
    g.add_node("Add", {sum, d}, {f}, {}, "add_bias");
    g.add_node(
        "QuantizeLinear",
        {xf, init("s6", Tensor::scalar(0.5f)), init("z6", Tensor::from_vector<uint8_t>({7}, {}))},
        {q3}, {}, "q_specials");
    for (ValueId o : {q, q2, f, q3}) g.add_output(o);
    Tensor xqt = Tensor::empty(DType::kU8, shape), yqt = Tensor::empty(DType::kI8, {n}),
           bt = Tensor::empty(DType::kI32, {n});
    std::mt19937 rng(5);
    for (int64_t i = 0; i < xqt.numel(); ++i) xqt.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
    for (int64_t i = 0; i < n; ++i) {
      yqt.data<int8_t>()[i] = static_cast<int8_t>(rng());
      bt.data<int32_t>()[i] = static_cast<int32_t>(rng() % 20001) - 10000;
    }
    Tensor xft = random_f32(shape, 61, -200, 200);  // NaN, inf, ... and far beyond the range
    for (int64_t i = 64; i < 96 && i < xft.numel(); ++i)
      xft.data<float>()[i] = 0.25f * static_cast<float>(i - 80);  // ties of x / 0.5
    c.feeds = {xqt, yqt, bt, xft, Tensor::scalar(0.031f)};
    TileProgram p = check(c, "quant " + dims_str(shape), 0);
    EXPECT_NE(p.str().find("in0 xq: u8"), std::string::npos) << p.str();
  }
}

TEST(TileExec, RejectsTensorsThatDoNotFit) {
  Case c;
  ValueId x = c.g.add_input("x", {DType::kF32, Shape{Dim::sym("n")}});
  ValueId y = c.g.add_value("y");
  c.g.add_node("Exp", {x}, {y}, {}, "exp");
  c.g.add_output(y);
  infer_types(c.g);
  std::optional<TileProgram> p = lower_elementwise(c.g, whole_group(c.g));
  ASSERT_TRUE(p);
  cpu::TileKernel kernel(*p);
  std::vector<Tensor> out = {Tensor::empty(DType::kF32, {4})};
  EXPECT_THROW(kernel.run({Tensor::zeros(DType::kF32, {5})}, out), ValueError);     // no broadcast
  EXPECT_THROW(kernel.run({Tensor::zeros(DType::kF32, {2, 4})}, out), ValueError);  // rank
  EXPECT_THROW(kernel.run({Tensor::zeros(DType::kI64, {4})}, out), ValueError);     // dtype
  EXPECT_THROW(kernel.run({}, out), ValueError);                                    // count
  kernel.run({Tensor::zeros(DType::kF32, {1})}, out);                               // broadcasts
  EXPECT_EQ(out[0].data<float>()[3], 1.0f);
}

// MatMul + bias + residual + GELU * 0.5: the chain after the MatMul runs as the GEMM's epilogue.
TEST(TileEpilogue, GemmRunsAnElementwiseChain) {
  const int64_t M = 37, K = 29, N = 53;
  Graph g;
  ValueId a = g.add_input("a", {DType::kF32, Shape{M, K}});
  ValueId w = g.add_input("w", {DType::kF32, Shape{K, N}});
  ValueId bias = g.add_input("bias", {DType::kF32, Shape{N}});
  ValueId res = g.add_input("res", {DType::kF32, Shape{M, N}});
  ValueId mm = g.add_value("mm"), t1 = g.add_value("t1"), t2 = g.add_value("t2"),
          t3 = g.add_value("t3"), y = g.add_value("y");
  g.add_node("MatMul", {a, w}, {mm}, {}, "mm");
  g.add_node("Add", {mm, bias}, {t1}, {}, "bias");
  g.add_node("Add", {res, t1}, {t2}, {}, "res");
  g.add_node("Gelu", {t2}, {t3}, {}, "gelu");
  g.add_node("Mul", {t3, constant(g, "half", 0.5f)}, {y}, {}, "half");
  g.add_output(y);
  infer_types(g);
  KernelGroup group = whole_group(g);
  group.anchor = 0;
  std::string why;
  std::optional<TileProgram> p = lower_epilogue(g, group, mm, &why);
  ASSERT_TRUE(p) << why;
  ASSERT_EQ(p->inputs.size(), 3u) << p->str();
  EXPECT_EQ(p->inputs[0].value, mm);
  std::vector<Tensor> feeds = {random_f32({M, K}, 11, -1, 1, false),
                               random_f32({K, N}, 12, -1, 1, false),
                               random_f32({N}, 13, -1, 1, false), random_f32({M, N}, 14)};
  Tensor want = reference::run(g, feeds)[0];
  std::vector<cpu::EpilogueOperand> ops;
  for (size_t k = 1; k < p->inputs.size(); ++k) {
    if (p->inputs[k].value == bias) ops.push_back({feeds[2].data<float>(), 0, 1});
    if (p->inputs[k].value == res) ops.push_back({feeds[3].data<float>(), N, 1});
  }
  ASSERT_EQ(ops.size(), 2u);
  cpu::TileKernel kernel(*p);
  const int saved = num_threads();
  for (Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor out = Tensor::empty(DType::kF32, {M, N});
      cpu::GemmArgs args{.m = M,
                         .n = N,
                         .k = K,
                         .a = feeds[0].data<float>(),
                         .lda = K,
                         .b = feeds[1].data<float>(),
                         .ldb = N,
                         .c = out.data<float>(),
                         .ldc = N};
      args.epilogue.tile = &kernel;
      args.epilogue.tile_operands = ops.data();
      cpu::sgemm(args);
      expect_near(
          out, want, 16, 1e-5,
          std::string("gemm epilogue ") + cpu::isa_name(isa) + " x" + std::to_string(threads));
    }
  }
  set_num_threads(saved);
}

// A per-row operand (a conv bias) on blocks of a C with padded rows, through run_block.
TEST(TileEpilogue, RunBlockWithPerRowOperand) {
  const int64_t M = 13, N = 70, ldc = 75;
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{M, N}});
  ValueId rb = g.add_input("rb", {DType::kF32, Shape{M, 1}});
  ValueId acc = g.add_value("acc"), y = g.add_value("y"), z = g.add_value("z");
  g.add_node("Identity", {x}, {acc}, {}, "anchor");
  g.add_node("Add", {acc, rb}, {y}, {}, "bias");
  g.add_node("Sigmoid", {y}, {z}, {}, "sig");
  g.add_output(z);
  infer_types(g);
  std::string why;
  std::optional<TileProgram> p = lower_epilogue(g, whole_group(g), acc, &why);
  ASSERT_TRUE(p) << why;
  std::vector<Tensor> feeds = {random_f32({M, N}, 15), random_f32({M, 1}, 16)};
  Tensor want = reference::run(g, feeds)[0];
  cpu::TileKernel kernel(*p);
  const cpu::EpilogueOperand op{feeds[1].data<float>(), 1, 0};
  for (Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    std::vector<float> c(static_cast<size_t>(M * ldc), -7.0f);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = feeds[0].data<float>()[i * N + j];
    for (int64_t m0 = 0; m0 < M; m0 += 6)  // blocks of 6 x 16, as a micro-kernel would
      for (int64_t n0 = 0; n0 < N; n0 += 16)
        kernel.run_block(&op, c.data() + m0 * ldc + n0, ldc, m0, std::min<int64_t>(6, M - m0), n0,
                         std::min<int64_t>(16, N - n0));
    Tensor got = Tensor::empty(DType::kF32, {M, N});
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) got.data<float>()[i * N + j] = c[i * ldc + j];
      EXPECT_EQ(c[i * ldc + N], -7.0f);  // the padding is untouched
    }
    expect_near(got, want, 4, 0, std::string("run_block ") + cpu::isa_name(isa));
  }
}

}  // namespace
}  // namespace pto
