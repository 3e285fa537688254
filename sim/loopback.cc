// The loopback simulation: the real aggregator and edge clients over mutual TLS on 127.0.0.1.
#include <omp.h>
#include <spdlog/spdlog.h>

#include <asio/io_context.hpp>
#include <chrono>

#include "aggregator/aggregator.h"
#include "aggregator/fed_task.h"
#include "core/net/certs.h"
#include "core/net/tls.h"
#include "edge_client/edge_client.h"
#include "sim/engine.h"

namespace starling::sim {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A connected client whose trainer (data slice, model, optimizer state) exists only while it
// trains a round.
class LazyTrainer final : public edge_client::LocalTrainer {
 public:
  LazyTrainer(const SimTask& task, int client, uint32_t* trained)
      : task_(task), client_(client), trained_(trained) {}
  const compress::Layout& layout() const override { return task_.layout(); }
  Result<edge_client::TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                                         std::span<float> delta) override {
    ++*trained_;
    // One thread per training, as in-process workers do: OpenMP teams on a busy machine wait
    // on descheduled threads at every barrier.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    auto r = task_.make_trainer(client_)->train(global, plan, delta);
    omp_set_num_threads(threads);
    return r;
  }

 private:
  const SimTask& task_;
  int client_;
  uint32_t* trained_;
};

struct Pki {
  net::TlsConfig server;
  std::vector<net::TlsConfig> clients;
};

// A throwaway CA, the aggregator's certificate and one per client, all in memory.
Result<Pki> make_pki(int n) {
  ASSIGN_OR_RETURN(auto ca, net::make_ca({"starling-simulation", net::CertRole::kCa, {}}));
  ASSIGN_OR_RETURN(std::string ca_pem, net::cert_to_pem(ca.cert.get()));
  auto node = [&](const std::string& name, net::CertRole role) -> Result<net::TlsConfig> {
    // Throwaway certificates: valid for a week, well inside the CA's year.
    ASSIGN_OR_RETURN(
        auto cred,
        net::issue_cert(ca, {name, role, {"DNS:localhost", "IP:127.0.0.1"}, -300, 7 * 86400}));
    net::TlsConfig t;
    t.ca_pem = ca_pem;
    ASSIGN_OR_RETURN(t.cert_pem, net::cert_to_pem(cred.cert.get()));
    ASSIGN_OR_RETURN(t.key_pem, net::key_to_pem(cred.key.get()));
    return t;
  };
  Pki pki;
  ASSIGN_OR_RETURN(pki.server, node("aggregator", net::CertRole::kServer));
  for (int k = 0; k < n; ++k) {
    ASSIGN_OR_RETURN(auto t, node("client-" + std::to_string(k), net::CertRole::kClient));
    pki.clients.push_back(std::move(t));
  }
  return pki;
}

}  // namespace

