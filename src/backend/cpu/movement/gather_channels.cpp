// The CPU kernel of GatherChannels (src/ir/ops/blocked_layout.cpp): whole channel planes picked
// from several inputs, as the FuseChannelMoves pass makes it of ShuffleNet's channel shuffle and
// AssignLayouts of a Concat, Split or Slice whose channel parts are not whole blocks.
//
// NCHW: output channels that read consecutive channels of one input form a run; each (image, run)
// is one memcpy of run x H x W elements. Blocked [N, Cb, H, W, c]: each output block lists the
// source blocks its lanes come from (a channel shuffle of two inputs interleaves two blocks into
// each output block) and permutes their lanes into place at every pixel (lanes.h); an output
// block that is one source block as it is, is a memcpy of its plane. The plan depends only on the
// attributes and the lane count, so it is made once when the kernel is prepared.
#include <algorithm>
#include <cstring>
#include <optional>

#include "backend/cpu/movement/lanes.h"
#include "backend/cpu/movement/movement.h"
#include "backend/cpu/movement/strided_copy.h"
#include "pto/parallel.h"

namespace pto::cpu {
namespace {

// Channels [first, first + count) of input `input` are output channels [out, out + count).
struct Run {
  int64_t input, first, count, out;
};

// One source block of an output block: source block `block` of input `input`, lanes as in
// LaneSource (without the pointer, which depends on the call's tensors).
struct BlockPart {
  int64_t input, block;
  uint32_t mask;
  int32_t lane[16];
};

struct Plan {
  int64_t lanes = 1;                          // c of the blocked layout; 1 for NCHW
  int64_t channels = 0;                       // J, the output's channels
  std::vector<Run> runs;                      // NCHW
  std::vector<std::vector<BlockPart>> parts;  // blocked: per output block
  std::vector<int64_t> min_channels;          // per input: the channels it must have at least
};

// The plan for `lanes` (1: NCHW); throws ValueError for an index out of range.
Plan make_plan(const Node& node, int64_t lanes, size_t inputs) {
  const Dims index = node.attrs.get_ints("input_index"),
             channel = node.attrs.get_ints("input_channel");
  if (index.empty() || index.size() != channel.size())
    throw ValueError(cat(node.where(), ": input_index and input_channel differ in length"));
  Plan plan;
  plan.lanes = lanes;
  plan.channels = static_cast<int64_t>(index.size());
  plan.min_channels.assign(inputs, 0);
  for (size_t j = 0; j < index.size(); ++j) {
    if (index[j] < 0 || index[j] >= static_cast<int64_t>(inputs) || channel[j] < 0)
      throw ValueError(cat(node.where(), ": output channel ", j, " reads channel ", channel[j],
                           " of input ", index[j], " (", inputs, " inputs)"));
    int64_t& need = plan.min_channels[static_cast<size_t>(index[j])];
    need = std::max(need, channel[j] + 1);
  }
  const auto J = static_cast<int64_t>(index.size());
  if (lanes == 1) {
    for (int64_t j = 0; j < J; ++j) {
      const auto k = static_cast<size_t>(j);
      if (!plan.runs.empty() && plan.runs.back().input == index[k] &&
          plan.runs.back().first + plan.runs.back().count == channel[k])
        ++plan.runs.back().count;
      else
        plan.runs.push_back({index[k], channel[k], 1, j});
    }
    return plan;
  }
  plan.parts.resize(static_cast<size_t>((J + lanes - 1) / lanes));
  for (int64_t j = 0; j < J; ++j) {
    const auto k = static_cast<size_t>(j);
    std::vector<BlockPart>& parts = plan.parts[static_cast<size_t>(j / lanes)];
    const int64_t block = channel[k] / lanes;
    auto it = std::find_if(parts.begin(), parts.end(), [&](const BlockPart& p) {
      return p.input == index[k] && p.block == block;
    });
    if (it == parts.end()) {
      parts.push_back({index[k], block, 0, {}});
      it = parts.end() - 1;
    }
    it->mask |= 1u << (j % lanes);
    it->lane[j % lanes] = static_cast<int32_t>(channel[k] % lanes);
  }
  return plan;
}

int64_t lanes_of(const NodeInfo& info) {
  const Shape& s = *info.inputs[0].shape;
  return s.size() == 5 ? s[4].value : 1;
}

bool accepts(const NodeInfo& info) {
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    const std::optional<Shape>& s = info.inputs[i].shape;
    if (!s || info.dtype(i) != info.dtype(0)) return false;
    if (s->size() == 5 && !((*s)[4] == Dim(8) || (*s)[4] == Dim(16))) return false;
    if (s->size() == 5 && dtype_size(info.dtype(i)) != 4) return false;
    if (s->size() != 4 && s->size() != 5) return false;
  }
  return !info.inputs.empty();
}

std::any prepare(const NodeInfo& info) {
  try {
    return make_plan(info.node, lanes_of(info), info.inputs.size());
  } catch (const ValueError&) {
    return {};  // run() reports it
  }
}

std::vector<Tensor> run(const KernelContext& c) {
  const Tensor& x0 = c.input(0);
  const bool blocked = x0.rank() == 5;
  const int64_t lanes = blocked ? x0.dim(4) : 1;
  const Plan* prepared = c.prepared_if<Plan>();
  std::optional<Plan> made;
  if (!prepared || prepared->lanes != lanes || prepared->min_channels.size() != c.inputs.size())
    made = make_plan(c.node, lanes, c.inputs.size());
  const Plan& p = made ? *made : *prepared;
  const int64_t N = x0.dim(0), H = x0.dim(2), W = x0.dim(3), HW = H * W;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Tensor& x = c.input(i);
    if (x.rank() != x0.rank() || x.dtype() != x0.dtype() || x.dim(0) != N || x.dim(2) != H ||
        x.dim(3) != W || (blocked && x.dim(4) != lanes) || x.dim(1) * lanes < p.min_channels[i])
      throw ValueError(cat(c.where(), ": input ", i, " ", x.str(), " does not fit input 0 ",
                           x0.str(), " and the channels read from it"));
  }
  const int64_t J = p.channels;
  const size_t item = x0.itemsize();
  if (!blocked) {
    Tensor y = Tensor::empty(x0.dtype(), {N, J, H, W});
    auto* out = static_cast<std::byte*>(y.raw_data());
    const auto runs = static_cast<int64_t>(p.runs.size());
    const int64_t plane = HW * static_cast<int64_t>(item);
    const int64_t grain =
        std::max<int64_t>(1, kCopyGrainBytes / std::max<int64_t>(1, plane * J / runs));
    parallel_for(0, N * runs, grain, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n = t / runs;
        const Run& r = p.runs[static_cast<size_t>(t % runs)];
        const Tensor& x = c.input(static_cast<size_t>(r.input));
        const auto* in = static_cast<const std::byte*>(x.raw_data());
        std::memcpy(out + (n * J + r.out) * plane, in + (n * x.dim(1) + r.first) * plane,
                    static_cast<size_t>(r.count * plane));
      }
    });
    return one(std::move(y));
  }
  const auto blocks = static_cast<int64_t>(p.parts.size());
  Tensor y = Tensor::empty(x0.dtype(), {N, blocks, H, W, lanes});
  auto* out = static_cast<uint32_t*>(y.raw_data());
  // Pieces of at most kCopyGrainBytes of one output block's plane.
  const int64_t pixels = std::max<int64_t>(1, kCopyGrainBytes / (lanes * 4));
  const int64_t pieces = (HW + pixels - 1) / pixels;
  // Tasks of fewer bytes than kCopyGrainBytes together: a shuffle of a 14 x 14 map is a few us,
  // less than waking another thread.
  const int64_t task_bytes = std::min(pixels, HW) * lanes * 4;
  parallel_for(0, N * blocks * pieces, std::max<int64_t>(1, kCopyGrainBytes / task_bytes),
               [&](int64_t t0, int64_t t1) {
                 LaneSource src[16];
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t piece = t % pieces, ob = t / pieces % blocks,
                                 n = t / pieces / blocks;
                   const int64_t p0 = piece * pixels, count = std::min(pixels, HW - p0);
                   const std::vector<BlockPart>& parts = p.parts[static_cast<size_t>(ob)];
                   uint32_t* dst = out + ((n * blocks + ob) * HW + p0) * lanes;
                   const auto source = [&](const BlockPart& b) {
                     const Tensor& x = c.input(static_cast<size_t>(b.input));
                     return static_cast<const uint32_t*>(x.raw_data()) +
                            ((n * x.dim(1) + b.block) * HW + p0) * lanes;
                   };
                   const uint32_t full = (1u << lanes) - 1;
                   bool whole = parts.size() == 1 && parts[0].mask == full;
                   for (int64_t l = 0; whole && l < lanes; ++l) whole = parts[0].lane[l] == l;
                   if (whole) {
                     std::memcpy(dst, source(parts[0]), static_cast<size_t>(count * lanes * 4));
                     continue;
                   }
                   for (size_t k = 0; k < parts.size(); ++k) {
                     src[k].src = source(parts[k]);
                     src[k].mask = parts[k].mask;
                     std::copy_n(parts[k].lane, 16, src[k].lane);
                   }
                   PTO_ISA_DISPATCH(gather_lanes_4, src, static_cast<int64_t>(parts.size()), dst,
                                    lanes, count);
                 }
               });
  return one(std::move(y));
}

}  // namespace

void register_gather_channels_kernel(KernelRegistry& r) {
  r.add("GatherChannels", {.accepts = accepts, .prepare = prepare, .run = run});
}

}  // namespace pto::cpu
