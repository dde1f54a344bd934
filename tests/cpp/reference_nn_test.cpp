// Reference kernels of the NN family: convolutions, pooling, normalizations, softmax, Gemm,
// MatMul, MatMulInteger, Einsum and Dropout. Expected values are worked out by hand from the ONNX
// spec; the ONNX node tests (tests/conformance) cover the rest against ONNX's own outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "single_op_test_util.h"

namespace pto {
namespace {

using testing::attrs;
using testing::error_of;
using testing::f32;
using testing::OpCall;
using testing::run_op;
using testing::values;
using V = std::vector<double>;

Tensor iota(Dims s, float start = 1) {
  std::vector<float> v(static_cast<size_t>(checked_numel(s)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return f32(v, std::move(s));
}

Tensor ones(Dims s) {
  std::vector<float> v(static_cast<size_t>(checked_numel(s)), 1.0f);
  return f32(v, std::move(s));
}

void expect_near(const Tensor& t, const V& want, double tol = 1e-5) {
  V got = values(t);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

using Ints = std::vector<int64_t>;

// ---- Conv ----

TEST(Conv, PadsStridesAndBias) {
  // x = 1..9 in 3x3, a 2x2 kernel of ones, pads 1 all round, stride 2: windows at -1 and 1.
  auto y = run_op({"Conv",
                   {iota({1, 1, 3, 3}), ones({1, 1, 2, 2}), f32({10}, {1})},
                   attrs({{"pads", Ints{1, 1, 1, 1}}, {"strides", Ints{2, 2}}})});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 2, 2}));
  // [1] [2+3] / [4+7] [5+6+8+9], plus 10.
  expect_near(y[0], {11, 15, 21, 38});
}

TEST(Conv, SameUpperAndSameLowerPadDifferentSides) {
  // 1-D, input 1..4, kernel [1, 10], stride 1: one pad in total.
  const Tensor x = iota({1, 1, 4}), w = f32({1, 10}, {1, 1, 2});
  auto up = run_op({"Conv", {x, w}, attrs({{"auto_pad", std::string("SAME_UPPER")}})});
  expect_near(up[0], {21, 32, 43, 4});  // pad at the end
  auto lo = run_op({"Conv", {x, w}, attrs({{"auto_pad", std::string("SAME_LOWER")}})});
  expect_near(lo[0], {10, 21, 32, 43});  // pad at the start
}

TEST(Conv, DepthwiseGroupsAndDilation) {
  // Two channels, group 2: each channel has its own 1-D kernel [1, 0, 1] dilated... kernel [1, 1]
  // with dilation 2 sums x[i] + x[i+2].
  Tensor x = f32({1, 2, 3, 4, 10, 20, 30, 40}, {1, 2, 4});
  Tensor w = f32({1, 1, 2, 2}, {2, 1, 2});
  auto y = run_op({"Conv", {x, w}, attrs({{"group", int64_t{2}}, {"dilations", Ints{2}}})});
  EXPECT_EQ(y[0].shape(), (Dims{1, 2, 2}));
  expect_near(y[0], {4, 6, 80, 120});
}

TEST(Conv, ThreeSpatialAxesAndDoubles) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {1, 1, 2, 2, 2});
  Tensor w = Tensor::from_vector<double>({1, 1, 1, 1, 1, 1, 1, 1}, {1, 1, 2, 2, 2});
  auto y = run_op({"Conv", {x, w}, {}});
  EXPECT_EQ(y[0].dtype(), DType::kF64);
  EXPECT_EQ(values(y[0]), (V{36}));
}

TEST(Conv, BadInputsAreErrors) {
  const Tensor x = iota({1, 2, 4, 4});
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 3, 2, 2})}, {}}), ValueError);  // channels
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 2, 5, 5})}, {}}), ValueError);  // kernel too big
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 2, 2, 2})}, attrs({{"strides", Ints{0, 1}}})}),
               ValueError);
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 2, 2, 2})}, attrs({{"pads", Ints{1, 1}}})}),
               ValueError);
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 2, 2, 2})}, attrs({{"group", int64_t{3}}})}),
               ValueError);
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 2, 2, 2})}, attrs({{"kernel_shape", Ints{3, 3}}})}),
               ValueError);
  EXPECT_THROW(run_op({"Conv", {x, ones({1, 2, 2, 2}), ones({2})}, {}}), ValueError);  // bias
  Tensor xi = Tensor::zeros(DType::kI32, {1, 1, 2, 2}),
         wi = Tensor::zeros(DType::kI32, {1, 1, 1, 1});
  EXPECT_THROW(run_op({"Conv", {xi, wi}, {}}), UnsupportedError);
}

