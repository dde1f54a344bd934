// OpDef ids (pto/op_registry.h): dense, one per op, and the id-indexed kernel lookup the reference
// interpreter uses gives the same kernel as the lookup by name.
#include <gtest/gtest.h>

#include <set>

#include "pto/op_registry.h"
#include "pto/reference.h"

namespace pto {
namespace {

TEST(OpRegistry, IdsAreDenseAndUnique) {
  const OpRegistry& r = OpRegistry::global();
  const std::vector<std::string> names = r.names();
  ASSERT_EQ(r.size(), names.size());
  std::set<int32_t> ids;
  for (const std::string& name : names) {
    const OpDef* def = r.find(name);
    ASSERT_NE(def, nullptr);
    ASSERT_GE(def->id, 0) << name;
    ASSERT_LT(static_cast<size_t>(def->id), r.size()) << name;
    EXPECT_EQ(&r.by_id(def->id), def) << name;
    ids.insert(def->id);
  }
  EXPECT_EQ(ids.size(), names.size());
  EXPECT_THROW(r.by_id(static_cast<int32_t>(r.size())), InternalError);
  EXPECT_THROW(r.by_id(-1), InternalError);
}

TEST(OpRegistry, AGraphNodeCarriesItsOpsId) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{2}});
  ValueId y = g.add_value("y");
  const Node& n = g.add_node("Relu", {x}, {y});
  ASSERT_NE(n.def, nullptr);
  EXPECT_EQ(n.def->id, OpRegistry::global().find("Relu")->id);
}

TEST(OpRegistry, ARegistryOfItsOwnCountsFromZero) {
  OpRegistry r;
  r.add({.name = "B"});
  r.add({.name = "A"});
  EXPECT_EQ(r.find("B")->id, 0);
  EXPECT_EQ(r.find("A")->id, 1);
  EXPECT_EQ(r.by_id(1).name, "A");
  EXPECT_THROW(r.add({.name = "A"}), InternalError);
  EXPECT_EQ(r.size(), 2u);
}

TEST(OpRegistry, KernelByNodeIsKernelByName) {
  const reference::KernelRegistry& kernels = reference::KernelRegistry::global();
  for (const std::string& op : OpRegistry::global().names()) {
    Node n;
    n.op = op;
    n.def = OpRegistry::global().find(op);
    EXPECT_EQ(kernels.find(n), kernels.find(op)) << op;
  }
  // A node whose OpDef comes from another registry (ids of its own) still finds its kernel by
  // name, and a node without an OpDef too.
  OpRegistry other;
  other.add({.name = "Relu"});
  Node n;
  n.op = "Exp";
  n.def = other.find("Relu");  // id 0: some other op's id in the global registry
  EXPECT_EQ(kernels.find(n), kernels.find("Exp"));
  n.def = nullptr;
  EXPECT_EQ(kernels.find(n), kernels.find("Exp"));
}

}  // namespace
}  // namespace pto
