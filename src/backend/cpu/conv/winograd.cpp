// Winograd F(4x4, 3x3) for ConvBlocked (winograd.h): the weight transform, the cost rule, and the
// driver that cuts the output into blocks of tiles and runs, per block, the input transform, the
// 36 GEMMs on the packed U and the output transform with the epilogue.
#include "backend/cpu/conv/winograd.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "pto/device_info.h"
#include "pto/parallel.h"
#include "pto/tensor.h"

namespace pto::cpu {
namespace {

// G of F(4, 3) for the points 0, 1, -1, 2, -2 and infinity (Lavin and Gray 2016).
constexpr double kG[6][3] = {{1.0 / 4, 0, 0},
                             {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                             {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                             {1.0 / 24, 1.0 / 12, 1.0 / 6},
                             {1.0 / 24, -1.0 / 12, 1.0 / 6},
                             {0, 0, 1}};

// The smallest block of tiles (the GEMMs' M): every block reads all of U, so smaller blocks would
// read it more often than their multiplications repay.
constexpr int64_t kMinTiles = 32;

struct Tiling {
  int64_t th = 0, tw = 0, tiles = 0;  // tiles per column, per row, in all images
  int64_t per_block = 0, blocks = 0;
};

// The cost rule's parts (winograd_pays, docs/backend/conv.md for the measurements).
constexpr int64_t kMinChannels = 16;  // below, the GEMMs are too thin for the transforms' cost
constexpr int64_t kMinPixels = 49;    // output pixels of a run: a 7x7 plane at batch 1
// The same against the bf16 direct kernel (twice the fp32 one's multiply-adds a cycle): two 14x14
// planes. ResNet-18's 3x3 convs, batch 1, 1 thread, Zen 4: Winograd 0.77-0.96 ms at 56x56 and
// 28x28 against the bf16 kernel's 1.06-1.07, at par at 14x14 (1.06-1.12 vs 1.11), 2.0-2.3 ms
// against 1.37 at 7x7 (reading U, 4x the weights' bytes, for 49 pixels).
constexpr int64_t kMinPixelsPairs = 392;

bool channels_pay(const BlockedConv& g) {
  return g.channels >= kMinChannels && g.ocb * g.block >= kMinChannels;
}

// Output pixels over the pixels of the tiles that cover them, at least one half.
bool tiles_filled(const BlockedConv& g) {
  const int64_t th = (g.oh + kWinoTile - 1) / kWinoTile, tw = (g.ow + kWinoTile - 1) / kWinoTile;
  return 2 * g.oh * g.ow >= th * tw * kWinoTile * kWinoTile;
}

Tiling tiling(const BlockedConv& g, int threads) {
  Tiling t;
  t.th = (g.oh + kWinoTile - 1) / kWinoTile;
  t.tw = (g.ow + kWinoTile - 1) / kWinoTile;
  t.tiles = g.n * t.th * t.tw;
  if (t.tiles == 0) return t;  // an empty batch
  // A block's V and M (36 rows of IC and OC floats a tile) in L2 where that leaves at least
  // kMinTiles tiles; else kMinTiles tiles, streamed through L3.
  const int64_t tile_bytes = kWinoPoints * (g.icb + g.ocb) * g.block * 4;
  int64_t per = std::max<int64_t>(kMinTiles, static_cast<int64_t>(cache_model().l2) / tile_bytes);
  t.blocks = std::max<int64_t>(1, (t.tiles + per - 1) / per);
  // Whole rounds of blocks for the threads, if the tiles allow it.
  if (t.blocks % threads != 0 && t.tiles >= threads * kMinTiles / 2)
    t.blocks = (t.blocks + threads - 1) / threads * threads;
  t.per_block = (t.tiles + t.blocks - 1) / t.blocks;
  t.blocks = (t.tiles + t.per_block - 1) / t.per_block;
  return t;
}

}  // namespace

size_t WinogradWeights::bytes() const {
  size_t n = 0;
  for (const PackedB& p : u) n += p.bytes();
  return n;
}

bool winograd_applies(const BlockedConv& g) {
  return !g.depthwise && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1;
}

bool winograd_pays(const BlockedConv& g, bool against_pairs) {
  return channels_pay(g) && tiles_filled(g) &&
         g.n * g.oh * g.ow >= (against_pairs ? kMinPixelsPairs : kMinPixels);
}

bool winograd_prepares(const BlockedConv& g, bool plane_known, WinogradWeights& u,
                       bool against_pairs) {
  if (const char* e = std::getenv("PTO_WINOGRAD")) {
    if (std::strcmp(e, "0") == 0) return false;
    if (std::strcmp(e, "1") == 0) return u.always = true;
  }
  if (!channels_pay(g)) return false;
  if (!plane_known) return true;  // min_batch 0: run() decides on the sizes
  if (!tiles_filled(g) || g.oh * g.ow == 0) return false;
  const int64_t pixels = against_pairs ? kMinPixelsPairs : kMinPixels;
  u.min_batch = (pixels + g.oh * g.ow - 1) / (g.oh * g.ow);
  return g.n == 0 || g.n >= u.min_batch;  // a fixed batch below it would never use U
}

std::string WinogradWeights::describe() const {
  std::string s = "winograd F(4x4,3x3)";
  if (always || min_batch == 1) return s;
  if (min_batch > 1) return s + " from batch " + std::to_string(min_batch) + ", else direct";
  return s + " where it pays, else direct";
}

void prepare_winograd(const float* w, int64_t ocb, int64_t icb, int64_t block, int64_t channels,
                      WinogradWeights& r) {
  r.channels = channels;
  r.out = ocb * block;
  std::vector<float> u(static_cast<size_t>(kWinoPoints * channels * r.out));
  for (int64_t ic = 0; ic < channels; ++ic)
    for (int64_t oc = 0; oc < r.out; ++oc) {
      const float* wp =
          w + ((oc / block * icb + ic / block) * 9 * block + ic % block) * block + oc % block;
      double gg[3][3], tmp[6][3];
      for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx) gg[ky][kx] = wp[(ky * 3 + kx) * block * block];
      for (int i = 0; i < 6; ++i)
        for (int kx = 0; kx < 3; ++kx)
          tmp[i][kx] = kG[i][0] * gg[0][kx] + kG[i][1] * gg[1][kx] + kG[i][2] * gg[2][kx];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j)
          u[((i * 6 + j) * channels + ic) * r.out + oc] = static_cast<float>(
              tmp[i][0] * kG[j][0] + tmp[i][1] * kG[j][1] + tmp[i][2] * kG[j][2]);
    }
  for (int xi = 0; xi < kWinoPoints; ++xi)
    r.u.push_back(pack_b(channels, r.out, u.data() + xi * channels * r.out, r.out, false));
}

void winograd_conv(const BlockedConv& g, const WinogradWeights& u, const float* x,
                   const float* bias, float* y, const Epilogue& ep) {
  const int threads = in_parallel_region() ? 1 : num_threads();
  const Tiling tl = tiling(g, threads);
  if (tl.tiles == 0) return;
  const int64_t ldv = g.icb * g.block, ldm = g.ocb * g.block;
  const int64_t vstride = tl.per_block * ldv, mstride = tl.per_block * ldm;
  const int64_t workers = std::min<int64_t>(tl.blocks, threads);
  // Each worker's V and M; from the run's memory pool, so repeated runs reuse the pages.
  Tensor scratch = Tensor::empty(DType::kF32, {workers, kWinoPoints * tl.per_block * (ldv + ldm)});
  const bool has_rest = ep.residual || ep.act != Activation::kNone;
  const int64_t row = g.ow * g.block;

  auto transform_in = [&](float* v, int64_t b, int64_t r0, int64_t r1) {
    const int64_t t0 = b * tl.per_block;
    if (!PTO_ISA_DISPATCH(winograd_input, g, x, t0 + r0, t0 + r1, v + r0 * ldv, ldv, vstride))
      generic::winograd_input(g, x, t0 + r0, t0 + r1, v + r0 * ldv, ldv, vstride);
  };
  auto multiply = [&](const float* v, float* m, int64_t rows, int64_t xi) {
    GemmArgs a;
    a.m = rows;
    a.n = u.out;
    a.k = u.channels;
    a.a = v + xi * vstride;
    a.lda = ldv;
    a.c = m + xi * mstride;
    a.ldc = ldm;
    sgemm_packed(a, u.u[xi]);
  };
  auto transform_out = [&](const float* m, int64_t b, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = b * tl.per_block + r;
      if (!PTO_ISA_DISPATCH(winograd_output, g, m + r * ldm, mstride, t, bias, y))
        generic::winograd_output(g, m + r * ldm, mstride, t, bias, y);
      if (!has_rest) continue;
      // The epilogue on the tile's pixels of each output block, while they are in L1.
      const int64_t n = t / (tl.th * tl.tw), oy0 = t / tl.tw % tl.th * kWinoTile,
                    ox0 = t % tl.tw * kWinoTile;
      const int64_t rows = std::min<int64_t>(kWinoTile, g.oh - oy0);
      const int64_t cols = std::min<int64_t>(kWinoTile, g.ow - ox0);
      for (int64_t o = 0; o < g.ocb; ++o) {
        const int64_t off = (((n * g.ocb + o) * g.oh + oy0) * g.ow + ox0) * g.block;
        Epilogue e = ep;
        if (ep.residual) e.residual = ep.residual + off;
        e.ldr = row;
        apply_epilogue(e, y + off, row, 0, rows, 0, cols * g.block);
      }
    }
  };
  auto rows_of = [&](int64_t b) { return std::min(tl.per_block, tl.tiles - b * tl.per_block); };

