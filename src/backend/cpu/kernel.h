// CPU kernels: what the Executable runs for each node (level 0 of DESIGN.md's backend contract).
//
// A kernel is registered per op with three parts:
//   accepts  — asked once at compile time with the node and its inferred input types; a kernel
//              that returns false (an unusual dtype or attribute) leaves the node to the reference
//              interpreter, which the plan records and `pto` reports;
//   prepare  — optional, also at compile time: work that depends only on the node and its constant
//              inputs (packing a weight matrix into GEMM panels), kept for every later run; a
//              kernel whose state holds the only copy it reads of a weight says so
//              (packed_inputs), and the runtime then releases the original;
//   run      — computes the outputs. Inputs are contiguous. Outputs are made with Tensor::empty,
//              which draws from the Executable's memory pool during a run, and may be views of an
//              input (Reshape) when the data is unchanged. Work is spread with pto::parallel_for.
#pragma once

#include <any>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cpu/gemm/gemm.h"
#include "backend/cpu/tile_kernel.h"
#include "pto/backend.h"
#include "pto/graph.h"
#include "pto/reference.h"
#include "pto/registry.h"

namespace pto::cpu {

// What accepts() and prepare() see.
struct NodeInfo {
  const Node& node;
  std::vector<TensorType> inputs;        // inferred types, DType::kUndefined where absent
  std::vector<const Tensor*> constants;  // an input's initializer, or nullptr
  std::vector<TensorType> outputs;
  const Knobs* knobs = nullptr;  // the group's knobs (KernelGroup::knobs), for prepare()

  // The values of knob `name`, or nullptr when it is not set.
  const std::vector<int64_t>* knob(const std::string& name) const {
    if (!knobs) return nullptr;
    auto it = knobs->find(name);
    return it == knobs->end() ? nullptr : &it->second;
  }
  bool is_constant(size_t i) const { return i < constants.size() && constants[i] != nullptr; }
  DType dtype(size_t i) const { return i < inputs.size() ? inputs[i].dtype : DType::kUndefined; }
};

// A norm's input 0 as a sum of operands (fusion/sum_norm.h, a kernel that takes_sums): the kernel
// adds them as it loads each row, in the graph's order, and writes the sums the group outputs.
struct FusedSum {
  // Per Add: its terms, >= 0 operands[t], < 0 the result of adds[-1 - t]; the last is input 0.
  struct Add {
    int lhs = 0, rhs = 0;
  };
  std::vector<Add> adds;
  // float32 operands, each of the sum's shape or a suffix of it covering the normalized axes
  // (read again every `numel / row` rows: position embeddings, a bias vector).
  std::vector<Tensor> operands;
  std::vector<Tensor> outputs;  // per Add: the sum's shape to store its result in, or undefined
  Dims shape;                   // the sum's shape
};

// What a fused group adds after a Conv, Gemm or MatMul (fusion/epilogue_chain.h), applied by the
// anchor's kernel to each output tile while it is in cache.
struct FusedEpilogue {
  Tensor bias;      // per output channel (Conv) or column (MatMul); undefined when none
  Tensor residual;  // the output's shape; undefined when none
  Activation act = Activation::kNone;
  float lo = 0.0f, hi = 0.0f;
  // Or a general elementwise chain as a tile program (MatMul/Gemm only; then the fields above are
  // unused): program input k >= 1 is tile_inputs[k - 1]; the GEMM kernel fills tile_operands.
  const TileKernel* tile = nullptr;
  std::vector<Tensor> tile_inputs;
  mutable std::vector<EpilogueOperand> tile_operands;
  // The dtype the result is stored in: bf16 or f16 when the group ends in a Cast (MatMul/Gemm:
  // GemmArgs::c_half; a kernel that takes_casts), else float32.
  DType store = DType::kF32;
  const FusedSum* sum = nullptr;  // a norm's input 0 as a sum (then inputs[0] is unused)
};

struct Epilogue;  // gemm/gemm.h

// A fused group's epilogue as the GEMM kernels take it, on an M x N product Y (rows of N):
// bias, residual and activation, or the tile program with its operands indexed from Y's rows
// (gemm/gemm_kernels.cpp; the int8 products use it too).
void apply_fused(const FusedEpilogue& f, const Tensor& Y, int64_t N, const std::string& where,
                 Epilogue& ep);

struct KernelContext : reference::KernelContext {
  const std::any* state = nullptr;          // what prepare() returned (empty std::any when none)
  const FusedEpilogue* epilogue = nullptr;  // set for the anchor of a fused group
  const Knobs* knobs = nullptr;             // the group's knobs (KernelGroup::knobs), checked
  template <class T>
  const T& prepared() const {
    return std::any_cast<const T&>(*state);
  }
  // What prepare() returned when it is a T, else nullptr (no prepare(), or a context made
  // without one).
  template <class T>
  const T* prepared_if() const {
    return state ? std::any_cast<T>(state) : nullptr;
  }
  // normalize_axis(axis, rank, where()) without building where() (an allocation, on every run)
  // unless the axis is out of range.
  int64_t axis(int64_t axis, int64_t rank) const {
    if (axis >= -rank && axis < rank) return axis < 0 ? axis + rank : axis;
    return normalize_axis(axis, rank, where());
  }
};

// A kernel's one output, moved in: `return {t}` copies t through an initializer list (two
// allocations for its shape and strides, on every run).
inline std::vector<Tensor> one(Tensor t) {
  std::vector<Tensor> out;
  out.push_back(std::move(t));
  return out;
}

struct Kernel {
  std::function<bool(const NodeInfo&)> accepts;      // empty: accepts every node of the op
  std::function<std::any(const NodeInfo&)> prepare;  // empty: nothing to prepare
  std::function<std::vector<Tensor>(const KernelContext&)> run;
  // run() hands some forms it only sees at run time (unusual input shapes) to the reference
  // kernel: said in the op coverage (pto ops, docs/op_coverage.md).
  bool reference_at_run_time = false;
  // run() also runs the node with the Casts around it (fusion/node_casts.h, rule
  // "Cast+LayerNormalization+Cast"): input 0 in bf16 or f16 where the widening Cast read it, and
  // its output stored in KernelContext::epilogue->store, computing in float32 between (norm.cpp).
  bool takes_casts = false;
  // run() also computes input 0 as KernelContext::epilogue->sum (fusion/sum_norm.h, rule
  // "Add+LayerNormalization"), float32, when accepts() takes the node (norm.cpp).
  bool takes_sums = false;
  // For a prepare() that copies constant inputs into its state (a weight packed into GEMM
  // panels): the node inputs run() then never reads, so the runtime may release the originals
  // and pass tensors without data in their place; the bytes the copies hold; and one original
  // rebuilt from its copy, for running the node on another kernel. Empty: nothing is copied.
  std::function<std::vector<size_t>(const std::any& state)> packed_inputs;
  std::function<size_t(const std::any& state)> packed_bytes;
  std::function<Tensor(const std::any& state, size_t input)> unpack;
  // The algorithm prepare() chose, for `pto compile --dump-tiles` and Executable::describe_step
  // (ConvBlocked: "direct" or "winograd F(4x4,3x3)"). Empty: nothing to say.
  std::function<std::string(const std::any& state)> describe;
  // The algorithm run() takes on node inputs of these shapes (-1: a size not known), for a kernel
  // that chooses by the sizes at run time (ConvBlocked: Winograd from a batch on): the
  // profiler's tag. Empty: describe() says it.
  std::function<std::string(const Node& node, const std::any& state,
                            const std::vector<Dims>& inputs)>
      algorithm;
  // The tuning knobs run() honours (KernelContext::knobs; docs/tuning.md "Knobs"): checks one
  // knob's values for the node, throwing ValueError naming `where` when they are invalid, and says
  // what it changes ("GEMM blocks KC 256, MC 96, NC 4096"). Empty: the kernel takes no knobs.
  std::function<std::string(const NodeInfo& node, const std::string& knob,
                            const std::vector<int64_t>& values, const std::string& where)>
      check_knob;
};

class KernelRegistry {
 public:
  static KernelRegistry& global();            // every CPU kernel, registered on first use
  void add(const std::string& op, Kernel k);  // a second kernel for an op is an InternalError
  const Kernel* find(std::string_view op) const { return kernels_.find(op); }
  std::vector<std::string> names() const { return kernels_.names(); }  // sorted

