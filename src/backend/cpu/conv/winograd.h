// Winograd F(4x4, 3x3) for ConvBlocked (3x3 kernel, stride 1, dilation 1, group 1, any padding).
//
// Each 4x4 block of output pixels (a tile) is computed from the 6x6 input patch around it:
//   Y = A^T [ (G g G^T) (.) (B^T d B) ] A
// with the standard F(4, 3) matrices (interpolation points 0, 1, -1, 2, -2, infinity). The 36
// elementwise products over all input channels are 36 GEMMs: for a block of T tiles,
//   M[xi] [T x OC] = V[xi] [T x IC] x U[xi] [IC x OC],  xi = 0..35,
// where U = G g G^T is computed once at compile time (prepare_winograd) and packed as the SGEMM's
// B operand, V = B^T d B is the input transform of each tile (vectorised over the c channel lanes
// of the blocked layout) and Y = A^T M A the output transform, which adds the bias and applies
// the fused residual and activation while the tile is in cache. 4x fewer multiplications than
// the direct kernel for a 2.25x larger weight set and extra transform work; the cost rule
// (winograd_pays) says where it wins. docs/backend/conv.md has the measurements and the rounding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/conv/conv_isa.h"
#include "backend/cpu/gemm/gemm.h"

namespace pto::cpu {

inline constexpr int kWinoTile = 4;     // output pixels per tile side
inline constexpr int kWinoPatch = 6;    // input pixels per patch side: tile + kernel - 1
inline constexpr int kWinoPoints = 36;  // kWinoPatch^2 GEMMs

// U = G g G^T of blocked weights, one SGEMM B operand [channels x ocb * block] per point xi, and
// when run() uses it.
struct WinogradWeights {
  std::vector<PackedB> u;  // kWinoPoints of them
  int64_t channels = 0;    // K: the real input channels
  int64_t out = 0;         // N: ocb * block
  bool always = false;     // PTO_WINOGRAD=1 at compile time: at every size, else winograd_pays
  int64_t min_batch = 0;   // the smallest batch winograd_pays takes (0: the plane is not known)
  size_t bytes() const;
  // "winograd F(4x4,3x3)", with " from batch N" or " where it pays" when run() also uses the
  // direct kernel.
  std::string describe() const;
};

// Whether ConvBlocked with these attributes is a convolution Winograd F(4x4, 3x3) computes:
// 3x3 kernel, stride 1, dilation 1, group 1 (depthwise is not).
bool winograd_applies(const BlockedConv& g);

// The cost rule, on the sizes of one run (docs/backend/conv.md has the measurements behind it):
// at least 16 input and 16 output channels, output tiles at least half filled (so a 2x2 or 5x5
// plane stays direct), and at least 49 output pixels over the batch (each block of tiles reads
// all of U, 4x the weights' bytes, which a few tiles do not repay). `against_pairs`: the other
// choice is the bf16 direct kernel (precision="bf16"), which Winograd beats only from 392 pixels.
bool winograd_pays(const BlockedConv& g, bool against_pairs = false);

// At compile time, where the batch (and perhaps the plane) is not known yet: whether to prepare
// U at all. PTO_WINOGRAD=0 says never, =1 always and for every size (tests, A/B measurements);
// otherwise the rule's channel and tile-fill parts when the plane is known, and its pixel count
// when the batch is too (g.n == 0: not known). Sets `min_batch` and `always` of `u` for run().
bool winograd_prepares(const BlockedConv& g, bool plane_known, WinogradWeights& u,
                       bool against_pairs = false);

// U for blocked weights w [ocb, icb, 3, 3, block(in), block(out)] of `channels` real inputs,
// into r.u (with r.channels and r.out).
void prepare_winograd(const float* w, int64_t ocb, int64_t icb, int64_t block, int64_t channels,
                      WinogradWeights& r);

// y [n, ocb, oh, ow, block] = epilogue(conv(x, w) + bias), as run_conv_blocked computes it,
// parallel over blocks of tiles (or, with fewer blocks than threads, within each block).
void winograd_conv(const BlockedConv& g, const WinogradWeights& u, const float* x,
                   const float* bias, float* y, const Epilogue& ep);

}  // namespace pto::cpu
