// CPU data-movement kernels (src/backend/cpu/movement*): every op as a one-node graph through
// pto::compile at level 0, compared bit for bit with the reference interpreter on every ISA and
// on 1 and 2 threads; view ops must share the input's storage.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/isa/isa.h"
#include "pto/executable.h"
#include "pto/parallel.h"

namespace pto {
namespace {

using Ints = std::vector<int64_t>;

std::mt19937& rng() {
  static std::mt19937 g(1234);
  return g;
}

// Random bits of any dtype (so float NaN payloads are exercised too); bool is 0 or 1.
Tensor random_tensor(DType dt, const Dims& shape) {
  Tensor t = Tensor::empty(dt, shape);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i)
    p[i] = static_cast<uint8_t>(dt == DType::kBool ? rng()() & 1 : rng()());
  return t;
}

Tensor ints(const Ints& v) {
  return Tensor::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())});
}

// One node: `data` inputs come first and are graph inputs; `constants` follow as initializers (an
// undefined tensor is a missing optional input).
struct Case {
  std::string op;
  std::vector<Tensor> data;
  std::vector<Tensor> constants;
  Attributes attrs;
  size_t outputs = 1;
  int opset = 18;
  bool any_shape = false;  // data inputs of unknown shape: errors come at run time, not compile
};

Graph graph_of(const Case& c) {
  Graph g;
  std::vector<ValueId> ins, outs;
  for (size_t i = 0; i < c.data.size(); ++i)
    ins.push_back(g.add_input(
        "x" + std::to_string(i),
        {c.data[i].dtype(), c.any_shape ? std::optional<Shape>() : to_shape(c.data[i].shape())}));
  for (size_t i = 0; i < c.constants.size(); ++i) {
    if (!c.constants[i].defined()) {
      ins.push_back(kNoValue);
      continue;
    }
    ins.push_back(g.add_value("c" + std::to_string(i)));
    g.set_initializer(ins.back(), c.constants[i]);
  }
  for (size_t i = 0; i < c.outputs; ++i) outs.push_back(g.add_value("y" + std::to_string(i)));
  g.add_node(c.op, ins, outs, c.attrs, "node0", c.opset);
  for (ValueId v : outs) g.add_output(v);
  return g;
}

void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  Tensor a = got.contiguous(), b = want.contiguous();
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << what << " differs";
}

// Runs `c` on the CPU backend (asserting it was chosen) and the reference, on every ISA and on 1
// and 2 threads; returns the CPU outputs of the last run.
std::vector<Tensor> check(const Case& c) {
  Executable exe = compile(graph_of(c), {.level = 0});
  EXPECT_EQ(exe.node_backend(0), "cpu") << c.op;
  const std::vector<Tensor> want = reference::run(exe.graph(), c.data);
  std::vector<Tensor> got;
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      got = exe.run(c.data);
      EXPECT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size() && i < want.size(); ++i)
        expect_same_bits(got[i], want[i],
                         cat(c.op, " ", c.data[0].str(), " output ", i, " (", cpu::isa_name(isa),
                             ", ", threads, " threads)"));
    }
  }
  set_num_threads(0);
  return got;
}

// The message the CPU backend and the reference throw for `c` (they must be the same).
std::string error_of(const Case& c) {
  Executable exe = compile(graph_of(c), {.level = 0});
  EXPECT_EQ(exe.node_backend(0), "cpu");
  std::string cpu_msg, ref_msg;
  try {
    exe.run(c.data);
  } catch (const ValueError& e) {
    cpu_msg = e.what();
  }
  try {
    reference::run(exe.graph(), c.data);
  } catch (const ValueError& e) {
    ref_msg = e.what();
  }
  EXPECT_EQ(cpu_msg, ref_msg);
  EXPECT_FALSE(cpu_msg.empty()) << "expected a ValueError";
  return cpu_msg;
}

Attributes attrs(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  Attributes a;
  for (const auto& [k, v] : kv) a.set(k, v);
  return a;
}

const DType kDTypes[] = {DType::kF32, DType::kI64, DType::kU8, DType::kBool, DType::kF16};

Dims random_shape(int rank, std::initializer_list<int64_t> sizes = {0, 1, 2, 3, 5, 7}) {
  std::vector<int64_t> pool(sizes);
  Dims d;
  for (int i = 0; i < rank; ++i) d.push_back(pool[rng()() % pool.size()]);
  return d;
}

