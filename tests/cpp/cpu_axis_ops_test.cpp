// CPU MeanVarianceNormalization, LpNormalization, LRN, Hardmax and Trilu (backend/cpu/axis_ops.cpp)
// against the reference interpreter, on every ISA with 1 and 2 threads: every axis set and axis,
// both opset rules of Hardmax, odd sizes, NaN and infinities.
//
// Tolerances (kUlp = one float ulp at 1): MVN computes the moments in float against the
// reference's double: within 64 ulp relative plus 64 ulp absolute for outputs of order 1 (data
// offset far from zero included). LpNormalization sums in float: 16 ulp. LRN sums the window's
// squares in float and takes two square roots (beta 0.75) or a pow: 16 ulp. Hardmax and Trilu are
// exact.
#include <cstring>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

Attributes axes_attr(const char* name, std::vector<int64_t> axes) {
  Attributes a;
  a.set(name, std::move(axes));
  return a;
}

TEST(CpuMeanVarianceNormalization, EveryAxisSet) {
  const Tol tol = {64 * kUlp, 64 * kUlp};
  uint32_t seed = 1;
  // [A, G, B] directly (reduced, kept, reduced; chunks of 16 or more), rows (reduced axes last),
  // and the packed form (kept axes after reduced ones, or several kept runs).
  for (const Dims& shape : {Dims{2, 3, 4, 5}, Dims{3, 4, 20, 17}, Dims{1, 7, 33}, Dims{5, 1, 9}}) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    const Tensor x = random_f32(shape, seed++, -3, 5);
    for (int64_t mask = 1; mask < (1 << rank); ++mask) {
      std::vector<int64_t> axes;
      for (int64_t a = 0; a < rank; ++a)
        if (mask >> a & 1) axes.push_back(a == rank - 1 && mask % 3 == 0 ? -1 : a);
      NodeCase c{"MeanVarianceNormalization", {x}, axes_attr("axes", axes), 13};
      expect_matches(c, tol);
    }
  }
  // The default axes [0, 2, 3] (NCHW, per channel), with a large offset: the shifted moments.
  expect_matches({"MeanVarianceNormalization", {random_f32({2, 3, 7, 9}, 40, 1000, 1001)}, {}, 13},
                 tol);
  expect_matches({"MeanVarianceNormalization", {random_f32({4, 5, 16, 16}, 41, -2, 2)}, {}, 9},
                 tol);
  // An audio front end's [batch, features, frames] normalized over the frames, and over both.
  const Tensor feats = random_f32({2, 80, 301}, 42, -10, 3);
  expect_matches({"MeanVarianceNormalization", {feats}, axes_attr("axes", {2}), 13}, tol);
  expect_matches({"MeanVarianceNormalization", {feats}, axes_attr("axes", {1, 2}), 13}, tol);
}

TEST(CpuMeanVarianceNormalization, ConstantGroupsAndSpecials) {
  const Tol tol = {64 * kUlp, 64 * kUlp};
  // Group 0 constant (0 / (0 + 1e-9) = 0), group 1 with a NaN, group 2 with +inf (NaN), group 3
  // ordinary; per row and per [A, G, B] chunks.
  Tensor x = random_f32({4, 40}, 50);
  float* v = x.data<float>();
  for (int64_t j = 0; j < 40; ++j) v[j] = 2.5f;
  v[40 + 17] = NAN;
  v[80 + 3] = INFINITY;
  expect_matches({"MeanVarianceNormalization", {x}, axes_attr("axes", {1}), 13}, tol);
  expect_matches(
      {"MeanVarianceNormalization", {x.reshape({2, 2, 40})}, axes_attr("axes", {0, 2}), 13}, tol);
  expect_matches({"MeanVarianceNormalization", {x}, axes_attr("axes", {0}), 13}, tol);
  // An empty input.
  expect_matches({"MeanVarianceNormalization", {random_f32({0, 3, 2, 2}, 51)}, {}, 13}, tol);
}

