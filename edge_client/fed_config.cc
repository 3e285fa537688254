// [client] section → EdgeClientOptions.
#include "edge_client/fed_config.h"

namespace starling::edge_client {

EdgeClientOptions edge_client_options(const v1::FederationConfig& config,
                                      const std::string& node_id, uint16_t port, uint64_t seed) {
  const auto& c = config.client();
  EdgeClientOptions o;
  o.connect.host = c.server_host();
  o.connect.port = port ? port : static_cast<uint16_t>(c.server_port());
  o.connect.server_name = c.server_name();
  o.node_id = node_id;
  o.backoff.initial = std::chrono::milliseconds(c.backoff_initial_ms());
  o.backoff.max = std::chrono::milliseconds(c.backoff_max_ms());
  o.seed = seed;
  o.memory_limit_bytes = static_cast<uint64_t>(c.memory_limit_mb()) << 20;
  o.condition.file = c.condition_file();
  o.condition.command = c.condition_command();
  o.condition_poll = std::chrono::seconds(c.condition_poll_s());
  o.upload_bytes_per_second = static_cast<uint64_t>(c.upload_limit_kbps()) * 1000;
  o.chunk_bytes = c.chunk_kb() << 10;
  o.require_secure_aggregation = config.secagg().enabled();
  if (c.state_path() == "none") {
    o.state_path.clear();
  } else if (c.state_path().empty()) {
    o.state_path = node_id + ".state.safetensors";
  } else {
    o.state_path = c.state_path();
  }
  return o;
}

ExecTrainerOptions exec_trainer_options(const v1::FederationConfig& config,
                                        const std::string& node_id, uint32_t partition,
                                        const std::filesystem::path& dir) {
  const auto& c = config.client();
  ExecTrainerOptions o;
  o.command.assign(c.trainer_command().begin(), c.trainer_command().end());
  o.timeout = std::chrono::seconds(c.trainer_timeout_s());
  o.dir = !c.trainer_dir().empty() ? std::filesystem::path(c.trainer_dir())
          : !dir.empty()           ? dir
                                   : std::filesystem::path(node_id + ".trainer");
  o.node_id = node_id;
  o.partition = partition;
  o.num_partitions = config.data().num_clients();
  o.data_path = config.data().path();
  return o;
}

}  // namespace starling::edge_client
