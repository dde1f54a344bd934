// The CPU ConvTranspose kernel (src/backend/cpu/conv/conv_transpose.cpp) against the reference
// interpreter, on every ISA with 1 and 2 threads: kernel == stride (the exact-tiling store path),
// the sub-pixel form (kernel a multiple of the stride) and overlapping taps on the col2im, pads,
// dilations, strides, output_padding, output_shape, every auto_pad, groups (depthwise too), 1-D
// and 2-D, several column blocks, W constant (packed) or a graph input, and a 3-D one left to the
// reference; ConvTranspose + BatchNormalization + (residual) + Relu fused into one kernel on each
// form; Col2Im (its col2im step alone). Tolerance: the kernel sums Cg*kh*kw float products where
// the reference sums in double; 4 ulp of 1 per product (inputs in [-1, 1]).
#include <gtest/gtest.h>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

struct TransposeCase {
  Dims x, w;  // w: [C, M/group, k...]
  Attributes attrs;
  bool bias = true;
  bool w_constant = true;
};

NodeCase node_of(const TransposeCase& t, uint32_t seed) {
  const int64_t group = t.attrs.get_int("group", 1);
  NodeCase c{"ConvTranspose", {random_f32(t.x, seed), random_f32(t.w, seed + 1)}, t.attrs, 18};
  if (t.bias) c.inputs.push_back(random_f32({t.w[1] * group}, seed + 2));
  c.constant = {false, t.w_constant, true};
  return c;
}

Tol tolerance(const TransposeCase& t) {
  int64_t k = t.w[0] / t.attrs.get_int("group", 1);
  for (size_t i = 2; i < t.w.size(); ++i) k *= t.w[i];
  return {0, 4 * kUlp * static_cast<double>(k + 1)};
}

Attributes attrs_of(std::initializer_list<std::pair<const char*, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

void check(const TransposeCase& t, const std::string& backend = "cpu") {
  static uint32_t seed = 1;
  expect_matches(node_of(t, seed), tolerance(t), {}, backend);
  seed += 3;
}

TEST(CpuConvTranspose, KernelEqualsStride) {
  // DBNet/UNet decoders: 2x2 stride 2 (every output written once), also 3x3 stride 3 and
  // rectangular, with and without bias, batch 1 and 2, W packed and not.
  check({{1, 8, 5, 7}, {8, 4, 2, 2}, attrs_of({{"strides", Dims{2, 2}}})});
  check({{2, 6, 4, 3}, {6, 5, 3, 3}, attrs_of({{"strides", Dims{3, 3}}}), false});
  check({{1, 4, 3, 5}, {4, 3, 2, 3}, attrs_of({{"strides", Dims{2, 3}}}), true, false});
  // Kernel == stride but pads or output_padding: some outputs uncovered or cropped.
  check({{1, 4, 5, 5},
         {4, 3, 2, 2},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 0, 0, 1}}})});
  check({{1, 4, 5, 5},
         {4, 3, 2, 2},
         attrs_of({{"strides", Dims{2, 2}}, {"output_padding", Dims{1, 1}}})});
}

TEST(CpuConvTranspose, OverlappingTaps) {
  check({{1, 8, 6, 6},
         {8, 4, 4, 4},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}})});
  check({{2, 5, 7, 4}, {5, 3, 3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}})});
  check({{1, 3, 4, 5},
         {3, 2, 3, 2},
         attrs_of({{"strides", Dims{3, 2}},
                   {"dilations", Dims{2, 1}},
                   {"pads", Dims{2, 0, 1, 1}},
                   {"output_padding", Dims{2, 1}}})});
  check({{1, 4, 4, 4},
         {4, 2, 3, 3},
         attrs_of({{"strides", Dims{2, 2}}, {"output_shape", Dims{10, 9}}})});
  for (const char* pad : {"SAME_UPPER", "SAME_LOWER", "VALID"})
    check({{1, 3, 5, 4},
           {3, 2, 3, 3},
           attrs_of({{"strides", Dims{2, 2}}, {"auto_pad", std::string(pad)}})});
  // W as a graph input (not packed), and several column blocks (64 * 16 rows of col per input
  // row of 64: one row a block).
  check({{2, 6, 5, 5}, {6, 4, 4, 4}, attrs_of({{"strides", Dims{2, 2}}}), true, false});
  check({{1, 8, 16, 64},
         {8, 64, 4, 4},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}})});
}

