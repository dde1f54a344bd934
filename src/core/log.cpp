// PTO_LOG: read once, overridable; one line per message on stderr.
#include "pto/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pto {
namespace {

LogLevel from_env() {
  const char* s = std::getenv("PTO_LOG");
  if (!s || !*s) return LogLevel::kWarn;
  if (!std::strcmp(s, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(s, "info")) return LogLevel::kInfo;
  if (!std::strcmp(s, "off")) return LogLevel::kOff;
  if (std::strcmp(s, "warn") != 0)
    std::fprintf(stderr, "[pypto warn] PTO_LOG='%s' is not one of debug|info|warn|off\n", s);
  return LogLevel::kWarn;
}

std::atomic<int>& level_slot() {
  static std::atomic<int> level{static_cast<int>(from_env())};
  return level;
}

}  // namespace

LogLevel log_level() {
  return static_cast<LogLevel>(level_slot().load(std::memory_order_relaxed));
}

void set_log_level(LogLevel level) {
  level_slot().store(static_cast<int>(level), std::memory_order_relaxed);
}

void log(LogLevel level, const std::string& message) {
  if (!log_enabled(level)) return;
  static const char* kNames[] = {"debug", "info", "warn", "off"};
  std::fprintf(stderr, "[pypto %s] %s\n", kNames[static_cast<int>(level)], message.c_str());
}

}  // namespace pto
