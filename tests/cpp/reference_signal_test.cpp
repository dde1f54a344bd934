// Reference kernels of the signal family: DFT, STFT, the windows, MelWeightMatrix and Det.
// Expected values are computed by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "single_op_test_util.h"

namespace pto {
namespace {

using testing::attrs;
using testing::f32;
using testing::i64;
using testing::OpCall;
using testing::run_op;
using testing::values;
using V = std::vector<double>;

void expect_near(const std::vector<double>& got, const std::vector<double>& want,
                 double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}

// DFT of the real signal [1, 2, 3, 4]: [10, -2 + 2i, -2, -2 - 2i].
Tensor signal4() {
  return f32({1, 2, 3, 4}, {1, 4, 1});
}

TEST(DFT, ForwardOnesidedAndAxisForms) {
  // Opset 20: axis is an input (default -2, here the signal axis too).
  auto y = run_op({"DFT", {signal4()}, {}, 1, 20});
  EXPECT_EQ(y[0].shape(), (Dims{1, 4, 2}));
  expect_near(values(y[0]), {10, 0, -2, 2, -2, 0, -2, -2});
  y = run_op(
      {"DFT", {signal4(), Tensor(), i64({1}, {})}, attrs({{"onesided", int64_t{1}}}), 1, 20});
  EXPECT_EQ(y[0].shape(), (Dims{1, 3, 2}));
  expect_near(values(y[0]), {10, 0, -2, 2, -2, 0});
  // Opset 17: axis is an attribute (default 1).
  y = run_op({"DFT", {signal4()}, {}, 1, 17});
  expect_near(values(y[0]), {10, 0, -2, 2, -2, 0, -2, -2});
  // dft_length truncates ([1, 2] -> [3, -1]) or zero-pads ([1, 2, 3, 4, 0, ...]).
  y = run_op({"DFT", {signal4(), i64({2}, {})}, {}, 1, 17});
  expect_near(values(y[0]), {3, 0, -1, 0});
  y = run_op({"DFT", {signal4(), i64({8}, {})}, {}, 1, 17});
  EXPECT_EQ(y[0].shape(), (Dims{1, 8, 2}));
  expect_near({values(y[0])[0], values(y[0])[8], values(y[0])[9]}, {10, -2, 0});
  // The last axis holds the complex parts and cannot be transformed.
  EXPECT_THROW(run_op({"DFT", {signal4(), Tensor(), i64({-1}, {})}, {}, 1, 20}), ValueError);
  EXPECT_THROW(run_op({"DFT", {f32({1, 2, 3}, {1, 1, 3})}, {}, 1, 20}), ValueError);
}

TEST(DFT, InverseAndInverseOnesided) {
  Tensor spectrum = f32({10, 0, -2, 2, -2, 0, -2, -2}, {1, 4, 2});
  auto y = run_op({"DFT", {spectrum}, attrs({{"inverse", int64_t{1}}}), 1, 20});
  expect_near(values(y[0]), {1, 0, 2, 0, 3, 0, 4, 0});
  // One-sided inverse: three bins give the 2 * (3 - 1) = 4 real samples.
  Tensor half = f32({10, 0, -2, 2, -2, 0}, {1, 3, 2});
  y = run_op({"DFT", {half}, attrs({{"inverse", int64_t{1}}, {"onesided", int64_t{1}}}), 1, 20});
  EXPECT_EQ(y[0].shape(), (Dims{1, 4, 1}));
  expect_near(values(y[0]), {1, 2, 3, 4});
  // The imaginary parts of bin 0 and of the Nyquist bin are ignored, as in numpy's irfft.
  half = f32({10, 7, -2, 2, -2, 5}, {1, 3, 2});
  y = run_op({"DFT", {half}, attrs({{"inverse", int64_t{1}}, {"onesided", int64_t{1}}}), 1, 20});
  expect_near(values(y[0]), {1, 2, 3, 4});
}

TEST(STFT, FramesWindowsAndOnesided) {
  // Frames [1, 2] and [3, 4] (step 2, length 2): bins [3, -1] and [7, -1].
  auto y = run_op({"STFT", {signal4(), i64({2}, {}), Tensor(), i64({2}, {})}, {}, 1, 17});
  EXPECT_EQ(y[0].shape(), (Dims{1, 2, 2, 2}));
  expect_near(values(y[0]), {3, 0, -1, 0, 7, 0, -1, 0});
  // A window [1, 0] keeps the first sample of each frame; step 1 gives three frames.
  y = run_op({"STFT", {signal4(), i64({1}, {}), f32({1, 0}, {2})}, {}, 1, 17});
  EXPECT_EQ(y[0].shape(), (Dims{1, 3, 2, 2}));
  expect_near(values(y[0]), {1, 0, 1, 0, 2, 0, 2, 0, 3, 0, 3, 0});
  // Two-sided.
  y = run_op({"STFT",
              {signal4(), i64({2}, {}), Tensor(), i64({4}, {})},
              attrs({{"onesided", int64_t{0}}}),
              1,
              17});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 4, 2}));
  expect_near(values(y[0]), {10, 0, -2, 2, -2, 0, -2, -2});
  EXPECT_THROW(run_op({"STFT", {signal4(), i64({0}, {}), f32({1, 0}, {2})}, {}, 1, 17}),
               ValueError);
  EXPECT_THROW(
      run_op({"STFT", {signal4(), i64({1}, {}), f32({1, 0}, {2}), i64({3}, {})}, {}, 1, 17}),
      ValueError);
}