TEST(Conv, EmptyBatch) {
  auto y = run_op({"Conv", {Tensor::zeros(DType::kF32, {0, 2, 4, 4}), ones({3, 2, 3, 3})}, {}});
  EXPECT_EQ(y[0].shape(), (Dims{0, 3, 2, 2}));
}

// ---- ConvTranspose ----

TEST(ConvTranspose, ScatterWithStrideOutputPaddingAndPads) {
  // 1-D: x = [1, 2, 3], kernel [1, 1], stride 2: each input lands on two outputs.
  const Tensor x = iota({1, 1, 3}), w = ones({1, 1, 2});
  auto y = run_op({"ConvTranspose", {x, w}, attrs({{"strides", Ints{2}}})});
  expect_near(y[0], {1, 1, 2, 2, 3, 3});
  y = run_op({"ConvTranspose",
              {x, w},
              attrs({{"strides", Ints{2}}, {"output_padding", Ints{1}}, {"pads", Ints{1, 0}}})});
  expect_near(y[0], {1, 2, 2, 3, 3, 0});
  // Two output channels per group, bias per output channel.
  y = run_op({"ConvTranspose", {x, f32({1, -1}, {1, 2, 1}), f32({0.5, 0}, {2})}, {}});
  EXPECT_EQ(y[0].shape(), (Dims{1, 2, 3}));
  expect_near(y[0], {1.5, 2.5, 3.5, -1, -2, -3});
}

TEST(ConvTranspose, OutputShapeDerivesPads) {
  // Full size 2*(3-1)+2 = 6; asking for 5 pads one at the start (NOTSET puts the odd one first).
  const Tensor x = iota({1, 1, 3}), w = ones({1, 1, 2});
  auto y =
      run_op({"ConvTranspose", {x, w}, attrs({{"strides", Ints{2}}, {"output_shape", Ints{5}}})});
  expect_near(y[0], {1, 2, 2, 3, 3});
  y = run_op({"ConvTranspose",
              {x, w},
              attrs({{"strides", Ints{2}},
                     {"output_shape", Ints{5}},
                     {"auto_pad", std::string("SAME_UPPER")}})});
  expect_near(y[0], {1, 1, 2, 2, 3});
  // SAME without output_shape: output = input * stride.
  y = run_op({"ConvTranspose",
              {x, w},
              attrs({{"strides", Ints{2}}, {"auto_pad", std::string("SAME_UPPER")}})});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 6}));
}

// ---- Pooling ----

TEST(MaxPool, CeilModeDropsAWindowStartingInThePadding) {
  // in 4, kernel 2, stride 2, pad 1+1: ceil((4+2-2)/2)+1 = 3 windows; (3-1)*2 = 4 >= 4+1? no.
  auto y = run_op({"MaxPool",
                   {iota({1, 1, 4})},
                   attrs({{"kernel_shape", Ints{2}},
                          {"strides", Ints{2}},
                          {"pads", Ints{1, 1}},
                          {"ceil_mode", int64_t{1}}})});
  expect_near(y[0], {1, 3, 4});
  // in 2, kernel 3, stride 3, pads 1+1: ceil gives 2 windows but the second starts at 3 >= 2+1.
  y = run_op({"MaxPool",
              {iota({1, 1, 2})},
              attrs({{"kernel_shape", Ints{3}},
                     {"strides", Ints{3}},
                     {"pads", Ints{1, 1}},
                     {"ceil_mode", int64_t{1}}})});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 1}));
}

