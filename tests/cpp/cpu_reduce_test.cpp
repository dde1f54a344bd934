// CPU Reduce* and ArgMax/ArgMin kernels against the reference interpreter: every axis subset of
// shapes with 0, 1 and odd sizes, negative axes, keepdims 0/1, noop_with_empty_axes, axes as an
// attribute, a constant input and a run-time input; the parallel splits of large reductions; NaN
// and infinities; every ISA with 1 and 2 threads.
//
// Tolerances (kUlp = one float ulp at 1): max/min/arg are exact. Sums (Sum, Mean, L1, SumSquare,
// L2) are within 16 ulp of sum(|x|) per output (float accumulation in a fixed order, against
// the reference's double). Prod within 64 ulp relative; LogSum and LogSumExp within 16 ulp
// relative plus 16 ulp absolute.
#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

struct ReduceOp {
  const char* name;
  Tol tol;
  bool sum_like;  // tolerance scaled by sum(|x|) (mean(|x|) for ReduceMean)
  float lo, hi;   // input range
};

const ReduceOp kReduceOps[] = {
    {"ReduceSum", {16 * kUlp, 0}, true, -1, 1},
    {"ReduceMean", {16 * kUlp, 0}, true, -1, 1},
    {"ReduceMax", {0, 0}, false, -1, 1},
    {"ReduceMin", {0, 0}, false, -1, 1},
    {"ReduceProd", {64 * kUlp, 0}, false, 0.5, 1.5},
    {"ReduceL1", {16 * kUlp, 0}, true, -1, 1},
    {"ReduceL2", {16 * kUlp, 0}, true, -1, 1},
    {"ReduceSumSquare", {16 * kUlp, 0}, true, -1, 1},
    {"ReduceLogSum", {16 * kUlp, 16 * kUlp}, false, 0.5, 1.5},
    {"ReduceLogSumExp", {16 * kUlp, 16 * kUlp}, false, -1, 1},
};

enum class AxesForm { kAttribute, kConstant, kRuntime };

NodeCase reduce_case(const ReduceOp& op, const Tensor& x, const std::vector<int64_t>* axes,
                     bool keepdims, bool noop, AxesForm form) {
  NodeCase c{op.name, {x}};
  c.attrs.set("keepdims", static_cast<int64_t>(keepdims));
  if (noop) c.attrs.set("noop_with_empty_axes", int64_t{1});
  if (form == AxesForm::kAttribute) {
    c.opset = std::string(op.name) == "ReduceSum" ? 11 : 13;
    if (axes) c.attrs.set("axes", *axes);
  } else if (axes) {
    c.inputs.push_back(ints(*axes));
    c.constant = {false, form == AxesForm::kConstant};
  }
  return c;
}

// Sum of |x| per output (mean of |x| for ReduceMean), from the reference: the scale of a sum's
// rounding error.
std::vector<double> abs_scale(const ReduceOp& op, NodeCase c) {
  if (!op.sum_like) return {};
  const bool mean = std::string(op.name) == "ReduceMean";
  c.op = mean ? "ReduceMean" : "ReduceL1";
  Tensor a = c.inputs[0].clone();
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = std::fabs(a.data<float>()[i]);
  c.inputs[0] = a;
  if (c.op == "ReduceL1" && c.opset == 11) c.opset = 13;
  std::vector<Tensor> feeds;
  Graph g = one_node(c, &feeds);
  const Tensor s = reference::run(g, feeds)[0];
  std::vector<double> v(s.numel());
  for (int64_t i = 0; i < s.numel(); ++i) v[i] = s.item_as_double(i);
  return v;
}

void check_reduce(const ReduceOp& op, const Tensor& x, const std::vector<int64_t>* axes,
                  bool keepdims, bool noop, AxesForm form) {
  const NodeCase c = reduce_case(op, x, axes, keepdims, noop, form);
  expect_matches(c, op.tol, abs_scale(op, c));
}

Tensor input_for(const ReduceOp& op, Dims shape, uint32_t seed) {
  return random_f32(std::move(shape), seed, op.lo, op.hi);
}

