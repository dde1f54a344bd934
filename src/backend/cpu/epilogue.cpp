// PLACEHOLDER (to be replaced by the vectorized per-ISA epilogue): scalar, correct only.
#include <algorithm>
#include <cmath>

#include "backend/cpu/gemm/gemm.h"

namespace pto::cpu {

static float activate(const Epilogue& ep, float x) {
  switch (ep.act) {
    case Activation::kNone:
      return x;
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kClip:
      return std::min(std::max(x, ep.lo), ep.hi);
    case Activation::kLeakyRelu:
      return x < 0 ? ep.lo * x : x;
    case Activation::kSigmoid:
      return 1 / (1 + std::exp(-x));
    case Activation::kTanh:
      return std::tanh(x);
    case Activation::kGelu:
      return 0.5f * x * (1 + std::erf(x * 0.70710678f));
    case Activation::kGeluTanh:
      return 0.5f * x * (1 + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kHardSwish:
      return x * std::min(std::max(x / 6 + 0.5f, 0.0f), 1.0f);
  }
  return x;
}

void apply_epilogue(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m, int64_t n0,
                    int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) {
      float x = row[j];
      switch (ep.bias_kind) {
        case Epilogue::Bias::kPerRow:
          x += ep.bias[m0 + i];
          break;
        case Epilogue::Bias::kPerCol:
          x += ep.bias[n0 + j];
          break;
        case Epilogue::Bias::kScalar:
          x += ep.bias[0];
          break;
        case Epilogue::Bias::kNone:
          break;
      }
      if (ep.residual) x += ep.residual_scale * ep.residual[(m0 + i) * ep.ldr + n0 + j];
      row[j] = activate(ep, x);
    }
  }
}

}  // namespace pto::cpu
