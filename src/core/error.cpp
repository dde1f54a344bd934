// The one place an error gains the name of the file it concerns (error.h, rethrow_with).
#include "pto/error.h"

#include <string_view>

namespace pto {

void rethrow_with(const std::string& prefix) {
  try {
    throw;
  } catch (const InternalError&) {
    throw;  // a bug in PyPTO: its message names our source file and line
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(prefix)) throw;  // prefixed already
    try {
      throw;
    } catch (const UnsupportedError&) {
      throw UnsupportedError(prefix + e.what());
    } catch (const TypeError&) {
      throw TypeError(prefix + e.what());
    } catch (const ValueError&) {
      throw ValueError(prefix + e.what());
    }
  }
}

}  // namespace pto
