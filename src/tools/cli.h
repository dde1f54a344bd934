// Shared pieces of the `pto` command: the command table, usage errors and a small option reader.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

// The PyPTO release (CMake's project version).
#ifndef PTO_VERSION
#define PTO_VERSION "unknown"
#endif

namespace pto {
struct CompileOptions;  // pto/executable.h
}  // namespace pto

namespace pto::cli {

inline constexpr const char* kVersion = PTO_VERSION;

// A mistake on the command line (exit code 2), as opposed to a pto::Error about the model or the
// data (exit code 1). `command` names the subcommand whose --help to suggest ("" for none).
class UsageError : public std::runtime_error {
 public:
  UsageError(const std::string& what, std::string command)
      : std::runtime_error(what), command(std::move(command)) {}
  std::string command;
};

struct Command {
  std::string name;
  std::string summary;                                            // one line for `pto --help`
  std::string usage;                                              // the text of `pto <name> --help`
  std::function<int(const std::vector<std::string>& args)> main;  // the args after the name
};

// One function per subcommand file.
Command info_command();
Command run_command();
Command compile_command();
Command ops_command();
Command check_command();
Command bench_command();
Command profile_command();
Command tune_command();
std::vector<Command> unimplemented_commands();  // none at present

// Reads options in the forms `--name value` and `--name=value`; `--` ends the options.
//   ArgReader a(args, "run");
//   while (a.next()) { if (a.is("--seed")) seed = a.int_value(0, INT64_MAX); ... }
class ArgReader {
 public:
  ArgReader(const std::vector<std::string>& args, std::string command)
      : args_(args), command_(std::move(command)) {}

  bool next();                        // moves to the next argument; false at the end
  const std::string& arg() const;     // the current argument
  bool is(const char* option) const;  // the current argument is this option
  bool is_help() const { return is("--help") || is("-h"); }
  bool positional() const { return positional_; }  // not an option (or after `--`)
  std::string value();  // the option's value: after '=' or the next argument
  int64_t int_value(int64_t min, int64_t max);
  [[noreturn]] void unknown() const;  // throws UsageError for the current argument
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const std::vector<std::string>& args_;
  std::string command_;
  size_t i_ = 0;
  bool started_ = false;
  bool options_done_ = false;
  bool positional_ = false;
};

// Takes the current argument when it is --precision f32|bf16|f16 (bf16, f16: CompileOptions::
// auto_mixed_precision with that mixed_precision, docs/precision.md), setting those two fields of
// `o`, or --matmul-precision / --conv-precision highest|high|medium (CompileOptions::
// matmul_precision, conv_precision); false for any other argument.
bool read_precision_option(ArgReader& a, CompileOptions& o);
// Whether `o` changes what products compute in (--precision bf16/f16, --matmul-precision or
// --conv-precision other than highest), and the flag that does, for messages.
bool reduces_precision(const CompileOptions& o);
std::string precision_flag(const CompileOptions& o);

// Takes the current argument when it is --no-tune-cache: compiles in this process then ignore the
// tuning cache (PTO_TUNE_CACHE=off, docs/tuning.md); false for any other argument.
bool read_tune_cache_option(ArgReader& a);

// Splits "name=value" at the first '='; a UsageError naming `option` when there is none.
std::pair<std::string, std::string> split_assignment(const std::string& s, const char* option,
                                                     const ArgReader& a);

}  // namespace pto::cli
