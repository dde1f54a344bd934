// Sets an environment variable for the life of the guard (tests that read PTO_* switches).
#pragma once

#include <cstdlib>

namespace pto::testing {

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvGuard() { unsetenv(name_); }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
};

}  // namespace pto::testing
