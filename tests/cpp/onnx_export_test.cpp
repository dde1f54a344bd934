// The ONNX exporter: what it writes is checked in the ModelProto itself and by importing it back
// with the (independently tested) importer: types with symbolic dims, initializers of every dtype
// bit for bit, attributes of every kind, generated names, opsets per domain, files.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>

#include "onnx_model_builder.h"
#include "pto/onnx.h"
#include "pto/reference.h"

namespace pto {
namespace {

using testing::TempDir;

::onnx::ModelProto parse(const std::string& bytes) {
  ::onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

Graph round_trip(const Graph& g) {
  return onnx::load_from_bytes(onnx::save_to_bytes(g), "", "exported");
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.dtype() == cb.dtype() && ca.shape() == cb.shape() &&
         (ca.nbytes() == 0 || std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0);
}

// y = Relu(x) on x: f32[batch, 3, ?].
Graph relu_graph() {
  Graph g;
  g.name = "relu_graph";
  g.opset = 17;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 3, Dim::unknown()}});
  ValueId y = g.add_value("y");
  g.add_node("Relu", {x}, {y}, {}, "relu");
  g.add_output(y);
  infer_types(g);
  return g;
}

TEST(OnnxExport, SymbolicAndUnknownDimsSurvive) {
  Graph g = relu_graph();
  ValueId s = g.add_input("s", {DType::kI64, Shape{}});       // a scalar: a shape with no dims
  ValueId r = g.add_input("r", {DType::kF16, std::nullopt});  // unknown rank: no shape at all
  g.add_output(s);  // graph inputs as graph outputs are valid ONNX
  g.add_output(r);
  ::onnx::ModelProto m = parse(onnx::save_to_bytes(g));
  const auto& gp = m.graph();
  ASSERT_EQ(gp.input_size(), 3);
  const auto& x = gp.input(0).type().tensor_type();
  EXPECT_EQ(x.elem_type(), ::onnx::TensorProto::FLOAT);
  ASSERT_EQ(x.shape().dim_size(), 3);
  EXPECT_EQ(x.shape().dim(0).dim_param(), "batch");
  EXPECT_EQ(x.shape().dim(1).dim_value(), 3);
  EXPECT_FALSE(x.shape().dim(2).has_dim_value());
  EXPECT_FALSE(x.shape().dim(2).has_dim_param());
  EXPECT_TRUE(gp.input(1).type().tensor_type().has_shape());
  EXPECT_EQ(gp.input(1).type().tensor_type().shape().dim_size(), 0);
  EXPECT_FALSE(gp.input(2).type().tensor_type().has_shape());
  EXPECT_EQ(m.producer_name(), "pypto");

  Graph back = round_trip(g);
  EXPECT_EQ(print(back), print(g));
  EXPECT_EQ(back.value(back.inputs()[0]).type.str(), "f32[batch, 3, ?]");
  EXPECT_EQ(back.value(back.outputs()[0]).type.str(), "f32[batch, 3, ?]");
  EXPECT_EQ(back.value(back.inputs()[2]).type.str(), "f16[*]");
}

// Random bytes of every dtype (bools 0 or 1; 4- and 2-bit types any of their values), so NaN
// payloads and odd bit patterns must survive, and the sub-byte types' packing.
Tensor random_tensor(DType dt, Dims shape, std::mt19937& rng) {
  Tensor t = Tensor::empty(dt, std::move(shape));
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    auto byte = static_cast<uint8_t>(dt == DType::kBool ? rng() & 1 : rng());
    if (packed_bits(dt) < 8)
      unpack_elements(dt, &byte, 1, p + i);  // the low bits as an element of a sub-byte dtype
    else
      p[i] = byte;
  }
  return t;
}

