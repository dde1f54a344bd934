// The tree ensembles of ai.onnx.ml on the CPU: TreeEnsemble, TreeEnsembleRegressor and
// TreeEnsembleClassifier with float, double, int32 and int64 X. prepare() flattens the forest
// (ir/ops/tree_ensemble.h) into one array of 16-byte nodes (threshold in the comparison type,
// feature, both children). run() takes chunks of rows in parallel and, within a chunk, each tree
// for all its rows, so that the tree stays in cache. Forests whose nodes are all BRANCH_LEQ
// without missing-value tracking (scikit-learn's) take a branch-free form: leaves become nodes
// that lead to themselves, and 16 rows step down a tree together for its depth, each step a load,
// a compare and a select (no mispredicted branches; the 16 walks overlap). Other forests walk
// 8 rows side by side with the general comparison. Scores are summed in the comparison type, as
// onnxruntime sums them; base values, the post transform and a classifier's label are the
// reference's (reference/ops/tree_finish.h).
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
  int32_t child[2];  // true, false; < 0: leaf ~c (in the fixed form, node indices)
};

struct Flat {
  Forest forest;
  bool plain = true;  // every node BRANCH_LEQ, none tracking missing values
  std::vector<FlatNode<float>> nodes_f;
  std::vector<FlatNode<double>> nodes_d;
  // A plain forest's branch-free form: leaf l appended as node I + l (I interior nodes) whose
  // children are itself, so that every row takes exactly depth[t] steps down tree t and a block
  // of rows steps together without testing for leaves. Used when no tree is deeper than
  // kMaxFixedDepth (a lopsided deep tree would make short paths pay for the longest).
  bool fixed = false;
  std::vector<FlatNode<float>> fixed_f;
  std::vector<FlatNode<double>> fixed_d;
  std::vector<int32_t> fixed_root, fixed_depth;
};

constexpr int32_t kMaxFixedDepth = 40;

// The interior levels on the longest path from `c` down (0 for a leaf), or more than `limit`
// when the path is longer than that. `memo` holds what is known per interior node (-1: not yet),
// so a node two parents share is counted once; the recursion is at most limit + 1 deep.
int32_t depth_of(const Forest& f, int32_t c, int32_t limit, std::vector<int32_t>& memo) {
  if (trees::is_leaf(c)) return 0;
  if (limit == 0) return 1;
  const auto i = static_cast<size_t>(c);
  if (memo[i] < 0)
    memo[i] = 1 + std::max(depth_of(f, f.true_child[i], limit - 1, memo),
                           depth_of(f, f.false_child[i], limit - 1, memo));
  return memo[i];
}

void make_fixed(Flat& fl) {
  const Forest& f = fl.forest;
  const auto interior = static_cast<int32_t>(f.feature.size());
  auto index = [&](int32_t c) { return trees::is_leaf(c) ? interior + trees::leaf_index(c) : c; };
  std::vector<int32_t> memo(f.feature.size(), -1);
  for (int32_t r : f.roots) {
    fl.fixed_root.push_back(index(r));
    fl.fixed_depth.push_back(depth_of(f, r, kMaxFixedDepth, memo));
    if (fl.fixed_depth.back() > kMaxFixedDepth) return;
  }
  for (size_t i = 0; i < f.feature.size(); ++i) {
    const int32_t t = index(f.true_child[i]), e = index(f.false_child[i]);
    fl.fixed_f.push_back({static_cast<float>(f.split[i]), f.feature[i], t, e});
    fl.fixed_d.push_back({f.split[i], f.feature[i], t, e});
  }
  const auto leaves = static_cast<int32_t>(f.leaf_begin.size()) - 1;
  for (int32_t l = 0; l < leaves; ++l) {
    fl.fixed_f.push_back({0.0f, 0, interior + l, interior + l});
    fl.fixed_d.push_back({0.0, 0, interior + l, interior + l});
  }
  fl.fixed = true;
}

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
  if (f->plain) make_fixed(*f);
  return f;
}

