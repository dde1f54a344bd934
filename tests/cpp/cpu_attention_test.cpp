// CPU Attention (4-D, float32) against the reference interpreter, on every ISA with 1 and 2
// threads: query blocks that do not divide the sequence, grouped heads, float and boolean masks
// broadcast over batch, heads or rows, causal masking with more keys than queries, fully masked
// rows (zeros), 3-D packed heads ([B, S, H * D], read at row strides) and PyPTO's qkv_split (Q,
// K and V as the column ranges of one input), and the forms the fast path leaves to the reference
// (a KV cache, a mask shorter than the keys, a qkv_split that does not fit) giving the same
// answers. The flash-style kernel's seams: lengths
// around its task rows and key chunks, padding and causal spans that skip chunks, scores large
// enough that the running max moves at almost every chunk, head sizes off the register panels,
// every tile choice (PTO_ATTENTION_TILES), and plan_attention's sizes (linear scratch). The
// decode kernel (at most 8 task rows: one or a few queries times the group's heads) and split-K:
// lengths around its chunks and split ranges, groups, MQA, head sizes, every mask kind, forced
// split counts, the same bits on two runs, and rescaling scores.
//
// Tolerance: two float GEMMs of length D and L around a float softmax, against the reference's
// double: 64 ulp relative plus 64 ulp absolute for outputs of order 1. The online softmax's
// rescaling (one rounding of exp(m_old - m_new) and one multiply per chunk) stays within it.
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

#include "backend/cpu/attention_plan.h"
#include "backend/cpu/isa/isa.h"
#include "cpu_reduce_test_util.h"
#include "env_guard.h"

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

NodeCase packed(std::vector<Tensor> in, int64_t hq, int64_t hkv, bool causal = false,
                Dims split = {}) {
  NodeCase c = attention(std::move(in), causal);
  c.attrs.set("q_num_heads", hq);
  c.attrs.set("kv_num_heads", hkv);
  if (!split.empty()) c.attrs.set("qkv_split", split);
  return c;
}

TEST(CpuAttention, PackedHeadsAndQkvSplit) {
  // 3-D [B, S, H * D] inputs and output read and written at row strides, with grouped heads,
  // Dv != D, masks and causal; then Q, K and V as the columns of one [B, S, width] tensor
  // (qkv_split), as FoldAttentionHeads leaves a merged projection, on batch 2, a length off the
  // task rows, and a decode-sized call (one position of 8 heads).
  uint32_t seed = 900;
  struct Case {
    int64_t b, hq, hkv, sq, l, d, dv;
  };
  for (const Case& k :
       {Case{2, 3, 3, 5, 7, 4, 4}, Case{2, 4, 2, 70, 70, 32, 24}, Case{1, 12, 12, 129, 129, 64, 64},
        Case{2, 8, 8, 1, 1, 16, 16}, Case{1, 8, 2, 3, 3, 8, 8}}) {
    SCOPED_TRACE(::testing::Message() << k.b << "x" << k.hq << "/" << k.hkv << " q" << k.sq << " l"
                                      << k.l << " d" << k.d << " dv" << k.dv);
    const Tensor q = random_f32({k.b, k.sq, k.hq * k.d}, seed++, -2, 2);
    const Tensor kk = random_f32({k.b, k.l, k.hkv * k.d}, seed++, -2, 2);
    const Tensor v = random_f32({k.b, k.l, k.hkv * k.dv}, seed++);
    const Tensor mask = random_bool({k.b, 1, k.sq, k.l}, seed++);
    expect_matches(packed({q, kk, v}, k.hq, k.hkv), attention_tol());
    expect_matches(packed({q, kk, v, mask}, k.hq, k.hkv, true), attention_tol());
    if (k.sq != k.l) continue;
    const Dims split = {k.hq * k.d, k.hkv * k.d, k.hkv * k.dv};
    const Tensor x = random_f32({k.b, k.sq, split[0] + split[1] + split[2]}, seed++, -2, 2);
    expect_matches(packed({x, x, x}, k.hq, k.hkv, false, split), attention_tol());
    expect_matches(packed({x, x, x, mask}, k.hq, k.hkv, true, split), attention_tol());
  }
  // Split-K and short task rows on the strided forms.
  const Tensor x = random_f32({1, 40, 3 * 2 * 16}, seed++, -2, 2);
  for (const char* tiles : {"0,0,3", "16,0,2", "7,8,1"}) {
    SCOPED_TRACE(tiles);
    const EnvGuard env("PTO_ATTENTION_TILES", tiles);
    expect_matches(packed({x, x, x}, 2, 2, true, {32, 32, 32}), attention_tol());
  }
}

