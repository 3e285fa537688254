// Federating your own model from C++ (docs/own_model.md). Implement edge_client::LocalTrainer
// (layout(): your tensors' names and shapes over one flat f32 vector; train(): from the global
// model, write local - global into the delta), then either
//   starling::sim::run_client(config, trainer)    join a federation as `starling client` does:
//                                                 [tls], [client], every codec and the state file
//   starling::sim::run_peer(config, trainer, w0)  a peer of a serverless gossip federation, as
//                                                 `starling peer` is (configs/gossip_*.toml)
//   starling::sim::simulate_federation(...)       the whole federation on this machine, every
//                                                 strategy, robust rule and emulation of
//                                                 [simulate], with your trainers as its clients
// Installed with the library: find_package(starling) and link starling::client.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/util/status.h"
#include "edge_client/edge_client.h"
#include "sim/engine.h"

namespace starling::sim {

struct ClientRunOptions {
  std::string node_id;  // empty: [client] node_id, else the certificate's common name
  int partition = -1;   // seeds the client's codec randomness; -1: [client] partition_index
};

struct ClientRun {
  int rounds_trained = 0;
  int rounds_lost = 0;  // train() failed and trainer.round_failures_recoverable() said go on
  int connections = 0;
  uint64_t peak_rss_bytes = 0;
};

// Loads and validates the federation config at `config`, connects to its aggregator over
// mutual TLS ([tls] ca, cert, key, crl) and trains with `trainer` until the aggregator ends the
// federation. The trainer's layout must be the aggregator's model (for model.arch = EXTERNAL:
// the tensors of model.weights, in file order). Errors name the config file and key.
Result<ClientRun> run_client(const std::filesystem::path& config,
                             edge_client::LocalTrainer& trainer,
                             const ClientRunOptions& options = {});

struct PeerRun {
  uint64_t rounds_completed = 0;
  uint64_t bytes_sent = 0;
  std::vector<float> params;  // this peer's model at the end
};

// Loads the gossip config at `config` (configs/gossip_*.toml: [tls], [peer] listen address,
// seeds and timeouts, [topology], [algorithm] with its codec, [rounds], [local]) and runs
// `trainer` as one peer over mutual TLS until its rounds are done, starting from `initial` (laid
// out as trainer.layout(); every peer should start from the same model). The node id
// (options.node_id, else [peer] node_id, else the certificate's CN) must be the CN; the
// partition (options.partition, else [peer] partition_index) seeds its randomness. [task],
// [data] and [eval] are not read: the model, data and evaluation are the trainer's.
Result<PeerRun> run_peer(const std::filesystem::path& config, edge_client::LocalTrainer& trainer,
                         std::vector<float> initial, const ClientRunOptions& options = {});

// Evaluates a global model: test loss and (NaN when there is none) accuracy.
using Evaluate = std::function<TaskEval(std::span<const float> global)>;
// Client k's trainer (k < data.num_clients). Called from several threads at once in
// simulate.mode = "in-process": it must be safe to call concurrently.
using MakeTrainer = std::function<std::unique_ptr<edge_client::LocalTrainer>(int client)>;

// Simulates the federation of the config file `config` with `initial` as the initial global model
// (laid out as make_trainer(0)->layout()) and clients from `make_trainer`, evaluated by `evaluate`
// on the rounds [eval] every_rounds asks (none when empty). `out_dir` receives spill files and, in
// loopback mode, the aggregator's state.
Result<SimResult> simulate_federation(const std::filesystem::path& config,
                                      std::vector<float> initial, MakeTrainer make_trainer,
                                      Evaluate evaluate, const std::filesystem::path& out_dir,
                                      const RoundCallback& on_round = {});

}  // namespace starling::sim
