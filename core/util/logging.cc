// Log level parsing for the CLI.
#include "core/util/logging.h"

#include <string>

namespace starling {

Status set_log_level(std::string_view level) {
  const auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return invalid_argument("unknown log level '" + std::string(level) +
                            "' (expected trace, debug, info, warn, error or off)");
  }
  spdlog::set_level(lvl);
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  return ok_status();
}

}  // namespace starling