// ---- Views ----

void expect_view(const Case& c) {
  std::vector<Tensor> out = check(c);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].raw_data(), c.data[0].raw_data()) << c.op << " copied its input";
}

TEST(CpuMovement, ReshapeIsAView) {
  for (DType dt : kDTypes) {
    Tensor x = random_tensor(dt, {2, 3, 4});
    expect_view({"Reshape", {x}, {ints({0, -1})}});
    expect_view({"Reshape", {x}, {ints({4, 0, 2})}});
    expect_view({"Reshape", {x}, {ints({24})}});
    expect_view({"Reshape", {x}, {ints({-1, 2, 3})}, attrs({{"allowzero", int64_t{1}}})});
  }
  expect_view({"Reshape",
               {random_tensor(DType::kF32, {0, 3})},
               {ints({3, 0})},
               attrs({{"allowzero", int64_t{1}}})});
  expect_view({"Reshape", {random_tensor(DType::kI64, {})}, {ints({1, 1})}});
  expect_view({"Reshape", {random_tensor(DType::kI64, {1, 1})}, {ints({})}});
  expect_view(
      {"Reshape", {random_tensor(DType::kF32, {6})}, {}, attrs({{"shape", Ints{2, 3}}}), 1, 1});
}

TEST(CpuMovement, FlattenSqueezeUnsqueezeIdentityAreViews) {
  for (DType dt : kDTypes) {
    Tensor x = random_tensor(dt, {2, 1, 3, 1});
    for (int64_t axis : {0, 2, 4, -1, -4})
      expect_view({"Flatten", {x}, {}, attrs({{"axis", axis}})});
    expect_view({"Squeeze", {x}, {}});
    expect_view({"Squeeze", {x}, {ints({-1, 1})}});
    expect_view({"Squeeze", {x}, {}, attrs({{"axes", Ints{3}}}), 1, 11});
    expect_view({"Unsqueeze", {x}, {ints({0, -1})}});
    expect_view({"Unsqueeze", {x}, {}, attrs({{"axes", Ints{1, 5}}}), 1, 11});
    expect_view({"Identity", {x}});
  }
  expect_view({"Unsqueeze", {random_tensor(DType::kU8, {})}, {ints({0})}});
  expect_view({"Squeeze", {random_tensor(DType::kU8, {1, 1})}, {}});
  expect_view({"Flatten", {random_tensor(DType::kF32, {0, 5})}, {}});
}

// ---- Transpose ----

TEST(CpuMovement, TransposeRandomShapesAndPerms) {
  for (int rank = 0; rank <= 5; ++rank)
    for (int trial = 0; trial < 6; ++trial) {
      Ints perm(rank);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng());
      if (rank > 0 && trial % 2) perm[0] -= rank;  // negative axes
      DType dt = kDTypes[trial % 5];
      Attributes a = trial == 0 ? Attributes() : attrs({{"perm", perm}});
      check({"Transpose", {random_tensor(dt, random_shape(rank))}, {}, a});
    }
}

TEST(CpuMovement, TransposeBlockedPaths) {
  // Sizes around the 8x8 and 16x16 blocks and the 64-row strips, every element size.
  const std::vector<std::pair<Dims, Ints>> cases = {
      {{67, 130}, {1, 0}},
      {{8, 8}, {1, 0}},
      {{129, 9}, {1, 0}},
      {{3, 40, 70}, {2, 0, 1}},
      {{5, 33, 17}, {0, 2, 1}},
      {{2, 12, 16, 8}, {0, 2, 1, 3}},
      {{2, 3, 4, 65, 3}, {4, 3, 1, 0, 2}},
      {{40, 3, 70}, {2, 1, 0}},
      {{1, 17, 1, 70}, {3, 1, 2, 0}},
  };
  for (const auto& [shape, perm] : cases)
    for (DType dt : {DType::kF32, DType::kI64, DType::kU8, DType::kF16, DType::kI32})
      check({"Transpose", {random_tensor(dt, shape)}, {}, attrs({{"perm", perm}})});
}

