// The ONNX importer: a valid model imports and runs; every kind of malformed model gives the right
// pto::Error type with a message that names the file, the node and the op.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "onnx_model_builder.h"
#include "pto/onnx.h"
#include "pto/reference.h"

namespace pto {
namespace {

using testing::ModelBuilder;
using testing::TempDir;
using TP = ::onnx::TensorProto;

// Expects `f` to throw exactly error type E with a message containing every piece of `parts`.
template <class E, class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << parts.front() << "'";
  } catch (const E& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "'" << p << "' missing from: " << e.what();
  } catch (const Error& e) {
    ADD_FAILURE() << "wrong pto::Error type: " << e.what();
  }
}

Graph load_bytes(const std::string& bytes, const std::string& src = "model.onnx") {
  return onnx::load_from_bytes(bytes, "", src);
}

// y = Exp(Relu(x * w + b) - 0.5) / 2 with w raw_data and b in float_data.
ModelBuilder small_model() {
  ModelBuilder mb(17);
  mb.input("x", TP::FLOAT, {std::string("batch"), int64_t{3}});
  mb.raw_floats("w", {1, -2, 3}, {3});
  mb.typed_floats("b", {0.5f, 0.25f, -1}, {3});
  mb.typed_floats("half", {0.5f}, {});
  mb.typed_floats("two", {2}, {});
  mb.node("Mul", {"x", "w"}, {"xw"}, "mul");
  mb.node("Add", {"xw", "b"}, {"s"}, "add");
  mb.node("Relu", {"s"}, {"r"}, "relu");
  mb.node("Sub", {"r", "half"}, {"d"}, "sub");
  mb.node("Exp", {"d"}, {"e"}, "exp");
  mb.node("Div", {"e", "two"}, {"y"}, "div");
  mb.output("y");
  return mb;
}

TEST(OnnxImport, ValidModelImportsAndRuns) {
  TempDir dir;
  std::string path = dir.write("small.onnx", small_model().bytes());
  Graph g = onnx::load(path);
  EXPECT_EQ(g.opset, 17);
  ASSERT_EQ(g.inputs().size(), 1u);
  ASSERT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(g.value(g.outputs()[0]).type.str(), "f32[batch, 3]");

  std::vector<float> x = {1, 2, 3, -1, 0.5f, 0};
  auto out = reference::run(g, {Tensor::from_vector<float>(x, {2, 3})});
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].shape(), (Dims{2, 3}));
  const float w[] = {1, -2, 3}, b[] = {0.5f, 0.25f, -1};
  for (int i = 0; i < 6; ++i) {
    double s = std::max(0.0, double(x[i]) * w[i % 3] + b[i % 3]);
    double expect = std::exp(s - 0.5) / 2;
    EXPECT_NEAR(out[0].item_as_double(i), expect, 1e-6 * expect) << i;  // f32 rounding
  }
}

TEST(OnnxImport, TruncatedFile) {
  std::string bytes = small_model().bytes();
  TempDir dir;
  // Cutting inside a length-delimited field makes protobuf parsing fail.
  std::string path = dir.write("cut.onnx", bytes.substr(0, bytes.size() / 2));
  expect_error<ValueError>([&] { onnx::load(path); }, {path, "truncated"});
  expect_error<ValueError>([&] { onnx::load(dir.file("absent.onnx")); },
                           {"absent.onnx", "cannot open"});
  expect_error<ValueError>([&] { load_bytes(""); }, {"model.onnx", "no graph"});
}