TEST(MaxPool, IndicesInRowAndColumnMajorOrder) {
  // 2 channels of 2x3; one window of 2x3 each: the max is the last element.
  Tensor x = f32({1, 2, 3, 4, 5, 9, 6, 5, 4, 3, 2, 1}, {1, 2, 2, 3});
  Attributes a = attrs({{"kernel_shape", Ints{2, 2}}});
  auto y = run_op({"MaxPool", {x}, a, 2});
  EXPECT_EQ(y[1].dtype(), DType::kI64);
  EXPECT_EQ(y[0].shape(), (Dims{1, 2, 1, 2}));
  expect_near(y[0], {5, 9, 6, 5});
  EXPECT_EQ(values(y[1]), (V{4, 5, 6, 7}));  // flat row-major indices over the whole tensor
  a.set("storage_order", int64_t{1});
  y = run_op({"MaxPool", {x}, a, 2});
  // Column-major within a plane: (h, w) -> h + w * 2; plane 1 starts at 6.
  EXPECT_EQ(values(y[1]), (V{1 + 1 * 2, 1 + 2 * 2, 6 + 0, 6 + 0 + 1 * 2}));
}

TEST(MaxPool, Int8AndDilations) {
  Tensor x = Tensor::from_vector<int8_t>({-5, 7, -128, 3, 127, -1}, {1, 1, 6});
  auto y = run_op({"MaxPool", {x}, attrs({{"kernel_shape", Ints{2}}, {"dilations", Ints{3}}})});
  EXPECT_EQ(y[0].dtype(), DType::kI8);
  EXPECT_EQ(values(y[0]), (V{3, 127, -1}));
}

TEST(AveragePool, CountIncludePadButNotTheCeilOverhang) {
  // in [1, 2, 3], kernel 2, stride 2, pads 1+0, ceil: windows [pad, 1], [2, 3].
  Attributes a = attrs({{"kernel_shape", Ints{2}}, {"strides", Ints{2}}, {"pads", Ints{1, 0}}});
  auto y = run_op({"AveragePool", {iota({1, 1, 3})}, a});
  expect_near(y[0], {1, 2.5});
  a.set("count_include_pad", int64_t{1});
  y = run_op({"AveragePool", {iota({1, 1, 3})}, a});
  expect_near(y[0], {0.5, 2.5});
  // No pads, ceil mode: the second window [3, overhang] averages one element either way.
  a = attrs({{"kernel_shape", Ints{2}},
             {"strides", Ints{2}},
             {"ceil_mode", int64_t{1}},
             {"count_include_pad", int64_t{1}}});
  y = run_op({"AveragePool", {iota({1, 1, 3})}, a});
  expect_near(y[0], {1.5, 3});
}

TEST(LpPool, PNormOfEachWindow) {
  auto y = run_op({"LpPool",
                   {f32({3, -4, 1, 0}, {1, 1, 4})},
                   attrs({{"kernel_shape", Ints{2}}, {"strides", Ints{2}}})});
  expect_near(y[0], {5, 1});
  y = run_op({"LpPool",
              {f32({3, -4, 1, 0}, {1, 1, 4})},
              attrs({{"kernel_shape", Ints{2}}, {"strides", Ints{2}}, {"p", int64_t{1}}})});
  expect_near(y[0], {7, 1});
}

TEST(GlobalPool, ReducesEverySpatialAxis) {
  const Tensor x = iota({1, 2, 2, 3});
  auto y = run_op({"GlobalAveragePool", {x}, {}});
  EXPECT_EQ(y[0].shape(), (Dims{1, 2, 1, 1}));
  expect_near(y[0], {3.5, 9.5});
  y = run_op({"GlobalMaxPool", {x}, {}});
  expect_near(y[0], {6, 12});
  y = run_op({"GlobalLpPool", {f32({3, 4}, {1, 1, 2})}, {}});
  expect_near(y[0], {5});
}

