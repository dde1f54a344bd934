// Reference kernels of the image family: GridSample, AffineGrid, CenterCropPad, Col2Im, RoiAlign,
// MaxUnpool and NonMaxSuppression. Expected values are computed by hand.
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

// GridSample on X = [[1, 2], [3, 4]] (1 x 1 x 2 x 2) at the given (x, y) grid points.
std::vector<double> sample22(std::vector<float> xy, const std::string& mode, const std::string& pad,
                             int64_t align) {
  const int64_t n = static_cast<int64_t>(xy.size()) / 2;
  auto y = run_op({"GridSample",
                   {f32({1, 2, 3, 4}, {1, 1, 2, 2}), f32(xy, {1, 1, n, 2})},
                   attrs({{"mode", mode}, {"padding_mode", pad}, {"align_corners", align}}),
                   1,
                   22});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 1, n}));
  return values(y[0]);
}

TEST(GridSample, BilinearPaddingAndAlignCorners) {
  // Center, then the top-left corner, then past the top-left corner.
  const std::vector<float> pts{0, 0, -1, -1, -1.5f, -1.5f};
  // align_corners=0: the corner (-1, -1) is pixel (-0.5, -0.5); -1.5 is pixel -1.
  expect_near(sample22(pts, "linear", "zeros", 0), {2.5, 0.25, 0});
  expect_near(sample22(pts, "linear", "border", 0), {2.5, 1, 1});
  // Reflection about -0.5: pixel -1 reflects to 0.
  expect_near(sample22(pts, "linear", "reflection", 0), {2.5, 1, 1});
  // align_corners=1: (-1, -1) is pixel (0, 0); -1.5 is pixel -0.25, 0.75 of pixel 0 per axis.
  expect_near(sample22(pts, "linear", "zeros", 1), {2.5, 1, 0.5625});
  // Reflection about 0: -0.25 reflects to 0.25, so 1 + 0.25 * 1 + 0.25 * 2.
  expect_near(sample22(pts, "linear", "reflection", 1), {2.5, 1, 1.75});
  // Old spelling (opset 16).
  auto y = run_op({"GridSample",
                   {f32({1, 2, 3, 4}, {1, 1, 2, 2}), f32({0, 0}, {1, 1, 1, 2})},
                   attrs({{"mode", std::string("bilinear")}}),
                   1,
                   16});
  expect_near(values(y[0]), {2.5});
}

TEST(GridSample, NearestRoundsHalfToEvenAndKeepsIntegers) {
  // 1-D: X = [10, 20, 30, 40]; align_corners=0 maps n to ((n + 1) * 4 - 1) / 2.
  Tensor x = Tensor::from_vector<int32_t>({10, 20, 30, 40}, {1, 1, 4});
  auto y = run_op({"GridSample",
                   {x, f32({-0.5f, 0, 0.5f, 2}, {1, 4, 1})},
                   attrs({{"mode", std::string("nearest")}}),
                   1,
                   22});
  EXPECT_EQ(y[0].dtype(), DType::kI32);
  // x = 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 5.5 -> 6, out of range (zeros).
  EXPECT_EQ(values(y[0]), (V{10, 30, 30, 0}));
  // Interpolating integers is not supported.
  EXPECT_THROW(run_op({"GridSample", {x, f32({0}, {1, 1, 1})}, {}, 1, 22}), UnsupportedError);
}

TEST(GridSample, CubicWeightsAndNDims) {
  // Keys' cubic (a = -0.75) on 1-D X = [0, 1, 2, 3, 4]: symmetric at t = 0.5, so exact there;
  // at t = 0.2 the weights are -0.096, 0.92, 0.2, -0.024 over pixels 1..4.
  Tensor x = f32({0, 1, 2, 3, 4}, {1, 1, 5});
  // align_corners=1: x = (n + 1) * 2, so n = -0.25 -> 1.5, n = 0.1 -> 2.2.
  auto y = run_op({"GridSample",
                   {x, f32({-0.25f, 0.1f}, {1, 2, 1})},
                   attrs({{"mode", std::string("cubic")}, {"align_corners", int64_t{1}}}),
                   1,
                   22});
  expect_near(values(y[0]), {1.5, 2.248});
  // 3-D trilinear: the center of a 2x2x2 cube is the mean of its corners.
  Tensor cube = f32({0, 1, 2, 3, 4, 5, 6, 7}, {1, 1, 2, 2, 2});
  y = run_op({"GridSample", {cube, f32({0, 0, 0}, {1, 1, 1, 1, 3})}, {}, 1, 22});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 1, 1, 1}));
  expect_near(values(y[0]), {3.5});
  // The grid's last axis is (x, y, z): x moves along the last axis of X.
  y = run_op({"GridSample",
              {cube, f32({1, -1, -1}, {1, 1, 1, 1, 3})},
              attrs({{"align_corners", int64_t{1}}}),
              1,
              22});
  expect_near(values(y[0]), {1});
}

