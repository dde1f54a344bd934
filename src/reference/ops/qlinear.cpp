// Reference kernels for ONNX Runtime's QOperator ops (src/ir/ops/qlinear_ops.h), as its contrib op
// spec states them: every quantized operand dequantized exactly, (q - zp) * scale in double, the
// float op's reference kernel run in double, and the result quantized once: round half to even,
// saturated to y's type. (ONNX Runtime computes in float32 or through lookup tables, so its
// results can differ from these by one step where the exact value lies near a rounding edge.)
#include <cmath>

#include "ir/ops/qlinear_ops.h"
#include "kernel_util.h"
#include "pto/op_registry.h"

namespace pto::reference {
namespace {

// The one value of a per-tensor scale or zero point (a missing zero point is 0).
double one_value(const KernelContext& c, size_t i, const char* what) {
  if (!c.has_input(i)) return 0.0;
  const Tensor& t = c.input(i);
  if (t.numel() != 1)
    throw UnsupportedError(cat(c.where(), ": ", what, " ", t.str(), " must be one value"));
  return to_doubles(t, c.where())[0];
}

std::vector<Tensor> qlinear(const KernelContext& c) {
  const std::string w = c.where();
  const qlinear::Form f = *qlinear::form_of(c.node);
  std::vector<Tensor> operands;
  DType out = DType::kUndefined;
  for (const qlinear::Operand& o : f.operands) {
    const Tensor& q = c.input(o.input);
    if (!o.quantized) {
      operands.push_back(q);
      continue;
    }
    if (q.dtype() != DType::kU8 && q.dtype() != DType::kI8)
      throw TypeError(cat(w, ": input ", o.input, " must be uint8 or int8, got ", q.str()));
    if (out == DType::kUndefined) out = q.dtype();
    const double scale = one_value(c, o.input + 1, "scale"), zp = one_value(c, o.input + 2, "zp");
    std::vector<double> v = to_doubles(q, w);
    for (double& e : v) e = (e - zp) * scale;
    operands.push_back(from_doubles(DType::kF64, q.shape(), v, w));
  }
  if (c.has_input(f.y_scale + 1)) out = c.input(f.y_scale + 1).dtype();

  // The float op, on the f64 operands.
  Node n = c.node;
  n.op = f.float_op;
  n.def = OpRegistry::global().find(f.float_op);
  if (c.node.op == "QLinearSoftmax") {  // its axis defaults to -1 whatever the opset says
    n.attrs.set("axis", c.node.attr_int("axis"));
    n.opset = static_cast<int>(c.node.attr_int("opset"));
  }
  KernelContext inner{n, std::move(operands), 1};
  const Tensor y = (*KernelRegistry::global().find(f.float_op))(inner).at(0);

  const double ys = one_value(c, f.y_scale, "y_scale"), yz = one_value(c, f.y_scale + 1, "y_zp");
  const std::vector<double> v = to_doubles(y, w);
  Tensor result = Tensor::empty(out, y.shape());
  dispatch(out, kIntTypes, w, [&]<class Q>() {
    const double lo = static_cast<double>(std::numeric_limits<Q>::lowest());
    const double hi = static_cast<double>(std::numeric_limits<Q>::max());
    Q* p = result.data<Q>();
    for (size_t i = 0; i < v.size(); ++i) {
      const double r = std::nearbyint(v[i] / ys);
      p[i] = static_cast<Q>(std::isnan(r) ? yz : std::clamp(r + yz, lo, hi));
    }
  });
  return {result};
}

}  // namespace

void register_qlinear_kernels(KernelRegistry& r) {
  for (const std::string& op : qlinear::form_ops()) r.add(op, qlinear);
}

}  // namespace pto::reference
