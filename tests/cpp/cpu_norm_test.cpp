// CPU Softmax, LogSoftmax, LayerNormalization, RMSNormalization, BatchNormalization,
// InstanceNormalization and GroupNormalization against the reference interpreter, on every ISA with
// 1 and 2 threads.
//
// Tolerances (kUlp = one float ulp at 1): Softmax and LogSoftmax within 8 ulp relative plus 8 ulp
// absolute (vector exp ~1 ulp, the float sum, one division; tiny probabilities carry the rounding
// of x - max, about eps * |x - max| relative, which the absolute term covers). The norms
// compute mean and variance in float against the reference's double: within 32 ulp relative
// plus 32 ulp absolute for outputs of order 1. Each also with the Casts around it (bf16/f16 in
// and out, CpuNormCasts).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>

#include "backend/cpu/elementwise.h"
#include "cpu_reduce_test_util.h"
#include "pto/memory_policy.h"

namespace pto::testing {
namespace {

const std::vector<Dims> kShapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 3}, {4, 1, 33}, {2, 3, 4, 17}};

TEST(CpuSoftmax, EveryAxisBothOpsetRules) {
  uint32_t seed = 1;
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const Tol tol = {8 * kUlp, 8 * kUlp};
    for (const Dims& shape : kShapes) {
      const int64_t rank = static_cast<int64_t>(shape.size());
      const Tensor x = random_f32(shape, seed++, -4, 4);
      for (int opset : {11, 13})
        for (int64_t axis = -rank; axis < (opset < 13 ? rank + 1 : std::max<int64_t>(rank, 1));
             ++axis) {
          NodeCase c{op, {x}, {}, opset};
          c.attrs.set("axis", axis);
          expect_matches(c, tol);
        }
    }
  }
}

TEST(CpuSoftmax, LargeRowsColumnsAndSpecials) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    const Tol tol = {8 * kUlp, 8 * kUlp};
    for (const Dims& shape : {Dims{12, 128, 128}, Dims{3, 1000, 70}}) {
      for (int64_t axis : {-1, 1}) {
        NodeCase c{op, {random_f32(shape, 5, -30, 30)}, {}, 13};
        c.attrs.set("axis", axis);
        expect_matches(c, tol);
      }
    }
    Tensor x = random_f32({6, 37}, 9);  // NaN, +inf, -inf in some rows; one row all -inf
    x.data<float>()[3] = NAN;
    x.data<float>()[37 + 5] = INFINITY;
    x.data<float>()[2 * 37 + 8] = -INFINITY;
    for (int64_t j = 0; j < 37; ++j) x.data<float>()[4 * 37 + j] = -INFINITY;
    x.data<float>()[5 * 37 + 36] = 80;  // exp would overflow without the max subtraction
    expect_matches({op, {x}, {}, 13}, tol);
  }
}

// Rows long enough for the max's four accumulators and the exps' pairs of vectors, and lengths
// around the vector width (1, 15, 16, 17 ...), several rows each (each row's pass folds the next
// row's max and prefetches the row after), with specials inside the unrolled part of a row: a NaN
// (not tracked by the row's max: it still makes the row NaN through the sum), +inf, a row all
// -inf, huge magnitudes, scores 88-110 below the max, whose exps are subnormal or zero, and the
// max in a row's tail. Both store paths: ordinary stores (each row's exps in y, scaled in place
// during the next row's pass), and the exps kept in two scratch rows and streamed to y a row
// later (what `auto` does for outputs larger than the L3, forced here by `always`) where rows are
// whole vectors (16, 64, 1024, 1040, 2080, 4096, 8224 on AVX-512), the others row by row in three
// passes, as LogSoftmax always; a single row of 4096 scales its own exps after them.
TEST(CpuSoftmax, RowLengthsAndSpecialsInLongRows) {
  const Tol tol = {8 * kUlp, 8 * kUlp};
  const MemoryPolicy saved = memory_policy();
  for (auto nt : {MemoryPolicy::NonTemporal::kNever, MemoryPolicy::NonTemporal::kAlways})
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      SCOPED_TRACE(::testing::Message() << "nontemporal " << static_cast<int>(nt));
      set_memory_policy(MemoryPolicy{.nontemporal = nt});
      expect_matches({op, {random_f32({1, 4096}, 3, -20, 20)}, {}, 13}, tol);
      for (int64_t len : {1, 15, 16, 17, 31, 63, 64, 65, 129, 1003, 1024, 1040, 2080, 4096, 8224}) {
        Tensor x = random_f32({9, len}, static_cast<uint32_t>(len), -20, 20);
        float* v = x.data<float>();
        const int64_t mid = len / 2 + len / 3;  // past the first four vectors when len >= 129
        v[0 * len + mid] = NAN;
        v[1 * len + mid] = INFINITY;
        for (int64_t j = 0; j < len; ++j) v[2 * len + j] = -INFINITY;
        v[3 * len + mid] = 3e38f;  // a huge max: the rest of the row underflows to 0
        v[4 * len + mid] = -3e38f;
        for (int64_t j = 0; j < len; ++j)  // exp(x - max) from e^-110 to 1: subnormals in between
          v[5 * len + j] = -110.0f * static_cast<float>(j) / static_cast<float>(len);
        v[6 * len + len - 1] = 1e4f;  // the max in the tail
        expect_matches({op, {x}, {}, 13}, tol);
      }
    }
  set_memory_policy(saved);
}