TEST(CpuAttention, FormsLeftToTheReference) {
  // A KV cache, a mask shorter than the keys (padded as masked) and a qkv_split whose widths do
  // not add up to the input's (the reference raises) run on the reference kernel inside the CPU
  // kernel: same answers.
  const Tensor x = random_f32({1, 4, 12}, 30);
  std::vector<Tensor> feeds;
  const Graph bad = one_node(packed({x, x, x}, 2, 2, false, {4, 4, 5}), &feeds);
  EXPECT_THROW(compile(bad, {.level = 0}).run(feeds), ValueError);
  const Tensor q = random_f32({1, 2, 3, 8}, 34), k = random_f32({1, 2, 3, 8}, 35),
               v = random_f32({1, 2, 3, 8}, 36);
  NodeCase cache =
      attention({q, k, v, Tensor(), random_f32({1, 2, 4, 8}, 37), random_f32({1, 2, 4, 8}, 38)});
  cache.num_outputs = 3;
  expect_matches(cache, attention_tol(), {}, "reference");  // declined at compile time
  expect_matches(attention({q, k, v, random_f32({3, 2}, 39)}), attention_tol());
}

TEST(CpuAttention, LengthsAroundTilesAndChunks) {
  uint32_t seed = 100;
  for (const int64_t n : {1, 7, 63, 64, 65, 129, 511, 512, 513, 1000}) {
    SCOPED_TRACE(::testing::Message() << "length " << n);
    // D = 32 keeps the planned chunk at 512 keys on a 1 MiB L2 (513 takes two chunks).
    const int64_t B = 2, H = 1, D = 32;
    const Tensor q = random_f32({B, H, n, D}, seed++, -1, 1);
    const Tensor k = random_f32({B, H, n, D}, seed++, -1, 1);
    const Tensor v = random_f32({B, H, n, D}, seed++);
    // Batch 1 padded: its last third of keys masked (chunks past the span are skipped).
    Tensor pad = Tensor::empty(DType::kBool, {B, 1, 1, n});
    for (int64_t j = 0; j < n; ++j) {
      pad.data<bool>()[j] = true;
      pad.data<bool>()[n + j] = j < n - n / 3;
    }
    expect_matches(attention({q, k, v}), attention_tol());
    expect_matches(attention({q, k, v}, true), attention_tol());
    expect_matches(attention({q, k, v, pad}, true), attention_tol());
    if (n < 500) {
      expect_matches(attention({q, k, v, pad}), attention_tol());
      expect_matches(attention({q, k, v, random_f32({n, n}, seed++, -2, 0)}), attention_tol());
    }
  }
}

TEST(CpuAttention, GroupedHeadsAndHeadSizes) {
  uint32_t seed = 200;
  for (const int64_t g : {1, 2, 4, 8})
    for (const int64_t hkv : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "group " << g << " kv heads " << hkv);
      const Tensor q = random_f32({1, g * hkv, 65, 32}, seed++, -2, 2);
      const Tensor k = random_f32({1, hkv, 129, 32}, seed++, -2, 2);
      const Tensor v = random_f32({1, hkv, 129, 24}, seed++);
      expect_matches(attention({q, k, v}), attention_tol());
      expect_matches(attention({q, k, v, random_bool({65, 129}, seed++)}, true), attention_tol());
    }
  for (const auto& [d, dv] : {std::pair<int64_t, int64_t>{8, 8},
                              {64, 64},
                              {80, 80},
                              {128, 128},
                              {80, 48},
                              {8, 128},
                              {128, 8}}) {
    SCOPED_TRACE(::testing::Message() << "d " << d << " dv " << dv);
    const Tensor q = random_f32({1, 1, 70, d}, seed++, -1, 1);
    const Tensor k = random_f32({1, 1, 300, d}, seed++, -1, 1);
    const Tensor v = random_f32({1, 1, 300, dv}, seed++);
    expect_matches(attention({q, k, v}), attention_tol());
    expect_matches(attention({q, k, v}, true), attention_tol());
  }
}

