// In-process gossip simulation: every node of a decentralized federation in one process, running
// the same GossipNode code as `starling peer`, with an in-memory exchange that still encodes and
// decodes every message through the codecs and counts its bytes. Used by `starling peer
// --simulate`, by the acceptance experiments and by `starling simulate` (sim/).
//
// Typical use:
//   ASSIGN_OR_RETURN(auto sim, Simulation::create(options, layout, initial, trainers));
//   for (int r = 0; r < rounds; ++r) RETURN_IF_ERROR(sim->run_round());
//   sim->consensus_distance(); sim->bytes_sent(i); sim->params(i);
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "edge_client/edge_client.h"
#include "gossip/node.h"
#include "gossip/topology.h"

namespace starling::gossip {

struct SimulationOptions {
  NodeOptions node;  // algorithm, codec, CHOCO step; node i's codec seed is forked from node.seed
  TopologySpec topology;
  int gossip_steps = 1;  // exchanges per round, after the local steps
  // Local training of each round (ignored by nodes without a trainer).
  uint32_t local_steps = 10;
  uint32_t batch_size = 32;
  float learning_rate = 0.05f;
  // Cosine decay to learning_rate * final_lr_fraction over num_rounds (scheduled_learning_rate);
  // num_rounds = 0: constant.
  float final_lr_fraction = 1.0f;
  uint64_t num_rounds = 0;
  uint64_t seed = 1;  // training batches (per node and round) and push-pull partner choice
};

// The learning rate of round `round` (0-based) of `num_rounds`: lr * (f + (1 - f) (1 + cos(pi
// round / (num_rounds - 1))) / 2), f = final_fraction: lr at round 0, lr * f at the last round.
// Constant when f = 1 or num_rounds < 2; rounds past the last get lr * f.
float scheduled_learning_rate(float lr, float final_fraction, uint64_t round, uint64_t num_rounds);

struct NodeRoundStats {
  double train_loss = 0.0;  // mean loss of the round's local steps (0 without a trainer)
  uint64_t examples = 0;
};

// Not thread-safe. Nodes are numbered 0..n-1; the topology is laid over the live nodes in that
// order each gossip step, as the peers lay it over their sorted live member list.
class Simulation {
 public:
  // `initial`: one model per node (all of the layout's numel). `trainers`: one per node, or
  // empty for pure averaging; not owned, must outlive the simulation. `sample_weights`: FedAvg's
  // weights (e.g. examples per node); empty: equal. InvalidArgument for inconsistent sizes, a bad
  // codec, or CHOCO on a time-varying topology (its public copies need fixed neighbours).
  static Result<std::unique_ptr<Simulation>> create(
      const SimulationOptions& options, compress::Layout layout,
      std::vector<std::vector<float>> initial, std::vector<edge_client::LocalTrainer*> trainers,
      std::vector<double> sample_weights = {});

  // One round: local steps on every live node that has a trainer, then gossip_steps exchanges.
  Status run_round();
  // One exchange (no training): the averaging experiments call this directly.
  Status gossip_step();

  // Failure injection. crash: the node stops; its neighbours drop it from the topology at the
  // next exchange. rejoin: the node restarts with fresh state and catches up by copying the model
  // of its first live neighbour (that copy's bytes are counted). FailedPrecondition when the node
  // is in the wrong state or no other node is alive.
  Status crash(int node);
  Status rejoin(int node);

  int num_nodes() const { return static_cast<int>(nodes_.size()); }
  bool alive(int node) const { return alive_[static_cast<size_t>(node)] != 0; }
  uint64_t rounds() const { return rounds_; }
  uint64_t exchanges() const { return exchanges_; }
  std::span<const float> params(int node) const {
    return nodes_[static_cast<size_t>(node)]->params();
  }
  // sqrt(mean over live i of ||x_i - mean||^2), in double.
  double consensus_distance() const;
  // Mean model of the live nodes.
  std::vector<float> mean_params() const;
  // Message bytes node `node` has sent (each copy to each neighbour counted).
  uint64_t bytes_sent(int node) const { return bytes_[static_cast<size_t>(node)]; }
  uint64_t total_bytes() const;
  const NodeRoundStats& last_round(int node) const { return stats_[static_cast<size_t>(node)]; }
  const SimulationOptions& options() const { return options_; }

 private:
  Simulation(SimulationOptions options, compress::Layout layout, int64_t numel);
  Result<std::unique_ptr<GossipNode>> make_node(int node, std::vector<float> x) const;
  std::vector<int> live() const;
  Status synchronous_step();
  Status push_pull_step();
  Status fedavg_step();

  SimulationOptions options_;
  compress::Layout layout_;
  int64_t numel_;
  std::vector<std::unique_ptr<GossipNode>> nodes_;
  std::vector<edge_client::LocalTrainer*> trainers_;
  std::vector<double> sample_weights_;
  std::vector<char> alive_;
  std::vector<uint64_t> bytes_;
  std::vector<NodeRoundStats> stats_;
  std::vector<int> restarts_;
  // CHOCO: (receiver, sender) pairs whose public copy is in sync.
  std::set<std::pair<int, int>> linked_;
  uint64_t rounds_ = 0;
  uint64_t exchanges_ = 0;
  std::vector<float> delta_;
};

}  // namespace starling::gossip
