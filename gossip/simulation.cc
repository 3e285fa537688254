// The in-process exchange: messages are serialized, counted, parsed and mixed exactly as a peer
// would, only without sockets.
#include "gossip/simulation.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/util/rng.h"

namespace starling::gossip {

float scheduled_learning_rate(float lr, float final_fraction, uint64_t round, uint64_t num_rounds) {
  if (final_fraction == 1.0f || num_rounds < 2) return lr;
  const double t = std::min(1.0, static_cast<double>(round) / static_cast<double>(num_rounds - 1));
  const double f = final_fraction;
  return static_cast<float>(lr * (f + (1.0 - f) * 0.5 * (1.0 + std::cos(std::numbers::pi * t))));
}

Simulation::Simulation(SimulationOptions options, compress::Layout layout, int64_t numel)
    : options_(std::move(options)), layout_(std::move(layout)), numel_(numel) {}

Result<std::unique_ptr<Simulation>> Simulation::create(
    const SimulationOptions& options, compress::Layout layout,
    std::vector<std::vector<float>> initial, std::vector<edge_client::LocalTrainer*> trainers,
    std::vector<double> sample_weights) {
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout), "gossip simulation");
  const size_t n = initial.size();
  if (n == 0) return invalid_argument("gossip simulation: no nodes");
  if (!trainers.empty() && trainers.size() != n) {
    return invalid_argument("gossip simulation: " + std::to_string(trainers.size()) +
                            " trainers for " + std::to_string(n) + " nodes");
  }
  if (!sample_weights.empty() && sample_weights.size() != n) {
    return invalid_argument("gossip simulation: " + std::to_string(sample_weights.size()) +
                            " sample weights for " + std::to_string(n) + " nodes");
  }
  if (options.node.algorithm == Algorithm::kChoco && options.node.shared_init) {
    for (size_t i = 1; i < n; ++i) {
      if (initial[i] != initial[0]) {
        return invalid_argument(
            "gossip simulation: CHOCO shared_init needs the same initial "
            "model on every node; node " +
            std::to_string(i) + " differs");
      }
    }
  }
  if (options.gossip_steps < 1) {
    return invalid_argument("gossip simulation: gossip_steps must be at least 1");
  }
  if (options.node.algorithm == Algorithm::kChoco && options.topology.time_varying) {
    return invalid_argument(
        "gossip simulation: CHOCO needs a static topology (its public copies x^ follow fixed "
        "neighbours); set topology.time_varying = false");
  }
  // Check the topology once on all nodes, so a bad torus or degree fails here, not mid-run.
  RETURN_IF_ERROR(mixing_matrix(options.topology, static_cast<int>(n), 0).status(),
                  "gossip simulation");
  std::unique_ptr<Simulation> sim(new Simulation(options, std::move(layout), numel));
  sim->trainers_ = std::move(trainers);
  sim->sample_weights_ = std::move(sample_weights);
  sim->alive_.assign(n, 1);
  sim->bytes_.assign(n, 0);
  sim->stats_.assign(n, {});
  sim->restarts_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(auto node, sim->make_node(static_cast<int>(i), std::move(initial[i])),
                     "node " + std::to_string(i));
    sim->nodes_.push_back(std::move(node));
  }
  if (options.node.algorithm == Algorithm::kChoco) {
    // Every x^ starts at zero, which every node knows: the first links need no snapshot.
    ASSIGN_OR_RETURN(MixingMatrix w, mixing_matrix(options.topology, static_cast<int>(n), 0));
    for (int p = 0; p < static_cast<int>(n); ++p) {
      for (int to : w.send_to[static_cast<size_t>(p)]) {
        sim->nodes_[static_cast<size_t>(to)]->assume_initial_copy(std::to_string(p));
        sim->linked_.insert({to, p});
      }
    }
  }
  return sim;
}

Result<std::unique_ptr<GossipNode>> Simulation::make_node(int node, std::vector<float> x) const {
  NodeOptions o = options_.node;
  // A restarted node gets a fresh codec stream, as a restarted process would.
  o.seed = Rng(options_.node.seed)
               .fork(static_cast<uint64_t>(node) * 1000 +
                     static_cast<uint64_t>(restarts_[static_cast<size_t>(node)]))
               .next_u64();
  return GossipNode::create(o, layout_, std::move(x));
}

