// Mutation fuzzing of the ONNX importer and the reference interpreter: thousands of randomly
// damaged versions of a valid model must each load and run, or throw a pto::Error. Any other
// exception fails the test; a crash, hang or out-of-bounds access (run it under ASan/UBSan with
// -DPTO_SANITIZE=ON) fails the run. PTO_FUZZ_VERBOSE=1 prints every error message;
// PTO_FUZZ_SCALE and PTO_FUZZ_SEED (below) run longer or different hunts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "onnx_model_builder.h"
#include "pto/onnx.h"
#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {
namespace {

using testing::ModelBuilder;
using TP = ::onnx::TensorProto;

// Several nodes, initializers in raw_data and in typed fields, attributes of every kind the
// importer reads (ints, floats, strings, a tensor), and a symbolic dimension.
std::string base_model() {
  ModelBuilder mb(23);
  mb.input("x", TP::FLOAT, {std::string("batch"), int64_t{4}});
  mb.input("z", TP::FLOAT, {int64_t{1}, int64_t{4}});
  mb.raw_floats("w", {1, -2, 0.5f, 3}, {4});
  mb.typed_floats("b", {0.25f, 0.5f, -1, 2}, {1, 4});
  mb.typed_floats("scale", {1, 1, 2, 0.5f}, {4});
  auto& k = mb.tensor("k", TP::DOUBLE, {});
  k.add_double_data(2.0);
  mb.node("Mul", {"x", "w"}, {"xw"}, "mul");
  mb.node("Add", {"xw", "b"}, {"s"}, "add");
  mb.node("Relu", {"s"}, {"r"}, "relu");
  auto& rms = mb.node("RMSNormalization", {"r", "scale"}, {"n"}, "rms");
  auto* a = rms.add_attribute();
  a->set_name("epsilon");
  a->set_type(::onnx::AttributeProto::FLOAT);
  a->set_f(1e-5f);
  a = rms.add_attribute();
  a->set_name("axis");
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(-1);
  mb.node("Sub", {"n", "z"}, {"d"}, "sub");
  mb.node("Exp", {"d"}, {"e"}, "exp");
  mb.node("Div", {"e", "scale"}, {"y"}, "div");
  // Nodes nobody reads, to exercise the other attribute kinds of the importer.
  a = mb.node("Gelu", {"d"}, {"g"}, "gelu").add_attribute();
  a->set_name("approximate");
  a->set_type(::onnx::AttributeProto::STRING);
  a->set_s("none");
  a = mb.node("Transpose", {"d"}, {"dt"}, "transpose").add_attribute();
  a->set_name("perm");
  a->set_type(::onnx::AttributeProto::INTS);
  a->add_ints(1);
  a->add_ints(0);
  a = mb.node("Constant", {}, {"cf"}, "floats").add_attribute();
  a->set_name("value_floats");
  a->set_type(::onnx::AttributeProto::FLOATS);
  a->add_floats(0.5f);
  a = mb.node("Constant", {}, {"ct"}, "table").add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto::TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(TP::INT32);
  t->add_dims(2);
  t->add_int32_data(7);
  t->add_int32_data(-7);
  mb.output("y");
  mb.output("r");
  return mb.bytes();
}

void mutate(std::string& s, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  static const unsigned char kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x08, 0x10, 0x40};
  switch (rng() % 6) {
    case 0:  // bit flip
      if (!s.empty()) s[pick(s.size())] ^= static_cast<char>(1u << (rng() % 8));
      break;
    case 1:  // overwrite a byte with a random one
      if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
      break;
    case 2:  // overwrite a byte with a boundary value
      if (!s.empty()) s[pick(s.size())] = static_cast<char>(kInteresting[rng() % 8]);
      break;
    case 3:  // truncate
      s.resize(pick(s.size() + 1));
      break;
    case 4: {  // insert random bytes
      std::string ins(1 + rng() % 8, '\0');
      for (char& c : ins) c = static_cast<char>(rng());
      s.insert(pick(s.size() + 1), ins);
      break;
    }
    case 5: {  // duplicate a chunk elsewhere
      if (s.empty()) break;
      size_t from = pick(s.size());
      size_t len = 1 + pick(std::min<size_t>(32, s.size() - from));
      std::string chunk = s.substr(from, len);
      s.insert(pick(s.size() + 1), chunk);
      break;
    }
  }
}

// Inputs from the declared types: symbolic and unknown dims become 2. nullopt when an input
// declares no dtype or no shape (the model loads but cannot be fed blindly).
std::optional<std::vector<Tensor>> make_inputs(const Graph& g, std::mt19937_64& rng) {
  std::vector<Tensor> out;
  for (ValueId v : g.inputs()) {
    const TensorType& t = g.value(v).type;
    if (t.dtype == DType::kUndefined || !t.shape) return std::nullopt;
    Dims dims;
    for (const Dim& d : *t.shape) dims.push_back(d.is_known() ? d.value : 2);
    Tensor x = Tensor::empty(t.dtype, dims);  // may throw ValueError past the allocation limit
    dispatch(t.dtype, kAllTypes, "fuzz input", [&]<class T>() {
      T* p = x.data<T>();
      for (int64_t i = 0; i < x.numel(); ++i) {
        if constexpr (std::is_same_v<T, bool>)
          p[i] = rng() & 1;
        else
          p[i] = static_cast<T>(static_cast<float>(rng() % 7) - 3.0f);  // small, even for ints
      }
    });
    out.push_back(std::move(x));
  }
  return out;
}

