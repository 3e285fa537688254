// A model kind is one unit: what a federation's [model] arch builds (data and partition, the
// model, local steps, evaluation, save, parameter names for the codecs), behind the SimTask
// interface, and the one trainer an edge client needs. Every role asks this registry
// (sim/model_kinds.cc) instead of switching on the arch: `starling aggregator` (its model and
// evaluation), `starling client` (its trainer), `starling simulate` and `aggregator --simulate`
// (every virtual client). Adding a kind is one source file and one line of the registry.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/util/status.h"
#include "core/wire/federation.pb.h"
#include "edge_client/edge_client.h"
#include "sim/task.h"

namespace starling::sim {

struct ModelKind {
  v1::FedModelConfig::Arch arch;
  std::string_view name;  // as in [model] arch, lower case
  // The task of a validated config; errors name `source` and the key.
  Result<std::unique_ptr<SimTask>> (*make_task)(const v1::FederationConfig& config,
                                                std::string_view source, TaskUse use);
  // The built-in trainer of edge client `partition` ([data] path: the device's own data
  // instead), loading only what that client trains on. `describe` receives what was loaded.
  Result<std::unique_ptr<edge_client::LocalTrainer>> (*make_client_trainer)(
      const v1::FederationConfig& config, std::string_view source, uint32_t partition,
      std::string* describe);
};

// Every registered kind, in the order of FedModelConfig.Arch.
std::span<const ModelKind> model_kinds();
// The kind of `config`'s [model] arch. InvalidArgument naming `source` and model.arch for an
// arch with no registered kind.
Result<const ModelKind*> model_kind(const v1::FederationConfig& config, std::string_view source);

}  // namespace starling::sim
