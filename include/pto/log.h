// Logging for people watching a compile: PTO_LOG=warn (default) | info | debug | off.
//
//   PTO_LOG=info pto compile model.onnx     # which passes ran, which fusion patterns fired
//
// Messages go to stderr, one line each, prefixed "[pypto <level>]". Cheap when disabled: test
// log_enabled() before building an expensive message.
#pragma once

#include <string>

namespace pto {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kOff = 3 };

// The level from PTO_LOG, read once (set_log_level overrides it).
LogLevel log_level();
void set_log_level(LogLevel level);
inline bool log_enabled(LogLevel level) {
  return level >= log_level() && log_level() != LogLevel::kOff;
}
void log(LogLevel level, const std::string& message);

}  // namespace pto
