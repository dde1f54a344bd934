// `pto ops`: every registered op and which backends run it (pto/op_coverage.h).
#include <algorithm>
#include <iostream>

#include "cli.h"
#include "pto/op_coverage.h"

namespace pto::cli {
namespace {

const char* kUsage =
    "usage: pto ops [--markdown]\n\n"
    "Lists every registered op and which backends run it: whether the reference interpreter has\n"
    "a kernel, and whether the CPU backend has one (and declines some nodes to the reference).\n"
    "A node the CPU backend does not take runs on the reference backend.\n\n"
    "  --markdown   print docs/op_coverage.md instead (which adds each op's attributes):\n"
    "               pto ops --markdown > docs/op_coverage.md\n";

int ops_main(const std::vector<std::string>& args) {
  ArgReader a(args, "ops");
  bool markdown = false;
  while (a.next()) {
    if (a.is_help()) {
      std::cout << kUsage;
      return 0;
    }
    if (a.is("--markdown"))
      markdown = true;
    else
      a.unknown();
  }
  if (markdown) {
    std::cout << op_coverage_markdown();
    return 0;
  }
  std::vector<OpCoverage> ops = op_coverage();
  size_t width = 2;
  for (const OpCoverage& c : ops) width = std::max(width, c.op.size());
  auto pad = [&](const std::string& s) { return s + std::string(width + 2 - s.size(), ' '); };
  std::cout << pad("op") << "reference  cpu\n";
  for (const OpCoverage& c : ops)
    std::cout << pad(c.op) << (c.reference ? "yes        " : "NO         ")
              << cpu_coverage_str(c.cpu) << (c.lowered_by.empty() ? "" : ": " + c.lowered_by)
              << "\n";
  return 0;
}

}  // namespace

Command ops_command() {
  return {"ops", "List every op and which backends (reference, cpu) run it.", kUsage, ops_main};
}

}  // namespace pto::cli
