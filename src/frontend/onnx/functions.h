// Model-local functions (ModelProto.functions, IR version 8+): a node whose domain and op name a
// function of the model is replaced by the function's body, as onnxruntime inlines them.
#pragma once

#include <string>

#include "onnx.pb.h"

namespace pto::onnx {

// Replaces every call of a model-local function in m's graph and its subgraphs (and calls inside
// function bodies, to any depth below 64) by the body: formal inputs and outputs renamed to the
// call's, the body's own values to fresh names that start with the call node's name, attributes
// that reference the function's (`ref_attr_name`) set from the call or the function's defaults
// (dropped when neither gives one). `src` names the file in errors.
void inline_functions(::onnx::ModelProto& m, const std::string& src);

}  // namespace pto::onnx