TEST(CpuAttention, CausalSpansAndFullyMaskedRows) {
  uint32_t seed = 300;
  // Causal (top-left) with fewer queries than keys and more: only the first keys are seen, or
  // the late rows see every key.
  for (const auto& [sq, l] : {std::pair<int64_t, int64_t>{5, 700}, {700, 5}, {300, 1100}}) {
    SCOPED_TRACE(::testing::Message() << "q " << sq << " l " << l);
    const Tensor q = random_f32({1, 2, sq, 16}, seed++, -2, 2);
    const Tensor k = random_f32({1, 2, l, 16}, seed++, -2, 2);
    const Tensor v = random_f32({1, 2, l, 16}, seed++);
    expect_matches(attention({q, k, v}, true), attention_tol());
    expect_matches(attention({q, k, v, random_bool({1, 1, 1, l}, seed++, 0.9)}, true),
                   attention_tol());
  }
  // Rows with no visible key give zeros: every row of one head, some rows of another, keys
  // visible only in the middle of the sequence (the chunks before and after are skipped), and
  // causal rows whose only visible keys lie after their position.
  const int64_t H = 3, S = 200, L = 600;
  Tensor m = random_bool({1, H, S, L}, seed++, 0.7);
  bool* p = m.data<bool>();
  for (int64_t j = 0; j < S * L; ++j) p[j] = false;  // head 0: nothing visible
  for (int64_t i = 0; i < S; i += 3)
    for (int64_t j = 0; j < L; ++j) p[(S + i) * L + j] = false;  // head 1: every third row
  for (int64_t i = 0; i < S; ++i)
    for (int64_t j = 0; j < L; ++j) p[(2 * S + i) * L + j] = j >= 250 && j < 380;  // head 2
  const Tensor q = random_f32({1, H, S, 16}, seed++, -2, 2);
  const Tensor k = random_f32({1, H, L, 16}, seed++, -2, 2);
  const Tensor v = random_f32({1, H, L, 16}, seed++);
  expect_matches(attention({q, k, v, m}), attention_tol());
  expect_matches(attention({q, k, v, m}, true), attention_tol());
}

// A mask of exactly the top-left causal pattern (a decoder's from transformers' SDPA path: GPT-2
// builds [1, 1, S, S] booleans) runs as is_causal without it; near misses keep the mask. Both
// against the reference, with and without is_causal, on boolean and additive masks.
Tensor causal_mask(Dims shape, DType dtype) {
  Tensor m = Tensor::empty(dtype, shape);
  const int64_t L = shape.back(), S = shape[shape.size() - 2];
  for (int64_t i = 0; i < m.numel(); ++i) {
    const bool visible = i % L <= i / L % S;
    if (dtype == DType::kBool)
      m.data<bool>()[i] = visible;
    else
      m.data<float>()[i] = visible ? 0.0f : -std::numeric_limits<float>::infinity();
  }
  return m;
}

TEST(CpuAttention, CausalMasksRunAsCausal) {
  uint32_t seed = 700;
  struct Case {
    int64_t h, sq, l;
    Dims mask;
  };
  for (const Case& k :
       {Case{12, 128, 128, {1, 1, 128, 128}}, Case{3, 70, 70, {70, 70}},
        Case{2, 5, 9, {2, 2, 5, 9}}, Case{2, 9, 5, {1, 2, 9, 5}}, Case{1, 300, 300, {300, 300}}}) {
    SCOPED_TRACE(::testing::Message()
                 << "h " << k.h << " q " << k.sq << " l " << k.l << " mask " << dims_str(k.mask));
    const int64_t b = k.mask.size() == 4 ? k.mask[0] : 1;
    const int64_t full[4] = {b, k.h, k.sq, k.l};
    const Tensor q = random_f32({b, k.h, k.sq, 64}, seed++, -2, 2);
    const Tensor kk = random_f32({b, k.h, k.l, 64}, seed++, -2, 2);
    const Tensor v = random_f32({b, k.h, k.l, 64}, seed++);
    for (DType dt : {DType::kBool, DType::kF32}) {
      const Tensor m = causal_mask(k.mask, dt);
      EXPECT_TRUE(cpu::is_causal_mask(m, full)) << dtype_name(dt);
      expect_matches(attention({q, kk, v, m}), attention_tol());
      expect_matches(attention({q, kk, v, m}, true), attention_tol());
      // Near misses run with the mask: one hidden key inside the causal span (key 0 of the last
      // row), one visible key past it (first row), an additive mask of -1e9 in place of -inf.
      Tensor hidden = causal_mask(k.mask, dt), extra = causal_mask(k.mask, dt);
      const int64_t last = hidden.numel() - k.l;
      if (dt == DType::kBool) {
        hidden.data<bool>()[last] = false;
        if (k.l > 1) extra.data<bool>()[1] = true;
      } else {
        hidden.data<float>()[last] = -std::numeric_limits<float>::infinity();
        if (k.l > 1) extra.data<float>()[1] = 0.0f;
      }
      EXPECT_FALSE(cpu::is_causal_mask(hidden, full));
      EXPECT_FALSE(cpu::is_causal_mask(extra, full));
      expect_matches(attention({q, kk, v, hidden}), attention_tol());
      expect_matches(attention({q, kk, v, extra}), attention_tol());
      if (dt == DType::kF32) {
        Tensor soft = causal_mask(k.mask, dt);
        for (int64_t i = 0; i < soft.numel(); ++i)
          if (soft.data<float>()[i] != 0.0f) soft.data<float>()[i] = -1e9f;
        EXPECT_FALSE(cpu::is_causal_mask(soft, full));
        expect_matches(attention({q, kk, v, soft}), attention_tol());
      }
    }
  }
  // One row per query is required: a [1, L] mask broadcast over the queries is not causal.
  const int64_t full[4] = {1, 1, 4, 4};
  EXPECT_FALSE(cpu::is_causal_mask(causal_mask({1, 4}, DType::kBool), full));
}

