// The text form (print/parse_graph/structurally_equal) and the level-1 graph passes. Each pass
// rule is a Before/Expected pair in the text form, compared structurally; every pair is also run
// through the reference interpreter before and after the pass on the same random inputs (fixed
// seed), which must agree bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "pto/op_registry.h"
#include "pto/passes.h"
#include "pto/reference.h"

namespace pto {
namespace {

Tensor random_tensor(DType dt, const Dims& dims, std::mt19937& rng) {
  Tensor t = Tensor::empty(dt, dims);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(0, 2);
  dispatch(dt, kAllTypes, "random_tensor", [&]<class T>() {
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<T, bool>)
        p[i] = small(rng) == 0;
      else if constexpr (std::is_integral_v<T>)
        p[i] = static_cast<T>(small(rng));
      else
        p[i] = static_cast<T>(normal(rng));
    }
  });
  return t;
}

// Runs both graphs on the same random inputs and expects the same bits in every output.
void expect_same_results(const Graph& before, const Graph& after, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::vector<Tensor> inputs;
  for (ValueId v : before.inputs()) {
    const TensorType& t = before.value(v).type;
    ASSERT_TRUE(t.shape && is_static(*t.shape)) << "test inputs need static shapes";
    inputs.push_back(random_tensor(t.dtype, to_dims(*t.shape), rng));
  }
  std::vector<Tensor> a = reference::run(before, inputs);
  std::vector<Tensor> b = reference::run(after, inputs);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].dtype(), b[i].dtype()) << "output " << i;
    ASSERT_EQ(a[i].shape(), b[i].shape()) << "output " << i;
    Tensor x = a[i].contiguous(), y = b[i].contiguous();
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << "output " << i;
  }
}

// Runs `pass` alone on `before`; the result must equal `expected` structurally and compute the
// same outputs as `before`. Returns the rules that fired.
std::map<std::string, int> expect_pass(const std::string& pass, const std::string& before,
                                       const std::string& expected) {
  Graph g = parse_graph(before);
  std::vector<PassReport> report;
  Graph out = run_passes(parse_graph(before), {.only = {pass}}, &report);
  Graph want = parse_graph(expected);
  std::string why;
  EXPECT_TRUE(structurally_equal(out, want, &why)) << why << "\ngot:\n"
                                                   << print(out) << "expected:\n"
                                                   << print(want);
  expect_same_results(g, out);
  return report.empty() ? std::map<std::string, int>{} : report[0].fired;
}

// A pass that must leave `text` as it is.
void expect_unchanged(const std::string& pass, const std::string& text) {
  std::map<std::string, int> fired = expect_pass(pass, text, text);
  EXPECT_TRUE(fired.empty()) << pass << " fired " << fired.begin()->first;
}

// ---------------------------------------------------------------- text form

TEST(PassTextForm, RoundTripsEveryKindOfLine) {
  const std::string text =
      "graph tiny (opset 17)\n"
      "  input  %x: f32[batch, 3]\n"
      "  input  %\"odd name\": i64[*]\n"
      "  input  %q: f16[?, 2]\n"
      "  const  %w: f32[3] = [1, -2.5, 0.1]\n"
      "  const  %i: i64[] = [-7]\n"
      "  const  %b: bool[2] = [true, false]\n"
      "  const  %big: f32[17]\n"
      "  %onnx::Mul_1: f32[batch, 3] = Mul(%x, %w)  # mul 1\n"
      "  %y: f32[batch, 3], _ = Dropout(%onnx::Mul_1)  # drop\n"
      "  %z: f32[batch, 3] = LeakyRelu(%y) {alpha=0.01}  # lrelu\n"
      "  %c: f32[2] = Constant() {value=tensor<f32[2] = [1.5, -inf]>}  # const\n"
      "  %e: f32[batch, 3] = com.example.Relu(%z) {floats=[1.0, 2.5e-08], ints=[1, -2], "
      "s=\"a \\\"q\\\"\", ss=[\"p\", \"q\"]}  # custom\n"
      "  return %e, %c\n";
  Graph g = parse_graph(text);
  EXPECT_EQ(print(g), text);
  EXPECT_EQ(g.name, "tiny");
  EXPECT_EQ(g.opset, 17);
  EXPECT_EQ(g.nodes()[4].domain, "com.example");
  EXPECT_EQ(g.nodes()[4].attrs.get_string("s"), "a \"q\"");
  EXPECT_EQ(g.nodes()[2].attrs.get_float("alpha"), static_cast<double>(0.01f));  // via float
  EXPECT_EQ(g.initializer(*g.find_value("w"))->item_as_double(2), static_cast<double>(0.1f));
  std::string why;
  EXPECT_TRUE(structurally_equal(g, parse_graph(print(g)), &why)) << why;
}

TEST(PassTextForm, RoundTripsABuiltGraph) {
  Graph g;
  g.opset = 18;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("n"), 4}});
  ValueId w = g.add_value("weights.0");
  g.set_initializer(w, Tensor::from_vector<float>({0.1f, 0.2f, 1e-30f, 3.0f}, {4}));
  ValueId y = g.add_value("");  // auto-named "%1"
  g.add_node("Add", {x, w}, {y});
  ValueId z = g.add_value("z");
  Attributes a;
  a.set("epsilon", 1e-5);                     // not a float: prints "1e-05d"
  a.set("alpha", static_cast<double>(0.1f));  // a float: prints "0.1"
  a.set("axis", int64_t{-1});
  g.add_node("LayerNormalization", {y, w, kNoValue}, {z}, a, "ln");
  g.add_output(z);
  infer_types(g);
  std::string text = print(g);
  EXPECT_NE(text.find("epsilon=1e-05d"), std::string::npos) << text;
  EXPECT_NE(text.find("alpha=0.1,"), std::string::npos) << text;
  Graph back = parse_graph(text);
  EXPECT_EQ(print(back), text);
  std::string why;
  EXPECT_TRUE(structurally_equal(g, back, &why)) << why;
}

TEST(PassTextForm, ErrorsNameTheLine) {
  auto error_of = [](const std::string& text) {
    try {
      parse_graph(text);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of("graph g (opset 18)\n  input %x: f32[2]\n  %y = Relu(%nope)\n  return %y\n")
                .find("line 3"),
            std::string::npos);
  EXPECT_NE(error_of("graph g (opset 18)\n  input %x: f32[2]\n  %y = NoSuchOp(%x)\n  return %y\n")
                .find("line 3"),
            std::string::npos);
  EXPECT_NE(error_of("graph g (opset 18)\n  input %x: q7[2]\n  return %x\n").find("line 2"),
            std::string::npos);
  EXPECT_NE(error_of("graph g (opset 18)\n  const %w: f32[2] = [1]\n  return %w\n").find("line 2"),
            std::string::npos);
  EXPECT_NE(error_of("graph g (opset 18)\n  input %x: f32[2]\n").find("return"), std::string::npos);
  EXPECT_NE(error_of("graph g (opset 18)\n  input %x: f32[2]\n  %x = Relu(%x)\n  return %x\n")
                .find("line 3"),
            std::string::npos);
}

// Random edits of a valid text either parse (and then print stably) or raise a ValueError that
// starts with "parse_graph"; nothing else escapes.
TEST(PassTextForm, MangledTextIsAValueErrorOrParsesStably) {
  const std::string base =
      "graph g (opset 17)\n"
      "  input  %x: f32[batch, 3]\n"
      "  const  %w: f32[3] = [1, -2.5, 0.1]\n"
      "  const  %s: i64[2] = [3, 1]\n"
      "  %m: f32[batch, 3] = Mul(%x, %w)  # mul\n"
      "  %y: f32[batch, 3], _ = Dropout(%m)  # drop\n"
      "  %z = LeakyRelu(%y) {alpha=0.01}\n"
      "  %r = Reshape(%z, %s)\n"
      "  %c: f32[2] = Constant() {value=tensor<f32[2] = [1.5, -inf]>}  # const\n"
      "  %e = Relu(%z) {floats=[1.0, 2.5e-08], ints=[1, -2], s=\"a\", ss=[\"p\"]}\n"
      "  return %e, %c, %r\n";
  std::mt19937 rng(3);
  const std::string alphabet = "%[](){}=,:#\"_ 0123456789-.eabcdfxyz\n*?<>";
  for (int it = 0; it < 3000; ++it) {
    std::string t = base;
    for (int k = 0, edits = 1 + static_cast<int>(rng() % 4); k < edits; ++k) {
      size_t pos = rng() % t.size();
      switch (rng() % 3) {
        case 0:
          t[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          t.erase(pos, 1 + rng() % 5);
          break;
        default:
          t.insert(pos, 1, alphabet[rng() % alphabet.size()]);
          break;
      }
    }
    try {
      Graph g = parse_graph(t);
      std::string printed = print(g);
      Graph again = parse_graph(printed);
      EXPECT_EQ(print(again), printed);
      std::string why;
      EXPECT_TRUE(structurally_equal(g, again, &why)) << why << "\n" << printed;
    } catch (const ValueError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("parse_graph", 0), 0u) << e.what();
    }
  }
}

TEST(PassTextForm, StructuralEqualityIgnoresNamesAndOrderButNotWiring) {
  const char* a = R"(graph a (opset 18)
  input %x: f32[2]
  input %y: f32[2]
  const %c: f32[2] = [1, 2]
  %p = Exp(%x)
  %q = Log(%y)
  %r = Sub(%p, %q)
  %s = Mul(%r, %c)
  return %s
)";
  const char* renamed_reordered = R"(graph b (opset 18)
  input %u: f32[2]
  input %v: f32[2]
  const %k: f32[2] = [1, 2]
  %b = Log(%v)
  %a = Exp(%u)
  %d = Sub(%a, %b)
  %e = Mul(%d, %k)
  return %e
)";
  const char* swapped = R"(graph b (opset 18)
  input %x: f32[2]
  input %y: f32[2]
  const %c: f32[2] = [1, 2]
  %p = Exp(%x)
  %q = Log(%y)
  %r = Sub(%q, %p)
  %s = Mul(%r, %c)
  return %s
)";
  const char* other_data = R"(graph b (opset 18)
  input %x: f32[2]
  input %y: f32[2]
  const %c: f32[2] = [1, 3]
  %p = Exp(%x)
  %q = Log(%y)
  %r = Sub(%p, %q)
  %s = Mul(%r, %c)
  return %s
)";
  const char* other_attr = R"(graph b (opset 18)
  input %x: f32[2]
  input %y: f32[2]
  const %c: f32[2] = [1, 2]
  %p = Exp(%x)
  %q = Log(%y)
  %r = Sub(%p, %q)
  %s = Mul(%r, %c)
  %t = Softmax(%s) {axis=0}
  return %t
)";
  std::string why;
  EXPECT_TRUE(structurally_equal(parse_graph(a), parse_graph(renamed_reordered), &why)) << why;
  EXPECT_FALSE(structurally_equal(parse_graph(a), parse_graph(swapped), &why));
  EXPECT_NE(why.find("Log"), std::string::npos) << why;
  EXPECT_FALSE(structurally_equal(parse_graph(a), parse_graph(other_data), &why));
  EXPECT_NE(why.find("constant"), std::string::npos) << why;
  std::string t(other_attr);
  Graph g1 = parse_graph(t);
  Graph g2 = parse_graph(t.replace(t.find("axis=0"), 6, "axis=-1"));
  EXPECT_FALSE(structurally_equal(g1, g2, &why));
  EXPECT_NE(why.find("attributes"), std::string::npos) << why;
}

