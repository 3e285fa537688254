// The image classifiers of federations (model.arch MLP and CNN): the task of a simulation or of
// the aggregator, and one edge client's trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/data/mnist.h"
#include "core/data/partition.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "sim/task.h"

namespace starling::sim {

// The splits of an image task: kSimulation loads the training split and partitions it; the test
// split is loaded when [eval] every_rounds > 0. Errors name `source`. The DDPM task shares it.
struct ImageSplits {
  std::shared_ptr<const data::MnistSet> train;  // null for kServer
  data::Partition parts;
  std::shared_ptr<const data::MnistSet> test;  // null without evaluation
};
Result<ImageSplits> load_image_splits(const v1::FederationConfig& config, std::string_view source,
                                      TaskUse use);

// kSimulation loads the training split and partitions it; kServer loads the test split only (when
// [eval] every_rounds > 0).
Result<std::unique_ptr<SimTask>> make_mnist_task(const v1::FederationConfig& config,
                                                 std::string_view source, TaskUse use);

// Client `partition`'s examples only (or every image of [data] path), never the whole split.
Result<std::unique_ptr<edge_client::LocalTrainer>> make_mnist_client_trainer(
    const v1::FederationConfig& config, std::string_view source, uint32_t partition,
    std::string* describe);

}  // namespace starling::sim
