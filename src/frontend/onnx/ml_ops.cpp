#include "ml_ops.h"

#include <map>

#include "pto/error.h"

namespace pto::onnx {
namespace {

// Op -> the first ai.onnx.ml opset at which PyPTO reads it.
const std::map<std::string, int64_t>& ml_ops() {
  static const std::map<std::string, int64_t> kOps = {
      {"ArrayFeatureExtractor", 1}, {"Binarizer", 1},
      {"FeatureVectorizer", 1},     {"Imputer", 1},
      {"LabelEncoder", 2},          {"LinearClassifier", 1},
      {"LinearRegressor", 1},       {"Normalizer", 1},
      {"OneHotEncoder", 1},         {"Scaler", 1},
      {"SVMClassifier", 1},         {"SVMRegressor", 1},
      {"TreeEnsemble", 5},          {"TreeEnsembleClassifier", 1},
      {"TreeEnsembleRegressor", 1}};
  return kOps;
}

}  // namespace

bool is_ml_op(const std::string& op) {
  return ml_ops().count(op) != 0;
}

void check_ml_opset(const std::string& op, int64_t opset, const std::string& where) {
  if (opset <= 0)
    throw ValueError(cat(where, ": the model does not import domain ai.onnx.ml (opset_import)"));
  if (opset >= 5 && (op == "TreeEnsembleRegressor" || op == "TreeEnsembleClassifier"))
    throw ValueError(cat(where, ": ", op,
                         " is deprecated at ai.onnx.ml opset 5 (the model "
                         "imports opset ",
                         opset,
                         "); write TreeEnsemble there, or import "
                         "ai.onnx.ml opset 3"));
  const int64_t first = ml_ops().at(op);
  if (opset >= first) return;
  if (op == "LabelEncoder")
    throw UnsupportedError(cat(where,
                               ": LabelEncoder of ai.onnx.ml opset 1 maps strings to "
                               "integers, and PyPTO has no string tensors (opset 2 and "
                               "later, with int64 or float keys and values, are read)"));
  throw ValueError(cat(where, ": ", op, " is an op of ai.onnx.ml opset ", first,
                       " and later; the model imports opset ", opset));
}

std::string ml_unsupported_hint(const std::string& op) {
  if (op == "ZipMap")
    return " (ZipMap: its output is a sequence of maps, which PyPTO does not have; export "
           "the classifier without it: skl2onnx.to_onnx(model, X, options={id(model): "
           "{'zipmap': False}}), onnxmltools.convert_lightgbm(model, ..., zipmap=False) "
           "(convert_xgboost writes none), or remove the ZipMap node and output its input, the "
           "probability tensor)";
  if (op == "CastMap" || op == "DictVectorizer")
    return cat(" (", op,
               ": it reads maps, which PyPTO does not have; vectorize the features "
               "before the model)");
  if (op == "CategoryMapper")
    return " (CategoryMapper: it maps strings, and PyPTO has no string tensors)";
  std::string read;
  for (const auto& [name, first] : ml_ops()) read += (read.empty() ? "" : ", ") + name;
  return cat(" (", op, ": not among the ai.onnx.ml ops PyPTO reads: ", read, ")");
}

}  // namespace pto::onnx