// Softmax gives the same bits under every store policy: the one-pass rows with ordinary stores,
// streamed, and the three-pass rows that streamed rows not of whole vectors take (lengths 1003
// and 17), on every ISA.
TEST(CpuSoftmax, SameBitsUnderEveryStorePolicy) {
  const MemoryPolicy saved = memory_policy();
  for (int64_t len : {17, 128, 1003, 1024, 1040}) {
    NodeCase c{"Softmax", {random_f32({7, len}, static_cast<uint32_t>(len), -20, 20)}, {}, 13};
    std::vector<Tensor> feeds;
    const Graph g = one_node(c, &feeds);
    const Executable exe = compile(g, {.level = 0});
    for (cpu::Isa isa : cpu::supported_isas()) {
      cpu::IsaScope scope(isa);
      set_memory_policy(MemoryPolicy{.nontemporal = MemoryPolicy::NonTemporal::kNever});
      const Tensor plain = exe.run(feeds)[0];
      set_memory_policy(MemoryPolicy{.nontemporal = MemoryPolicy::NonTemporal::kAlways});
      const Tensor streamed = exe.run(feeds)[0];
      ASSERT_EQ(plain.numel(), streamed.numel());
      EXPECT_EQ(std::memcmp(plain.raw_data(), streamed.raw_data(), plain.nbytes()), 0)
          << cpu::isa_name(isa) << ", rows of " << len;
    }
  }
  set_memory_policy(saved);
}

Tol norm_tol() {
  return {32 * kUlp, 32 * kUlp};
}

TEST(CpuLayerNorm, EveryAxisBiasAndStatistics) {
  uint32_t seed = 50;
  for (const Dims& shape :
       {Dims{7}, Dims{3, 5}, Dims{4, 1, 33}, Dims{2, 0, 3}, Dims{2, 3, 4, 17}, Dims{128, 768}}) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    const Tensor x = random_f32(shape, seed++, -2, 3);
    for (int64_t axis = -rank; axis < rank; ++axis) {
      const Dims norm(shape.begin() + (axis < 0 ? axis + rank : axis), shape.end());
      const Tensor scale = random_f32(norm, seed++), bias = random_f32(norm, seed++);
      for (bool with_bias : {false, true})
        for (size_t outputs : {1, 3}) {
          NodeCase c{"LayerNormalization", {x, scale, with_bias ? bias : Tensor()}, {}, 17};
          c.num_outputs = outputs;
          c.constant = {false, true, true};
          c.attrs.set("axis", axis);
          c.attrs.set("epsilon", 1e-3);
          expect_matches(c, norm_tol());
        }
    }
  }
}