TEST(CpuMovement, DepthToSpaceAndSpaceToDepth) {
  for (DType dt : {DType::kF32, DType::kU8, DType::kI64}) {
    for (const char* mode : {"DCR", "CRD"}) {
      Attributes a = attrs({{"blocksize", int64_t{2}}, {"mode", std::string(mode)}});
      check({"DepthToSpace", {random_tensor(dt, {2, 12, 3, 5})}, {}, a});
      check({"SpaceToDepth", {random_tensor(dt, {2, 3, 6, 10})}, {}, a, 1, 25});
    }
    check({"DepthToSpace",
           {random_tensor(dt, {1, 9, 0, 4})},
           {},
           attrs({{"blocksize", int64_t{3}}})});
  }
}

// ---- Gather ----

TEST(CpuMovement, Gather) {
  for (DType dt : kDTypes)
    for (int64_t axis : {0, 1, 2, -1, -3}) {
      Dims shape = {4, 5, 3};
      int64_t n = shape[axis < 0 ? axis + 3 : axis];
      Tensor i64 = Tensor::from_vector<int64_t>({0, n - 1, -1, -n, 1, 1}, {2, 3});
      Tensor i32 = Tensor::from_vector<int32_t>({int32_t(n - 1), 0, -1}, {3});
      Tensor scalar = Tensor::scalar<int64_t>(-2);
      Tensor empty = Tensor::empty(DType::kI64, {0, 2});
      for (const Tensor& ind : {i64, i32, scalar, empty})
        check({"Gather", {random_tensor(dt, shape), ind}, {}, attrs({{"axis", axis}})});
    }
  check({"Gather",
         {random_tensor(DType::kF32, {300, 64}),
          Tensor::from_vector<int64_t>(std::vector<int64_t>(500, 7), {500})}});
  check({"Gather", {random_tensor(DType::kU8, {0, 3}), Tensor::empty(DType::kI32, {4, 0})}});
  check(
      {"Gather", {random_tensor(DType::kI64, {3, 0}), Tensor::from_vector<int64_t>({2, -3}, {2})}});
}

TEST(CpuMovement, GatherOutOfRangeNamesTheNode) {
  Tensor x = random_tensor(DType::kF32, {4, 3});
  std::string msg = error_of({"Gather", {x, Tensor::from_vector<int64_t>({0, 4}, {2})}});
  EXPECT_NE(msg.find("node 'node0'"), std::string::npos) << msg;
  error_of({"Gather", {x, Tensor::from_vector<int32_t>({-5}, {1})}});
  // Checked even when the output is empty.
  error_of(
      {"Gather", {random_tensor(DType::kF32, {4, 0}), Tensor::from_vector<int64_t>({9}, {1})}});
}

TEST(CpuMovement, GatherND) {
  // (data shape, indices shape, batch_dims): whole elements, rows and blocks; batches; an empty
  // index set. Indices drawn across [-n, n) of the dimension each one indexes.
  const std::tuple<Dims, Dims, int64_t> cases[] = {
      {{4, 5, 6}, {3, 3}, 0},    {{4, 5, 6}, {2, 2, 1}, 0}, {{4, 5, 6}, {7, 2}, 0},
      {{4, 5, 6}, {4, 3, 1}, 1}, {{4, 5, 6}, {4, 5, 1}, 2}, {{2, 16, 16}, {2, 1, 16, 1}, 1},
      {{4, 5, 6}, {0, 2}, 0}};
  for (DType dt : kDTypes)
    for (const auto& [shape, ind_shape, b] : cases) {
      Tensor ind = Tensor::empty(DType::kI64, ind_shape);
      const int64_t m = ind_shape.back();
      for (int64_t i = 0; i < ind.numel(); ++i) {
        const int64_t n = shape[b + i % m];
        ind.data<int64_t>()[i] = static_cast<int64_t>(rng()() % (2 * n)) - n;
      }
      check({"GatherND", {random_tensor(dt, shape), ind}, {}, attrs({{"batch_dims", b}})});
    }
  // Out of range: the node's error, before anything is copied.
  error_of({"GatherND",
            {random_tensor(DType::kF32, {3, 4}), Tensor::from_vector<int64_t>({0, 4}, {1, 2})}});
}

