// ONNX import (ModelProto -> Tensor Graph) and export (the inverse). Both use protobuf with the
// onnx.proto schema of the installed onnx package (generated at build time).
#pragma once

#include <string>
#include <string_view>

#include "pto/graph.h"

namespace pto::onnx {

// Loads a model file; external-data initializers are read relative to the file's folder.
// Every malformed input gives a pto::Error whose message names the file (and node, op).
Graph load(const std::string& path);

// Loads a model from serialized bytes. `base_dir` resolves external data ("" forbids it);
// `source` names the model in error messages.
Graph load_from_bytes(std::string_view bytes, const std::string& base_dir,
                      const std::string& source);

// Serializes `g` as an ONNX ModelProto: names kept (empty or repeated value names get generated
// ones), weights inline as raw_data (so at most 2 GB), one opset per domain (a node with opset 0
// takes its domain's; a graph with none gets g.opset or the newest onnxruntime 1.32 loads).
// Throws UnsupportedError naming the node for what ONNX cannot express (nodes of one domain with
// different opsets, undefined tensors), ValueError for a graph verify() rejects.
std::string save_to_bytes(const Graph& g);

// Writes save_to_bytes(g) to `path`; errors name the path.
void save(const Graph& g, const std::string& path);

// Reads a serialized TensorProto file (the ONNX test-data format, input_0.pb).
Tensor load_tensor(const std::string& path);
// Reads a test-data file of a value of `type`: a TensorProto for a tensor, a SequenceProto for a
// sequence (Tensor::sequence), an OptionalProto for an optional (Tensor::none() when empty, else
// the value it holds).
Tensor load_value(const std::string& path, const TensorType& type);

// Opset range of the default domain this importer accepts.
inline constexpr int kMinOpset = 7;
int max_opset();  // the newest the generated schema's onnx release knows

}  // namespace pto::onnx