// ---------------------------------------------------------------- FoldConstants

TEST(PassFoldConstants, FoldsAChainOfConstantNodes) {
  auto fired = expect_pass("FoldConstants", R"(graph t (opset 18)
  input %x: f32[2]
  const %a: f32[2] = [1, 2]
  const %b: f32[2] = [3, -4]
  %c = Add(%a, %b)
  %d = Abs(%c)
  %y = Mul(%x, %d)
  return %y
)",
                           R"(graph t (opset 18)
  input %x: f32[2]
  const %d: f32[2] = [4, 2]
  %y = Mul(%x, %d)
  return %y
)");
  EXPECT_EQ(fired["FoldConstants/Add"], 1);
  EXPECT_EQ(fired["FoldConstants/Abs"], 1);
}

TEST(PassFoldConstants, FoldsShapeAndSizeOfStaticShapes) {
  auto fired = expect_pass("FoldConstants", R"(graph t (opset 18)
  input %x: f32[2, 3, 5]
  input %v: f32[5]
  input %w: f32[6]
  %s = Shape(%x) {start=1}
  %s2 = Shape(%x) {end=-1}
  %n = Size(%x)
  %f = Cast(%n) {to=1}
  %y = Mul(%x, %f)
  %e = Expand(%v, %s)
  %z = Add(%y, %e)
  %r = Reshape(%w, %s2)
  return %z, %r
)",
                           R"(graph t (opset 18)
  input %x: f32[2, 3, 5]
  input %v: f32[5]
  input %w: f32[6]
  const %s: i64[2] = [3, 5]
  const %s2: i64[2] = [2, 3]
  const %f: f32[] = [30]
  %y = Mul(%x, %f)
  %e = Expand(%v, %s)
  %z = Add(%y, %e)
  %r = Reshape(%w, %s2)
  return %z, %r
)");
  EXPECT_EQ(fired["FoldConstants/static Shape"], 2);
  EXPECT_EQ(fired["FoldConstants/static Size"], 1);
  EXPECT_EQ(fired["FoldConstants/Cast"], 1);
}

TEST(PassFoldConstants, LeavesWhatItCannotFold) {
  // A symbolic shape, an overridable input default, a kernel that fails (index out of range) and
  // a result over 64 MiB.
  Graph g = parse_graph(R"(graph t (opset 18)
  input %x: f32[n, 3]
  input %d: f32[3]
  const %d: f32[3] = [1, 2, 3]
  const %bad: i64[1] = [7]
  const %w: f32[3] = [1, 2, 3]
  const %big: i64[2] = [5000, 5000]
  %s = Shape(%x)
  %e = Exp(%d)
  %r = Gather(%w, %bad) {axis=0}
  %z = ConstantOfShape(%big)
  return %s, %e, %r, %z
)");
  std::vector<PassReport> report;
  Graph out = run_passes(parse_graph(print(g)), {.only = {"FoldConstants"}}, &report);
  std::string why;
  EXPECT_TRUE(structurally_equal(out, g, &why)) << why;
  EXPECT_TRUE(report.at(0).fired.empty());
}

TEST(PassFoldConstants, MaxFoldedBytesLimitsWhatFolds) {
  // As the runtime plans memory per input shape: shape arithmetic folds, a 4 KiB+ mask does not.
  const char* src = R"(graph t (opset 18)
  input %x: f32[1, 2000]
  %s = Shape(%x)
  %z = ConstantOfShape(%s)
  %y = Add(%x, %z)
  return %y
)";
  std::vector<PassReport> all, small;
  run_passes(parse_graph(src), {.only = {"FoldConstants"}}, &all);
  run_passes(parse_graph(src), {.only = {"FoldConstants"}, .max_folded_bytes = 4096}, &small);
  EXPECT_EQ(all.at(0).fired["FoldConstants/ConstantOfShape"], 1);
  EXPECT_EQ(small.at(0).fired["FoldConstants/static Shape"], 1);
  EXPECT_EQ(small.at(0).fired.count("FoldConstants/ConstantOfShape"), 0u);
}

// ---------------------------------------------------------------- EliminateNoOps

TEST(PassEliminateNoOps, RemovesIdentityLikeNodes) {
  auto fired = expect_pass("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[2, 3]
  const %s23: i64[2] = [2, 3]
  const %ax: i64[1] = [1]
  const %st: i64[1] = [0]
  const %en: i64[1] = [3]
  const %pz: i64[4] = [0, 0, 0, 0]
  %a = Relu(%x)
  %b = Identity(%a)
  %c, _ = Dropout(%b)
  %d = Cast(%c) {to=1}
  %e = Reshape(%d, %s23)
  %f = Flatten(%e) {axis=1}
  %g = Expand(%f, %s23)
  %h = Transpose(%g) {perm=[0, 1]}
  %i = Slice(%h, %st, %en, %ax)
  %j = Pad(%i, %pz)
  %k = Concat(%j) {axis=0}
  %l = Sum(%k)
  %m = Max(%l)
  %n = Min(%m)
  %o = Neg(%n)
  return %o
)",
                           R"(graph t (opset 18)
  input %x: f32[2, 3]
  %a = Relu(%x)
  %o = Neg(%a)
  return %o
)");
  for (const char* op : {"Identity", "Dropout", "Cast", "Reshape", "Flatten", "Expand", "Transpose",
                         "Slice", "Pad", "Concat", "Sum", "Max", "Min"})
    EXPECT_EQ(fired[cat("EliminateNoOps/", op)], 1) << op;
}

TEST(PassEliminateNoOps, RemovesASqueezeThatKeepsTheShape) {
  // No axis of size 1: Squeeze without axes changes nothing.
  expect_pass("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[2, 3]
  %a = Exp(%x)
  %b = Squeeze(%a)
  %c = Neg(%b)
  return %c
)",
              R"(graph t (opset 18)
  input %x: f32[2, 3]
  %a = Exp(%x)
  %c = Neg(%a)
  return %c
)");
}

