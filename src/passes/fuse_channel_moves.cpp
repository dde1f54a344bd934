// FuseChannelMoves (level 1: every value keeps its bits): a chain of data-movement nodes that,
// taken as a whole, only picks whole channel planes of 4-D values becomes one GatherChannels node
// per result:
//
//   Y[n, j, h, w] = X{input_index[j]}[n, input_channel[j], h, w]
//
// ShuffleNet's channel shuffle and the chunk after it (Concat, Reshape [N, 2, C/2, H, W],
// Transpose, Reshape, Slice: five copies and views) become one copy per half; GhostNet's
// Concat-then-Slice and a Split's part of a Concat become one copy. At level 3 AssignLayouts keeps
// GatherChannels on the blocked layout, where the Concat, Transpose and Slice of a shuffle would
// each need the NCHW value (a reorder out and one back in).
//
// The chain is proven, not matched: its nodes are run at compile time by their reference kernels
// on index tensors (every element the number of the source element it is), and the rewrite
// happens only when each output channel is, element for element, one channel plane of one
// source. Any mix of Concat, Split, Slice, Gather (constant indices), Reshape, Flatten, Squeeze,
// Unsqueeze, Transpose and Identity qualifies; its other inputs (shapes, starts, permutations)
// must be constants.
//
// A result is a 4-D float32 value of known shape (its batch may be a symbol when every node of
// its chain leaves the batch alone: chain_node) that such a node makes and something else reads
// (a node of another kind, a graph output, or a movement node whose result is not 4-D); its
// sources are the values the chain starts from, all [N, C_i, H, W] with the result's N, H and W.
// A chain of one node is left alone (it is one copy already), as is a chain whose index tensors
// would be large (kMaxElements, kMaxChain). A result equal to one source is replaced by it. The
// chain's nodes that nothing else reads go with EliminateDeadCode.
#include <algorithm>
#include <map>

#include "passes/passes.h"
#include "passes/rewrite_util.h"
#include "pto/reader_index.h"
#include "pto/reference.h"

namespace pto::passes {
namespace {

// The most elements of index tensors one chain may make (int32 each), and the most nodes it may
// have: each result's chain is evaluated on its own, so both bound the compile time.
constexpr int64_t kMaxElements = int64_t{1} << 22;
constexpr size_t kMaxChain = 256;

bool is_move_op(const Node& n) {
  static const char* const kOps[] = {"Concat",  "Split",   "Slice",     "Gather",   "Reshape",
                                     "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"};
  if (!n.domain.empty()) return false;
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* op) { return n.op == op; });
}

// The node's inputs that carry data: all of a Concat's, the first of the others (whose other
// inputs must be constants or absent for the chain to be evaluated).
std::vector<ValueId> data_inputs(const Node& n) {
  if (n.op == "Concat") return n.inputs;
  return n.inputs.empty() ? std::vector<ValueId>{} : std::vector<ValueId>{n.inputs[0]};
}

bool params_constant(const Graph& g, const Node& n) {
  if (n.op == "Concat") return true;
  for (size_t i = 1; i < n.inputs.size(); ++i)
    if (n.inputs[i] != kNoValue && !constant_of(g, n.inputs[i])) return false;
  return true;
}

// A float32 value's shape when every dimension is known but perhaps the first, a symbol (a
// dynamic batch): that one is 1 here, the batch of the index tensors, and `batch` is its symbol.
struct ValueDims {
  Dims dims;
  std::string batch;  // empty: a static shape
};

std::optional<ValueDims> value_dims(const Graph& g, ValueId v) {
  if (v == kNoValue || g.value(v).type.dtype != DType::kF32 || !g.value(v).type.shape)
    return std::nullopt;
  const Shape& s = *g.value(v).type.shape;
  ValueDims out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].is_known()) {
      out.dims.push_back(s[i].value);
    } else if (i == 0 && s[i].is_symbolic()) {
      out.dims.push_back(1);
      out.batch = s[i].symbol;
    } else {
      return std::nullopt;
    }
  }
  if (out.dims.empty()) return std::nullopt;
  return out;
}

