// LowerConv3D: a 3-D convolution as a 2-D one over depth windows, so that video and volume models
// (R3D, MC3, S3D, 3-D U-Nets) run on the CPU's 2-D conv kernels (implicit GEMM, blocked, Winograd)
// instead of the reference interpreter. For X [N, C, D, H, W] and W [M, C/g, kd, kh, kw]:
//
//   Xt  = Transpose(Pad(X, depth pads), [0, 2, 1, 3, 4])              [N, Dp, C, H, W]
//   S_t = Slice(Xt, axis 1, from t dd, step sd, Do entries)            [N, Do, C, H, W], t < kd
//   Xc  = Reshape(Concat(Unsqueeze(S_t, 3) for each t, axis 3),
//                 [-1, C kd, H, W])                                    [N Do, C kd, H, W]
//   Y2  = Conv(Xc, W as [M, C/g kd, kh, kw], B; H and W's strides, pads and dilations; group g)
//   Y   = Transpose(Reshape(Y2, [-1, Do, M, Ho, Wo]), [0, 2, 1, 3, 4])
//
// Channel c kd + t of Xc is X's channel c at depth offset t: that is W's [C/g, kd] axes flattened
// in memory order, so the weight is a view of the same data, and each group's channels stay
// contiguous. The sums run in another order than a direct 3-D conv's (as every conv kernel's
// does), so results move by rounding; level 2. Xc holds kd copies of the input.
//
// Taken when X is floating with C, D, H and W known (N may be symbolic), the output's other
// dimensions known, and auto_pad NOTSET or VALID; other 3-D convs stay as they are.
#include "passes/passes.h"
#include "passes/rewrite_util.h"

namespace pto::passes {
namespace {

struct Conv3d {
  int64_t c, d, h, w, m, kd, kh, kw, group;
  std::vector<int64_t> strides, dilations, pads;  // [d, h, w], [d, h, w], [d0, h0, w0, d1, h1, w1]
  int64_t dout, hout, wout;
};

std::optional<Conv3d> match(const Graph& g, const Node& n) {
  if (n.op != "Conv" || n.inputs.size() < 2 || n.outputs.size() != 1) return std::nullopt;
  const TensorType& xt = g.value(n.inputs[0]).type;
  const TensorType& wt = g.value(n.inputs[1]).type;
  const TensorType& yt = g.value(n.outputs[0]).type;
  if (!is_floating(xt.dtype) || !xt.shape || xt.shape->size() != 5) return std::nullopt;
  if (!wt.shape || wt.shape->size() != 5 || !yt.shape || yt.shape->size() != 5) return std::nullopt;
  const Shape &x = *xt.shape, &w = *wt.shape, &y = *yt.shape;
  for (size_t k = 1; k < 5; ++k)
    if (!x[k].is_known() || !w[k].is_known() || !y[k].is_known()) return std::nullopt;
  if (!w[0].is_known()) return std::nullopt;
  const std::string pad = n.attrs.get_string("auto_pad", "NOTSET");
  if (pad != "NOTSET" && pad != "VALID") return std::nullopt;
  Conv3d c{x[1].value, x[2].value, x[3].value,
           x[4].value, w[0].value, w[2].value,
           w[3].value, w[4].value, n.attrs.get_int("group", 1),
           {},         {},         {},
           y[2].value, y[3].value, y[4].value};
  c.strides = n.attrs.get_ints("strides", {1, 1, 1});
  c.dilations = n.attrs.get_ints("dilations", {1, 1, 1});
  c.pads =
      pad == "VALID" ? std::vector<int64_t>(6, 0) : n.attrs.get_ints("pads", {0, 0, 0, 0, 0, 0});
  if (c.strides.size() != 3 || c.dilations.size() != 3 || c.pads.size() != 6) return std::nullopt;
  if (n.attrs.has("kernel_shape") &&
      n.attrs.get_ints("kernel_shape") != std::vector<int64_t>{c.kd, c.kh, c.kw})
    return std::nullopt;
  if (c.group < 1 || c.c % c.group != 0 || w[1].value * c.group != c.c || y[1].value != c.m)
    return std::nullopt;
  // The output depth the windows give must be the one the type says.
  const int64_t dp = c.d + c.pads[0] + c.pads[3];
  const int64_t span = c.dilations[0] * (c.kd - 1) + 1;
  if (c.strides[0] < 1 || dp < span || (dp - span) / c.strides[0] + 1 != c.dout)
    return std::nullopt;
  return c;
}

Graph lower_conv3d(Graph g, const PassContext& ctx) {
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const std::optional<Conv3d> m = match(g, g.nodes()[i]);
    if (!m) continue;
    const Conv3d& c = *m;
    const Node n = g.nodes()[i];  // a copy: inserting nodes moves the vector
    const DType dt = g.value(n.inputs[0]).type.dtype;
    const Dim batch = (*g.value(n.inputs[0]).type.shape)[0];
    const std::string& base = n.name.empty() ? g.value(n.outputs[0]).name : n.name;
    size_t at = i;
    auto value = [&](const std::string& suffix, Shape shape) {
      return g.add_value(g.unique_name(base + suffix), TensorType{dt, std::move(shape)});
    };
    auto ints = [&](const std::string& suffix, const std::vector<int64_t>& v) {
      return g.add_constant(base + suffix,
                            Tensor::from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}));
    };
    auto add = [&](const std::string& op, std::vector<ValueId> in, ValueId out, Attributes a = {}) {
      g.insert_node(at++, op, std::move(in), {out}, std::move(a), base + "_" + op);
      return out;
    };

