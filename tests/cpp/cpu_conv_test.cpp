// The CPU Conv kernel (src/backend/cpu/conv) against the reference interpreter: single-node graphs
// compiled at level 0 must run on "cpu" and match reference::run, on every ISA and with 1 and 2
// threads; the fused epilogue (bias + residual + activation) against reference conv then plain
// loops; 3-D and float64 convs fall back to the reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/isa/isa.h"
#include "conv_test_util.h"
#include "env_guard.h"
#include "pto/executable.h"
#include "pto/parallel.h"
#include "pto/reference.h"

namespace pto {
namespace {

using cpu::IsaScope;

Tensor random_tensor(Dims shape, uint32_t seed, DType dt = DType::kF32) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Tensor t = Tensor::empty(dt, shape);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::kF32)
      t.data<float>()[i] = u(rng);
    else
      t.data<double>()[i] = u(rng);
  }
  return t;
}

struct ConvCase {
  Dims x, w;
  bool bias = false;
  Attributes attrs;
  bool weights_as_inputs = false;  // W and B graph inputs instead of initializers
};

Attributes attrs_of(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

// Pads of 1 on every side (a 3x3 conv's "same"), and the same with strides of 2: most cases here.
Attributes pads1() {
  return attrs_of({{"pads", Dims{1, 1, 1, 1}}});
}
Attributes stride2_pads1() {
  return attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}});
}
// a with `group` groups.
Attributes grouped(Attributes a, int64_t group) {
  a.set("group", group);
  return a;
}

Attributes without_precision(const Attributes& a) {
  Attributes out;
  for (const auto& [k, v] : a.all())
    if (k != "precision") out.set(k, v);
  return out;
}

struct Built {
  Graph g;
  std::vector<Tensor> feeds;
};

Built conv_graph(const ConvCase& c, DType dt = DType::kF32) {
  Built b;
  std::vector<Tensor> vals = {random_tensor(c.x, 1, dt), random_tensor(c.w, 2, dt)};
  if (c.bias) vals.push_back(random_tensor({c.w[0]}, 3, dt));
  std::vector<ValueId> ins;
  for (size_t i = 0; i < vals.size(); ++i) {
    const std::string name = "in" + std::to_string(i);
    if (i == 0 || c.weights_as_inputs) {
      ins.push_back(b.g.add_input(name, {vals[i].dtype(), to_shape(vals[i].shape())}));
      b.feeds.push_back(vals[i]);
    } else {
      ins.push_back(b.g.add_value(name));
      b.g.set_initializer(ins.back(), vals[i]);
    }
  }
  ValueId y = b.g.add_value("y");
  b.g.add_node("Conv", ins, {y}, c.attrs, "conv");
  b.g.add_output(y);
  return b;
}

using testing::expect_close;

// A conv case with bias and initializer weights, its reference output and a residual operand, for
// the tests that call the conv kernels directly with each epilogue.
struct ConvWithReference {
  Built b;
  Tensor x, want_conv, w, bias, res;
};

ConvWithReference conv_with_reference(const ConvCase& c) {
  ConvWithReference r{conv_graph(c), {}, {}, {}, {}, {}};
  r.x = r.b.feeds[0];
  r.want_conv = reference::run(r.b.g, r.b.feeds)[0];
  r.w = *r.b.g.initializer(1);
  r.bias = *r.b.g.initializer(2);
  r.res = random_tensor(r.want_conv.shape(), 7);
  return r;
}

int64_t k_of(const ConvCase& c) {
  return c.w[1] * (c.w.size() > 2 ? c.w[2] : 1) * (c.w.size() > 3 ? c.w[3] : 1);
}

// Runs the built case at level 0 on every ISA with 1 and 2 threads (the node must run on the CPU
// kernel), handing each output and what ran it to `expect`.
void run_everywhere(const Built& b, const ConvCase& c,
                    const std::function<void(const Tensor&, const std::string&)>& expect) {
  const int saved = num_threads();
  for (cpu::Isa isa : cpu::supported_isas()) {
    IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Executable exe = compile(b.g, {.level = 0});
      ASSERT_EQ(exe.node_backend(0), "cpu");
      expect(exe.run(b.feeds)[0],
             cat(c.attrs.get_string("precision", "f32"), " X ", dims_str(c.x), " W ", dims_str(c.w),
                 " on ", cpu::isa_name(isa), ", ", threads, " thread(s)",
                 cpu::has_ext(cpu::Ext::kAmxBf16) ? "" : ", no amx_bf16",
                 cpu::has_ext(cpu::Ext::kAvx512Bf16) ? "" : ", no avx512_bf16"));
    }
  }
  set_num_threads(saved);
}

// Runs the case everywhere (run_everywhere) against the reference.
void check(const ConvCase& c) {
  Built b = conv_graph(c);
  const std::vector<Tensor> want = reference::run(b.g, b.feeds);
  run_everywhere(b, c, [&](const Tensor& got, const std::string& what) {
    expect_close(got, want[0], k_of(c), what);
  });
}

// The case with bf16 products (precision="bf16") against the reference, which rounds X and W to
// bf16: with VDPBF16PS and with the extension turned off (the fp32 kernels on rounded values),
// at level 0 and at level 2; and the result differs from the fp32 conv's (the rounding happened).
// precision="bf16" (or "f16"): against the reference, which rounds X and W itself, with the
// extension that computes it (VDPBF16PS, F16C) on and off, and at level 2; and the rounding
// changed the result.
void check_reduced(ConvCase c, const std::string& precision = "bf16") {
  c.attrs.set("precision", precision);
  for (bool ext : {true, false}) {
    std::optional<cpu::ExtScope> off;
    if (!ext) off.emplace(precision == "bf16" ? cpu::Ext::kAvx512Bf16 : cpu::Ext::kF16c);
    check(c);
  }
  Built b = conv_graph(c);
  const Tensor want = reference::run(b.g, b.feeds)[0];
  const Tensor got = compile(b.g, {.level = 2}).run(b.feeds)[0];
  expect_close(got, want, k_of(c), cat("level 2, X ", dims_str(c.x), " W ", dims_str(c.w)));
  c.attrs = without_precision(c.attrs);
  Built f = conv_graph(c);
  const Tensor f32 = reference::run(f.g, f.feeds)[0];
  double diff = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    diff = std::max(diff, std::fabs(got.item_as_double(i) - f32.item_as_double(i)));
  if (got.numel() > 0 && k_of(c) >= 8) {
    EXPECT_GT(diff, 1e-4) << dims_str(c.x) << " " << dims_str(c.w);
  }
}

TEST(CpuConv, Pointwise) {
  check({{1, 20, 7, 9}, {17, 20, 1, 1}, true});
  check({{3, 9, 1, 1}, {10, 9, 1, 1}, false});
  check({{2, 8, 7, 9}, {5, 8, 1, 1}, true, attrs_of({{"strides", Dims{2, 2}}})});
  check({{1, 6, 5, 4}, {3, 6, 1, 1}, true, attrs_of({{"pads", Dims{1, 0, 0, 2}}})});
}

TEST(CpuConv, Dense3x3And7x7) {
  const Attributes pad1 = pads1();
  check({{1, 19, 9, 11}, {18, 19, 3, 3}, true, pad1});
  check({{3, 5, 9, 7},
         {7, 5, 3, 3},
         false,
         attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}})});
  check({{1, 3, 23, 21},
         {16, 3, 7, 7},
         true,
         attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{2, 2}}})});
  check({{1, 5, 1, 1}, {4, 5, 3, 3}, true, pad1});
  check({{1, 4, 7, 9}, {6, 4, 3, 3}, false});  // no padding
  // Several column blocks (K = 576 gives blocks of 256 columns), batch 3 in parallel tasks.
  check({{1, 64, 20, 20}, {8, 64, 3, 3}, true, pad1});
  check({{3, 64, 17, 19}, {5, 64, 3, 3}, true, pad1});
}

