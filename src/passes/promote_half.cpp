// PromoteHalf: a graph that computes in bf16 or f16 (a torch model after .to(torch.bfloat16) or
// .half(), an ONNX model in bfloat16 or float16) computes in fp32 with half-precision products, so
// that it runs on the CPU kernels, which are fp32 (and bf16 or f16 for products), instead of the
// reference interpreter. For each half type H of the graph (bf16, f16):
//
//   %x: H input             ->  %x_f32 = Cast(%x) {to=float}
//   H weights, values       ->  fp32 (exact: every bf16 and every f16 is an fp32)
//   MatMul / Gemm           ->  the same {precision="bf16" or "f16"} (operands rounded to H)
//   Conv                    ->  bf16: the same {precision="bf16"} (not a depthwise Conv); f16:
//                               fp32 on the f16 weights, as the depthwise ones (below)
//   Cast(to=H)              ->  Cast(to=float) (removed by EliminateNoOps)
//   %y: H output            ->  %y = Cast(%y_f32) {to=H}
//
// Why an f16 graph's convs compute in plain fp32: no CPU PyPTO runs on multiplies in f16, so an
// f16 product is an fp32 one on rounded operands, and a conv marked so runs on the implicit GEMM,
// which rounds its activations as it packs them; unmarked, at level 3 it runs on the blocked
// direct and Winograd kernels (ResNet-18 from an fp16 ONNX file, 1 thread: 42 -> 21 ms). Its
// weights are f16 values already, so only its activations are no longer rounded: the result is
// closer to exact, and it is what ONNX Runtime computes for an fp16 conv on an x86 CPU (in fp32,
// between casts). bf16 convs keep their marking: they run on VDPBF16PS, faster than fp32.
//
// The products round their operands as the H graph does; every other op keeps fp32 where the
// graph rounded each result to H, so results are at least as accurate as the graph's own
// arithmetic, not bit-identical to it (docs/precision.md); an f16 graph whose intermediates
// overflow 65504 gets finite values here where it would get inf. A graph with an H value the pass
// cannot account for (an op whose attribute makes H data other than Cast, Constant and
// ConstantOfShape) is left as it was (for that H), and so is a graph that only moves H data
// (reshapes, transposes, gathers, concatenations, ...: the CPU kernels move any dtype as it is,
// and casts around them would only add traffic).
#include <algorithm>
#include <set>
#include <string>

#include "ir/ops/op_params.h"
#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "reference/ops/cast.h"