TEST(CpuAttention, SoftcapBeforeTheMask) {
  // Gemma-2's soft cap c tanh(s / c) on the scaled scores, then a float mask or causal; prefill
  // and decode, grouped heads; a softcap of 0 or below is none (the reference's rule).
  for (double cap : {50.0, 2.0, 0.5, -1.0}) {
    const Tensor q = random_f32({1, 4, 37, 16}, 60), k = random_f32({1, 2, 70, 16}, 61),
                 v = random_f32({1, 2, 70, 24}, 62);
    NodeCase c = attention({q, k, v, random_f32({1, 1, 37, 70}, 63)}, false, 0.9);
    c.attrs.set("softcap", cap);
    expect_matches(c, attention_tol());
    NodeCase causal = attention({q, k, v}, true);
    causal.attrs.set("softcap", cap);
    expect_matches(causal, attention_tol());
    NodeCase decode = attention({random_f32({2, 4, 1, 16}, 64), random_f32({2, 4, 300, 16}, 65),
                                 random_f32({2, 4, 300, 16}, 66)});
    decode.attrs.set("softcap", cap);
    expect_matches(decode, attention_tol());
  }
}

TEST(CpuAttention, LargeScoresRescaleOften) {
  // Scores scaled by 30 over 4097 keys: the running max grows at many chunks, and most
  // exponentials underflow; O must be rescaled each time without losing the rows' mass.
  const Tensor q = random_f32({1, 2, 33, 16}, 400, -1, 1);
  const Tensor k = random_f32({1, 2, 4097, 16}, 401, -1, 1);
  const Tensor v = random_f32({1, 2, 4097, 16}, 402);
  expect_matches(attention({q, k, v}, false, 30.0), attention_tol());
  expect_matches(attention({q, k, v}, true, 30.0), attention_tol());
  // Keys ordered so that each chunk holds larger scores than the last: a rescale at every chunk
  // (scores up to 16: larger ones lose digits to their own rounding in float, on any kernel).
  Tensor ks = random_f32({1, 1, 2000, 8}, 403, 0, 1);
  for (int64_t j = 0; j < 2000; ++j)
    for (int64_t c = 0; c < 8; ++c) ks.data<float>()[j * 8 + c] = 0.001f * static_cast<float>(j);
  expect_matches(
      attention({random_f32({1, 1, 40, 8}, 404, 0.5, 1), ks, random_f32({1, 1, 2000, 8}, 405)},
                false, 1.0),
      attention_tol());
}

TEST(CpuAttention, TheRowMaxSeesEveryKey) {
  // One key scores 160 (q . k), the others 0: exp(s - max) overflows unless the max taken over
  // the chunk sees that key, wherever it sits in the chunk's vectors (the max loop runs four
  // vectors at a time, then the rest one at a time, masked past the last key).
  for (int64_t keys : {int64_t{70}, int64_t{256}, int64_t{300}})
    for (int64_t hot : {int64_t{0}, int64_t{17}, int64_t{50}, int64_t{63}, int64_t{69}})
      for (int64_t at : {hot, keys - 1 - hot}) {
        SCOPED_TRACE(::testing::Message() << keys << " keys, hot key " << at);
        const Tensor q = Tensor::from_vector(std::vector<float>(48, 1.0f), {1, 1, 3, 16});
        Tensor k = Tensor::zeros(DType::kF32, {1, 1, keys, 16});
        for (int64_t c = 0; c < 16; ++c) k.data<float>()[at * 16 + c] = 10.0f;
        expect_matches(attention({q, k, random_f32({1, 1, keys, 16}, 410)}, false, 1.0),
                       attention_tol());
      }
}

