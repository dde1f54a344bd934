// The tree ensembles of domain ai.onnx.ml (TreeEnsemble, opset 5; TreeEnsembleRegressor and
// TreeEnsembleClassifier, opsets 1 and 3) read into one form: interior nodes in arrays, children
// as indices, leaves as lists of (target, weight). Each of the three spells a forest its own way
// (ids per tree and node, *_as_tensor attributes, leaf flags); decode() checks every index and
// says which attribute is wrong. The reference kernel walks this form node by node, the CPU kernel
// flattens it further (backend/cpu/tree_ensemble.cpp).
#pragma once

#include <string>
#include <vector>

#include "pto/graph.h"

namespace pto::trees {

enum class Mode : uint8_t { kLeq, kLt, kGte, kGt, kEq, kNeq, kMember };
enum class Aggregate : uint8_t { kAverage, kSum, kMin, kMax };  // TreeEnsemble's codes
enum class PostTransform : uint8_t { kNone, kSoftmax, kLogistic, kSoftmaxZero, kProbit };

// A child or a root: an interior node (>= 0) or leaf ~c (< 0).
inline bool is_leaf(int32_t c) {
  return c < 0;
}
inline int32_t leaf_index(int32_t c) {
  return ~c;
}

struct Forest {
  // Interior nodes.
  std::vector<int32_t> feature;
  std::vector<Mode> mode;
  std::vector<uint8_t> missing_true;  // a NaN feature takes the true branch
  std::vector<double> split;          // the threshold, rounded to the comparison type
  std::vector<int32_t> true_child, false_child;
  // kMember nodes: the set of node i is members[set_begin[i], set_begin[i + 1]).
  std::vector<int64_t> set_begin;
  std::vector<double> members;
  std::vector<int32_t> roots;  // one per tree
  // Leaves: leaf l adds weights[leaf_begin[l], leaf_begin[l + 1]) to targets[...].
  std::vector<int64_t> leaf_begin;
  std::vector<int64_t> targets;
  std::vector<double> weights;

  int64_t n_targets = 1;  // the classes of a classifier
  Aggregate aggregate = Aggregate::kSum;
  PostTransform post = PostTransform::kNone;
  std::vector<double> base_values;  // empty, or one per target (or one, for one target)
  // Whether the comparisons and sums are in double (a double input), else float.
  bool in_double = false;

  // TreeEnsembleClassifier: the int64 labels, and onnxruntime's two-class rule (finish_classifier).
  bool classifier = false;
  std::vector<int64_t> labels;
  bool binary_case = false;           // two labels, and every leaf weight for one class
  bool weights_all_positive = false;  // no leaf weight below 0

  int64_t num_trees() const { return static_cast<int64_t>(roots.size()); }
  int64_t num_features() const;  // 1 + the largest feature index read
};

// Reads a TreeEnsemble, TreeEnsembleRegressor or TreeEnsembleClassifier node for an input of
// dtype `x` (which fixes the comparison type). Throws ValueError for inconsistent attributes and
// UnsupportedError for what PyPTO does not read (string class labels), naming `where`.
Forest decode(const Node& n, DType x, const std::string& where);

// A post_transform attribute's value ("NONE", "SOFTMAX", ...); ValueError naming `where` for
// another.
PostTransform post_from_string(const std::string& s, const std::string& where);

}  // namespace pto::trees
