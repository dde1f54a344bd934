// StoreHalfOperands: a float32 activation that is only ever read as the A operand of products
// computing in bf16 (or f16) is stored in bf16 (f16), half the bytes to write and read back,
// with no change to any result: those products round A to that type anyway.
//
//   %h = Gelu(%x)                           %h = Gelu(%x)
//   %y = MatMul(%h, %w) {precision="bf16"}  %h_bf16 = Cast(%h) {to=bfloat16}
//                                     ->    %y = MatMul(%h_bf16, %w) {precision="bf16"}
//
// Fusion then gives the Cast to the group computing %h, whose tile program stores bf16 (a GEMM
// with a tile epilogue stores its rounded block, GemmArgs::c_half; a norm's kernel its rows,
// rule LayerNormalization+Cast), and the reading GEMM widens A's blocks as it packs them
// (GemmArgs::a_half): no separate cast kernel runs. Only values made by an op that fuses the
// Cast (elementwise ops, norms and softmax, MatMul, Gemm) are stored so, also when views (Reshape,
// Flatten, ...) stand between them and the products, which then move the half data; graph outputs,
// inputs and weights are not. Level 2, after AutoMixedPrecision and PromoteHalf have marked the
// products.
#include <map>

#include "ir/ops/op_params.h"
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// Whether the kernel computing `n`'s output takes a Cast of it into its own store at no cost:
// an elementwise op (its tile program stores half), a MatMul or Gemm (c_half), a norm or
// softmax, which keeps the shape of its input (its row kernel stores half, norm.cpp, or its tile
// program does; a norm without either leaves the Cast a kernel of its own: same values).
bool fuses_a_cast(const Graph& g, const Node& n) {
  if (!n.domain.empty() || n.outputs.empty() || !n.def) return false;
  for (size_t o = 1; o < n.outputs.size(); ++o)
    if (n.outputs[o] != kNoValue) return false;
  if (n.def->is_reduction() && !n.inputs.empty() && n.inputs[0] != kNoValue) {
    const std::optional<Shape>&x = g.value(n.inputs[0]).type.shape,
          &y = g.value(n.outputs[0]).type.shape;
    return x && y && *x == *y;
  }
  return n.outputs.size() == 1 && (n.def->is_elementwise() || n.op == "MatMul" || n.op == "Gemm");
}

using Uses = std::map<ValueId, std::vector<std::pair<int32_t, size_t>>>;

bool is_view(const Node& n) {
  return n.domain.empty() && n.outputs.size() == 1 &&
         (n.op == "Reshape" || n.op == "Flatten" || n.op == "Squeeze" || n.op == "Unsqueeze");
}

// The half type every reader of `v` rounds it to as its A operand, if every reader does; views
// (Reshape, Flatten, Squeeze, Unsqueeze: they move any dtype) are looked through.
std::optional<DType> rounded_by_all_readers(const Graph& g, ValueId v, const Uses& uses) {
  auto it = uses.find(v);
  if (it == uses.end() || g.is_output(v)) return std::nullopt;
  std::optional<DType> half;
  for (const auto& [node, slot] : it->second) {
    const Node& r = g.nodes()[node];
    std::optional<DType> p;
    if (is_view(r) && slot == 0) {
      p = rounded_by_all_readers(g, r.outputs[0], uses);
    } else {
      if (slot != 0 || !r.domain.empty() || (r.op != "MatMul" && r.op != "Gemm"))
        return std::nullopt;
      for (size_t i = 1; i < r.inputs.size(); ++i)
        if (r.inputs[i] == v) return std::nullopt;  // also B or C: read as float there
      p = params::product_precision(r);
    }
    if (!p || *p == DType::kF32 || (half && *half != *p)) return std::nullopt;
    half = p;
  }
  return half;
}

Graph store_half_operands(Graph g, const PassContext& ctx) {
  Uses uses;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (size_t k = 0; k < g.nodes()[i].inputs.size(); ++k)
      uses[g.nodes()[i].inputs[k]].push_back({static_cast<int32_t>(i), k});
  struct Store {
    size_t after;  // the producer's position
    ValueId value;
    DType half;
  };
  std::vector<Store> stores;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!fuses_a_cast(g, n)) continue;
    const ValueId v = n.outputs[0];
    const TensorType& t = g.value(v).type;
    if (v == kNoValue || t.dtype != DType::kF32 || !t.shape) continue;
    if (std::optional<DType> half = rounded_by_all_readers(g, v, uses))
      stores.push_back({i, v, *half});
  }
  // The readers first, while `uses` holds their positions (a store's readers may lie past a later
  // store's Cast: the encoder output every decoder layer reads), then the Casts, back to front so
  // that each producer's position holds.
  std::vector<ValueId> halves;
  for (const Store& s : stores) {
    const std::string name = g.value(s.value).name;
    halves.push_back(g.add_value(g.unique_name(cat(name, "_", dtype_name(s.half))),
                                 TensorType{s.half, g.value(s.value).type.shape}));
    for (const auto& [node, slot] : uses.at(s.value))
      g.mutable_nodes()[node].inputs[slot] = halves.back();
  }
  for (size_t k = stores.size(); k-- > 0;) {
    const Store& s = stores[k];
    const std::string name = g.value(s.value).name;
    Attributes to;
    to.set("to", static_cast<int64_t>(onnx_code(s.half)));
    g.insert_node(s.after + 1, "Cast", {s.value}, {halves[k]}, to,
                  g.unique_name(cat(name, "/store_", dtype_name(s.half))));
  }
  if (!stores.empty()) ctx.note("StoreHalfOperands/values", static_cast<int>(stores.size()));
  return g;
}

}  // namespace

void register_store_half_operands(PassRegistry& r) {
  r.add({"StoreHalfOperands", store_half_operands,
         "stores a float32 value read only as A of bf16/f16 products in that type (same results, "
         "half the bytes)"});
}

}  // namespace pto::passes