// Strides 3 to 8 (im2col's permuted copies: 16 outputs a step, the loads stopping at the last
// input used) and 9 (element by element): output rows shorter than a step, a step and a tail,
// several steps; patch embeddings (kernel = stride) and padded stems; a depthwise conv.
TEST(CpuConv, LargeStrides) {
  for (int64_t s = 3; s <= 9; ++s)
    for (int64_t w : {5 * s, 16 * s + 2, 41 * s + 1}) {
      SCOPED_TRACE(::testing::Message() << "stride " << s << ", width " << w);
      check({{1, 3, 2 * s + 1, w}, {5, 3, s, s}, true, attrs_of({{"strides", Dims{s, s}}})});
      check({{1, 2, 3 * s, w},
             {4, 2, 7, 5},
             true,
             attrs_of({{"pads", Dims{3, 2, 3, 2}}, {"strides", Dims{s, s}}})});
    }
  check({{1, 6, 9, 70},
         {6, 1, 3, 3},
         false,
         attrs_of({{"group", int64_t{6}}, {"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{3, 4}}})});
}

// Patch embeddings wider than 8 (ViT's 16x16/16, DINOv2's 14x14/14): im2col transposes each input
// row's patches into the kernel row's col rows. Input sizes the patches do not divide (the rest is
// never read), batch 2, a plane of 196 patches, and a K split into several column blocks.
TEST(CpuConv, PatchEmbeddings) {
  const Attributes s16 = attrs_of({{"strides", Dims{16, 16}}});
  const Attributes s14 = attrs_of({{"strides", Dims{14, 14}}});
  check({{2, 3, 64, 48}, {8, 3, 16, 16}, true, s16});
  check({{1, 3, 58, 59}, {12, 3, 14, 14}, true, s14});
  check({{1, 3, 224, 224}, {20, 3, 16, 16}, true, s16});
  check({{1, 16, 48, 32}, {5, 16, 16, 16}, false, s16});
}

// Stride-1 outputs at least 16 wide take the shifted path (sgemm reading shifted rows of a padded
// copy of the input, no col): pads, dilation, asymmetric pads, groups, batch, several row blocks.
// (Those on 4 input channels or fewer take the stem path unless PTO_CONV_STEM=0.)
TEST(CpuConv, ShiftedRows) {
  testing::EnvGuard no_stem("PTO_CONV_STEM", "0");
  check({{1, 8, 30, 30}, {16, 8, 3, 3}, true, attrs_of({{"pads", Dims{1, 1, 1, 1}}})});
  check({{1, 4, 40, 40},
         {6, 4, 3, 3},
         false,
         attrs_of({{"dilations", Dims{2, 2}}, {"pads", Dims{2, 2, 2, 2}}})});
  check({{1, 3, 33, 33}, {7, 3, 3, 3}, true, attrs_of({{"pads", Dims{0, 1, 2, 0}}})});
  check({{2, 8, 24, 24},
         {6, 4, 3, 3},
         true,
         attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"group", int64_t{2}}})});
  check({{1, 2, 70, 66}, {3, 2, 5, 5}, true, attrs_of({{"pads", Dims{2, 2, 2, 2}}})});
  check({{1, 5, 40, 36}, {4, 5, 3, 3}, false, {}, true});  // weights not prepared
}

// Convs on 1-4 input channels with outputs at least 16 wide (a network's first conv) take the
// stem path: each output row one GEMM macro-block of the phase-split input's tap rows, written
// into Y with the epilogue per micro-tile. Strides 1-4 with overlapping windows, 7x7 and 5x5,
// dilation, asymmetric pads, 1 to 4 channels, output channels around the register block (5, 6,
// 7, 13, 32), outputs 16 and 17 wide (a masked last vector), batch 2, and weights given at run
// time (packed per call). Grouped convs keep the shifted / im2col paths.
TEST(CpuConv, StemRows) {
  check({{1, 3, 64, 70},
         {32, 3, 3, 3},
         true,
         attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}})});
  check({{1, 3, 40, 46},
         {13, 3, 7, 7},
         true,
         attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{2, 2}}})});
  check({{1, 3, 68, 72},
         {16, 3, 7, 7},
         false,
         attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{4, 4}}})});
  check(
      {{1, 4, 30, 40},
       {7, 4, 5, 5},
       true,
       attrs_of({{"dilations", Dims{2, 2}}, {"pads", Dims{2, 4, 3, 1}}, {"strides", Dims{1, 2}}})});
  check({{1, 1, 20, 16}, {5, 1, 3, 3}, true, attrs_of({{"pads", Dims{1, 1, 1, 1}}})});
  check({{1, 2, 19, 17}, {6, 2, 3, 3}, false, attrs_of({{"pads", Dims{0, 1, 0, 1}}})});
  check({{2, 3, 34, 36},
         {8, 3, 3, 3},
         true,
         attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}})});
  check({{1, 3, 35, 35}, {7, 3, 3, 3}, true, attrs_of({{"strides", Dims{2, 2}}}), true});
  // A 1-D front end on raw audio (wav2vec2's: kernel 10, stride 5) as a [1, W] plane.
  check({{2, 1, 1, 403}, {24, 1, 1, 10}, true, attrs_of({{"strides", Dims{1, 5}}})});
}

// PTO_CONV_STEM takes 0 (the stem on the shifted / im2col paths: still the reference's result) or
// 1; any other value is an error that names the variable, not a silent default.
TEST(CpuConv, StemSwitch) {
  const ConvCase c{{1, 3, 34, 36},
                   {8, 3, 3, 3},
                   true,
                   attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}})};
  {
    testing::EnvGuard off("PTO_CONV_STEM", "0");
    check(c);
  }
  testing::EnvGuard bad("PTO_CONV_STEM", "yes");
  Built b = conv_graph(c);
  try {
    compile(b.g, {.level = 0}).run(b.feeds);
    FAIL() << "PTO_CONV_STEM=yes was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("PTO_CONV_STEM='yes': expected 0 or 1"), std::string::npos)
        << e.what();
  }
}

TEST(CpuConv, DilationsAndAsymmetricPads) {
  check({{1, 6, 11, 13},
         {5, 6, 3, 3},
         true,
         attrs_of({{"dilations", Dims{2, 2}}, {"pads", Dims{2, 2, 2, 2}}})});
  check(
      {{2, 3, 10, 12},
       {4, 3, 3, 2},
       false,
       attrs_of({{"dilations", Dims{1, 3}}, {"pads", Dims{1, 0, 0, 2}}, {"strides", Dims{2, 3}}})});
}

TEST(CpuConv, AutoPad) {
  for (const char* mode : {"SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET"}) {
    SCOPED_TRACE(mode);
    for (int64_t s : {1, 2}) {
      const Attributes a = attrs_of({{"auto_pad", std::string(mode)}, {"strides", Dims{s, s}}});
      check({{1, 4, 7, 8}, {6, 4, 3, 3}, true, a});
      check({{2, 6, 8, 7}, {6, 1, 3, 3}, false, [&] {
               Attributes d = a;
               d.set("group", int64_t{6});
               return d;
             }()});
    }
  }
}

TEST(CpuConv, Grouped) {
  check({{1, 8, 7, 9},
         {6, 4, 3, 3},
         false,
         attrs_of({{"group", int64_t{2}}, {"pads", Dims{1, 1, 1, 1}}})});
  check({{3, 12, 6, 5},
         {8, 3, 3, 3},
         true,
         attrs_of({{"group", int64_t{4}}, {"strides", Dims{2, 1}}})});
  check({{1, 8, 5, 5}, {8, 2, 1, 1}, true, attrs_of({{"group", int64_t{4}}})});
}

TEST(CpuConv, Depthwise) {
  const Attributes pad1 = pads1();
  auto dw = [](Attributes a, int64_t g) {
    a.set("group", g);
    return a;
  };
  check({{1, 19, 9, 21}, {19, 1, 3, 3}, true, dw(pad1, 19)});  // 3x3 s1
  check({{3, 16, 13, 34},
         {16, 1, 3, 3},
         false,  // 3x3 s2, batch 3
         dw(attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}}), 16)});
  check({{1, 7, 11, 40},
         {7, 1, 5, 5},
         true,  // 5x5
         dw(attrs_of({{"pads", Dims{2, 2, 2, 2}}}), 7)});
  check({{1, 4, 7, 9}, {8, 1, 3, 3}, true, dw(pad1, 4)});  // channel multiplier 2
  check({{2, 5, 17, 19},
         {5, 1, 3, 4},
         true,  // dilated, strided, asymmetric
         dw(attrs_of(
                {{"dilations", Dims{2, 3}}, {"pads", Dims{0, 2, 1, 3}}, {"strides", Dims{3, 2}}}),
            5)});
  check({{1, 3, 1, 1}, {3, 1, 3, 3}, false, dw(pad1, 3)});  // 1x1 input
  check({{1, 33, 2, 70}, {33, 1, 1, 7}, true, dw(attrs_of({{"pads", Dims{0, 3, 0, 2}}}), 33)});
}