TEST(Pool, BadAttributesAreErrors) {
  const Tensor x = iota({1, 1, 4, 4});
  EXPECT_THROW(run_op({"MaxPool", {x}, {}}), ValueError);  // kernel_shape is required
  EXPECT_THROW(run_op({"MaxPool", {x}, attrs({{"kernel_shape", Ints{2}}})}), ValueError);
  // A window larger than the input gives an empty output, as in ONNX's reference.
  EXPECT_EQ(run_op({"AveragePool", {x}, attrs({{"kernel_shape", Ints{5, 5}}})})[0].shape(),
            (Dims{1, 1, 0, 0}));
  EXPECT_THROW(run_op({"LpPool", {x}, attrs({{"kernel_shape", Ints{2, 2}}, {"p", int64_t{0}}})}),
               ValueError);
  EXPECT_THROW(
      run_op(
          {"MaxPool", {x}, attrs({{"kernel_shape", Ints{2, 2}}, {"auto_pad", std::string("X")}})}),
      ValueError);
}

// ---- Normalizations ----

TEST(BatchNormalization, InferenceAndTrainingStatistics) {
  // One channel of [1, 3] (mean 2, var 1) and one of [2, 4] (mean 3, var 1).
  Tensor x = f32({1, 3, 2, 4}, {1, 2, 2});
  Tensor scale = f32({2, 1}, {2}), bias = f32({1, 0}, {2});
  Tensor mean = f32({0, 1}, {2}), var = f32({1, 4}, {2});
  auto y =
      run_op({"BatchNormalization", {x, scale, bias, mean, var}, attrs({{"epsilon", 0.0}}), 1, 15});
  expect_near(y[0], {3, 7, 0.5, 1.5});
  y = run_op({"BatchNormalization",
              {x, scale, bias, mean, var},
              attrs({{"epsilon", 0.0}, {"training_mode", int64_t{1}}, {"momentum", 0.5}}),
              3,
              15});
  expect_near(y[0], {-1, 3, -1, 1});
  expect_near(y[1], {1, 2});    // 0.5 * input mean + 0.5 * batch mean
  expect_near(y[2], {1, 2.5});  // 0.5 * input var + 0.5 * batch var
}

TEST(LayerNormalization, MeanAndInvStdDevOutputs) {
  Tensor x = f32({1, 3, 2, 2, 0, 4}, {2, 3});
  auto y = run_op({"LayerNormalization", {x, ones({3})}, attrs({{"epsilon", 0.0}}), 3, 17});
  const double s = std::sqrt(2.0 / 3.0);
  expect_near(y[0], {-1 / s, 1 / s, 0, 0, -2 / (std::sqrt(8.0 / 3)), 2 / std::sqrt(8.0 / 3)});
  EXPECT_EQ(y[1].shape(), (Dims{2, 1}));
  expect_near(y[1], {2, 2});
  expect_near(y[2], {1 / s, 1 / std::sqrt(8.0 / 3)});
  // axis 0 normalizes everything; Mean is [1, 1].
  y = run_op({"LayerNormalization",
              {x, ones({2, 3}), f32({1, 1, 1, 1, 1, 1}, {2, 3})},
              attrs({{"axis", int64_t{0}}}),
              2,
              17});
  EXPECT_EQ(y[1].shape(), (Dims{1, 1}));
  expect_near(y[1], {2});
}

TEST(InstanceAndGroupNormalization, StatisticsPerInstanceAndPerGroup) {
  Tensor x = f32({1, 3, 5, 7, 0, 2, 2, 4}, {1, 4, 2});
  auto y = run_op({"InstanceNormalization",
                   {x, ones({4}), f32({0, 0, 0, 10}, {4})},
                   attrs({{"epsilon", 0.0}})});
  expect_near(y[0], {-1, 1, -1, 1, -1, 1, 9, 11});
  // Two groups of two channels: [1, 3, 5, 7] (mean 4, var 5) and [0, 2, 2, 4] (mean 2, var 2).
  y = run_op({"GroupNormalization",
              {x, ones({4}), Tensor::zeros(DType::kF32, {4})},
              attrs({{"num_groups", int64_t{2}}, {"epsilon", 0.0}}),
              1,
              21});
  const double a = std::sqrt(5.0), b = std::sqrt(2.0);
  expect_near(y[0], {-3 / a, -1 / a, 1 / a, 3 / a, -2 / b, 0, 0, 2 / b});
  EXPECT_THROW(run_op({"GroupNormalization",
                       {x, ones({4}), ones({4})},
                       attrs({{"num_groups", int64_t{3}}}),
                       1,
                       21}),
               ValueError);
}

