// CPU DeformConv against the reference interpreter (double precision), on every ISA (the GEMM's)
// with 1 and 2 threads: groups and offset groups, strides, dilations, pads, mask and bias or
// none, offsets that leave the image, and an output plane split into several column blocks.
#include <gtest/gtest.h>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

struct Deform {
  int64_t n = 1, c = 4, h = 9, w = 7, m = 6, k = 3, stride = 1, pad = 1, dil = 1, group = 1,
          offset_group = 1;
  bool mask = true, bias = true;
};

NodeCase deform_case(const Deform& d) {
  const int64_t oh = (d.h + 2 * d.pad - d.dil * (d.k - 1) - 1) / d.stride + 1;
  const int64_t ow = (d.w + 2 * d.pad - d.dil * (d.k - 1) - 1) / d.stride + 1;
  const int64_t taps = d.offset_group * d.k * d.k;
  NodeCase c{"DeformConv",
             {random_f32({d.n, d.c, d.h, d.w}, 1), random_f32({d.m, d.c / d.group, d.k, d.k}, 2),
              random_f32({d.n, 2 * taps, oh, ow}, 3, -3.0f, 3.0f)}};
  c.inputs.push_back(d.bias ? random_f32({d.m}, 4) : Tensor());
  c.inputs.push_back(d.mask ? random_f32({d.n, taps, oh, ow}, 5, 0.0f, 1.0f) : Tensor());
  while (!c.inputs.back().defined()) c.inputs.pop_back();
  c.attrs.set("strides", Dims{d.stride, d.stride});
  c.attrs.set("pads", Dims{d.pad, d.pad, d.pad, d.pad});
  c.attrs.set("dilations", Dims{d.dil, d.dil});
  c.attrs.set("group", d.group);
  c.attrs.set("offset_group", d.offset_group);
  c.opset = 19;
  c.constant.assign(c.inputs.size(), false);
  c.constant[1] = true;
  return c;
}

// Sums of up to 288 products of values around 1 in float (the reference's in double): an
// absolute tolerance, as outputs near 0 come from cancellation.
const Tol kTol = {1e-4, 1e-4};

TEST(CpuDeformConv, Forms) {
  expect_matches(deform_case({}), kTol);
  expect_matches(deform_case({.mask = false, .bias = false}), kTol);
  expect_matches(deform_case({.n = 2, .c = 8, .m = 4, .group = 2, .offset_group = 4}), kTol);
  expect_matches(deform_case({.h = 16, .w = 13, .k = 5, .stride = 2, .pad = 2, .dil = 2}), kTol);
  expect_matches(deform_case({.c = 3, .h = 5, .w = 6, .m = 3, .k = 1, .pad = 0, .group = 3}), kTol);
}

TEST(CpuDeformConv, ManyColumnBlocks) {  // 96 x 96 pixels: several blocks of columns
  expect_matches(deform_case({.c = 32, .h = 96, .w = 96, .m = 8, .offset_group = 2}), kTol);
}

}  // namespace
}  // namespace pto::testing
