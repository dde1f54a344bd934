// The CPU TopK and GridSample kernels against the reference interpreter, on every ISA with 1 and 2
// threads. TopK must match exactly (values and indices): ties (values drawn from a few integers),
// NaN and infinities, every axis, largest and smallest, k from 0 to n, float and integer dtypes.
// GridSample: every mode, padding mode and align_corners, grids reaching past the borders, NaN and
// infinite coordinates and inputs on the 2-D fast path.
#include <gtest/gtest.h>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

Attributes attrs_of(std::initializer_list<std::pair<const char*, Attribute>> list) {
  Attributes a;
  for (const auto& [k, v] : list) a.set(k, v);
  return a;
}

// Values in {-2, ..., 2} (many ties) in dtype dt, from the float tensor t.
Tensor few_values(const Tensor& t, DType dt) {
  Tensor out = Tensor::empty(dt, t.shape());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int64_t v = static_cast<int64_t>(std::lround(2 * t.data<float>()[i]));
    dispatch(dt, kNumericTypes, "test", [&]<class T>() { out.data<T>()[i] = static_cast<T>(v); });
  }
  return out;
}

void check_topk(const Tensor& x, int64_t k, int64_t axis, int64_t largest, bool k_constant = true) {
  NodeCase c{"TopK", {x, ints({k})}, attrs_of({{"axis", axis}, {"largest", largest}}), 11, 2};
  c.constant = {false, k_constant};
  expect_matches(c, {});
}

TEST(CpuTopK, TiesNaNAxesAndDtypes) {
  uint32_t seed = 1;
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32})
    for (int64_t axis : {0, 1, -1})
      for (int64_t largest : {0, 1}) {
        const Tensor x = few_values(random_f32({5, 7, 6}, seed++), dt);
        const int64_t n = x.dim(axis < 0 ? axis + 3 : axis);
        for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n}) check_topk(x, k, axis, largest);
      }
  for (int64_t largest : {0, 1}) {
    check_topk(with_specials(random_f32({4, 33}, seed++)), 9, 1, largest);
    check_topk(random_f32({3, 5000}, seed++), 10, -1, largest, false);  // long lines
    check_topk(random_f32({600, 8, 3}, seed++), 2, 1, largest);         // many short lines
  }
}

void check_grid_sample(const Tensor& x, const Tensor& grid, const char* mode, const char* pad,
                       int64_t align, int opset) {
  NodeCase c{"GridSample",
             {x, grid},
             attrs_of({{"mode", std::string(mode)},
                       {"padding_mode", std::string(pad)},
                       {"align_corners", align}}),
             opset};
  // The general path sums the same taps in double, in the same order: exact. The 2-D fast path
  // (bilinear or nearest, zeros or border padding) computes in float: nearest is still exact, a
  // bilinear sample within a few ulps of the inputs' scale (|x| <= 1 or infinite here).
  const bool fast = x.rank() == 4 && std::string(mode) != "cubic" &&
                    std::string(mode) != "bicubic" && std::string(pad) != "reflection";
  const bool nearest = std::string(mode) == "nearest";
  expect_matches(c, {0, fast && !nearest ? 8 * kUlp : 0.0});
}

TEST(CpuGridSample, EveryModePaddingAndAlignment) {
  uint32_t seed = 100;
  const Tensor x = random_f32({2, 3, 5, 7}, seed++);
  // Coordinates in [-1.3, 1.3]: some samples fall outside the input.
  const Tensor grid = random_f32({2, 4, 6, 2}, seed++, -1.3f, 1.3f);
  for (int opset : {16, 20})
    for (const char* mode : {"nearest", "linear", "cubic"})
      for (const char* pad : {"zeros", "border", "reflection"})
        for (int64_t align : {0, 1}) {
          const std::string m = opset == 16 && std::string(mode) != "nearest"
                                    ? std::string("bi") + mode
                                    : std::string(mode);
          check_grid_sample(x, grid, m.c_str(), pad, align, opset);
        }
  // Exact pixel centers (nearest ties), far outside, NaN, and a larger case split over threads.
  check_grid_sample(x, with_specials(random_f32({2, 3, 3, 2}, seed++, -4.0f, 4.0f)), "bilinear",
                    "reflection", 0, 16);
  check_grid_sample(x, with_specials(random_f32({2, 3, 3, 2}, seed++, -4.0f, 4.0f)), "nearest",
                    "border", 1, 16);
  check_grid_sample(random_f32({1, 16, 40, 30}, seed), random_f32({1, 64, 48, 2}, seed + 1),
                    "bilinear", "zeros", 0, 16);
  // The fast path's cases with NaN and infinite coordinates and inputs (zero-padding taps must
  // not turn an infinite input into NaN), widths that are not a multiple of the vector width.
  for (const char* mode : {"bilinear", "nearest"})
    for (const char* pad : {"zeros", "border"})
      for (int64_t align : {0, 1})
        check_grid_sample(with_specials(random_f32({2, 3, 5, 7}, seed + 2)),
                          with_specials(random_f32({2, 5, 19, 2}, seed + 3, -1.5f, 1.5f)), mode,
                          pad, align, 16);
}

}  // namespace
}  // namespace pto::testing
