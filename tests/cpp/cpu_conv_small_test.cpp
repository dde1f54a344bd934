// The small-output conv kernel (conv.h conv_small: output channels along the vector lanes, for
// convs of a few output positions, as Silero VAD's) against the reference
// interpreter: 1-D and 2-D convs with 1 to 12 output positions, strides, pads, dilations, groups,
// with and without bias, fused ReLU / Clip / Sigmoid / residual Add + ReLU / a tile epilogue, on
// every ISA with 1 and 2 threads; a depthwise conv and a larger plane stay on their kernels; a
// plane known only at run time; the kernel on planes of many position blocks; the conv.algo {3}
// knob.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/isa/isa.h"
#include "conv_test_util.h"
#include "pto/backend.h"
#include "pto/error.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"
#include "random_tensor.h"

namespace pto {
namespace {

using cpu::IsaScope;
using testing::random_tensor;

Attributes attrs_of(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

using testing::expect_close;

struct Case {
  Dims x, w;
  Attributes attrs;
  bool bias = true;
  bool small = true;  // whether the planner puts it on the small-output kernel
  // Not small but on the generic ISA (no blocked kernel there: the implicit GEMM is the
  // alternative).
  bool generic_small = false;
};

int64_t k_of(const Dims& w) {
  int64_t k = 1;
  for (size_t d = 1; d < w.size(); ++d) k *= w[d];
  return k;
}

// The output shape of `c` (the reference's shape inference on a one-node graph).
Dims out_shape(const Case& c) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, to_shape(c.x)});
  ValueId w = testing::constant(g, "w", c.w, 2);
  ValueId y = g.add_value("y");
  g.add_node("Conv", {x, w}, {y}, c.attrs, "conv");
  g.add_output(y);
  return reference::run(g, {random_tensor(c.x, 1)})[0].shape();
}

// What follows the conv (fused into its kernel at level 2).
enum class After { kNone, kRelu, kClip, kSigmoid, kAddRelu, kTile };
const char* after_name(After a) {
  const char* names[] = {"none", "relu", "clip", "sigmoid", "add+relu", "mul+tanh"};
  return names[static_cast<int>(a)];
}

struct Built {
  Graph g;
  std::vector<Tensor> feeds;
};

// Conv (W and B constants) then `after`; X (and the residual) graph inputs of shape `xs` (and
// the output's), fed with x (and r).
Built build(const Case& c, After after, const Shape& xs) {
  Built b;
  const Dims y = out_shape(c);
  ValueId x = b.g.add_input("x", {DType::kF32, xs});
  b.feeds.push_back(random_tensor(c.x, 1));
  std::vector<ValueId> ins = {x, testing::constant(b.g, "w", c.w, 2)};
  if (c.bias) ins.push_back(testing::constant(b.g, "b", {c.w[0]}, 3));
  ValueId conv = b.g.add_value("conv");
  b.g.add_node("Conv", ins, {conv}, c.attrs, "conv");
  ValueId out = b.g.add_value("out");
  switch (after) {
    case After::kNone:
      out = conv;
      break;
    case After::kRelu:
      b.g.add_node("Relu", {conv}, {out}, {}, "relu");
      break;
    case After::kClip: {
      ValueId lo = b.g.add_value("lo"), hi = b.g.add_value("hi");
      Tensor l = Tensor::empty(DType::kF32, {}), h = Tensor::empty(DType::kF32, {});
      l.data<float>()[0] = -0.25f;
      h.data<float>()[0] = 0.5f;
      b.g.set_initializer(lo, l);
      b.g.set_initializer(hi, h);
      b.g.add_node("Clip", {conv, lo, hi}, {out}, {}, "clip");
      break;
    }
    case After::kSigmoid:
      b.g.add_node("Sigmoid", {conv}, {out}, {}, "sigmoid");
      break;
    case After::kAddRelu: {
      ValueId r = b.g.add_input("r", {DType::kF32, to_shape(y)});
      b.feeds.push_back(random_tensor(y, 4));
      ValueId s = b.g.add_value("s");
      b.g.add_node("Add", {conv, r}, {s}, {}, "add");
      b.g.add_node("Relu", {s}, {out}, {}, "relu");
      break;
    }
    case After::kTile: {  // Tanh(conv * s), s one value per output channel: a tile epilogue
      Dims sd(y.size() - 1, 1);
      sd[0] = y[1];
      ValueId s = testing::constant(b.g, "s", sd, 5), m = b.g.add_value("m");
      b.g.add_node("Mul", {conv, s}, {m}, {}, "mul");
      b.g.add_node("Tanh", {m}, {out}, {}, "tanh");
      break;
    }
  }
  b.g.add_output(out);
  return b;
}

