// The CPU tree-ensemble kernel (ai.onnx.ml TreeEnsemble) against the reference interpreter, on
// every ISA with 1 and 2 threads: random complete trees with every node mode, set membership and
// missing-value tracking (the general walk), forests of BRANCH_LEQ alone (the branch-free form),
// each aggregate, float and double X with NaN; and the errors decode() gives for malformed trees.
#include <gtest/gtest.h>

#include <random>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

struct TreeSpec {
  int trees = 5, depth = 4, features = 6, targets = 3;
  int modes = 7;  // node modes drawn from 0 .. modes - 1 (6: MEMBER)
  bool missing = false;
  int64_t aggregate = 1;
};

Tensor typed(const std::vector<double>& v, DType dt) {
  Tensor t = Tensor::empty(dt, {static_cast<int64_t>(v.size())});
  dispatch(dt, kFloatTypes, "test", [&]<class T>() {
    for (size_t i = 0; i < v.size(); ++i) t.data<T>()[i] = static_cast<T>(v[i]);
  });
  return t;
}

// Complete trees in TreeEnsemble's form: interior nodes and leaves indexed separately.
Attributes forest(const TreeSpec& s, DType dt, uint32_t seed) {
  std::mt19937 gen(seed);
  auto pick = [&](int n) { return static_cast<int64_t>(gen() % static_cast<uint32_t>(n)); };
  std::vector<int64_t> feature, true_ids, false_ids, true_leaf, false_leaf, missing, targets, roots;
  std::vector<double> modes, splits, weights, members;
  for (int t = 0; t < s.trees; ++t) {
    const auto base_node = static_cast<int64_t>(feature.size());
    const auto base_leaf = static_cast<int64_t>(weights.size());
    roots.push_back(base_node);
    const int64_t interior = (int64_t{1} << s.depth) - 1;
    for (int64_t p = 0; p < interior; ++p) {
      const int64_t mode = pick(s.modes);
      feature.push_back(pick(s.features));
      modes.push_back(static_cast<double>(mode));
      splits.push_back(static_cast<double>(pick(5) - 2));
      missing.push_back(s.missing ? pick(2) : 0);
      if (mode == 6) {
        members.push_back(static_cast<double>(pick(5) - 2));
        members.push_back(static_cast<double>(pick(5) - 2));
        members.push_back(NAN);
      }
      for (int side = 0; side < 2; ++side) {
        const int64_t child = 2 * p + 1 + side;
        const bool leaf = child >= interior;
        (side == 0 ? true_leaf : false_leaf).push_back(leaf);
        (side == 0 ? true_ids : false_ids)
            .push_back(leaf ? base_leaf + child - interior : base_node + child);
      }
    }
    for (int64_t l = 0; l <= interior; ++l) {
      targets.push_back(pick(s.targets));
      weights.push_back(static_cast<double>(pick(2001) - 1000) / 300.0);
    }
  }
  Attributes a;
  a.set("nodes_featureids", feature);
  a.set("nodes_modes", [&] {
    Tensor m = Tensor::empty(DType::kU8, {static_cast<int64_t>(modes.size())});
    for (size_t i = 0; i < modes.size(); ++i) m.data<uint8_t>()[i] = static_cast<uint8_t>(modes[i]);
    return m;
  }());
  a.set("nodes_splits", typed(splits, dt));
  a.set("nodes_truenodeids", true_ids);
  a.set("nodes_falsenodeids", false_ids);
  a.set("nodes_trueleafs", true_leaf);
  a.set("nodes_falseleafs", false_leaf);
  if (s.missing) a.set("nodes_missing_value_tracks_true", missing);
  if (!members.empty()) a.set("membership_values", typed(members, dt));
  a.set("leaf_targetids", targets);
  a.set("leaf_weights", typed(weights, dt));
  a.set("tree_roots", roots);
  a.set("n_targets", int64_t{s.targets});
  a.set("aggregate_function", s.aggregate);
  return a;
}

// X [rows, features] of values in {-2, ..., 2} (ties with the thresholds), some NaN.
Tensor rows_x(int64_t rows, int features, DType dt, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> v(static_cast<size_t>(rows * features));
  for (double& e : v) e = gen() % 10 == 0 ? NAN : static_cast<double>(gen() % 5) - 2;
  return typed(v, dt).reshape({rows, features});
}

void check(const TreeSpec& s, DType dt, int64_t rows, uint32_t seed) {
  NodeCase c{"TreeEnsemble", {rows_x(rows, s.features, dt, seed)}, forest(s, dt, seed + 1), 5};
  // Sums in the comparison type (float for float X) against the reference's double.
  expect_matches(c, {.rtol = 1e-5, .atol = 1e-5});
}

TEST(CpuTreeEnsemble, EveryModeMembershipAndMissingValues) {
  uint32_t seed = 10;
  for (DType dt : {DType::kF32, DType::kF64})
    for (int64_t agg : {0, 1, 2, 3})
      for (bool missing : {false, true})
        check({.modes = 7, .missing = missing, .aggregate = agg}, dt, 37, seed += 2);
}

TEST(CpuTreeEnsemble, PlainForestBranchFree) {
  uint32_t seed = 100;
  for (DType dt : {DType::kF32, DType::kF64})
    for (int64_t rows : {1, 15, 16, 17, 300})  // around the 16 rows stepping together
      check({.trees = 9, .depth = 6, .targets = 2, .modes = 1}, dt, rows, seed += 2);
}

void expect_rejected(Attributes a, const std::string& what) {
  NodeCase c{"TreeEnsemble", {rows_x(3, 6, DType::kF32, 1)}, std::move(a), 5};
  std::vector<Tensor> feeds;
  Graph g = one_node(c, &feeds);
  try {
    reference::run(g, feeds);
    ADD_FAILURE() << "expected an error mentioning '" << what << "'";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(CpuTreeEnsemble, MalformedTreesRejected) {
  const TreeSpec s{.trees = 1, .depth = 2, .modes = 1};
  Attributes a = forest(s, DType::kF32, 3);
  a.set("nodes_truenodeids", std::vector<int64_t>{1, 0, 2});  // node 1's true child: the root
  a.set("nodes_trueleafs", std::vector<int64_t>{0, 0, 1});
  expect_rejected(a, "cycle");
  a = forest(s, DType::kF32, 3);
  a.set("nodes_falsenodeids", std::vector<int64_t>{2, 1, 9});  // leaf 9 of 4
  expect_rejected(a, "nodes_falsenodeids[2] = 9 is not a leaf index below 4");
  a = forest(s, DType::kF32, 3);
  a.set("leaf_targetids", std::vector<int64_t>{0, 5, 0, 0});
  expect_rejected(a, "target 5");
  a = forest(s, DType::kF32, 3);
  a.set("nodes_modes", [] {
    Tensor m = Tensor::empty(DType::kU8, {3});
    for (int i = 0; i < 3; ++i) m.data<uint8_t>()[i] = 6;  // MEMBER without membership_values
    return m;
  }());
  expect_rejected(a, "without its members");
}

}  // namespace
}  // namespace pto::testing