TEST(OnnxExport, InitializersOfEveryDTypeAreBitExact) {
  std::mt19937 rng(7);
  Graph g;
  std::vector<Tensor> want;
  for (int d = 1; d < kNumDTypes; ++d) {
    auto dt = static_cast<DType>(d);
    Tensor t7 = random_tensor(dt, {7}, rng);
    Tensor wide = random_tensor(dt, {2, 3}, rng);
    Tensor transposed = wide.view({3, 2}, {1, 3}, 0);  // non-contiguous: written packed
    for (const Tensor& t :
         {t7, transposed, random_tensor(dt, {}, rng), Tensor::empty(dt, {0, 4})}) {
      ValueId v = g.add_value(cat(dtype_name(dt), "_", g.values().size()));
      g.set_initializer(v, t);
      g.add_output(v);  // an initializer as a graph output is valid ONNX
      want.push_back(t);
    }
  }
  Graph back = round_trip(g);
  ASSERT_EQ(back.outputs().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Tensor* got = back.initializer(back.outputs()[i]);
    ASSERT_NE(got, nullptr) << i;
    EXPECT_TRUE(same_bits(*got, want[i])) << back.value(back.outputs()[i]).name;
  }
}

// c = Constant() {value=[1, 2, 3]}: a node whose attributes are of every kind but ints.
Graph constant_graph() {
  Graph g;
  g.opset = 17;
  ValueId c = g.add_value("c");
  Attributes a;
  a.set("value", Tensor::from_vector<float>({1, 2, 3}, {3}));
  g.add_node("Constant", {}, {c}, std::move(a), "k");
  g.add_output(c);
  return g;
}

// The ops of g's export and its Casts to bfloat16; no node keeps PyPTO's precision attribute.
std::pair<std::multiset<std::string>, int> exported_ops(const Graph& g) {
  const ::onnx::ModelProto m = parse(onnx::save_to_bytes(g));
  std::multiset<std::string> ops;
  int bf16_casts = 0;
  for (const auto& n : m.graph().node()) {
    ops.insert(n.op_type());
    for (const auto& at : n.attribute()) {
      EXPECT_NE(at.name(), "precision");
      if (n.op_type() == "Cast" && at.name() == "to" && at.i() == 16) ++bf16_casts;
    }
  }
  return {ops, bf16_casts};
}

// PyPTO's precision="bf16" on MatMul/Gemm (AutoMixedPrecision) is written as a Cast to bfloat16
// and back on each operand: valid ONNX with the same meaning. The re-imported graph runs on the
// reference interpreter to the same values as the marked one, and carries no such attribute.
TEST(OnnxExport, Bf16PrecisionBecomesCasts) {
  Graph g;
  g.opset = 17;
  const ValueId a = g.add_input("a", {DType::kF32, Shape{3, 40}});
  const ValueId w = g.add_value("w");
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> wv(40 * 6);
  for (float& x : wv) x = u(rng);
  g.set_initializer(w, Tensor::from_vector<float>(wv, {6, 40}));
  const ValueId y = g.add_value("y");
  Attributes attrs;
  attrs.set("transB", int64_t{1});
  attrs.set("precision", std::string("bf16"));
  g.add_node("Gemm", {a, w}, {y}, attrs, "fc");
  g.add_output(y);
  infer_types(g);

  const auto [ops, bf16_casts] = exported_ops(g);
  EXPECT_EQ(ops.count("Cast"), 4u);
  EXPECT_EQ(bf16_casts, 2);
  EXPECT_EQ(ops.count("Gemm"), 1u);

  const Graph back = round_trip(g);
  std::vector<float> av(3 * 40);
  for (float& x : av) x = u(rng);
  const std::vector<Tensor> feed = {Tensor::from_vector<float>(av, {3, 40})};
  EXPECT_TRUE(same_bits(reference::run(back, feed)[0], reference::run(g, feed)[0]));
}

