// Reference kernels of the reduction family: Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK.
// Expected values are computed by hand (or follow numpy / the ONNX reference where noted).
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

Tensor axes(std::vector<int64_t> a) {
  int64_t n = static_cast<int64_t>(a.size());
  return Tensor::from_vector<int64_t>(a, {n});
}

// x = [[1, 2, 3], [4, 5, 6]]
Tensor x23() {
  return f32({1, 2, 3, 4, 5, 6}, {2, 3});
}

TEST(Reduce, AxesAsInputOrAttributeKeepdims) {
  auto y = run_op({"ReduceSum", {x23(), axes({1})}, attrs({{"keepdims", int64_t{0}}}), 1, 13});
  EXPECT_EQ(y[0].shape(), (Dims{2}));
  EXPECT_EQ(values(y[0]), (V{6, 15}));
  // Opset 11: axes is an attribute; negative axes count from the end.
  y = run_op({"ReduceSum", {x23()}, attrs({{"axes", std::vector<int64_t>{-2}}}), 1, 11});
  EXPECT_EQ(y[0].shape(), (Dims{1, 3}));
  EXPECT_EQ(values(y[0]), (V{5, 7, 9}));
  y = run_op({"ReduceMean", {x23()}, {}, 1, 18});  // no axes: all of them, kept as 1s
  EXPECT_EQ(y[0].shape(), (Dims{1, 1}));
  EXPECT_EQ(values(y[0]), (V{3.5}));
  y = run_op({"ReduceProd", {x23(), axes({0, 1})}, attrs({{"keepdims", int64_t{0}}})});
  EXPECT_EQ(y[0].shape(), Dims{});
  EXPECT_EQ(values(y[0]), (V{720}));
}

TEST(Reduce, NoopWithEmptyAxesReducesEachElementAlone) {
  Attributes noop = attrs({{"noop_with_empty_axes", int64_t{1}}});
  auto y = run_op({"ReduceSum", {x23(), axes({})}, noop, 1, 13});
  EXPECT_EQ(y[0].shape(), (Dims{2, 3}));
  EXPECT_EQ(values(y[0]), (V{1, 2, 3, 4, 5, 6}));
  // As the ONNX reference: the per-element transform still applies.
  y = run_op({"ReduceSumSquare", {f32({-2, 3}, {2})}, noop});
  EXPECT_EQ(values(y[0]), (V{4, 9}));
  y = run_op({"ReduceL2", {f32({-2, 3}, {2})}, noop});
  EXPECT_EQ(values(y[0]), (V{2, 3}));
  // Without the flag an empty axes input reduces everything.
  y = run_op({"ReduceSum", {x23(), axes({})}, {}, 1, 13});
  EXPECT_EQ(values(y[0]), (V{21}));
}

