// Saved models (pto/serialize.h): a compiled model read back runs bit for bit as the original
// and equals the reference interpreter, without a pass running; every kind of damaged file is a
// ValueError that says what is wrong. Also the DOT picture (pto/graph_dot.h) and the progress
// bar's line (pto/progress.h).
#include <gtest/gtest.h>

#include <cctype>

#include <cstdlib>
#include <cstring>
#include <random>

#include "pto/device_info.h"
#include "pto/executable.h"
#include "pto/graph_dot.h"
#include "pto/progress.h"
#include "pto/reference.h"
#include "pto/serialize.h"
#include "random_tensor.h"

namespace pto {
namespace {

using testing::constant;
using testing::random_tensor;

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// A small network with a symbolic batch: Conv + BatchNorm (folded by the passes) + Relu, a
// residual Add, a Flatten (a view), Gemm + Sigmoid, Mul + Tanh (a tile program), and attributes
// of several kinds.
Graph model() {
  Graph g;
  g.symbol_ranges["batch"] = {1, 16};
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 4, 6, 6}});
  ValueId w = constant(g, "w", {4, 4, 3, 3}, 1), b = constant(g, "b", {4}, 2);
  ValueId scale = constant(g, "scale", {4}, 3), bias = constant(g, "bias", {4}, 4);
  ValueId mean = constant(g, "mean", {4}, 5);
  Tensor var_t = random_tensor({4}, 6);
  for (int i = 0; i < 4; ++i) var_t.data<float>()[i] = 1.0f + std::abs(var_t.data<float>()[i]);
  ValueId var = g.add_value("var");
  g.set_initializer(var, var_t);
  ValueId w2 = constant(g, "w2", {10, 144}, 7), c2 = constant(g, "c2", {10}, 8);
  ValueId conv = g.add_value("conv"), bn = g.add_value("bn"), relu = g.add_value("relu");
  ValueId add = g.add_value("add"), flat = g.add_value("flat"), gemm = g.add_value("gemm");
  ValueId y = g.add_value("y");
  Attributes ca;
  ca.set("pads", std::vector<int64_t>{1, 1, 1, 1});
  ca.set("kernel_shape", std::vector<int64_t>{3, 3});
  ca.set("auto_pad", std::string("NOTSET"));
  g.add_node("Conv", {x, w, b}, {conv}, ca, "conv");
  Attributes ba;
  ba.set("epsilon", 1e-3);
  g.add_node("BatchNormalization", {conv, scale, bias, mean, var}, {bn}, ba, "bn");
  g.add_node("Relu", {bn}, {relu}, {}, "relu");
  g.add_node("Add", {relu, x}, {add}, {}, "residual");
  g.add_node("Flatten", {add}, {flat}, {}, "flatten");
  Attributes ga;
  ga.set("transB", int64_t{1});
  ga.set("alpha", 1.0);
  g.add_node("Gemm", {flat, w2, c2}, {gemm}, ga, "fc");
  g.add_node("Sigmoid", {gemm}, {y}, {}, "sigmoid");
  ValueId mul = g.add_value("mul"), z = g.add_value("z");  // an elementwise tile kernel
  g.add_node("Mul", {add, x}, {mul}, {}, "mul");
  g.add_node("Tanh", {mul}, {z}, {}, "tanh");
  g.add_output(y);
  g.add_output(add);
  g.add_output(z);
  return g;
}

// Sets an environment variable for the scope of a test.
struct EnvScope {
  EnvScope(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old) old_ = old;
    had_ = old != nullptr;
    setenv(name, value, 1);
  }
  ~EnvScope() { had_ ? setenv(name_, old_.c_str(), 1) : unsetenv(name_); }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

