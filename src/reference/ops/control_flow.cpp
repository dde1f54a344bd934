// Control flow: If runs the branch cond chooses, Loop and Scan run their body once per
// iteration. A node's last inputs are the captures (ir/ops/control_flow.h), passed on as the
// subgraph's last inputs. run_control_flow takes what runs a subgraph: the reference kernels
// below pass reference::run, the Executable its compiled subgraphs (src/runtime), so both follow
// this one reading of the ONNX semantics. A Scan offers the body, from its second iteration on,
// the slices of the stacked outputs it fills (pto/control_flow_runner.h): a compiled body writes
// there, and only what it did not write is copied.
#include <cstring>
#include <limits>

#include "ir/ops/control_flow.h"
#include "kernel_util.h"
#include "pto/control_flow_runner.h"

namespace pto::reference {
namespace {

// A single-element tensor as a truth value (a bool, or any number: nonzero is true).
bool truth(const Tensor& t, const std::string& where, const char* what) {
  if (t.numel() != 1)
    throw ValueError(cat(where, ": ", what, " should have one element, got ", dims_str(t.shape())));
  bool v = false;
  dispatch(t.dtype(), kAllTypes, what, [&]<class T>() { v = t.data<T>()[0] != T{}; });
  return v;
}

std::vector<Tensor> tail(const std::vector<Tensor>& v, size_t from) {
  return std::vector<Tensor>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end());
}

// x[..., i, ...] along `axis`, one rank less: a view of x where that is contiguous (a slice along
// axis 0, every scan step of the usual layout), else a packed copy (made once, not by each
// reader of it in the subgraph).
Tensor take(const Tensor& x, int64_t axis, int64_t i) {
  Dims shape = x.shape(), strides = x.strides();
  const int64_t offset = i * strides[axis];
  shape.erase(shape.begin() + axis);
  strides.erase(strides.begin() + axis);
  Tensor v = x.view(std::move(shape), std::move(strides), offset);
  return v.is_contiguous() ? v : v.clone();
}

// Copies `part` to out[..., i, ...] along `axis` (out's other dims are part's).
void put(const Tensor& out, int64_t axis, int64_t i, const Tensor& part) {
  const Tensor packed = part.is_contiguous() ? Tensor() : part.clone();
  const Tensor& c = packed.defined() ? packed : part;
  const int64_t n = out.shape()[axis];
  const auto [outer, inner] = split_at(out.shape(), axis, dtype_size(out.dtype()));
  char* dst = static_cast<char*>(out.raw_data());
  const char* src = static_cast<const char*>(c.raw_data());
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + (o * n + i) * inner, src + o * inner, inner);
}

// `length` parts (all of one dtype and shape) stacked along a new `axis` (of the stacked rank) as
// they come: the stacked tensor is made at the first part, and each part is copied to its place
// at once, so no part outlives its iteration (its buffer goes back to the pool for the next
// one). With no parts, the result has `fallback`'s dtype and static shape (the subgraph output's
// declared type).
class Stacker {
 public:
  Stacker(int64_t length, int64_t axis, const TensorType& fallback, std::string where)
      : length_(length), axis_(axis), fallback_(fallback), where_(std::move(where)) {}

  // Whether the body may write the parts in place (slot), decided at the first part (its shape
  // makes the stacked tensor): where a part's place is contiguous (the stacking axis is 0, or
  // every dim before it is 1) and it has at least kInPlaceBytes. Below that size the copy costs
  // less than passing the view (callgrind, scan_tiny: ~2.4K instructions a step for 4 bytes).
  static constexpr size_t kInPlaceBytes = 4096;
  bool in_place() const { return in_place_; }

  // out[..., i, ...], a view of the stacked tensor, where in_place(); else undefined.
  Tensor slot(int64_t i) const {
    if (!in_place_) return Tensor();
    Dims shape = out_.shape(), strides = out_.strides();
    shape.erase(shape.begin() + axis_);
    strides.erase(strides.begin() + axis_);
    return out_.view(std::move(shape), std::move(strides), i * out_.strides()[axis_]);
  }

