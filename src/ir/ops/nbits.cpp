#include "ir/ops/nbits.h"

#include <vector>

#include "pto/error.h"

namespace pto::nbits {

Layout layout(const Node& n, const std::string& where) {
  Layout w;
  w.k = n.attr_int("K");
  w.n = n.attr_int("N");
  w.bits = n.attr_int("bits");
  w.block = n.attr_int("block_size");
  if (w.bits != 2 && w.bits != 4 && w.bits != 8)
    throw UnsupportedError(
        cat(where, ": MatMulNBits with bits=", w.bits, " (2, 4 and 8 are read)"));
  if (w.k <= 0 || w.n <= 0 || w.block < 16 || (w.block & (w.block - 1)) != 0)
    throw ValueError(cat(where, ": K ", w.k, ", N ", w.n, " and block_size ", w.block,
                         " must be positive, block_size a power of 2 of 16 or more"));
  w.blocks = (w.k + w.block - 1) / w.block;
  w.blob = w.block * w.bits / 8;
  w.zp_row = (w.blocks * w.bits + 7) / 8;
  return w;
}

void check_operands(const Layout& w, const Tensor& b, const Tensor& scales, const Tensor* zp,
                    const Tensor* g_idx, const std::string& where) {
  if (b.dtype() != DType::kU8 || b.numel() != w.n * w.blocks * w.blob)
    throw ValueError(cat(where, ": B must be uint8 [N, blocks, blob] = [", w.n, ", ", w.blocks,
                         ", ", w.blob, "], got ", b.str()));
  if (scales.numel() != w.n * w.blocks || !is_floating(scales.dtype()))
    throw ValueError(cat(where, ": scales must hold N * blocks = ", w.n * w.blocks, " floats, got ",
                         scales.str()));
  if (zp) {
    const bool packed = zp->dtype() == DType::kU8;
    if (!packed && !is_floating(zp->dtype()))
      throw ValueError(cat(where, ": zero_points must be uint8 or float, got ", zp->str()));
    if (packed ? zp->numel() != w.n * w.zp_row : zp->numel() != w.n * w.blocks)
      throw ValueError(cat(where, ": zero_points ", zp->str(), " do not match N = ", w.n,
                           " rows of ", w.blocks, " blocks"));
  }
  if (g_idx) {
    if (g_idx->dtype() != DType::kI32 || g_idx->numel() != w.k)
      throw ValueError(cat(where, ": g_idx must be int32 [K = ", w.k, "], got ", g_idx->str()));
    const Tensor gc = g_idx->contiguous();
    for (int64_t i = 0; i < w.k; ++i) {
      const int64_t g = gc.data<int32_t>()[i];
      if (g < 0 || g >= w.blocks)
        throw ValueError(
            cat(where, ": g_idx[", i, "] = ", g, " is not a block index in [0, ", w.blocks, ")"));
    }
  }
}

void dequantize(const Layout& w, const Tensor& b, const Tensor& scales, const Tensor* zp,
                const Tensor* g_idx, int64_t n0, int64_t n1, float* out, int64_t ldw) {
  const Tensor bc = b.contiguous();
  const uint8_t* codes = bc.data<uint8_t>();
  const bool packed_zp = zp && zp->dtype() == DType::kU8;
  const Tensor zc = packed_zp ? zp->contiguous() : Tensor();
  const Tensor gc = g_idx ? g_idx->contiguous() : Tensor();
  const int32_t mask = w.code_mask();
  std::vector<float> scale(static_cast<size_t>(w.blocks)), zero(scale.size());
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t blk = 0; blk < w.blocks; ++blk) {
      scale[blk] = static_cast<float>(scales.item_as_double(n * w.blocks + blk));
      zero[blk] =
          !zp ? static_cast<float>(w.mid())
          : packed_zp
              ? static_cast<float>(code(zc.data<uint8_t>() + n * w.zp_row, blk, w.bits, mask))
              : static_cast<float>(zp->item_as_double(n * w.blocks + blk));
    }
    // Row n's codes run along K (block after block, each blob exactly block_size codes); g_idx
    // only changes which block's scale and zero point a k takes.
    const uint8_t* row = codes + n * w.blocks * w.blob;
    for (int64_t k = 0; k < w.k; ++k) {
      const int64_t blk = g_idx ? gc.data<int32_t>()[k] : k / w.block;
      out[k * ldw + (n - n0)] =
          (static_cast<float>(code(row, k, w.bits, mask)) - zero[blk]) * scale[blk];
    }
  }
}

}  // namespace pto::nbits