TEST(PassEliminateNoOps, ArithmeticIdentitiesAreExact) {
  // x*1, 1*x, x/1, x+(-0), x-(+0) go; x+(+0) (turns -0 into +0), x-(-0) and 0-x stay.
  auto fired = expect_pass("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[2, 3]
  const %one: f32[3] = [1, 1, 1]
  const %nz: f32[] = [-0]
  const %pz: f32[] = [0]
  %a = Mul(%x, %one)
  %b = Mul(%one, %a)
  %c = Div(%b, %one)
  %d = Add(%c, %nz)
  %e = Sub(%d, %pz)
  %f = Add(%e, %pz)
  %g = Sub(%f, %nz)
  %h = Sub(%pz, %g)
  return %h
)",
                           R"(graph t (opset 18)
  input %x: f32[2, 3]
  const %pz: f32[] = [0]
  const %nz: f32[] = [-0]
  %f = Add(%x, %pz)
  %g = Sub(%f, %nz)
  %h = Sub(%pz, %g)
  return %h
)");
  EXPECT_EQ(fired["EliminateNoOps/Mul"], 2);
  EXPECT_EQ(fired["EliminateNoOps/Add"], 1);
  EXPECT_EQ(fired["EliminateNoOps/Sub"], 1);
  // Broadcasting that changes the shape, and integer zero.
  expect_unchanged("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[3]
  const %one: f32[2, 3] = [1, 1, 1, 1, 1, 1]
  %a = Mul(%x, %one)
  return %a
)");
  expect_pass("EliminateNoOps", R"(graph t (opset 18)
  input %x: i32[3]
  const %z: i32[] = [0]
  %a = Add(%x, %z)
  %b = Neg(%a)
  return %b
)",
              R"(graph t (opset 18)
  input %x: i32[3]
  %b = Neg(%x)
  return %b
)");
}

TEST(PassEliminateNoOps, KeepsWhatChangesData) {
  // A used Dropout mask, a reversing Slice, a shifting Pad, a real Cast and Transpose.
  expect_unchanged("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[2, 3]
  const %st: i64[1] = [-1]
  const %en: i64[1] = [-9]
  const %ax: i64[1] = [1]
  const %sp: i64[1] = [-1]
  const %pads: i64[4] = [0, 1, 0, -1]
  %y, %mask = Dropout(%x)
  %m = Cast(%mask) {to=1}
  %a = Add(%y, %m)
  %b = Slice(%a, %st, %en, %ax, %sp)
  %c = Pad(%b, %pads)
  %d = Cast(%c) {to=10}
  %e = Transpose(%d) {perm=[1, 0]}
  return %e
)");
}

TEST(PassEliminateNoOps, KeepsAnIdentityFromInputToOutput) {
  // Removing it would make the graph output the input itself, under the input's name.
  expect_unchanged("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[2]
  %y = Identity(%x)
  return %y
)");
  // An intermediate takes over the output's name instead.
  expect_pass("EliminateNoOps", R"(graph t (opset 18)
  input %x: f32[2]
  %a = Exp(%x)
  %y = Identity(%a)
  return %y
)",
              R"(graph t (opset 18)
  input %x: f32[2]
  %y = Exp(%x)
  return %y
)");
  Graph out = run_passes(parse_graph(R"(graph t (opset 18)
  input %x: f32[2]
  %a = Exp(%x)
  %y = Identity(%a)
  return %y
)"),
                         {.only = {"EliminateNoOps"}});
  EXPECT_EQ(out.value(out.outputs()[0]).name, "y");
}

// ---------------------------------------------------------------- SimplifyTransposes

TEST(PassSimplifyTransposes, ComposesTransposes) {
  auto fired = expect_pass("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  %a = Transpose(%x) {perm=[1, 2, 0]}
  %b = Transpose(%a) {perm=[0, 2, 1]}
  %c = Transpose(%b)
  return %c
)",
                           // [1,2,0] then [0,2,1] is [1,0,2]; then the default reverse [2,1,0]
                           // gives [2,0,1].
                           R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  %c = Transpose(%x) {perm=[2, 0, 1]}
  return %c
)");
  EXPECT_EQ(fired["SimplifyTransposes/Transpose-Transpose"], 2);
  expect_pass("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  %a = Transpose(%x) {perm=[1, 2, 0]}
  %b = Transpose(%a) {perm=[2, 0, 1]}
  %c = Exp(%b)
  return %c
)",
              R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  %c = Exp(%x)
  return %c
)");
  // The intermediate is used twice: nothing to merge.
  expect_unchanged("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[2, 3]
  %a = Transpose(%x) {perm=[1, 0]}
  %b = Transpose(%a) {perm=[1, 0]}
  %c = Exp(%a)
  return %b, %c
)");
}

TEST(PassSimplifyTransposes, MergesReshapeChains) {
  auto fired = expect_pass("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  const %s: i64[2] = [6, 4]
  const %ax: i64[1] = [0]
  %a = Reshape(%x, %s)
  %b = Unsqueeze(%a, %ax)
  %c = Flatten(%b) {axis=2}
  %d = Exp(%c)
  return %d
)",
                           R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  const %s: i64[2] = [6, 4]
  %c = Reshape(%x, %s)
  %d = Exp(%c)
  return %d
)");
  EXPECT_EQ(fired["SimplifyTransposes/Reshape-Reshape"], 2);
}

// A Transpose that moves only axes of size 1 is a Reshape (a view): a decode step's head split
// and merge, [1, 1, 12, 64] <-> [1, 12, 1, 64], merged with the Reshapes around them. A Transpose
// that swaps two axes of more than one element stays.
TEST(PassSimplifyTransposes, TransposesOfUnitAxesBecomeReshapes) {
  auto fired = expect_pass("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[1, 96]
  const %s: i64[4] = [1, 1, 12, 8]
  const %flat: i64[2] = [1, 96]
  %a = Reshape(%x, %s)
  %b = Transpose(%a) {perm=[0, 2, 1, 3]}
  %c = Exp(%b)
  %d = Transpose(%c) {perm=[0, 2, 1, 3]}
  %e = Reshape(%d, %flat)
  return %e
)",
                           R"(graph t (opset 18)
  input %x: f32[1, 96]
  const %b_shape: i64[4] = [1, 12, 1, 8]
  const %e_shape: i64[2] = [1, 96]
  %b = Reshape(%x, %b_shape)
  %c = Exp(%b)
  %e = Reshape(%c, %e_shape)
  return %e
)");
  EXPECT_EQ(fired["SimplifyTransposes/Transpose=Reshape"], 2);
  expect_unchanged("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[1, 2, 12, 8]
  %b = Transpose(%x) {perm=[0, 2, 1, 3]}
  return %b
)");
}

// The dynamo exporter's K^T of a [b, h, L, d] key: merge b and h, swap the last two axes, split
// b and h back. One Transpose of the 4-D key (which RecognizeAttention then reads as K). A split
// other than the merge's ([h, b] from b * h) stays.
TEST(PassSimplifyTransposes, BatchedTransposeBetweenReshapesIsOneTranspose) {
  auto fired = expect_pass("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[2, 3, 5, 4]
  const %merge: i64[3] = [6, 5, 4]
  const %split: i64[4] = [2, 3, 4, 5]
  %a = Reshape(%x, %merge)
  %b = Transpose(%a) {perm=[0, 2, 1]}
  %c = Reshape(%b, %split)
  %d = Exp(%c)
  return %d
)",
                           R"(graph t (opset 18)
  input %x: f32[2, 3, 5, 4]
  %c = Transpose(%x) {perm=[0, 1, 3, 2]}
  %d = Exp(%c)
  return %d
)");
  EXPECT_EQ(fired["SimplifyTransposes/Reshape-Transpose-Reshape"], 1);
  expect_unchanged("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[2, 3, 5, 4]
  const %merge: i64[3] = [6, 5, 4]
  const %split: i64[4] = [3, 2, 4, 5]
  %a = Reshape(%x, %merge)
  %b = Transpose(%a) {perm=[0, 2, 1]}
  %c = Reshape(%b, %split)
  return %c
)");
}

TEST(PassSimplifyTransposes, DropsLosslessIntermediateCasts) {
  expect_pass("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[5]
  input %i: i16[5]
  %a = Cast(%x) {to=11}
  %b = Cast(%a) {to=10}
  %c = Cast(%x) {to=11}
  %d = Cast(%c) {to=1}
  %e = Cast(%i) {to=6}
  %f = Cast(%e) {to=1}
  %g = Add(%d, %f)
  return %b, %g
)",
              R"(graph t (opset 18)
  input %x: f32[5]
  input %i: i16[5]
  %b = Cast(%x) {to=10}
  %f = Cast(%i) {to=1}
  %g = Add(%x, %f)
  return %b, %g
)");
  // f32 -> f16 loses bits: f32 -> f16 -> f32 is not the identity.
  expect_unchanged("SimplifyTransposes", R"(graph t (opset 18)
  input %x: f32[5]
  %a = Cast(%x) {to=10}
  %b = Cast(%a) {to=1}
  return %b
)");
}

// ---------------------------------------------------------------- CSE