TEST(GridSample, BadInputs) {
  Tensor x = f32({1, 2, 3, 4}, {1, 1, 2, 2});
  EXPECT_THROW(run_op({"GridSample", {x, f32({0, 0, 0}, {1, 1, 1, 3})}, {}, 1, 22}), ValueError);
  EXPECT_THROW(run_op({"GridSample", {x, f32({0, 0, 0, 0}, {2, 1, 1, 2})}, {}, 1, 22}), ValueError);
  EXPECT_THROW(run_op({"GridSample",
                       {x, f32({0, 0}, {1, 1, 1, 2})},
                       attrs({{"mode", std::string("area")}}),
                       1,
                       22}),
               ValueError);
  // A NaN coordinate gives NaN; huge ones read padding without overflowing an index.
  auto y = run_op({"GridSample", {x, f32({NAN, 0, 1e30f, -1e30f}, {1, 1, 2, 2})}, {}, 1, 22});
  EXPECT_TRUE(std::isnan(values(y[0])[0]));
  EXPECT_EQ(values(y[0])[1], 0);
  y = run_op({"GridSample",
              {x, f32({1e30f, -1e30f}, {1, 1, 1, 2})},
              attrs({{"padding_mode", std::string("reflection")}}),
              1,
              22});
  EXPECT_TRUE(std::isfinite(values(y[0])[0]));
}

TEST(AffineGrid, IdentityThetaGivesTheBaseGrid) {
  Tensor theta = f32({1, 0, 0, 0, 1, 0}, {1, 2, 3});
  auto y = run_op({"AffineGrid", {theta, i64({1, 1, 2, 3}, {4})}, {}, 1, 20});
  EXPECT_EQ(y[0].shape(), (Dims{1, 2, 3, 2}));
  const double t = 2.0 / 3;  // pixel centers of a 3-wide axis: -2/3, 0, 2/3
  expect_near(values(y[0]), {-t, -0.5, 0, -0.5, t, -0.5, -t, 0.5, 0, 0.5, t, 0.5});
  y = run_op({"AffineGrid",
              {theta, i64({1, 1, 2, 3}, {4})},
              attrs({{"align_corners", int64_t{1}}}),
              1,
              20});
  expect_near(values(y[0]), {-1, -1, 0, -1, 1, -1, -1, 1, 0, 1, 1, 1});
  // 3-D with a translation in z.
  Tensor theta3 = f32({1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0.5f}, {1, 3, 4});
  y = run_op({"AffineGrid", {theta3, i64({1, 1, 1, 1, 2}, {5})}, {}, 1, 20});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 1, 2, 3}));
  expect_near(values(y[0]), {-0.5, 0, 0.5, 0.5, 0, 0.5});
  EXPECT_THROW(run_op({"AffineGrid", {theta, i64({2, 1, 2, 3}, {4})}, {}, 1, 20}), ValueError);
  EXPECT_THROW(run_op({"AffineGrid", {theta, i64({1, 1, 2}, {3})}, {}, 1, 20}), ValueError);
}

TEST(CenterCropPad, CropsAndPadsAroundTheCenter) {
  // Crop 5 -> 2 starts at (5 - 2) / 2 = 1; pad 3 -> 6 puts one zero before, two after.
  auto y = run_op({"CenterCropPad", {f32({1, 2, 3, 4, 5}, {5}), i64({2}, {1})}});
  EXPECT_EQ(values(y[0]), (V{2, 3}));
  y = run_op({"CenterCropPad", {f32({1, 2, 3}, {3}), i64({6}, {1})}});
  EXPECT_EQ(values(y[0]), (V{0, 1, 2, 3, 0, 0}));
  // Only the listed (negative) axis changes.
  y = run_op({"CenterCropPad",
              {f32({1, 2, 3, 4, 5, 6}, {2, 3}), Tensor::from_vector<int32_t>({1}, {1})},
              attrs({{"axes", std::vector<int64_t>{-1}}})});
  EXPECT_EQ(y[0].shape(), (Dims{2, 1}));
  EXPECT_EQ(values(y[0]), (V{2, 5}));
  EXPECT_THROW(run_op({"CenterCropPad", {f32({1}, {1}), i64({1, 1}, {2})}}), ValueError);
  EXPECT_THROW(run_op({"CenterCropPad", {f32({1}, {1}), i64({-1}, {1})}}), ValueError);
}

