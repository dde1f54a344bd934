// `pto`: the command-line program. Finds the subcommand and turns every error into a message and
// an exit code: 0 success, 1 a pto::Error (bad model, bad data, unsupported feature), 2 a usage
// mistake. Nothing escapes as an uncaught exception.
#include <iostream>
#include <new>

#include "cli.h"
#include "pto/error.h"

namespace pto::cli {
namespace {

std::vector<Command> all_commands() {
  std::vector<Command> cmds = {info_command(),    ops_command(),   run_command(),
                               compile_command(), bench_command(), check_command(),
                               profile_command(), tune_command()};
  for (Command& c : unimplemented_commands()) cmds.push_back(std::move(c));
  return cmds;
}

void print_help(const std::vector<Command>& cmds) {
  std::cout << "usage: pto <command> [options]\n\n"
               "PyPTO "
            << kVersion
            << ": a compiler and runtime for ONNX and PyTorch models.\n\n"
               "commands:\n";
  for (const Command& c : cmds) {
    std::cout << "  " << c.name << std::string(10 - std::min<size_t>(c.name.size(), 9), ' ')
              << c.summary << "\n";
  }
  std::cout << "\n'pto <command> --help' describes a command. Exit codes: 0 success, 1 error in "
               "the model or data, 2 bad command line.\n";
}

int dispatch(const std::vector<std::string>& args) {
  std::vector<Command> cmds = all_commands();
  if (args.empty()) {
    print_help(cmds);
    throw UsageError("no command given", "");
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    if (name == "help" && args.size() > 1) {
      for (const Command& c : cmds)
        if (c.name == args[1]) return c.main({"--help"});
      throw UsageError(cat("unknown command '", args[1], "'"), "");
    }
    print_help(cmds);
    return 0;
  }
  if (name == "--version") {
    std::cout << "pto " << kVersion << "\n";
    return 0;
  }
  for (const Command& c : cmds)
    if (c.name == name) return c.main(std::vector<std::string>(args.begin() + 1, args.end()));
  throw UsageError(cat("unknown command '", name, "'"), "");
}

}  // namespace
}  // namespace pto::cli

int main(int argc, char** argv) {
  using pto::cli::UsageError;
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return pto::cli::dispatch(args);
  } catch (const UsageError& e) {
    std::cout.flush();
    std::cerr << "pto: error: " << e.what() << "\n"
              << "(see 'pto " << (e.command.empty() ? "" : e.command + " ") << "--help')\n";
    return 2;
  } catch (const pto::Error& e) {
    std::cout.flush();
    std::cerr << "pto: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cout.flush();
    std::cerr << "pto: error: out of memory\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "pto: error: internal error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "pto: error: internal error: unknown exception\n";
    return 1;
  }
}