TEST(PassEliminateCommonSubexpressions, MergesEqualNodesAndConstants) {
  auto fired = expect_pass("EliminateCommonSubexpressions", R"(graph t (opset 18)
  input %x: f32[2, 3]
  const %c1: f32[3] = [1, 2, 3]
  const %c2: f32[3] = [1, 2, 3]
  %a = Add(%x, %c1)
  %b = Add(%x, %c2)
  %p = Softmax(%a) {axis=1}
  %q = Softmax(%b) {axis=1}
  %r = Softmax(%b) {axis=0}
  %k1 = Constant() {value=tensor<f32[2] = [1, 2]>}
  %k2 = Constant() {value=tensor<f32[2] = [1, 2]>}
  %k3 = Constant() {value=tensor<f32[2] = [1, 3]>}
  %s = Sub(%p, %q)
  %t = Add(%s, %r)
  %u = Add(%k1, %k2)
  %v = Add(%u, %k3)
  return %t, %v
)",
                           R"(graph t (opset 18)
  input %x: f32[2, 3]
  const %c1: f32[3] = [1, 2, 3]
  %a = Add(%x, %c1)
  %p = Softmax(%a) {axis=1}
  %r = Softmax(%a) {axis=0}
  %k1 = Constant() {value=tensor<f32[2] = [1, 2]>}
  %k3 = Constant() {value=tensor<f32[2] = [1, 3]>}
  %s = Sub(%p, %p)
  %t = Add(%s, %r)
  %u = Add(%k1, %k1)
  %v = Add(%u, %k3)
  return %t, %v
)");
  EXPECT_EQ(fired["EliminateCommonSubexpressions/constant"], 1);
  EXPECT_EQ(fired["EliminateCommonSubexpressions/Add"], 1);
  EXPECT_EQ(fired["EliminateCommonSubexpressions/Softmax"], 1);
  EXPECT_EQ(fired["EliminateCommonSubexpressions/Constant"], 1);
}

TEST(PassEliminateCommonSubexpressions, KeepsTwoGraphOutputs) {
  // Both outputs are seen by callers under their names: merging would lose one.
  expect_unchanged("EliminateCommonSubexpressions", R"(graph t (opset 18)
  input %x: f32[2]
  %a = Exp(%x)
  %b = Exp(%x)
  return %a, %b
)");
}

// ---------------------------------------------------------------- nondeterministic ops

// No random op is registered yet (RandomNormal and friends will carry kNondeterministic), so the
// test marks Sin as one for its duration: the property alone must stop folding and merging.
class MarkNondeterministic {
 public:
  explicit MarkNondeterministic(const char* op)
      : def_(const_cast<OpDef*>(OpRegistry::global().find(op))), saved_(def_->properties) {
    def_->properties |= kNondeterministic;
  }
  ~MarkNondeterministic() { def_->properties = saved_; }

 private:
  OpDef* def_;
  uint32_t saved_;
};

TEST(PassNondeterministic, NeitherFoldedNorMerged) {
  const char* text = R"(graph t (opset 18)
  input %x: f32[2]
  const %c: f32[2] = [1, 2]
  %r1 = Sin(%c)
  %r2 = Sin(%c)
  %d = Sub(%r1, %r2)
  %y = Add(%x, %d)
  return %y
)";
  for (const char* pass : {"FoldConstants", "EliminateCommonSubexpressions"}) {
    std::vector<PassReport> report;
    {
      MarkNondeterministic mark("Sin");
      Graph out = run_passes(parse_graph(text), {.only = {pass}}, &report);
      std::string why;
      EXPECT_TRUE(structurally_equal(out, parse_graph(text), &why)) << pass << ": " << why;
      EXPECT_TRUE(report.at(0).fired.empty()) << pass;
    }
    // Without the mark both passes do rewrite it.
    report.clear();
    run_passes(parse_graph(text), {.only = {pass}}, &report);
    EXPECT_FALSE(report.at(0).fired.empty()) << pass;
  }
}

// ---------------------------------------------------------------- random graphs

Attributes attrs_of(const char* name, Attribute value) {
  Attributes a;
  a.set(name, std::move(value));
  return a;
}

// A random chain over x: f32[2, 3, 4] of the layout ops, casts, arithmetic with 0, -0, 1 and 2,
// Shape -> Reshape, and copies of earlier nodes (for CSE), keeping values whose shape is static.
Graph random_graph(std::mt19937& rng) {
  Graph g;
  g.opset = 18;
  std::vector<ValueId> pool = {g.add_input("x", {DType::kF32, Shape{2, 3, 4}})};
  auto ints = [&](std::vector<int64_t> v) {
    auto n = static_cast<int64_t>(v.size());
    return g.add_constant("k", Tensor::from_vector(v, {n}));
  };
  const int steps = 3 + static_cast<int>(rng() % 10);
  for (int i = 0; i < steps; ++i) {
    ValueId x = pool[rng() % pool.size()];
    Dims d = to_dims(*g.value(x).type.shape);
    DType dt = g.value(x).type.dtype;
    ValueId y = g.add_value("");
    try {
      switch (rng() % 11) {
        case 0: {
          std::vector<int64_t> p(d.size());
          std::iota(p.begin(), p.end(), 0);
          std::shuffle(p.begin(), p.end(), rng);
          g.add_node("Transpose", {x}, {y}, rng() % 4 ? attrs_of("perm", p) : Attributes());
          break;
        }
        case 1: {
          int64_t rest = checked_numel(d);
          std::vector<int64_t> s;
          for (int64_t f : {2, 3, 2})
            if (rest % f == 0 && rng() % 2) s.push_back(f), rest /= f;
          s.push_back(rng() % 3 ? rest : -1);
          g.add_node("Reshape", {x, ints(s)}, {y});
          break;
        }
        case 2:
          g.add_node("Flatten", {x}, {y}, attrs_of("axis", int64_t(rng() % (d.size() + 1))));
          break;
        case 3:
          g.add_node("Unsqueeze", {x, ints({0})}, {y});
          break;
        case 4:
          g.add_node(rng() % 2 ? "Identity" : "Dropout", {x}, {y});
          break;
        case 5: {
          const int64_t codes[] = {1, 11, 10, 7, 6, 16};  // f32 f64 f16 i64 i32 bf16
          g.add_node("Cast", {x}, {y}, attrs_of("to", codes[rng() % 6]));
          break;
        }
        case 6: {
          const char* ops[] = {"Add", "Sub", "Mul", "Div"};
          const float vals[] = {0.0f, -0.0f, 1.0f, 2.0f};
          Tensor c = Tensor::empty(dt, {});
          float v = vals[rng() % 4];
          dispatch(dt, kNumericTypes, "test", [&]<class T>() { *c.data<T>() = static_cast<T>(v); });
          ValueId k = g.add_constant("c", c);
          const char* op = ops[rng() % 4];
          g.add_node(op, rng() % 2 ? std::vector{x, k} : std::vector{k, x}, {y});
          break;
        }
        case 7:
          g.add_node(is_floating(dt) ? "Exp" : "Neg", {x}, {y});
          break;
        case 8: {
          ValueId s = g.add_value("");
          g.add_node("Shape", {x}, {s});
          g.add_node("Reshape", {x, s}, {y});
          break;
        }
        case 9: {  // a copy of an earlier single-output node
          Node m = g.nodes().empty() ? Node() : g.nodes()[rng() % g.nodes().size()];
          if (m.outputs.size() == 1)
            g.add_node(m.op, m.inputs, {y}, m.attrs);
          else
            g.add_node("Identity", {x}, {y});
          break;
        }
        default:
          g.add_node(rng() % 2 ? "Concat" : "Sum", rng() % 2 ? std::vector{x} : std::vector{x, x},
                     {y}, attrs_of("axis", int64_t{0}));
      }
      infer_types(g);
    } catch (const Error&) {
      break;  // an op the chain cannot take here (e.g. Sub on a bool): stop growing
    }
    if (g.value(y).type.shape && is_static(*g.value(y).type.shape)) pool.push_back(y);
  }
  g.add_output(pool.back());
  if (pool.size() > 2) g.add_output(pool[1 + rng() % (pool.size() - 2)]);
  return g;
}

// Every pass alone, and the level-1 pipeline, keep the bits of every output (on an input holding
// -0.0) and the names of the outputs. Not PromoteHalf, which a graph computing in f16 or bf16
// gets first: it computes in fp32 instead, more accurately, by design (docs/precision.md).
TEST(PassProperty, RandomGraphsKeepResultsAndOutputNames) {
  std::mt19937 rng(11);
  int tested = 0;
  for (int trial = 0; trial < 150; ++trial) {
    Graph g = random_graph(rng);
    std::vector<Tensor> want;
    Tensor in = random_tensor(DType::kF32, {2, 3, 4}, rng);
    in.data<float>()[0] = -0.0f;
    try {
      verify(g);
      want = reference::run(g, {in});
    } catch (const Error&) {
      continue;  // the chain stopped in an invalid state
    }
    ++tested;
    for (const char* pass : {"FoldConstants", "EliminateNoOps", "SimplifyTransposes",
                             "EliminateCommonSubexpressions", ""}) {
      PassOptions options;
      options.only = *pass ? std::vector<std::string>{pass} : pipeline(1);
      Graph out = run_passes(parse_graph(print(g)), options);  // small constants: exact text
      std::vector<Tensor> got = reference::run(out, {in});
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        Tensor a = want[i].contiguous(), b = got[i].contiguous();
        ASSERT_TRUE(a.dtype() == b.dtype() && a.shape() == b.shape() &&
                    std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0)
            << (*pass ? pass : "level 1") << " changed output " << i << " of\n"
            << print(g) << "into\n"
            << print(out);
        EXPECT_EQ(out.value(out.outputs()[i]).name, g.value(g.outputs()[i]).name);
      }
    }
  }
  EXPECT_GT(tested, 100);
}