TEST(Col2Im, SumsOverlappingBlocks) {
  // Image 2 x 3, blocks 1 x 2: 2 x 2 block positions; every block writes ones.
  Tensor x = f32(std::vector<float>(8, 1), {1, 2, 4});
  auto y = run_op({"Col2Im", {x, i64({2, 3}, {2}), i64({1, 2}, {2})}});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 2, 3}));
  EXPECT_EQ(values(y[0]), (V{1, 2, 1, 1, 2, 1}));
  // Pads: blocks that fall on the padding are dropped.
  y = run_op({"Col2Im",
              {f32({1, 2, 3}, {1, 1, 3}), i64({1, 1}, {2}), i64({1, 1}, {2})},
              attrs({{"pads", std::vector<int64_t>{0, 1, 0, 1}}})});
  EXPECT_EQ(values(y[0]), (V{2}));
  // The block count must match L, and C * K must divide.
  EXPECT_THROW(run_op({"Col2Im", {f32({1, 2}, {1, 1, 2}), i64({2, 2}, {2}), i64({1, 1}, {2})}}),
               ValueError);
  EXPECT_THROW(run_op({"Col2Im", {x, i64({2, 3}, {2}), i64({3, 1}, {2})}}), ValueError);
}

TEST(RoiAlign, SamplingModesAndOpsetDefault) {
  // X[h, w] = w on a 4 x 4 map; bilinear sampling reproduces it exactly.
  std::vector<float> ramp;
  for (int h = 0; h < 4; ++h)
    for (int w = 0; w < 4; ++w) ramp.push_back(static_cast<float>(w));
  Tensor x = f32(ramp, {1, 1, 4, 4});
  Tensor rois = f32({1, 1, 3, 3}, {1, 4});
  auto run = [&](Attributes a, int opset) {
    a.set("sampling_ratio", int64_t{2});
    return values(run_op({"RoiAlign", {x, rois, i64({0}, {1})}, a, 1, opset})[0]);
  };
  // output_half_pixel: samples at x = 1.5 and 2.5; half_pixel shifts them by -0.5.
  expect_near(
      run(attrs({{"coordinate_transformation_mode", std::string("output_half_pixel")}}), 22),
      {2.0});
  expect_near(run({}, 22), {1.5});
  expect_near(run({}, 10), {2.0});  // opset 10 had no half-pixel shift
  // max: the largest weighted corner of each sample; every corner weighs 0.25 here, so the
  // corner x = 3 of the samples at x = 2.5 wins: 0.25 * 3.
  expect_near(run(attrs({{"mode", std::string("max")},
                         {"coordinate_transformation_mode", std::string("output_half_pixel")}}),
                  22),
              {0.75});
  EXPECT_THROW(run_op({"RoiAlign", {x, rois, i64({1}, {1})}, {}, 1, 22}), ValueError);
  EXPECT_THROW(run_op({"RoiAlign", {x, f32({1, 1, 3}, {1, 3}), i64({0}, {1})}, {}, 1, 22}),
               ValueError);
}

TEST(MaxUnpool, ScattersAndPadsToOutputShape) {
  Attributes a = attrs(
      {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}});
  Tensor x = f32({5, 6, 7, 8}, {1, 1, 2, 2});
  Tensor ind = i64({5, 7, 13, 15}, {1, 1, 2, 2});
  auto y = run_op({"MaxUnpool", {x, ind}, a, 1, 22});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 4, 4}));
  EXPECT_EQ(values(y[0]), (V{0, 0, 0, 0, 0, 5, 0, 6, 0, 0, 0, 0, 0, 7, 0, 8}));
  y = run_op({"MaxUnpool", {x, ind, i64({1, 1, 5, 5}, {4})}, a, 1, 22});
  EXPECT_EQ(y[0].shape(), (Dims{1, 1, 5, 5}));
  EXPECT_EQ(values(y[0])[6], 5);  // (1, 1) of the 4 x 4 result, at the origin of the 5 x 5
  EXPECT_EQ(values(y[0])[18], 8);
  EXPECT_THROW(run_op({"MaxUnpool", {x, i64({5, 7, 13, 16}, {1, 1, 2, 2})}, a, 1, 22}), ValueError);
  EXPECT_THROW(run_op({"MaxUnpool", {x, ind, i64({1, 1, 3, 3}, {4})}, a, 1, 22}), ValueError);
}

