// `starling aggregator` and `starling client`: one federation from a configs/fed_*.toml file.
// `starling aggregator --simulate` also runs [simulate].num_clients clients in the same process
// over loopback TLS with throwaway certificates, so a whole federation is one command.
#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "aggregator/access.h"
#include "aggregator/fed_task.h"
#include "aggregator/leaf.h"
#include "aggregator/monitor.h"
#include "apps/starling/commands.h"
#include "apps/starling/device_flags.h"
#include "apps/starling/fetch_data.h"
#include "apps/starling/io_loop.h"
#include "core/net/certs.h"
#include "core/net/tls.h"
#include "edge_client/edge_client.h"
#include "edge_client/fed_config.h"
#include "edge_client/model_params.h"
#include "sim/external_task.h"
#include "sim/task.h"

namespace starling::apps {
namespace {

using aggregator::Aggregator;
using aggregator::RoundReport;
using std::chrono::milliseconds;

struct AggregatorArgs {
  std::string config;
  bool simulate = false;
  uint32_t num_rounds = 0;
  int metrics_port = -1;  // -1: [server].metrics_port
  DeviceFlags device;     // the simulated clients' trainers (--simulate)
};

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

// A client of the in-process simulation: options from [client]; state kept in memory only, and
// the device keys (memory limit, training condition, upload cap) left to sim/'s emulation.
std::unique_ptr<edge_client::EdgeClient> make_client(
    asio::io_context& io, std::shared_ptr<asio::ssl::context> ctx, const v1::FederationConfig& c,
    const std::string& node_id, uint16_t port, edge_client::LocalTrainer& trainer, uint64_t seed) {
  auto o = edge_client::edge_client_options(c, node_id, port, seed);
  o.state_path.clear();
  o.memory_limit_bytes = 0;
  o.condition = {};
  o.upload_bytes_per_second = 0;
  auto client = std::make_unique<edge_client::EdgeClient>(io, std::move(ctx), o, trainer);
  client->start();
  return client;
}

// A leaf's link to the tier above ([upstream]), as aggregator/leaf.h takes it.
aggregator::LeafOptions leaf_options(const v1::FederationConfig& cfg) {
  const auto& u = cfg.upstream();
  aggregator::LeafOptions lo;
  auto& o = lo.upstream;
  o.connect.host = u.host();
  o.connect.port = static_cast<uint16_t>(u.port());
  o.connect.server_name = u.server_name();
  o.node_id = cfg.server().node_id();
  o.backoff.initial = milliseconds(u.backoff_initial_ms());
  o.backoff.max = milliseconds(u.backoff_max_ms());
  o.seed = cfg.rounds().seed();
  o.chunk_bytes = u.chunk_kb() << 10;
  // The residuals of the leaf's own uploads (a lossy codec of the tier above), crash-safe.
  o.state_path = cfg.server().state_dir() + "/upstream.state.safetensors";
  lo.deadline_fraction = u.deadline_fraction();
  return lo;
}

// A leaf's certificate serves its clients and the tier above: role leaf, or the tier above
// refuses it after the handshake with a message the operator would have to find in its log.
Status check_leaf_certificate(const v1::FederationConfig& cfg, const net::TlsConfig& tls) {
  ASSIGN_OR_RETURN(auto cert, net::cert_from_pem(tls.cert_pem), "[tls] cert " + cfg.tls().cert());
  const auto id = net::cert_identity(cert.get());
  if (id.role != "leaf") {
    return failed_precondition(
        "[tls] cert " + cfg.tls().cert() + " has role '" + id.role +
        "': a leaf aggregator ([upstream]) needs a certificate of role leaf (`starling certs "
        "issue --role leaf --name " +
        id.common_name + " --san DNS:...`), which its clients and the tier above both accept");
  }
  if (id.common_name != cfg.server().node_id()) {
    return failed_precondition("[tls] cert " + cfg.tls().cert() + " names '" + id.common_name +
                               "', [server] node_id is '" + cfg.server().node_id() +
                               "': they must be the same");
  }
  return ok_status();
}

Status run_aggregator(const AggregatorArgs& args) {
  // First: the io_context outlives everything bound to it. The monitor (held by `options` and
  // `monitor` below) closes its acceptor when it goes; declared after `options`, the
  // io_context was destroyed first, and the monitor then freed its sockets into an io_context
  // already gone: heap corruption at the exit of every run with a metrics port
  // (configs/fed_mnist_dp.toml).
  asio::io_context io;
  ASSIGN_OR_RETURN(auto cfg, aggregator::load_federation_config(args.config));
  if (args.num_rounds) cfg.mutable_rounds()->set_num_rounds(args.num_rounds);
  const bool leaf = cfg.has_upstream();
  if (leaf && args.simulate) {
    return invalid_argument(args.config +
                            ": --simulate runs a whole federation in one process; a leaf "
                            "([upstream]) serves real clients for the tier above");
  }
  RETURN_IF_ERROR(apply_device_flags(args.device, &cfg, args.config));
  RETURN_IF_ERROR(fetch_federation_data(cfg));
  // The model kind's task (sim/model_kind.h): the model, its evaluation and checkpoint, and the
  // simulated clients' trainers. Without --simulate the clients' training data is not loaded.
  if (args.simulate) RETURN_IF_ERROR(sim::check_simulated_trainer(cfg, args.config));
  RETURN_IF_ERROR(sim::check_external_evaluation(cfg, args.config));
  ASSIGN_OR_RETURN(auto task, sim::SimTask::create(cfg, args.config,
                                                   args.simulate ? sim::TaskUse::kSimulation
                                                                 : sim::TaskUse::kServer));
  spdlog::info("task: {}", task->describe());
  const auto layout = task->layout();
  auto options = aggregator::aggregator_options(cfg);
  options.simulation = args.simulate;
  if (const char* crash = std::getenv("STARLING_CRASH_POINT"); crash && *crash) {
    options.crash_point = crash;  // crash tests only (AggregatorOptions::crash_point)
  }
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
  if (leaf) RETURN_IF_ERROR(check_leaf_certificate(cfg, server_tls), args.config);

  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t every = leaf ? 0 : cfg.eval().every_rounds();  // the root evaluates
  const float target = cfg.eval().target_accuracy();
  std::shared_ptr<aggregator::Monitor> monitor;  // [server].metrics_port
  auto hook = [&](const RoundReport& r, std::span<const float> global) {
    nlohmann::json j = {
        {"round", r.round},
        {"selected", r.selected},
        {"updates", r.updates},
        {"rejected", r.rejected},
        {"lost_by_clients", r.lost},
        {"examples", r.total_weight},
        {"train_loss", r.mean_train_loss},
        {"update_bytes", r.update_bytes},
        {"round_seconds", r.seconds},
        {"registered", r.registered},
        {"clipped", r.clipped},
        {"excluded", r.excluded},
        {"elapsed_seconds",
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
    bool go_on = true;
    if (every > 0 && r.round % every == 0) {
      const sim::TaskEval e = task->evaluate(global);
      j["test_loss"] = e.loss;
      j["test_accuracy"] = e.accuracy;
      if (monitor) monitor->evaluated(r.round, e.loss, e.accuracy);
      if (std::isnan(e.accuracy)) {  // a model evaluated by loss alone (EXTERNAL)
        spdlog::info("round {}: test loss {:.4f}", r.round, e.loss);
      } else {
        spdlog::info("round {}: test accuracy {:.4f}, loss {:.4f}", r.round, e.accuracy, e.loss);
      }
      if (target > 0 && e.accuracy >= target) {
        spdlog::info("target accuracy {} reached in round {}", target, r.round);
        go_on = false;
      }
    }
    if (options.dp.enabled()) {
      j["dp_epsilon"] = r.dp_epsilon;
      j["dp_delta"] = options.dp.delta;
      j["dp_noise_std"] = r.dp_noise_std;
      j["dp_sampling_rate"] = r.dp_sampling_rate;
      j["dp_expected_updates"] = r.dp_expected_updates;
      j["dp_clip_norm"] = options.dp.clip_norm;
    }
    if (options.buffer_size > 0) {
      j["mean_staleness"] = r.mean_staleness;
      j["max_staleness"] = r.max_staleness;
    }
    j["fold_gbps"] = r.fold_gbps;
    j["receive_gbps"] = r.receive_gbps;
    if (r.secagg_degree > 0) {
      j["secagg_survivors"] = r.secagg_survivors;
      j["secagg_dropped"] = r.secagg_dropped;
      j["secagg_degree"] = r.secagg_degree;
      j["secagg_threshold"] = r.secagg_threshold;
      j["secagg_stage_bytes"] = r.secagg_stage_bytes;
      if (options.secagg.noise_multiplier() > 0) {
        j["dp_epsilon"] = r.dp_epsilon;
        j["dp_delta"] = options.secagg.dp_delta();
        j["dp_sampling_rate"] = r.dp_sampling_rate;
        j["dp_expected_updates"] = r.dp_expected_updates;
      }
    }
    metrics->write(j.dump());
    return go_on;
  };

  const uint32_t metrics_port = args.metrics_port >= 0 ? static_cast<uint32_t>(args.metrics_port)
                                                       : cfg.server().metrics_port();
  if (metrics_port > 0) {
    ASSIGN_OR_RETURN(monitor, aggregator::Monitor::start(io, cfg.server().metrics_host(),
                                                         static_cast<uint16_t>(metrics_port),
                                                         "starling federation: " + args.config));
    options.monitor = monitor;
  }
  // Who may join: in force before the first connection, then kept current (SIGHUP, file
  // changes). A simulation's throwaway PKI has no CRL or allow-list to watch.
  if (!args.simulate) {
    ASSIGN_OR_RETURN(options.access,
                     aggregator::access_policy(cfg, server_tls.ca_pem, server_tls.crl_pem));
  }
  ASSIGN_OR_RETURN(
      auto agg, Aggregator::create(io, server_ctx, options, layout, task->initial_model(), hook));
  spdlog::info("aggregator: listening on {}:{}, state in {}, metrics in {}", options.server.host,
               agg->port(), options.state_dir, metrics_path);
  std::unique_ptr<aggregator::AccessWatcher> access;
  if (!args.simulate) {
    ASSIGN_OR_RETURN(access, aggregator::AccessWatcher::start(io, cfg, server_tls, server_ctx,
                                                              [&agg](aggregator::AccessPolicy p) {
                                                                agg->set_access(std::move(p));
                                                              }));
  }

  // A leaf: the link to the tier above, on its own thread; it ends the run when the tier above
  // ends the federation.
  std::unique_ptr<aggregator::Leaf> uplink;
  if (leaf) {
    ASSIGN_OR_RETURN(auto up_ctx, net::make_tls_context(server_tls, net::TlsSide::kClient));
    ASSIGN_OR_RETURN(uplink, aggregator::Leaf::start(io, *agg, layout, up_ctx, leaf_options(cfg)));
    spdlog::info("aggregator: leaf of {}:{} (as {})", cfg.upstream().host(), cfg.upstream().port(),
                 cfg.server().node_id());
    run_while(io, [&] { return uplink->stopped(); });
    const Status up = uplink->error();
    const int rounds = uplink->rounds();
    agg->end_federation();
    const auto until = std::chrono::steady_clock::now() + milliseconds(1000);
    run_while(io, [&] { return std::chrono::steady_clock::now() > until; });
    uplink.reset();
    if (!up.ok()) return up.with_context("leaf: the link to the tier above");
    spdlog::info(
        "aggregator: leaf done: the tier above ended the federation after {} round(s) "
        "of this leaf",
        rounds);
    return ok_status();
  }

  std::vector<std::unique_ptr<edge_client::LocalTrainer>> trainers;
  std::vector<std::unique_ptr<edge_client::EdgeClient>> clients;
  if (args.simulate) {
    for (int k = 0; k < sim_clients; ++k) {
      ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(pki.clients[static_cast<size_t>(k)],
                                                       net::TlsSide::kClient));
      trainers.push_back(task->make_trainer(k % task->num_clients()));
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
  // The model as its kind saves it (a GPT, MDLM or DDPM checkpoint `starling sample` reads),
  // beside the raw global model.
  const std::string path = options.state_dir + "/model.safetensors";
  RETURN_IF_ERROR(task->save_model(path, agg->global(), agg->rounds_completed()));
  spdlog::info("aggregator: model checkpoint in {}", path);
  spdlog::info("aggregator: done after {} rounds; global model in {}/global_model.safetensors",
               agg->rounds_completed(), options.state_dir);
  return ok_status();
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
  cmd->add_option("--metrics-port", args->metrics_port,
                  "Override [server].metrics_port: Prometheus /metrics and the status page "
                  "(0: off)")
      ->check(CLI::Range(0, 65535));
  add_device_flags(cmd, &args->device);
  cmd->callback([args, &ctx] {
    const Status st = run_aggregator(*args);
    if (!st.ok()) fail(ctx, st.to_string());
  });
}

}  // namespace starling::apps