TEST(LpNormalization, ZeroNormGivesZeros) {
  auto y = run_op({"LpNormalization", {f32({3, 4, 0, 0}, {2, 2})}, {}});
  expect_near(y[0], {0.6, 0.8, 0, 0});
  y = run_op({"LpNormalization", {f32({3, -1, 0, 0}, {2, 2})}, attrs({{"p", int64_t{1}}})});
  expect_near(y[0], {0.75, -0.25, 0, 0});
}

TEST(LRN, ChannelWindow) {
  // size 2: channels [c, c+1]; y = x / (1 + 1/2 * sum x^2)^1.
  auto y = run_op({"LRN",
                   {f32({1, 2, 3}, {1, 3})},
                   attrs({{"size", int64_t{2}}, {"alpha", 1.0}, {"beta", 1.0}})});
  expect_near(y[0], {1 / 3.5, 2 / 7.5, 3 / 5.5});
}

TEST(MeanVarianceNormalization, DefaultAxes) {
  auto y = run_op({"MeanVarianceNormalization", {f32({1, 3, 10, 10}, {1, 2, 2, 1})}, {}});
  expect_near(y[0], {-1, 1, 0, 0}, 1e-6);
}

// ---- Softmax family ----

TEST(Softmax, Opset11CoercesTo2DButOpset13WorksPerAxis) {
  Tensor x = f32({0, 0, 0, std::log(3.0f)}, {1, 2, 2});
  auto old = run_op({"Softmax", {x}, {}, 1, 11});  // axis 1: one row of 4
  expect_near(old[0], {1 / 6.0, 1 / 6.0, 1 / 6.0, 0.5});
  auto now = run_op({"Softmax", {x}, attrs({{"axis", int64_t{1}}}), 1, 13});
  expect_near(now[0], {0.5, 0.25, 0.5, 0.75});
  auto logs = run_op({"LogSoftmax", {x}, {}, 1, 13});  // axis -1
  expect_near(logs[0], {std::log(0.5), std::log(0.5), std::log(0.25), std::log(0.75)});
}

TEST(Hardmax, FirstMaximumWins) {
  auto y = run_op({"Hardmax", {f32({1, 3, 3, 0, 2, 2}, {2, 3})}, {}, 1, 13});
  EXPECT_EQ(values(y[0]), (V{0, 1, 0, 0, 1, 0}));
}

// A row starting with NaN has no maximum (all zeros, as onnxruntime); a later NaN is skipped.
TEST(Hardmax, NaNFirstRowIsZeros) {
  auto y = run_op({"Hardmax", {f32({NAN, 3, 5, 1, NAN, 2}, {2, 3})}, {}, 1, 13});
  EXPECT_EQ(values(y[0]), (V{0, 0, 0, 0, 0, 1}));
}

// ---- Contractions ----

TEST(Gemm, TransposesAlphaBetaAndBroadcastC) {
  // A' = [[1, 2], [3, 4]] given transposed, B = identity, C = [10, 20] per column.
  Tensor a = f32({1, 3, 2, 4}, {2, 2});
  Tensor b = f32({1, 0, 0, 1}, {2, 2});
  auto y = run_op({"Gemm",
                   {a, b, f32({10, 20}, {2})},
                   attrs({{"transA", int64_t{1}}, {"alpha", 2.0}, {"beta", 0.5}})});
  expect_near(y[0], {7, 14, 11, 18});
  Tensor ai = Tensor::from_vector<int32_t>({1, 2, 3, 4}, {2, 2});
  Tensor bi = Tensor::from_vector<int32_t>({1, 1, 1, 1}, {2, 2});
  y = run_op({"Gemm", {ai, bi}, attrs({{"transB", int64_t{1}}})});
  EXPECT_EQ(y[0].dtype(), DType::kI32);
  EXPECT_EQ(values(y[0]), (V{3, 3, 7, 7}));
  EXPECT_THROW(run_op({"Gemm", {a, b, ones({3})}, {}}), ValueError);
}

