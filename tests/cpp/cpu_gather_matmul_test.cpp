// GatherMatMul (a mixture of experts' layer: row s times the matrix I[s] selects) on the CPU
// against the reference interpreter, every ISA, 1 and 2 threads: both weight layouts, constant
// (packed per expert) and fed weights, experts with no rows, one expert for every row, negative
// and int32 indices, enough rows an expert for the pooled GEMMs; the reference against values
// computed here; an index out of range is a ValueError on both.
#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

const Tol kTol = {1e-5, 1e-5};

Tensor indices(const std::vector<int64_t>& v, DType dt = DType::kI64) {
  const auto n = static_cast<int64_t>(v.size());
  if (dt == DType::kI64) return Tensor::from_vector<int64_t>(v, {n});
  return Tensor::from_vector<int32_t>(std::vector<int32_t>(v.begin(), v.end()), {n});
}

NodeCase gather_case(const Tensor& x, const Tensor& w, const Tensor& idx, bool trans,
                     bool constant_w) {
  NodeCase c{"GatherMatMul", {x, w, idx}, {}, 18};
  c.attrs.set("trans_w", int64_t{trans});
  c.constant = {false, constant_w, false};
  return c;
}

std::vector<int64_t> routed(int64_t rows, int64_t experts, uint32_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(rows));
  uint32_t s = seed;
  for (auto& e : v) {
    s = s * 1664525u + 1013904223u;
    e = static_cast<int64_t>(s >> 16) % experts;
  }
  return v;
}

TEST(CpuGatherMatMul, MatchesTheReference) {
  uint32_t seed = 1;
  for (bool trans : {false, true})
    for (bool constant_w : {true, false})
      for (const auto& [S, K, N, E] : std::vector<std::array<int64_t, 4>>{
               {1, 8, 5, 3}, {7, 17, 9, 4}, {48, 33, 40, 6}, {200, 64, 96, 4}}) {
        const Tensor x = random_f32({S, K}, seed++);
        const Tensor w = random_f32(trans ? Dims{E, K, N} : Dims{E, N, K}, seed++);
        std::vector<int64_t> idx = routed(S, E - 1, seed++);  // expert E - 1 gets no rows
        if (S > 2) idx[1] = -1, idx[2] = -E;                  // negative indices count from E
        expect_matches(gather_case(x, w, indices(idx), trans, constant_w), kTol);
        expect_matches(gather_case(x, w, indices(idx, DType::kI32), trans, constant_w), kTol);
        expect_matches(gather_case(x, w, indices(std::vector<int64_t>(S, 1)), trans, constant_w),
                       kTol);
      }
}

TEST(CpuGatherMatMul, ReferenceValuesAndBadIndex) {
  // X = [[1, 2], [3, 4], [5, 6]], W[0] = [[1, 0], [0, 1], [1, 1]], W[1] = 2 W[0] (N = 3, K = 2).
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor w = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1, 2, 0, 0, 2, 2, 2}, {2, 3, 2});
  NodeCase c = gather_case(x, w, indices({1, 0, 1}), false, true);
  std::vector<Tensor> feeds;
  Graph g = one_node(c, &feeds);
  const std::vector<Tensor> y = reference::run(g, feeds);
  const std::vector<float> want = {2, 4, 6, 3, 4, 7, 10, 12, 22};
  ASSERT_EQ(y[0].shape(), (Dims{3, 3}));
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(y[0].data<float>()[i], want[i]) << i;
  for (int level : {0, 2}) {
    NodeCase bad = gather_case(x, w, indices({0, 2, 1}), false, true);
    Graph gb = one_node(bad, &feeds);
    Executable exe = compile(gb, {.level = level});
    EXPECT_THROW(exe.run(feeds), ValueError);
    EXPECT_THROW(reference::run(gb, feeds), ValueError);
  }
}

}  // namespace
}  // namespace pto::testing