// The exported bf16x3 file (`back`) against the marked graph `g` on the reference: within fp32
// rounding of the three sums (2e-6), while the split itself moved the result further from the
// fp32 graph (g without its precision marks) than that, and below 1e-3.
void expect_split_file_matches(const Graph& g, const Graph& back, const std::vector<Tensor>& feed) {
  const Tensor got = reference::run(back, feed)[0], want = reference::run(g, feed)[0];
  Graph f32 = g;
  for (Node& n : f32.mutable_nodes()) {
    Attributes kept;
    for (const auto& [key, v] : n.attrs.all())
      if (key != "precision") kept.set(key, v);
    n.attrs = kept;
  }
  const Tensor exact = reference::run(f32, feed)[0];
  ASSERT_EQ(got.shape(), want.shape());
  double diff = 0, split_error = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    diff = std::max(diff, std::fabs(got.item_as_double(i) - want.item_as_double(i)));
    split_error =
        std::max(split_error, std::fabs(exact.item_as_double(i) - want.item_as_double(i)));
  }
  EXPECT_LT(diff, 2e-6);
  EXPECT_GT(split_error, 4 * diff);
  EXPECT_LT(split_error, 1e-3);
}

// PyPTO's precision="bf16x3" on MatMul and Gemm (MatMulPrecision) is written as the sum of its
// three products, (Ah Bh) + ((Al Bh) + (Ah Bl)), of heads Cast(Cast(x, bfloat16), float) and tails
// (the same of x - head); a Gemm's C (beta) with the first product, alpha and transB with all.
// The re-imported graph runs on the reference interpreter to the marked graph's values within
// fp32 rounding of the three sums, and differs from the fp32 graph by more.
TEST(OnnxExport, Bf16x3PrecisionBecomesItsThreeProducts) {
  Graph g;
  g.opset = 17;
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1, 1);
  auto constant = [&](const std::string& name, Dims shape) {
    std::vector<float> v(static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)));
    for (float& x : v) x = u(rng);
    const ValueId id = g.add_value(name);
    g.set_initializer(id, Tensor::from_vector<float>(v, shape));
    return id;
  };
  const ValueId a = g.add_input("a", {DType::kF32, Shape{3, 40}});
  const ValueId w = constant("w", {6, 40}), c = constant("c", {6}), w2 = constant("w2", {6, 5});
  const ValueId y = g.add_value("y"), z = g.add_value("z");
  Attributes attrs;
  attrs.set("transB", int64_t{1});
  attrs.set("alpha", 0.5);
  attrs.set("beta", -2.0);
  attrs.set("precision", std::string("bf16x3"));
  g.add_node("Gemm", {a, w, c}, {y}, attrs, "fc");
  Attributes split;
  split.set("precision", std::string("bf16x3"));
  g.add_node("MatMul", {y, w2}, {z}, split, "mm");
  g.add_output(z);
  infer_types(g);

  const auto [ops, bf16_casts] = exported_ops(g);
  EXPECT_EQ(ops.count("Gemm"), 3u);
  EXPECT_EQ(ops.count("MatMul"), 3u);
  EXPECT_EQ(ops.count("Add"), 4u);
  EXPECT_EQ(ops.count("Sub"), 4u);
  EXPECT_EQ(bf16_casts, 8);  // a head and a tail of each of four operands

  const Graph back = round_trip(g);
  std::vector<float> av(3 * 40);
  for (float& x : av) x = u(rng);
  const std::vector<Tensor> feed = {Tensor::from_vector<float>(av, {3, 40})};
  expect_split_file_matches(g, back, feed);
}