namespace pto::passes {
namespace {

constexpr int64_t kOnnxFloat = 1;

Tensor widened(const Tensor& t) {  // exact: every bf16 and f16 is a float
  return reference::cast(t, DType::kF32, "PromoteHalf");
}

// Whether the pass knows how every `half`-making attribute of `n` reads in fp32.
bool understood(const Node& n, DType half) {
  const int64_t code = onnx_code(half);
  for (const auto& [key, a] : n.attrs.all()) {
    if (const Tensor* t = std::get_if<Tensor>(&a); t && t->dtype() == half)
      if (n.op != "Constant" && n.op != "ConstantOfShape") return false;
    if (const int64_t* c = std::get_if<int64_t>(&a);
        c && *c == code && (key == "to" || key == "dtype") && n.op != "Cast")
      return false;
  }
  return true;
}

// Whether some node of `g` computes on `half` values, rather than only moving them (the ops here
// copy elements whatever their type).
bool computes_in(const Graph& g, DType half) {
  static const std::set<std::string> moves = {
      "Cast",     "Concat",   "Dropout", "Expand",    "Flatten",  "Gather", "GatherElements",
      "GatherND", "Identity", "Pad",     "Reshape",   "Shape",    "Size",   "Slice",
      "Split",    "Squeeze",  "Tile",    "Transpose", "Unsqueeze"};
  for (const Node& n : g.nodes()) {
    if (moves.count(n.op)) continue;
    for (const auto* list : {&n.inputs, &n.outputs})
      for (ValueId v : *list)
        if (v != kNoValue && dtype_of_value(g, v) == half) return true;
  }
  return false;
}

// The graph's `half` values, weights and attributes become fp32, its products round to `half`.
Graph promote(Graph g, const PassContext& ctx, DType half) {
  const std::string h = params::product_precision_name(half);
  const int64_t code = onnx_code(half);
  bool any = false;
  for (const Value& v : g.values()) any = any || v.type.dtype == half;
  if (!any) return g;
  if (!computes_in(g, half)) {
    ctx.note(cat("PromoteHalf/skipped (", h, " data is only moved)"));
    return g;
  }
  for (const Node& n : g.nodes())
    if (!understood(n, half)) {
      ctx.note(cat("PromoteHalf/skipped (", n.op, " makes ", h, " data)"));
      return g;
    }

  // Products whose operands are `half` now round them to `half` in fp32 (not an f16 conv's).
  int products = 0, fp32_convs = 0;
  for (Node& n : g.mutable_nodes())
    if (takes_reduced_products(g, n) && dtype_of_value(g, n.inputs[0]) == half &&
        !n.attrs.has("precision")) {
      if (half == DType::kF16 && n.op == "Conv") {
        ++fp32_convs;
        continue;
      }
      n.attrs.set("precision", h);
      ++products;
    }
  // Attributes that make `half` data make fp32.
  for (Node& n : g.mutable_nodes()) {
    if (n.op == "Cast" && n.attrs.get_int("to", 0) == code) n.attrs.set("to", kOnnxFloat);
    std::vector<std::pair<std::string, Tensor>> widen;
    for (const auto& [key, a] : n.attrs.all())
      if (const Tensor* t = std::get_if<Tensor>(&a); t && t->dtype() == half)
        widen.emplace_back(key, widened(*t));
    for (auto& [key, t] : widen) n.attrs.set(key, std::move(t));
  }
  // Weights.
  std::vector<std::pair<ValueId, Tensor>> weights;
  for (const auto& [v, t] : g.initializers())
    if (t.dtype() == half) weights.emplace_back(v, widened(t));
  for (auto& [v, t] : weights) g.set_initializer(v, std::move(t));

  // Outputs stay `half`: each becomes a Cast of its fp32 value (which gives up the name).
  const std::vector<ValueId> outputs = g.outputs();
  for (ValueId y : outputs) {
    if (dtype_of_value(g, y) != half || is_graph_input(g, y) || g.initializer(y)) continue;
    const ValueId y16 = g.add_value(g.unique_name(cat(g.value(y).name, "_", h)));
    Attributes to;
    to.set("to", code);
    g.add_node("Cast", {y}, {y16}, to, g.unique_name(cat(g.value(y).name, "/to_", h)));
    g.replace_uses(y, y16);            // the output list, and y16 takes y's name ...
    for (Node& n : g.mutable_nodes())  // ... but the nodes keep reading the fp32 value
      for (ValueId& in : n.inputs)
        if (in == y16) in = y;
    g.value(y).type.dtype = DType::kF32;
  }
  // Inputs stay `half`: each is read through a Cast to fp32.
  const std::vector<ValueId> inputs = g.inputs();
  for (ValueId x : inputs) {
    if (dtype_of_value(g, x) != half) continue;
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
    if (val.type.dtype == half && !is_graph_input(g, v) && !g.is_output(v))
      val.type.dtype = DType::kF32;
  }
  ctx.note(cat("PromoteHalf/", h, " graph"));
  if (products) ctx.note(cat("PromoteHalf/", h, " products"), products);
  if (fp32_convs) ctx.note(cat("PromoteHalf/", h, " convs in fp32"), fp32_convs);
  return g;
}

Graph promote_half(Graph g, const PassContext& ctx) {
  for (DType half : {DType::kBF16, DType::kF16}) g = promote(std::move(g), ctx, half);
  return g;
}

}  // namespace

bool has_half_values(const Graph& g) {
  return std::any_of(g.values().begin(), g.values().end(), [](const Value& v) {
    return v.type.dtype == DType::kBF16 || v.type.dtype == DType::kF16;
  });
}

void register_promote_half(PassRegistry& r) {
  r.add({"PromoteHalf", promote_half,
         "a bf16 or f16 graph computes in fp32 with bf16/f16 products (its inputs and outputs "
         "kept)"});
}

}  // namespace pto::passes