// The row kernels with the next row prefetched (the built-in prefetch_distance, -1) and with
// prefetching off (0): the same results as the reference either way, over several rows a task.
TEST(CpuNorm, RowKernelsWithPrefetchOnAndOff) {
  const MemoryPolicy saved = memory_policy();
  for (int distance : {-1, 0}) {
    SCOPED_TRACE(::testing::Message() << "prefetch_distance " << distance);
    set_memory_policy(MemoryPolicy{.prefetch_distance = distance});
    const Tensor x = random_f32({37, 768}, 61, -2, 3);
    expect_matches({"Softmax", {x}, {}, 13}, {8 * kUlp, 8 * kUlp});
    NodeCase ln{"LayerNormalization", {x, random_f32({768}, 62), random_f32({768}, 63)}, {}, 17};
    ln.constant = {false, true, true};
    expect_matches(ln, norm_tol());
    NodeCase rms{"RMSNormalization", {x, random_f32({768}, 64)}, {}, 23};
    rms.constant = {false, true};
    expect_matches(rms, norm_tol());
  }
  set_memory_policy(saved);
}

// Streaming stores (what `auto` gives outputs larger than the L3, forced by `always`): rows of
// 4096 floats or more, a multiple of 32, stream each row's output during the next row's variance
// pass (layer_norm_rows_streamed; 8224 spans two of the sums' blocks of 4096), the others row by
// row.
// One row, a few, many over 2 threads; with and without bias; Mean and InvStdDev too; NaN and inf.
TEST(CpuLayerNorm, StreamedRowsAgainstReference) {
  const MemoryPolicy saved = memory_policy();
  set_memory_policy(MemoryPolicy{.nontemporal = MemoryPolicy::NonTemporal::kAlways});
  uint32_t seed = 90;
  for (const Dims& shape :
       {Dims{1, 4096}, Dims{5, 64}, Dims{3, 8224}, Dims{37, 768}, Dims{6, 100}, Dims{4, 2, 4096}}) {
    Tensor x = random_f32(shape, seed++, -2, 3);
    if (x.numel() >= 3 * shape.back() && shape.back() > 9) {
      x.data<float>()[shape.back() + 7] = NAN;           // row 1
      x.data<float>()[2 * shape.back() + 9] = INFINITY;  // row 2
    }
    const Dims norm{shape.back()};
    const Tensor scale = random_f32(norm, seed++), bias = random_f32(norm, seed++);
    for (bool with_bias : {false, true})
      for (size_t outputs : {1, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << dims_str(shape) << " bias " << with_bias << " outputs " << outputs);
        NodeCase c{"LayerNormalization", {x, scale, with_bias ? bias : Tensor()}, {}, 17};
        c.num_outputs = outputs;
        c.constant = {false, true, true};
        c.attrs.set("axis", -1);
        expect_matches(c, norm_tol());
      }
  }
  set_memory_policy(saved);
}

// The streamed rows (two summed a pass while the two before them are written, scale and bias
// loaded once for both) give the same bits as row by row (`never`): every row count from 1 to 7
// (a last pass of one row or two, a last output pass of one or two), rows of 4096 and 8224 (two
// of the sums' blocks), with and without bias, a NaN, an inf and a far shift in some rows; on
// every ISA, Mean and InvStdDev too.
TEST(CpuLayerNorm, StreamedRowsSameBitsAsRowByRow) {
  const MemoryPolicy saved = memory_policy();
  uint32_t seed = 200;
  for (int64_t n : {4096, 8224})
    for (int64_t rows = 1; rows <= 7; ++rows) {
      Tensor x = random_f32({rows, n}, seed++, -2, 3);
      if (rows > 2) x.data<float>()[n + 11] = NAN;
      if (rows > 3) x.data<float>()[3 * n + 5] = INFINITY;
      if (rows > 4)
        for (int64_t j = 0; j < 16; ++j) x.data<float>()[4 * n + j] += 40.0f;  // second pass
      const Tensor scale = random_f32({n}, seed++), bias = random_f32({n}, seed++);
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message() << rows << " rows of " << n << " bias " << with_bias);
        NodeCase c{"LayerNormalization", {x, scale, with_bias ? bias : Tensor()}, {}, 17};
        c.num_outputs = 3;
        c.constant = {false, true, true};
        std::vector<Tensor> feeds;
        Graph g = one_node(c, &feeds);
        Executable exe = compile(g, {.level = 0});
        for (cpu::Isa isa : cpu::supported_isas()) {
          cpu::IsaScope scope(isa);
          set_memory_policy(MemoryPolicy{.nontemporal = MemoryPolicy::NonTemporal::kNever});
          const std::vector<Tensor> rowwise = exe.run(feeds);
          set_memory_policy(MemoryPolicy{.nontemporal = MemoryPolicy::NonTemporal::kAlways});
          const std::vector<Tensor> streamed = exe.run(feeds);
          for (size_t o = 0; o < 3; ++o)
            EXPECT_EQ(std::memcmp(rowwise[o].raw_data(), streamed[o].raw_data(),
                                  static_cast<size_t>(rowwise[o].nbytes())),
                      0)
                << cpu::isa_name(isa) << " output " << o;
        }
      }
    }
  set_memory_policy(saved);
}