std::string error_of(std::string_view bytes) {
  try {
    deserialize_executable(bytes, "m.pto");
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

// The bytes with the payload's size and checksum made right again after an edit.
std::string resealed(std::string bytes) {
  const uint64_t size = bytes.size() - 32;
  const uint64_t sum = saved_model_checksum(bytes.data() + 32, size);
  std::memcpy(bytes.data() + 16, &size, 8);
  std::memcpy(bytes.data() + 24, &sum, 8);
  return bytes;
}

TEST(Serialize, RoundTripRunsBitIdenticallyWithoutPasses) {
  for (int level : {0, 1, 2, 3}) {
    SCOPED_TRACE(cat("level ", level));
    Executable exe = compile(model(), {.level = level});
    const std::string bytes = serialize_executable(exe, "meta data");
    // A pass run while loading would throw: PTO_DISABLE_PASSES names no pass.
    EnvScope no_passes("PTO_DISABLE_PASSES", "NoSuchPass");
    LoadedExecutable m = deserialize_executable(bytes, "m.pto");
    EXPECT_EQ(m.info.metadata, "meta data");
    EXPECT_EQ(m.info.options.level, level);
    EXPECT_EQ(m.info.isa, device_info().isa);
    EXPECT_EQ(m.info.format, kSavedModelFormat);
    EXPECT_EQ(m.exe.num_steps(), exe.num_steps());
    EXPECT_EQ(m.exe.stats().nodes_in, exe.stats().nodes_in);
    ASSERT_EQ(m.exe.pass_report().size(), exe.pass_report().size());
    for (size_t i = 0; i < exe.pass_report().size(); ++i) {
      EXPECT_EQ(m.exe.pass_report()[i].name, exe.pass_report()[i].name);
      EXPECT_EQ(m.exe.pass_report()[i].fired, exe.pass_report()[i].fired);
    }
    std::string why;
    EXPECT_TRUE(structurally_equal(m.exe.graph_with_weights(), exe.graph_with_weights(), &why))
        << why;
    // The same bytes again from the loaded model: nothing was lost or changed on the way.
    EXPECT_TRUE(serialize_executable(m.exe, "meta data") == bytes);
    const Graph original = model();
    for (int64_t batch : {1, 3}) {
      const std::vector<Tensor> in = {random_tensor({batch, 4, 6, 6}, 40 + batch)};
      const auto a = exe.run(in), b = m.exe.run(in);
      const auto ref = reference::run(original, in);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(same_bits(a[i], b[i])) << "output " << i << " batch " << batch;
        for (int64_t e = 0; e < ref[i].numel(); ++e)
          ASSERT_NEAR(b[i].item_as_double(e), ref[i].item_as_double(e), 1e-4);
      }
    }
  }
}

TEST(Serialize, PinnedTilesAndOptionsSurvive) {
  CompileOptions o;
  o.level = 2;
  o.concurrent_kernels = false;
  o.memory_optimization = false;
  o.tiles["*"] = {8};
  Executable exe = compile(model(), o);
  LoadedExecutable m = deserialize_executable(serialize_executable(exe), "m.pto");
  EXPECT_FALSE(m.exe.options().concurrent_kernels);
  EXPECT_FALSE(m.exe.options().memory_optimization);
  EXPECT_EQ(m.exe.options().tiles, o.tiles);
  for (size_t i = 0; i < exe.num_steps(); ++i)
    EXPECT_EQ(m.exe.describe_step(i), exe.describe_step(i)) << "step " << i;
}

TEST(Serialize, DamagedFilesAreClearErrors) {
  const std::string bytes = serialize_executable(compile(model(), {.level = 2}));
  EXPECT_NE(error_of("not a model at all").find("not a PyPTO saved model"), std::string::npos);
  EXPECT_NE(error_of(bytes.substr(0, 20)).find("truncated"), std::string::npos);
  const std::string cut = error_of(bytes.substr(0, bytes.size() - 100));
  EXPECT_NE(cut.find("truncated"), std::string::npos) << cut;
  EXPECT_NE(cut.find("m.pto"), std::string::npos) << cut;
  std::string longer = bytes + "x";
  EXPECT_NE(error_of(longer).find("after its end"), std::string::npos);
  // Every byte of the payload is covered by the checksum: flip a few spread over the file.
  for (size_t at : {size_t{40}, bytes.size() / 2, bytes.size() - 1}) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x10);
    const std::string e = error_of(flipped);
    EXPECT_NE(e.find("corrupt"), std::string::npos) << at << ": " << e;
    EXPECT_NE(e.find("checksum"), std::string::npos) << at << ": " << e;
  }
  std::string other = bytes;
  const uint32_t v2 = kSavedModelFormat + 1;
  std::memcpy(other.data() + 8, &v2, 4);
  const std::string e = error_of(other);
  EXPECT_NE(e.find(cat("format version ", v2)), std::string::npos) << e;
  EXPECT_NE(e.find(cat("reads versions ", kOldestSavedModelFormat, " to ", kSavedModelFormat)),
            std::string::npos)
      << e;
  // A version 1 file (no subgraph attributes) still loads.
  std::string v1 = bytes;
  const uint32_t one = 1;
  std::memcpy(v1.data() + 8, &one, 4);
  EXPECT_EQ(error_of(v1), "(no error)");
  // A damaged payload that still has a right checksum (written by a broken tool) is caught by
  // the bounds checks and the verifier: cut the payload's last bytes and reseal it.
  const std::string short_payload = error_of(resealed(bytes.substr(0, bytes.size() - 9)));
  EXPECT_NE(short_payload.find("corrupt saved model"), std::string::npos) << short_payload;
}

