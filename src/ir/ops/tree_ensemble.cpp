#include "ir/ops/tree_ensemble.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <utility>

#include "pto/error.h"

namespace pto::trees {
namespace {

// The values of a float list attribute or of its *_as_tensor form (opset 3+), in double; empty
// when neither is given. Both at once is an error.
std::vector<double> floats_or_tensor(const Node& n, const std::string& name,
                                     const std::string& where) {
  const std::string tensor = name + "_as_tensor";
  const bool has_list = n.attrs.has(name), has_tensor = n.attrs.has(tensor);
  if (has_list && has_tensor)
    throw ValueError(cat(where, ": give ", name, " or ", tensor, ", not both"));
  if (has_tensor) {
    if (n.opset != 0 && n.opset < 3)
      throw ValueError(cat(where, ": ", tensor,
                           " is an attribute of ai.onnx.ml opset 3 and "
                           "later; the model imports opset ",
                           n.opset));
    const Tensor& t = n.attrs.get_tensor(tensor);
    if (!is_floating(t.dtype()))
      throw ValueError(cat(where, ": ", tensor, " must be a float tensor, got ", t.str()));
    std::vector<double> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[i] = t.item_as_double(i);
    return v;
  }
  return has_list ? n.attrs.get_floats(name) : std::vector<double>{};
}

std::vector<int64_t> ints(const Node& n, const std::string& name) {
  return n.attrs.has(name) ? n.attrs.get_ints(name) : std::vector<int64_t>{};
}

// A threshold or set member as the comparison sees it: rounded to float unless the input is
// double (onnxruntime's ThresholdType).
double to_threshold(double v, bool in_double) {
  return in_double ? v : static_cast<double>(static_cast<float>(v));
}

}  // namespace

PostTransform post_from_string(const std::string& s, const std::string& where) {
  static const std::map<std::string, PostTransform> kNames = {
      {"NONE", PostTransform::kNone},
      {"SOFTMAX", PostTransform::kSoftmax},
      {"LOGISTIC", PostTransform::kLogistic},
      {"SOFTMAX_ZERO", PostTransform::kSoftmaxZero},
      {"PROBIT", PostTransform::kProbit}};
  auto it = kNames.find(s);
  if (it == kNames.end())
    throw ValueError(cat(where, ": post_transform '", s,
                         "' is not one of NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT"));
  return it->second;
}

namespace {

Mode mode_from_string(const std::string& s, const std::string& where) {
  static const std::map<std::string, Mode> kNames = {
      {"BRANCH_LEQ", Mode::kLeq}, {"BRANCH_LT", Mode::kLt}, {"BRANCH_GTE", Mode::kGte},
      {"BRANCH_GT", Mode::kGt},   {"BRANCH_EQ", Mode::kEq}, {"BRANCH_NEQ", Mode::kNeq}};
  auto it = kNames.find(s);
  if (it == kNames.end())
    throw ValueError(cat(where, ": nodes_modes entry '", s,
                         "' is not one of BRANCH_LEQ, BRANCH_LT, BRANCH_GTE, BRANCH_GT, "
                         "BRANCH_EQ, BRANCH_NEQ, LEAF"));
  return it->second;
}

void check_size(size_t got, size_t want, const std::string& name, const std::string& what,
                const std::string& where) {
  if (got != want)
    throw ValueError(cat(where, ": ", name, " has ", got, " entries; ", what, " has ", want));
}

// TreeEnsemble (ai.onnx.ml opset 5): interior nodes by index, leaves by index, flags saying which
// a child is.
void decode_tree_ensemble(const Node& n, Forest& f, const std::string& where) {
  if (n.opset != 0 && n.opset < 5)
    throw ValueError(cat(where,
                         ": TreeEnsemble is an op of ai.onnx.ml opset 5; the model "
                         "imports opset ",
                         n.opset));
  const std::vector<int64_t> feature = n.attrs.get_ints("nodes_featureids");
  const size_t count = feature.size();
  const Tensor& modes = n.attrs.get_tensor("nodes_modes");
  const Tensor& splits = n.attrs.get_tensor("nodes_splits");
  const std::vector<int64_t> true_ids = n.attrs.get_ints("nodes_truenodeids");
  const std::vector<int64_t> false_ids = n.attrs.get_ints("nodes_falsenodeids");
  const std::vector<int64_t> true_leaf = n.attrs.get_ints("nodes_trueleafs");
  const std::vector<int64_t> false_leaf = n.attrs.get_ints("nodes_falseleafs");
  const std::vector<int64_t> missing = ints(n, "nodes_missing_value_tracks_true");
  const std::string what = "nodes_featureids";
  check_size(static_cast<size_t>(modes.numel()), count, "nodes_modes", what, where);
  check_size(static_cast<size_t>(splits.numel()), count, "nodes_splits", what, where);
  check_size(true_ids.size(), count, "nodes_truenodeids", what, where);
  check_size(false_ids.size(), count, "nodes_falsenodeids", what, where);
  check_size(true_leaf.size(), count, "nodes_trueleafs", what, where);
  check_size(false_leaf.size(), count, "nodes_falseleafs", what, where);
  if (!missing.empty())
    check_size(missing.size(), count, "nodes_missing_value_tracks_true", what, where);
  const Tensor& leaf_weights = n.attrs.get_tensor("leaf_weights");
  const std::vector<int64_t> leaf_targets = n.attrs.get_ints("leaf_targetids");
  check_size(static_cast<size_t>(leaf_weights.numel()), leaf_targets.size(), "leaf_weights",
             "leaf_targetids", where);
  const int64_t leaves = static_cast<int64_t>(leaf_targets.size());
  if (!n.attrs.has("n_targets"))
    throw ValueError(cat(where, ": n_targets is required (the output's columns)"));
  f.n_targets = n.attrs.get_int("n_targets");
  const int64_t agg = n.attrs.get_int("aggregate_function", 1);
  const int64_t post = n.attrs.get_int("post_transform", 0);
  if (agg < 0 || agg > 3)
    throw ValueError(cat(where, ": aggregate_function ", agg,
                         " is not 0 (AVERAGE), 1 (SUM), 2 (MIN) or 3 (MAX)"));
  if (post < 0 || post > 4)
    throw ValueError(cat(where, ": post_transform ", post,
                         " is not 0 (NONE), 1 (SOFTMAX), 2 (LOGISTIC), 3 (SOFTMAX_ZERO) or 4 "
                         "(PROBIT)"));
  f.aggregate = static_cast<Aggregate>(agg);
  f.post = static_cast<PostTransform>(post);
  const Tensor* members =
      n.attrs.has("membership_values") ? &n.attrs.get_tensor("membership_values") : nullptr;
  int64_t next_member = 0;
  auto child = [&](int64_t id, int64_t is_leaf, const char* name, size_t i) -> int32_t {
    const int64_t limit = is_leaf ? leaves : static_cast<int64_t>(count);
    if (id < 0 || id >= limit)
      throw ValueError(cat(where, ": ", name, "[", i, "] = ", id, " is not a ",
                           is_leaf ? "leaf" : "node", " index below ", limit));
    return is_leaf ? ~static_cast<int32_t>(id) : static_cast<int32_t>(id);
  };
  f.set_begin.push_back(0);
  for (size_t i = 0; i < count; ++i) {
    const int64_t m = static_cast<int64_t>(modes.item_as_double(static_cast<int64_t>(i)));
    if (m < 0 || m > 6)
      throw ValueError(
          cat(where, ": nodes_modes[", i, "] = ", m, " is not a mode 0 (LEQ) to 6 (MEMBER)"));
    f.feature.push_back(static_cast<int32_t>(feature[i]));
    f.mode.push_back(static_cast<Mode>(m));
    f.missing_true.push_back(!missing.empty() && missing[i] != 0);
    f.split.push_back(to_threshold(splits.item_as_double(static_cast<int64_t>(i)), f.in_double));
    f.true_child.push_back(child(true_ids[i], true_leaf[i], "nodes_truenodeids", i));
    f.false_child.push_back(child(false_ids[i], false_leaf[i], "nodes_falsenodeids", i));
    if (f.mode.back() == Mode::kMember) {
      // This node's members run to the next NaN of membership_values (spec: in the order of the
      // member nodes).
      if (!members || next_member >= members->numel())
        throw ValueError(cat(where, ": nodes_modes[", i,
                             "] is a set membership node without its members in "
                             "membership_values"));
      for (; next_member < members->numel(); ++next_member) {
        const double v = members->item_as_double(next_member);
        if (std::isnan(v)) break;
        f.members.push_back(to_threshold(v, f.in_double));
      }
      ++next_member;  // the NaN
    }
    f.set_begin.push_back(static_cast<int64_t>(f.members.size()));
  }
  for (int64_t r : n.attrs.get_ints("tree_roots")) {
    if (r < 0 || r >= static_cast<int64_t>(count))
      throw ValueError(cat(where, ": tree_roots entry ", r, " is not a node index below ", count));
    // A tree that is one leaf: both children the same leaf (the spec's degenerate case).
    const size_t i = static_cast<size_t>(r);
    const bool leaf_tree = true_leaf[i] && false_leaf[i] && true_ids[i] == false_ids[i];
    f.roots.push_back(leaf_tree ? f.true_child[i] : static_cast<int32_t>(r));
  }
  for (int64_t l = 0; l < leaves; ++l) {
    f.leaf_begin.push_back(l);
    f.targets.push_back(leaf_targets[static_cast<size_t>(l)]);
    f.weights.push_back(leaf_weights.item_as_double(l));
  }
  f.leaf_begin.push_back(leaves);
}

// TreeEnsembleRegressor and TreeEnsembleClassifier (opsets 1 and 3): nodes named by (tree id,
// node id), LEAF nodes among them, leaf weights listed as (tree id, node id, target, weight).
void decode_by_ids(const Node& n, Forest& f, const std::string& where) {
  const bool cls = f.classifier;
  const std::string leaf = cls ? "class_" : "target_";
  const std::vector<int64_t> tree_ids = ints(n, "nodes_treeids");
  const std::vector<int64_t> node_ids = ints(n, "nodes_nodeids");
  const size_t count = tree_ids.size();
  const std::vector<int64_t> feature = ints(n, "nodes_featureids");
  const std::vector<std::string> modes =
      n.attrs.has("nodes_modes") ? n.attrs.get_strings("nodes_modes") : std::vector<std::string>{};
  const std::vector<double> values = floats_or_tensor(n, "nodes_values", where);
  const std::vector<int64_t> true_ids = ints(n, "nodes_truenodeids");
  const std::vector<int64_t> false_ids = ints(n, "nodes_falsenodeids");
  const std::vector<int64_t> missing = ints(n, "nodes_missing_value_tracks_true");
  const std::string what = "nodes_treeids";
  check_size(node_ids.size(), count, "nodes_nodeids", what, where);
  check_size(feature.size(), count, "nodes_featureids", what, where);
  check_size(modes.size(), count, "nodes_modes", what, where);
  check_size(values.size(), count, "nodes_values", what, where);
  check_size(true_ids.size(), count, "nodes_truenodeids", what, where);
  check_size(false_ids.size(), count, "nodes_falsenodeids", what, where);
  if (!missing.empty())
    check_size(missing.size(), count, "nodes_missing_value_tracks_true", what, where);
  const std::vector<int64_t> w_tree = ints(n, leaf + "treeids");
  const std::vector<int64_t> w_node = ints(n, leaf + "nodeids");
  const std::vector<int64_t> w_target = ints(n, leaf + "ids");
  const std::vector<double> w_value = floats_or_tensor(n, leaf + "weights", where);
  check_size(w_node.size(), w_tree.size(), leaf + "nodeids", leaf + "treeids", where);
  check_size(w_target.size(), w_tree.size(), leaf + "ids", leaf + "treeids", where);
  check_size(w_value.size(), w_tree.size(), leaf + "weights", leaf + "treeids", where);

  // Interior nodes and leaves get indices in the order listed; a tree's root is its first node.
  std::map<std::pair<int64_t, int64_t>, int32_t> index;  // (tree, node) -> child encoding
  std::map<int64_t, int32_t> roots;                      // tree id -> root, in tree id order
  int32_t interior = 0, leaves = 0;
  for (size_t i = 0; i < count; ++i) {
    const bool is_leaf = modes[i] == "LEAF";
    const int32_t c = is_leaf ? ~leaves++ : interior++;
    if (!index.emplace(std::make_pair(tree_ids[i], node_ids[i]), c).second)
      throw ValueError(cat(where, ": tree ", tree_ids[i], " lists node ", node_ids[i], " twice"));
    roots.emplace(tree_ids[i], c);
  }
  auto find = [&](int64_t tree, int64_t node, const std::string& name) {
    auto it = index.find({tree, node});
    if (it == index.end())
      throw ValueError(cat(where, ": ", name, " names node ", node, " of tree ", tree,
                           ", which nodes_nodeids does not list"));
    return it->second;
  };
  f.set_begin.assign(static_cast<size_t>(interior) + 1, 0);
  for (size_t i = 0; i < count; ++i) {
    if (modes[i] == "LEAF") continue;
    f.feature.push_back(static_cast<int32_t>(feature[i]));
    f.mode.push_back(mode_from_string(modes[i], where));
    f.missing_true.push_back(!missing.empty() && missing[i] != 0);
    f.split.push_back(to_threshold(values[i], f.in_double));
    f.true_child.push_back(find(tree_ids[i], true_ids[i], "nodes_truenodeids"));
    f.false_child.push_back(find(tree_ids[i], false_ids[i], "nodes_falsenodeids"));
  }
  for (const auto& [tree, root] : roots) f.roots.push_back(root);
  // Leaf weights, grouped by leaf in the order listed.
  std::vector<std::vector<std::pair<int64_t, double>>> by_leaf(static_cast<size_t>(leaves));
  for (size_t i = 0; i < w_tree.size(); ++i) {
    const int32_t c = find(w_tree[i], w_node[i], leaf + "nodeids");
    if (!is_leaf(c))
      throw ValueError(cat(where, ": ", leaf, "nodeids[", i, "] names node ", w_node[i],
                           " of tree ", w_tree[i], ", which is not a LEAF"));
    by_leaf[static_cast<size_t>(leaf_index(c))].emplace_back(w_target[i], w_value[i]);
  }
  for (const auto& l : by_leaf) {
    f.leaf_begin.push_back(static_cast<int64_t>(f.targets.size()));
    for (const auto& [t, w] : l) {
      f.targets.push_back(t);
      f.weights.push_back(w);
    }
  }
  f.leaf_begin.push_back(static_cast<int64_t>(f.targets.size()));
  f.post = post_from_string(n.attrs.get_string("post_transform", "NONE"), where);
  f.base_values = floats_or_tensor(n, "base_values", where);
}

}  // namespace

int64_t Forest::num_features() const {
  int64_t m = 0;
  for (int32_t v : feature) m = std::max<int64_t>(m, int64_t{v} + 1);
  return m;
}

Forest decode(const Node& n, DType x, const std::string& where) {
  Forest f;
  f.in_double = x == DType::kF64;
  if (n.op == "TreeEnsemble") {
    decode_tree_ensemble(n, f, where);
  } else if (n.op == "TreeEnsembleRegressor") {
    decode_by_ids(n, f, where);
    const std::string agg = n.attrs.get_string("aggregate_function", "SUM");
    static const std::map<std::string, Aggregate> kNames = {{"AVERAGE", Aggregate::kAverage},
                                                            {"SUM", Aggregate::kSum},
                                                            {"MIN", Aggregate::kMin},
                                                            {"MAX", Aggregate::kMax}};
    auto it = kNames.find(agg);
    if (it == kNames.end())
      throw ValueError(
          cat(where, ": aggregate_function '", agg, "' is not one of AVERAGE, SUM, MIN, MAX"));
    f.aggregate = it->second;
    f.n_targets = n.attrs.get_int("n_targets", 1);
  } else {
    PTO_CHECK(n.op == "TreeEnsembleClassifier") << n.op << " is not a tree ensemble";
    f.classifier = true;
    if (n.attrs.has("classlabels_strings"))
      throw UnsupportedError(cat(where,
                                 ": string class labels (classlabels_strings): PyPTO has "
                                 "no string tensors; export the model with integer "
                                 "labels (encode the classes as 0..n-1 before fitting)"));
    if (!n.attrs.has("classlabels_int64s"))
      throw ValueError(cat(where, ": classlabels_int64s is required"));
    decode_by_ids(n, f, where);
    f.labels = n.attrs.get_ints("classlabels_int64s");
    f.n_targets = static_cast<int64_t>(f.labels.size());
    if (f.n_targets < 2)
      throw ValueError(
          cat(where, ": a classifier needs at least 2 class labels, got ", f.n_targets));
    std::set<int64_t> classes(f.targets.begin(), f.targets.end());
    f.binary_case = f.n_targets == 2 && classes.size() == 1;
    f.weights_all_positive =
        std::none_of(f.weights.begin(), f.weights.end(), [](double w) { return w < 0; });
  }
  if (f.n_targets <= 0)
    throw ValueError(cat(where, ": n_targets must be positive, got ", f.n_targets));
  for (size_t i = 0; i < f.targets.size(); ++i)
    if (f.targets[i] < 0 || f.targets[i] >= f.n_targets)
      throw ValueError(cat(where, ": leaf weight ", i, " is for target ", f.targets[i],
                           ", not one of the ", f.n_targets, " targets"));
  for (size_t i = 0; i < f.feature.size(); ++i)
    if (f.feature[i] < 0)
      throw ValueError(cat(where, ": node ", i, " reads feature ", f.feature[i]));
  if (f.roots.empty()) throw ValueError(cat(where, ": the ensemble has no trees"));
  // Every path must end at a leaf: a child index at or before its parent's could loop forever.
  // Children are checked to lie below the node count; a walk longer than the node count is a
  // cycle (checked once here, so that kernels walk without counting).
  std::vector<uint8_t> state(f.feature.size(), 0);  // 0 unseen, 1 on the stack, 2 done
  std::vector<std::pair<int32_t, int>> stack;
  for (int32_t r : f.roots) {
    if (is_leaf(r) || state[static_cast<size_t>(r)] == 2) continue;
    stack.push_back({r, 0});
    state[static_cast<size_t>(r)] = 1;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == 2) {
        state[static_cast<size_t>(node)] = 2;
        stack.pop_back();
        continue;
      }
      const int32_t c = next++ == 0 ? f.true_child[static_cast<size_t>(node)]
                                    : f.false_child[static_cast<size_t>(node)];
      if (is_leaf(c) || state[static_cast<size_t>(c)] == 2) continue;
      if (state[static_cast<size_t>(c)] == 1)
        throw ValueError(cat(where, ": the trees have a cycle through node ", c));
      state[static_cast<size_t>(c)] = 1;
      stack.push_back({c, 0});
    }
  }
  const size_t nb = f.base_values.size();
  if (nb != 0 && nb != static_cast<size_t>(f.n_targets) && !(f.classifier && nb == 1))
    throw ValueError(cat(where, ": base_values has ", nb, " entries; the ensemble has ",
                         f.n_targets, f.classifier ? " classes" : " targets",
                         " (give none, or one for each; a classifier may give one)"));
  return f;
}

}  // namespace pto::trees