// A bf16x3 Conv (ConvPrecision) the same way: three Convs of the heads and tails of X and W with
// the conv's strides, pads and groups, the bias with the first. Re-imported, the reference runs it
// to the marked Conv's values (whose reference computes the three products itself) within fp32
// rounding, both further from the fp32 Conv.
TEST(OnnxExport, Bf16x3ConvBecomesItsThreeConvs) {
  Graph g;
  g.opset = 17;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  auto random = [&](Dims shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return Tensor::from_vector<float>(v, shape);
  };
  const ValueId x = g.add_input("x", {DType::kF32, Shape{1, 8, 9, 9}});
  const ValueId w = g.add_value("w"), b = g.add_value("b"), y = g.add_value("y");
  g.set_initializer(w, random({6, 4, 3, 3}));
  g.set_initializer(b, random({6}));
  Attributes attrs;
  attrs.set("group", int64_t{2});
  attrs.set("strides", Dims{2, 1});
  attrs.set("pads", Dims{1, 1, 1, 1});
  attrs.set("precision", std::string("bf16x3"));
  g.add_node("Conv", {x, w, b}, {y}, attrs, "conv");
  g.add_output(y);
  infer_types(g);

  const auto [ops, bf16_casts] = exported_ops(g);
  EXPECT_EQ(ops.count("Conv"), 3u);
  EXPECT_EQ(ops.count("Add"), 2u);
  EXPECT_EQ(ops.count("Sub"), 2u);
  EXPECT_EQ(bf16_casts, 4);

  const Graph back = round_trip(g);
  expect_split_file_matches(g, back, {random({1, 8, 9, 9})});
}

// Attention with precision="bf16" rounds Q, K and V through Casts (once under qkv_split, whose
// three inputs are one tensor); the probabilities' rounding has no ONNX form, so the re-imported
// graph equals the marked one to bf16's rounding of them, and differs from the fp32 graph by more.
TEST(OnnxExport, Bf16AttentionRoundsItsOperandsThroughCasts) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-3, 3);
  auto random = [&](Dims shape) {
    Tensor t = Tensor::empty(DType::kF32, shape);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
    return t;
  };
  for (const bool split : {false, true}) {
    SCOPED_TRACE(split ? "qkv_split" : "Q, K, V");
    Graph f32;
    f32.opset = 23;
    Attributes attrs;
    std::vector<ValueId> in;
    std::vector<Tensor> feed;
    if (split) {
      in.assign(3, f32.add_input("qkv", {DType::kF32, Shape{1, 6, 96}}));
      feed = {random({1, 6, 96})};
      attrs.set("qkv_split", std::vector<int64_t>{32, 32, 32});
      attrs.set("q_num_heads", int64_t{2});
      attrs.set("kv_num_heads", int64_t{2});
    } else {
      for (const char* name : {"q", "k", "v"}) {
        in.push_back(f32.add_input(name, {DType::kF32, Shape{1, 2, 6, 16}}));
        feed.push_back(random({1, 2, 6, 16}));
      }
    }
    const ValueId y = f32.add_value("y");
    f32.add_node("Attention", in, {y}, attrs, "attention");
    f32.add_output(y);
    infer_types(f32);
    Graph g = f32;
    g.mutable_nodes()[0].attrs.set("precision", std::string("bf16"));
    const ::onnx::ModelProto m = parse(onnx::save_to_bytes(g));
    int bf16_casts = 0;
    for (const auto& n : m.graph().node())
      for (const auto& at : n.attribute()) {
        EXPECT_NE(at.name(), "precision");
        if (n.op_type() == "Cast" && at.name() == "to" && at.i() == 16) ++bf16_casts;
      }
    EXPECT_EQ(bf16_casts, split ? 1 : 3);
    const Tensor back = reference::run(round_trip(g), feed)[0], want = reference::run(g, feed)[0];
    const Tensor exact = reference::run(f32, feed)[0];
    double to_marked = 0, to_exact = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      to_marked = std::max(to_marked, std::fabs(back.item_as_double(i) - want.item_as_double(i)));
      to_exact = std::max(to_exact, std::fabs(back.item_as_double(i) - exact.item_as_double(i)));
    }
    EXPECT_LT(to_marked, 1e-2);
    EXPECT_GT(to_exact, 2 * to_marked);
  }
}