TEST(CpuLpNormalization, EveryAxisBothNorms) {
  const Tol tol = {16 * kUlp, 16 * kUlp};
  uint32_t seed = 60;
  for (const Dims& shape :
       {Dims{7}, Dims{3, 5}, Dims{4, 1, 33}, Dims{2, 0, 3}, Dims{2, 3, 4, 17}}) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    Tensor x = random_f32(shape, seed++, -3, 3);
    for (int64_t axis = -rank; axis < rank; ++axis)
      for (int64_t p : {1, 2}) {
        Attributes a;
        a.set("axis", axis);
        a.set("p", p);
        expect_matches({"LpNormalization", {x}, a, 1}, tol);
      }
  }
  // A zero row (zeros out), a NaN row, an inf row (inf / inf NaN, the rest 0), tiny values.
  Tensor x = random_f32({5, 19}, 70);
  float* v = x.data<float>();
  for (int64_t j = 0; j < 19; ++j) v[j] = 0.0f;
  v[19 + 4] = NAN;
  v[38 + 7] = -INFINITY;
  for (int64_t j = 0; j < 19; ++j) v[57 + j] *= 1e-20f;
  for (int64_t p : {1, 2}) {
    Attributes a;
    a.set("p", p);
    expect_matches({"LpNormalization", {x}, a, 1}, tol);
  }
}

TEST(CpuLrn, WindowsAndExponents) {
  const Tol tol = {16 * kUlp, 16 * kUlp};
  uint32_t seed = 80;
  for (const Dims& shape : {Dims{1, 1, 5}, Dims{2, 3, 4, 5}, Dims{1, 7, 9, 11}, Dims{2, 16, 13}})
    for (int64_t size : {1, 2, 3, 5, 9})
      for (double beta : {0.75, 0.5, 1.3}) {
        Attributes a;
        a.set("size", size);
        a.set("beta", beta);
        if (size == 3) {
          a.set("alpha", 0.02);
          a.set("bias", 2.0);
        }
        expect_matches({"LRN", {random_f32(shape, seed++, -4, 4)}, a, 13}, tol);
      }
  Attributes a;
  a.set("size", int64_t{3});
  expect_matches({"LRN", {with_specials(random_f32({1, 4, 6, 5}, 90))}, a, 13}, tol);
}

TEST(CpuHardmax, EveryAxisBothOpsetRulesAndNaN) {
  uint32_t seed = 100;
  for (const Dims& shape :
       {Dims{7}, Dims{3, 5}, Dims{4, 1, 33}, Dims{2, 0, 3}, Dims{2, 3, 4, 17}}) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    Tensor x = random_f32(shape, seed++, -4, 4);
    // Ties (the first maximum wins) and NaNs: first in some rows, later in others.
    float* v = x.data<float>();
    for (int64_t i = 0; i + 5 < x.numel(); i += 9) v[i + 5] = v[i];
    for (int64_t i = 0; i < x.numel(); i += 11) v[i] = NAN;
    for (int opset : {11, 13})
      for (int64_t axis = -rank; axis < (opset < 13 ? rank + 1 : rank); ++axis) {
        Attributes a;
        a.set("axis", axis);
        expect_matches({"Hardmax", {x}, a, opset}, {});
      }
  }
}

// Dropout at inference: Y is X, the mask ones (bool, or float before opset 10); a training_mode
// input that is false keeps it on the CPU kernel, a true one (ratio 0) runs the reference's.
TEST(CpuDropout, InferenceAndMask) {
  const Tensor x = random_f32({3, 17}, 120);
  for (int opset : {7, 10, 13})
    for (size_t outputs : {1, 2}) {
      NodeCase c{"Dropout", {x}, {}, opset};
      c.num_outputs = outputs;
      expect_matches(c, {});
    }
  for (bool training : {false, true}) {
    NodeCase c{"Dropout", {x, Tensor::scalar(0.0f), Tensor::scalar(training)}, {}, 13};
    c.num_outputs = 2;
    expect_matches(c, {});
  }
}

// Trilu on float, integer and bool elements, upper and lower, k from far below to far above.
TEST(CpuTrilu, EveryDiagonalAndDtype) {
  for (const Dims& shape : {Dims{4, 6}, Dims{3, 5, 2}, Dims{2, 7, 7}, Dims{0, 3}, Dims{1, 1}}) {
    const Tensor f = random_f32(shape, 110, -5, 5);
    Tensor i64 = Tensor::empty(DType::kI64, shape), b = Tensor::empty(DType::kBool, shape);
    for (int64_t i = 0; i < f.numel(); ++i) {
      i64.data<int64_t>()[i] = static_cast<int64_t>(f.data<float>()[i] * 1000);
      b.data<bool>()[i] = f.data<float>()[i] > 0;
    }
    for (const Tensor& x : {f, i64, b})
      for (int64_t upper : {0, 1}) {
        Attributes a;
        a.set("upper", upper);
        expect_matches({"Trilu", {x}, a, 14}, {});
        for (int64_t k : {-100, -3, -1, 0, 1, 2, 5, 100}) {
          NodeCase c{"Trilu", {x, Tensor::scalar(k)}, a, 14};
          expect_matches(c, {});
          c.constant = {false, true};
          expect_matches(c, {});
        }
      }
  }
}

}  // namespace
}  // namespace pto::testing

