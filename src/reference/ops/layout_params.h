// The parameters of the layout ops (Reshape, Transpose, Slice, Split, Concat, Expand, Tile, Pad)
// read and checked once (and Gather's indices), for the reference kernels and the CPU backend's
// data-movement kernels. Each function reads the node's attributes and inputs exactly as the
// reference does and throws the same errors; the ops whose output is a strided view of the input
// return that view, and a kernel only has to pack it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "pto/reference.h"

namespace pto::reference {

// Output shapes of the ops that only rename dimensions (the output is input 0 reshaped).
Dims reshape_dims(const KernelContext& c);  // shape input or attribute; 0, -1 and allowzero
// reshape_dims for a target `spec` read once (a kernel prepared with the constant shape input):
// errors name c's node, whose where() is built only for them.
Dims reshape_dims(const KernelContext& c, const std::vector<int64_t>& spec, bool allowzero);
Dims flatten_dims(const KernelContext& c);
Dims squeeze_dims(const KernelContext& c);  // axes input or attribute, or every size-1 axis
Dims unsqueeze_dims(const KernelContext& c);

// Transpose's permutation, normalized (the reverse of the axes when `perm` is absent).
std::vector<int64_t> transpose_perm(const KernelContext& c);
// A view of `t` with its axes permuted: out.shape[i] = t.shape[perm[i]].
Tensor permuted_view(const Tensor& t, const std::vector<int64_t>& perm);

// Strided views of input 0 (zero strides where it repeats) whose packed copy is the output.
Tensor expand_view(const KernelContext& c);
Tensor slice_view(const KernelContext& c);
// Slice's starts, ends, axes and steps (attributes, or inputs 1-4), of one length, axes and steps
// filled in where absent; and the view for them read once (a kernel prepared with constant
// inputs): errors name c's node, whose where() is built only for them.
struct SliceParams {
  std::vector<int64_t> starts, ends, axes, steps;
};
SliceParams slice_params(const KernelContext& c);
Tensor slice_view(const KernelContext& c, const SliceParams& p);
// Tile: the view has shape [r0, d0, r1, d1, ...]; its packed copy reshaped to `out` is the output.
Tensor tile_view(const KernelContext& c, Dims* out);

// DepthToSpace and SpaceToDepth (NCHW): the view is 6-D; its packed copy reshaped to `out` is the
// output.
Tensor depth_to_space_view(const KernelContext& c, Dims* out);
Tensor space_to_depth_view(const KernelContext& c, Dims* out);
// Split: one view of input 0 per output.
std::vector<Tensor> split_views(const KernelContext& c);
// Split's axis, sizes (input 1 or attribute `split`) and num_outputs as the node gives them; and
// the views for them read once (a kernel prepared with a constant `split`), checked against
// input 0 on each call (errors build where() only when thrown).
struct SplitParams {
  int64_t axis = 0;
  std::optional<std::vector<int64_t>> split;
  std::optional<int64_t> num_outputs;
};
SplitParams split_params(const KernelContext& c);
std::vector<Tensor> split_views(const KernelContext& c, const SplitParams& p);
// Concat: the output shape after checking every input against input 0; `*axis` normalized.
Dims concat_dims(const KernelContext& c, int64_t* axis);

// Gather: the indices, bounds-checked and made non-negative; the normalized axis and the output
// shape through the pointers.
std::vector<int64_t> gather_indices(const KernelContext& c, int64_t* axis, Dims* out_shape);
// GatherElements: the same for its indices (the output has their shape), after checking that they
// fit inside the data on every other axis.
std::vector<int64_t> gather_elements_indices(const KernelContext& c, int64_t* axis);
// GatherND: the element offset in data of each slice the output copies (every index checked),
// the output's shape and the slice's element count.
std::vector<int64_t> gather_nd_offsets(const KernelContext& c, Dims* out_shape, int64_t* slice);
// ReverseSequence: sequence_lens, checked against the input (each in [0, steps]); the batch and
// time axes (0 and 1, in either order) through the pointers.
std::vector<int64_t> reverse_sequence_lens(const KernelContext& c, int64_t* batch_axis,
                                           int64_t* time_axis);

// Pad: for each output index along each axis, the input index it reads, or -1 for the constant.
// The maps are left empty when the output has no elements.
struct PadPlan {
  Dims out_shape;
  std::vector<std::vector<int64_t>> source;  // per axis, out_shape[a] entries
  Tensor value;                              // the constant, a 0-D tensor of the input's dtype
};
PadPlan pad_plan(const KernelContext& c);

}  // namespace pto::reference
