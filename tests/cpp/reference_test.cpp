// The interpreter itself: input checking and freeing (that every op has a reference kernel:
// op_coverage_test.cpp).
#include <gtest/gtest.h>

#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {
namespace {

TEST(Reference, RunsASmallGraphAndChecksInputs) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("batch"), 3}});
  ValueId w = g.add_value("w");
  g.set_initializer(w, Tensor::from_vector<float>({1, -2, 3}, {3}));
  ValueId y = g.add_value("y");
  ValueId z = g.add_value("z");
  g.add_node("Mul", {x, w}, {y});
  g.add_node("Relu", {y}, {z});
  g.add_output(z);
  verify(g);
  infer_types(g);
  EXPECT_EQ(g.value(z).type.str(), "f32[batch, 3]");

  auto out = reference::run(g, {Tensor::from_vector<float>({1, 1, 1, -1, -1, -1}, {2, 3})});
  ASSERT_EQ(out.size(), 1u);
  std::vector<double> expect = {1, 0, 3, 0, 2, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[0].item_as_double(i), expect[i]);

  EXPECT_THROW(reference::run(g, {Tensor::zeros(DType::kF32, {2, 4})}), ValueError);
  EXPECT_THROW(reference::run(g, {Tensor::zeros(DType::kI32, {2, 3})}), TypeError);
  EXPECT_THROW(reference::run(g, {}), ValueError);
}

TEST(Graph, VerifierRejectsUseBeforeDefinition) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{2}});
  ValueId a = g.add_value("a");
  ValueId b = g.add_value("b");
  g.add_node("Relu", {a}, {b});
  g.add_node("Relu", {x}, {a});
  g.add_output(b);
  EXPECT_THROW(verify(g), ValueError);
}

TEST(Graph, UnknownOpIsUnsupported) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{2}});
  ValueId y = g.add_value("y");
  EXPECT_THROW(g.add_node("NoSuchOp", {x}, {y}), UnsupportedError);
}

TEST(Graph, PrinterIsStable) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{Dim::sym("n")}});
  ValueId y = g.add_value("y");
  g.add_node("Exp", {x}, {y}, {}, "exp0");
  g.add_output(y);
  infer_types(g);
  EXPECT_EQ(print(g),
            "graph main (opset 0)\n"
            "  input  %x: f32[n]\n"
            "  %y: f32[n] = Exp(%x)  # exp0\n"
            "  return %y\n");
}

}  // namespace
}  // namespace pto