TEST(CpuAttention, EveryTileChoiceAgrees) {
  const Tensor q = random_f32({2, 4, 77, 40}, 500, -2, 2),
               k = random_f32({2, 2, 301, 40}, 501, -2, 2), v = random_f32({2, 2, 301, 24}, 502);
  const Tensor mask = random_bool({2, 1, 77, 301}, 503, 0.6);
  for (const char* tiles : {"1,1", "1,301", "3,5", "7,64", "77,1024", "200,2000", "0,17", "13,0"}) {
    SCOPED_TRACE(tiles);
    const EnvGuard env("PTO_ATTENTION_TILES", tiles);
    expect_matches(attention({q, k, v}), attention_tol());
    expect_matches(attention({q, k, v, mask}, true), attention_tol());
  }
}

// Cycles through head sizes (Dv != D among them) so that each decode shape meets several.
std::pair<int64_t, int64_t> head_sizes(int64_t i) {
  static const std::pair<int64_t, int64_t> kSizes[] = {{8, 8},     {64, 64}, {80, 48},
                                                       {128, 128}, {64, 80}, {128, 8}};
  return kSizes[i % std::size(kSizes)];
}

// The largest |a - b| over two tensors' elements.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    d = std::max(d, std::fabs(a.item_as_double(i) - b.item_as_double(i)));
  return d;
}

// precision="bf16" / "f16" (AutoMixedPrecision): both products take rounded operands (Q, K, then
// the unnormalized probabilities and V). The kernel against the reference under the same
// attribute, within a tolerance far below the gap between the reference with and without it
// (so a kernel computing in fp32 fails), on every ISA and 1 and 2 threads, with the AMX tiles
// and VDPBF16PS on and off (rows from 16 run on the tiles): grouped heads, odd lengths, float and
// boolean masks, causal, several key chunks. The decode kernel (few rows) computes in fp32
// whatever the precision: it matches the fp32 reference to the fp32 tolerance.
TEST(CpuAttention, ReducedPrecisionRoundsBothProducts) {
  struct Case {
    int64_t b, hq, hkv, sq, l, d, dv;
    int mask;           // 0 none, 1 float, 2 boolean, 3 causal
    const char* tiles;  // PTO_ATTENTION_TILES, or null
  };
  uint32_t seed = 900;
  for (const char* precision : {"bf16", "f16"})
    for (const Case& k :
         {Case{1, 12, 12, 128, 128, 64, 64, 0, nullptr}, Case{2, 4, 2, 70, 70, 32, 24, 1, nullptr},
          Case{1, 2, 1, 37, 300, 64, 64, 2, nullptr}, Case{1, 4, 4, 200, 200, 64, 64, 3, nullptr},
          Case{1, 3, 3, 40, 50, 64, 64, 0, "9,32"}}) {  // tasks of 9 rows: below the tiles
      EnvGuard tiles_env("PTO_ATTENTION_TILES", k.tiles ? k.tiles : "");
      SCOPED_TRACE(::testing::Message() << precision << " " << k.b << "x" << k.hq << "/" << k.hkv
                                        << " q" << k.sq << " l" << k.l << " mask " << k.mask);
      // Scores of order 10: rounding Q and K moves them (and the result) well past the tolerance.
      std::vector<Tensor> in = {random_f32({k.b, k.hq, k.sq, k.d}, seed++, -4, 4),
                                random_f32({k.b, k.hkv, k.l, k.d}, seed++, -4, 4),
                                random_f32({k.b, k.hkv, k.l, k.dv}, seed++)};
      if (k.mask == 1) in.push_back(random_f32({k.sq, k.l}, seed++, -3, 1));
      if (k.mask == 2) in.push_back(random_bool({k.b, 1, 1, k.l}, seed++));
      NodeCase c = attention(in, k.mask == 3, 0.125);
      std::vector<Tensor> feeds, same;
      const Graph fp32 = one_node(c, &feeds);
      const Tensor exact = reference::run(fp32, feeds)[0];
      c.attrs.set("precision", std::string(precision));
      const Graph g = one_node(c, &same);
      const Tensor rounded = reference::run(g, feeds)[0];
      const Tol tol{0, std::string(precision) == "bf16" ? 4e-3 : 6e-4};
      EXPECT_GT(max_abs_diff(exact, rounded), 2 * tol.atol);  // the attribute has an effect
      const Executable exe = compile(g, {.level = 0});
      ASSERT_EQ(exe.node_backend(0), "cpu");
      for (const int off : {0, 1, 2}) {  // nothing off; the tiles off; the tiles and pairs off
        std::optional<cpu::ExtScope> tiles, pairs;
        if (off >= 1) tiles.emplace(cpu::Ext::kAmxBf16);
        if (off >= 2) pairs.emplace(cpu::Ext::kAvx512Bf16);
        SCOPED_TRACE(::testing::Message() << "extensions off: " << off);
        expect_runs_match(g, exe, feeds, tol);
      }
    }
  // A decode step (one query, 8 heads over 2): fp32 whatever the precision.
  const Tensor q = random_f32({1, 8, 1, 64}, 950, -4, 4),
               k = random_f32({1, 2, 600, 64}, 951, -4, 4), v = random_f32({1, 2, 600, 64}, 952);
  NodeCase c = attention({q, k, v}, false, 0.125);
  std::vector<Tensor> feeds, same;
  const Graph fp32 = one_node(c, &feeds);
  c.attrs.set("precision", std::string("bf16"));
  const Executable exe = compile(one_node(c, &same), {.level = 0});
  expect_runs_match(fp32, exe, feeds, attention_tol());
}

