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
#include <vector>

#include "pto/graph.h"
#include "pto/kernel_graph.h"

namespace pto {

class Executable;

struct DotOptions {
  std::string title;           // a caption at the top ("" for none)
  size_t max_name_chars = 40;  // node names longer than this keep their end ("...layer1/conv")
};

// A subgraph drawn in the picture of the graph that holds it (a control-flow node's compiled
// body): a dashed frame titled `title` beside node `node`, which feeds its inputs.
struct DotSubgraph {
  int32_t node = -1;
  std::string title;  // "Loop_0: body"
  const Graph* graph = nullptr;
  KernelGraph kernels;                 // drawn as clusters inside it, as for the outer graph
  std::vector<DotSubgraph> subgraphs;  // its own nodes' subgraphs
};

// `kernels`, when given, draws every kernel of more than one node as a cluster; `subgraphs`, the
// subgraphs to draw inside (src/ir).
std::string to_dot(const Graph& g, const KernelGraph* kernels = nullptr,
                   const DotOptions& options = {}, const std::vector<DotSubgraph>& subgraphs = {});

// The compiled graph of `exe` with its plan's kernels as clusters, and the compiled subgraphs of
// its control-flow nodes as dashed frames, recursively (src/runtime).
std::string to_dot(const Executable& exe, const DotOptions& options = {});

// `g` as pass `pass` of level `level`'s pipeline left it (src/runtime; pypto.save_graph(after=)).
// ValueError listing the level's passes when it does not run that pass (check_pass_runs).
Graph graph_after_pass(Graph g, int level, const std::string& pass);
void check_pass_runs(int level, const std::string& pass);

}  // namespace pto