  // Whether t lies in the stacked tensor (a body output written in place, or a view of one).
  bool holds(const Tensor& t) const {
    if (!out_.defined() || !t.is_tensor() || !t.defined()) return false;
    const auto* p = static_cast<const std::byte*>(t.raw_data());
    const auto* base = static_cast<const std::byte*>(out_.raw_data());
    return p >= base && p < base + out_.nbytes();
  }

  void add(int64_t i, const Tensor& part) {
    if (!part.is_tensor()) throw UnsupportedError(cat(where_, ": a scan output is ", part.str()));
    if (!out_.defined()) {
      Dims shape = part.shape();
      axis_ = normalize_axis(axis_, part.rank() + 1, where_);
      shape.insert(shape.begin() + axis_, length_);
      out_ = Tensor::empty(part.dtype(), shape);
      first_ = part.shape();
      in_place_ = part.nbytes() >= kInPlaceBytes;
      for (int64_t d = 0; d < axis_; ++d) in_place_ = in_place_ && shape[d] == 1;
    } else if (part.shape() != first_ || part.dtype() != out_.dtype()) {
      throw ValueError(cat(where_, ": a scan output is ", dtype_name(part.dtype()),
                           dims_str(part.shape()), " in one iteration and ",
                           dtype_name(out_.dtype()), dims_str(first_), " in another"));
    }
    // Written in place: the body's kernel made it in slot(i).
    if (in_place_ && part.is_contiguous() && part.raw_data() == slot_data(i)) return;
    put(out_, axis_, i, part);
  }

  // With no part, the declared type's dims that are not known (the model's symbols) are 0, as
  // onnxruntime makes them: a Loop of zero trips over a [T, N, H] scan output gives [0, 0, H].
  Tensor result() const {
    if (out_.defined()) return out_;
    if (fallback_.dtype == DType::kUndefined || !fallback_.shape)
      throw ValueError(cat(where_, ": no iteration ran, and the rank of a scan output (",
                           fallback_.str(), ") is not known"));
    Dims shape;
    for (const Dim& d : *fallback_.shape) shape.push_back(d.is_known() ? d.value : 0);
    const auto rank = static_cast<int64_t>(shape.size()) + 1;
    shape.insert(shape.begin() + normalize_axis(axis_, rank, where_), 0);
    return Tensor::empty(fallback_.dtype, shape);
  }

 private:
  int64_t length_, axis_;
  TensorType fallback_;
  std::string where_;
  const void* slot_data(int64_t i) const {
    return static_cast<const std::byte*>(out_.raw_data()) +
           i * out_.strides()[axis_] * static_cast<int64_t>(dtype_size(out_.dtype()));
  }

  Tensor out_;
  Dims first_;  // the first part's shape
  bool in_place_ = false;
};

// The parts stacked along a new `axis`, as Stacker does.
Tensor stack(const std::vector<Tensor>& parts, int64_t axis, const TensorType& fallback,
             const std::string& where) {
  Stacker s(static_cast<int64_t>(parts.size()), axis, fallback, where);
  for (size_t i = 0; i < parts.size(); ++i) s.add(static_cast<int64_t>(i), parts[i]);
  return s.result();
}

const TensorType& output_type(const Graph& g, size_t i) {
  return g.value(g.outputs()[i]).type;
}

std::vector<Tensor> run_if(const KernelContext& c, const SubgraphRunnerInto& run_sub) {
  const bool cond = truth(c.input(0), c.where(), "cond");
  return run_sub(cond ? "then_branch" : "else_branch", tail(c.inputs, 1), {});
}