TEST(Reduce, EmptySetsGiveIdentities) {
  Tensor e = Tensor::zeros(DType::kF32, {2, 0});
  auto reduce = [&](const char* op, const Tensor& x) {
    return values(run_op({op, {x, axes({1})}, attrs({{"keepdims", int64_t{0}}})})[0]);
  };
  const double inf = INFINITY;
  EXPECT_EQ(reduce("ReduceSum", e), (V{0, 0}));
  EXPECT_EQ(reduce("ReduceProd", e), (V{1, 1}));
  EXPECT_EQ(reduce("ReduceMax", e), (V{-inf, -inf}));
  EXPECT_EQ(reduce("ReduceMin", e), (V{inf, inf}));
  EXPECT_EQ(reduce("ReduceL1", e), (V{0, 0}));
  EXPECT_EQ(reduce("ReduceL2", e), (V{0, 0}));
  EXPECT_EQ(reduce("ReduceLogSum", e), (V{-inf, -inf}));
  EXPECT_EQ(reduce("ReduceLogSumExp", e), (V{-inf, -inf}));
  EXPECT_EQ(reduce("ReduceSumSquare", e), (V{0, 0}));
  EXPECT_TRUE(std::isnan(reduce("ReduceMean", e)[0]));
  Tensor ei = Tensor::zeros(DType::kI32, {2, 0});
  EXPECT_EQ(reduce("ReduceMax", ei)[0], std::numeric_limits<int32_t>::lowest());
  EXPECT_EQ(reduce("ReduceMin", ei)[0], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(reduce("ReduceMean", ei)[0], 0);  // defined as 0 rather than NaN cast to int
  Tensor eb = Tensor::zeros(DType::kBool, {2, 0});
  EXPECT_EQ(reduce("ReduceMax", eb), (V{0, 0}));
  EXPECT_EQ(reduce("ReduceMin", eb), (V{1, 1}));
  // A zero-sized kept axis gives an empty output.
  auto y = run_op({"ReduceSum", {Tensor::zeros(DType::kF32, {0, 3}), axes({1})}});
  EXPECT_EQ(y[0].shape(), (Dims{0, 1}));
}

TEST(Reduce, IntegersWrapAndTruncate) {
  const int32_t max = std::numeric_limits<int32_t>::max(),
                min = std::numeric_limits<int32_t>::min();
  Tensor x = Tensor::from_vector<int32_t>({max, 1}, {2});
  EXPECT_EQ(values(run_op({"ReduceSum", {x}})[0]), (V{double(min)}));
  EXPECT_EQ(values(run_op({"ReduceL1", {Tensor::from_vector<int32_t>({min}, {1})}})[0]),
            (V{double(min)}));  // |INT_MIN| wraps to itself, as in numpy
  Tensor big = Tensor::from_vector<int64_t>({int64_t{1} << 62, 4}, {2});
  EXPECT_EQ(values(run_op({"ReduceProd", {big}})[0]), (V{0}));  // 2^64 wraps to 0
  EXPECT_EQ(values(run_op({"ReduceMean", {Tensor::from_vector<int32_t>({-3, 0}, {2})}})[0]),
            (V{-1}));  // -1.5 truncates toward zero
  EXPECT_EQ(values(run_op({"ReduceMean", {Tensor::from_vector<uint8_t>({255, 255}, {2})}})[0]),
            (V{127}));  // the sum wraps in uint8 first, as numpy's mean with dtype=uint8
  EXPECT_EQ(values(run_op({"ReduceL2", {Tensor::from_vector<int64_t>({3, 4}, {2})}})[0]), (V{5}));
  EXPECT_EQ(values(run_op({"ReduceMax", {Tensor::from_vector<bool>({false, true}, {2})}})[0]),
            (V{1}));
}

TEST(Reduce, LogSumExpIsStableAndNaNPropagates) {
  auto y = run_op({"ReduceLogSumExp", {Tensor::from_vector<double>({1000, 1000}, {2})}});
  EXPECT_DOUBLE_EQ(values(y[0])[0], 1000 + std::log(2.0));
  y = run_op({"ReduceLogSumExp", {f32({1, INFINITY}, {2})}});
  EXPECT_EQ(values(y[0])[0], INFINITY);
  y = run_op({"ReduceLogSumExp", {f32({-INFINITY, -INFINITY}, {2})}});
  EXPECT_EQ(values(y[0])[0], -INFINITY);
  y = run_op({"ReduceMax", {f32({1, NAN, 3}, {3})}});
  EXPECT_TRUE(std::isnan(values(y[0])[0]));
  y = run_op({"ReduceMin", {f32({NAN, 1}, {2})}});
  EXPECT_TRUE(std::isnan(values(y[0])[0]));
}

TEST(Reduce, HalfTypesAccumulateWide) {
  // 4096 ones sum to 4096 (a float16 running sum would stop at 2048).
  Tensor x = Tensor::empty(DType::kF16, {4096});
  for (int i = 0; i < 4096; ++i) x.data<Float16>()[i] = Float16(1.0f);
  EXPECT_EQ(values(run_op({"ReduceSum", {x}})[0]), (V{4096}));
}

TEST(Reduce, BadAxesAndDtypesAreErrors) {
  std::string msg = error_of<ValueError>([] {
    run_op({"ReduceSum", {x23(), axes({2})}, {}, 1, 13});
  });
  EXPECT_NE(msg.find("node0"), std::string::npos) << msg;
  EXPECT_THROW(run_op({"ReduceMax", {x23(), axes({1, -1})}}), ValueError);
  EXPECT_THROW(run_op({"ReduceSum", {Tensor::zeros(DType::kBool, {2})}}), UnsupportedError);
  // Integer LogSum inputs were allowed up to opset 18 and removed in 28.
  Tensor ints = Tensor::from_vector<int32_t>({1, 2}, {2});
  EXPECT_EQ(values(run_op({"ReduceLogSum", {ints}, {}, 1, 18})[0]), (V{1}));  // log 3, truncated
  EXPECT_THROW(run_op({"ReduceLogSum", {ints}, {}, 1, 28}), TypeError);
}

TEST(ArgMax, KeepdimsLastIndexAndNaN) {
  Tensor x = f32({2, 5, 5, 1, 0, 1}, {2, 3});
  auto y = run_op({"ArgMax", {x}, attrs({{"axis", int64_t{1}}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 1}));
  EXPECT_EQ(values(y[0]), (V{1, 0}));
  y = run_op({"ArgMax", {x}, attrs({{"axis", int64_t{-1}}, {"select_last_index", int64_t{1}}})});
  EXPECT_EQ(values(y[0]), (V{2, 2}));
  y = run_op({"ArgMin", {x}, attrs({{"keepdims", int64_t{0}}})});
  EXPECT_EQ(y[0].shape(), (Dims{3}));
  EXPECT_EQ(values(y[0]), (V{1, 1, 1}));
  // NaN wins for both (numpy's first NaN).
  Tensor n = f32({1, NAN, 3, NAN}, {4});
  EXPECT_EQ(values(run_op({"ArgMax", {n}})[0]), (V{1}));
  EXPECT_EQ(values(run_op({"ArgMin", {n}})[0]), (V{1}));
  EXPECT_EQ(values(run_op({"ArgMin", {n}, attrs({{"select_last_index", int64_t{1}}})})[0]), (V{3}));
  EXPECT_THROW(
      run_op({"ArgMax", {Tensor::zeros(DType::kF32, {2, 0})}, attrs({{"axis", int64_t{1}}})}),
      ValueError);
  // An empty output needs no element of the empty axis.
  auto e = run_op({"ArgMax", {Tensor::zeros(DType::kF32, {0, 3})}, attrs({{"axis", int64_t{1}}})});
  EXPECT_EQ(e[0].shape(), (Dims{0, 1}));
}

TEST(CumSum, ExclusiveReverseAndAxisForms) {
  Tensor x = f32({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor axis1 = Tensor::scalar<int32_t>(1);
  EXPECT_EQ(values(run_op({"CumSum", {x, axis1}})[0]), (V{1, 3, 6, 4, 9, 15}));
  EXPECT_EQ(values(run_op({"CumSum", {x, axis1}, attrs({{"exclusive", int64_t{1}}})})[0]),
            (V{0, 1, 3, 0, 4, 9}));
  EXPECT_EQ(values(run_op({"CumSum", {x, axis1}, attrs({{"reverse", int64_t{1}}})})[0]),
            (V{6, 5, 3, 15, 11, 6}));
  EXPECT_EQ(values(run_op({"CumSum",
                           {x, Tensor::from_vector<int64_t>({-2}, {1})},
                           attrs({{"reverse", int64_t{1}}, {"exclusive", int64_t{1}}})})[0]),
            (V{4, 5, 6, 0, 0, 0}));
  EXPECT_EQ(values(run_op({"CumProd", {x, axis1}})[0]), (V{1, 2, 6, 4, 20, 120}));
  Tensor big = Tensor::from_vector<int32_t>({std::numeric_limits<int32_t>::max(), 1}, {2});
  EXPECT_EQ(values(run_op({"CumSum", {big, Tensor::scalar<int64_t>(0)}})[0]),
            (V{2147483647.0, -2147483648.0}));
  EXPECT_THROW(run_op({"CumSum", {x, Tensor::scalar<int64_t>(2)}}), ValueError);
  EXPECT_THROW(run_op({"CumSum", {x, axes({0, 1})}}), ValueError);
}

TEST(TopK, StableTiesLargestSmallestAndNaN) {
  Tensor x = f32({3, 1, 3, 2, 1}, {5});
  Tensor k3 = Tensor::from_vector<int64_t>({3}, {1});
  auto y = run_op({"TopK", {x, k3}, {}, 2, 11});
  EXPECT_EQ(values(y[0]), (V{3, 3, 2}));
  EXPECT_EQ(values(y[1]), (V{0, 2, 3}));
  y = run_op({"TopK", {x, k3}, attrs({{"largest", int64_t{0}}}), 2, 11});
  EXPECT_EQ(values(y[0]), (V{1, 1, 2}));
  EXPECT_EQ(values(y[1]), (V{1, 4, 3}));
  // NaN orders above every number, as in the ONNX reference's lexsort.
  Tensor n = f32({1, NAN, 2}, {3});
  Tensor k2 = Tensor::from_vector<int64_t>({2}, {1});
  EXPECT_EQ(values(run_op({"TopK", {n, k2}, {}, 2, 11})[1]), (V{1, 2}));
  EXPECT_EQ(values(run_op({"TopK", {n, k2}, attrs({{"largest", int64_t{0}}}), 2, 11})[1]),
            (V{0, 2}));
  // Opset 1: k is an attribute; axis 0 of a matrix.
  Tensor m = f32({1, 9, 5, 2}, {2, 2});
  y = run_op({"TopK", {m}, attrs({{"k", int64_t{1}}, {"axis", int64_t{0}}}), 2, 1});
  EXPECT_EQ(y[0].shape(), (Dims{1, 2}));
  EXPECT_EQ(values(y[0]), (V{5, 9}));
  EXPECT_EQ(values(y[1]), (V{1, 0}));
  EXPECT_EQ(run_op({"TopK", {x, Tensor::from_vector<int64_t>({0}, {1})}, {}, 2, 11})[0].numel(), 0);
  EXPECT_THROW(run_op({"TopK", {x, Tensor::from_vector<int64_t>({6}, {1})}, {}, 2, 11}),
               ValueError);
  EXPECT_THROW(run_op({"TopK", {x, Tensor::from_vector<int64_t>({-1}, {1})}, {}, 2, 11}),
               ValueError);
}

}  // namespace
}  // namespace pto