TEST(CpuMovement, GatherElements) {
  for (DType dt : kDTypes)
    for (int64_t axis : {0, 1, 2, -1}) {
      const Dims data_shape = {4, 5, 6};
      const int64_t n = data_shape[axis < 0 ? axis + 3 : axis];
      for (Dims ind_shape : {Dims{4, 5, 6}, Dims{2, 3, 4}, Dims{1, 1, 1}, Dims{0, 5, 6}}) {
        ind_shape[axis < 0 ? axis + 3 : axis] += 1;  // the axis may be longer than data's
        Tensor ind = Tensor::empty(DType::kI64, ind_shape);
        for (int64_t i = 0; i < ind.numel(); ++i)
          ind.data<int64_t>()[i] = static_cast<int64_t>(rng()() % (2 * n)) - n;
        check(
            {"GatherElements", {random_tensor(dt, data_shape), ind}, {}, attrs({{"axis", axis}})});
        if (ind.numel() == 0 || dt != DType::kF32) continue;
        Tensor i32 = Tensor::empty(DType::kI32, ind_shape);
        for (int64_t i = 0; i < ind.numel(); ++i)
          i32.data<int32_t>()[i] = static_cast<int32_t>(ind.data<int64_t>()[i]);
        check(
            {"GatherElements", {random_tensor(dt, data_shape), i32}, {}, attrs({{"axis", axis}})});
      }
    }
  // Rows of one index along the last axis (an index Expand-ed over it: copied row by row), some
  // of them negative, and the gather along the last axis itself.
  for (DType dt : {DType::kF32, DType::kI64, DType::kU8})
    for (int64_t axis : {0, 1, 2}) {
      const Dims data_shape = {3, 7, 9};
      const int64_t n = data_shape[axis];
      Dims ind_shape = {3, 5, 9};
      ind_shape[axis] = 4;
      Tensor ind = Tensor::empty(DType::kI64, ind_shape);
      const int64_t width = ind_shape[2];
      for (int64_t r = 0; r < ind.numel() / width; ++r) {
        const int64_t v = static_cast<int64_t>(rng()() % (2 * n)) - n;
        for (int64_t j = 0; j < width; ++j) ind.data<int64_t>()[r * width + j] = v;
      }
      check({"GatherElements", {random_tensor(dt, data_shape), ind}, {}, attrs({{"axis", axis}})});
    }
  Tensor x = random_tensor(DType::kF32, {3, 4});
  error_of({"GatherElements",
            {x, Tensor::from_vector<int64_t>({0, 1, 3, 2}, {2, 2})},
            {},
            attrs({{"axis", int64_t{0}}})});
  error_of({"GatherElements",
            {x, Tensor::from_vector<int64_t>({0, 1, 2, 0, 1}, {1, 5})},
            {},
            attrs({{"axis", int64_t{0}}})});
}

// Indices of `shape` along dimension `axis` of data (size n): random in [-n, n) (duplicates
// likely), or, with `unique`, a permutation of [0, n) per line along `axis` (then shape[axis] ==
// n), shifted by -n in every other entry (negative indices).
Tensor scatter_indices(const Dims& shape, int64_t axis, int64_t n, bool unique) {
  Tensor ind = Tensor::empty(DType::kI64, shape);
  int64_t* p = ind.data<int64_t>();
  if (!unique) {
    for (int64_t i = 0; i < ind.numel(); ++i) p[i] = static_cast<int64_t>(rng()() % (2 * n)) - n;
    return ind;
  }
  int64_t inner = 1;
  for (size_t k = axis + 1; k < shape.size(); ++k) inner *= shape[k];
  for (int64_t line = 0; line < ind.numel() / n; ++line) {
    std::vector<int64_t> perm(n);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    const int64_t base = (line / inner) * n * inner + line % inner;
    for (int64_t j = 0; j < n; ++j) p[base + j * inner] = perm[j] - (j % 2) * n;
  }
  return ind;
}

