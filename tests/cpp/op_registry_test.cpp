// OpDef ids (pto/op_registry.h): dense, one per op, and the id-indexed kernel lookup the reference
// interpreter uses gives the same kernel as the lookup by name. Attribute schemas: every op has
// one, the verifier holds nodes to it, and Node::attr_int and friends read its defaults. The
// registry template (pto/registry.h) all the name -> entry tables share.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "pto/op_registry.h"
#include "pto/reference.h"
#include "pto/registry.h"

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

TEST(Registry, AddFindNamesAndDuplicates) {
  Registry<int> r("widget");
  int& b = r.add("b", 2);
  r.add("a", 1);
  EXPECT_EQ(&b, r.find("b"));  // entries keep their address
  for (int i = 0; i < 100; ++i) r.add(cat("w", i), i);
  EXPECT_EQ(&b, r.find("b"));
  EXPECT_EQ(*r.find("a"), 1);
  EXPECT_EQ(r.find("c"), nullptr);
  EXPECT_EQ(r.index_of("a"), 1);
  EXPECT_EQ(r.index_of("c"), -1);
  EXPECT_EQ(r.name_at(0), "b");
  EXPECT_EQ(r.at(1), 1);
  EXPECT_EQ(r.names_in_order()[0], "b");
  EXPECT_EQ(r.names()[0], "a");  // sorted
  EXPECT_EQ(r.size(), 102u);
  try {
    r.add("a", 3);
    FAIL() << "a duplicate was accepted";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("widget 'a' registered twice"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(*r.find("a"), 1);  // the first entry stays
  EXPECT_THROW(r.add("", 0), InternalError);
  EXPECT_THROW(r.at(102), InternalError);
}

TEST(Registry, TheGlobalRegistriesRejectDuplicates) {
  EXPECT_THROW(reference::KernelRegistry::global().add("Relu", {}), InternalError);
  OpRegistry r;
  r.add({.name = "X"});
  EXPECT_THROW(r.add({.name = "X"}), InternalError);
}

TEST(AttrSchema, EveryOpDeclaresOne) {
  const OpRegistry& r = OpRegistry::global();
  for (const std::string& name : r.names()) {
    const OpDef& def = *r.find(name);
    EXPECT_TRUE(def.attrs.declared()) << name << " has no attribute schema";
    std::set<std::string> seen;
    for (const AttrDef& a : def.attrs.defs()) {
      EXPECT_TRUE(seen.insert(a.name).second) << name << " declares '" << a.name << "' twice";
      if (a.use != AttrUse::kDefault) continue;
      // A node without the attribute reads the default through the accessor of its kind.
      Node n;
      n.op = name;
      n.def = &def;
      switch (a.kind) {
        case AttrKind::kInt:
        case AttrKind::kBool:
          EXPECT_NO_THROW(n.attr_int(a.name)) << name;
          break;
        case AttrKind::kFloat:
          EXPECT_NO_THROW(n.attr_float(a.name)) << name;
          break;
        case AttrKind::kString:
          EXPECT_NO_THROW(n.attr_string(a.name)) << name;
          break;
        case AttrKind::kInts:
          EXPECT_NO_THROW(n.attr_ints(a.name)) << name;
          break;
        case AttrKind::kFloats:
          EXPECT_NO_THROW(n.attr_floats(a.name)) << name;
          break;
        default:
          ADD_FAILURE() << name << "." << a.name << ": a default of an unexpected kind";
      }
    }
  }
}

// A one-node graph of `op` with the given attributes, verified.
void verify_node(const std::string& op, Attributes attrs, int inputs = 1) {
  Graph g;
  std::vector<ValueId> in;
  for (int i = 0; i < inputs; ++i) in.push_back(g.add_input(cat("x", i), {DType::kF32, Shape{2}}));
  ValueId y = g.add_value("y");
  g.add_node(op, in, {y}, std::move(attrs), "n1");
  g.add_output(y);
  verify(g);
}

std::string verify_error(const std::string& op, Attributes attrs, int inputs = 1) {
  try {
    verify_node(op, std::move(attrs), inputs);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(AttrSchema, UnknownAttributeIsRejectedNamingIt) {
  Attributes a;
  a.set("axis", int64_t{1});
  a.set("bogus", int64_t{1});
  const std::string e = verify_error("Softmax", a);
  EXPECT_NE(e.find("[Softmax] node 'n1'"), std::string::npos) << e;
  EXPECT_NE(e.find("unrecognized attribute 'bogus'"), std::string::npos) << e;
  EXPECT_NE(e.find("accepts axis"), std::string::npos) << e;  // lists the accepted ones
  Attributes none;
  none.set("alpha", 1.0);
  EXPECT_NE(verify_error("Relu", none).find("accepts consumed_inputs"), std::string::npos);
  EXPECT_NE(verify_error("Sin", none).find("accepts no attributes"), std::string::npos);
}

TEST(AttrSchema, WrongKindIsRejected) {
  Attributes a;
  a.set("axis", std::string("last"));
  const std::string e = verify_error("Softmax", a);
  EXPECT_NE(e.find("attribute 'axis' of operator Softmax should be of kind int, got string"),
            std::string::npos)
      << e;
  Attributes f;
  f.set("alpha", Dims{1, 2});
  EXPECT_NE(verify_error("LeakyRelu", f).find("kind float, got ints"), std::string::npos);
}

// ONNX's boolean attributes are ints of 0 or 1: 2 or -1 is refused naming the attribute (it was
// read as true, where onnxruntime reads keepdims=2 as false).
TEST(AttrSchema, BooleanOutsideZeroOrOneIsRejected) {
  for (int64_t v : {int64_t{2}, int64_t{-1}}) {
    Attributes a;
    a.set("keepdims", v);
    const std::string e = verify_error("ReduceMax", a);
    EXPECT_NE(e.find(cat("[ReduceMax] node 'n1': attribute 'keepdims' of operator ReduceMax is a "
                         "boolean and must be 0 or 1, got ",
                         v)),
              std::string::npos)
        << e;
  }
  for (int64_t v : {int64_t{0}, int64_t{1}}) {
    Attributes a;
    a.set("keepdims", v);
    EXPECT_NO_THROW(verify_node("ReduceMax", a));
  }
  Attributes f;
  f.set("ceil_mode", 1.0);
  EXPECT_NE(verify_error("MaxPool", f).find("should be of kind bool, got float"),
            std::string::npos);
}

TEST(AttrSchema, LenientKindsAreAccepted) {
  Attributes a;
  a.set("alpha", int64_t{1});  // an int for a float
  EXPECT_NO_THROW(verify_node("LeakyRelu", a));
  Attributes to_name, to_code;
  to_name.set("to", std::string("FLOAT"));  // Cast-1's type name
  to_code.set("to", int64_t{1});
  EXPECT_NO_THROW(verify_node("Cast", to_name));
  EXPECT_NO_THROW(verify_node("Cast", to_code));
  Attributes empty;
  empty.set("perm", std::vector<double>{});  // an empty list of no particular element type
  EXPECT_NO_THROW(verify_node("Transpose", empty));
}

TEST(AttrSchema, MissingRequiredIsRejected) {
  const std::string e = verify_error("Cast", {});
  EXPECT_NE(e.find("[Cast] node 'n1': required attribute 'to' (dtype) of operator Cast is missing"),
            std::string::npos)
      << e;
  EXPECT_NE(verify_error("Einsum", {}).find("'equation'"), std::string::npos);
}

TEST(AttrSchema, DefaultsComeFromTheSchema) {
  Graph g;
  ValueId x = g.add_input("x", {DType::kF32, Shape{2, 3}});
  ValueId y = g.add_value("y");
  Node& n = g.add_node("LayerNormalization", {x, x}, {y});
  EXPECT_EQ(n.attr_int("axis"), -1);
  EXPECT_DOUBLE_EQ(n.attr_float("epsilon"), 1e-5);
  n.attrs.set("axis", int64_t{1});
  EXPECT_EQ(n.attr_int("axis"), 1);                              // a given attribute wins
  EXPECT_THROW(n.attr_int("no_such_attribute"), InternalError);  // not in the schema: a bug

  Node& cast = g.add_node("Cast", {x}, {g.add_value("z")});
  EXPECT_THROW(cast.attr_int("to"), ValueError);  // required, absent
  Node& gelu = g.add_node("Gelu", {x}, {g.add_value("w")});
  EXPECT_EQ(gelu.attr_string("approximate"), "none");
}

TEST(AttrSchema, AnOpWithoutASchemaIsNotChecked) {
  OpRegistry r;
  r.add({.name = "MyOp", .min_inputs = 1, .max_inputs = 1});
  Node n;
  n.op = "MyOp";
  n.def = r.find("MyOp");
  n.attrs.set("anything", int64_t{1});
  EXPECT_NO_THROW(check_attributes(n));
  EXPECT_EQ(n.attr_int("anything"), 1);
}

}  // namespace
}  // namespace pto