TEST(OnnxImport, RandomGarbage) {
  std::mt19937 rng(7);
  std::string junk(4096, '\0');
  for (char& c : junk) c = static_cast<char>(rng());
  TempDir dir;
  std::string path = dir.write("junk.onnx", junk);
  EXPECT_THROW(
      {
        try {
          onnx::load(path);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
}

TEST(OnnxImport, UnknownOp) {
  ModelBuilder mb;
  mb.input("x", TP::FLOAT, {int64_t{2}});
  mb.node("FrobnicateTensor", {"x"}, {"y"}, "frob1");
  mb.output("y");
  expect_error<UnsupportedError>([&] { load_bytes(mb.bytes()); },
                                 {"model.onnx", "FrobnicateTensor", "frob1"});
}

TEST(OnnxImport, UnsupportedOpsets) {
  for (int opset : {onnx::max_opset() + 1, onnx::kMinOpset - 1}) {
    ModelBuilder mb(opset);
    mb.input("x", TP::FLOAT, {int64_t{2}});
    mb.node("Relu", {"x"}, {"y"});
    mb.output("y");
    expect_error<UnsupportedError>([&] { load_bytes(mb.bytes()); },
                                   {"model.onnx", "opset " + std::to_string(opset)});
  }
}

TEST(OnnxImport, OpsetOutOfIntRangeOrMissing) {
  // 2^32 + 17 must not wrap around to 17.
  ModelBuilder mb;
  mb.model().mutable_opset_import(0)->set_version((int64_t{1} << 32) + 17);
  mb.input("x", TP::FLOAT, {int64_t{2}});
  mb.node("Relu", {"x"}, {"y"});
  mb.output("y");
  expect_error<UnsupportedError>([&] { load_bytes(mb.bytes()); }, {"model.onnx", "4294967313"});
  // No opset_import at all means opset 1 (IR version 2), older than we support.
  mb.model().clear_opset_import();
  expect_error<UnsupportedError>([&] { load_bytes(mb.bytes()); }, {"model.onnx", "opset 1 "});
}

TEST(OnnxImport, DuplicateNames) {
  ModelBuilder inputs;
  inputs.input("x", TP::FLOAT, {int64_t{2}});
  inputs.input("x", TP::FLOAT, {int64_t{2}});
  inputs.node("Relu", {"x"}, {"y"});
  inputs.output("y");
  expect_error<ValueError>([&] { load_bytes(inputs.bytes()); }, {"model.onnx", "'x'", "twice"});

  ModelBuilder inits;
  inits.input("x", TP::FLOAT, {int64_t{2}});
  inits.raw_floats("w", {1, 2}, {2});
  inits.raw_floats("w", {3, 4}, {2});
  inits.node("Mul", {"x", "w"}, {"y"});
  inits.output("y");
  expect_error<ValueError>([&] { load_bytes(inits.bytes()); }, {"model.onnx", "'w'", "twice"});

  ModelBuilder outs;
  outs.input("x", TP::FLOAT, {int64_t{2}});
  outs.node("Relu", {"x"}, {"x"}, "relu_x");
  outs.output("x");
  expect_error<ValueError>([&] { load_bytes(outs.bytes()); }, {"model.onnx", "relu_x", "'x'"});
}

TEST(OnnxImport, HugeTypedTensorIsRejectedBeforeAllocating) {
  // Three floats claiming 2^31 elements: a count error, not an 8 GB allocation.
  ModelBuilder mb;
  mb.input("x", TP::FLOAT, {int64_t{2}});
  mb.typed_floats("w", {1, 2, 3}, {int64_t{1} << 31});
  mb.node("Mul", {"x", "w"}, {"y"});
  mb.output("y");
  size_t saved = max_tensor_bytes();
  set_max_tensor_bytes(size_t{1} << 20);
  expect_error<ValueError>([&] { load_bytes(mb.bytes()); }, {"model.onnx", "'w'", "float_data"});
  // Within the count but past the allocation limit: the error still names the tensor.
  ModelBuilder big;
  big.input("x", TP::FLOAT, {int64_t{2}});
  big.raw_floats("w", std::vector<float>(1 << 19), {1 << 19});
  big.node("Mul", {"x", "w"}, {"y"});
  big.output("y");
  expect_error<ValueError>([&] { load_bytes(big.bytes()); }, {"model.onnx", "'w'", "limit"});
  set_max_tensor_bytes(saved);
}

TEST(OnnxImport, NonDefaultDomain) {
  ModelBuilder mb;
  auto* o = mb.model().add_opset_import();
  o->set_domain("com.microsoft");
  o->set_version(1);
  mb.input("x", TP::FLOAT, {int64_t{2}});
  mb.node("DecoderMaskedMultiHeadAttention", {"x", "x", "x"}, {"y"}, "dmmha")
      .set_domain("com.microsoft");
  mb.output("y");
  expect_error<UnsupportedError>(
      [&] { load_bytes(mb.bytes()); },
      {"model.onnx", "com.microsoft", "dmmha", "[DecoderMaskedMultiHeadAttention]", "contrib op"});
}

// A contrib op the importer reads (contrib_ops.h) becomes the standard op it stands for.
TEST(OnnxImport, ContribGeluIsTheStandardGelu) {
  ModelBuilder mb;
  auto* o = mb.model().add_opset_import();
  o->set_domain("com.microsoft");
  o->set_version(1);
  mb.input("x", TP::FLOAT, {int64_t{5}});
  mb.node("Gelu", {"x"}, {"y"}, "gelu_ms").set_domain("com.microsoft");
  mb.output("y");
  const Graph g = load_bytes(mb.bytes());
  ASSERT_EQ(g.nodes().size(), 1u);
  EXPECT_EQ(g.nodes()[0].op, "Gelu");
  EXPECT_EQ(g.nodes()[0].domain, "");
  EXPECT_EQ(g.nodes()[0].attr_string("approximate"), "none");
  const Tensor x = Tensor::from_vector(std::vector<float>{-3.0f, -1.0f, 0.0f, 0.5f, 2.0f}, {5});
  const Tensor y = reference::run(g, {x})[0];
  for (int64_t i = 0; i < 5; ++i) {
    const double v = x.data<float>()[i];
    EXPECT_NEAR(y.data<float>()[i], 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))), 1e-6);
  }
}