TEST(CpuConv, OneDimensional) {
  check({{2, 6, 17}, {5, 6, 3}, true, attrs_of({{"pads", Dims{1, 1}}, {"strides", Dims{2}}})});
  check({{1, 6, 33}, {6, 1, 5}, false, attrs_of({{"group", int64_t{6}}, {"pads", Dims{2, 1}}})});
}

TEST(CpuConv, WeightsAsInputsAndEmpty) {
  ConvCase c{{2, 5, 6, 7}, {4, 5, 3, 3}, true, attrs_of({{"pads", Dims{1, 1, 1, 1}}})};
  c.weights_as_inputs = true;
  check(c);
  check({{0, 4, 5, 5}, {3, 4, 3, 3}, true});  // no images
  check({{1, 0, 5, 5}, {3, 0, 3, 3}, true});  // no input channels: the output is the bias
}

TEST(CpuConv, DeclinesThreeDAndFloat64) {
  Built b3 = conv_graph({{1, 2, 4, 4, 4}, {3, 2, 3, 3, 3}, true});
  EXPECT_EQ(compile(b3.g, {.level = 0}).node_backend(0), "reference");
  Built b64 = conv_graph({{1, 2, 5, 5}, {3, 2, 3, 3}, true}, DType::kF64);
  EXPECT_EQ(compile(b64.g, {.level = 0}).node_backend(0), "reference");
}

TEST(CpuConv, GeometryErrors) {
  Attributes none;
  EXPECT_THROW(
      cpu::conv_geometry(attrs_of({{"group", int64_t{3}}}), {1, 4, 5, 5}, {2, 2, 3, 3}, "conv"),
      ValueError);
  EXPECT_THROW(cpu::conv_geometry(none, {1, 4, 5, 5}, {2, 3, 3, 3}, "conv"), ValueError);
  EXPECT_THROW(cpu::conv_geometry(none, {1, 4, 2, 2}, {2, 4, 3, 3}, "conv"), ValueError);
  EXPECT_THROW(cpu::conv_geometry(none, {1, 4, 5, 5, 5}, {2, 4, 3, 3, 3}, "conv"), ValueError);
}

// The geometries the reduced-precision conv tests run: 1x1 (the input as B, strided, padded),
// 3x3 and 7x7 with strides and pads, shifted rows (the GEMM packs them into pairs, reading them
// through b_rows), a small plane the fp32 kernel runs blocked (here the implicit GEMM), several
// column blocks, groups, depthwise (with `depthwise`), 1-D, dilations, weights as inputs; K and
// the output plane with tails against the GEMM's blocks (K odd: a half pair); then `random`
// random ones from `seed` (channels, planes, kernels, strides, pads and groups with tails).
std::vector<ConvCase> product_geometries(bool depthwise, int random, uint32_t seed) {
  const Attributes pad1 = pads1();
  const Attributes s2p1 = stride2_pads1();
  std::vector<ConvCase> cases = {
      {{1, 20, 7, 9}, {17, 20, 1, 1}, true},
      {{2, 9, 5, 3}, {10, 9, 1, 1}, false},  // K odd
      {{2, 8, 7, 9}, {5, 8, 1, 1}, true, attrs_of({{"strides", Dims{2, 2}}})},
      {{1, 6, 5, 4}, {3, 6, 1, 1}, true, attrs_of({{"pads", Dims{1, 0, 0, 2}}})},
      {{1, 19, 9, 11}, {18, 19, 3, 3}, true, pad1},
      {{3, 5, 9, 7}, {7, 5, 3, 3}, false, s2p1},
      {{1, 3, 23, 21},
       {16, 3, 7, 7},
       true,
       attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{2, 2}}})},
      {{1, 64, 20, 20}, {8, 64, 3, 3}, true, pad1},  // several column blocks
      {{1, 8, 30, 30}, {16, 8, 3, 3}, true, pad1},   // shifted: the rows packed into pairs
      {{2, 24, 7, 7}, {40, 24, 3, 3}, true, pad1},   // blocked in fp32
      {{1, 6, 11, 13},
       {5, 6, 3, 3},
       true,
       attrs_of({{"dilations", Dims{2, 2}}, {"pads", Dims{2, 2, 2, 2}}})},
      {{3, 12, 6, 5},
       {8, 3, 3, 3},
       true,
       attrs_of({{"group", int64_t{4}}, {"strides", Dims{2, 1}}})},
      {{2, 6, 17}, {5, 6, 3}, true, attrs_of({{"pads", Dims{1, 1}}, {"strides", Dims{2}}})}};
  if (depthwise)
    cases.push_back({{1, 19, 9, 21},
                     {19, 1, 3, 3},
                     true,
                     attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"group", int64_t{19}}})});
  ConvCase inputs{{2, 5, 6, 7}, {4, 5, 3, 3}, true, pad1};
  inputs.weights_as_inputs = true;
  cases.push_back(inputs);
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < random; ++i) {
    const int64_t k = std::array<int64_t, 3>{1, 3, 7}[pick(0, 2)];
    const int64_t s = pick(1, 2), p = pick(0, k / 2), group = pick(1, 3);
    const int64_t c = group * pick(2, 9), m = group * pick(1, 13);
    cases.push_back(
        {{pick(1, 2), c, pick(k, 20), pick(k, 20)},
         {m, c / group, k, k},
         pick(0, 1) == 1,
         attrs_of({{"pads", Dims{p, p, p, p}}, {"strides", Dims{s, s}}, {"group", group}})});
  }
  return cases;
}

// bf16 products on every geometry above, depthwise included (rounded copies, fp32 kernel).
TEST(CpuConvBf16, MatchesTheRoundedReference) {
  const std::vector<ConvCase> cases = product_geometries(true, 12, 17);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cat("case ", i));
    check_reduced(cases[i]);
  }
}

// precision="bf16x3" (ConvPrecision under "high"): against the reference's three products of
// X's and W's bf16 heads and tails, to fp32 accumulation (5e-7 + 1.5e-8 K relative to values
// past 1: far inside the split's own ~2^-16), on every ISA with 1 and 2 threads, with AMX (the
// fused tile kernel), without it (VDPBF16PS pairs) and without AVX512_BF16 (the fp32 kernels, three
// passes), and at level 2 (the NCHW kernel, never the blocked one); and the result is further from
// the fp32 conv's than that (the operands were split, not used whole).
void check_split(ConvCase c) {
  c.attrs.set("precision", std::string("bf16x3"));
  Built b = conv_graph(c);
  const Tensor want = reference::run(b.g, b.feeds)[0];
  const double tol = 5e-7 + 1.5e-8 * static_cast<double>(k_of(c));
  auto expect_within = [&](const Tensor& got, const std::string& what) {
    ASSERT_EQ(got.shape(), want.shape()) << what;
    int64_t bad = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const double d = std::fabs(got.item_as_double(i) - want.item_as_double(i));
      if (!(d <= tol * std::max(1.0, std::fabs(want.item_as_double(i)))) && bad++ < 3)
        ADD_FAILURE() << what << ": element " << i << " is " << got.item_as_double(i)
                      << ", reference " << want.item_as_double(i);
    }
    EXPECT_EQ(bad, 0) << what;
  };
  for (std::optional<cpu::Ext> off_ext :
       {std::optional<cpu::Ext>(), std::optional(cpu::Ext::kAmxBf16),
        std::optional(cpu::Ext::kAvx512Bf16)}) {
    std::optional<cpu::ExtScope> off;
    if (off_ext) off.emplace(*off_ext);
    run_everywhere(b, c, expect_within);
  }
  const Tensor got = compile(b.g, {.level = 2}).run(b.feeds)[0];
  expect_within(got, cat("bf16x3 level 2, X ", dims_str(c.x), " W ", dims_str(c.w)));
  c.attrs = without_precision(c.attrs);
  Built f = conv_graph(c);
  const Tensor f32 = reference::run(f.g, f.feeds)[0];
  double diff = 0;
  for (int64_t i = 0; i < got.numel(); ++i)
    diff = std::max(diff, std::fabs(got.item_as_double(i) - f32.item_as_double(i)));
  if (got.numel() >= 64 && k_of(c) >= 16) {
    EXPECT_GT(diff, 4 * tol) << dims_str(c.x) << " " << dims_str(c.w);
  }
}

