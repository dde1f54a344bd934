// Pictures of a graph: Graphviz DOT text (render it with `dot -Tsvg`; pto compile --graph,
// pypto.save_graph).
//
// One box per node (the op, its name, and the constants it reads folded into its label, so
// weights do not crowd the picture), edges labelled with the dtype and shape of the value they
// carry, graph inputs, outputs and nodes of heavy ops styled apart, and each fused kernel of a
// Kernel Graph drawn as a cluster (a framed box) around its nodes, titled with its number and
// fusion rule. Top to bottom (rankdir TB), so a deep network reads as a column.
#pragma once

#include <string>

#include "pto/graph.h"
#include "pto/kernel_graph.h"

namespace pto {

class Executable;

struct DotOptions {
  std::string title;           // a caption at the top ("" for none)
  size_t max_name_chars = 40;  // node names longer than this keep their end ("...layer1/conv")
};

// `kernels`, when given, draws every kernel of more than one node as a cluster (src/ir).
std::string to_dot(const Graph& g, const KernelGraph* kernels = nullptr,
                   const DotOptions& options = {});

// The compiled graph of `exe` with its plan's kernels as clusters (src/runtime).
std::string to_dot(const Executable& exe, const DotOptions& options = {});

// `g` as pass `pass` of level `level`'s pipeline left it (src/runtime; pypto.save_graph(after=)).
// ValueError listing the level's passes when it does not run that pass (check_pass_runs).
Graph graph_after_pass(Graph g, int level, const std::string& pass);
void check_pass_runs(int level, const std::string& pass);

}  // namespace pto