// A file whose checksum was made right after random damage (a broken writer) is an error, never
// a crash: each read is bounds-checked, the graph verified, the partition checked.
TEST(Serialize, ResealedRandomDamageIsAnErrorOrAValidModel) {
  const std::string bytes = serialize_executable(compile(model(), {.level = 2}));
  std::mt19937 rng(7);
  int errors = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string damaged = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t at = 32 + rng() % (bytes.size() - 32);
      damaged[at] = static_cast<char>(rng() & 0xff);
    }
    try {
      LoadedExecutable m = deserialize_executable(resealed(damaged), "m.pto");
      m.exe.run({random_tensor({2, 4, 6, 6}, 3)});
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

// The payload starts with the PyPTO version, the ISA and its CPU features: add one this CPU
// lacks (resealing the checksum) and loading must refuse the file.
TEST(Serialize, ModelForAnIsaThisCpuLacksIsRefused) {
  const std::string bytes = serialize_executable(compile(model(), {.level = 2}));
  size_t at = 32;
  auto skip_string = [&] {
    uint64_t n;
    std::memcpy(&n, bytes.data() + at, 8);
    at += 8 + n;
  };
  skip_string();  // version
  skip_string();  // isa
  uint64_t count;
  std::memcpy(&count, bytes.data() + at, 8);
  const size_t count_at = at;
  at += 8;
  for (uint64_t i = 0; i < count; ++i) skip_string();
  const std::string lacking = device_info().avx512_fp16 ? "amx_fp8" : "avx512_fp16";
  std::string edited = bytes.substr(0, at);
  const uint64_t n = lacking.size(), count2 = count + 1;
  std::memcpy(edited.data() + count_at, &count2, 8);
  edited.append(reinterpret_cast<const char*>(&n), 8);
  edited += lacking;
  edited += bytes.substr(at);
  const std::string e = error_of(resealed(edited));
  EXPECT_NE(e.find(cat("feature ", lacking, " that this CPU lacks")), std::string::npos) << e;
}

TEST(Serialize, PartitionMustFitTheGraph) {
  Executable exe = compile(model(), {.level = 2});
  Graph g = exe.graph_with_weights();
  KernelPartition p = exe.partition();
  ASSERT_GE(p.kernels.kernels.size(), 2u);
  // Runs on the same partition, given explicitly.
  Executable again = compile_partitioned(g, p, exe.options());
  EXPECT_EQ(again.num_steps(), exe.num_steps());
  KernelPartition missing = p;  // a node in no kernel
  missing.kernels.kernels.pop_back();
  missing.leading.pop_back();
  missing.trailing.pop_back();
  EXPECT_THROW(compile_partitioned(g, missing, exe.options()), ValueError);
  KernelPartition reordered = p;  // a kernel before the one that makes its input
  std::swap(reordered.kernels.kernels.front(), reordered.kernels.kernels.back());
  std::swap(reordered.leading.front(), reordered.leading.back());
  std::swap(reordered.trailing.front(), reordered.trailing.back());
  EXPECT_THROW(compile_partitioned(g, reordered, exe.options()), ValueError);
}

// 4-bit weights (packed two per byte in the file) and a float8 constant survive saving: the loaded
// model gives the reference interpreter's bits, and the file is smaller than one byte per element.
TEST(Serialize, StorageDTypeInitializersRoundTrip) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{3, 128}});
  Tensor w4 = Tensor::empty(DType::kI4, {128, 64});
  for (int64_t i = 0; i < w4.numel(); ++i) w4.data<Int4>()[i] = Int4(i * 7 % 16 - 8);
  Tensor f8 = Tensor::empty(DType::kF8E5M2, {64});
  for (int64_t i = 0; i < 64; ++i) f8.data<Float8E5M2>()[i] = Float8E5M2(0.1f * i - 0.7f);
  ValueId w = g.add_value("w4"), s = g.add_value("s"), b = g.add_value("b");
  g.set_initializer(w, w4);
  g.set_initializer(s, Tensor::scalar(0.05f));
  g.set_initializer(b, f8);
  ValueId wf = g.add_value("wf"), bf = g.add_value("bf"), mm = g.add_value("mm");
  ValueId y = g.add_value("y");
  g.add_node("DequantizeLinear", {w, s}, {wf}, {}, "dq");
  Attributes to;
  to.set("to", int64_t{1});
  g.add_node("Cast", {b}, {bf}, to, "cast");
  g.add_node("MatMul", {x, wf}, {mm}, {}, "mm");
  g.add_node("Add", {mm, bf}, {y}, {}, "add");
  g.add_output(y);
  for (int level : {0, 2}) {
    Executable exe = compile(g, {.level = level});
    const std::string bytes = serialize_executable(exe, "");
    if (level == 0) {
      EXPECT_LT(bytes.size(), 128u * 64u);  // the 8192 int4 take 4096 bytes
    }
    LoadedExecutable m = deserialize_executable(bytes, "m.pto");
    const std::vector<Tensor> in = {random_tensor({3, 128}, 9)};
    const auto ref = reference::run(g, in);
    const auto got = m.exe.run(in);
    for (int64_t e = 0; e < ref[0].numel(); ++e) {
      ASSERT_NEAR(got[0].item_as_double(e), ref[0].item_as_double(e), 1e-5) << level;
    }
  }
}