TEST(CpuReduce, EveryAxisSubsetKeepdimsAndAxesForm) {
  const std::vector<Dims> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 3}, {4, 1, 33}, {2, 3, 4, 5}};
  uint32_t seed = 1;
  int variant = 0;
  for (const ReduceOp& op : kReduceOps)
    for (const Dims& shape : shapes) {
      const int64_t rank = static_cast<int64_t>(shape.size());
      const Tensor x = input_for(op, shape, seed++);
      for (int64_t mask = 1; mask < (int64_t{1} << rank); ++mask) {
        std::vector<int64_t> axes;
        for (int64_t k = rank - 1; k >= 0; --k)  // listed backwards, some negative
          if (mask >> k & 1) axes.push_back((k + mask) % 2 ? k - rank : k);
        const AxesForm form = static_cast<AxesForm>(variant++ % 3);
        check_reduce(op, x, &axes, mask % 2 == 0, false, form);
      }
      for (bool noop : {false, true}) check_reduce(op, x, nullptr, true, noop, AxesForm::kConstant);
      check_reduce(op, x, nullptr, false, false, AxesForm::kAttribute);
    }
}

TEST(CpuReduce, ParallelSplitsOfLargeReductions) {
  struct Shape {
    Dims dims;
    std::vector<int64_t> axes;
  };
  const std::vector<Shape> cases = {
      {{64, 1000}, {1}},         // many rows
      {{2, 300, 200}, {1}},      // few rows of long columns: columns split
      {{3, 20000}, {1}},         // few short outputs of a long axis: chunks combined in order
      {{40001}, {0}},            // everything
      {{5, 70, 9}, {0, 2}},      // non-adjacent axes: gathered first
      {{8, 64, 7, 7}, {2, 3}}};  // mean over H, W
  uint32_t seed = 100;
  for (const ReduceOp& op : kReduceOps) {
    if (std::string(op.name) == "ReduceProd") continue;  // overflows to inf on long axes
    for (const Shape& s : cases) {
      const Tensor x = input_for(op, s.dims, seed++);
      check_reduce(op, x, &s.axes, true, false, AxesForm::kConstant);
    }
  }
}

TEST(CpuReduce, NaNAndInfinities) {
  for (const ReduceOp& op : kReduceOps)
    for (const Dims& shape : {Dims{5, 23}, Dims{23, 5}, Dims{3, 40000}}) {
      const Tensor x = with_specials(input_for(op, shape, 7));
      for (int64_t axis : {0, 1}) {
        const std::vector<int64_t> axes = {axis};
        check_reduce(op, x, &axes, false, false, AxesForm::kConstant);
      }
    }
}

TEST(CpuReduce, DeclinesOtherDtypes) {
  NodeCase c{"ReduceMean", {Tensor::from_vector<int32_t>({1, 2, 3}, {3})}};  // truncating mean
  expect_matches(c, {}, {}, "reference");
  NodeCase i8{"ReduceSum", {Tensor::from_vector<int8_t>({1, 2, 3}, {3})}};
  expect_matches(i8, {}, {}, "reference");
  NodeCase axes32{"ReduceMax", {random_f32({2, 3}, 1), Tensor::from_vector<int32_t>({1}, {1})}};
  axes32.constant = {false, true};
  expect_matches(axes32, {}, {}, "reference");  // int32 axes: left to the reference
}