// The case at level 0 (the conv alone) and level 2 (fused with `after`), on every ISA with 1 and
// 2 threads: one step, on the small-output kernel exactly when c.small, close to the reference,
// and the same bits on 1 and 2 threads.
void check(const Case& c, After after) {
  Built b = build(c, after, to_shape(c.x));
  const Tensor want = reference::run(b.g, b.feeds)[0];
  const int saved = num_threads();
  for (cpu::Isa isa : cpu::supported_isas()) {
    IsaScope scope(isa);
    for (int level : {0, 2}) {
      if (level == 0 && after != After::kNone) continue;
      Tensor first;
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        const std::string what =
            cat("X ", dims_str(c.x), " W ", dims_str(c.w), " then ", after_name(after), " on ",
                cpu::isa_name(isa), ", level ", level, ", ", threads, " thread(s)");
        Executable exe = compile(b.g, {.level = level});
        ASSERT_EQ(exe.num_steps(), 1u) << what;
        ASSERT_EQ(exe.node_backend(0), "cpu") << what;
        if (after != After::kTile) {  // (a tile epilogue's step describes its program instead)
          const bool small = c.small || (c.generic_small && isa == cpu::Isa::kGeneric);
          EXPECT_EQ(exe.describe_step(0).find("small output") != std::string::npos, small)
              << what << ": " << exe.describe_step(0);
        }
        const Tensor got = exe.run(b.feeds)[0];
        expect_close(got, want, k_of(c.w), what);
        if (threads == 1) {
          first = got;
        } else {
          ASSERT_EQ(got.numel(), first.numel());
          for (int64_t i = 0; i < got.numel(); ++i)
            ASSERT_EQ(got.data<float>()[i], first.data<float>()[i]) << what << ": element " << i;
        }
      }
    }
  }
  set_num_threads(saved);
}

std::vector<Case> one_d_cases() {
  return {
      // Silero VAD's: the STFT (258 filters, kernel 256, stride 128) and the encoder.
      {{1, 1, 576}, {258, 1, 256}, attrs_of({{"strides", Dims{128}}}), false},
      {{1, 129, 3}, {128, 129, 3}, attrs_of({{"pads", Dims{1, 1}}})},
      {{1, 128, 3}, {64, 128, 3}, attrs_of({{"pads", Dims{1, 1}}, {"strides", Dims{2}}})},
      {{1, 64, 2}, {64, 64, 3}, attrs_of({{"pads", Dims{1, 1}}, {"strides", Dims{2}}})},
      {{2, 64, 1}, {128, 64, 3}, attrs_of({{"pads", Dims{1, 1}}})},
      {{1, 128, 1}, {1, 128, 1}, {}},  // one output channel (the decoder)
      // Dilation and asymmetric pads, 8 positions, 37 channels (a partial vector).
      {{2, 20, 9}, {37, 20, 3}, attrs_of({{"pads", Dims{2, 1}}, {"dilations", Dims{2}}}), false},
      // Groups, 4 positions at stride 2.
      {{1, 12, 7},
       {30, 4, 3},
       attrs_of({{"group", int64_t{3}}, {"pads", Dims{1, 1}}, {"strides", Dims{2}}})},
      // 300 channels in several register blocks, 5, 6 and 7 positions.
      {{1, 8, 5}, {300, 8, 1}, {}, false},
      {{1, 8, 8}, {40, 8, 3}, {}},
      {{3, 5, 9}, {17, 5, 3}, {}},
      // 1.6M multiply-adds: on 2 threads split by output channels.
      {{1, 256, 4}, {512, 256, 3}, attrs_of({{"pads", Dims{1, 1}}})},
  };
}

TEST(CpuConvSmall, OneDimensional) {
  for (const Case& c : one_d_cases())
    for (After a :
         {After::kNone, After::kRelu, After::kClip, After::kSigmoid, After::kAddRelu, After::kTile})
      check(c, a);
}