TEST(Serialize, SaveAndLoadFiles) {
  Executable exe = compile(model(), {.level = 2});
  const std::string path = ::testing::TempDir() + "serialize_test.pto";
  save_executable(exe, path, "x");
  EXPECT_TRUE(is_saved_model(path));
  LoadedExecutable m = load_executable(path);
  EXPECT_EQ(m.info.metadata, "x");
  EXPECT_THROW(load_executable(path + ".missing"), ValueError);
  EXPECT_FALSE(is_saved_model(path + ".missing"));
  EXPECT_THROW(save_executable(exe, "/nonexistent-dir/m.pto"), ValueError);
  std::remove(path.c_str());
}

TEST(GraphDot, OneClusterPerFusedKernelAndEveryNode) {
  Executable exe = compile(model(), {.level = 2});
  const std::string dot = to_dot(exe, {.title = "t"});
  size_t fused = 0;
  for (size_t i = 0; i < exe.num_steps(); ++i) fused += exe.step(i).nodes.size() > 1;
  ASSERT_GT(fused, 0u);
  // Clusters are "subgraph cluster_k<digits> {" (no std::regex: GCC 12's regex trips
  // -Wmaybe-uninitialized in the sanitizer build).
  size_t clusters = 0;
  for (size_t at = dot.find("subgraph cluster_k"); at != std::string::npos;
       at = dot.find("subgraph cluster_k", at + 1)) {
    size_t e = at + 18;
    while (e < dot.size() && std::isdigit(static_cast<unsigned char>(dot[e]))) ++e;
    clusters += e > at + 18 && dot.compare(e, 2, " {") == 0;
  }
  EXPECT_EQ(clusters, fused);
  const Graph& g = exe.graph();
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    EXPECT_NE(dot.find(cat("  n", i, " [")), std::string::npos) << "node " << i;
    EXPECT_NE(dot.find(g.nodes()[i].name), std::string::npos) << g.nodes()[i].name;
  }
  // Constants are folded into their reader's label, not drawn as nodes; edges carry types.
  EXPECT_NE(dot.find("w2 f32[10, 144]"), std::string::npos);
  EXPECT_NE(dot.find("label=\" f32[batch, 4, 6, 6]\""), std::string::npos);
  EXPECT_NE(dot.find("shape=invhouse"), std::string::npos);  // the input
  EXPECT_EQ(dot.find("digraph pypto {"), 0u);
  EXPECT_EQ(dot.back(), '\n');
  // Without kernels: no clusters.
  EXPECT_EQ(to_dot(g).find("subgraph"), std::string::npos);
}

