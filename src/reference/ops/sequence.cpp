// Reference kernels for sequences and optionals (ir/ops/sequence.cpp). A sequence is a Tensor
// holding its elements (Tensor::sequence), an empty optional Tensor::none(), and an optional that
// holds a value is that value; elements are shared between sequences, never copied, as no kernel
// writes into its inputs.
#include <algorithm>
#include <cstring>

#include "kernel_util.h"

namespace pto::reference {
namespace {

const std::vector<Tensor>& sequence_input(const KernelContext& c, size_t i) {
  const Tensor& s = c.input(i);
  if (s.kind() != ValueKind::kSequence)
    throw ValueError(cat(c.where(), ": input ", i, " should be a sequence, got ", s.str()));
  return s.items();
}

const Tensor& tensor_input(const KernelContext& c, size_t i) {
  const Tensor& t = c.input(i);
  if (!t.is_tensor())
    throw ValueError(cat(c.where(), ": input ", i, " should be a tensor, got ", t.str()));
  return t;
}

// Input i (a scalar or one-element integer tensor) as a position in a sequence of `size`
// elements, negative counting from the end; `end_ok`: `size` itself is allowed (SequenceInsert).
size_t position(const KernelContext& c, size_t i, size_t size, bool end_ok) {
  const std::vector<int64_t> p = to_int64s(tensor_input(c, i), c.where());
  if (p.size() != 1)
    throw ValueError(cat(c.where(), ": position should be one integer, got ", p.size()));
  const auto n = static_cast<int64_t>(size);
  const int64_t at = p[0] < 0 ? p[0] + n : p[0];
  if (at < 0 || at > n || (at == n && !end_ok))
    throw ValueError(
        cat(c.where(), ": position ", p[0], " is outside a sequence of ", n, " elements"));
  return static_cast<size_t>(at);
}

std::vector<Tensor> sequence_empty(const KernelContext&) {
  return {Tensor::sequence({})};
}

std::vector<Tensor> sequence_construct(const KernelContext& c) {
  std::vector<Tensor> items;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    items.push_back(tensor_input(c, i));
    if (items[i].dtype() != items[0].dtype())
      throw ValueError(cat(c.where(), ": input ", i, " is ", items[i].str(), ", input 0 ",
                           items[0].str(), " (a sequence holds one dtype)"));
  }
  return {Tensor::sequence(std::move(items))};
}

std::vector<Tensor> sequence_at(const KernelContext& c) {
  const std::vector<Tensor>& s = sequence_input(c, 0);
  return {s[position(c, 1, s.size(), false)]};
}

std::vector<Tensor> sequence_insert(const KernelContext& c) {
  std::vector<Tensor> s = sequence_input(c, 0);
  const Tensor& x = tensor_input(c, 1);
  if (!s.empty() && x.dtype() != s[0].dtype())
    throw ValueError(
        cat(c.where(), ": inserts ", x.str(), " into a sequence of ", dtype_name(s[0].dtype())));
  const size_t at = c.has_input(2) ? position(c, 2, s.size(), true) : s.size();
  s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), x);
  return {Tensor::sequence(std::move(s))};
}

std::vector<Tensor> sequence_erase(const KernelContext& c) {
  std::vector<Tensor> s = sequence_input(c, 0);
  if (s.empty()) throw ValueError(cat(c.where(), ": erases from an empty sequence"));
  const size_t at = c.has_input(1) ? position(c, 1, s.size(), false) : s.size() - 1;
  s.erase(s.begin() + static_cast<std::ptrdiff_t>(at));
  return {Tensor::sequence(std::move(s))};
}

std::vector<Tensor> sequence_length(const KernelContext& c) {
  return {Tensor::scalar<int64_t>(static_cast<int64_t>(sequence_input(c, 0).size()))};
}

// x[..., start:start + len, ...] along `axis`, as a new contiguous tensor.
Tensor slice_axis(const Tensor& x, int64_t axis, int64_t start, int64_t len) {
  Dims shape = x.shape();
  const int64_t n = shape[axis];
  shape[axis] = len;
  Tensor out = Tensor::empty(x.dtype(), shape);
  const auto [outer, inner] = split_at(x.shape(), axis, x.itemsize());
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  const size_t row = inner * static_cast<size_t>(len);
  for (int64_t o = 0; o < outer && row > 0; ++o)
    std::memcpy(dst + o * row, src + (o * n + start) * inner, row);
  return out;
}

