// The CPU DFT and STFT kernels (float32 FFTs) against the reference interpreter (an O(n p) DFT in
// double), on every ISA with 1 and 2 threads: lengths with every radix (1, 2, 3, 5, 8, 12, 26, 77,
// 128, 768, 1000) and Bluestein's (17, 34), real and complex inputs, every axis, one-sided forward
// and inverse transforms, inverses, dft_length shorter and longer than the axis, batch 1, opset
// 17's axis attribute and opset 20's axis input, sizes known only at run time, and STFT with and
// without a window. The tolerance is that of an O(log n) error: 4 ulps per stage (log2 of the
// length) of the output's root-mean-square value.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

Attributes dft_attrs(int64_t inverse, int64_t onesided, std::optional<int64_t> axis = {}) {
  Attributes a;
  a.set("inverse", inverse);
  a.set("onesided", onesided);
  if (axis) a.set("axis", *axis);
  return a;
}

// Stages of the transform of `length` points: log2 of the FFT length it runs (Bluestein's
// power of two m >= 2 n - 1 for lengths with a prime factor above 13).
double stages(int64_t length) {
  int64_t n = length;
  for (int64_t p : {2, 3, 5, 7, 11, 13})
    while (n % p == 0) n /= p;
  const double m = n == 1 ? static_cast<double>(length) : 4.0 * static_cast<double>(length);
  return std::max(1.0, std::log2(m));
}

// Runs `c` on the CPU kernel and compares it with the reference within 4 ulps per stage of the
// reference output's root-mean-square value (of its finite elements; an all-zero output compares
// exactly).
void expect_dft(const NodeCase& c, int64_t length) {
  std::vector<Tensor> feeds;
  Graph g = one_node(c, &feeds);
  const Tensor want = reference::run(g, feeds)[0];
  double sum = 0;
  int64_t finite = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double v = want.item_as_double(i);
    if (std::isfinite(v)) sum += v * v, ++finite;
  }
  const double rms = finite ? std::sqrt(sum / static_cast<double>(finite)) : 0.0;
  expect_matches(c, {4 * stages(length) * kUlp, 0.0},
                 std::vector<double>(static_cast<size_t>(want.numel()), rms));
}

// Opset 20: axis and dft_length as constant inputs (the plan built at compile time).
void check20(const Tensor& x, int64_t axis, int64_t inverse, int64_t onesided, int64_t length) {
  const int64_t rank = x.rank(), a = axis < 0 ? axis + rank : axis;
  const bool has_length = length > 0;
  const int64_t n = x.dim(a);
  NodeCase c{"DFT",
             {x, has_length ? ints({length}) : Tensor(), ints({axis})},
             dft_attrs(inverse, onesided),
             20};
  c.constant = {false, true, true};
  expect_dft(c, has_length ? length : inverse && onesided ? 2 * (n - 1) : n);
}

TEST(CpuDft, EveryLengthRealAndComplex) {
  uint32_t seed = 1;
  for (int64_t n : {1, 2, 3, 5, 8, 12, 17, 26, 34, 77, 128, 768, 1000})
    for (int64_t cin : {1, 2}) {
      SCOPED_TRACE(n);
      check20(random_f32({3, n, cin}, seed++), -2, 0, 0, 0);             // forward
      check20(random_f32({2, n, cin}, seed++), 1, 1, 0, 0);              // inverse
      if (cin == 1) check20(random_f32({2, n, 1}, seed++), 1, 0, 1, 0);  // one-sided (rfft)
    }
}

TEST(CpuDft, EveryAxisAndBatchOne) {
  uint32_t seed = 100;
  for (int64_t cin : {1, 2}) {
    check20(random_f32({12, 3, 5, cin}, seed++), 0, 0, 0, 0);
    check20(random_f32({3, 12, 5, cin}, seed++), 1, 0, 0, 0);
    check20(random_f32({3, 5, 17, cin}, seed++), 2, 1, 0, 0);
    check20(random_f32({3, 20, 5, cin}, seed++), -3, 0, 0, 0);
    check20(random_f32({40, 33, cin}, seed++), 0, 0, 0, 0);  // lines not a multiple of the lanes
    check20(random_f32({1, 768, cin}, seed++), 1, 0, 0, 0);
    check20(random_f32({1, 1000, 1, cin}, seed++), 1, 1, 0, 0);
  }
  // FNet's token mixing: the hidden axis (real), then the sequence axis (complex, strided).
  check20(random_f32({2, 9, 64, 1}, seed++), 2, 0, 0, 0);
  check20(random_f32({2, 9, 64, 2}, seed++), 1, 0, 0, 0);
}