TEST(CpuConvTranspose, GroupsAndOneDimensional) {
  check({{2, 6, 5, 4}, {6, 2, 3, 3}, attrs_of({{"group", int64_t{3}}, {"strides", Dims{2, 1}}})});
  check({{1, 4, 6, 6}, {4, 1, 2, 2}, attrs_of({{"group", int64_t{4}}, {"strides", Dims{2, 2}}})});
  check(
      {{1, 4, 6, 6}, {4, 3, 3, 3}, attrs_of({{"group", int64_t{4}}, {"pads", Dims{1, 1, 1, 1}}})});
  check({{2, 4, 9}, {4, 3, 4}, attrs_of({{"strides", Dims{2}}, {"pads", Dims{1, 1}}})});
  check({{1, 6, 7},
         {6, 2, 3},
         attrs_of({{"group", int64_t{2}},
                   {"dilations", Dims{2}},
                   {"output_padding", Dims{1}},
                   {"strides", Dims{2}}})});
  check({{1, 4, 8}, {4, 2, 2}, attrs_of({{"strides", Dims{2}}})}, "cpu");
  // Empty batch, and 3-D (declined: the reference runs it).
  check({{0, 4, 3, 3}, {4, 2, 2, 2}, attrs_of({{"strides", Dims{2, 2}}})});
  check({{1, 2, 3, 3, 3}, {2, 2, 2, 2, 2}, attrs_of({{"strides", Dims{2, 2, 2}}})}, "reference");
}

TEST(CpuConvTranspose, SubPixel) {
  // The sub-pixel form (kernel a multiple of the stride, no dilation): odd sizes with
  // output_padding (phases of unequal sizes), unequal strides and asymmetric pads, groups, one
  // input channel per group, W a graph input, a stride-1 3x3 (one phase), 1-D, phases large
  // enough for conv2d's shifted path; and pads past the kernel's reach and Mg < Cg / 2, which take
  // the col2im.
  check(
      {{1, 5, 7, 9},
       {5, 3, 4, 4},
       attrs_of(
           {{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}, {"output_padding", Dims{1, 1}}})});
  check({{2, 6, 5, 6},
         {6, 2, 4, 6},
         attrs_of({{"group", int64_t{2}}, {"strides", Dims{2, 3}}, {"pads", Dims{1, 2, 0, 1}}})});
  check({{1, 3, 4, 5},
         {3, 4, 6, 6},
         attrs_of({{"strides", Dims{3, 3}}, {"pads", Dims{2, 2, 2, 2}}})});
  check({{1, 4, 7, 7},
         {4, 2, 4, 4},
         attrs_of({{"group", int64_t{4}}, {"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}})});
  check({{1, 3, 6, 5},
         {3, 2, 4, 4},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}}),
         false,
         false});
  check({{2, 4, 6, 7}, {4, 5, 3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}})});
  check({{1, 4, 11}, {4, 3, 4}, attrs_of({{"strides", Dims{2}}, {"pads", Dims{1, 2}}})});
  check({{1, 8, 20, 24},
         {8, 6, 4, 4},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}})});
  check({{1, 4, 5, 5},
         {4, 3, 4, 4},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{3, 3, 3, 3}}})});
  check({{1, 8, 5, 6},
         {8, 2, 4, 4},
         attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}})});
}

// ConvTranspose -> BatchNormalization -> (+ residual) -> Relu at level 2: the BN folds into W and
// B and the rest is one kernel (`rule`), which on every ISA and thread count gives the reference's
// result on the graph as built; for the sub-pixel, exact-tiling and col2im forms.
void check_fused(const Dims& x, const Dims& w, const Dims& y, const Attributes& a, bool residual,
                 const std::string& rule) {
  SCOPED_TRACE(rule + " " + dims_str(x) + " " + dims_str(w));
  static uint32_t seed = 900;
  const int64_t m = y[1];
  Graph g;
  std::vector<Tensor> feeds = {random_f32(x, seed++)};
  ValueId v = g.add_input("x", {DType::kF32, to_shape(x)});
  auto constant = [&](const std::string& name, Tensor t) {
    ValueId c = g.add_value(name);
    g.set_initializer(c, std::move(t));
    return c;
  };
  ValueId wv = constant("w", random_f32(w, seed++)), bv = constant("b", random_f32({m}, seed++));
  ValueId t = g.add_value("t");
  g.add_node("ConvTranspose", {v, wv, bv}, {t}, a, "up", 18);
  ValueId bn = g.add_value("bn");
  g.add_node("BatchNormalization",
             {t, constant("scale", random_f32({m}, seed++, 0.5f, 1.5f)),
              constant("shift", random_f32({m}, seed++)), constant("mean", random_f32({m}, seed++)),
              constant("var", random_f32({m}, seed++, 0.5f, 2.0f))},
             {bn}, {}, "bn", 15);
  v = bn;
  if (residual) {
    ValueId r = g.add_input("r", {DType::kF32, to_shape(y)});
    feeds.push_back(random_f32(y, seed++));
    ValueId s = g.add_value("s");
    g.add_node("Add", {v, r}, {s}, {}, "add", 14);
    v = s;
  }
  ValueId out = g.add_value("out");
  g.add_node("Relu", {v}, {out}, {}, "relu", 14);
  g.add_output(out);
  infer_types(g);
  Executable exe = compile(g, {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).rule, rule);
  expect_runs_match(g, exe, feeds, {1e-5, 1e-4});
}

