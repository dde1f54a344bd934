// Helpers for the JSON files PyPTO writes (profiler traces, the tuning cache).
#pragma once

#include <string>
#include <string_view>

namespace pto {

// `s` as a JSON string literal, quotes included: '"' and '\\' escaped, control characters as
// \u00XX, every other byte (UTF-8 included) as it is.
std::string json_string(std::string_view s);

}  // namespace pto
