// Add+LayerNormalization and Add+RMSNormalization groups (fusion/sum_norm.h): the norm kernel
// computes its input's sum of operands as it loads each row. Against the reference interpreter on
// every ISA with 1 and 2 threads (norm tolerance; the sums written out exactly), and bit for bit
// against the unfused graph's kernels: the reference's Adds (float additions in the same order),
// then the norm's CPU kernel on their sum.
#include <cstdlib>
#include <cstring>

#include "cpu_reduce_test_util.h"
#include "pto/memory_policy.h"

namespace pto::testing {
namespace {

constexpr double kUlp = 0x1p-23;
const Tol kNormTol = {32 * kUlp, 32 * kUlp};

// A sum of operands feeding a norm: operand shapes, and per Add its terms (>= 0 an operand,
// < 0 the result of Add -1 - t); the last Add is the norm's input.
struct SumCase {
  std::vector<Dims> operands;
  std::vector<std::pair<int, int>> adds;
  std::string norm = "LayerNormalization";
  std::vector<size_t> sum_outputs;  // Adds whose results are also graph outputs
  bool bias = true;
  int64_t axis = -1;
};

// The graph of `c` on random operands (`feeds`), Scale and B initializers of the normalized shape.
Graph sum_graph(const SumCase& c, uint32_t seed, std::vector<Tensor>* feeds) {
  Graph g;
  std::vector<ValueId> ops, sums;
  for (size_t i = 0; i < c.operands.size(); ++i) {
    feeds->push_back(random_f32(c.operands[i], seed++, -2, 3));
    ops.push_back(g.add_input(cat("x", i), {DType::kF32, to_shape(c.operands[i])}));
  }
  for (size_t i = 0; i < c.adds.size(); ++i) {
    auto term = [&](int t) { return t >= 0 ? ops[t] : sums[static_cast<size_t>(-1 - t)]; };
    sums.push_back(g.add_value(cat("s", i)));
    g.add_node("Add", {term(c.adds[i].first), term(c.adds[i].second)}, {sums.back()}, {},
               cat("add", i), 17);
  }
  const Dims& full = c.operands[0];
  const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(full.size()) : c.axis;
  const Dims normalized(full.begin() + axis, full.end());
  std::vector<ValueId> ins = {sums.back(), g.add_value("scale")};
  g.set_initializer(ins[1], random_f32(normalized, seed++, 0.5f, 1.5f));
  if (c.bias && c.norm == "LayerNormalization") {
    ins.push_back(g.add_value("bias"));
    g.set_initializer(ins[2], random_f32(normalized, seed++));
  }
  const ValueId y = g.add_value("y");
  Attributes attrs;
  attrs.set("axis", c.axis);
  attrs.set("epsilon", 1e-5);
  g.add_node(c.norm, ins, {y}, attrs, "norm", 23);
  g.add_output(y);
  for (size_t a : c.sum_outputs) g.add_output(sums[a]);
  infer_types(g);
  return g;
}

std::string describe(const SumCase& c) {
  std::string s = cat(c.norm, " of");
  for (const Dims& d : c.operands) s = cat(s, " ", dims_str(d));
  return cat(s, ", ", c.adds.size(), " adds, ", c.sum_outputs.size(), " sums out, axis ", c.axis);
}

// Every Add's result as the reference computes it, in the graph's order.
std::vector<Tensor> reference_sums(const SumCase& c, const std::vector<Tensor>& feeds) {
  std::vector<Tensor> sums;
  for (auto [l, r] : c.adds) {
    Graph g;
    auto term = [&](int t) { return t >= 0 ? feeds[t] : sums[static_cast<size_t>(-1 - t)]; };
    const Tensor a = term(l), b = term(r);
    const ValueId x = g.add_input("a", {DType::kF32, to_shape(a.shape())});
    const ValueId w = g.add_input("b", {DType::kF32, to_shape(b.shape())});
    const ValueId y = g.add_value("y");
    g.add_node("Add", {x, w}, {y}, {}, "add", 17);
    g.add_output(y);
    infer_types(g);
    sums.push_back(reference::run(g, {a, b})[0]);
  }
  return sums;
}

// The graph of `c` at level 2 is one kernel, the norm's, that matches the reference (norm
// tolerance for Y, exactly for the sums written out) on every ISA with 1 and 2 threads, and gives
// the bits of the norm's own CPU kernel run on the reference's sum.
void expect_fused_matches(const SumCase& c, uint32_t seed = 1) {
  SCOPED_TRACE(describe(c));
  std::vector<Tensor> feeds;
  const Graph g = sum_graph(c, seed, &feeds);
  const Executable exe = compile(g, {.level = 2});
  ASSERT_EQ(exe.num_steps(), 1u);
  EXPECT_EQ(exe.step(0).backend, "cpu");
  EXPECT_EQ(exe.step(0).rule, cat("Add+", c.norm));
  expect_runs_match(g, exe, feeds, kNormTol);

  // The unfused graph's second kernel: the norm alone on the reference's sum.
  const std::vector<Tensor> sums = reference_sums(c, feeds);
  Graph ng;
  const Node& norm = g.nodes().back();
  std::vector<ValueId> ins = {ng.add_input("x", {DType::kF32, to_shape(sums.back().shape())})};
  for (size_t i = 1; i < norm.inputs.size(); ++i) {
    ins.push_back(ng.add_value(g.value(norm.inputs[i]).name));
    ng.set_initializer(ins.back(), *g.initializer(norm.inputs[i]));
  }
  const ValueId y = ng.add_value("y");
  ng.add_node(norm.op, ins, {y}, norm.attrs, "norm", 23);
  ng.add_output(y);
  infer_types(ng);
  const Executable alone = compile(ng, {.level = 0});
  ASSERT_EQ(alone.node_backend(0), "cpu");
  for (cpu::Isa isa : cpu::supported_isas()) {
    cpu::IsaScope scope(isa);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      const std::vector<Tensor> got = exe.run(feeds);
      const Tensor want = alone.run({sums.back()})[0];
      ASSERT_EQ(got.size(), 1 + c.sum_outputs.size());
      ASSERT_EQ(got[0].shape(), want.shape());
      EXPECT_EQ(std::memcmp(got[0].raw_data(), want.raw_data(), want.nbytes()), 0)
          << cpu::isa_name(isa) << ", " << threads << " thread(s): Y differs from the unfused";
      for (size_t k = 0; k < c.sum_outputs.size(); ++k) {
        const Tensor& s = sums[c.sum_outputs[k]];
        ASSERT_EQ(got[1 + k].shape(), s.shape());
        EXPECT_EQ(std::memcmp(got[1 + k].raw_data(), s.raw_data(), s.nbytes()), 0)
            << cpu::isa_name(isa) << ", " << threads << " thread(s): sum " << k << " differs";
      }
    }
  }
  set_num_threads(0);
}

// Two and three operands (a chain and a tree), every row length from 1 through the short-row
// kernel's (<= 4 vectors), row by row (768, 4099) and the streamed long rows, rows of 1.
TEST(CpuAddNorm, SumsOfTwoAndThreeOperands) {
  uint32_t seed = 1;
  for (const char* norm : {"LayerNormalization", "RMSNormalization"})
    for (int64_t n : {1, 7, 17, 64, 768, 4099})
      for (int64_t rows : {1, 5, 37}) {
        const Dims x = {rows, n};
        expect_fused_matches({{x, x}, {{0, 1}}, norm}, seed++);
        expect_fused_matches({{x, x, x}, {{0, 1}, {-1, 2}}, norm}, seed++);
        // (a + b) + (c + d): two partial sums
        expect_fused_matches({{x, x, x, x}, {{0, 1}, {2, 3}, {-1, -2}}, norm}, seed++);
      }
}

// Operands repeated over rows: position embeddings [seq, n] on [batch, seq, n], a bias [n]
// ([1, 1, n]), an operand read twice (x + x), and BERT's embedding sum word + position + type.
TEST(CpuAddNorm, RowBroadcastOperands) {
  uint32_t seed = 100;
  for (int64_t n : {1, 17, 768}) {
    const Dims x = {3, 11, n}, pos = {11, n}, vec = {n}, vec3 = {1, 1, n};
    expect_fused_matches({{x, pos}, {{0, 1}}}, seed++);
    expect_fused_matches({{pos, x}, {{1, 0}}}, seed++);
    expect_fused_matches({{x, vec}, {{0, 1}}}, seed++);
    expect_fused_matches({{x, pos, vec3}, {{0, 1}, {-1, 2}}}, seed++);
    expect_fused_matches({{x}, {{0, 0}}}, seed++);
    expect_fused_matches({{x, pos, vec}, {{0, 1}, {-1, 2}}, "RMSNormalization"}, seed++);
  }
}

// The sums the graph also reads (SkipLayerNormalization's second output, an embedding sum kept
// for a residual): written during the same pass, the last one or a partial one.
TEST(CpuAddNorm, SumsAsOutputs) {
  uint32_t seed = 200;
  for (int64_t n : {7, 768, 4099}) {
    const Dims x = {9, n}, vec = {n};
    SumCase c{{x, x, vec}, {{0, 1}, {-1, 2}}};
    for (std::vector<size_t> outs : {std::vector<size_t>{1}, {0}, {0, 1}}) {
      c.sum_outputs = outs;
      expect_fused_matches(c, seed++);
    }
    c.norm = "RMSNormalization";
    expect_fused_matches(c, seed++);
  }
}

// Long rows under every store policy: the streamed two-rows-a-pass kernel (rows of 4096 floats
// and more, outputs past the cache) reads the sums a piece at a time.
TEST(CpuAddNorm, StreamedLongRows) {
  const MemoryPolicy saved = memory_policy();
  for (auto nt : {MemoryPolicy::NonTemporal::kNever, MemoryPolicy::NonTemporal::kAlways}) {
    SCOPED_TRACE(::testing::Message() << "nontemporal " << static_cast<int>(nt));
    set_memory_policy(MemoryPolicy{.nontemporal = nt});
    for (int64_t rows : {1, 2, 3, 7}) {
      const Dims x = {rows, 4096};
      expect_fused_matches({{x, x}, {{0, 1}}}, 300 + static_cast<uint32_t>(rows));
      SumCase out{{x, x, {4096}}, {{0, 1}, {-1, 2}}};
      out.sum_outputs = {1};
      expect_fused_matches(out, 310 + static_cast<uint32_t>(rows));
    }
  }
  set_memory_policy(saved);
}

// What the norm kernel does not take stays one tile program ("Elementwise") that still matches
// the reference: an operand broadcast over the sequence ([batch, 1, n]), PTO_ADD_NORM=0. Any other
// PTO_ADD_NORM value is an error naming it.
TEST(CpuAddNorm, OtherFormsStayOnTheTileProgram) {
  auto expect_tile = [](const Graph& g, const std::vector<Tensor>& feeds) {
    const Executable exe = compile(g, {.level = 2});
    ASSERT_EQ(exe.num_steps(), 1u);
    EXPECT_EQ(exe.step(0).rule, "Elementwise");
    expect_runs_match(g, exe, feeds, kNormTol);
  };
  {
    std::vector<Tensor> feeds;
    expect_tile(sum_graph({{{2, 5, 33}, {2, 1, 33}}, {{0, 1}}}, 400, &feeds), feeds);
  }
  {
    std::vector<Tensor> feeds;
    const Dims x = {6, 40};
    Graph g = sum_graph({{x, x}, {{0, 1}}}, 401, &feeds);
    ::setenv("PTO_ADD_NORM", "0", 1);
    expect_tile(g, feeds);
    ::setenv("PTO_ADD_NORM", "yes", 1);
    try {
      compile(g, {.level = 2});
      ADD_FAILURE() << "PTO_ADD_NORM=yes accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("PTO_ADD_NORM"), std::string::npos) << e.what();
    }
    ::unsetenv("PTO_ADD_NORM");
  }
}

}  // namespace
}  // namespace pto::testing
