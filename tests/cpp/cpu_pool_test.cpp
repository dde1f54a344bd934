// CPU MaxPool, AveragePool, GlobalMaxPool and GlobalAveragePool against the reference
// interpreter: 1-D, 2-D and 3-D windows over a grid of kernel, stride, dilation, pads, auto_pad,
// ceil_mode and count_include_pad, odd and empty sizes, NaN and infinities; every ISA with 1 and
// 2 threads. Max is exact; averages are within 8 ulp relative plus 8 ulp absolute (float sums of
// at most a few dozen inputs in [-1, 1]).
#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

const Tol kAvgTol = {8 * kUlp, 8 * kUlp};

NodeCase pool_case(const char* op, const Tensor& x, Dims kernel, Dims strides, Dims dilations,
                   Dims pads, bool ceil, const char* auto_pad, bool count_pad) {
  NodeCase c{op, {x}, {}, 19};
  c.attrs.set("kernel_shape", kernel);
  c.attrs.set("strides", strides);
  c.attrs.set("dilations", dilations);
  if (std::string(auto_pad) == "NOTSET")
    c.attrs.set("pads", pads);
  else
    c.attrs.set("auto_pad", std::string(auto_pad));
  c.attrs.set("ceil_mode", static_cast<int64_t>(ceil));
  if (std::string(op) == "AveragePool") c.attrs.set("count_include_pad", int64_t{count_pad});
  return c;
}

TEST(CpuPool, TwoDimensionalGrid) {
  uint32_t seed = 1;
  const Tensor inputs[] = {random_f32({1, 2, 7, 9}, seed++), random_f32({2, 1, 5, 20}, seed++),
                           with_specials(random_f32({1, 3, 6, 6}, seed++))};
  for (const char* op : {"MaxPool", "AveragePool"})
    for (const Tensor& x : inputs)
      for (int64_t k : {1, 2, 3})
        for (int64_t s : {1, 2, 3})
          for (int64_t d : {1, 2})
            for (const char* auto_pad : {"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"})
              for (bool ceil : {false, true}) {
                const bool count_pad = (k + s + d) % 2 == 0;
                const Dims pads = {k / 2, (k + 1) / 2 - 1 + s % 2, k - 1, 0};
                expect_matches(pool_case(op, x, {k, k + s % 2}, {s, 3 - s % 2}, {d, 1}, pads, ceil,
                                         auto_pad, count_pad),
                               std::string(op) == "MaxPool" ? Tol{} : kAvgTol);
              }
}

TEST(CpuPool, OneDimensionalAndEmpty) {
  uint32_t seed = 40;
  for (const char* op : {"MaxPool", "AveragePool"}) {
    const Tol tol = std::string(op) == "MaxPool" ? Tol{} : kAvgTol;
    for (const Dims& shape : {Dims{2, 3, 1}, Dims{1, 2, 17}, Dims{0, 2, 8}, Dims{1, 0, 8}})
      for (int64_t k : {1, 3})
        for (int64_t s : {1, 2})
          for (bool count_pad : {false, true})
            expect_matches(pool_case(op, random_f32(shape, seed++), {k}, {s}, {1}, {k / 2, 1}, true,
                                     "NOTSET", count_pad),
                           tol);
    // A window that does not fit gives an empty output.
    expect_matches(pool_case(op, random_f32({1, 1, 2, 2}, 3), {3, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0},
                             false, "NOTSET", false),
                   tol);
  }
}

// Stride 1 along the rows folds each row's windows as lane shifts of the vertical folds in
// registers: rows shorter than, equal to and a little past one or two vectors (8 lanes on AVX2, 16
// on AVX-512), wide and dilated windows whose column offsets reach a whole vector either way, pads
// on one side only, and NaN / infinities for max's NaN rule.
TEST(CpuPool, RowsFoldedByLaneShifts) {
  uint32_t seed = 90;
  for (int64_t w : {3, 7, 8, 9, 15, 16, 17, 33})
    for (const Dims& kd :
         {Dims{2, 1}, Dims{3, 1}, Dims{5, 1}, Dims{3, 4}, Dims{7, 2}, Dims{5, 4}}) {
      const int64_t k = kd[0], d = kd[1], reach = (k - 1) * d;
      const Tensor x = with_specials(random_f32({1, 2, 4, w}, seed++));
      for (const Dims& pw :
           {Dims{0, 0}, Dims{reach / 2, reach - reach / 2}, Dims{reach, 0}, Dims{0, reach}})
        for (const char* op : {"MaxPool", "AveragePool"})
          for (bool count_pad : {false, true})
            expect_matches(pool_case(op, x, {3, k}, {1, 1}, {1, d}, {1, pw[0], 1, pw[1]}, false,
                                     "NOTSET", count_pad),
                           std::string(op) == "MaxPool" ? Tol{} : kAvgTol);
    }
}

// Stride 2 along the rows folds each row's windows as lane shifts of the even and odd columns of
// the vertical folds (pool_row_shifted2): rows around one, two and four vectors, windows whose
// column offsets reach two vectors either way (5 wide, dilation 4), pads on either side, and NaN /
// infinities for max's NaN rule.
TEST(CpuPool, StrideTwoRowsFoldedByLaneShifts) {
  uint32_t seed = 190;
  for (int64_t w : {3, 8, 15, 16, 17, 31, 32, 33, 65})
    for (const Dims& kd : {Dims{2, 1}, Dims{3, 1}, Dims{5, 1}, Dims{3, 4}, Dims{5, 4}}) {
      const int64_t k = kd[0], d = kd[1], reach = (k - 1) * d;
      const Tensor x = with_specials(random_f32({1, 2, 5, w}, seed++));
      for (const Dims& pw :
           {Dims{0, 0}, Dims{reach / 2, reach - reach / 2}, Dims{reach, 0}, Dims{0, reach}})
        for (const char* op : {"MaxPool", "AveragePool"})
          for (bool ceil : {false, true})
            expect_matches(pool_case(op, x, {3, k}, {2, 2}, {1, d}, {1, pw[0], 0, pw[1]}, ceil,
                                     "NOTSET", ceil),
                           std::string(op) == "MaxPool" ? Tol{} : kAvgTol);
    }
}