TEST(CpuMovement, ScatterElementsAndScatterND) {
  // Not f16: PromoteHalf computes an f16 scatter in fp32 between Casts, and the CPU and reference
  // Casts may quiet a random NaN payload differently.
  const char* reductions[] = {"none", "add", "mul", "max", "min"};
  for (DType dt : {DType::kF32, DType::kF64, DType::kI64, DType::kI32, DType::kU8, DType::kBool})
    for (const char* red : reductions)
      for (bool unique : {false, true}) {
        // ScatterElements on each axis: duplicates or none; the [4, 9000] case splits the output
        // between 2 threads (4- and 8-byte types).
        for (int64_t axis : {0, 1, -1}) {
          const Dims data_shape = {4, 6, 5};
          const int64_t a = axis < 0 ? axis + 3 : axis, n = data_shape[a];
          Dims ind_shape = {3, 4, 5};
          if (unique) ind_shape = data_shape;
          check({"ScatterElements",
                 {random_tensor(dt, data_shape), scatter_indices(ind_shape, a, n, unique),
                  random_tensor(dt, ind_shape)},
                 {},
                 attrs({{"axis", axis}, {"reduction", std::string(red)}})});
        }
        check({"ScatterElements",
               {random_tensor(dt, {4, 9000}), scatter_indices({4, 9000}, 1, 9000, unique),
                random_tensor(dt, {4, 9000})},
               {},
               attrs({{"axis", int64_t{1}}, {"reduction", std::string(red)}})});
        // ScatterND: elements, rows and blocks; 40 rows of 4 KB (parallel over output ranges on 2
        // threads for 4- and 8-byte types, with and without duplicates).
        const std::tuple<Dims, int64_t, int64_t> nd[] = {
            {{6, 5, 4}, 3, 7}, {{6, 5, 4}, 2, 9}, {{6, 5, 4}, 1, 4}, {{40, 1024}, 1, 40}};
        for (const auto& [shape, k, rows] : nd) {
          Tensor ind = Tensor::empty(DType::kI64, {unique ? shape[0] : rows, k});
          const Tensor first = scatter_indices({ind.dim(0)}, 0, shape[0], unique);
          for (int64_t r = 0; r < ind.dim(0); ++r)
            for (int64_t t = 0; t < k; ++t)
              ind.data<int64_t>()[r * k + t] =
                  t == 0 ? first.data<int64_t>()[r] : static_cast<int64_t>(rng()() % shape[t]);
          Dims upd_shape = {ind.dim(0)};
          upd_shape.insert(upd_shape.end(), shape.begin() + k, shape.end());
          check({"ScatterND",
                 {random_tensor(dt, shape), ind, random_tensor(dt, upd_shape)},
                 {},
                 attrs({{"reduction", std::string(red)}})});
        }
      }
  // Scatter (ScatterElements' old name, opset 9), and no updates.
  check({"Scatter",
         {random_tensor(DType::kF32, {4, 5}), scatter_indices({2, 5}, 0, 4, false),
          random_tensor(DType::kF32, {2, 5})},
         {},
         attrs({{"axis", int64_t{0}}}),
         1,
         9});
  check({"ScatterND",
         {random_tensor(DType::kI32, {4, 5}), Tensor::empty(DType::kI64, {0, 1}),
          random_tensor(DType::kI32, {0, 5})}});
  // Out of range: the node's error.
  error_of({"ScatterND",
            {random_tensor(DType::kF32, {3, 4}), Tensor::from_vector<int64_t>({0, 4}, {1, 2}),
             random_tensor(DType::kF32, {1})}});
  error_of({"ScatterElements",
            {random_tensor(DType::kF32, {3, 4}), Tensor::from_vector<int64_t>({-4}, {1, 1}),
             random_tensor(DType::kF32, {1, 1})}});
}

// ---- Concat and Split ----

TEST(CpuMovement, Concat) {
  for (DType dt : kDTypes)
    for (int64_t axis : {0, 1, 2, -1}) {
      auto part = [&](int64_t k) {
        Dims d = {3, 2, 5};
        d[axis < 0 ? axis + 3 : axis] = k;
        return random_tensor(dt, d);
      };
      check({"Concat", {part(1), part(0), part(4)}, {}, attrs({{"axis", axis}})});
      check({"Concat", {part(2)}, {}, attrs({{"axis", axis}})});
    }
  check({"Concat",
         {random_tensor(DType::kF32, {70000}), random_tensor(DType::kF32, {5})},
         {},
         attrs({{"axis", int64_t{0}}})});
  check({"Concat",
         {random_tensor(DType::kU8, {0, 3}), random_tensor(DType::kU8, {0, 4})},
         {},
         attrs({{"axis", int64_t{1}}})});
}

