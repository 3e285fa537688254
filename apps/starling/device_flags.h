// `--device` and `--gpus`: where the built-in trainers of `starling client`, `starling aggregator
// --simulate` and `starling simulate` run, overriding [client] device and gpus.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"
#include "core/wire/federation.pb.h"

namespace starling::apps {

struct DeviceFlags {
  std::string device;          // empty: [client] device
  std::vector<uint32_t> gpus;  // empty: [client] gpus
};

void add_device_flags(CLI::App* command, DeviceFlags* flags);

// Writes the flags into [client] and validates the config again, so a bad combination is named
// as the keys it sets (e.g. "key 'client.device' must be \"cpu\" or \"cuda\"").
Status apply_device_flags(const DeviceFlags& flags, v1::FederationConfig* config,
                          std::string_view source);

}  // namespace starling::apps