// Rows of at most four vectors (eight under AVX-512) run as one call per task with each row in
// registers (layer_norm_rows_short): lengths around every vector count of AVX-512 and AVX2 (and
// 129, past them), one row and many (split over 2 threads), with and without bias, Mean and
// InvStdDev too, a large mean (kept exact by the shift) and a row with a NaN.
TEST(CpuLayerNorm, ShortRowsInRegisters) {
  uint32_t seed = 120;
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, 63, 64, 65, 80, 96, 127, 128, 129})
    for (int64_t rows : {1, 300}) {
      Tensor x = random_f32({rows, n}, seed++, -2, 3);
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += rows == 1 ? 1000.0f : 0.0f;
      if (rows > 1) x.data<float>()[n + n / 2] = NAN;  // row 1
      const Tensor scale = random_f32({n}, seed++), bias = random_f32({n}, seed++);
      for (bool with_bias : {false, true})
        for (size_t outputs : {1, 3}) {
          SCOPED_TRACE(::testing::Message() << rows << " rows of " << n << " bias " << with_bias
                                            << " outputs " << outputs);
          NodeCase c{"LayerNormalization", {x, scale, with_bias ? bias : Tensor()}, {}, 17};
          c.num_outputs = outputs;
          c.constant = {false, true, true};
          expect_matches(c, norm_tol());
        }
    }
}

// The variance from one pass (the sums of d and d^2, d = x - shift, the shift the mean of the
// row's first vector) and, where the shift lies over a standard deviation from the row's mean so
// that E[d^2] - E[d]^2 cancels, from a second pass over the centred values: a row whose first 16
// elements sit 3 above the rest (the second pass on every ISA; without it the outputs are off by
// ~100 ulp, past the tolerance), x[0] an outlier (3 against values in [-1, 1]), a constant row
// (variance 0), a large mean (1000 + [-1, 1]), an inf in the first vector (the shift then x[0]:
// the row's outputs NaN, its mean inf, as the reference's), on every path: row by row (odd
// lengths, the tails of the sums' vectors, two blocks of 4096 and one huge row) and streamed with
// the next row's sums (multiples of 32 from 4096); Mean and InvStdDev too. GroupNormalization
// takes the same moments.
TEST(CpuLayerNorm, OnePassVarianceAndItsSecondPass) {
  const MemoryPolicy saved = memory_policy();
  uint32_t seed = 300;
  for (auto nt : {MemoryPolicy::NonTemporal::kNever, MemoryPolicy::NonTemporal::kAlways})
    for (const Dims& shape : {Dims{6, 65}, Dims{6, 100}, Dims{6, 768}, Dims{6, 1000}, Dims{6, 4096},
                              Dims{6, 4097}, Dims{6, 8224}, Dims{1, 100003}}) {
      set_memory_policy(MemoryPolicy{.nontemporal = nt});
      const int64_t n = shape[1];
      Tensor x = random_f32(shape, seed++, -1, 1);
      float* v = x.data<float>();
      for (int64_t j = 0; j < 16; ++j) v[j] += 3.0f;  // row 0: the shift far from the mean
      if (shape[0] > 1) {
        v[n] = 3.0f;  // row 1: x[0] an outlier
        for (int64_t j = 0; j < n; ++j) {
          v[2 * n + j] = 5.0f;      // row 2: constant
          v[3 * n + j] += 1000.0f;  // row 3: a large mean
        }
        v[4 * n + 3] = INFINITY;  // row 4
      }
      const Tensor scale = random_f32({n}, seed++), bias = random_f32({n}, seed++);
      for (size_t outputs : {1, 3}) {
        SCOPED_TRACE(::testing::Message() << dims_str(shape) << " nontemporal "
                                          << static_cast<int>(nt) << " outputs " << outputs);
        NodeCase c{"LayerNormalization", {x, scale, bias}, {}, 17};
        c.num_outputs = outputs;
        c.constant = {false, true, true};
        expect_matches(c, norm_tol());
      }
    }
  set_memory_policy(saved);
  Tensor g = random_f32({2, 4, 3, 50}, seed++, -1, 1);  // groups of 300, one shifted far
  for (int64_t j = 0; j < 16; ++j) g.data<float>()[j] += 3.0f;
  NodeCase gn{"GroupNormalization", {g, random_f32({4}, seed++), random_f32({4}, seed++)}, {}, 21};
  gn.attrs.set("num_groups", int64_t{2});
  expect_matches(gn, norm_tol());
}