std::vector<Tensor> run_loop(const KernelContext& c, const SubgraphRunnerInto& run_sub) {
  const control_flow::Arity a = control_flow::loop_arity(c.node);
  const Graph& body = c.attrs().get_graph("body");
  int64_t trips = std::numeric_limits<int64_t>::max();
  if (c.has_input(0)) {
    const Tensor m = c.input(0);
    if (m.numel() != 1 || m.dtype() != DType::kI64)
      throw ValueError(cat(c.where(), ": M should be one int64, got ", m.str()));
    trips = m.data<int64_t>()[0];
  }
  bool cond = !c.has_input(1) || truth(c.input(1), c.where(), "cond");
  if (!c.has_input(0) && !c.has_input(1))
    throw UnsupportedError(cat(c.where(), ": a Loop without M and cond never ends"));
  std::vector<Tensor> carried(c.inputs.begin() + 2,
                              c.inputs.begin() + 2 + static_cast<std::ptrdiff_t>(a.carried));
  const std::vector<Tensor> captures = tail(c.inputs, 2 + a.carried);
  std::vector<std::vector<Tensor>> scans(a.scan_outputs);
  // The body's inputs: the iteration number, cond, the carried values (moved in: each is
  // replaced by the body's output), the captures (set once).
  std::vector<Tensor> in(2 + a.carried);
  in.insert(in.end(), captures.begin(), captures.end());
  for (int64_t i = 0; i < trips && cond; ++i) {
    in[0] = Tensor::scalar<int64_t>(i);
    in[1] = Tensor::scalar<bool>(cond);
    for (size_t k = 0; k < a.carried; ++k) in[2 + k] = std::move(carried[k]);
    std::vector<Tensor> out = run_sub("body", in, {});
    cond = truth(out[0], c.where(), "the body's cond");
    for (size_t k = 0; k < a.carried; ++k) carried[k] = std::move(out[1 + k]);
    for (size_t k = 0; k < a.scan_outputs; ++k)
      scans[k].push_back(std::move(out[1 + a.carried + k]));
  }
  std::vector<Tensor> outs = std::move(carried);
  for (size_t k = 0; k < a.scan_outputs; ++k)
    outs.push_back(stack(scans[k], 0, output_type(body, 1 + a.carried + k), c.where()));
  return outs;
}

// One scan over axis in_axes[i] of each scan input (opset 9+ semantics).
std::vector<Tensor> scan(const KernelContext& c, const SubgraphRunnerInto& run_sub,
                         const control_flow::Arity& a, std::vector<Tensor> states,
                         const std::vector<Tensor>& scan_inputs,
                         const std::vector<Tensor>& captures) {
  const Graph& body = c.attrs().get_graph("body");
  std::vector<int64_t> in_ranks, out_ranks;
  for (const Tensor& t : scan_inputs) in_ranks.push_back(t.rank());
  for (size_t k = 0; k < a.scan_outputs; ++k) {
    const TensorType& t = output_type(body, a.carried + k);
    out_ranks.push_back(t.shape ? static_cast<int64_t>(t.shape->size()) + 1 : -1);
  }
  const control_flow::ScanAxes axes = control_flow::scan_axes(c.node, in_ranks, out_ranks);
  const int64_t length = scan_inputs[0].shape()[axes.in_axes[0]];
  for (size_t i = 0; i < scan_inputs.size(); ++i)
    if (scan_inputs[i].shape()[axes.in_axes[i]] != length)
      throw ValueError(cat(c.where(), ": scan input ", i, " has ",
                           scan_inputs[i].shape()[axes.in_axes[i]], " steps, scan input 0 ",
                           length));
  std::vector<Stacker> stacked;
  for (size_t k = 0; k < a.scan_outputs; ++k)
    stacked.emplace_back(length, axes.out_axes[k], output_type(body, a.carried + k), c.where());
  // The body's inputs: the states, this iteration's slices, the captures (set once); its
  // destinations: none for the states, the stacked outputs' slices of this iteration.
  std::vector<Tensor> in(a.carried + scan_inputs.size());
  in.insert(in.end(), captures.begin(), captures.end());
  std::vector<Tensor> dests;
  auto out_index = [&](size_t k, int64_t t) { return axes.out_reverse[k] ? length - 1 - t : t; };
  for (int64_t t = 0; t < length; ++t) {
    for (size_t k = 0; k < a.carried; ++k) in[k] = std::move(states[k]);
    for (size_t i = 0; i < scan_inputs.size(); ++i)
      in[a.carried + i] =
          take(scan_inputs[i], axes.in_axes[i], axes.in_reverse[i] ? length - 1 - t : t);
    if (t == 1)  // the stacked tensors exist now: does any take its parts in place?
      for (size_t k = 0; k < a.scan_outputs; ++k)
        if (stacked[k].in_place()) dests.resize(a.carried + a.scan_outputs);
    for (size_t k = 0; k < a.scan_outputs && !dests.empty(); ++k)
      dests[a.carried + k] = stacked[k].slot(out_index(k, t));
    std::vector<Tensor> out = run_sub("body", in, dests);
    for (size_t k = 0; k < a.carried; ++k) states[k] = std::move(out[k]);
    for (size_t k = 0; k < a.scan_outputs; ++k) stacked[k].add(out_index(k, t), out[a.carried + k]);
  }
  // A final state the body wrote into a stacked output is a view of it: the node's outputs do
  // not share memory.
  for (Tensor& s : states)
    for (const Stacker& st : stacked)
      if (st.holds(s)) s = s.clone();
  std::vector<Tensor> outs = std::move(states);
  for (const Stacker& s : stacked) outs.push_back(s.result());
  return outs;
}