TEST(OnnxExport, AttributesOfEveryKind) {
  // Constant's value_* attributes cover every kind; nodes are checked against their op's schema
  // (one value_* is what Constant means, but only the schema is checked here). Relu's opset-1
  // consumed_inputs holds an empty list.
  Graph g;
  g.name = "every_kind";
  g.opset = 17;
  ValueId c = g.add_value("c"), x = g.add_input("x", {DType::kF32, Shape{3}}), y = g.add_value("y");
  g.add_node("Constant", {}, {c}, {}, "k");
  g.add_node("Relu", {x}, {y}, {}, "relu");
  g.add_output(c);
  g.add_output(y);
  Attributes& a = g.mutable_nodes()[0].attrs;
  a.set("value_int", int64_t{-5});
  a.set("value_float", 0.75);  // exactly a float: ONNX attributes are single precision
  a.set("value_string", std::string("hello\0world", 11));
  a.set("value_ints", std::vector<int64_t>{1, -2, INT64_MAX});
  a.set("value_floats", std::vector<double>{0.5, -2.25, 1e30});
  a.set("value_strings", std::vector<std::string>{"a", "", "c"});
  a.set("value", Tensor::from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}));
  g.mutable_nodes()[1].attrs.set("consumed_inputs", std::vector<int64_t>{});
  infer_types(g);

  ::onnx::ModelProto m = parse(onnx::save_to_bytes(g));
  std::map<std::string, int> kinds;
  for (int i = 0; i < 2; ++i)
    for (const auto& ap : m.graph().node(i).attribute()) kinds[ap.name()] = ap.type();
  using AP = ::onnx::AttributeProto;
  EXPECT_EQ(kinds, (std::map<std::string, int>{{"consumed_inputs", AP::INTS},
                                               {"value", AP::TENSOR},
                                               {"value_float", AP::FLOAT},
                                               {"value_floats", AP::FLOATS},
                                               {"value_int", AP::INT},
                                               {"value_ints", AP::INTS},
                                               {"value_string", AP::STRING},
                                               {"value_strings", AP::STRINGS}}));

  Graph back = round_trip(g);
  Graph want = g;  // print() is exact: 1e30 comes back as the float ONNX keeps
  want.mutable_nodes()[0].attrs.set("value_floats", std::vector<double>{0.5, -2.25, double(1e30f)});
  EXPECT_EQ(print(back), print(want));
  const Attributes& b = back.nodes()[0].attrs;
  EXPECT_EQ(b.get_int("value_int"), -5);
  EXPECT_EQ(b.get_float("value_float"), 0.75);
  EXPECT_EQ(b.get_string("value_string"), std::string("hello\0world", 11));
  EXPECT_EQ(b.get_ints("value_ints"), (std::vector<int64_t>{1, -2, INT64_MAX}));
  EXPECT_TRUE(back.nodes()[1].attrs.get_ints("consumed_inputs").empty());
  EXPECT_EQ(b.get_floats("value_floats"), (std::vector<double>{0.5, -2.25, double(1e30f)}));
  EXPECT_EQ(b.get_strings("value_strings"), (std::vector<std::string>{"a", "", "c"}));
  EXPECT_TRUE(same_bits(b.get_tensor("value"), a.get_tensor("value")));
}

TEST(OnnxExport, UndefinedTensorAttributeNamesTheNode) {
  Graph g = constant_graph();
  g.mutable_nodes()[0].attrs.set("value", Tensor());
  try {
    onnx::save_to_bytes(g);
    FAIL() << "no exception";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("[Constant] node 'k' attribute 'value'"),
              std::string::npos)
        << e.what();
  }
}

TEST(OnnxExport, EmptyAndRepeatedNamesGetUniqueOnes) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{4}});
  ValueId a = g.add_value("a"), b = g.add_value("b"), c = g.add_value("c");
  g.add_node("Relu", {x}, {a});
  g.add_node("Neg", {a}, {b});
  g.add_node("Add", {a, b}, {c});
  g.add_output(c);
  g.add_output(a);
  infer_types(g);
  g.value(a).name = "";   // passes may leave names empty ...
  g.value(b).name = "x";  // ... or repeat one
  g.value(c).name = "x_1";

  std::string bytes = onnx::save_to_bytes(g);
  EXPECT_EQ(bytes, onnx::save_to_bytes(g)) << "generated names must be deterministic";
  ::onnx::ModelProto m = parse(bytes);
  std::set<std::string> names;
  for (const auto& n : m.graph().node())
    for (const auto& o : n.output()) {
      EXPECT_FALSE(o.empty());
      EXPECT_TRUE(names.insert(o).second) << o << " is defined twice";
    }
  EXPECT_EQ(names, (std::set<std::string>{"v1", "x_2", "x_1"}));
  EXPECT_EQ(m.graph().node(2).input(0), "v1");
  EXPECT_EQ(m.graph().output(1).name(), "v1");

  Graph back = round_trip(g);
  Tensor in = Tensor::from_vector<float>({-1, 2, -3, 4}, {4});
  auto want = reference::run(g, {in});
  auto got = reference::run(back, {in});
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(same_bits(got[i], want[i])) << i;
}

