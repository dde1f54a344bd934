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

std::vector<Tensor> one(Tensor t) {
  return {std::move(t)};
}

Kernel view_kernel(Dims (*dims)(const ref::KernelContext&)) {
  return {.run = [dims](const KernelContext& c) { return one(c.input(0).reshape(dims(c))); }};
}

std::vector<Tensor> transpose(const KernelContext& c) {
  return one(pack(ref::permuted_view(c.input(0), ref::transpose_perm(c))));
}

// Ops whose output is a packed view reshaped: Tile, DepthToSpace, SpaceToDepth.
Kernel reshaped_view_kernel(Tensor (*view)(const ref::KernelContext&, Dims*)) {
  return {.run = [view](const KernelContext& c) {
    Dims out;
    Tensor v = view(c, &out);
    return one(pack(v).reshape(out));
  }};
}

std::vector<Tensor> split(const KernelContext& c) {
  std::vector<Tensor> outs;
  for (const Tensor& v : ref::split_views(c)) outs.push_back(pack(v));
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

}  // namespace

void register_movement_kernels(KernelRegistry& r) {
  r.add("Reshape", view_kernel(ref::reshape_dims));
  r.add("Flatten", view_kernel(ref::flatten_dims));
  r.add("Squeeze", view_kernel(ref::squeeze_dims));
  r.add("Unsqueeze", view_kernel(ref::unsqueeze_dims));
  r.add("Identity", {.run = [](const KernelContext& c) { return one(c.input(0)); }});
  r.add("Transpose", {.run = transpose});
  r.add("Slice", {.run = [](const KernelContext& c) { return one(pack(ref::slice_view(c))); }});
  r.add("Expand", {.run = [](const KernelContext& c) { return one(pack(ref::expand_view(c))); }});
  r.add("Tile", reshaped_view_kernel(ref::tile_view));
  r.add("DepthToSpace", reshaped_view_kernel(ref::depth_to_space_view));
  r.add("SpaceToDepth", reshaped_view_kernel(ref::space_to_depth_view));
  r.add("Split", {.run = split});
  r.add("Concat", {.run = concat});
  register_gather_kernels(r);
  register_pad_kernels(r);
  register_scatter_kernels(r);
}

}  // namespace pto::cpu