std::vector<Tensor> run_scan(const KernelContext& c, const SubgraphRunnerInto& run_sub) {
  const control_flow::Arity a = control_flow::scan_arity(c.node);
  const bool v8 = c.node.opset != 0 && c.node.opset < 9;
  const size_t first = v8 ? 1 : 0;
  std::vector<Tensor> states(c.inputs.begin() + static_cast<std::ptrdiff_t>(first),
                             c.inputs.begin() + static_cast<std::ptrdiff_t>(first + a.carried));
  std::vector<Tensor> scan_inputs(
      c.inputs.begin() + static_cast<std::ptrdiff_t>(first + a.carried),
      c.inputs.begin() + static_cast<std::ptrdiff_t>(first + a.carried + a.scan_inputs));
  const std::vector<Tensor> captures = tail(c.inputs, first + a.carried + a.scan_inputs);
  if (!v8) return scan(c, run_sub, a, std::move(states), scan_inputs, captures);
  // Opset 8: axis 0 is a batch; each batch entry scans along its axis 0 (the input's axis 1).
  const int64_t batch = scan_inputs[0].shape()[0];
  if (c.has_input(0)) {
    const Tensor lens = c.input(0);
    for (int64_t b = 0; b < lens.numel(); ++b)
      if (lens.dtype() != DType::kI32 || lens.data<int32_t>()[b] != scan_inputs[0].shape()[1])
        throw UnsupportedError(cat(c.where(), ": sequence_lens shorter than the scan inputs"));
  }
  std::vector<std::vector<Tensor>> per_output(c.num_outputs);
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Tensor> s, x;
    for (const Tensor& t : states) s.push_back(take(t, 0, b));
    for (const Tensor& t : scan_inputs) x.push_back(take(t, 0, b));
    std::vector<Tensor> out = scan(c, run_sub, a, std::move(s), x, captures);
    for (size_t o = 0; o < out.size(); ++o) per_output[o].push_back(std::move(out[o]));
  }
  std::vector<Tensor> outs;
  for (size_t o = 0; o < per_output.size(); ++o)
    outs.push_back(stack(per_output[o], 0, TensorType{}, c.where()));
  return outs;
}

