// The classical-ML ops of domain ai.onnx.ml (scikit-learn, LightGBM and XGBoost models as
// skl2onnx and onnxmltools export them): tree ensembles, linear models, and the preprocessing
// steps of their pipelines. Inputs are [N, F] (a 1-D input is one row, as onnxruntime reads it);
// string tensors, and ZipMap's sequence of maps, are not read (docs/onnx.md "Classical ML").
#include <optional>

#include "ir/ops/infer_util.h"
#include "pto/error.h"
#include "pto/op_registry.h"

namespace pto {
namespace {

// N, the rows of input 0: its first dimension, 1 for a 1-D input; nullopt when unknown.
std::optional<Dim> rows(const InferContext& c) {
  const auto& s = c.inputs[0].shape;
  if (!s || s->empty()) return std::nullopt;
  return s->size() == 1 ? Dim(1) : (*s)[0];
}

// Sets output `out` to [N, cols] (cols < 0: unknown) or [N].
void set_rows(InferContext& c, size_t out, DType dtype, int64_t cols, bool matrix = true) {
  const std::optional<Dim> n = rows(c);
  if (!n) return infer::set(c, out, dtype, std::nullopt);
  Shape s{*n};
  if (matrix) s.push_back(cols >= 0 ? Dim(cols) : Dim::unknown());
  infer::set(c, out, dtype, s);
}

int64_t list_size(const Node& n, const std::string& name) {
  if (!n.attrs.has(name)) return 0;
  const Attribute& a = n.attrs.all().at(name);
  if (auto* v = std::get_if<std::vector<int64_t>>(&a)) return static_cast<int64_t>(v->size());
  if (auto* v = std::get_if<std::vector<double>>(&a)) return static_cast<int64_t>(v->size());
  if (auto* v = std::get_if<std::vector<std::string>>(&a)) return static_cast<int64_t>(v->size());
  if (auto* v = std::get_if<Tensor>(&a)) return v->numel();
  return 0;
}

// Attributes the old tree ensembles share (TreeEnsembleRegressor and TreeEnsembleClassifier,
// opsets 1 and 3; the *_as_tensor forms are opset 3's double-precision spellings).
std::vector<AttrDef> tree_node_attrs() {
  using K = AttrKind;
  return {
      optional_attr("nodes_treeids", K::kInts, "the tree of each node"),
      optional_attr("nodes_nodeids", K::kInts, "the node's id within its tree"),
      optional_attr("nodes_featureids", K::kInts, "the feature a node compares"),
      optional_attr("nodes_modes", K::kStrings, "BRANCH_LEQ, BRANCH_LT, ..., LEAF"),
      optional_attr("nodes_values", K::kFloats, "thresholds"),
      optional_attr("nodes_values_as_tensor", K::kTensor, "thresholds (opset 3)"),
      optional_attr("nodes_truenodeids", K::kInts, "the true branch's node id"),
      optional_attr("nodes_falsenodeids", K::kInts, "the false branch's node id"),
      optional_attr("nodes_missing_value_tracks_true", K::kInts,
                    "1: a NaN feature takes the true branch"),
      optional_attr("nodes_hitrates", K::kFloats, "not used for inference"),
      optional_attr("nodes_hitrates_as_tensor", K::kTensor, "not used for inference"),
      optional_attr("base_values", K::kFloats, "added to each target's score"),
      optional_attr("base_values_as_tensor", K::kTensor, "base_values (opset 3)"),
      {"post_transform", std::string("NONE"), "NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO or PROBIT"}};
}

std::vector<AttrDef> with(std::vector<AttrDef> a, std::initializer_list<AttrDef> more) {
  a.insert(a.end(), more);
  return a;
}

// The old tree ensembles' attributes: the nodes', the leaf weights' (`prefix` "target_" for the
// regressor, "class_" for the classifier: each weight's tree, leaf, target or class, and value),
// then `more`.
std::vector<AttrDef> tree_attrs(const std::string& prefix, std::initializer_list<AttrDef> more) {
  using K = AttrKind;
  std::vector<AttrDef> a =
      with(tree_node_attrs(),
           {optional_attr(prefix + "treeids", K::kInts, "the tree of each leaf weight"),
            optional_attr(prefix + "nodeids", K::kInts, "the leaf of each weight"),
            optional_attr(prefix + "ids", K::kInts, "the target or class of each weight"),
            optional_attr(prefix + "weights", K::kFloats, "the weights"),
            optional_attr(prefix + "weights_as_tensor", K::kTensor, "the weights (opset 3)")});
  a.insert(a.end(), more);
  return a;
}

// String attributes would make string tensors, which PyPTO does not have: refused at import.
void reject_strings(const InferContext& c, std::initializer_list<const char*> names,
                    const char* advice) {
  for (const char* name : names)
    if (c.node.attrs.has(name))
      throw UnsupportedError(cat(c.where(), ": ", name, ": PyPTO has no string tensors; ", advice));
}

// Y: float [N, C] scores with C the classes, Y int64 [N] labels, for the classifiers.
void infer_classifier(InferContext& c, int64_t classes) {
  if (!c.has_input(0)) return;
  set_rows(c, 0, DType::kI64, 0, false);
  set_rows(c, 1, DType::kF32, classes);
}

void add(OpRegistry& r, const std::string& name, int inputs, int outputs, AttrSchema attrs,
         InferFn infer, std::string doc) {
  r.add({.name = name,
         .min_inputs = inputs,
         .max_inputs = inputs,
         .min_outputs = outputs,
         .max_outputs = outputs,
         .properties = kOpaque,
         .attrs = std::move(attrs),
         .infer = std::move(infer),
         .doc = "ai.onnx.ml: " + std::move(doc)});
}

void register_tree_ops(OpRegistry& r) {
  using K = AttrKind;
  add(
      r, "TreeEnsemble", 1, 1,
      {required_attr("nodes_featureids", K::kInts, "the feature each interior node compares"),
       required_attr("nodes_modes", K::kTensor, "uint8 modes 0 LEQ to 5 NEQ, 6 MEMBER"),
       required_attr("nodes_splits", K::kTensor, "thresholds, X's type"),
       required_attr("nodes_truenodeids", K::kInts, "true child: a node or leaf index"),
       required_attr("nodes_falsenodeids", K::kInts, "false child: a node or leaf index"),
       required_attr("nodes_trueleafs", K::kInts, "1: the true child is a leaf"),
       required_attr("nodes_falseleafs", K::kInts, "1: the false child is a leaf"),
       optional_attr("nodes_missing_value_tracks_true", K::kInts, "1: NaN goes true"),
       optional_attr("nodes_hitrates", K::kTensor, "not used for inference"),
       optional_attr("membership_values", K::kTensor, "MEMBER nodes' sets, NaN-separated"),
       required_attr("leaf_targetids", K::kInts, "the target each leaf adds to"),
       required_attr("leaf_weights", K::kTensor, "each leaf's weight, X's type"),
       required_attr("tree_roots", K::kInts, "the root node of each tree"),
       optional_attr("n_targets", K::kInt, "the output's columns"),
       {"aggregate_function", int64_t{1}, "0 AVERAGE, 1 SUM, 2 MIN, 3 MAX"},
       {"post_transform", int64_t{0}, "0 NONE, 1 SOFTMAX, 2 LOGISTIC, 3 SOFTMAX_ZERO, 4 PROBIT"}},
      [](InferContext& c) {
        if (c.has_input(0))
          set_rows(c, 0, c.inputs[0].dtype, c.node.attrs.get_int("n_targets", -1));
      },
      "opset 5: a forest of decision trees, Y [N, n_targets] in X's type");
  add(
      r, "TreeEnsembleRegressor", 1, 1,
      tree_attrs("target_",
                 {{"n_targets", int64_t{1}, "the output's columns"},
                  {"aggregate_function", std::string("SUM"), "AVERAGE, SUM, MIN or MAX"}}),
      [](InferContext& c) {
        if (c.has_input(0)) set_rows(c, 0, DType::kF32, c.node.attrs.get_int("n_targets", 1));
      },
      "opsets 1, 3: a forest of regression trees, Y float [N, n_targets]");
  add(
      r, "TreeEnsembleClassifier", 1, 2,
      tree_attrs("class_", {optional_attr("classlabels_int64s", K::kInts, "the class labels"),
                            optional_attr("classlabels_strings", K::kStrings,
                                          "not read: no string tensors")}),
      [](InferContext& c) {
        reject_strings(c, {"classlabels_strings"},
                       "string class labels: fit the model on integer labels (encode the classes "
                       "as 0..n-1)");
        infer_classifier(c, list_size(c.node, "classlabels_int64s"));
      },
      "opsets 1, 3: a forest of classification trees, labels int64 [N] and scores float "
      "[N, classes]");
}

void register_linear_ops(OpRegistry& r) {
  using K = AttrKind;
  add(
      r, "LinearRegressor", 1, 1,
      {optional_attr("coefficients", K::kFloats, "[targets, F], row-major"),
       optional_attr("intercepts", K::kFloats, "one per target"),
       {"targets", int64_t{1}, "the output's columns"},
       {"post_transform", std::string("NONE"), "NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT"}},
      [](InferContext& c) {
        if (c.has_input(0)) set_rows(c, 0, DType::kF32, c.node.attr_int("targets"));
      },
      "X times coefficients transposed plus intercepts, Y float [N, targets]");
  add(
      r, "LinearClassifier", 1, 2,
      {required_attr("coefficients", K::kFloats, "[classes, F], row-major"),
       optional_attr("intercepts", K::kFloats, "one per class"),
       optional_attr("classlabels_ints", K::kInts, "the class labels"),
       optional_attr("classlabels_strings", K::kStrings, "not read: no string tensors"),
       {"multi_class", int64_t{0}, "ignored, as onnxruntime ignores it"},
       {"post_transform", std::string("NONE"), "NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT"}},
      [](InferContext& c) {
        reject_strings(c, {"classlabels_strings"},
                       "string class labels: fit the model on integer labels");
        const int64_t labels = list_size(c.node, "classlabels_ints");
        int64_t classes = list_size(c.node, "intercepts");
        if (classes == 0) classes = -1;
        infer_classifier(c, classes == 1 && labels == 2 ? 2 : classes);
      },
      "linear scores per class, labels int64 [N] and scores float [N, classes]");
  add(
      r, "SVMRegressor", 1, 1,
      {optional_attr("coefficients", K::kFloats, "per support vector, or per feature (linear)"),
       optional_attr("support_vectors", K::kFloats, "[n_supports, F], row-major"),
       {"n_supports", int64_t{0}, "0: the linear form coefficients . x + rho"},
       optional_attr("rho", K::kFloats, "the intercept"),
       optional_attr("kernel_params", K::kFloats, "gamma, coef0, degree"),
       {"kernel_type", std::string("LINEAR"), "LINEAR, POLY, RBF or SIGMOID"},
       {"one_class", int64_t{0}, "1: the score's sign, 1 or -1"},
       {"post_transform", std::string("NONE"), "NONE (no other is read)"},
       optional_attr("n_targets", K::kInt, "1")},
      [](InferContext& c) {
        if (c.has_input(0)) set_rows(c, 0, DType::kF32, 1);
      },
      "a support-vector regressor, Y float [N, 1]");
  add(
      r, "SVMClassifier", 1, 2,
      {required_attr("coefficients", K::kFloats,
                     "[classes - 1, vectors], or [classes, F] (linear)"),
       optional_attr("support_vectors", K::kFloats, "[vectors, F], row-major"),
       optional_attr("vectors_per_class", K::kInts, "support vectors of each class"),
       optional_attr("rho", K::kFloats, "one per pair of classes"),
       optional_attr("prob_a", K::kFloats, "Platt scaling per pair: probabilities as scores"),
       optional_attr("prob_b", K::kFloats, "Platt scaling per pair"),
       optional_attr("kernel_params", K::kFloats, "gamma, coef0, degree"),
       {"kernel_type", std::string("LINEAR"), "LINEAR, POLY, RBF or SIGMOID"},
       optional_attr("classlabels_ints", K::kInts, "the class labels"),
       optional_attr("classlabels_strings", K::kStrings, "not read: no string tensors"),
       {"post_transform", std::string("NONE"), "NONE, SOFTMAX, LOGISTIC, SOFTMAX_ZERO, PROBIT"}},
      [](InferContext& c) {
        reject_strings(c, {"classlabels_strings"},
                       "string class labels: fit the model on integer labels");
        const Attributes& a = c.node.attrs;
        const int64_t classes = list_size(c.node, "classlabels_ints");
        const bool svc = list_size(c.node, "vectors_per_class") > 0;
        const bool proba = a.has("prob_a") && list_size(c.node, "prob_a") > 0;
        infer_classifier(c, !svc || proba ? classes
                            : classes > 2 ? classes * (classes - 1) / 2
                                          : 2);
      },
      "a support-vector classifier, labels int64 [N] and scores float [N, classes] (or the "
      "pairwise decisions)");
}

void register_transform_ops(OpRegistry& r) {
  using K = AttrKind;
  auto float_like_x = [](InferContext& c) {
    if (c.has_input(0)) infer::set(c, 0, DType::kF32, c.inputs[0].shape);
  };
  add(r, "Scaler", 1, 1,
      {optional_attr("offset", K::kFloats, "subtracted first: one, or one per feature"),
       optional_attr("scale", K::kFloats, "then multiplied: one, or one per feature")},
      float_like_x, "(X - offset) * scale per feature, float");
  add(r, "Normalizer", 1, 1, {{"norm", std::string("MAX"), "MAX, L1 or L2"}}, float_like_x,
      "each row divided by its max, L1 or L2 norm, float");
  add(
      r, "Binarizer", 1, 1, {{"threshold", 0.0, "values above it become 1, others 0"}},
      [](InferContext& c) { infer::same_as_input(c); }, "X > threshold as 1 or 0 in X's type");
  add(
      r, "Imputer", 1, 1,
      {optional_attr("imputed_value_floats", K::kFloats, "one, or one per feature"),
       optional_attr("imputed_value_int64s", K::kInts, "one, or one per feature"),
       {"replaced_value_float", 0.0, "the value replaced (NaN: missing values)"},
       {"replaced_value_int64", int64_t{0}, "the value replaced"}},
      [](InferContext& c) { infer::same_as_input(c); },
      "replaces one value (NaN: the missing ones) by a per-feature value");
  add(
      r, "ArrayFeatureExtractor", 2, 1, AttrSchema::none(),
      [](InferContext& c) {
        if (!c.has_input(0)) return;
        const auto& s = c.inputs[0].shape;
        const auto& idx = c.inputs.size() > 1 ? c.inputs[1].shape : std::nullopt;
        if (!s || s->empty() || !idx) return infer::set(c, 0, c.inputs[0].dtype, std::nullopt);
        Dim count(1);
        for (const Dim& d : *idx)
          count = d.is_known() && count.is_known() ? Dim(count.value * d.value) : Dim::unknown();
        Shape y = s->size() == 1 ? Shape{Dim(1), count} : *s;
        y.back() = count;
        infer::set(c, 0, c.inputs[0].dtype, y);
      },
      "the features (last axis) at the given int64 indices");
  add(
      r, "OneHotEncoder", 1, 1,
      {optional_attr("cats_int64s", K::kInts, "the categories"),
       optional_attr("cats_strings", K::kStrings, "not read: no string tensors"),
       {"zeros", int64_t{1}, "0: a value in no category is an error"}},
      [](InferContext& c) {
        reject_strings(c, {"cats_strings"}, "encode the categories as integers");
        if (!c.has_input(0)) return;
        auto s = c.inputs[0].shape;
        if (s) s->push_back(Dim(list_size(c.node, "cats_int64s")));
        infer::set(c, 0, DType::kF32, s);
      },
      "one float column per category: X [..] -> Y [.., categories]");
  add(
      r, "LabelEncoder", 1, 1,
      {optional_attr("keys_int64s", K::kInts, "keys"),
       optional_attr("keys_floats", K::kFloats, "keys"),
       optional_attr("keys_strings", K::kStrings, "not read: no string tensors"),
       optional_attr("keys_tensor", K::kTensor, "keys (opset 4)"),
       optional_attr("values_int64s", K::kInts, "values"),
       optional_attr("values_floats", K::kFloats, "values"),
       optional_attr("values_strings", K::kStrings, "not read: no string tensors"),
       optional_attr("values_tensor", K::kTensor, "values (opset 4)"),
       {"default_int64", int64_t{-1}, "an int64 value for a missing key"},
       {"default_float", -0.0, "a float value for a missing key"},
       optional_attr("default_string", K::kString, "not read: no string tensors"),
       optional_attr("default_tensor", K::kTensor, "the value for a missing key (opset 4)")},
      [](InferContext& c) {
        reject_strings(c, {"keys_strings", "values_strings"},
                       "map integer or float keys to integer or float values");
        if (!c.has_input(0)) return;
        const Attributes& a = c.node.attrs;
        DType t = a.has("values_int64s")   ? DType::kI64
                  : a.has("values_floats") ? DType::kF32
                  : a.has("values_tensor") ? a.get_tensor("values_tensor").dtype()
                                           : DType::kUndefined;
        infer::set(c, 0, t, c.inputs[0].shape);
      },
      "maps each key to its value (int64, float and tensor keys and values)");
  r.add({.name = "FeatureVectorizer",
         .min_inputs = 1,
         .max_inputs = -1,
         .properties = kOpaque,
         .attrs = {optional_attr("inputdimensions", K::kInts, "the columns taken from each input")},
         .infer =
             [](InferContext& c) {
               if (!c.has_input(0)) return;
               int64_t total = 0;
               for (int64_t d : c.node.attrs.get_ints("inputdimensions", {})) total += d;
               set_rows(c, 0, DType::kF32, total);
             },
         .doc = "ai.onnx.ml: the inputs' first inputdimensions columns side by side, float"});
}

}  // namespace

void register_ml_ops(OpRegistry& r) {
  register_tree_ops(r);
  register_linear_ops(r);
  register_transform_ops(r);
}

}  // namespace pto