 private:
  Registry<Kernel> kernels_{"CPU kernel"};
};

// Runs the node's reference kernel: for forms a CPU kernel finds unusual only at run time.
std::vector<Tensor> run_reference(const KernelContext& c);

// A MatMul, Gemm or Conv node's precision attribute as the GEMM's (gemm_kernels.cpp): absent is
// fp32, "bf16x3" on a MatMul or Gemm kBF16x3; nullopt for anything but those, "bf16" and "f16"
// (the kernel declines; the reference says what is wrong).
std::optional<Precision> precision_of(const Node& n);

// Kernel families register themselves through these (explicit calls, as for the reference).
void register_gemm_kernels(KernelRegistry& r);          // gemm/: MatMul, Gemm
void register_gather_matmul_kernel(KernelRegistry& r);  // gemm/gather_matmul.cpp
void register_conv_kernels(KernelRegistry& r);          // conv/: Conv, ConvTranspose, Col2Im
void register_elementwise_kernels(KernelRegistry& r);   // elementwise: unary, binary, Where, Cast
void register_reduce_kernels(KernelRegistry& r);        // reduce: Reduce*, Softmax, norms, pooling
void register_movement_kernels(KernelRegistry& r);      // movement: Transpose, Gather, Concat, ...
void register_attention_kernels(KernelRegistry& r);     // attention: Attention (4-D, float32)
void register_quant_kernels(KernelRegistry& r);  // quant_kernels: MatMulInteger, QLinearMatMul, ...
void register_generate_kernels(KernelRegistry& r);   // generate: Range, ConstantOfShape, Shape, ...
void register_resize_kernels(KernelRegistry& r);     // resize: Resize, Upsample
void register_recurrent_kernels(KernelRegistry& r);  // recurrent: RNN, GRU, LSTM (float32)
// linear_attention: LinearAttention, CausalConvWithState (float32)
void register_linear_attention_kernels(KernelRegistry& r);
void register_topk_kernels(KernelRegistry& r);         // topk: TopK
void register_grid_sample_kernels(KernelRegistry& r);  // grid_sample: GridSample
// axis_ops: MeanVarianceNormalization, LpNormalization, LRN, Hardmax, Trilu
void register_axis_kernels(KernelRegistry& r);
void register_detect_kernels(KernelRegistry& r);  // detect: NonMaxSuppression, RoiAlign
void register_nbits_kernels(KernelRegistry& r);   // nbits_kernels: MatMulNBits
void register_dft_kernels(KernelRegistry& r);     // dft: DFT, STFT (float32)

// The CPU backend (backend.cpp): single nodes on the kernels above, and fused groups.
std::unique_ptr<Backend> make_backend();

}  // namespace pto::cpu