namespace pto::testing {
namespace {

// NonMaxSuppression (backend/cpu/nms.cpp): the reference's selected rows exactly, on random boxes
// in both box formats (flipped corners included), several batches and classes, ties, NaN scores,
// with and without the optional inputs.
TEST(CpuNonMaxSuppression, SameRowsAsTheReference) {
  for (int64_t n : {1, 7, 300, 2000})
    for (int64_t center : {0, 1}) {
      const int64_t B = 2, K = 3;
      Tensor boxes = random_f32({B, n, 4}, static_cast<uint32_t>(n), 0, 100);
      float* bx = boxes.data<float>();
      for (int64_t i = 0; i < B * n; ++i) {  // sizes 2..30, every third box's corners flipped
        float* p = bx + i * 4;
        if (center == 1) {
          p[2] = 2 + p[2] * 0.28f, p[3] = 2 + p[3] * 0.28f;
        } else {
          p[2] = p[0] + 2 + p[2] * 0.28f, p[3] = p[1] + 2 + p[3] * 0.28f;
          if (i % 3 == 0) std::swap(p[0], p[2]);
        }
      }
      Tensor scores = random_f32({B, K, n}, static_cast<uint32_t>(n + 1), 0, 1);
      float* sc = scores.data<float>();
      for (int64_t i = 0; i < scores.numel(); i += 5) sc[i] = std::round(sc[i] * 10) / 10;  // ties
      if (n > 7) sc[3] = NAN;
      Attributes a;
      a.set("center_point_box", center);
      const Tensor max_out = Tensor::from_vector<int64_t>({n > 100 ? 50 : 5}, {1});
      for (float iou : {0.0f, 0.3f, 0.7f}) {
        const Tensor iou_t = Tensor::from_vector<float>({iou}, {1});
        expect_matches({"NonMaxSuppression", {boxes, scores, max_out, iou_t}, a, 11}, {});
        expect_matches({"NonMaxSuppression",
                        {boxes, scores, max_out, iou_t, Tensor::from_vector<float>({0.4f}, {1})},
                        a,
                        11},
                       {});
      }
      expect_matches({"NonMaxSuppression", {boxes, scores}, a, 11}, {});  // no boxes out
      expect_matches(
          {"NonMaxSuppression", {boxes, scores, Tensor::from_vector<int64_t>({n}, {1})}, a, 11},
          {});
    }
  // Identical boxes: the first (by score, then index) suppresses the others.
  Tensor same = Tensor::from_vector<float>({0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1}, {1, 3, 4});
  expect_matches({"NonMaxSuppression",
                  {same, Tensor::from_vector<float>({0.5f, 0.9f, 0.9f}, {1, 1, 3}),
                   Tensor::from_vector<int64_t>({3}, {1}), Tensor::from_vector<float>({0.5f}, {1})},
                  {},
                  11},
                 {});
}

}  // namespace
}  // namespace pto::testing

namespace pto::testing {
namespace {

// RotaryEmbedding: 4-D [B, H, S, D] and 3-D [B, S, H * D] inputs, half-split and interleaved
// pairs, a rotary_embedding_dim below D (the rest copied), caches read through position_ids or
// per [B, S]; float products against the reference's double: 4 ulp.
TEST(CpuRotaryEmbedding, LayoutsPairsAndCaches) {
  const Tol tol = {4 * kUlp, 4 * kUlp};
  const int64_t B = 2, H = 3, S = 5, D = 8, P = 11;
  for (int64_t rot : {0, 4})
    for (int64_t interleaved : {0, 1})
      for (bool four_d : {true, false})
        for (bool ids : {true, false}) {
          const int64_t half = (rot ? rot : D) / 2;
          Attributes a;
          a.set("interleaved", interleaved);
          if (rot) a.set("rotary_embedding_dim", rot);
          if (!four_d) a.set("num_heads", H);
          const Tensor x = random_f32(four_d ? Dims{B, H, S, D} : Dims{B, S, H * D}, 130, -3, 3);
          const Dims cache = ids ? Dims{P, half} : Dims{B, S, half};
          const Tensor cs = random_f32(cache, 131), sn = random_f32(cache, 132);
          std::vector<int64_t> p(B * S);
          for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int64_t>(i * 7 % P);
          NodeCase c{"RotaryEmbedding", {x, cs, sn}, a, 23};
          if (ids) c.inputs.push_back(Tensor::from_vector<int64_t>(p, {B, S}));
          expect_matches(c, tol);
        }
}

}  // namespace
}  // namespace pto::testing