// ---------------------------------------------------------------- the level-1 pipeline

TEST(PassPipeline, Level1ResolvesAShapeChainToAStaticReshape) {
  const std::string before = R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  const %i0: i64[] = [0]
  const %ax: i64[1] = [0]
  const %m1: i64[1] = [-1]
  %s = Shape(%x)
  %d0 = Gather(%s, %i0) {axis=0}
  %u = Unsqueeze(%d0, %ax)
  %shape = Concat(%u, %m1) {axis=0}
  %y = Reshape(%x, %shape)
  %z = Identity(%y)
  %r = Relu(%z)
  return %r
)";
  for (const char* name : {"FoldConstants", "EliminateNoOps", "SimplifyTransposes",
                           "EliminateCommonSubexpressions", "EliminateDeadCode"}) {
    std::vector<std::string> p = pipeline(1);
    EXPECT_NE(std::find(p.begin(), p.end(), name), p.end()) << name;
  }
  std::vector<PassReport> report;
  Graph out = run_passes(parse_graph(before), {.level = 1}, &report);
  Graph want = parse_graph(R"(graph t (opset 18)
  input %x: f32[2, 3, 4]
  const %shape: i64[2] = [2, -1]
  %y = Reshape(%x, %shape)
  %r = Relu(%y)
  return %r
)");
  std::string why;
  EXPECT_TRUE(structurally_equal(out, want, &why)) << why << "\n" << print(out);
  EXPECT_EQ(out.value(out.nodes()[0].outputs[0]).type.str(), "f32[2, 12]");
  EXPECT_EQ(out.initializers().size(), 1u);  // dead constants gone
  expect_same_results(parse_graph(before), out);
}

// ---------------------------------------------------------------- FuseDynamicQuantization

// What onnxruntime.quantization.quantize_dynamic writes for x @ W + b (per-column weight scales
// and zero points), and a second product sharing the quantized x, without a bias.
TEST(PassFuseDynamicQuantization, FusesOnnxRuntimesDynamicMatMul) {
  auto fired = expect_pass("FuseDynamicQuantization", R"(graph t (opset 17)
  input %x: f32[2, 3]
  const %w: i8[3, 2] = [1, -2, 3, 4, -5, 6]
  const %ws: f32[2] = [0.01, 0.02]
  const %wz: i8[2] = [0, 1]
  const %b: f32[2] = [0.5, -0.5]
  const %v: i8[3, 2] = [7, 0, -1, 2, 3, -4]
  const %vs: f32[] = [0.03]
  %q: u8[2, 3], %s: f32[], %z: u8[] = DynamicQuantizeLinear(%x)
  %acc: i32[2, 2] = MatMulInteger(%q, %w, %z, %wz)
  %f: f32[2, 2] = Cast(%acc) {to=1}
  %scale: f32[2] = Mul(%s, %ws)
  %m: f32[2, 2] = Mul(%f, %scale)
  %y: f32[2, 2] = Add(%m, %b)
  %acc2: i32[2, 2] = MatMulInteger(%q, %v, %z)
  %f2: f32[2, 2] = Cast(%acc2) {to=1}
  %scale2: f32[] = Mul(%vs, %s)
  %y2: f32[2, 2] = Mul(%scale2, %f2)
  return %y, %y2
)",
                           R"(graph t (opset 17)
  input %x: f32[2, 3]
  const %w: i8[3, 2] = [1, -2, 3, 4, -5, 6]
  const %ws: f32[2] = [0.01, 0.02]
  const %wz: i8[2] = [0, 1]
  const %b: f32[2] = [0.5, -0.5]
  const %v: i8[3, 2] = [7, 0, -1, 2, 3, -4]
  const %vs: f32[] = [0.03]
  %q: u8[2, 3], %s: f32[], %z: u8[] = DynamicQuantizeLinear(%x)
  %scale: f32[2] = Mul(%s, %ws)
  %y: f32[2, 2] = DynamicQuantizeMatMul(%x, %w, %ws, %wz, %b)
  %scale2: f32[] = Mul(%vs, %s)
  %y2: f32[2, 2] = DynamicQuantizeMatMul(%x, %v, %vs)
  return %y, %y2
)");
  EXPECT_EQ(fired["FuseDynamicQuantization/MatMulBias"], 1);
  EXPECT_EQ(fired["FuseDynamicQuantization/MatMul"], 1);
}

// Not the pattern: the accumulators read twice, a scale that is not the quantizer's, a weight
// computed at run time.
TEST(PassFuseDynamicQuantization, LeavesOtherProducts) {
  expect_unchanged("FuseDynamicQuantization", R"(graph t (opset 17)
  input %x: f32[2, 3]
  input %t: f32[]
  const %w: i8[3, 2] = [1, -2, 3, 4, -5, 6]
  const %ws: f32[2] = [0.01, 0.02]
  %q: u8[2, 3], %s: f32[], %z: u8[] = DynamicQuantizeLinear(%x)
  %acc: i32[2, 2] = MatMulInteger(%q, %w, %z)
  %f: f32[2, 2] = Cast(%acc) {to=1}
  %scale: f32[2] = Mul(%s, %ws)
  %y: f32[2, 2] = Mul(%f, %scale)
  %acc2: i32[2, 2] = MatMulInteger(%q, %w, %z)
  %f2: f32[2, 2] = Cast(%acc2) {to=1}
  %scale2: f32[2] = Mul(%t, %ws)
  %y2: f32[2, 2] = Mul(%f2, %scale2)
  return %y, %y2, %acc
)");
}

// ---------------------------------------------------------------- LowerQdqToInteger

// onnxruntime's QDQ form: a Conv (per-channel weight scales, a dequantized int32 bias) and a
// transposed Gemm over dequantized 8-bit tensors. Scales are powers of two, so the float and the
// integer forms give the same bits and the test can ask for them.
TEST(PassLowerQdqToInteger, RunsQdqProductsOnIntegerOps) {
  auto fired = expect_pass("LowerQdqToInteger", R"(graph t (opset 17)
  input %xq: u8[1, 2, 3, 3]
  input %aq: u8[2, 3]
  const %xs: f32[] = [0.5]
  const %xz: u8[] = [1]
  const %w: i8[2, 2, 1, 1] = [1, -2, 3, 4]
  const %ws: f32[2] = [0.25, 0.125]
  const %bq: i32[2] = [4, -8]
  const %bs: f32[] = [0.0625]
  const %v: i8[4, 3] = [1, 2, 3, -1, -2, -3, 4, 5, 6, 0, 1, 0]
  const %vs: f32[] = [0.25]
  const %c: f32[4] = [1, 2, 3, 4]
  %x: f32[1, 2, 3, 3] = DequantizeLinear(%xq, %xs, %xz)
  %wf: f32[2, 2, 1, 1] = DequantizeLinear(%w, %ws) {axis=0}
  %b: f32[2] = DequantizeLinear(%bq, %bs)
  %y: f32[1, 2, 3, 3] = Conv(%x, %wf, %b)
  %a: f32[2, 3] = DequantizeLinear(%aq, %xs, %xz)
  %vf: f32[4, 3] = DequantizeLinear(%v, %vs)
  %z: f32[2, 4] = Gemm(%a, %vf, %c) {transB=1}
  return %y, %z
)",
                           R"(graph t (opset 17)
  input %xq: u8[1, 2, 3, 3]
  input %aq: u8[2, 3]
  const %xs: f32[] = [0.5]
  const %xz: u8[] = [1]
  const %w: i8[2, 2, 1, 1] = [1, -2, 3, 4]
  const %ws: f32[2] = [0.25, 0.125]
  const %bq: i32[2] = [4, -8]
  const %bs: f32[] = [0.0625]
  const %v: i8[4, 3] = [1, 2, 3, -1, -2, -3, 4, 5, 6, 0, 1, 0]
  const %vs: f32[] = [0.25]
  const %c: f32[4] = [1, 2, 3, 4]
  const %cs: f32[2, 1, 1] = [0.125, 0.0625]
  const %shape: i64[3] = [2, 1, 1]
  const %vt: i8[3, 4] = [1, -1, 4, 0, 2, -2, 5, 1, 3, -3, 6, 0]
  const %gs: f32[] = [0.125]
  %x: f32[1, 2, 3, 3] = DequantizeLinear(%xq, %xs, %xz)
  %wf: f32[2, 2, 1, 1] = DequantizeLinear(%w, %ws) {axis=0}
  %b: f32[2] = DequantizeLinear(%bq, %bs)
  %acc: i32[1, 2, 3, 3] = ConvInteger(%xq, %w, %xz)
  %f: f32[1, 2, 3, 3] = Cast(%acc) {to=1}
  %b4: f32[2, 1, 1] = Reshape(%b, %shape)
  %s: f32[1, 2, 3, 3] = Mul(%f, %cs)
  %y: f32[1, 2, 3, 3] = Add(%s, %b4)
  %a: f32[2, 3] = DequantizeLinear(%aq, %xs, %xz)
  %vf: f32[4, 3] = DequantizeLinear(%v, %vs)
  %acc2: i32[2, 4] = MatMulInteger(%aq, %vt, %xz)
  %f2: f32[2, 4] = Cast(%acc2) {to=1}
  %s2: f32[2, 4] = Mul(%f2, %gs)
  %z: f32[2, 4] = Add(%s2, %c)
  return %y, %z
)");
  EXPECT_EQ(fired["LowerQdqToInteger/Conv"], 1);
  EXPECT_EQ(fired["LowerQdqToInteger/Gemm"], 1);
}