    ValueId x = n.inputs[0];
    const int64_t dp = c.d + c.pads[0] + c.pads[3];
    if (c.pads[0] != 0 || c.pads[3] != 0)
      x = add("Pad", {x, ints("_depth_pads", {0, 0, c.pads[0], 0, 0, 0, 0, c.pads[3], 0, 0})},
              value("_padded", {batch, c.c, dp, c.h, c.w}));
    Attributes perm;
    perm.set("perm", std::vector<int64_t>{0, 2, 1, 3, 4});
    x = add("Transpose", {x}, value("_depth_major", {batch, dp, c.c, c.h, c.w}), perm);
    std::vector<ValueId> windows;
    for (int64_t t = 0; t < c.kd; ++t) {
      const int64_t from = t * c.dilations[0];
      const ValueId s =
          add("Slice",
              {x, ints("_from", {from}), ints("_to", {from + (c.dout - 1) * c.strides[0] + 1}),
               ints("_axis", {1}), ints("_step", {c.strides[0]})},
              value("_window", {batch, c.dout, c.c, c.h, c.w}));
      windows.push_back(add("Unsqueeze", {s, ints("_axes", {3})},
                            value("_window", {batch, c.dout, c.c, 1, c.h, c.w})));
    }
    ValueId cat = windows[0];
    if (c.kd > 1) {
      Attributes axis;
      axis.set("axis", int64_t{3});
      cat = add("Concat", windows, value("_windows", {batch, c.dout, c.c, c.kd, c.h, c.w}), axis);
    }
    const Dim rows = batch.is_known() ? Dim(batch.value * c.dout) : Dim::unknown();
    const ValueId xc = add("Reshape", {cat, ints("_rows", {-1, c.c * c.kd, c.h, c.w})},
                           value("_columns", {rows, c.c * c.kd, c.h, c.w}));

    const Shape w2{c.m, c.c / c.group * c.kd, c.kh, c.kw};
    ValueId w = n.inputs[1];
    if (const Tensor* wc = constant_of(g, w)) {
      w = g.add_constant(g.value(w).name + "_2d", wc->reshape(to_dims(w2)));
    } else {
      w = add("Reshape", {w, ints("_w2d", to_dims(w2))}, value("_w2d", w2));
    }
    Attributes a2;
    a2.set("kernel_shape", std::vector<int64_t>{c.kh, c.kw});
    a2.set("strides", std::vector<int64_t>{c.strides[1], c.strides[2]});
    a2.set("dilations", std::vector<int64_t>{c.dilations[1], c.dilations[2]});
    a2.set("pads", std::vector<int64_t>{c.pads[1], c.pads[2], c.pads[4], c.pads[5]});
    a2.set("group", c.group);
    // The same products: what they compute in (AutoMixedPrecision, ConvPrecision) carries over.
    if (n.attrs.has("precision")) a2.set("precision", n.attrs.get_string("precision"));
    std::vector<ValueId> conv_in{xc, w};
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) conv_in.push_back(n.inputs[2]);
    const ValueId y2 = add("Conv", conv_in, value("_2d", {rows, c.m, c.hout, c.wout}), a2);
    const ValueId y5 = add("Reshape", {y2, ints("_depths", {-1, c.dout, c.m, c.hout, c.wout})},
                           value("_depth_major_out", {batch, c.dout, c.m, c.hout, c.wout}));
    retarget(g.mutable_nodes()[at], "Transpose", {y5}, perm);
    i = at;
    ctx.note("LowerConv3D/Conv");
  }
  return g;
}

}  // namespace

void register_lower_conv3d(PassRegistry& r) {
  r.add({"LowerConv3D", lower_conv3d,
         "a 3-D Conv as a 2-D Conv over depth windows (the CPU kernels are 1-D and 2-D)"});
}

}  // namespace pto::passes
