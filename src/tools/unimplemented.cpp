// The subcommands API.md promises that this version does not have yet. Each answers --help with
// its planned usage and otherwise fails with a clear message (exit 1). When one is implemented it
// moves to its own file, like info.cpp and run.cpp.
#include <iostream>

#include "cli.h"
#include "pto/error.h"

namespace pto::cli {
namespace {

[[maybe_unused]] Command planned(const char* name, const char* summary, const char* usage) {
  std::string cmd = name;
  std::string text = cat("usage: ", usage, "\n\n", summary,
                         "\n\nNot implemented yet in this version of PyPTO (", kVersion, ").\n");
  return {cmd, cat(summary, " (not implemented yet)"), text,
          [cmd, text](const std::vector<std::string>& args) {
            ArgReader a(args, cmd);
            while (a.next()) {
              if (a.is_help()) {
                std::cout << text;
                return 0;
              }
            }
            throw UnsupportedError(cat("'pto ", cmd, "' is not implemented yet in this version (",
                                       kVersion,
                                       "); 'pto run' runs a model on the reference interpreter"));
          }};
}

}  // namespace

std::vector<Command> unimplemented_commands() {
  return {};
}

}  // namespace pto::cli