int opset_of(const ::onnx::ModelProto& m, const std::string& domain) {
  for (const auto& o : m.opset_import())
    if (o.domain() == domain) return static_cast<int>(o.version());
  return -1;
}

TEST(OnnxExport, OneOpsetPerDomain) {
  Graph g = relu_graph();  // g.opset 17: the node carries 17
  ::onnx::ModelProto m = parse(onnx::save_to_bytes(g));
  EXPECT_EQ(opset_of(m, ""), 17);
  EXPECT_EQ(m.ir_version(), 8);  // onnx 1.12's, the release of opset 17
  EXPECT_EQ(m.opset_import_size(), 1);

  // Opset 0 ("unspecified") takes the domain's opset from the nodes that say one.
  g.mutable_nodes()[0].opset = 0;
  ValueId z = g.add_value("z");
  g.add_node("Neg", {g.outputs()[0]}, {z}, {}, "neg", 13);
  g.add_output(z);
  EXPECT_EQ(opset_of(parse(onnx::save_to_bytes(g)), ""), 13);

  // Nothing said anywhere: the newest opset onnxruntime 1.32 loads, at most.
  g.opset = 0;
  g.mutable_nodes()[1].opset = 0;
  int newest = opset_of(parse(onnx::save_to_bytes(g)), "");
  EXPECT_EQ(newest, std::min(onnx::max_opset(), 28));

  // Another domain gets its own entry (version 1 when no node says one); "ai.onnx" is the default.
  g.mutable_nodes()[0].domain = "ai.onnx";
  g.mutable_nodes()[1].domain = "com.example";
  m = parse(onnx::save_to_bytes(g));
  EXPECT_EQ(opset_of(m, "com.example"), 1);
  EXPECT_EQ(opset_of(m, ""), newest);
  EXPECT_EQ(m.graph().node(0).domain(), "");
  EXPECT_EQ(m.graph().node(1).domain(), "com.example");
}

TEST(OnnxExport, MixedOpsetsInOneDomainAreUnsupported) {
  Graph g = relu_graph();
  ValueId z = g.add_value("z");
  g.add_node("Neg", {g.outputs()[0]}, {z}, {}, "neg", 13);
  g.add_output(z);
  try {
    onnx::save_to_bytes(g);
    FAIL() << "no exception";
  } catch (const UnsupportedError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[Neg] node 'neg': opset 13", 0), 0u) << msg;
    EXPECT_NE(msg.find("node 'relu'"), std::string::npos) << msg;
  }
}

TEST(OnnxExport, SaveWritesAFileThatLoads) {
  TempDir dir;
  Graph g = relu_graph();
  std::string path = dir.file("relu.onnx");
  onnx::save(g, path);
  EXPECT_EQ(print(onnx::load(path)), print(g));

  std::string bad = (dir.path() / "missing_dir" / "relu.onnx").string();
  try {
    onnx::save(g, bad);
    FAIL() << "no exception";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(bad + ": ", 0), 0u) << e.what();
  }
  // An export error keeps its type and gets the path in front.
  Graph k = constant_graph();
  k.mutable_nodes()[0].attrs.set("value", Tensor());
  try {
    onnx::save(k, path);
    FAIL() << "no exception";
  } catch (const UnsupportedError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path + ": [Constant] node 'k'", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace pto