TEST(CpuLayerNorm, LargeMeanAndOtherScaleShapes) {
  Tensor x = random_f32({5, 64}, 3);
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] += 1000;  // cancels in E[x^2]-E[x]^2
  expect_matches({"LayerNormalization", {x, random_f32({1, 64}, 4)}, {}, 17}, norm_tol());
  // A Scale that broadcasts over rows is left to the reference at run time (still "cpu").
  expect_matches({"LayerNormalization", {x, random_f32({5, 64}, 4)}, {}, 17}, norm_tol());
  // stash_type double: declined.
  NodeCase c{"LayerNormalization", {x, random_f32({64}, 4)}, {}, 17};
  c.attrs.set("stash_type", int64_t{11});
  expect_matches(c, norm_tol(), {}, "reference");
}

TEST(CpuRmsNorm, EveryAxisAndScaleShapes) {
  uint32_t seed = 70;
  for (const Dims& shape :
       {Dims{7}, Dims{3, 5}, Dims{4, 1, 33}, Dims{2, 0, 3}, Dims{2, 3, 4, 17}, Dims{16, 4096}}) {
    const int64_t rank = static_cast<int64_t>(shape.size());
    const Tensor x = random_f32(shape, seed++, -2, 3);
    for (int64_t axis = -rank; axis < rank; ++axis) {
      const Dims norm(shape.begin() + (axis < 0 ? axis + rank : axis), shape.end());
      NodeCase c{"RMSNormalization", {x, random_f32(norm, seed++)}, {}, 23};
      c.constant = {false, true};
      c.attrs.set("axis", axis);
      c.attrs.set("epsilon", 1e-5);
      expect_matches(c, norm_tol());
    }
  }
  // A Scale that broadcasts over rows goes to the reference at run time; stash_type double is
  // declined at compile time.
  const Tensor x = random_f32({5, 64}, 3);
  expect_matches({"RMSNormalization", {x, random_f32({5, 64}, 4)}, {}, 23}, norm_tol());
  NodeCase c{"RMSNormalization", {x, random_f32({64}, 4)}, {}, 23};
  c.attrs.set("stash_type", int64_t{11});
  expect_matches(c, norm_tol(), {}, "reference");
}

TEST(CpuBatchNorm, InferenceShapesAndTrainingDeclines) {
  uint32_t seed = 80;
  // Planes under 16 elements take the row-wise path (BatchNorm1d on [tokens, channels]).
  for (const Dims& shape :
       {Dims{2, 3}, Dims{1, 1, 1}, Dims{2, 5, 7}, Dims{2, 3, 5, 9}, Dims{0, 3, 4},
        Dims{2, 16, 17, 17}, Dims{196, 384}, Dims{3, 40, 15}, Dims{5, 7, 2, 2}}) {
    const int64_t ch = shape[1];
    const Tensor var = random_f32({ch}, seed++, 0.1f, 2);
    for (bool constant : {false, true}) {
      NodeCase c{"BatchNormalization",
                 {random_f32(shape, seed++, -2, 3), random_f32({ch}, seed++),
                  random_f32({ch}, seed++), random_f32({ch}, seed++), var},
                 {},
                 15};
      c.constant = {false, constant, constant, constant, constant};
      expect_matches(c, norm_tol());
    }
  }
  NodeCase train{"BatchNormalization",
                 {random_f32({2, 3, 4}, 1), random_f32({3}, 2), random_f32({3}, 3),
                  random_f32({3}, 4), random_f32({3}, 5, 0.1f, 1)},
                 {},
                 15};
  train.attrs.set("training_mode", int64_t{1});
  expect_matches(train, norm_tol(), {}, "reference");
}

