// The tree ensembles of ai.onnx.ml on the CPU: TreeEnsemble, TreeEnsembleRegressor and
// TreeEnsembleClassifier with float, double, int32 and int64 X. prepare() flattens the forest
// (ir/ops/tree_ensemble.h) into one array of 16-byte nodes (threshold in the comparison type,
// feature, both children; a child < 0 is leaf ~c) and one of leaf weights; run() takes blocks of
// rows in parallel and, within a block, each tree for all its rows, so that the tree stays in
// cache while eight rows walk it side by side (independent loads the core overlaps). Forests whose
// nodes are all BRANCH_LEQ without missing-value tracking (scikit-learn's, LightGBM's) walk a loop
// with one comparison; any other mode takes the general comparison. Scores are summed in the
// comparison type, as onnxruntime sums them; base values, the post transform and a classifier's
// label are the reference's (reference/ops/tree_finish.h).
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/kernel.h"
#include "ir/ops/tree_ensemble.h"
#include "pto/parallel.h"
#include "reference/ops/tree_finish.h"

namespace pto::cpu {
namespace {

using trees::Aggregate;
using trees::Forest;
using trees::Mode;

template <class Th>
struct FlatNode {
  Th threshold;
  int32_t feature;
  int32_t true_child;   // < 0: leaf ~c
  int32_t false_child;  // < 0: leaf ~c
};

struct Flat {
  Forest forest;
  bool plain = true;  // every node BRANCH_LEQ, none tracking missing values
  std::vector<FlatNode<float>> nodes_f;
  std::vector<FlatNode<double>> nodes_d;
};

std::shared_ptr<const Flat> flatten(const Node& n, DType x, const std::string& where) {
  auto f = std::make_shared<Flat>();
  f->forest = trees::decode(n, x, where);
  const Forest& t = f->forest;
  for (size_t i = 0; i < t.feature.size(); ++i) {
    f->plain = f->plain && t.mode[i] == Mode::kLeq && !t.missing_true[i];
    f->nodes_f.push_back(
        {static_cast<float>(t.split[i]), t.feature[i], t.true_child[i], t.false_child[i]});
    f->nodes_d.push_back({t.split[i], t.feature[i], t.true_child[i], t.false_child[i]});
  }
  return f;
}

// Whether x takes node i's true branch, for any mode (the reference's goes_true).
template <class Th>
bool general_true(const Forest& f, size_t i, Th x, Th t) {
  if (std::isnan(x) && f.missing_true[i]) return true;
  switch (f.mode[i]) {
    case Mode::kLeq:
      return x <= t;
    case Mode::kLt:
      return x < t;
    case Mode::kGte:
      return x >= t;
    case Mode::kGt:
      return x > t;
    case Mode::kEq:
      return x == t;
    case Mode::kNeq:
      return x != t;
    case Mode::kMember:
      for (int64_t m = f.set_begin[i]; m < f.set_begin[i + 1]; ++m)
        if (x == static_cast<Th>(f.members[static_cast<size_t>(m)])) return true;
      return false;
  }
  return false;
}

constexpr int64_t kBlock = 8;  // rows walking one tree side by side

// Rows [r0, r1) of X (features `cols`, converted to Th) through every tree: the leaf each row
// reaches in each tree is added to acc ([rows, targets], in Th) and has.
template <class T, class Th, bool kPlain>
void walk_rows(const Flat& fl, const FlatNode<Th>* nodes, const T* x, int64_t cols, int64_t r0,
               int64_t r1, Th* acc, uint8_t* has) {
  const Forest& f = fl.forest;
  const int64_t T_ = f.n_targets;
  const bool minmax = f.aggregate == Aggregate::kMin || f.aggregate == Aggregate::kMax;
  auto add = [&](int64_t row, int32_t leaf) {
    const auto l = static_cast<size_t>(trees::leaf_index(leaf));
    Th* a = acc + (row - r0) * T_;
    uint8_t* h = has + (row - r0) * T_;
    for (int64_t k = f.leaf_begin[l]; k < f.leaf_begin[l + 1]; ++k) {
      const auto t = static_cast<size_t>(f.targets[static_cast<size_t>(k)]);
      const Th v = static_cast<Th>(f.weights[static_cast<size_t>(k)]);
      if (!minmax)
        a[t] += v;
      else if (!h[t] || (f.aggregate == Aggregate::kMin ? v < a[t] : v > a[t]))
        a[t] = v;
      h[t] = 1;
    }
  };
  for (int32_t root : f.roots) {
    for (int64_t b = r0; b < r1; b += kBlock) {
      const int64_t n = std::min(kBlock, r1 - b);
      int32_t at[kBlock];
      for (int64_t j = 0; j < n; ++j) at[j] = root;
      // Each row of the block steps once per pass until all are at leaves.
      for (bool moving = true; moving;) {
        moving = false;
        for (int64_t j = 0; j < n; ++j) {
          const int32_t c = at[j];
          if (c < 0) continue;
          const FlatNode<Th>& nd = nodes[c];
          const Th v = static_cast<Th>(x[(b + j) * cols + nd.feature]);
          bool go;
          if constexpr (kPlain)
            go = v <= nd.threshold;
          else
            go = general_true<Th>(f, static_cast<size_t>(c), v, nd.threshold);
          at[j] = go ? nd.true_child : nd.false_child;
          moving = moving || at[j] >= 0;
        }
      }
      for (int64_t j = 0; j < n; ++j) add(b + j, at[j]);
    }
  }
}

constexpr int64_t kRowsPerChunk = 64;

std::vector<Tensor> run_tree_ensemble(const KernelContext& c) {
  const Flat& fl = **c.prepared_if<std::shared_ptr<const Flat>>();
  const Forest& f = fl.forest;
  const Tensor& X = c.input(0);
  if (X.rank() < 1 || X.rank() > 2 || f.num_features() > X.dim(-1)) return run_reference(c);
  const int64_t rows = X.rank() == 1 ? 1 : X.dim(0), cols = X.dim(-1), T_ = f.n_targets;
  const bool tree_ensemble = c.node.op == "TreeEnsemble";
  Tensor y = Tensor::empty(tree_ensemble ? X.dtype() : DType::kF32, {rows, T_});
  Tensor label = f.classifier ? Tensor::empty(DType::kI64, {rows}) : Tensor();
  auto body = [&]<class T, class Th>(const FlatNode<Th>* nodes) {
    const T* x = X.data<T>();
    parallel_for(0, rows, kRowsPerChunk, [&](int64_t r0, int64_t r1) {
      std::vector<Th> acc(static_cast<size_t>((r1 - r0) * T_), Th(0));
      std::vector<uint8_t> has(acc.size(), 0);
      if (fl.plain)
        walk_rows<T, Th, true>(fl, nodes, x, cols, r0, r1, acc.data(), has.data());
      else
        walk_rows<T, Th, false>(fl, nodes, x, cols, r0, r1, acc.data(), has.data());
      std::vector<double> score(static_cast<size_t>(T_)), out(static_cast<size_t>(T_));
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t k = 0; k < T_; ++k) score[k] = static_cast<double>(acc[(r - r0) * T_ + k]);
        int64_t lab = 0;
        reference::ml::finish_row(f, score.data(), has.data() + (r - r0) * T_, out.data(), &lab);
        if (f.classifier) label.data<int64_t>()[r] = lab;
        if (y.dtype() == DType::kF64)
          for (int64_t k = 0; k < T_; ++k) y.data<double>()[r * T_ + k] = out[k];
        else
          for (int64_t k = 0; k < T_; ++k) y.data<float>()[r * T_ + k] = static_cast<float>(out[k]);
      }
    });
  };
  switch (X.dtype()) {
    case DType::kF32:
      body.operator()<float, float>(fl.nodes_f.data());
      break;
    case DType::kF64:
      body.operator()<double, double>(fl.nodes_d.data());
      break;
    case DType::kI64:
      body.operator()<int64_t, float>(fl.nodes_f.data());
      break;
    case DType::kI32:
      body.operator()<int32_t, float>(fl.nodes_f.data());
      break;
    default:
      return run_reference(c);
  }
  if (f.classifier) return {label, y};
  return one(std::move(y));
}

bool accepts_tree_ensemble(const NodeInfo& n) {
  const DType x = n.dtype(0);
  if (n.node.op == "TreeEnsemble") return x == DType::kF32 || x == DType::kF64;
  return x == DType::kF32 || x == DType::kF64 || x == DType::kI64 || x == DType::kI32;
}

std::any prepare_tree_ensemble(const NodeInfo& n) {
  return flatten(n.node, n.dtype(0), n.node.where());
}

}  // namespace

void register_tree_ensemble_kernels(KernelRegistry& r) {
  for (const char* op : {"TreeEnsemble", "TreeEnsembleRegressor", "TreeEnsembleClassifier"})
    r.add(op, {.accepts = accepts_tree_ensemble,
               .prepare = prepare_tree_ensemble,
               .run = run_tree_ensemble});
}

}  // namespace pto::cpu
