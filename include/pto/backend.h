// The execution contract between the runtime and the backends (DESIGN.md "The execution
// contract"; ggml's backend table is the model).
//
// A backend is a small interface: a name, the device it computes on, `supports(group)` and
// `compile(group)`, which turns a group of nodes (one kernel of the Kernel Graph) into a
// CompiledKernel. The runtime asks the registered backends in order and keeps the first that
// supports a group; the reference interpreter is one backend among them, last, so every
// single-node group has a kernel. The runtime includes no backend's private header.
//
// Buffers belong to the runtime: a kernel makes each output with Tensor::empty, and the runtime's
// allocator hands it the destination the memory plan chose for that output (src/runtime). An
// output may instead be a view of an input only for ops whose OpDef declares kView.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "pto/kernel_graph.h"
#include "pto/registry.h"

namespace pto {

// Thrown by a fused kernel, before it writes anything, when this run's concrete shapes do not
// fit what it was compiled for (an unknown dimension turned out to broadcast). The runtime then
// runs the group's nodes one by one, so the answer is always the unfused graph's.
class KernelDeclined : public std::exception {
 public:
  explicit KernelDeclined(std::string why) : why_(std::move(why)) {}
  const char* what() const noexcept override { return why_.c_str(); }

 private:
  std::string why_;
};

class CompiledKernel {
 public:
  virtual ~CompiledKernel() = default;
  // `inputs`: the group's inputs in KernelGroup::inputs order, contiguous. Returns the group's
  // outputs in KernelGroup::outputs order. Must be safe to call from several threads at once.
  virtual std::vector<Tensor> run(const std::vector<Tensor>& inputs) const = 0;
  // run() on inputs the caller lends: the kernel may move them into its work instead of copying
  // them (per call, a copy of a tensor is two allocations) and puts them back when it returns or
  // throws, so the caller keeps what it lent (a weight). The default copies: run(inputs).
  virtual std::vector<Tensor> run_taking(std::vector<Tensor>& inputs) const { return run(inputs); }
  // What `pto compile --dump-tiles` prints for it: the tile program, or "" for an opaque kernel.
  virtual std::string describe() const { return ""; }
  // The algorithm a call on inputs of these shapes runs, in one line (the profiler's tag is its
  // first word): `inputs` in KernelGroup::inputs order, -1 for a size not known. A kernel that
  // chooses by the sizes at run time says which it takes (ConvBlocked: Winograd from a batch on,
  // else direct); the default is describe() when that is one short line, else "".
  virtual std::string algorithm(const std::vector<Dims>& inputs) const;
  // Bytes held for the kernel's lifetime, e.g. weights packed into GEMM panels.
  virtual size_t prepared_bytes() const { return 0; }
  // Constant inputs (initializers among the group's inputs) the kernel copied at compile time
  // and never reads when it runs: the runtime may release the originals and then passes, in
  // their place, tensors with the shape and dtype but no data.
  virtual std::vector<ValueId> packed_constants() const { return {}; }
  // One of packed_constants() rebuilt from the kernel's copy, for running the group's nodes on
  // other kernels (after a KernelDeclined) or writing the graph out.
  virtual Tensor unpack_constant(ValueId v) const;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu", "reference", "cuda"
  virtual Device device() const = 0;
  // Whether compile() can build this group. Asked at compile time with inferred types.
  virtual bool supports(const Graph& g, const KernelGroup& group) const = 0;
  virtual std::unique_ptr<CompiledKernel> compile(const Graph& g,
                                                  const KernelGroup& group) const = 0;
};

class BackendRegistry {
 public:
  // The built-in backends in the order they are asked: cpu, then reference (src/backend).
  static BackendRegistry& global();
  void add(std::unique_ptr<Backend> backend);  // a second backend of the same name: InternalError
  const Backend* find(const std::string& name) const;
  std::vector<const Backend*> backends() const;  // in the order they are asked

 private:
  Registry<std::unique_ptr<Backend>> backends_{"backend"};
};

// For a node of a group: the position in group.inputs of each of the node's inputs (-1 for a
// missing optional input).
std::vector<int> node_input_slots(const Node& n, const KernelGroup& group);
// The node's inputs, in its own order, from the group's inputs (undefined where slots says -1).
std::vector<Tensor> gather_node_inputs(const std::vector<int>& slots,
                                       const std::vector<Tensor>& group_inputs);
// Whether the node reads the group's inputs as they are: slots 0, 1, ..., n-1 of n (a single
// node's group whose inputs are distinct), so run_taking can hand them over without gathering.
bool reads_in_order(const std::vector<int>& slots, size_t num_group_inputs);

}  // namespace pto
