// A gossip federation described by a GossipConfig (configs/gossip_*.toml): loading and checking
// the config, the options it gives the nodes, the task every peer trains (the MNIST 2NN on its
// data partition, or a consensus vector) and a whole simulated run with its JSON-lines metrics.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/data/mnist.h"
#include "core/data/partition.h"
#include "core/wire/gossip.pb.h"
#include "edge_client/mnist_trainer.h"
#include "gossip/peer.h"
#include "gossip/simulation.h"
#include "models/mlp/mlp.h"

namespace starling::gossip {

// load_toml, then validate_gossip_config.
Result<v1::GossipConfig> load_gossip_config(const std::filesystem::path& file);
// InvalidArgument listing every bad value ("SOURCE: key 'topology.degree' ...").
Status validate_gossip_config(const v1::GossipConfig& config, std::string_view source);

TopologySpec topology_spec(const v1::GossipConfig& config);
NodeOptions node_options(const v1::GossipConfig& config);
// [peer], [rounds], [local] and the node and topology options of peer `node_id` on partition
// `index` (its seeds forked from rounds.seed), as `starling peer` runs it.
PeerOptions peer_options(const v1::GossipConfig& config, const std::string& node_id,
                         uint32_t index);
SimulationOptions simulation_options(const v1::GossipConfig& config);
// Peers of a simulation: simulate.num_peers, else data.num_clients.
int simulated_peers(const v1::GossipConfig& config);

struct TaskEval {
  double loss = 0.0;
  double accuracy = 0.0;    // MNIST: test accuracy; consensus: 0
  double mean_value = 0.0;  // mean parameter value (the consensus task's figure)
};

// task.kind FEDERATED: a model kind of the federation side (sim/'s SimTask: GPT with LoRA, MDLM,
// the image models) as gossip peers see it. sim/ provides it (sim::register_gossip_model_tasks),
// since gossip/ does not link sim/.
class ModelTask {
 public:
  virtual ~ModelTask() = default;
  virtual const compress::Layout& layout() const = 0;
  virtual std::vector<float> initial() const = 0;
  virtual int num_partitions() const = 0;
  // Partition k's trainer (what a peer on it trains).
  virtual std::unique_ptr<edge_client::LocalTrainer> make_trainer(int partition) const = 0;
  // Its training examples (tokens for the language models): the FedAvg weight.
  virtual double examples(int partition) const = 0;
  // The model on the held-out data (loss, accuracy).
  virtual TaskEval evaluate(std::span<const float> params) = 0;
  virtual std::string describe() const = 0;
};
// `one_peer`: the task of one `starling peer` process, whose [peer] gpus are its own
// data-parallel ranks; else a simulation's, whose peers spread over them.
using ModelTaskFactory = std::function<Result<std::unique_ptr<ModelTask>>(
    const v1::GossipConfig& config, std::string_view source, bool one_peer)>;
// Installs the factory of task.kind FEDERATED (once per process; later calls replace it).
void set_model_task_factory(ModelTaskFactory factory);

// What every peer trains. Thread-compatible; trainers are made on demand and owned here.
class GossipTask {
 public:
  // Loads the data (MNIST: train split and partition for `num_partitions`; the test split when
  // `with_test`). NotFound naming the data folder when the dataset is missing. `one_peer`: the
  // task of one `starling peer` process (ModelTaskFactory).
  static Result<std::unique_ptr<GossipTask>> create(const v1::GossipConfig& config,
                                                    int num_partitions, bool with_test,
                                                    bool one_peer);

  const compress::Layout& layout() const { return layout_; }
  // Peer k's starting model: MNIST: the seeded 2NN (the same for all, as D-PSGD assumes);
  // FEDERATED: the model kind's initial model (with init_from and [lora]: the adapters on the
  // pretrained base), the same for all; consensus: every element equal to k.
  std::vector<float> initial(int peer) const;
  // Peer k's trainer (partition k); nullptr for the consensus task.
  edge_client::LocalTrainer* trainer(int peer);
  // Examples of partition k (FedAvg weights); 1 for the consensus task.
  double examples(int peer) const;
  // MNIST: loss and accuracy on (up to eval.max_examples of) the test split. REQUIRES: created
  // with_test for MNIST.
  TaskEval evaluate(std::span<const float> params) const;
  bool is_mnist() const { return mnist_; }
  // Whether peers train (MNIST, FEDERATED) rather than only average (consensus).
  bool trains() const { return mnist_ || model_task_ != nullptr; }
  // One line for logs: the dataset, partitions and model.
  std::string describe() const;

 private:
  GossipTask() = default;

  v1::GossipConfig config_;
  bool mnist_ = true;
  compress::Layout layout_;
  std::vector<float> init_;
  std::shared_ptr<const data::MnistSet> train_;
  std::shared_ptr<const data::MnistSet> test_;
  data::Partition parts_;
  std::vector<std::unique_ptr<edge_client::MnistTrainer>> trainers_;
  std::unique_ptr<models::Mlp> eval_model_;
  int64_t eval_n_ = 0;
  // task.kind FEDERATED.
  std::unique_ptr<ModelTask> model_task_;
  std::vector<std::unique_ptr<edge_client::LocalTrainer>> model_trainers_;
};

// JSON lines appended to a file, flushed per line. Not thread-safe.
class JsonLines {
 public:
  // "" opens nothing (write() does nothing). Creates parent folders.
  static Result<std::unique_ptr<JsonLines>> open(const std::string& path);
  ~JsonLines();
  void write(const std::string& line);

 private:
  explicit JsonLines(std::FILE* f) : file_(f) {}
  std::FILE* file_ = nullptr;
};

struct SimulationSummary {
  int rounds = 0;
  double consensus_distance = 0.0;
  uint64_t total_bytes = 0;
  double bytes_per_node = 0.0;
  std::vector<TaskEval> node_eval;  // last evaluation, per node (crashed nodes included)
  TaskEval mean_model_eval;         // the live nodes' mean model
  double mean_accuracy = 0.0;       // over live nodes
  double min_accuracy = 0.0;
};

// Runs config.rounds.num_rounds of a simulated gossip federation from `config`, with the failure
// injection of [simulate], writing one JSON line per round to simulate.metrics_path (round,
// consensus_distance, bytes, bytes_per_node, train_loss, and on evaluation rounds per-node
// test_accuracy plus the mean model's). `on_round` (optional) sees every round's line.
Result<SimulationSummary> run_simulation(
    const v1::GossipConfig& config,
    const std::function<void(const std::string& json_line)>& on_round = {});

}  // namespace starling::gossip