TEST(GraphDot, GraphAfterAPass) {
  auto has_op = [](const Graph& g, const std::string& op) {
    for (const Node& n : g.nodes())
      if (n.op == op) return true;
    return false;
  };
  EXPECT_TRUE(has_op(graph_after_pass(model(), 1, "CanonicalizeOps"), "BatchNormalization"));
  EXPECT_FALSE(has_op(graph_after_pass(model(), 1, "FoldBatchNorm"), "BatchNormalization"));
  EXPECT_THROW(graph_after_pass(model(), 1, "AssignLayouts"), ValueError);  // level 3 only
  EXPECT_THROW(check_pass_runs(0, "FoldBatchNorm"), ValueError);
  EXPECT_NO_THROW(check_pass_runs(3, "AssignLayouts"));
}

TEST(GraphDot, NamesAreEscaped) {
  Graph g;
  ValueId x = g.add_input("in \"quoted\"", {DType::kF32, to_shape({2})});
  ValueId y = g.add_value("back\\slash");
  g.add_node("Relu", {x}, {y}, {}, "a \"node\"");
  g.add_output(y);
  const std::string dot = to_dot(g);
  EXPECT_NE(dot.find("in \\\"quoted\\\""), std::string::npos) << dot;
  EXPECT_NE(dot.find("back\\\\slash"), std::string::npos) << dot;
}

TEST(Progress, LineFitsTheWidth) {
  EXPECT_EQ(ProgressBar::render("compiling", 6, 24, "Conv", 80),
            "compiling [######..................] 6/24 Conv");
  EXPECT_EQ(ProgressBar::render("x", 30, 24, "", 80), "x [########################] 24/24");
  EXPECT_EQ(ProgressBar::render("compiling", 1, 2, std::string(200, 'a'), 60).size(), 59u);
  EnvScope off("PTO_PROGRESS", "0");
  EXPECT_FALSE(ProgressBar::wanted());
  EnvScope on("PTO_PROGRESS", "1");
  EXPECT_TRUE(ProgressBar::wanted());
}

}  // namespace
}  // namespace pto