// SequenceMap: the body on element i of every sequence input (other inputs whole), each body
// output collected into a sequence. The sequences must have the same length.
std::vector<Tensor> run_sequence_map(const KernelContext& c, const SubgraphRunnerInto& run_sub) {
  const Graph& body = c.attrs().get_graph("body");
  const size_t formal = c.inputs.size() - static_cast<size_t>(body.num_captures);
  const Tensor& first = c.input(0);
  if (first.kind() != ValueKind::kSequence)
    throw ValueError(cat(c.where(), ": input 0 should be a sequence, got ", first.str()));
  const size_t length = first.items().size();
  for (size_t k = 1; k < formal; ++k)
    if (c.input(k).kind() == ValueKind::kSequence && c.input(k).items().size() != length)
      throw ValueError(cat(c.where(), ": input ", k, " has ", c.input(k).items().size(),
                           " elements, input 0 ", length));
  std::vector<std::vector<Tensor>> outs(c.num_outputs);
  for (size_t i = 0; i < length; ++i) {
    std::vector<Tensor> in = c.inputs;
    for (size_t k = 0; k < formal; ++k)
      if (in[k].kind() == ValueKind::kSequence) in[k] = in[k].items()[i];
    std::vector<Tensor> out = run_sub("body", in, {});
    for (size_t o = 0; o < out.size(); ++o) outs[o].push_back(std::move(out[o]));
  }
  std::vector<Tensor> result;
  for (auto& o : outs) result.push_back(Tensor::sequence(std::move(o)));
  return result;
}

// run_sub with its errors naming node n and the subgraph ("[Scan] node 's': subgraph 'body':
// [Add] node 'a': ..."): a body's node alone does not say where it is.
SubgraphRunnerInto naming(const Node& n, const SubgraphRunnerInto& run_sub) {
  return [&n, run_sub](const std::string& attr, const std::vector<Tensor>& in,
                       const std::vector<Tensor>& dests) {
    try {
      return run_sub(attr, in, dests);
    } catch (const Error&) {
      rethrow_with(cat(n.where(), ": subgraph '", attr, "': "));
    }
  };
}

// The reference kernel of a control-flow op: its subgraphs on the interpreter (which writes no
// destination; the scan copies).
Kernel interpreted(std::vector<Tensor> (*op)(const KernelContext&, const SubgraphRunnerInto&)) {
  return [op](const KernelContext& c) {
    return op(c, naming(c.node, [&](const std::string& attr, const std::vector<Tensor>& in,
                                    const std::vector<Tensor>&) {
                return reference::run(c.attrs().get_graph(attr), in);
              }));
  };
}

}  // namespace

std::vector<Tensor> run_control_flow(const Node& n, std::vector<Tensor> inputs,
                                     const SubgraphRunner& run_sub) {
  return run_control_flow_into(n, std::move(inputs),
                               [&](const std::string& attr, const std::vector<Tensor>& in,
                                   const std::vector<Tensor>&) { return run_sub(attr, in); });
}

std::vector<Tensor> run_control_flow_into(const Node& n, std::vector<Tensor> inputs,
                                          const SubgraphRunnerInto& run_sub) {
  const KernelContext c{n, std::move(inputs), n.outputs.size()};
  const SubgraphRunnerInto named = naming(n, run_sub);
  if (n.op == "If") return run_if(c, named);
  if (n.op == "Loop") return run_loop(c, named);
  if (n.op == "Scan") return run_scan(c, named);
  if (n.op == "SequenceMap") return run_sequence_map(c, named);
  throw InternalError(cat(n.where(), ": run_control_flow: not a control-flow op"));
}

void register_control_flow_kernels(KernelRegistry& r) {
  r.add("If", interpreted(run_if));
  r.add("Loop", interpreted(run_loop));
  r.add("Scan", interpreted(run_scan));
  r.add("SequenceMap", interpreted(run_sequence_map));
}

}  // namespace pto::reference
