// Registers the CPU Conv kernel: float32, NCHW, 1-D and 2-D (conv.h). 3-D convolutions and other
// dtypes are declined and run on the reference interpreter.
#include "backend/cpu/conv/conv.h"
#include "backend/cpu/kernel.h"

namespace pto::cpu {
namespace {

bool accepts(const NodeInfo& info) {
  const size_t n = info.inputs.size();
  if (n < 2 || info.dtype(0) != DType::kF32 || info.dtype(1) != DType::kF32) return false;
  if (n > 2 && info.dtype(2) != DType::kF32 && info.dtype(2) != DType::kUndefined) return false;
  const auto& x = info.inputs[0].shape;
  return x && (x->size() == 3 || x->size() == 4);
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
  Tensor y = Tensor::empty(DType::kF32, yshape);
  conv2d(g, x.data<float>(), w.data<float>(), bias, y.data<float>());
  return {y};
}

}  // namespace

void register_conv_kernels(KernelRegistry& r) {
  r.add("Conv", {accepts, {}, run});
}

}  // namespace pto::cpu