TEST(CpuConvSmall, TwoDimensional) {
  const std::vector<Case> cases = {
      // 64 input channels (the blocked kernel would apply) and 74K weights.
      {{1, 64, 2, 2}, {128, 64, 3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}})},
      {{2, 6, 5, 5}, {24, 6, 3, 3}, attrs_of({{"strides", Dims{2, 2}}}), false},
      {{1, 5, 9, 9},
       {20, 5, 3, 3},
       attrs_of({{"strides", Dims{4, 4}}, {"dilations", Dims{2, 2}}, {"pads", Dims{1, 0, 2, 1}}})},
      {{1, 6, 2, 4}, {10, 6, 1, 1}, {}},  // 8 positions, 1x1
      {{1, 16, 3, 3}, {40, 8, 3, 3}, attrs_of({{"group", int64_t{2}}, {"strides", Dims{2, 2}}})},
      // 1x1 input, 8 of 9 taps in the padding: the blocked kernel, which skips them, where it
      // applies (small_output_wins); the generic ISA has none
      {{1, 64, 1, 1}, {128, 64, 3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}}), true, false, true},
  };
  for (const Case& c : cases)
    for (After a : {After::kNone, After::kRelu, After::kAddRelu, After::kTile}) check(c, a);
}

// Planes beyond small_output_wins' rule and depthwise convs (their own kernel) do not take the
// small-output kernel.
TEST(CpuConvSmall, LargerPlanesAndDepthwiseDecline) {
  Case big{
      {1, 16, 4, 4}, {40, 8, 1, 3}, attrs_of({{"group", int64_t{2}}, {"pads", Dims{0, 1, 0, 1}}})};
  big.small = false;  // 16 positions
  check(big, After::kRelu);
  Case wide{{1, 6, 25}, {10, 6, 1}, {}};
  wide.small = false;  // 25 positions in a row
  // A 2-D window on a tiny plane with a channel block of inputs or more and few weights: the
  // blocked kernel (not on the generic ISA, which has none).
  Case blocked{{1, 32, 2, 2}, {48, 32, 3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}})};
  blocked.small = false;
  blocked.generic_small = true;
  check(blocked, After::kRelu);
  check(wide, After::kNone);
  Case dw{
      {1, 16, 2, 2}, {16, 1, 3, 3}, attrs_of({{"group", int64_t{16}}, {"pads", Dims{1, 1, 1, 1}}})};
  dw.small = false;
  check(dw, After::kRelu);
  Case dw1{{1, 8, 3}, {16, 1, 3}, attrs_of({{"group", int64_t{8}}})};  // 1-D, multiplier 2
  dw1.small = false;
  check(dw1, After::kNone);
}

// A plane known only at run time (Silero VAD's convs inside its If: [?, C, ?]): a run whose
// output has at most kSmallConvRow positions takes the small-output kernel (its weights made
// from the packed ones on first use), a wider one the implicit GEMM, in any order, on every ISA
// and 1 and 2 threads.
TEST(CpuConvSmall, PlaneChosenAtRunTime) {
  const Case c{{1, 24, 5}, {40, 24, 3}, attrs_of({{"pads", Dims{1, 1}}, {"strides", Dims{2}}})};
  Built b = build(c, After::kRelu, Shape{Dim::sym("n"), Dim(24), Dim::sym("t")});
  const int saved = num_threads();
  for (cpu::Isa isa : cpu::supported_isas()) {
    IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Executable exe = compile(b.g, {.level = 2});
      ASSERT_EQ(exe.num_steps(), 1u);
      for (Dims x : {Dims{1, 24, 5}, Dims{2, 24, 64}, Dims{1, 24, 16}, Dims{3, 24, 2}}) {
        const std::vector<Tensor> feeds = {random_tensor(x, 7 + static_cast<uint32_t>(x[2]))};
        Graph typed = b.g;
        typed.value(typed.inputs()[0]).type.shape = to_shape(x);
        expect_close(exe.run(feeds)[0], reference::run(typed, feeds)[0], k_of(c.w),
                     cat(dims_str(x), " on ", cpu::isa_name(isa), ", ", threads, " thread(s)"));
      }
    }
  }
  set_num_threads(saved);
}

