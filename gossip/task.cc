// Gossip configs, the task peers train, and a whole simulated run.
#include "gossip/task.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/config/toml_config.h"
#include "core/data/data_dir.h"
#include "core/util/rng.h"
#include "edge_client/model_params.h"

namespace starling::gossip {
namespace {

ModelTaskFactory& model_task_factory() {
  static ModelTaskFactory factory;
  return factory;
}

}  // namespace

void set_model_task_factory(ModelTaskFactory factory) { model_task_factory() = std::move(factory); }

Result<v1::GossipConfig> load_gossip_config(const std::filesystem::path& file) {
  v1::GossipConfig config;
  RETURN_IF_ERROR(config::load_toml(file, &config));
  RETURN_IF_ERROR(validate_gossip_config(config, file.string()));
  return config;
}

Status validate_gossip_config(const v1::GossipConfig& c, std::string_view source) {
  std::string errors;
  auto check = [&](bool ok, const char* key, const std::string& what) {
    if (!ok) errors += "\n  " + std::string(source) + ": key '" + key + "' " + what;
  };
  check(c.rounds().num_rounds() > 0, "rounds.num_rounds", "must be positive");
  check(c.local().batch_size() > 0, "local.batch_size", "must be positive");
  check(c.local().learning_rate() >= 0, "local.learning_rate", "must be >= 0");
  check(c.local().final_lr_fraction() >= 0 && c.local().final_lr_fraction() <= 1,
        "local.final_lr_fraction", "must be in [0, 1]");
  check(c.algorithm().gossip_steps() > 0, "algorithm.gossip_steps", "must be positive");
  check(c.algorithm().consensus_step() > 0 && c.algorithm().consensus_step() <= 1,
        "algorithm.consensus_step", "must be in (0, 1]");
  if (auto cs = compress::parse_compression_spec(c.algorithm().codec()); !cs.ok()) {
    check(false, "algorithm.codec", cs.status().message() + " (e.g. \"topk:ratio=0.01\")");
  }
  check(!(c.algorithm().kind() == v1::GossipAlgorithmConfig::CHOCO && c.topology().time_varying()),
        "topology.time_varying",
        "must be false for CHOCO (its public copies need fixed neighbours)");
  check(
      c.topology().kind() != v1::GossipTopologyConfig::RANDOM_REGULAR || c.topology().degree() > 0,
      "topology.degree", "must be positive");
  check(c.data().num_clients() > 0, "data.num_clients", "must be positive");
  const bool cuda = c.peer().device() == "cuda";
  check(cuda || c.peer().device() == "cpu", "peer.device", "must be \"cpu\" or \"cuda\"");
  check(!cuda || c.task().kind() == v1::GossipTaskConfig::FEDERATED, "peer.device",
        "\"cuda\" applies to task.kind = \"FEDERATED\" (the federations' model kinds)");
  check(c.peer().gpus().empty() || cuda, "peer.gpus", "applies to peer.device \"cuda\"");
  // task.kind FEDERATED: [data], [model] and [lora] are checked as a federation's when the task
  // is made (the model kind's own rules, e.g. ROLES for shakespeare, init_from for GPT).
  const bool federated = c.task().kind() == v1::GossipTaskConfig::FEDERATED;
  if (!federated) {
    check(c.data().alpha() > 0, "data.alpha", "must be positive");
    check(c.data().shards_per_client() > 0, "data.shards_per_client", "must be positive");
    check(c.data().dataset() == "mnist" || c.data().dataset() == "fashion-mnist", "data.dataset",
          "must be mnist or fashion-mnist (other data: task.kind = \"FEDERATED\")");
    check(c.model().hidden() > 0, "model.hidden", "must be positive");
    check(std::isfinite(c.model().init_std()) && c.model().init_std() > 0, "model.init_std",
          "must be finite and positive");
    check(std::isfinite(c.model().init_bias()), "model.init_bias", "must be finite");
    check(c.model().arch() == v1::FedModelConfig::MLP, "model.arch",
          "must be MLP for task.kind MNIST (other models: task.kind = \"FEDERATED\")");
    check(c.data().partition() == v1::FedDataConfig::IID ||
              c.data().partition() == v1::FedDataConfig::DIRICHLET ||
              c.data().partition() == v1::FedDataConfig::SHARDS,
          "data.partition", "must be IID, DIRICHLET or SHARDS");
    check(c.peer().partition_index() < c.data().num_clients(), "peer.partition_index",
          "must be below data.num_clients");
    check(c.lora().rank() == 0, "lora.rank", "applies to task.kind = \"FEDERATED\" only");
  }
  check(c.task().consensus_dim() > 0, "task.consensus_dim", "must be positive");
  check(c.peer().heartbeat_ms() > 0, "peer.heartbeat_ms", "must be positive");
  check(c.peer().fail_timeout_ms() > c.peer().heartbeat_ms(), "peer.fail_timeout_ms",
        "must exceed peer.heartbeat_ms");
  check(c.peer().round_timeout_ms() > 0, "peer.round_timeout_ms", "must be positive");
  check(c.peer().listen_port() < 65536, "peer.listen_port", "must be below 65536");
  for (const auto& s : c.peer().seeds()) {
    const auto colon = s.rfind(':');
    check(colon != std::string::npos && colon > 0 && colon + 1 < s.size(), "peer.seeds",
          "entry '" + s + "' is not host:port");
  }
  const int n = simulated_peers(c);
  if (c.simulate().crash_peer() >= 0) {
    check(c.simulate().crash_peer() < n, "simulate.crash_peer", "must be below the peer count");
    check(c.simulate().rejoin_round() == 0 ||
              c.simulate().rejoin_round() > c.simulate().crash_round(),
          "simulate.rejoin_round", "must be after simulate.crash_round (or 0: never)");
  }
  if (c.topology().kind() == v1::GossipTopologyConfig::TORUS && c.topology().torus_rows() > 0) {
    check(n % static_cast<int>(c.topology().torus_rows()) == 0, "topology.torus_rows",
          "must divide the number of peers (" + std::to_string(n) + ")");
  }
  if (!errors.empty()) return invalid_argument("invalid gossip config:" + errors);
  return ok_status();
}

TopologySpec topology_spec(const v1::GossipConfig& c) {
  TopologySpec t;
  switch (c.topology().kind()) {
    case v1::GossipTopologyConfig::RING:
      t.kind = TopologyKind::kRing;
      break;
    case v1::GossipTopologyConfig::TORUS:
      t.kind = TopologyKind::kTorus;
      break;
    case v1::GossipTopologyConfig::EXPONENTIAL:
      t.kind = TopologyKind::kExponential;
      break;
    case v1::GossipTopologyConfig::RANDOM_REGULAR:
      t.kind = TopologyKind::kRandomRegular;
      break;
    case v1::GossipTopologyConfig::COMPLETE:
      t.kind = TopologyKind::kComplete;
      break;
  }
  t.time_varying = c.topology().time_varying();
  t.degree = static_cast<int>(c.topology().degree());
  t.torus_rows = static_cast<int>(c.topology().torus_rows());
  t.seed = c.topology().seed();
  return t;
}

PeerOptions peer_options(const v1::GossipConfig& cfg, const std::string& node_id, uint32_t index) {
  PeerOptions o;
  o.node_id = node_id;
  o.listen_host = cfg.peer().listen_host();
  o.listen_port = static_cast<uint16_t>(cfg.peer().listen_port());
  o.advertise_host = cfg.peer().advertise_host();
  o.seeds.assign(cfg.peer().seeds().begin(), cfg.peer().seeds().end());
  o.seed_server_name = cfg.peer().seed_server_name();
  o.heartbeat = Millis(cfg.peer().heartbeat_ms());
  o.fail_timeout = Millis(cfg.peer().fail_timeout_ms());
  o.round_timeout = Millis(cfg.peer().round_timeout_ms());
  o.linger = Millis(cfg.peer().linger_ms());
  o.round_interval = Millis(cfg.peer().round_interval_ms());
  o.min_peers = cfg.peer().min_peers();
  o.state_dir = cfg.peer().state_dir();
  o.num_rounds = cfg.rounds().num_rounds();
  o.node = node_options(cfg);
  o.node.seed = Rng(cfg.rounds().seed()).fork(index).next_u64();
  o.topology = topology_spec(cfg);
  o.local_steps = cfg.local().local_steps();
  o.batch_size = cfg.local().batch_size();
  o.learning_rate = cfg.local().learning_rate();
  o.final_lr_fraction = cfg.local().final_lr_fraction();
  o.seed = cfg.rounds().seed() + index;
  return o;
}

NodeOptions node_options(const v1::GossipConfig& c) {
  NodeOptions o;
  switch (c.algorithm().kind()) {
    case v1::GossipAlgorithmConfig::DPSGD:
      o.algorithm = Algorithm::kDpsgd;
      break;
    case v1::GossipAlgorithmConfig::PUSH_PULL:
      o.algorithm = Algorithm::kPushPull;
      break;
    case v1::GossipAlgorithmConfig::CHOCO:
      o.algorithm = Algorithm::kChoco;
      break;
    case v1::GossipAlgorithmConfig::FEDAVG:
      o.algorithm = Algorithm::kFedAvg;
      break;
  }
  o.codec = c.algorithm().codec();
  o.consensus_step = c.algorithm().consensus_step();
  // Trained peers all start from the one model (D-PSGD assumes it); consensus peers start apart.
  o.shared_init = c.task().kind() != v1::GossipTaskConfig::CONSENSUS;
  o.seed = c.rounds().seed();
  return o;
}

SimulationOptions simulation_options(const v1::GossipConfig& c) {
  SimulationOptions s;
  s.node = node_options(c);
  s.topology = topology_spec(c);
  s.gossip_steps = static_cast<int>(c.algorithm().gossip_steps());
  s.local_steps = c.local().local_steps();
  s.batch_size = c.local().batch_size();
  s.learning_rate = c.local().learning_rate();
  s.final_lr_fraction = c.local().final_lr_fraction();
  s.num_rounds = c.rounds().num_rounds();
  s.seed = c.rounds().seed();
  return s;
}

int simulated_peers(const v1::GossipConfig& c) {
  return static_cast<int>(c.simulate().num_peers() ? c.simulate().num_peers()
                                                   : c.data().num_clients());
}

Result<std::unique_ptr<GossipTask>> GossipTask::create(const v1::GossipConfig& c,
                                                       int num_partitions, bool with_test,
                                                       bool one_peer) {
  std::unique_ptr<GossipTask> t(new GossipTask());
  t->config_ = c;
  t->mnist_ = c.task().kind() == v1::GossipTaskConfig::MNIST;
  if (c.task().kind() == v1::GossipTaskConfig::FEDERATED) {
    if (!model_task_factory()) {
      return failed_precondition(
          "gossip task: task.kind FEDERATED needs the model kinds of sim/ "
          "(sim::register_gossip_model_tasks was not called)");
    }
    ASSIGN_OR_RETURN(t->model_task_, model_task_factory()(c, "gossip config", one_peer));
    if (t->model_task_->num_partitions() < 1) {
      return invalid_argument("gossip task: the dataset has no partition to train on");
    }
    t->layout_ = t->model_task_->layout();
    t->init_ = t->model_task_->initial();
    t->model_trainers_.resize(static_cast<size_t>(
        std::min(std::max(num_partitions, 1), t->model_task_->num_partitions())));
    (void)with_test;  // the model kind loads its held-out data itself
    return t;
  }
  if (!t->mnist_) {
    const auto dim = static_cast<int64_t>(c.task().consensus_dim());
    t->layout_ = compress::flat_layout(dim);
    return t;
  }
  ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(c.data().data_dir()), "gossip task");
  ASSIGN_OR_RETURN(auto train, data::load_mnist_split(dir, c.data().dataset(), true));
  t->train_ = std::make_shared<const data::MnistSet>(std::move(train));
  if (with_test) {
    ASSIGN_OR_RETURN(auto test, data::load_mnist_split(dir, c.data().dataset(), false));
    t->test_ = std::make_shared<const data::MnistSet>(std::move(test));
    t->eval_n_ = t->test_->size();
    if (c.eval().max_examples() > 0) {
      t->eval_n_ = std::min<int64_t>(t->eval_n_, c.eval().max_examples());
    }
  }
  switch (c.data().partition()) {
    case v1::FedDataConfig::IID:
      t->parts_ = data::partition_iid(t->train_->size(), num_partitions, c.data().seed());
      break;
    case v1::FedDataConfig::DIRICHLET: {
      ASSIGN_OR_RETURN(t->parts_, data::partition_dirichlet(t->train_->labels, num_partitions,
                                                            c.data().alpha(), c.data().seed()));
      break;
    }
    case v1::FedDataConfig::SHARDS: {
      ASSIGN_OR_RETURN(
          t->parts_,
          data::partition_shards(t->train_->labels, num_partitions,
                                 static_cast<int>(c.data().shards_per_client()), c.data().seed()));
      break;
    }
    default:
      return invalid_argument("gossip task: data.partition " +
                              v1::FedDataConfig::Partition_Name(c.data().partition()) +
                              " does not split image datasets (IID, DIRICHLET or SHARDS)");
  }
  const models::MlpConfig mc{t->train_->pixels(), c.model().hidden(), 10};
  t->eval_model_ =
      std::make_unique<models::Mlp>(mc, c.model().seed(), edge_client::init_spec(c.model()));
  t->layout_ = edge_client::layout_of(*t->eval_model_);
  t->init_ = edge_client::flatten(*t->eval_model_);
  t->trainers_.resize(t->parts_.size());
  return t;
}