TEST(CpuInstanceNorm, Shapes) {
  uint32_t seed = 120;
  for (const Dims& shape : {Dims{2, 3, 1}, Dims{1, 4, 7}, Dims{2, 3, 5, 9}, Dims{2, 3, 0}}) {
    NodeCase c{"InstanceNormalization",
               {random_f32(shape, seed++, -2, 3), random_f32({shape[1]}, seed++),
                random_f32({shape[1]}, seed++)},
               {},
               6};
    c.attrs.set("epsilon", 1e-4);
    expect_matches(c, norm_tol());
  }
}

TEST(CpuGroupNorm, PerChannelAndPerGroupScale) {
  uint32_t seed = 140;
  for (const Dims& shape : {Dims{2, 6, 5}, Dims{1, 4, 3, 3}, Dims{3, 8, 1}, Dims{2, 32, 9, 9}})
    for (int64_t groups : {int64_t{1}, int64_t{2}, shape[1]}) {
      const Tensor x = random_f32(shape, seed++, -2, 3);
      NodeCase c21{"GroupNormalization",
                   {x, random_f32({shape[1]}, seed++), random_f32({shape[1]}, seed++)},
                   {},
                   21};
      c21.attrs.set("num_groups", groups);
      expect_matches(c21, norm_tol());
      NodeCase c18{"GroupNormalization",
                   {x, random_f32({groups}, seed++), random_f32({groups}, seed++)},
                   {},
                   18};
      c18.attrs.set("num_groups", groups);
      expect_matches(c18, norm_tol());
    }
}

// ---- The norms with the Casts around them (fusion/node_casts.h) ----

// `t` converted to `dtype` by the reference's Cast.
Tensor cast_to(const Tensor& t, DType dtype) {
  Graph g;
  const ValueId x = g.add_input("x", {t.dtype(), to_shape(t.shape())}), y = g.add_value("y");
  Attributes to;
  to.set("to", static_cast<int64_t>(onnx_code(dtype)));
  g.add_node("Cast", {x}, {y}, to, "cast");
  g.add_output(y);
  infer_types(g);
  return reference::run(g, {t})[0];
}

// c's node (one output) reading input 0 in `in` through a Cast to float and giving its output
// through a Cast to `out` (no Cast where that is float32); the feeds are c's, input 0 in `in`.
Graph with_casts(const NodeCase& c, DType in, DType out, std::vector<Tensor>* feeds) {
  Graph g;
  auto cast = [&](ValueId x, DType dtype, const std::string& name) {
    const ValueId y = g.add_value(name);
    Attributes to;
    to.set("to", static_cast<int64_t>(onnx_code(dtype)));
    g.add_node("Cast", {x}, {y}, to, name);
    return y;
  };
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.inputs[i];
    const std::string name = cat("in", i);
    if (!t.defined()) {
      ins.push_back(kNoValue);
    } else if (i < c.constant.size() && c.constant[i]) {
      ins.push_back(g.add_value(name));
      g.set_initializer(ins.back(), t);
    } else {
      feeds->push_back(i == 0 ? cast_to(t, in) : t);
      ins.push_back(g.add_input(name, {feeds->back().dtype(), to_shape(t.shape())}));
      if (i == 0 && in != DType::kF32) ins.back() = cast(ins.back(), DType::kF32, "widen");
    }
  }
  ValueId y = g.add_value("out");
  g.add_node(c.op, ins, {y}, c.attrs, "node0", c.opset);
  if (out != DType::kF32) y = cast(y, out, "narrow");
  g.add_output(y);
  infer_types(g);
  return g;
}