// conv_small itself computes any plane, in blocks of at most 8 positions (12 -> 6 + 6, 35 ->
// 5 x 7): against the reference, with bias, groups and a residual + ReLU epilogue; and the
// packed weights unpack to W.
TEST(CpuConvSmall, KernelOnLargerPlanes) {
  struct K {
    Dims x, w;
    Attributes attrs;
  };
  for (const K& t : {K{{2, 6, 3, 4},
                       {20, 3, 3, 3},
                       attrs_of({{"group", int64_t{2}}, {"pads", Dims{1, 1, 1, 1}}})},
                     K{{1, 5, 35}, {33, 5, 3}, attrs_of({{"pads", Dims{1, 1}}})}}) {
    Graph g;
    ValueId x = g.add_input("x", {DType::kF32, to_shape(t.x)});
    ValueId w = testing::constant(g, "w", t.w, 2), bv = testing::constant(g, "b", {t.w[0]}, 3);
    ValueId y = g.add_value("y");
    g.add_node("Conv", {x, w, bv}, {y}, t.attrs, "conv");
    g.add_output(y);
    const Tensor xt = random_tensor(t.x, 1), wt = random_tensor(t.w, 2),
                 bt = random_tensor({t.w[0]}, 3);
    const Tensor conv = reference::run(g, {xt})[0];
    const Tensor r = random_tensor(conv.shape(), 9);
    Tensor want = Tensor::empty(DType::kF32, conv.shape());
    for (int64_t i = 0; i < conv.numel(); ++i)
      want.data<float>()[i] = std::max(0.0f, conv.data<float>()[i] + 0.5f * r.data<float>()[i]);
    const cpu::ConvGeometry geo = cpu::conv_geometry(t.attrs, t.x, t.w, "test");
    const int64_t kh = t.w.size() == 4 ? t.w[2] : 1;
    const Tensor packed =
        cpu::pack_small_weights(wt.data<float>(), t.w[0], t.w[1], kh, t.w.back(), geo.group);
    Tensor back = Tensor::empty(DType::kF32, t.w);
    cpu::unpack_small_weights(packed.data<float>(), t.w[0], t.w[1], kh, t.w.back(), geo.group,
                              back.data<float>());
    for (int64_t i = 0; i < wt.numel(); ++i) ASSERT_EQ(back.data<float>()[i], wt.data<float>()[i]);
    cpu::Epilogue ep;
    ep.residual = r.data<float>();
    ep.residual_scale = 0.5f;
    ep.act = cpu::Activation::kRelu;
    const int saved = num_threads();
    for (cpu::Isa isa : cpu::supported_isas()) {
      IsaScope scope(isa);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Tensor got = Tensor::empty(DType::kF32, conv.shape());
        cpu::conv_small(geo, xt.data<float>(), packed.data<float>(), bt.data<float>(),
                        got.data<float>(), ep);
        expect_close(got, want, k_of(t.w),
                     cat(dims_str(t.x), " on ", cpu::isa_name(isa), ", ", threads, " thread(s)"));
      }
    }
    set_num_threads(saved);
  }
}

// The knob conv.algo {3} puts a conv of any plane on the small-output kernel (which the plan then
// names); on a depthwise conv or with bf16 products it is a ValueError.
TEST(CpuConvSmall, AlgoKnob) {
  const Backend* cpu = BackendRegistry::global().find("cpu");
  auto conv = [](const Dims& x, const Dims& w, const Attributes& a) {
    Graph g;
    ValueId xv = g.add_input("x", {DType::kF32, to_shape(x)});
    ValueId y = g.add_value("y");
    g.add_node("Conv", {xv, testing::constant(g, "w", w, 2)}, {y}, a, "conv");
    g.add_output(y);
    return g;
  };
  const Graph wide = conv({1, 8, 7, 7}, {16, 8, 3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}}));
  const Executable planner = compile(wide, {.level = 2});
  EXPECT_EQ(planner.describe_step(0).find("small output"), std::string::npos);
  KernelGroup k = planner.step_group(0);
  k.knobs["conv.algo"] = {3};
  const std::unique_ptr<CompiledKernel> kernel = cpu->compile(planner.graph(), k);
  EXPECT_NE(kernel->describe().find("small output"), std::string::npos) << kernel->describe();
  const Graph dw = conv({1, 8, 3, 3}, {8, 1, 3, 3},
                        attrs_of({{"group", int64_t{8}}, {"pads", Dims{1, 1, 1, 1}}}));
  const Executable dwe = compile(dw, {.level = 2});
  KernelGroup kd = dwe.step_group(0);
  kd.knobs["conv.algo"] = {3};
  EXPECT_THROW(cpu->compile(dwe.graph(), kd), ValueError);
  const Graph bf16 =
      conv({1, 8, 2, 2}, {16, 8, 1, 1}, attrs_of({{"precision", std::string("bf16")}}));
  const Executable be = compile(bf16, {.level = 0});
  KernelGroup kb = be.step_group(0);
  kb.knobs["conv.algo"] = {3};
  EXPECT_THROW(cpu->compile(be.graph(), kb), ValueError);
  // bf16 products never take it on their own (the kernel is fp32).
  EXPECT_EQ(be.describe_step(0).find("small output"), std::string::npos) << be.describe_step(0);
}