std::string GossipTask::describe() const {
  if (model_task_) return model_task_->describe();
  if (mnist_) {
    return config_.data().dataset() + ", " + std::to_string(parts_.size()) + " partitions, 2NN " +
           std::to_string(init_.size()) + " parameters";
  }
  return "consensus of " + std::to_string(config_.task().consensus_dim()) + " values";
}

std::vector<float> GossipTask::initial(int peer) const {
  if (model_task_) return init_;
  if (!mnist_) {
    return std::vector<float>(static_cast<size_t>(config_.task().consensus_dim()),
                              static_cast<float>(peer));
  }
  return init_;
}

edge_client::LocalTrainer* GossipTask::trainer(int peer) {
  if (model_task_) {
    // Peer k trains partition k (mod the partitions there are).
    const int part = peer % model_task_->num_partitions();
    if (static_cast<size_t>(part) >= model_trainers_.size()) {
      model_trainers_.resize(static_cast<size_t>(part) + 1);
    }
    auto& slot = model_trainers_[static_cast<size_t>(part)];
    if (!slot) slot = model_task_->make_trainer(part);
    return slot.get();
  }
  if (!mnist_) return nullptr;
  auto& slot = trainers_[static_cast<size_t>(peer) % trainers_.size()];
  if (!slot) {
    edge_client::MnistTrainerOptions o;
    o.hidden = config_.model().hidden();
    o.init = edge_client::init_spec(config_.model());
    slot = std::make_unique<edge_client::MnistTrainer>(
        train_, parts_[static_cast<size_t>(peer) % parts_.size()], o);
  }
  return slot.get();
}

