// to_dot(Graph) (include/pto/graph_dot.h): DOT text for Graphviz. Values that are initializers
// are not drawn as nodes; each reader lists them in its label ("W f32[64, 3, 7, 7]", small ones
// with their data). Edges go from a value's producer (or the graph-input node) to each reader.
#include <algorithm>
#include <sstream>

#include "pto/graph_dot.h"
#include "pto/op_registry.h"

namespace pto {
namespace {

// A DOT double-quoted string's contents; "\n" in `s` stays a line break of the label.
std::string quote(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\')
      out += '\\';
    else if (c == '\n') {
      out += "\\n";
      continue;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      continue;
    }
    out += c;
  }
  return out;
}

std::string short_name(const std::string& name, size_t max) {
  if (name.size() <= max || max < 4) return name;
  std::string out = "...";
  out.append(name, name.size() - (max - 3), std::string::npos);
  return out;
}

// Heavy ops (they hold most of the time) are drawn in orange, elementwise ones in yellow, the
// layout and data-movement ops in grey.
const char* fill_of(const Node& n) {
  static const char* heavy[] = {"Conv",          "ConvBlocked",       "Gemm", "MatMul", "Attention",
                                "ConvTranspose", "MultiHeadAttention"};
  for (const char* h : heavy)
    if (n.op == h) return "#fdd0a2";
  if (n.def && n.def->is_view()) return "#eeeeee";
  if (n.def && (n.def->is_elementwise() || n.def->is_reduction())) return "#fff7bc";
  return "#ffffff";
}

std::string constant_line(const Graph& g, ValueId v, size_t max_name) {
  const Tensor* t = g.initializer(v);
  std::string line = short_name(g.value(v).name, max_name / 2) + " " + g.value(v).type.str();
  if (t && t->numel() > 0 && t->numel() <= 4) {
    line += " = [";
    for (int64_t i = 0; i < t->numel(); ++i) {
      std::ostringstream s;
      s << t->item_as_double(i);
      line += (i ? ", " : "") + s.str();
    }
    line += "]";
  }
  return line;
}

// The statements drawing `g`, its kernels and its subgraphs, every id starting with `p` (a
// subgraph's ids must not meet its enclosing graph's), each line indented by `ind`.
void write_graph(std::ostream& out, const Graph& g, const KernelGraph* kernels,
                 const std::vector<DotSubgraph>& subgraphs, const DotOptions& options,
                 const std::string& p, const std::string& ind) {
  auto is_const = [&](ValueId v) { return g.initializer(v) || g.is_released(v); };
  for (ValueId v : g.inputs()) {
    if (is_const(v)) continue;
    out << ind << p << "v" << v << " [shape=invhouse, fillcolor=\"#c6dbef\", label=\""
        << quote(short_name(g.value(v).name, options.max_name_chars) + "\n" + g.value(v).type.str())
        << "\"];\n";
  }
  auto node_stmt = [&](int32_t i, const std::string& indent) {
    const Node& n = g.nodes()[i];
    std::string label = n.domain.empty() ? n.op : cat(n.domain, ".", n.op);
    label += '\n';
    label += short_name(n.name, options.max_name_chars);
    for (ValueId v : n.inputs) {
      if (v == kNoValue || !is_const(v)) continue;
      label += '\n';
      label += constant_line(g, v, options.max_name_chars);
    }
    out << indent << p << "n" << i << " [fillcolor=\"" << fill_of(n) << "\", label=\""
        << quote(label) << "\"];\n";
  };
  std::vector<char> in_cluster(g.nodes().size(), 0);
  if (kernels) {
    for (size_t k = 0; k < kernels->kernels.size(); ++k) {
      const KernelGroup& group = kernels->kernels[k];
      if (group.nodes.size() < 2) continue;
      out << ind << "subgraph cluster_" << p << "k" << k << " {\n"
          << ind << "  style=\"rounded,filled\"; color=\"#3182bd\"; fillcolor=\"#f0f6fc\"; "
          << "penwidth=1.5;\n"
          << ind << "  fontname=\"Helvetica\"; fontsize=10; fontcolor=\"#3182bd\"; label=\""
          << quote(cat("kernel ", k, group.rule.empty() ? "" : ": " + group.rule)) << "\";\n";
      for (int32_t n : group.nodes) {
        if (n < 0 || n >= static_cast<int32_t>(g.nodes().size()) || in_cluster[n]) continue;
        in_cluster[n] = 1;
        node_stmt(n, ind + "  ");
      }
      out << ind << "}\n";
    }
  }
  for (int32_t i = 0; i < static_cast<int32_t>(g.nodes().size()); ++i)
    if (!in_cluster[i]) node_stmt(i, ind);

  // Edges: producer (or input node) -> reader, labelled with the value's type.
  auto source = [&](ValueId v) -> std::string {
    const int32_t producer = g.value(v).producer;
    if (producer >= 0) return cat(p, "n", producer);
    return cat(p, "v", v);
  };
  for (int32_t i = 0; i < static_cast<int32_t>(g.nodes().size()); ++i) {
    std::vector<ValueId> seen;
    for (ValueId v : g.nodes()[i].inputs) {
      if (v == kNoValue || is_const(v)) continue;
      if (std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
      seen.push_back(v);
      if (g.value(v).producer < 0 &&
          std::find(g.inputs().begin(), g.inputs().end(), v) == g.inputs().end())
        continue;  // a value nothing defines (an unset optional): nothing to draw from
      out << ind << source(v) << " -> " << p << "n" << i << " [label=\" "
          << quote(g.value(v).type.str()) << "\"];\n";
    }
  }
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const ValueId v = g.outputs()[o];
    out << ind << p << "out" << o << " [shape=house, fillcolor=\"#c7e9c0\", label=\""
        << quote(short_name(g.value(v).name, options.max_name_chars) + "\n" + g.value(v).type.str())
        << "\"];\n";
    if (!is_const(v)) out << ind << source(v) << " -> " << p << "out" << o << ";\n";
  }
  // Subgraphs: a dashed frame each, its inputs fed (dashed) by the node that runs it.
  for (size_t s = 0; s < subgraphs.size(); ++s) {
    const DotSubgraph& sub = subgraphs[s];
    if (!sub.graph) continue;
    const std::string sp = cat(p, "s", s, "_");
    out << ind << "subgraph cluster_" << sp << " {\n"
        << ind << "  style=\"rounded,dashed\"; color=\"#756bb1\"; fontname=\"Helvetica\"; "
        << "fontsize=10; fontcolor=\"#756bb1\"; label=\"" << quote(sub.title) << "\";\n";
    write_graph(out, *sub.graph, &sub.kernels, sub.subgraphs, options, sp, ind + "  ");
    out << ind << "}\n";
    if (sub.node >= 0 && sub.node < static_cast<int32_t>(g.nodes().size()))
      for (ValueId v : sub.graph->inputs())
        if (!sub.graph->initializer(v) && !sub.graph->is_released(v))
          out << ind << p << "n" << sub.node << " -> " << sp << "v" << v
              << " [style=dashed, color=\"#756bb1\"];\n";
  }
}

}  // namespace

std::string to_dot(const Graph& g, const KernelGraph* kernels, const DotOptions& options,
                   const std::vector<DotSubgraph>& subgraphs) {
  std::ostringstream out;
  out << "digraph pypto {\n"
      << "  rankdir=TB; nodesep=0.25; ranksep=0.35;\n"
      << "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", fontsize=10, "
         "height=0.3];\n"
      << "  edge [fontname=\"Helvetica\", fontsize=8, color=\"#555555\", "
         "fontcolor=\"#555555\"];\n";
  if (!options.title.empty())
    out << "  labelloc=t; fontname=\"Helvetica\"; label=\"" << quote(options.title) << "\";\n";
  write_graph(out, g, kernels, subgraphs, options, "", "  ");
  out << "}\n";
  return out.str();
}

}  // namespace pto
