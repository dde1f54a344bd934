// Shared declarations of the binding files (one per area, STYLE.md habit 13): each registers its
// part of the module; tensors cross the boundary through DLPack (tensor.cpp) with no copy.
#pragma once

#include <functional>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "pto/tensor.h"

namespace pto::python {

namespace nb = nanobind;

// Wraps any DLPack-capable CPU array (torch.Tensor, numpy.ndarray, nb_ndarray) as a pto::Tensor
// without copying; strides are kept, so a non-contiguous view is read correctly. The Tensor holds
// a reference to the array until it is destroyed. `what` names the argument in errors.
Tensor tensor_from_python(nb::handle array, const std::string& what);
// The same, with `what` made only for an error (a run's inputs: no string per call).
Tensor tensor_from_python(nb::handle array, const std::function<std::string()>& what);

// A graph input's value: an array as tensor_from_python takes it, a list (or tuple) of arrays for
// a sequence, None for an empty optional.
Tensor value_from_python(nb::handle x, const std::function<std::string()>& what);

// Exposes a pto::Tensor as an array (no copy) that keeps the storage alive: a numpy array, or for
// bf16 (which numpy lacks) a DLPack-capable one. torch.from_numpy / torch.from_dlpack turn it
// into a torch tensor. A sequence becomes a list of arrays, an empty optional None.
nb::object tensor_to_python(const Tensor& t);
// The same for a tensor the caller gives away: the array holds it without a copy (a Tensor copy
// is two allocations, on every output of every call).
nb::object tensor_to_python(Tensor&& t);

void bind_errors(nb::module_& m);
void bind_tensor(nb::module_& m);
void bind_graph(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_onnx(nb::module_& m);
void bind_device(nb::module_& m);
void bind_profiler(nb::module_& m);
void bind_serialize(nb::module_& m);

}  // namespace pto::python
