// Logging setup: starling logs through spdlog; this configures the default logger once in main().
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "core/util/status.h"

namespace starling {

// Sets the global level from a name (trace, debug, info, warn, error, off).
Status set_log_level(std::string_view level);

}  // namespace starling
