// CPU LinearAttention and CausalConvWithState against the reference interpreter (double
// precision), on every ISA with 1 and 2 threads: every update rule, per-head and per-key decay,
// beta per head and shared, past state or none, grouped query heads (1, 3, 4 and 6 per KV head:
// the kernel reads four at a time), value widths that leave vector tails, prefill and one-token
// decode; causal convs with and without bias, past state and SiLU, kernel sizes 1 to 5, rows
// shorter than the kernel. Forms the kernel declines go to the reference.
#include <gtest/gtest.h>

#include <cmath>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

struct Lin {
  const char* rule = "gated_delta";
  int64_t batch = 2, tokens = 5, hq = 4, hkv = 2, dk = 16, dv = 20;
  bool per_key_decay = false, shared_beta = false, past = true;
  double scale = 0.0;
  int outputs = 2;
};

NodeCase linear_case(const Lin& l) {
  const std::string rule = l.rule;
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  const int64_t B = l.batch, T = l.tokens;
  // Keys of norm about 1 (as the delta rule expects L2-normalized keys) keep the state bounded.
  const float ks = 1.0f / std::sqrt(static_cast<float>(l.dk));
  NodeCase c{"LinearAttention",
             {random_f32({B, T, l.hq * l.dk}, 1), random_f32({B, T, l.hkv * l.dk}, 2, -ks, ks),
              random_f32({B, T, l.hkv * l.dv}, 3)}};
  c.inputs.push_back(l.past ? random_f32({B, l.hkv, l.dk, l.dv}, 4) : Tensor());
  c.inputs.push_back(
      gated ? random_f32({B, T, l.per_key_decay ? l.hkv * l.dk : l.hkv}, 5, -0.5f, 0.0f)
            : Tensor());
  c.inputs.push_back(delta ? random_f32({B, T, l.shared_beta ? 1 : l.hkv}, 6, 0.0f, 1.0f)
                           : Tensor());
  while (!c.inputs.empty() && !c.inputs.back().defined()) c.inputs.pop_back();
  c.attrs.set("update_rule", rule);
  c.attrs.set("q_num_heads", l.hq);
  c.attrs.set("kv_num_heads", l.hkv);
  if (l.scale != 0.0) c.attrs.set("scale", l.scale);
  c.opset = 27;
  c.num_outputs = l.outputs;
  c.constant.assign(c.inputs.size(), false);
  return c;
}

const Tol kTol = {1e-4, 1e-5};

TEST(CpuLinearAttention, EveryUpdateRule) {
  for (const char* rule : {"linear", "gated", "delta", "gated_delta"})
    for (bool past : {false, true}) expect_matches(linear_case({.rule = rule, .past = past}), kTol);
}

TEST(CpuLinearAttention, DecayBetaAndScaleForms) {
  expect_matches(linear_case({.per_key_decay = true}), kTol);
  expect_matches(linear_case({.rule = "gated", .per_key_decay = true}), kTol);
  expect_matches(linear_case({.shared_beta = true}), kTol);
  expect_matches(linear_case({.rule = "delta", .shared_beta = true, .scale = 0.3}), kTol);
}

TEST(CpuLinearAttention, GroupedHeadsAndTails) {
  for (int64_t hq : {2, 6, 8, 12})  // 1, 3, 4 and 6 query heads per KV head
    expect_matches(linear_case({.hq = hq, .hkv = 2, .dv = 37}), kTol);
  expect_matches(linear_case({.batch = 1, .hq = 5, .hkv = 1, .dk = 7, .dv = 3}), kTol);
}

TEST(CpuLinearAttention, PrefillDecodeAndOneOutput) {
  expect_matches(linear_case({.batch = 1, .tokens = 64, .hq = 4, .hkv = 4, .dk = 32, .dv = 32}),
                 kTol);
  expect_matches(linear_case({.batch = 3, .tokens = 1, .per_key_decay = true}), kTol);
  expect_matches(linear_case({.outputs = 1}), kTol);
}

TEST(CpuLinearAttention, BadFormsGoToTheReference) {
  NodeCase c = linear_case({});
  c.attrs.set("update_rule", std::string("linear"));  // decay and beta given: an error
  std::vector<Tensor> feeds;
  Graph g = one_node(c, &feeds);
  Executable exe = compile(g, {.level = 0});
  EXPECT_THROW(exe.run(feeds), ValueError);
}

struct Causal {
  int64_t batch = 2, channels = 5, length = 9, k = 4;
  bool bias = true, past = true;
  const char* activation = "silu";
};

NodeCase causal_case(const Causal& cc) {
  NodeCase c{
      "CausalConvWithState",
      {random_f32({cc.batch, cc.channels, cc.length}, 11), random_f32({cc.channels, 1, cc.k}, 12)}};
  c.inputs.push_back(cc.bias ? random_f32({cc.channels}, 13) : Tensor());
  c.inputs.push_back(cc.past ? random_f32({cc.batch, cc.channels, cc.k - 1}, 14) : Tensor());
  while (!c.inputs.empty() && !c.inputs.back().defined()) c.inputs.pop_back();
  c.attrs.set("activation", std::string(cc.activation));
  c.opset = 27;
  c.num_outputs = 2;
  c.constant.assign(c.inputs.size(), false);
  c.constant[1] = true;
  return c;
}

TEST(CpuCausalConvWithState, Forms) {
  for (const char* act : {"none", "silu", "swish"})
    for (bool bias : {false, true})
      for (bool past : {false, true})
        expect_matches(causal_case({.bias = bias, .past = past, .activation = act}), kTol);
}

TEST(CpuCausalConvWithState, KernelSizesLengthsAndDecode) {
  for (int64_t k : {1, 2, 3, 5})
    for (int64_t length : {1, 3, 40})
      expect_matches(causal_case({.batch = 1, .channels = 33, .length = length, .k = k}), kTol);
}

}  // namespace
}  // namespace pto::testing