// Adds leaf `leaf`'s weights to one row's scores `a` (and marks `h`), by the aggregate.
template <class Th>
inline void add_leaf(const Forest& f, size_t leaf, Th* a, uint8_t* h) {
  const bool min = f.aggregate == Aggregate::kMin, max = f.aggregate == Aggregate::kMax;
  for (int64_t k = f.leaf_begin[leaf]; k < f.leaf_begin[leaf + 1]; ++k) {
    const auto t = static_cast<size_t>(f.targets[static_cast<size_t>(k)]);
    const Th v = static_cast<Th>(f.weights[static_cast<size_t>(k)]);
    if (!min && !max)
      a[t] += v;
    else if (!h[t] || (min ? v < a[t] : v > a[t]))
      a[t] = v;
    h[t] = 1;
  }
}

constexpr int64_t kBlock = 8;   // rows walking one tree side by side (any mode)
constexpr int64_t kLanes = 16;  // rows stepping one plain tree together, branch-free

// Rows [r0, r1) of X (features `cols`, converted to Th) through every tree: the leaf each row
// reaches in each tree is added to acc ([rows, targets], in Th) and has.
template <class T, class Th>
void walk_rows(const Flat& fl, const FlatNode<Th>* nodes, const T* x, int64_t cols, int64_t r0,
               int64_t r1, Th* acc, uint8_t* has) {
  const Forest& f = fl.forest;
  const int64_t T_ = f.n_targets;
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
          const bool go = reference::ml::goes_true<Th>(f, static_cast<size_t>(c), v, nd.threshold);
          at[j] = nd.child[go ? 0 : 1];
          moving = moving || at[j] >= 0;
        }
      }
      for (int64_t j = 0; j < n; ++j)
        add_leaf(f, static_cast<size_t>(trees::leaf_index(at[j])), acc + (b + j - r0) * T_,
                 has + (b + j - r0) * T_);
    }
  }
}

// walk_rows for a plain forest in its fixed form: kLanes rows take depth[t] steps down tree t
// together (a lane past r1 repeats the last row), each step a compare and a select.
template <class T, class Th>
void walk_fixed(const Flat& fl, const FlatNode<Th>* nodes, const T* x, int64_t cols, int64_t r0,
                int64_t r1, Th* acc, uint8_t* has) {
  const Forest& f = fl.forest;
  const int64_t T_ = f.n_targets;
  const auto interior = static_cast<int32_t>(f.feature.size());
  for (size_t t = 0; t < fl.fixed_root.size(); ++t) {
    const int32_t root = fl.fixed_root[t], depth = fl.fixed_depth[t];
    for (int64_t b = r0; b < r1; b += kLanes) {
      int32_t at[kLanes];
      const T* row[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) {
        at[j] = root;
        row[j] = x + std::min(b + j, r1 - 1) * cols;
      }
      // The child picked by indexing, not by a branch: a data dependency the 16 walks overlap.
      for (int32_t s = 0; s < depth; ++s)
        for (int64_t j = 0; j < kLanes; ++j) {
          const FlatNode<Th>& nd = nodes[at[j]];
          at[j] = nd.child[!(static_cast<Th>(row[j][nd.feature]) <= nd.threshold)];
        }
      const int64_t n = std::min(kLanes, r1 - b);
      for (int64_t j = 0; j < n; ++j)
        add_leaf(f, static_cast<size_t>(at[j] - interior), acc + (b + j - r0) * T_,
                 has + (b + j - r0) * T_);
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
  auto body = [&]<class T, class Th>(const FlatNode<Th>* nodes, const FlatNode<Th>* fixed) {
    const T* x = X.data<T>();
    parallel_for(0, rows, kRowsPerChunk, [&](int64_t r0, int64_t r1) {
      std::vector<Th> acc(static_cast<size_t>((r1 - r0) * T_), Th(0));
      std::vector<uint8_t> has(acc.size(), 0);
      if (fl.fixed)
        walk_fixed<T, Th>(fl, fixed, x, cols, r0, r1, acc.data(), has.data());
      else
        walk_rows<T, Th>(fl, nodes, x, cols, r0, r1, acc.data(), has.data());
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
      body.operator()<float, float>(fl.nodes_f.data(), fl.fixed_f.data());
      break;
    case DType::kF64:
      body.operator()<double, double>(fl.nodes_d.data(), fl.fixed_d.data());
      break;
    case DType::kI64:
      body.operator()<int64_t, float>(fl.nodes_f.data(), fl.fixed_f.data());
      break;
    case DType::kI32:
      body.operator()<int32_t, float>(fl.nodes_f.data(), fl.fixed_f.data());
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