// The axes a movement node works on, normalized to `rank`; nullopt when they are not constants.
std::optional<Dims> moved_axes(const Graph& g, const Node& n, int64_t rank) {
  Dims axes;
  if (n.op == "Concat" || n.op == "Split" || n.op == "Gather") {
    axes = {n.attrs.get_int("axis", n.op == "Concat" ? 1 : 0)};
  } else if (n.op == "Slice") {
    if (n.inputs.size() > 3 && n.inputs[3] != kNoValue) {
      const std::optional<std::vector<int64_t>> a = constant_ints(g, n, 3);
      if (!a) return std::nullopt;
      axes = *a;
    } else if (const std::optional<std::vector<int64_t>> starts = constant_ints(g, n, 1)) {
      for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
    } else {
      return std::nullopt;
    }
  } else if (n.op == "Squeeze" || n.op == "Unsqueeze") {
    if (n.attrs.has("axes")) {
      axes = n.attrs.get_ints("axes");
    } else if (n.inputs.size() > 1 && n.inputs[1] != kNoValue) {
      const std::optional<std::vector<int64_t>> a = constant_ints(g, n, 1);
      if (!a) return std::nullopt;
      axes = *a;
    } else {
      return std::nullopt;  // a Squeeze of every 1: perhaps the batch
    }
    if (n.op == "Unsqueeze") rank += static_cast<int64_t>(axes.size());
  } else if (n.op == "Flatten") {
    const int64_t a = n.attrs.get_int("axis", 1);
    if (a != 1 && a != 1 - rank) axes = {0};  // only at axis 1 is the first dimension kept
  } else if (n.op == "Transpose") {
    const Dims perm = n.attrs.get_ints("perm", {});
    if (perm.empty() || perm[0] != 0) axes = {0};
  }
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  return axes;
}

// Whether `n` is a movement node over float32 values of known shapes whose parameters are
// constants. On a dynamic batch (dimension 0 one symbol in every value) it must also leave that
// dimension alone, so that it does the same to each image: then the chain is evaluated for a batch
// of 1 and holds for any. (A Reshape from [N, ...] to [N, ...] keeps each image's elements.)
bool chain_node(const Graph& g, const Node& n) {
  if (!is_move_op(n) || !params_constant(g, n)) return false;
  std::string batch;
  bool first = true, known = false;
  auto fits = [&](ValueId v) {
    const std::optional<ValueDims> d = value_dims(g, v);
    if (!d) return false;
    if (first) batch = d->batch;
    known = known || d->batch.empty();
    first = false;
    return d->batch == batch;
  };
  for (ValueId v : data_inputs(n))
    if (!fits(v)) return false;
  for (ValueId v : n.outputs)
    if (v != kNoValue && !fits(v)) return false;
  if (batch.empty()) return true;  // static shapes: the evaluation is the proof
  if (known) return false;
  const std::optional<Dims> axes =
      moved_axes(g, n, static_cast<int64_t>(value_dims(g, data_inputs(n)[0])->dims.size()));
  return axes && std::find(axes->begin(), axes->end(), 0) == axes->end();
}

// Same N, H and W (dims of value_dims, with their batch symbols).
bool same_plane(const ValueDims& a, const ValueDims& b) {
  return a.dims.size() == 4 && b.dims.size() == 4 && a.batch == b.batch && a.dims[0] == b.dims[0] &&
         a.dims[2] == b.dims[2] && a.dims[3] == b.dims[3];
}

struct Gather {
  ValueId result;
  std::vector<ValueId> sources;
  Dims index, channel;
};

class Finder {
 public:
  explicit Finder(const Graph& g) : g_(g), readers_(g) {}

  // The values chain nodes make that something other than a chain step reads.
  std::vector<ValueId> results() const {
    std::vector<ValueId> out;
    for (const Node& n : g_.nodes()) {
      if (!chain_node(g_, n)) continue;
      for (ValueId v : n.outputs) {
        const std::optional<ValueDims> d = value_dims(g_, v);
        if (d && d->dims.size() == 4 && ends_chain(v, *d)) out.push_back(v);
      }
    }
    return out;
  }