  if (workers > 1 || threads == 1) {
    // Blocks split evenly over the workers; each runs its blocks start to end (the GEMMs run
    // serially inside the parallel region).
    parallel_tasks(workers, [&](int64_t wk) {
      float* v = scratch.data<float>() + wk * kWinoPoints * tl.per_block * (ldv + ldm);
      float* m = v + kWinoPoints * tl.per_block * ldv;
      for (int64_t b = tl.blocks * wk / workers; b < tl.blocks * (wk + 1) / workers; ++b) {
        const int64_t rows = rows_of(b);
        transform_in(v, b, 0, rows);
        for (int64_t xi = 0; xi < kWinoPoints; ++xi) multiply(v, m, rows, xi);
        transform_out(m, b, 0, rows);
      }
    });
    return;
  }
  // One block and several threads: each step of it in parallel (tiles, then the 36 GEMMs).
  float* v = scratch.data<float>();
  float* m = v + kWinoPoints * tl.per_block * ldv;
  const int64_t rows = rows_of(0);
  parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) { transform_in(v, 0, r0, r1); });
  parallel_tasks(kWinoPoints, [&](int64_t xi) { multiply(v, m, rows, xi); });
  parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) { transform_out(m, 0, r0, r1); });
}

}  // namespace pto::cpu
