// The op x backend coverage (pto/op_coverage.h, `pto ops`): the reference is the oracle, so every
// op has a reference kernel unless listed below, and docs/op_coverage.md matches the registries.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "backend/cpu/kernel.h"
#include "pto/op_coverage.h"
#include "pto/op_registry.h"
#include "pto/passes.h"
#include "pto/reference.h"

namespace pto {
namespace {

// Ops allowed to have no reference kernel, each with the reason. Empty: every op has one. An op
// goes here only for a reason that survives review (e.g. a backend-only op with no meaning to
// the interpreter), and leaves as soon as it has its kernel (the test below checks both ways).
const std::set<std::string> kNoReferenceKernel = {};

TEST(OpCoverage, EveryOpHasAReferenceKernel) {
  std::vector<OpCoverage> ops = op_coverage();
  EXPECT_EQ(ops.size(), OpRegistry::global().names().size());
  for (const OpCoverage& c : ops) {
    if (kNoReferenceKernel.count(c.op))
      EXPECT_FALSE(c.reference) << c.op << " has a reference kernel now: take it off the list";
    else
      EXPECT_TRUE(c.reference) << c.op << " has an OpDef but no reference kernel";
  }
}

TEST(OpCoverage, EveryKernelIsForARegisteredOp) {
  for (const std::string& op : reference::KernelRegistry::global().names())
    EXPECT_NE(OpRegistry::global().find(op), nullptr) << "reference kernel for unknown op " << op;
  for (const std::string& op : cpu::KernelRegistry::global().names())
    EXPECT_NE(OpRegistry::global().find(op), nullptr) << "CPU kernel for unknown op " << op;
}

TEST(OpCoverage, CpuColumnFollowsTheKernelTable) {
  std::map<std::string, CpuCoverage> cpu;
  for (const OpCoverage& c : op_coverage()) cpu[c.op] = c.cpu;
  for (const std::string& op : cpu::KernelRegistry::global().names())
    EXPECT_NE(cpu[op], CpuCoverage::kNone) << op;
  EXPECT_EQ(cpu["Reshape"], CpuCoverage::kAll);  // a view, for every node
  EXPECT_EQ(cpu["Relu"], CpuCoverage::kSome);    // float32 only
  EXPECT_EQ(cpu["LayerNormalization"], CpuCoverage::kRunTime);
  EXPECT_EQ(cpu["CenterCropPad"], CpuCoverage::kNone);
  EXPECT_EQ(cpu["Loop"], CpuCoverage::kSubgraphs);  // the runtime compiles its body
}

// An op a pass lowers names a pass that exists (the first word of OpDef::lowered_by).
TEST(OpCoverage, LoweredOpsNameARegisteredPass) {
  int lowered = 0;
  for (const OpCoverage& c : op_coverage()) {
    if (c.cpu != CpuCoverage::kLowered) continue;
    ++lowered;
    const std::string pass = c.lowered_by.substr(0, c.lowered_by.find(' '));
    EXPECT_NE(PassRegistry::global().find(pass), nullptr) << c.op << ": " << c.lowered_by;
    EXPECT_EQ(cpu::KernelRegistry::global().find(c.op), nullptr) << c.op;
  }
  EXPECT_GE(lowered, 10);  // the QLinear* ops and QGemm
}

TEST(OpCoverage, DocIsUpToDate) {
  const std::string path = std::string(PTO_SOURCE_DIR) + "/docs/op_coverage.md";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "cannot read " << path;
  std::stringstream doc;
  doc << f.rdbuf();
  EXPECT_TRUE(doc.str() == op_coverage_markdown())
      << path << " differs from the registries: run `build/pto ops --markdown > "
      << "docs/op_coverage.md`";
}

}  // namespace
}  // namespace pto
