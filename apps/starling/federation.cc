// `starling aggregator` and `starling client`: one federation from a configs/fed_*.toml file.
// `starling aggregator --simulate` also runs [simulate].num_clients clients in the same process
// over loopback TLS with throwaway certificates, so a whole federation is one command.
#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "aggregator/fed_task.h"
#include "apps/starling/commands.h"
#include "core/net/certs.h"
#include "core/net/tls.h"
#include "edge_client/edge_client.h"
#include "edge_client/model_params.h"

namespace starling::apps {
namespace {

using aggregator::Aggregator;
using aggregator::RoundReport;
using std::chrono::milliseconds;

struct AggregatorArgs {
  std::string config;
  bool simulate = false;
  uint32_t num_rounds = 0;
};

struct ClientArgs {
  std::string config;
  std::string node_id;
  int partition = -1;
};

// Runs handlers until done() or, when no handler is left, returns.
void run_while(asio::io_context& io, const std::function<bool()>& done) {
  while (!done()) {
    if (io.stopped()) io.restart();
    if (io.run_one_for(milliseconds(100)) == 0 && io.stopped()) return;
  }
}

// An in-memory PKI for a simulation: the aggregator's and each client's TLS config.
struct SimPki {
  net::TlsConfig server;
  std::vector<net::TlsConfig> clients;
};

Result<SimPki> make_sim_pki(int n) {
  ASSIGN_OR_RETURN(auto ca, net::make_ca({"starling-simulation", net::CertRole::kCa, {}}));
  ASSIGN_OR_RETURN(std::string ca_pem, net::cert_to_pem(ca.cert.get()));
  auto node = [&](const std::string& name, net::CertRole role) -> Result<net::TlsConfig> {
    ASSIGN_OR_RETURN(auto cred,
                     net::issue_cert(ca, {name, role, {"DNS:localhost", "IP:127.0.0.1"}}));
    net::TlsConfig t;
    t.ca_pem = ca_pem;
    ASSIGN_OR_RETURN(t.cert_pem, net::cert_to_pem(cred.cert.get()));
    ASSIGN_OR_RETURN(t.key_pem, net::key_to_pem(cred.key.get()));
    return t;
  };
  SimPki pki;
  ASSIGN_OR_RETURN(pki.server, node("aggregator", net::CertRole::kServer));
  for (int k = 0; k < n; ++k) {
    ASSIGN_OR_RETURN(auto t, node("client-" + std::to_string(k), net::CertRole::kClient));
    pki.clients.push_back(std::move(t));
  }
  return pki;
}

std::unique_ptr<edge_client::EdgeClient> make_client(
    asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx, const v1::FederationConfig& c,
    const std::string& node_id, uint16_t port, edge_client::LocalTrainer& trainer, uint64_t seed) {
  edge_client::EdgeClientOptions o;
  o.connect.host = c.client().server_host();
  o.connect.port = port;
  o.connect.server_name = c.client().server_name();
  o.node_id = node_id;
  o.backoff.initial = milliseconds(c.client().backoff_initial_ms());
  o.backoff.max = milliseconds(c.client().backoff_max_ms());
  o.seed = seed;
  auto client = std::make_unique<edge_client::EdgeClient>(io, std::move(ctx), o, trainer);
  client->start();
  return client;
}

Status run_aggregator(const AggregatorArgs& args) {
  ASSIGN_OR_RETURN(auto cfg, aggregator::load_federation_config(args.config));
  if (args.num_rounds) cfg.mutable_rounds()->set_num_rounds(args.num_rounds);
  std::shared_ptr<const data::MnistSet> test;
  if (cfg.eval().every_rounds() > 0) {
    ASSIGN_OR_RETURN(test, aggregator::load_split(cfg, false));
  }
  const int64_t pixels = test ? test->pixels() : 784;
  auto model = aggregator::make_model(cfg, pixels);
  const auto layout = edge_client::layout_of(*model);
  auto options = aggregator::aggregator_options(cfg);
  const std::string metrics_path = cfg.server().metrics_path().empty()
                                       ? cfg.server().state_dir() + "/metrics.jsonl"
                                       : cfg.server().metrics_path();
  ASSIGN_OR_RETURN(auto metrics, aggregator::MetricsLog::open(metrics_path));

  const int sim_clients = static_cast<int>(
      cfg.simulate().num_clients() ? cfg.simulate().num_clients() : cfg.data().num_clients());
  net::TlsConfig server_tls;
  SimPki pki;
  if (args.simulate) {
    ASSIGN_OR_RETURN(pki, make_sim_pki(sim_clients));
    server_tls = pki.server;
    options.server.port = 0;
    cfg.mutable_client()->set_server_host("127.0.0.1");
    cfg.mutable_client()->set_server_name("localhost");
  } else {
    ASSIGN_OR_RETURN(server_tls, net::load_tls_config(cfg.tls().ca(), cfg.tls().cert(),
                                                      cfg.tls().key(), cfg.tls().crl()));
  }
  ASSIGN_OR_RETURN(auto server_ctx, net::make_tls_context(server_tls, net::TlsSide::kServer));

  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t every = cfg.eval().every_rounds();
  const float target = cfg.eval().target_accuracy();
  int64_t eval_n = test ? test->size() : 0;
  if (cfg.eval().max_examples() > 0) eval_n = std::min<int64_t>(eval_n, cfg.eval().max_examples());
  auto hook = [&](const RoundReport& r, std::span<const float> global) {
    nlohmann::json j = {
        {"round", r.round},
        {"selected", r.selected},
        {"updates", r.updates},
        {"rejected", r.rejected},
        {"examples", r.total_weight},
        {"train_loss", r.mean_train_loss},
        {"update_bytes", r.update_bytes},
        {"round_seconds", r.seconds},
        {"elapsed_seconds",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
    bool go_on = true;
    if (test && every > 0 && r.round % every == 0) {
      (void)edge_client::load_flat(*model, global);
      const auto e = models::evaluate(*model, test->images.data(), test->labels.data(), eval_n);
      j["test_loss"] = e.loss;
      j["test_accuracy"] = e.accuracy;
      spdlog::info("round {}: test accuracy {:.4f}, loss {:.4f}", r.round, e.accuracy, e.loss);
      if (target > 0 && e.accuracy >= target) {
        spdlog::info("target accuracy {} reached in round {}", target, r.round);
        go_on = false;
      }
    }
    metrics->write(j.dump());
    return go_on;
  };

  asio::io_context io;
  ASSIGN_OR_RETURN(auto agg, Aggregator::create(io, server_ctx, options, layout,
                                                edge_client::flatten(*model), hook));
  spdlog::info("aggregator: listening on {}:{}, state in {}, metrics in {}", options.server.host,
               agg->port(), options.state_dir, metrics_path);

  std::vector<std::unique_ptr<edge_client::MnistTrainer>> trainers;
  std::vector<std::unique_ptr<edge_client::EdgeClient>> clients;
  if (args.simulate) {
    ASSIGN_OR_RETURN(auto train, aggregator::load_split(cfg, true));
    ASSIGN_OR_RETURN(auto parts, aggregator::make_partition(cfg, *train));
    for (int k = 0; k < sim_clients; ++k) {
      ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(pki.clients[static_cast<size_t>(k)],
                                                       net::TlsSide::kClient));
      trainers.push_back(std::make_unique<edge_client::MnistTrainer>(
          train, parts[static_cast<size_t>(k) % parts.size()], aggregator::trainer_options(cfg)));
      clients.push_back(make_client(io, ctx, cfg, "client-" + std::to_string(k), agg->port(),
                                    *trainers.back(), static_cast<uint64_t>(k) + 1));
    }
  }
  run_while(io, [&] { return agg->done(); });
  // Let the clients hear that the federation is complete.
  const auto until = std::chrono::steady_clock::now() + milliseconds(1000);
  run_while(io, [&] {
    return std::chrono::steady_clock::now() > until ||
           (!clients.empty() && std::all_of(clients.begin(), clients.end(),
                                            [](const auto& c) { return c->stopped(); }));
  });
  if (!agg->error().ok()) return agg->error();
  spdlog::info("aggregator: done after {} rounds; global model in {}/global_model.safetensors",
               agg->rounds_completed(), options.state_dir);
  return ok_status();
}

Status run_client(const ClientArgs& args) {
  ASSIGN_OR_RETURN(auto cfg, aggregator::load_federation_config(args.config));
  ASSIGN_OR_RETURN(auto tls, net::load_tls_config(cfg.tls().ca(), cfg.tls().cert(), cfg.tls().key(),
                                                  cfg.tls().crl()));
  std::string node_id = !args.node_id.empty() ? args.node_id : cfg.client().node_id();
  if (node_id.empty()) {
    ASSIGN_OR_RETURN(auto cert, net::cert_from_pem(tls.cert_pem));
    node_id = net::cert_identity(cert.get()).common_name;
  }
  const uint32_t index =
      args.partition >= 0 ? static_cast<uint32_t>(args.partition) : cfg.client().partition_index();
  if (index >= cfg.data().num_clients()) {
    return invalid_argument("partition " + std::to_string(index) + " >= data.num_clients " +
                            std::to_string(cfg.data().num_clients()));
  }
  ASSIGN_OR_RETURN(auto train, aggregator::load_split(cfg, true));
  ASSIGN_OR_RETURN(auto parts, aggregator::make_partition(cfg, *train));
  edge_client::MnistTrainer trainer(train, parts[index], aggregator::trainer_options(cfg));
  ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(tls, net::TlsSide::kClient));
  asio::io_context io;
  spdlog::info("client {}: partition {} ({} examples), aggregator {}:{}", node_id, index,
               parts[index].size(), cfg.client().server_host(), cfg.client().server_port());
  auto client = make_client(io, ctx, cfg, node_id,
                            static_cast<uint16_t>(cfg.client().server_port()), trainer, index + 1);
  run_while(io, [&] { return client->stopped(); });
  return client->error();
}

}  // namespace

void register_aggregator(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<AggregatorArgs>();
  auto* cmd = app.add_subcommand("aggregator", "Run the aggregation server of a federation");
  cmd->add_option("-c,--config", args->config, "Federation TOML config (configs/fed_*.toml)")
      ->required();
  cmd->add_flag("--simulate", args->simulate,
                "Also run [simulate].num_clients clients in this process (loopback TLS, "
                "throwaway certificates)");
  cmd->add_option("--num-rounds", args->num_rounds, "Override [rounds].num_rounds");
  cmd->callback([args, &ctx] {
    const Status st = run_aggregator(*args);
    if (!st.ok()) fail(ctx, st.to_string());
  });
}

void register_client(CLI::App& app, CommandContext& ctx) {
  auto args = std::make_shared<ClientArgs>();
  auto* cmd = app.add_subcommand("client", "Run an edge client of a federation");
  cmd->add_option("-c,--config", args->config, "Federation TOML config (configs/fed_*.toml)")
      ->required();
  cmd->add_option("--node-id", args->node_id,
                  "Our identity (default: [client].node_id, else the certificate's CN)");
  cmd->add_option("--partition", args->partition,
                  "Which data partition to train on (default: [client].partition_index)");
  cmd->callback([args, &ctx] {
    const Status st = run_client(*args);
    if (!st.ok()) fail(ctx, st.to_string());
  });
}

}  // namespace starling::apps