  // The gather `result` is, when its chain proves to be one.
  std::optional<Gather> gather(ValueId result) const {
    const ValueDims shape = *value_dims(g_, result);
    std::vector<size_t> chain;  // node indices, in graph order
    std::vector<ValueId> sources;
    std::vector<ValueId> stack = {result};
    std::vector<bool> seen(g_.values().size(), false);
    seen[result] = true;
    while (!stack.empty()) {
      const ValueId v = stack.back();
      stack.pop_back();
      const int p = g_.value(v).producer;
      if (p >= 0 && chain_node(g_, g_.nodes()[p])) {
        if (std::find(chain.begin(), chain.end(), static_cast<size_t>(p)) == chain.end())
          chain.push_back(static_cast<size_t>(p));
        if (chain.size() > kMaxChain) return std::nullopt;
        for (ValueId in : data_inputs(g_.nodes()[p]))
          if (!seen[in]) {
            seen[in] = true;
            stack.push_back(in);
          }
        continue;
      }
      const std::optional<ValueDims> d = value_dims(g_, v);
      if (!d || !same_plane(*d, shape)) return std::nullopt;  // a source must be [N, C, H, W]
      sources.push_back(v);
    }
    if (chain.size() < 2 || sources.empty()) return std::nullopt;
    std::sort(chain.begin(), chain.end());
    std::sort(sources.begin(), sources.end());

    // Index tensors: source s holds base[s] + its flat element number.
    std::map<ValueId, Tensor> env;
    std::vector<int64_t> base;
    int64_t total = 0;
    for (ValueId s : sources) {
      const Dims d = value_dims(g_, s)->dims;
      const int64_t count = checked_numel(d);
      Tensor t = Tensor::empty(DType::kI32, d);
      for (int64_t i = 0; i < count; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(total + i);
      base.push_back(total);
      total += count;
      if (total > kMaxElements) return std::nullopt;
      env.emplace(s, std::move(t));
    }
    int64_t made = 0;
    for (size_t i : chain) {
      const Node& n = g_.nodes()[i];
      for (ValueId v : n.outputs)
        if (v != kNoValue) made += checked_numel(value_dims(g_, v)->dims);
      if (made > kMaxElements) return std::nullopt;
      const reference::Kernel* kernel = reference::KernelRegistry::global().find(n.op);
      if (!kernel) return std::nullopt;
      reference::KernelContext kc{n, {}, n.outputs.size()};
      const std::vector<ValueId> data = data_inputs(n);
      for (ValueId in : n.inputs) {
        if (in == kNoValue) {
          kc.inputs.emplace_back();
        } else if (std::find(data.begin(), data.end(), in) != data.end()) {
          kc.inputs.push_back(env.at(in));
        } else {
          kc.inputs.push_back(constant_of(g_, in)->contiguous());
        }
      }
      std::vector<Tensor> outs;
      try {
        outs = (*kernel)(kc);
      } catch (const Error&) {
        return std::nullopt;
      }
      for (size_t o = 0; o < n.outputs.size() && o < outs.size(); ++o)
        if (n.outputs[o] != kNoValue) env[n.outputs[o]] = outs[o].contiguous();
    }
    const auto it = env.find(result);
    if (it == env.end() || it->second.shape() != shape.dims || it->second.dtype() != DType::kI32)
      return std::nullopt;
    return read_gather(result, it->second, sources, base);
  }

 private:
  // Whether v, a 4-D chain value, is read by something that is not a chain step over v's plane.
  bool ends_chain(ValueId v, const ValueDims& shape) const {
    if (g_.is_output(v)) return true;
    for (const int32_t r : readers_.readers(v)) {
      const Node& n = g_.nodes()[r];
      if (!chain_node(g_, n)) return true;
      for (ValueId o : n.outputs) {
        const std::optional<ValueDims> d = value_dims(g_, o);
        if (!d || !same_plane(*d, shape)) return true;
      }
    }
    return false;
  }

  // The gather the index tensor `y` describes, or nullopt when some output channel is not one
  // source's channel plane.
  std::optional<Gather> read_gather(ValueId result, const Tensor& y,
                                    const std::vector<ValueId>& sources,
                                    const std::vector<int64_t>& base) const {
    const int64_t N = y.dim(0), C = y.dim(1), HW = y.dim(2) * y.dim(3);
    const int32_t* at = y.data<int32_t>();
    Gather gather{result, {}, {}, {}};
    std::vector<int64_t> used(sources.size(), -1);  // source -> input index
    for (int64_t j = 0; j < C; ++j) {
      const int64_t first = at[j * HW];
      const auto s =
          static_cast<size_t>(std::upper_bound(base.begin(), base.end(), first) - base.begin() - 1);
      const int64_t Cs = value_dims(g_, sources[s])->dims[1];
      const int64_t local = first - base[s];
      if (local % HW != 0 || local / HW >= Cs) return std::nullopt;  // not at (0, c, 0, 0)
      const int64_t ch = local / HW;
      for (int64_t n = 0; n < N; ++n) {
        const int32_t* row = at + (n * C + j) * HW;
        const int64_t from = base[s] + (n * Cs + ch) * HW;
        for (int64_t p = 0; p < HW; ++p)
          if (row[p] != from + p) return std::nullopt;
      }
      if (used[s] < 0) {
        used[s] = static_cast<int64_t>(gather.sources.size());
        gather.sources.push_back(sources[s]);
      }
      gather.index.push_back(used[s]);
      gather.channel.push_back(ch);
    }
    return gather;
  }

  const Graph& g_;
  const ReaderIndex readers_;
};

// Whether the gather is source 0 as it is.
bool is_identity(const Graph& g, const Gather& gather) {
  if (gather.sources.size() != 1 ||
      value_dims(g, gather.sources[0])->dims[1] != static_cast<int64_t>(gather.channel.size()))
    return false;
  for (size_t j = 0; j < gather.channel.size(); ++j)
    if (gather.channel[j] != static_cast<int64_t>(j)) return false;
  return true;
}

Graph fuse_channel_moves(Graph g, const PassContext& ctx) {
  std::vector<Gather> found;
  {
    const Finder finder(g);
    for (ValueId v : finder.results())
      if (std::optional<Gather> m = finder.gather(v)) found.push_back(std::move(*m));
  }
  // Rewrite from the last result back, so that inserting a node does not move the positions of
  // those still to come.
  std::sort(found.begin(), found.end(), [&](const Gather& a, const Gather& b) {
    return g.value(a.result).producer > g.value(b.result).producer;
  });
  for (const Gather& m : found) {
    if (is_identity(g, m) && can_replace(g, m.result, m.sources[0])) {
      g.replace_uses(m.result, m.sources[0]);
      ctx.note("FuseChannelMoves/identity");
      continue;
    }
    const auto at = static_cast<size_t>(g.value(m.result).producer);
    // The chain's last node keeps a value of its own (now unread, unless another result's chain
    // reads it); the new node makes the result, names and readers unchanged.
    Node& last = g.mutable_nodes()[at];
    const ValueId old =
        g.add_value(g.unique_name(g.value(m.result).name + "_moved"), g.value(m.result).type);
    std::replace(last.outputs.begin(), last.outputs.end(), m.result, old);
    g.value(old).producer = static_cast<int32_t>(at);
    g.value(m.result).producer = -1;  // the new node's
    Attributes attrs;
    attrs.set("input_index", m.index);
    attrs.set("input_channel", m.channel);
    Node& n = g.insert_node(at + 1, "GatherChannels", m.sources, {m.result}, std::move(attrs),
                            g.nodes()[at].name + "_channels");
    n.domain = "pto";
    ctx.note("FuseChannelMoves/GatherChannels");
  }
  return g;
}

}  // namespace

void register_fuse_channel_moves(PassRegistry& r) {
  r.add({"FuseChannelMoves", fuse_channel_moves,
         "a chain of Concat, Split, Slice, Reshape and Transpose nodes that only moves "
         "whole channel planes (ShuffleNet's channel shuffle) as one GatherChannels per result"});
}

}  // namespace pto::passes