// int32 and int64 sums, products, max and min (Hugging Face models sum their attention masks):
// every axis subset of a 3-D shape (two apart: the reference at run time), keepdims, an empty
// reduced axis (the identities), sums and products that wrap modulo 2^bits as the reference's.
TEST(CpuReduce, IntegerSumProductMaxMin) {
  const Tensor base = random_f32({3, 5, 7}, 91);
  for (DType dt : {DType::kI64, DType::kI32}) {
    Tensor x = Tensor::empty(dt, base.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t v = std::lround(base.data<float>()[i] * 9);
      if (dt == DType::kI64)
        x.data<int64_t>()[i] =  // every 11th near the int64 limits: sums and products wrap
            i % 11 == 0 ? static_cast<int64_t>(static_cast<uint64_t>(v) * 4000000000000000000ULL)
                        : v;
      else
        x.data<int32_t>()[i] = static_cast<int32_t>(i % 11 == 0 ? v * 900000000 : v);
    }
    for (const char* op : {"ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"})
      for (const std::vector<int64_t>& axes :
           {std::vector<int64_t>{0}, {1}, {2}, {0, 1}, {1, 2}, {-1}, {}, {0, 2}})
        for (int64_t keepdims : {0, 1}) {
          NodeCase c{op, {x, ints(axes)}};
          c.constant = {false, true};
          c.attrs.set("keepdims", keepdims);
          const bool apart = axes == std::vector<int64_t>{0, 2};
          SCOPED_TRACE(apart ? "axes apart" : "one run of axes");
          expect_matches(c, {});  // exact: integers
        }
    NodeCase empty{"ReduceSum", {Tensor::empty(dt, {2, 0, 3}), ints({1})}};
    empty.constant = {false, true};
    for (const char* op : {"ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"}) {
      empty.op = op;
      expect_matches(empty, {});
    }
  }
}

TEST(CpuReduce, BadAxesRaiseLikeTheReference) {
  for (const std::vector<int64_t>& axes : {std::vector<int64_t>{2}, std::vector<int64_t>{1, -1}}) {
    NodeCase c{"ReduceSum", {random_f32({2, 3}, 1), ints(axes)}};  // axes known only at run time
    std::vector<Tensor> feeds;
    Graph g = one_node(c, &feeds);
    Executable exe = compile(g, {.level = 0});
    ASSERT_EQ(exe.node_backend(0), "cpu");
    EXPECT_THROW(exe.run(feeds), ValueError);
  }
}

TEST(CpuArgMax, AxesKeepdimsTiesAndNaN) {
  uint32_t seed = 300;
  for (const char* op : {"ArgMax", "ArgMin"})
    for (const Dims& shape : {Dims{1}, Dims{7}, Dims{3, 5}, Dims{4, 1, 33}, Dims{2, 0, 3},
                              Dims{2, 3, 4, 5}, Dims{3, 20000}}) {
      Tensor x = random_f32(shape, seed++);
      for (int64_t i = 0; i < x.numel(); ++i)  // few distinct values: many ties
        x.data<float>()[i] = std::round(x.data<float>()[i] * 2);
      for (bool specials : {false, true})
        for (int64_t axis = -static_cast<int64_t>(shape.size()); axis < 0; ++axis)
          for (int64_t keepdims : {0, 1})
            for (int64_t last : {0, 1}) {
              if (shape[shape.size() + axis] == 0) continue;  // an error, as in the reference
              NodeCase c{op, {specials ? with_specials(x.clone()) : x}};
              c.attrs.set("axis", axis);
              c.attrs.set("keepdims", keepdims);
              c.attrs.set("select_last_index", last);
              expect_matches(c, {});
            }
    }
}

// Integer inputs (CLIP's pooled output takes the ArgMax of int64 token ids): every integer width,
// ties (values in -3..3), both tie rules.
TEST(CpuArgMax, IntegerInputs) {
  const Tensor base = random_f32({3, 4, 33}, 77);
  auto as = [&]<class T>(DType dt) {
    Tensor x = Tensor::empty(dt, base.shape());
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<T>()[i] =
          static_cast<T>(std::lround(base.data<float>()[i] * 3) + (dt == DType::kU8 ? 3 : 0));
    return x;
  };
  const Tensor inputs[] = {as.operator()<int64_t>(DType::kI64), as.operator()<int32_t>(DType::kI32),
                           as.operator()<int8_t>(DType::kI8), as.operator()<uint8_t>(DType::kU8)};
  for (const char* op : {"ArgMax", "ArgMin"})
    for (const Tensor& x : inputs)
      for (int64_t axis : {-3, -2, -1})
        for (int64_t last : {0, 1}) {
          NodeCase c{op, {x}};
          c.attrs.set("axis", axis);
          c.attrs.set("keepdims", int64_t{0});
          c.attrs.set("select_last_index", last);
          expect_matches(c, {});
        }
}

}  // namespace
}  // namespace pto::testing