TEST(CpuConvTranspose, FusedBatchNormAndRelu) {
  const Attributes s2 = attrs_of({{"strides", Dims{2, 2}}});
  const Attributes s2p1 = attrs_of({{"strides", Dims{2, 2}}, {"pads", Dims{1, 1, 1, 1}}});
  const Attributes dil = attrs_of({{"strides", Dims{2, 2}}, {"dilations", Dims{2, 2}}});
  check_fused({1, 8, 6, 7}, {8, 4, 2, 2}, {1, 4, 12, 14}, s2, false, "ConvTranspose+Relu");
  check_fused({2, 8, 5, 6}, {8, 4, 4, 4}, {2, 4, 10, 12}, s2p1, false, "ConvTranspose+Relu");
  check_fused({1, 4, 5, 5}, {4, 3, 3, 3}, {1, 3, 13, 13}, dil, false, "ConvTranspose+Relu");
  check_fused({1, 8, 6, 7}, {8, 4, 2, 2}, {1, 4, 12, 14}, s2, true, "ConvTranspose+Add+Relu");
  check_fused({2, 8, 5, 6}, {8, 4, 4, 4}, {2, 4, 10, 12}, s2p1, true, "ConvTranspose+Add+Relu");
  check_fused({1, 4, 5, 5}, {4, 3, 3, 3}, {1, 3, 13, 13}, dil, true, "ConvTranspose+Add+Relu");
}

// Col2Im of x [n, c * prod(block), L] into `image` (L follows from the attributes).
void check_col2im(int64_t n, int64_t c, const Dims& image, const Dims& block, const Attributes& a) {
  static uint32_t seed = 500;
  const size_t r = image.size();
  const Dims strides = a.get_ints("strides", Dims(r, 1)), dil = a.get_ints("dilations", Dims(r, 1));
  const Dims pads = a.get_ints("pads", Dims(2 * r, 0));
  int64_t k = 1, l = 1;
  for (size_t i = 0; i < r; ++i) {
    k *= block[i];
    l *= (image[i] + pads[i] + pads[i + r] - dil[i] * (block[i] - 1) - 1) / strides[i] + 1;
  }
  NodeCase nc{"Col2Im", {random_f32({n, c * k, l}, seed++), ints(image), ints(block)}, a, 18};
  nc.constant = {false, true, true};
  expect_matches(nc, {0, 4 * kUlp * static_cast<double>(k + 1)});
}

TEST(CpuConvTranspose, Col2Im) {
  check_col2im(2, 3, {8, 10}, {2, 2}, attrs_of({{"strides", Dims{2, 2}}}));  // exact tiling
  check_col2im(1, 4, {9, 7}, {3, 3}, attrs_of({{"pads", Dims{1, 1, 1, 1}}}));
  check_col2im(
      2, 2, {11, 8}, {3, 2},
      attrs_of({{"strides", Dims{2, 3}}, {"dilations", Dims{2, 1}}, {"pads", Dims{0, 1, 2, 1}}}));
  check_col2im(1, 3, {12}, {4}, attrs_of({{"strides", Dims{2}}, {"pads", Dims{1, 1}}}));  // 1-D
  check_col2im(1, 2, {4, 4, 4}, {2, 2, 2}, attrs_of({{"strides", Dims{2, 2, 2}}}));  // reference
}

}  // namespace
}  // namespace pto::testing
