// The C++ API for a user's own model: a client of a real federation, or a whole simulation.
#include "sim/federate.h"

#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <limits>

#include "aggregator/fed_task.h"
#include "core/net/certs.h"
#include "core/net/tls.h"
#include "edge_client/device.h"
#include "edge_client/fed_config.h"
#include "gossip/peer.h"
#include "gossip/task.h"

namespace starling::sim {
namespace {

// A SimTask over the user's factory: no data of its own, evaluation by the user's function.
class UserTask final : public SimTask {
 public:
  UserTask(const v1::FederationConfig& c, compress::Layout layout, std::vector<float> initial,
           MakeTrainer make, Evaluate evaluate)
      : config_(c),
        layout_(std::move(layout)),
        initial_(std::move(initial)),
        make_(std::move(make)),
        evaluate_(std::move(evaluate)) {}
  int num_clients() const override { return static_cast<int>(config_.data().num_clients()); }
  const compress::Layout& layout() const override { return layout_; }
  std::vector<float> initial_model() const override { return initial_; }
  std::unique_ptr<edge_client::LocalTrainer> make_trainer(int client) const override {
    return make_(client);
  }
  int64_t local_steps(int client, const v1::RoundPlan& plan) const override {
    (void)client;
    return std::max<int64_t>(1, plan.local_steps());
  }
  TaskEval evaluate(std::span<const float> global) override {
    if (!evaluate_) {
      constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
      return {kNan, kNan};
    }
    return evaluate_(global);
  }
  Status save_model(const std::filesystem::path& path, std::span<const float> global,
                    uint64_t round) const override {
    (void)path;
    (void)global;
    (void)round;
    return ok_status();  // the caller has SimResult::global
  }
  std::string describe() const override {
    return "your own model (" + std::to_string(layout_.size()) + " tensors, " +
           std::to_string(initial_.size()) + " parameters)";
  }

 private:
  v1::FederationConfig config_;
  compress::Layout layout_;
  std::vector<float> initial_;
  MakeTrainer make_;
  Evaluate evaluate_;
};

}  // namespace

Result<ClientRun> run_client(const std::filesystem::path& config,
                             edge_client::LocalTrainer& trainer, const ClientRunOptions& options) {
  const std::string source = config.string();
  ASSIGN_OR_RETURN(auto cfg, aggregator::load_federation_config(config));
  ASSIGN_OR_RETURN(
      auto tls,
      net::load_tls_config(cfg.tls().ca(), cfg.tls().cert(), cfg.tls().key(), cfg.tls().crl()),
      source + ": [tls]");
  std::string node_id = !options.node_id.empty() ? options.node_id : cfg.client().node_id();
  if (node_id.empty()) {
    ASSIGN_OR_RETURN(auto cert, net::cert_from_pem(tls.cert_pem));
    node_id = net::cert_identity(cert.get()).common_name;
  }
  const uint32_t partition = options.partition >= 0 ? static_cast<uint32_t>(options.partition)
                                                    : cfg.client().partition_index();
  RETURN_IF_ERROR(compress::validate_layout(trainer.layout()).status(), "the trainer's layout");
  ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(tls, net::TlsSide::kClient), source);
  auto o = edge_client::edge_client_options(cfg, node_id, 0, partition + 1);
  asio::io_context io;
  spdlog::info("client {}: your trainer ({} tensors), aggregator {}:{}, state {}", node_id,
               trainer.layout().size(), o.connect.host, o.connect.port,
               o.state_path.empty() ? "in memory" : o.state_path);
  edge_client::EdgeClient client(io, ctx, o, trainer);
  client.start();
  while (!client.stopped()) {
    if (io.stopped()) io.restart();
    if (io.run_one_for(std::chrono::milliseconds(100)) == 0 && io.stopped()) break;
  }
  RETURN_IF_ERROR(client.error());
  ClientRun r;
  r.rounds_trained = client.rounds_trained();
  r.rounds_lost = client.rounds_lost();
  r.connections = client.connections();
  if (auto peak = edge_client::peak_rss_bytes(); peak.ok()) r.peak_rss_bytes = *peak;
  return r;
}