TEST(CpuAttention, DecodeLengthsGroupsAndHeadSizes) {
  uint32_t seed = 600;
  int64_t n = 0;
  // (query heads, kv heads): no grouping, groups of 4 and 8 (the decode kernel's most rows), MQA.
  for (const int64_t l : {1, 7, 513, 4096, 4097})
    for (const int64_t sq : {1, 2, 3, 8})
      for (const auto& [h, hkv] :
           {std::pair<int64_t, int64_t>{2, 2}, {8, 2}, {8, 1}, {3, 1}, {16, 2}}) {
        if (l >= 4096 && (sq == 3 || h == 3)) continue;  // the reference's time
        const auto [d, dv] = head_sizes(n++);
        SCOPED_TRACE(::testing::Message() << "q " << sq << " l " << l << " heads " << h << "/"
                                          << hkv << " d " << d << " dv " << dv);
        const Tensor q = random_f32({1, h, sq, d}, seed++, -2, 2);
        const Tensor k = random_f32({1, hkv, l, d}, seed++, -2, 2);
        const Tensor v = random_f32({1, hkv, l, dv}, seed++);
        expect_matches(attention({q, k, v}), attention_tol());
      }
}

TEST(CpuAttention, DecodeMasks) {
  uint32_t seed = 700;
  const int64_t B = 2, H = 4, Hkv = 2, L = 1100, D = 64;
  for (const int64_t sq : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "q " << sq);
    const Tensor q = random_f32({B, H, sq, D}, seed++, -2, 2);
    const Tensor k = random_f32({B, Hkv, L, D}, seed++, -2, 2);
    const Tensor v = random_f32({B, Hkv, L, D}, seed++);
    for (const Dims& m : {Dims{L}, Dims{sq, L}, Dims{B, 1, 1, L}, Dims{1, H, sq, L},
                          Dims{B, H, sq, L}, Dims{B, 1, sq, L}}) {
      SCOPED_TRACE(dims_str(m));
      expect_matches(attention({q, k, v, random_f32(m, seed++, -3, 1)}), attention_tol());
      expect_matches(attention({q, k, v, random_bool(m, seed++)}), attention_tol());
      expect_matches(attention({q, k, v, random_bool(m, seed++)}, true), attention_tol());
    }
    // Causal with fewer queries than keys (top-left: query i sees keys <= i only), alone and
    // with padding (batch 1's keys from 700 on hidden: the later split ranges see nothing).
    expect_matches(attention({q, k, v}, true), attention_tol());
    Tensor pad = Tensor::empty(DType::kBool, {B, 1, 1, L});
    for (int64_t j = 0; j < L; ++j) {
      pad.data<bool>()[j] = j >= 3;
      pad.data<bool>()[L + j] = j < 700;
    }
    expect_matches(attention({q, k, v, pad}), attention_tol());
    expect_matches(attention({q, k, v, pad}, true), attention_tol());
    // Rows with no visible key give zeros: head 1 of batch 0 (every query), float -inf in
    // batch 1's head 3, and keys visible only in the middle (the other chunks skipped).
    Tensor hide = random_bool({B, H, sq, L}, seed++);
    Tensor neg = random_f32({B, H, sq, L}, seed++, -2, 0);
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t j = 0; j < L; ++j) {
        hide.data<bool>()[((0 * H + 1) * sq + i) * L + j] = false;
        hide.data<bool>()[((1 * H + 2) * sq + i) * L + j] = j >= 600 && j < 640;
        neg.data<float>()[((1 * H + 3) * sq + i) * L + j] = -INFINITY;
      }
    expect_matches(attention({q, k, v, hide}), attention_tol());
    expect_matches(attention({q, k, v, neg}), attention_tol());
  }
}