TEST(NonMaxSuppression, SuppressesByIouAndScore) {
  // Box 1 overlaps box 0 with IoU 0.9 / 1.1; box 2 is far away.
  Tensor boxes = f32({0, 0, 1, 1, 0.1f, 0, 1.1f, 1, 5, 5, 6, 6}, {1, 3, 4});
  Tensor scores = f32({0.8f, 0.9f, 0.3f}, {1, 1, 3});
  auto run = [&](std::vector<Tensor> extra, int64_t center = 0) {
    std::vector<Tensor> in{boxes, scores};
    in.insert(in.end(), extra.begin(), extra.end());
    return run_op({"NonMaxSuppression", in, attrs({{"center_point_box", center}}), 1, 11})[0];
  };
  Tensor y = run({i64({10}, {1}), f32({0.5f}, {1})});
  EXPECT_EQ(y.shape(), (Dims{2, 3}));
  EXPECT_EQ(values(y), (V{0, 0, 1, 0, 0, 2}));
  // A higher IoU threshold keeps box 0 too; max_output_boxes_per_class caps the count.
  EXPECT_EQ(values(run({i64({10}, {1}), f32({0.9f}, {1})})), (V{0, 0, 1, 0, 0, 0, 0, 0, 2}));
  EXPECT_EQ(values(run({i64({1}, {1}), f32({0.9f}, {1})})), (V{0, 0, 1}));
  // score_threshold drops box 2; no max_output_boxes_per_class means no output.
  EXPECT_EQ(values(run({i64({10}, {1}), f32({0.5f}, {1}), f32({0.5f}, {1})})), (V{0, 0, 1}));
  EXPECT_EQ(run({}).shape(), (Dims{0, 3}));
  // Center format: the same boxes as [x_center, y_center, width, height].
  boxes = f32({0.5f, 0.5f, 1, 1, 0.6f, 0.5f, 1, 1, 5.5f, 5.5f, 1, 1}, {1, 3, 4});
  EXPECT_EQ(values(run({i64({10}, {1}), f32({0.5f}, {1})}, 1)), (V{0, 0, 1, 0, 0, 2}));
  EXPECT_THROW(run({}, 2), ValueError);
}

TEST(ImageOps, MalformedInputsThrowInsteadOfCrashing) {
  // An empty input cannot be sampled; an empty grid gives an empty output.
  EXPECT_THROW(
      run_op({"GridSample", {f32({}, {1, 1, 0, 2}), f32({0, 0}, {1, 1, 1, 2})}, {}, 1, 22}),
      ValueError);
  EXPECT_EQ(
      run_op({"GridSample", {f32({1}, {1, 1, 1, 1}), f32({}, {1, 0, 1, 2})}, {}, 1, 22})[0].shape(),
      (Dims{1, 1, 0, 1}));
  // NaN regions: an adaptive grid cannot be sized; a fixed one samples nothing inside.
  Tensor x = f32({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor nan_roi = f32({NAN, 0, 1, 1}, {1, 4});
  EXPECT_THROW(run_op({"RoiAlign", {x, nan_roi, i64({0}, {1})}, {}, 1, 22}), ValueError);
  auto y = run_op(
      {"RoiAlign", {x, nan_roi, i64({0}, {1})}, attrs({{"sampling_ratio", int64_t{1}}}), 1, 22});
  EXPECT_EQ(values(y[0]), (V{0}));
  EXPECT_THROW(run_op({"RoiAlign",
                       {x, f32({0, 0, 1, 1}, {1, 4}), i64({0}, {1})},
                       attrs({{"sampling_ratio", int64_t{1} << 40}}),
                       1,
                       22}),
               ValueError);
  // Sizes from data past the memory limit are refused before allocating.
  EXPECT_THROW(run_op({"AffineGrid",
                       {f32({1, 0, 0, 0, 1, 0}, {1, 2, 3}), i64({1, 1, 1 << 30, 1 << 30}, {4})},
                       {},
                       1,
                       20}),
               ValueError);
  EXPECT_THROW(run_op({"CenterCropPad", {f32({1}, {1}), i64({int64_t{1} << 62}, {1})}}),
               ValueError);
}

}  // namespace
}  // namespace pto
