// PromoteBf16: a graph that computes in bf16 (a torch model after .to(torch.bfloat16), an ONNX
// model in bfloat16) computes in fp32 with bf16 products, so that it runs on the CPU kernels,
// which are fp32 (and bf16 for products), instead of the reference interpreter:
//
//   %x: bf16 input          ->  %x_f32 = Cast(%x) {to=float}
//   bf16 weights, values    ->  fp32 (exact: every bf16 is an fp32)
//   MatMul / Gemm / Conv    ->  the same {precision="bf16"} (operands rounded to bf16; not a
//                               depthwise Conv, which computes in fp32 on the bf16 values)
//   Cast(to=bfloat16)       ->  Cast(to=float) (removed by EliminateNoOps)
//   %y: bf16 output         ->  %y = Cast(%y_f32) {to=bfloat16}
//
// The products round their operands as the bf16 graph does; every other op keeps fp32 where the
// graph rounded each result to bf16, so results are at least as accurate as the graph's own
// arithmetic, not bit-identical to it (docs/precision.md). A graph with a bf16 value the pass
// cannot account for (an op whose attribute makes bf16 data other than Cast, Constant and
// ConstantOfShape) is left as it was.
#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "reference/ops/cast.h"

namespace pto::passes {
namespace {

constexpr int64_t kOnnxFloat = 1, kOnnxBfloat16 = 16;

Tensor widened(const Tensor& t) {  // exact: every bf16 is a float
  return reference::cast(t, DType::kF32, "PromoteBf16");
}

// Whether the pass knows how every bf16-making attribute of `n` reads in fp32.
bool understood(const Node& n) {
  for (const auto& [key, a] : n.attrs.all()) {
    if (const Tensor* t = std::get_if<Tensor>(&a); t && t->dtype() == DType::kBF16)
      if (n.op != "Constant" && n.op != "ConstantOfShape") return false;
    if (const int64_t* code = std::get_if<int64_t>(&a);
        code && *code == kOnnxBfloat16 && (key == "to" || key == "dtype") && n.op != "Cast")
      return false;
  }
  return true;
}

Graph promote_bf16(Graph g, const PassContext& ctx) {
  bool any = false;
  for (const Value& v : g.values()) any = any || v.type.dtype == DType::kBF16;
  if (!any) return g;
  for (const Node& n : g.nodes())
    if (!understood(n)) {
      ctx.note("PromoteBf16/skipped (" + n.op + " makes bf16 data)");
      return g;
    }

  // Products whose operands are bf16 now round them to bf16 in fp32.
  int products = 0;
  for (Node& n : g.mutable_nodes())
    if (takes_bf16_products(g, n) && dtype_of_value(g, n.inputs[0]) == DType::kBF16 &&
        !n.attrs.has("precision")) {
      n.attrs.set("precision", std::string("bf16"));
      ++products;
    }
  // Attributes that make bf16 data make fp32.
  for (Node& n : g.mutable_nodes()) {
    if (n.op == "Cast" && n.attrs.get_int("to", 0) == kOnnxBfloat16) n.attrs.set("to", kOnnxFloat);
    std::vector<std::pair<std::string, Tensor>> widen;
    for (const auto& [key, a] : n.attrs.all())
      if (const Tensor* t = std::get_if<Tensor>(&a); t && t->dtype() == DType::kBF16)
        widen.emplace_back(key, widened(*t));
    for (auto& [key, t] : widen) n.attrs.set(key, std::move(t));
  }
  // Weights.
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (const auto& [v, t] : g.initializers())
    if (t.dtype() == DType::kBF16) weights.emplace_back(v, widened(t));
  for (auto& [v, t] : weights) g.set_initializer(v, std::move(t));

  // Outputs stay bf16: each becomes a Cast of its fp32 value (which gives up the name).
  const std::vector<ValueId> outputs = g.outputs();
  for (ValueId y : outputs) {
    if (dtype_of_value(g, y) != DType::kBF16 || is_graph_input(g, y) || g.initializer(y)) continue;
    const ValueId y16 = g.add_value(g.unique_name(g.value(y).name + "_bf16"));
    Attributes to;
    to.set("to", kOnnxBfloat16);
    g.add_node("Cast", {y}, {y16}, to, g.unique_name(g.value(y).name + "/to_bf16"));
    g.replace_uses(y, y16);            // the output list, and y16 takes y's name ...
    for (Node& n : g.mutable_nodes())  // ... but the nodes keep reading the fp32 value
      for (ValueId& in : n.inputs)
        if (in == y16) in = y;
    g.value(y).type.dtype = DType::kF32;
  }
  // Inputs stay bf16: each is read through a Cast to fp32.
  const std::vector<ValueId> inputs = g.inputs();
  for (ValueId x : inputs) {
    if (dtype_of_value(g, x) != DType::kBF16) continue;
    const ValueId x32 = g.add_value(g.unique_name(g.value(x).name + "_f32"));
    Attributes to;
    to.set("to", kOnnxFloat);
    g.insert_node(0, "Cast", {x}, {x32}, to, g.unique_name(g.value(x).name + "/to_f32"));
    for (size_t i = 1; i < g.nodes().size(); ++i)
      for (ValueId& in : g.mutable_nodes()[i].inputs)
        if (in == x) in = x32;
  }
  // Every other value is fp32 now (types are inferred again after the pass).
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    Value& val = g.value(v);
    if (val.type.dtype == DType::kBF16 && !is_graph_input(g, v) && !g.is_output(v))
      val.type.dtype = DType::kF32;
  }
  ctx.note("PromoteBf16/graph");
  if (products) ctx.note("PromoteBf16/bf16 products", products);
  return g;
}

}  // namespace

void register_promote_bf16(PassRegistry& r) {
  r.add({"PromoteBf16", promote_bf16,
         "a bf16 graph computes in fp32 with bf16 products (bf16 inputs and outputs kept)"});
}

}  // namespace pto::passes
