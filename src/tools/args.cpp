// The option reader shared by the subcommands.
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "cli.h"
#include "pto/error.h"
#include "pto/executable.h"

namespace pto::cli {

bool ArgReader::next() {
  if (started_) ++i_;
  started_ = true;
  if (!options_done_ && i_ < args_.size() && args_[i_] == "--") {
    options_done_ = true;
    ++i_;
  }
  positional_ = i_ < args_.size() && (options_done_ || args_[i_].size() < 2 || args_[i_][0] != '-');
  return i_ < args_.size();
}

const std::string& ArgReader::arg() const {
  return args_[i_];
}

bool ArgReader::is(const char* option) const {
  if (positional_ || i_ >= args_.size()) return false;
  const std::string& a = args_[i_];
  size_t n = std::strlen(option);
  return a.compare(0, n, option) == 0 && (a.size() == n || a[n] == '=');
}

std::string ArgReader::value() {
  const std::string& a = args_[i_];
  auto eq = a.find('=');
  if (eq != std::string::npos) return a.substr(eq + 1);
  if (i_ + 1 >= args_.size()) fail(cat(a, " needs a value"));
  ++i_;
  return args_[i_];
}

int64_t ArgReader::int_value(int64_t min, int64_t max) {
  std::string option = arg().substr(0, arg().find('='));
  std::string v = value();
  errno = 0;
  char* end = nullptr;
  long long n = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno == ERANGE || n < min || n > max)
    fail(cat(option, " expects an integer in [", min, ", ", max, "], got '", v, "'"));
  return n;
}

void ArgReader::unknown() const {
  if (positional_) fail(cat("unexpected argument '", arg(), "'"));
  fail(cat("unknown option '", arg().substr(0, arg().find('=')), "'"));
}

void ArgReader::fail(const std::string& what) const {
  throw UsageError(command_.empty() ? what : cat(command_, ": ", what), command_);
}

bool reduces_precision(const CompileOptions& o) {
  return o.auto_mixed_precision || o.matmul_precision != "highest" || o.conv_precision != "highest";
}

std::string precision_flag(const CompileOptions& o) {
  return o.auto_mixed_precision            ? "--precision bf16/f16"
         : o.matmul_precision != "highest" ? "--matmul-precision"
                                           : "--conv-precision";
}

bool read_precision_option(ArgReader& a, CompileOptions& o) {
  for (auto [flag, field] : {std::pair{"--matmul-precision", &CompileOptions::matmul_precision},
                             std::pair{"--conv-precision", &CompileOptions::conv_precision}}) {
    if (!a.is(flag)) continue;
    const std::string v = a.value();
    if (v != "highest" && v != "high" && v != "medium")
      a.fail(cat(flag, " takes highest, high or medium, got '", v, "'"));
    o.*field = v;
    return true;
  }
  if (!a.is("--precision")) return false;
  const std::string v = a.value();
  if (v != "f32" && v != "bf16" && v != "f16")
    a.fail(cat("--precision takes f32, bf16 or f16, got '", v, "'"));
  o.auto_mixed_precision = v != "f32";
  if (o.auto_mixed_precision) o.mixed_precision = dtype_from_name(v);
  return true;
}

bool read_tune_cache_option(ArgReader& a) {
  if (!a.is("--no-tune-cache")) return false;
  setenv("PTO_TUNE_CACHE", "off", 1);
  return true;
}

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* option,
                                                     const ArgReader& a) {
  auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0) a.fail(cat(option, " expects NAME=VALUE, got '", s, "'"));
  return {s.substr(0, eq), s.substr(eq + 1)};
}

}  // namespace pto::cli