TEST(CpuMovement, Split) {
  for (DType dt : kDTypes) {
    Tensor x = random_tensor(dt, {6, 5, 3});
    check({"Split", {x}, {}, attrs({{"axis", int64_t{1}}, {"split", Ints{2, 0, 3}}}), 3, 11});
    check({"Split", {x}, {ints({1, 5})}, attrs({}), 2, 13});
    check({"Split", {x}, {}, attrs({{"axis", int64_t{-1}}}), 3, 13});
    check({"Split", {x}, {}, attrs({{"axis", int64_t{1}}, {"num_outputs", int64_t{2}}}), 2, 18});
  }
  check({"Split", {random_tensor(DType::kF32, {0, 4})}, {}, attrs({{"axis", int64_t{1}}}), 2, 13});
  check({"Split", {random_tensor(DType::kF32, {100000})}, {}, attrs({}), 2, 13});
}

// ---- Slice ----

TEST(CpuMovement, Slice) {
  struct S {
    Ints starts, ends, axes, steps;
  };
  const std::vector<S> slices = {
      {{1}, {3}, {}, {}},
      {{0, 1}, {-1, 100}, {0, 2}, {}},
      {{-1}, {-1000}, {1}, {-1}},
      {{10, 0}, {-10, 5}, {-3, -1}, {-2, 2}},
      {{2, 0, 1}, {0, 5, 5}, {2, 0, 1}, {-1, 3, 2}},
      {{3}, {1}, {0}, {1}},  // empty
      {{0}, {INT64_MAX}, {1}, {INT64_MIN}},
      {{INT64_MIN}, {INT64_MAX}, {2}, {1}},
  };
  for (DType dt : kDTypes)
    for (const S& s : slices) {
      Tensor x = random_tensor(dt, {5, 6, 7});
      std::vector<Tensor> consts = {ints(s.starts), ints(s.ends)};
      consts.push_back(s.axes.empty() ? Tensor() : ints(s.axes));
      if (!s.steps.empty()) consts.push_back(ints(s.steps));
      check({"Slice", {x}, consts});
    }
  check({"Slice", {random_tensor(DType::kF32, {4, 0})}, {ints({1}), ints({3})}});
  check({"Slice",
         {random_tensor(DType::kF32, {4, 6})},
         {},
         attrs({{"starts", Ints{1}}, {"ends", Ints{-1}}, {"axes", Ints{1}}}),
         1,
         1});
  check({"Slice", {random_tensor(DType::kF32, {300, 300})}, {ints({1, 2}), ints({299, 298})}});
}

// Constant starts/ends/axes/steps are read once when the kernel is made (prepare_params); every
// error still comes at run time, the reference's message word for word, whether reading them
// failed (lengths that differ) or the input shows it (an axis out of its rank, repeated, step 0).
TEST(CpuMovement, SliceErrorsWithConstantParameters) {
  const Tensor x = random_tensor(DType::kF32, {5, 6});
  EXPECT_NE(error_of({"Slice", {x}, {ints({0}), ints({1}), ints({2})}, {}, 1, 18, true})
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"Slice", {x}, {ints({0, 0}), ints({1, 1}), ints({1, -1})}, {}, 1, 18, true})
                .find("repeated"),
            std::string::npos);
  EXPECT_NE(error_of({"Slice", {x}, {ints({0}), ints({1}), ints({0}), ints({0})}, {}, 1, 18, true})
                .find("step 0"),
            std::string::npos);
  EXPECT_NE(
      error_of({"Slice", {x}, {ints({0, 1}), ints({1})}, {}, 1, 18, true}).find("differ in length"),
      std::string::npos);
  // The same prepared kernel on inputs of other ranks: the axis is checked per call.
  Executable exe = compile(
      graph_of({"Slice", {x}, {ints({1}), ints({4}), ints({-1})}, {}, 1, 18, true}), {.level = 0});
  ASSERT_EQ(exe.node_backend(0), "cpu");
  for (const Dims& shape : {Dims{7}, Dims{2, 3, 9}}) {
    const Tensor y = random_tensor(DType::kF32, shape);
    expect_same_bits(exe.run({y})[0], reference::run(exe.graph(), {y})[0], dims_str(shape));
  }
}