namespace pto::testing {
namespace {

// RoiAlign (backend/cpu/detect.cpp): the reference's values exactly (the same sample points and
// double sums), both modes and coordinate transformations, adaptive and fixed sampling, regions
// partly or wholly outside the map, several images.
TEST(CpuRoiAlign, SameValuesAsTheReference) {
  const Tensor x = random_f32({2, 5, 13, 17}, 140, -3, 3);
  const int64_t R = 9;
  Tensor rois = random_f32({R, 4}, 141, -20, 300);
  float* b = rois.data<float>();
  for (int64_t r = 0; r < R; ++r) {  // x2 >= x1 mostly; region 3 flipped, region 5 outside
    b[r * 4 + 2] = b[r * 4] + std::abs(b[r * 4 + 2]) * 0.5f;
    b[r * 4 + 3] = b[r * 4 + 1] + std::abs(b[r * 4 + 3]) * 0.5f;
  }
  std::swap(b[3 * 4], b[3 * 4 + 2]);
  b[5 * 4] = b[5 * 4 + 1] = 1000, b[5 * 4 + 2] = b[5 * 4 + 3] = 1100;
  std::vector<int64_t> bi(R);
  for (int64_t r = 0; r < R; ++r) bi[r] = r % 2;
  const Tensor batch = Tensor::from_vector<int64_t>(bi, {R});
  for (const char* mode : {"avg", "max"})
    for (const char* ctm : {"half_pixel", "output_half_pixel"})
      for (int64_t sampling : {0, 2})
        for (int64_t out : {1, 3}) {
          Attributes a;
          a.set("mode", std::string(mode));
          a.set("coordinate_transformation_mode", std::string(ctm));
          a.set("sampling_ratio", sampling);
          a.set("output_height", out);
          a.set("output_width", out + 1);
          a.set("spatial_scale", 0.0625);
          expect_matches({"RoiAlign", {x, rois, batch}, a, 16}, {});
        }
}

}  // namespace
}  // namespace pto::testing

namespace pto::testing {
namespace {

// LpPool: 1-D, 2-D and 3-D windows with strides, dilations, pads, auto_pad and ceil_mode, p = 1, 2
// and 3, against the reference (the same double sums: within an ulp).
TEST(CpuLpPool, WindowsAndPowers) {
  const Tol tol = {kUlp, 0};
  struct Case {
    Dims shape, kernel, strides, dilations, pads;
    const char* auto_pad;
    int64_t ceil;
  };
  const Case cases[] = {
      {{2, 3, 17}, {3}, {2}, {1}, {1, 0}, "NOTSET", 0},
      {{1, 4, 9, 11}, {3, 2}, {1, 2}, {1, 1}, {0, 0, 0, 0}, "NOTSET", 0},
      {{2, 2, 10, 7}, {2, 3}, {2, 1}, {2, 1}, {1, 1, 0, 2}, "NOTSET", 1},
      {{1, 3, 8, 9}, {3, 3}, {2, 2}, {1, 1}, {}, "SAME_UPPER", 0},
      {{1, 3, 8, 9}, {2, 2}, {1, 1}, {1, 1}, {}, "SAME_LOWER", 0},
      {{1, 2, 5, 6, 7}, {2, 3, 2}, {1, 2, 2}, {1, 1, 2}, {0, 1, 0, 1, 0, 1}, "NOTSET", 0},
  };
  uint32_t seed = 160;
  for (const Case& k : cases)
    for (double p : {1.0, 2.0, 3.0}) {
      Attributes a;
      a.set("kernel_shape", k.kernel);
      a.set("strides", k.strides);
      a.set("dilations", k.dilations);
      if (!k.pads.empty()) a.set("pads", k.pads);
      a.set("auto_pad", std::string(k.auto_pad));
      a.set("ceil_mode", k.ceil);
      a.set("p", static_cast<int64_t>(p));
      expect_matches({"LpPool", {random_f32(k.shape, seed++, -3, 3)}, a, 18}, tol);
    }
}

}  // namespace
}  // namespace pto::testing