// Left alone: an activation scale per channel, a weight that is not constant.
TEST(PassLowerQdqToInteger, LeavesOtherForms) {
  expect_unchanged("LowerQdqToInteger", R"(graph t (opset 17)
  input %aq: u8[2, 3]
  input %vq: i8[3, 4]
  const %as: f32[3] = [0.5, 0.25, 0.5]
  const %vs: f32[] = [0.25]
  const %w: i8[3, 4] = [1, 2, 3, -1, -2, -3, 4, 5, 6, 0, 1, 0]
  %a: f32[2, 3] = DequantizeLinear(%aq, %as) {axis=1}
  %wf: f32[3, 4] = DequantizeLinear(%w, %vs)
  %y: f32[2, 4] = MatMul(%a, %wf)
  %a2: f32[2, 3] = DequantizeLinear(%aq, %vs)
  %vf: f32[3, 4] = DequantizeLinear(%vq, %vs)
  %z: f32[2, 4] = MatMul(%a2, %vf)
  return %y, %z
)");
}

// ---------------------------------------------------------------- LowerQLinearOps

// onnxruntime's QOperator ops become DequantizeLinear -> float op -> QuantizeLinear: a broadcast
// QLinearAdd, a QLinearConcat with one input on the output's grid, a QGemm with a per-column B
// and an int32 C (float output), and a MaxPool of int8 values. Scales are powers of two, so the
// float detour gives the reference's bits and the test can ask for them.
TEST(PassLowerQLinearOps, RewritesQOperatorOpsAsQdq) {
  auto fired = expect_pass("LowerQLinearOps", R"(graph t (opset 17)
  input %a: u8[2, 3]
  input %b: u8[3]
  input %c: i8[1, 4, 2, 2]
  const %as: f32[] = [0.5]
  const %az: u8[] = [3]
  const %bs: f32[] = [0.25]
  const %bz: u8[] = [128]
  const %ys: f32[] = [0.5]
  const %yz: u8[] = [10]
  const %w: i8[3, 4] = [1, 2, 3, -1, -2, -3, 4, 5, 6, 0, 1, 0]
  const %ws: f32[4] = [0.25, 0.5, 0.125, 1]
  const %wz: i8[4] = [0, 0, 0, 0]
  const %cq: i32[4] = [4, -8, 16, 1]
  %y: u8[2, 3] = com.microsoft.QLinearAdd(%a, %as, %az, %b, %bs, %bz, %ys, %yz)
  %k: u8[2, 6] = com.microsoft.QLinearConcat(%ys, %yz, %a, %ys, %yz, %y, %as, %az) {axis=1}
  %g: f32[2, 4] = com.microsoft.QGemm(%a, %as, %az, %w, %ws, %wz, %cq)
  %m: i8[1, 4, 1, 1] = MaxPool(%c) {kernel_shape=[2, 2], strides=[2, 2]}
  return %k, %g, %m
)",
                           R"(graph t (opset 17)
  input %a: u8[2, 3]
  input %b: u8[3]
  input %c: i8[1, 4, 2, 2]
  const %as: f32[] = [0.5]
  const %az: u8[] = [3]
  const %bs: f32[] = [0.25]
  const %bz: u8[] = [128]
  const %ys: f32[] = [0.5]
  const %yz: u8[] = [10]
  const %w: i8[3, 4] = [1, 2, 3, -1, -2, -3, 4, 5, 6, 0, 1, 0]
  const %ws: f32[4] = [0.25, 0.5, 0.125, 1]
  const %wz: i8[4] = [0, 0, 0, 0]
  const %cq: i32[4] = [4, -8, 16, 1]
  const %cs: f32[4] = [0.125, 0.25, 0.0625, 0.5]
  const %one: f32[] = [1]
  const %zero: i8[] = [0]
  %af: f32[2, 3] = DequantizeLinear(%a, %as, %az)
  %bf: f32[3] = DequantizeLinear(%b, %bs, %bz)
  %yf: f32[2, 3] = Add(%af, %bf)
  %y: u8[2, 3] = QuantizeLinear(%yf, %ys, %yz)
  %yd: f32[2, 3] = DequantizeLinear(%y, %as, %az)
  %ad: f32[2, 3] = DequantizeLinear(%a, %ys, %yz)
  %kf: f32[2, 6] = Concat(%ad, %yd) {axis=1}
  %k: u8[2, 6] = QuantizeLinear(%kf, %ys, %yz)
  %ga: f32[2, 3] = DequantizeLinear(%a, %as, %az)
  %gw: f32[3, 4] = DequantizeLinear(%w, %ws, %wz)
  %gc: f32[4] = DequantizeLinear(%cq, %cs) {axis=0}
  %g: f32[2, 4] = Gemm(%ga, %gw, %gc)
  %cf: f32[1, 4, 2, 2] = DequantizeLinear(%c, %one, %zero)
  %mf: f32[1, 4, 1, 1] = MaxPool(%cf) {kernel_shape=[2, 2], strides=[2, 2]}
  %m: i8[1, 4, 1, 1] = QuantizeLinear(%mf, %one, %zero)
  return %k, %g, %m
)");
  EXPECT_EQ(fired["LowerQLinearOps/QLinearAdd"], 1);
  EXPECT_EQ(fired["LowerQLinearOps/QLinearConcat"], 1);
  EXPECT_EQ(fired["LowerQLinearOps/QGemm"], 1);
  EXPECT_EQ(fired["LowerQLinearOps/MaxPool"], 1);
}

// Left to the reference kernels: a QGemm whose B scale is not a constant, an int8 QLinearAdd
// without the output zero point (QuantizeLinear would make that uint8).
TEST(PassLowerQLinearOps, LeavesOtherForms) {
  expect_unchanged("LowerQLinearOps", R"(graph t (opset 17)
  input %a: u8[2, 3]
  input %q: i8[2, 3]
  input %bs: f32[]
  const %s: f32[] = [0.5]
  const %z: u8[] = [3]
  const %qz: i8[] = [-3]
  const %w: u8[3, 4] = [1, 2, 3, 1, 2, 3, 4, 5, 6, 0, 1, 0]
  %g: f32[2, 4] = com.microsoft.QGemm(%a, %s, %z, %w, %bs, %z)
  %y: i8[2, 3] = com.microsoft.QLinearAdd(%q, %s, %qz, %q, %s, %qz, %s)
  return %y, %g
)");
}

// ---------------------------------------------------------------- MergeSiblingMatMuls

// Q, K and V projections of one activation (a bias on the left of its Add, one without a bias, a
// [1, N] bias): one MatMul by the weights side by side, one Add of the biases (0 for K), a Split.
// The Transpose reading Q is not elementwise, so it does not keep Q out.
TEST(PassMergeSiblingMatMuls, MergesProjectionsOfOneActivation) {
  auto fired = expect_pass("MergeSiblingMatMuls", R"(graph t (opset 17)
  input %x: f32[1, 2, 3]
  const %wq: f32[3, 2] = [1, 2, 3, 4, 5, 6]
  const %bq: f32[2] = [0.5, -0.5]
  const %wk: f32[3, 1] = [7, 8, 9]
  const %wv: f32[3, 2] = [-1, -2, -3, -4, -5, -6]
  const %bv: f32[1, 2] = [1, 2]
  %q0: f32[1, 2, 2] = MatMul(%x, %wq)
  %q: f32[1, 2, 2] = Add(%bq, %q0)
  %k: f32[1, 2, 1] = MatMul(%x, %wk)
  %v0: f32[1, 2, 2] = MatMul(%x, %wv)
  %v: f32[1, 2, 2] = Add(%v0, %bv)
  %t: f32[1, 2, 2] = Transpose(%q) {perm=[0, 2, 1]}
  return %t, %k, %v
)",
                           R"(graph t (opset 17)
  input %x: f32[1, 2, 3]
  const %wq: f32[3, 2] = [1, 2, 3, 4, 5, 6]
  const %bq: f32[2] = [0.5, -0.5]
  const %wk: f32[3, 1] = [7, 8, 9]
  const %wv: f32[3, 2] = [-1, -2, -3, -4, -5, -6]
  const %bv: f32[1, 2] = [1, 2]
  const %w: f32[3, 5] = [1, 2, 7, -1, -2, 3, 4, 8, -3, -4, 5, 6, 9, -5, -6]
  const %b: f32[5] = [0.5, -0.5, 0, 1, 2]
  const %s: i64[3] = [2, 1, 2]
  %m: f32[1, 2, 5] = MatMul(%x, %w)
  %mb: f32[1, 2, 5] = Add(%m, %b)
  %q: f32[1, 2, 2], %k: f32[1, 2, 1], %v: f32[1, 2, 2] = Split(%mb, %s) {axis=-1}
  %t: f32[1, 2, 2] = Transpose(%q) {perm=[0, 2, 1]}
  return %t, %k, %v
)");
  EXPECT_EQ(fired["MergeSiblingMatMuls/3Products"], 1);
}