int64_t interesting_int(std::mt19937_64& rng) {
  static const int64_t kValues[] = {0, 1,       -1,        2,         3,         4,
                                    7, 1 << 16, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
  if (rng() % 4 == 0) return static_cast<int64_t>(rng());
  return kValues[rng() % std::size(kValues)];
}

// Structure-aware mutations: change one field of the model to a boundary value, so that the
// damage gets past the protobuf parser into the importer and the kernels.
void mutate_structure(::onnx::ModelProto& m, std::mt19937_64& rng) {
  auto& g = *m.mutable_graph();
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  static const char* kOps[] = {"Add", "Sub", "Mul", "Div", "Relu", "Exp", "RMSNormalization", ""};
  switch (rng() % 12) {
    case 0:  // the opset
      m.mutable_opset_import(0)->set_version(rng() % 2 ? interesting_int(rng) : 1 + pick(30));
      break;
    case 1: {  // an initializer's dims
      auto& t = *g.mutable_initializer(pick(g.initializer_size()));
      if (rng() % 3 == 0 || t.dims_size() == 0)
        t.add_dims(rng() % 2 ? interesting_int(rng) : pick(4));
      else
        t.set_dims(pick(t.dims_size()), rng() % 2 ? interesting_int(rng) : pick(6));
      break;
    }
    case 2:  // an initializer's element type
      g.mutable_initializer(pick(g.initializer_size()))->set_data_type(pick(26));
      break;
    case 3: {  // an initializer's data: shorter raw_data, or typed data added or dropped
      auto& t = *g.mutable_initializer(pick(g.initializer_size()));
      if (t.has_raw_data())
        t.mutable_raw_data()->resize(
            static_cast<size_t>(pick(static_cast<int>(t.raw_data().size()) + 8)));
      else if (rng() % 2)
        t.add_float_data(1.5f);
      else
        t.clear_float_data();
      break;
    }
    case 4: {  // a graph input's element type or a dimension
      auto& tt = *g.mutable_input(pick(g.input_size()))->mutable_type()->mutable_tensor_type();
      if (rng() % 2) {
        tt.set_elem_type(pick(26));
      } else if (tt.shape().dim_size()) {
        auto& d = *tt.mutable_shape()->mutable_dim(pick(tt.shape().dim_size()));
        if (rng() % 3)
          d.set_dim_value(rng() % 2 ? interesting_int(rng) : pick(9));
        else
          d.set_dim_param(rng() % 2 ? "batch" : "other");
      } else {
        tt.mutable_shape()->add_dim()->set_dim_value(pick(4));
      }
      break;
    }
    case 5: {  // a node's op: one of the base model's, or any registered op
      static const std::vector<std::string> kAll = OpRegistry::global().names();
      g.mutable_node(pick(g.node_size()))
          ->set_op_type(rng() % 2 ? kOps[pick(std::size(kOps))] : kAll[pick(kAll.size())]);
      break;
    }
    case 6: {  // a node's inputs
      auto& n = *g.mutable_node(pick(g.node_size()));
      int what = pick(3);
      if (what == 0 && n.input_size()) n.mutable_input()->RemoveLast();
      if (what == 1) n.add_input(g.initializer(pick(g.initializer_size())).name());
      if (what == 2 && n.input_size()) n.set_input(pick(n.input_size()), rng() % 2 ? "" : "x");
      break;
    }
    case 7: {  // a node's outputs
      auto& n = *g.mutable_node(pick(g.node_size()));
      if (rng() % 2)
        n.add_output(cat("extra", pick(3)));
      else if (n.output_size())
        n.set_output(0, rng() % 2 ? "" : "x");
      break;
    }
    case 8: {  // an attribute value or kind
      auto& n = *g.mutable_node(pick(g.node_size()));
      auto* a = n.add_attribute();
      static const char* kNames[] = {
          "axis", "axes",  "epsilon",   "stash_type", "keepdims",   "k",       "mode",
          "to",   "alpha", "reduction", "direction",  "batch_dims", "largest", "note"};
      a->set_name(kNames[pick(std::size(kNames))]);
      a->set_type(static_cast<::onnx::AttributeProto::AttributeType>(pick(15)));
      a->set_i(interesting_int(rng));
      if (rng() % 2) a->set_f(static_cast<float>(interesting_int(rng)));
      if (rng() % 2) a->add_ints(interesting_int(rng));
      if (rng() % 2) a->set_s(rng() % 2 ? "LEFT" : "constant");
      break;
    }
    case 9:  // a node's domain
      g.mutable_node(pick(g.node_size()))->set_domain(rng() % 2 ? "ai.onnx" : "com.example");
      break;
    case 10: {  // node order
      int a = pick(g.node_size()), b = pick(g.node_size());
      g.mutable_node()->SwapElements(a, b);
      break;
    }
    case 11:  // a graph output
      if (rng() % 2)
        g.mutable_output(pick(g.output_size()))->set_name(rng() % 2 ? "x" : "w");
      else
        g.add_output()->set_name(g.node(pick(g.node_size())).output(0));
      break;
  }
}

class MaxTensorBytesGuard {
 public:
  explicit MaxTensorBytesGuard(size_t n) : saved_(max_tensor_bytes()) { set_max_tensor_bytes(n); }
  ~MaxTensorBytesGuard() { set_max_tensor_bytes(saved_); }

 private:
  size_t saved_;
};

struct Tally {
  int mutants = 0, load_errors = 0, loaded = 0, ran = 0, run_errors = 0, not_runnable = 0;

  void print(const char* what, double secs) const {
    std::printf(
        "[ fuzz     ] %s: %d mutants in %.2f s: %d rejected at load, %d loaded (%d ran, %d run "
        "errors, %d not runnable)\n",
        what, mutants, secs, load_errors, loaded, ran, run_errors, not_runnable);
  }
};

// Loads and, where possible, runs one mutant; anything but success or a pto::Error fails.
void try_model(const std::string& bytes, const std::string& src, std::mt19937_64& rng,
               Tally& tally) {
  ++tally.mutants;
  std::optional<Graph> g;
  try {
    g = onnx::load_from_bytes(bytes, "", src);
  } catch (const Error& e) {
    if (std::getenv("PTO_FUZZ_VERBOSE")) std::printf("load error: %s\n", e.what());
    ++tally.load_errors;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << src << ": load threw a non-pto exception: " << e.what();
    return;
  }
  ++tally.loaded;
  try {
    auto inputs = make_inputs(*g, rng);
    if (!inputs) {
      ++tally.not_runnable;
      return;
    }
    reference::run(*g, *inputs);
    ++tally.ran;
  } catch (const Error& e) {
    if (std::getenv("PTO_FUZZ_VERBOSE")) std::printf("run error: %s\n", e.what());
    ++tally.run_errors;
  } catch (const std::exception& e) {
    ADD_FAILURE() << src << ": run threw a non-pto exception: " << e.what();
  }
}

// PTO_FUZZ_SCALE=N runs N times as many mutants and PTO_FUZZ_SEED=S changes the seeds, for
// longer hunts than CI's few seconds.
int scaled(int n) {
  const char* s = std::getenv("PTO_FUZZ_SCALE");
  return s ? n * std::max(1, std::atoi(s)) : n;
}
uint64_t seed(uint64_t s) {
  const char* e = std::getenv("PTO_FUZZ_SEED");
  return e ? s ^ std::strtoull(e, nullptr, 10) : s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(OnnxFuzz, BaseModelRuns) {
  Graph g = onnx::load_from_bytes(base_model(), "", "base");
  std::mt19937_64 rng(1);
  auto inputs = make_inputs(g, rng);
  ASSERT_TRUE(inputs.has_value());
  EXPECT_EQ(reference::run(g, *inputs).size(), 2u);
}

// Byte-level damage: bit flips, overwrites, truncation, insertion, duplicated chunks.
TEST(OnnxFuzz, ByteMutationsLoadOrThrowPtoErrors) {
  MaxTensorBytesGuard guard(size_t{64} << 20);
  const std::string base = base_model();
  std::mt19937_64 rng(seed(20240611));
  Tally tally;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < scaled(10000); ++i) {
    std::string m = base;
    int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) mutate(m, rng);
    try_model(m, cat("mutant ", i), rng, tally);
  }
  tally.print("bytes", seconds_since(t0));
  // Most byte mutants die in the protobuf parser; enough must get past it to mean something.
  EXPECT_GT(tally.loaded, tally.mutants / 50);
  EXPECT_GT(tally.ran, tally.mutants / 100);
}

// Field-level damage: boundary values in dims, types, opsets, node wiring and attributes.
TEST(OnnxFuzz, StructuredMutationsLoadOrThrowPtoErrors) {
  MaxTensorBytesGuard guard(size_t{64} << 20);
  ::onnx::ModelProto base;
  ASSERT_TRUE(base.ParseFromString(base_model()));
  std::mt19937_64 rng(seed(77));
  Tally tally;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < scaled(3000); ++i) {
    ::onnx::ModelProto m = base;
    int n = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < n; ++k) mutate_structure(m, rng);
    try_model(m.SerializeAsString(), cat("structured mutant ", i), rng, tally);
  }
  tally.print("structured", seconds_since(t0));
  EXPECT_GT(tally.loaded, tally.mutants / 10);
  EXPECT_GT(tally.run_errors, 0);
}

}  // namespace
}  // namespace pto