TEST(OnnxImport, InputNotDefined) {
  ModelBuilder mb;
  mb.input("x", TP::FLOAT, {int64_t{2}});
  mb.node("Add", {"x", "nowhere"}, {"y"}, "add1");
  mb.output("y");
  expect_error<ValueError>([&] { load_bytes(mb.bytes()); },
                           {"model.onnx", "nowhere", "add1", "[Add]"});
}

TEST(OnnxImport, MissingGraphOutput) {
  ModelBuilder mb;
  mb.input("x", TP::FLOAT, {int64_t{2}});
  mb.node("Relu", {"x"}, {"y"});
  mb.output("not_produced");
  expect_error<ValueError>([&] { load_bytes(mb.bytes()); }, {"model.onnx", "not_produced"});
}

TEST(OnnxImport, ShortRawData) {
  ModelBuilder mb;
  mb.input("x", TP::FLOAT, {int64_t{2}, int64_t{3}});
  mb.raw_floats("w", {1, 2, 3, 4, 5}, {2, 3});  // 5 floats for a [2, 3] shape
  mb.node("Mul", {"x", "w"}, {"y"});
  mb.output("y");
  expect_error<ValueError>([&] { load_bytes(mb.bytes()); }, {"model.onnx", "'w'", "raw_data"});

  ModelBuilder typed;
  typed.input("x", TP::FLOAT, {int64_t{2}});
  typed.typed_floats("w", {1, 2, 3}, {2});  // typed field with the wrong count
  typed.node("Mul", {"x", "w"}, {"y"});
  typed.output("y");
  expect_error<ValueError>([&] { load_bytes(typed.bytes()); }, {"'w'", "float_data"});
}

TEST(OnnxImport, NegativeDims) {
  ModelBuilder init;
  init.input("x", TP::FLOAT, {int64_t{2}});
  init.raw_floats("w", {}, {-1});
  init.node("Mul", {"x", "w"}, {"y"});
  init.output("y");
  expect_error<ValueError>([&] { load_bytes(init.bytes()); }, {"model.onnx", "'w'", "negative"});

  ModelBuilder in;
  in.input("x", TP::FLOAT, {int64_t{-2}});
  in.node("Relu", {"x"}, {"y"});
  in.output("y");
  expect_error<ValueError>([&] { load_bytes(in.bytes()); }, {"model.onnx", "'x'", "negative"});
}

// What other exporters write for a dynamic size (-1, 0, '?', ''), read as onnxruntime reads it:
// unknown dims, each '?' independent of the others, one warning per kind naming where.
TEST(OnnxImport, DialectDims) {
  ModelBuilder mb;
  mb.input("a", TP::FLOAT, {int64_t{-1}, int64_t{2}});
  mb.input("b", TP::FLOAT, {std::string("?"), int64_t{2}});
  mb.input("c", TP::FLOAT, {std::string(""), int64_t{0}});
  mb.graph().mutable_input(2)->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim();
  mb.raw_floats("empty", {}, {0, 2});  // a real zero size in an initializer stays legal
  auto* axis = mb.node("Concat", {"a", "b", "empty"}, {"ab"}).add_attribute();
  axis->set_name("axis");
  axis->set_type(::onnx::AttributeProto::INT);
  axis->set_i(0);
  mb.node("Relu", {"c"}, {"y"});
  mb.output("ab");
  mb.output("y");
  auto* vi = mb.graph().add_value_info();  // a dynamic dim written as -1 in value_info too
  vi->set_name("ab");
  auto* vshape = vi->mutable_type()->mutable_tensor_type()->mutable_shape();
  vshape->add_dim()->set_dim_value(-1);
  vshape->add_dim()->set_dim_value(2);

  ::testing::internal::CaptureStderr();
  Graph g = load_bytes(mb.bytes());
  std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(g.value(g.inputs()[0]).type.str(), "f32[?, 2]");
  EXPECT_EQ(g.value(g.inputs()[1]).type.str(), "f32[?, 2]");
  EXPECT_EQ(g.value(g.inputs()[2]).type.str(), "f32[?, ?, ?]");
  for (const char* part :
       {"model.onnx: dim_value -1 read as an unknown dimension", "input 'a' dim 0",
        "value_info 'ab' dim 0", "(2 dims)", "dim_value 0 on a graph input", "input 'c' dim 1",
        "dim_param '?' or '' read as a fresh unknown dimension", "input 'b' dim 0"})
    EXPECT_NE(log.find(part), std::string::npos) << "'" << part << "' missing from: " << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 3) << log;  // once per kind, not per dim

  // The two '?' (and the -1) are not one symbol: a and b take different sizes.
  std::vector<float> a = {1, 2}, b = {3, 4, 5, 6, 7, 8};
  auto out = reference::run(
      g, {Tensor::from_vector<float>(a, {1, 2}), Tensor::from_vector<float>(b, {3, 2}),
          Tensor::from_vector<float>({-1, 1}, {2, 1, 1})});
  ASSERT_EQ(out[0].shape(), (Dims{4, 2}));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(out[0].item_as_double(i), i + 1) << i;
  EXPECT_EQ(out[1].shape(), (Dims{2, 1, 1}));
}

