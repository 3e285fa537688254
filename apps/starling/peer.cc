// `starling peer`: one member of a serverless gossip federation (configs/gossip_*.toml) over
// mutual TLS, identity from its certificate. `starling peer --simulate` runs every peer of the
// config in this process instead (in-memory exchange through the same codecs and node code).
#include "gossip/peer.h"

#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "apps/starling/commands.h"
#include "core/net/certs.h"
#include "core/net/reload_watch.h"
#include "core/net/tls.h"
#include "gossip/task.h"
#include "sim/gossip_tasks.h"

namespace starling::apps {
namespace {

struct PeerArgs {
  std::string config;
  bool simulate = false;
  std::string node_id;
  int partition = -1;
  uint32_t num_rounds = 0;
  std::string metrics;
  std::string device;          // empty: [peer] device
  std::vector<uint32_t> gpus;  // empty: [peer] gpus
};

Status run_simulated(const v1::GossipConfig& cfg) {
  ASSIGN_OR_RETURN(auto s, gossip::run_simulation(cfg));
  if (cfg.task().kind() == v1::GossipTaskConfig::CONSENSUS) {
    spdlog::info(
        "gossip simulation: {} rounds, consensus distance {:.4g}, {:.3f} MB sent per "
        "peer ({} bytes in all), mean value {:.6g}",
        s.rounds, s.consensus_distance, s.bytes_per_node / 1e6, s.total_bytes,
        s.mean_model_eval.mean_value);
    return ok_status();
  }
  spdlog::info(
      "gossip simulation: {} rounds, consensus distance {:.4g}, {:.3f} MB sent per peer "
      "({} bytes in all), test accuracy mean {:.4f} min {:.4f}, mean model {:.4f} (test loss "
      "{:.4f})",
      s.rounds, s.consensus_distance, s.bytes_per_node / 1e6, s.total_bytes, s.mean_accuracy,
      s.min_accuracy, s.mean_model_eval.accuracy, s.mean_model_eval.loss);
  return ok_status();
}

Status run_peer(const PeerArgs& args) {
  sim::register_gossip_model_tasks();  // task.kind FEDERATED: the federations' model kinds
  ASSIGN_OR_RETURN(auto cfg, gossip::load_gossip_config(args.config));
  if (args.num_rounds) cfg.mutable_rounds()->set_num_rounds(args.num_rounds);
  if (!args.metrics.empty()) {
    (args.simulate ? cfg.mutable_simulate()->mutable_metrics_path()
                   : cfg.mutable_peer()->mutable_metrics_path())
        ->assign(args.metrics);
  }
  if (!args.device.empty() || !args.gpus.empty()) {
    if (!args.device.empty()) cfg.mutable_peer()->set_device(args.device);
    if (!args.gpus.empty()) {
      cfg.mutable_peer()->clear_gpus();
      for (uint32_t g : args.gpus) cfg.mutable_peer()->add_gpus(g);
    }
    RETURN_IF_ERROR(gossip::validate_gossip_config(cfg, args.config + " with --device/--gpus"));
  }
  if (args.simulate) return run_simulated(cfg);

  ASSIGN_OR_RETURN(
      auto tls,
      net::load_tls_config(cfg.tls().ca(), cfg.tls().cert(), cfg.tls().key(), cfg.tls().crl()),
      "peer [tls]");
  ASSIGN_OR_RETURN(auto cert, net::cert_from_pem(tls.cert_pem), "peer certificate");
  const std::string cn = net::cert_identity(cert.get()).common_name;
  std::string node_id = !args.node_id.empty() ? args.node_id : cfg.peer().node_id();
  if (node_id.empty()) node_id = cn;
  if (node_id != cn) {
    return invalid_argument("peer: node id '" + node_id + "' differs from the certificate's CN '" +
                            cn + "' (" + cfg.tls().cert() + ")");
  }
  const uint32_t index =
      args.partition >= 0 ? static_cast<uint32_t>(args.partition) : cfg.peer().partition_index();
  if (index >= cfg.data().num_clients()) {
    return invalid_argument("peer: partition " + std::to_string(index) + " >= data.num_clients " +
                            std::to_string(cfg.data().num_clients()));
  }
  const bool trains = cfg.task().kind() != v1::GossipTaskConfig::CONSENSUS;
  ASSIGN_OR_RETURN(
      auto task, gossip::GossipTask::create(cfg, static_cast<int>(cfg.data().num_clients()), trains,
                                            /*one_peer=*/true));
  spdlog::info("peer: {}", task->describe());
  ASSIGN_OR_RETURN(auto server_ctx, net::make_tls_context(tls, net::TlsSide::kServer));
  ASSIGN_OR_RETURN(auto client_ctx, net::make_tls_context(tls, net::TlsSide::kClient));
  ASSIGN_OR_RETURN(auto metrics, gossip::JsonLines::open(cfg.peer().metrics_path()));

  gossip::PeerOptions o = gossip::peer_options(cfg, node_id, index);
  if (const char* crash = std::getenv("STARLING_CRASH_POINT"); crash && *crash) {
    o.crash_point = crash;  // crash tests only (PeerOptions::crash_point)
  }

  const uint32_t every = cfg.eval().every_rounds();
  const uint32_t rounds = cfg.rounds().num_rounds();
  const auto t0 = std::chrono::steady_clock::now();
  auto hook = [&](const gossip::PeerRoundReport& r, std::span<const float> params) {
    nlohmann::json j = {
        {"node", node_id},
        {"round", r.round},
        {"live_members", r.live_members},
        {"neighbours", r.neighbours},
        {"mixed", r.mixed},
        {"train_loss", r.train_loss},
        {"bytes_sent", r.bytes_sent},
        {"round_seconds", r.seconds},
        {"caught_up", r.caught_up},
        {"resumed", r.resumed},
        {"elapsed_seconds",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
    const bool eval = (every > 0 && r.round % every == 0) || r.round == rounds;
    if (eval || !trains) {
      const auto e = task->evaluate(params);
      j["mean_value"] = e.mean_value;
      if (trains) {
        j["test_accuracy"] = e.accuracy;
        j["test_loss"] = e.loss;
        spdlog::info("peer {} round {}: {} live, mixed {}/{}, test accuracy {:.4f}", node_id,
                     r.round, r.live_members, r.mixed, r.neighbours, e.accuracy);
      }
    }
    metrics->write(j.dump());
  };

  asio::io_context io;
  ASSIGN_OR_RETURN(auto peer, gossip::Peer::create(io, server_ctx, client_ctx, o, task->layout(),
                                                   task->initial(static_cast<int>(index)),
                                                   task->trainer(static_cast<int>(index)), hook));
  spdlog::info("peer {}: listening on {}:{}, partition {}, {} seed(s), {} on {}", node_id,
               o.listen_host, peer->port(), index, o.seeds.size(),
               gossip::algorithm_name(o.node.algorithm), gossip::topology_name(o.topology.kind));
  if (!cfg.peer().port_file().empty()) {
    RETURN_IF_ERROR(
        net::write_file(cfg.peer().port_file(), std::to_string(peer->port()) + "\n", 0644),
        "peer.port_file");
  }
  // The CRL ([tls] crl) is reloaded on SIGHUP and when the file changes: new handshakes
  // (accepted and dialed) verify against it, and links to revoked peers are dropped at once.
  std::unique_ptr<net::ReloadWatch> crl_watch;
  if (!cfg.tls().crl().empty()) {
    crl_watch = std::make_unique<net::ReloadWatch>(
        io, "peer " + node_id, std::vector<std::string>{cfg.tls().crl()},
        [&](const std::string&) -> Status {
          net::TlsConfig next = tls;
          ASSIGN_OR_RETURN(next.crl_pem, net::read_file(cfg.tls().crl()), "revocation list");
          ASSIGN_OR_RETURN(auto serials,
                           net::verified_crl_serials(next.crl_pem, next.ca_pem,
                                                     "revocation list " + cfg.tls().crl()));
          RETURN_IF_ERROR(net::reload_trust(*server_ctx, next));
          RETURN_IF_ERROR(net::reload_trust(*client_ctx, next));
          tls = std::move(next);
          const size_t dropped =
              peer->drop_revoked(std::set<std::string>(serials.begin(), serials.end()));
          spdlog::info("peer {}: revocation list reloaded: {} revoked, {} link(s) dropped", node_id,
                       serials.size(), dropped);
          return ok_status();
        });
  }
  RETURN_IF_ERROR(gossip::run_peer_to_end(io, *peer));
  const auto final_eval = task->evaluate(peer->params());
  spdlog::info("peer {}: done after {} rounds; {} bytes sent; mean parameter {:.6g}{}", node_id,
               peer->rounds_completed(), peer->bytes_sent(), final_eval.mean_value,
               trains ? fmt::format(", test accuracy {:.4f}", final_eval.accuracy) : "");
  return ok_status();
}

}  // namespace

void register_peer(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<PeerArgs>();
  auto* cmd = app.add_subcommand("peer", "Run a peer of a serverless gossip federation");
  cmd->add_option("-c,--config", args->config, "Gossip TOML config (configs/gossip_*.toml)")
      ->required();
  cmd->add_flag("--simulate", args->simulate,
                "Run every peer of the config in this process (in-memory exchange, bytes counted)");
  cmd->add_option("--node-id", args->node_id,
                  "Our identity (default: [peer].node_id, else the certificate's CN)");
  cmd->add_option("--partition", args->partition,
                  "Which data partition to train on (default: [peer].partition_index)");
  cmd->add_option("--num-rounds", args->num_rounds, "Override [rounds].num_rounds");
  cmd->add_option("--device", args->device,
                  "Where the built-in trainer runs: cpu or cuda (overrides [peer] device)");
  cmd->add_option("--gpus", args->gpus,
                  "The GPUs of --device cuda, e.g. --gpus 0 or 0,1 (data parallel; with "
                  "--simulate the peers spread over them; overrides [peer] gpus)")
      ->delimiter(',');
  cmd->add_option("--metrics", args->metrics,
                  "JSON-lines metrics file (overrides [peer].metrics_path, or "
                  "[simulate].metrics_path with --simulate)");
  cmd->callback([args, &ctx] {
    const Status st = run_peer(*args);
    if (!st.ok()) fail(ctx, st.to_string());
  });
}

}  // namespace starling::apps