TEST(MatMul, VectorsBatchesAndBroadcasting) {
  auto y = run_op({"MatMul", {iota({3}), iota({3})}, {}});
  EXPECT_EQ(y[0].shape(), Dims{});
  EXPECT_EQ(values(y[0]), (V{14}));
  y = run_op({"MatMul", {iota({2, 1, 2, 3}), ones({4, 3, 1})}, {}});
  EXPECT_EQ(y[0].shape(), (Dims{2, 4, 2, 1}));
  EXPECT_EQ(values(y[0])[0], 6);
  y = run_op({"MatMul", {iota({3}), ones({2, 3, 2})}, {}});
  EXPECT_EQ(y[0].shape(), (Dims{2, 2}));
  y = run_op(
      {"MatMul", {Tensor::zeros(DType::kF32, {2, 0}), Tensor::zeros(DType::kF32, {0, 3})}, {}});
  EXPECT_EQ(values(y[0]), V(6, 0.0));  // empty sums are zero
  EXPECT_THROW(run_op({"MatMul", {iota({2, 3}), iota({2, 3})}, {}}), ValueError);
}

TEST(MatMul, TiledPathMatchesPlainLoopsBitForBit) {
  // Sizes that leave partial 4 x 12 tiles, with a broadcast batch.
  const int64_t M = 9, K = 7, N = 29;
  std::vector<double> av(2 * M * K), bv(K * N);
  uint32_t r = 12345;
  auto next = [&] { return (r = r * 1664525u + 1013904223u) / 4294967296.0 - 0.5; };
  for (double& v : av) v = next();
  for (double& v : bv) v = next();
  auto y =
      run_op({"MatMul",
              {Tensor::from_vector<double>(av, {2, M, K}), Tensor::from_vector<double>(bv, {K, N})},
              {}});
  ASSERT_EQ(y[0].shape(), (Dims{2, M, N}));
  for (int64_t bt = 0; bt < 2; ++bt)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += av[(bt * M + i) * K + k] * bv[k * N + j];
        EXPECT_EQ(y[0].data<double>()[(bt * M + i) * N + j], acc) << bt << "," << i << "," << j;
      }
}

TEST(MatMul, IntegersWrapAround) {
  Tensor a = Tensor::from_vector<int8_t>({100, 100}, {1, 2});
  Tensor b = Tensor::from_vector<int8_t>({2, 2}, {2, 1});
  auto y = run_op({"MatMul", {a, b}, {}});
  EXPECT_EQ(y[0].dtype(), DType::kI8);
  EXPECT_EQ(values(y[0]), (V{400 - 512}));
  Tensor u = Tensor::from_vector<uint64_t>({~uint64_t{0}}, {1, 1});
  y = run_op({"MatMul", {u, Tensor::from_vector<uint64_t>({2}, {1, 1})}, {}});
  EXPECT_EQ(y[0].data<uint64_t>()[0], ~uint64_t{0} - 1);
}

TEST(MatMulInteger, ZeroPointsPerTensorRowAndColumn) {
  Tensor a = Tensor::from_vector<uint8_t>({10, 20, 30, 40}, {2, 2});
  Tensor b = Tensor::from_vector<int8_t>({1, -1, 2, 3}, {2, 2});
  auto y = run_op({"MatMulInteger", {a, b}, {}});
  EXPECT_EQ(y[0].dtype(), DType::kI32);
  EXPECT_EQ(values(y[0]), (V{50, 50, 110, 90}));
  // Per-row a zero points [10, 30] and a per-tensor b zero point 1.
  y = run_op({"MatMulInteger",
              {a, b, Tensor::from_vector<uint8_t>({10, 30}, {2}), Tensor::scalar<int8_t>(1)},
              {}});
  EXPECT_EQ(values(y[0]), (V{10, 20, 10, 20}));
}