TEST(Windows, PeriodicSymmetricAndDtypes) {
  auto run = [](const char* op, int64_t size, int64_t periodic, int64_t dtype = 1) {
    return run_op({op,
                   {Tensor::scalar<int32_t>(static_cast<int32_t>(size))},
                   attrs({{"periodic", periodic}, {"output_datatype", dtype}}),
                   1,
                   17})[0];
  };
  expect_near(values(run("HannWindow", 4, 1)), {0, 0.5, 1, 0.5});
  expect_near(values(run("HannWindow", 3, 0)), {0, 1, 0});
  expect_near(values(run("HammingWindow", 2, 1)), {4.0 / 46, 1});
  expect_near(values(run("BlackmanWindow", 2, 1)), {0, 1});
  expect_near(values(run("BlackmanWindow", 3, 0)), {0, 1, 0});
  Tensor d = run("HannWindow", 4, 1, 11);
  EXPECT_EQ(d.dtype(), DType::kF64);
  EXPECT_EQ(run("HannWindow", 0, 1).shape(), (Dims{0}));
  expect_near(values(run("HannWindow", 1, 0)), {1});  // one point, symmetric
  EXPECT_THROW(run("HannWindow", -1, 1), ValueError);
}

TEST(MelWeightMatrix, TriangularFilters) {
  // 3 filters over 16-point DFT bins at 16 kHz, 0 to 8 kHz: edges land on bins 0, 0, 1, 2, 4.
  auto y = run_op({"MelWeightMatrix",
                   {i64({3}, {}), i64({16}, {}), i64({16000}, {}), Tensor::scalar<float>(0),
                    Tensor::scalar<float>(8000)},
                   {},
                   1,
                   17});
  EXPECT_EQ(y[0].shape(), (Dims{9, 3}));
  V want(27, 0);
  want[0 * 3 + 0] = 1;
  want[1 * 3 + 1] = 1;
  want[2 * 3 + 2] = 1;
  want[3 * 3 + 2] = 0.5;
  EXPECT_EQ(values(y[0]), want);
}

TEST(Det, PivotingBatchesAndEmpty) {
  auto y = run_op({"Det", {f32({1, 2, 3, 4}, {2, 2})}, {}, 1, 22});
  EXPECT_EQ(y[0].shape(), (Dims{}));
  expect_near(values(y[0]), {-2});
  // A zero leading pivot needs a row swap: a permutation matrix with one swap.
  y = run_op(
      {"Det", {f32({0, 1, 0, 1, 0, 0, 0, 0, 1, 2, 0, 0, 0, 3, 0, 0, 0, 4}, {2, 3, 3})}, {}, 1, 22});
  expect_near(values(y[0]), {-1, 24});
  y = run_op({"Det", {f32({}, {2, 0, 0})}, {}, 1, 22});
  EXPECT_EQ(values(y[0]), (V{1, 1}));
  y = run_op({"Det", {f32({1, 2, 2, 4}, {2, 2})}, {}, 1, 22});
  EXPECT_EQ(values(y[0]), (V{0}));
  EXPECT_THROW(run_op({"Det", {f32({1, 2}, {1, 2})}, {}, 1, 22}), ValueError);
}

TEST(SignalOps, MalformedSizesThrow) {
  EXPECT_THROW(run_op({"DFT", {signal4(), i64({0}, {})}, {}, 1, 17}), ValueError);
  EXPECT_THROW(run_op({"DFT", {signal4(), i64({int64_t{1} << 60}, {})}, {}, 1, 17}), ValueError);
  EXPECT_THROW(run_op({"HannWindow", {i64({int64_t{1} << 60}, {})}, {}, 1, 17}), ValueError);
  EXPECT_THROW(run_op({"MelWeightMatrix",
                       {i64({int64_t{1} << 60}, {}), i64({16}, {}), i64({16000}, {}),
                        Tensor::scalar<float>(0), Tensor::scalar<float>(8000)},
                       {},
                       1,
                       17}),
               ValueError);
  EXPECT_THROW(run_op({"MelWeightMatrix",
                       {i64({3}, {}), i64({16}, {}), i64({0}, {}), Tensor::scalar<float>(0),
                        Tensor::scalar<float>(8000)},
                       {},
                       1,
                       17}),
               ValueError);
}

}  // namespace
}  // namespace pto