TEST(CpuPool, ResNetStemAndLargePlanes) {
  const Tensor x = random_f32({2, 16, 57, 61}, 77);
  expect_matches(
      pool_case("MaxPool", x, {3, 3}, {2, 2}, {1, 1}, {1, 1, 1, 1}, false, "NOTSET", false), {});
  expect_matches(
      pool_case("AveragePool", x, {3, 3}, {1, 1}, {1, 1}, {1, 1, 1, 1}, false, "NOTSET", false),
      kAvgTol);
}

// 3-D windows (separable: H x W per plane, then D with OH OW lanes), including the forms the
// NCHWc path takes (a unit window on the last axis); NaN and infinities on the first plane a
// window reads and elsewhere; empty outputs.
TEST(CpuPool, ThreeDimensionalWindows) {
  uint32_t seed = 60;
  const Tensor inputs[] = {random_f32({1, 2, 5, 6, 7}, seed++), random_f32({2, 3, 4, 9, 5}, seed++),
                           with_specials(random_f32({1, 2, 3, 6, 6}, seed++))};
  for (const char* op : {"MaxPool", "AveragePool"}) {
    const Tol tol = std::string(op) == "MaxPool" ? Tol{} : kAvgTol;
    for (const Tensor& x : inputs)
      for (int64_t k : {1, 2, 3})
        for (int64_t s : {1, 2})
          for (bool ceil : {false, true}) {
            const bool count_pad = (k + s) % 2 == 0;
            const Dims pads = {k / 2, 0, (k - 1) / 2, (k - 1) / 2, k / 2, 1 % k};
            expect_matches(pool_case(op, x, {k, 3, k + s % 2}, {s, 2, s}, {1, 1, 1}, pads, ceil,
                                     "NOTSET", count_pad),
                           tol);
            expect_matches(pool_case(op, x, {3, k, 2}, {1, s, 1}, {2, 1, 1}, pads, ceil,
                                     "SAME_UPPER", count_pad),
                           tol);
            expect_matches(pool_case(op, x, {k, k, 1}, {s, s, 1}, {1, 1, 1}, {0, 0, 0, 0, 0, 0},
                                     ceil, "NOTSET", count_pad),
                           tol);
          }
    // MViT's pooling: 3x3x3, stride (1, 2, 2), padding 1; a window that does not fit.
    expect_matches(pool_case(op, random_f32({4, 16, 4, 14, 14}, seed++), {3, 3, 3}, {1, 2, 2},
                             {1, 1, 1}, {1, 1, 1, 1, 1, 1}, false, "NOTSET", false),
                   tol);
    expect_matches(pool_case(op, random_f32({1, 2, 2, 5, 5}, seed++), {3, 2, 2}, {1, 1, 1},
                             {1, 1, 1}, {0, 0, 0, 0, 0, 0}, false, "NOTSET", false),
                   tol);
  }
}

// Level 3's channel blocks (NCHWc, a unit window on the last axis) of one and two vectors of lanes
// on every ISA (8, 16, 32) and of neither (5): a window holding a NaN, at any position, is NaN.
TEST(CpuPool, ChannelBlocksPropagateNaN) {
  uint32_t seed = 300;
  for (int64_t c : {5, 8, 16, 32}) {
    const Tensor x = with_specials(random_f32({1, 2, 7, 9, c}, seed++));
    for (int64_t s : {1, 2})
      expect_matches(pool_case("MaxPool", x, {3, 3, 1}, {s, s, 1}, {1, 1, 1}, {1, 1, 0, 1, 1, 0},
                               false, "NOTSET", false),
                     {});
  }
}

TEST(CpuPool, DeclinesIndicesAndStorageOrder) {
  NodeCase with_indices = pool_case("MaxPool", random_f32({1, 2, 5, 5}, 1), {2, 2}, {1, 1}, {1, 1},
                                    {0, 0, 0, 0}, false, "NOTSET", false);
  with_indices.num_outputs = 2;
  expect_matches(with_indices, {}, {}, "reference");
  NodeCase order = pool_case("MaxPool", random_f32({1, 2, 5, 5}, 1), {2, 2}, {1, 1}, {1, 1},
                             {0, 0, 0, 0}, false, "NOTSET", false);
  order.attrs.set("storage_order", int64_t{1});
  expect_matches(order, {}, {}, "reference");
}

TEST(CpuGlobalPool, RanksSpecialsAndEmpty) {
  uint32_t seed = 90;
  for (const Dims& shape :
       {Dims{2, 3}, Dims{1, 1, 1}, Dims{2, 3, 7}, Dims{8, 64, 7, 7}, Dims{2, 3, 0, 4},
        Dims{0, 3, 4}, Dims{1, 2, 3, 4, 5}, Dims{2, 3, 200, 200}})
    for (bool specials : {false, true}) {
      Tensor x = random_f32(shape, seed++);
      if (specials) x = with_specials(x);
      expect_matches({"GlobalMaxPool", {x}}, {});
      expect_matches({"GlobalAveragePool", {x}}, {16 * kUlp, 16 * kUlp});
    }
}

}  // namespace
}  // namespace pto::testing