// Each (in, out) pair of float32, bf16 and f16 with a half side: one kernel (rule
// Cast+Op+Cast) on the CPU that matches the reference on the unfused graph to a unit of the half
// type (the kernel's float result is within norm_tol of the reference's double one, and the two
// may round to neighbouring half values), on every ISA, with F16C and without.
void expect_casts_match(const NodeCase& c, Tol tol) {
  const DType f = DType::kF32, b = DType::kBF16, h = DType::kF16;
  for (auto [in, out] : {std::pair{b, b}, {h, h}, {b, f}, {f, b}, {h, f}, {f, h}, {b, h}}) {
    SCOPED_TRACE(cat(describe(c), ", ", dtype_name(in), " -> ", dtype_name(out)));
    std::vector<Tensor> feeds;
    Graph g = with_casts(c, in, out, &feeds);
    Executable exe = compile(g, {.level = 2});
    ASSERT_EQ(exe.num_steps(), 1u);
    EXPECT_EQ(exe.step(0).backend, "cpu");
    EXPECT_EQ(exe.step(0).rule, cat(in != f ? "Cast+" : "", c.op, out != f ? "+Cast" : ""));
    const double unit = in == h || out == h ? 0x1p-10 : 0x1p-7;
    for (bool f16c : {true, false}) {  // f16 converted by F16C, and without it
      std::optional<cpu::ExtScope> off;
      if (!f16c) off.emplace(cpu::Ext::kF16c);
      expect_runs_match(g, exe, feeds, {tol.rtol + unit, tol.atol + unit * 1e-3});
    }
  }
}

TEST(CpuNormCasts, SoftmaxRowsColumnsAndSpecials) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    // {300, 37}: rows through scratch in three pieces, the last one short.
    for (const Dims& shape :
         {Dims{3, 37}, Dims{300, 37}, Dims{12, 2, 129}, Dims{2, 5, 70}, Dims{1}})
      for (int64_t axis : {int64_t{-1}, int64_t{0}}) {
        NodeCase c{op, {random_f32(shape, 7, -6, 6)}, {}, 13};
        c.attrs.set("axis", axis);
        expect_casts_match(c, {8 * kUlp, 8 * kUlp});
      }
    Tensor x = random_f32({5, 37}, 9);
    x.data<float>()[3] = NAN;
    x.data<float>()[37 + 5] = INFINITY;
    for (int64_t j = 0; j < 37; ++j) x.data<float>()[2 * 37 + j] = -INFINITY;
    expect_casts_match({op, {x}, {}, 13}, {8 * kUlp, 8 * kUlp});
  }
}

TEST(CpuNormCasts, LayerNormRowsAndTheReferenceForm) {
  uint32_t seed = 300;
  for (const Dims& shape : {Dims{7}, Dims{3, 37}, Dims{4, 1, 33}, Dims{300, 96}, Dims{5, 128},
                            Dims{128, 768}, Dims{2, 0, 5}}) {
    const Dims norm = {shape.back()};
    for (bool with_bias : {false, true}) {
      NodeCase c{"LayerNormalization",
                 {random_f32(shape, seed++, -2, 3), random_f32(norm, seed++),
                  with_bias ? random_f32(norm, seed++) : Tensor()},
                 {},
                 17};
      c.constant = {false, true, true};
      c.attrs.set("epsilon", 1e-3);
      expect_casts_match(c, norm_tol());
    }
  }
  // A Scale that broadcasts over rows: the reference kernel at run time, through float32.
  NodeCase c{"LayerNormalization", {random_f32({5, 64}, 3), random_f32({5, 64}, 4)}, {}, 17};
  expect_casts_match(c, norm_tol());
}

