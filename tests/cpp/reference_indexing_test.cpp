// Reference kernels of the indexing family: gathers, scatters, OneHot, NonZero, Compress, Unique,
// ReverseSequence and TensorScatter. Expected values are computed by hand.
#include <gtest/gtest.h>

#include <cmath>

#include "single_op_test_util.h"

namespace pto {
namespace {

using testing::attrs;
using testing::error_of;
using testing::f32;
using testing::i64;
using testing::OpCall;
using testing::run_op;
using testing::values;
using V = std::vector<double>;

// x = [[0, 1, 2], [3, 4, 5]]
Tensor x23() {
  return f32({0, 1, 2, 3, 4, 5}, {2, 3});
}

TEST(Gather, AxesNegativeIndicesAndBounds) {
  auto y = run_op({"Gather", {x23(), i64({-1, 0}, {2})}});
  EXPECT_EQ(y[0].shape(), (Dims{2, 3}));
  EXPECT_EQ(values(y[0]), (V{3, 4, 5, 0, 1, 2}));
  y = run_op({"Gather", {x23(), i64({2, 0, 1, 1}, {2, 2})}, attrs({{"axis", int64_t{1}}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 2, 2}));
  EXPECT_EQ(values(y[0]), (V{2, 0, 1, 1, 5, 3, 4, 4}));
  y = run_op({"Gather", {x23(), Tensor::scalar<int32_t>(1)}});  // a scalar index drops the axis
  EXPECT_EQ(y[0].shape(), (Dims{3}));
  EXPECT_EQ(values(y[0]), (V{3, 4, 5}));
  std::string msg = error_of<ValueError>([] { run_op({"Gather", {x23(), i64({2}, {1})}}); });
  EXPECT_NE(msg.find("node0"), std::string::npos) << msg;
  EXPECT_THROW(run_op({"Gather", {x23(), i64({-3}, {1})}}), ValueError);
  EXPECT_THROW(run_op({"Gather", {x23(), f32({0}, {1})}}), TypeError);
  // Bool data moves as raw elements.
  y = run_op({"Gather", {Tensor::from_vector<bool>({true, false}, {2}), i64({1, 0, 0}, {3})}});
  EXPECT_EQ(values(y[0]), (V{0, 1, 1}));
}

TEST(GatherElements, AlongAxisWithBounds) {
  auto y = run_op(
      {"GatherElements", {x23(), i64({2, -3, 1, 1}, {2, 2})}, attrs({{"axis", int64_t{1}}})});
  EXPECT_EQ(values(y[0]), (V{2, 0, 4, 4}));
  EXPECT_THROW(run_op({"GatherElements", {x23(), i64({3}, {1, 1})}, attrs({{"axis", int64_t{1}}})}),
               ValueError);
  // indices larger than data on a non-gathered axis would read out of bounds.
  EXPECT_THROW(
      run_op({"GatherElements", {x23(), i64({0, 0, 0}, {3, 1})}, attrs({{"axis", int64_t{1}}})}),
      ValueError);
  EXPECT_THROW(run_op({"GatherElements", {x23(), i64({0}, {1})}}), ValueError);
}

TEST(GatherND, BatchDimsAndSlices) {
  // data [2, 2, 2]: 0..7
  Tensor data = f32({0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2});
  auto y = run_op({"GatherND", {data, i64({1, 0, 0, -1}, {2, 2})}});
  EXPECT_EQ(y[0].shape(), (Dims{2, 2}));
  EXPECT_EQ(values(y[0]), (V{4, 5, 2, 3}));
  y = run_op({"GatherND", {data, i64({1, 0}, {2, 1})}, attrs({{"batch_dims", int64_t{1}}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 2}));
  EXPECT_EQ(values(y[0]), (V{2, 3, 4, 5}));
  y = run_op({"GatherND", {data, i64({1, 1, 0}, {1, 3})}});
  EXPECT_EQ(values(y[0]), (V{6}));
  EXPECT_THROW(run_op({"GatherND", {data, i64({2, 0}, {1, 2})}}), ValueError);
  EXPECT_THROW(run_op({"GatherND", {data, i64({0, 0, 0, 0}, {1, 4})}}), ValueError);
  EXPECT_THROW(
      run_op({"GatherND", {data, i64({0, 0, 0}, {3, 1})}, attrs({{"batch_dims", int64_t{1}}})}),
      ValueError);  // batch dimension mismatch
}

TEST(ScatterElements, ReductionsApplyInOrder) {
  Tensor data = f32({1, 1, 1, 1}, {4});
  Tensor ind = i64({1, 1, -1}, {3});
  Tensor upd = f32({2, 3, 5}, {3});
  EXPECT_EQ(values(run_op({"ScatterElements", {data, ind, upd}})[0]), (V{1, 3, 1, 5}));
  EXPECT_EQ(
      values(run_op(
          {"ScatterElements", {data, ind, upd}, attrs({{"reduction", std::string("add")}})})[0]),
      (V{1, 6, 1, 6}));
  EXPECT_EQ(
      values(run_op(
          {"ScatterElements", {data, ind, upd}, attrs({{"reduction", std::string("mul")}})})[0]),
      (V{1, 6, 1, 5}));
  EXPECT_EQ(
      values(run_op(
          {"ScatterElements", {data, ind, upd}, attrs({{"reduction", std::string("max")}})})[0]),
      (V{1, 3, 1, 5}));
  EXPECT_EQ(
      values(run_op(
          {"ScatterElements", {data, ind, upd}, attrs({{"reduction", std::string("min")}})})[0]),
      (V{1, 1, 1, 1}));
  // Old name, opset 9.
  EXPECT_EQ(values(run_op({"Scatter", {data, i64({0}, {1}), f32({7}, {1})}, {}, 1, 9})[0]),
            (V{7, 1, 1, 1}));
  EXPECT_THROW(run_op({"ScatterElements", {data, i64({4}, {1}), f32({7}, {1})}}), ValueError);
  EXPECT_THROW(run_op({"ScatterElements", {data, ind, f32({1}, {1})}}), ValueError);
  EXPECT_THROW(
      run_op({"ScatterElements", {data, ind, upd}, attrs({{"reduction", std::string("avg")}})}),
      ValueError);
  // Integer add wraps.
  Tensor d8 = Tensor::from_vector<int8_t>({127}, {1});
  Tensor u8 = Tensor::from_vector<int8_t>({1}, {1});
  EXPECT_EQ(values(run_op({"ScatterElements",
                           {d8, i64({0}, {1}), u8},
                           attrs({{"reduction", std::string("add")}})})[0]),
            (V{-128}));
}

TEST(ScatterND, SlicesAndReduction) {
  Tensor data = f32({0, 1, 2, 3}, {2, 2});
  auto y = run_op({"ScatterND", {data, i64({-1}, {1, 1}), f32({8, 9}, {1, 2})}});
  EXPECT_EQ(values(y[0]), (V{0, 1, 8, 9}));
  y = run_op({"ScatterND",
              {data, i64({0, 1, 0, 1}, {2, 2}), f32({5, 5}, {2})},
              attrs({{"reduction", std::string("add")}})});
  EXPECT_EQ(values(y[0]), (V{0, 11, 2, 3}));
  EXPECT_THROW(run_op({"ScatterND", {data, i64({2}, {1, 1}), f32({8, 9}, {1, 2})}}), ValueError);
  EXPECT_THROW(run_op({"ScatterND", {data, i64({0}, {1, 1}), f32({8}, {1, 1})}}), ValueError);
}

TEST(OneHot, NegativeOutOfRangeAxisAndFloatDepth) {
  Tensor vals = f32({0, 5}, {2});
  auto y = run_op({"OneHot", {i64({1, -1, 3}, {3}), Tensor::scalar<float>(3.0f), vals}});
  EXPECT_EQ(y[0].shape(), (Dims{3, 3}));
  EXPECT_EQ(values(y[0]), (V{0, 5, 0, 0, 0, 5, 0, 0, 0}));  // 3 is out of range: all off
  y = run_op(
      {"OneHot", {f32({0.7f, 1.2f}, {2}), i64({2}, {1}), vals}, attrs({{"axis", int64_t{0}}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 2}));
  EXPECT_EQ(values(y[0]), (V{5, 0, 0, 5}));  // float indices truncate
  // Opset 9 accepts only [0, depth): a negative index gives all off_value.
  y = run_op({"OneHot", {i64({-1}, {1}), i64({2}, {1}), vals}, {}, 1, 9});
  EXPECT_EQ(values(y[0]), (V{0, 0}));
  EXPECT_THROW(run_op({"OneHot", {i64({0}, {1}), i64({0}, {1}), vals}}), ValueError);
  EXPECT_THROW(run_op({"OneHot", {i64({0}, {1}), i64({2}, {1}), f32({0}, {1})}}), ValueError);
}

TEST(NonZero, CoordinatesInRowMajorOrder) {
  auto y = run_op({"NonZero", {f32({0, 1, NAN, 0, 0, 2}, {2, 3})}});
  EXPECT_EQ(y[0].shape(), (Dims{2, 3}));
  EXPECT_EQ(values(y[0]), (V{0, 0, 1, 1, 2, 2}));
  y = run_op({"NonZero", {Tensor::scalar<int32_t>(4)}});
  EXPECT_EQ(y[0].shape(), (Dims{0, 1}));
  y = run_op({"NonZero", {Tensor::zeros(DType::kBool, {3})}});
  EXPECT_EQ(y[0].shape(), (Dims{1, 0}));
}

TEST(Compress, AxisFlattenAndShortCondition) {
  Tensor cond = Tensor::from_vector<bool>({false, true}, {2});
  auto y = run_op({"Compress", {x23(), cond}, attrs({{"axis", int64_t{1}}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 1}));
  EXPECT_EQ(values(y[0]), (V{1, 4}));
  y = run_op({"Compress", {x23(), Tensor::from_vector<bool>({true, false, false, true}, {4})}});
  EXPECT_EQ(values(y[0]), (V{0, 3}));
  Tensor long_cond = Tensor::from_vector<bool>({true, false, true}, {3});
  EXPECT_THROW(run_op({"Compress", {x23(), long_cond}, attrs({{"axis", int64_t{0}}})}), ValueError);
  y = run_op({"Compress",
              {x23(), Tensor::from_vector<bool>({true, false, false}, {3})},
              attrs({{"axis", int64_t{0}}})});
  EXPECT_EQ(y[0].shape(), (Dims{1, 3}));
}

TEST(Unique, SortedUnsortedAxisAndNaN) {
  Tensor x = f32({2, 1, 2, NAN, 1, NAN}, {6});
  auto y = run_op({"Unique", {x}, {}, 4, 11});
  V u = values(y[0]);
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[0], 1);
  EXPECT_EQ(u[1], 2);
  EXPECT_TRUE(std::isnan(u[2]));
  EXPECT_EQ(values(y[1]), (V{1, 0, 3}));
  EXPECT_EQ(values(y[2]), (V{1, 0, 1, 2, 0, 2}));
  EXPECT_EQ(values(y[3]), (V{2, 2, 2}));
  y = run_op({"Unique", {x}, attrs({{"sorted", int64_t{0}}}), 4, 11});
  EXPECT_EQ(values(y[0])[0], 2);
  EXPECT_EQ(values(y[1]), (V{0, 1, 3}));
  EXPECT_EQ(values(y[2]), (V{0, 1, 0, 2, 1, 2}));
  // Along axis 1: columns [1, 3], [0, 2], [1, 3] -> [0, 2], [1, 3].
  Tensor m = f32({1, 0, 1, 3, 2, 3}, {2, 3});
  y = run_op({"Unique", {m}, attrs({{"axis", int64_t{-1}}}), 4, 11});
  EXPECT_EQ(y[0].shape(), (Dims{2, 2}));
  EXPECT_EQ(values(y[0]), (V{0, 1, 2, 3}));
  EXPECT_EQ(values(y[1]), (V{1, 0}));
  EXPECT_EQ(values(y[2]), (V{1, 0, 1}));
  EXPECT_EQ(values(y[3]), (V{1, 2}));
  y = run_op({"Unique", {m}, attrs({{"axis", int64_t{1}}, {"sorted", int64_t{0}}}), 1, 11});
  EXPECT_EQ(values(y[0]), (V{1, 0, 3, 2}));
  EXPECT_EQ(run_op({"Unique", {Tensor::zeros(DType::kI32, {0})}, {}, 4, 11})[0].numel(), 0);
}

TEST(ReverseSequence, BatchAndTimeAxes) {
  // time_axis 0, batch_axis 1: x[t, b]
  Tensor x = f32({0, 1, 2, 3, 4, 5}, {3, 2});
  auto y = run_op({"ReverseSequence", {x, i64({3, 1}, {2})}, {}, 1, 10});
  EXPECT_EQ(values(y[0]), (V{4, 1, 2, 3, 0, 5}));
  y = run_op({"ReverseSequence",
              {x23(), i64({2, 3}, {2})},
              attrs({{"batch_axis", int64_t{0}}, {"time_axis", int64_t{1}}}),
              1,
              10});
  EXPECT_EQ(values(y[0]), (V{1, 0, 2, 5, 4, 3}));
  EXPECT_THROW(run_op({"ReverseSequence", {x, i64({4, 1}, {2})}, {}, 1, 10}), ValueError);
  EXPECT_THROW(run_op({"ReverseSequence", {x, i64({1}, {1})}, {}, 1, 10}), ValueError);
}

TEST(TensorScatter, LinearAndCircular) {
  Tensor cache = Tensor::zeros(DType::kF32, {2, 3, 1});
  Tensor upd = f32({1, 2, 3, 4}, {2, 2, 1});
  auto y = run_op({"TensorScatter", {cache, upd, i64({1, 0}, {2})}, {}, 1, 24});
  EXPECT_EQ(values(y[0]), (V{0, 1, 2, 3, 4, 0}));
  y = run_op({"TensorScatter",
              {cache, upd, i64({2, 0}, {2})},
              attrs({{"mode", std::string("circular")}}),
              1,
              24});
  EXPECT_EQ(values(y[0]), (V{2, 0, 1, 3, 4, 0}));
  EXPECT_THROW(run_op({"TensorScatter", {cache, upd, i64({2, 0}, {2})}, {}, 1, 24}), ValueError);
  y = run_op({"TensorScatter", {cache, upd}, {}, 1, 24});  // no write_indices: start at 0
  EXPECT_EQ(values(y[0]), (V{1, 2, 0, 3, 4, 0}));
}

}  // namespace
}  // namespace pto
