// CPU RNN, GRU and LSTM against the reference interpreter, on every ISA with 1 and 2 threads:
// each direction and layout, sequence_lens (with 0 and full lengths), initial_h and initial_c,
// peepholes, clip, input_forget, GRU linear_before_reset 0 and 1, weights as initializers (packed
// at compile time) and as graph inputs, sizes that leave vector tails and split a step over the
// pool. Tolerance: the kernel sums in float where the reference sums in double, and the error
// of each step carries into the next; inputs and weights in [-1, 1] (scaled by 1/sqrt(H) for R).
// Non-default activations stay on the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cpu_reduce_test_util.h"

namespace pto::testing {
namespace {

const Tol kTol = {2e-4, 2e-5};

struct Rnn {
  const char* op = "LSTM";
  int64_t seq = 5, batch = 3, input = 7, hidden = 17;
  const char* direction = "forward";
  int64_t layout = 0;
  bool bias = true, lens = false, initial = false, peep = false, constant = true;
  Attributes extra;  // clip, input_forget, linear_before_reset, activations
  int outputs = 3;
};

int64_t gates(const Rnn& r) {
  const std::string op = r.op;
  return op == "LSTM" ? 4 : op == "GRU" ? 3 : 1;
}

NodeCase make_case(const Rnn& r) {
  const int64_t D = std::string(r.direction) == "bidirectional" ? 2 : 1, G = gates(r);
  const int64_t S = r.seq, B = r.batch, H = r.hidden;
  const bool lstm = std::string(r.op) == "LSTM";
  const Dims x = r.layout ? Dims{B, S, r.input} : Dims{S, B, r.input};
  const Dims state = r.layout ? Dims{B, D, H} : Dims{D, B, H};
  const float rs = 1.0f / std::sqrt(static_cast<float>(H));
  NodeCase c{r.op,
             {random_f32(x, 1), random_f32({D, G * H, r.input}, 2, -0.5f, 0.5f),
              random_f32({D, G * H, H}, 3, -rs, rs)}};
  c.inputs.push_back(r.bias ? random_f32({D, 2 * G * H}, 4) : Tensor());
  std::vector<int64_t> lens;
  for (int64_t b = 0; b < B; ++b) lens.push_back(b == 0 ? S : (b * 3) % (S + 1));
  c.inputs.push_back(
      r.lens ? Tensor::from_vector<int32_t>(std::vector<int32_t>(lens.begin(), lens.end()), {B})
             : Tensor());
  c.inputs.push_back(r.initial ? random_f32(state, 5) : Tensor());
  if (lstm) {
    c.inputs.push_back(r.initial ? random_f32(state, 6) : Tensor());
    c.inputs.push_back(r.peep ? random_f32({D, 3 * H}, 7) : Tensor());
  }
  Attributes a = r.extra;
  a.set("hidden_size", H);
  a.set("direction", std::string(r.direction));
  if (r.layout) a.set("layout", r.layout);
  c.attrs = a;
  c.opset = 14;
  c.num_outputs = lstm ? r.outputs : std::min(r.outputs, 2);
  c.constant.assign(c.inputs.size(), false);
  c.constant[1] = c.constant[2] = r.constant;
  c.constant[3] = true;
  return c;
}

void check(const Rnn& r, const std::string& backend = "cpu") {
  expect_matches(make_case(r), kTol, {}, backend);
}

TEST(CpuRecurrent, EveryCellDirectionAndLayout) {
  for (const char* op : {"RNN", "GRU", "LSTM"})
    for (const char* dir : {"forward", "reverse", "bidirectional"})
      for (int64_t layout : {0, 1}) check({.op = op, .direction = dir, .layout = layout});
}

TEST(CpuRecurrent, LensInitialStateAndNoBias) {
  for (const char* op : {"RNN", "GRU", "LSTM"})
    for (const char* dir : {"forward", "reverse", "bidirectional"})
      for (int64_t layout : {0, 1}) {
        check({.op = op,
               .batch = 4,
               .direction = dir,
               .layout = layout,
               .lens = true,
               .initial = true});
        check({.op = op, .direction = dir, .layout = layout, .bias = false, .constant = false});
      }
}

TEST(CpuRecurrent, LstmPeepholesClipAndInputForget) {
  for (const char* dir : {"forward", "bidirectional"}) {
    check({.direction = dir, .initial = true, .peep = true});
    Attributes clip;
    clip.set("clip", 0.7);
    check({.direction = dir, .initial = true, .peep = true, .extra = clip});
    Attributes forget;
    forget.set("input_forget", int64_t{1});
    check({.direction = dir, .lens = true, .peep = true, .extra = forget});
  }
}

TEST(CpuRecurrent, GruLinearBeforeResetAndClip) {
  for (int64_t lbr : {0, 1})
    for (const char* dir : {"forward", "reverse", "bidirectional"}) {
      Attributes a;
      a.set("linear_before_reset", lbr);
      check({.op = "GRU", .batch = 4, .direction = dir, .lens = true, .initial = true, .extra = a});
      a.set("clip", 0.5);
      check({.op = "GRU", .direction = dir, .extra = a});
    }
  Attributes clip;
  clip.set("clip", 0.3);
  check({.op = "RNN", .extra = clip});
}

// Hidden sizes that split a step over the pool (several blocks of units), batch 1 (the
// streaming case) and batches past the product's row blocks (8 rows on AVX-512, 4 on AVX2).
TEST(CpuRecurrent, LargeStepsAndBatchOne) {
  for (const char* op : {"GRU", "LSTM"}) {
    check({.op = op, .seq = 4, .batch = 1, .input = 33, .hidden = 150});
    check({.op = op, .seq = 3, .batch = 11, .input = 16, .hidden = 130, .lens = true});
  }
  Attributes a;
  a.set("linear_before_reset", int64_t{0});
  check(
      {.op = "GRU", .seq = 3, .batch = 5, .input = 9, .hidden = 200, .initial = true, .extra = a});
}

TEST(CpuRecurrent, OnlySomeOutputsAndEmptyBatch) {
  check({.outputs = 1});
  check({.op = "GRU", .outputs = 1});
  check({.batch = 0});
  check({.seq = 1, .batch = 2, .lens = true});
}

// Constant W and R are held packed only (the runtime releases the originals) and come back bit for
// bit from the packing.
TEST(CpuRecurrent, PackedWeightsReleasedAndGivenBack) {
  for (const char* op : {"GRU", "LSTM"}) {
    NodeCase c = make_case({.op = op, .hidden = 37, .direction = "bidirectional"});
    const std::vector<Tensor> want = {c.inputs[1].clone(), c.inputs[2].clone()};
    std::vector<Tensor> feeds;
    Graph g = one_node(c, &feeds);
    const std::vector<ValueId> ids = {g.nodes()[0].inputs[1], g.nodes()[0].inputs[2]};
    c.inputs.clear();  // the Executable holds the only copy
    CompileOptions o;
    o.level = 0;
    o.release_packed_weights = true;
    const Executable exe = compile(std::move(g), o);
    ASSERT_EQ(exe.node_backend(0), "cpu");
    EXPECT_EQ(exe.graph().released().size(), 2u) << op;
    const Graph full = exe.graph_with_weights();
    for (size_t i = 0; i < 2; ++i) {
      const Tensor& back = full.initializers().at(ids[i]);
      EXPECT_TRUE(back.shape() == want[i].shape() &&
                  std::memcmp(back.raw_data(), want[i].raw_data(), want[i].nbytes()) == 0)
          << op << " input " << i + 1;
    }
    expect_runs_match(full, exe, feeds, kTol);
  }
}

TEST(CpuRecurrent, OtherActivationsStayOnTheReference) {
  Attributes a;
  a.set("activations", std::vector<std::string>{"Relu"});
  check({.op = "RNN", .extra = a}, "reference");
  Attributes dflt;
  dflt.set("activations", std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"});
  check({.extra = dflt});
}

}  // namespace
}  // namespace pto::testing