TEST(Einsum, TraceDiagonalImplicitOutputAndEllipsis) {
  const Tensor m = iota({3, 3});
  EXPECT_EQ(values(run_op({"Einsum", {m}, attrs({{"equation", std::string("ii")}})})[0]), (V{15}));
  EXPECT_EQ(values(run_op({"Einsum", {m}, attrs({{"equation", std::string("ii->i")}})})[0]),
            (V{1, 5, 9}));
  // Implicit output: labels used once, alphabetically: "ba" -> "ab", a transpose.
  auto y = run_op({"Einsum", {iota({2, 3})}, attrs({{"equation", std::string("ba")}})});
  EXPECT_EQ(y[0].shape(), (Dims{3, 2}));
  EXPECT_EQ(values(y[0]), (V{1, 4, 2, 5, 3, 6}));
  // Ellipsis broadcasting: [2, 1, 3] with [4, 3] -> [2, 4].
  y = run_op({"Einsum",
              {iota({2, 1, 3}), ones({4, 3})},
              attrs({{"equation", std::string("...j,...j->...")}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 4}));
  EXPECT_EQ(values(y[0]), (V{6, 6, 6, 6, 15, 15, 15, 15}));
  EXPECT_THROW(run_op({"Einsum", {m}, attrs({{"equation", std::string("ij,jk")}})}), ValueError);
  EXPECT_THROW(run_op({"Einsum", {m}, attrs({{"equation", std::string("i->i")}})}), ValueError);
  EXPECT_THROW(run_op({"Einsum", {m}, attrs({{"equation", std::string("ij->k")}})}), ValueError);
  EXPECT_THROW(run_op({"Einsum", {m}, attrs({{"equation", std::string("i.j")}})}), ValueError);
  EXPECT_THROW(
      run_op(
          {"Einsum", {iota({2, 3}), iota({4, 3})}, attrs({{"equation", std::string("ij,ij->i")}})}),
      ValueError);
}

// ---- Dropout ----

TEST(Dropout, InferenceIsIdentityAndTrainingIsUnsupported) {
  const Tensor x = iota({2, 2});
  auto y = run_op({"Dropout", {x}, attrs({{"ratio", 0.5}}), 2, 7});
  EXPECT_EQ(values(y[0]), values(x));
  EXPECT_EQ(y[1].dtype(), DType::kF32);  // before opset 10 the mask has X's type
  y = run_op({"Dropout", {x, Tensor::scalar<float>(0.0f), Tensor::scalar<bool>(true)}, {}, 2, 13});
  EXPECT_EQ(y[1].dtype(), DType::kBool);
  EXPECT_EQ(values(y[1]), (V{1, 1, 1, 1}));
  EXPECT_THROW(
      run_op({"Dropout", {x, Tensor::scalar<float>(0.1f), Tensor::scalar<bool>(true)}, {}, 1, 13}),
      UnsupportedError);
}

// ---- Empty tensors ----

TEST(NnEmpty, EmptyTensorsWithLargeDimsReturnAtOnce) {
  // 2^40 planes of nothing: walking them one by one would take hours.
  const int64_t kBig = int64_t{1} << 20;
  const Tensor x = Tensor::zeros(DType::kF32, {kBig, kBig, 0, 4});
  auto y = run_op({"MaxPool", {x}, attrs({{"kernel_shape", Ints{1, 2}}}), 2});
  EXPECT_EQ(y[0].shape(), (Dims{kBig, kBig, 0, 3}));
  y = run_op({"AveragePool", {x}, attrs({{"kernel_shape", Ints{1, 2}}})});
  EXPECT_EQ(y[0].shape(), (Dims{kBig, kBig, 0, 3}));
  y = run_op({"Softmax", {x}, {}});
  EXPECT_EQ(y[0].shape(), x.shape());
  y = run_op({"LpNormalization", {x}, attrs({{"axis", int64_t{1}}})});
  EXPECT_EQ(y[0].numel(), 0);
  y = run_op({"Conv", {Tensor::zeros(DType::kF32, {kBig, 4, 0}), ones({kBig, 4, 1})}, {}});
  EXPECT_EQ(y[0].shape(), (Dims{kBig, kBig, 0}));
  y = run_op({"MatMul",
              {Tensor::zeros(DType::kF32, {kBig, kBig, 0, 3}), Tensor::zeros(DType::kF32, {3, 2})},
              {}});
  EXPECT_EQ(y[0].shape(), (Dims{kBig, kBig, 0, 2}));
  y = run_op({"Einsum",
              {Tensor::zeros(DType::kF32, {kBig, 0, kBig})},
              attrs({{"equation", std::string("abc->cb")}})});
  EXPECT_EQ(y[0].shape(), (Dims{kBig, 0}));
}

}  // namespace
}  // namespace pto
