// Federation configs and the MNIST task.
#include "aggregator/fed_task.h"

#include <cmath>

#include "core/config/toml_config.h"
#include "core/data/data_dir.h"

namespace starling::aggregator {

Result<v1::FederationConfig> load_federation_config(const std::filesystem::path& file) {
  v1::FederationConfig config;
  RETURN_IF_ERROR(config::load_toml(file, &config));
  RETURN_IF_ERROR(validate_federation_config(config, file.string()));
  return config;
}

Status validate_federation_config(const v1::FederationConfig& c, std::string_view source) {
  std::string errors;
  auto check = [&](bool ok, const char* key, const char* what) {
    if (!ok) errors += "\n  " + std::string(source) + ": key '" + key + "' " + what;
  };
  check(c.rounds().num_rounds() > 0, "rounds.num_rounds", "must be positive");
  check(c.rounds().fraction() >= 0 && c.rounds().fraction() <= 1, "rounds.fraction",
        "must be in [0, 1]");
  check(c.rounds().over_selection() >= 0, "rounds.over_selection", "must be >= 0");
  check(c.rounds().round_deadline_ms() > 0, "rounds.round_deadline_ms", "must be positive");
  check(c.strategy().server_lr() > 0, "strategy.server_lr", "must be positive");
  check(c.strategy().tau() > 0, "strategy.tau", "must be positive");
  check(c.local().batch_size() > 0, "local.batch_size", "must be positive");
  check(c.local().learning_rate() > 0, "local.learning_rate", "must be positive");
  check(c.local().local_steps() > 0 || c.local().epochs() > 0, "local.epochs",
        "must be positive when local.local_steps is 0");
  check(c.local().prox_mu() >= 0, "local.prox_mu", "must be >= 0");
  if (auto cs = compress::parse_compression_spec(c.local().codec()); !cs.ok()) {
    check(false, "local.codec",
          (cs.status().message() + " (e.g. \"topk:ratio=0.01,ef=1;*.bias=identity\")").c_str());
  }
  check(c.data().num_clients() > 0, "data.num_clients", "must be positive");
  check(c.data().alpha() > 0, "data.alpha", "must be positive");
  check(c.data().shards_per_client() > 0, "data.shards_per_client", "must be positive");
  check(c.data().dataset() == "mnist" || c.data().dataset() == "fashion-mnist", "data.dataset",
        "must be mnist or fashion-mnist");
  check(c.model().hidden() > 0, "model.hidden", "must be positive");
  check(c.client().partition_index() < c.data().num_clients(), "client.partition_index",
        "must be below data.num_clients");
  check(c.eval().target_accuracy() >= 0 && c.eval().target_accuracy() <= 1, "eval.target_accuracy",
        "must be in [0, 1]");
  check(c.robust().trim_fraction() >= 0 && c.robust().trim_fraction() < 0.5, "robust.trim_fraction",
        "must be in [0, 0.5)");
  check(c.robust().clip_norm() >= 0, "robust.clip_norm", "must be >= 0");
  if (!errors.empty()) return invalid_argument("invalid federation config:" + errors);
  return ok_status();
}

StrategyOptions strategy_options(const v1::FederationConfig& c) {
  StrategyOptions s;
  switch (c.strategy().kind()) {
    case v1::FedStrategyConfig::FEDAVG:
      s.kind = StrategyKind::kFedAvg;
      break;
    case v1::FedStrategyConfig::FEDAVGM:
      s.kind = StrategyKind::kFedAvgM;
      break;
    case v1::FedStrategyConfig::FEDADAM:
      s.kind = StrategyKind::kFedAdam;
      break;
    case v1::FedStrategyConfig::FEDYOGI:
      s.kind = StrategyKind::kFedYogi;
      break;
    case v1::FedStrategyConfig::FEDADAGRAD:
      s.kind = StrategyKind::kFedAdagrad;
      break;
  }
  s.server_lr = c.strategy().server_lr();
  s.momentum = c.strategy().momentum();
  s.beta1 = c.strategy().beta1();
  s.beta2 = c.strategy().beta2();
  s.tau = c.strategy().tau();
  return s;
}

AggregatorOptions aggregator_options(const v1::FederationConfig& c) {
  AggregatorOptions o;
  o.server.host = c.server().host();
  o.server.port = static_cast<uint16_t>(c.server().port());
  o.node_id = c.server().node_id();
  o.num_rounds = c.rounds().num_rounds();
  o.clients_per_round = c.rounds().clients_per_round();
  o.fraction = c.rounds().fraction();
  o.min_available = c.rounds().min_available();
  o.over_selection = c.rounds().over_selection();
  o.min_updates = c.rounds().min_updates();
  o.round_deadline = std::chrono::milliseconds(c.rounds().round_deadline_ms());
  o.seed = c.rounds().seed();
  o.buffer_size = c.rounds().buffer_size();
  o.max_staleness = c.rounds().max_staleness();
  o.strategy = strategy_options(c);
  o.local_steps = c.local().local_steps();
  o.batch_size = c.local().batch_size();
  o.learning_rate = c.local().learning_rate();
  o.codec = c.local().codec();
  o.state_dir = c.server().state_dir();
  switch (c.robust().rule()) {
    case v1::FedRobustConfig::MEAN:
      o.rule.rule = RobustRule::kMean;
      break;
    case v1::FedRobustConfig::MEDIAN:
      o.rule.rule = RobustRule::kMedian;
      break;
    case v1::FedRobustConfig::TRIMMED_MEAN:
      o.rule.rule = RobustRule::kTrimmedMean;
      break;
  }
  o.rule.trim_fraction = c.robust().trim_fraction();
  o.rule.clip_norm = c.robust().clip_norm();
  return o;
}

edge_client::MnistTrainerOptions trainer_options(const v1::FederationConfig& c) {
  edge_client::MnistTrainerOptions o;
  o.hidden = c.model().hidden();
  o.epochs = c.local().epochs();
  o.prox_mu = c.local().prox_mu();
  return o;
}

Result<std::shared_ptr<const data::MnistSet>> load_split(const v1::FederationConfig& c,
                                                         bool train) {
  ASSIGN_OR_RETURN(auto dir, data::resolve_data_dir(c.data().data_dir()));
  ASSIGN_OR_RETURN(auto set, data::load_mnist_split(dir, c.data().dataset(), train));
  return std::shared_ptr<const data::MnistSet>(std::make_shared<data::MnistSet>(std::move(set)));
}

Result<data::Partition> make_partition(const v1::FederationConfig& c, const data::MnistSet& train) {
  const int clients = static_cast<int>(c.data().num_clients());
  switch (c.data().partition()) {
    case v1::FedDataConfig::IID:
      return data::partition_iid(train.size(), clients, c.data().seed());
    case v1::FedDataConfig::DIRICHLET:
      return data::partition_dirichlet(train.labels, clients, c.data().alpha(), c.data().seed());
    case v1::FedDataConfig::SHARDS:
      return data::partition_shards(
          train.labels, clients, static_cast<int>(c.data().shards_per_client()), c.data().seed());
  }
  return invalid_argument("unknown partition");
}

std::unique_ptr<models::Mlp> make_model(const v1::FederationConfig& c, int64_t pixels) {
  return std::make_unique<models::Mlp>(models::MlpConfig{pixels, c.model().hidden(), 10},
                                       c.model().seed());
}

Result<std::unique_ptr<MetricsLog>> MetricsLog::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) return internal_error("cannot open metrics log " + path.string());
  return std::unique_ptr<MetricsLog>(new MetricsLog(f));
}

MetricsLog::~MetricsLog() { std::fclose(file_); }

void MetricsLog::write(const std::string& json_line) {
  std::fputs(json_line.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

}  // namespace starling::aggregator