TEST(CpuDft, OneSidedInverseAndDftLength) {
  uint32_t seed = 200;
  // irfft: n bins of a real signal of 2 (n - 1) points, or dft_length points (odd, even, shorter
  // and longer than 2 (n - 1)).
  for (int64_t bins : {1, 2, 5, 65})
    for (int64_t length : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, 2 * bins + 3})
      if (length > 0 || bins > 1) check20(random_f32({3, bins, 2}, seed++), -2, 1, 1, length);
  // dft_length shorter (truncated) and longer (zero-padded) than the axis.
  for (int64_t length : {1, 6, 12, 13, 17, 40})
    for (int64_t cin : {1, 2}) {
      check20(random_f32({2, 12, 3, cin}, seed++), 1, 0, 0, length);
      check20(random_f32({2, 12, 3, cin}, seed++), 1, 1, 0, length);
      if (cin == 1) check20(random_f32({2, 12, 3, 1}, seed++), 1, 0, 1, length);
    }
}

TEST(CpuDft, Opset17AndRunTimeSizes) {
  uint32_t seed = 300;
  // Opset 17: the axis attribute (default 1) and dft_length as a constant input.
  for (int64_t axis : {1, 2, -2}) {
    NodeCase c{"DFT", {random_f32({2, 10, 6, 2}, seed++)}, dft_attrs(0, 0, axis), 17};
    expect_dft(c, axis == 1 ? 10 : 6);
  }
  NodeCase len{"DFT", {random_f32({4, 10, 1}, seed++), ints({16})}, dft_attrs(0, 1, 1), 17};
  len.constant = {false, true};
  expect_dft(len, 16);
  // dft_length and the axis as graph inputs: planned when run.
  NodeCase late{
      "DFT", {random_f32({3, 4, 9, 2}, seed++), ints({11}), ints({2})}, dft_attrs(1, 0), 20};
  late.constant = {false, false, false};
  expect_dft(late, 11);
  // No inputs but the signal: axis -2.
  NodeCase plain{"DFT", {random_f32({3, 4, 9, 2}, seed++)}, dft_attrs(0, 0), 20};
  expect_dft(plain, 9);
  // An empty batch.
  check20(random_f32({0, 8, 2}, seed++), 1, 0, 0, 0);
}

// A NaN or an infinity reaches bins of its own line only (which parts of which bins are NaN is
// the arithmetic's: the FFT's differs from the reference's sum), on real inputs too, where lines
// share a vector lane in pairs: every other line matches the reference.
TEST(CpuDft, NonFiniteValuesStayInTheirLine) {
  for (int64_t cin : {1, 2}) {
    Tensor x = random_f32({40, 12, cin}, 400);
    x.data<float>()[(2 * 12 + 3) * cin] = NAN;       // line 2
    x.data<float>()[(5 * 12 + 7) * cin] = INFINITY;  // line 5
    std::vector<Tensor> feeds;
    NodeCase c{"DFT", {x, Tensor(), ints({1})}, dft_attrs(0, 0), 20};
    c.constant = {false, true, true};
    Graph g = one_node(c, &feeds);
    Executable exe = compile(g, {.level = 0});
    ASSERT_EQ(exe.node_backend(0), "cpu");
    const Tensor want = reference::run(g, feeds)[0];
    for (cpu::Isa isa : cpu::supported_isas()) {
      cpu::IsaScope scope(isa);
      const Tensor got = exe.run(feeds)[0];
      for (int64_t line = 0; line < 40; ++line) {
        bool any_nonfinite = false;
        for (int64_t i = line * 24; i < (line + 1) * 24; ++i) {
          const double a = got.item_as_double(i), b = want.item_as_double(i);
          any_nonfinite |= !std::isfinite(a);
          if (line != 2 && line != 5) {
            EXPECT_NEAR(a, b, 1e-5) << cpu::isa_name(isa) << " cin " << cin << " element " << i;
          }
        }
        EXPECT_EQ(any_nonfinite, line == 2 || line == 5) << cpu::isa_name(isa) << " line " << line;
      }
    }
  }
}

void check_stft(const Tensor& x, int64_t step, const Tensor& window, int64_t frame,
                int64_t onesided) {
  Attributes a;
  a.set("onesided", onesided);
  NodeCase c{"STFT", {x, ints({step}), window, frame > 0 ? ints({frame}) : Tensor()}, a, 17};
  c.constant = {false, true, false, true};
  expect_dft(c, frame > 0 ? frame : window.dim(0));
}

TEST(CpuStft, WindowsFramesAndComplexSignals) {
  uint32_t seed = 500;
  for (int64_t onesided : {0, 1}) {
    ++seed;
    check_stft(random_f32({2, 100, 1}, seed), 10, random_f32({16}, seed + 1000, 0.0f, 1.0f), 0,
               onesided);
    check_stft(random_f32({1, 64, 2}, seed), 7, Tensor(), 15, onesided);
    check_stft(random_f32({3, 300, 1}, seed), 32, random_f32({128}, seed + 1000), 128, onesided);
    check_stft(random_f32({2, 40, 1}, seed), 3, random_f32({17}, seed + 1000), 17, onesided);
  }
}

}  // namespace
}  // namespace pto::testing