// A model whose initializer "w" (3 floats) lives in an external file.
ModelBuilder external_model(const std::string& location, int64_t offset) {
  ModelBuilder mb;
  mb.input("x", TP::FLOAT, {int64_t{3}});
  auto& w = mb.tensor("w", TP::FLOAT, {3});
  w.set_data_location(TP::EXTERNAL);
  auto add = [&](const char* k, const std::string& v) {
    auto* kv = w.add_external_data();
    kv->set_key(k);
    kv->set_value(v);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  add("length", "12");
  mb.node("Mul", {"x", "w"}, {"y"}, "mul");
  mb.output("y");
  return mb;
}

TEST(OnnxImport, ExternalData) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "weights");
  const float w[] = {2, 3, 4};
  std::string data = "PAD!" + std::string(reinterpret_cast<const char*>(w), sizeof(w));
  dir.write("weights/w.bin", data);

  // Valid: relative location with an offset.
  std::string path = dir.write("ok.onnx", external_model("weights/w.bin", 4).bytes());
  Graph g = onnx::load(path);
  auto out = reference::run(g, {Tensor::from_vector<float>({1, 1, 0.5f}, {3})});
  EXPECT_EQ(out[0].item_as_double(0), 2);
  EXPECT_EQ(out[0].item_as_double(1), 3);
  EXPECT_EQ(out[0].item_as_double(2), 2);

  // A location that climbs out of the model's folder, or is absolute.
  path = dir.write("escape.onnx", external_model("../w.bin", 0).bytes());
  expect_error<ValueError>([&] { onnx::load(path); }, {path, "'w'", "../w.bin"});
  path = dir.write("abs.onnx", external_model(dir.file("weights/w.bin"), 4).bytes());
  expect_error<ValueError>([&] { onnx::load(path); }, {path, "relative"});

  // A missing file, and a file too short for offset + length.
  path = dir.write("missing.onnx", external_model("weights/none.bin", 0).bytes());
  expect_error<ValueError>([&] { onnx::load(path); }, {path, "none.bin"});
  path = dir.write("short.onnx", external_model("weights/w.bin", 8).bytes());
  expect_error<ValueError>([&] { onnx::load(path); }, {path, "w.bin", "fewer"});

  // From bytes there is no folder to resolve external data against.
  expect_error<ValueError>([&] { load_bytes(external_model("weights/w.bin", 4).bytes()); },
                           {"model.onnx", "external data"});
}

TEST(OnnxImport, WrongInputsAtRunTime) {
  Graph g = load_bytes(small_model().bytes());
  expect_error<ValueError>(
      [&] {
        reference::run(g, {Tensor::zeros(DType::kF32, {2, 4})});
      },
      {"'x'", "dimension 1"});
  expect_error<ValueError>([&] { reference::run(g, {Tensor::zeros(DType::kF32, {3})}); },
                           {"'x'", "rank"});
  expect_error<TypeError>(
      [&] {
        reference::run(g, {Tensor::zeros(DType::kI32, {2, 3})});
      },
      {"'x'", "dtype"});
  expect_error<ValueError>([&] { reference::run(g, {}); }, {"expected 1 inputs"});
}

TEST(OnnxImport, LoadTensorFile) {
  TP t;
  t.set_name("t");
  t.set_data_type(TP::INT64);
  t.add_dims(2);
  t.add_int64_data(-5);
  t.add_int64_data(7);
  TempDir dir;
  std::string path = dir.write("input_0.pb", t.SerializeAsString());
  Tensor v = onnx::load_tensor(path);
  EXPECT_EQ(v.dtype(), DType::kI64);
  EXPECT_EQ(v.item_as_double(1), 7);
  path = dir.write("bad.pb", std::string("\xff\xff\xff", 3));
  expect_error<ValueError>([&] { onnx::load_tensor(path); }, {path});
}

}  // namespace
}  // namespace pto
