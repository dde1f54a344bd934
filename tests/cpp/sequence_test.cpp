// Sequences and optionals: their types through the printer and parser, structural equality and
// saved models; the ops on the reference interpreter against values worked out by hand; the
// Executable passing them between CPU kernels and reference kernels at every level; and the
// errors for a tensor op given one.
#include <gtest/gtest.h>

#include "pto/executable.h"
#include "pto/reference.h"
#include "pto/serialize.h"

namespace pto {
namespace {

Tensor floats(std::vector<float> v, Dims shape) {
  return Tensor::from_vector(v, std::move(shape));
}

std::vector<float> values(const Tensor& t) {
  std::vector<float> out;
  for (int64_t i = 0; i < t.numel(); ++i) out.push_back(static_cast<float>(t.item_as_double(i)));
  return out;
}

// x [2, 3] -> Relu (a CPU kernel) -> SplitToSequence(axis 1) -> insert x at 0 -> erase the last
// -> ConcatFromSequence(axis 1) -> Neg (a CPU kernel); also the sequence, its length and an
// optional of it as outputs.
Graph model() {
  return parse_graph(R"(graph seq (opset 18)
  input %x: f32[2, 3]
  const %zero: i64[] = [0]
  %r = Relu(%x)
  %parts = SplitToSequence(%r) {axis=1}
  %ins = SequenceInsert(%parts, %x, %zero)
  %er = SequenceErase(%ins)
  %cat = ConcatFromSequence(%er) {axis=1}
  %y = Neg(%cat)
  %n = SequenceLength(%er)
  %opt = Optional(%er)
  return %y, %er, %n, %opt
)");
}

TEST(Sequence, TypesPrintParseAndCompare) {
  for (const char* text : {"seq<f32[*]>", "opt<f32[2, n]>", "opt<seq<i64[?, 3]>>"})
    EXPECT_EQ(parse_type(text).str(), text);
  EXPECT_THROW(parse_type("seq<seq<f32[*]>>"), ValueError);
  EXPECT_THROW(parse_type("seq<opt<f32[*]>>"), ValueError);
  const Graph g = model();
  EXPECT_EQ(g.value(*g.find_value("parts")).type.str(), "seq<f32[2, 1]>");
  EXPECT_EQ(g.value(*g.find_value("ins")).type.str(), "seq<f32[2, ?]>");
  EXPECT_EQ(g.value(*g.find_value("opt")).type.str(), "opt<seq<f32[2, ?]>>");
  EXPECT_EQ(g.value(*g.find_value("cat")).type.str(), "f32[2, ?]");
  EXPECT_EQ(print(parse_graph(print(g))), print(g));
  Graph other = g;
  other.value(*other.find_value("opt")).type.optional = false;
  std::string why;
  EXPECT_FALSE(structurally_equal(g, other, &why));
  EXPECT_NE(why.find("seq<f32[2, ?]>"), std::string::npos) << why;
}

TEST(Sequence, ReferenceRunsTheOps) {
  const Tensor x = floats({1, -2, 3, -4, 5, -6}, {2, 3});
  const std::vector<Tensor> out = reference::run(model(), {x});
  // Relu(x) split into columns [1 0], [0 5], [3 0]; x inserted first; the last column erased;
  // then [x | 1 0 | 0 5] negated.
  EXPECT_EQ(values(out[0]), (std::vector<float>{-1, 2, -3, -1, 0, 4, -5, 6, 0, -5}));
  EXPECT_EQ(dims_str(out[0].shape()), "[2, 5]");
  ASSERT_EQ(out[1].kind(), ValueKind::kSequence);
  ASSERT_EQ(out[1].items().size(), 3u);
  EXPECT_EQ(values(out[1].items()[2]), (std::vector<float>{0, 5}));
  EXPECT_EQ(out[2].item_as_double(), 3);
  ASSERT_EQ(out[3].kind(), ValueKind::kSequence);  // an optional holding a value is that value
}

TEST(Sequence, ExecutableMatchesTheReferenceAtEveryLevel) {
  const Graph g = model();
  const Tensor x = floats({1, -2, 3, -4, 5, -6}, {2, 3});
  const std::vector<Tensor> want = reference::run(g, {x});
  for (int level : {0, 1, 2, 3}) {
    Executable exe = compile(g, {.level = level});
    for (int run = 0; run < 2; ++run) {  // the second run reuses the arena
      const std::vector<Tensor> got = exe.run({x});
      EXPECT_EQ(values(got[0]), values(want[0])) << "level " << level;
      ASSERT_EQ(got[1].items().size(), 3u);
      for (size_t i = 0; i < 3; ++i)
        EXPECT_EQ(values(got[1].items()[i]), values(want[1].items()[i])) << "level " << level;
    }
  }
  // The sequence ops ran on the reference kernels; Relu and Neg on the CPU backend.
  Executable exe = compile(g, {.level = 0});
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const std::string& op = g.nodes()[i].op;
    if (op == "Relu" || op == "Neg") {
      EXPECT_EQ(exe.node_backend(i), "cpu") << op;
    } else if (op.starts_with("Sequence")) {
      EXPECT_EQ(exe.node_backend(i), "reference") << op;
    }
  }
}

TEST(Sequence, SavedModelKeepsTheTypes) {
  const Graph g = model();
  Executable exe = compile(g, {.level = 2});
  LoadedExecutable back = deserialize_executable(serialize_executable(exe), "test");
  EXPECT_EQ(back.info.format, kSavedModelFormat);
  const Tensor x = floats({1, 2, 3, 4, 5, 6}, {2, 3});
  const std::vector<Tensor> got = back.exe.run({x});
  EXPECT_EQ(got[1].items().size(), 3u);
  EXPECT_EQ(print(back.exe.graph()), print(exe.graph()));
}

TEST(Sequence, OptionalsAndInputKinds) {
  const Graph g = parse_graph(R"(graph opt (opset 18)
  input %o: opt<f32[2]>
  %has = OptionalHasElement(%o)
  %none = Optional() {type="seq<i64[*]>"}
  %has_none = OptionalHasElement(%none)
  %missing = OptionalHasElement(_)
  return %has, %has_none, %missing, %none
)");
  std::vector<Tensor> out = reference::run(g, {floats({1, 2}, {2})});
  EXPECT_EQ(out[0].item_as_double(), 1);
  EXPECT_EQ(out[1].item_as_double(), 0);
  EXPECT_EQ(out[2].item_as_double(), 0);
  EXPECT_EQ(out[3].kind(), ValueKind::kNone);
  out = reference::run(g, {Tensor::none()});
  EXPECT_EQ(out[0].item_as_double(), 0);
  // A sequence where an optional tensor is declared, a None where a tensor is.
  EXPECT_THROW(reference::run(g, {Tensor::sequence({floats({1, 2}, {2})})}), TypeError);
  const Graph t =
      parse_graph("graph t (opset 18)\n  input %x: f32[2]\n  %y = Relu(%x)\n  return %y\n");
  EXPECT_THROW(reference::run(t, {Tensor::none()}), TypeError);
}

TEST(Sequence, TensorOpGivenASequenceIsUnsupported) {
  // Declared: the verifier says so at once.
  try {
    verify(
        parse_graph("graph bad (opset 18)\n  input %s: seq<f32[2]>\n  %y = Relu(%s)\n"
                    "  return %y\n"));
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("[Relu] node"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("input 's' is a sequence"), std::string::npos) << e.what();
  }
  // Untyped: the interpreter refuses the value when the node is about to read it.
  Graph h = parse_graph(
      "graph h (opset 18)\n  input %x: f32[2]\n  %s = SequenceConstruct(%x, %x)\n  return %s\n");
  ValueId y = h.add_value("y");
  h.add_node("Relu", {*h.find_value("s")}, {y});
  h.value(*h.find_value("s")).type = TensorType{};  // as if nothing said it is a sequence
  h.add_output(y);
  EXPECT_THROW(reference::run(h, {floats({1, 2}, {2})}), UnsupportedError);
}

}  // namespace
}  // namespace pto
