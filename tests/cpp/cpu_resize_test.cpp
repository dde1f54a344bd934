// CPU Resize and Upsample against the reference interpreter, on every ISA with 1 and 2 threads:
// nearest (every nearest_mode), linear and cubic (exclude_outside, antialias), every coordinate
// transform, scales and sizes, keep_aspect_ratio_policy, axes, up and down, tf_crop_and_resize
// with extrapolation, and Upsample. Tolerance: the CPU kernel sums in float with weights rounded
// to float where the reference sums in double; within 8 ulp of the input's largest magnitude per
// resized axis (inputs in [-1, 1], so 8 ulp absolute plus 8 ulp relative).
#include <gtest/gtest.h>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

Tensor floats(std::vector<float> v) {
  const auto n = static_cast<int64_t>(v.size());
  return Tensor::from_vector<float>(std::move(v), {n});
}

const Tol kTol = {16 * kUlp, 16 * kUlp};

// Resize of x with `scales` (or `sizes`), every input an initializer but x.
void check_resize(const Tensor& x, const Attributes& attrs, const Tensor& scales,
                  const Tensor& sizes = Tensor(), const Tensor& roi = Tensor(), int opset = 19) {
  NodeCase c{"Resize", {x, roi, scales, sizes}, attrs, opset};
  c.constant = {false, true, true, true};
  expect_matches(c, kTol);
}