// bf16x3 products on the same geometries (not the depthwise one). A depthwise conv marked by hand
// (ConvPrecision never marks one) has no bf16x3 CPU kernel: it runs on the reference.
TEST(CpuConvBf16x3, MatchesTheSplitReference) {
  const std::vector<ConvCase> cases = product_geometries(false, 6, 23);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cat("case ", i));
    check_split(cases[i]);
  }
  ConvCase depthwise{{1, 19, 9, 21},
                     {19, 1, 3, 3},
                     true,
                     attrs_of({{"pads", Dims{1, 1, 1, 1}},
                               {"group", int64_t{19}},
                               {"precision", std::string("bf16x3")}})};
  Built d = conv_graph(depthwise);
  Executable exe = compile(d.g, {.level = 0});
  EXPECT_EQ(exe.node_backend(0), "reference");
  const Tensor got = exe.run(d.feeds)[0], want = reference::run(d.g, d.feeds)[0];
  for (int64_t i = 0; i < want.numel(); ++i)
    ASSERT_EQ(got.item_as_double(i), want.item_as_double(i)) << i;
}

// f16 products take the same paths (operands rounded to IEEE half while packed, fp32 kernels):
// pointwise, 3x3 on the shifted and im2col paths, 7x7 strided, grouped and a depthwise conv
// marked by hand (rounded copies).
TEST(CpuConvF16, MatchesTheRoundedReference) {
  const Attributes pad1 = pads1();
  check_reduced({{1, 20, 7, 9}, {17, 20, 1, 1}, true}, "f16");
  check_reduced({{1, 8, 30, 30}, {16, 8, 3, 3}, true, pad1}, "f16");
  check_reduced({{3, 5, 9, 7},
                 {7, 5, 3, 3},
                 false,
                 attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 2}}})},
                "f16");
  check_reduced({{1, 3, 23, 21},
                 {16, 3, 7, 7},
                 true,
                 attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{2, 2}}})},
                "f16");
  check_reduced({{3, 12, 6, 5},
                 {8, 3, 3, 3},
                 true,
                 attrs_of({{"group", int64_t{4}}, {"strides", Dims{2, 1}}})},
                "f16");
  check_reduced({{1, 19, 9, 21},
                 {19, 1, 3, 3},
                 true,
                 attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"group", int64_t{19}}})},
                "f16");
}

// conv2d's epilogue (the fusion entry point): y = relu(conv + bias + 0.5 residual), against the
// reference conv with bias followed by plain loops.
TEST(CpuConv, FusedResidualAndRelu) {
  const std::vector<ConvCase> cases = {
      {{2, 6, 9, 7}, {5, 6, 3, 3}, true, attrs_of({{"pads", Dims{1, 1, 1, 1}}})},
      {{2, 6, 20, 24}, {5, 6, 3, 3}, true, attrs_of({{"pads", Dims{1, 1, 1, 1}}})},  // shifted
      {{1, 16, 8, 8}, {8, 16, 1, 1}, true, {}},
      {{2, 8, 9, 11},
       {8, 1, 3, 3},
       true,
       attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"group", int64_t{8}}})},
  };
  const int saved = num_threads();
  for (const ConvCase& c : cases) {
    const ConvWithReference r = conv_with_reference(c);
    const Tensor &x = r.x, &want_conv = r.want_conv, &w = r.w, &bias = r.bias, &res = r.res;
    Tensor want = Tensor::empty(DType::kF32, want_conv.shape());
    for (int64_t i = 0; i < want.numel(); ++i)
      want.data<float>()[i] = std::max(
          0.0f, static_cast<float>(want_conv.item_as_double(i)) + 0.5f * res.data<float>()[i]);
    const cpu::ConvGeometry g = cpu::conv_geometry(c.attrs, c.x, c.w, "conv");
    cpu::Epilogue ep;
    ep.residual = res.data<float>();
    ep.residual_scale = 0.5f;
    ep.act = cpu::Activation::kRelu;
    for (cpu::Isa isa : cpu::supported_isas()) {
      IsaScope scope(isa);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Tensor y = Tensor::empty(DType::kF32, want.shape());
        cpu::conv2d(g, x.data<float>(), w.data<float>(), bias.data<float>(), y.data<float>(), ep);
        expect_close(y, want, c.w[1] * 9, cat(dims_str(c.x), " on ", cpu::isa_name(isa)));
      }
    }
  }
  set_num_threads(saved);
}