Result<SimResult> run_loopback(const v1::FederationConfig& cfg, SimTask& task,
                               const std::filesystem::path& out_dir,
                               const RoundCallback& on_round) {
  const int have = task.num_clients();
  const int n =
      cfg.simulate().num_clients() ? static_cast<int>(cfg.simulate().num_clients()) : have;
  if (n > have) {
    return invalid_argument("simulate.num_clients " + std::to_string(n) + " exceeds the " +
                            std::to_string(have) + " client partitions of [data]");
  }
  const auto t0 = Clock::now();
  ASSIGN_OR_RETURN(Pki pki, make_pki(n), "loopback certificates");
  ASSIGN_OR_RETURN(auto server_ctx, net::make_tls_context(pki.server, net::TlsSide::kServer));
  auto options = aggregator::aggregator_options(cfg);
  options.simulation = true;
  options.server.host = "127.0.0.1";
  options.server.port = 0;
  options.state_dir = (out_dir / "state").string();
  // The first round waits for the whole fleet to connect (no availability traces here).
  options.min_available = std::max<uint32_t>(options.min_available, static_cast<uint32_t>(n));
  std::error_code ec;
  std::filesystem::remove_all(options.state_dir, ec);  // a fresh run, not a resume

  SimResult res;
  res.mode = "loopback";
  res.num_clients = n;
  res.workers = 1;
  res.participation.assign(static_cast<size_t>(n), 0);
  uint64_t bytes_total = 0;
  const uint64_t model_bytes =
      task.layout().empty() ? 0
                            : static_cast<uint64_t>(task.layout().back().offset +
                                                    shape_numel(task.layout().back().shape)) *
                                  4;
  auto hook = [&](const aggregator::RoundReport& r, std::span<const float> global) {
    RoundRecord rec;
    rec.round = r.round;
    rec.available = static_cast<int>(n);
    rec.selected = r.selected;
    rec.updates = r.updates;
    rec.rejected = r.rejected;
    rec.examples = r.total_weight;
    rec.train_loss = r.mean_train_loss;
    rec.bytes_up = r.update_bytes;
    rec.bytes_down = static_cast<uint64_t>(r.selected) * model_bytes;
    if (r.secagg_degree > 0) {
      rec.secagg_dropped = r.secagg_dropped;
      rec.secagg_degree = r.secagg_degree;
      rec.secagg_threshold = r.secagg_threshold;
      // The key and unmask stages, both directions (the masked vectors are in update_bytes).
      rec.bytes_up += r.secagg_stage_bytes[0] + r.secagg_stage_bytes[1] + r.secagg_stage_bytes[3];
      rec.bytes_down = static_cast<uint64_t>(r.secagg_survivors + r.secagg_dropped) * model_bytes;
    }
    rec.dp_epsilon = r.dp_epsilon;
    bytes_total += rec.bytes_up + rec.bytes_down;
    rec.bytes_total = bytes_total;
    rec.real_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // No emulation over real sockets: the clock is the real one.
    rec.sim_round_seconds = r.seconds;
    rec.sim_seconds = rec.real_seconds;
    const uint32_t every = cfg.eval().every_rounds();
    bool go_on = true;
    if (every > 0 && (r.round % every == 0 || r.round == cfg.rounds().num_rounds())) {
      const TaskEval e = task.evaluate(global);
      rec.evaluated = true;
      rec.test_loss = e.loss;
      rec.test_accuracy = e.accuracy;
      const float target = cfg.eval().target_accuracy();
      if (target > 0 && e.accuracy >= target) go_on = false;
    }
    res.rounds.push_back(rec);
    if (on_round) on_round(rec);
    return go_on;
  };

  asio::io_context io;
  ASSIGN_OR_RETURN(auto agg,
                   aggregator::Aggregator::create(io, server_ctx, options, task.layout(),
                                                  task.initial_model(), hook),
                   "loopback aggregator");
  std::vector<std::unique_ptr<LazyTrainer>> trainers;
  std::vector<std::unique_ptr<edge_client::EdgeClient>> clients;
  for (int k = 0; k < n; ++k) {
    ASSIGN_OR_RETURN(auto ctx, net::make_tls_context(pki.clients[static_cast<size_t>(k)],
                                                     net::TlsSide::kClient));
    trainers.push_back(
        std::make_unique<LazyTrainer>(task, k, &res.participation[static_cast<size_t>(k)]));
    edge_client::EdgeClientOptions o;
    o.connect.host = "127.0.0.1";
    o.connect.port = agg->port();
    o.connect.server_name = "localhost";
    o.node_id = "client-" + std::to_string(k);
    o.backoff.initial = milliseconds(cfg.client().backoff_initial_ms());
    o.backoff.max = milliseconds(cfg.client().backoff_max_ms());
    o.seed = static_cast<uint64_t>(k) + 1;
    o.chunk_bytes = cfg.simulate().chunk_bytes();
    o.require_secure_aggregation = cfg.secagg().enabled();
    clients.push_back(std::make_unique<edge_client::EdgeClient>(io, ctx, o, *trainers.back()));
    clients.back()->start();
  }
  const auto connect_by = Clock::now() + std::chrono::seconds(cfg.simulate().connect_timeout_s());
  bool anyone = false;
  Status unreachable;
  while (!agg->done()) {
    if (io.stopped()) io.restart();
    if (io.run_one_for(milliseconds(100)) == 0 && io.stopped()) break;
    if (!anyone) {
      anyone = std::any_of(clients.begin(), clients.end(),
                           [](const auto& c) { return c->connections() > 0; });
      if (!anyone && Clock::now() >= connect_by) {
        unreachable =
            unavailable("no client reached the loopback aggregator at 127.0.0.1:" +
                        std::to_string(agg->port()) + " within simulate.connect_timeout_s = " +
                        std::to_string(cfg.simulate().connect_timeout_s()) +
                        " s (is the loopback interface up?)");
        break;
      }
    }
  }
  res.global.assign(agg->global().begin(), agg->global().end());
  // Let the clients hear that the federation is complete.
  const auto until = Clock::now() + milliseconds(2000);
  while (Clock::now() < until &&
         !std::all_of(clients.begin(), clients.end(), [](const auto& c) { return c->stopped(); })) {
    if (io.stopped()) io.restart();
    io.run_one_for(milliseconds(50));
  }
  // Tearing down aborts handshakes and connections still open; that is no news to anyone.
  const auto level = spdlog::get_level();
  spdlog::set_level(std::max(level, spdlog::level::err));
  Status error = !unreachable.ok() ? unreachable : agg->error();
  for (const auto& c : clients) {
    if (error.ok() && !c->error().ok()) error = c->error().with_context("loopback client");
  }
  clients.clear();
  agg.reset();
  io.poll();
  spdlog::set_level(level);
  if (!error.ok()) return error;

  res.real_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

}  // namespace starling::sim
