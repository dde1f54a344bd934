// CPU kernels for the data-movement ops. Ops that only rename dimensions (Reshape, Flatten,
// Squeeze, Unsqueeze, Identity) return a view sharing the input's storage: no copy at all. Ops
// whose output is a strided view of the input (Transpose, Slice, Expand, Tile, Split,
// DepthToSpace, SpaceToDepth) build that view with the reference's own parameter code
// (reference/ops/layout_params.h: same attributes, same errors) and pack it with the strided-copy
// engine; Concat unpacks each input into its region of the output. Every dtype works: elements
// move as bytes.
#include "backend/cpu/movement/movement.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/movement/strided_copy.h"
#include "reference/ops/layout_params.h"

namespace pto::cpu {
namespace {

namespace ref = pto::reference;

// The input and output shapes of a renaming op when both are static at compile time and its
// other inputs (axes) are constants: a call with that input shape reshapes to the output shape
// without reading the axes again (a subgraph compiled for its run's shapes is all such nodes).
struct StaticView {
  Dims in, out;
};

std::any prepare_static_view(const NodeInfo& n) {
  if (n.inputs.empty() || n.outputs.size() != 1 || !n.inputs[0].shape ||
      !is_static(*n.inputs[0].shape) || !n.outputs[0].shape || !is_static(*n.outputs[0].shape))
    return {};
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (n.dtype(i) != DType::kUndefined && !n.is_constant(i)) return {};
  return StaticView{to_dims(*n.inputs[0].shape), to_dims(*n.outputs[0].shape)};
}

Kernel view_kernel(Dims (*dims)(const ref::KernelContext&)) {
  return {.prepare = prepare_static_view, .run = [dims](const KernelContext& c) {
            const Tensor& x = c.input(0);
            if (const auto* v = c.prepared_if<StaticView>(); v && v->in == x.shape())
              return one(x.reshape(v->out));
            return one(x.reshape(dims(c)));
          }};
}

// Reshape's target shape as written (a constant 1-D input) and allowzero, read once when the
// kernel is made rather than on every run.
struct ReshapeSpec {
  Dims spec;
  bool allowzero;
};

std::any prepare_reshape(const NodeInfo& n) {
  if (!n.is_constant(1) || n.dtype(1) != DType::kI64 || n.constants[1]->rank() != 1) return {};
  const Tensor& s = *n.constants[1];
  return ReshapeSpec{Dims(s.data<int64_t>(), s.data<int64_t>() + s.numel()),
                     n.node.attr_int("allowzero") != 0};
}

// The output shape, from the prepared spec when there is one (the reference rules and errors).
Dims reshape_to(const KernelContext& c) {
  const auto* p = c.prepared_if<ReshapeSpec>();
  return p ? ref::reshape_dims(c, p->spec, p->allowzero) : ref::reshape_dims(c);
}

// Transpose's permutation, checked once when the input's rank is known at compile time; the
// reference reads it (with its errors) otherwise.
std::any prepare_transpose(const NodeInfo& n) {
  if (!n.inputs[0].shape) return {};
  const auto rank = static_cast<int64_t>(n.inputs[0].shape->size());
  std::vector<int64_t> perm(static_cast<size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[static_cast<size_t>(i)] = rank - 1 - i;
  if (n.node.attrs.has("perm")) perm = n.node.attrs.get_ints("perm");
  if (static_cast<int64_t>(perm.size()) != rank) return {};
  std::vector<bool> seen(static_cast<size_t>(rank), false);
  for (int64_t& a : perm) {
    if (a < -rank || a >= rank) return {};
    a = a < 0 ? a + rank : a;
    if (seen[static_cast<size_t>(a)]) return {};
    seen[static_cast<size_t>(a)] = true;
  }
  return perm;
}

std::vector<Tensor> transpose(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const auto* perm = c.prepared_if<std::vector<int64_t>>();
  if (perm && static_cast<int64_t>(perm->size()) == x.rank())
    return one(pack(ref::permuted_view(x, *perm)));
  return one(pack(ref::permuted_view(x, ref::transpose_perm(c))));
}

// Ops whose output is a packed view reshaped: Tile, DepthToSpace, SpaceToDepth.
Kernel reshaped_view_kernel(Tensor (*view)(const ref::KernelContext&, Dims*)) {
  return {.run = [view](const KernelContext& c) {
    Dims out;
    Tensor v = view(c, &out);
    return one(pack(v).reshape(out));
  }};
}

// Parameters that Slice (starts, ends, axes, steps) and Split (axis, sizes) read from
// attributes and constant inputs, read once when the kernel is made: a call then builds no
// error string and parses no tensor (in a Loop body that runs per iteration, ~0.5 us a Slice).
// None when an input they read is not a constant, or reading it fails (the call reads it then,
// and reports the error as the reference does).
template <class Params>
std::any prepare_params(const NodeInfo& n, Params (*read)(const ref::KernelContext&)) {
  std::vector<Tensor> inputs(n.node.inputs.size());
  for (size_t i = 1; i < inputs.size(); ++i) {
    if (n.dtype(i) == DType::kUndefined && !n.is_constant(i)) continue;  // absent
    if (!n.is_constant(i)) return {};
    inputs[i] = *n.constants[i];
  }
  try {
    return read(ref::KernelContext{n.node, std::move(inputs), n.outputs.size()});
  } catch (const Error&) {
    return {};
  }
}

std::vector<Tensor> slice(const KernelContext& c) {
  const auto* p = c.prepared_if<ref::SliceParams>();
  return one(pack(p ? ref::slice_view(c, *p) : ref::slice_view(c)));
}

std::vector<Tensor> split(const KernelContext& c) {
  const auto* p = c.prepared_if<ref::SplitParams>();
  std::vector<Tensor> outs;
  outs.reserve(c.num_outputs);
  for (const Tensor& v : p ? ref::split_views(c, *p) : ref::split_views(c)) outs.push_back(pack(v));
  return outs;
}

std::vector<Tensor> concat(const KernelContext& c) {
  int64_t axis = 0;
  Tensor y = Tensor::empty(c.input(0).dtype(), ref::concat_dims(c, &axis));
  int64_t start = 0;
  for (const Tensor& t : c.inputs) {
    unpack_into(y.view(t.shape(), y.strides(), start * y.strides()[axis]), t);
    start += t.shape()[axis];
  }
  return one(y);
}

// Dropout at inference: Y is X (a view), the mask all ones (bool from opset 10, X's dtype before:
// float32 only). Training mode (opset 12's third input true) goes to the reference kernel, which
// takes ratio 0 and reports a random one as unsupported.
bool accepts_dropout(const NodeInfo& n) {
  if (n.outputs.size() > 2 || n.inputs.empty() || n.inputs[0].sequence) return false;
  const bool legacy_mask = n.node.opset > 0 && n.node.opset < 10;
  return n.outputs.size() < 2 || !legacy_mask || n.dtype(0) == DType::kF32;
}

std::vector<Tensor> dropout(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const int opset = c.node.opset > 0 ? c.node.opset : 1 << 30;
  if (opset >= 12 && c.has_input(2)) {
    const Tensor& t = c.input(2);
    if (t.numel() != 1 || t.dtype() != DType::kBool || t.data<bool>()[0]) return run_reference(c);
  }
  std::vector<Tensor> out;
  out.push_back(x);
  if (c.num_outputs > 1) {
    Tensor mask = Tensor::empty(opset < 10 ? DType::kF32 : DType::kBool, x.shape());
    if (opset < 10)
      std::fill(mask.data<float>(), mask.data<float>() + mask.numel(), 1.0f);
    else
      std::fill(mask.data<bool>(), mask.data<bool>() + mask.numel(), true);
    out.push_back(std::move(mask));
  }
  return out;
}

}  // namespace

void register_movement_kernels(KernelRegistry& r) {
  r.add("Reshape", {.prepare = prepare_reshape, .run = [](const KernelContext& c) {
                      return one(c.input(0).reshape(reshape_to(c)));
                    }});
  r.add("Flatten", view_kernel(ref::flatten_dims));
  r.add("Squeeze", view_kernel(ref::squeeze_dims));
  r.add("Unsqueeze", view_kernel(ref::unsqueeze_dims));
  r.add("Identity", {.run = [](const KernelContext& c) { return one(c.input(0)); }});
  r.add("Dropout", {.accepts = accepts_dropout, .run = dropout, .reference_at_run_time = true});
  r.add("Transpose", {.prepare = prepare_transpose, .run = transpose});
  r.add("Slice", {.prepare = [](const NodeInfo& n) { return prepare_params(n, ref::slice_params); },
                  .run = slice});
  r.add("Expand", {.run = [](const KernelContext& c) { return one(pack(ref::expand_view(c))); }});
  r.add("Tile", reshaped_view_kernel(ref::tile_view));
  r.add("DepthToSpace", reshaped_view_kernel(ref::depth_to_space_view));
  r.add("SpaceToDepth", reshaped_view_kernel(ref::space_to_depth_view));
  r.add("Split", {.prepare = [](const NodeInfo& n) { return prepare_params(n, ref::split_params); },
                  .run = split});
  r.add("Concat", {.run = concat});
  register_gather_kernels(r);
  register_pad_kernels(r);
  register_scatter_kernels(r);
  register_gather_channels_kernel(r);
}

}  // namespace pto::cpu