double GossipTask::examples(int peer) const {
  if (model_task_) return model_task_->examples(peer % model_task_->num_partitions());
  if (!mnist_) return 1.0;
  return static_cast<double>(parts_[static_cast<size_t>(peer) % parts_.size()].size());
}

TaskEval GossipTask::evaluate(std::span<const float> params) const {
  TaskEval e;
  double sum = 0.0;
  for (float v : params) sum += v;
  e.mean_value = params.empty() ? 0.0 : sum / static_cast<double>(params.size());
  if (model_task_) {
    const TaskEval m = model_task_->evaluate(params);
    e.loss = m.loss;
    e.accuracy = m.accuracy;
    return e;
  }
  if (mnist_ && test_) {
    (void)edge_client::load_flat(*eval_model_, params);
    const auto r =
        models::evaluate(*eval_model_, test_->images.data(), test_->labels.data(), eval_n_);
    e.loss = r.loss;
    e.accuracy = r.accuracy;
  }
  return e;
}

Result<std::unique_ptr<JsonLines>> JsonLines::open(const std::string& path) {
  if (path.empty()) return std::unique_ptr<JsonLines>(new JsonLines(nullptr));
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return internal_error("cannot open metrics file " + path);
  return std::unique_ptr<JsonLines>(new JsonLines(f));
}

