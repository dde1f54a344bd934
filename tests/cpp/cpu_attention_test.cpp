// CPU Attention (4-D, float32) against the reference interpreter, on every ISA with 1 and 2
// threads: query blocks that do not divide the sequence, grouped heads, float and boolean masks
// broadcast over batch, heads or rows, causal masking with more keys than queries, fully masked
// rows (zeros), and the forms the fast path leaves to the reference (3-D inputs, a KV cache, a
// mask shorter than the keys) giving the same answers.
//
// Tolerance: two float GEMMs of length D and L around a float softmax, against the reference's
// double: 64 ulp relative plus 64 ulp absolute for outputs of order 1.
#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

Tol attention_tol() {
  return {64 * kUlp, 64 * kUlp};
}

Tensor random_bool(Dims shape, uint32_t seed, double p_true = 0.8) {
  Tensor t = Tensor::empty(DType::kBool, shape);
  std::mt19937 rng(seed);
  std::bernoulli_distribution keep(p_true);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<bool>()[i] = keep(rng);
  return t;
}

NodeCase attention(std::vector<Tensor> in, bool causal = false, double scale = 0) {
  NodeCase c{"Attention", std::move(in), {}, 23};
  if (causal) c.attrs.set("is_causal", int64_t{1});
  if (scale != 0) c.attrs.set("scale", scale);
  return c;
}

TEST(CpuAttention, ShapesBlocksAndGroupedHeads) {
  uint32_t seed = 1;
  struct Case {
    int64_t b, hq, hkv, sq, l, d, dv;
  };
  for (const Case& k :
       {Case{1, 1, 1, 1, 1, 8, 8}, Case{1, 2, 2, 5, 7, 16, 16}, Case{2, 4, 2, 70, 70, 32, 24},
        Case{1, 3, 1, 129, 65, 64, 64}, Case{1, 12, 12, 128, 128, 64, 64}}) {
    SCOPED_TRACE(::testing::Message() << k.b << "x" << k.hq << "/" << k.hkv << " q" << k.sq << " l"
                                      << k.l << " d" << k.d << " dv" << k.dv);
    const Tensor q = random_f32({k.b, k.hq, k.sq, k.d}, seed++, -2, 2);
    const Tensor kk = random_f32({k.b, k.hkv, k.l, k.d}, seed++, -2, 2);
    const Tensor v = random_f32({k.b, k.hkv, k.l, k.dv}, seed++);
    expect_matches(attention({q, kk, v}), attention_tol());
    expect_matches(attention({q, kk, v}, false, 0.3), attention_tol());
  }
}

TEST(CpuAttention, MasksBroadcastCausalAndFullyMaskedRows) {
  const int64_t B = 2, H = 3, S = 17, L = 23, D = 16;
  const Tensor q = random_f32({B, H, S, D}, 11, -2, 2), k = random_f32({B, H, L, D}, 12, -2, 2),
               v = random_f32({B, H, L, D}, 13);
  for (const Dims& m : {Dims{L}, Dims{S, L}, Dims{B, 1, 1, L}, Dims{1, H, S, L}, Dims{B, H, S, L},
                        Dims{B, 1, S, L}}) {
    SCOPED_TRACE(dims_str(m));
    expect_matches(attention({q, k, v, random_f32(m, 14, -3, 1)}), attention_tol());
    expect_matches(attention({q, k, v, random_bool(m, 15)}), attention_tol());
    expect_matches(attention({q, k, v, random_bool(m, 16)}, true), attention_tol());
  }
  // Rows with no visible key are zeros: a boolean mask that hides all of row 2, a float mask of
  // -inf, and causal rows past the keys' end (S > L).
  Tensor hide = random_bool({S, L}, 17);
  for (int64_t j = 0; j < L; ++j) hide.data<bool>()[2 * L + j] = false;
  expect_matches(attention({q, k, v, hide}), attention_tol());
  Tensor neg = random_f32({S, L}, 18);
  for (int64_t j = 0; j < L; ++j) neg.data<float>()[5 * L + j] = -INFINITY;
  expect_matches(attention({q, k, v, neg}), attention_tol());
  expect_matches(attention({random_f32({1, 2, 9, 8}, 19), random_f32({1, 2, 4, 8}, 20),
                            random_f32({1, 2, 4, 8}, 21)},
                           true),
                 attention_tol());
}

TEST(CpuAttention, FormsLeftToTheReference) {
  // 3-D packed heads, a KV cache, and a mask shorter than the keys (padded as masked) run on the
  // reference kernel inside the CPU kernel: same answers.
  const Tensor q3 = random_f32({2, 5, 12}, 31), k3 = random_f32({2, 7, 12}, 32),
               v3 = random_f32({2, 7, 12}, 33);
  NodeCase packed = attention({q3, k3, v3});
  packed.attrs.set("q_num_heads", int64_t{3});
  packed.attrs.set("kv_num_heads", int64_t{3});
  expect_matches(packed, attention_tol());
  const Tensor q = random_f32({1, 2, 3, 8}, 34), k = random_f32({1, 2, 3, 8}, 35),
               v = random_f32({1, 2, 3, 8}, 36);
  NodeCase cache =
      attention({q, k, v, Tensor(), random_f32({1, 2, 4, 8}, 37), random_f32({1, 2, 4, 8}, 38)});
  cache.num_outputs = 3;
  expect_matches(cache, attention_tol(), {}, "reference");  // declined at compile time
  expect_matches(attention({q, k, v, random_f32({3, 2}, 39)}), attention_tol());
}

}  // namespace
}  // namespace pto::testing
