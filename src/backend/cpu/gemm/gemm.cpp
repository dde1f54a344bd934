// PLACEHOLDER (to be replaced by the packed, blocked implementation): plain loops, correct only.
#include "backend/cpu/gemm/gemm.h"

#include <cstring>
#include <vector>

#include "backend/cpu/isa/isa.h"
#include "pto/parallel.h"

namespace pto::cpu {

void sgemm(const GemmArgs& g) {
  parallel_for(0, g.m, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t i = m0; i < m1; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        float s = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          float a = g.trans_a ? g.a[p * g.lda + i] : g.a[i * g.lda + p];
          float b = g.trans_b ? g.b[j * g.ldb + p] : g.b[p * g.ldb + j];
          s += a * b;
        }
        g.c[i * g.ldc + j] = g.alpha * s;
      }
      apply_epilogue(g.epilogue, g.c + i * g.ldc, g.ldc, i, 1, 0, g.n);
    }
  });
}

PackedB pack_b(int64_t k, int64_t n, const float* b, int64_t ldb, bool trans_b) {
  PackedB p;
  p.k_ = k;
  p.n_ = n;
  p.isa_ = static_cast<int>(active_isa());
  p.data_ = std::shared_ptr<float[]>(new float[static_cast<size_t>(k * n) + 1]);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < n; ++j) p.data_[i * n + j] = trans_b ? b[j * ldb + i] : b[i * ldb + j];
  return p;
}

void sgemm_packed(const GemmArgs& args, const PackedB& packed) {
  GemmArgs g = args;
  g.b = packed.data();
  g.ldb = packed.n();
  g.trans_b = false;
  sgemm(g);
}

void sgemm_batched(const GemmArgs& args, int64_t batch, int64_t stride_a, int64_t stride_b,
                   int64_t stride_c, int64_t stride_r) {
  for (int64_t i = 0; i < batch; ++i) {
    GemmArgs g = args;
    g.a += i * stride_a;
    g.b += i * stride_b;
    g.c += i * stride_c;
    if (g.epilogue.residual) g.epilogue.residual += i * stride_r;
    sgemm(g);
  }
}

}  // namespace pto::cpu
