// What an edge client keeps on disk between runs, so that a power loss or SIGKILL loses no part
// of an update: the error-feedback residual of each codec it used and how many rounds it
// trained. Written atomically after every upload (temporary file, fsync, rename) as safetensors
// with a SHA-256 of the residuals in the metadata; a torn or edited file is refused on load.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace starling::edge_client {

struct ClientState {
  std::string node_id;
  uint64_t rounds_trained = 0;
  uint64_t last_round = 0;  // the aggregator's round number of the last upload
  // Codec spec -> its persistent_state() (the error-feedback residual).
  std::map<std::string, std::vector<float>> codec_state;
};

Status save_client_state(const std::filesystem::path& path, const ClientState& state);
// NotFound when there is no file (a first start); DataLoss naming the file when it is corrupt
// or its checksum does not match; FailedPrecondition when it belongs to another node.
Result<ClientState> load_client_state(const std::filesystem::path& path,
                                      const std::string& node_id);

}  // namespace starling::edge_client