TEST(CpuMovement, SplitErrorsWithConstantParameters) {
  const Tensor x = random_tensor(DType::kF32, {5, 6});
  EXPECT_NE(error_of({"Split", {x}, {ints({2, 3})}, attrs({{"axis", int64_t{1}}}), 2, 13, true})
                .find("does not sum"),
            std::string::npos);
  EXPECT_NE(error_of({"Split", {x}, {ints({2, 3, 1})}, attrs({{"axis", int64_t{2}}}), 3, 13, true})
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"Split", {x}, {ints({5})}, attrs({}), 2, 13, true}).find("entries for"),
            std::string::npos);
  EXPECT_NE(error_of({"Split", {x}, {}, attrs({{"axis", int64_t{1}}}), 4, 13, true}).find("evenly"),
            std::string::npos);
}

// ---- Expand, Tile, Pad ----

TEST(CpuMovement, Expand) {
  for (DType dt : kDTypes) {
    check({"Expand", {random_tensor(dt, {3, 1}), ints({2, 3, 4})}});
    check({"Expand", {random_tensor(dt, {1}), ints({5})}});
    check({"Expand", {random_tensor(dt, {}), ints({2, 3})}});
    check({"Expand", {random_tensor(dt, {2, 1, 3}), ints({1, 1})}});
    check({"Expand", {random_tensor(dt, {1, 4, 1}), ints({3, 0, 4, 70})}});
    check({"Expand", {random_tensor(dt, {4, 1, 1}), ints({1, 1, 80, 1})}});
  }
}

TEST(CpuMovement, Tile) {
  for (DType dt : kDTypes) {
    check({"Tile", {random_tensor(dt, {2, 3}), ints({2, 3})}});
    check({"Tile", {random_tensor(dt, {2, 3}), ints({0, 2})}});
    check({"Tile", {random_tensor(dt, {1, 35}), ints({4, 1})}});
    check({"Tile", {random_tensor(dt, {}), ints({})}});
    check({"Tile", {random_tensor(dt, {3, 1, 2}), ints({1, 5, 7})}});
  }
}

TEST(CpuMovement, Pad) {
  for (DType dt : kDTypes)
    for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
      Tensor x = random_tensor(dt, {3, 4, 5});
      Attributes a = attrs({{"mode", std::string(mode)}});
      check({"Pad", {x}, {ints({1, 0, 2, 2, 3, 1})}, a});
      check({"Pad", {x}, {ints({0, -1, 3, 1, 2, -2})}, a});
      check({"Pad", {x}, {ints({2, 3, 1, 4}), Tensor(), ints({-1, 0})}, a});
      check({"Pad", {x}, {ints({0, 0, 0, 0, 0, 0})}, a});
    }
  Tensor x = random_tensor(DType::kF32, {2, 3});
  check({"Pad", {x}, {ints({1, 1, 1, 1}), Tensor::scalar<float>(2.5f)}});
  check({"Pad", {x}, {}, attrs({{"pads", Ints{0, 2, 1, 0}}, {"value", 1.5}}), 1, 2});
  check({"Pad", {random_tensor(DType::kI64, {0, 3})}, {ints({1, 0, 1, 2})}});
  check({"Pad", {random_tensor(DType::kU8, {})}, {ints({})}});
  check({"Pad",
         {random_tensor(DType::kF32, {1, 3, 60, 60})},
         {ints({0, 0, 2, 2, 0, 0, 2, 2})},
         attrs({{"mode", std::string("reflect")}})});
}

// Medians of Transpose through the Executable, for docs/backend/movement.md (compare with torch's
// x.permute(...).contiguous() at the same thread count). Run with --gtest_also_run_disabled_tests.
TEST(CpuMovement, DISABLED_TransposeTiming) {
  const std::vector<std::pair<Dims, Ints>> cases = {{{1, 12, 128, 64}, {0, 2, 1, 3}},
                                                    {{768, 3072}, {1, 0}}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto& [shape, perm] : cases) {
      Case c{"Transpose", {random_tensor(DType::kF32, shape)}, {}, attrs({{"perm", perm}})};
      Executable exe = compile(graph_of(c), {.level = 0});
      std::vector<double> us;
      for (int i = 0; i < 200; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        exe.run(c.data);
        us.push_back(
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count());
      }
      std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
      std::printf("Transpose %s perm %s, %d threads: median %.1f us\n", dims_str(shape).c_str(),
                  dims_str(perm).c_str(), threads, us[us.size() / 2]);
    }
  }
  set_num_threads(0);
}

}  // namespace
}  // namespace pto