// Gemm siblings of a 2-D activation, one with transB: the merged weight is [K, N], the Cs are C.
TEST(PassMergeSiblingMatMuls, MergesGemmsWithTransposedWeights) {
  auto fired = expect_pass("MergeSiblingMatMuls", R"(graph t (opset 17)
  input %x: f32[2, 3]
  const %wa: f32[2, 3] = [1, 2, 3, 4, 5, 6]
  const %ca: f32[2] = [0.25, 0.75]
  const %wb: f32[3, 1] = [1, 0, -1]
  %a: f32[2, 2] = Gemm(%x, %wa, %ca) {transB=1}
  %b: f32[2, 1] = Gemm(%x, %wb)
  return %a, %b
)",
                           R"(graph t (opset 17)
  input %x: f32[2, 3]
  const %wa: f32[2, 3] = [1, 2, 3, 4, 5, 6]
  const %ca: f32[2] = [0.25, 0.75]
  const %wb: f32[3, 1] = [1, 0, -1]
  const %w: f32[3, 3] = [1, 4, 1, 2, 5, 0, 3, 6, -1]
  const %c: f32[3] = [0.25, 0.75, 0]
  const %s: i64[2] = [2, 1]
  %m: f32[2, 3] = Gemm(%x, %w, %c)
  %a: f32[2, 2], %b: f32[2, 1] = Split(%m, %s) {axis=-1}
  return %a, %b
)");
  EXPECT_EQ(fired["MergeSiblingMatMuls/2Products"], 1);
}

// Every member with transB (torch's Linear): the weights' rows one after another, transB kept.
TEST(PassMergeSiblingMatMuls, KeepsTransBWhenEveryMemberHasIt) {
  expect_pass("MergeSiblingMatMuls", R"(graph t (opset 17)
  input %x: f32[2, 3]
  const %wa: f32[2, 3] = [1, 2, 3, 4, 5, 6]
  const %wb: f32[1, 3] = [1, 0, -1]
  %a: f32[2, 2] = Gemm(%x, %wa) {transB=1}
  %b: f32[2, 1] = Gemm(%x, %wb) {transB=1}
  return %a, %b
)",
              R"(graph t (opset 17)
  input %x: f32[2, 3]
  const %wa: f32[2, 3] = [1, 2, 3, 4, 5, 6]
  const %wb: f32[1, 3] = [1, 0, -1]
  const %w: f32[3, 3] = [1, 2, 3, 4, 5, 6, 1, 0, -1]
  const %s: i64[2] = [2, 1]
  %m: f32[2, 3] = Gemm(%x, %w) {transB=1}
  %a: f32[2, 2], %b: f32[2, 1] = Split(%m, %s) {axis=-1}
  return %a, %b
)");
}

// Not merged: products feeding an elementwise op (their epilogue), directly or through a view, a
// weight computed at run time, a product of another precision, a Gemm scaled by alpha. One
// candidate is left: nothing to merge.
TEST(PassMergeSiblingMatMuls, LeavesOtherProducts) {
  expect_unchanged("MergeSiblingMatMuls", R"(graph t (opset 17)
  input %x: f32[2, 3]
  input %u: f32[3, 2]
  const %w1: f32[3, 2] = [1, 2, 3, 4, 5, 6]
  const %w2: f32[3, 2] = [6, 5, 4, 3, 2, 1]
  const %w3: f32[3, 1] = [1, 1, 1]
  const %flat: i64[1] = [4]
  %a: f32[2, 2] = MatMul(%x, %w1)
  %r: f32[2, 2] = Relu(%a)
  %f: f32[2, 2] = MatMul(%x, %w2)
  %f4: f32[4] = Reshape(%f, %flat)
  %s: f32[4] = Sigmoid(%f4)
  %b: f32[2, 2] = MatMul(%x, %u)
  %c: f32[2, 2] = MatMul(%x, %w2)
  %d: f32[2, 2] = MatMul(%x, %w1) {precision="bf16"}
  %e: f32[2, 1] = Gemm(%x, %w3) {alpha=2.0}
  return %r, %s, %b, %c, %d, %e
)");
}

// A symbolic batch and sequence (a dynamic model): the merge needs only K and the N_i, which the
// weights fix; the outputs keep their bits on two sequence lengths.
TEST(PassMergeSiblingMatMuls, MergesUnderSymbolicShapes) {
  const std::string text = R"(graph t (opset 17)
  input %x: f32[batch, seq, 3]
  const %wq: f32[3, 2] = [1, 2, 3, 4, 5, 6]
  const %bq: f32[2] = [0.5, -0.5]
  const %wk: f32[3, 2] = [7, 8, 9, 1, 2, 3]
  %q0: f32[batch, seq, 2] = MatMul(%x, %wq)
  %q: f32[batch, seq, 2] = Add(%q0, %bq)
  %k: f32[batch, seq, 2] = MatMul(%x, %wk)
  return %q, %k
)";
  Graph out = run_passes(parse_graph(text), {.only = {"MergeSiblingMatMuls"}});
  std::vector<std::string> ops;
  for (const Node& n : out.nodes()) ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"MatMul", "Add", "Split"}));
  const Shape& qs = *out.value(out.outputs()[0]).type.shape;
  EXPECT_TRUE(qs[0].is_symbolic() && qs[1].is_symbolic()) << print(out);
  for (int64_t seq : {1, 7}) {
    std::mt19937 rng(static_cast<uint32_t>(seq));
    const std::vector<Tensor> in = {random_tensor(DType::kF32, {2, seq, 3}, rng)};
    std::vector<Tensor> a = reference::run(parse_graph(text), in), b = reference::run(out, in);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].shape(), b[i].shape());
      Tensor x = a[i].contiguous(), y = b[i].contiguous();
      EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << "output " << i;
    }
  }
}

// ---------------------------------------------------------------- FoldAttentionHeads

// The ops of `g` in order.
std::vector<std::string> ops_of(const Graph& g) {
  std::vector<std::string> ops;
  for (const Node& n : g.nodes()) ops.push_back(n.op);
  return ops;
}

// A merged Q/K/V projection's Split, the head splits, an Attention with a padding mask and the
// head merge (BERT after MergeSiblingMatMuls, batch 2, 2 heads of 2, a V head of 3): one 3-D
// Attention reading the merged tensor (qkv_split), the same bits on the reference.
TEST(PassFoldAttentionHeads, FoldsHeadSplitsHeadMergeAndTheSplit) {
  const std::string text = R"(graph t (opset 23)
  input %x: f32[2, 3, 14]
  input %mask: f32[2, 1, 1, 3]
  const %s: i64[3] = [4, 4, 6]
  const %h: i64[4] = [0, 0, 2, 2]
  const %hv: i64[4] = [0, 0, 2, 3]
  const %m: i64[3] = [0, 0, 6]
  %q3: f32[2, 3, 4], %k3: f32[2, 3, 4], %v3: f32[2, 3, 6] = Split(%x, %s) {axis=-1}
  %qr: f32[2, 3, 2, 2] = Reshape(%q3, %h)
  %q: f32[2, 2, 3, 2] = Transpose(%qr) {perm=[0, 2, 1, 3]}
  %kr: f32[2, 3, 2, 2] = Reshape(%k3, %h)
  %k: f32[2, 2, 3, 2] = Transpose(%kr) {perm=[0, 2, 1, 3]}
  %vr: f32[2, 3, 2, 3] = Reshape(%v3, %hv)
  %v: f32[2, 2, 3, 3] = Transpose(%vr) {perm=[0, 2, 1, 3]}
  %y: f32[2, 2, 3, 3] = Attention(%q, %k, %v, %mask) {scale=0.5}
  %yt: f32[2, 3, 2, 3] = Transpose(%y) {perm=[0, 2, 1, 3]}
  %out: f32[2, 3, 6] = Reshape(%yt, %m)
  return %out
)";
  std::vector<PassReport> report;
  Graph out =
      run_passes(parse_graph(text), {.only = {"FoldAttentionHeads", "EliminateDeadCode"}}, &report);
  EXPECT_EQ(ops_of(out), std::vector<std::string>{"Attention"}) << print(out);
  const Node& a = out.nodes()[0];
  EXPECT_EQ(a.inputs[0], out.inputs()[0]);
  EXPECT_EQ(a.inputs[1], out.inputs()[0]);
  EXPECT_EQ(a.inputs[2], out.inputs()[0]);
  EXPECT_EQ(a.inputs[3], out.inputs()[1]);
  EXPECT_EQ(a.attrs.get_ints("qkv_split"), (std::vector<int64_t>{4, 4, 6}));
  EXPECT_EQ(a.attrs.get_int("q_num_heads"), 2);
  EXPECT_EQ(a.attrs.get_int("kv_num_heads"), 2);
  EXPECT_EQ(a.attrs.get_float("scale"), 0.5);
  EXPECT_EQ(report[0].fired["FoldAttentionHeads/Split"], 1);
  expect_same_results(parse_graph(text), out);
}

