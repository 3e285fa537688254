// The edge client's options from a federation config's [client] section, shared by
// `starling client`, its --check and the in-process simulations.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "edge_client/exec_trainer.h"

namespace starling::edge_client {

// [client] → EdgeClientOptions: server address and name, backoff, device awareness (memory
// limit, training condition, upload cap) and the state file ("" in the config: <node_id>.state
// .safetensors; "none": not kept). `port` overrides server_port when non-zero.
EdgeClientOptions edge_client_options(const v1::FederationConfig& config,
                                      const std::string& node_id, uint16_t port, uint64_t seed);

// [client] trainer_command, trainer_timeout_s and trainer_dir ("" in the config: `dir`, else
// <node_id>.trainer) → ExecTrainerOptions for one client; data_path from [data] path.
ExecTrainerOptions exec_trainer_options(const v1::FederationConfig& config,
                                        const std::string& node_id, uint32_t partition,
                                        const std::filesystem::path& dir = {});

}  // namespace starling::edge_client