Result<PeerRun> run_peer(const std::filesystem::path& config, edge_client::LocalTrainer& trainer,
                         std::vector<float> initial, const ClientRunOptions& options) {
  const std::string source = config.string();
  ASSIGN_OR_RETURN(auto cfg, gossip::load_gossip_config(config));
  ASSIGN_OR_RETURN(
      auto tls,
      net::load_tls_config(cfg.tls().ca(), cfg.tls().cert(), cfg.tls().key(), cfg.tls().crl()),
      source + ": [tls]");
  ASSIGN_OR_RETURN(auto cert, net::cert_from_pem(tls.cert_pem), source + ": [tls] cert");
  const std::string cn = net::cert_identity(cert.get()).common_name;
  const std::string node_id = !options.node_id.empty()        ? options.node_id
                              : !cfg.peer().node_id().empty() ? cfg.peer().node_id()
                                                              : cn;
  if (node_id != cn) {
    return invalid_argument(source + ": node id '" + node_id +
                            "' differs from the certificate's CN '" + cn + "'");
  }
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(trainer.layout()),
                   "the trainer's layout");
  if (static_cast<int64_t>(initial.size()) != numel) {
    return invalid_argument("run_peer: an initial model of " + std::to_string(initial.size()) +
                            " values for a layout of " + std::to_string(numel));
  }
  const uint32_t index = options.partition >= 0 ? static_cast<uint32_t>(options.partition)
                                                : cfg.peer().partition_index();
  ASSIGN_OR_RETURN(auto server_ctx, net::make_tls_context(tls, net::TlsSide::kServer), source);
  ASSIGN_OR_RETURN(auto client_ctx, net::make_tls_context(tls, net::TlsSide::kClient), source);
  asio::io_context io;
  gossip::PeerOptions peer_options = gossip::peer_options(cfg, node_id, index);
  peer_options.node.shared_init = true;  // every peer starts from the same `initial` (CHOCO)
  ASSIGN_OR_RETURN(auto peer,
                   gossip::Peer::create(io, server_ctx, client_ctx, peer_options, trainer.layout(),
                                        std::move(initial), &trainer, {}));
  spdlog::info("peer {}: your trainer ({} tensors), listening on port {}", node_id,
               trainer.layout().size(), peer->port());
  if (!cfg.peer().port_file().empty()) {
    RETURN_IF_ERROR(
        net::write_file(cfg.peer().port_file(), std::to_string(peer->port()) + "\n", 0644),
        source + ": peer.port_file");
  }
  RETURN_IF_ERROR(gossip::run_peer_to_end(io, *peer));
  PeerRun r;
  r.rounds_completed = peer->rounds_completed();
  r.bytes_sent = peer->bytes_sent();
  r.params.assign(peer->params().begin(), peer->params().end());
  return r;
}

Result<SimResult> simulate_federation(const std::filesystem::path& config,
                                      std::vector<float> initial, MakeTrainer make_trainer,
                                      Evaluate evaluate, const std::filesystem::path& out_dir,
                                      const RoundCallback& on_round) {
  ASSIGN_OR_RETURN(auto cfg, aggregator::load_federation_config(config));
  if (!make_trainer) return invalid_argument("simulate_federation: no make_trainer");
  auto first = make_trainer(0);
  if (!first) return invalid_argument("simulate_federation: make_trainer(0) gave no trainer");
  const compress::Layout layout = first->layout();
  first.reset();
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout), "the trainer's layout");
  if (static_cast<int64_t>(initial.size()) != numel) {
    return invalid_argument("simulate_federation: an initial model of " +
                            std::to_string(initial.size()) + " values for a layout of " +
                            std::to_string(numel));
  }
  if (!evaluate) cfg.mutable_eval()->set_every_rounds(0);
  UserTask task(cfg, layout, std::move(initial), std::move(make_trainer), std::move(evaluate));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return invalid_argument(out_dir.string() + ": " + ec.message());
  return cfg.simulate().mode() == v1::FedSimulateConfig::LOOPBACK
             ? run_loopback(cfg, task, out_dir, on_round)
             : run_in_process(cfg, task, out_dir, on_round);
}

}  // namespace starling::sim