// torch's import of BERT (a Linear on 2-D rows): the merged [B * S, 3 * H * D] product's parts
// are each reshaped to [B, S, H * D]; the Split goes, the merged product is reshaped once (a view).
TEST(PassFoldAttentionHeads, FoldsASplitOfRowsThroughOneReshape) {
  const std::string text = R"(graph t (opset 23)
  input %x: f32[6, 12]
  const %s: i64[3] = [4, 4, 4]
  const %u: i64[3] = [2, 3, 4]
  const %h: i64[4] = [2, 3, 2, 2]
  const %m: i64[2] = [6, 4]
  %q2: f32[6, 4], %k2: f32[6, 4], %v2: f32[6, 4] = Split(%x, %s) {axis=1}
  %q3: f32[2, 3, 4] = Reshape(%q2, %u)
  %k3: f32[2, 3, 4] = Reshape(%k2, %u)
  %v3: f32[2, 3, 4] = Reshape(%v2, %u)
  %qr: f32[2, 3, 2, 2] = Reshape(%q3, %h)
  %q: f32[2, 2, 3, 2] = Transpose(%qr) {perm=[0, 2, 1, 3]}
  %kr: f32[2, 3, 2, 2] = Reshape(%k3, %h)
  %k: f32[2, 2, 3, 2] = Transpose(%kr) {perm=[0, 2, 1, 3]}
  %vr: f32[2, 3, 2, 2] = Reshape(%v3, %h)
  %v: f32[2, 2, 3, 2] = Transpose(%vr) {perm=[0, 2, 1, 3]}
  %y: f32[2, 2, 3, 2] = Attention(%q, %k, %v)
  %yt: f32[2, 3, 2, 2] = Transpose(%y) {perm=[0, 2, 1, 3]}
  %out: f32[6, 4] = Reshape(%yt, %m)
  return %out
)";
  Graph out = run_passes(parse_graph(text), {.only = {"FoldAttentionHeads", "EliminateDeadCode"}});
  EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Reshape", "Attention", "Reshape"}))
      << print(out);
  const Node& a = out.nodes()[1];
  EXPECT_EQ(a.inputs, std::vector<ValueId>(3, out.nodes()[0].outputs[0]));
  EXPECT_EQ(a.attrs.get_ints("qkv_split"), (std::vector<int64_t>{4, 4, 4}));
  expect_same_results(parse_graph(text), out);
}

// GPT-2's export: Q, K and V as graph inputs (no Split to fold), K through torch's batched K^T
// and back, and a head merge to [B * S, H * D] for the next Gemm: a 3-D Attention on q, k and v
// whose result that Reshape (a view) flattens.
TEST(PassFoldAttentionHeads, ReadsThroughTheKeyRoundTripAndKeepsAFlatteningMerge) {
  const std::string text = R"(graph t (opset 23)
  input %q3: f32[1, 3, 4]
  input %k3: f32[1, 3, 4]
  input %v3: f32[1, 3, 4]
  const %h: i64[4] = [1, 3, 2, 2]
  const %flat3: i64[3] = [2, 3, 2]
  const %kt4: i64[4] = [1, 2, 2, 3]
  const %m: i64[2] = [3, 4]
  %qr: f32[1, 3, 2, 2] = Reshape(%q3, %h)
  %q: f32[1, 2, 3, 2] = Transpose(%qr) {perm=[0, 2, 1, 3]}
  %kr: f32[1, 3, 2, 2] = Reshape(%k3, %h)
  %k0: f32[1, 2, 3, 2] = Transpose(%kr) {perm=[0, 2, 1, 3]}
  %k1: f32[2, 3, 2] = Reshape(%k0, %flat3)
  %k2: f32[2, 2, 3] = Transpose(%k1) {perm=[0, 2, 1]}
  %k3b: f32[1, 2, 2, 3] = Reshape(%k2, %kt4)
  %k: f32[1, 2, 3, 2] = Transpose(%k3b) {perm=[0, 1, 3, 2]}
  %vr: f32[1, 3, 2, 2] = Reshape(%v3, %h)
  %v: f32[1, 2, 3, 2] = Transpose(%vr) {perm=[0, 2, 1, 3]}
  %y: f32[1, 2, 3, 2] = Attention(%q, %k, %v) {is_causal=1}
  %yt: f32[1, 3, 2, 2] = Transpose(%y) {perm=[0, 2, 1, 3]}
  %out: f32[3, 4] = Reshape(%yt, %m)
  return %out
)";
  Graph out = run_passes(parse_graph(text), {.only = {"FoldAttentionHeads", "EliminateDeadCode"}});
  EXPECT_EQ(ops_of(out), (std::vector<std::string>{"Attention", "Reshape"})) << print(out);
  const Node& a = out.nodes()[0];
  EXPECT_EQ(a.inputs, (std::vector<ValueId>{out.inputs()[0], out.inputs()[1], out.inputs()[2]}));
  EXPECT_FALSE(a.attrs.has("qkv_split"));
  EXPECT_EQ(a.attrs.get_int("is_causal"), 1);
  expect_same_results(parse_graph(text), out);
}

// Left alone: an output read by more than the head merge, a head split that is not [0, 2, 1, 3],
// and a head merge that keeps the heads apart (4-D).
TEST(PassFoldAttentionHeads, LeavesOtherForms) {
  expect_unchanged("FoldAttentionHeads", R"(graph t (opset 23)
  input %q3: f32[1, 3, 4]
  const %h: i64[4] = [1, 3, 2, 2]
  const %m: i64[3] = [1, 3, 4]
  %qr: f32[1, 3, 2, 2] = Reshape(%q3, %h)
  %q: f32[1, 2, 3, 2] = Transpose(%qr) {perm=[0, 2, 1, 3]}
  %y: f32[1, 2, 3, 2] = Attention(%q, %q, %q)
  %yt: f32[1, 3, 2, 2] = Transpose(%y) {perm=[0, 2, 1, 3]}
  %out: f32[1, 3, 4] = Reshape(%yt, %m)
  %qs: f32[1, 2, 2, 3] = Transpose(%qr) {perm=[0, 2, 3, 1]}
  %z: f32[1, 2, 2, 3] = Attention(%qs, %qs, %qs)
  %zt: f32[1, 2, 2, 3] = Transpose(%z) {perm=[0, 2, 1, 3]}
  %w: f32[1, 2, 3, 2] = Attention(%q, %q, %q) {scale=0.25}
  %wt: f32[1, 3, 2, 2] = Transpose(%w) {perm=[0, 2, 1, 3]}
  return %out, %y, %zt, %wt
)");
}

// Symbolic batch and sequence (a dynamic BERT): the head Reshapes copy them with 0, the fold
// needs only the head sizes; the same bits at two sequence lengths.
TEST(PassFoldAttentionHeads, FoldsUnderSymbolicShapes) {
  const std::string text = R"(graph t (opset 23)
  input %x: f32[batch, seq, 12]
  const %s: i64[3] = [4, 4, 4]
  const %h: i64[4] = [0, 0, 2, 2]
  const %m: i64[3] = [0, 0, 4]
  %q3: f32[batch, seq, 4], %k3: f32[batch, seq, 4], %v3: f32[batch, seq, 4] = Split(%x, %s) {axis=2}
  %qr: f32[batch, seq, 2, 2] = Reshape(%q3, %h)
  %q: f32[batch, 2, seq, 2] = Transpose(%qr) {perm=[0, 2, 1, 3]}
  %kr: f32[batch, seq, 2, 2] = Reshape(%k3, %h)
  %k: f32[batch, 2, seq, 2] = Transpose(%kr) {perm=[0, 2, 1, 3]}
  %vr: f32[batch, seq, 2, 2] = Reshape(%v3, %h)
  %v: f32[batch, 2, seq, 2] = Transpose(%vr) {perm=[0, 2, 1, 3]}
  %y: f32[batch, 2, seq, 2] = Attention(%q, %k, %v)
  %yt: f32[batch, seq, 2, 2] = Transpose(%y) {perm=[0, 2, 1, 3]}
  %out: f32[batch, seq, 4] = Reshape(%yt, %m)
  return %out
)";
  Graph out = run_passes(parse_graph(text), {.only = {"FoldAttentionHeads", "EliminateDeadCode"}});
  EXPECT_EQ(ops_of(out), std::vector<std::string>{"Attention"}) << print(out);
  for (int64_t seq : {1, 7}) {
    std::mt19937 rng(static_cast<uint32_t>(seq));
    const std::vector<Tensor> in = {random_tensor(DType::kF32, {2, seq, 12}, rng)};
    std::vector<Tensor> a = reference::run(parse_graph(text), in), b = reference::run(out, in);
    ASSERT_EQ(a.size(), b.size());
    ASSERT_EQ(a[0].shape(), b[0].shape());
    Tensor x = a[0].contiguous(), y = b[0].contiguous();
    EXPECT_EQ(std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()), 0) << "seq " << seq;
  }
}

}  // namespace
}  // namespace pto