// Times the small-output kernel against the implicit GEMM (weights packed as the Conv kernel packs
// them) on 1-D convs of 1 to 32 output positions: where kSmallConvPlane should be. Per shape and
// width, the median over 15 rounds of the mean of 40 calls, the two alternating.
TEST(CpuConvSmall, DISABLED_Crossover) {
  struct S {
    const char* name;
    int64_t c, m, k, stride;
  };
  const S shapes[] = {{"64->64 k3", 64, 64, 3, 1},
                      {"128->128 k3", 128, 128, 3, 1},
                      {"256->256 k3", 256, 256, 3, 1},
                      {"129->128 k3", 129, 128, 3, 1},
                      {"1->258 k256 s128", 1, 258, 256, 128},
                      {"32->16 k3", 32, 16, 3, 1}};
  for (const S& s : shapes) {
    for (int64_t pos : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32}) {
      const int64_t pad = s.k == 3 ? 1 : 0, width = (pos - 1) * s.stride + s.k - 2 * pad;
      const Attributes a = attrs_of({{"strides", Dims{s.stride}}, {"pads", Dims{pad, pad}}});
      const cpu::ConvGeometry g = cpu::conv_geometry(a, {1, s.c, width}, {s.m, s.c, s.k}, "bench");
      const Tensor x = random_tensor({1, s.c, width}, 1), w = random_tensor({s.m, s.c, s.k}, 2),
                   b = random_tensor({s.m}, 3);
      const std::vector<cpu::PackedA> packed =
          cpu::pack_weights(w.data<float>(), s.m, s.c, 1, s.k, 1);
      const Tensor small = cpu::pack_small_weights(w.data<float>(), s.m, s.c, 1, s.k, 1);
      Tensor y = Tensor::empty(DType::kF32, {1, s.m, g.ow});
      cpu::Epilogue ep;
      ep.act = cpu::Activation::kRelu;
      auto time = [&](auto f) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 40; ++i) f();
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                   .count() /
               40;
      };
      std::vector<double> tg, ts;
      for (int r = 0; r < 15; ++r) {
        tg.push_back(time([&] {
          cpu::conv2d(g, x.data<float>(), nullptr, b.data<float>(), y.data<float>(), ep,
                      packed.data());
        }));
        ts.push_back(time([&] {
          cpu::conv_small(g, x.data<float>(), small.data<float>(), b.data<float>(), y.data<float>(),
                          ep);
        }));
      }
      std::sort(tg.begin(), tg.end());
      std::sort(ts.begin(), ts.end());
      std::printf("%-18s %3lld positions  gemm %8.2f us  small %8.2f us  %5.2fx\n", s.name,
                  static_cast<long long>(g.ow), tg[7], ts[7], tg[7] / ts[7]);
    }
  }
}

}  // namespace
}  // namespace pto

// valid_tap_share counts, per tap, the outputs that read the input as one range: the same
// count as walking every (output, tap) pair, and no walk for a declared size of 2^40.
TEST(CpuConvSmall, ValidTapShareCountsWithoutWalking) {
  using pto::cpu::ConvGeometry;
  auto walked = [](int64_t out, int64_t in, int64_t k, int64_t s, int64_t d, int64_t p) {
    int64_t n = 0;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t t = 0; t < k; ++t) n += o * s + t * d - p >= 0 && o * s + t * d - p < in;
    return static_cast<double>(n) / static_cast<double>(std::max<int64_t>(1, out * k));
  };
  for (int64_t in : {1, 2, 3, 7, 12})
    for (int64_t k : {1, 3, 5})
      for (int64_t s : {1, 2, 3})
        for (int64_t d : {1, 2})
          for (int64_t p : {0, 1, 2, 4}) {
            const int64_t out = (in + 2 * p - d * (k - 1) - 1) / s + 1;
            if (out < 1) continue;
            ConvGeometry g;
            g.ih = in;
            g.oh = out;
            g.kh = k;
            g.sh = s;
            g.dh = d;
            g.ph = p;  // the width: 1 x 1, every tap valid
            EXPECT_DOUBLE_EQ(pto::cpu::valid_tap_share(g), walked(out, in, k, s, d, p))
                << in << " " << k << " " << s << " " << d << " " << p;
          }
  ConvGeometry huge;
  huge.ih = huge.oh = int64_t{1} << 40;
  huge.kh = 3;
  huge.ph = 1;
  EXPECT_NEAR(pto::cpu::valid_tap_share(huge), 1.0, 1e-9);
}