// A LayerNormalization with a bf16 Cast after it stores the bits its float32 result rounds to
// (f32_to_bf16), on every ISA: rows in registers (up to 8 vectors under AVX-512, where the kernel
// rounds them itself) and row by row.
TEST(CpuNormCasts, LayerNormBf16IsItsFloatResultRounded) {
  uint32_t seed = 700;
  for (const Dims& shape : {Dims{300, 96}, Dims{7, 128}, Dims{9, 37}, Dims{4, 129}, Dims{3, 768}}) {
    const Dims norm = {shape.back()};
    NodeCase c{
        "LayerNormalization",
        {random_f32(shape, seed++, -2, 3), random_f32(norm, seed++), random_f32(norm, seed++)},
        {},
        17};
    c.constant = {false, true, true};
    std::vector<Tensor> feeds32, feeds16;
    const Graph g32 = with_casts(c, DType::kF32, DType::kF32, &feeds32);
    const Graph g16 = with_casts(c, DType::kF32, DType::kBF16, &feeds16);
    const Executable e32 = compile(g32, {.level = 2}), e16 = compile(g16, {.level = 2});
    ASSERT_EQ(e16.step(0).rule, "LayerNormalization+Cast");
    for (cpu::Isa isa : cpu::supported_isas()) {
      cpu::IsaScope scope(isa);
      const Tensor y32 = e32.run(feeds32)[0], y16 = e16.run(feeds16)[0];
      ASSERT_EQ(y16.dtype(), DType::kBF16);
      std::vector<uint16_t> want(static_cast<size_t>(y32.numel()));
      cpu::f32_to_bf16(y32.data<float>(), want.data(), y32.numel());
      const auto* got = static_cast<const uint16_t*>(y16.raw_data());
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && bad++ < 3)
          ADD_FAILURE() << dims_str(shape) << " " << cpu::isa_name(isa) << " at " << i << ": 0x"
                        << std::hex << got[i] << ", want 0x" << want[i] << std::dec;
    }
  }
}

TEST(CpuNormCasts, BatchInstanceAndGroupNorm) {
  uint32_t seed = 400;
  for (const Dims& shape : {Dims{2, 3, 5, 9}, Dims{1, 6, 17}}) {
    const int64_t ch = shape[1];
    NodeCase bn{
        "BatchNormalization",
        {random_f32(shape, seed++, -2, 3), random_f32({ch}, seed++), random_f32({ch}, seed++),
         random_f32({ch}, seed++), random_f32({ch}, seed++, 0.1f, 2)},
        {},
        15};
    bn.constant = {false, true, true, true, true};
    expect_casts_match(bn, norm_tol());
    NodeCase in{
        "InstanceNormalization",
        {random_f32(shape, seed++, -2, 3), random_f32({ch}, seed++), random_f32({ch}, seed++)},
        {},
        6};
    in.constant = {false, true, true};
    expect_casts_match(in, norm_tol());
    NodeCase gn{
        "GroupNormalization",
        {random_f32(shape, seed++, -2, 3), random_f32({ch}, seed++), random_f32({ch}, seed++)},
        {},
        21};
    gn.constant = {false, true, true};
    gn.attrs.set("num_groups", int64_t{3});
    expect_casts_match(gn, norm_tol());
  }
}

}  // namespace
}  // namespace pto::testing

namespace pto::testing {
namespace {

// Medians of the kernels the design note quotes (run with --gtest_also_run_disabled_tests).
TEST(CpuReduceBench, DISABLED_Medians) {
  auto bench = [](const char* label, const NodeCase& c) {
    std::vector<Tensor> feeds;
    Graph g = one_node(c, &feeds);
    Executable exe = compile(g, {.level = 0});
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<double> us;
      for (int i = 0; i < 60; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        exe.run(feeds);
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      std::sort(us.begin(), us.end());
      std::printf("%-28s %d thread(s): median %8.1f us (%s)\n", label, threads, us[us.size() / 2],
                  exe.node_backend(0).c_str());
    }
    set_num_threads(0);
  };
  NodeCase softmax{"Softmax", {random_f32({12, 128, 128}, 1)}, {}, 13};
  bench("softmax [12,128,128]", softmax);
  NodeCase ln{"LayerNormalization",
              {random_f32({128, 768}, 2), random_f32({768}, 3), random_f32({768}, 4)},
              {},
              17};
  ln.constant = {false, true, true};
  bench("layer_norm [128,768]", ln);
  NodeCase mp{"MaxPool", {random_f32({1, 64, 112, 112}, 5)}, {}, 12};
  mp.attrs.set("kernel_shape", Dims{3, 3});
  mp.attrs.set("strides", Dims{2, 2});
  mp.attrs.set("pads", Dims{1, 1, 1, 1});
  bench("max_pool 3x3 s2 [1,64,112,112]", mp);
  NodeCase mean{"ReduceMean", {random_f32({8, 2048, 7, 7}, 6), ints({2, 3})}, {}, 18};
  mean.constant = {false, true};
  bench("mean HW [8,2048,7,7]", mean);
}

}  // namespace
}  // namespace pto::testing