std::vector<Tensor> split_to_sequence(const KernelContext& c) {
  const Tensor& x = tensor_input(c, 0);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), x.rank(), c.where());
  const int64_t n = x.shape()[axis];
  std::vector<int64_t> sizes;
  if (!c.has_input(1)) {
    sizes.assign(static_cast<size_t>(n), 1);
  } else if (const Tensor& split = tensor_input(c, 1); split.rank() == 0) {
    const int64_t chunk = to_int64s(split, c.where())[0];
    if (chunk <= 0) throw ValueError(cat(c.where(), ": split ", chunk, " should be positive"));
    for (int64_t at = 0; at < n; at += chunk) sizes.push_back(std::min(chunk, n - at));
  } else {
    sizes = to_int64s(split, c.where());
    int64_t sum = 0;
    for (int64_t s : sizes) {
      if (s < 0) throw ValueError(cat(c.where(), ": split has a negative size ", s));
      sum += s;
    }
    if (sum != n)
      throw ValueError(
          cat(c.where(), ": split sizes add up to ", sum, ", axis ", axis, " has ", n));
  }
  // keepdims=0 drops the axis, and applies only where no split is given (parts of size 1).
  const bool squeeze = !c.has_input(1) && c.node.attr_int("keepdims") == 0;
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t len : sizes) {
    Tensor part = slice_axis(x, axis, start, len);
    if (squeeze) {
      Dims shape = part.shape();
      shape.erase(shape.begin() + axis);
      part = part.reshape(shape);
    }
    parts.push_back(std::move(part));
    start += len;
  }
  return {Tensor::sequence(std::move(parts))};
}

std::vector<Tensor> concat_from_sequence(const KernelContext& c) {
  const std::vector<Tensor>& s = sequence_input(c, 0);
  if (s.empty())
    throw ValueError(cat(c.where(), ": concatenates an empty sequence (no dtype or shape)"));
  const bool new_axis = c.node.attr_int("new_axis") != 0;
  // Stacking is concatenation of the elements with a 1 inserted at `axis`.
  const int64_t rank = s[0].rank() + (new_axis ? 1 : 0);
  const int64_t axis = normalize_axis(c.node.attr_int("axis"), rank, c.where());
  std::vector<Tensor> parts;
  for (const Tensor& t : s) {
    Dims shape = t.shape();
    if (new_axis) shape.insert(shape.begin() + axis, 1);
    parts.push_back(t.reshape(shape));
  }
  Dims out_shape = parts[0].shape();
  out_shape[axis] = 0;
  for (const Tensor& p : parts) {
    Dims want = parts[0].shape();
    want[axis] = p.shape()[axis];
    if (p.dtype() != parts[0].dtype() || p.shape() != want)
      throw ValueError(cat(c.where(), ": cannot concatenate ", p.str(), " with ", parts[0].str(),
                           " along axis ", axis));
    out_shape[axis] += p.shape()[axis];
  }
  Tensor out = Tensor::empty(parts[0].dtype(), out_shape);
  const auto [outer, inner] = split_at(out_shape, axis, out.itemsize());
  const size_t out_row = inner * static_cast<size_t>(out_shape[axis]);
  char* dst = static_cast<char*>(out.raw_data());
  size_t offset = 0;
  for (const Tensor& p : parts) {
    const size_t row = inner * static_cast<size_t>(p.shape()[axis]);
    const char* src = static_cast<const char*>(p.raw_data());
    for (int64_t o = 0; o < outer && row > 0; ++o)
      std::memcpy(dst + o * out_row + offset, src + o * row, row);
    offset += row;
  }
  return {out};
}

std::vector<Tensor> optional(const KernelContext& c) {
  return {c.has_input(0) ? c.inputs[0] : Tensor::none()};
}

std::vector<Tensor> optional_has_element(const KernelContext& c) {
  return {Tensor::scalar<bool>(c.has_input(0) && c.inputs[0].kind() != ValueKind::kNone)};
}

std::vector<Tensor> optional_get_element(const KernelContext& c) {
  if (c.input(0).kind() == ValueKind::kNone)
    throw ValueError(cat(c.where(), ": the optional is empty"));
  return {c.inputs[0]};
}

}  // namespace

void register_sequence_kernels(KernelRegistry& r) {
  r.add("SequenceEmpty", sequence_empty);
  r.add("SequenceConstruct", sequence_construct);
  r.add("SequenceAt", sequence_at);
  r.add("SequenceInsert", sequence_insert);
  r.add("SequenceErase", sequence_erase);
  r.add("SequenceLength", sequence_length);
  r.add("SplitToSequence", split_to_sequence);
  r.add("ConcatFromSequence", concat_from_sequence);
  r.add("Optional", optional);
  r.add("OptionalHasElement", optional_has_element);
  r.add("OptionalGetElement", optional_get_element);
}

}  // namespace pto::reference
