// FuseDynamicQuantization: the dynamically quantized matrix product that onnxruntime.quantization
// .quantize_dynamic writes for each MatMul,
//
//   (xq, xs, xzp) = DynamicQuantizeLinear(x)
//   y = Cast<float>(MatMulInteger(xq, W, xzp[, wzp])) * (xs * ws)      [+ bias]
//
// becomes one DynamicQuantizeMatMul(x, W, ws, wzp, bias): the activation is quantized inside the
// product's kernel, the int32 accumulators never reach memory, and the scales and bias are applied
// in its epilogue. The arithmetic is the same, operation for operation (the same quantization,
// float(acc) * (xs * ws) + bias in float32), so every bit is kept. W must be an 8-bit matrix and
// ws, wzp and bias one value or one per column; DynamicQuantizeLinear and the scale product stay
// for their other readers (and go with dead code otherwise).
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

// The node producing output `slot` of v's producer when it is op `op`, else nullptr.
const Node* produced_by(const Graph& g, ValueId v, const char* op, int slot = 0) {
  const Node* n = producer(g, v);
  if (!n || n->op != op) return nullptr;
  return n->outputs.size() > static_cast<size_t>(slot) && n->outputs[slot] == v ? n : nullptr;
}

// Whether v is a float32 constant holding one value or `columns` values along its last axis.
bool per_column_constant(const Graph& g, ValueId v, int64_t columns, DType dtype) {
  const Tensor* t = constant(g, v);
  if (!t || t->dtype() != dtype) return false;
  if (t->numel() == 1) return true;
  for (int64_t d = 0; d + 1 < t->rank(); ++d)
    if (t->dim(d) != 1) return false;
  return t->rank() >= 1 && t->dim(-1) == columns;
}

bool fuse(Rewrite& rw, size_t i, const PassContext& ctx) {
  Graph& g = rw.graph();
  const Node& mul = g.nodes()[i];
  if (mul.op != "Mul" || mul.inputs.size() != 2) return false;
  const ReaderIndex& readers = rw.readers();
  for (size_t side = 0; side < 2; ++side) {
    const ValueId acc_f = mul.inputs[side], scale = mul.inputs[1 - side];
    const Node* cast = produced_by(g, acc_f, "Cast");
    if (!cast || cast->attrs.get_int("to", 0) != 1 || readers.single_reader(acc_f) != int32_t(i))
      continue;
    const Node* mmi = produced_by(g, cast->inputs[0], "MatMulInteger");
    if (!mmi || mmi->inputs.size() < 3 || readers.uses(cast->inputs[0]) != 1) continue;
    const ValueId x_q = mmi->inputs[0], w = mmi->inputs[1];
    const Node* dql = produced_by(g, x_q, "DynamicQuantizeLinear");
    if (!dql || mmi->inputs[2] != dql->outputs[2]) continue;
    const Tensor* wt = constant(g, w);
    if (!wt || wt->rank() != 2 || (wt->dtype() != DType::kI8 && wt->dtype() != DType::kU8))
      continue;
    const int64_t n = wt->dim(1);
    const ValueId w_zp = mmi->inputs.size() > 3 ? mmi->inputs[3] : kNoValue;
    if (w_zp != kNoValue && !per_column_constant(g, w_zp, n, wt->dtype())) continue;
    const Node* prod = produced_by(g, scale, "Mul");
    if (!prod || prod->inputs.size() != 2) continue;
    const ValueId xs = dql->outputs[1];
    const int ws_side = prod->inputs[0] == xs ? 1 : prod->inputs[1] == xs ? 0 : -1;
    if (ws_side < 0 || !per_column_constant(g, prod->inputs[ws_side], n, DType::kF32)) continue;
    std::vector<ValueId> inputs = {dql->inputs[0], w, prod->inputs[ws_side], w_zp};
    // A bias added right after, along the columns, joins the epilogue.
    size_t target = i;
    const int32_t add = readers.single_reader(mul.outputs[0]);
    if (add >= 0 && g.nodes()[add].op == "Add" && g.nodes()[add].inputs.size() == 2) {
      const Node& a = g.nodes()[add];
      const ValueId bias = a.inputs[0] == mul.outputs[0] ? a.inputs[1] : a.inputs[0];
      if (per_column_constant(g, bias, n, DType::kF32) && constant(g, bias)->rank() <= 1) {
        inputs.push_back(bias);
        target = static_cast<size_t>(add);
        rw.remove(i);
      }
    }
    while (inputs.back() == kNoValue) inputs.pop_back();
    rw.remove(static_cast<size_t>(g.value(acc_f).producer));
    rw.remove(static_cast<size_t>(g.value(cast->inputs[0]).producer));
    retarget(g.mutable_nodes()[target], "DynamicQuantizeMatMul", std::move(inputs));
    ctx.note(target == i ? "FuseDynamicQuantization/MatMul" : "FuseDynamicQuantization/MatMulBias");
    return true;
  }
  return false;
}

Graph fuse_dynamic_quantization(Graph g, const PassContext& ctx) {
  apply_rules(g, {{nullptr, fuse}}, ctx);
  return g;
}

}  // namespace

void register_fuse_dynamic_quantization(PassRegistry& r) {
  r.add({"FuseDynamicQuantization", fuse_dynamic_quantization,
         "fuses DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul by the scales (-> Add of "
         "a bias), as onnxruntime's quantize_dynamic writes it, into one DynamicQuantizeMatMul"});
}

}  // namespace pto::passes