std::vector<int> Simulation::live() const {
  std::vector<int> out;
  for (size_t i = 0; i < alive_.size(); ++i) {
    if (alive_[i]) out.push_back(static_cast<int>(i));
  }
  return out;
}

Status Simulation::run_round() {
  v1::RoundPlan plan;
  plan.set_round(rounds_);
  plan.set_local_steps(options_.local_steps);
  plan.set_batch_size(options_.batch_size);
  plan.set_learning_rate(scheduled_learning_rate(options_.learning_rate, options_.final_lr_fraction,
                                                 rounds_, options_.num_rounds));
  if (!trainers_.empty()) {
    delta_.resize(static_cast<size_t>(numel_));
    for (int i : live()) {
      auto* trainer = trainers_[static_cast<size_t>(i)];
      if (!trainer) continue;
      plan.set_seed(
          Rng(options_.seed).fork(rounds_ * 1'000'003ull + static_cast<uint64_t>(i)).next_u64());
      GossipNode& node = *nodes_[static_cast<size_t>(i)];
      ASSIGN_OR_RETURN(auto report, trainer->train(node.params(), plan, delta_),
                       "node " + std::to_string(i) + " round " + std::to_string(rounds_));
      auto x = node.params();
      for (size_t k = 0; k < x.size(); ++k) x[k] += delta_[k];
      stats_[static_cast<size_t>(i)] = {report.loss, report.num_samples};
    }
  }
  for (int s = 0; s < options_.gossip_steps; ++s) RETURN_IF_ERROR(gossip_step());
  ++rounds_;
  return ok_status();
}

Status Simulation::gossip_step() {
  Status st;
  switch (options_.node.algorithm) {
    case Algorithm::kDpsgd:
    case Algorithm::kChoco:
      st = synchronous_step();
      break;
    case Algorithm::kPushPull:
      st = push_pull_step();
      break;
    case Algorithm::kFedAvg:
      st = fedavg_step();
      break;
  }
  RETURN_IF_ERROR(st, "gossip step " + std::to_string(exchanges_));
  ++exchanges_;
  return ok_status();
}

