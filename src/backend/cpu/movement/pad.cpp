// Pad on the CPU. The reference's pad_plan reads the node (mode, pads as attribute or input,
// axes, the constant) and maps every output index along each axis to the input index it reads,
// or -1. Here the last axis's map is cut once into runs — copied from the input (a memcpy when
// the source indices are consecutive) or filled with the constant — and every output row replays
// those runs from its source row, or is all constant when an outer axis maps to -1.
#include <algorithm>
#include <cstring>
#include <optional>

#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"
#include "reference/ops/layout_params.h"

namespace pto::cpu {
namespace {

// Output elements [dst, dst + len) of a row read input elements [src, src + len), or are all the
// constant (src = -1).
struct Run {
  int64_t dst, len, src;
};

std::vector<Run> runs_of(const std::vector<int64_t>& map) {
  std::vector<Run> runs;
  for (int64_t o = 0; o < static_cast<int64_t>(map.size()); ++o) {
    const int64_t s = map[o], prev = o > 0 ? map[o - 1] : -2;
    if (o > 0 && ((s < 0 && prev < 0) || (s >= 0 && prev >= 0 && s == prev + 1)))
      ++runs.back().len;
    else
      runs.push_back({o, 1, s});
  }
  return runs;
}

// The plan and the last axis's runs, made once at compile time when the pads, axes and constant
// are constants and the input's shape is static (Silero VAD's reflect Pad of its 512 samples,
// after its subgraph is compiled for the run's shapes): per call, the plan's index maps and the
// runs were most of the kernel's work.
struct PreparedPad {
  Dims in_shape;  // the shape the plan is for; another one is planned per call
  reference::PadPlan plan;
  std::vector<Run> runs;
};

template <class U>
void pad_rows(const Tensor& x, const Tensor& y, const reference::PadPlan& plan,
              const std::vector<Run>& runs) {
  const int64_t rank = x.rank();
  const Dims& out = plan.out_shape;
  const U* src = static_cast<const U*>(x.raw_data());
  U* dst = static_cast<U*>(y.raw_data());
  const U value = *static_cast<const U*>(plan.value.raw_data());
  const int64_t width = out[rank - 1];
  int64_t rows = 1;
  for (int64_t a = 0; a + 1 < rank; ++a) rows *= out[a];
  const int64_t grain =
      std::max<int64_t>(1, kCopyGrainBytes / (width * static_cast<int64_t>(sizeof(U))));
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      U* to = dst + r * width;
      int64_t from = 0;  // the source row's first element, or -1
      for (int64_t a = rank - 1, rest = r; a-- > 0 && from >= 0;) {
        const int64_t i = plan.source[a][rest % out[a]];
        rest /= out[a];
        from = i < 0 ? -1 : from + i * x.strides()[a];
      }
      if (from < 0) {
        std::fill_n(to, width, value);
        continue;
      }
      const U* row = src + from;
      for (const Run& run : runs) {
        if (run.src < 0)
          std::fill_n(to + run.dst, run.len, value);
        else if (run.len == 1)
          to[run.dst] = row[run.src];
        else
          std::memcpy(to + run.dst, row + run.src, static_cast<size_t>(run.len) * sizeof(U));
      }
    }
  });
}

std::any prepare_pad(const NodeInfo& info) {
  const auto& shape = info.inputs.empty() ? std::nullopt : info.inputs[0].shape;
  if (!shape || !is_static(*shape) || shape->empty()) return {};
  reference::KernelContext ctx{info.node, {}, 1};
  Dims dims;
  for (const Dim& d : *shape) dims.push_back(d.value);
  ctx.inputs.push_back(
      Tensor::empty(info.inputs[0].dtype, dims));  // its shape is read, not its data
  for (size_t i = 1; i < info.inputs.size(); ++i) {
    if (info.inputs[i].dtype == DType::kUndefined) {
      ctx.inputs.emplace_back();  // absent
      continue;
    }
    if (!info.is_constant(i)) return {};
    ctx.inputs.push_back(*info.constants[i]);
  }
  try {
    PreparedPad p{dims, reference::pad_plan(ctx), {}};
    if (!p.plan.source.empty()) p.runs = runs_of(p.plan.source.back());
    return p;
  } catch (const Error&) {
    return {};  // run() plans per call and reports it
  }
}

std::vector<Tensor> pad(const KernelContext& c) {
  const Tensor& x = c.input(0);
  const PreparedPad* prepared = c.prepared_if<PreparedPad>();
  if (prepared && prepared->in_shape != x.shape()) prepared = nullptr;
  std::optional<reference::PadPlan> own;
  if (!prepared) own = reference::pad_plan(c);
  const reference::PadPlan& plan = prepared ? prepared->plan : *own;
  Tensor y = Tensor::empty(x.dtype(), plan.out_shape);
  if (y.numel() == 0) return one(std::move(y));
  if (x.rank() == 0) {
    std::memcpy(y.raw_data(), x.raw_data(), x.itemsize());
    return one(std::move(y));
  }
  std::vector<Run> own_runs;
  if (!prepared) own_runs = runs_of(plan.source[static_cast<size_t>(x.rank() - 1)]);
  const std::vector<Run>& runs = prepared ? prepared->runs : own_runs;
  with_element_size(x.itemsize(), [&]<class U>() { pad_rows<U>(x, y, plan, runs); });
  return one(std::move(y));
}

}  // namespace

void register_pad_kernels(KernelRegistry& r) {
  r.add("Pad", {.prepare = prepare_pad, .run = pad});
}

}  // namespace pto::cpu
