// ReaderIndex (pto/reader_index.h): the readers of each value, and the single-reader query that
// fusion, the passes and the runtime share, against a graph written as text.
#include <gtest/gtest.h>

#include <vector>

#include "pto/graph.h"
#include "pto/reader_index.h"

namespace pto {
namespace {

ValueId id(const Graph& g, const char* name) {
  auto v = g.find_value(name);
  EXPECT_TRUE(v.has_value()) << name;
  return v.value_or(kNoValue);
}

std::vector<int32_t> list(std::span<const int32_t> s) {
  return {s.begin(), s.end()};
}

// a is read once; b by two nodes; c twice by one node; d is read once but is also an output;
// e is read by nothing; f is the last output.
const char* kGraph = R"(graph t (opset 18)
  input %x: f32[4]
  %a = Relu(%x)
  %b = Neg(%a)
  %c = Exp(%b)
  %d = Mul(%c, %c)
  %e = Abs(%b)
  %f = Sigmoid(%d)
  return %d, %f
)";

TEST(ReaderIndex, ListsReadersInNodeOrder) {
  Graph g = parse_graph(kGraph);
  const ReaderIndex r(g);
  EXPECT_EQ(list(r.readers(id(g, "x"))), std::vector<int32_t>({0}));
  EXPECT_EQ(list(r.readers(id(g, "b"))), std::vector<int32_t>({2, 4}));
  EXPECT_EQ(list(r.readers(id(g, "c"))), std::vector<int32_t>({3, 3}));  // once per input
  EXPECT_TRUE(r.readers(id(g, "e")).empty());
  EXPECT_TRUE(r.readers(id(g, "f")).empty());
}

TEST(ReaderIndex, UsesMatchUseCounts) {
  Graph g = parse_graph(kGraph);
  const ReaderIndex r(g);
  const std::vector<int> counts = g.use_counts();
  for (ValueId v = 0; v < static_cast<ValueId>(g.values().size()); ++v) {
    EXPECT_EQ(r.uses(v), counts[v]) << g.value(v).name;
    EXPECT_EQ(r.is_output(v), g.is_output(v)) << g.value(v).name;
  }
}

TEST(ReaderIndex, SingleReaderCountsGraphOutputsAsReaders) {
  Graph g = parse_graph(kGraph);
  const ReaderIndex r(g);
  EXPECT_EQ(r.single_reader(id(g, "x")), 0);
  EXPECT_EQ(r.single_reader(id(g, "a")), 1);
  EXPECT_EQ(r.single_reader(id(g, "b")), -1);  // two nodes
  EXPECT_EQ(r.single_reader(id(g, "c")), -1);  // one node, two inputs
  EXPECT_EQ(r.single_reader(id(g, "d")), -1);  // read by Sigmoid and by the caller
  EXPECT_EQ(r.single_reader(id(g, "e")), -1);  // nobody
  EXPECT_EQ(r.single_reader(id(g, "f")), -1);  // only the caller
  EXPECT_EQ(r.single_reader(kNoValue), -1);
}

TEST(ReaderIndex, SkipsMissingOptionalInputs) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{4}});
  ValueId lo = g.add_input("lo", {DType::kF32, Shape{}});
  ValueId y = g.add_value("y");
  g.add_node("Clip", {x, kNoValue, lo}, {y});
  g.add_output(y);
  const ReaderIndex r(g);
  EXPECT_EQ(r.single_reader(x), 0);
  EXPECT_EQ(r.single_reader(lo), 0);
  EXPECT_TRUE(r.readers(y).empty());
  EXPECT_TRUE(r.is_output(y));
}

TEST(ReaderIndex, EmptyGraph) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{1}});
  g.add_output(x);
  const ReaderIndex r(g);
  EXPECT_TRUE(r.readers(x).empty());
  EXPECT_EQ(r.uses(x), 1);
  EXPECT_EQ(r.single_reader(x), -1);
}

}  // namespace
}  // namespace pto
