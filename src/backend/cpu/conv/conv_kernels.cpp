// Registers the CPU Conv kernel: float32, NCHW, 1-D and 2-D (conv.h). 3-D convolutions and other
// dtypes are declined and run on the reference interpreter. The blocked-layout kernels are in
// conv_blocked.cpp.
#include <algorithm>

#include "backend/cpu/conv/conv.h"
#include "backend/cpu/kernel.h"
#include "backend/cpu/tile_kernel.h"
#include "pto/error.h"

namespace pto::cpu {
namespace {

bool accepts(const NodeInfo& info) {
  const size_t n = info.inputs.size();
  if (n < 2 || info.dtype(0) != DType::kF32 || info.dtype(1) != DType::kF32) return false;
  if (n > 2 && info.dtype(2) != DType::kF32 && info.dtype(2) != DType::kUndefined) return false;
  const auto& x = info.inputs[0].shape;
  return x && (x->size() == 3 || x->size() == 4);
}

// A constant W packed once per group as the GEMM's A operand, and W's shape to give it back.
struct PreparedW {
  std::vector<PackedA> groups;
  Dims shape;
};

std::any prepare(const NodeInfo& info) {
  if (!info.is_constant(1)) return {};
  const Tensor& w = *info.constants[1];
  if ((w.rank() != 3 && w.rank() != 4) || w.dtype() != DType::kF32) return {};
  const int64_t group = info.node.attrs.get_int("group", 1);
  if (group < 1 || w.dim(0) % group != 0) return {};  // run() reports the error
  std::vector<PackedA> packed = pack_weights(w.data<float>(), w.dim(0), w.dim(1),
                                             w.rank() == 4 ? w.dim(2) : 1, w.dim(-1), group);
  if (packed.empty()) return {};
  return PreparedW{std::move(packed), w.shape()};
}

// W [m, cg, kh, kw] is the groups' A matrices [m/group, cg*kh*kw] one after another.
Tensor unpack(const std::any& state, size_t input) {
  const auto& p = std::any_cast<const PreparedW&>(state);
  PTO_CHECK(input == 1) << "Conv: only W is packed";
  Tensor w = Tensor::empty(DType::kF32, p.shape);
  float* out = w.data<float>();
  for (const PackedA& a : p.groups) {
    const std::vector<float> rows = a.unpack();
    out = std::copy(rows.begin(), rows.end(), out);
  }
  return w;
}

std::vector<Tensor> run(const KernelContext& c) {
  const std::string where = c.where();
  const Tensor &x = c.input(0), &w = c.input(1);
  const ConvGeometry g = conv_geometry(c.attrs(), x.shape(), w.shape(), where);
  const float* bias = nullptr;
  if (c.has_input(2)) {
    const Tensor& b = c.input(2);
    if (b.rank() != 1 || b.dim(0) != g.m)
      throw ValueError(cat(where, ": B must be 1-D with ", g.m, " elements, got ", b.str()));
    bias = b.data<float>();
  }
  Dims yshape = {g.n, g.m, g.oh, g.ow};
  if (x.rank() == 3) yshape.erase(yshape.begin() + 2);
  const Epilogue ep = conv_epilogue(c.epilogue, yshape, where);
  if (c.epilogue && c.epilogue->bias.defined())
    bias = c.epilogue->bias.data<float>();  // the group's bias (Conv had none)
  Tensor y = Tensor::empty(DType::kF32, yshape);
  const PackedA* packed = nullptr;
  if (c.state && c.state->has_value()) {  // then W's data may have been released
    const auto& p = c.prepared<PreparedW>();
    PTO_CHECK(static_cast<int64_t>(p.groups.size()) == g.group && !g.depthwise())
        << where << ": W was packed for " << p.groups.size() << " groups";
    packed = p.groups.data();
  }
  conv2d(g, x.data<float>(), w.data<float>(), bias, y.data<float>(), ep, packed);
  return {y};
}

}  // namespace

std::optional<EpilogueOperand> conv_operand_strides(const Dims& t, const Dims& y) {
  if (t.size() > y.size() || y.size() < 3) return std::nullopt;
  // Strides of t through y's dimensions (0 where t broadcasts).
  Dims s(y.size(), 0);
  int64_t step = 1;
  for (size_t d = t.size(); d-- > 0;) {
    const size_t yd = d + y.size() - t.size();
    if (t[d] != y[yd] && t[d] != 1) return std::nullopt;
    if (t[d] != 1) s[yd] = step;
    step *= t[d];
  }
  // The positions are the flattened spatial dimensions: t must step through them all by one, or
  // not at all (a dimension of size 1 steps either way).
  int64_t col = 0;
  for (size_t d = 2; d < y.size(); ++d)
    if (s[d] != 0) col = 1;
  int64_t inner = 1;  // positions per step of dimension d
  for (size_t d = y.size(); d-- > 2; inner *= y[d])
    if (y[d] > 1 && s[d] != col * inner) return std::nullopt;
  return EpilogueOperand{nullptr, s[1], col, s[0]};
}

Epilogue conv_epilogue(const FusedEpilogue* f, const Dims& yshape, const std::string& where) {
  Epilogue ep;
  if (!f) return ep;
  if (f->tile) {
    f->tile_operands.clear();
    for (const Tensor& t : f->tile_inputs) {
      std::optional<EpilogueOperand> o = conv_operand_strides(t.shape(), yshape);
      if (!o || t.dtype() != DType::kF32)
        throw KernelDeclined(cat(where, ": epilogue operand ", t.str(),
                                 " is not per channel, per position, per image or of the output ",
                                 dims_str(yshape)));
      o->data = t.data<float>();
      f->tile_operands.push_back(*o);
    }
    ep.tile = f->tile;
    ep.tile_operands = f->tile_operands.data();
    return ep;
  }
  if (f->residual.defined()) {
    if (f->residual.shape() != yshape)
      throw KernelDeclined(cat(where, ": fused residual ", f->residual.str(),
                               " does not match the output ", dims_str(yshape)));
    ep.residual = f->residual.data<float>();
  }
  ep.act = f->act;
  ep.lo = f->lo;
  ep.hi = f->hi;
  return ep;
}

void register_conv_kernels(KernelRegistry& r) {
  Kernel conv{accepts, prepare, run};
  conv.packed_inputs = [](const std::any& state) {
    return state.has_value() ? std::vector<size_t>{1} : std::vector<size_t>{};
  };
  conv.packed_bytes = [](const std::any& state) {
    size_t n = 0;
    if (state.has_value())
      for (const PackedA& a : std::any_cast<const PreparedW&>(state).groups) n += a.bytes();
    return n;
  };
  conv.unpack = unpack;
  r.add("Conv", std::move(conv));
  register_blocked_conv_kernels(r);
}

}  // namespace pto::cpu
