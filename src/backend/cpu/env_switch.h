// The CPU backend's A/B switches: an environment variable that turns one kernel path off.
#pragma once

#include <cstdlib>
#include <cstring>

#include "pto/error.h"

namespace pto::cpu {

// Unset, empty or "1" is on, "0" off, anything else a ValueError naming the variable. Read on
// every call, so that tests and A/B runs can flip it inside one process.
inline bool env_switch(const char* name) {
  const char* e = std::getenv(name);
  if (!e || !*e || std::strcmp(e, "1") == 0) return true;
  if (std::strcmp(e, "0") == 0) return false;
  throw ValueError(cat(name, "='", e, "': expected 0 or 1"));
}

}  // namespace pto::cpu