TEST(CpuAttention, ForcedSplitsAgree) {
  // Split-K forced on decode (1 and 8 task rows) and on prefill tasks, with masks and causal:
  // every split count gives the reference's answer.
  uint32_t seed = 800;
  const Tensor mask = random_bool({1, 1, 1, 2000}, seed++, 0.7);
  for (const auto& [h, hkv, sq] :
       {std::tuple<int64_t, int64_t, int64_t>{3, 3, 1}, {8, 1, 1}, {4, 2, 2}, {2, 1, 40}}) {
    const Tensor q = random_f32({1, h, sq, 64}, seed++, -2, 2);
    const Tensor q_small = random_f32({1, h, sq, 64}, seed++, -0.1, 0.1);
    const Tensor k = random_f32({1, hkv, 2000, 64}, seed++, -2, 2);
    const Tensor v = random_f32({1, hkv, 2000, 48}, seed++);
    for (const char* tiles :
         {"0,0,1", "0,0,2", "0,0,3", "0,0,7", "0,64,7", "0,100,3", "0,0,2000", "16,0,3"}) {
      SCOPED_TRACE(::testing::Message()
                   << "heads " << h << "/" << hkv << " q " << sq << " tiles " << tiles);
      const EnvGuard env("PTO_ATTENTION_TILES", tiles);
      expect_matches(attention({q, k, v}), attention_tol());
      expect_matches(attention({q, k, v, mask}), attention_tol());
      expect_matches(attention({q, k, v, mask}, true), attention_tol());
      // Scores up to about 50 (larger ones lose digits to the float rounding of the
      // scores themselves, on any kernel).
      expect_matches(attention({q_small, k, v}, false, 30.0), attention_tol());
    }
  }
}

TEST(CpuAttention, SplitsGiveTheSameBitsEachRun) {
  // A fixed thread count fixes the split and the merge order: two runs give the same bits.
  for (const char* tiles : {"", "0,0,3", "0,96,7"}) {
    SCOPED_TRACE(tiles);
    const EnvGuard env("PTO_ATTENTION_TILES", tiles);
    std::vector<Tensor> feeds;
    const Graph g = one_node(
        attention({random_f32({1, 4, 1, 64}, 900, -2, 2), random_f32({1, 1, 5000, 64}, 901, -2, 2),
                   random_f32({1, 1, 5000, 64}, 902)}),
        &feeds);
    const Executable exe = compile(g, {.level = 0});
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const Tensor a = exe.run(feeds)[0], b = exe.run(feeds)[0];
      EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.numel() * sizeof(float)), 0)
          << threads << " thread(s)";
    }
    set_num_threads(0);
  }
}

TEST(CpuAttention, DecodeLargeScoresRescaleOften) {
  // Scores scaled by 30 over 4097 keys, and keys ordered so that every chunk raises the running
  // max: the decode kernel's O rescaled at each chunk, in every split range.
  const Tensor q = random_f32({1, 8, 1, 16}, 950, -1, 1);
  const Tensor k = random_f32({1, 2, 4097, 16}, 951, -1, 1);
  const Tensor v = random_f32({1, 2, 4097, 16}, 952);
  expect_matches(attention({q, k, v}, false, 30.0), attention_tol());
  Tensor ks = random_f32({1, 1, 3000, 8}, 953, 0, 1);
  for (int64_t j = 0; j < 3000; ++j)
    for (int64_t c = 0; c < 8; ++c) ks.data<float>()[j * 8 + c] = 0.0005f * static_cast<float>(j);
  for (const char* tiles : {"0,0,1", "0,0,3"}) {
    const EnvGuard env("PTO_ATTENTION_TILES", tiles);
    expect_matches(
        attention({random_f32({1, 2, 1, 8}, 954, 0.5, 1), ks, random_f32({1, 1, 3000, 8}, 955)},
                  false, 1.0),
        attention_tol());
  }
}