Status Simulation::synchronous_step() {
  const std::vector<int> ids = live();
  const int m = static_cast<int>(ids.size());
  ASSIGN_OR_RETURN(MixingMatrix w, mixing_matrix(options_.topology, m, exchanges_));
  const bool choco = options_.node.algorithm == Algorithm::kChoco;
  // Every live node encodes once; each copy it sends is counted.
  std::vector<compress::EncodedUpdate> msgs(static_cast<size_t>(m));
  std::vector<compress::EncodedUpdate> snaps(static_cast<size_t>(m));
  std::vector<char> has_snap(static_cast<size_t>(m), 0);
  std::vector<uint64_t> snap_bytes(static_cast<size_t>(m), 0);
  for (int p = 0; p < m; ++p) {
    const int id = ids[static_cast<size_t>(p)];
    ASSIGN_OR_RETURN(std::string bytes, nodes_[static_cast<size_t>(id)]->make_message(),
                     "node " + std::to_string(id));
    ASSIGN_OR_RETURN(msgs[static_cast<size_t>(p)],
                     parse_message(bytes, numel_, "node " + std::to_string(id)));
    for (int to : w.send_to[static_cast<size_t>(p)]) {
      const int rid = ids[static_cast<size_t>(to)];
      const bool snapshot = choco && !linked_.count({rid, id});
      if (snapshot && !has_snap[static_cast<size_t>(p)]) {
        const std::string s = nodes_[static_cast<size_t>(id)]->snapshot();
        ASSIGN_OR_RETURN(snaps[static_cast<size_t>(p)],
                         parse_message(s, numel_, "node " + std::to_string(id)));
        has_snap[static_cast<size_t>(p)] = 1;
        snap_bytes[static_cast<size_t>(p)] = s.size();
      }
      bytes_[static_cast<size_t>(id)] +=
          snapshot ? snap_bytes[static_cast<size_t>(p)] : bytes.size();
    }
  }
  if (choco) {
    // Links that are gone leave stale copies behind: drop them (a new link sends a snapshot).
    std::set<std::pair<int, int>> current;
    for (int p = 0; p < m; ++p) {
      for (int to : w.send_to[static_cast<size_t>(p)]) {
        current.insert({ids[static_cast<size_t>(to)], ids[static_cast<size_t>(p)]});
      }
    }
    for (auto it = linked_.begin(); it != linked_.end();) {
      if (!current.count(*it)) {
        nodes_[static_cast<size_t>(it->first)]->forget(std::to_string(it->second));
        it = linked_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (int p = 0; p < m; ++p) {
    const int id = ids[static_cast<size_t>(p)];
    const MixingRow& row = w.rows[static_cast<size_t>(p)];
    std::vector<Incoming> in;
    double self = 0.0;
    for (size_t k = 0; k < row.nodes.size(); ++k) {
      const int q = row.nodes[k];
      if (q == p) {
        self = row.weights[k];
        continue;
      }
      const int sid = ids[static_cast<size_t>(q)];
      const bool snapshot = choco && !linked_.count({id, sid});
      in.push_back({std::to_string(sid),
                    snapshot ? &snaps[static_cast<size_t>(q)] : &msgs[static_cast<size_t>(q)],
                    row.weights[k], snapshot});
    }
    RETURN_IF_ERROR(nodes_[static_cast<size_t>(id)]->mix(self, in), "node " + std::to_string(id));
  }
  if (choco) {
    for (int p = 0; p < m; ++p) {
      for (int to : w.send_to[static_cast<size_t>(p)]) {
        linked_.insert({ids[static_cast<size_t>(to)], ids[static_cast<size_t>(p)]});
      }
    }
  }
  return ok_status();
}

Status Simulation::push_pull_step() {
  const std::vector<int> ids = live();
  const int m = static_cast<int>(ids.size());
  ASSIGN_OR_RETURN(auto adj, neighbours(options_.topology, m, exchanges_));
  // Asynchronous gossip as a random sequence of pairwise exchanges: each live node wakes once per
  // step, in random order, and averages with one random neighbour.
  Rng rng = Rng(options_.seed).fork(0x9055 + exchanges_);
  std::vector<int> order(static_cast<size_t>(m));
  for (int p = 0; p < m; ++p) order[static_cast<size_t>(p)] = p;
  for (size_t i = order.size(); i > 1; --i) {
    std::swap(order[i - 1], order[static_cast<size_t>(rng.below(i))]);
  }
  for (int p : order) {
    const auto& nb = adj[static_cast<size_t>(p)];
    if (nb.empty()) continue;
    const int q = nb[static_cast<size_t>(rng.below(nb.size()))];
    const int a = ids[static_cast<size_t>(p)], b = ids[static_cast<size_t>(q)];
    GossipNode& na = *nodes_[static_cast<size_t>(a)];
    GossipNode& nb_node = *nodes_[static_cast<size_t>(b)];
    ASSIGN_OR_RETURN(std::string push, na.make_message(), "node " + std::to_string(a));
    ASSIGN_OR_RETURN(std::string pull, nb_node.make_message(), "node " + std::to_string(b));
    bytes_[static_cast<size_t>(a)] += push.size();
    bytes_[static_cast<size_t>(b)] += pull.size();
    ASSIGN_OR_RETURN(auto from_a, parse_message(push, numel_, "node " + std::to_string(a)));
    ASSIGN_OR_RETURN(auto from_b, parse_message(pull, numel_, "node " + std::to_string(b)));
    RETURN_IF_ERROR(na.pair_average(from_b), "node " + std::to_string(a));
    RETURN_IF_ERROR(nb_node.pair_average(from_a), "node " + std::to_string(b));
  }
  return ok_status();
}

Status Simulation::fedavg_step() {
  const std::vector<int> ids = live();
  double total = 0.0;
  for (int id : ids) {
    total += sample_weights_.empty() ? 1.0 : sample_weights_[static_cast<size_t>(id)];
  }
  if (!(total > 0.0)) return failed_precondition("fedavg: live nodes carry no weight");
  std::vector<double> acc(static_cast<size_t>(numel_), 0.0);
  for (int id : ids) {
    const double wgt =
        (sample_weights_.empty() ? 1.0 : sample_weights_[static_cast<size_t>(id)]) / total;
    // Upload through the codec, as a client would (identity: exact).
    ASSIGN_OR_RETURN(std::string up, nodes_[static_cast<size_t>(id)]->make_message());
    ASSIGN_OR_RETURN(auto u, parse_message(up, numel_, "node " + std::to_string(id)));
    std::vector<float> x(static_cast<size_t>(numel_));
    RETURN_IF_ERROR(compress::decode(u, x));
    for (size_t k = 0; k < x.size(); ++k) acc[k] += wgt * static_cast<double>(x[k]);
    // Upload plus the dense download of the new global model.
    bytes_[static_cast<size_t>(id)] += up.size() + static_cast<uint64_t>(numel_) * 4;
  }
  std::vector<float> global(acc.begin(), acc.end());
  for (int id : ids) RETURN_IF_ERROR(nodes_[static_cast<size_t>(id)]->set_params(global));
  return ok_status();
}

Status Simulation::crash(int node) {
  if (node < 0 || node >= num_nodes() || !alive(node)) {
    return failed_precondition("gossip simulation: node " + std::to_string(node) +
                               " is not a live node");
  }
  alive_[static_cast<size_t>(node)] = 0;
  return ok_status();
}

Status Simulation::rejoin(int node) {
  if (node < 0 || node >= num_nodes() || alive(node)) {
    return failed_precondition("gossip simulation: node " + std::to_string(node) +
                               " is not a crashed node");
  }
  alive_[static_cast<size_t>(node)] = 1;
  const std::vector<int> ids = live();
  if (ids.size() < 2) {
    alive_[static_cast<size_t>(node)] = 0;
    return failed_precondition("gossip simulation: no live node for " + std::to_string(node) +
                               " to catch up from");
  }
  const int p = static_cast<int>(std::find(ids.begin(), ids.end(), node) - ids.begin());
  ASSIGN_OR_RETURN(auto adj,
                   neighbours(options_.topology, static_cast<int>(ids.size()), exchanges_));
  const auto& nb = adj[static_cast<size_t>(p)];
  const int source = ids[static_cast<size_t>(nb.empty() ? (p == 0 ? 1 : 0) : nb.front())];
  const auto src = nodes_[static_cast<size_t>(source)]->params();
  ++restarts_[static_cast<size_t>(node)];
  ASSIGN_OR_RETURN(nodes_[static_cast<size_t>(node)],
                   make_node(node, std::vector<float>(src.begin(), src.end())));
  bytes_[static_cast<size_t>(source)] += static_cast<uint64_t>(numel_) * 4;
  // Every copy of the restarted node is stale, and it holds none.
  for (auto it = linked_.begin(); it != linked_.end();) {
    if (it->first == node || it->second == node) {
      nodes_[static_cast<size_t>(it->first)]->forget(std::to_string(it->second));
      it = linked_.erase(it);
    } else {
      ++it;
    }
  }
  return ok_status();
}

double Simulation::consensus_distance() const {
  const std::vector<int> ids = live();
  if (ids.empty()) return 0.0;
  std::vector<double> mean(static_cast<size_t>(numel_), 0.0);
  for (int id : ids) {
    const auto x = params(id);
    for (size_t k = 0; k < x.size(); ++k) mean[k] += x[k];
  }
  for (double& v : mean) v /= static_cast<double>(ids.size());
  double sum = 0.0;
  for (int id : ids) {
    const auto x = params(id);
    for (size_t k = 0; k < x.size(); ++k) {
      const double d = static_cast<double>(x[k]) - mean[k];
      sum += d * d;
    }
  }
  return std::sqrt(sum / static_cast<double>(ids.size()));
}

std::vector<float> Simulation::mean_params() const {
  const std::vector<int> ids = live();
  std::vector<double> mean(static_cast<size_t>(numel_), 0.0);
  for (int id : ids) {
    const auto x = params(id);
    for (size_t k = 0; k < x.size(); ++k) mean[k] += x[k];
  }
  std::vector<float> out(mean.size());
  for (size_t k = 0; k < mean.size(); ++k) {
    out[k] = static_cast<float>(mean[k] / static_cast<double>(std::max<size_t>(1, ids.size())));
  }
  return out;
}

uint64_t Simulation::total_bytes() const {
  uint64_t t = 0;
  for (uint64_t b : bytes_) t += b;
  return t;
}

}  // namespace starling::gossip