// PTO_DEPTHWISE_FLAT (or another variable) for the scope of a test (null: unset).
class DepthwiseFlatEnv {
 public:
  explicit DepthwiseFlatEnv(const char* value, const char* name = "PTO_DEPTHWISE_FLAT")
      : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~DepthwiseFlatEnv() {
    if (had_)
      setenv(name_, saved_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

// The depthwise conv's flat kernel (no padded plane; conv_depthwise_impl.h) and the padded-plane
// kernel (PTO_DEPTHWISE_FLAT=0) against the reference conv, its epilogues against plain loops:
// planes 5..30 (odd and even, square and not), strides 1 and 2, pads 0, 1, 2 (symmetric and
// not), kernels 3 and 5 (and 1x3), dilation 2, channel multiplier 2, batch 2, with none, Relu,
// Clip and residual Add + Relu after it, every ISA, 1 and 2 threads.
TEST(CpuConv, DepthwiseFlatKernel) {
  struct Case {
    int64_t n, c, h, w, mult, kh, kw, s, d;
    Dims pads;
  };
  std::vector<Case> cases = {
      {1, 19, 5, 5, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {2, 7, 6, 6, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 9, 7, 7, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {1, 5, 11, 13, 1, 5, 5, 1, 1, {2, 2, 2, 2}},
      {1, 6, 12, 12, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {2, 4, 24, 24, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 3, 30, 29, 1, 5, 5, 2, 1, {2, 2, 2, 2}},
      {1, 5, 17, 19, 1, 3, 3, 1, 2, {2, 2, 2, 2}},
      {1, 4, 9, 9, 2, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 4, 10, 8, 2, 3, 3, 2, 1, {1, 1, 1, 1}},
      {1, 6, 9, 10, 1, 3, 3, 2, 1, {0, 0, 1, 1}},
      {1, 5, 8, 9, 1, 3, 3, 1, 1, {0, 0, 0, 0}},
      {1, 3, 13, 14, 1, 3, 3, 1, 1, {2, 2, 2, 2}},
      {1, 7, 15, 16, 1, 1, 3, 1, 1, {0, 1, 0, 1}},
      {1, 8, 3, 3, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {2, 17, 28, 28, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {1, 5, 26, 27, 1, 5, 5, 1, 1, {2, 2, 2, 2}},
      {1, 4, 21, 20, 1, 3, 3, 2, 2, {2, 2, 2, 2}},
      {1, 3, 9, 70, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {2, 3, 8, 67, 1, 5, 5, 2, 1, {2, 2, 2, 2}},
      // AVX-512's blocks of 12 vectors, then 4, then the tail: 12, 13 and 16 vectors a plane.
      {1, 3, 8, 24, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {2, 3, 13, 16, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 3, 32, 32, 1, 5, 5, 2, 1, {2, 2, 2, 2}},
      // Four planes at a time (flat_quad, AVX-512 vectors): 4 vectors a plane (7x7 and 8x8), 4 and
      // a tail of 1, 2 or 3, 12 and a tail of 1 or 3, 12 and 4; channel counts that leave 1-3
      // planes one by one.
      {1, 11, 7, 7, 1, 5, 5, 1, 1, {2, 2, 2, 2}},
      {1, 10, 8, 8, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {2, 9, 7, 11, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 8, 9, 10, 1, 5, 5, 1, 1, {2, 2, 2, 2}},
      {1, 13, 7, 16, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 9, 14, 14, 1, 5, 5, 1, 1, {2, 2, 2, 2}},
      {1, 6, 15, 15, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 7, 16, 16, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      // The strided rows kernel (AVX-512: input rows of at most 32 floats, output rows of 6 to
      // 16, 12 to 16 for 5x5): rows of 32 and 17, stride 3, a 1x3 kernel, asymmetric pads, 4
      // planes at a time and the rest one by one (5 and 7 channels).
      {1, 5, 11, 32, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {2, 4, 10, 17, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {1, 4, 18, 17, 1, 3, 3, 3, 1, {1, 1, 1, 1}},
      {1, 3, 9, 13, 1, 1, 3, 2, 1, {0, 1, 0, 1}},
      {2, 7, 14, 14, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      // Wider rows in chunks of 15 (3x3) or 14 (5x5) outputs: 28, 29, 43 and 120 wide, a
      // trailing pad of 2, stride 3 (chunks of 10).
      {1, 5, 7, 56, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {2, 3, 6, 57, 1, 5, 5, 2, 1, {2, 2, 2, 2}},
      {1, 4, 5, 85, 1, 3, 3, 2, 1, {1, 0, 1, 2}},
      {1, 2, 4, 240, 1, 3, 3, 2, 1, {1, 1, 1, 1}},
      {1, 3, 5, 90, 1, 3, 3, 3, 1, {1, 1, 1, 1}},
      // The gapped kernel (AVX-512, stride 1, "same" sizes, 3x3 and 5x5): rows of 12 to 56
      // (1-4 vectors, the last masked or whole), 1 to 30 rows (blocks of 12 or 5 and the
      // rest), asymmetric pads (the gap is the larger side), channel multiplier 2.
      {1, 3, 12, 15, 1, 3, 3, 1, 1, {0, 0, 2, 2}},
      {1, 4, 10, 20, 1, 5, 5, 1, 1, {1, 3, 3, 1}},
      {2, 3, 30, 32, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 5, 1, 48, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 6, 14, 14, 2, 5, 5, 1, 1, {2, 2, 2, 2}},
      {1, 2, 11, 56, 1, 3, 3, 1, 1, {1, 1, 1, 1}},
      {1, 3, 23, 12, 1, 5, 5, 1, 1, {2, 2, 2, 2}},
      // 7x7 (ConvNeXt's): the weights a column at a time, blocks of up to 14 rows: rows of 7 to
      // 56 (one lane in three used, a masked tail, three whole vectors and a tail), 1 to 30
      // rows (one block, 15 as 8 + 7, 30 as 10 + 10 + 10), asymmetric pads, multiplier 2.
      {1, 5, 7, 7, 1, 7, 7, 1, 1, {3, 3, 3, 3}},
      {2, 3, 15, 17, 1, 7, 7, 1, 1, {3, 3, 3, 3}},
      {1, 4, 30, 56, 1, 7, 7, 1, 1, {3, 3, 3, 3}},
      {1, 3, 1, 14, 1, 7, 7, 1, 1, {3, 3, 3, 3}},
      {1, 3, 14, 14, 1, 7, 7, 1, 1, {1, 2, 5, 4}},
      {1, 2, 9, 12, 2, 7, 7, 1, 1, {3, 3, 3, 3}},
  };
  std::mt19937 rng(5);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int i = 0; i < 10; ++i) {  // random planes 5..30, stride 1 or 2, pads 0..2, kernel 3/5
    const int64_t k = pick(0, 1) ? 5 : 3, p = pick(0, 2);
    cases.push_back({pick(1, 2), pick(1, 12), pick(5, 30), pick(5, 30), 1, k, k, pick(1, 2), 1,
                     Dims{p, p, pick(0, 2), p}});
  }
  const int saved = num_threads();
  int flat = 0, rows = 0, gapped = 0, gapped7 = 0;
  const std::vector<cpu::Isa> isas = cpu::supported_isas();
  const bool has512 = std::find(isas.begin(), isas.end(), cpu::Isa::kAvx512) != isas.end();
  for (const Case& t : cases) {
    const ConvCase c{{t.n, t.c, t.h, t.w},
                     {t.c * t.mult, 1, t.kh, t.kw},
                     true,
                     attrs_of({{"pads", t.pads},
                               {"strides", Dims{t.s, t.s}},
                               {"dilations", Dims{t.d, t.d}},
                               {"group", t.c}})};
    const ConvWithReference r = conv_with_reference(c);
    const Tensor &x = r.x, &want_conv = r.want_conv, &w = r.w, &bias = r.bias, &res = r.res;
    const cpu::ConvGeometry g = cpu::conv_geometry(c.attrs, c.x, c.w, "conv");
    flat += cpu::depthwise_flat_applies(g);
    if (has512) {
      IsaScope scope(cpu::Isa::kAvx512);
      rows += cpu::depthwise_rows_applies(g);
      gapped += cpu::depthwise_gapped_applies(g);
      gapped7 += cpu::depthwise_gapped_applies(g) && t.kh == 7;
    }
    for (int e = 0; e < 4; ++e) {  // none, Relu, Clip, residual Add + Relu
      cpu::Epilogue ep;
      if (e == 1) ep.act = cpu::Activation::kRelu;
      if (e == 2) ep.act = cpu::Activation::kClip, ep.lo = -0.5f, ep.hi = 0.75f;
      if (e == 3) ep.residual = res.data<float>(), ep.act = cpu::Activation::kRelu;
      Tensor want = Tensor::empty(DType::kF32, want_conv.shape());
      for (int64_t j = 0; j < want.numel(); ++j) {
        float v = static_cast<float>(want_conv.item_as_double(j));
        if (e == 3) v += res.data<float>()[j];
        if (e == 1 || e == 3) v = std::max(0.0f, v);
        if (e == 2) v = std::min(std::max(v, -0.5f), 0.75f);
        want.data<float>()[j] = v;
      }
      // unset: the flat kernel (and the rows or gapped kernel where they apply); "0": the
      // padded-plane kernel; "rows 0": the flat kernel with its split where the rows kernel
      // would apply; "gapped 0": the masked flat kernel where the gapped one would apply.
      for (const char* env : {static_cast<const char*>(nullptr), "0", "rows 0", "gapped 0"}) {
        const std::string e_str = env ? env : "";
        const bool rows_off = e_str == "rows 0", gapped_off = e_str == "gapped 0";
        DepthwiseFlatEnv scope_env(rows_off || gapped_off ? nullptr : env);
        DepthwiseFlatEnv scope_rows(rows_off ? "0" : nullptr, "PTO_DEPTHWISE_ROWS");
        DepthwiseFlatEnv scope_gapped(gapped_off ? "0" : nullptr, "PTO_DEPTHWISE_GAPPED");
        for (cpu::Isa isa : cpu::supported_isas()) {
          IsaScope scope(isa);
          for (int threads : {1, 2}) {
            set_num_threads(threads);
            Tensor y = Tensor::empty(DType::kF32, want.shape());
            cpu::conv2d(g, x.data<float>(), w.data<float>(), bias.data<float>(), y.data<float>(),
                        ep);
            expect_close(
                y, want, t.kh * t.kw,
                cat(dims_str(c.x), " k", t.kh, "x", t.kw, " s", t.s, " d", t.d, " pads ",
                    dims_str(t.pads), " mult ", t.mult, " epilogue ", e, " flat ",
                    env ? env : "unset", " on ", cpu::isa_name(isa), ", ", threads, " thread(s)"));
          }
        }
      }
    }
  }
  set_num_threads(saved);
  EXPECT_GE(flat, 20);  // most cases take the flat kernel; the rest the padded-plane one
  if (has512) {
    EXPECT_GE(rows, 8);     // strided rows of <= 16 outputs
    EXPECT_GE(gapped, 16);  // stride 1, "same" sizes, 3x3 and 5x5 rows that fill vectors, 7x7
    EXPECT_EQ(gapped7, 6);  // every 7x7 case above
  }
}

TEST(CpuConv, DepthwiseFlatEnvIsChecked) {
  DepthwiseFlatEnv scope_env("yes");
  const ConvCase c{{1, 4, 6, 6},
                   {4, 1, 3, 3},
                   false,
                   attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"group", int64_t{4}}})};
  const cpu::ConvGeometry g = cpu::conv_geometry(c.attrs, c.x, c.w, "conv");
  std::vector<float> x(144, 1.0f), w(36, 1.0f), y(144);
  EXPECT_THROW(cpu::conv2d(g, x.data(), w.data(), nullptr, y.data()), ValueError);
  // Where the flat kernel applies: "same" pads (any stride) on planes up to 2^16 positions.
  auto applies = [](Dims x, int64_t k, int64_t s, int64_t p) {
    const Attributes a =
        attrs_of({{"pads", Dims{p, p, p, p}}, {"strides", Dims{s, s}}, {"group", x[1]}});
    return cpu::depthwise_flat_applies(cpu::conv_geometry(a, x, {x[1], 1, k, k}, "conv"));
  };
  EXPECT_TRUE(applies({1, 4, 6, 6}, 3, 1, 1));
  EXPECT_TRUE(applies({1, 4, 7, 7}, 3, 2, 1));
  EXPECT_TRUE(applies({1, 4, 13, 13}, 5, 2, 2));
  EXPECT_FALSE(applies({1, 4, 8, 8}, 3, 1, 0));  // pads 0: input columns no output reads
  EXPECT_FALSE(applies({1, 4, 9, 9}, 3, 2, 0));
  EXPECT_TRUE(applies({1, 4, 256, 256}, 3, 1, 1));
  EXPECT_FALSE(applies({1, 4, 257, 256}, 3, 1, 1));  // past 2^16 positions
}

// The taps kernel (bf16 products on AMX tiles, B read from planes of channel pairs:
// conv_amx_avx512.cpp) on convs it takes: input channels padded to a chunk of 32 (33, 48),
// output channels past one panel of 32 (40, 70), 5x5 and 1x3 kernels, no pads and asymmetric
// ones, batch 2, planes from 7x7 (the threads split the output channels) to 20x40 (they split the
// rows), strides of 2 (the planes split by phase, as the shifted path splits them), 1-D convs;
// folded ones (fewer than 32 input channels: the kernel's columns, and rows as fit, folded into
// the channels, strides up to 4, K shorter than a tile's); grouped ones (each panel reading the
// chunks of its groups' channels); bf16 and
// bf16x3 products (the planes and weights of the tails too: check_split's tolerance). The Conv node
// against the rounded reference everywhere (check_reduced: with AMX the kernel runs it), and
// conv_taps itself with a residual and ReLU, on 1 and 2 threads; where the CPU has no AMX-BF16 it
// applies to none. PTO_CONV_TAPS=0 turns it off, another value is an error.
TEST(CpuConvBf16, TapsKernel) {
  const Attributes pad1 = pads1();
  const Attributes s2p1 = stride2_pads1();
  const std::vector<ConvCase> cases = {
      {{1, 64, 20, 23}, {40, 64, 3, 3}, true, pad1},
      {{2, 48, 14, 14}, {64, 48, 3, 3}, true, pad1},
      {{1, 32, 9, 40}, {16, 32, 5, 5}, true, attrs_of({{"pads", Dims{2, 2, 2, 2}}})},
      {{1, 64, 7, 7}, {96, 64, 3, 3}, true, pad1},
      {{1, 40, 16, 16}, {32, 40, 1, 3}, true, attrs_of({{"pads", Dims{0, 1, 0, 1}}})},
      {{1, 33, 12, 40}, {70, 33, 3, 3}, true, {}},
      {{2, 32, 10, 30}, {32, 32, 3, 3}, true, attrs_of({{"pads", Dims{2, 1, 0, 1}}})},
      // Strided: the pair planes split by stride phase.
      {{1, 64, 28, 28}, {64, 64, 3, 3}, true, s2p1},
      {{2, 32, 15, 17}, {40, 32, 3, 3}, true, s2p1},
      {{1, 48, 12, 20},
       {32, 48, 3, 3},
       true,
       attrs_of({{"pads", Dims{1, 1, 1, 1}}, {"strides", Dims{2, 1}}})},
      {{1, 32, 20, 21},
       {16, 32, 5, 5},
       true,
       attrs_of({{"pads", Dims{2, 2, 2, 2}}, {"strides", Dims{2, 2}}})},
      // 1-D: one output row, split by positions between the threads.
      {{1, 40, 100}, {48, 40, 3}, true, attrs_of({{"pads", Dims{1, 1}}})},
      // Folded (fewer than 32 channels): a ResNet stem (one kernel row a tap, 21 values, two
      // phases); 3x3 on 3 and 1 channels (all three rows folded: one tap, 27 and 9 values);
      // 16 channels (48 values a row: two chunks); stride 4; 7x3 on 2 channels (five rows a
      // tap: the second tap's last three rows past the kernel); strides (3, 2) with asymmetric
      // pads; 1-D with stride 2.
      {{1, 3, 30, 28},
       {40, 3, 7, 7},
       true,
       attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{2, 2}}})},
      {{2, 3, 21, 19}, {32, 3, 3, 3}, true, s2p1},
      {{1, 1, 17, 40}, {24, 1, 3, 3}, true, pad1},
      {{1, 16, 12, 12}, {20, 16, 3, 3}, true, pad1},
      {{1, 3, 33, 33},
       {16, 3, 7, 7},
       true,
       attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{4, 4}}})},
      {{1, 2, 20, 18}, {16, 2, 7, 3}, true, attrs_of({{"pads", Dims{3, 1, 3, 1}}})},
      {{1, 2, 9, 15},
       {16, 2, 5, 3},
       true,
       attrs_of({{"pads", Dims{2, 1, 1, 0}}, {"strides", Dims{3, 2}}})},
      {{2, 1, 300}, {32, 1, 5}, true, attrs_of({{"pads", Dims{2, 2}}, {"strides", Dims{2}}})},
      // Grouped: ResNeXt's 32 groups of 4 (a panel's 8 groups in one chunk), groups of 8, two
      // output channels an input one (stride 2), groups of 24 (panels across group and chunk
      // edges), two groups of 64, groups of 4 inputs and 8 outputs.
      {{1, 128, 14, 14}, {128, 4, 3, 3}, true, grouped(pad1, 32)},
      {{1, 64, 10, 12}, {64, 8, 3, 3}, true, grouped({}, 8)},
      {{1, 64, 9, 9}, {128, 16, 3, 3}, true, grouped(s2p1, 4)},
      {{1, 96, 8, 8}, {96, 24, 3, 3}, true, grouped(pad1, 4)},
      {{1, 128, 7, 7}, {128, 64, 3, 3}, true, grouped(pad1, 2)},
      {{2, 64, 12, 12}, {128, 4, 3, 3}, true, grouped(pad1, 16)},
  };
  const int saved = num_threads();
  for (const ConvCase& c : cases) {
    SCOPED_TRACE(cat("X ", dims_str(c.x), " W ", dims_str(c.w)));
    check_reduced(c);
    check_split(c);
    const cpu::ConvGeometry g = cpu::conv_geometry(c.attrs, c.x, c.w, "conv");
    if (!cpu::has_ext(cpu::Ext::kAmxBf16)) {
      EXPECT_FALSE(cpu::taps_conv_applies(g));
      continue;
    }
    EXPECT_TRUE(cpu::taps_conv_applies(g));
    ConvCase marked = c;
    marked.attrs.set("precision", std::string("bf16"));
    EXPECT_NE(compile(conv_graph(marked).g, {.level = 0}).describe_step(0).find("AMX taps kernel"),
              std::string::npos);
    // Compiled for the taps kernel (the GEMM's weights not kept), then run where it is off: the
    // implicit GEMM on weights packed from the taps ones, the same products.
    for (const std::string precision : {"bf16", "bf16x3"}) {
      marked.attrs.set("precision", precision);
      const Built b = conv_graph(marked);
      const Tensor want = reference::run(b.g, b.feeds)[0];
      Executable exe = compile(b.g, {.level = 0});
      expect_close(exe.run(b.feeds)[0], want, k_of(c), cat(precision, " on the taps kernel"));
      DepthwiseFlatEnv off("0", "PTO_CONV_TAPS");
      expect_close(exe.run(b.feeds)[0], want, k_of(c), cat(precision, " turned off after"));
    }
    marked.attrs.set("precision", std::string("bf16"));
    {
      DepthwiseFlatEnv off("0", "PTO_CONV_TAPS");
      EXPECT_EQ(
          compile(conv_graph(marked).g, {.level = 0}).describe_step(0).find("AMX taps kernel"),
          std::string::npos);
      EXPECT_FALSE(cpu::taps_conv_applies(g));
      DepthwiseFlatEnv bad("2", "PTO_CONV_TAPS");
      EXPECT_THROW(cpu::taps_conv_applies(g), ValueError);
    }
    // conv_taps itself: a residual and ReLU or Clip are applied as the outputs are written, a
    // LeakyReLU by the epilogue's pass after.
    for (const std::string precision : {"bf16", "bf16x3"}) {
      ConvCase rounded = c;
      rounded.attrs.set("precision", precision);
      const ConvWithReference r = conv_with_reference(rounded);
      const cpu::PackedA packed = cpu::pack_taps_weights(
          r.w.data<float>(), g,
          precision == "bf16" ? cpu::Precision::kBF16 : cpu::Precision::kBF16x3);
      ASSERT_EQ(packed.m(), g.m);
      for (const cpu::Activation act :
           {cpu::Activation::kRelu, cpu::Activation::kClip, cpu::Activation::kLeakyRelu}) {
        cpu::Epilogue ep;
        ep.residual = r.res.data<float>();
        ep.residual_scale = 0.5f;
        ep.act = act;
        ep.lo = act == cpu::Activation::kLeakyRelu ? 0.125f : -0.25f;
        ep.hi = 0.5f;
        Tensor want = Tensor::empty(DType::kF32, r.want_conv.shape());
        for (int64_t i = 0; i < want.numel(); ++i) {
          const float v =
              static_cast<float>(r.want_conv.item_as_double(i)) + 0.5f * r.res.data<float>()[i];
          want.data<float>()[i] = act == cpu::Activation::kRelu   ? std::max(0.0f, v)
                                  : act == cpu::Activation::kClip ? std::clamp(v, -0.25f, 0.5f)
                                  : v < 0                         ? 0.125f * v
                                                                  : v;
        }
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          Tensor y = Tensor::empty(DType::kF32, want.shape());
          cpu::conv_taps(g, r.x.data<float>(), packed, r.bias.data<float>(), y.data<float>(), ep);
          expect_close(y, want, k_of(c),
                       cat("conv_taps ", precision, " act ", static_cast<int>(act), ", ", threads,
                           " thread(s)"));
        }
      }
    }
  }
  set_num_threads(saved);
  // Groups of 2 channels would make a panel's chunk 16 times its channels: not taken.
  if (cpu::has_ext(cpu::Ext::kAmxBf16)) {
    const Attributes a = grouped(pad1, 32);
    EXPECT_FALSE(
        cpu::taps_conv_applies(cpu::conv_geometry(a, {1, 64, 8, 8}, {64, 2, 3, 3}, "conv")));
  }
}

// The taps kernel where the plane is known only at run time: a dense, a grouped and a folded
// (stem) conv with bf16 products, compiled with symbolic H and W and run on planes it takes and
// planes it does not (too many junk columns: the implicit GEMM then, its weights made from the
// taps ones, or the other way round), with a SiLU after (the epilogue's pass, not the in-place
// clamp); each against the reference, which rounds X and W as the products do.
TEST(CpuConvBf16, TapsKernelPlaneChosenAtRunTime) {
  struct Case {
    int64_t c;
    Dims w;
    Attributes attrs;
    std::vector<std::pair<int64_t, int64_t>> planes;  // input (h, w), in order
    bool mixed;  // planes the kernel takes and planes it does not
  };
  const std::vector<Case> cases = {
      {48, {40, 48, 3, 3}, pads1(), {{6, 6}, {20, 23}, {5, 7}, {14, 14}}, true},
      {64, {64, 4, 3, 3}, grouped(pads1(), 16), {{18, 16}, {5, 5}, {9, 30}}, true},
      {3,
       {32, 3, 7, 7},
       attrs_of({{"pads", Dims{3, 3, 3, 3}}, {"strides", Dims{2, 2}}}),
       {{30, 28}, {17, 45}},
       false},
  };
  const int saved = num_threads();
  for (const Case& t : cases) {
    Attributes a = t.attrs;
    a.set("precision", std::string("bf16"));
    Graph g;
    ValueId xv =
        g.add_input("x", {DType::kF32, Shape{Dim(1), Dim(t.c), Dim::sym("h"), Dim::sym("w")}});
    ValueId wv = g.add_value("w"), bv = g.add_value("b");
    g.set_initializer(wv, random_tensor(t.w, 2));
    g.set_initializer(bv, random_tensor({t.w[0]}, 3));
    ValueId c = g.add_value("c"), s = g.add_value("s"), out = g.add_value("out");
    g.add_node("Conv", {xv, wv, bv}, {c}, a, "conv");
    g.add_node("Sigmoid", {c}, {s}, {}, "sigmoid");
    g.add_node("Mul", {c, s}, {out}, {}, "mul");
    g.add_output(out);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Executable exe = compile(g, {.level = 2});
      ASSERT_EQ(exe.num_steps(), 1u);
      int taken = 0;
      for (const auto& [h, w] : t.planes) {
        const std::vector<Tensor> feeds = {random_tensor({1, t.c, h, w}, 1 + h)};
        Graph typed = g;
        typed.value(typed.inputs()[0]).type.shape = to_shape(feeds[0].shape());
        taken += cpu::taps_conv_applies(cpu::conv_geometry(a, feeds[0].shape(), t.w, "conv"));
        const Tensor want = reference::run(typed, feeds)[0];
        expect_close(exe.run(feeds)[0], want, t.w[1] * t.w[2] * t.w[3],
                     cat(dims_str(t.w), " on ", h, "x", w, ", ", threads, " thread(s)"));
      }
      if (cpu::has_ext(cpu::Ext::kAmxBf16)) {
        EXPECT_GE(taken, 1) << dims_str(t.w);
        if (t.mixed) {
          EXPECT_LT(taken, static_cast<int>(t.planes.size())) << dims_str(t.w);
        }
      }
    }
  }
  set_num_threads(saved);
}

// Relu(Conv(x, W, B) + r): W and B random constants, x and r graph inputs of the given shapes.
Graph conv_add_relu(const Shape& x, const Dims& w, const Shape& r, const Attributes& a) {
  Graph g;
  ValueId xv = g.add_input("x", {DType::kF32, x});
  ValueId wv = g.add_value("w"), bv = g.add_value("b");
  g.set_initializer(wv, random_tensor(w, 2));
  g.set_initializer(bv, random_tensor({w[0]}, 3));
  ValueId rv = g.add_input("r", {DType::kF32, r});
  ValueId c = g.add_value("c"), s = g.add_value("s"), out = g.add_value("out");
  g.add_node("Conv", {xv, wv, bv}, {c}, a, "conv");
  g.add_node("Add", {c, rv}, {s}, {}, "add");
  g.add_node("Relu", {s}, {out}, {}, "relu");
  g.add_output(out);
  return g;
}

// g compiled at level 2 on every ISA with 1 and 2 threads: one step, on the blocked direct
// kernel exactly when blocked(isa), and close to `want` for sums of k products.
template <class Blocked>
void expect_one_conv_step(const Graph& g, const std::vector<Tensor>& feeds, const Tensor& want,
                          Blocked blocked, int64_t k, const std::string& what) {
  const int saved = num_threads();
  for (cpu::Isa isa : cpu::supported_isas()) {
    IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Executable exe = compile(g, {.level = 2});
      ASSERT_EQ(exe.num_steps(), 1u);
      EXPECT_EQ(exe.describe_step(0).find("blocked direct") != std::string::npos, blocked(isa))
          << exe.describe_step(0);
      expect_close(exe.run(feeds)[0], want, k,
                   cat(what, " on ", cpu::isa_name(isa), ", ", threads, " thread(s)"));
    }
  }
  set_num_threads(saved);
}

// Small planes with a block of input channels or more run on the blocked kernel inside the Conv
// kernel (conv_kernels.cpp); here with a fused residual Add and Relu at level 2 (applied to the
// NCHW output after the reorder) and channel counts that leave padded lanes.
TEST(CpuConv, SmallPlaneBlockedPath) {
  // (x, w, group, stride, whether the blocked path is chosen: a 1x1 conv only on planes up to
  // 8x8; a depthwise conv only when strided, the stride-1 ones stay on the flat kernel, and
  // under AVX-512 only when its input rows are wider than 32 or its output rows narrower than 6)
  for (const auto& [x, w, group, stride, small] :
       {std::tuple{Dims{2, 24, 7, 7}, Dims{40, 24, 3, 3}, 1, 1, true},
        std::tuple{Dims{1, 40, 7, 7}, Dims{36, 40, 1, 1}, 1, 1, true},
        std::tuple{Dims{1, 40, 14, 14}, Dims{36, 40, 1, 1}, 1, 1, false},
        std::tuple{Dims{2, 40, 9, 9}, Dims{40, 1, 3, 3}, 40, 1, false},
        std::tuple{Dims{2, 40, 9, 9}, Dims{40, 1, 3, 3}, 40, 2, true},
        std::tuple{Dims{2, 40, 13, 13}, Dims{40, 1, 3, 3}, 40, 2, true},
        std::tuple{Dims{2, 40, 20, 36}, Dims{40, 1, 3, 3}, 40, 2, true}}) {
    const Dims y = {x[0], w[0], (x[2] - 1) / stride + 1, (x[3] - 1) / stride + 1};
    Attributes a = attrs_of({{"group", int64_t{group}}, {"strides", Dims{stride, stride}}});
    if (w[2] == 3) a.set("pads", Dims{1, 1, 1, 1});
    const Graph g = conv_add_relu(to_shape(x), w, to_shape(y), a);
    const std::vector<Tensor> feeds = {random_tensor(x, 1), random_tensor(y, 4)};
    const bool is_small = small;
    // AVX-512 runs a strided 3x3 depthwise conv with input rows of at most 32 floats and output
    // rows of at least 6 on the rows kernel (conv.h depthwise_rows_applies) instead.
    const bool rows = group > 1 && stride > 1 && ((x[3] <= 32 && y[3] >= 6) || y[3] >= 28);
    expect_one_conv_step(
        g, feeds, reference::run(g, feeds)[0],
        [&](cpu::Isa isa) {
          return is_small && isa != cpu::Isa::kGeneric && !(rows && isa == cpu::Isa::kAvx512);
        },
        w[1] * w[2] * w[3], dims_str(x));
  }
}

// Stems (3 input channels, fewer than a block) stay on the NCHW kernel at level 2 (its stem path
// from 16 output columns on, else the implicit GEMM; the blocked
// kernel reading their NCHW input is the tuner's "conv.algo" {1}, TunerTest.ConvAlgoKnob; the
// planner does not pick it: conv_kernels.cpp). Residual Add + Relu fused, batch 2, 3x3 and 7x7,
// strides 1 and 2, known and symbolic planes, every ISA, 1 and 2 threads, against the reference.
TEST(CpuConv, StemsStayOnTheGemm) {
  struct Stem {
    Dims x, w;
    int64_t stride;
  };
  for (const Stem& t :
       {Stem{{2, 3, 33, 31}, {16, 3, 3, 3}, 2}, Stem{{1, 3, 40, 46}, {32, 3, 7, 7}, 2},
        Stem{{2, 3, 17, 19}, {16, 3, 3, 3}, 1}}) {
    for (bool symbolic : {false, true}) {
      const Shape xs =
          symbolic ? Shape{Dim(t.x[0]), Dim(3), Dim::sym("h"), Dim::sym("w")} : to_shape(t.x);
      const int64_t k = t.w[2], p = k / 2;
      const Dims y = {t.x[0], t.w[0], (t.x[2] + 2 * p - k) / t.stride + 1,
                      (t.x[3] + 2 * p - k) / t.stride + 1};
      const Shape ys =
          symbolic ? Shape{Dim(y[0]), Dim(y[1]), Dim::sym("oh"), Dim::sym("ow")} : to_shape(y);
      const Graph g = conv_add_relu(
          xs, t.w, ys,
          attrs_of({{"pads", Dims{p, p, p, p}}, {"strides", Dims{t.stride, t.stride}}}));
      const std::vector<Tensor> feeds = {random_tensor(t.x, 1), random_tensor(y, 4)};
      Graph typed = g;
      typed.value(typed.inputs()[0]).type.shape = to_shape(t.x);
      typed.value(typed.inputs()[1]).type.shape = to_shape(y);
      const Tensor want = reference::run(typed, feeds)[0];
      expect_one_conv_step(
          g, feeds, want, [](cpu::Isa) { return false; }, t.w[1] * k * k,
          cat(dims_str(t.x), " k", k, " s", t.stride, symbolic ? " symbolic" : ""));
    }
  }
}

// A conv whose input height and width are symbolic (a model exported with dynamic axes) does not
// know its output plane at compile time: each run picks the blocked kernel for a small plane
// (its weights made from the packed ones on first use) and the implicit GEMM otherwise, as the
// compile-time rule does. SiLU (x * sigmoid(x)) fused as the conv's epilogue; 20 input channels
// (padded lanes in blocks of 8 and 16), batch 2, 3x3 with stride 1 and 2 and 1x1; the same
// executable on planes of both kinds, small first and last, on every ISA, 1 and 2 threads.
TEST(CpuConv, SmallPlaneChosenAtRunTime) {
  struct Case {
    Dims w;
    Dims strides, pads;
    std::vector<std::pair<int64_t, int64_t>> planes;  // input (h, w), in order
  };
  for (const Case& t : {Case{{24, 20, 3, 3}, {1, 1}, {1, 1, 1, 1}, {{9, 8}, {90, 84}, {5, 16}}},
                        Case{{24, 20, 3, 3}, {2, 2}, {1, 1, 1, 1}, {{17, 15}, {182, 171}, {3, 3}}},
                        Case{{36, 20, 1, 1}, {1, 1}, {0, 0, 0, 0}, {{6, 6}, {14, 14}, {8, 8}}}}) {
    Graph g;
    ValueId xv =
        g.add_input("x", {DType::kF32, Shape{Dim(2), Dim(20), Dim::sym("h"), Dim::sym("w")}});
    ValueId wv = g.add_value("w"), bv = g.add_value("b");
    g.set_initializer(wv, random_tensor(t.w, 2));
    g.set_initializer(bv, random_tensor({t.w[0]}, 3));
    ValueId c = g.add_value("c"), s = g.add_value("s"), out = g.add_value("out");
    g.add_node("Conv", {xv, wv, bv}, {c}, attrs_of({{"strides", t.strides}, {"pads", t.pads}}),
               "conv");
    g.add_node("Sigmoid", {c}, {s}, {}, "sigmoid");
    g.add_node("Mul", {c, s}, {out}, {}, "mul");
    g.add_output(out);
    const int saved = num_threads();
    for (cpu::Isa isa : cpu::supported_isas()) {
      IsaScope scope(isa);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        Executable exe = compile(g, {.level = 2});
        ASSERT_EQ(exe.num_steps(), 1u);
        for (const auto& [h, w] : t.planes) {
          const std::vector<Tensor> feeds = {random_tensor({2, 20, h, w}, 1 + h)};
          Graph typed = g;
          typed.value(typed.inputs()[0]).type.shape = to_shape(feeds[0].shape());
          const Tensor want = reference::run(typed, feeds)[0];
          expect_close(exe.run(feeds)[0], want, t.w[1] * t.w[2] * t.w[3],
                       cat(dims_str(t.w), " s", t.strides[0], " on ", h, "x", w, ", ",
                           cpu::isa_name(isa), ", ", threads, " thread(s)"));
        }
      }
    }
    set_num_threads(saved);
  }
}

// Same bits on every run for a given thread count (fixed task split, serial GEMM per task).
TEST(CpuConv, Deterministic) {
  Built b =
      conv_graph({{3, 16, 12, 12}, {8, 16, 3, 3}, true, attrs_of({{"pads", Dims{1, 1, 1, 1}}})});
  const int saved = num_threads();
  set_num_threads(2);
  Executable exe = compile(b.g, {.level = 0});
  const Tensor a = exe.run(b.feeds)[0], c = exe.run(b.feeds)[0];
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.data<float>()[i], c.data<float>()[i]);
  set_num_threads(saved);
}

// Timing, not a test: build/tests/cpp/pto_tests --gtest_also_run_disabled_tests
// --gtest_filter='CpuConv.DISABLED_Bench' prints the median milliseconds per shape on one thread.
TEST(CpuConv, DISABLED_Bench) {
  struct Shape {
    const char* name;
    Dims x, w;
    int64_t stride, pad, group;
  };
  const Shape shapes[] = {
      {"resnet 3x3 64", {1, 64, 56, 56}, {64, 64, 3, 3}, 1, 1, 1},
      {"resnet 1x1 256->64", {1, 256, 56, 56}, {64, 256, 1, 1}, 1, 0, 1},
      {"resnet 7x7 s2", {1, 3, 224, 224}, {64, 3, 7, 7}, 2, 3, 1},
      {"mbv2 dw 3x3 144", {1, 144, 56, 56}, {144, 1, 3, 3}, 1, 1, 144},
      {"mbv2 dw 3x3 s2 96", {1, 96, 112, 112}, {96, 1, 3, 3}, 2, 1, 96},
      {"mbv2 dw 3x3 576 14x14", {1, 576, 14, 14}, {576, 1, 3, 3}, 1, 1, 576},
      {"mbv2 dw 3x3 960 7x7", {1, 960, 7, 7}, {960, 1, 3, 3}, 1, 1, 960},
  };
  const int saved = num_threads();
  set_num_threads(1);
  for (const Shape& s : shapes) {
    const Attributes a = attrs_of({{"strides", Dims{s.stride, s.stride}},
                                   {"pads", Dims{s.pad, s.pad, s.pad, s.pad}},
                                   {"group", s.group}});
    const cpu::ConvGeometry g = cpu::conv_geometry(a, s.x, s.w, "bench");
    const Tensor x = random_tensor(s.x, 1), w = random_tensor(s.w, 2),
                 b = random_tensor({s.w[0]}, 3);
    Tensor y = Tensor::empty(DType::kF32, {g.n, g.m, g.oh, g.ow});
    std::vector<double> ms;
    for (int rep = 0; rep < 15; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu::conv2d(g, x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>());
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double gflop = 2.0 * g.n * g.m * g.out_plane() * g.cg() * g.kh * g.kw * 1e-9;
    std::printf("%-22s %9.3f ms  %7.1f GFLOP/s\n", s.name, ms[ms.size() / 2],
                gflop / ms[ms.size() / 2] * 1e3);
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace pto