Attributes attrs_of(std::initializer_list<std::pair<const char*, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

TEST(CpuResize, NearestEveryModeAndCoordinate) {
  const Tensor x = random_f32({2, 3, 5, 7}, 1);
  for (const char* nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"})
    for (const char* coord : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                              "tf_half_pixel_for_nn", "half_pixel_symmetric"})
      for (const Tensor& scales :
           {floats({1, 1, 2, 2}), floats({1, 1, 0.6f, 1.5f}), floats({1, 1, 3, 0.5f})})
        check_resize(x,
                     attrs_of({{"mode", std::string("nearest")},
                               {"nearest_mode", std::string(nearest)},
                               {"coordinate_transformation_mode", std::string(coord)}}),
                     scales);
}

// The plane resized by copies in one pass (resize_copies_2d): ranks 3 and 5, rows repeated within
// and across the two threads' chunks, a plane of many rows, an axis left alone, a blocked plane
// (the two axes before the lanes) and doubled columns.
TEST(CpuResize, NearestPlanesOfOtherRanks) {
  const auto nearest = attrs_of({{"mode", std::string("nearest")},
                                 {"nearest_mode", std::string("floor")},
                                 {"coordinate_transformation_mode", std::string("asymmetric")}});
  check_resize(random_f32({2, 9, 13}, 2), nearest, floats({1, 2, 2}));
  check_resize(random_f32({1, 2, 3, 4, 5}, 3), nearest, floats({1, 1, 1, 2.5f, 3}));
  check_resize(random_f32({3, 64, 40, 40}, 4), nearest, floats({1, 1, 2, 2}));
  check_resize(random_f32({2, 3, 6, 5}, 5), nearest, floats({1, 1, 1, 2}));
  check_resize(random_f32({2, 3, 6, 5}, 6), nearest, floats({1, 1, 3, 1}));
  // A channel-blocked plane [N, C/c, H, W, c] (level 3): whole pixels of c = 16, 8 or 3 lanes.
  check_resize(random_f32({2, 3, 5, 4, 16}, 7), nearest, floats({1, 1, 2, 2, 1}));
  check_resize(random_f32({1, 2, 7, 3, 8}, 8), nearest, floats({1, 1, 2, 3, 1}));
  check_resize(random_f32({1, 2, 4, 6, 3}, 9), nearest, floats({1, 1, 0.5f, 2, 1}));
  // Columns doubled (2x): each value written twice, odd widths.
  check_resize(random_f32({2, 5, 3, 9}, 10), nearest, floats({1, 1, 2, 2}));
}

// Infinities and NaNs are copied by nearest (no weight-0 neighbour multiplies them), on the copy
// path and the general one.
TEST(CpuResize, NearestCopiesInfAndNan) {
  Tensor x = random_f32({1, 2, 4, 6}, 7);
  float* p = x.data<float>();
  p[0] = INFINITY, p[7] = -INFINITY, p[13] = NAN, p[23] = INFINITY, p[30] = NAN;
  for (const char* coord : {"asymmetric", "half_pixel"})
    for (const Tensor& scales : {floats({1, 1, 2, 2}), floats({1, 1, 1.5f, 0.5f})})
      check_resize(x,
                   attrs_of({{"mode", std::string("nearest")},
                             {"nearest_mode", std::string("round_prefer_floor")},
                             {"coordinate_transformation_mode", std::string(coord)}}),
                   scales);
}

TEST(CpuResize, LinearAndCubicUpAndDown) {
  const Tensor x = random_f32({1, 4, 9, 6}, 2);
  for (const char* mode : {"linear", "cubic"})
    for (const char* coord : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"})
      for (int64_t exclude : {0, 1})
        for (int64_t antialias : {0, 1})
          for (const Tensor& scales : {floats({1, 1, 2, 2}), floats({1, 1, 0.5f, 0.75f}),
                                       floats({1, 1, 1.7f, 1}), floats({1, 1, 1, 1})}) {
            check_resize(x,
                         attrs_of({{"mode", std::string(mode)},
                                   {"coordinate_transformation_mode", std::string(coord)},
                                   {"exclude_outside", exclude},
                                   {"antialias", antialias}}),
                         scales);
          }
}

TEST(CpuResize, SizesAxesAspectPolicyAndCrop) {
  const Tensor x = random_f32({2, 3, 8, 10}, 3);
  const Attributes linear = attrs_of({{"mode", std::string("linear")}});
  check_resize(x, linear, Tensor(), ints({2, 3, 16, 5}));
  check_resize(x, attrs_of({{"mode", std::string("linear")}, {"axes", std::vector<int64_t>{3, 2}}}),
               floats({0.5f, 3}));
  for (const char* policy : {"not_larger", "not_smaller"})
    check_resize(x,
                 attrs_of({{"mode", std::string("cubic")},
                           {"axes", std::vector<int64_t>{2, 3}},
                           {"keep_aspect_ratio_policy", std::string(policy)}}),
                 Tensor(), ints({12, 12}));
  check_resize(x,
               attrs_of({{"mode", std::string("linear")},
                         {"coordinate_transformation_mode", std::string("tf_crop_and_resize")},
                         {"extrapolation_value", 0.25f}}),
               Tensor(), ints({2, 3, 6, 6}), floats({0, 0, -0.2f, 0.1f, 1, 1, 0.9f, 1.3f}));
  // Rank 3 (a 1-D signal) and 5; an empty output.
  check_resize(random_f32({2, 3, 11}, 4), linear, floats({1, 1, 2.5f}));
  check_resize(random_f32({1, 2, 3, 4, 5}, 5), linear, floats({1, 1, 2, 0.5f, 1.5f}));
  check_resize(x, linear, Tensor(), ints({2, 3, 0, 4}));
}

TEST(CpuResize, UpsampleAndOtherDtypes) {
  const Tensor x = random_f32({1, 2, 3, 4}, 6);
  for (const char* mode : {"nearest", "linear"}) {
    NodeCase c{"Upsample", {x, floats({1, 1, 2, 3})}, attrs_of({{"mode", std::string(mode)}}), 9};
    c.constant = {false, true};
    expect_matches(c, kTol);
  }
  // A double input stays on the reference.
  std::vector<double> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1 * static_cast<double>(i);
  NodeCase d{"Resize",
             {Tensor::from_vector<double>(v, {1, 2, 3, 4}), Tensor(), floats({1, 1, 2, 2})},
             attrs_of({}),
             19};
  d.constant = {false, true, true};
  expect_matches(d, kTol, {}, "reference");
}

}  // namespace
}  // namespace pto::testing
