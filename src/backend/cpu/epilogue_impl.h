// The per-ISA GEMM/conv epilogue (gemm.h's apply_epilogue): bias, scaled residual and activation
// on an M x N block, row by row with full vectors and one masked tail. Instantiated per activation
// and per bias/residual form so that the inner loop has no branches.
#pragma once

#include "backend/cpu/elementwise_ops.h"
#include "backend/cpu/gemm/gemm.h"

namespace pto::cpu::PTO_ISA_NS {
namespace {

enum BiasForm { kNoBias, kRowBias, kColBias };  // kRowBias: one value per row (or a scalar)

template <class Act, BiasForm Bias, bool Residual>
void epilogue_rows(const Epilogue& ep, Act act, float* c, int64_t ldc, int64_t m0, int64_t m,
                   int64_t n0, int64_t n) {
  constexpr int L = Vec::kLanes;
  const Vec rs = Vec::set1(ep.residual_scale);
  const float* col_bias = Bias == kColBias ? ep.bias + n0 : nullptr;
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    const float* res = Residual ? ep.residual + (m0 + i) * ep.ldr + n0 : nullptr;
    float row_bias = 0.0f;
    if (ep.bias_kind == Epilogue::Bias::kPerRow) row_bias = ep.bias[m0 + i];
    if (ep.bias_kind == Epilogue::Bias::kScalar) row_bias = ep.bias[0];
    const Vec rb = Vec::set1(row_bias);
    auto step = [&](int64_t j, auto load, auto store) {
      Vec x = load(row + j);
      if constexpr (Bias == kColBias) x = x + load(col_bias + j);
      if constexpr (Bias == kRowBias) x = x + rb;
      if constexpr (Residual) x = fma(rs, load(res + j), x);
      store(act(x), row + j);
    };
    int64_t j = 0;
#pragma GCC unroll 2
    for (; j + L <= n; j += L)
      step(
          j, [](const float* q) { return Vec::load(q); }, [](Vec v, float* q) { v.store(q); });
    if (j < n) {
      int k = static_cast<int>(n - j);
      step(
          j, [k](const float* q) { return Vec::load(q, k); },
          [k](Vec v, float* q) { v.store(q, k); });
    }
  }
}

// act: Vec -> Vec, the activation.
template <class Act>
void epilogue_for(const Epilogue& ep, Act act, float* c, int64_t ldc, int64_t m0, int64_t m,
                  int64_t n0, int64_t n) {
  using B = Epilogue::Bias;
  BiasForm bias = ep.bias_kind == B::kPerCol ? kColBias
                  : ep.bias_kind == B::kNone ? kNoBias
                                             : kRowBias;
  auto run = [&]<BiasForm F>() {
    if (ep.residual) return epilogue_rows<Act, F, true>(ep, act, c, ldc, m0, m, n0, n);
    return epilogue_rows<Act, F, false>(ep, act, c, ldc, m0, m, n0, n);
  };
  if (bias == kColBias) return run.template operator()<kColBias>();
  if (bias == kRowBias) return run.template operator()<kRowBias>();
  return run.template operator()<kNoBias>();
}

}  // namespace

void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m, int64_t n0,
                    int64_t n) {
  if (m <= 0 || n <= 0) return;
  if (ep.tile) return run_tile_epilogue(ep, c, ldc, m0, m, n0, n);
  const UnaryParams p{ep.lo, ep.hi};
  auto go = [&]<UnaryOp Op>() {
    epilogue_for(
        ep, [&p](Vec x) { return unary<Op>(x, p); }, c, ldc, m0, m, n0, n);
  };
  using enum UnaryOp;
  switch (ep.act) {
    case Activation::kNone:
      if (ep.bias_kind != Epilogue::Bias::kNone || ep.residual) go.template operator()<kIdentity>();
      return;
    case Activation::kRelu:
      return go.template operator()<kRelu>();
    case Activation::kClip:
      return go.template operator()<kClip>();
    case Activation::kLeakyRelu:
      return go.template operator()<kLeakyRelu>();
    case Activation::kSigmoid:
      return go.template operator()<kSigmoid>();
    case Activation::kTanh:
      return go.template operator()<kTanh>();
    case Activation::kGelu:
      if (ep.half_store)
        return epilogue_for(
            ep, [](Vec x) { return gelu_erf_half(x); }, c, ldc, m0, m, n0, n);
      return go.template operator()<kGelu>();
    case Activation::kGeluTanh:
      return go.template operator()<kGeluTanh>();
    case Activation::kSilu:
      return go.template operator()<kSilu>();
    case Activation::kHardSwish:
      return go.template operator()<kHardSwish>();
  }
}

}  // namespace pto::cpu::PTO_ISA_NS