TEST(CpuAttention, PlanFitsL2AndScratchIsLinear) {
  CacheModel cache;
  cache.l1d = 48 << 10;
  cache.l2 = 1 << 20;
  cache.l3 = 32 << 20;
  const int64_t nr = 64;
  // The sizes of the plan's derivation (attention_plan.cpp, docs/fusion.md): 256 task rows and
  // 512 keys per chunk at D = 64, 256 keys at D = 128 (4 heads of the group x 64 positions),
  // both within L2; causal at most a quarter of the queries per task.
  const cpu::AttentionPlan d64 = cpu::plan_attention({1, 12, 12, 2048, 2048, 64, 64}, 2, cache, nr);
  EXPECT_EQ(d64.task_rows, 256);
  EXPECT_EQ(d64.block, 512);
  const cpu::AttentionPlan d128 =
      cpu::plan_attention({1, 32, 8, 2048, 2048, 128, 128}, 2, cache, nr);
  EXPECT_EQ(d128.task_rows, 256);
  EXPECT_EQ(d128.rows, 64);
  EXPECT_EQ(d128.block, 256);
  EXPECT_EQ(cpu::plan_attention({1, 12, 12, 512, 512, 64, 64, true}, 2, cache, nr).rows, 128);
  // Short sequences: the chunk does not outgrow the keys; few tasks: fewer rows per task.
  EXPECT_EQ(cpu::plan_attention({1, 1, 1, 100, 100, 64, 64}, 1, cache, nr).block, 100);
  EXPECT_EQ(cpu::plan_attention({1, 1, 1, 512, 512, 64, 64}, 2, cache, nr).tasks, 4);
  // Scratch does not grow with the sequence: bounded by L2 at 64K keys, equal at S and 4S.
  for (const int64_t d : {64, 128}) {
    const size_t s =
        cpu::plan_attention({1, 12, 12, 16384, 16384, d, d}, 2, cache, nr).scratch_bytes;
    const size_t s4 =
        cpu::plan_attention({1, 12, 12, 65536, 65536, d, d}, 2, cache, nr).scratch_bytes;
    EXPECT_EQ(s, s4);
    EXPECT_LE(s4, cache.l2);
  }
  const cpu::AttentionTiles tiles{.rows = 5, .block = 3000};
  const cpu::AttentionPlan over =
      cpu::plan_attention({1, 2, 1, 100, 700, 64, 64}, 2, cache, nr, &tiles);
  EXPECT_EQ(over.rows, 5);
  EXPECT_EQ(over.block, 700);  // clamped to the keys
  EXPECT_EQ(over.task_rows, 10);
  EXPECT_EQ(over.splits, 1);
  // Decode: tasks of at most 8 rows (queries x group; all the queries when they fit) up to 32
  // rows per kv head and a group of at most 8; split only on several threads with fewer than two
  // tasks per thread, in ranges of at least 512 keys.
  struct Expect {
    cpu::AttentionShape shape;
    int threads;
    bool decode;
    int64_t rows, tasks, splits;
  };
  for (const Expect& e : {Expect{{1, 12, 12, 1, 4096, 64, 64}, 2, true, 1, 12, 1},
                          Expect{{1, 32, 8, 2, 4096, 128, 128}, 2, true, 2, 8, 1},
                          Expect{{1, 12, 12, 32, 4096, 64, 64}, 1, true, 8, 48, 1},
                          Expect{{1, 32, 8, 8, 4096, 128, 128}, 1, true, 2, 32, 1},
                          Expect{{1, 12, 12, 33, 4096, 64, 64}, 1, false, 33, 12, 1},
                          Expect{{1, 4, 1, 1, 4096, 64, 64}, 2, true, 1, 1, 4},
                          Expect{{1, 4, 1, 1, 4096, 64, 64}, 1, true, 1, 1, 1},
                          Expect{{1, 4, 1, 1, 4096, 64, 64}, 3, true, 1, 1, 6},
                          Expect{{1, 4, 1, 1, 1000, 64, 64}, 2, true, 1, 1, 1},
                          // A group of 32 (over 8): the GEMM path, split.
                          Expect{{1, 32, 1, 1, 4096, 64, 64}, 2, false, 1, 1, 4}}) {
    const cpu::AttentionShape& x = e.shape;
    SCOPED_TRACE(::testing::Message() << x.heads << "/" << x.kv_heads << " q" << x.queries << " l"
                                      << x.keys << " threads " << e.threads);
    const cpu::AttentionPlan p = cpu::plan_attention(x, e.threads, cache, nr);
    EXPECT_EQ(p.decode, e.decode);
    EXPECT_EQ(p.rows, e.rows);
    EXPECT_EQ(p.tasks, e.tasks);
    EXPECT_EQ(p.splits, e.splits);
    EXPECT_EQ(p.partial_bytes > 0, e.splits > 1);
  }
  const cpu::AttentionTiles split{.splits = 9000};
  EXPECT_EQ(cpu::plan_attention({1, 4, 1, 1, 4096, 64, 64}, 2, cache, nr, &split).splits, 4096);
}

}  // namespace
}  // namespace pto::testing
