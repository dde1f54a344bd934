// Reference Einsum: one odometer over every label (output labels outermost, summed labels
// innermost), each operand's offset advanced by its per-label stride. Repeated labels within an
// operand add their strides (a diagonal); a size-1 axis broadcasts with stride 0.
#include "ir/ops/einsum_equation.h"
#include "nn_kernels.h"

namespace pto::reference {
namespace {

template <class V>
Tensor einsum_typed(const KernelContext& c, const einsum::Equation& e,
                    const std::vector<int64_t>& size) {
  const std::string w = c.where();
  const size_t nops = c.inputs.size();
  // Every label, output labels first.
  std::vector<int> labels = e.output;
  std::vector<bool> used(einsum::kMaxLabels, false);
  for (int l : labels) used[l] = true;
  for (const auto& in : e.inputs)
    for (int l : in)
      if (!used[l]) {
        used[l] = true;
        labels.push_back(l);
      }
  const size_t L = labels.size(), nout = e.output.size();
  Dims dims(L), yshape(nout);
  for (size_t j = 0; j < L; ++j) dims[j] = size[labels[j]];
  for (size_t j = 0; j < nout; ++j) yshape[j] = dims[j];
  const int64_t out_count = checked_numel(yshape, w.c_str());
  const int64_t sum_count = checked_numel(Dims(dims.begin() + nout, dims.end()), w.c_str());
  if (out_count > 0 && sum_count > (int64_t{1} << 62) / out_count)
    throw ValueError(cat(w, ": einsum iteration space is too large"));

  // strides[op][j]: how far operand op's offset moves when label j advances.
  std::vector<std::vector<int64_t>> strides(nops, std::vector<int64_t>(L, 0));
  std::vector<std::vector<V>> vals;
  for (size_t op = 0; op < nops; ++op) {
    const Tensor& t = c.inputs[op];
    if (t.numel() == 0) {  // nothing to iterate; skip strides of possibly huge empty shapes
      vals.emplace_back();
      continue;
    }
    const Dims st = contiguous_strides(t.shape());
    for (size_t a = 0; a < e.inputs[op].size(); ++a) {
      if (t.dim(static_cast<int64_t>(a)) == 1 && size[e.inputs[op][a]] != 1) continue;
      for (size_t j = 0; j < L; ++j)
        if (labels[j] == e.inputs[op][a]) strides[op][j] += st[a];
    }
    vals.push_back(values_as<V>(t, w));
  }

  std::vector<V> y(static_cast<size_t>(out_count), V(0));
  if (out_count == 0 || sum_count == 0 || L == 0) {
    if (L == 0 && out_count == 1) {  // every operand is a scalar
      V prod = V(1);
      for (size_t op = 0; op < nops; ++op) prod *= vals[op][0];
      y[0] = prod;
    }
    return tensor_from(c.inputs[0].dtype(), yshape, y, w);
  }
  // The odometer walks every label but the last; the last one runs as a tight inner loop. When it
  // is a summed label the run adds into one result, otherwise each step is its own result.
  const size_t last = L - 1;
  const int64_t run = dims[last];
  const bool last_summed = last >= nout;
  std::vector<int64_t> step(nops);
  for (size_t op = 0; op < nops; ++op) step[op] = strides[op][last];
  const int64_t outer = out_count * sum_count / run;
  Dims idx(L, 0);
  std::vector<int64_t> off(nops, 0);
  for (int64_t it = 0; it < outer; ++it) {
    const int64_t flat = it * run;  // iteration index of the run's first element
    if (last_summed) {
      V acc = V(0);
      if (nops == 2) {
        const V *a = vals[0].data() + off[0], *b = vals[1].data() + off[1];
        for (int64_t r = 0; r < run; ++r) acc += a[r * step[0]] * b[r * step[1]];
      } else {
        for (int64_t r = 0; r < run; ++r) {
          V prod = V(1);
          for (size_t op = 0; op < nops; ++op) prod *= vals[op][off[op] + r * step[op]];
          acc += prod;
        }
      }
      y[flat / sum_count] += acc;
    } else {
      for (int64_t r = 0; r < run; ++r) {
        V prod = V(1);
        for (size_t op = 0; op < nops; ++op) prod *= vals[op][off[op] + r * step[op]];
        y[flat + r] += prod;  // no summed labels: iteration index == output index
      }
    }
    for (size_t j = last; j-- > 0;) {
      for (size_t op = 0; op < nops; ++op) off[op] += strides[op][j];
      if (++idx[j] < dims[j]) break;
      for (size_t op = 0; op < nops; ++op) off[op] -= strides[op][j] * dims[j];
      idx[j] = 0;
    }
  }
  return tensor_from(c.inputs[0].dtype(), yshape, y, w);
}

std::vector<Tensor> einsum_kernel(const KernelContext& c) {
  const std::string w = c.where();
  if (c.inputs.empty()) throw ValueError(cat(w, ": needs at least one input"));
  std::vector<int64_t> ranks;
  std::vector<Dims> shapes;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& t = c.input(i);
    if (t.dtype() != c.inputs[0].dtype())
      throw TypeError(cat(w, ": all inputs must share a dtype"));
    ranks.push_back(t.rank());
    shapes.push_back(t.shape());
  }
  const einsum::Equation e = einsum::parse(c.attrs().get_string("equation"), ranks, w);
  const std::vector<int64_t> size = einsum::label_sizes(e, shapes, w);
  const DType dt = c.inputs[0].dtype();
  if (is_floating(dt)) return {einsum_typed<double>(c, e, size)};
  if (is_integral(dt)) return {einsum_typed<uint64_t>(c, e, size)};
  throw_unsupported_dtype(dt, w);
}

}  // namespace

void register_einsum_kernels(KernelRegistry& r) {
  r.add("Einsum", einsum_kernel);
}

}  // namespace pto::reference