JsonLines::~JsonLines() {
  if (file_) std::fclose(file_);
}

void JsonLines::write(const std::string& line) {
  if (!file_) return;
  std::fputs(line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

Result<SimulationSummary> run_simulation(const v1::GossipConfig& c,
                                         const std::function<void(const std::string&)>& on_round) {
  const int n = simulated_peers(c);
  ASSIGN_OR_RETURN(auto task, GossipTask::create(c, n, true, /*one_peer=*/false));
  std::vector<std::vector<float>> initial;
  std::vector<edge_client::LocalTrainer*> trainers;
  std::vector<double> weights;
  for (int i = 0; i < n; ++i) {
    initial.push_back(task->initial(i));
    weights.push_back(task->examples(i));
    if (task->trains()) trainers.push_back(task->trainer(i));
  }
  ASSIGN_OR_RETURN(auto sim, Simulation::create(simulation_options(c), task->layout(),
                                                std::move(initial), trainers, weights));
  ASSIGN_OR_RETURN(auto log, JsonLines::open(c.simulate().metrics_path()));
  spdlog::info("gossip task: {}", task->describe());
  spdlog::info("gossip simulation: {} peers, {} on {}{}, codec {}, {} rounds", n,
               algorithm_name(sim->options().node.algorithm),
               topology_name(sim->options().topology.kind),
               sim->options().topology.time_varying ? " (time-varying)" : "", c.algorithm().codec(),
               c.rounds().num_rounds());
  SimulationSummary summary;
  summary.node_eval.resize(static_cast<size_t>(n));
  const int crash = c.simulate().crash_peer();
  const uint32_t every = c.eval().every_rounds();
  const uint32_t rounds = c.rounds().num_rounds();
  for (uint32_t r = 1; r <= rounds; ++r) {
    RETURN_IF_ERROR(sim->run_round(), "gossip simulation round " + std::to_string(r));
    nlohmann::json j;
    j["round"] = r;
    if (crash >= 0 && r == c.simulate().crash_round() && sim->alive(crash)) {
      RETURN_IF_ERROR(sim->crash(crash));
      j["event"] = "crash peer " + std::to_string(crash);
      spdlog::info("round {}: peer {} crashed", r, crash);
    }
    if (crash >= 0 && r == c.simulate().rejoin_round() && !sim->alive(crash)) {
      RETURN_IF_ERROR(sim->rejoin(crash));
      j["event"] = "peer " + std::to_string(crash) + " rejoined";
      spdlog::info("round {}: peer {} rejoined and caught up from a neighbour", r, crash);
    }
    int live = 0;
    double loss = 0.0;
    for (int i = 0; i < n; ++i) {
      if (!sim->alive(i)) continue;
      ++live;
      loss += sim->last_round(i).train_loss;
    }
    summary.rounds = static_cast<int>(r);
    summary.consensus_distance = sim->consensus_distance();
    summary.total_bytes = sim->total_bytes();
    summary.bytes_per_node = static_cast<double>(summary.total_bytes) / n;
    j["live_peers"] = live;
    j["consensus_distance"] = summary.consensus_distance;
    j["bytes"] = summary.total_bytes;
    j["bytes_per_node"] = summary.bytes_per_node;
    std::vector<uint64_t> per_node;
    for (int i = 0; i < n; ++i) per_node.push_back(sim->bytes_sent(i));
    j["bytes_sent"] = per_node;
    j["train_loss"] = live ? loss / live : 0.0;
    const bool eval = (every > 0 && r % every == 0) || r == rounds;
    if (eval) {
      std::vector<double> acc, node_loss;
      double sum = 0.0, lo = 1.0;
      for (int i = 0; i < n; ++i) {
        const TaskEval e = task->evaluate(sim->params(i));
        summary.node_eval[static_cast<size_t>(i)] = e;
        acc.push_back(e.accuracy);
        node_loss.push_back(e.loss);
        if (sim->alive(i)) {
          sum += e.accuracy;
          lo = std::min(lo, e.accuracy);
        }
      }
      const auto mean_model = sim->mean_params();
      summary.mean_model_eval = task->evaluate(mean_model);
      summary.mean_accuracy = live ? sum / live : 0.0;
      summary.min_accuracy = lo;
      j["test_accuracy"] = acc;
      j["test_loss"] = node_loss;
      j["mean_test_accuracy"] = summary.mean_accuracy;
      j["min_test_accuracy"] = summary.min_accuracy;
      j["mean_model_test_accuracy"] = summary.mean_model_eval.accuracy;
      j["mean_model_value"] = summary.mean_model_eval.mean_value;
      if (task->trains()) {
        spdlog::info(
            "round {}: consensus distance {:.4g}, {:.3f} MB sent per peer, test accuracy mean "
            "{:.4f} (min {:.4f}), mean model {:.4f}",
            r, summary.consensus_distance, summary.bytes_per_node / 1e6, summary.mean_accuracy,
            summary.min_accuracy, summary.mean_model_eval.accuracy);
      } else {
        spdlog::info(
            "round {}: consensus distance {:.4g}, {:.3f} MB sent per peer, mean value {:.6g}", r,
            summary.consensus_distance, summary.bytes_per_node / 1e6,
            summary.mean_model_eval.mean_value);
      }
    }
    const std::string line = j.dump();
    log->write(line);
    if (on_round) on_round(line);
  }
  return summary;
}

}  // namespace starling::gossip
