// A federation described by a FederationConfig (configs/fed_*.toml): loading and checking the
// config, the options it gives the aggregator and the clients, and the MNIST task (data,
// partition, initial 2NN, evaluation) that `starling aggregator` and `starling client` share.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "aggregator/aggregator.h"
#include "core/data/mnist.h"
#include "core/data/partition.h"
#include "core/wire/federation.pb.h"
#include "edge_client/mnist_trainer.h"
#include "models/mlp/mlp.h"

namespace starling::aggregator {

// load_toml, then validate_federation_config.
Result<v1::FederationConfig> load_federation_config(const std::filesystem::path& file);
// InvalidArgument listing every bad value ("SOURCE: key 'rounds.fraction' ...").
Status validate_federation_config(const v1::FederationConfig& config, std::string_view source);

// The random-k ratio local.codec asks of secure aggregation (0 for "identity"); InvalidArgument
// naming the key for a codec that does not compose with it.
Result<double> secagg_randk_ratio(const v1::FederationConfig& config);

AggregatorOptions aggregator_options(const v1::FederationConfig& config);
edge_client::MnistTrainerOptions trainer_options(const v1::FederationConfig& config);
StrategyOptions strategy_options(const v1::FederationConfig& config);

// The config's dataset split, from its data_dir (or the default data folder).
Result<std::shared_ptr<const data::MnistSet>> load_split(const v1::FederationConfig& config,
                                                         bool train);
// Every client's examples, as [data] asks (the same on every node: it is seeded).
Result<data::Partition> make_partition(const v1::FederationConfig& config,
                                       const data::MnistSet& train);
// The initial global model of an image task: the 2NN ([model] hidden) or the CNN ([model]
// arch = "CNN", cnn_*), from [model] seed.
std::unique_ptr<models::Classifier> make_model(const v1::FederationConfig& config, int64_t pixels);

// JSON lines appended to a file, flushed after each line. A failed open leaves it disabled.
class MetricsLog {
 public:
  static Result<std::unique_ptr<MetricsLog>> open(const std::filesystem::path& path);
  ~MetricsLog();
  void write(const std::string& json_line);

 private:
  explicit MetricsLog(std::FILE* f) : file_(f) {}
  std::FILE* file_;
};

}  // namespace starling::aggregator
