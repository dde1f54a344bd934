// Sets an environment variable for the life of the guard (tests that read PTO_* switches).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace pto::testing {

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  // Restores the value it had (tuner_test.cpp sets PTO_TUNE_CACHE=off for the whole binary).
  ~EnvGuard() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace pto::testing
