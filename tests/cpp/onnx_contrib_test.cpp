// onnxruntime's contrib ops and model-local functions through the importer (contrib_ops.cpp,
// functions.cpp) in C++, where the sanitizer build runs them: a small decoder layer of contrib
// ops imports, compiles at level 2 and runs on the CPU kernels with the results of the reference
// interpreter. (What each expansion computes is checked against onnxruntime itself in
// tests/python/test_contrib_ops.py and test_onnx_functions.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "onnx_model_builder.h"
#include "pto/executable.h"
#include "pto/onnx.h"
#include "pto/reference.h"

namespace pto {
namespace {

using testing::ModelBuilder;
using TP = ::onnx::TensorProto;

void set_int(::onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(v);
}

void set_float(::onnx::NodeProto& n, const std::string& name, float v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::FLOAT);
  a->set_f(v);
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = d(gen);
  return v;
}

::onnx::NodeProto& contrib(ModelBuilder& mb, const std::string& op,
                           const std::vector<std::string>& ins,
                           const std::vector<std::string>& outs) {
  auto& n = mb.node(op, ins, outs, op + "_0");
  n.set_domain("com.microsoft");
  return n;
}

// x [2, 5, 32] -> SkipSimplifiedLayerNormalization -> MatMulNBits (packed QKV, 4-bit) ->
// GroupQueryAttention (2 heads over 1, rotary) -> Attention (mask) -> FusedMatMul -> a call of
// the model's function Twice (y + y) -> BiasGelu.
ModelBuilder decoder_layer() {
  ModelBuilder mb(17);
  auto* ms = mb.model().add_opset_import();
  ms->set_domain("com.microsoft");
  ms->set_version(1);
  auto* local = mb.model().add_opset_import();
  local->set_domain("local");
  local->set_version(1);
  constexpr int64_t D = 32, kQkv = 64, kBlocks = 1, kBlob = 16;  // head 16: 2 + 2 x 1 heads
  mb.input("x", TP::FLOAT, {int64_t{2}, int64_t{5}, D});
  mb.input("mask", TP::INT32, {int64_t{2}, int64_t{5}});
  mb.input("seqlens", TP::INT32, {int64_t{2}});
  mb.input("total", TP::INT32, {});
  mb.raw_floats("gamma", random_floats(D, 1), {D});
  auto& norm = contrib(mb, "SkipSimplifiedLayerNormalization", {"x", "x", "gamma"}, {"h"});
  set_float(norm, "epsilon", 1e-6f);
  // 4-bit codes: byte i of each row's one block of 32 holds codes (i, i + 1) mod 16.
  auto& b = mb.tensor("w_q4", TP::UINT8, {kQkv, kBlocks, kBlob});
  std::string codes;
  for (int64_t n = 0; n < kQkv; ++n)
    for (int64_t i = 0; i < kBlob; ++i)
      codes.push_back(static_cast<char>(((n + i) % 16) | (((n + 2 * i + 1) % 16) << 4)));
  b.set_raw_data(codes);
  mb.raw_floats("w_scales", random_floats(kQkv * kBlocks, 2, 0.05f), {kQkv * kBlocks});
  auto& q4 = contrib(mb, "MatMulNBits", {"h", "w_q4", "w_scales"}, {"qkv"});
  set_int(q4, "K", D);
  set_int(q4, "N", kQkv);
  set_int(q4, "bits", 4);
  set_int(q4, "block_size", 32);
  std::vector<float> cosv, sinv;
  for (int p = 0; p < 16; ++p)
    for (int k = 0; k < 4; ++k) {
      cosv.push_back(std::cos(p * std::pow(0.5f, static_cast<float>(k))));
      sinv.push_back(std::sin(p * std::pow(0.5f, static_cast<float>(k))));
    }
  mb.raw_floats("cos", cosv, {16, 4});
  mb.raw_floats("sin", sinv, {16, 4});
  auto& gqa = contrib(mb, "GroupQueryAttention",
                      {"qkv", "", "", "", "", "seqlens", "total", "cos", "sin"}, {"g"});
  set_int(gqa, "num_heads", 2);
  set_int(gqa, "kv_num_heads", 1);
  set_int(gqa, "do_rotary", 1);
  mb.raw_floats("att_w", random_floats(D * 3 * D, 3, 0.2f), {D, 3 * D});
  mb.raw_floats("att_b", random_floats(3 * D, 4), {3 * D});
  auto& att = contrib(mb, "Attention", {"g", "att_w", "att_b", "mask"}, {"a"});
  set_int(att, "num_heads", 2);
  mb.raw_floats("proj", random_floats(D * D, 5, 0.2f), {D, D});
  auto& fm = contrib(mb, "FusedMatMul", {"a", "proj"}, {"p"});
  set_int(fm, "transB", 1);
  set_float(fm, "alpha", 0.5f);
  mb.node("Twice", {"p"}, {"t"}, "call").set_domain("local");
  auto* f = mb.model().add_functions();
  f->set_name("Twice");
  f->set_domain("local");
  f->add_input("u");
  f->add_output("v");
  auto* add = f->add_node();
  add->set_op_type("Add");
  add->add_input("u");
  add->add_input("u");
  add->add_output("v");
  f->add_opset_import()->set_version(17);
  mb.raw_floats("gelu_b", random_floats(D, 6), {D});
  contrib(mb, "BiasGelu", {"t", "gelu_b"}, {"y"});
  mb.output("y");
  return mb;
}

TEST(OnnxContrib, DecoderLayerOfContribOpsRunsOnTheCpuKernels) {
  const Graph g = onnx::load_from_bytes(decoder_layer().bytes(), "", "layer.onnx");
  // All standard now, but MatMulNBits: its weight stays in 4-bit blocks.
  for (const Node& n : g.nodes())
    EXPECT_EQ(n.domain, n.op == "MatMulNBits" ? "com.microsoft" : "") << n.op;
  Tensor x = Tensor::from_vector(random_floats(2 * 5 * 32, 7), {2, 5, 32});
  Tensor mask = Tensor::from_vector(std::vector<int32_t>{1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 5});
  Tensor seqlens = Tensor::from_vector(std::vector<int32_t>{4, 4}, {2});
  Tensor total = Tensor::scalar(int32_t{5});
  const std::vector<Tensor> feeds = {x, mask, seqlens, total};
  const Tensor want = reference::run(g, feeds)[0];
  Executable exe = compile(g, {.level = 2});
  for (size_t i = 0; i < exe.graph().nodes().size(); ++i)
    EXPECT_EQ(exe.node_backend(i), "cpu") << exe.graph().nodes()[i].op;
  const Tensor got = exe.run(feeds)[0];
  ASSERT_EQ(got.shape(), want.shape());
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(got.data<float>()[i]));
    worst = std::max(worst, std::fabs(double{got.data<float>()[i]} - want.data<float>()[i]));
  }
  EXPECT_LT(worst, 1e-4);
}

}  // namespace
}  // namespace pto
